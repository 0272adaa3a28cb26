#!/usr/bin/env python3
# kernel_report.py: what the compiler made of yolo_kernels.cu, without a GPU (issue 14).
#   python3 test/kernel_report.py [--out FILE] [--check BASELINE] [--arch "80 86 89 90"]
# (make kernel-report, make kernel-report-baseline; .ci/run runs the check where nvcc is installed).
# For every architecture it compiles yolo_kernels.cu once with nvcc (-O3, -Xptxas -v, --keep) and reads:
#   - ptxas's resource usage per kernel: registers, spill stores/loads, stack frame (local memory),
#     shared memory (static, and the dynamic a launch asks for: dynamic_smem); threads per block from
#     __launch_bounds__ (.maxntid in the PTX) or, when a kernel has none, from its launch in the source
#     (a literal or a named constant);
#   - theoretical occupancy, computed here from the per-architecture limits in LIMITS below;
#   - for each convolution kernel (conv_*), the main loop's instruction mix, read from the PTX: the
#     main loop is the innermost loop (a label and a backward branch to it) whose body holds an mma
#     (or, where a `// K step` mark lies in a loop holding an mma, the innermost such: a K step that
#     loops over its tiles); loops nested inside it (operand staging, such tiles) are weighted by
#     their trip count, read from the loop's own `add r, r, STRIDE` / `setp.lt r, BOUND` pair (where
#     the back edge also needs a break's test, and.pred, the constant bound's count; a loop whose
#     count is not a constant counts once and is marked '?'). Figures per K step: a trip of the main
#     loop is one K step, or as many as the `// K step` marks on its path (conv_k_loop marks each step
#     by an empty inline asm, and takes two a trip in some variants); the figures of a trip are
#     divided by that number:
#       instr/mma  PTX instructions per mma, counted in HMMA.16816 (m16n8k16) units: a wmma
#                  m16n16k16 counts as two, as the hardware issues it
#       gld_bytes  global bytes loaded, on the path through the step that loads the most
#       16B%       their share in 16-byte accesses (ld.global.v4 / cp.async 16)
#       sts/mma    shared-memory stores per mma
#       bar/K      barrier instructions (bar.sync, bar.arrive) a warp executes per K step
#     The FP32 convs (conv_*_f32_kernel, amp=0) have no mma: their unit is one FFMA (fma.rn.f32; the
#     products' and the few in the staging, BN+SiLU's), the columns instr/fma, fma, sts/fma.
#   SASS (the machine code) is read instead when cuobjdump or nvdisasm is installed; nvcc 13 here
#   ships neither, so the figures are the PTX's, and the report says so.
# With --check BASELINE it fails (exit 1) on any spill, and on any kernel whose figures are worse than
# the baseline's: lower occupancy, a larger stack frame, instr/mma up by more than MARGIN, the 16-byte
# share down by more than 2 points, more shared stores per mma or more barriers per K step.
import os, re, shutil, subprocess, sys, tempfile

MARGIN = 0.05   # instr/mma and sts/mma may grow by 5 % before the check calls it a regression

# per streaming multiprocessor (CUDA C++ Programming Guide, "Compute capabilities" table):
# registers, max warps, max resident blocks, shared memory usable by blocks (bytes), shared memory
# the system reserves per block (bytes), register allocation unit (registers per warp)
LIMITS = {
    "80": dict(regs=65536, warps=64, blocks=32, smem=164 * 1024, smem_rsv=1024, reg_unit=256),  # A100
    "86": dict(regs=65536, warps=48, blocks=16, smem=100 * 1024, smem_rsv=1024, reg_unit=256),  # RTX 30xx
    "89": dict(regs=65536, warps=48, blocks=24, smem=100 * 1024, smem_rsv=1024, reg_unit=256),  # RTX 40xx
    "90": dict(regs=65536, warps=64, blocks=32, smem=228 * 1024, smem_rsv=1024, reg_unit=256),  # H100
}


def occupancy(arch, regs, smem, threads):
    """theoretical occupancy (active warps / max warps) and resident blocks per SM"""
    L = LIMITS[arch]
    wpb = (threads + 31) // 32
    regs_warp = (max(regs, 1) * 32 + L["reg_unit"] - 1) // L["reg_unit"] * L["reg_unit"]
    by_regs = (L["regs"] // regs_warp) // wpb
    by_warps = L["warps"] // wpb
    by_smem = L["smem"] // (smem + L["smem_rsv"]) if smem else L["blocks"]
    blocks = min(by_regs, by_warps, by_smem, L["blocks"])
    return blocks * wpb / L["warps"], blocks


def demangle(names):
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True).stdout.split("\n")
    res = {}
    for m, d in zip(names, out):
        d = re.sub(r"^void ", "", d.split("(")[0]).strip()
        res[m] = d
    return res


def launch_threads(src):
    """kernel base name -> threads per block of its launches in the source, where it is a constant"""
    consts = {}
    for m in re.finditer(r"#define\s+(\w+)\s+\(?(\d+)\)?\s", src):
        consts[m.group(1)] = int(m.group(2))
    for m in re.finditer(r"\b(\w+)\s*=\s*(\d+)\s*[,}]", src):   # enum { X = 256 }
        consts.setdefault(m.group(1), int(m.group(2)))
    for m in re.finditer(r"(?:constexpr|const)\s+(?:int|unsigned)\s+(\w+)\s*=\s*(\d+)\s*;", src):
        consts[m.group(1)] = int(m.group(2))
    res = {}
    for m in re.finditer(r"\b(\w+)\s*(?:<[^<>;]*>)?\s*<<<([^>]*)>>>", src):
        args, depth, cur = [], 0, ""
        for ch in m.group(2):   # split at top-level commas: dim3(cdiv(n, 256), B), 256, 0, s
            depth += (ch == "(") - (ch == ")")
            if ch == "," and depth == 0:
                args.append(cur.strip())
                cur = ""
            else:
                cur += ch
        args.append(cur.strip())
        if len(args) < 2:
            continue
        b = args[1]
        n = int(b) if b.isdigit() else consts.get(b)
        if n is None:   # dim3 block(X, Y) declared before the launch (perhaps after another: grid(...), block(X))
            d = re.findall(r"\b" + re.escape(b) + r"\s*\(([\w\s,]*)\)\s*;", src[: m.start()])
            if d:
                parts = [p.strip() for p in d[-1].split(",")]
                vals = [int(p) if p.isdigit() else consts.get(p) for p in parts]
                if all(v is not None for v in vals):
                    n = 1
                    for v in vals:
                        n *= v
        if n is not None:
            res.setdefault(m.group(1), n)
    return res


def parse_ptxas(text, arch):
    res, cur = {}, None
    for line in text.splitlines():
        m = re.search(r"Compiling entry function '(\w+)' for 'sm_(\d+)'", line)
        if m:
            cur = m.group(1) if m.group(2) == arch else None
            if cur:
                res[cur] = dict(regs=0, spill_st=0, spill_ld=0, stack=0, smem=0)
            continue
        if not cur:
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m:
            res[cur].update(stack=int(m.group(1)), spill_st=int(m.group(2)), spill_ld=int(m.group(3)))
        m = re.search(r"Used (\d+) registers", line)
        if m:
            res[cur]["regs"] = int(m.group(1))
            s = re.search(r"(\d+) bytes smem", line)
            res[cur]["smem"] = int(s.group(1)) if s else 0
    return res


INSTR = re.compile(r"^\s*(@!?%\w+\s+)?([a-z][\w.]*)")


def dynamic_smem(name):
    """the dynamic shared memory a kernel is launched with (ptxas reports only the static), in bytes:
    conv_fwd_kernel's BN table with BN+SiLU on 16-byte rows (yolo_kernels.cu ig_fold: taken at 256 input
    channels, 2 KB; it grows 8 bytes a channel; with PARTS over all of its input, a concatenation: taken at
    384 channels, 3 KB, yolov8n's widest, the neck's first C2f);
    conv_halo_kernel<ACT, DGRAD, S2, TC, VW>'s two stages (yolo_kernels.cu H3Shape: A's 9 taps of 64 x 16
    values (DGRAD: 16 rows padded to 72), and the halo of 48-byte positions (32 for the stride-2
    forward's TC 32) rounded up to 128 bytes, TR + 2 by TC + 2, or 2 TR + 1 by 2 TC + 1 for the
    stride-2 forward's window, TR = 128 / TC (S2: 64 / TC))"""
    if re.match(r"conv_fwd_kernel<true, true, (true|false), true>$", name):
        return 384 * 8   # PARTS: the table over the concatenation's channels, 384 at yolov8n's widest
    if re.match(r"conv_fwd_kernel<true, true, (true|false), (true|false)>$", name):
        return 256 * 8   # the 1x1 BN+SiLU forward's table (ig_fold), 8 bytes a channel: 256, yolov8n's widest
    m = re.match(r"conv_halo_kernel<(true|false), (true|false), (true|false), (\d+), (\d+)>$", name)
    if not m:
        return 0
    dgrad, s2, tc = m.group(2) == "true", m.group(3) == "true", int(m.group(4))
    fs2 = s2 and not dgrad
    tr = (64 if s2 else 128) // tc
    hr, hc = (2 * tr + 1, 2 * tc + 1) if fs2 else (tr + 2, tc + 2)
    a = 9 * 16 * 72 if dgrad else 9 * 64 * 16
    return 2 * (a + (hr * hc * (16 if fs2 and tc == 32 else 24) + 63) // 64 * 64) * 2


def ptx_entries(ptx):
    """entry name -> (maxntid or None, body lines)"""
    res = {}
    for m in re.finditer(r"\.entry (\w+)\(", ptx):
        start = m.end()
        nxt = ptx.find(".entry ", start)
        body = ptx[start: nxt if nxt > 0 else len(ptx)]
        t = re.search(r"\.maxntid (\d+), (\d+), (\d+)", body[:4000])
        threads = int(t.group(1)) * int(t.group(2)) * int(t.group(3)) if t else None
        res[m.group(1)] = (threads, body.split("\n"))
    return res


def instrs(line):
    """the PTX instructions on a line: inline asm (cuda_fp16's conversions, for one) wraps them in braces,
    '{  cvt.rn.f16.f32 %rs1, %f1;}' or a '{.reg ..;' line, then instruction lines, the last ending in '}'"""
    s = line.strip()
    if s.startswith("//"):
        return 0
    n = 0
    for part in s.split(";")[:-1]:   # statements end in ';' (what follows the last is '}' or nothing)
        p = part.strip().lstrip("{").strip()
        if p and not p.startswith(".") and INSTR.match(p) is not None:
            n += 1
    return n


def loops(lines):
    """(label line, back-edge line) of every backward branch"""
    labels = {}
    res = []
    for i, l in enumerate(lines):
        m = re.match(r"^(\$\w+):", l.strip())
        if m:
            labels[m.group(1)] = i
        m = re.search(r"\bbra(?:\.uni)?\s+(\$\w+);", l)
        if m and m.group(1) in labels and labels[m.group(1)] < i:
            res.append((labels[m.group(1)], i))
    return res


def trip_count(lines, lo, hi):
    """iterations of the loop [lo, hi] from its induction pattern, or None"""
    br = re.search(r"@(%p\d+)\s+bra", lines[hi])
    if not br:
        return None
    ps = [br.group(1)]
    for j in range(hi - 1, max(lo, hi - 12) - 1, -1):
        # a back edge taken while two tests hold (and.pred: a constant bound and a break's test): the
        # constant one bounds the trips, and the longest path takes them all
        a = re.search(r"and\.pred\s+" + re.escape(ps[0]) + r",\s*(%p\d+),\s*(%p\d+);", lines[j])
        if a:
            ps = [a.group(1), a.group(2)]
            continue
        m = None
        for p in ps:
            m = m or re.search(r"setp\.(lt|le|ne)\.[su]32\s+" + re.escape(p) + r",\s*(%r\d+),\s*(-?\d+);", lines[j])
        if not m:
            continue
        op, reg, bound = m.group(1), m.group(2), int(m.group(3))
        for k in range(hi - 1, lo, -1):   # the increment nearest the back edge
            a = re.search(r"add\.s32\s+(%r\d+),\s*(%r\d+),\s*(\d+);", lines[k])
            if not a or int(a.group(3)) <= 0 or reg not in (a.group(1), a.group(2)):
                continue
            stride = int(a.group(3))
            # the test reads the value before the increment (an increment in place: where it comes after)
            if a.group(2) == reg and (a.group(1) != reg or k > j):
                return bound // stride + 1 + (op == "le" and bound % stride == 0)
            if a.group(1) == reg:
                return max(1, (bound + stride - 1) // stride)
        return None
    return None


def line_figures(l, w, fma=False):
    f = dict(instr=0.0, mma=0.0, sts=0.0, bar=0.0, gbytes=0.0, g16=0.0, ks=0.0)
    if re.match(r"^\s*// K step\s*$", l):   # (a K step's mark: an inline asm holding only this comment)
        f["ks"] = w
        return f
    n = instrs(l)
    if not n:
        return f
    f["instr"] = w * n
    m = re.search(r"\b(?:wmma\.mma|mma)\.sync\S*?\.m(\d+)n(\d+)k(\d+)", l)
    if m:   # in units of HMMA.16816 (m16n8k16): a wmma m16n16k16 is two
        f["mma"] = w * int(m.group(1)) * int(m.group(2)) * int(m.group(3)) / (16 * 8 * 16)
    if fma and re.search(r"\bfma\.rn\.f32\b", l):   # (the FP32 kernels' unit: one FFMA)
        f["mma"] = w
    if re.search(r"\bst\.shared\.", l) or re.search(r"\bwmma\.store\.[^ ]*\.shared", l):
        f["sts"] = w
    if re.search(r"\bbar(\.sync|\.cta\.sync|\.arrive|\.cta\.arrive)?\b|barrier\.(sync|arrive)", l):
        f["bar"] = w
    m = re.search(r"\bld\.global(?:\.nc)?(?:\.L\w+::\w+)*\.(v[248]\.)?([a-z]+)(\d+)", l)
    if m:
        n = int(m.group(1)[1]) if m.group(1) else 1
        b = n * int(m.group(3)) // 8
        f["gbytes"] = w * b
        f["g16"] = w * b * (b == 16)
    m = re.search(r"\bcp\.async\.\w+\.shared\.global\S*\s+\[[^]]+\],\s*\[[^]]+\],\s*(\d+)", l)
    if m:
        b = int(m.group(1))
        f["gbytes"] = w * b
        f["g16"] = w * b * (b == 16)
    return f


def loop_mix(lines, fma=False, worst=False):
    """instruction mix of one K step of the main loop, or None when no loop holds an mma (fma: an FP32
    kernel's, whose unit is fma.rn.f32, its products' FFMA and the few of its staging alike). The K step
    is the longest path (in weighted instructions) from the loop's label to its back edge: of two
    alternatives (a specialised and a general staging path, an edge check) the costlier one counts
    (for the global bytes and their 16-byte share, the one that loads more). The main loop is the
    smallest loop holding an mma and a K step mark where one does (a K step that runs a loop of its own
    over its tiles: conv_halo_wgrad_kernel's at stride 1, two trips of 4 B tiles, weighted by that
    count), else the smallest loop holding an mma; worst (a kernel that runs its K loop once a part of
    its input, a loop for each kind of part: conv_fwd_kernel with PARTS), the innermost one of most
    instructions per mma.
    A warp-specialised kernel stages its operands in a loop of other warps, which hand each K step
    over by bar.arrive: that loop (the smallest one outside the main loop holding a bar.arrive and no
    mma) is one more trip per K step, and its figures are added to the main loop's (barriers: the
    larger of the two, as each warp executes only its own loop's)."""
    ls = loops(lines)
    is_mma = lambda l: re.search(r"\b(wmma\.mma|mma)\.sync" + (r"|\bfma\.rn\.f32\b" if fma else ""), l) is not None
    mloops = [(lo, hi) for lo, hi in ls if any(is_mma(lines[i]) for i in range(lo, hi + 1))]
    if not mloops:
        return None
    if worst:
        inner = [(lo, hi) for lo, hi in mloops if not any((a, b) != (lo, hi) and lo <= a and b <= hi for a, b in mloops)]
    else:
        kstep = lambda lo, hi: any(re.match(r"^\s*// K step\s*$", lines[i]) for i in range(lo, hi + 1))
        marked = [(lo, hi) for lo, hi in mloops if kstep(lo, hi)]
        inner = [min(marked or mloops, key=lambda x: x[1] - x[0])]
    main, f = None, None
    for lo, hi in inner:
        g = loop_figs(lines, ls, lo, hi, fma)
        if f is None or (g["mma"] and g["instr"] / g["mma"] > f["instr"] / max(f["mma"], 1e-9)):
            main, f = (lo, hi), g
    prod = None
    for lo, hi in ls:
        if (hi < main[0] or lo > main[1]) and not any(is_mma(lines[i]) for i in range(lo, hi + 1)) and \
                any(re.search(r"\bbar(\.cta)?\.arrive\b", lines[i]) for i in range(lo, hi + 1)):
            if prod is None or hi - lo < prod[1] - prod[0]:
                prod = (lo, hi)
    if prod:
        g = loop_figs(lines, ls, *prod, fma)
        f = {k: max(f[k], g[k]) if k == "bar" else f[k] + g[k] for k in f}
    return f


def loop_figs(lines, ls, lo, hi, fma=False):
    """loop_mix's figures of one trip of the loop [lo, hi]"""
    weight = [1.0] * len(lines)
    unknown = 0
    for a, b in ls:
        if lo < a and b < hi:
            t = trip_count(lines, a, b)
            if t is None:
                unknown += 1
                t = 1
            for i in range(a, b + 1):
                weight[i] *= t
    # basic blocks of [lo, hi]: a label starts one, a branch ends one
    labels = {}
    starts = [lo]
    for i in range(lo, hi + 1):
        m = re.match(r"^(\$\w+):", lines[i].strip())
        if m:
            labels[m.group(1)] = i
            if i != lo:
                starts.append(i)
        elif re.search(r"\bbra(\.uni)?\s", lines[i]) and i + 1 <= hi:
            starts.append(i + 1)
    starts = sorted(set(starts))
    ends = [s - 1 for s in starts[1:]] + [hi]
    block_of = {s: k for k, s in enumerate(starts)}
    keys = ("instr", "mma", "sts", "bar", "gbytes", "g16", "ks")
    fig = []
    for s, e in zip(starts, ends):
        acc = dict.fromkeys(keys, 0.0)
        for i in range(s, e + 1):
            for k, v in line_figures(lines[i], weight[i], fma).items():
                acc[k] += v
        fig.append(acc)
    # longest path over forward edges (backward ones are the inner loops' own, already weighted), by
    # instructions; the global bytes (and their 16-byte part) are those of the path that loads the most,
    # so that a load in a branch whose other side holds more instructions (a zero fill where the value
    # lies past the image) still counts
    n = len(starts)

    def longest(by):
        best = [None] * n
        best[0] = dict(fig[0])
        for k in range(n):
            if best[k] is None:
                continue
            e = ends[k]
            last = lines[e]
            succ = []
            m = re.search(r"\bbra(?:\.uni)?\s+(\$\w+);", last)
            if m and m.group(1) in labels and labels[m.group(1)] > e:
                succ.append(block_of.get(labels[m.group(1)]))
            uncond = m and not re.match(r"^\s*@", last)
            if not uncond and k + 1 < n:
                succ.append(k + 1)
            for t in succ:
                if t is None:
                    continue
                cand = {x: best[k][x] + fig[t][x] for x in keys}
                # (of two paths loading as many bytes, the one with fewer in 16-byte accesses)
                if best[t] is None or cand[by] > best[t][by] or \
                        (by == "gbytes" and cand[by] == best[t][by] and cand["g16"] < best[t]["g16"]):
                    best[t] = cand
        return best[n - 1] or dict.fromkeys(keys, 0.0)
    f = longest("instr")
    g = longest("gbytes")
    ks = max(1.0, f["ks"])   # K steps a trip (the marks on each path; none: one)
    f = {k: f[k] / ks for k in ("instr", "mma", "sts", "bar")}
    kg = max(1.0, g["ks"])
    return dict(f, gbytes=g["gbytes"] / kg, g16=g["g16"] / kg, unknown=unknown)


def report_arch(arch, src, nvcc, tmp):
    d = os.path.join(tmp, arch)
    os.makedirs(d)
    r = subprocess.run([nvcc, "-std=c++17", "-O3", f"-gencode=arch=compute_{arch},code=sm_{arch}", "-Xptxas", "-v",
                        "--keep", "--keep-dir", d, "-c", "yolo_kernels.cu", "-o", os.path.join(d, "k.o")],
                       capture_output=True, text=True)
    if r.returncode:
        sys.stderr.write(r.stderr)
        sys.exit(f"kernel_report: nvcc failed for sm_{arch}")
    res = parse_ptxas(r.stdout + r.stderr, arch)
    ptx = open(os.path.join(d, "yolo_kernels.ptx")).read()
    ents = ptx_entries(ptx)
    names = demangle(sorted(res))
    lt = launch_threads(src)
    rows = []
    for mangled, v in res.items():
        name = names[mangled]
        threads, lines = ents.get(mangled, (None, []))
        src_threads = threads is None
        if threads is None:
            threads = lt.get(name.split("<")[0])
        v = dict(v, smem=v["smem"] + dynamic_smem(name))
        occ, blocks = occupancy(arch, v["regs"], v["smem"], threads) if threads else (None, None)
        f32 = "_f32_kernel" in name   # the FP32 (amp=0) convs: SIMT, per FFMA
        parts = re.match(r"conv_fwd_kernel<\w+, \w+, \w+, true>$", name) is not None   # (its loop per part)
        mix = loop_mix(lines, f32, parts) if name.startswith("conv_") else None
        rows.append(dict(v, name=name, threads=threads, launch=src_threads, occ=occ, blocks=blocks, mix=mix,
                         unit="fma" if f32 else "mma"))
    rows.sort(key=lambda x: x["name"])
    return rows


def fmt(arch_rows, tool_note):
    out = ["# kernel report of yolo_kernels.cu (make kernel-report; test/kernel_report.py). One line per kernel",
           "# and architecture: registers, spill bytes (stores/loads), stack frame bytes (local memory), static",
           "# shared memory bytes, threads per block (L: from the launch in the source; else __launch_bounds__),",
           "# resident blocks per SM and theoretical occupancy. 'loop' lines: one K step of a conv kernel's main",
           "# loop (a trip's figures divided by the '// K step' marks on it, if any): PTX instructions per mma",
           "# (HMMA.16816 units), global bytes loaded and their 16-byte share, shared stores per mma, barriers",
           "# per K step ('?': an inner loop of unknown trip count, counted once). The FP32 convs (amp=0, SIMT)",
           "# per FFMA instead (instr/fma, sts/fma: fma.rn.f32, their products' and the few of their staging).",
           f"# {tool_note}"]
    for arch, rows in arch_rows:
        out.append(f"== sm_{arch}")
        out.append(f"{'kernel':<44} {'regs':>4} {'spill':>9} {'stack':>5} {'smem':>6} {'thr':>5} {'blk':>3} {'occ':>5}")
        for x in rows:
            thr = f"{x['threads']}{'L' if x['launch'] else ''}" if x["threads"] else "?"
            occ = f"{100 * x['occ']:.0f}%" if x["occ"] is not None else "?"
            out.append(f"{x['name']:<44} {x['regs']:>4} {x['spill_st']:>4}/{x['spill_ld']:<4} {x['stack']:>5} {x['smem']:>6} "
                       f"{thr:>5} {x['blocks'] if x['blocks'] is not None else '?':>3} {occ:>5}")
        for x in rows:
            f = x["mix"]
            if not f or not f["mma"]:
                continue
            share = 100 * f["g16"] / f["gbytes"] if f["gbytes"] else 0.0
            u = x["unit"]
            out.append(f"loop {x['name']:<39} instr/{u} {f['instr'] / f['mma']:7.1f}  {u} {f['mma']:4.0f}  gld_bytes {f['gbytes']:6.0f}"
                       f"  16B% {share:5.1f}  sts/{u} {f['sts'] / f['mma']:6.2f}  bar/K {f['bar']:3.0f}{'  ?' if f['unknown'] else ''}")
    return "\n".join(out) + "\n"


def parse_report(text):
    """(arch, kernel) -> figures, from a report's text"""
    res, arch = {}, None
    for line in text.splitlines():
        if line.startswith("== sm_"):
            arch = line[6:].strip()
            continue
        if not arch or line.startswith("#") or line.startswith("kernel "):
            continue
        # a kernel's name may hold spaces (template arguments: "conv_halo_kernel<false, true, 16, 8>"):
        # it is what precedes the fixed columns
        if line.startswith("loop "):
            m = re.match(r"loop (.+?)\s+instr/[mf]ma\s+([\d.]+)\s+[mf]ma\s+\d+\s+gld_bytes\s+\d+\s+16B%\s+([\d.]+)\s+sts/[mf]ma\s+([\d.]+)\s+bar/K\s+(\d+)", line)
            if m:
                res.setdefault((arch, m.group(1)), {}).update(ipm=float(m.group(2)), g16=float(m.group(3)),
                                                              spm=float(m.group(4)), bar=int(m.group(5)))
            continue
        m = re.match(r"(.+?)\s+(\d+)\s+(\d+)/(\d+)\s+(\d+)\s+\d+\s+\S+\s+\S+\s+(\S+)$", line)
        if m:
            occ = None if m.group(6) == "?" else float(m.group(6).rstrip("%"))
            res.setdefault((arch, m.group(1)), {}).update(regs=int(m.group(2)), spill=int(m.group(3)) + int(m.group(4)),
                                                          stack=int(m.group(5)), occ=occ)
    return res


def check(cur_text, base_text):
    cur, base = parse_report(cur_text), parse_report(base_text)
    bad = []
    for k, v in sorted(cur.items()):
        arch, name = k
        if v.get("spill", 0):
            bad.append(f"sm_{arch} {name}: {v['spill']} bytes of register spills (must be 0)")
        b = base.get(k)
        if not b:
            continue
        if v.get("occ") is not None and b.get("occ") is not None and v["occ"] < b["occ"]:
            bad.append(f"sm_{arch} {name}: occupancy {v['occ']:.0f}% < baseline {b['occ']:.0f}% (registers {v['regs']}, were {b['regs']})")
        if v.get("stack", 0) > b.get("stack", 0):
            bad.append(f"sm_{arch} {name}: stack frame {v['stack']} bytes > baseline {b['stack']} (local memory)")
        if "ipm" in v and "ipm" in b:
            if v["ipm"] > b["ipm"] * (1 + MARGIN):
                bad.append(f"sm_{arch} {name}: {v['ipm']:.1f} instructions per {'fma' if '_f32_kernel' in name else 'mma'} > baseline {b['ipm']:.1f} + {MARGIN:.0%}")
            if v["g16"] < b["g16"] - 2:
                bad.append(f"sm_{arch} {name}: 16-byte share of loop loads {v['g16']:.1f}% < baseline {b['g16']:.1f}% - 2 points")
            if v["spm"] > b["spm"] * (1 + MARGIN) + 1e-9:
                bad.append(f"sm_{arch} {name}: {v['spm']:.2f} shared stores per {'fma' if '_f32_kernel' in name else 'mma'} > baseline {b['spm']:.2f} + {MARGIN:.0%}")
            if v["bar"] > b["bar"]:
                bad.append(f"sm_{arch} {name}: {v['bar']} barriers per K step > baseline {b['bar']}")
    gone = sorted(set(base) - set(cur))
    return bad, gone


def main():
    args = sys.argv[1:]
    out = chk = None
    archs = ["80", "86", "89", "90"]
    while args:
        a = args.pop(0)
        if a == "--out":
            out = args.pop(0)
        elif a == "--check":
            chk = args.pop(0)
        elif a == "--arch":
            archs = args.pop(0).split()
        else:
            sys.exit(f"kernel_report.py: unknown argument {a} (--out FILE, --check BASELINE, --arch \"80 86\")")
    for a in archs:
        if a not in LIMITS:
            sys.exit(f"kernel_report.py: no occupancy limits for sm_{a} (known: {' '.join(LIMITS)})")
    cuda = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    nvcc = os.environ.get("NVCC") or shutil.which("nvcc") or os.path.join(cuda, "bin", "nvcc")
    if not os.path.exists(nvcc) and not shutil.which(nvcc):
        sys.exit("kernel_report.py needs nvcc (not found in PATH or " + cuda + "/bin)")
    bindir = os.path.join(cuda, "bin")        # PATH's nvcc may be a wrapper script outside the toolkit
    if not os.path.isdir(bindir):
        bindir = os.path.dirname(os.path.realpath(shutil.which(nvcc) or nvcc))
    sass = [t for t in ("cuobjdump", "nvdisasm") if os.path.exists(os.path.join(bindir, t)) or shutil.which(t)]
    ver = re.search(r"release ([\d.]+)", subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout)
    note = (f"nvcc {ver.group(1) if ver else '?'}; figures from PTX and ptxas -v"
            + ("" if not sass else f" ({', '.join(sass)} found: SASS reading is not implemented, the PTX figures stand)"))
    if not sass:
        note += f" (no cuobjdump/nvdisasm in {bindir}: SASS not read)"
    src = open("yolo.h").read() + open("yolo_kernels.cu").read()   # constants such as OPT_NORM_BLOCKS live in yolo.h
    with tempfile.TemporaryDirectory() as tmp:
        text = fmt([(a, report_arch(a, src, nvcc, tmp)) for a in archs], note)
    if out:
        with open(out, "w") as f:
            f.write(text)
    sys.stdout.write(text)
    if chk:
        bad, gone = check(text, open(chk).read())
        for g in gone:
            print(f"note: sm_{g[0]} {g[1]} is in the baseline but not compiled now (renamed or removed)")
        for b in bad:
            print("WORSE: " + b)
        print(f"kernel-report check against {chk}: {len(bad)} regressions (spills must be 0; occupancy, stack, "
              f"instr/mma +{MARGIN:.0%}, 16-byte share -2 points, sts/mma, barriers per K step)")
        sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
