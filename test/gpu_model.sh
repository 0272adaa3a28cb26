#!/usr/bin/env bash
# gpu_model.sh: a MODEL of the device training step's time on named GPUs, built without a GPU (issue 14).
#   bash test/gpu_model.sh COUNTS.tsv [--gpu NAME] [--report FILE] [--tsv] [--host-us N] [--launches RE]
#   (make gpu-model)
# --tsv (with --gpu): only "kind<TAB>launches<TAB>modeled ms" lines, for test/gpu_check.sh
# --launches RE: after the table (the A100's, or --gpu's), each launch whose kind matches the awk regex RE
# ("^conv wgrad 3x3"), in step order: its kernel, blocks, each term's time and the one that sets it
# COUNTS.tsv: one launch per line from the emulator's counter mode (make emu-count: one yolov8n 640
# batch-16 step, test/gpu_count.c; GPU_COUNT="B S scale" counts another, which its "# step:" line names
# for the labels and the images/s here), each launch named after its YOLO_PROFILE row ("conv fwd 3x3 s1").
# FILE: a kernel report (test/kernel_report.py; default test/kernel_report.baseline) for the conv
# kernels' PTX instructions per HMMA on each GPU's architecture.
# Per launch, the modeled time is the largest of (a roofline with an issue limit):
#   tensor   mma FLOP / (tensor peak x min(mma ceiling, c / I)): I the main loop's instructions per
#            HMMA.16816 from the kernel report, c the cycles one HMMA.16816 takes on one SM sub-partition
#            at peak (4096 FLOP / the sub-partition's FLOP per clock); one instruction issued per clock
#            per sub-partition, latency assumed hidden
#   DRAM     compulsory bytes (each byte the launch reads, once, and each it writes, once: a read-
#            modify-write twice) / DRAM bandwidth
#   L2       bytes of the 32-byte sectors the warps request / L2 bandwidth (assumed 3x DRAM)
#   shared   shared-memory wavefronts (bank conflicts included) / (SMs x 1 wavefront per clock)
#   floor    2 microseconds (a launch's start and drain)
# Then the host: each launch costs it HOST_US microseconds to issue (3 by default, --host-us; an
# assumption, not a measurement: the CUDA runtime's launch call takes a few microseconds), and a
# launch starts on the device when it has been issued and the one before it has ended; the host waits
# for the device after the loss (its values are read back) and after the optimizer step (the gradient
# norm). The step's time with the host is printed beside the device's: where the two differ, launch
# overhead shows and a CUDA Graph would pay.
# Columns: GFLOP, the kind's useful FLOP (YOLO_PROFILE's figure: 2 x the convolution's multiply-adds);
# mma GFLOP, what the tensor cores execute (tile padding and skipped zero taps included); DRAM MB,
# compulsory bytes; L2 MB, requested sectors; sect/req, 32-byte sectors per warp request (global);
# 16B %, share of global bytes moved in 16-byte accesses; bank cnfl/r, shared-memory bank conflicts
# (extra wavefronts) per shared request; tensor peak %, useful FLOP / (modeled time x tensor peak).
# Below the table, the same share for the convs whose tiles are full and for those with >= 64 input and
# output channels (the counts' cin and cout columns, from yolo.c's emu_count_dims).
# Kernels without mma are modeled as memory-bound (their FP32 arithmetic is not counted). The FP32
# CUDA-core figures are stated for reference only. Nothing here is measured: every line says MODEL.
# bash test/gpu_model.sh --merge LOADS.tsv STORES.tsv: the counts of one step from the loads-only and the
# stores-only builds (make emu-count; EMU_COUNT_KINDS in test/cuda_emu.cpp) as one list on stdout: per
# launch (the same in both, in order) the counted columns added, the rest the first list's
set -u
if [ "${1:-}" = --merge ]; then
    [ $# = 3 ] && [ -f "$2" ] && [ -f "$3" ] || { echo "usage: bash test/gpu_model.sh --merge LOADS.tsv STORES.tsv" >&2; exit 2; }
    exec awk -F'\t' -v OFS='\t' '
        NR == FNR { if (/^#/) { print; next } n++; L[n] = $0; next }
        /^#/ { next }
        { m++; split(L[m], a, "\t")
          if (m > n || a[1] != $1 || a[2] != $2 || a[3] != $3) { printf "gpu_model.sh --merge: launch %d differs: %s / %s in %s\n", m, a[2], $2, FILENAME > "/dev/stderr"; bad = 1; exit 2 }
          for (i = 6; i <= 24; i++) a[i] += $i
          line = a[1]; for (i = 2; i <= NF; i++) line = line OFS a[i]; print line }
        END { if (!bad && m != n) { printf "gpu_model.sh --merge: %d launches against %d\n", n, m > "/dev/stderr"; exit 2 } }' "$2" "$3"
fi
cd "$(dirname "$0")/.." || exit 1
counts=${1:-}
[ -n "$counts" ] && [ -f "$counts" ] || { echo "usage: bash test/gpu_model.sh COUNTS.tsv [--gpu NAME] [--report FILE] (make gpu-model makes the counts)"; exit 2; }
shift
only=""; report=test/kernel_report.baseline; tsv=0; host_us=3; launches=""
while [ $# -gt 0 ]; do
    case $1 in
        --host-us) host_us=$2; shift 2 ;;
        --gpu) only=$2; shift 2 ;;
        --report) report=$2; shift 2 ;;
        --tsv) tsv=1; shift ;;
        --launches) launches=$2; shift 2 ;;
        *) echo "gpu_model.sh: unknown argument $1"; exit 2 ;;
    esac
done
[ -f "$report" ] || { echo "gpu_model.sh: kernel report $report not found (make kernel-report-baseline)"; exit 2; }
# name, arch, SMs, boost clock GHz, FP16 tensor TFLOP/s (dense, FP32 accumulate), FP32 TFLOP/s, DRAM GB/s,
# mma.sync ceiling (share of the tensor peak mma.sync can reach: Hopper's peak needs wgmma; assumed 0.67)
gpus='RTX3060 86 28 1.777 25.4 12.7 360 1.0
RTX4090 89 128 2.52 165.2 82.6 1008 1.0
A100 80 108 1.41 312 19.5 1555 1.0
H100 90 132 1.83 989.4 66.9 3352 0.67'
awk -v launches="$launches" -v only="$only" -v tsv="$tsv" -v host_us="$host_us" -v gpus="$gpus" -v counts="$counts" -v report="$report" -F'\t' '
function max(a, b) { return a > b ? a : b }
BEGIN {
    SNAME = "yolov8n"; SIMG = 640; SB = 16   # the step counted, unless the counts say otherwise ("# step:")
    ng = split(gpus, gl, "\n")
    for (i = 1; i <= ng; i++) {
        split(gl[i], f, " ")
        G[i] = f[1]; ARCH[i] = f[2]; SM[i] = f[3]; CLK[i] = f[4]; TC[i] = f[5]; F32[i] = f[6]; BW[i] = f[7]; CEIL[i] = f[8]
        C[i] = 4096 / (TC[i] * 1e12 / (SM[i] * CLK[i] * 1e9 * 4))
    }
}
# the kernel report: "== sm_80" sections, "loop NAME instr/mma X ..." lines
FILENAME != counts {
    if ($0 ~ /^== sm_/) { arch = substr($0, 7); next }
    if ($0 ~ /^loop /) {   # the name may hold spaces (template arguments): it ends where "instr/mma" starts
        nm = substr($0, 6); p = index(nm, " instr/mma"); split(substr(nm, p + 10), w, " ")
        nm = substr(nm, 1, p - 1); sub(/ +$/, "", nm); IPM[arch, nm] = w[1]
    }
    next
}
/^# step: / { if (split($0, sp, " ") >= 7 && sp[7] + 0 > 0) { SNAME = sp[3]; SIMG = sp[5]; SB = sp[7] + 0 } next }   # (test/gpu_count.c)
/^#/ { next }
{
    nl++
    TAG[nl] = $1; K[nl] = $2
    for (j = 3; j <= 27; j++) V[nl, j] = $j
}
END {
    if (tsv) {
        for (i = 1; i <= ng; i++) if (G[i] == only) g = i
        if (!g) { printf "gpu_model.sh: --tsv needs --gpu with one of the table names\n" > "/dev/stderr"; exit 2 }
    }
    if (!tsv) printf "MODEL  a modeled, not measured, device step from %s (%d launches) and %s\n", counts, nl, report
    if (!tsv) printf "MODEL  %-8s %4s %4s %6s %10s %9s %9s %8s %12s\n", "GPU", "arch", "SMs", "GHz", "FP16 tensor", "FP32", "DRAM", "mma.sync", "HMMA cycles"
    if (!tsv) printf "MODEL  %-8s %4s %4s %6s %10s %9s %9s %8s %12s\n", "", "", "", "", "TFLOP/s", "TFLOP/s", "GB/s", "ceiling", "per SMSP"
    for (l = 1; l <= nl; l++) for (j = 12; j <= 16; j++) {
        WB[j] += V[l, j]; WT += V[l, j]
        if (TAG[l] ~ /^conv /) { CT += V[l, j]; if (j == 16) C16 += V[l, j] }   # the conv kinds (split-K sums included)
    }
    if (!tsv && WT > 0)
        printf "counts: the step moves %.1f GB in global accesses; by width 1 B %.3f%%, 2 B %.3f%%, 4 B %.3f%%, 8 B %.3f%%, 16 B %.3f%%\n",
               WT / 1e9, 100 * WB[12] / WT, 100 * WB[13] / WT, 100 * WB[14] / WT, 100 * WB[15] / WT, 100 * WB[16] / WT
    if (!tsv && CT > 0)
        printf "counts: the convolutions (every conv kind) move %.1f GB, %.1f%% of it in 16-byte accesses\n", CT / 1e9, 100 * C16 / CT
    for (i = 1; i <= ng && !tsv; i++)
        printf "MODEL  %-8s %4s %4d %6.3f %10.1f %9.1f %9d %8.2f %12.1f\n", G[i], "sm_" ARCH[i], SM[i], CLK[i], TC[i], F32[i], BW[i], CEIL[i], C[i]
    for (i = 1; i <= ng; i++) {
        if (only != "" && G[i] != only) continue
        delete FT; delete FU; delete FN; delete NC; delete XT; delete XU; delete XN; delete XB; delete DT; delete DU; delete DN
        gt = 0; gf = 0; gb = 0; gk = ""; LN = 0; LF = 0; LN12 = 0; LF12 = 0
        delete T; delete FL; delete UF; delete NL; delete DR; delete L2B; delete SQ; delete SS; delete BY; delete B16; delete SW; delete SP; delete SR
        delete BN; delete BT
        LL = ""
        nk = 0; tot = 0; miss = ""
        for (l = 1; l <= nl; l++) {
            k = TAG[l]
            if (k == "untimed") k = "untimed: " K[l]
            if (!(k in NL)) KO[++nk] = k
            gld_req = V[l, 6]; gld_sect = V[l, 7]; gld_bytes = V[l, 8]; gst_req = V[l, 9]; gst_sect = V[l, 10]; gst_bytes = V[l, 11]
            gb16 = V[l, 16]; sld_req = V[l, 17]; sld_wave = V[l, 18]; sld_ph = V[l, 19]; sst_req = V[l, 20]; sst_wave = V[l, 21]
            sst_ph = V[l, 22]; flop = V[l, 23]; comp = V[l, 24]; UF[k] += V[l, 25]
            t_mem = comp / (BW[i] * 1e9)
            t_l2 = (gld_sect + gst_sect) * 32 / (3 * BW[i] * 1e9)
            t_sh = (sld_wave + sst_wave) / (SM[i] * CLK[i] * 1e9)
            t_tc = 0
            if (flop > 0) {
                ipm = IPM[ARCH[i], K[l]]
                # the conv launches whose loop the report gives at most 12 instructions per HMMA (the
                # goal of issue 14), by count and by mma FLOP
                if (TAG[l] ~ /^conv /) { LN++; LF += flop; if (ipm != "" && ipm + 0 <= 12) { LN12++; LF12 += flop } }
                if (ipm == "") { ipm = C[i]; if (index(miss, K[l]) == 0) miss = miss " " K[l] }
                eff = C[i] / ipm; if (eff > CEIL[i]) eff = CEIL[i]
                t_tc = flop / (TC[i] * 1e12 * eff)
            }
            t = max(max(max(t_tc, t_mem), max(t_l2, t_sh)), 2e-6)
            # the term that sets the launch its time (the first of equal ones in this order)
            b = t == t_tc ? "tensor" : t == t_mem ? "DRAM" : t == t_l2 ? "L2" : t == t_sh ? "shared" : "floor"
            if (launches != "" && TAG[l] ~ launches)
                LL = LL sprintf("MODEL    %-20s %-44s %6d %7.1f %7.1f %7.1f %7.1f %7.1f  %s\n", substr(TAG[l], 1, 20), substr(K[l], 1, 44), V[l, 3],
                                t_tc * 1e6, t_mem * 1e6, t_l2 * 1e6, t_sh * 1e6, t * 1e6, b)
            if (TAG[l] ~ /^conv /) { BN[b]++; BT[b] += t }
            # a conv: its launches (kernel, then a split-K reduction) up to the one carrying the useful FLOP
            # gb: the bound of the group, each launch at its compulsory bytes (2 us at least), the useful FLOP at
            # the tensor peak (mma.sync ceiling) where that is longer
            if (k != gk) { gt = 0; gf = 0; gb = 0; gk = k }
            gt += t; gf += flop; gb += max(t_mem, 2e-6)
            if (V[l, 25] > 0) {
                if (gf > 0 && gf <= 1.05 * V[l, 25]) { FT[k] += gt; FU[k] += V[l, 25]; FN[k]++ }
                if (V[l, 26] >= 64 && V[l, 27] >= 64) {
                    XT[k] += gt; XU[k] += V[l, 25]; XN[k]++; XB[k] += max(gb, V[l, 25] / (TC[i] * 1e12 * CEIL[i]))
                    if (k ~ /^conv .* 3x3 s[12]$/) { d = substr(k, 1, length(k) - 3); DT[d] += gt; DU[d] += V[l, 25]; DN[d]++ }
                }
                gt = 0; gf = 0; gb = 0; NC[k]++
            }
            T[k] += t; FL[k] += flop; NL[k]++; DR[k] += comp; L2B[k] += (gld_sect + gst_sect) * 32
            SQ[k] += gld_req + gst_req; SS[k] += gld_sect + gst_sect; BY[k] += gld_bytes + gst_bytes; B16[k] += gb16
            SW[k] += sld_wave + sst_wave; SP[k] += sld_ph + sst_ph; SR[k] += sld_req + sst_req
            tot += t; TL[l] = t
        }
        # the host issuing the launches in order (see the top); nshort: launches shorter on the device than
        # their issue
        hs = host_us * 1e-6; hc = 0; dc = 0; nshort = 0
        for (l = 1; l <= nl; l++) {
            hc += hs; dc = (hc > dc ? hc : dc) + TL[l]
            if (TL[l] < hs) nshort++
            if ((TAG[l] == "loss" && TAG[l + 1] != "loss") || K[l] ~ /^optim_step_kernel/) hc = dc
        }
        hline = sprintf("MODEL  %-8s with the host issuing each launch in %g us (assumed): %.2f ms, the device alone %.2f ms (%d of %d launches are shorter than that on the device)", G[i], host_us, dc * 1e3, tot * 1e3, nshort, nl)
        # the conv launches (split-K sums included) by the term that sets their modeled time
        bline = sprintf("MODEL  %-8s conv launches by the term that sets their time:", G[i])
        split("tensor DRAM L2 shared floor", BO, " ")
        for (a = 1; a <= 5; a++) bline = bline sprintf(" %s %d (%.2f ms)%s", BO[a], BN[BO[a]], BT[BO[a]] * 1e3, a < 5 ? "," : "")
        hline = hline "\n" bline
        if (tsv) { for (a = 1; a <= nk; a++) printf "%s\t%d\t%.4f\n", KO[a], NL[KO[a]], T[KO[a]] * 1e3; continue }
        if (only == "" && G[i] != "A100") { printf "MODEL  %-8s %s %s batch-%d step: %8.1f ms (%.0f images/s)\n%s\n", G[i], SNAME, SIMG, SB, tot * 1e3, SB / tot, hline; continue }
        printf "MODEL  %s, %s %s batch %d, one training step by kind of launch (YOLO_PROFILE names):\n", G[i], SNAME, SIMG, SB
        printf "MODEL  %-28s %4s %6s %6s %7s %7s %5s %4s %6s %8s %6s %6s\n", "kind", "lnch", "GFLOP", "mma", "DRAM", "L2", "sect/", "16B", "bank", "model", "share", "tensor"
        printf "MODEL  %-28s %4s %6s %6s %7s %7s %5s %4s %6s %8s %6s %6s\n", "", "", "", "GFLOP", "MB", "MB", "req", "%", "cnfl/r", "ms", "", "peak%"
        # kinds by modeled time
        for (a = 1; a <= nk; a++) for (b = a + 1; b <= nk; b++) if (T[KO[b]] > T[KO[a]]) { x = KO[a]; KO[a] = KO[b]; KO[b] = x }
        for (a = 1; a <= nk; a++) {
            k = KO[a]
            pk = UF[k] > 0 ? sprintf("%5.1f%%", 100 * UF[k] / (T[k] * TC[i] * 1e12)) : "     -"
            printf "MODEL  %-28s %4d %6.1f %6.1f %7.1f %7.1f %5.1f %4.0f %6.2f %8.3f %5.1f%% %6s\n", substr(k, 1, 28), NL[k], UF[k] / 1e9, FL[k] / 1e9, DR[k] / 1e6,
                   L2B[k] / 1e6, SQ[k] ? SS[k] / SQ[k] : 0, BY[k] ? 100 * B16[k] / BY[k] : 0, SR[k] ? (SW[k] - SP[k]) / SR[k] : 0,
                   T[k] * 1e3, 100 * T[k] / tot, pk
        }
        printf "MODEL  %-8s %s %s batch-%d step: %8.1f ms (%.0f images/s)\n%s\n", G[i], SNAME, SIMG, SB, tot * 1e3, SB / tot, hline
        printf "MODEL  the convolutions whose tiles are full (executed mma FLOP within 5%% of the useful: channel counts\n"
        printf "MODEL  that fill the 64-channel tiles, maps that fill the pixel tiles), their share of the tensor peak:\n"
        for (a = 1; a <= nk; a++) {
            k = KO[a]
            if (FN[k] > 0) printf "MODEL    %-28s %3d of %3d convs  %6.1f GFLOP  %8.3f ms  %5.1f%%\n", substr(k, 1, 28), FN[k], NC[k], FU[k] / 1e9,
                                  FT[k] * 1e3, 100 * FU[k] / (FT[k] * TC[i] * 1e12)
        }
        printf "MODEL  the convolutions with at least 64 input and 64 output channels, their share of the tensor peak;\n"
        printf "MODEL  bound: the least time this model gives them (each launch at its compulsory DRAM bytes, 2 us at\n"
        printf "MODEL  least, or at its useful FLOP at the tensor peak, whichever is longer) and the share that allows:\n"
        for (a = 1; a <= nk; a++) {
            k = KO[a]
            if (XN[k] > 0) printf "MODEL    %-28s %3d of %3d convs  %6.1f GFLOP  %8.3f ms  %5.1f%%   bound %8.3f ms  %5.1f%%\n", substr(k, 1, 28), XN[k], NC[k],
                                  XU[k] / 1e9, XT[k] * 1e3, 100 * XU[k] / (XT[k] * TC[i] * 1e12), XB[k] * 1e3, 100 * XU[k] / (XB[k] * TC[i] * 1e12)
        }
        printf "MODEL  the 3x3 ones of them, both strides, by direction:\n"
        split("conv fwd 3x3|conv dgrad 3x3|conv wgrad 3x3", DO, "|")
        for (a = 1; a <= 3; a++)
            if (DN[DO[a]] > 0) printf "MODEL    %-28s %3d convs         %6.1f GFLOP  %8.3f ms  %5.1f%%\n", DO[a], DN[DO[a]], DU[DO[a]] / 1e9, DT[DO[a]] * 1e3,
                                         100 * DU[DO[a]] / (DT[DO[a]] * TC[i] * 1e12)
        if (LN > 0) printf "counts: %d of the %d conv launches of the step with mma, %.1f%% of their mma FLOP, run loops of at most 12 PTX\ncounts: instructions per HMMA (%s, the kernel report)\n", LN12, LN, 100 * LF12 / LF, "sm_" ARCH[i]
        if (miss != "") printf "MODEL  (no kernel-report loop figures for:%s; their mma issue taken as ideal)\n", miss
        if (LL != "") {
            printf "MODEL  the launches of kinds matching /%s/, in step order (times in us; the largest is the modeled one):\n", launches
            printf "MODEL    %-20s %-44s %6s %7s %7s %7s %7s %7s  %s\n", "kind", "kernel", "blocks", "tensor", "DRAM", "L2", "shared", "model", "set by"
            printf "%s", LL
        }
    }
}' "$report" "$counts"
