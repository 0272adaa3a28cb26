#!/usr/bin/env bash
# emu_train.sh YOLO TMPDIR: `yolo train device=0` with the CUDA build of yolo.c on the emulated kernels
# (run by test/run_emu.sh): a 4-image synthetic dataset, 2 epochs at 32x32, batch 2. Checks that the run
# plans one cudaMalloc, that device memory in use grew by exactly the plan (emulated cudaMemGetInfo:
# 2 MiB pages), that the arena's high-water mark equals the plan, that validation ran on the device
# that the checkpoints the device state was downloaded into load in the CPU build (yolo val), and
# that yolo val device=0 and yolo predict device=0 run them on the device, and that runs killed after
# epoch 1 and resumed on the device (AMP, with its GradScaler state, and amp=0) end byte for byte as
# uninterrupted ones; and that a step of one image runs (the host touching no device memory).
yolo=$1 tmp=$2
pass=0 fail=0
ok() { if [ "$1" = 1 ]; then echo "PASS  $2"; pass=$((pass + 1)); else echo "FAIL  $2"; fail=$((fail + 1)); fi; }
"$yolo" shapes out="$tmp/data" ntrain=4 nval=2 imgsz=64 seed=3 >/dev/null || { echo "FAIL  yolo shapes"; echo "0 passed, 1 failed"; exit 1; }
start=$(date +%s)
out=$(EMU_STRICT=1 "$yolo" train data="$tmp/data/data.yaml" device=0 epochs=2 imgsz=32 batch=2 workers=1 project="$tmp/runs" name=e 2>&1)
rc=$?
printf '%s\n' "$out" | grep -E '^(device|memory|GradScaler)|epochs completed' | sed 's/^/  /'
echo "  ($(( $(date +%s) - start )) s)"
ok $([ $rc = 0 ] && echo 1) "yolo train device=0 exits 0 (got $rc)"
ok $(printf '%s\n' "$out" | grep -q '^device 0: CUDA emulation' && echo 1) "the run chose the device"
ok $(printf '%s\n' "$out" | grep -q 'in one cudaMalloc' && echo 1) "one cudaMalloc, planned"
ok $(printf '%s\n' "$out" | grep -E 'the arena took .* pages$' | grep -vq NOT && echo 1) "device memory in use grew by exactly the plan (2 MiB pages)"
hw=$(printf '%s\n' "$out" | sed -n 's/.*device arena.s high-water mark was \([0-9.]*\) of \([0-9.]*\) MiB.*/\1 \2/p')
ok $([ -n "$hw" ] && [ "${hw% *}" = "${hw#* }" ] && echo 1) "device arena high-water mark equals the plan ($hw)"
lay=$(printf '%s\n' "$out" | sed -n 's/^memory: \([0-9]*\) step allocations placed by the arena.s layout, \([0-9]*\) steps left it.*/\1 \2/p')
ok $([ -n "$lay" ] && [ "${lay% *}" -gt 0 ] && [ "${lay#* }" = 0 ] && echo 1) \
   "every training and validation step allocated at the offsets of the arena's layout (placed, steps that left it: $lay)"
ok $([ "$(wc -l <"$tmp/runs/e/results.csv")" = 3 ] && echo 1) "results.csv has both epochs' rows (validated on the device)"
ok $([ -s "$tmp/runs/e/weights/last.ckpt" ] && [ -s "$tmp/runs/e/weights/best.safetensors" ] && echo 1) "last.ckpt and best.safetensors written"
val=$("$yolo" val model="$tmp/runs/e/weights/best.safetensors" data="$tmp/data/data.yaml" imgsz=32 batch=2 device=cpu project="$tmp/runs" name=v 2>&1)
ok $([ $? = 0 ] && echo 1) "the downloaded weights validate on the CPU (yolo val device=cpu)"
val=$(EMU_STRICT=1 "$yolo" val model="$tmp/runs/e/weights/best.safetensors" data="$tmp/data/data.yaml" imgsz=32 batch=2 device=0 project="$tmp/runs" name=vd 2>&1)
ok $([ $? = 0 ] && printf '%s\n' "$val" | grep -q 'MiB (device)' && printf '%s\n' "$val" | grep -E 'the arena took' | grep -vq NOT && echo 1) \
   "yolo val device=0: evaluation-only device arena, in use == plan"
prof=$(YOLO_PROFILE=1 EMU_STRICT=1 "$yolo" val model="$tmp/runs/e/weights/best.safetensors" data="$tmp/data/data.yaml" imgsz=32 batch=2 device=0 project="$tmp/runs" name=vp 2>&1)
ok $([ $? = 0 ] && printf '%s\n' "$prof" | grep -q '^device time by kind of launch' && printf '%s\n' "$prof" | grep -Eq '^  conv fwd 3x3 s1 +[0-9]+ ' &&
     printf '%s\n' "$prof" | grep -Eq '^  total +[0-9.]+$' && echo 1) "YOLO_PROFILE=1 yolo val device=0 prints the device time by kind of launch"
img=$(ls "$tmp"/data/images/val/* | head -n 1)
pred=$(EMU_STRICT=1 "$yolo" predict model="$tmp/runs/e/weights/best.safetensors" source="$img" imgsz=64 device=0 conf=0.001 project="$tmp/runs" name=pd 2>&1)
cpu=$("$yolo" predict model="$tmp/runs/e/weights/best.safetensors" source="$img" imgsz=64 device=cpu conf=0.001 project="$tmp/runs" name=pc 2>&1)
nd=$(printf '%s\n' "$pred" | sed -n 's/.*, \([0-9]*\) detections.*/\1/p'); nc=$(printf '%s\n' "$cpu" | sed -n 's/.*, \([0-9]*\) detections.*/\1/p')
ok $([ -n "$nd" ] && [ -s "$tmp/runs/pd/labels/$(basename "${img%.*}").txt" ] && printf '%s\n' "$pred" | grep -E 'the arena took' | grep -vq NOT && echo 1) \
   "yolo predict device=0: $nd detections at conf 0.001 (CPU: $nc), labels written, in use == plan for every input shape"
# killed_resumed NAME ARGS...: the run killed once epoch 1's checkpoint exists (written whole, then
# renamed; at most 5 min), then resumed; its rc
killed_resumed() {
    local name=$1; shift
    ( EMU_STRICT=1 exec "$yolo" train "$@" name="$name" >"$tmp/$name.log" 2>&1 ) & local pid=$!
    for _ in $(seq 1500); do [ -f "$tmp/runs/$name/weights/last.ckpt" ] && break; sleep 0.2; done
    kill -9 $pid 2>/dev/null; wait $pid 2>/dev/null
    EMU_STRICT=1 "$yolo" train "$@" name="$name" resume=1 >"$tmp/$name.resumed.log" 2>&1
    local rc=$?
    grep -q 'resuming .* from epoch 2' "$tmp/$name.resumed.log" || rc=99
    return $rc
}
# AMP: against run e (the GradScaler's scale and good steps come back with the checkpoint)
common="data=$tmp/data/data.yaml device=0 epochs=2 imgsz=32 batch=2 workers=1 project=$tmp/runs"
killed_resumed eb $common; rcb=$?
ok $([ $rc = 0 ] && [ $rcb = 0 ] && cmp -s "$tmp/runs/e/weights/last.safetensors" "$tmp/runs/eb/weights/last.safetensors" && echo 1) \
   "AMP on the device: a run killed after epoch 1 and resumed ends with last.safetensors identical to an uninterrupted run (rc $rcb)"
# amp=0 (FP32 device step): an uninterrupted run and the same run killed and resumed
EMU_STRICT=1 "$yolo" train $common amp=0 name=fa >"$tmp/fa.log" 2>&1; rca=$?
killed_resumed fb $common amp=0; rcb=$?
ok $([ $rca = 0 ] && [ $rcb = 0 ] && cmp -s "$tmp/runs/fa/weights/last.safetensors" "$tmp/runs/fb/weights/last.safetensors" && echo 1) \
   "amp=0 on the device: a run killed after epoch 1 and resumed ends with last.safetensors identical to an uninterrupted run (rc $rca, $rcb)"
# a batch of 1 on the device (4 images at batch 3: each epoch's last batch holds one) with the host's
# accesses to device memory trapped: what the walk keeps per conv for the batch must be host memory
b1=$(EMU_STRICT=1 EMU_HOSTTRAP=1 "$yolo" train data="$tmp/data/data.yaml" device=0 epochs=1 imgsz=32 batch=3 workers=1 \
     project="$tmp/runs" name=b1 2>&1); rc1=$?
ok $([ $rc1 = 0 ] && echo 1) "yolo train device=0 batch=3 on 4 images (a last batch of 1), host traps on: exits 0 (got $rc1)"
[ $rc1 = 0 ] || printf '%s\n' "$b1" | tail -n 5 | sed 's/^/  /'
echo "$pass passed, $fail failed"
[ $fail = 0 ]
