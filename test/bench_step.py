#!/usr/bin/env python3
"""Time one whole training step of test/reference.py's YOLOv8n in PyTorch: forward and v8 loss,
backward, clip_grad_norm_ + SGD (Nesterov, the three Ultralytics groups): the step that
test/bin/bench_step times in yolo.c. Random input in [0, 1], 4 random boxes per image, nc 80.
Best of --reps after one warm-up step. make bench runs both and prints the ratio.

Usage: /usr/bin/python3 test/bench_step.py [--batch 8] [--imgsz 320] [--reps 5] [--threads 2]
       python3 test/bench_step.py --device cuda --amp --scale n --batch 16 --imgsz 640 --reps 30
With --device cuda (a GPU, beside test/bin/gpu/gpu_bench): the same step on the GPU, cuDNN's autotuner
on, each step's time from the host with the device synchronised at its end; --amp as Ultralytics
trains: the forward under autocast (FP16; the loss in FP32, as yolo.c computes it), GradScaler, the
gradients unscaled before the clip; the SGD optimizer made once, as a trainer does (on the CPU it is
made anew each step, as test/bin/bench_step's comparison always did). --loss sum replaces the v8
loss by the sum of the maps' means: reference.py's loss is written for parity, not speed (its assigner
works image by image), so `--loss sum` times PyTorch's network, backward and optimizer alone, a
floor under any PyTorch trainer's step (Ultralytics' adds its own loss to it).
The last line is machine-readable:  step S B threads best fwd+loss backward clip+sgd cpu  (seconds; cpu:
the best CPU time of the process, all threads, steadier than wall time on a busy machine)
"""
import argparse
import contextlib
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
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--amp", action="store_true")
    ap.add_argument("--scale", default="n")
    ap.add_argument("--loss", default="v8", choices=["v8", "sum"])
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(1)
    cuda = args.device.startswith("cuda")
    if args.amp and not cuda:
        ap.error("--amp needs --device cuda")
    if cuda:
        torch.backends.cudnn.benchmark = True
        torch.set_default_device(args.device)  # the loss's own tensors too
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    scaler = torch.amp.GradScaler("cuda") if args.amp else None  # 65536 at first, as Ultralytics and yolo.c
    B, S, nbox = args.batch, args.imgsz, 4
    model = ref.DetectionModel(args.scale, 80, dry_run=False).to(args.device)
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
    if args.loss == "sum":
        def lossf(feats, *_):  # noqa: F811 (the network alone: every map's mean, summed)
            t = sum(f.mean() for f in feats)
            return t, None, None
    opt = None
    if cuda:  # made once; the three Ultralytics groups
        g_bias, g_w, g_bn = ref.optimizer_groups(model)
        opt = torch.optim.SGD([p for _, p in g_bias], lr=0.01, momentum=0.937, nesterov=True)
        opt.add_param_group({"params": [p for _, p in g_w], "weight_decay": 5e-4})
        opt.add_param_group({"params": [p for _, p in g_bn], "weight_decay": 0.0})
    best, best_cpu, times = None, None, []
    warm = 3 if cuda else 1  # cuDNN's autotuner tries its algorithms in the first steps
    for it in range(args.reps + warm):  # the first `warm` are warm-ups
        model.zero_grad(set_to_none=True)
        sync()
        t0, c0 = time.perf_counter(), time.process_time()
        with torch.autocast("cuda", dtype=torch.float16) if args.amp else contextlib.nullcontext():
            feats = model(x)
        # the loss in FP32 (reference.py's assigner writes FP32 metrics into tensors of the maps' type)
        ltot, _, _ = lossf([f.float() for f in feats], bi.float(), cl, bb)
        total = ltot.sum()
        sync()
        t1 = time.perf_counter()
        (scaler.scale(total) if scaler else total).backward()
        sync()
        t2 = time.perf_counter()
        if scaler:  # unscale, clip, step (skipped on inf), update: Ultralytics' optimizer_step
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=10.0)
            scaler.step(opt)
            scaler.update()
        elif opt:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=10.0)
            opt.step()
        else:
            ref.sgd_step(model, 0.01, 0.937, 5e-4, 10.0)
        sync()
        t3, c3 = time.perf_counter(), time.process_time()
        if it < warm:
            continue
        times.append(t3 - t0)
        if best_cpu is None or c3 - c0 < best_cpu:
            best_cpu = c3 - c0
        if best is None or t3 - t0 < best[0]:
            best = (t3 - t0, t1 - t0, t2 - t1, t3 - t2)
    where = f"{torch.cuda.get_device_name()}{', AMP' if args.amp else ', FP32'}" if cuda else f"{args.threads} threads"
    what = "whole training step" if args.loss == "v8" else "training step without the loss (--loss sum)"
    print(f"PyTorch {torch.__version__} yolov8{args.scale} {what}, batch {B}, {S}x{S}, {where}, "
          f"best of {args.reps}: {best[0]:.3f} s (forward+loss {best[1]:.3f} / backward {best[2]:.3f} / "
          f"clip+SGD {best[3]:.3f}); mean {sum(times) / len(times):.4f} s ({B * len(times) / sum(times):.0f} images/s); "
          f"CPU time {best_cpu:.3f} s; last loss {float(total):.3f}")
    print(f"step {S} {B} {args.threads} {best[0]:.4f} {best[1]:.4f} {best[2]:.4f} {best[3]:.4f} {best_cpu:.4f}")


if __name__ == "__main__":
    main()
