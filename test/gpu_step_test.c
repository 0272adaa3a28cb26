// gpu_step_test.c: the device training step (the GPU section of yolo.c) against the CPU step of yolo.c on the same
// weights, input and targets: YOLOv8n, nc 3, batch 2, 64x64 (and one step at 96x160: test_rect_step). Built
// by test/emu.mk against the CPU emulation of yolo_kernels.cu (run by test/run_emu.sh) and, with make
// test-gpu, against the real cudart. Not named test_*.c: the main Makefile would build it without kernels.
// Both sides use the same FP16-rounded conv weights and input. Tolerances, from measurements:
// loss components 2e-3 relative (the issue's); head maps 6e-2 of max(1, |ref|); whole gradient 6e-2
// relative L2; each gradient tensor max |diff| <= 5e-2 * (its L2 norm + 1e-6 * the whole gradient's
// norm: the floor covers the ~1e-12 gradients of level-2 box convs with no foreground, flushed in FP16).
// The issue asks 5e-3 per tensor; that is below what this configuration allows any implementation:
// the test measures the FP32 CPU step's own sensitivity (the same step with 1% of the input pixels
// moved by one FP16 ulp) and it is ~3e-2 per tensor, as large as the GPU's difference. At 64x64 the
// deepest maps are 2x2, BN normalises over 8 values and every rounding difference grows layer by
// layer (with FP16 storage emulated on the CPU, model.0's z is bit-identical to the GPU's, model.1's
// differs by one ulp in a few values, and by the 2x2 layers almost every value differs). So the GPU must also stay
// within 2x the measured sensitivity, and within 2x of what FP16 storage itself costs: the CPU step's FP16 twin
// (twin_backend: the CPU rounds every tensor where the device stores FP16, at the same loss scale) is ~3.5e-2 per
// tensor and ~7e-3 in the loss components from the FP32 step, and the device is as far from that twin as from FP32. A
// wrong index or a missing term would be far outside these bounds.
#ifndef TESTING
#define TESTING
#endif
#define YOLO_CUDA
#include "../yolo.c"

#include "../yolo.h"
#include "test.h"
#include "yolo_test.h"

// gpu_forward_backward: gpu_train_step at the shape planned first, gradients zeroed first (tests)
static LossOut gpu_forward_backward(Gpu *g, const uint8_t *img, const LossTargets *tg, const LossConfig *lcfg) {
    GpuShape s = {g->B, g->H, g->W, 1};
    gpu_zero_grad(g);
    return gpu_train_step(g, &s, img, tg, lcfg);
}

enum { TB = 2, TS = 64, TNC = 3 };

// The CPU step's FP16 twin: the CPU backend with every tensor the device stores in FP16 rounded
// the same way (activations it materialises, residual sums, pre-BN outputs; at the loss scale
// twin_scale the gradients: dz, each BN conv's dA when its backward reads it, and the views'
// gradients as they are added or carried through a pool or upsample). The Detect maps stay FP32, as on
// the device. Installed as model_cpu_backend. (The device also rounds each partial sum of a dA that
// several readers add into; the twin rounds the whole once.)
static float twin_scale;
static Backend twin_backend;

// half_store: x (n) rounded as the device stores it in FP16: x*s to the nearest FP16 and back, /s
// (s a power of two: the loss scale for gradients, 1 for activations)
static void half_store(float *x, size_t n, float s) {
    for (size_t i = 0; i < n; i++) x[i] = half_to_float(float_to_half(x[i] * s)) / s;
}
// (acc, a residual sum: the device rounds the activation to FP16, then the sum, as twin_add does)
static void twin_act(Exec *e, const Conv *c, int c0, int C, int b, void *out, long os, int acc) {
    size_t n = (size_t)C * c->Ho * c->Wo;
    float *t = acc ? xmalloc(n * sizeof(float)) : out;
    cpu_backend.act(e, c, c0, C, b, t, os, 0);
    if (c->bn) half_store(t, n, 1.f);
    if (!acc) return;
    cpu_backend.add(e, t, (long)n, out, os, (long)n);
    half_store(out, n, 1.f);
    free(t);
}
static void twin_add(Exec *e, const void *t, long ts, void *out, long os, long n) {
    cpu_backend.add(e, t, ts, out, os, n);
    half_store(out, (size_t)n, 1.f);
}
static void twin_conv(Exec *e, Conv *c) {
    cpu_backend.conv(e, c);
    for (int b = 0; b < e->m->B && c->bn && !arena_dry(e->a); b++)
        half_store(c->z + (size_t)b * c->zstride, (size_t)c->cout * c->Ho * c->Wo, 1.f);
}
static void twin_grad_add(Exec *e, const float *g, long gs, float *d, long ds, long n) {
    cpu_backend.grad_add(e, g, gs, d, ds, n);
    half_store(d, (size_t)n, twin_scale);
}
static void twin_upsample_back(Exec *e, const float *g, long gs, float *gx, int C, int H, int W) {
    cpu_backend.upsample_back(e, g, gs, gx, C, H, W);
    half_store(gx, (size_t)C * H * W, twin_scale);
}
static void twin_maxpool_back(Exec *e, const void *x, long xs, const float *g, long gs, float *gx, int C, int H,
                              int W) {
    cpu_backend.maxpool_back(e, x, xs, g, gs, gx, C, H, W);
    if (!arena_dry(e->a)) half_store(gx, (size_t)C * H * W, twin_scale);
}
static void *twin_bn_backward(Exec *e, Conv *c) {
    for (int b = 0; b < e->m->B && c->level < 0 && !arena_dry(e->a); b++)   // dA as the device reads it
        half_store(c->dA + (size_t)b * c->zstride, (size_t)c->cout * c->Ho * c->Wo, twin_scale);
    float *dz = cpu_backend.bn_backward(e, c);
    for (int b = 0; b < e->m->B && !arena_dry(e->a); b++)
        half_store(dz + (size_t)b * c->zstride, (size_t)c->cout * c->Ho * c->Wo, twin_scale);
    return dz;
}
static void twin_init(void) {
    twin_backend = cpu_backend;
    twin_backend.act = twin_act;
    twin_backend.add = twin_add;
    twin_backend.conv = twin_conv;
    twin_backend.bn_backward = twin_bn_backward;
    twin_backend.grad_add = twin_grad_add;
    twin_backend.upsample_back = twin_upsample_back;
    twin_backend.maxpool_back = twin_maxpool_back;
}

// the CPU step as trainer_step + the optimizer, on model m (its own arena a) at batch B of H x W; heads
// copied out (head_copy NULL: not)
static LossOut cpu_step_at(Model *m, Arena *a, const float *x, int B, int H, int W, const LossTargets *tg,
                           const LossConfig *lc, void *scratch, size_t lb, float *head_copy[3], size_t head_n[3]) {
    m->train = 1;
    m->infer = 0;
    model_zero_grad(m);
    model_forward(m, a, x, B, H, W);
    for (int i = 0; i < 3 && head_copy; i++) memcpy(head_copy[i], m->head[i], head_n[i] * sizeof(float));
    model_head_grad(m, a);
    LossOut lo = loss_forward_backward(lc, B, m->nc, H, W, (const float *const *)m->head, m->dhead, tg, 1.f, scratch,
                                       lb, 0);
    model_backward(m, a);
    return lo;
}
static LossOut cpu_step(Model *m, Arena *a, const float *x, const LossTargets *tg, const LossConfig *lc, void *scratch,
                        size_t lb, float *head_copy[3], size_t head_n[3]) {
    return cpu_step_at(m, a, x, TB, TS, TS, tg, lc, scratch, lb, head_copy, head_n);
}

static float *dev_floats(const float *d, size_t n) {
    float *h = xmalloc(n * sizeof(float));
    GPU_CHECK(cudaMemcpy(h, d, n * sizeof(float), cudaMemcpyDeviceToHost));
    return h;
}

// worst relative difference of a map, |got - ref| / max(1, |ref|)
static double worst_rel(const float *got, const float *ref, size_t n, size_t *at) {
    double w = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - ref[i]) / fmax(1.0, fabs(ref[i]));
        if (!(d <= w)) w = d, *at = i;
    }
    return w;
}

// grad_compare: per-tensor max |got - ref| / (||ref tensor||_2 + 1e-6 ||ref||_2) and the whole relative L2
// difference; prints up to 5 tensors over tol; returns the number over and sets *worst, *whole, wname
static int grad_compare(const Model *m, const float *got, const float *ref, double tol, double *worst, double *whole,
                        char *wname, size_t wn, int *ntens) {
    double tot = 0, dtot = 0;
    for (size_t i = 0; i < m->nparams; i++)
        tot += (double)ref[i] * ref[i], dtot += ((double)got[i] - ref[i]) * ((double)got[i] - ref[i]);
    tot = sqrt(tot);
    *whole = sqrt(dtot) / tot;
    int nbad = 0;
    *worst = 0;
    *ntens = 0;
    for (int ci = 0; ci < m->nconv; ci++) {
        size_t off[3], len[3];
        int pg[3];
        model_segments(m, ci, off, len, pg);
        for (int k = 0; k < 3; k++) {
            if (!len[k]) continue;
            double nrm = 0, md = 0;
            for (size_t j = 0; j < len[k]; j++) {
                nrm += (double)ref[off[k] + j] * ref[off[k] + j];
                md = fmax(md, fabs((double)got[off[k] + j] - ref[off[k] + j]));
            }
            double rel = md / (sqrt(nrm) + 1e-6 * tot);
            const char *kind = k == 0 ? "weight" : k == 1 ? "bias" : "gamma";
            (*ntens)++;
            if (!(rel <= tol) && ++nbad <= 5)
                printf("  over: %s (%dx%d) %s max|diff| %.3g norm %.3g (%.3g)\n", m->conv[ci].name, m->conv[ci].Ho,
                       m->conv[ci].Wo, kind, md, sqrt(nrm), rel);
            if (!(rel <= *worst)) *worst = rel, snprintf(wname, wn, "%s %s", m->conv[ci].name, kind);
        }
    }
    return nbad;
}

// conv_weights_half: the conv weights in p (m's layout) rounded to FP16, as the device's convs read them
static void conv_weights_half(const Model *m, float *p) {
    for (int ci = 0; ci < m->nconv; ci++) {
        const Conv *c = &m->conv[ci];
        for (size_t j = 0; j < (size_t)c->cout * c->cin * c->k * c->k; j++)
            p[c->w_off + j] = half_to_float(float_to_half(p[c->w_off + j]));
    }
}
// blob_input: a batch of B smooth random blobs, H x W (uint8 img), and x, what the CPU sees (x / 255 in
// FP16, the device's input)
static void blob_input(uint8_t *img, float *x, int B, int H, int W, Rng *r) {
    for (size_t i = 0; i < (size_t)B * 3 * H * W; i++) {
        int px = (int)(i % W), py = (int)(i / W % H), ch = (int)(i / ((size_t)H * W) % 3);
        double v = 128 + 90 * sin(px * 0.21 + ch) * cos(py * 0.17 - ch) + rng_range(r, -30, 30);
        img[i] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
        x[i] = half_to_float(float_to_half(img[i] * (1.f / 255.f)));
    }
}
// step_open: yolov8n (nc TNC, weights from seed, the conv weights rounded to FP16) and its CPU arena for
// a step of B x H x W, and a batch of blobs from r: *img (uint8) and *x (what the CPU sees)
static Arena *step_open(Model *m, int B, int H, int W, uint64_t seed, Rng *r, uint8_t **img, float **x) {
    Arena *a = model_open(m, 'n', TNC, B, H, W, seed);
    size_t n = (size_t)B * 3 * H * W;
    *img = xmalloc(n);
    *x = xmalloc(n * sizeof(float));
    blob_input(*img, *x, B, H, W, r);
    conv_weights_half(m, m->params);
    return a;
}
// launched: whether the emulator's launch log (EMU_LAUNCH_LOG, one kernel name a line, each name once)
// names a kernel that begins with pre and ends with suf; -1: no log (a real GPU, or run outside run_emu.sh)
static int launched(const char *pre, const char *suf) {
    const char *log = getenv("EMU_LAUNCH_LOG");
    FILE *f = log ? fopen(log, "r") : NULL;
    if (!f) return -1;
    char line[256];
    int found = 0;
    size_t np = strlen(pre), ns = strlen(suf);
    while (!found && fgets(line, sizeof line, f)) {
        size_t n = strcspn(line, "\n");
        line[n] = 0;
        found = n >= np + ns && !strncmp(line, pre, np) && !strcmp(line + n - ns, suf);
    }
    fclose(f);
    return found;
}

// 10. a rectangular batch, 2 x 96 x 160, where the 3x3 convs take the row tiles (conv_halo_kernel,
// conv_halo_wgrad_kernel with TC H3_ROW_TC or H3_ROW_TC40: whole output rows of a map at most 20 wide a
// tile, 3 at stride 2, 6 at stride 1; at stride 1 3 rows of a map at most 40 wide), which the 64 x 64
// step's maps never do: model.3 (32 -> 64 channels, stride 8) outputs 12 x 20 (4 of its 3-row tiles against
// 6 of 4 x 16's in 16-column tiles), and its input gradient is 12 rows of 20 pixel pairs a parity; the
// stride-1 3x3 convs of the 12 x 20 map (model.4's and the neck's model.15's Bottlenecks, Detect's first
// level) take 2 tiles of 6 rows against 3 of 4 x 32, and those of the 24 x 40 map (model.2's Bottleneck) 8
// tiles of 3 rows of 40 against 9 of 8 x 16. The device step against the FP32 CPU step, bounded as C bounds
// the 64 x 64 step's: by 2x the CPU's FP16 twin's own distance from FP32, or the same floors, whichever is
// larger
static void test_rect_step(void) {
    enum { RB = 2, RH = 96, RW = 160, NR = 9 };
    // the launch log names each kernel once, when first launched: the row tiles must not be in it yet
    // (stride 2: forward, input gradient, weight gradient; then stride 1's 20 and 40 columns)
    const char *rpre[NR] = {"conv_halo_kernel<", "conv_halo_kernel<false, true, true, 20, ", "conv_halo_wgrad_kernel<",
                            "conv_halo_kernel<", "conv_halo_kernel<false, true, false, 20, ", "conv_halo_wgrad_kernel<",
                            "conv_halo_kernel<", "conv_halo_kernel<false, true, false, 40, ", "conv_halo_wgrad_kernel<"},
               *rsuf[NR] = {", false, true, 20, 8>", ">", ", true, 20, 8>", ", false, false, 20, 4>", "4>", ", false, 20, 4>",
                            ", false, false, 40, 8>", "8>", ", false, 40, 8>"};
    int before = 0;
    for (int i = 0; i < NR; i++) before += launched(rpre[i], rsuf[i]) > 0;
    Model *m = xcalloc(1, sizeof(Model));
    uint8_t *img;
    float *x;
    Rng r;
    rng_seed(&r, 7);
    Arena *a = step_open(m, RB, RH, RW, 13, &r, &img, &x);
    int bidx[4] = {0, 0, 1, 1}, cls[4] = {1, 2, 0, 2};
    float box[4][4] = {{0.2f, 0.4f, 0.15f, 0.5f}, {0.65f, 0.5f, 0.3f, 0.7f}, {0.4f, 0.6f, 0.5f, 0.6f},
                       {0.85f, 0.3f, 0.12f, 0.4f}};
    LossTargets tg = {4, bidx, cls, &box[0][0]};
    LossConfig lc = loss_config_default();
    size_t lb = loss_scratch_bytes(RB, loss_num_anchors(RH, RW), lc.max_boxes);
    void *scratch = xmalloc(lb);
    Optimizer opt = sgd_test();
    opt.m = xcalloc(m->nparams, sizeof(float));
    GpuShape shp = {RB, RH, RW, 1};
    Gpu *g = gpu_open(m, 0, 1, 1, &shp, &opt, NULL, NULL, &lc);
    g->scaler.scale = 1024.f;
    float *buf0 = xmalloc(m->nbuffers * sizeof(float)), *g32 = xmalloc(m->nparams * sizeof(float));
    memcpy(buf0, m->buffers, m->nbuffers * sizeof(float));
    LossOut lo_c = cpu_step_at(m, a, x, RB, RH, RW, &tg, &lc, scratch, lb, NULL, NULL);   // FP32
    memcpy(g32, m->grads, m->nparams * sizeof(float));
    double t0 = now_sec();
    LossOut lo_g = gpu_forward_backward(g, img, &tg, &lc);
    GPU_CHECK(cudaDeviceSynchronize());
    printf("rectangular %dx%d batch %d: emulated device step %.2f s\n", RH, RW, RB, now_sec() - t0);
    float *gg = dev_floats(g->grads, m->nparams);
    for (size_t i = 0; i < m->nparams; i++) gg[i] /= g->scaler.scale;
    memcpy(m->buffers, buf0, m->nbuffers * sizeof(float));   // the twin from the same running stats
    twin_init();
    twin_scale = g->scaler.scale;
    model_cpu_backend = &twin_backend;
    LossOut lo_h = cpu_step_at(m, a, x, RB, RH, RW, &tg, &lc, scratch, lb, NULL, NULL);
    model_cpu_backend = &cpu_backend;
    int ntens;
    double twin, twin_whole, worst, whole;
    char tname[80] = "", wname[80] = "";
    grad_compare(m, m->grads, g32, 1, &twin, &twin_whole, tname, sizeof tname, &ntens);
    double gtol = fmax(5e-2, 2 * twin);
    int nbad = grad_compare(m, gg, g32, gtol, &worst, &whole, wname, sizeof wname, &ntens);
    check(!nbad && whole <= fmax(6e-2, 2 * twin_whole),
          "%dx%d batch %d (row tiles), FP32 ref: gradients of %d tensors: worst %.3g (%s), tol %.3g (max(5e-2, 2x "
          "the FP16 twin's %.3g)), %d over; whole %.3g, tol max(6e-2, 2x the twin's %.3g)",
          RH, RW, RB, ntens, worst, wname, gtol, twin, nbad, whole, twin_whole);
    // each loss component within 2x its own FP16 twin's distance from FP32 (or 2e-3), as the 64 x 64 step's
    double lc_c[3] = {lo_c.box, lo_c.cls, lo_c.dfl}, lc_g[3] = {lo_g.box, lo_g.cls, lo_g.dfl},
           lh[3] = {lo_h.box, lo_h.cls, lo_h.dfl}, rel[3], trel[3];
    int lbad = 0;
    for (int k = 0; k < 3; k++) {
        rel[k] = fabs(lc_g[k] - lc_c[k]) / fmax(fabs(lc_c[k]), 1e-12);
        trel[k] = fabs(lh[k] - lc_c[k]) / fmax(fabs(lc_c[k]), 1e-12);
        lbad += !(rel[k] <= fmax(2e-3, 2 * trel[k]));
    }
    check(!lbad && lo_g.n_fg == lo_c.n_fg && lo_c.n_fg > 0,
          "%dx%d batch %d (row tiles), FP32 ref: loss box %.6g / %.6g, cls %.6g / %.6g, dfl %.6g / %.6g (gpu / cpu): "
          "relative diffs %.3g / %.3g / %.3g, each within max(2e-3, 2x the FP16 twin's %.3g / %.3g / %.3g); "
          "foreground %d / %d",
          RH, RW, RB, lc_g[0], lc_c[0], lc_g[1], lc_c[1], lc_g[2], lc_c[2], rel[0], rel[1], rel[2], trel[0], trel[1],
          trel[2], lo_g.n_fg, lo_c.n_fg);
    // the step took the row tiles: named in the launch log now, and not before it
    int got[NR];
    for (int i = 0; i < NR; i++) got[i] = launched(rpre[i], rsuf[i]);
    if (got[0] < 0) printf("(no EMU_LAUNCH_LOG: which conv kernels the rectangular step launched is not checked)\n");
    else
        check(!before && got[0] > 0 && got[1] > 0 && got[2] > 0 && got[3] > 0 && got[4] > 0 && got[5] > 0 && got[6] > 0 &&
                      got[7] > 0 && got[8] > 0,
              "%dx%d batch %d: the row tiles launched by this step (the emulator's launch log; %d of them before "
              "it): stride 2 forward %d, input gradient %d, weight gradient %d; stride 1, 20 columns %d, %d, %d, "
              "40 columns %d, %d, %d", RH, RW, RB, before, got[0], got[1], got[2], got[3], got[4], got[5], got[6],
              got[7], got[8]);
    gpu_close(g);
    free(gg); free(g32); free(buf0); free(img); free(x); free(scratch); free(opt.m);
    free(a->base);
    free(a);
    free(m);
}

int main(void) {
    double t0 = now_sec();
    Model *m = xcalloc(1, sizeof(Model));
    // input: smooth random blobs (uint8), the CPU sees x/255 as input_from_batch makes it; the conv
    // weights rounded to FP16 on both sides: the device convs read exactly these values
    size_t nimg = (size_t)TB * 3 * TS * TS;
    uint8_t *img;
    float *x;
    Rng r;
    rng_seed(&r, 5);
    Arena *a = step_open(m, TB, TS, TS, 11, &r, &img, &x);
    int bidx[5] = {0, 0, 1, 1, 1}, cls[5] = {0, 2, 1, 0, 2};
    float box[5][4] = {{0.3f, 0.3f, 0.3f, 0.25f}, {0.7f, 0.6f, 0.4f, 0.5f}, {0.5f, 0.5f, 0.6f, 0.6f},
                       {0.2f, 0.75f, 0.2f, 0.3f}, {0.8f, 0.2f, 0.25f, 0.2f}};
    LossTargets tg = {5, bidx, cls, &box[0][0]};
    LossConfig lc = loss_config_default();
    size_t lb = loss_scratch_bytes(TB, loss_num_anchors(TS, TS), lc.max_boxes);
    void *scratch = xmalloc(lb);
    Optimizer opt = sgd_test();
    opt.m = xcalloc(m->nparams, sizeof(float));

    // the device step: plan, one cudaMalloc, weights uploaded before the CPU step moves the BN stats
    GpuShape shp = {TB, TS, TS, 1};
    Gpu *g = gpu_open(m, 0, 1, 1, &shp, &opt, NULL, NULL, &lc);
    g->copy_heads = 1;   // the head maps of the step to g->head_h for the comparisons below
    // GPU_STEP_QUICK (run_emu.sh under the sanitizers, where a device step takes minutes): one step,
    // without the recompute=1 twin and the extra optimizer steps
    int quick = getenv("GPU_STEP_QUICK") != NULL;
    Gpu *gr = NULL, *gf = NULL, *gs[2] = {NULL, NULL};
    if (!quick) {
        m->recompute = 1;   // a second device, recompute=1, from the same weights and running stats
        gr = gpu_open(m, 0, 1, 1, &shp, &opt, NULL, NULL, &lc);
        m->recompute = 0;
        // a third: the batch to the stem as an FP16 copy (gpu_input) into the gather kernel, the path of
        // the stems the stem's kernels do not take (yolov8l, x), planned and run so
        gpu_stem_u8_off = 1;
        gf = gpu_open(m, 0, 1, 1, &shp, &opt, NULL, NULL, &lc);
        gpu_stem_u8_off = 0;
        // a fourth and a fifth (recompute=1): the BN backward's sums from the input gradient's epilogue
        // (gpu_bn_sums) on every layer whose dA one input gradient writes, its threshold lowered: no channel
        // of this step is large enough
        gpu_bn_sums_min = 0;
        for (int k = 0; k < 2; k++) {
            m->recompute = k;
            gs[k] = gpu_open(m, 0, 1, 1, &shp, &opt, NULL, NULL, &lc);
        }
        m->recompute = 0;
        gpu_bn_sums_min = 32768;
        printf("device arenas: recompute=0 %.2f MiB, recompute=1 %.2f MiB\n", g->plan / 1048576.0,
               gr->plan / 1048576.0);
    }
    printf("device arena: %.2f MiB planned by a dry run, params %zu\n", g->plan / 1048576.0, m->nparams);
    g->scaler.scale = 1024.f;   // a scale whose gradients stay finite in FP16 here (65536 overflows at step 1)

    float *hc[3];
    size_t hn[3];
    for (int i = 0; i < 3; i++) {
        const Conv *bx = &m->conv[m->head_conv[i][0]];
        hn[i] = (size_t)TB * (REG_MAX * 4 + TNC) * bx->Ho * bx->Wo;
        hc[i] = xmalloc(hn[i] * sizeof(float));
    }
    float *buf0 = xmalloc(m->nbuffers * sizeof(float)), *g32 = xmalloc(m->nparams * sizeof(float));
    memcpy(buf0, m->buffers, m->nbuffers * sizeof(float));
    double t1 = now_sec();
    LossOut lo_c = cpu_step(m, a, x, &tg, &lc, scratch, lb, hc, hn);   // FP32
    double t2 = now_sec();
    memcpy(g32, m->grads, m->nparams * sizeof(float));
    float *buf1 = xmalloc(m->nbuffers * sizeof(float));   // the running stats after the FP32 step
    memcpy(buf1, m->buffers, m->nbuffers * sizeof(float));
    LossOut lo_g = gpu_forward_backward(g, img, &tg, &lc);
    GPU_CHECK(cudaDeviceSynchronize());
    double t3 = now_sec();
    printf("CPU step %.2f s, emulated device step %.2f s\n", t2 - t1, t3 - t2);
    float *gg = dev_floats(g->grads, m->nparams);
    for (size_t i = 0; i < m->nparams; i++) gg[i] /= g->scaler.scale;
    if (gr) {   // recompute=1 on the device: the same loss, gradients and running stats, bit for bit
        gr->scaler.scale = g->scaler.scale;
        m->recompute = 1;
        LossOut lo_r = gpu_forward_backward(gr, img, &tg, &lc);
        m->recompute = 0;
        float *rg = dev_floats(gr->grads, m->nparams), *rb = dev_floats(gr->buffers, m->nbuffers),
              *b0 = dev_floats(g->buffers, m->nbuffers);
        for (size_t i = 0; i < m->nparams; i++) rg[i] /= gr->scaler.scale;
        check(lo_r.box == lo_g.box && lo_r.cls == lo_g.cls && lo_r.dfl == lo_g.dfl && !memcmp(rg, gg, m->nparams * 4) &&
              !memcmp(rb, b0, m->nbuffers * 4) && gr->a->high == gr->plan && gr->plan < g->plan,
              "recompute=1 device step: loss, gradients and running stats bit-identical to recompute=0; arena %.2f MiB "
              "(high-water mark == plan) < %.2f MiB", gr->plan / 1048576.0, g->plan / 1048576.0);
        free(rg); free(rb); free(b0);
        gpu_close(gr);
    }
    float *sgr[2] = {NULL, NULL};   // gs's gradients (checked in B)
    LossOut lo_s[2] = {{0}};
    int s_plan[2] = {0};
    long s_taken[2] = {0};
    for (int k = 0; k < 2 && gs[k]; k++) {
        gs[k]->scaler.scale = g->scaler.scale;
        gpu_bn_sums_min = 0;
        m->recompute = k;
        lo_s[k] = gpu_forward_backward(gs[k], img, &tg, &lc);
        m->recompute = 0;
        gpu_bn_sums_min = 32768;
        sgr[k] = dev_floats(gs[k]->grads, m->nparams);
        for (size_t i = 0; i < m->nparams; i++) sgr[k][i] /= gs[k]->scaler.scale;
        s_plan[k] = gs[k]->a->high == gs[k]->plan;
        s_taken[k] = gs[k]->bn_sums_taken;
        gpu_close(gs[k]);
    }
    float *fg = NULL;   // gf's gradients (checked in B against the reference's sensitivity)
    LossOut lo_f = {0};
    int f_plan = 0;
    if (gf) {
        gf->scaler.scale = g->scaler.scale;
        gpu_stem_u8_off = 1;
        lo_f = gpu_forward_backward(gf, img, &tg, &lc);
        gpu_stem_u8_off = 0;
        fg = dev_floats(gf->grads, m->nparams);
        for (size_t i = 0; i < m->nparams; i++) fg[i] /= gf->scaler.scale;
        f_plan = gf->a->high == gf->plan;
        gpu_close(gf);
    }

    // A. against the FP32 CPU step: FP16 rounding itself, amplified by BN over 8 values. Measured here,
    // checked after C against fixed bounds or 2x what the FP16 twin measures, whichever is larger (on a
    // GPU, tensor-core accumulation and FMA contraction put the roundings elsewhere: a fresh draw)
    double hw[3], lc_c[3] = {lo_c.box, lo_c.cls, lo_c.dfl}, lc_g[3] = {lo_g.box, lo_g.cls, lo_g.dfl};
    size_t hat[3];
    float *h32[3];
    for (int i = 0; i < 3; i++) {
        hw[i] = worst_rel(g->head_h[i], hc[i], hn[i], &hat[i]);
        h32[i] = xmalloc(hn[i] * sizeof(float));
        memcpy(h32[i], hc[i], hn[i] * sizeof(float));
    }
    const char *ln[3] = {"box", "cls", "dfl"};
    int ntens;
    double worst, whole;
    char wname[80] = "";
    grad_compare(m, gg, g32, 1, &worst, &whole, wname, sizeof wname, &ntens);

    // B. the reference's own sensitivity: the FP32 CPU step with half of the input pixels one FP16 ulp up
    // (FP16-rounding-sized noise)
    float *xp = xmalloc(nimg * sizeof(float));
    for (size_t i = 0; i < nimg; i++) xp[i] = rng_uniform(&r) < 0.5 ? half_to_float(float_to_half(x[i]) + 1) : x[i];
    memcpy(m->buffers, buf0, m->nbuffers * sizeof(float));
    LossOut lo_p = cpu_step(m, a, xp, &tg, &lc, scratch, lb, hc, hn);
    double sens, sens_whole, gpu_worst = worst;
    char sname[80] = "";
    grad_compare(m, m->grads, g32, 1, &sens, &sens_whole, sname, sizeof sname, &ntens);
    printf("sensitivity of the FP32 reference to 1-ulp input noise: loss box %.3g cls %.3g dfl %.3g relative; "
           "gradients: worst tensor %.3g (%s), whole %.3g\n", fabs(lo_p.box - lo_c.box) / lo_c.box,
           fabs(lo_p.cls - lo_c.cls) / lo_c.cls, fabs(lo_p.dfl - lo_c.dfl) / lo_c.dfl, sens, sname, sens_whole);
    check(gpu_worst <= 2 * sens,
          "gradients: the GPU's worst tensor difference %.3g is within 2x the reference's own sensitivity %.3g",
          gpu_worst, sens);
    if (fg) {   // the stem from the batch's FP16 copy: other kernels (not the same bits), as close to FP32
        double fw, fwh;
        char fname[80] = "";
        grad_compare(m, fg, g32, 1, &fw, &fwh, fname, sizeof fname, &ntens);
        check(fw <= 2 * sens && memcmp(fg, gg, m->nparams * 4) && f_plan,
              "the stem from an FP16 copy of the batch (gpu_input, the gather kernel: the l and x stems' path): "
              "gradients' worst tensor difference %.3g (%s) within 2x the sensitivity %.3g, not the bits of the "
              "uint8 read's (other kernels), high-water mark == plan %d", fw, fname, sens, f_plan);
        free(fg);
    }
    for (int k = 0; k < 2 && sgr[k]; k++) {   // the BN backward's sums from the input gradients: sums in
                                               // another order, not the same bits, and close to them
        double sw, swh, dw, dwh;
        char sname2[80] = "", dname[80] = "";
        grad_compare(m, sgr[k], g32, 1, &sw, &swh, sname2, sizeof sname2, &ntens);
        grad_compare(m, sgr[k], gg, 1, &dw, &dwh, dname, sizeof dname, &ntens);
        check(sw <= 2 * sens && dw <= 1e-2 && s_taken[k] >= (k ? 5 : 20) && s_plan[k] && lo_s[k].box == lo_g.box &&
                      lo_s[k].cls == lo_g.cls && lo_s[k].dfl == lo_g.dfl,
              "the BN backward's sums from the input gradients' epilogues (conv_dgrad_bn_cuda, %ld layers%s): "
              "gradients' worst tensor difference from FP32 %.3g (%s) within 2x the sensitivity %.3g, from the "
              "two passes' %.3g (%s) within 1e-2; the loss the bits of the step's, high-water mark == plan %d",
              s_taken[k], k ? ", recompute=1" : "", sw, sname2, sens, dw, dname, s_plan[k]);
        free(sgr[k]);
    }

    // C. the CPU step's FP16 twin (twin_backend: the CPU rounds every tensor the device stores in FP16, at
    // the same loss scale) against the FP32 step: what FP16 storage itself costs here. The device may
    // differ from FP32 by no more than 2x that; its distance from the twin is printed (as large: the
    // order of FP32 sums alone flips FP16 roundings, and those grow like any other 1-ulp change)
    memcpy(m->buffers, buf0, m->nbuffers * sizeof(float));
    twin_init();
    twin_scale = g->scaler.scale;
    model_cpu_backend = &twin_backend;
    LossOut lo_h = cpu_step(m, a, x, &tg, &lc, scratch, lb, hc, hn);
    model_cpu_backend = &cpu_backend;
    double twin, twin_whole, gt_worst, gt_whole, th[3];
    char tname[80] = "", gname[80] = "";
    grad_compare(m, m->grads, g32, 1, &twin, &twin_whole, tname, sizeof tname, &ntens);
    grad_compare(m, gg, m->grads, 1, &gt_worst, &gt_whole, gname, sizeof gname, &ntens);
    printf("FP16 twin on the CPU vs the FP32 step: loss box %.3g cls %.3g dfl %.3g relative; gradients: worst tensor "
           "%.3g (%s), "
           "whole %.3g; the device vs the twin: worst tensor %.3g (%s), whole %.3g\n",
           fabs(lo_h.box - lo_c.box) / lo_c.box, fabs(lo_h.cls - lo_c.cls) / lo_c.cls,
           fabs(lo_h.dfl - lo_c.dfl) / lo_c.dfl, twin, tname, twin_whole, gt_worst, gname, gt_whole);
    check(gpu_worst <= 2 * twin,
          "gradients: the GPU's worst tensor difference from FP32 %.3g is within 2x the FP16 twin's own %.3g",
          gpu_worst, twin);
    for (int i = 0; i < 3; i++) {
        size_t at;
        th[i] = worst_rel(hc[i], h32[i], hn[i], &at);
        double tol = fmax(6e-2, 2 * th[i]);
        check(hw[i] <= tol,
              "FP32 ref: head map %d (%zu values): worst |gpu - cpu| / max(1, |cpu|) %.3g at %zu (gpu %g cpu %g), "
              "tol %.3g (max(6e-2, 2x the FP16 twin's %.3g): FP16 through 50 layers)",
              i, hn[i], hw[i], hat[i], g->head_h[i][hat[i]], h32[i][hat[i]], tol, th[i]);
        free(h32[i]);
    }
    check(whole <= fmax(6e-2, 2 * twin_whole),
          "FP32 ref: whole gradient ||gpu - cpu||_2 / ||cpu||_2 = %.3g, tol max(6e-2, 2x the "
          "FP16 twin's %.3g)",
          whole, twin_whole);
    double gtol = fmax(5e-2, 2 * twin);
    int nbad = grad_compare(m, gg, g32, gtol, &worst, &whole, wname, sizeof wname, &ntens);
    check(!nbad,
          "FP32 ref: gradients of %d tensors: worst max|gpu - cpu| / (||cpu tensor||_2 + 1e-6 ||cpu||_2) = %.3g (%s), "
          "tol %.3g "
          "(max(5e-2, 2x the FP16 twin's %.3g)), %d over",
          ntens, worst, wname, gtol, twin, nbad);
    // the loss components: the 2e-3, or 2x the twin's own distance from FP32, whichever is larger
    double lh[3] = {lo_h.box, lo_h.cls, lo_h.dfl};
    for (int k = 0; k < 3; k++) {
        double rel = fabs(lc_g[k] - lc_c[k]) / fmax(fabs(lc_c[k]), 1e-12),
               trel = fabs(lh[k] - lc_c[k]) / fmax(fabs(lc_c[k]), 1e-12);
        check(rel <= fmax(2e-3, 2 * trel),
              "FP32 ref: loss %s: gpu %.7g cpu %.7g, relative diff %.3g, tol max(2e-3, 2x the FP16 twin's %.3g)", ln[k],
              lc_g[k], lc_c[k], rel, trel);
        if (gf) {   // (closed above; its loss kept)
            double lf = k == 0 ? lo_f.box : k == 1 ? lo_f.cls : lo_f.dfl, frel = fabs(lf - lc_c[k]) / fmax(fabs(lc_c[k]), 1e-12);
            check(frel <= fmax(2e-3, 2 * trel), "FP32 ref: loss %s, the stem from the batch's FP16 copy: gpu %.7g, "
                  "relative diff %.3g, the same tol", ln[k], lf, frel);
        }
    }
    // bounds for the optimizer checks below, from the same measured FP16 cost
    double ptol = fmax(8e-2, 2 * twin + 1.5e-2), ltol = 1e-2;
    for (int k = 0; k < 3; k++) ltol = fmax(ltol, 2 * fabs(lh[k] - lc_c[k]) / fmax(fabs(lc_c[k]), 1e-12));
    memcpy(m->grads, g32, m->nparams * sizeof(float));   // the FP32 step's state for the checks below
    memcpy(m->buffers, buf1, m->nbuffers * sizeof(float));
    free(buf1);
    free(xp);
    free(buf0);
    free(g32);
    // 4. BN running stats after the forward
    float *bg = dev_floats(g->buffers, m->nbuffers);
    size_t at = 0;
    double wb = worst_rel(bg, m->buffers, m->nbuffers, &at);
    check(wb <= 2e-3, "BN running mean/var after one train forward (%zu values): worst rel diff %.3g, tol 2e-3",
          m->nbuffers, wb);
    free(bg);

    // 5. one optimizer step on both: norm, then the parameters (SGD, clip 10)
    float *p0 = xmalloc(m->nparams * sizeof(float));
    memcpy(p0, m->params, m->nparams * sizeof(float));
    double norm_c = grad_clip_norm(m, GRAD_CLIP_NORM), norm_g = 0;
    optim_step(&opt, m);
    int taken = gpu_optimize(g, &norm_g);
    check(taken, "device optimizer step taken (finite gradients at scale 1024)");
    check_close("gradient norm (unscaled), gpu vs cpu (tol 1.5e-2 relative)", norm_g, norm_c, 1.5e-2 * norm_c);
    float *pg_ = dev_floats(g->params, m->nparams);
    nbad = 0; worst = 0;
    double utot = 0;
    for (size_t i = 0; i < m->nparams; i++) utot += ((double)m->params[i] - p0[i]) * ((double)m->params[i] - p0[i]);
    utot = sqrt(utot);
    for (int ci = 0; ci < m->nconv; ci++) {
        size_t off[3], len[3];
        int pgr[3];
        model_segments(m, ci, off, len, pgr);
        for (int k = 0; k < 3; k++) {
            double un = 0, md = 0;
            for (size_t j = 0; j < len[k]; j++) {
                double d = m->params[off[k] + j] - p0[off[k] + j];
                un += d * d;
                md = fmax(md, fabs((double)pg_[off[k] + j] - m->params[off[k] + j]));
            }
            if (!len[k]) continue;
            double rel = md / (sqrt(un) + 1e-6 * utot);
            if (!(rel <= ptol)) nbad++;
            if (!(rel <= worst)) worst = rel;
        }
    }
    check(!nbad,
          "parameters after one SGD step: worst max|gpu - cpu| / (||cpu tensor update||_2 + 1e-6 ||cpu update||_2) = "
          "%.3g, "
          "tol %.3g (max(8e-2, 2x the FP16 twin's gradients + 1.5e-2: the update is linear in them, and the clip "
          "factor "
          "differs too), %d tensors over",
          worst, ptol, nbad);
    free(pg_);

    // 6. a forced overflow: inf in one gradient of the last step (the optimizer leaves the gradients
    //    as they are) -> step skipped, scale halved, nothing updated
    float inf = INFINITY, scale0 = g->scaler.scale;
    long step0 = g->opt.step, ema0 = g->ema_updates;
    GPU_CHECK(cudaMemcpy(g->grads + m->conv[5].w_off + 3, &inf, sizeof inf, cudaMemcpyHostToDevice));
    float *pb = dev_floats(g->params, m->nparams), *eb = dev_floats(g->ema_p, m->nparams);
    double nrm_inf = 0;
    int took = gpu_optimize(g, &nrm_inf);
    float *pa = dev_floats(g->params, m->nparams), *ea = dev_floats(g->ema_p, m->nparams);
    // the EMA still moves towards the (unchanged) weights, as Ultralytics' ema.update after a skipped scaler.step
    float d = (float)(0.9999 * (1 - exp(-(double)(ema0 + 1) / 2000.0)));
    double ema_err = 0;
    for (size_t i = 0; i < m->nparams; i++) ema_err = fmax(ema_err, fabs(ea[i] - (d * eb[i] + (1 - d) * pb[i])));
    check(!took && isinf(nrm_inf) && g->scaler.scale == scale0 / 2 && g->opt.step == step0 &&
                  !memcmp(pa, pb, m->nparams * 4) && g->ema_updates == ema0 + 1 && ema_err <= 1e-6,
          "forced overflow (inf in %s.weight): step skipped (%d), norm %g, scale %g -> %g, step count kept, weights "
          "bit-identical, "
          "EMA updated once towards them (max err %.2g)",
          m->conv[5].name, !took, nrm_inf, scale0, g->scaler.scale, ema_err);
    free(pa); free(pb); free(ea); free(eb);

    // 7. memory: the device arena's high-water mark is exactly its dry-run plan, every step allocation
    //    at the offset the layout gave it (none fell back to first-fit), and the layout no larger than
    //    first-fit's plan
    {
        Arena *fa = xcalloc(1, sizeof(Arena));   // first-fit: the same dry run without the layout
        GpuShape fs = {g->B, g->H, g->W, 1};
        Gpu *fg = xcalloc(1, sizeof(Gpu));
        fg->m = m, fg->a = fa, fg->opt.kind = g->opt.kind, fg->esz = 2;
        fa->cap = SIZE_MAX;
        gpu_alloc(fg);
        gpu_shape(fg, &fs);
        gpu_input_begin(fg, NULL);
        Exec fe = exec_gpu(fg);
        walk_step(&fe, NULL, &lc);
        gpu_input_end(fg);
        check(g->a->high == g->plan && g->a->n == 10 + (g->opt_v != NULL) + (g->wt16 != NULL) && g->lay &&
                      g->a->replay_miss == 0 && g->a->replayed >= g->lay->count[0] && g->plan <= fa->high,
              "device arena: high-water mark %zu bytes == plan %zu (first-fit's %zu); %d blocks live after the steps "
              "(the persistent ones); %ld allocations placed by the layout (%d a step), %ld steps left it",
              g->a->high, g->plan, fa->high, g->a->n, g->a->replayed, g->lay ? g->lay->count[0] : 0, g->a->replay_miss);
        free(fa), free(fg);
        gpu_shape(g, &fs);
    }
    // 7b. gpu_input, the batch as FP16 for a reader the stem's kernels do not serve (AMP keeps it as uint8):
    //     into a dense buffer (one conversion) and a strided one (as into a channel slice of a wider buffer:
    //     one an image), the bits of fp16(v / 255) (u8_to_f16_cuda's), nothing written between the images
    {
        const long n = 3L * TS * TS, os = n + 40;
        uint8_t *du;
        uint16_t *dh;
        GPU_CHECK(cudaMalloc((void **)&du, (size_t)TB * n));
        GPU_CHECK(cudaMalloc((void **)&dh, (size_t)TB * os * 2));
        GPU_CHECK(cudaMemcpy(du, img, (size_t)TB * n, cudaMemcpyHostToDevice));
        Exec ge = exec_gpu(g);
        ge.x = du;
        long bad[2] = {0, 0};
        uint16_t *h = xmalloc((size_t)TB * os * 2);
        for (int strided = 0; strided < 2; strided++) {
            const long st = strided ? os : n;
            GPU_CHECK(cudaMemset(dh, 0xff, (size_t)TB * os * 2));
            gpu_input(&ge, 0, dh, st, n);
            GPU_CHECK(cudaMemcpy(h, dh, (size_t)TB * os * 2, cudaMemcpyDeviceToHost));
            for (int b = 0; b < TB; b++)
                for (long i = 0; i < st; i++)
                    bad[strided] += h[b * st + i] != (i < n ? float_to_half(img[b * n + i] * (1.f / 255.f)) : 0xffff);
        }
        check(g->x8 && !bad[0] && !bad[1], "gpu_input from the uint8 batch: the bits of fp16(v / 255), dense (%ld "
              "differ) and image by image into a strided buffer (%ld differ or written between the images)", bad[0],
              bad[1]);
        free(h);
        GPU_CHECK(cudaFree(du));
        GPU_CHECK(cudaFree(dh));
    }
    // 8. more SGD steps on the same batch (lr 0.01, momentum 0.937, clip 10): the loss goes down; the
    //    device's weights then give the CPU the same loss. The first steps from random weights move the
    //    loss up or down by chance (the assigner re-assigns, BN over 8 values; the FP32 CPU step does the
    //    same: over seeds 11-13, FP32 and the FP16 twin, the loss after 2 steps was 0.97-1.30x the first,
    //    after 7 steps 0.43-0.55x), so the check is after 7 steps: section 5's, then 6 here
    if (!quick) {
        enum { NSTEP = 7 };
        double l[NSTEP + 1] = {lo_g.box + lo_g.cls + lo_g.dfl};   // at the initial weights
        int ok = 1;                                                  // steps taken (section 5's was)
        for (int k = 1; k <= NSTEP; k++) {
            LossOut lo = gpu_forward_backward(g, img, &tg, &lc);
            l[k] = lo.box + lo.cls + lo.dfl;
            if (k < NSTEP) ok += gpu_optimize(g, NULL);
        }
        // the CPU forward of the device's weights after those steps (conv weights FP16-rounded as the device uses them)
        float *p1 = dev_floats(g->params, m->nparams);
        conv_weights_half(m, p1);
        memcpy(m->params, p1, m->nparams * sizeof(float));
        free(p1);
        LossOut lo_c1 = cpu_step(m, a, x, &tg, &lc, scratch, lb, hc, hn);
        double l1c = lo_c1.box + lo_c1.cls + lo_c1.dfl;
        check(fabs(l[NSTEP] - l1c) <= ltol * l1c,
              "after %d SGD steps the device loss %.4f matches the CPU forward of the device's "
              "updated weights %.4f (%.3g relative, max(1e-2, 2x the FP16 twin's loss difference): the FP16 forward)",
              NSTEP, l[NSTEP], l1c, ltol);
        char traj[200];
        int tn = 0;
        for (int k = 0; k <= NSTEP; k++) tn += snprintf(traj + tn, sizeof traj - tn, "%s%.3f", k ? " -> " : "", l[k]);
        check(l[NSTEP] < 0.7 * l[0],
              "device SGD steps on one batch (lr 0.01, momentum 0.937): loss %s, below 0.7x the first after "
              "%d steps (%d taken, the others skipped by the GradScaler)",
              traj, NSTEP, ok);
    }
    gpu_close(g);

    // 9. amp=0: the same step in FP32 on the device (the master weights in the convs, FP32 activations
    //    and input x/255 unrounded) against the FP32 CPU step from the same weights and running stats
    if (!quick) {
        float *x32 = xmalloc(nimg * sizeof(float));
        for (size_t i = 0; i < nimg; i++) x32[i] = img[i] * (1.f / 255.f);
        Gpu *gf = gpu_open(m, 0, 0, 1, &shp, &opt, NULL, NULL, &lc);
        gf->copy_heads = 1;
        LossOut lf_c = cpu_step(m, a, x32, &tg, &lc, scratch, lb, hc, hn);
        double t4 = now_sec();
        LossOut lf_g = gpu_forward_backward(gf, img, &tg, &lc);
        GPU_CHECK(cudaDeviceSynchronize());
        printf("emulated FP32 device step %.2f s\n", now_sec() - t4);
        double c3[3] = {lf_c.box, lf_c.cls, lf_c.dfl}, g3[3] = {lf_g.box, lf_g.cls, lf_g.dfl}, worst_l = 0;
        for (int k = 0; k < 3; k++) worst_l = fmax(worst_l, fabs(g3[k] - c3[k]) / fabs(c3[k]));
        check(worst_l <= 1e-5 && lf_g.n_fg == lf_c.n_fg,
              "amp=0 FP32 device step: loss box %.8g / %.8g, cls %.8g / %.8g, dfl %.8g / %.8g "
              "(gpu / cpu): worst relative diff %.3g, tol 1e-5; foreground %d / %d",
              g3[0], c3[0], g3[1], c3[1], g3[2], c3[2], worst_l, lf_g.n_fg, lf_c.n_fg);
        double hw = 0;
        for (int i = 0; i < 3; i++) {
            size_t at = 0;
            hw = fmax(hw, worst_rel(gf->head_h[i], hc[i], hn[i], &at));
        }
        check(hw <= 1e-4, "amp=0 FP32 device step: head maps worst |gpu - cpu| / max(1, |cpu|) %.3g, tol 1e-4", hw);
        float *fg = dev_floats(gf->grads, m->nparams);
        double fw, fwhole;
        char fname[80] = "";
        int fbad = grad_compare(m, fg, m->grads, 1e-3, &fw, &fwhole, fname, sizeof fname, &ntens);
        check(!fbad,
              "amp=0 FP32 device step: gradients of %d tensors, worst max|gpu - cpu| / (||cpu tensor||_2 + 1e-6 "
              "||cpu||_2) = "
              "%.3g (%s), tol 1e-3; whole %.3g",
              ntens, fw, fname, fwhole);
        free(fg);
        free(x32);
        gpu_close(gf);
    }
    if (!quick) test_rect_step();
    printf("total %.1f s\n", now_sec() - t0);
    free(gg); free(p0); free(img); free(x); free(scratch); free(opt.m);
    for (int i = 0; i < 3; i++) free(hc[i]);
    return test_summary();
}
