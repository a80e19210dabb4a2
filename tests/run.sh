#!/usr/bin/env bash
# The test command: install what is missing, build, run every suite with ctest.
# GPU tests (label gpu) skip with a visible message on machines without a GPU.
source "$(dirname "${BASH_SOURCE[0]}")/../tools/bootstrap.sh"
wsync_build
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "wsync: no GPU on this machine: tests labelled 'gpu' will be reported as skipped"
fi
ctest --test-dir "$WSYNC_BUILD" --output-on-failure -j2 --timeout 600
