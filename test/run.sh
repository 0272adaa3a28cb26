#!/usr/bin/env bash
# Runs every test binary in test/bin (and the emulated CUDA suite when present), sums their
# "N passed, N failed" lines and ends with the total. Exit status is non-zero on any failure.
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
for t in test/bin/test_*; do
    [ -x "$t" ] || continue
    echo "== $t"
    run_one "$t"
done
for f in test/fixtures/*.safetensors; do
    [ -f "$f" ] || continue
    echo "== ./yolo check-ref $f (against the PyTorch reference)"
    run_one ./yolo check-ref "$f"
done
if [ -f test/run_emu.sh ]; then
    echo "== test/run_emu.sh (CUDA kernels under the CPU emulation)"
    out=$(bash test/run_emu.sh 2>&1); rc=$?
    printf '%s\n' "$out"
    while IFS= read -r line; do
        pass=$((pass + $(echo "$line" | awk '{print $1}')))
        fail=$((fail + $(echo "$line" | awk '{print $3}')))
    done < <(printf '%s\n' "$out" | grep -E '^[0-9]+ passed, [0-9]+ failed')
    if [ "$rc" -ne 0 ] && ! printf '%s\n' "$out" | grep -qE '^[0-9]+ passed, [1-9][0-9]* failed'; then
        echo "CRASH  test/run_emu.sh exited $rc"; fail=$((fail + 1))
    fi
fi
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
