#!/bin/sh
# End-to-end checks of the wsync CLI against a plugin.
#   cli_check.sh demo WSYNC PLUGIN SYNCS [demo options...]
#       runs the demo; passes when it exits 0, prints SYNCS "verified N/N" lines with N/N equal
#       and non-zero, and ends with PASS.
#   cli_check.sh lora WSYNC PLUGIN SYNCS [demo options...]
#       runs demo --lora; passes when it exits 0, prints SYNCS "verified N/N adapter tensors"
#       lines with N/N equal and non-zero, every sync moved exactly the adapter's bytes and fewer
#       than the model's, and ends with PASS.
#   cli_check.sh engine WSYNC PLUGIN SYNCS TP [demo options...]
#       runs demo --tp TP through wsync-engine (options name --engine); passes when every rank
#       prints SYNCS "verified N/N engine parameters" lines with N/N equal and non-zero.
#   cli_check.sh bench WSYNC PLUGIN [bench options...]
#       runs wsync bench --layout both; passes when it exits 0 and reports the plugin's copy for
#       both layouts (its content check, every tensor looked up by name, ran first).
#   cli_check.sh info WSYNC PLUGIN
#       info must succeed and name the plugin; info on a missing path must fail naming it.
set -u
mode=$1; wsync=$2; plugin=$3; shift 3
out=$(mktemp)
trap 'rm -f "$out"' EXIT

fail() { echo "FAIL: $*"; echo "--- output ---"; cat "$out"; exit 1; }

# run_demo SYNCS LINES PATTERN [demo options...]: exit 0, LINES lines matching PATTERN whose
# "verified N/M" have N == M > 0, and a PASS line (wsync's or wsync-engine's).
run_demo() {
    syncs=$1; lines=$2; pattern=$3; shift 3
    timeout 300 "$wsync" demo --plugin "$plugin" --syncs "$syncs" "$@" >"$out" 2>&1
    rc=$?
    cat "$out"
    [ $rc -eq 0 ] || fail "wsync demo $* exited with $rc"
    n=$(grep -c "$pattern" "$out")
    [ "$n" -eq "$lines" ] || fail "expected $lines lines matching '$pattern', got $n"
    bad=$(grep -o 'verified [0-9]*/[0-9]*' "$out" | awk '{ split($2, a, "/"); if (a[1] != a[2] || a[1] == 0) print }')
    [ -z "$bad" ] || fail "unequal verification: $bad"
    grep -Eq 'wsync demo: PASS|^demo [a-z]+: all ranks verified' "$out" || fail "no PASS line"
}

case $mode in
demo)
    syncs=$1; shift
    run_demo "$syncs" "$syncs" 'verified [0-9]*/[0-9]* tensors' "$@"
    ;;
lora)
    syncs=$1; shift
    run_demo "$syncs" "$syncs" 'verified [0-9]*/[0-9]* adapter tensors' --lora "$@"
    adapter=$(sed -n 's/.*adapter bytes \([0-9]*\).*/\1/p' "$out" | head -1)
    [ -n "$adapter" ] || fail "no 'adapter bytes' line"
    bad=$(grep -o 'bytes moved [0-9]* vs model bytes [0-9]*' "$out" | awk -v a="$adapter" '{ if ($3 != a || $3 + 0 >= $7 + 0) print }')
    [ -z "$bad" ] || fail "a sync moved other than the adapter's $adapter bytes or not less than the model: $bad"
    [ "$(grep -c 'bytes moved' "$out")" -eq "$syncs" ] || fail "missing 'bytes moved' lines"
    ;;
engine)
    syncs=$1; tp=$2; shift 2
    run_demo "$syncs" $((syncs * tp)) 'verified [0-9]*/[0-9]* engine parameters' --tp "$tp" "$@"
    ;;
bench)
    timeout 300 "$wsync" bench --plugin "$plugin" --layout both "$@" >"$out" 2>&1
    rc=$?
    cat "$out"
    [ $rc -eq 0 ] || fail "wsync bench exited with $rc"
    [ "$(grep -c '^  copy_weights  ' "$out")" -eq 2 ] || fail "no copy_weights row for both layouts"
    ! grep -q 'is wrong' "$out" || fail "a plugin copy is wrong"
    ;;
info)
    "$wsync" info "$plugin" >"$out" 2>&1 || fail "wsync info $plugin failed"
    cat "$out"
    grep -q '^name: *cpu$' "$out" || fail "info does not name the CPU plugin"
    grep -q '^abi: *1 negotiated' "$out" || fail "info does not show the negotiated ABI"
    grep -q '^  copy_weights *present$' "$out" || fail "info does not list copy_weights"
    if "$wsync" info /nonexistent/libwsync_none.so >"$out" 2>&1; then
        fail "info on a missing plugin succeeded"
    fi
    grep -q '/nonexistent/libwsync_none.so' "$out" || fail "the error does not name the path"
    ;;
*)
    echo "usage: $0 demo|lora|engine|bench|info WSYNC PLUGIN ..."; exit 2 ;;
esac
echo "OK"
