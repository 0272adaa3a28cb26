#!/usr/bin/env bash
# make bench: one whole training step of YOLOv8n (batch 8, forward+loss, backward, clip, SGD) in
# yolo.c (test/bin/bench_step) and in PyTorch (test/bench_step.py, test/reference.py's model) in
# the same run, at 320 and 640, best of BENCH_REPS (5) each, the two alternating for
# BENCH_ROUNDS (1) rounds; prints both, the ratio yolo.c / PyTorch and the CPU. Then one epoch of
# the shapes set with ./yolo train. Without python3-torch the PyTorch half is skipped.
# BENCH_THREADS (2) sets OMP_NUM_THREADS for both. yolo.c's threads wait as ./yolo's do (a short
# spin on a machine idle at start, passive on a busy one; OMP_WAIT_POLICY or GOMP_SPINCOUNT
# decide instead when set); PyTorch runs with its own defaults. Each side also reports its
# best CPU time per step (all threads): on a busy machine that ratio is steadier than wall time's.
# BENCH_ISA=avx2 on an AVX-512 machine compares the AVX2 code paths of both: yolo.c's step built
# for Haswell (test/bin/bench_step_avx2: AVX2 + FMA, no AVX-512) against PyTorch with oneDNN and
# ATen held to AVX2 (ONEDNN_MAX_CPU_ISA, ATEN_CPU_CAPABILITY).
set -u
cd "$(dirname "$0")/.." || exit 1
threads=${BENCH_THREADS:-2} reps=${BENCH_REPS:-5} rounds=${BENCH_ROUNDS:-1} sizes=${BENCH_SIZES:-"320 640"}
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
isa=$(grep -o -w 'avx512f\|avx2\|asimd' /proc/cpuinfo | sort -u | tr '\n' ' ')
echo "CPU: ${cpu:-unknown} ($(nproc) cores; ${isa:-no AVX2/AVX-512/NEON flag}), $threads threads, load average $(cut -d' ' -f1-3 /proc/loadavg)"
py=""
for p in /usr/bin/python3 python3; do
    if command -v "$p" >/dev/null 2>&1 && "$p" -c 'import torch' >/dev/null 2>&1; then py=$p; break; fi
done
[ -n "$py" ] || echo "python3-torch not found: the PyTorch half is skipped (apt-get install python3-torch)"
bin=test/bin/bench_step
if [ "${BENCH_ISA:-}" = avx2 ]; then
    bin=test/bin/bench_step_avx2
    export ONEDNN_MAX_CPU_ISA=AVX2 DNNL_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2
    echo "ISA: AVX2 for both ($bin, built -march=haswell; PyTorch with ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2)"
fi
status=0
for S in $sizes; do
    yb="" pb="" yc="" pc=""
    for r in $(seq "$rounds"); do
        line=$(OMP_NUM_THREADS=$threads "$bin" 8 "$S" "$reps") || status=1
        echo "$line" | head -n 1
        t=$(echo "$line" | awk '$1 == "step" {print $5}') c=$(echo "$line" | awk '$1 == "step" {print $9}')
        [ -n "$t" ] && { [ -z "$yb" ] || awk "BEGIN{exit !($t < $yb)}"; } && yb=$t
        [ -n "$c" ] && { [ -z "$yc" ] || awk "BEGIN{exit !($c < $yc)}"; } && yc=$c
        if [ -n "$py" ]; then
            line=$(OMP_NUM_THREADS=$threads "$py" test/bench_step.py --batch 8 --imgsz "$S" --reps "$reps" --threads "$threads") || status=1
            echo "$line" | head -n 1
            t=$(echo "$line" | awk '$1 == "step" {print $5}') c=$(echo "$line" | awk '$1 == "step" {print $9}')
            [ -n "$t" ] && { [ -z "$pb" ] || awk "BEGIN{exit !($t < $pb)}"; } && pb=$t
            [ -n "$c" ] && { [ -z "$pc" ] || awk "BEGIN{exit !($c < $pc)}"; } && pc=$c
        fi
    done
    if [ -n "$yb" ] && [ -n "$pb" ]; then
        awk -v s="$S" -v y="$yb" -v p="$pb" -v c="$cpu" -v t="$threads" -v yc="$yc" -v pc="$pc" -v i="${BENCH_ISA:+, ${BENCH_ISA^^} code paths}" \
            'BEGIN{printf "BENCH step %s px batch 8, %s threads%s: yolo.c %.3f s, PyTorch %.3f s, ratio yolo.c/PyTorch %.2f (CPU time %.3f / %.3f s, ratio %.2f) (%s)\n", s, t, i, y, p, y / p, yc, pc, yc / pc, c}'
    elif [ -n "$yb" ]; then
        echo "BENCH step $S px batch 8, $threads threads: yolo.c $yb s (no PyTorch to compare with)"
    fi
done
# one epoch of the shapes set, end to end (loader, training, validation), the demo's settings
[ -f data/shapes/data.yaml ] || ./yolo shapes out=data/shapes >/dev/null || status=1
start=$(date +%s.%N)
./yolo train data=data/shapes/data.yaml model=yolov8n epochs=1 imgsz=160 batch=16 workers=2 name=bench exist_ok=1 \
    >/tmp/yolo_bench_epoch.$$ 2>&1 || { cat /tmp/yolo_bench_epoch.$$; status=1; }
rm -f /tmp/yolo_bench_epoch.$$
awk -v a="$start" -v b="$(date +%s.%N)" -v c="$cpu" 'BEGIN{printf "BENCH one epoch of data/shapes (yolov8n, 160 px, batch 16, train + val): %.1f s wall (%s)\n", b - a, c}'
exit $status
