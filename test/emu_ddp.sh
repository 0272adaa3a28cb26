#!/usr/bin/env bash
# emu_ddp.sh YOLO TMPDIR: data-parallel training with the CUDA build of yolo.c on the emulated kernels and
# the emulated NCCL (processes and shared memory; test/emu_include/nccl.h), run by test/run_emu.sh.
# A 4-image synthetic dataset at 32x32, global batch 6 (3 per rank on 2 ranks, 2 on 3, 6 on 1), so the
# same checkpoint resumes on 1, 2 or 3 GPUs. Checks: the clear errors (a device listed twice, a device
# past the count, a batch the ranks do not divide); a 2-rank `yolo train device=0,1` end to end (one
# results.csv, checkpoints, only rank 0 writes); the same launched torchrun-style (id over TCP); a 2-rank run whose rank 1 is killed (SIGKILL) once
# epoch 1's checkpoint exists: the run stops within the timeout with a message naming rank 1, and
# last.ckpt is byte for byte the one that existed at the kill; that run resumed on 1 rank and, from a
# copy, on 3 ranks, each finishing epoch 2; a rank that hangs (SIGSTOP) instead; the same run started
# by mpirun (the NCCL id over MPI) with batch=-1 on two cards of different sizes.
yolo=$1 tmp=$2
pass=0 fail=0
ok() { if [ "$1" = 1 ]; then echo "PASS  $2"; pass=$((pass + 1)); else echo "FAIL  $2"; fail=$((fail + 1)); fi; }
# the timeouts are long: a rank must see its peer's death itself (at its next collective), not be
# killed by the launcher because its step was slow on a busy machine
export EMU_DEVICES=3 YOLO_DDP_TIMEOUT=600 EMU_NCCL_TIMEOUT=600
"$yolo" shapes out="$tmp/data" ntrain=4 nval=1 imgsz=64 seed=3 >/dev/null || { echo "FAIL  yolo shapes"; echo "0 passed, 1 failed"; exit 1; }
common="data=$tmp/data/data.yaml imgsz=32 batch=6 workers=1 project=$tmp/runs"

err=$("$yolo" train $common epochs=1 device=0,0 name=x 2>&1); rc=$?
ok $([ $rc != 0 ] && printf '%s\n' "$err" | grep -q 'device 0 is listed twice' && echo 1) "device=0,0 is refused: $(printf '%s\n' "$err" | tail -n 1)"
err=$("$yolo" train $common epochs=1 device=0,3 name=x 2>&1); rc=$?
ok $([ $rc != 0 ] && printf '%s\n' "$err" | grep -q 'there is no device 3 (3 CUDA device' && echo 1) "device=0,3 with 3 devices is refused: $(printf '%s\n' "$err" | tail -n 1)"
err=$("$yolo" train $common epochs=1 device=0,1 batch=5 name=x 2>&1); rc=$?
ok $([ $rc != 0 ] && printf '%s\n' "$err" | grep -q 'batch=5 does not split evenly over 2 GPUs' && echo 1) "batch=5 over 2 GPUs is refused: $(printf '%s\n' "$err" | tail -n 1)"
ok $([ ! -e "$tmp/runs/x/weights/last.ckpt" ] && echo 1) "the refused runs trained nothing"

start=$(date +%s)
out=$(EMU_STRICT=1 "$yolo" train $common epochs=1 device=0,1 name=d 2>&1); rc=$?
printf '%s\n' "$out" | grep -E '^(DDP|NCCL|data parallel)|all-reduce [0-9]|epochs completed' | sed 's/^/  /'
echo "  ($(( $(date +%s) - start )) s)"
ok $([ $rc = 0 ] && echo 1) "yolo train device=0,1 (2 ranks) exits 0 (got $rc)"
ok $(printf '%s\n' "$out" | grep -q '^NCCL: rank 0 of 2 on device 0' && printf '%s\n' "$out" | grep -q '^data parallel: 2 ranks, batch 3 per rank' && echo 1) \
   "two ranks, batch 6 split 3 + 3, the communicator set up before the arena"
ok $(printf '%s\n' "$out" | grep -Eq ' +1/1 .*it/s  all-reduce [0-9.]+ s not hidden' && echo 1) "the epoch line reports the communication time"
ok $([ "$(wc -l <"$tmp/runs/d/results.csv")" = 2 ] && [ "$(find "$tmp/runs" -name results.csv | wc -l)" = 1 ] && echo 1) \
   "one results.csv (rank 0's), with the epoch's row"
ok $([ -s "$tmp/runs/d/weights/last.ckpt" ] && [ -s "$tmp/runs/d/weights/best.safetensors" ] && [ "$(ls "$tmp/runs" | grep -v '^x$')" = d ] && echo 1) \
   "last.ckpt and best.safetensors written, in the one run folder the launcher chose"

# torchrun-style: two processes started by hand with RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT;
# rank 0 hands the NCCL id and its run folder to rank 1 over TCP
port=$((20000 + $$ % 20000))
for r in 0 1; do
    ( RANK=$r LOCAL_RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port EMU_STRICT=1 \
      exec "$yolo" train $common epochs=1 device=0,1 name=tr >"$tmp/tr$r.log" 2>&1 ) & eval "tr$r=\$!"
done
wait $tr0; rc0=$?; wait $tr1; rc1=$?
ok $([ $rc0 = 0 ] && [ $rc1 = 0 ] && grep -q '^NCCL: rank 1 of 2 on device 1' "$tmp/tr1.log" && [ "$(wc -l <"$tmp/runs/tr/results.csv")" = 2 ] &&
     [ -z "$(ls "$tmp/runs" | grep '^tr.')" ] && echo 1) \
   "torchrun-style launch (RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, id over TCP): both ranks exit 0 (rc $rc0, $rc1), one run folder, results.csv"

# a rank killed: run k, rank 1 gets SIGKILL as soon as epoch 1's checkpoint exists
( EMU_STRICT=1 exec "$yolo" train $common epochs=2 device=0,1 name=k >"$tmp/k.log" 2>&1 ) & pid=$!
for _ in $(seq 3000); do [ -f "$tmp/runs/k/weights/last.ckpt" ] && break; sleep 0.1; done
cp "$tmp/runs/k/weights/last.ckpt" "$tmp/k.ckpt" 2>/dev/null
r1=
for c in $(ps -o pid= --ppid $pid); do tr '\0' '\n' <"/proc/$c/environ" 2>/dev/null | grep -qx 'RANK=1' && r1=$c; done
[ -n "$r1" ] && kill -9 "$r1"
t0=$(date +%s); wait $pid; rck=$?; dt=$(( $(date +%s) - t0 ))
sed 's/^/  /' "$tmp/k.log" | grep -E 'DDP|rank [0-9]' | head -n 4
ok $([ -n "$r1" ] && [ $rck != 0 ] && [ $dt -le 630 ] && echo 1) "rank 1 killed once epoch 1's checkpoint existed: the run stopped in $dt s (limit YOLO_DDP_TIMEOUT + 30 = 630), exit $rck"
ok $(grep -q 'DDP: rank 1 (device 1) was killed by signal 9' "$tmp/k.log" && echo 1) "the launcher names the rank that died"
ok $(grep -q 'rank 0 of 2: .*another rank died or hung' "$tmp/k.log" && echo 1) "rank 0 saw the failure in its collective and stopped (ncclCommAbort)"
ok $(cmp -s "$tmp/k.ckpt" "$tmp/runs/k/weights/last.ckpt" && echo 1) "last.ckpt intact: byte for byte the epoch-1 checkpoint"
cp -r "$tmp/runs/k" "$tmp/runs/k3"
out=$(EMU_STRICT=1 "$yolo" train $common epochs=2 device=0 name=k resume=1 2>&1); rc=$?
ok $([ $rc = 0 ] && printf '%s\n' "$out" | grep -q 'resuming .* from epoch 2' && [ "$(wc -l <"$tmp/runs/k/results.csv")" = 3 ] && echo 1) \
   "the killed 2-rank run resumed on 1 GPU (device=0) finishes epoch 2 (rc $rc)"
out=$(EMU_STRICT=1 "$yolo" train $common epochs=2 device=0,1,2 name=k3 resume=1 2>&1); rc=$?
ok $([ $rc = 0 ] && printf '%s\n' "$out" | grep -q 'resuming .* from epoch 2' && printf '%s\n' "$out" | grep -q 'data parallel: 3 ranks, batch 2 per rank' &&
     [ "$(wc -l <"$tmp/runs/k3/results.csv")" = 3 ] && echo 1) "the same checkpoint resumed on 3 GPUs (device=0,1,2) finishes epoch 2 (rc $rc)"

# a rank that hangs instead of dying: rank 1 stopped (SIGSTOP) once epoch 1's checkpoint exists; rank 0's
# next collective times out (30 s here), it aborts its communicator and says which wait failed; rank 1,
# let go again (SIGCONT), finds the communicator in error and stops too
( EMU_STRICT=1 YOLO_DDP_TIMEOUT=30 EMU_NCCL_TIMEOUT=30 exec "$yolo" train $common epochs=2 device=0,1 name=h >"$tmp/h.log" 2>&1 ) & pid=$!
for _ in $(seq 3000); do [ -f "$tmp/runs/h/weights/last.ckpt" ] && break; sleep 0.1; done
cp "$tmp/runs/h/weights/last.ckpt" "$tmp/h.ckpt" 2>/dev/null
r0= r1=
for c in $(ps -o pid= --ppid $pid); do
    e=$(tr '\0' '\n' <"/proc/$c/environ" 2>/dev/null)
    printf '%s\n' "$e" | grep -qx 'RANK=0' && r0=$c
    printf '%s\n' "$e" | grep -qx 'RANK=1' && r1=$c
done
[ -n "$r1" ] && kill -STOP "$r1"
t0=$(date +%s)
while [ -n "$r0" ] && kill -0 "$r0" 2>/dev/null && [ $(( $(date +%s) - t0 )) -lt 300 ]; do sleep 1; done
dt=$(( $(date +%s) - t0 ))
[ -n "$r1" ] && kill -CONT "$r1"
wait $pid; rch=$?
sed 's/^/  /' "$tmp/h.log" | grep -E 'DDP|rank [0-9]' | head -n 4
ok "$([ -n "$r1" ] && [ -n "$r0" ] && [ $dt -ge 25 ] && [ $dt -le 120 ] && [ $rch != 0 ] && echo 1)" \
   "rank 1 hung (SIGSTOP) after epoch 1: rank 0 stopped on its own after $dt s (timeout 30 s), the run exits $rch"
ok "$(grep -q 'waited 30 s for its peers' "$tmp/h.log" && grep -q 'rank 0 of 2: .*another rank died or hung' "$tmp/h.log" && echo 1)" \
   "rank 0's collective timed out (30 s) and it stopped naming the wait (ncclCommAbort)"
ok "$(cmp -s "$tmp/h.ckpt" "$tmp/runs/h/weights/last.ckpt" && echo 1)" "last.ckpt intact after the hang"

# mpirun: the ranks' environment from OpenMPI (OMPI_COMM_WORLD_*), the NCCL id over MPI; batch=-1 on two
# cards of different sizes (EMU_DEVICE_MIB): AutoBatch on each, the smallest card's batch on both
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_plm=isolated
if ! command -v mpirun >/dev/null 2>&1 || ! ldd "$yolo" 2>/dev/null | grep -q libmpi; then
    echo "SKIP  mpirun launch and batch=-1 over two cards (no mpirun, or this yolo was built without MPI: apt-get install libopenmpi-dev openmpi-bin)"
elif ! timeout 120 mpirun -np 2 --oversubscribe true >/dev/null 2>&1; then
    echo "SKIP  mpirun launch and batch=-1 over two cards: this machine's mpirun cannot start 2 processes (mpirun -np 2 true fails)"
else
    out=$(EMU_DEVICE_MIB=1024,768 EMU_STRICT=1 \
          timeout 900 mpirun -np 2 --oversubscribe "$yolo" train ${common/batch=6/batch=-1} epochs=1 device=0,1 name=mpi 2>&1); rc=$?
    printf '%s\n' "$out" | grep -E 'came over MPI|^AutoBatch|^data parallel|epochs completed' | sed 's/^/  /'
    b0=$(printf '%s\n' "$out" | sed -n 's/^AutoBatch: batch \([0-9]*\) .* on device 0 .*/\1/p' | head -n 1)
    b1=$(printf '%s\n' "$out" | sed -n 's/^AutoBatch: batch \([0-9]*\) .* on device 1 .*/\1/p' | head -n 1)
    bmin=$(( ${b0:-0} < ${b1:-0} ? ${b0:-0} : ${b1:-0} ))
    ok "$([ $rc = 0 ] && [ "$(printf '%s\n' "$out" | grep -c 'the NCCL id came over MPI')" = 2 ] && [ -s "$tmp/runs/mpi/results.csv" ] &&
         [ -z "$(ls "$tmp/runs" | grep '^mpi.')" ] && [ "$(printf '%s\n' "$out" | grep -c 'epochs completed')" = 1 ] && echo 1)" \
       "mpirun -np 2: both ranks got the NCCL id over MPI, one run folder, results.csv, rank 0 alone reports (rc $rc)"
    ok "$([ -n "$b0" ] && [ -n "$b1" ] && [ "$b0" -gt "$b1" ] && printf '%s\n' "$out" | grep -q "^data parallel: 2 ranks, batch $bmin per rank" && echo 1)" \
       "batch=-1 over a 1024 and a 768 MiB card: AutoBatch $b0 and $b1, both ranks train with the smaller ($bmin per rank, global $((2 * bmin)))"
fi
echo "$pass passed, $fail failed"
[ $fail = 0 ]
