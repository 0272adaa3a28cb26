#!/usr/bin/env python3
"""Time one whole training step of test/reference.py's YOLOv8n in PyTorch: forward and v8 loss,
backward, clip_grad_norm_ + SGD (Nesterov, the three Ultralytics groups): the step that
test/bin/bench_step times in yolo.c. Random input in [0, 1], 4 random boxes per image, nc 80.
Best of --reps after one warm-up step. make bench runs both and prints the ratio.

Usage: /usr/bin/python3 test/bench_step.py [--batch 8] [--imgsz 320] [--reps 5] [--threads 2]
The last line is machine-readable:  step S B threads best fwd+loss backward clip+sgd cpu  (seconds; cpu:
the best CPU time of the process, all threads, steadier than wall time on a busy machine)
"""
import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference as ref  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--imgsz", type=int, default=320)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(1)
    B, S, nbox = args.batch, args.imgsz, 4
    model = ref.DetectionModel("n", 80, dry_run=False)
    model.train()
    ref.freeze_dfl(model)
    x = torch.rand(B, 3, S, S)
    n = B * nbox
    bi = torch.arange(n) // nbox
    cl = torch.randint(0, 80, (n,)).float()
    wh = 0.05 + 0.45 * torch.rand(n, 2)
    xy = wh / 2 + (1 - wh) * torch.rand(n, 2)
    bb = torch.cat((xy, wh), 1)
    lossf = ref.V8Loss(model.nc, model.stride.tolist())
    best, best_cpu = None, None
    for it in range(args.reps + 1):  # it 0 is the warm-up
        model.zero_grad(set_to_none=True)
        t0, c0 = time.perf_counter(), time.process_time()
        feats = model(x)
        ltot, _, _ = lossf(feats, bi.float(), cl, bb)
        total = ltot.sum()
        t1 = time.perf_counter()
        total.backward()
        t2 = time.perf_counter()
        ref.sgd_step(model, 0.01, 0.937, 5e-4, 10.0)
        t3, c3 = time.perf_counter(), time.process_time()
        if it > 0 and (best_cpu is None or c3 - c0 < best_cpu):
            best_cpu = c3 - c0
        if it > 0 and (best is None or t3 - t0 < best[0]):
            best = (t3 - t0, t1 - t0, t2 - t1, t3 - t2)
    print(f"PyTorch {torch.__version__} yolov8n whole training step, batch {B}, {S}x{S}, {args.threads} threads, "
          f"best of {args.reps}: {best[0]:.3f} s (forward+loss {best[1]:.3f} / backward {best[2]:.3f} / "
          f"clip+SGD {best[3]:.3f}); CPU time {best_cpu:.3f} s; last loss {float(total):.3f}")
    print(f"step {S} {B} {args.threads} {best[0]:.4f} {best[1]:.4f} {best[2]:.4f} {best[3]:.4f} {best_cpu:.4f}")


if __name__ == "__main__":
    main()
