#!/usr/bin/env python3
"""YOLOv8 detection reference: model, v8 loss and one SGD step in PyTorch, written from
Ultralytics' code (yolov8.yaml, nn/modules, utils/loss.py, utils/tal.py, the trainer's optimizer).
It writes the safetensors fixtures that
`./yolo check-ref FILE` compares the C code against (CI has no torch, so fixtures are
committed under test/fixtures/).

Needs python3 + torch (>= 1.13) + numpy. No Ultralytics, no safetensors package. (On the dev box torch is Debian's
python3-torch: run it with /usr/bin/python3; the pyenv python3 on PATH has no torch.) One torch thread by default
(--threads): float32 results change in the last bits with the thread count, and the committed fixture used 1.
A full default run (self-tests + fixture) takes ~7 s on one core.

Usage
-----
  python3 test/reference.py                      # seeded n/nc=3/128/batch 2 -> test/fixtures/ref_n_nc3_128.safetensors
  python3 test/reference.py --scale s --nc 80 --imgsz 160 --batch 2 --seed 1 --out /tmp/f.safetensors
  python3 test/reference.py --weights best.pt --out f.safetensors      # Ultralytics .pt (plain state_dict or
                                                                      # checkpoint dict with 'model'/'ema')
  python3 test/reference.py --weights model.safetensors --out f.safetensors
  python3 test/reference.py --check-names c_written.safetensors       # strict load_state_dict of the model.* keys
  python3 test/reference.py --self-test-only                          # only the self-checks below

Every run first does the self-checks (param counts of n/s/m/l/x at nc=80 against Ultralytics', leaf-layer counts,
YOLOv8n per-layer counts, optimizer group sizes 63/64/57, a hand-made assigner test, a float64
gradcheck of the loss at a fixed assignment) unless --no-self-test is given. Every fixture run also recomputes the
loss, fg mask and soft targets from out.train.* with loop_loss (an independent one-anchor-at-a-time float64
implementation) and requires agreement to 1e-5.

What one fixture run does (in this order)
-----------------------------------------
 1. build the model for (scale, nc): PyTorch default init (kaiming-uniform a=sqrt(5)) under torch.manual_seed(seed),
    BN eps 1e-3 / momentum 0.03, strides [8,16,32] from a dry eval-mode forward of 1x3x256x256 zeros, bias_init
    (box bias 1.0, class bias ln(5/nc/(640/s)^2)). DFL conv weight = 0..15, requires_grad False.
    Then (seeded mode only, perturb_state) the state is made non-trivial: gamma ~ 1 + 0.1 N(0,1), beta ~ 0.1 N(0,1),
    then BN running stats are calibrated from one batch-statistics pass over the fixture images and perturbed
    (mean += 0.02 sd N(0,1), var *= exp(0.05 N(0,1))), num_batches_tracked stays 0; the box-branch output biases
    (model.22.cv2.i.2.bias) get the bin profile 1 - 0.6 k + 0.3 N(0,1) instead of the flat 1.0, so that initial
    boxes are ~1.2 grid units per side and foreground anchors land on all three levels (with the flat bias at
    128 px every positive is on stride 8, leaving the P4/P5 box branches with zero gradient).
    With --weights, the file's weights are used as they are.
 2. EVAL forward on these initial weights (uses the running stats stored under the plain weight names)
    -> out.eval, out.eval_raw.*. No BN state changes.
 3. TRAIN forward (batch statistics; updates running stats and num_batches_tracked) -> out.train.*, bn_after.*.
 4. v8 loss on out.train.* -> loss.*, assign.*.
 5. backward of loss.total -> grad.* (raw, BEFORE clipping).
 6. clip_grad_norm_(all params, 10.0) then SGD(lr, momentum, nesterov=True) with the three Ultralytics groups
    (pg0 biases decay 0, pg1 conv weights decay=weight_decay, pg2 BN weights decay 0), momentum buffers empty
    (first PyTorch step sets buf = d_p) -> step.*.
    With no warmup: all groups use the same lr. Ultralytics' first iteration would be inside warmup with lr 0 for
    pg1/pg2; the fixture deliberately uses a plain step so every group moves.

Fixture contents (safetensors; all floats F32 little-endian, integers I64; 0-d tensors have shape [])
------------------------------------------------------------------------------------------------------
 Notation: B batch, S imgsz, NC classes, A = 21*(S/32)^2 anchors (336 at S=128), N number of target boxes,
 Hi = S/8, S/16, S/32 for i = 0, 1, 2.

 <name>                        every state_dict entry of the model under its Ultralytics name, initial values
                               (e.g. model.0.conv.weight (16,3,3,3), model.0.bn.weight/bias/running_mean/
                               running_var (16,), model.0.bn.num_batches_tracked () I64 = 0, ...,
                               model.22.cv2.0.2.weight (64,64,1,1), model.22.cv2.0.2.bias (64,),
                               model.22.cv3.0.2.weight (NC,c3,1,1), model.22.dfl.conv.weight (1,16,1,1) = 0..15).
 input.images       (B,3,S,S)  network input, values exactly k/255 for integer k (so uint8/255 reproduces it):
                               seeded sinusoids + Gaussian blobs + noise (make_images).
 targets.batch_idx  (N,)       F32, image index of each box (Ultralytics keeps it float).
 targets.cls        (N,)       F32, class id of each box.
 targets.bboxes     (N,4)      F32, normalised cx, cy, w, h (dyadic values, exact in float).
                               Default set (N=6, all in image 0; image 1 has no boxes, so M=6 with 6 padding rows),
                               xyxy px at S=128 (scaled by S/128 otherwise), class mod NC:
                                 cls 0 (21.5, 9.5, 26.5, 15.5)  5x6 px, contains no anchor centre at any stride
                                 cls 1 (8, 40, 72, 104)          large
                                 cls 2 (40, 56, 88, 120)         overlaps the previous, other class
                                 cls 1 (48, 64, 80, 96)          inside both of the above
                                 cls 0 (80, 8, 128, 40)          touches the right border
                                 cls 2 (2, 2, 18, 26)            small, 9 in-box anchors (< topk)
 out.eval           (B,4+NC,A) eval-mode decoded output: cx, cy, w, h in input pixels, then sigmoid class scores.
 out.eval_raw.i     (B,64+NC,Hi,Hi)  the raw per-level maps of that eval forward (second return value).
 out.train.i        (B,64+NC,Hi,Hi)  raw per-level maps of the train-mode forward (what the loss consumes).
 bn_after.<bn>.running_mean / running_var (C,) F32 and .num_batches_tracked () I64:
                               BN buffers after the train-mode forward (<bn> = e.g. model.0.bn).
 loss.box, loss.cls, loss.dfl  ()  loss components after gains (7.5 / 0.5 / 1.5), before the xB.
 loss.total         ()         B*(box+cls+dfl), what is back-propagated.
 assign.fg_count    () I64     number of foreground anchors over the batch.
 assign.target_scores_sum ()   max(sum of target scores, 1).
 assign.fg_mask     (B,A) I64  1 for foreground anchors.
 assign.target_gt_idx (B,A) I64 index of the gt (within its image, 0..M-1) each anchor is assigned to (0 for bg).
 assign.target_scores (B,A,NC) normalised soft targets used by the BCE.
 assign.target_bboxes (B,A,4)  assigned gt box, xyxy in input pixels (gt 0 of the image for bg anchors).
 grad.<param>                  d loss.total / d param, BEFORE clipping, for every parameter with requires_grad
                               (all params except model.22.dfl.conv.weight).
 step.<param>                  every parameter after clip + one SGD step (the frozen DFL weight is included,
                               unchanged). Momentum buffers after the step = clipped grad + wd*param (pg1) or
                               clipped grad (pg0, pg2), not stored.
 __metadata__ (all strings): format, scale, nc, imgsz, batch, seed, source, lr, momentum, nesterov,
   weight_decay, clip_max_norm, grad_norm (total L2 norm of all grads before clipping), clip_coef
   (min(1, 10/(grad_norm+1e-6)), the factor applied to every grad), box_gain, cls_gain, dfl_gain, bn_eps,
   bn_momentum, order ("eval(initial weights) -> train forward -> loss -> backward -> clip -> sgd"),
   torch_version, torch_threads, fp64_* (max |fp32 - fp64| / max |fp64| over out.eval, out.train.*, loss.*, grad.*
   (per tensor, worst) and step.* (per tensor, worst) from a float64 rerun: a floor for tolerances),
   assign_unambiguous (see below), margin_* (how close the discrete assignment decisions were, see below).

Ambiguity: torch.topk breaks ties at align 0 arbitrarily. The script reports whether the fixture is free of
such cases (every in-box anchor of a gt with < 10 positive-align in-box anchors has align > 0, the 10th/11th
align values differ, and multi-gt anchors have a unique max overlap). The default fixture asserts it.
Margins: margin_topk_gap = smallest relative gap between the 10th and 11th in-box align of any gt,
margin_multi_gt_gap = smallest CIoU difference that decided an anchor claimed by two gts, margin_min_pos_overlap =
smallest nonzero clamped CIoU of an in-box anchor. A C assigner agrees with this one as long as its float error stays
well below these.
"""
import argparse
import json
import math
import os
import struct
import sys
import types

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

REG_MAX = 16
SCALES = {  # depth, width, max_channels (yolov8.yaml scales)
    "n": (0.33, 0.25, 1024), "s": (0.33, 0.50, 1024), "m": (0.67, 0.75, 768),
    "l": (1.00, 1.00, 512), "x": (1.00, 1.25, 512)}
PARAMS_NC80 = {"n": 3157200, "s": 11166560, "m": 25902640, "l": 43691520, "x": 68229648}
LEAVES = {"n": 129, "s": 129, "m": 169, "l": 209, "x": 209}
LAYER_PARAMS_N = [464, 4672, 7360, 18560, 49664, 73984, 197632, 295424, 460288, 164608, 0, 0, 148224, 0, 0,
                  37248, 36992, 0, 123648, 147712, 0, 493056, 897664]

# ------------------------------------------------------------------------------------------------ model


class Conv(nn.Module):
    """Conv2d(no bias) -> BN -> SiLU. One SiLU instance is shared by every Conv, as in Ultralytics
    (class attribute default_act), which only matters for the leaf-module count."""
    act_shared = nn.SiLU()

    def __init__(self, c1, c2, k=1, s=1):
        super().__init__()
        self.conv = nn.Conv2d(c1, c2, k, s, k // 2, bias=False)
        self.bn = nn.BatchNorm2d(c2)
        self.act = Conv.act_shared

    def forward(self, x):
        return self.act(self.bn(self.conv(x)))


class Bottleneck(nn.Module):
    def __init__(self, c, shortcut):
        super().__init__()
        self.cv1 = Conv(c, c, 3, 1)
        self.cv2 = Conv(c, c, 3, 1)
        self.add = shortcut

    def forward(self, x):
        y = self.cv2(self.cv1(x))
        return x + y if self.add else y


class C2f(nn.Module):
    def __init__(self, c1, c2, n, shortcut):
        super().__init__()
        self.c = c2 // 2
        self.cv1 = Conv(c1, 2 * self.c, 1, 1)
        self.cv2 = Conv((2 + n) * self.c, c2, 1, 1)
        self.m = nn.ModuleList(Bottleneck(self.c, shortcut) for _ in range(n))

    def forward(self, x):
        y = list(self.cv1(x).chunk(2, 1))
        for m in self.m:
            y.append(m(y[-1]))
        return self.cv2(torch.cat(y, 1))


class SPPF(nn.Module):
    def __init__(self, c1, c2, k=5):
        super().__init__()
        c_ = c1 // 2
        self.cv1 = Conv(c1, c_, 1, 1)
        self.cv2 = Conv(c_ * 4, c2, 1, 1)
        self.m = nn.MaxPool2d(k, 1, k // 2)

    def forward(self, x):
        y = [self.cv1(x)]
        for _ in range(3):
            y.append(self.m(y[-1]))
        return self.cv2(torch.cat(y, 1))


class Concat(nn.Module):
    def forward(self, xs):
        return torch.cat(xs, 1)


class DFL(nn.Module):
    """Expectation over the 16 bins as a frozen 1x1 conv with weights 0..15."""

    def __init__(self, c1=REG_MAX):
        super().__init__()
        self.conv = nn.Conv2d(c1, 1, 1, bias=False).requires_grad_(False)
        self.conv.weight.data[:] = torch.arange(c1, dtype=torch.float).view(1, c1, 1, 1)
        self.c1 = c1

    def forward(self, x):  # (B, 4*R, A) -> (B, 4, A)
        b, _, a = x.shape
        return self.conv(x.view(b, 4, self.c1, a).transpose(2, 1).softmax(1)).view(b, 4, a)


def make_anchors(shapes, strides, offset=0.5, dtype=torch.float32):
    """Anchor centres in grid units (A,2) and per-anchor stride (A,1), levels in order, row-major."""
    pts, sts = [], []
    for (h, w), s in zip(shapes, strides):
        sx = torch.arange(w, dtype=dtype) + offset
        sy = torch.arange(h, dtype=dtype) + offset
        yy, xx = torch.meshgrid(sy, sx, indexing="ij")
        pts.append(torch.stack((xx, yy), -1).view(-1, 2))
        sts.append(torch.full((h * w, 1), float(s), dtype=dtype))
    return torch.cat(pts), torch.cat(sts)


class Detect(nn.Module):
    def __init__(self, nc, ch):
        super().__init__()
        self.nc, self.nl, self.no = nc, len(ch), nc + 4 * REG_MAX
        self.stride = torch.zeros(self.nl)  # plain attribute, not in the state_dict
        c2 = max(16, ch[0] // 4, 4 * REG_MAX)
        c3 = max(ch[0], min(nc, 100))
        self.cv2 = nn.ModuleList(nn.Sequential(Conv(x, c2, 3), Conv(c2, c2, 3), nn.Conv2d(c2, 4 * REG_MAX, 1))
                                 for x in ch)
        self.cv3 = nn.ModuleList(nn.Sequential(Conv(x, c3, 3), Conv(c3, c3, 3), nn.Conv2d(c3, nc, 1)) for x in ch)
        self.dfl = DFL(REG_MAX)

    def forward(self, xs):
        xs = [torch.cat((self.cv2[i](xs[i]), self.cv3[i](xs[i])), 1) for i in range(self.nl)]
        if self.training:
            return xs
        b = xs[0].shape[0]
        xcat = torch.cat([x.view(b, self.no, -1) for x in xs], 2)
        anc, st = make_anchors([x.shape[2:] for x in xs], self.stride.tolist(), dtype=xcat.dtype)
        anc, st = anc.transpose(0, 1).unsqueeze(0), st.transpose(0, 1)
        box, cls = xcat.split((4 * REG_MAX, self.nc), 1)
        lt, rb = self.dfl(box).chunk(2, 1)
        x1y1, x2y2 = anc - lt, anc + rb
        dbox = torch.cat(((x1y1 + x2y2) / 2, x2y2 - x1y1), 1) * st
        return torch.cat((dbox, cls.sigmoid()), 1), xs

    def bias_init(self):
        for a, b, s in zip(self.cv2, self.cv3, self.stride.tolist()):
            a[-1].bias.data[:] = 1.0
            b[-1].bias.data[: self.nc] = math.log(5 / self.nc / (640 / s) ** 2)


def ceil8(x):
    return int(math.ceil(x / 8) * 8)


class DetectionModel(nn.Module):
    """Top-level module; state_dict keys are model.<i>.… exactly as Ultralytics."""

    def __init__(self, scale="n", nc=80, dry_run=True):
        """dry_run=False skips the 256x256 stride forward (strides are then set to 8/16/32 directly)."""
        super().__init__()
        depth, width, max_ch = SCALES[scale]
        self.scale, self.nc = scale, nc
        ch = lambda c: ceil8(min(c, max_ch) * width)  # noqa: E731
        rep = lambda r: max(round(r * depth), 1) if r > 1 else r  # noqa: E731
        c = {}
        L = []
        # (from, module) in yaml order; c[i] = output channels of layer i
        c[0] = ch(64);   L.append((-1, Conv(3, c[0], 3, 2)))                                  # 0  P1/2
        c[1] = ch(128);  L.append((-1, Conv(c[0], c[1], 3, 2)))                               # 1  P2/4
        c[2] = ch(128);  L.append((-1, C2f(c[1], c[2], rep(3), True)))                       # 2
        c[3] = ch(256);  L.append((-1, Conv(c[2], c[3], 3, 2)))                               # 3  P3/8
        c[4] = ch(256);  L.append((-1, C2f(c[3], c[4], rep(6), True)))                       # 4
        c[5] = ch(512);  L.append((-1, Conv(c[4], c[5], 3, 2)))                               # 5  P4/16
        c[6] = ch(512);  L.append((-1, C2f(c[5], c[6], rep(6), True)))                       # 6
        c[7] = ch(1024); L.append((-1, Conv(c[6], c[7], 3, 2)))                               # 7  P5/32
        c[8] = ch(1024); L.append((-1, C2f(c[7], c[8], rep(3), True)))                       # 8
        c[9] = ch(1024); L.append((-1, SPPF(c[8], c[9], 5)))                                  # 9
        c[10] = c[9];    L.append((-1, nn.Upsample(None, 2, "nearest")))                      # 10
        c[11] = c[10] + c[6]; L.append(([-1, 6], Concat()))                                  # 11
        c[12] = ch(512); L.append((-1, C2f(c[11], c[12], rep(3), False)))                    # 12
        c[13] = c[12];   L.append((-1, nn.Upsample(None, 2, "nearest")))                      # 13
        c[14] = c[13] + c[4]; L.append(([-1, 4], Concat()))                                  # 14
        c[15] = ch(256); L.append((-1, C2f(c[14], c[15], rep(3), False)))                    # 15 P3 out
        c[16] = ch(256); L.append((-1, Conv(c[15], c[16], 3, 2)))                             # 16
        c[17] = c[16] + c[12]; L.append(([-1, 12], Concat()))                                # 17
        c[18] = ch(512); L.append((-1, C2f(c[17], c[18], rep(3), False)))                    # 18 P4 out
        c[19] = ch(512); L.append((-1, Conv(c[18], c[19], 3, 2)))                             # 19
        c[20] = c[19] + c[9]; L.append(([-1, 9], Concat()))                                  # 20
        c[21] = ch(1024); L.append((-1, C2f(c[20], c[21], rep(3), False)))                   # 21 P5 out
        L.append(([15, 18, 21], Detect(nc, (c[15], c[18], c[21]))))                          # 22
        self.froms = [f for f, _ in L]
        self.model = nn.Sequential(*[m for _, m in L])
        for m in self.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.eps, m.momentum = 1e-3, 0.03
        det = self.model[22]
        if dry_run:
            was = self.training
            self.eval()  # dry run for strides without touching BN statistics
            with torch.no_grad():
                det.training = True
                outs = self.forward(torch.zeros(1, 3, 256, 256))
            det.stride = torch.tensor([256 / x.shape[-2] for x in outs])
            self.train(was)
        else:
            det.stride = torch.tensor([8.0, 16.0, 32.0])
        self.stride = det.stride
        det.bias_init()

    def forward(self, x):
        y = []
        for f, m in zip(self.froms, self.model):
            if f != -1:
                x = y[f] if isinstance(f, int) else [x if j == -1 else y[j] for j in f]
            x = m(x)
            y.append(x)
        return x


def count_leaves(model):
    return sum(1 for m in model.modules() if len(list(m.children())) == 0)


def optimizer_groups(model):
    """Ultralytics build_optimizer split: (pg0 biases, pg1 decayed weights, pg2 norm weights) with names."""
    g_bias, g_w, g_bn = [], [], []
    for mname, module in model.named_modules():
        for pname, p in module.named_parameters(recurse=False):
            full = f"{mname}.{pname}" if mname else pname
            if "bias" in full:
                g_bias.append((full, p))
            elif isinstance(module, (nn.BatchNorm2d,)):
                g_bn.append((full, p))
            else:
                g_w.append((full, p))
    return g_bias, g_w, g_bn


def freeze_dfl(model):
    for k, v in model.named_parameters():
        if ".dfl" in k:
            v.requires_grad_(False)

# ------------------------------------------------------------------------------------------------ loss


def bbox_ciou(b1, b2, eps=1e-7, alpha=None):
    """CIoU of xyxy boxes b1, b2 (..., 4) -> (..., 1). alpha (the v weight) is computed under no_grad unless
    given (a given alpha is used by the gradcheck, which needs it to be a constant)."""
    b1_x1, b1_y1, b1_x2, b1_y2 = b1.chunk(4, -1)
    b2_x1, b2_y1, b2_x2, b2_y2 = b2.chunk(4, -1)
    w1, h1 = b1_x2 - b1_x1, b1_y2 - b1_y1 + eps
    w2, h2 = b2_x2 - b2_x1, b2_y2 - b2_y1 + eps
    inter = (torch.min(b1_x2, b2_x2) - torch.max(b1_x1, b2_x1)).clamp(0) * \
            (torch.min(b1_y2, b2_y2) - torch.max(b1_y1, b2_y1)).clamp(0)
    union = w1 * h1 + w2 * h2 - inter + eps
    iou = inter / union
    cw = torch.max(b1_x2, b2_x2) - torch.min(b1_x1, b2_x1)
    ch = torch.max(b1_y2, b2_y2) - torch.min(b1_y1, b2_y1)
    c2 = cw ** 2 + ch ** 2 + eps
    rho2 = ((b2_x1 + b2_x2 - b1_x1 - b1_x2) ** 2 + (b2_y1 + b2_y2 - b1_y1 - b1_y2) ** 2) / 4
    v = (4 / math.pi ** 2) * (torch.atan(w2 / h2) - torch.atan(w1 / h1)) ** 2
    if alpha is None:
        with torch.no_grad():
            alpha = v / (v - iou + (1 + eps))
    return iou - (rho2 / c2 + v * alpha)


class Assigner:
    """TaskAlignedAssigner(topk=10, alpha=0.5, beta=6, eps=1e-9) with CIoU overlaps (utils/tal.py)."""

    def __init__(self, nc, topk=10, alpha=0.5, beta=6.0, eps=1e-9):
        self.nc, self.topk, self.alpha, self.beta, self.eps = nc, topk, alpha, beta, eps
        self.margins = {}  # how close the discrete decisions were (filled by ambiguities())

    @torch.no_grad()
    def __call__(self, pd_scores, pd_bboxes, anc_points, gt_labels, gt_bboxes, mask_gt):
        """pd_scores (B,A,NC) probs, pd_bboxes (B,A,4) xyxy px, anc_points (A,2) px, gt_labels (B,M,1),
        gt_bboxes (B,M,4) xyxy px, mask_gt (B,M,1). Returns dict of targets and intermediates."""
        B, A = pd_scores.shape[:2]
        M = gt_bboxes.shape[1]
        if M == 0:
            return dict(target_labels=torch.zeros(B, A, dtype=torch.long),
                        target_bboxes=torch.zeros_like(pd_bboxes), target_scores=torch.zeros_like(pd_scores),
                        fg_mask=torch.zeros(B, A, dtype=torch.bool),
                        target_gt_idx=torch.zeros(B, A, dtype=torch.long), ambiguous=[])
        mask_in = self.in_gts(anc_points, gt_bboxes)                                     # (B,M,A)
        align, overlaps = self.metrics(pd_scores, pd_bboxes, gt_labels, gt_bboxes, mask_in * mask_gt)
        mask_topk = self.topk_mask(align, mask_gt.expand(-1, -1, self.topk).bool())
        mask_pos = mask_topk * mask_in * mask_gt
        amb = self.ambiguities(align, overlaps, mask_in * mask_gt, mask_pos)
        target_gt_idx, fg_mask, mask_pos = self.highest_overlaps(mask_pos, overlaps, M)
        t_labels, t_bboxes, t_scores = self.targets(gt_labels, gt_bboxes, target_gt_idx, fg_mask)
        align = align * mask_pos
        pos_align = align.amax(dim=-1, keepdim=True)                                      # (B,M,1)
        pos_ovl = (overlaps * mask_pos).amax(dim=-1, keepdim=True)
        norm = (align * pos_ovl / (pos_align + self.eps)).amax(-2).unsqueeze(-1)          # (B,A,1)
        t_scores = t_scores * norm
        return dict(target_labels=t_labels, target_bboxes=t_bboxes, target_scores=t_scores,
                    fg_mask=fg_mask.bool(), target_gt_idx=target_gt_idx, ambiguous=amb,
                    mask_in=mask_in, align=align, overlaps=overlaps, mask_pos=mask_pos)

    def in_gts(self, xy, gt, eps=1e-9):
        B, M, _ = gt.shape
        lt, rb = gt.view(-1, 1, 4).chunk(2, 2)
        d = torch.cat((xy[None] - lt, rb - xy[None]), 2).view(B, M, xy.shape[0], -1)
        return (d.amin(3) > eps).to(gt.dtype)

    def metrics(self, pd_scores, pd_bboxes, gt_labels, gt_bboxes, mask):
        B, A = pd_scores.shape[:2]
        M = gt_bboxes.shape[1]
        mask = mask.bool()
        overlaps = torch.zeros(B, M, A, dtype=pd_bboxes.dtype)
        scores = torch.zeros(B, M, A, dtype=pd_scores.dtype)
        bi = torch.arange(B).view(-1, 1).expand(-1, M)
        lab = gt_labels.squeeze(-1).long()
        scores[mask] = pd_scores[bi, :, lab][mask]                                     # (B,M,A) score of gt class
        pd = pd_bboxes.unsqueeze(1).expand(-1, M, -1, -1)[mask]
        gt = gt_bboxes.unsqueeze(2).expand(-1, -1, A, -1)[mask]
        overlaps[mask] = bbox_ciou(gt, pd).squeeze(-1).clamp(0)
        align = scores.pow(self.alpha) * overlaps.pow(self.beta)
        return align, overlaps

    def topk_mask(self, metrics, topk_mask):
        _, idx = torch.topk(metrics, self.topk, dim=-1, largest=True)
        idx = idx.masked_fill(~topk_mask, 0)
        count = torch.zeros(metrics.shape, dtype=torch.int8)
        ones = torch.ones_like(idx[:, :, :1], dtype=torch.int8)
        for k in range(self.topk):
            count.scatter_add_(-1, idx[:, :, k:k + 1], ones)
        count.masked_fill_(count > 1, 0)
        return count.to(metrics.dtype)

    def highest_overlaps(self, mask_pos, overlaps, M):
        fg = mask_pos.sum(-2)                                                              # (B,A)
        if fg.max() > 1:
            multi = (fg.unsqueeze(1) > 1).expand(-1, M, -1)
            best = overlaps.argmax(1)
            is_max = torch.zeros(mask_pos.shape, dtype=mask_pos.dtype)
            is_max.scatter_(1, best.unsqueeze(1), 1)
            mask_pos = torch.where(multi, is_max, mask_pos).float().to(overlaps.dtype)
            fg = mask_pos.sum(-2)
        return mask_pos.argmax(-2), fg, mask_pos

    def targets(self, gt_labels, gt_bboxes, gt_idx, fg):
        B, M = gt_labels.shape[:2]
        idx = gt_idx + torch.arange(B).view(-1, 1) * M
        labels = gt_labels.long().flatten()[idx].clamp(0)                                 # (B,A)
        bboxes = gt_bboxes.view(-1, 4)[idx]                                               # (B,A,4)
        scores = F.one_hot(labels, self.nc).to(gt_bboxes.dtype)
        scores = torch.where(fg[:, :, None].repeat(1, 1, self.nc) > 0, scores, torch.zeros_like(scores))
        return labels, bboxes, scores

    def ambiguities(self, align, overlaps, mask_valid, mask_pos):
        """List of human-readable reasons why torch's tie-breaking could decide this assignment."""
        out = []
        B, M, A = align.shape
        for b in range(B):
            for j in range(M):
                inside = mask_valid[b, j] > 0
                if not inside.any():
                    continue
                vals = align[b, j][inside]
                npos = int((vals > 0).sum())
                nzero = int((vals == 0).sum())
                if nzero and npos < self.topk:
                    out.append(f"b{b} gt{j}: {nzero} in-box anchors with align 0, only {npos} positive")
                if npos > self.topk:
                    s = torch.sort(vals, descending=True).values
                    if s[self.topk - 1] == s[self.topk]:
                        out.append(f"b{b} gt{j}: tie at top-{self.topk} boundary")
                    self.margins["topk_gap"] = min(self.margins.get("topk_gap", 1.0),
                                                   float((s[self.topk - 1] - s[self.topk]) / s[self.topk - 1]))
                ovl = overlaps[b, j][inside]
                if (ovl > 0).any():
                    self.margins["min_pos_overlap"] = min(self.margins.get("min_pos_overlap", 1.0),
                                                          float(ovl[ovl > 0].min()))
        fg = mask_pos.sum(-2)
        for b, a in zip(*torch.nonzero(fg > 1, as_tuple=True)):
            col = overlaps[b, :, a]
            if int((col == col.max()).sum()) > 1:
                out.append(f"b{int(b)} anchor {int(a)}: tie in max overlap between gts")
            top2 = torch.topk(col, 2).values
            self.margins["multi_gt_gap"] = min(self.margins.get("multi_gt_gap", 1.0), float(top2[0] - top2[1]))
        return out


class V8Loss:
    """v8DetectionLoss (utils/loss.py). __call__(feats, batch) -> (loss_vec*B, loss_vec.detach(), info)."""

    def __init__(self, nc, strides, box=7.5, cls=0.5, dfl=1.5):
        self.nc, self.strides = nc, list(strides)
        self.hyp = (box, cls, dfl)
        self.assigner = Assigner(nc)

    def preprocess(self, batch_idx, cls, bboxes, B, scale, dtype):
        """Targets -> padded (B, M, 5) rows of (cls, x1, y1, x2, y2) in pixels."""
        n = batch_idx.shape[0]
        if n == 0:
            return torch.zeros(B, 0, 5, dtype=dtype)
        counts = torch.bincount(batch_idx.long(), minlength=B)
        out = torch.zeros(B, int(counts.max()), 5, dtype=dtype)
        t = torch.cat((batch_idx.view(-1, 1), cls.view(-1, 1), bboxes), 1).to(dtype)
        for i in range(B):
            m = batch_idx.long() == i
            k = int(m.sum())
            if k:
                out[i, :k] = t[m, 1:]
        xywh = out[..., 1:5] * scale
        xy, wh = xywh[..., :2], xywh[..., 2:] / 2
        out[..., 1:5] = torch.cat((xy - wh, xy + wh), -1)
        return out

    def __call__(self, feats, batch_idx, cls, bboxes, fixed=None):
        B = feats[0].shape[0]
        no = 4 * REG_MAX + self.nc
        dtype = feats[0].dtype
        xcat = torch.cat([f.view(B, no, -1) for f in feats], 2)
        pred_distri, pred_scores = xcat.split((4 * REG_MAX, self.nc), 1)
        pred_scores = pred_scores.permute(0, 2, 1).contiguous()                            # (B,A,NC)
        pred_distri = pred_distri.permute(0, 2, 1).contiguous()                            # (B,A,64)
        anc, st = make_anchors([f.shape[2:] for f in feats], self.strides, dtype=dtype)
        H, W = feats[0].shape[2] * self.strides[0], feats[0].shape[3] * self.strides[0]
        scale = torch.tensor([W, H, W, H], dtype=dtype)
        targets = self.preprocess(batch_idx, cls, bboxes, B, scale, dtype)
        gt_labels, gt_bboxes = targets.split((1, 4), 2)
        mask_gt = (gt_bboxes.sum(2, keepdim=True) > 0).to(dtype)
        pred_bboxes = self.decode(anc, pred_distri)                                        # (B,A,4) grid xyxy
        asg = self.assigner(pred_scores.detach().sigmoid(), (pred_bboxes.detach() * st).to(gt_bboxes.dtype),
                            anc * st, gt_labels, gt_bboxes, mask_gt)
        if fixed is not None:
            asg.update(fixed)
        lvec, tss = self.loss_from_assignment(pred_distri, pred_scores, anc, st, asg)
        return lvec * B, lvec.detach(), dict(asg, target_scores_sum=tss, anchors=anc, strides=st)

    @staticmethod
    def decode(anc, pred_distri):
        b, a, c = pred_distri.shape
        proj = torch.arange(REG_MAX, dtype=pred_distri.dtype)
        d = pred_distri.view(b, a, 4, c // 4).softmax(3).matmul(proj)
        lt, rb = d.chunk(2, -1)
        return torch.cat((anc - lt, anc + rb), -1)

    def loss_from_assignment(self, pred_distri, pred_scores, anc, st, asg, alpha=None):
        """Loss given the assignment (the differentiable part). alpha: optional fixed CIoU alpha for fg anchors."""
        loss = torch.zeros(3, dtype=pred_scores.dtype)
        t_scores, fg = asg["target_scores"], asg["fg_mask"]
        tss = max(t_scores.sum(), 1)
        loss[1] = F.binary_cross_entropy_with_logits(pred_scores, t_scores.to(pred_scores.dtype),
                                                     reduction="none").sum() / tss
        if fg.sum():
            pred_bboxes = self.decode(anc, pred_distri)
            t_bboxes = asg["target_bboxes"] / st
            weight = t_scores.sum(-1)[fg].unsqueeze(-1)
            iou = bbox_ciou(pred_bboxes[fg], t_bboxes[fg], alpha=alpha)
            loss[0] = ((1.0 - iou) * weight).sum() / tss
            x1y1, x2y2 = t_bboxes.chunk(2, -1)
            ltrb = torch.cat((anc - x1y1, x2y2 - anc), -1).clamp(0, REG_MAX - 1 - 0.01)
            loss[2] = (self.dfl(pred_distri[fg].view(-1, REG_MAX), ltrb[fg]) * weight).sum() / tss
        loss[0] = loss[0] * self.hyp[0]
        loss[1] = loss[1] * self.hyp[1]
        loss[2] = loss[2] * self.hyp[2]
        return loss, tss

    @staticmethod
    def dfl(pred, target):
        """pred (n*4, 16) logits, target (n, 4) in [0, 14.99] -> (n, 1) mean over sides."""
        tl = target.long()
        tr = tl + 1
        wl = tr - target
        wr = 1 - wl
        return (F.cross_entropy(pred, tl.view(-1), reduction="none").view(tl.shape) * wl +
                F.cross_entropy(pred, tr.view(-1), reduction="none").view(tl.shape) * wr).mean(-1, keepdim=True)

# ------------------------------------------------------------------------------------------------ safetensors

ST_DTYPES = {"F32": np.float32, "F64": np.float64, "F16": np.float16, "I64": np.int64, "I32": np.int32,
             "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}


def st_write(path, tensors, metadata):
    """tensors: list of (name, torch/np array). Floats are written as F32 unless already F64/F16;
    integers as I64."""
    header, blobs, off = {}, [], 0
    for name, t in tensors:
        a = t.detach().cpu().numpy() if torch.is_tensor(t) else np.asarray(t)
        if a.dtype == np.bool_ or np.issubdtype(a.dtype, np.integer):
            a, dt = a.astype("<i8"), "I64"
        else:
            a, dt = a.astype("<f4"), "F32"
        b = np.ascontiguousarray(a).tobytes()
        header[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    header["__metadata__"] = {k: str(v) for k, v in metadata.items()}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def st_read(path):
    """-> (dict name -> torch tensor (F16/BF16 promoted to F32), metadata dict, header dict)."""
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {}) or {}
    base = 8 + n
    out = {}
    for name, h in header.items():
        s, e = h["data_offsets"]
        raw = data[base + s: base + e]
        if h["dtype"] == "BF16":
            a = (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            a = np.frombuffer(raw, np.dtype(ST_DTYPES[h["dtype"]]).newbyteorder("<"))
        a = a.reshape(h["shape"]).copy()
        if a.dtype == np.float16:
            a = a.astype(np.float32)
        out[name] = torch.from_numpy(a)
    return out, meta, header

# ------------------------------------------------------------------------------------------------ weights I/O


def infer_scale_nc(sd):
    w0 = sd["model.0.conv.weight"].shape[0]
    scale = {16: "n", 32: "s", 48: "m", 64: "l", 80: "x"}.get(int(w0))
    if scale is None:
        raise SystemExit(f"model.0.conv.weight has {w0} output channels; no YOLOv8 scale has that")
    return scale, int(sd["model.22.cv3.0.2.weight"].shape[0])


class _Stub(nn.Module):
    """Stand-in for any ultralytics class met while unpickling a .pt without ultralytics installed."""

    def __init__(self, *a, **k):
        super().__init__()

    def __setstate__(self, state):
        if isinstance(state, dict):
            nn.Module.__setstate__(self, state) if "_modules" in state else self.__dict__.update(state)
        else:
            self.__dict__["_state"] = state


class _StubFinder:
    """sys.meta_path hook: any 'ultralytics[.x]' import yields a module whose every attribute is a _Stub subclass.
    (torch 1.13's torch.load ignores a custom pickle_module, so the stubs have to be importable modules.)"""

    def __init__(self):
        self.classes = {}

    def find_spec(self, name, path=None, target=None):
        import importlib.machinery
        if name.split(".")[0] != "ultralytics":
            return None
        return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec):
        mod = types.ModuleType(spec.name)
        mod.__path__ = []

        def getattr_(attr, _mod=spec.name):
            if attr.startswith("__"):
                raise AttributeError(attr)
            key = (_mod, attr)
            if key not in self.classes:
                self.classes[key] = type(attr, (_Stub,), {"__module__": _mod})
            return self.classes[key]
        mod.__getattr__ = getattr_
        return mod

    def exec_module(self, module):
        pass


def _torch_load_stubbed(path):
    finder = _StubFinder()
    sys.meta_path.insert(0, finder)
    try:
        return torch.load(path, map_location="cpu")
    finally:
        sys.meta_path.remove(finder)
        for k in [k for k in sys.modules if k.split(".")[0] == "ultralytics"]:
            del sys.modules[k]


def load_weights(path):
    """State dict (float32 floats) from a .pt (plain state_dict, module, or checkpoint dict) or .safetensors."""
    if path.endswith(".safetensors"):
        sd, _, _ = st_read(path)
        return {k: v for k, v in sd.items() if k.startswith("model.")}
    try:
        obj = torch.load(path, map_location="cpu")
    except (ModuleNotFoundError, AttributeError):
        obj = _torch_load_stubbed(path)  # ultralytics not installed: unpickle its classes as stubs
    if isinstance(obj, dict) and ("model" in obj or "ema" in obj):
        obj = obj.get("model") if obj.get("model") is not None else obj.get("ema")
    if isinstance(obj, nn.Module):
        obj = obj.state_dict()
    if not isinstance(obj, dict):
        raise SystemExit(f"{path}: expected a state_dict, a module or a checkpoint dict with 'model'")
    return {k: (v.float() if v.is_floating_point() else v) for k, v in obj.items()}


def check_names(path):
    sd, meta, header = st_read(path)
    model_keys = {k: v for k, v in sd.items() if k.startswith("model.")}
    other = sorted(set(sd) - set(model_keys))
    if "model.0.conv.weight" not in model_keys or "model.22.cv3.0.2.weight" not in model_keys:
        print(f"FAIL {path}: model.0.conv.weight / model.22.cv3.0.2.weight missing; cannot infer scale and nc")
        return 1
    scale, nc = infer_scale_nc(model_keys)
    model = DetectionModel(scale, nc)
    ref = model.state_dict()
    bad = []
    for k, v in model_keys.items():
        if k in ref and tuple(v.shape) != tuple(ref[k].shape):
            bad.append(f"shape {k}: file {tuple(v.shape)} model {tuple(ref[k].shape)}")
    dtypes = sorted({header[k]["dtype"] for k in model_keys})
    print(f"{path}: {len(model_keys)} model.* tensors (dtypes {dtypes}), {len(other)} other tensors ignored; "
          f"inferred scale {scale} nc {nc}; model has {len(ref)} state_dict entries")
    if bad:
        print("\n".join("  " + b for b in bad[:50]))
        print(f"FAIL {len(bad)} shape mismatches")
        return 1
    try:
        res = model.load_state_dict({k: v.to(ref[k].dtype) if k in ref else v for k, v in model_keys.items()},
                                    strict=True)
    except RuntimeError as e:
        print(f"FAIL load_state_dict(strict=True): {e}")
        return 1
    print(f"OK load_state_dict(strict=True): {res}")
    return 0

# ------------------------------------------------------------------------------------------------ fixture data


def make_images(B, S, seed):
    """Smooth patterns + blobs + noise, quantised to k/255."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:S, 0:S].astype(np.float64) / S
    imgs = np.zeros((B, 3, S, S))
    for b in range(B):
        for c in range(3):
            f = rng.uniform(1, 6, size=2)
            ph = rng.uniform(0, 2 * np.pi, size=2)
            v = 0.5 + 0.25 * np.sin(2 * np.pi * f[0] * xx + ph[0]) * np.cos(2 * np.pi * f[1] * yy + ph[1])
            for _ in range(4):
                cx, cy, r, a = rng.uniform(0, 1), rng.uniform(0, 1), rng.uniform(0.03, 0.2), rng.uniform(-.4, .4)
                v += a * np.exp(-((xx - cx) ** 2 + (yy - cy) ** 2) / (2 * r * r))
            v += rng.normal(0, 0.04, size=v.shape)
            imgs[b, c] = v
    q = np.clip(np.round(imgs * 255), 0, 255).astype(np.uint8)
    return torch.from_numpy(q).float() / 255


def make_targets(B, S):
    """Boxes for image 0 only (other images empty), in pixels then normalised (all dyadic, exact in float).
    Includes: a box of 5x6 px containing no anchor centre at any stride, overlapping boxes of different
    and same class, a large box, a box at the image border."""
    px = [  # (img, cls, x1, y1, x2, y2) for S = 128; scaled by S/128 otherwise
        (0, 0, 21.5, 9.5, 26.5, 15.5),     # 5x6 px: x range holds only a stride-16 centre (24), y only stride-8 (12)
        (0, 1, 8.0, 40.0, 72.0, 104.0),    # large
        (0, 2, 40.0, 56.0, 88.0, 120.0),   # overlaps the previous one, other class
        (0, 1, 48.0, 64.0, 80.0, 96.0),    # inside both of the above, same class as the large one
        (0, 0, 80.0, 8.0, 128.0, 40.0),    # touches the right border
        (0, 2, 2.0, 2.0, 18.0, 26.0),      # small-ish, top-left
    ]
    k = S / 128
    rows = [(i, c % 1000, x1 * k, y1 * k, x2 * k, y2 * k) for i, c, x1, y1, x2, y2 in px if i < B]
    bi = torch.tensor([r[0] for r in rows], dtype=torch.float32)
    cl = torch.tensor([r[1] for r in rows], dtype=torch.float32)
    bb = torch.tensor([[(r[2] + r[4]) / 2 / S, (r[3] + r[5]) / 2 / S, (r[4] - r[2]) / S, (r[5] - r[3]) / S]
                       for r in rows], dtype=torch.float32)
    return bi, cl, bb


def perturb_state(model, images, seed):
    """Seeded BN gamma/beta, then realistic running stats (one batch-statistics pass, momentum 1), then a seeded
    perturbation of the running stats (so eval and train forwards differ a little but both stay well scaled).
    Box-branch output biases get a decaying bin profile 1 - 0.6 k + 0.3 N(0,1) (bin k of each side), so the
    initial predicted distances are ~1.2 grid units instead of ~7.5 and foreground anchors appear on all three
    levels (with Detect.bias_init's flat bias every positive lands on stride 8 at this image size)."""
    g = torch.Generator().manual_seed(seed + 1000)
    for seq in model.model[22].cv2:
        b = seq[-1].bias
        k = torch.arange(REG_MAX, dtype=b.dtype).repeat(4)
        b.data = 1.0 - 0.6 * k + 0.3 * torch.randn(b.shape, generator=g)
    bns = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    for m in bns:
        c = m.num_features
        m.weight.data = 1 + 0.1 * torch.randn(c, generator=g)
        m.bias.data = 0.1 * torch.randn(c, generator=g)
        m.momentum = 1.0
    model.train()
    with torch.no_grad():
        model(images)
    for m in bns:
        c = m.num_features
        m.momentum = 0.03
        m.num_batches_tracked.zero_()
        m.running_mean.data = m.running_mean + 0.02 * torch.randn(c, generator=g) * m.running_var.sqrt()
        m.running_var.data = m.running_var * torch.exp(0.05 * torch.randn(c, generator=g))


def loop_loss(feats, bi, cl, bb, nc, strides=(8, 16, 32), topk=10):
    """Independent, deliberately plain re-implementation of the v8 loss (one gt and one anchor at a time, float64, no
    shared code with V8Loss) used to cross-check it. Top-k is taken among in-box anchors, which equals
    TaskAlignedAssigner whenever the assignment is unambiguous.
    Returns (box, cls, dfl, fg_mask (B,A), target_scores (B,A,NC))."""
    feats = [f.double() for f in feats]
    B = feats[0].shape[0]
    no = 4 * REG_MAX + nc
    xcat = torch.cat([f.reshape(B, no, -1) for f in feats], 2)
    A = xcat.shape[2]
    H, W = feats[0].shape[2] * strides[0], feats[0].shape[3] * strides[0]
    pts, sts = [], []
    for f, s in zip(feats, strides):
        for y in range(f.shape[2]):
            for x in range(f.shape[3]):
                pts.append((x + 0.5, y + 0.5))
                sts.append(float(s))

    def ciou(b1, b2, eps=1e-7):
        w1, h1 = b1[2] - b1[0], b1[3] - b1[1] + eps
        w2, h2 = b2[2] - b2[0], b2[3] - b2[1] + eps
        inter = max(min(b1[2], b2[2]) - max(b1[0], b2[0]), 0) * max(min(b1[3], b2[3]) - max(b1[1], b2[1]), 0)
        iou = inter / (w1 * h1 + w2 * h2 - inter + eps)
        c2 = (max(b1[2], b2[2]) - min(b1[0], b2[0])) ** 2 + (max(b1[3], b2[3]) - min(b1[1], b2[1])) ** 2 + eps
        rho2 = ((b2[0] + b2[2] - b1[0] - b1[2]) ** 2 + (b2[1] + b2[3] - b1[1] - b1[3]) ** 2) / 4
        v = 4 / math.pi ** 2 * (math.atan(w2 / h2) - math.atan(w1 / h1)) ** 2
        return iou - (rho2 / c2 + v * (v / (v - iou + 1 + eps)))

    logits = xcat[:, 4 * REG_MAX:]                                                        # (B,NC,A)
    dist = torch.softmax(xcat[:, :4 * REG_MAX].reshape(B, 4, REG_MAX, A), 2)
    d = (dist * torch.arange(REG_MAX, dtype=torch.float64).view(1, 1, REG_MAX, 1)).sum(2)  # (B,4,A) l,t,r,b
    pbox = [[[pts[a][0] - float(d[b, 0, a]), pts[a][1] - float(d[b, 1, a]), pts[a][0] + float(d[b, 2, a]),
              pts[a][1] + float(d[b, 3, a])] for a in range(A)] for b in range(B)]      # grid units
    TS = torch.zeros(B, A, nc, dtype=torch.float64)
    FG = torch.zeros(B, A, dtype=torch.long)
    assigned = {}
    for b in range(B):
        gts = [(int(cl[i]), [(float(bb[i, 0]) - float(bb[i, 2]) / 2) * W, (float(bb[i, 1]) - float(bb[i, 3]) / 2) * H,
                             (float(bb[i, 0]) + float(bb[i, 2]) / 2) * W, (float(bb[i, 1]) + float(bb[i, 3]) / 2) * H])
               for i in range(len(bi)) if int(bi[i]) == b]
        M = len(gts)
        ov = [[0.0] * A for _ in range(M)]
        al = [[0.0] * A for _ in range(M)]
        pos = [[False] * A for _ in range(M)]
        for j, (c, g) in enumerate(gts):
            inside = []
            for a in range(A):
                ax, ay = pts[a][0] * sts[a], pts[a][1] * sts[a]
                if min(ax - g[0], ay - g[1], g[2] - ax, g[3] - ay) > 1e-9:
                    o = max(ciou(g, [v * sts[a] for v in pbox[b][a]]), 0.0)
                    p = 1 / (1 + math.exp(-float(logits[b, c, a])))
                    ov[j][a], al[j][a] = o, p ** 0.5 * o ** 6
                    inside.append(a)
            for a in sorted(inside, key=lambda a: -al[j][a])[:topk]:
                pos[j][a] = True
        for a in range(A):
            if sum(pos[j][a] for j in range(M)) > 1:
                best = max(range(M), key=lambda j: (ov[j][a], -j))
                for j in range(M):
                    pos[j][a] = j == best
        max_al = [max(al[j][a] * pos[j][a] for a in range(A)) for j in range(M)]
        max_ov = [max(ov[j][a] * pos[j][a] for a in range(A)) for j in range(M)]
        for a in range(A):
            js = [j for j in range(M) if pos[j][a]]
            if js:
                FG[b, a] = 1
                assigned[(b, a)] = gts[js[0]][1]
                TS[b, a, gts[js[0]][0]] = max(al[k][a] * pos[k][a] * max_ov[k] / (max_al[k] + 1e-9) for k in range(M))
    tss = max(float(TS.sum()), 1.0)
    lg = logits.permute(0, 2, 1)
    cls = float((lg.clamp(min=0) - lg * TS + torch.log1p(torch.exp(-lg.abs()))).sum()) / tss
    box = dfl = 0.0
    for (b, a), g in assigned.items():
        g = [v / sts[a] for v in g]
        w = float(TS[b, a].sum())
        box += (1 - ciou(pbox[b][a], g)) * w
        t = [pts[a][0] - g[0], pts[a][1] - g[1], g[2] - pts[a][0], g[3] - pts[a][1]]
        side = 0.0
        for k in range(4):
            tt = min(max(t[k], 0.0), REG_MAX - 1 - 0.01)
            i = int(tt)
            wl = i + 1 - tt
            lp = torch.log_softmax(xcat[b, REG_MAX * k:REG_MAX * (k + 1), a], 0)
            side += -float(lp[i]) * wl - float(lp[i + 1]) * (1 - wl)
        dfl += side / 4 * w
    return 7.5 * box / tss, 0.5 * cls, 1.5 * dfl / tss, FG, TS


def sgd_step(model, lr, momentum, wd, max_norm):
    """clip_grad_norm_ + SGD(nesterov) with the three Ultralytics groups; returns (grad_norm, clip_coef)."""
    g_bias, g_w, g_bn = optimizer_groups(model)
    opt = torch.optim.SGD([p for _, p in g_bias], lr=lr, momentum=momentum, nesterov=True)
    opt.add_param_group({"params": [p for _, p in g_w], "weight_decay": wd})
    opt.add_param_group({"params": [p for _, p in g_bn], "weight_decay": 0.0})
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=max_norm)
    coef = min(1.0, max_norm / (float(norm) + 1e-6))
    opt.step()
    return float(norm), coef

# ------------------------------------------------------------------------------------------------ self-tests


def self_tests(quick=False):
    torch.manual_seed(0)
    fails = 0

    def report(name, ok, detail=""):
        nonlocal fails
        fails += 0 if ok else 1
        print(f"{'PASS' if ok else 'FAIL'}  {name} {detail}")

    # model sizes (Ultralytics' figures)
    for s in ("n",) if quick else ("n", "s", "m", "l", "x"):
        m = DetectionModel(s, 80, dry_run=(s == "n"))
        n = sum(p.numel() for p in m.parameters())
        ng = n - m.model[22].dfl.conv.weight.numel()
        report(f"params {s} nc=80", n == PARAMS_NC80[s] and ng == PARAMS_NC80[s] - 16, f"{n:,} (want {PARAMS_NC80[s]:,})")
        report(f"leaf layers {s}", count_leaves(m) == LEAVES[s], f"{count_leaves(m)} (want {LEAVES[s]})")
        if s == "n":
            per = [sum(p.numel() for p in l.parameters()) for l in m.model]
            report("YOLOv8n per-layer params", per == LAYER_PARAMS_N)
            gb, gw, gn = optimizer_groups(m)
            report("optimizer groups n", (len(gb), len(gw), len(gn)) == (63, 64, 57),
                   f"{len(gb)}/{len(gw)}/{len(gn)} (want 63/64/57)")
            report("strides from dry run", m.stride.tolist() == [8.0, 16.0, 32.0], f"{m.stride.tolist()}")
            sd = m.state_dict()
            report("state_dict names", all(k in sd for k in (
                "model.0.conv.weight", "model.0.bn.num_batches_tracked", "model.2.m.0.cv1.conv.weight",
                "model.9.cv1.conv.weight", "model.22.cv2.0.0.conv.weight", "model.22.cv2.0.2.bias",
                "model.22.cv3.2.2.weight", "model.22.dfl.conv.weight")) and len(sd) == 355, f"{len(sd)} entries")
            b = m.model[22].cv3[0][2].bias
            report("bias_init", abs(float(b[0]) - (-11.5366)) < 1e-4, f"{float(b[0]):.4f}")
            del m
    # assigner on hand-made boxes: 4x4 grid at stride 8 (centres 4,12,20,28 px), nc=2
    asg = Assigner(2, topk=10)
    anc, st = make_anchors([(4, 4)], [8])
    ap = anc * st
    gt = torch.tensor([[[6., 6., 22., 14.], [10., 10., 30., 30.], [13., 13., 18., 19.], [0, 0, 0, 0]]])
    labels = torch.tensor([[[0.], [1.], [0.], [0.]]])
    mgt = torch.tensor([[[1.], [1.], [1.], [0.]]])
    mask_in = asg.in_gts(ap, gt)
    want0 = torch.zeros(16); want0[[5, 6]] = 1
    want1 = torch.zeros(16); want1[[5, 6, 7, 9, 10, 11, 13, 14, 15]] = 1
    report("in-box candidates", torch.equal(mask_in[0, 0], want0) and torch.equal(mask_in[0, 1], want1)
           and mask_in[0, 2].sum() == 0)
    # predicted boxes: each anchor predicts a box; anchor 5 predicts gt0 exactly, anchor 6 predicts gt1 exactly
    pd = torch.cat((ap - 6, ap + 6), 1).unsqueeze(0).clone()
    pd[0, 5] = gt[0, 0]
    pd[0, 6] = gt[0, 1]
    sc = torch.full((1, 16, 2), 0.5)
    r = asg(sc, pd, ap, labels, gt, mgt)
    fg = r["fg_mask"][0]
    # anchor 5 is inside gt0 and gt1: its CIoU with gt0 is ~1, so it belongs to gt0; anchor 6 (inside both)
    # predicts gt1 exactly, so it goes to gt1; gt2 (5x6 px between centres) gets nothing.
    report("assigner fg set", torch.equal(fg.nonzero().flatten(), want1.nonzero().flatten()),
           f"{fg.nonzero().flatten().tolist()}")
    report("assigner gt resolution", int(r["target_gt_idx"][0, 5]) == 0 and int(r["target_gt_idx"][0, 6]) == 1
           and int(r["target_labels"][0, 6]) == 1)
    ts = r["target_scores"][0]
    report("assigner soft targets", abs(float(ts[5, 0]) - 1) < 1e-5 and abs(float(ts[6, 1]) - 1) < 1e-5
           and float(ts[5, 1]) == 0 and float(ts[0].sum()) == 0, f"best-anchor targets {float(ts[5,0]):.6f} "
           f"{float(ts[6,1]):.6f}")
    # loss gradient vs finite differences in float64, fixed assignment and fixed CIoU alpha
    torch.manual_seed(1)
    nc, B = 3, 2
    loss = V8Loss(nc, [8, 16])
    feats = [torch.randn(B, 64 + nc, 4, 4, dtype=torch.float64), torch.randn(B, 64 + nc, 2, 2, dtype=torch.float64)]
    bi = torch.tensor([0., 0., 1.], dtype=torch.float64)
    cl = torch.tensor([0., 2., 1.], dtype=torch.float64)
    bb = torch.tensor([[0.4, 0.4, 0.7, 0.6], [0.6, 0.55, 0.5, 0.8], [0.5, 0.5, 0.9, 0.9]], dtype=torch.float64)
    _, _, info = loss(feats, bi, cl, bb)
    fixed = {k: info[k] for k in ("target_scores", "target_bboxes", "fg_mask")}
    nfg = int(info["fg_mask"].sum())
    anc, st = info["anchors"], info["strides"]

    def split(xcat):
        d, s = xcat.split((64, nc), 1)
        return d.permute(0, 2, 1).contiguous(), s.permute(0, 2, 1).contiguous()

    xcat = torch.cat([f.view(B, 64 + nc, -1) for f in feats], 2).detach()
    d0, s0 = split(xcat)
    with torch.no_grad():
        pb = loss.decode(anc, d0)[fixed["fg_mask"]]
        tb = (fixed["target_bboxes"] / st)[fixed["fg_mask"]]
        b1, b2 = pb, tb  # the CIoU alpha at this point, recomputed as a constant
        w1, h1 = b1[:, 2:3] - b1[:, 0:1], b1[:, 3:4] - b1[:, 1:2] + 1e-7
        w2, h2 = b2[:, 2:3] - b2[:, 0:1], b2[:, 3:4] - b2[:, 1:2] + 1e-7
        inter = (torch.min(b1[:, 2:3], b2[:, 2:3]) - torch.max(b1[:, 0:1], b2[:, 0:1])).clamp(0) * \
                (torch.min(b1[:, 3:4], b2[:, 3:4]) - torch.max(b1[:, 1:2], b2[:, 1:2])).clamp(0)
        iou = inter / (w1 * h1 + w2 * h2 - inter + 1e-7)
        v = (4 / math.pi ** 2) * (torch.atan(w2 / h2) - torch.atan(w1 / h1)) ** 2
        alpha = v / (v - iou + (1 + 1e-7))

    def f(x):
        d, s = split(x)
        lv, _ = loss.loss_from_assignment(d, s, anc, st, fixed, alpha=alpha)
        return lv * B

    x = xcat.clone().requires_grad_(True)
    ok = torch.autograd.gradcheck(f, (x,), eps=1e-6, atol=1e-6, rtol=1e-5, raise_exception=False)
    report("loss gradcheck (float64, fixed assignment)", ok and nfg > 0, f"fg {nfg}")
    # and the alpha-under-no_grad path equals the fixed-alpha path in value and gradient
    x1 = xcat.clone().requires_grad_(True)
    d, s = split(x1)
    lv1, _ = loss.loss_from_assignment(d, s, anc, st, fixed)
    g1, = torch.autograd.grad(lv1.sum(), x1)
    x2 = xcat.clone().requires_grad_(True)
    d, s = split(x2)
    lv2, _ = loss.loss_from_assignment(d, s, anc, st, fixed, alpha=alpha)
    g2, = torch.autograd.grad(lv2.sum(), x2)
    report("no_grad alpha == constant alpha", torch.allclose(lv1, lv2, rtol=0, atol=1e-12)
           and torch.allclose(g1, g2, rtol=0, atol=1e-12))
    print(f"self-tests: {fails} failed")
    return fails

# ------------------------------------------------------------------------------------------------ fixture


def run_case(model, images, bi, cl, bb, args):
    """eval forward, train forward, loss, backward, step. Mutates model. Returns dict of results."""
    B = images.shape[0]
    model.eval()
    with torch.no_grad():
        y_eval, raw_eval = model(images)
    model.train()
    freeze_dfl(model)
    model.zero_grad(set_to_none=True)
    feats = model(images)
    lossf = V8Loss(model.nc, model.stride.tolist())
    ltot, lvec, info = lossf(feats, bi, cl, bb)
    margins = dict(lossf.assigner.margins)
    total = ltot.sum()
    total.backward()
    grads = {k: p.grad.detach().clone() for k, p in model.named_parameters() if p.grad is not None}
    bn_after = {k: v.detach().clone() for k, v in model.state_dict().items()
                if k.endswith(("running_mean", "running_var", "num_batches_tracked"))}
    norm, coef = sgd_step(model, args.lr, args.momentum, args.weight_decay, args.clip)
    step = {k: p.detach().clone() for k, p in model.named_parameters()}
    return dict(y_eval=y_eval, raw_eval=raw_eval, feats=[f.detach() for f in feats], lvec=lvec, total=total.detach(),
                info=info, grads=grads, bn_after=bn_after, step=step, norm=norm, coef=coef, margins=margins)


def level_ranges(S):
    n = [(S // s) ** 2 for s in (8, 16, 32)]
    return [(0, n[0]), (n[0], n[0] + n[1]), (n[0] + n[1], sum(n))]


def rel_dev(a, b):
    a, b = a.double(), b.double()
    return float((a - b).abs().max() / b.abs().max().clamp(min=1e-30))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scale", default="n", choices=list(SCALES))
    ap.add_argument("--nc", type=int, default=3)
    ap.add_argument("--imgsz", type=int, default=128)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--weights", help="Ultralytics .pt or .safetensors to take the weights from")
    ap.add_argument("--out", help="fixture path (default test/fixtures/ref_<scale>_nc<nc>_<imgsz>.safetensors)")
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--momentum", type=float, default=0.937)
    ap.add_argument("--weight-decay", type=float, default=0.0005)
    ap.add_argument("--clip", type=float, default=10.0)
    ap.add_argument("--check-names", metavar="FILE", help="strict-load the model.* tensors of FILE and report")
    ap.add_argument("--no-self-test", action="store_true")
    ap.add_argument("--self-test-only", action="store_true")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads; results depend on it in the last bits, the fixtures use 1")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    if args.check_names:
        sys.exit(check_names(args.check_names))
    if not args.no_self_test:
        if self_tests(quick=args.weights is not None):
            sys.exit("self-tests failed")
    if args.self_test_only:
        return
    assert args.imgsz % 32 == 0, "imgsz must be a multiple of 32"

    source = "seeded"
    if args.weights:
        sd = load_weights(args.weights)
        args.scale, args.nc = infer_scale_nc(sd)
        model = DetectionModel(args.scale, args.nc)
        model.load_state_dict(sd, strict=True)
        source = os.path.basename(args.weights)
    else:
        torch.manual_seed(args.seed)
        model = DetectionModel(args.scale, args.nc)
    images = make_images(args.batch, args.imgsz, args.seed)
    bi, cl, bb = make_targets(args.batch, args.imgsz)
    cl = cl.remainder(args.nc)
    if not args.weights:
        perturb_state(model, images, args.seed)
    init_sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    model64 = DetectionModel(args.scale, args.nc).double()
    model64.load_state_dict(init_sd)

    r = run_case(model, images, bi, cl, bb, args)
    r64 = run_case(model64, images.double(), bi.double(), cl.double(), bb.double(), args)

    info = r["info"]
    fg = info["fg_mask"]
    nfg = int(fg.sum())
    same_assign = torch.equal(fg, r64["info"]["fg_mask"]) and \
        torch.equal(info["target_gt_idx"][fg], r64["info"]["target_gt_idx"][fg])
    amb = info["ambiguous"]
    lv = r["lvec"]
    print(f"scale {args.scale} nc {args.nc} imgsz {args.imgsz} batch {args.batch} source {source}")
    print(f"loss box {float(lv[0]):.6f} cls {float(lv[1]):.6f} dfl {float(lv[2]):.6f} "
          f"total(xB) {float(r['total']):.6f}")
    lvl = [int(fg[:, a:b].sum()) for a, b in level_ranges(args.imgsz)]
    print(f"fg anchors {nfg} (per image {fg.sum(1).tolist()}, per level P3/P4/P5 {lvl}), target_scores_sum {float(info['target_scores_sum']):.6f}")
    print(f"grad norm before clip {r['norm']:.6f}, clip coef {r['coef']:.6f}")
    print(f"assignment unambiguous: {not amb}" + ("" if not amb else " -> " + "; ".join(amb)))
    print(f"float64 rerun gives the same assignment: {same_assign}")
    mg = r["margins"]
    print("decision margins: " + ", ".join(f"{k} {v:.3g}" for k, v in sorted(mg.items())) +
          " (topk_gap: smallest relative gap between the 10th and 11th in-box align of a gt; min_pos_overlap: "
          "smallest nonzero clamped CIoU of an in-box anchor; multi_gt_gap: smallest CIoU gap deciding an anchor "
          "claimed by two gts)")
    dev = {
        "fp64_out_eval": rel_dev(r["y_eval"], r64["y_eval"]),
        "fp64_out_train": max(rel_dev(a, b) for a, b in zip(r["feats"], r64["feats"])),
        "fp64_loss": rel_dev(r["lvec"], r64["lvec"]),
        "fp64_grad": max(rel_dev(r["grads"][k], r64["grads"][k]) for k in r["grads"]),
        "fp64_step": max(rel_dev(r["step"][k], r64["step"][k]) for k in r["step"]),
    }
    lb, lc, ld, lfg, lts = loop_loss(r["feats"], bi, cl, bb, args.nc, model.stride.tolist())
    loop_dev = max(abs(x - float(y)) / max(abs(float(y)), 1e-12) for x, y in zip((lb, lc, ld), lv))
    loop_ok = torch.equal(lfg, fg.long()) and loop_dev < 1e-5 and \
        float((lts - info["target_scores"].double()).abs().max()) < 1e-5
    print(f"{'PASS' if loop_ok else 'FAIL'}  independent loop loss (float64, from out.train): box {lb:.6f} cls {lc:.6f} "
          f"dfl {ld:.6f}, worst rel diff {loop_dev:.2e} (tol 1e-5), same fg mask {torch.equal(lfg, fg.long())}")
    print("max |fp32 - fp64| / max|fp64|: " + ", ".join(f"{k[5:]} {v:.2e}" for k, v in dev.items()))
    if not args.weights:
        assert nfg > 0, "no foreground anchors; change the targets"
        assert not amb, "assignment depends on torch tie-breaking; change the targets or seed"
        assert loop_ok, "vectorised loss and independent loop loss disagree"

    T = []
    for k, v in init_sd.items():
        T.append((k, v))
    T.append(("input.images", images))
    T += [("targets.batch_idx", bi), ("targets.cls", cl), ("targets.bboxes", bb)]
    T.append(("out.eval", r["y_eval"]))
    T += [(f"out.eval_raw.{i}", x) for i, x in enumerate(r["raw_eval"])]
    T += [(f"out.train.{i}", x) for i, x in enumerate(r["feats"])]
    T += [(f"bn_after.{k}", v) for k, v in r["bn_after"].items()]
    T += [("loss.box", lv[0]), ("loss.cls", lv[1]), ("loss.dfl", lv[2]), ("loss.total", r["total"])]
    T += [("assign.fg_count", torch.tensor(nfg, dtype=torch.int64)),
          ("assign.target_scores_sum", torch.as_tensor(info["target_scores_sum"], dtype=torch.float32)),
          ("assign.fg_mask", fg.long()), ("assign.target_gt_idx", info["target_gt_idx"].long()),
          ("assign.target_scores", info["target_scores"]), ("assign.target_bboxes", info["target_bboxes"])]
    T += [(f"grad.{k}", v) for k, v in r["grads"].items()]
    T += [(f"step.{k}", v) for k, v in r["step"].items()]
    meta = dict(format="yolo.c reference fixture v1", scale=args.scale, nc=args.nc, imgsz=args.imgsz,
                batch=args.batch, seed=args.seed, source=source, lr=args.lr, momentum=args.momentum,
                nesterov=1, weight_decay=args.weight_decay, clip_max_norm=args.clip, grad_norm=repr(r["norm"]),
                clip_coef=repr(r["coef"]), box_gain=7.5, cls_gain=0.5, dfl_gain=1.5, bn_eps=1e-3, bn_momentum=0.03,
                order="eval(initial weights) -> train forward -> loss -> backward -> clip -> sgd",
                torch_version=torch.__version__, torch_threads=args.threads, assign_unambiguous=int(not amb),
                **{f"margin_{k}": f"{v:.3e}" for k, v in r["margins"].items()},
                **{k: f"{v:.3e}" for k, v in dev.items()})
    out = args.out or os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures",
                                   f"ref_{args.scale}_nc{args.nc}_{args.imgsz}.safetensors")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    st_write(out, T, meta)
    print(f"wrote {out} ({os.path.getsize(out) / 1e6:.1f} MB, {len(T)} tensors)")
    # read back: round trip of every tensor
    back, meta2, _ = st_read(out)
    rt = all(torch.equal(back[k], (v.detach().float() if v.is_floating_point() else v.detach().long()).reshape(
        back[k].shape)) for k, v in T) and meta2["scale"] == args.scale
    print(f"{'PASS' if rt else 'FAIL'}  safetensors round trip")
    if not rt:
        sys.exit(1)


if __name__ == "__main__":
    main()
