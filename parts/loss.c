/*
 * loss: the YOLOv8 detection loss, forward and backward, on the CPU in FP32 (double accumulators).
 * Matches Ultralytics v8DetectionLoss (utils/loss.py) with TaskAlignedAssigner (utils/tal.py), BboxLoss and
 * DFLoss; spec yolov8.md section 2.
 *
 * Public API
 *   LossConfig loss_config_default(void)      gains box 7.5, cls 0.5, dfl 1.5; max_boxes 1024
 *   int    loss_num_anchors(int imgH, int imgW)                  A = sum over strides 8,16,32 of (H/s)(W/s)
 *   size_t loss_scratch_bytes(int B, int A, int max_boxes)       exact scratch bytes of one call
 *   LossOut loss_forward_backward(const LossConfig *cfg, int B, int NC, int imgH, int imgW,
 *                                 const float *const head[3], float *const dhead[3],
 *                                 const LossTargets *tg, float grad_scale, void *scratch,
 *                                 size_t scratch_bytes, int flags)
 *
 * Shapes and units
 *   head[i]  (B, 64+NC, H_i, W_i) raw head maps of level i (strides 8, 16, 32; H_i = imgH/stride_i).
 *            Channels 0..63: sides l,t,r,b x 16 DFL bins (consecutive per side); 64..63+NC: class logits.
 *            Anchor index: level offset + y*W_i + x; anchor point (x+0.5, y+0.5) grid units.
 *   dhead[i] same shape; OVERWRITTEN (not accumulated) with grad_scale * d(total)/d(head), where
 *            total = B*(box+cls+dfl) is the scalar Ultralytics back-propagates. dhead == NULL (or any
 *            dhead[i] == NULL) means forward only (validation loss).
 *   tg       n boxes: batch_idx[n] in [0,B), cls[n] in [0,NC), box[n*4] normalised (cx, cy, w, h) of the
 *            final image; converted to pixels xyxy with (W, H, W, H) exactly as Ultralytics preprocess.
 *   scratch  caller-provided, scratch_bytes >= loss_scratch_bytes(B, A, cfg->max_boxes) (checked; dies
 *            otherwise), any alignment; no allocation happens inside the call. It also keeps the last
 *            assignment (see LOSS_REUSE_ASSIGNMENT).
 *   flags    0, or LOSS_REUSE_ASSIGNMENT: skip the assigner and reuse the foreground list and
 *            target_scores_sum left in scratch by the previous call with the same B, imgH, imgW, NC and
 *            targets (for finite-difference tests: the assigner is no-grad in Ultralytics).
 *   LossOut  box/cls/dfl after gains, before xB (what Ultralytics logs); total = B*(box+cls+dfl);
 *            n_fg foreground anchors; target_scores_sum = max(sum of target scores, 1) over the batch;
 *            n_over_cap boxes ignored because their image had more than max_boxes (the first max_boxes of
 *            an image, in input order, are kept), n_images_over_cap such images. The first time boxes are
 *            dropped a one-line warning goes to stderr; the counts come back on every call.
 *   errors   batch_idx outside [0,B) or cls outside [0,NC) die (the data loader validates labels first).
 *   loss_ciou_alpha_grad  test-only switch (0 in training): 1 also differentiates CIoU's alpha.
 *
 * Memory: no [B, M, A] tensor. Each gt visits only the anchors whose centres fall inside its box (the
 * anchor rectangle of each level) and keeps its top-10; overlaps between gts are then resolved one image
 * at a time with O(A) arrays. Scratch: predicted boxes (B, A, 4) f32, per-gt candidates (B, M, 10) and the
 * batch's foreground list B*min(A, 10*M) x 32 B: 9.0 MB for B=16, A=8400, M=1024; 5.3 MB with M=400.
 *
 * DEVIATIONS from Ultralytics
 *  - torch.topk tie order: when a gt has fewer than 10 anchors with align > 0, topk also returns anchors
 *    with align exactly 0, and which ones is implementation-defined. We follow CUDA torch.topk (ties at the
 *    k-th value taken in increasing anchor index over ALL A anchors, outside anchors included), so an
 *    inside anchor with align 0 is a candidate only if fewer than 10 - npos zero-align anchors (inside or
 *    outside) precede it. CPU torch may pick different zeros; positive-align choices agree.
 *  - Boxes beyond max_boxes per image are ignored (counted and reported); Ultralytics has no cap.
 *  - Sums (target_scores_sum, BCE, box, DFL) are accumulated in double; PyTorch sums in float.
 *  - BCE is evaluated as BCE(x,0) - x*t (exact identity); the gradient sigmoid(x) - t.
 */

// ------------------------------------------------------------------------------------------
// settings, results, geometry
// ------------------------------------------------------------------------------------------

enum { LOSS_R = 16, LOSS_TOPK = 10, LOSS_REUSE_ASSIGNMENT = 1 };

typedef struct {
    float box, cls, dfl;   // loss gains (hyp box, cls, dfl)
    int max_boxes;         // per-image box cap M; a mosaic holds ~4x the boxes of one source image
} LossConfig;

typedef struct {
    int n;                 // number of boxes in the batch
    const int *batch_idx;  // (n) image of each box
    const int *cls;        // (n) class of each box
    const float *box;      // (n, 4) normalised cx, cy, w, h
} LossTargets;

typedef struct {
    double box, cls, dfl;       // components after gains, before xB
    double total;               // B*(box+cls+dfl), the back-propagated scalar
    int n_fg;                   // foreground anchors in the batch
    double target_scores_sum;   // max(sum of target scores, 1)
    int n_over_cap;             // boxes ignored by the max_boxes cap
    int n_images_over_cap;      // images that had more than max_boxes boxes
} LossOut;

typedef struct {
    int H[3], W[3];        // grid size of each level
    int off[3];            // first global anchor index of each level
    float stride[3];       // 8, 16, 32
    int A;                 // anchors in all levels
} LossGrid;

typedef struct { float x1, y1, x2, y2; int cls, valid; } LossGt;   // pixels xyxy; valid = mask_gt
typedef struct { int a; float align, o; } LossCand;                 // one top-k candidate of a gt
typedef struct { int b, a, cls; float score, x1, y1, x2, y2; } LossFg; // foreground anchor, target (pixels)

// what the scratch keeps between calls (for LOSS_REUSE_ASSIGNMENT)
typedef struct { int B, A, max_boxes, n_fg; double tss; } LossKeep;

static LossConfig loss_config_default(void) {
    LossConfig c = {7.5f, 0.5f, 1.5f, 1024};
    return c;
}

// loss_grid_make: level sizes and anchor offsets of an imgH x imgW input (multiples of 32).
static LossGrid loss_grid_make(int imgH, int imgW) {
    if (imgH <= 0 || imgW <= 0 || imgH % 32 || imgW % 32)
        die("loss: image size %dx%d must be positive multiples of 32", imgW, imgH);
    LossGrid g;
    g.A = 0;
    for (int l = 0; l < 3; l++) {
        int s = 8 << l;
        g.stride[l] = (float)s;
        g.H[l] = imgH / s;
        g.W[l] = imgW / s;
        g.off[l] = g.A;
        g.A += g.H[l] * g.W[l];
    }
    return g;
}

static int loss_num_anchors(int imgH, int imgW) { return loss_grid_make(imgH, imgW).A; }

static int loss_fg_cap(int A, int max_boxes) {
    long c = (long)LOSS_TOPK * max_boxes;
    return c < A ? (int)c : A;
}

#define LOSS_ALIGN_UP(x) (((x) + 63) & ~(size_t)63)

// loss_scratch_bytes: exact bytes loss_forward_backward needs for B images of A anchors and at most
// max_boxes (M) boxes per image. Layout (each part 64-byte aligned): keep | pbox (B,A,4) f32 |
// owner (A) i32 | align, o (A) f32 | m (B) i32 | gts (B,M) | cand (B,M,10) | nsel (B,M) i32 |
// max_align, max_iou (M) f32 | fg (B*min(A,10M)). 9.0 MB for B=16, A=8400, M=1024.
static size_t loss_scratch_bytes(int B, int A, int max_boxes) {
    size_t M = (size_t)(max_boxes > 0 ? max_boxes : 1), BM = (size_t)B * M;
    size_t n = 64;   // alignment slack for an unaligned scratch pointer
    n += LOSS_ALIGN_UP(sizeof(LossKeep));
    n += LOSS_ALIGN_UP((size_t)B * A * 4 * sizeof(float));
    n += LOSS_ALIGN_UP((size_t)A * sizeof(int));
    n += 2 * LOSS_ALIGN_UP((size_t)A * sizeof(float));
    n += LOSS_ALIGN_UP((size_t)B * sizeof(int));
    n += LOSS_ALIGN_UP(BM * sizeof(LossGt));
    n += LOSS_ALIGN_UP(BM * LOSS_TOPK * sizeof(LossCand));
    n += LOSS_ALIGN_UP(BM * sizeof(int));
    n += 2 * LOSS_ALIGN_UP(M * sizeof(float));
    n += LOSS_ALIGN_UP((size_t)B * loss_fg_cap(A, (int)M) * sizeof(LossFg));
    return n;
}

typedef struct {
    int B, A, M;
    LossKeep *keep;
    float *pbox;        // (B, A, 4) predicted boxes, pixels xyxy
    int *owner;         // (A) of the image being resolved: -1 background, -2 several gts, else the gt
    float *align, *o;   // (A) metrics of the single claiming gt
    int *m;             // (B) boxes kept per image
    LossGt *gts;        // (B, M)
    LossCand *cand;     // (B, M, 10) selected candidates per gt
    int *nsel;          // (B, M)
    float *max_align, *max_iou;   // (M) per gt of the image being resolved, over its final positives
    LossFg *fg;         // (B*min(A, 10M)) foreground list of the batch
} LossWork;

static void *loss_take(char **p, size_t bytes) {
    void *r = *p;
    *p += LOSS_ALIGN_UP(bytes);
    return r;
}

// loss_work_carve: split the caller's scratch into the LossWork arrays (same layout as loss_scratch_bytes).
static LossWork loss_work_carve(void *scratch, int B, int A, int max_boxes) {
    size_t M = (size_t)max_boxes;
    char *p = (char *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
    LossWork w;
    w.B = B; w.A = A; w.M = max_boxes;
    w.keep = loss_take(&p, sizeof(LossKeep));
    w.pbox = loss_take(&p, (size_t)B * A * 4 * sizeof(float));
    w.owner = loss_take(&p, (size_t)A * sizeof(int));
    w.align = loss_take(&p, (size_t)A * sizeof(float));
    w.o = loss_take(&p, (size_t)A * sizeof(float));
    w.m = loss_take(&p, (size_t)B * sizeof(int));
    w.gts = loss_take(&p, (size_t)B * M * sizeof(LossGt));
    w.cand = loss_take(&p, (size_t)B * M * LOSS_TOPK * sizeof(LossCand));
    w.nsel = loss_take(&p, (size_t)B * M * sizeof(int));
    w.max_align = loss_take(&p, M * sizeof(float));
    w.max_iou = loss_take(&p, M * sizeof(float));
    w.fg = loss_take(&p, (size_t)B * loss_fg_cap(A, max_boxes) * sizeof(LossFg));
    return w;
}

// ------------------------------------------------------------------------------------------
// CIoU and DFL decode (bbox_iou(..., CIoU=True) and bbox_decode of Ultralytics)
// ------------------------------------------------------------------------------------------

// bbox_ciou: complete IoU of xyxy boxes b1, b2 (4 floats each), in the exact operation order of
// Ultralytics bbox_iou(box1, box2, xywh=False, CIoU=True), eps 1e-7, in float.
static float bbox_ciou(const float *b1, const float *b2) {
    const float eps = 1e-7f;
    float w1 = b1[2] - b1[0], h1 = b1[3] - b1[1] + eps;
    float w2 = b2[2] - b2[0], h2 = b2[3] - b2[1] + eps;
    float iw = fmaxf(fminf(b1[2], b2[2]) - fmaxf(b1[0], b2[0]), 0.0f);
    float ih = fmaxf(fminf(b1[3], b2[3]) - fmaxf(b1[1], b2[1]), 0.0f);
    float inter = iw * ih;
    float uni = w1 * h1 + w2 * h2 - inter + eps;
    float iou = inter / uni;
    float cw = fmaxf(b1[2], b2[2]) - fminf(b1[0], b2[0]);
    float ch = fmaxf(b1[3], b2[3]) - fminf(b1[1], b2[1]);
    float c2 = cw * cw + ch * ch + eps;
    float dx = b2[0] + b2[2] - b1[0] - b1[2], dy = b2[1] + b2[3] - b1[1] - b1[3];
    float rho2 = (dx * dx + dy * dy) / 4.0f;
    float dat = atanf(w2 / h2) - atanf(w1 / h1);
    float v = (float)(4.0 / (M_PI * M_PI)) * (dat * dat);
    float alpha = v / (v - iou + (1.0f + eps));
    return iou - (rho2 / c2 + v * alpha);
}

// PyTorch's derivative of minimum/maximum w.r.t. its first argument: 1, 1/2 on ties, 0.
static inline double loss_dmin(float a, float b) { return a < b ? 1.0 : a == b ? 0.5 : 0.0; }
static inline double loss_dmax(float a, float b) { return a > b ? 1.0 : a == b ? 0.5 : 0.0; }

// loss_ciou_alpha_grad: 0 (always, in training) treats CIoU's alpha as a constant like Ultralytics, whose
// gradient is then not the derivative of the forward value; tests set 1 to get the true derivative and
// check the whole chain against finite differences of the forward.
static int loss_ciou_alpha_grad = 0;

// bbox_ciou_backward: d1 (4) = g * dCIoU(b1, b2)/db1 with alpha held constant (Ultralytics computes it
// under no_grad; alpha_grad = 1 differentiates it too) and PyTorch's conventions for clamp (passes at 0)
// and min/max ties (half each).
static void bbox_ciou_backward(const float *b1, const float *b2, double g, int alpha_grad, double *d1) {
    const float eps = 1e-7f;
    float w1 = b1[2] - b1[0], h1 = b1[3] - b1[1] + eps;
    float w2 = b2[2] - b2[0], h2 = b2[3] - b2[1] + eps;
    float iwr = fminf(b1[2], b2[2]) - fmaxf(b1[0], b2[0]), iw = fmaxf(iwr, 0.0f);
    float ihr = fminf(b1[3], b2[3]) - fmaxf(b1[1], b2[1]), ih = fmaxf(ihr, 0.0f);
    float inter = iw * ih;
    float uni = w1 * h1 + w2 * h2 - inter + eps;
    float iou = inter / uni;
    float cw = fmaxf(b1[2], b2[2]) - fminf(b1[0], b2[0]);
    float ch = fmaxf(b1[3], b2[3]) - fminf(b1[1], b2[1]);
    float c2 = cw * cw + ch * ch + eps;
    float dx = b2[0] + b2[2] - b1[0] - b1[2], dy = b2[1] + b2[3] - b1[1] - b1[3];
    float rho2 = (dx * dx + dy * dy) / 4.0f;
    float r1 = w1 / h1;
    float dat = atanf(w2 / h2) - atanf(r1);
    float k = (float)(4.0 / (M_PI * M_PI));
    float v = k * (dat * dat);
    float alpha = v / (v - iou + (1.0f + eps));
    // ciou = iou - rho2/c2 - v*alpha
    double g_iou = g, g_q = -g, g_v = -g * alpha;
    if (alpha_grad) {   // alpha = v / D, D = v - iou + 1 + eps: d(v*alpha) = (alpha + v/D - v^2/D^2) dv + v^2/D^2 diou
        double D = (double)v - iou + (1.0f + eps), q = (double)v * v / (D * D);
        g_v = -g * (alpha + v / D - q);
        g_iou = g * (1.0 - q);
    }
    double g_inter = g_iou / uni, g_uni = -g_iou * (double)inter / ((double)uni * uni);
    double g_w1 = g_uni * h1, g_h1 = g_uni * w1;
    g_inter -= g_uni;
    double g_iw = iwr >= 0.0f ? g_inter * ih : 0.0, g_ih = ihr >= 0.0f ? g_inter * iw : 0.0;
    double g_rho2 = g_q / c2, g_c2 = -g_q * (double)rho2 / ((double)c2 * c2);
    double g_cw = g_c2 * 2.0 * cw, g_ch = g_c2 * 2.0 * ch;
    double g_dx = g_rho2 * dx / 2.0, g_dy = g_rho2 * dy / 2.0;
    double g_r1 = g_v * k * 2.0 * dat * -1.0 / (1.0 + (double)r1 * r1);
    g_w1 += g_r1 / h1;
    g_h1 -= g_r1 * (double)w1 / ((double)h1 * h1);
    d1[0] = -g_w1 - g_iw * loss_dmax(b1[0], b2[0]) - g_cw * loss_dmin(b1[0], b2[0]) - g_dx;
    d1[2] = g_w1 + g_iw * loss_dmin(b1[2], b2[2]) + g_cw * loss_dmax(b1[2], b2[2]) - g_dx;
    d1[1] = -g_h1 - g_ih * loss_dmax(b1[1], b2[1]) - g_ch * loss_dmin(b1[1], b2[1]) - g_dy;
    d1[3] = g_h1 + g_ih * loss_dmin(b1[3], b2[3]) + g_ch * loss_dmax(b1[3], b2[3]) - g_dy;
}

// dfl_side_decode: softmax over the 16 bins of one side, logits z[k*step], k = 0..15. Returns the
// expected distance sum_k k*p_k (grid units); p (16) receives the probabilities and *lse the log-sum-exp
// (for the DFL cross-entropy). Matches bbox_decode (softmax, matmul with arange(16)).
static inline float dfl_side_decode(const float *z, size_t step, float *p, float *lse) {
    float m = z[0];
    for (int k = 1; k < LOSS_R; k++) m = fmaxf(m, z[k * step]);
    float sum = 0.0f;
    for (int k = 0; k < LOSS_R; k++) { p[k] = expf(z[k * step] - m); sum += p[k]; }
    float d = 0.0f;
    for (int k = 0; k < LOSS_R; k++) { p[k] = p[k] / sum; d += (float)k * p[k]; }
    *lse = m + logf(sum);
    return d;
}

// loss_decode_box: predicted box (4) of anchor r (row-major index in level l) of image b, xyxy in grid
// units (anchor -/+ ltrb). p (4, 16) and lse (4) get the softmax and log-sum-exp of every side.
static void loss_decode_box(const LossGrid *g, int NC, const float *const head[3], int b, int l, int r,
                            float *box, float *p, float *lse) {
    size_t HW = (size_t)g->H[l] * g->W[l];
    const float *z = head[l] + (size_t)b * (64 + NC) * HW + r;   // (64+NC, H, W) of image b, at anchor r
    float ax = (float)(r % g->W[l]) + 0.5f, ay = (float)(r / g->W[l]) + 0.5f;
    float d[4];
    for (int s = 0; s < 4; s++) d[s] = dfl_side_decode(z + (size_t)s * LOSS_R * HW, HW, p + s * LOSS_R, lse + s);
    box[0] = ax - d[0]; box[1] = ay - d[1]; box[2] = ax + d[2]; box[3] = ay + d[3];
}

static inline int loss_anchor_level(const LossGrid *g, int a) { return a >= g->off[2] ? 2 : a >= g->off[1] ? 1 : 0; }

// ------------------------------------------------------------------------------------------
// task-aligned assigner, one image at a time (TaskAlignedAssigner, topk 10, alpha 0.5, beta 6)
// ------------------------------------------------------------------------------------------

// tal_metric: the assigner's metrics of gt against predicted box pb (pixels) at anchor centre (ax, ay)
// (pixels) with class logit `logit`. Returns 1 with o = max(CIoU(gt, pb), 0) and align = s^0.5 * o^6
// (s = sigmoid(logit)) when the centre is strictly inside the gt (select_candidates_in_gts, eps 1e-9)
// and mask_gt holds; returns 0 (metrics 0) otherwise. Matches get_box_metrics.
static inline int tal_metric(const LossGt *gt, float ax, float ay, const float *pb, float logit,
                             float *o, float *align) {
    float dmin = fminf(fminf(ax - gt->x1, ay - gt->y1), fminf(gt->x2 - ax, gt->y2 - ay));
    *o = 0.0f;
    *align = 0.0f;
    if (!gt->valid || !(dmin > 1e-9f)) return 0;
    float gb[4] = {gt->x1, gt->y1, gt->x2, gt->y2};
    float ov = fmaxf(bbox_ciou(gb, pb), 0.0f);
    float s = 1.0f / (1.0f + expf(-logit));
    *o = ov;
    *align = sqrtf(s) * powf(ov, 6.0f);
    return 1;
}

// tal_topk_gt: the candidates (mask_pos row) of one gt: top-10 align over all A anchors (CUDA torch.topk
// tie order, see DEVIATIONS), ANDed with the in-box mask. Visits only the anchor rectangle of the box on
// each level. cls_plane[l] points at the (H_l, W_l) logit plane of this gt's class in this image, pbox
// (A, 4) pixels. Writes up to 10 candidates to out, returns their count. Matches select_topk_candidates.
static int tal_topk_gt(const LossGrid *g, const LossGt *gt, const float *pbox, const float *const cls_plane[3],
                       LossCand *out) {
    if (!gt->valid) return 0;
    LossCand pos[LOSS_TOPK], zero[LOSS_TOPK];
    int npos = 0, nzero = 0;
    long npos_total = 0;
    for (int l = 0; l < 3; l++) {
        float s = g->stride[l];
        int x0 = (int)floorf(gt->x1 / s - 0.5f) - 1, x1 = (int)ceilf(gt->x2 / s - 0.5f) + 1;
        int y0 = (int)floorf(gt->y1 / s - 0.5f) - 1, y1 = (int)ceilf(gt->y2 / s - 0.5f) + 1;
        if (x0 < 0) x0 = 0;
        if (y0 < 0) y0 = 0;
        if (x1 > g->W[l] - 1) x1 = g->W[l] - 1;
        if (y1 > g->H[l] - 1) y1 = g->H[l] - 1;
        for (int y = y0; y <= y1; y++)
            for (int x = x0; x <= x1; x++) {
                int r = y * g->W[l] + x, a = g->off[l] + r;
                float o, al;
                if (!tal_metric(gt, ((float)x + 0.5f) * s, ((float)y + 0.5f) * s, pbox + (size_t)a * 4,
                                cls_plane[l][r], &o, &al))
                    continue;
                LossCand c = {a, al, o};
                if (al > 0.0f) {
                    npos_total++;
                    // sorted by align descending; equal align keeps the lower (earlier) anchor first
                    if (npos == LOSS_TOPK && !(al > pos[LOSS_TOPK - 1].align)) continue;
                    int i = npos < LOSS_TOPK ? npos++ : LOSS_TOPK - 1;
                    while (i > 0 && al > pos[i - 1].align) { pos[i] = pos[i - 1]; i--; }
                    pos[i] = c;
                } else if (nzero < LOSS_TOPK) {
                    zero[nzero++] = c;   // anchors come in increasing index: the first zeros are the lowest
                }
            }
    }
    int n = 0;
    for (int i = 0; i < npos; i++) out[n++] = pos[i];
    if (npos_total < LOSS_TOPK) {
        // topk fills the remaining slots with the lowest-index anchors of align 0 over all A anchors;
        // an inside zero at index a is preceded by a - (positives before a) zero-align anchors.
        int need = LOSS_TOPK - (int)npos_total;
        for (int i = 0; i < nzero; i++) {
            int before = 0;
            for (int j = 0; j < npos; j++) before += pos[j].a < zero[i].a;
            if (zero[i].a - before >= need) break;
            out[n++] = zero[i];
        }
    }
    return n;
}

// tal_decode_batch: predicted boxes (B, A, 4) in pixels of every anchor of every image that has boxes
// (pred_bboxes.detach() * stride_tensor).
static void tal_decode_batch(const LossGrid *g, int NC, const float *const head[3], int B, const int *m, float *pbox) {
    long n = (long)B * g->A;
    #pragma omp parallel for schedule(static)
    for (long i = 0; i < n; i++) {
        int b = (int)(i / g->A), a = (int)(i % g->A);
        if (m[b] == 0) continue;
        int l = loss_anchor_level(g, a);
        float p[4 * LOSS_R], lse[4], box[4];
        loss_decode_box(g, NC, head, b, l, a - g->off[l], box, p, lse);
        for (int k = 0; k < 4; k++) pbox[i * 4 + k] = box[k] * g->stride[l];
    }
}

// tal_topk_batch: tal_topk_gt for every gt of every image, in parallel over all gts of the batch.
// gts (B, M) with m (B) used per image; writes cand (B, M, 10) and nsel (B, M).
static void tal_topk_batch(const LossGrid *g, int NC, const float *const head[3], int B, int M, const int *m,
                           const LossGt *gts, const float *pbox, LossCand *cand, int *nsel) {
    long n = (long)B * M;
    #pragma omp parallel for schedule(dynamic, 1)
    for (long i = 0; i < n; i++) {
        int b = (int)(i / M), j = (int)(i % M);
        if (j >= m[b]) continue;
        const float *planes[3];
        for (int l = 0; l < 3; l++) {
            size_t HW = (size_t)g->H[l] * g->W[l];
            planes[l] = head[l] + ((size_t)b * (64 + NC) + 64 + gts[i].cls) * HW;
        }
        nsel[i] = tal_topk_gt(g, &gts[i], pbox + (size_t)b * g->A * 4, planes, cand + i * LOSS_TOPK);
    }
}

// tal_resolve_image: the rest of the assignment of image b once its gts (m, pixels) have their top-k
// candidates (cand (m, 10), nsel (m)) and pbox (A, 4) is decoded: one gt per anchor by the largest overlap
// over all gts (select_highest_overlaps; first max on ties), normalised soft targets
// (align * max_iou_j / (max_align_j + 1e-9)). Appends the foreground anchors, in anchor order, to fg and
// returns their count. Matches TaskAlignedAssigner._forward after get_pos_mask, and get_targets.
static int tal_resolve_image(const LossGrid *g, int NC, const float *const head[3], int b, const LossGt *gts,
                             int m, const LossCand *cand, const int *nsel, const float *pbox, LossWork *w,
                             LossFg *fg) {
    int A = g->A;
    if (m == 0) return 0;
    for (int a = 0; a < A; a++) w->owner[a] = -1;
    // claims; an anchor claimed twice is resolved below
    for (int j = 0; j < m; j++)
        for (int i = 0; i < nsel[j]; i++) {
            const LossCand *c = &cand[(size_t)j * LOSS_TOPK + i];
            if (w->owner[c->a] == -1) {
                w->owner[c->a] = j;
                w->align[c->a] = c->align;
                w->o[c->a] = c->o;
            } else {
                w->owner[c->a] = -2;
            }
        }
    for (int j = 0; j < m; j++) w->max_align[j] = w->max_iou[j] = 0.0f;
    for (int a = 0; a < A; a++) {
        if (w->owner[a] == -1) continue;
        if (w->owner[a] == -2) {
            // argmax over all gts of the overlap column (0 where the anchor is outside the gt)
            int l = loss_anchor_level(g, a), r = a - g->off[l];
            float s = g->stride[l], ax = ((float)(r % g->W[l]) + 0.5f) * s, ay = ((float)(r / g->W[l]) + 0.5f) * s;
            size_t HW = (size_t)g->H[l] * g->W[l];
            const float *zc = head[l] + ((size_t)b * (64 + NC) + 64) * HW + r;   // class logits at anchor, stride HW
            int best = 0;
            float best_o = -1.0f, best_al = 0.0f;
            for (int j = 0; j < m; j++) {
                float o, al;
                tal_metric(&gts[j], ax, ay, pbox + (size_t)a * 4, zc[(size_t)gts[j].cls * HW], &o, &al);
                if (o > best_o) { best_o = o; best = j; best_al = al; }
            }
            w->owner[a] = best;
            w->align[a] = best_al;
            w->o[a] = best_o;
        }
        int j = w->owner[a];
        if (w->align[a] > w->max_align[j]) w->max_align[j] = w->align[a];
        if (w->o[a] > w->max_iou[j]) w->max_iou[j] = w->o[a];
    }
    int n = 0;
    for (int a = 0; a < A; a++) {
        int j = w->owner[a];
        if (j < 0) continue;
        LossFg f = {b, a, gts[j].cls, w->align[a] * w->max_iou[j] / (w->max_align[j] + 1e-9f),
                    gts[j].x1, gts[j].y1, gts[j].x2, gts[j].y2};
        fg[n++] = f;
    }
    return n;
}

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

// loss_gather_gts: the boxes of image b in input order, pixels xyxy (preprocess + xywh2xyxy of Ultralytics:
// scale by (W, H, W, H), then centre -/+ half size), at most max_boxes; returns how many the image has.
static int loss_gather_gts(const LossTargets *tg, int b, int NC, int imgH, int imgW, int max_boxes, LossGt *gts) {
    int m = 0;
    for (int i = 0; i < tg->n; i++) {
        if (tg->batch_idx[i] != b) continue;
        if (tg->cls[i] < 0 || tg->cls[i] >= NC) die("loss: box %d has class %d, outside [0, %d)", i, tg->cls[i], NC);
        if (m < max_boxes) {
            const float *bx = tg->box + (size_t)i * 4;
            float cx = bx[0] * (float)imgW, cy = bx[1] * (float)imgH;
            float hw = bx[2] * (float)imgW / 2.0f, hh = bx[3] * (float)imgH / 2.0f;
            LossGt *q = &gts[m];
            q->x1 = cx - hw; q->y1 = cy - hh; q->x2 = cx + hw; q->y2 = cy + hh;
            q->cls = tg->cls[i];
            q->valid = ((q->x1 + q->y1) + q->x2) + q->y2 > 0.0f;
        }
        m++;
    }
    return m;
}

// ------------------------------------------------------------------------------------------
// loss forward + backward (v8DetectionLoss.__call__, BboxLoss, DFLoss)
// ------------------------------------------------------------------------------------------

// loss_fg_term: box (1 - CIoU) and DFL terms of one foreground anchor, unweighted; when dhead is not NULL
// also writes into dhead the gradient gb * d(1-CIoU) + gd * d(DFL) w.r.t. the anchor's 64 box logits.
static void loss_fg_term(const LossGrid *g, int NC, const float *const head[3], float *const dhead[3],
                         const LossFg *f, double gb, double gd, double *box_term, double *dfl_term) {
    int l = loss_anchor_level(g, f->a), r = f->a - g->off[l];
    size_t HW = (size_t)g->H[l] * g->W[l];
    float s = g->stride[l];
    float p[4 * LOSS_R], lse[4], pb[4];
    loss_decode_box(g, NC, head, f->b, l, r, pb, p, lse);
    float tb[4] = {f->x1 / s, f->y1 / s, f->x2 / s, f->y2 / s};   // target_bboxes /= stride_tensor
    *box_term = 1.0 - (double)bbox_ciou(pb, tb);
    // DFL: bbox2dist then DFLoss, targets clamped to [0, 14.99]
    float ax = (float)(r % g->W[l]) + 0.5f, ay = (float)(r / g->W[l]) + 0.5f;
    float t[4] = {ax - tb[0], ay - tb[1], tb[2] - ax, tb[3] - ay};
    const float *z = head[l] + (size_t)f->b * (64 + NC) * HW + r;
    double dfl = 0.0;
    int tl[4];
    float wl[4], wr[4];
    for (int k = 0; k < 4; k++) {
        float tk = fminf(fmaxf(t[k], 0.0f), (float)(LOSS_R - 1 - 0.01));
        tl[k] = (int)tk;
        wl[k] = (float)(tl[k] + 1) - tk;
        wr[k] = 1.0f - wl[k];
        const float *zk = z + (size_t)k * LOSS_R * HW;
        float ce_l = lse[k] - zk[(size_t)tl[k] * HW], ce_r = lse[k] - zk[(size_t)(tl[k] + 1) * HW];
        dfl += (double)(ce_l * wl[k] + ce_r * wr[k]);
    }
    *dfl_term = dfl / 4.0;
    if (!dhead) return;
    double db[4], dd[4];
    bbox_ciou_backward(pb, tb, -gb, loss_ciou_alpha_grad, db);
    dd[0] = -db[0]; dd[1] = -db[1]; dd[2] = db[2]; dd[3] = db[3];   // x1 = ax - l, x2 = ax + r
    float *dz = dhead[l] + (size_t)f->b * (64 + NC) * HW + r;
    for (int k = 0; k < 4; k++) {
        const float *pk = p + k * LOSS_R;
        double dist = 0.0;
        for (int i = 0; i < LOSS_R; i++) dist += (double)i * pk[i];
        for (int i = 0; i < LOSS_R; i++) {
            double gz = dd[k] * pk[i] * (i - dist);                    // through the expectation
            double tgt = (i == tl[k] ? wl[k] : 0.0) + (i == tl[k] + 1 ? wr[k] : 0.0);
            gz += gd / 4.0 * ((double)pk[i] * ((double)wl[k] + wr[k]) - tgt);   // through the CE
            dz[(size_t)(k * LOSS_R + i) * HW] = (float)gz;
        }
    }
}

static int loss_cap_warned;

// loss_forward_backward: the YOLOv8 detection loss of a batch and (dhead != NULL) its gradient, see the
// comment at the top of this section for shapes and semantics. Matches v8DetectionLoss.__call__.
static LossOut loss_forward_backward(const LossConfig *cfg, int B, int NC, int imgH, int imgW,
                                     const float *const head[3], float *const dhead[3], const LossTargets *tg,
                                     float grad_scale, void *scratch, size_t scratch_bytes, int flags) {
    LossGrid g = loss_grid_make(imgH, imgW);
    int A = g.A, M = cfg->max_boxes;
    if (M <= 0) die("loss: max_boxes=%d must be positive", M);
    if (scratch_bytes < loss_scratch_bytes(B, A, M))
        die("loss: scratch of %zu bytes, need loss_scratch_bytes(B=%d, A=%d, max_boxes=%d) = %zu", scratch_bytes, B,
            A, M, loss_scratch_bytes(B, A, M));
    LossWork w = loss_work_carve(scratch, B, A, M);
    int want_grad = dhead && dhead[0] && dhead[1] && dhead[2];
    LossOut out;
    memset(&out, 0, sizeof out);

    // 1. assignment (decode and per-gt top-k for the whole batch, then overlaps resolved image by image);
    //    target_scores_sum over the whole batch
    if (flags & LOSS_REUSE_ASSIGNMENT) {
        if (w.keep->B != B || w.keep->A != A || w.keep->max_boxes != M)
            die("loss: LOSS_REUSE_ASSIGNMENT with a scratch from a different batch shape");
    } else {
        for (int i = 0; i < tg->n; i++)
            if (tg->batch_idx[i] < 0 || tg->batch_idx[i] >= B)
                die("loss: box %d has batch_idx %d, outside [0, %d)", i, tg->batch_idx[i], B);
        int n_fg = 0, cap = loss_fg_cap(A, M);
        double tss = 0.0;
        for (int b = 0; b < B; b++) {
            int m = loss_gather_gts(tg, b, NC, imgH, imgW, M, w.gts + (size_t)b * M);
            if (m > M) { out.n_over_cap += m - M; out.n_images_over_cap++; m = M; }
            w.m[b] = m;
        }
        tal_decode_batch(&g, NC, head, B, w.m, w.pbox);
        tal_topk_batch(&g, NC, head, B, M, w.m, w.gts, w.pbox, w.cand, w.nsel);
        for (int b = 0; b < B; b++) {
            size_t o = (size_t)b * M;
            int nf = tal_resolve_image(&g, NC, head, b, w.gts + o, w.m[b], w.cand + o * LOSS_TOPK, w.nsel + o,
                                       w.pbox + (size_t)b * A * 4, &w, w.fg + n_fg);
            if (nf > cap) die("loss: internal error, %d foreground anchors in one image (cap %d)", nf, cap);
            for (int i = 0; i < nf; i++) tss += w.fg[n_fg + i].score;
            n_fg += nf;
        }
        w.keep->B = B; w.keep->A = A; w.keep->max_boxes = M;
        w.keep->n_fg = n_fg;
        w.keep->tss = tss > 1.0 ? tss : 1.0;
        if (out.n_over_cap && !loss_cap_warned) {
            loss_cap_warned = 1;
            fprintf(stderr, "warning: %d boxes in %d images were over the max_boxes=%d cap and are ignored by the "
                    "loss (reported once; raise max_boxes to keep them)\n", out.n_over_cap, out.n_images_over_cap, M);
        }
    }
    int n_fg = w.keep->n_fg;
    double tss = w.keep->tss;
    const LossFg *fg = w.fg;

    // 2. classification: BCE over all B*A*NC logits with target 0, then the foreground corrections
    double g_cls = (double)B * cfg->cls * grad_scale / tss;
    float g_clsf = (float)g_cls;
    double bce = 0.0;
    // one pass over every (level, image, channel) plane: BCE on class planes, zero box-logit gradients
    // (background anchors have none; the foreground ones are written in step 3)
    int C = 64 + NC, nplane = 3 * B * C;
    #pragma omp parallel for reduction(+:bce) schedule(dynamic, 4)
    for (int pl = 0; pl < nplane; pl++) {
        int l = pl / (B * C), bc = pl % (B * C), c = bc % C;
        size_t HW = (size_t)g.H[l] * g.W[l];
        float *dx = want_grad ? dhead[l] + (size_t)bc * HW : NULL;   // (H, W)
        if (c < 64) {
            if (dx) memset(dx, 0, HW * sizeof(float));
            continue;
        }
        const float *x = head[l] + (size_t)bc * HW;   // (H, W)
        double acc = 0.0;   // glibc expf/log1pf; a branch-free polynomial version measured slower here
        for (size_t i = 0; i < HW; i++) {
            float e = expf(-fabsf(x[i]));
            acc += (double)(fmaxf(x[i], 0.0f) + log1pf(e));
            if (dx) dx[i] = g_clsf * ((x[i] >= 0.0f ? 1.0f : e) / (1.0f + e));   // sigmoid(x)
        }
        bce += acc;
    }
    for (int i = 0; i < n_fg; i++) {
        const LossFg *f = &fg[i];
        int l = loss_anchor_level(&g, f->a), r = f->a - g.off[l];
        size_t HW = (size_t)g.H[l] * g.W[l], at = ((size_t)f->b * (64 + NC) + 64 + f->cls) * HW + r;
        float x = head[l][at];
        bce -= (double)x * f->score;
        if (want_grad) dhead[l][at] = (float)(g_cls * (1.0 / (1.0 + exp(-(double)x)) - f->score));
    }

    // 3. box and DFL over the foreground anchors
    double box_sum = 0.0, dfl_sum = 0.0;
    double kb = (double)B * cfg->box * grad_scale / tss, kd = (double)B * cfg->dfl * grad_scale / tss;
    #pragma omp parallel for reduction(+:box_sum, dfl_sum) schedule(dynamic, 16)
    for (int i = 0; i < n_fg; i++) {
        double bt, dt, wa = fg[i].score;
        loss_fg_term(&g, NC, head, want_grad ? dhead : NULL, &fg[i], kb * wa, kd * wa, &bt, &dt);
        box_sum += bt * wa;
        dfl_sum += dt * wa;
    }

    out.box = cfg->box * box_sum / tss;
    out.cls = cfg->cls * bce / tss;
    out.dfl = cfg->dfl * dfl_sum / tss;
    out.total = B * (out.box + out.cls + out.dfl);
    out.n_fg = n_fg;
    out.target_scores_sum = tss;
    return out;
}
