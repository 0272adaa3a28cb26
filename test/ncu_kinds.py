#!/usr/bin/env python3
"""Per-kind time and TFLOP/s of one measured training step: Nsight Compute's per-launch times
(test/gpu_check.sh writes ncu_step.csv: gpu__time_duration of every launch of one yolov8n 640
batch-16 step of test/bin/gpu/gpu_bench) matched launch by launch to the emulator's launch list of
the same step (make emu-count: test/bin/emu-count/step.tsv, which names each launch's
YOLO_PROFILE kind and carries its useful FLOP and channels). The two lists are aligned on kernel
names (difflib: a launch one side has and the other has not is skipped). A conv's time includes
its reduction launch (the split weight gradient's). Measured, not modelled: ncu serialises the
launches and by default flushes the caches before each, so small kernels read as cold.

Usage: python3 test/ncu_kinds.py NCU.csv [STEP.tsv]   (STEP.tsv: test/bin/emu-count/step.tsv)
       python3 test/ncu_kinds.py --why NCU_CONVS.csv
--why: test/gpu_check.sh's second ncu pass (conv launches with the Occupancy, WarpStateStats and
ComputeWorkloadAnalysis sections and the per-reason stall ratios), per kernel: launches, time, achieved
occupancy, cycles between a warp's issues, and the stall reasons that cost the most (warps stalled
per issued instruction).
"""
import collections
import csv
import difflib
import re
import sys


def base(name):
    name = re.sub(r"^void ", "", name)
    return re.sub(r"[<(].*$", "", name)


def ncu_rows(path):
    """the metric rows of an ncu --csv file as dicts (its header's names; repeated headers skipped)"""
    with open(path) as f:
        rows = csv.reader([line for line in f if line.startswith('"')])
        hdr = next(rows)
        for r in rows:
            d = dict(zip(hdr, r))
            if d.get("ID") != "ID" and "Metric Name" in d:
                yield d


def ncu_us(d, path):
    """a gpu__time_duration row's value in microseconds"""
    scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}
    if d["Metric Unit"] not in scale:
        sys.exit(f"ncu_kinds.py: unknown time unit {d['Metric Unit']!r} in {path}")
    return float(d["Metric Value"].replace(",", "")) * scale[d["Metric Unit"]]


def why(path):
    per = collections.defaultdict(lambda: collections.defaultdict(list))   # kernel -> metric -> values
    ids = collections.defaultdict(set)
    for d in ncu_rows(path):
        k = re.sub(r"^void ", "", re.sub(r"\(.*$", "", d["Kernel Name"]))
        ids[k].add(d["ID"])
        if d["Metric Name"] == "gpu__time_duration.sum":
            per[k]["us"].append(ncu_us(d, path))
            continue
        try:
            per[k][d["Metric Name"]].append(float(d["Metric Value"].replace(",", "")))
        except ValueError:
            pass
    mean = lambda v: sum(v) / len(v) if v else float("nan")
    pre, post = "smsp__average_warps_issue_stalled_", "_per_issue_active.ratio"
    for k in sorted(per, key=lambda k: -sum(per[k].get("us", [0]))):
        m = per[k]
        t = sum(m.get("us", [0]))
        stalls = sorted(((mean(v), n[len(pre):-len(post)]) for n, v in m.items() if n.startswith(pre) and n.endswith(post)),
                        reverse=True)
        top = ", ".join(f"{n} {v:.1f}" for v, n in stalls[:5])
        print(f"{k}: {len(ids[k])} launches, {t:.1f} us; achieved occupancy {mean(m.get('Achieved Occupancy', [])):.1f} %, "
              f"theoretical {mean(m.get('Theoretical Occupancy', [])):.1f} %; cycles per issue "
              f"{mean(m.get('Warp Cycles Per Issued Instruction', [])):.1f}; stalls per issue: {top}")


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--why":
        return why(sys.argv[2])
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    step = sys.argv[2] if len(sys.argv) > 2 else "test/bin/emu-count/step.tsv"
    ncu = [(d["Kernel Name"], ncu_us(d, sys.argv[1])) for d in ncu_rows(sys.argv[1])
           if d["Metric Name"] == "gpu__time_duration.sum"]
    emu = []
    with open(step) as f:
        for line in f:
            if line.startswith("#"):
                continue
            c = line.rstrip("\n").split("\t")
            emu.append((c[0], c[1], float(c[24]), int(float(c[25])), int(float(c[26]))))   # tag kernel flop cin cout
    sm = difflib.SequenceMatcher(None, [base(k) for k, _ in ncu], [base(e[1]) for e in emu], autojunk=False)
    pairs = [(b.a + t, b.b + t) for b in sm.get_matching_blocks() for t in range(b.size)]
    total = sum(us for _, us in ncu)
    kind = collections.defaultdict(lambda: [0, 0.0, 0.0])      # launches, us, useful flop
    conv = collections.defaultdict(lambda: [0, 0.0, 0.0])      # convs, us, useful flop by channel class
    pending = 0.0
    for i, j in pairs:
        tag, _, flop, cin, cout = emu[j]
        us = ncu[i][1]
        k = kind[tag]
        k[0] += 1; k[1] += us; k[2] += flop
        if tag.startswith("conv"):
            pending += us
            if flop > 0:   # the launch that carries the conv's FLOP ends it (after a split's reduction)
                c = conv[(tag, cin >= 64 and cout >= 64)]
                c[0] += 1; c[1] += pending; c[2] += flop
                pending = 0.0
    print(f"one step's launches: {len(ncu)} timed by ncu, {len(emu)} in {step}, {len(pairs)} matched; "
          f"kernels' own time {total / 1e3:.3f} ms")
    print(f"  {'kind':<26}{'launches':>9}{'ms':>9}{'share':>8}{'TFLOP/s':>9}")
    for tag, (n, us, flop) in sorted(kind.items(), key=lambda x: -x[1][1]):
        tf = f"{flop / us / 1e6:9.1f}" if flop > 0 and not tag.startswith("conv") else ""
        if tag.startswith("conv"):
            cf = sum(v[2] for (t, _), v in conv.items() if t == tag)
            tf = f"{cf / us / 1e6:9.1f}" if cf > 0 else ""
        print(f"  {tag:<26}{n:9d}{us / 1e3:9.3f}{100 * us / total:7.1f}%{tf}")
    print("  convs by channels (both >= 64, or not): useful TFLOP/s, the reduction launches included")
    for (tag, wide), (n, us, flop) in sorted(conv.items()):
        print(f"  {tag:<20}{'>= 64 ch' if wide else ' < 64 ch':>9}{n:5d} convs{us / 1e3:9.3f} ms{flop / us / 1e6:8.1f} TFLOP/s")


if __name__ == "__main__":
    main()
