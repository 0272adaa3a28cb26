#!/usr/bin/env bash
# Runs every test binary in test/bin (and the emulated CUDA suite when present), sums their
# "N passed, N failed" lines and ends with the total. Exit status is non-zero on any failure. Each
# binary's wall time follows its output, "  (NAME: N s)", to keep the suite's length in view.
# The sanitizer targets of the Makefile (make asan, make tsan) run it on their own builds with:
#   TEST_BIN     folder of the test binaries (test/bin)      TEST_GLOB  which ones ('test_*')
#   YOLO_BIN     the ./yolo for check-ref and test_train      EMU_BIN    the emulated build (run_emu.sh)
#   SKIP_EMU=1, SKIP_CHECK_REF=1   leave those parts out
#   SAN_REPORTS  prefix of the sanitizer report files (log_path): each one is printed and counted
#                as a failure, so a report from a child process (./yolo under test_train) is seen
#   TEST_EXEC    a command put in front of every test binary (make test-arm64: qemu-aarch64 -L sysroot)
cd "$(dirname "$0")/.." || exit 1
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}   # spinning OpenMP threads starve the loader and other tests
pass=0; fail=0; crashed=0
run_one() {
    local out rc
    out=$("$@" 2>&1); rc=$?
    printf '%s\n' "$out"
    local line
    line=$(printf '%s\n' "$out" | grep -E '^[0-9]+ passed, [0-9]+ failed' | tail -n 1)
    if [ -z "$line" ]; then
        echo "CRASH  $* exited $rc without a summary line"; fail=$((fail + 1)); return
    fi
    pass=$((pass + $(echo "$line" | awk '{print $1}')))
    fail=$((fail + $(echo "$line" | awk '{print $3}')))
    if [ "$rc" -ne 0 ] && [ "$(echo "$line" | awk '{print $3}')" = 0 ]; then
        echo "CRASH  $* exited $rc"; fail=$((fail + 1))
    fi
}
bin=${TEST_BIN:-test/bin}
yolo=${YOLO_BIN:-./yolo}
export YOLO_BIN=$yolo
for g in ${TEST_GLOB:-test_*}; do
    for t in "$bin"/$g; do
        [ -f "$t" ] && [ -x "$t" ] || continue
        echo "== $t"
        t0=$SECONDS
        run_one ${TEST_EXEC:-} "$t"
        echo "  ($t: $((SECONDS - t0)) s)"
    done
done
for f in test/fixtures/*.safetensors; do
    [ -f "$f" ] && [ -z "${SKIP_CHECK_REF:-}" ] || continue
    echo "== $yolo check-ref $f (against the PyTorch reference)"
    run_one "$yolo" check-ref "$f"
done
if [ -f test/run_emu.sh ] && [ -z "${SKIP_EMU:-}" ]; then
    echo "== test/run_emu.sh (CUDA kernels under the CPU emulation)"
    t0=$SECONDS
    out=$(bash test/run_emu.sh 2>&1); rc=$?
    printf '%s\n' "$out"
    echo "  (test/run_emu.sh: $((SECONDS - t0)) s)"
    while IFS= read -r line; do
        pass=$((pass + $(echo "$line" | awk '{print $1}')))
        fail=$((fail + $(echo "$line" | awk '{print $3}')))
    done < <(printf '%s\n' "$out" | grep -E '^[0-9]+ passed, [0-9]+ failed')
    if [ "$rc" -ne 0 ] && ! printf '%s\n' "$out" | grep -qE '^[0-9]+ passed, [1-9][0-9]* failed'; then
        echo "CRASH  test/run_emu.sh exited $rc"; fail=$((fail + 1))
    fi
fi
if [ -n "${SAN_REPORTS:-}" ]; then
    nrep=0
    for r in "$SAN_REPORTS".*; do
        [ -f "$r" ] || continue
        echo "FAIL  sanitizer report $r:"; cat "$r"; nrep=$((nrep + 1)); fail=$((fail + 1))
    done
    echo "== sanitizer reports ($SAN_REPORTS.*): $nrep"
fi
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
