// test_loss.c: the YOLOv8 detection loss (the loss section of yolo.c): CIoU against an independent double formula,
// DFL against hand cross-entropies, the assigner against a dense re-implementation of Ultralytics'
// TaskAlignedAssigner ([M, A] matrices, full top-k), hand-made assignment cases, the max_boxes cap, and a
// finite-difference check of the gradient of each loss part w.r.t. every head value of a small batch.
#define TESTING
#include "../yolo.c"
#include "test.h"

// ------------------------------------------------------------------------------------------
// helpers
// ------------------------------------------------------------------------------------------

// tal_assign_image: the whole assignment of one image b with gts (m <= w->M, pixels), using image b's
// slices of the work arrays; the batch path in loss_forward_backward runs the same three steps for all
// images at once. Appends the foreground anchors to fg and returns their count.
static int tal_assign_image(const LossGrid *g, int NC, const float *const head[3], int b, const LossGt *gts,
                            int m, LossWork *w, LossFg *fg) {
    size_t o = (size_t)b * w->M;
    float *pbox = w->pbox + (size_t)b * g->A * 4;
    for (int a = 0; a < g->A; a++) {
        int l = loss_anchor_level(g, a);
        float p[4 * LOSS_R], lse[4], box[4];
        loss_decode_box(g, NC, head, b, l, a - g->off[l], box, p, lse);
        for (int k = 0; k < 4; k++) pbox[(size_t)a * 4 + k] = box[k] * g->stride[l];
    }
    #pragma omp parallel for schedule(dynamic, 1)
    for (int j = 0; j < m; j++) {
        const float *planes[3];
        for (int l = 0; l < 3; l++) {
            size_t HW = (size_t)g->H[l] * g->W[l];
            planes[l] = head[l] + ((size_t)b * (64 + NC) + 64 + gts[j].cls) * HW;
        }
        w->nsel[o + j] = tal_topk_gt(g, &gts[j], pbox, planes, w->cand + (o + j) * LOSS_TOPK);
    }
    return tal_resolve_image(g, NC, head, b, gts, m, w->cand + o * LOSS_TOPK, w->nsel + o, pbox, w, fg);
}

typedef struct {
    int B, NC, imgH, imgW;
    LossGrid g;
    float *head[3], *dhead[3];   // (B, 64+NC, H_l, W_l)
    size_t n[3];                 // elements per level
    void *scratch;
    size_t scratch_bytes;
} Case;

static Case case_make(int B, int NC, int imgH, int imgW, int max_boxes) {
    Case c;
    c.B = B; c.NC = NC; c.imgH = imgH; c.imgW = imgW;
    c.g = loss_grid_make(imgH, imgW);
    for (int l = 0; l < 3; l++) {
        c.n[l] = (size_t)B * (64 + NC) * c.g.H[l] * c.g.W[l];
        c.head[l] = xcalloc(c.n[l], sizeof(float));
        c.dhead[l] = xcalloc(c.n[l], sizeof(float));
    }
    c.scratch_bytes = loss_scratch_bytes(B, c.g.A, max_boxes);
    c.scratch = xmalloc(c.scratch_bytes);
    return c;
}
static void case_free(Case *c) {
    for (int l = 0; l < 3; l++) { free(c->head[l]); free(c->dhead[l]); }
    free(c->scratch);
}
// pointer to head value (b, ch) at global anchor a
static float *case_at(Case *c, float *const *maps, int b, int ch, int a) {
    int l = loss_anchor_level(&c->g, a);
    size_t HW = (size_t)c->g.H[l] * c->g.W[l];
    return maps[l] + ((size_t)b * (64 + c->NC) + ch) * HW + (a - c->g.off[l]);
}
// random head: box logits N(0, sb), class logits N(mc, sc)
static void case_fill(Case *c, Rng *r, double sb, double mc, double sc) {
    for (int l = 0; l < 3; l++) {
        size_t HW = (size_t)c->g.H[l] * c->g.W[l];
        for (int b = 0; b < c->B; b++)
            for (int ch = 0; ch < 64 + c->NC; ch++)
                for (size_t i = 0; i < HW; i++)
                    c->head[l][((size_t)b * (64 + c->NC) + ch) * HW + i] =
                        (float)(ch < 64 ? sb * rng_normal(r) : mc + sc * rng_normal(r));
    }
}
// set the box logits of anchor a so that its predicted distances are about (l, t, r, b) grid units:
// two adjacent bins around each distance get logits whose softmax mean is exactly the distance.
static void case_set_dist(Case *c, int b, int a, const double *d) {
    for (int s = 0; s < 4; s++) {
        int k = (int)floor(d[s]);
        if (k > 14) k = 14;
        double f = d[s] - k;   // p_k = 1-f, p_{k+1} = f
        for (int i = 0; i < 16; i++) *case_at(c, c->head, b, s * 16 + i, a) = -30.0f;
        *case_at(c, c->head, b, s * 16 + k, a) = (float)log(1.0 - f + 1e-12);
        *case_at(c, c->head, b, s * 16 + k + 1, a) = (float)log(f + 1e-12);
    }
}
// normalised cx,cy,w,h of a pixel xyxy box
static void box_norm(float *out, double x1, double y1, double x2, double y2, int imgH, int imgW) {
    out[0] = (float)((x1 + x2) / 2 / imgW); out[1] = (float)((y1 + y2) / 2 / imgH);
    out[2] = (float)((x2 - x1) / imgW); out[3] = (float)((y2 - y1) / imgH);
}

// ciou_ref: CIoU in double straight from the paper's definitions (Zheng et al. 2020) with Ultralytics'
// eps placement; alpha_fixed >= 0 replaces alpha (to differentiate with alpha held constant).
static double ciou_ref(const double *p, const double *t, double alpha_fixed) {
    double eps = 1e-7;
    double wp = p[2] - p[0], hp = p[3] - p[1] + eps, wt = t[2] - t[0], ht = t[3] - t[1] + eps;
    double iw = fmax(0, fmin(p[2], t[2]) - fmax(p[0], t[0])), ih = fmax(0, fmin(p[3], t[3]) - fmax(p[1], t[1]));
    double inter = iw * ih, iou = inter / (wp * hp + wt * ht - inter + eps);
    double cxp = (p[0] + p[2]) / 2, cyp = (p[1] + p[3]) / 2, cxt = (t[0] + t[2]) / 2, cyt = (t[1] + t[3]) / 2;
    double rho2 = (cxp - cxt) * (cxp - cxt) + (cyp - cyt) * (cyp - cyt);
    double cw = fmax(p[2], t[2]) - fmin(p[0], t[0]), ch = fmax(p[3], t[3]) - fmin(p[1], t[1]);
    double c2 = cw * cw + ch * ch + eps;
    double v = 4 / (M_PI * M_PI) * pow(atan(wt / ht) - atan(wp / hp), 2);
    double alpha = alpha_fixed >= 0 ? alpha_fixed : v / (v - iou + 1 + eps);
    return iou - rho2 / c2 - alpha * v;
}

// ------------------------------------------------------------------------------------------
// dense reference assigner: Ultralytics' TaskAlignedAssigner on full [M, A] matrices
// ------------------------------------------------------------------------------------------

typedef struct { int a, gt; float score; } RefFg;

// ref_assign: dense version of one image: in-box mask and metrics for every (gt, anchor), top-10 over all
// anchors sorted by (align desc, index asc) = CUDA torch.topk ties, mask_pos, multi-gt resolution by
// argmax of overlaps over gts, soft-target normalisation. Returns the foreground count.
static int ref_assign(Case *c, int b, const LossGt *gts, int m, RefFg *out) {
    int A = c->g.A;
    float *pb = xmalloc((size_t)A * 4 * sizeof(float));
    float *ov = xcalloc((size_t)m * A, sizeof(float)), *al = xcalloc((size_t)m * A, sizeof(float));
    char *pos = xcalloc((size_t)m * A, 1), *inb = xcalloc((size_t)m * A, 1);
    int *idx = xmalloc(A * sizeof(int));
    for (int a = 0; a < A; a++) {
        int l = loss_anchor_level(&c->g, a);
        float p[64], lse[4], box[4];
        loss_decode_box(&c->g, c->NC, (const float *const *)c->head, b, l, a - c->g.off[l], box, p, lse);
        for (int k = 0; k < 4; k++) pb[a * 4 + k] = box[k] * c->g.stride[l];
    }
    for (int j = 0; j < m; j++) {
        for (int a = 0; a < A; a++) {
            int l = loss_anchor_level(&c->g, a), r = a - c->g.off[l];
            float s = c->g.stride[l];
            float ax = (r % c->g.W[l] + 0.5f) * s, ay = (r / c->g.W[l] + 0.5f) * s;
            float d[4] = {ax - gts[j].x1, ay - gts[j].y1, gts[j].x2 - ax, gts[j].y2 - ay};
            float mn = d[0];
            for (int k = 1; k < 4; k++) mn = d[k] < mn ? d[k] : mn;
            inb[j * A + a] = mn > 1e-9f && gts[j].valid;
            if (!inb[j * A + a]) continue;
            float gb[4] = {gts[j].x1, gts[j].y1, gts[j].x2, gts[j].y2};
            float o = bbox_ciou(gb, pb + a * 4);
            o = o > 0 ? o : 0;
            float sc = 1.0f / (1.0f + expf(-*case_at(c, c->head, b, 64 + gts[j].cls, a)));
            ov[j * A + a] = o;
            al[j * A + a] = sqrtf(sc) * powf(o, 6.0f);
        }
        if (!gts[j].valid) continue;
        // full sort of all anchors by (align desc, index asc); insertion sort is fine at these sizes
        for (int a = 0; a < A; a++) {
            int i = a;
            while (i > 0 && al[j * A + idx[i - 1]] < al[j * A + a]) { idx[i] = idx[i - 1]; i--; }
            idx[i] = a;
        }
        for (int k = 0; k < 10 && k < A; k++) pos[j * A + idx[k]] = inb[j * A + idx[k]];
    }
    for (int a = 0; a < A; a++) {
        int cnt = 0;
        for (int j = 0; j < m; j++) cnt += pos[j * A + a];
        if (cnt > 1) {
            int best = 0;
            for (int j = 1; j < m; j++) if (ov[j * A + a] > ov[best * A + a]) best = j;
            for (int j = 0; j < m; j++) pos[j * A + a] = j == best;
        }
    }
    float *pal = xcalloc(m, sizeof(float)), *pov = xcalloc(m, sizeof(float));
    for (int j = 0; j < m; j++)
        for (int a = 0; a < A; a++)
            if (pos[j * A + a]) {
                if (al[j * A + a] > pal[j]) pal[j] = al[j * A + a];
                if (ov[j * A + a] > pov[j]) pov[j] = ov[j * A + a];
            }
    int n = 0;
    for (int a = 0; a < A; a++) {
        int gt = -1;
        float norm = 0;
        for (int j = 0; j < m; j++) {
            float v = pos[j * A + a] ? al[j * A + a] * pov[j] / (pal[j] + 1e-9f) : 0.0f;
            if (v > norm) norm = v;
            if (pos[j * A + a] && gt < 0) gt = j;
        }
        if (gt >= 0) out[n++] = (RefFg){a, gt, norm};
    }
    free(pb); free(ov); free(al); free(pos); free(inb); free(idx); free(pal); free(pov);
    return n;
}

// ------------------------------------------------------------------------------------------
// tests
// ------------------------------------------------------------------------------------------

static void test_ciou(void) {
    Rng r;
    rng_seed(&r, 1);
    float a[4] = {10, 20, 50, 45};
    check_close("CIoU of identical boxes (tol 1e-6: eps 1e-7 in union)", bbox_ciou(a, a), 1.0, 1e-6);
    // known pair by hand: p=(0,0,2,2), t=(1,1,3,3): iou = 1/7, rho2 = 2, c2 = 18, v = 0 -> 1/7 - 1/9
    float p[4] = {0, 0, 2, 2}, t[4] = {1, 1, 3, 3};
    check_close("CIoU (0,0,2,2) vs (1,1,3,3) = 1/7 - 1/9 by hand (tol 1e-6)", bbox_ciou(p, t), 1.0 / 7 - 1.0 / 9, 1e-6);
    // disjoint, different aspect: compare the float implementation with the double formula
    double worst = 0, worst_g[2] = {0, 0};
    for (int it = 0; it < 2000; it++) {
        double pd[4], td[4];
        for (int k = 0; k < 2; k++) {
            pd[k] = rng_range(&r, 0, 50); pd[k + 2] = pd[k] + rng_range(&r, 0.5, 40);
            td[k] = rng_range(&r, 0, 50); td[k + 2] = td[k] + rng_range(&r, 0.5, 40);
        }
        float pf[4], tf[4];
        for (int k = 0; k < 4; k++) { pf[k] = (float)pd[k]; tf[k] = (float)td[k]; pd[k] = pf[k]; td[k] = tf[k]; }
        double e = fabs(bbox_ciou(pf, tf) - ciou_ref(pd, td, -1));
        if (e > worst) worst = e;
        // gradient w.r.t. the first box, alpha held constant, against central differences of the double formula
        double v = 4 / (M_PI * M_PI) * pow(atan((td[2] - td[0]) / (td[3] - td[1] + 1e-7)) -
                                           atan((pd[2] - pd[0]) / (pd[3] - pd[1] + 1e-7)), 2);
        double eps = 1e-7, wp = pd[2] - pd[0], hp = pd[3] - pd[1] + eps, wt = td[2] - td[0], ht = td[3] - td[1] + eps;
        double iw = fmax(0, fmin(pd[2], td[2]) - fmax(pd[0], td[0]));
        double ih = fmax(0, fmin(pd[3], td[3]) - fmax(pd[1], td[1]));
        double iou = iw * ih / (wp * hp + wt * ht - iw * ih + eps);
        double alpha = v / (v - iou + 1 + eps);
        for (int ag = 0; ag < 2; ag++) {   // alpha constant (Ultralytics), then alpha differentiated too
            double d1[4];
            bbox_ciou_backward(pf, tf, 1.0, ag, d1);
            for (int k = 0; k < 4; k++) {
                double h = 1e-6, pp[4], pm[4];
                memcpy(pp, pd, sizeof pp); memcpy(pm, pd, sizeof pm);
                pp[k] += h; pm[k] -= h;
                double fd = (ciou_ref(pp, td, ag ? -1 : alpha) - ciou_ref(pm, td, ag ? -1 : alpha)) / (2 * h);
                double e2 = fabs(fd - d1[k]) / (1e-3 + fabs(fd));
                if (e2 > worst_g[ag]) worst_g[ag] = e2;
            }
        }
    }
    check(worst <= 2e-6, "CIoU float vs double formula, 2000 random pairs: worst |diff| %.3g tol 2e-6", worst);
    for (int ag = 0; ag < 2; ag++)
        check(worst_g[ag] <= 1e-4, "CIoU backward (%s) vs central differences of the double formula, 2000 pairs: "
              "worst |diff|/(1e-3+|fd|) %.3g tol 1e-4 (float forward values inside backward)",
              ag ? "alpha differentiated" : "alpha constant", worst_g[ag]);
}

static void test_dfl(void) {
    // one anchor at level 0 of a 64x64 image, target distances exact integers, then fractional
    Case c = case_make(1, 2, 64, 64, 4);
    Rng r;
    rng_seed(&r, 2);
    case_fill(&c, &r, 1.5, 0, 1);
    int a = 2 * 8 + 3;   // x=3, y=2: centre (3.5, 2.5) grid units
    for (int pass = 0; pass < 2; pass++) {
        double d[4] = {3, 2, 5, 1};
        if (pass) { d[0] = 3.25; d[1] = 0.5; d[2] = 14.995; d[3] = 7.75; }
        double tb[4] = {3.5 - d[0], 2.5 - d[1], 3.5 + d[2], 2.5 + d[3]};
        LossFg f = {0, a, 0, 1.0f, (float)(tb[0] * 8), (float)(tb[1] * 8), (float)(tb[2] * 8), (float)(tb[3] * 8)};
        double bt, dt;
        loss_fg_term(&c.g, c.NC, (const float *const *)c.head, NULL, &f, 0, 0, &bt, &dt);
        double want = 0;
        for (int s = 0; s < 4; s++) {
            double mx = -1e30, sum = 0, z[16];
            for (int i = 0; i < 16; i++) { z[i] = *case_at(&c, c.head, 0, s * 16 + i, a); mx = fmax(mx, z[i]); }
            for (int i = 0; i < 16; i++) sum += exp(z[i] - mx);
            double lse = mx + log(sum), t = fmin(d[s], 14.99);
            int k = (int)floor(t);
            want += (lse - z[k]) * (k + 1 - t) + (lse - z[k + 1]) * (t - k);
        }
        want /= 4;
        check_close(pass ? "DFL, fractional targets incl. clamp at 14.99 (tol 2e-5)" :
                           "DFL of integer targets = mean CE at bin k (tol 2e-5)", dt, want, 2e-5);
    }
    // decode: expectation of a constructed distribution
    double d[4] = {1.25, 4.5, 0.0, 9.75};
    case_set_dist(&c, 0, a, d);
    float p[64], lse[4], box[4];
    loss_decode_box(&c.g, c.NC, (const float *const *)c.head, 0, 0, a, box, p, lse);
    double worst = fmax(fmax(fabs(box[0] - (3.5 - 1.25)), fabs(box[1] - (2.5 - 4.5))),
                        fmax(fabs(box[2] - (3.5 + 0.0)), fabs(box[3] - (2.5 + 9.75))));
    check(worst <= 1e-5, "decode: anchor -/+ softmax expectation, worst |diff| %.3g tol 1e-5", worst);
    case_free(&c);
}

// hand-made assignments on a 64x64 image (grids 8x8, 4x4, 2x2; A = 84)
static void test_assign_hand(void) {
    Case c = case_make(1, 3, 64, 64, 8);
    LossWork w = loss_work_carve(c.scratch, 1, c.g.A, 8);
    Rng r;
    rng_seed(&r, 3);
    case_fill(&c, &r, 0.3, 0, 0.5);   // near-uniform bins: every predicted box ~ anchor -/+ 7.5 cells
    // gt (8,8)-(32,24) px: stride 8 centres x in {12,20,28}, y in {12,20}; stride 16 none (8 and 24 are on
    // the edges, not strictly inside); stride 32 centre (16,16). 7 anchors.
    LossGt gt = {8, 8, 32, 24, 1, 1};
    int want[7] = {1 * 8 + 1, 1 * 8 + 2, 1 * 8 + 3, 2 * 8 + 1, 2 * 8 + 2, 2 * 8 + 3, 80};
    for (int a = 0; a < 84; a++) {   // predicted boxes overlapping the gt so every align is positive
        int l = loss_anchor_level(&c.g, a), rr = a - c.g.off[l];
        float s = c.g.stride[l], ax = (rr % c.g.W[l] + 0.5f), ay = (rr / c.g.W[l] + 0.5f);
        double d[4] = {ax - 8 / s, ay - 8 / s, 32 / s - ax, 24 / s - ay};
        for (int k = 0; k < 4; k++) d[k] = fmin(fmax(d[k] + 0.3, 0.2), 14.9);
        case_set_dist(&c, 0, a, d);
    }
    LossFg fg[84];
    int nf = tal_assign_image(&c.g, c.NC, (const float *const *)c.head, 0, &gt, 1, &w, fg);
    int ok = nf == 7;
    for (int i = 0; i < nf && ok; i++) ok = fg[i].a == want[i] && fg[i].score > 0;
    check(ok, "gt (8,8,32,24) px on 64x64: exactly the 7 anchors strictly inside are foreground (got %d)", nf);
    // its best anchor gets target = best CIoU (normalisation): max score == max overlap
    float best = 0, max_o = 0;
    for (int i = 0; i < nf; i++) best = fmaxf(best, fg[i].score);
    for (int i = 0; i < 7; i++) {
        int a = want[i], l = loss_anchor_level(&c.g, a), rr = a - c.g.off[l];
        float s = c.g.stride[l], o, al;
        tal_metric(&gt, (rr % c.g.W[l] + 0.5f) * s, (rr / c.g.W[l] + 0.5f) * s, w.pbox + a * 4,
                   *case_at(&c, c.head, 0, 64 + 1, a), &o, &al);
        max_o = fmaxf(max_o, o);
    }
    check_close("best anchor's target score = gt's best CIoU (tol 1e-6)", best, max_o, 1e-6);

    // a 6x10 px box lying between centres at every stride: no positive anchor
    LossGt small = {29, 27, 35, 37, 0, 1};
    nf = tal_assign_image(&c.g, c.NC, (const float *const *)c.head, 0, &small, 1, &w, fg);
    check(nf == 0, "6x10 px box (29,27)-(35,37) between anchor centres: %d foreground anchors, want 0", nf);

    // anchor inside two gts goes to the gt with larger CIoU, whatever their order
    for (int order = 0; order < 2; order++) {
        // anchor x=3,y=3 at stride 8, centre (28,28) px; gts both contain only a few anchors
        LossGt g2[2] = {{22, 22, 34, 34, 0, 1}, {25, 25, 45, 36, 2, 1}};
        if (order) { LossGt t = g2[0]; g2[0] = g2[1]; g2[1] = t; }
        int a = 3 * 8 + 3;
        double d[4] = {(28 - 24) / 8.0, (28 - 24) / 8.0, (40 - 28) / 8.0, (35 - 28) / 8.0};   // pred (24,24,40,35)
        case_set_dist(&c, 0, a, d);
        nf = tal_assign_image(&c.g, c.NC, (const float *const *)c.head, 0, g2, 2, &w, fg);
        int claimed = 0;   // was the anchor in both top-k lists?
        for (int j = 0; j < 2; j++)
            for (int i = 0; i < w.nsel[j]; i++) claimed += w.cand[j * LOSS_TOPK + i].a == a;
        float pb[4] = {24, 24, 40, 35};
        float o[2];
        for (int j = 0; j < 2; j++) {
            float gb[4] = {g2[j].x1, g2[j].y1, g2[j].x2, g2[j].y2};
            o[j] = bbox_ciou(gb, pb);
        }
        int wantj = o[1] > o[0], got = -1;
        for (int i = 0; i < nf; i++)
            if (fg[i].a == a) got = fg[i].x1 == g2[0].x1 ? 0 : 1;
        check(claimed == 2 && got == wantj, "anchor (28,28) in two gts (order %d, CIoU %.4f vs %.4f): claimed by %d, "
              "assigned to gt %d, want %d", order, o[0], o[1], claimed, got, wantj);
    }
    case_free(&c);
}

// the assigner against the dense reference on random crowded scenes
static void test_assign_dense(void) {
    Rng r;
    rng_seed(&r, 4);
    int total_fg = 0, mism = 0, cases = 0, zero_fg = 0;
    double worst = 0;
    for (int it = 0; it < 12; it++) {
        int imgH = it % 2 ? 96 : 128, imgW = it % 3 ? 128 : 96, NC = 4, m = 5 + rng_int(&r, 40);
        Case c = case_make(1, NC, imgH, imgW, 64);
        LossWork w = loss_work_carve(c.scratch, 1, c.g.A, 64);
        case_fill(&c, &r, it % 3 == 0 ? 3.0 : 1.0, -1, 2);
        LossGt gts[64];
        for (int j = 0; j < m; j++) {
            double bw = rng_uniform(&r) < 0.3 ? rng_range(&r, 2, 12) : rng_range(&r, 8, imgW * 0.8);
            double bh = rng_uniform(&r) < 0.3 ? rng_range(&r, 2, 12) : rng_range(&r, 8, imgH * 0.8);
            double x1 = rng_range(&r, 0, imgW - bw), y1 = rng_range(&r, 0, imgH - bh);
            if (j % 7 == 3) { x1 = 16; y1 = 16; bw = 32; bh = 24; }   // exact duplicates and grid-aligned edges
            gts[j] = (LossGt){(float)x1, (float)y1, (float)(x1 + bw), (float)(y1 + bh), rng_int(&r, NC), 1};
        }
        LossFg *fg = xmalloc(c.g.A * sizeof(LossFg));
        RefFg *ref = xmalloc(c.g.A * sizeof(RefFg));
        int nf = tal_assign_image(&c.g, NC, (const float *const *)c.head, 0, gts, m, &w, fg);
        int nr = ref_assign(&c, 0, gts, m, ref);
        if (nf != nr) mism++;
        for (int i = 0; i < nf && i < nr; i++) {
            const LossGt *q = &gts[ref[i].gt];
            if (fg[i].a != ref[i].a || fg[i].cls != q->cls || fg[i].x1 != q->x1 || fg[i].y2 != q->y2) mism++;
            double e = fabs(fg[i].score - ref[i].score);
            if (e > worst) worst = e;
            zero_fg += fg[i].score == 0;
        }
        total_fg += nf;
        cases++;
        free(fg); free(ref); case_free(&c);
    }
    check(mism == 0, "assigner vs dense [M, A] reference, %d random scenes (%d fg anchors, %d with score 0): "
          "%d mismatches in anchor / gt / class", cases, total_fg, zero_fg, mism);
    check(worst == 0, "assigner soft target scores vs dense reference: worst |diff| %.3g tol 0 (same float ops)",
          worst);
}

// no boxes: only the classification loss, = sum BCE(x, 0) / 1; gradients B*0.5*sigmoid(x), box grads 0
static void test_no_boxes(void) {
    Case c = case_make(2, 5, 64, 96, 16);
    Rng r;
    rng_seed(&r, 5);
    case_fill(&c, &r, 1, -2, 3);
    for (int l = 0; l < 3; l++) for (size_t i = 0; i < c.n[l]; i++) c.dhead[l][i] = 777.0f;   // must be overwritten
    LossConfig cfg = loss_config_default();
    cfg.max_boxes = 16;
    LossTargets tg = {0, NULL, NULL, NULL};
    LossOut o = loss_forward_backward(&cfg, c.B, c.NC, c.imgH, c.imgW, (const float *const *)c.head, c.dhead, &tg,
                                      1.0f, c.scratch, c.scratch_bytes, 0);
    double want = 0, worst_g = 0;
    for (int l = 0; l < 3; l++) {
        size_t HW = (size_t)c.g.H[l] * c.g.W[l];
        for (int b = 0; b < c.B; b++)
            for (int ch = 0; ch < 64 + c.NC; ch++)
                for (size_t i = 0; i < HW; i++) {
                    size_t at = ((size_t)b * (64 + c.NC) + ch) * HW + i;
                    double x = c.head[l][at], gw = 0;
                    if (ch >= 64) {
                        want += fmax(x, 0) + log1p(exp(-fabs(x)));
                        gw = c.B * 0.5 / (1 + exp(-x));
                    }
                    worst_g = fmax(worst_g, fabs(c.dhead[l][at] - gw) / (1e-6 + fabs(gw)));
                }
    }
    check(o.box == 0 && o.dfl == 0 && o.n_fg == 0 && o.target_scores_sum == 1.0,
          "no boxes: box %g dfl %g n_fg %d target_scores_sum %g (want 0 0 0 1)", o.box, o.dfl, o.n_fg,
          o.target_scores_sum);
    check_close("no boxes: cls = 0.5 * sum BCE(x, 0) (rel tol 1e-6)", o.cls / (0.5 * want), 1.0, 1e-6);
    check_close("no boxes: total = B * cls (tol 1e-9 rel)", o.total / (c.B * o.cls), 1.0, 1e-9);
    check(worst_g <= 1e-5, "no boxes: dhead = B*0.5*sigmoid(x) on class logits, 0 on box logits: worst rel diff %.3g "
          "tol 1e-5", worst_g);
    case_free(&c);
}

// max_boxes cap: overflow counted, and the result equals the call with only the first max_boxes boxes
static void test_cap(void) {
    Case c = case_make(2, 3, 64, 64, 3);
    Rng r;
    rng_seed(&r, 6);
    case_fill(&c, &r, 1, -1, 1);
    int bi[7] = {0, 1, 0, 0, 1, 0, 0}, cl[7] = {0, 1, 2, 0, 1, 2, 0};
    float bx[7][4];
    for (int i = 0; i < 7; i++) box_norm(bx[i], 4 + 5 * i, 6 + 3 * i, 30 + 4 * i, 40 + 2 * i, 64, 64);
    LossConfig cfg = loss_config_default();
    cfg.max_boxes = 3;
    LossTargets tg = {7, bi, cl, &bx[0][0]};
    LossOut o = loss_forward_backward(&cfg, 2, 3, 64, 64, (const float *const *)c.head, NULL, &tg, 1,
                                      c.scratch, c.scratch_bytes, 0);
    check(o.n_over_cap == 2 && o.n_images_over_cap == 1, "cap 3 with 5 boxes in image 0: n_over_cap %d (want 2), "
          "images %d (want 1)", o.n_over_cap, o.n_images_over_cap);
    LossTargets tg5 = {5, bi, cl, &bx[0][0]};   // image 0: boxes 0, 2, 3; image 1: boxes 1, 4
    LossOut o5 = loss_forward_backward(&cfg, 2, 3, 64, 64, (const float *const *)c.head, NULL, &tg5, 1,
                                       c.scratch, c.scratch_bytes, 0);
    // tol 1e-12 relative: the same terms, summed in an OpenMP reduction whose order may vary between calls
    check(o5.n_over_cap == 0 && fabs(o5.total - o.total) <= 1e-12 * o.total && o5.n_fg == o.n_fg,
          "capped batch = batch of the first 3 boxes per image: total %.12g vs %.12g (rel tol 1e-12), n_fg %d vs %d",
          o.total, o5.total, o.n_fg, o5.n_fg);
    case_free(&c);
}

// finite differences of each loss part w.r.t. every head value, assignment held fixed
static void test_gradient(void) {
    Case c = case_make(2, 3, 64, 96, 16);
    Rng r;
    rng_seed(&r, 7);
    case_fill(&c, &r, 1.0, -1, 1.5);
    // image 0: four boxes (two overlapping heavily, one small); image 1: none
    int bi[4] = {0, 0, 0, 0}, cl[4] = {0, 2, 2, 1};
    float bx[4][4];
    box_norm(bx[0], 10, 8, 60, 50, 64, 96);
    box_norm(bx[1], 30, 20, 80, 58, 64, 96);
    box_norm(bx[2], 36, 26, 78, 60, 64, 96);
    box_norm(bx[3], 70, 4, 90, 18, 64, 96);
    LossTargets tg = {4, bi, cl, &bx[0][0]};
    LossConfig cfg = loss_config_default();
    cfg.max_boxes = 16;
    // dhead is overwritten, not added to (the step does not zero the head maps' gradients first)
    for (int l = 0; l < 3; l++) for (size_t i = 0; i < c.n[l]; i++) c.dhead[l][i] = 777.0f;
    LossOut o = loss_forward_backward(&cfg, c.B, c.NC, c.imgH, c.imgW, (const float *const *)c.head, c.dhead, &tg,
                                      1.0f, c.scratch, c.scratch_bytes, 0);
    long left = 0, total = 0;
    for (int l = 0; l < 3; l++)
        for (size_t i = 0; i < c.n[l]; i++, total++) left += c.dhead[l][i] == 777.0f;
    check(left == 0 && o.n_fg > 0, "gradient case (%d foreground anchors): every value of dhead written (%ld of %ld "
          "left as filled)", o.n_fg, left, total);
    printf("  gradient case: n_fg %d target_scores_sum %.4f box %.4f cls %.4f dfl %.4f\n", o.n_fg,
           o.target_scores_sum, o.box, o.cls, o.dfl);
    // values checked: every class logit, the 64 box logits of every foreground anchor, 300 other box logits
    LossWork w = loss_work_carve(c.scratch, c.B, c.g.A, cfg.max_boxes);
    char *pick[3];
    for (int l = 0; l < 3; l++) {
        size_t HW = (size_t)c.g.H[l] * c.g.W[l];
        pick[l] = xcalloc(c.n[l], 1);
        for (size_t i = 0; i < c.n[l]; i++) pick[l][i] = (int)(i / HW % (64 + c.NC)) >= 64;
    }
    for (int i = 0; i < w.keep->n_fg; i++)
        for (int ch = 0; ch < 64; ch++) {
            const LossFg *f = &w.fg[i];
            int l = loss_anchor_level(&c.g, f->a);
            pick[l][case_at(&c, c.head, f->b, ch, f->a) - c.head[l]] = 1;
        }
    for (int k = 0; k < 300; k++) {
        int l = rng_int(&r, 3);
        size_t i = (size_t)rng_int(&r, (int)c.n[l]);
        pick[l][i] = 1;
    }
    const char *names[3] = {"box (alpha differentiated)", "cls", "dfl"};
    for (int part = 0; part < 3; part++) {
        LossConfig pc = cfg;
        pc.box = part == 0 ? cfg.box : 0; pc.cls = part == 1 ? cfg.cls : 0; pc.dfl = part == 2 ? cfg.dfl : 0;
        const float gs = 2.0f;   // grad_scale: the gradient must carry it, the loss must not
        // Ultralytics' box gradient holds CIoU's alpha constant, so it is not the derivative of the forward;
        // here alpha is differentiated too (test_ciou checks both CIoU backward modes against the formula)
        loss_ciou_alpha_grad = part == 0;
        loss_forward_backward(&pc, c.B, c.NC, c.imgH, c.imgW, (const float *const *)c.head, c.dhead, &tg, gs,
                              c.scratch, c.scratch_bytes, LOSS_REUSE_ASSIGNMENT);
        loss_ciou_alpha_grad = 0;
        double worst = 0, worst_fd = 0, worst_an = 0, maxg = 0;
        long nonzero = 0, count = 0;
        for (int l = 0; l < 3; l++)
            for (size_t i = 0; i < c.n[l]; i++) {
                if (!pick[l][i]) continue;
                float x = c.head[l][i], h = 1e-2f;
                float xp = x + h, xm = x - h;
                c.head[l][i] = xp;
                double fp = loss_forward_backward(&pc, c.B, c.NC, c.imgH, c.imgW, (const float *const *)c.head, NULL,
                                                  &tg, 1, c.scratch, c.scratch_bytes, LOSS_REUSE_ASSIGNMENT).total;
                c.head[l][i] = xm;
                double fm = loss_forward_backward(&pc, c.B, c.NC, c.imgH, c.imgW, (const float *const *)c.head, NULL,
                                                  &tg, 1, c.scratch, c.scratch_bytes, LOSS_REUSE_ASSIGNMENT).total;
                c.head[l][i] = x;
                double fd = gs * (fp - fm) / ((double)xp - xm), an = c.dhead[l][i];
                double e = fabs(fd - an) / (1e-4 + 2e-3 * fabs(an));
                if (e > worst) { worst = e; worst_fd = fd; worst_an = an; }
                nonzero += an != 0;
                maxg = fmax(maxg, fabs(an));
                count++;
            }
        check(worst <= 1.0, "d(%s)/d(head), %ld values (%ld non-zero, max |g| %.3g), central diff h=1e-2: "
              "worst fd %.6g vs analytic %.6g, tol 1e-4 + 2e-3*|g| (FP32 terms, O(h^2) truncation)",
              names[part], count, nonzero, maxg, worst_fd, worst_an);
    }
    for (int l = 0; l < 3; l++) free(pick[l]);
    case_free(&c);
}

static void bench_loss(void) {
    int B = 8, NC = 80, S = 320, per = 20;
    Case c = case_make(B, NC, S, S, 1024);
    Rng r;
    rng_seed(&r, 8);
    case_fill(&c, &r, 1.0, -6, 2);
    int n = B * per, *bi = xmalloc(n * sizeof(int)), *cl = xmalloc(n * sizeof(int));
    float *bx = xmalloc(n * 4 * sizeof(float));
    for (int i = 0; i < n; i++) {
        bi[i] = i / per; cl[i] = rng_int(&r, NC);
        double w = rng_range(&r, 8, 200), h = rng_range(&r, 8, 200);
        double x = rng_range(&r, 0, S - w), y = rng_range(&r, 0, S - h);
        box_norm(bx + i * 4, x, y, x + w, y + h, S, S);
    }
    LossConfig cfg = loss_config_default();
    LossTargets tg = {n, bi, cl, bx};
    double best = 1e9, best_cpu = 1e9;
    LossOut o;
    for (int rep = 0; rep < 5; rep++) {
        struct timespec c0, c1;
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c0);
        double t0 = now_sec();
        o = loss_forward_backward(&cfg, B, NC, S, S, (const float *const *)c.head, c.dhead, &tg, 1, c.scratch,
                                  c.scratch_bytes, 0);
        best = fmin(best, now_sec() - t0);
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c1);
        best_cpu = fmin(best_cpu, (c1.tv_sec - c0.tv_sec) + (c1.tv_nsec - c0.tv_nsec) * 1e-9);
    }
    int threads = 1;
#ifdef _OPENMP
    threads = omp_get_max_threads();
#endif
    printf("  perf: loss forward+backward B=%d imgsz %d NC=%d %d boxes/img: %.2f ms wall, %.2f ms CPU (best of 5, "
           "%d threads), n_fg %d, scratch %.2f MB\n", B, S, NC, per, best * 1e3, best_cpu * 1e3, threads, o.n_fg,
           loss_scratch_bytes(B, c.g.A, 1024) / 1e6);
    free(bi); free(cl); free(bx); case_free(&c);
}

int main(void) {
    test_ciou();
    test_dfl();
    test_assign_hand();
    test_assign_dense();
    test_no_boxes();
    test_cap();
    test_gradient();
    bench_loss();
    return test_summary();
}
