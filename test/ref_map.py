#!/usr/bin/env python3
"""ref_map.py: numpy reference for validation matching and mAP (DetectionValidator), written
in the style of Ultralytics' numpy code (match_predictions, ap_per_class,
compute_ap, smooth), independently of parts/eval.c.

Usage:
  python3 test/ref_map.py [--seed 1] [--images 60] [--out test/fixtures/map_random.txt]
Generates random labels and detections (deterministic from the seed), runs the reference and
writes the fixture that test/test_eval.c checks the C Evaluator against.

Fixture format (plain text, one record per line, floats %.9g; boxes and scores are float32
values so strtof reads them back exactly):
  # ...                          comment
  nc NC                          number of classes
  image M N                      an image with M labels and N detections, followed by
  l CLS X1 Y1 X2 Y2              M label lines (pixels, xyxy)
  d CLS CONF X1 Y1 X2 Y2         N detection lines in NMS order (confidence descending)
  expect P R MAP50 MAP5095       reference metrics
  best K                         index into linspace(0, 1, 1000) of the smoothed max mean F1
  ap CLS AP50 AP5095             per-class AP for every class with at least one label
"""
import argparse
import os
import numpy as np

IOUV = np.array([0.5 + 0.05 * i for i in range(10)], dtype=np.float32)  # = torch.linspace in fp32


def box_iou(b1, b2, eps=1e-7):
    """(M,4) x (N,4) xyxy -> (M,N) IoU in float32, eps added to the union last."""
    b1 = b1.astype(np.float32)[:, None, :]
    b2 = b2.astype(np.float32)[None, :, :]
    wh = (np.minimum(b1[..., 2:], b2[..., 2:]) - np.maximum(b1[..., :2], b2[..., :2])).clip(0)
    inter = wh[..., 0] * wh[..., 1]
    a1 = (b1[..., 2] - b1[..., 0]) * (b1[..., 3] - b1[..., 1])
    a2 = (b2[..., 2] - b2[..., 0]) * (b2[..., 3] - b2[..., 1])
    return inter / (a1 + a2 - inter + np.float32(eps))


def match_predictions(pred_classes, true_classes, iou):
    """(N,) pred cls, (M,) label cls, (M,N) IoU -> (N,10) bool TP per IoU threshold."""
    correct = np.zeros((pred_classes.shape[0], IOUV.shape[0]), dtype=bool)
    iou = iou * (true_classes[:, None] == pred_classes[None, :])
    for ti, thr in enumerate(IOUV):
        m = np.array(np.nonzero(iou >= thr)).T  # (K,2) label, detection
        if m.shape[0] == 0:
            continue
        if m.shape[0] > 1:
            m = m[iou[m[:, 0], m[:, 1]].argsort(kind="stable")[::-1]]
            m = m[np.unique(m[:, 1], return_index=True)[1]]
            m = m[np.unique(m[:, 0], return_index=True)[1]]
        correct[m[:, 1], ti] = True
    return correct


def match_greedy_iou(pred_classes, true_classes, iou):
    """Diagnostic only: one-to-one matching by IoU alone (what a summary of it suggests), to
    count how often match_predictions' detection-index rule decides differently."""
    correct = np.zeros((pred_classes.shape[0], IOUV.shape[0]), dtype=bool)
    iou = iou * (true_classes[:, None] == pred_classes[None, :])
    for ti, thr in enumerate(IOUV):
        used_l, used_d = set(), set()
        for k in np.argsort(-iou, axis=None, kind="stable"):
            i, j = divmod(int(k), iou.shape[1])
            if iou[i, j] < thr:
                break
            if i not in used_l and j not in used_d:
                used_l.add(i), used_d.add(j)
                correct[j, ti] = True
    return correct


def smooth(y, f=0.05):
    nf = round(len(y) * f * 2) // 2 + 1
    p = np.ones(nf // 2)
    yp = np.concatenate((p * y[0], y, p * y[-1]), 0)
    return np.convolve(yp, np.ones(nf) / nf, mode="valid")


def compute_ap(recall, precision):
    mrec = np.concatenate(([0.0], recall, [1.0]))
    mpre = np.concatenate(([1.0], precision, [0.0]))
    mpre = np.flip(np.maximum.accumulate(np.flip(mpre)))
    x = np.linspace(0, 1, 101)
    y = np.interp(x, mrec, mpre)
    return float(np.sum(np.diff(x) * (y[1:] + y[:-1]) / 2.0))  # np.trapz


def ap_per_class(tp, conf, pred_cls, target_cls, eps=1e-16):
    i = np.argsort(-conf, kind="stable")
    tp, conf, pred_cls = tp[i], conf[i], pred_cls[i]
    unique_classes, nt = np.unique(target_cls, return_counts=True)
    nc = unique_classes.shape[0]
    x = np.linspace(0, 1, 1000)
    ap, p_curve, r_curve = np.zeros((nc, tp.shape[1])), np.zeros((nc, 1000)), np.zeros((nc, 1000))
    for ci, c in enumerate(unique_classes):
        i = pred_cls == c
        n_l, n_p = nt[ci], i.sum()
        if n_p == 0 or n_l == 0:
            continue
        fpc = (1 - tp[i]).cumsum(0)
        tpc = tp[i].cumsum(0)
        recall = tpc / (n_l + eps)
        r_curve[ci] = np.interp(-x, -conf[i], recall[:, 0], left=0)
        precision = tpc / (tpc + fpc)
        p_curve[ci] = np.interp(-x, -conf[i], precision[:, 0], left=1)
        for j in range(tp.shape[1]):
            ap[ci, j] = compute_ap(recall[:, j], precision[:, j])
    f1_curve = 2 * p_curve * r_curve / (p_curve + r_curve + eps)
    k = smooth(f1_curve.mean(0), 0.1).argmax()
    return p_curve[:, k], r_curve[:, k], ap, unique_classes.astype(int), k


def generate(rng, n_images, nc):
    """Random images. Classes 0..nc-3 get labels and detections; class nc-2 has labels but is
    never predicted; class nc-1 is predicted but never labelled."""
    labelled = list(range(nc - 1))            # classes that can have labels
    predicted = list(range(nc - 2)) + [nc - 1]
    images = []
    for im in range(n_images):
        m = int(rng.integers(0, 7)) if im % 10 != 3 else 0        # some images have no labels
        xy = rng.uniform(0, 560, (m, 2))
        wh = rng.uniform(12, 200, (m, 2))
        lb = np.concatenate((xy, xy + wh), 1).astype(np.float32)
        lc = rng.choice(labelled, m).astype(np.int64)
        dets, dcls, confs = [], [], []
        if im % 10 != 7:                                            # some images have no detections
            for j in range(m):
                if lc[j] == nc - 2 or rng.uniform() < 0.15:
                    continue
                for _ in range(int(rng.integers(1, 3))):            # a hit and sometimes a duplicate
                    s = rng.uniform(0.0, 0.22)
                    w, h = lb[j, 2] - lb[j, 0], lb[j, 3] - lb[j, 1]
                    jit = rng.normal(0, 1, 4) * s * np.array([w, h, w, h])
                    dets.append(lb[j] + jit)
                    dcls.append(lc[j] if rng.uniform() < 0.85 else rng.choice(predicted))
                    c = 1.0 - 3.0 * s + rng.normal(0, 0.15)          # better boxes score higher
                    confs.append(c if 0.002 < c < 0.999 else rng.uniform(0.002, 0.999))
            for _ in range(int(rng.integers(0, 4))):                # background false positives
                p = rng.uniform(0, 560, 2)
                dets.append(np.concatenate((p, p + rng.uniform(12, 200, 2))))
                dcls.append(rng.choice(predicted))
                confs.append(rng.uniform(0.001, 0.6))
        n = len(dets)
        db = np.array(dets, dtype=np.float32).reshape(n, 4)
        db[:, 2:] = np.maximum(db[:, 2:], db[:, :2] + 1)              # keep boxes non-degenerate
        dc = np.array(dcls, dtype=np.int64).reshape(n)
        conf = np.array(confs, dtype=np.float32).reshape(n)
        o = np.argsort(-conf, kind="stable")                        # NMS output order
        images.append((lb, lc, db[o], dc[o], conf[o]))
    return images


def main():
    ap_ = argparse.ArgumentParser()
    ap_.add_argument("--seed", type=int, default=1)
    ap_.add_argument("--images", type=int, default=60)
    ap_.add_argument("--nc", type=int, default=5)
    ap_.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "fixtures", "map_random.txt"))
    a = ap_.parse_args()
    rng = np.random.default_rng(a.seed)
    images = generate(rng, a.images, a.nc)

    tps, confs, pcls, tcls, ious, quirk = [], [], [], [], [], 0
    for lb, lc, db, dc, conf in images:
        tcls.append(lc)
        if len(dc) == 0:
            continue
        if len(lc):
            iou = box_iou(lb, db)
            ious.append((iou * (lc[:, None] == dc[None, :])).ravel())
            tps.append(match_predictions(dc, lc, iou))
            quirk += int((tps[-1] != match_greedy_iou(dc, lc, iou)).sum())
        else:
            tps.append(np.zeros((len(dc), 10), dtype=bool))
        confs.append(conf)
        pcls.append(dc)
    tp, conf, pc, tc = np.concatenate(tps), np.concatenate(confs), np.concatenate(pcls), np.concatenate(tcls)
    assert len(np.unique(conf)) == len(conf), "confidence tie: choose another seed"
    p, r, ap, cls, kbest = ap_per_class(tp, conf, pc, tc)
    assert 50 < kbest < 950, "max-F1 confidence at the grid edge (index %d): P/R would test little" % kbest
    P, R, map50, map5095 = p.mean(), r.mean(), ap[:, 0].mean(), ap.mean()

    iou = np.concatenate(ious)
    hits = iou[iou > 0]
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        f.write("# map_random.txt: written by test/ref_map.py --seed %d --images %d --nc %d; format in its docstring\n"
                % (a.seed, a.images, a.nc))
        f.write("# %d labels, %d detections, %d TP at IoU 0.5, %d TP at 0.95; matched-class IoUs > 0: %d in [%.2f, %.2f]\n"
                % (len(tc), len(conf), tp[:, 0].sum(), tp[:, 9].sum(), len(hits), hits.min(), hits.max()))
        f.write("# (detection, threshold) TP flags where match_predictions differs from pure greedy-by-IoU: %d\n" % quirk)
        f.write("nc %d\n" % a.nc)
        for lb, lc, db, dc, cf in images:
            f.write("image %d %d\n" % (len(lc), len(dc)))
            for b, c in zip(lb, lc):
                f.write("l %d %.9g %.9g %.9g %.9g\n" % (c, *[float(v) for v in b]))
            for b, c, s in zip(db, dc, cf):
                f.write("d %d %.9g %.9g %.9g %.9g %.9g\n" % (c, float(s), *[float(v) for v in b]))
        f.write("expect %.9g %.9g %.9g %.9g\n" % (P, R, map50, map5095))
        f.write("best %d\n" % kbest)
        for k, c in enumerate(cls):
            f.write("ap %d %.9g %.9g\n" % (c, ap[k, 0], ap[k].mean()))
    print("wrote %s: P %.6f R %.6f mAP50 %.6f mAP50-95 %.6f (%d labels, %d detections, max-F1 index %d)"
          % (a.out, P, R, map50, map5095, len(tc), len(conf), kbest))
    hist = np.histogram(hits, bins=[0, 0.3, 0.5, 0.7, 0.9, 1.0001])[0]
    print("matched-class IoU histogram [0,.3,.5,.7,.9,1]:", hist)


if __name__ == "__main__":
    main()
