#!/usr/bin/env bash
# gpu_check.sh: the one prepared script for a machine with a GPU (issue 7), within 5 minutes (about 2 on
# an H200 with prebuilt binaries). It builds ./yolo and the tests with nvcc for the GPU it finds, runs
# every kernel test and the whole-step test against the CPU on the real device (no emulation), then
# trains the synthetic dataset at 640 with batch 16 for yolov8n and yolov8s (2 epochs each) and prints
# images/s and the planned device memory beside what the device reports in use, then times the device
# step alone (test/bin/gpu/gpu_bench) and, where python3 has CUDA torch, PyTorch's step on the same GPU
# (test/bench_step.py --device cuda), then each kernel of one step under ncu (where installed, with
# GPU_CHECK_LOGS), then (with two GPUs) a data-parallel run on GPUs 0,1 over NCCL, then where the time
# of a training step goes (YOLO_PROFILE=1) and that measured time per kind beside the MODEL of
# test/gpu_model.sh (issue 14), and the ncu step by kind (test/ncu_kinds.py).
#   bash test/gpu_check.sh            (from the repository root)
# GPU_CHECK_PREBUILT=1: ./yolo, test/bin/gpu/{kernels_test,gpu_step_test,gpu_bench} and
# test/bin/emu-count/step.tsv were built on another machine (make test-gpu EMU_ARCHS=90 and the yolo
# link with CUDA_ARCH=90 for an H100/H200, -march no newer than the GPU machine's CPU) and copied here,
# with the libraries they link that it lacks on LD_LIBRARY_PATH (libjpeg, libpng, libyaml, libcudart);
# nothing is built, so a machine without the jpeg/png/yaml headers runs the check too.
# GPU_CHECK_LOGS=DIR: the tests' and the training runs' whole outputs are kept there.
# GPU_CHECK_SANITIZE=1: the whole-step test once more under compute-sanitizer's memcheck (where it runs).
set -u
cd "$(dirname "$0")/.." || exit 1
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
nvidia-smi --query-gpu=name,compute_cap,memory.total,memory.used,driver_version --format=csv 2>&1 | head -n 3
cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d .)
status=0
t0=$(date +%s)
# the emulator's counts of one yolov8n 640 batch-16 step (make emu-count, CPU only, ~3 minutes on
# one core), made in the background while the GPU runs, for the MODEL-vs-measured table at the end
if [ "${GPU_CHECK_PREBUILT:-0}" = 1 ]; then
    echo "== prebuilt binaries (GPU_CHECK_PREBUILT=1): no build"
    for f in yolo test/bin/gpu/kernels_test test/bin/gpu/gpu_step_test test/bin/gpu/gpu_bench; do
        [ -x "$f" ] || { echo "GPU_CHECK_PREBUILT=1: $f missing"; exit 1; }
    done
    count_pid=""
else
    ( make -s emu-count >/tmp/gpu_check_count.$$ 2>&1 ) &
    count_pid=$!
    echo "== build (sm_${cap:-default})"
    make -s -j"$(nproc)" yolo ${cap:+CUDA_ARCH=$cap} || exit 1
    make -s test-gpu ${cap:+EMU_ARCHS=$cap} || exit 1
fi
echo "== kernel tests on the GPU (each kernel against its CPU twin)"
# the tests' own exit status, not tail's: a failure anywhere fails the script
out=$(timeout 180 test/bin/gpu/kernels_test 2>&1) || { rc=$?; status=1; echo "kernels_test: exit $rc (124: stopped at 180 s)"; }
[ -n "${GPU_CHECK_LOGS:-}" ] && printf '%s\n' "$out" >"$GPU_CHECK_LOGS/kernels_test.log"
printf '%s\n' "$out" | grep -E '^FAIL' | head -n 20
printf '%s\n' "$out" | tail -n 3
echo "== whole training step on the GPU vs the CPU (YOLOv8n 64x64 batch 2, FP16)"
out=$(timeout 120 test/bin/gpu/gpu_step_test 2>&1) || { rc=$?; status=1; echo "gpu_step_test: exit $rc (124: stopped at 120 s)"; }
[ -n "${GPU_CHECK_LOGS:-}" ] && printf '%s\n' "$out" >"$GPU_CHECK_LOGS/gpu_step_test.log"
printf '%s\n' "$out" | tail -n 40
echo "build + tests: $(( $(date +%s) - t0 )) s"
echo "== training on the GPU: synthetic shapes at 640, batch 16, 2 epochs"
data=$(mktemp -d)
./yolo shapes out="$data" ntrain=320 nval=64 imgsz=640 >/dev/null || exit 1
for m in yolov8n yolov8s; do
    ./yolo plan model=$m batch=16 imgsz=640 nc=4 | grep -E '^  total|device total'
    out=$(timeout 200 ./yolo train data="$data/data.yaml" model=$m imgsz=640 batch=16 epochs=2 device=0 workers="$(nproc)" \
          project="$data/runs" name=$m 2>&1); rc=$?
    [ -n "${GPU_CHECK_LOGS:-}" ] && printf '%s\n' "$out" >"$GPU_CHECK_LOGS/train_$m.log"
    [ $rc = 0 ] || { echo "$out" | tail -n 20; echo "$m: exit $rc (124: stopped at 200 s)"; status=1; continue; }
    printf '%s\n' "$out" | grep -E '^device|^memory|in use|^ +[0-9]+/2 |GradScaler|epochs completed|^loader: the training'
    its=$(printf '%s\n' "$out" | grep -E '^ +2/2 ' | tail -n 1 | sed -n 's/.* \([0-9.]*\) it\/s.*/\1/p')
    [ -n "$its" ] && echo "$m: $(awk -v a="$its" 'BEGIN { print a * 16 }') images/s in epoch 2 (its it/s: the loader's waits included, validation not)"
done
echo "== the device step alone (test/bin/gpu/gpu_bench: a batch already in host memory) and PyTorch's on this GPU"
# the same step in PyTorch (test/bench_step.py: test/reference.py's YOLOv8, AMP as Ultralytics trains, SGD),
# where a python3 with CUDA torch is installed: with reference.py's v8 loss (written for parity, not
# speed) and with the loss replaced by a sum (PyTorch's network, backward and optimizer alone: a floor
# under any PyTorch trainer's step)
for sc in n s; do
    out=$(timeout 120 test/bin/gpu/gpu_bench $sc 16 640 30 1 2>&1) || { echo "$out" | tail -n 5; status=1; }
    printf '%s\n' "$out" | grep -E '^yolo\.c'
    ours=$(printf '%s\n' "$out" | awk '$1 == "gpustep" { print $7 }')
    python3 -c 'import torch, sys; sys.exit(not torch.cuda.is_available())' 2>/dev/null || continue
    for loss in v8 sum; do
        out=$(timeout 150 python3 test/bench_step.py --device cuda --amp --scale $sc --loss $loss --batch 16 --imgsz 640 \
              --reps 30 2>&1)
        printf '%s\n' "$out" | grep -E '^PyTorch' || printf '%s\n' "$out" | tail -n 5
        pt=$(printf '%s\n' "$out" | sed -n 's/.*(\([0-9]*\) images\/s).*/\1/p')
        [ -n "$ours" ] && [ -n "$pt" ] && awk -v a="$ours" -v b="$pt" -v sc=$sc -v l=$loss 'BEGIN {
            printf "yolov8%s 640 batch 16: yolo.c %.0f images/s, PyTorch (loss %s) %.0f images/s: yolo.c / PyTorch %.2f\n",
                   sc, a, l, b, a / b }'
    done
done
# each kernel's own time in one step (Nsight Compute, where it reads the counters): gpu_bench's last
# step (the 12th: 6 with the batch pageable, then 6 page-locked)
if command -v ncu >/dev/null && [ -n "${GPU_CHECK_LOGS:-}" ]; then
    echo "== each launch of one yolov8n 640 batch-16 step under ncu (gpu__time_duration; $GPU_CHECK_LOGS/ncu_step.csv)"
    GPU_BENCH_PROFILE_LAST=1 timeout 200 ncu --clock-control none --profile-from-start off --metrics gpu__time_duration.sum \
        --csv test/bin/gpu/gpu_bench n 16 640 1 1 >"$GPU_CHECK_LOGS/ncu_step.csv" 2>"$GPU_CHECK_LOGS/ncu_step.err"
    echo "ncu: exit $?; $(grep -c gpu__time_duration "$GPU_CHECK_LOGS/ncu_step.csv") launches timed"
    # why the convs take the time they take: ncu_why NAME REGEX N, the first N launches of the same step
    # whose kernel matches REGEX, with achieved occupancy, tensor-pipe activity and the warps' stall
    # reasons, into $GPU_CHECK_LOGS/NAME.csv, which ncu_kinds.py --why reads
    ncu_why() {
        GPU_BENCH_PROFILE_LAST=1 timeout 240 ncu --clock-control none --profile-from-start off -k "regex:$2" --launch-count "$3" \
            --section Occupancy --section WarpStateStats --section ComputeWorkloadAnalysis \
            --metrics 'gpu__time_duration.sum,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio' --csv \
            test/bin/gpu/gpu_bench n 16 640 1 1 >"$GPU_CHECK_LOGS/$1.csv" 2>"$GPU_CHECK_LOGS/$1.err"
        echo "ncu: exit $?"
        python3 test/ncu_kinds.py --why "$GPU_CHECK_LOGS/$1.csv" || true
    }
    echo "== the first 60 conv launches of that step: occupancy, tensor pipe, stall reasons ($GPU_CHECK_LOGS/ncu_convs.csv)"
    ncu_why ncu_convs conv_ 60
    # the step's 3x3 weight gradients (its 38 launches of conv_halo_wgrad_kernel, all after the 60
    # above): two blocks an SM, at more instructions and in twice the slices, against the one before
    echo "== the 3x3 weight-gradient launches of that step: the same sections ($GPU_CHECK_LOGS/ncu_wgrad.csv)"
    ncu_why ncu_wgrad conv_halo_wgrad 38
fi
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
if [ "$ngpu" -ge 2 ]; then
    echo "== data parallel over NCCL: yolov8n on GPUs 0,1, global batch 32 (16 per GPU), 2 epochs"
    out=$(./yolo train data="$data/data.yaml" model=yolov8n imgsz=640 batch=32 epochs=2 device=0,1 workers="$(nproc)" \
          project="$data/runs" name=ddp 2>&1) || status=1
    printf '%s\n' "$out" | grep -E '^(DDP|NCCL|data parallel|device|memory)|in use|^ +[0-9]+/2 |all-reduce:|epochs completed|rank [0-9]'
    its=$(printf '%s\n' "$out" | grep -E '^ +2/2 ' | tail -n 1 | sed -n 's/.* \([0-9.]*\) it\/s.*/\1/p')
    [ -n "$its" ] && echo "2 GPUs: $(awk -v a="$its" 'BEGIN { print a * 32 }') images/s in epoch 2"
    [ "$(wc -l <"$data/runs/ddp/results.csv" 2>/dev/null)" = 3 ] || { echo "FAIL  data parallel: results.csv missing or not 2 rows"; status=1; }
else
    echo "== data parallel: skipped ($ngpu GPU(s); a 2-GPU epoch runs when the machine has two)"
fi
echo "== where a training step's time goes: yolov8n 640 batch 16, 1 epoch of 64 images, YOLO_PROFILE=1"
./yolo shapes out="$data/small" ntrain=64 nval=16 imgsz=640 >/dev/null || exit 1
YOLO_PROFILE=1 timeout 150 ./yolo train data="$data/small/data.yaml" model=yolov8n imgsz=640 batch=16 epochs=1 device=0 workers="$(nproc)" \
    project="$data/runs" name=prof 2>&1 | sed -n '/^device time by kind/,/^  total/p' | tee "$data/prof.txt"
# measured (above) beside the MODEL (test/gpu_model.sh) per kind, per step: the measured total is
# scaled by the model's launches of that kind in one step over the measured launches
echo "== measured vs MODEL, per training step, by kind (yolov8n 640 batch 16)"
[ -n "$count_pid" ] && wait "$count_pid"
case "$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)" in
    *A100*) mg=A100 ;; *H100*|*H200*|*GH200*) mg=H100 ;; *4090*) mg=RTX4090 ;; *3060*) mg=RTX3060 ;;
    *) case "$cap" in 80) mg=A100 ;; 86) mg=RTX3060 ;; 89) mg=RTX4090 ;; *) mg=H100 ;; esac ;;
esac
if [ -f test/bin/emu-count/step.tsv ] && bash test/gpu_model.sh test/bin/emu-count/step.tsv --gpu "$mg" --tsv >"$data/model.tsv"; then
    awk -v mg="$mg" -F'\t' 'FILENAME ~ /model/ { ml[$1] = $2; mt[$1] = $3; next }
        /^  / && !/^  kind/ && !/^  total/ {
            k = substr($0, 3, 24); sub(/ +$/, "", k); split(substr($0, 28), f, " ")
            meas[k] = f[2]; nmeas[k] = f[1]; order[++n] = k }
        END {
            printf "  %-24s %12s %12s %8s   (MODEL: the %s row of test/gpu_model.sh)\n", "kind", "measured ms", "MODEL ms", "ratio", mg
            for (i = 1; i <= n; i++) { k = order[i]; if (!(k in mt) || !nmeas[k]) continue
                m = meas[k] * ml[k] / nmeas[k]; tm += m; tt += mt[k]
                printf "  %-24s %12.3f %12.3f %8.2f\n", k, m, mt[k], (mt[k] > 0 ? m / mt[k] : 0) }
            printf "  %-24s %12.3f %12.3f %8.2f\n", "total (kinds in both)", tm, tt, (tt > 0 ? tm / tt : 0) }' "$data/model.tsv" "$data/prof.txt"
else
    echo "no MODEL figures: make emu-count failed"; tail -n 5 /tmp/gpu_check_count.$$
fi
rm -f /tmp/gpu_check_count.$$
if [ -s "${GPU_CHECK_LOGS:-/nonexistent}/ncu_step.csv" ] && [ -f test/bin/emu-count/step.tsv ]; then
    echo "== the ncu step by kind: each launch's measured time matched to the emulator's launch list (test/ncu_kinds.py)"
    python3 test/ncu_kinds.py "$GPU_CHECK_LOGS/ncu_step.csv" test/bin/emu-count/step.tsv
fi
if [ "${GPU_CHECK_SANITIZE:-0}" = 1 ] && command -v compute-sanitizer >/dev/null; then
    echo "== the whole-step test under compute-sanitizer --tool memcheck (at most 90 s)"
    timeout 90 compute-sanitizer --tool memcheck --error-exitcode 3 --print-limit 20 test/bin/gpu/gpu_step_test 2>&1 |
        grep -vE '^(ok|PASS) ' | tail -n 40
    rc=${PIPESTATUS[0]}
    echo "compute-sanitizer memcheck: exit $rc (0: clean, 3: errors found, 124: stopped at 90 s)"
    [ "$rc" = 3 ] && status=1
fi
echo "device memory in use now (nvidia-smi):"
nvidia-smi --query-gpu=memory.used,memory.total --format=csv 2>&1 | tail -n 1
echo "total: $(( $(date +%s) - t0 )) s"
rm -rf "$data"
[ $status = 0 ] && echo "gpu_check: all passed" || echo "gpu_check: FAILURES above"
exit $status
