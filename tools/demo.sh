#!/usr/bin/env bash
# The main job: build wsync if needed and run the trainer → engine demo.
# Arguments go to `wsync demo` (e.g. --layout moe --syncs 5 --plugin PATH).
source "$(dirname "${BASH_SOURCE[0]}")/bootstrap.sh"
# Only what the demo runs: the CLI and the plugins (the CUDA one where CUDA is found).
echo "wsync: building the CLI and the plugins into $WSYNC_BUILD (log: $WSYNC_BUILD/build.log)"
WSYNC_BUILD_TARGETS="wsync wsync-demo wsync-engine wsync_cpu wsync_cuda wsync_shim" wsync_build_quiet
exec "$WSYNC_BUILD/bin/wsync" demo "$@"
