#!/usr/bin/env bash
# gpu_check.sh: the one prepared script for a machine with a GPU (issue 7). It builds the kernels
# with nvcc for the GPU it finds, runs every kernel test and the whole-step test against the CPU
# on the real device (cudart + cuBLAS, no emulation), and prints the planned memory of yolov8n and
# yolov8s at 640, batch 16, beside what the device reports. Budget: a few minutes.
#   bash test/gpu_check.sh            (from the repository root)
# Training on the GPU is not wired into `yolo train` yet, so this script cannot time epochs.
set -u
cd "$(dirname "$0")/.." || exit 1
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
nvidia-smi --query-gpu=name,compute_cap,memory.total,memory.used,driver_version --format=csv 2>&1 | head -n 3
cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d .)
status=0
echo "== build (sm_${cap:-default})"
make -s yolo || exit 1
if [ -n "$cap" ]; then make -s test-gpu EMU_ARCHS="$cap" || exit 1; else make -s test-gpu || exit 1; fi
echo "== kernel tests on the GPU (each kernel against its CPU twin)"
start=$(date +%s.%N)
test/bin/gpu/kernels_test | tail -n 25 || status=1
echo "== whole training step on the GPU vs the CPU (YOLOv8n 64x64 batch 2, FP16)"
test/bin/gpu/gpu_step_test | tail -n 25 || status=1
echo "kernel + step tests: $(echo "$(date +%s.%N) - $start" | bc) s"
echo "== planned memory (GPU layout, AMP) at 640, batch 16"
for m in yolov8n yolov8s; do
    ./yolo plan model=$m batch=16 imgsz=640 | sed -n '/GPU layout/,$p' | grep -E "GPU layout|total|context|per image"
done
echo "device memory in use now (nvidia-smi):"
nvidia-smi --query-gpu=memory.used,memory.total --format=csv 2>&1 | tail -n 1
exit $status
