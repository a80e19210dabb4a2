#!/usr/bin/env bash
# The main job: build wsync if needed and run the trainer → engine demo.
# Arguments go to `wsync demo` (e.g. --layout moe --syncs 5 --plugin PATH).
source "$(dirname "${BASH_SOURCE[0]}")/bootstrap.sh"
wsync_build
exec "$WSYNC_BUILD/bin/wsync" demo "$@"
