#!/usr/bin/env bash
# run_emu.sh: the emulated CUDA suite (test/emu.mk, test/cuda_emu.h). Runs the kernel tests in the
# three thread and block orders in strict mode, once in async mode with host traps, and the emulator's
# selftest; in the background on the second core, the device training step test (gpu_step_test,
# random order) and a whole `yolo train device=0` run of the CUDA build (test/emu_train.sh; not under
# the sanitizers); then fails any __global__ kernel of yolo_kernels.cu that no test launched. Every
# run prints its own "N passed, N failed" line (test/run.sh sums them); exit status non-zero on failure.
# EMU_BIN selects the build (test/bin/emu, or test/bin/emu-asan for make emu-asan); TEST_EXEC is put in
# front of each test binary and EMU_YOLO replaces $EMU_BIN/yolo (make test-arm64: qemu-aarch64).
cd "$(dirname "$0")/.." || exit 1
bin=${EMU_BIN:-test/bin/emu}
failed=0
log=$(mktemp); trap 'rm -f "$log"' EXIT
report() { # report NAME RC OUTPUT: prints a run's output; a crash without a summary counts as one failure
    local name=$1 rc=$2 out=$3
    echo "== $name"
    printf '%s\n' "$out" | grep -v '^[0-9]* passed, [0-9]* failed'
    local line; line=$(printf '%s\n' "$out" | grep -E '^[0-9]+ passed, [0-9]+ failed' | tail -n 1)
    if [ -z "$line" ]; then echo "FAIL  $name crashed (exit $rc) without a summary line"; echo "0 passed, 1 failed"; failed=1; return; fi
    echo "$line"
    if [ "$rc" -ne 0 ]; then failed=1; fi
}
run() {   # run NAME ENV... -- CMD: one test run, in the foreground
    local name=$1; shift
    local envs=()
    while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
    local out rc
    out=$(env "${envs[@]}" EMU_LAUNCH_LOG="$log" ${TEST_EXEC:-} "$@" 2>&1); rc=$?
    report "$name" "$rc" "$out"
}
if [ ! -x "$bin/kernels_test" ] || [ ! -x "$bin/emu_selftest" ] || [ ! -x "$bin/gpu_step_test" ] || [ ! -x "$bin/ddp_step_test" ]; then
    echo "FAIL  emulated binaries missing in $bin (make emu-bins)"; echo "0 passed, 1 failed"; exit 1
fi
# the device training step (test/gpu_step_test.c, a few minutes in emulation), started in the
# background so that it overlaps the kernel tests on the second core; its own output, status and
# launch log are collected below
gpu_orders=(random)   # the kernels of the step run in all three orders in kernels_test
quick=; case "$bin" in *asan*) quick=1 ;; esac   # under the sanitizers: one device step only

for order in "${gpu_orders[@]}"; do
    ( env EMU_ORDER=$order EMU_SEED=3 EMU_STRICT=1 EMU_LAUNCH_LOG="$log.$order" ${quick:+GPU_STEP_QUICK=1} ${TEST_EXEC:-} "$bin/gpu_step_test" >"$log.$order.out" 2>&1
      echo $? >"$log.$order.rc" ) &
done
trap 'rm -f "$log" "$log".*' EXIT
# the CUDA build of ./yolo (test/bin/emu/yolo) trains a tiny synthetic dataset with device=0: planning,
# one cudaMalloc, steps, validation on the device, checkpoints downloaded (about two minutes; not
# under the sanitizers, where it would take ten)
case "$bin" in *asan*) ;; *)
    ( tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
      EMU_LAUNCH_LOG="$log.train" bash test/emu_train.sh "${EMU_YOLO:-$bin/yolo}" "$tmp" >"$log.train.out" 2>&1; echo $? >"$log.train.rc" ) &
    train_bg=1
    # data parallel over the emulated NCCL (processes and shared memory): the 2- and 3-rank step
    # against the single-process accumulation, then yolo train device=0,1: end to end, a rank
    # killed, resumed on 1 and 3 ranks (test/emu_ddp.sh; about five minutes on a busy 2-core machine)
    ( "$bin/ddp_step_test" >"$log.ddp.out" 2>&1; echo $? >"$log.ddp.rc"
      tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
      bash test/emu_ddp.sh "$bin/yolo" "$tmp" >"$log.ddptrain.out" 2>&1; echo $? >"$log.ddptrain.rc" ) &
    ddp_bg=1 ;;
esac
for order in forward reverse random; do
    run "kernels_test (emulated, $order order, strict)" EMU_ORDER=$order EMU_STRICT=1 -- "$bin/kernels_test"
done
run "kernels_test (emulated, async streams, host traps, random order)" EMU_ASYNC=1 EMU_HOSTTRAP=1 EMU_ORDER=random EMU_SEED=7 -- "$bin/kernels_test"
run "emu_selftest (the emulator's own tests)" EMU_STRICT=0 -- "$bin/emu_selftest"
# the counter mode's figures on kernels with known access patterns (test/emu_count_test.cu; its own
# builds, test/bin/emu-count (loads) and test/bin/emu-count/st (stores), made by make tests; not under
# the sanitizers, whose build it is not)
case "$bin" in *asan*) ;; *)
    for k in "loads:test/bin/emu-count" "stores:test/bin/emu-count/st"; do
        if [ -x "${k#*:}/emu_count_test" ]; then run "emu_count_test (the counter mode, ${k%%:*}: sectors, 16-byte share, bank conflicts)" -- "${k#*:}/emu_count_test"
        else echo "FAIL  ${k#*:}/emu_count_test missing (make emu-count-test)"; echo "0 passed, 1 failed"; failed=1; fi
    done ;;
esac

wait
for order in "${gpu_orders[@]}"; do
    report "gpu_step_test (emulated, $order order, strict; YOLOv8n 64x64 batch 2, and 64x160 for the row tiles)" "$(cat "$log.$order.rc" 2>/dev/null || echo 1)" "$(cat "$log.$order.out")"
    cat "$log.$order" >>"$log" 2>/dev/null
done

if [ -n "${train_bg:-}" ]; then
    report "yolo train device=0 (emulated CUDA build, a 4-image dataset at 32x32: 2 epochs, val, predict, kill and resume)" "$(cat "$log.train.rc" 2>/dev/null || echo 1)" "$(cat "$log.train.out")"
    cat "$log.train" >>"$log" 2>/dev/null
fi

if [ -n "${ddp_bg:-}" ]; then
    report "ddp_step_test (emulated NCCL: a 2- and a 3-rank step against the single-process accumulation)" "$(cat "$log.ddp.rc" 2>/dev/null || echo 1)" "$(cat "$log.ddp.out")"
    report "yolo train device=0,1 (emulated NCCL: end to end, a rank killed, resumed on 1 and 3 ranks)" "$(cat "$log.ddptrain.rc" 2>/dev/null || echo 1)" "$(cat "$log.ddptrain.out")"
fi

# every __global__ kernel of yolo_kernels.cu must be launched by some test
echo "== kernel coverage"
# (launch bounds with one level of parentheses inside: conv_halo_kernel's H3_MIN_BLOCKS(...))
kernels=$(perl -0ne 'while (/__global__\s+(?:__launch_bounds__\s*\((?:[^()]|\([^()]*\))*\)\s*)?void\s+([A-Za-z_]\w*)/g) { print "$1\n" }' yolo_kernels.cu | sort -u)
launched=$(sed 's/<.*//' "$log" | sort -u)
missing=$(comm -23 <(printf '%s\n' $kernels) <(printf '%s\n' $launched))
n=$(printf '%s\n' $kernels | grep -c .)
if [ -n "$missing" ]; then
    for k in $missing; do echo "FAIL  kernel $k in yolo_kernels.cu is launched by no test"; done
    echo "0 passed, 1 failed"; failed=1
else
    echo "PASS  all $n __global__ kernels of yolo_kernels.cu launched by a test"
    echo "1 passed, 0 failed"
fi
exit $failed
