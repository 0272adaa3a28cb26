// ------------------------------------------------------------------------------------------
// evaluation: head decode, NMS, matching, mAP (spec sections 1.3 "Inference decode" and 5)
// ------------------------------------------------------------------------------------------
//
// Public API (all static; shapes use B, NC, A, R = 16 DFL bins):
//
//   Det                     one detection: x1, y1, x2, y2 (input pixels), score, cls
//   head_anchor_count(imgH, imgW)                     -> A = sum over strides 8/16/32 of H_i*W_i
//   head_decode(maps, B, NC, imgH, imgW, out)         raw maps[3] (B, 64+NC, H_i, W_i) ->
//                                                     out (B, 4+NC, A): [cx, cy, w, h]*stride and
//                                                     sigmoid scores, exactly Ultralytics' eval output
//   NmsConfig nms_config_val() / nms_config_predict() conf 0.001 / 0.25, iou 0.7, max_det 300,
//                                                     max_nms 30000, multi_label 1 / 0, agnostic 0
//   nms_init(&nms, cfg, NC, A) / nms_free(&nms)       one allocation of every work buffer
//   nms_run_maps(&nms, maps, b, imgH, imgW, out)      NMS of image b straight from the raw maps
//                                                     (only candidate anchors are decoded);
//                                                     out must hold cfg.max_det Dets; returns count
//   nms_run_decoded(&nms, pred, out)                  the same from one image of head_decode's output,
//                                                     pred (4+NC, A)
//   evaluator_init(&ev, NC) / evaluator_reset / evaluator_free
//   evaluator_add_image(&ev, dets, n, gt_box, gt_cls, M)   match one image (gt_box (M, 4) xyxy, same
//                                                     pixel space as the dets) and store per-detection
//                                                     (conf, cls, tp[10]) and per-label class
//   evaluator_compute(&ev, &metrics)                  ap_per_class: P, R, mAP50, mAP50-95, per-class AP;
//                                                     fitness = mAP50-95; metrics_free(&metrics)
//                                                     releases its per-class arrays
//
// Matching follows match_predictions literally, which is not a pure greedy-by-IoU matching
// (the spec's summary): each detection takes its best-IoU label, then each label goes to the
// lowest-index (highest-confidence) detection that chose it; other detections are FP at that
// threshold even when a second-best label was free. Perfect detections score AP 0.995, not 1
// (the (1, 0) sentinel of compute_ap is hit by the last of the 101 points).
//
// Output order of both NMS paths: descending score; equal scores keep candidate order, which
// is anchor-major then class (torch.where order), as a stable sort gives. The max_nms cut keeps
// the max_nms first candidates in that same order (quickselect, then a sort of those only).
// An Nms is scratch for one image at a time: use one per thread.
//
// DEVIATIONS from Ultralytics in this section:
//  - All sorts are stable. Ultralytics sorts with np.argsort (quicksort, unstable) in
//    ap_per_class and match_predictions and with torch argsort for max_nms; results differ only
//    when two confidences (or two IoUs of one detection) are exactly equal.
//    Tie rules we implement: ap_per_class keeps image order then NMS order for equal
//    confidences; in matching a detection with two labels at exactly the same IoU takes the
//    label with the larger index (what a stable argsort followed by [::-1] gives).
//  - NMS stops as soon as max_det boxes are kept. Greedy NMS decides box k only from boxes
//    kept before it, so the first max_det kept boxes are the same as Ultralytics' full NMS
//    followed by [:max_det].
//  - No NMS time limit (Ultralytics only warns and stops early on slow hardware).
//  - Softmax/DFL sums and sigmoid are plain float loops; PyTorch's vectorised kernels may
//    differ in the last bit.
//
#include <stdint.h>

#define EVAL_NIOU 10          // IoU thresholds 0.50:0.05:0.95
#define EVAL_NGRID 1000       // confidence grid of the P/R/F1 curves
#define NMS_MAX_WH 7680.0f    // class offset of class-aware NMS (Ultralytics max_wh)

// IoU thresholds: torch.linspace(0.5, 0.95, 10) in float32 equals the nearest floats below.
static const float eval_iouv[EVAL_NIOU] = {0.50f, 0.55f, 0.60f, 0.65f, 0.70f,
                                          0.75f, 0.80f, 0.85f, 0.90f, 0.95f};
static const int head_strides[3] = {8, 16, 32};

typedef struct {
    float x1, y1, x2, y2;     // box corners in network-input pixels
    float score;              // class probability (sigmoid)
    int cls;                  // class index in [0, NC)
} Det;

// ------------------------------------------------------------------------------------------
// stable sorting and numpy-compatible helpers
// ------------------------------------------------------------------------------------------

// idx_before: the total order every sort here uses: higher key first, equal keys by lower
// index. For an identity start this is what a stable descending sort gives.
static inline int idx_before(const float *key, int32_t a, int32_t b) {
    return key[a] > key[b] || (key[a] == key[b] && a < b);
}

// sort_desc_stable: reorder idx[0..n) by idx_before (bottom-up merge sort, tmp holds n ints).
// With idx = 0..n-1 on entry this is np.argsort(-key, kind="stable"); it stands in for
// np.argsort(-x) and torch sort(descending=True), see DEVIATIONS.
static void sort_desc_stable(int32_t *idx, int32_t *tmp, int64_t n, const float *key) {
    int32_t *src = idx, *dst = tmp;
    for (int64_t width = 1; width < n; width *= 2) {
        for (int64_t lo = 0; lo < n; lo += 2 * width) {
            int64_t mid = lo + width < n ? lo + width : n;
            int64_t hi = lo + 2 * width < n ? lo + 2 * width : n;
            int64_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi) dst[k++] = idx_before(key, src[j], src[i]) ? src[j++] : src[i++];
            while (i < mid) dst[k++] = src[i++];
            while (j < hi) dst[k++] = src[j++];
        }
        int32_t *t = src; src = dst; dst = t;
    }
    if (src != idx) memcpy(idx, src, (size_t)n * sizeof *idx);
}

// select_top: quickselect so that idx[0..k) holds the first k of idx[0..n) under idx_before
// (in no particular order). O(n); lets NMS sort only max_nms of up to A*NC candidates.
static void select_top(int32_t *idx, int64_t n, int64_t k, const float *key) {
    int64_t lo = 0, hi = n - 1;
    while (lo < hi) {
        int32_t a = idx[lo], b = idx[lo + (hi - lo) / 2], c = idx[hi], pivot;   // median of three
        if (idx_before(key, a, b)) pivot = idx_before(key, b, c) ? b : idx_before(key, a, c) ? c : a;
        else pivot = idx_before(key, a, c) ? a : idx_before(key, b, c) ? c : b;
        int64_t i = lo, j = hi;
        while (i <= j) {
            while (idx_before(key, idx[i], pivot)) i++;
            while (idx_before(key, pivot, idx[j])) j--;
            if (i <= j) { int32_t t = idx[i]; idx[i] = idx[j]; idx[j] = t; i++; j--; }
        }
        if (k - 1 <= j) hi = j;
        else if (k - 1 >= i) lo = i;
        else break;
    }
}

// np_interp: numpy.interp(x, xp, fp, left, right) for one query, xp non-decreasing (n >= 1).
// Picks j = last index with xp[j] <= x and interpolates to j+1 exactly as numpy's C loop does
// (including x == xp[n-1] -> fp[n-1], which gives the (1, 0) end of compute_ap its weight).
static double np_interp(double x, const double *xp, const double *fp, int64_t n, double left, double right) {
    if (x > xp[n - 1]) return right;
    if (x < xp[0]) return left;
    if (x == xp[n - 1]) return fp[n - 1];
    int64_t lo = 0, hi = n - 1;               // invariant: xp[lo] <= x < xp[hi]
    while (hi - lo > 1) {
        int64_t mid = (lo + hi) / 2;
        if (xp[mid] <= x) lo = mid; else hi = mid;
    }
    int64_t j = lo;
    if (xp[j] == x) return fp[j];
    double slope = (fp[j + 1] - fp[j]) / (xp[j + 1] - xp[j]);
    double y = slope * (x - xp[j]) + fp[j];
    if (isnan(y)) {
        y = slope * (x - xp[j + 1]) + fp[j + 1];
        if (isnan(y) && fp[j] == fp[j + 1]) y = fp[j];
    }
    return y;
}

// sigmoid_f: torch.sigmoid in float32.
static inline float sigmoid_f(float x) { return 1.0f / (1.0f + expf(-x)); }

// ------------------------------------------------------------------------------------------
// head decode (Detect inference path: DFL, dist2bbox, strides, sigmoid)
// ------------------------------------------------------------------------------------------

// head_anchor_count: A for an input of imgH x imgW (both multiples of 32), levels P3, P4, P5.
static int head_anchor_count(int imgH, int imgW) {
    if (imgH <= 0 || imgW <= 0 || imgH % 32 || imgW % 32)
        die("head decode: image size %dx%d must be positive multiples of 32", imgH, imgW);
    int A = 0;
    for (int l = 0; l < 3; l++) A += (imgH / head_strides[l]) * (imgW / head_strides[l]);
    return A;
}

// anchor_decode_xywh: DFL expectation of the 4 sides at one pixel of one level, then
// Ultralytics dist2bbox(xywh=True) times the stride. map points at this image's
// (64+NC, H, W) block, HW = H*W, pix = y*W + x. Matches DFL.forward + Detect._inference.
static void anchor_decode_xywh(const float *map, int HW, int pix, int x, int y, float stride, float xywh[4]) {
    float dist[4];                            // l, t, r, b in grid units
    for (int side = 0; side < 4; side++) {
        const float *lg = map + (size_t)side * 16 * HW + pix;   // 16 bins, channel stride HW
        float mx = lg[0];
        for (int k = 1; k < 16; k++) mx = lg[(size_t)k * HW] > mx ? lg[(size_t)k * HW] : mx;
        float e[16], sum = 0.0f;
        for (int k = 0; k < 16; k++) { e[k] = expf(lg[(size_t)k * HW] - mx); sum += e[k]; }
        float d = 0.0f;
        for (int k = 0; k < 16; k++) d += (e[k] / sum) * (float)k;
        dist[side] = d;
    }
    float ax = (float)x + 0.5f, ay = (float)y + 0.5f;
    float x1 = ax - dist[0], y1 = ay - dist[1], x2 = ax + dist[2], y2 = ay + dist[3];
    xywh[0] = (x1 + x2) / 2.0f * stride;
    xywh[1] = (y1 + y2) / 2.0f * stride;
    xywh[2] = (x2 - x1) * stride;
    xywh[3] = (y2 - y1) * stride;
}

// head_decode: the tensor Ultralytics' Detect returns in eval mode.
// maps[l]: (B, 64+NC, H_l, W_l) raw head outputs for strides 8, 16, 32 (H_l = imgH/stride).
// out: (B, 4+NC, A), rows cx, cy, w, h (input pixels) then NC sigmoid scores; anchors in level
// order, row-major within a level.
static void head_decode(const float *const maps[3], int B, int NC, int imgH, int imgW, float *out) {
    int A = head_anchor_count(imgH, imgW), C = 64 + NC;
    #pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++)
        for (int l = 0; l < 3; l++) {
            int H = imgH / head_strides[l], W = imgW / head_strides[l], HW = H * W, a0 = 0;
            for (int q = 0; q < l; q++) a0 += (imgH / head_strides[q]) * (imgW / head_strides[q]);
            const float *map = maps[l] + (size_t)b * C * HW;              // (64+NC, H, W)
            float *o = out + (size_t)b * (4 + NC) * A;                     // (4+NC, A)
            for (int pix = 0; pix < HW; pix++) {
                float xywh[4];
                anchor_decode_xywh(map, HW, pix, pix % W, pix / W, (float)head_strides[l], xywh);
                for (int k = 0; k < 4; k++) o[(size_t)k * A + a0 + pix] = xywh[k];
                for (int c = 0; c < NC; c++)
                    o[(size_t)(4 + c) * A + a0 + pix] = sigmoid_f(map[(size_t)(64 + c) * HW + pix]);
            }
        }
}

// ------------------------------------------------------------------------------------------
// NMS (utils/nms.py non_max_suppression + torchvision.ops.nms), one image at a time
// ------------------------------------------------------------------------------------------

typedef struct {
    float conf;               // candidate threshold on class score: score > conf (0.001 val, 0.25 predict)
    float iou;                // NMS IoU threshold: suppress when IoU > iou (0.7)
    int max_det;              // detections kept per image (300)
    int max_nms;              // candidates entering NMS at most (30000)
    int multi_label;          // 1: every (anchor, class) with score > conf; ignored (0) when NC == 1
    int agnostic;             // 1: one NMS over all classes (single_cls / agnostic_nms)
} NmsConfig;

static NmsConfig nms_config_val(void) { return (NmsConfig){0.001f, 0.7f, 300, 30000, 1, 0}; }
static NmsConfig nms_config_predict(void) { return (NmsConfig){0.25f, 0.7f, 300, 30000, 0, 0}; }

// Nms: every buffer one image needs, allocated once by nms_init for (NC, A).
typedef struct {
    NmsConfig cfg;
    int NC, A;
    int64_t cap;              // candidate capacity: A*NC with multi_label, else A
    int32_t *cand;            // (cap) candidate = anchor*NC + cls
    float *score;             // (cap) candidate score
    int32_t *order, *tmp;     // (cap) sort permutation and merge buffer
    float *box;               // (A, 4) xyxy of candidate anchors (others stale)
    float *kept;              // (max_det, 5) offset box x1, y1, x2, y2 and its area
    float *s;                 // (NC) scores of one anchor (nms_run_maps)
} Nms;

// nms_init: size and allocate the work buffers. Memory = 16*cap + 16*A + 20*max_det bytes
// (A=8400, NC=80: about 11 MB).
static void nms_init(Nms *n, NmsConfig cfg, int NC, int A) {
    if (NC < 1 || A < 1 || cfg.max_det < 1 || cfg.max_nms < 1) die("nms_init: bad NC=%d A=%d max_det=%d max_nms=%d", NC, A, cfg.max_det, cfg.max_nms);
    if (NC == 1) cfg.multi_label = 0;         // Ultralytics: multi_label &= nc > 1
    n->cfg = cfg; n->NC = NC; n->A = A;
    n->cap = cfg.multi_label ? (int64_t)A * NC : A;
    if (n->cap > INT32_MAX) die("nms_init: A*NC = %lld candidates is too many", (long long)n->cap);
    n->cand = xmalloc((size_t)n->cap * sizeof(int32_t));
    n->score = xmalloc((size_t)n->cap * sizeof(float));
    n->order = xmalloc((size_t)n->cap * sizeof(int32_t));
    n->tmp = xmalloc((size_t)n->cap * sizeof(int32_t));
    n->box = xmalloc((size_t)A * 4 * sizeof(float));
    n->kept = xmalloc((size_t)cfg.max_det * 5 * sizeof(float));
    n->s = xmalloc((size_t)NC * sizeof(float));
}

static void nms_free(Nms *n) {
    free(n->cand); free(n->score); free(n->order); free(n->tmp); free(n->box); free(n->kept); free(n->s);
    memset(n, 0, sizeof *n);
}

// nms_store_box: xywh -> xyxy (Ultralytics xywh2xyxy, float32) into the anchor's box slot.
static inline void nms_store_box(Nms *n, int a, const float xywh[4]) {
    float hw = xywh[2] / 2.0f, hh = xywh[3] / 2.0f, *bx = n->box + (size_t)a * 4;
    bx[0] = xywh[0] - hw; bx[1] = xywh[1] - hh; bx[2] = xywh[0] + hw; bx[3] = xywh[1] + hh;
}

// nms_add_anchor: append the candidates of one anchor given its NC scores (stride sstep).
// multi_label: every class with score > conf, in class order; otherwise the first maximal
// class if it beats conf. Returns 1 when the anchor produced a candidate.
static int nms_add_anchor(Nms *n, int64_t *count, int a, const float *s, size_t sstep) {
    int NC = n->NC, any = 0;
    float conf = n->cfg.conf;
    if (n->cfg.multi_label) {
        for (int c = 0; c < NC; c++) {
            float v = s[(size_t)c * sstep];
            if (v > conf) { n->cand[*count] = a * NC + c; n->score[*count] = v; (*count)++; any = 1; }
        }
    } else {
        int best = 0;
        for (int c = 1; c < NC; c++) if (s[(size_t)c * sstep] > s[(size_t)best * sstep]) best = c;
        float v = s[(size_t)best * sstep];
        if (v > conf) { n->cand[*count] = a * NC + best; n->score[*count] = v; (*count)++; any = 1; }
    }
    return any;
}

// nms_finish: sort candidates by score (stable, descending), keep the top max_nms, then greedy
// class-offset NMS with torchvision semantics (IoU in float32 on boxes + cls*7680, suppress
// when IoU > iou), stopping at max_det kept. Writes out (max_det) and returns the count.
static int nms_finish(Nms *n, int64_t count, Det *out) {
    for (int64_t i = 0; i < count; i++) n->order[i] = (int32_t)i;
    if (count > n->cfg.max_nms) {
        select_top(n->order, count, n->cfg.max_nms, n->score);
        count = n->cfg.max_nms;
    }
    sort_desc_stable(n->order, n->tmp, count, n->score);
    int nk = 0, NC = n->NC;
    double thr = n->cfg.iou;                  // torchvision compares float IoU with a double
    for (int64_t r = 0; r < count && nk < n->cfg.max_det; r++) {
        int32_t ci = n->order[r];
        int a = n->cand[ci] / NC, cls = n->cand[ci] % NC;
        const float *bx = n->box + (size_t)a * 4;
        float off = n->cfg.agnostic ? 0.0f : (float)cls * NMS_MAX_WH;
        float x1 = bx[0] + off, y1 = bx[1] + off, x2 = bx[2] + off, y2 = bx[3] + off;
        float area = (x2 - x1) * (y2 - y1);
        int suppressed = 0;
        for (int k = 0; k < nk && !suppressed; k++) {
            const float *kb = n->kept + (size_t)k * 5;
            float xx1 = fmaxf(kb[0], x1), yy1 = fmaxf(kb[1], y1);
            float xx2 = fminf(kb[2], x2), yy2 = fminf(kb[3], y2);
            float w = fmaxf(0.0f, xx2 - xx1), h = fmaxf(0.0f, yy2 - yy1);
            float inter = w * h;
            float ovr = inter / (kb[4] + area - inter);
            if ((double)ovr > thr) suppressed = 1;
        }
        if (suppressed) continue;
        float *kb = n->kept + (size_t)nk * 5;
        kb[0] = x1; kb[1] = y1; kb[2] = x2; kb[3] = y2; kb[4] = area;
        out[nk] = (Det){bx[0], bx[1], bx[2], bx[3], n->score[ci], cls};
        nk++;
    }
    return nk;
}

// nms_run_decoded: non_max_suppression for one image of head_decode's output.
// pred: (4+NC, A) rows cx, cy, w, h, scores. out: (max_det). Returns the number of detections.
static int nms_run_decoded(Nms *n, const float *pred, Det *out) {
    int A = n->A;
    int64_t count = 0;
    for (int a = 0; a < A; a++)
        if (nms_add_anchor(n, &count, a, pred + (size_t)4 * A + a, (size_t)A)) {
            float xywh[4] = {pred[a], pred[(size_t)A + a], pred[(size_t)2 * A + a], pred[(size_t)3 * A + a]};
            nms_store_box(n, a, xywh);
        }
    return nms_finish(n, count, out);
}

// nms_run_maps: the same result as head_decode + nms_run_decoded for image b, computed from the
// raw maps (B, 64+NC, H_l, W_l). Scores are sigmoid'ed only for logits near or above
// logit(conf), and DFL boxes are decoded only for candidate anchors.
static int nms_run_maps(Nms *n, const float *const maps[3], int b, int imgH, int imgW, Det *out) {
    int NC = n->NC, C = 64 + NC;
    if (head_anchor_count(imgH, imgW) != n->A) die("nms_run_maps: %dx%d gives %d anchors, Nms was sized for %d", imgH, imgW, head_anchor_count(imgH, imgW), n->A);
    float conf = n->cfg.conf;
    // sigmoid(x) > conf  <=>  x > log(conf/(1-conf)); the margin covers float rounding.
    float lthr = conf > 0.0f && conf < 1.0f ? logf(conf / (1.0f - conf)) - 1e-3f : -INFINITY;
    float *s = n->s;                          // (NC) one anchor's scores
    int64_t count = 0;
    for (int l = 0, a0 = 0; l < 3; l++) {
        int H = imgH / head_strides[l], W = imgW / head_strides[l], HW = H * W;
        const float *map = maps[l] + (size_t)b * C * HW;                 // (64+NC, H, W)
        for (int pix = 0; pix < HW; pix++) {
            const float *lg = map + (size_t)64 * HW + pix;
            int near = 0;
            for (int c = 0; c < NC; c++) {
                float x = lg[(size_t)c * HW];
                s[c] = x > lthr ? sigmoid_f(x) : 0.0f;
                near |= x > lthr;
            }
            if (!near) continue;
            if (nms_add_anchor(n, &count, a0 + pix, s, 1)) {
                float xywh[4];
                anchor_decode_xywh(map, HW, pix, pix % W, pix / W, (float)head_strides[l], xywh);
                nms_store_box(n, a0 + pix, xywh);
            }
        }
        a0 += HW;
    }
    return nms_finish(n, count, out);
}

// ------------------------------------------------------------------------------------------
// matching and AP (engine/validator.py match_predictions, utils/metrics.py ap_per_class)
// ------------------------------------------------------------------------------------------

// Evaluator: per-detection and per-label records of a whole validation pass.
typedef struct {
    int NC;
    int64_t n, cap;           // detections stored / capacity
    float *conf;              // (cap) detection score
    int32_t *cls;             // (cap) detection class
    uint16_t *tp;             // (cap) bit t set = TP at IoU threshold eval_iouv[t]
    int64_t *n_gt;            // (NC) labels per class
    float *iou;               // (iou_cap) scratch M x N IoU matrix of one image
    int64_t iou_cap;
    int *best, *taken;        // (N) / (M) scratch, grown with the image
    int64_t best_cap, taken_cap;
} Evaluator;

typedef struct {
    double P, R;              // mean over classes with GT, at the max-F1 confidence
    double map50, map;        // mAP at IoU 0.5 and mean over 0.50:0.95
    double fitness;           // = map (Ultralytics 8.3 fitness for best.pt)
    int n_cls;                // classes with >= 1 label (the ones averaged)
    double *ap50, *ap;        // (NC) per-class AP50 and AP50-95; -1 for classes without labels
    double *p, *r;            // (NC) per-class P and R at the max-F1 confidence; -1 without labels
    double conf_best;         // confidence grid value where the smoothed mean F1 peaks
} Metrics;

static void evaluator_init(Evaluator *ev, int NC) {
    memset(ev, 0, sizeof *ev);
    if (NC < 1) die("evaluator_init: NC=%d", NC);
    ev->NC = NC;
    ev->n_gt = xcalloc((size_t)NC, sizeof(int64_t));
}

// evaluator_reset: forget all images (keeps the buffers).
static void evaluator_reset(Evaluator *ev) {
    ev->n = 0;
    memset(ev->n_gt, 0, (size_t)ev->NC * sizeof(int64_t));
}

static void evaluator_free(Evaluator *ev) {
    free(ev->conf); free(ev->cls); free(ev->tp); free(ev->n_gt); free(ev->iou); free(ev->best); free(ev->taken);
    memset(ev, 0, sizeof *ev);
}

// grow_buffer: realloc p to hold need elements of size sz when *cap is short (amortised doubling).
static void *grow_buffer(void *p, int64_t *cap, int64_t need, size_t sz) {
    if (need <= *cap) return p;
    int64_t nc = *cap ? *cap : 256;
    while (nc < need) nc *= 2;
    void *q = realloc(p, (size_t)nc * sz);
    if (!q) die("evaluator: out of host memory growing to %lld elements", (long long)nc);
    *cap = nc;
    return q;
}

// box_iou_f: utils/metrics.py box_iou for one pair, float32 with eps = 1e-7 added last.
static inline float box_iou_f(const float *a, const float *b) {
    float w = fminf(a[2], b[2]) - fmaxf(a[0], b[0]);
    float h = fminf(a[3], b[3]) - fmaxf(a[1], b[1]);
    float inter = fmaxf(w, 0.0f) * fmaxf(h, 0.0f);
    float a1 = (a[2] - a[0]) * (a[3] - a[1]), a2 = (b[2] - b[0]) * (b[3] - b[1]);
    return inter / (a1 + a2 - inter + 1e-7f);
}

// evaluator_add_image: match one image's detections (in NMS order) against its labels.
// dets: (N); gt_box: (M, 4) x1 y1 x2 y2 in the same pixels; gt_cls: (M).
// Per threshold t this reproduces match_predictions exactly: the pairs with IoU >= t sorted by
// IoU descending, np.unique on the detection column (first occurrence = each detection's best
// label; equal IoUs -> larger label index), then np.unique on the label column of that result,
// which np.unique has reordered by detection index: each label goes to the lowest-index
// detection that chose it. Those detections are TP.
static void evaluator_add_image(Evaluator *ev, const Det *dets, int N, const float *gt_box, const int *gt_cls, int M) {
    for (int i = 0; i < M; i++) {
        if (gt_cls[i] < 0 || gt_cls[i] >= ev->NC) die("evaluator: label class %d outside [0, %d)", gt_cls[i], ev->NC);
        ev->n_gt[gt_cls[i]]++;
    }
    if (N == 0) return;
    int64_t cap = ev->cap;                    // the three per-detection arrays grow together
    ev->conf = grow_buffer(ev->conf, &cap, ev->n + N, sizeof(float));
    cap = ev->cap;
    ev->cls = grow_buffer(ev->cls, &cap, ev->n + N, sizeof(int32_t));
    ev->tp = grow_buffer(ev->tp, &ev->cap, ev->n + N, sizeof(uint16_t));
    ev->iou = grow_buffer(ev->iou, &ev->iou_cap, (int64_t)M * N, sizeof(float));  // (M, N)
    ev->best = grow_buffer(ev->best, &ev->best_cap, N, sizeof(int));
    ev->taken = grow_buffer(ev->taken, &ev->taken_cap, M > 0 ? M : 1, sizeof(int));
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            const float db[4] = {dets[j].x1, dets[j].y1, dets[j].x2, dets[j].y2};
            float v = box_iou_f(gt_box + (size_t)i * 4, db);
            ev->iou[(size_t)i * N + j] = gt_cls[i] == dets[j].cls ? v : 0.0f;   // iou * correct_class
        }
    uint16_t *tp = ev->tp + ev->n;
    for (int j = 0; j < N; j++) tp[j] = 0;
    for (int t = 0; t < EVAL_NIOU && M > 0; t++) {
        float thr = eval_iouv[t];
        for (int j = 0; j < N; j++) {
            int bi = -1;
            float bv = 0.0f;
            for (int i = 0; i < M; i++) {
                float v = ev->iou[(size_t)i * N + j];
                if (v >= thr && (bi < 0 || v >= bv)) { bi = i; bv = v; }
            }
            ev->best[j] = bi;
        }
        for (int i = 0; i < M; i++) ev->taken[i] = 0;
        for (int j = 0; j < N; j++) {
            int bi = ev->best[j];
            if (bi >= 0 && !ev->taken[bi]) { ev->taken[bi] = 1; tp[j] |= (uint16_t)(1u << t); }
        }
    }
    for (int j = 0; j < N; j++) {
        if (dets[j].cls < 0 || dets[j].cls >= ev->NC) die("evaluator: detection class %d outside [0, %d)", dets[j].cls, ev->NC);
        ev->conf[ev->n + j] = dets[j].score;
        ev->cls[ev->n + j] = dets[j].cls;
    }
    ev->n += N;
}

// compute_ap: utils/metrics.py compute_ap ("interp" method) for one PR curve of n points.
// mrec, mpre: scratch of n+2 doubles. Sentinels (0, 1) in front and (1, 0) at the end, the
// precision envelope from the right, then the trapezoid of np.interp at linspace(0, 1, 101).
// A perfect curve gives 0.995, not 1: np.interp(1.0) lands on the (1, 0) sentinel.
static double compute_ap(const double *recall, const double *precision, int64_t n, double *mrec, double *mpre) {
    mrec[0] = 0.0; mpre[0] = 1.0;
    for (int64_t i = 0; i < n; i++) { mrec[i + 1] = recall[i]; mpre[i + 1] = precision[i]; }
    mrec[n + 1] = 1.0; mpre[n + 1] = 0.0;
    for (int64_t i = n; i >= 0; i--) mpre[i] = fmax(mpre[i], mpre[i + 1]);
    double ap = 0.0, xprev = 0.0, yprev = 0.0;
    for (int k = 0; k <= 100; k++) {
        double x = k == 100 ? 1.0 : k * (1.0 / 100.0);       // np.linspace(0, 1, 101)
        double y = np_interp(x, mrec, mpre, n + 2, mpre[0], mpre[n + 1]);
        if (k) ap += (x - xprev) * (y + yprev) / 2.0;          // np.trapezoid
        xprev = x; yprev = y;
    }
    return ap;
}

// evaluator_compute: ap_per_class over everything added, plus the Metric means.
// m->ap50, ap, p, r are allocated here (NC each); free them with metrics_free.
static void evaluator_compute(Evaluator *ev, Metrics *m) {
    int NC = ev->NC;
    int64_t n = ev->n;
    memset(m, 0, sizeof *m);
    m->ap50 = xmalloc((size_t)NC * sizeof(double)); m->ap = xmalloc((size_t)NC * sizeof(double));
    m->p = xmalloc((size_t)NC * sizeof(double)); m->r = xmalloc((size_t)NC * sizeof(double));
    for (int c = 0; c < NC; c++) m->ap50[c] = m->ap[c] = m->p[c] = m->r[c] = -1.0;
    int ncls = 0;
    for (int c = 0; c < NC; c++) ncls += ev->n_gt[c] > 0;
    m->n_cls = ncls;
    if (ncls == 0) return;                                   // Ultralytics reports zeros

    int32_t *order = xmalloc((size_t)(n ? n : 1) * sizeof(int32_t));     // (n) sorted detections
    int32_t *tmp = xmalloc((size_t)(n ? n : 1) * sizeof(int32_t));
    for (int64_t i = 0; i < n; i++) order[i] = (int32_t)i;
    sort_desc_stable(order, tmp, n, ev->conf);
    double *rec = xmalloc((size_t)(n + 1) * EVAL_NIOU * sizeof(double));  // (n, 10)
    double *pre = xmalloc((size_t)(n + 1) * EVAL_NIOU * sizeof(double));  // (n, 10)
    double *negc = xmalloc((size_t)(n + 1) * sizeof(double));             // (n) -conf, ascending
    double *col_r = xmalloc((size_t)(n + 1) * sizeof(double)), *col_p = xmalloc((size_t)(n + 1) * sizeof(double));
    double *mrec = xmalloc((size_t)(n + 2) * sizeof(double)), *mpre = xmalloc((size_t)(n + 2) * sizeof(double));
    double *pc = xcalloc((size_t)ncls * EVAL_NGRID, sizeof(double));     // (ncls, 1000) precision curve
    double *rc = xcalloc((size_t)ncls * EVAL_NGRID, sizeof(double));     // (ncls, 1000) recall curve
    double grid[EVAL_NGRID];
    for (int k = 0; k < EVAL_NGRID; k++) grid[k] = k == EVAL_NGRID - 1 ? 1.0 : k * (1.0 / (EVAL_NGRID - 1));

    double sum_ap50 = 0.0, sum_ap = 0.0;
    for (int c = 0, ci = 0; c < NC; c++) {
        if (ev->n_gt[c] == 0) continue;
        int64_t np_ = 0, tpc[EVAL_NIOU] = {0};
        double nl = (double)ev->n_gt[c] + 1e-16;
        for (int64_t q = 0; q < n; q++) {
            int32_t d = order[q];
            if (ev->cls[d] != c) continue;
            for (int t = 0; t < EVAL_NIOU; t++) {
                tpc[t] += (ev->tp[d] >> t) & 1;
                double fpc = (double)(np_ + 1 - tpc[t]);
                rec[np_ * EVAL_NIOU + t] = (double)tpc[t] / nl;
                pre[np_ * EVAL_NIOU + t] = (double)tpc[t] / ((double)tpc[t] + fpc);
            }
            negc[np_] = -(double)ev->conf[d];
            np_++;
        }
        double apc[EVAL_NIOU] = {0};
        if (np_ > 0) {
            for (int t = 0; t < EVAL_NIOU; t++) {
                for (int64_t i = 0; i < np_; i++) { col_r[i] = rec[i * EVAL_NIOU + t]; col_p[i] = pre[i * EVAL_NIOU + t]; }
                apc[t] = compute_ap(col_r, col_p, np_, mrec, mpre);
                if (t == 0)
                    for (int k = 0; k < EVAL_NGRID; k++) {
                        rc[(size_t)ci * EVAL_NGRID + k] = np_interp(-grid[k], negc, col_r, np_, 0.0, col_r[np_ - 1]);
                        pc[(size_t)ci * EVAL_NGRID + k] = np_interp(-grid[k], negc, col_p, np_, 1.0, col_p[np_ - 1]);
                    }
            }
        }
        double s = 0.0;
        for (int t = 0; t < EVAL_NIOU; t++) s += apc[t];
        m->ap50[c] = apc[0]; m->ap[c] = s / EVAL_NIOU;
        sum_ap50 += apc[0]; sum_ap += s / EVAL_NIOU;
        ci++;
    }
    // mean F1 over classes, smoothed (Ultralytics smooth(y, 0.1): box filter of 101 with edge
    // padding of 50 on each side), argmax = first maximum
    double f1m[EVAL_NGRID];
    for (int k = 0; k < EVAL_NGRID; k++) {
        double s = 0.0;
        for (int ci = 0; ci < ncls; ci++) {
            double p = pc[(size_t)ci * EVAL_NGRID + k], r = rc[(size_t)ci * EVAL_NGRID + k];
            s += 2.0 * p * r / (p + r + 1e-16);
        }
        f1m[k] = s / ncls;
    }
    int nf = (int)lround(EVAL_NGRID * 0.1 * 2) / 2 + 1, half = nf / 2, best = 0;
    double bestv = -1.0;
    for (int k = 0; k < EVAL_NGRID; k++) {
        double s = 0.0;
        for (int q = k - half; q <= k + half; q++) s += f1m[q < 0 ? 0 : q >= EVAL_NGRID ? EVAL_NGRID - 1 : q] * (1.0 / nf);
        if (s > bestv) { bestv = s; best = k; }
    }
    double sp = 0.0, sr = 0.0;
    for (int c = 0, ci = 0; c < NC; c++) {
        if (ev->n_gt[c] == 0) continue;
        m->p[c] = pc[(size_t)ci * EVAL_NGRID + best]; m->r[c] = rc[(size_t)ci * EVAL_NGRID + best];
        sp += m->p[c]; sr += m->r[c];
        ci++;
    }
    m->P = sp / ncls; m->R = sr / ncls;
    m->map50 = sum_ap50 / ncls; m->map = sum_ap / ncls; m->fitness = m->map;
    m->conf_best = grid[best];
    free(order); free(tmp); free(rec); free(pre); free(negc); free(col_r); free(col_p);
    free(mrec); free(mpre); free(pc); free(rc);
}

static void metrics_free(Metrics *m) {
    free(m->ap50); free(m->ap); free(m->p); free(m->r);
    m->ap50 = m->ap = m->p = m->r = NULL;
}
