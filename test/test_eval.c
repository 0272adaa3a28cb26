// test_eval.c: head decode, NMS, matching and mAP (the eval section of yolo.c) against hand-computed values,
// an independent brute-force NMS, and the numpy reference fixture of test/ref_map.py.
#define TESTING
#include "../yolo.c"
#include "test.h"
#include "yolo_test.h"

// ------------------------------------------------------------------------------------------
// helpers
// ------------------------------------------------------------------------------------------

// eval_one: metrics of one image (dets in NMS order, labels xyxy) with NC classes.
static Metrics eval_one(int NC, const Det *d, int n, const float *gb, const int *gc, int m) {
    Evaluator ev;
    evaluator_init(&ev, NC);
    evaluator_add_image(&ev, d, n, gb, gc, m);
    Metrics mt;
    evaluator_compute(&ev, &mt);
    evaluator_free(&ev);
    return mt;
}

// set_box: write one anchor's xywh and NC scores into a decoded (4+NC, A) tensor.
static void set_box(float *pred, int NC, int A, int a, float x1, float y1, float x2, float y2, const float *scores) {
    pred[a] = (x1 + x2) / 2; pred[A + a] = (y1 + y2) / 2; pred[2 * A + a] = x2 - x1; pred[3 * A + a] = y2 - y1;
    for (int c = 0; c < NC; c++) pred[(4 + c) * A + a] = scores[c];
}

// naive_nms: Ultralytics' non_max_suppression written the slow obvious way: all (anchor, class) candidates
// (or the max class), stable sort by score, top max_nms, full greedy torchvision NMS over all
// of them on class-offset boxes with a suppressed[] array, then the first max_det.
static int naive_nms(const float *pred, int NC, int A, NmsConfig cfg, Det *out) {
    int multi = cfg.multi_label && NC > 1, cap = A * NC, n = 0;
    Det *c = xmalloc(sizeof(Det) * cap);
    for (int a = 0; a < A; a++) {
        float cx = pred[a], cy = pred[A + a], w = pred[2 * A + a], h = pred[3 * A + a];
        Det box = {cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2, 0, 0};
        int best = 0;
        for (int k = 1; k < NC; k++) if (pred[(4 + k) * A + a] > pred[(4 + best) * A + a]) best = k;
        for (int k = 0; k < NC; k++) {
            float s = pred[(4 + k) * A + a];
            if (!(s > cfg.conf) || (!multi && k != best)) continue;
            box.score = s; box.cls = k; c[n++] = box;
        }
    }
    for (int i = 1; i < n; i++) {                       // insertion sort: stable, descending
        Det t = c[i];
        int j = i - 1;
        while (j >= 0 && c[j].score < t.score) { c[j + 1] = c[j]; j--; }
        c[j + 1] = t;
    }
    if (n > cfg.max_nms) n = cfg.max_nms;
    int *sup = xcalloc(n ? n : 1, sizeof(int)), nk = 0;
    for (int i = 0; i < n; i++) {
        if (sup[i]) continue;
        if (nk < cfg.max_det) out[nk++] = c[i];
        float oi = cfg.agnostic ? 0 : c[i].cls * 7680.0f;
        float ix1 = c[i].x1 + oi, iy1 = c[i].y1 + oi, ix2 = c[i].x2 + oi, iy2 = c[i].y2 + oi;
        float ia = (ix2 - ix1) * (iy2 - iy1);
        for (int j = i + 1; j < n; j++) {
            float oj = cfg.agnostic ? 0 : c[j].cls * 7680.0f;
            float jx1 = c[j].x1 + oj, jy1 = c[j].y1 + oj, jx2 = c[j].x2 + oj, jy2 = c[j].y2 + oj;
            float ja = (jx2 - jx1) * (jy2 - jy1);
            float w = fmaxf(0, fminf(ix2, jx2) - fmaxf(ix1, jx1)), h = fmaxf(0, fminf(iy2, jy2) - fmaxf(iy1, jy1));
            float inter = w * h;
            if ((double)(inter / (ia + ja - inter)) > (double)cfg.iou) sup[j] = 1;
        }
    }
    free(sup); free(c);
    return nk;
}

static int dets_equal(const Det *a, int na, const Det *b, int nb, double tol) {
    if (na != nb) return 0;
    for (int i = 0; i < na; i++)
        if (a[i].cls != b[i].cls || fabs(a[i].score - b[i].score) > tol || fabs(a[i].x1 - b[i].x1) > tol ||
            fabs(a[i].y1 - b[i].y1) > tol || fabs(a[i].x2 - b[i].x2) > tol || fabs(a[i].y2 - b[i].y2) > tol)
            return 0;
    return 1;
}

// ------------------------------------------------------------------------------------------
// metrics on hand-made images
// ------------------------------------------------------------------------------------------

static void test_ap_by_hand(void) {
    // Perfect: 2 labels, 2 exact detections. recall [.5, 1], precision [1, 1]; with sentinels
    // mrec [0,.5,1,1], mpre [1,1,1,0]. np.interp gives 1 at x = 0 .. 0.99 and, at x = 1.0 = the
    // last xp, the last fp = 0. Trapezoid: 99 intervals of 0.01*1 + 0.01*(1+0)/2 = 0.995.
    // P/R: the smoothed F1 peaks where p = r = 1.
    {
        float gb[] = {10, 10, 50, 60, 100, 100, 180, 150};
        int gc[] = {0, 0};
        Det d[] = {{10, 10, 50, 60, 0.9f, 0}, {100, 100, 180, 150, 0.8f, 0}};
        Metrics m = eval_one(1, d, 2, gb, gc, 2);
        check_close("perfect mAP50", m.map50, 0.995, 1e-12);
        check_close("perfect mAP50-95", m.map, 0.995, 1e-12);
        check_close("perfect P", m.P, 1.0, 1e-12);
        check_close("perfect R", m.R, 1.0, 1e-12);
        check(m.n_cls == 1, "perfect: classes averaged %d want 1", m.n_cls);
        metrics_free(&m);
    }
    // All false: 1 label, 1 detection elsewhere. recall [0], precision [0] -> mrec [0,0,1],
    // envelope [1,0,0]; np.interp(0) takes the last xp equal to 0 -> 0, everything after is 0:
    // AP 0. The F1 curve is 0 everywhere, argmax 0 (conf 0 < 0.7): p = last precision 0, r 0.
    {
        float gb[] = {10, 10, 50, 60};
        int gc[] = {0};
        Det d[] = {{300, 300, 340, 350, 0.7f, 0}};
        Metrics m = eval_one(1, d, 1, gb, gc, 1);
        check_close("all-false mAP50", m.map50, 0.0, 1e-12);
        check_close("all-false mAP50-95", m.map, 0.0, 1e-12);
        check_close("all-false P", m.P, 0.0, 1e-12);
        check_close("all-false R", m.R, 0.0, 1e-12);
        metrics_free(&m);
    }
    // Half right: 2 labels, 1 exact detection. recall [.5], precision [1] -> mrec [0,.5,1],
    // mpre [1,1,0]: interp is 1 on [0,.5] and 2-2x on [.5,1]; the trapezoid is exact for
    // piecewise-linear data: 0.5 + 0.25 = 0.75 at every threshold. P 1, R 0.5 (F1 2/3 below 0.9).
    {
        float gb[] = {10, 10, 50, 60, 100, 100, 180, 150};
        int gc[] = {0, 0};
        Det d[] = {{10, 10, 50, 60, 0.9f, 0}};
        Metrics m = eval_one(1, d, 1, gb, gc, 2);
        check_close("half-right mAP50", m.map50, 0.75, 1e-12);
        check_close("half-right mAP50-95", m.map, 0.75, 1e-12);
        check_close("half-right P", m.P, 1.0, 1e-12);
        check_close("half-right R", m.R, 0.5, 1e-12);
        metrics_free(&m);
    }
    // Duplicate: labels A, B; d0 exact on A (0.9), d1 on A with IoU 0.8 (0.8), d2 exact on B (0.7).
    // d1's best label is A, which d0 (lower index) already holds -> FP at every threshold.
    // recall [.5,.5,1], precision [1,.5,2/3] -> mrec [0,.5,.5,1,1], envelope [1,1,2/3,2/3,0].
    // interp: 1 for x < .5; x = .5 hits the last xp equal to .5 -> 2/3; 2/3 up to .99; 0 at 1.
    // AP = .49 + .01*(1+2/3)/2 + .49*2/3 + .01*(2/3)/2 = 497/600.
    {
        float gb[] = {0, 0, 100, 100, 200, 200, 260, 280};
        int gc[] = {0, 0};
        Det d[] = {{0, 0, 100, 100, 0.9f, 0}, {0, 0, 100, 80, 0.8f, 0}, {200, 200, 260, 280, 0.7f, 0}};
        Evaluator ev;
        evaluator_init(&ev, 1);
        evaluator_add_image(&ev, d, 3, gb, gc, 2);
        check(ev.tp[0] == 0x3ff && ev.tp[1] == 0 && ev.tp[2] == 0x3ff,
              "duplicate: tp bits %03x %03x %03x want 3ff 000 3ff", ev.tp[0], ev.tp[1], ev.tp[2]);
        Metrics m;
        evaluator_compute(&ev, &m);
        check_close("duplicate mAP50", m.map50, 497.0 / 600.0, 1e-12);
        check_close("duplicate mAP50-95", m.map, 497.0 / 600.0, 1e-12);
        metrics_free(&m);
        evaluator_free(&ev);
    }
    // Matching is by IoU, then by detection index: label A, dets d0 (IoU 0.6 with A) and d1
    // (IoU 0.9 with A), both class 0. At t = .5 both pick A, A goes to the lower index d0
    // (np.unique after the detection-index reordering), so d1 is FP although its IoU is higher.
    // At t = .65 .. .9 only d1 reaches A -> d1 TP. t = .95: none.
    {
        float gb[] = {0, 0, 100, 100};
        int gc[] = {0};
        Det d[] = {{0, 0, 100, 60, 0.9f, 0}, {0, 0, 100, 90, 0.8f, 0}};
        Evaluator ev;
        evaluator_init(&ev, 1);
        evaluator_add_image(&ev, d, 2, gb, gc, 1);
        // bits: t index 0..9 = .50 .55 .60 .65 .70 .75 .80 .85 .90 .95
        check(ev.tp[0] == 0x007 && ev.tp[1] == 0x1f8, "IoU-then-index matching: tp bits %03x %03x want 007 1f8",
              ev.tp[0], ev.tp[1]);
        evaluator_free(&ev);
    }
    // Equal IoUs: labels A (0,0,10,10) and B (2,0,12,10); d0 (1,0,11,10) has IoU 90/110 with
    // both, d1 sits exactly on A. numpy: nonzero gives (A,d0) (A,d1) (B,d0) with IoUs .818 1
    // .818; stable argsort + [::-1] -> (A,d1) (B,d0) (A,d0); unique over detections keeps
    // d0 -> B, d1 -> A: both TP at t <= .8 (0.818 >= .8, < .85); d1 alone from .85 on.
    {
        float gb[] = {0, 0, 10, 10, 2, 0, 12, 10};
        int gc[] = {0, 0};
        Det d[] = {{1, 0, 11, 10, 0.9f, 0}, {0, 0, 10, 10, 0.8f, 0}};
        Evaluator ev;
        evaluator_init(&ev, 1);
        evaluator_add_image(&ev, d, 2, gb, gc, 2);
        check(ev.tp[0] == 0x07f && ev.tp[1] == 0x3ff,
              "equal IoUs go to the larger label index: tp bits %03x %03x want 07f 3ff", ev.tp[0], ev.tp[1]);
        evaluator_free(&ev);
    }
    // Class mismatch: labels A (cls 0), B (cls 1); d0 cls 1 exactly on A (IoU zeroed -> FP,
    // 0.9), d1 cls 1 exactly on B (TP, 0.5). Class 0: no detections -> AP 0. Class 1:
    // recall [0,1], precision [0,.5] -> mrec [0,0,1,1], envelope [1,.5,.5,0]: interp .5 on
    // [0,.99], 0 at 1 -> AP = .99*.5 + .01*.25 = .4975. mAP = (0 + .4975)/2 = .24875.
    {
        float gb[] = {0, 0, 100, 100, 200, 200, 260, 280};
        int gc[] = {0, 1};
        Det d[] = {{0, 0, 100, 100, 0.9f, 1}, {200, 200, 260, 280, 0.5f, 1}};
        Metrics m = eval_one(3, d, 2, gb, gc, 2);
        check_close("class mismatch mAP50", m.map50, 0.24875, 1e-12);
        check_close("class mismatch mAP50-95", m.map, 0.24875, 1e-12);
        check_close("class mismatch AP50 class 0", m.ap50[0], 0.0, 1e-12);
        check_close("class mismatch AP50 class 1", m.ap50[1], 0.4975, 1e-12);
        check(m.n_cls == 2 && m.ap50[2] == -1.0, "class without labels excluded: n_cls %d ap50[2] %g", m.n_cls,
              m.ap50[2]);
        metrics_free(&m);
    }
    // Detections of a class without labels are ignored: adding a class-2 detection at higher
    // confidence must leave the class-mismatch result unchanged.
    {
        float gb[] = {0, 0, 100, 100, 200, 200, 260, 280};
        int gc[] = {0, 1};
        Det d[] = {{5, 5, 90, 90, 0.95f, 2}, {0, 0, 100, 100, 0.9f, 1}, {200, 200, 260, 280, 0.5f, 1}};
        Metrics m = eval_one(3, d, 3, gb, gc, 2);
        check_close("unlabelled-class detection ignored, mAP50", m.map50, 0.24875, 1e-12);
        metrics_free(&m);
    }
    // IoU exactly at a threshold: label (0,0,10,10), det (0,0,10,5): inter 50, union 100 (+1e-7
    // vanishes in float32) -> IoU exactly 0.5 >= 0.5: TP only at t = .5. AP50 = .995 (perfect),
    // other thresholds 0 (all-false case) -> mAP50-95 = .0995. Det (0,0,10,4.99): IoU .499 -> none.
    {
        float gb[] = {0, 0, 10, 10};
        int gc[] = {0};
        Det d[] = {{0, 0, 10, 5, 0.6f, 0}};
        check_close("box_iou_f at exactly 0.5", box_iou_f(gb, (float[]){0, 0, 10, 5}), 0.5, 0.0);
        Metrics m = eval_one(1, d, 1, gb, gc, 1);
        check_close("IoU = 0.5 mAP50", m.map50, 0.995, 1e-12);
        check_close("IoU = 0.5 mAP50-95", m.map, 0.0995, 1e-12);
        metrics_free(&m);
        d[0].y2 = 4.99f;
        m = eval_one(1, d, 1, gb, gc, 1);
        check_close("IoU = 0.499 mAP50", m.map50, 0.0, 1e-12);
        metrics_free(&m);
    }
    // box_iou's eps = 1e-7 matters for small boxes: label (0,0,1,1), det (0,0,1,.5): the union
    // 1 + 1e-7 rounds up to 1 + 2^-23 in float32, so IoU = 0.49999994 < 0.5: no TP anywhere.
    {
        float gb[] = {0, 0, 1, 1};
        int gc[] = {0};
        Det d[] = {{0, 0, 1, 0.5f, 0.6f, 0}};
        Metrics m = eval_one(1, d, 1, gb, gc, 1);
        check_close("unit box at IoU 0.5 - eps, mAP50", m.map50, 0.0, 1e-12);
        metrics_free(&m);
    }
    // Two images accumulate: image 1 a perfect hit, image 2 a missed label and no detections.
    // recall [.5], precision [1] -> 0.75 as in half-right.
    {
        Evaluator ev;
        evaluator_init(&ev, 2);
        float g1[] = {0, 0, 100, 100}, g2[] = {10, 10, 40, 40};
        int c1[] = {1}, c2[] = {1};
        Det d[] = {{0, 0, 100, 100, 0.4f, 1}};
        evaluator_add_image(&ev, d, 1, g1, c1, 1);
        evaluator_add_image(&ev, NULL, 0, g2, c2, 1);
        Metrics m;
        evaluator_compute(&ev, &m);
        check_close("two images mAP50-95", m.map, 0.75, 1e-12);
        metrics_free(&m);
        evaluator_reset(&ev);
        evaluator_compute(&ev, &m);
        check(m.n_cls == 0 && m.map == 0.0, "after reset: n_cls %d map %g want 0 0", m.n_cls, m.map);
        metrics_free(&m);
        evaluator_free(&ev);
    }
}

// ------------------------------------------------------------------------------------------
// NMS on hand-built decoded tensors
// ------------------------------------------------------------------------------------------

static void test_nms_by_hand(void) {
    enum { NC = 3, A = 12 };
    float pred[(4 + NC) * A];
    Det out[300];
    NmsConfig cfg = nms_config_predict();
    Nms n;
    // overlap: a0 and a1 class 0 with IoU 90/110 = .82 > .7 -> a1 suppressed; a2 class 1 on the
    // same box as a0 is kept (class-aware); a3 class 0 with IoU 70/100 -> float32 0.69999999 is
    // not > 0.7 (torchvision compares the float IoU with the double threshold) -> kept.
    memset(pred, 0, sizeof pred);
    for (int a = 0; a < A; a++)
        set_box(pred, NC, A, a, 1000 + 50 * a, 0, 1010 + 50 * a, 10, (float[]){0.1f, 0.1f, 0.1f});
    set_box(pred, NC, A, 0, 0, 0, 10, 10, (float[]){0.9f, 0.1f, 0.1f});
    set_box(pred, NC, A, 1, 0, 1, 10, 10, (float[]){0.8f, 0.1f, 0.1f});  // inter 90 / union 100
    set_box(pred, NC, A, 2, 0, 0, 10, 10, (float[]){0.1f, 0.85f, 0.1f});
    set_box(pred, NC, A, 3, 0, 3, 10, 10, (float[]){0.7f, 0.1f, 0.1f});  // IoU 70/100 with a0
    nms_init(&n, cfg, NC, A);
    int k = nms_run_decoded(&n, pred, out);
    check(k == 3 && out[0].score == 0.9f && out[1].score == 0.85f && out[1].cls == 1 && out[2].score == 0.7f,
          "class-aware NMS: %d dets (want 3: 0.9 c0, 0.85 c1, 0.7 c0 kept at IoU 0.7f), got %.2f/%d %.2f/%d %.2f/%d",
          k, k > 0 ? out[0].score : 0, k > 0 ? out[0].cls : -1, k > 1 ? out[1].score : 0, k > 1 ? out[1].cls : -1,
          k > 2 ? out[2].score : 0, k > 2 ? out[2].cls : -1);
    check(k >= 1 && out[0].x1 == 0 && out[0].y1 == 0 && out[0].x2 == 10 && out[0].y2 == 10,
          "NMS box is xyxy of the input xywh: %g %g %g %g", out[0].x1, out[0].y1, out[0].x2, out[0].y2);
    nms_free(&n);
    // agnostic: the class-1 box on a0 now overlaps a0 fully -> suppressed
    cfg.agnostic = 1;
    nms_init(&n, cfg, NC, A);
    k = nms_run_decoded(&n, pred, out);
    check(k == 2 && out[0].score == 0.9f && out[1].score == 0.7f, "agnostic NMS: %d dets want 2 (0.9, 0.7)", k);
    nms_free(&n);
    // conf threshold is strict: a score of exactly 0.25 is not a candidate
    cfg = nms_config_predict();
    pred[(4 + 0) * A + 3] = 0.25f;
    nms_init(&n, cfg, NC, A);
    k = nms_run_decoded(&n, pred, out);
    check(k == 2, "conf 0.25 strict: %d dets want 2", k);
    nms_free(&n);
    // multi-label: one anchor with class scores .6 and .5 gives two detections (different
    // classes, the offset keeps them apart); single-label gives one (class of the max)
    memset(pred, 0, sizeof pred);
    set_box(pred, NC, A, 5, 20, 20, 60, 70, (float[]){0.5f, 0.0f, 0.6f});
    cfg = nms_config_val();
    nms_init(&n, cfg, NC, A);
    k = nms_run_decoded(&n, pred, out);
    check(k == 2 && out[0].cls == 2 && out[1].cls == 0 && out[1].score == 0.5f,
          "multi-label: %d dets want 2 (cls 2, cls 0)", k);
    nms_free(&n);
    cfg.multi_label = 0;
    nms_init(&n, cfg, NC, A);
    k = nms_run_decoded(&n, pred, out);
    check(k == 1 && out[0].cls == 2, "single-label: %d dets want 1 (cls 2)", k);
    nms_free(&n);
    // max_det and max_nms: 12 disjoint boxes with scores .05 .. .6
    for (int a = 0; a < A; a++) set_box(pred, NC, A, a, 100 * a, 0, 100 * a + 50, 50, (float[]){0.05f * (a + 1), 0, 0});
    cfg = nms_config_val(); cfg.max_det = 4;
    nms_init(&n, cfg, NC, A);
    k = nms_run_decoded(&n, pred, out);
    check(k == 4 && out[0].score == 0.05f * 12 && out[3].score == 0.05f * 9, "max_det 4: %d dets, first %.2f last %.2f",
          k, out[0].score, k ? out[k - 1].score : 0);
    nms_free(&n);
    cfg = nms_config_val(); cfg.max_nms = 3;
    nms_init(&n, cfg, NC, A);
    k = nms_run_decoded(&n, pred, out);
    check(k == 3 && out[2].score == 0.05f * 10, "max_nms 3: %d dets, last %.2f", k, k ? out[k - 1].score : 0);
    nms_free(&n);
    // equal scores keep anchor order (stable)
    for (int a = 0; a < A; a++) pred[4 * A + a] = 0.3f;
    cfg = nms_config_val();
    nms_init(&n, cfg, NC, A);
    k = nms_run_decoded(&n, pred, out);
    int ordered = k == A;
    for (int i = 0; i < k; i++) ordered &= out[i].x1 == 100.0f * i;
    check(ordered, "equal scores keep anchor order: %d dets", k);
    nms_free(&n);
    cfg.max_nms = 5;                          // the top 5 of 12 equal scores are the first 5 anchors
    nms_init(&n, cfg, NC, A);
    k = nms_run_decoded(&n, pred, out);
    ordered = k == 5;
    for (int i = 0; i < k; i++) ordered &= out[i].x1 == 100.0f * i;
    check(ordered, "equal scores with max_nms 5: %d dets, anchors 0..4 in order", k);
    nms_free(&n);
    // select_top + sort against a full stable sort, on heavily tied keys
    {
        enum { NS = 5000 };
        static float key[NS];
        static int32_t a[NS], b[NS], tmp[NS];
        Rng r;
        rng_seed(&r, 3);
        for (int i = 0; i < NS; i++) key[i] = (float)rng_int(&r, 40) / 40.0f;
        int ok = 1;
        for (int kk = 1; kk <= NS; kk += 333) {
            for (int i = 0; i < NS; i++) a[i] = b[i] = i;
            sort_desc_stable(a, tmp, NS, key);
            select_top(b, NS, kk, key);
            sort_desc_stable(b, tmp, kk, key);
            ok &= memcmp(a, b, sizeof(int32_t) * kk) == 0;
        }
        check(ok, "select_top(k) + sort == first k of a full stable sort (n %d, 40 distinct keys)", NS);
    }
}

// ------------------------------------------------------------------------------------------
// decode: one-hot DFL logits give known boxes
// ------------------------------------------------------------------------------------------

static void test_decode(void) {
    enum { NC = 2, IMG = 32, C = 64 + NC };
    int H[3] = {4, 2, 1};
    float *maps[3];
    for (int l = 0; l < 3; l++) {
        maps[l] = xcalloc((size_t)2 * C * H[l] * H[l], sizeof(float));                   // (B=2, C, H, W)
        for (int b = 0; b < 2; b++)
            for (int c = 0; c < NC; c++)
                for (int p = 0; p < H[l] * H[l]; p++) maps[l][((size_t)b * C + 64 + c) * H[l] * H[l] + p] = -10.0f;
    }
    // image 1, level 0 (stride 8), pixel x=1, y=2: sides l,t,r,b peaked at bins 3,1,2,5 (logit 20,
    // others 0: the expectation is k + (sum_j (j-k)) e^-20 / (1 + 15 e^-20), off by < 1e-6).
    // anchor (1.5, 2.5): x1 = (1.5-3)*8 = -12, y1 = (2.5-1)*8 = 12, x2 = (1.5+2)*8 = 28,
    // y2 = (2.5+5)*8 = 60 -> cx 8, cy 36, w 40, h 48. Class 1 logit 2 -> sigmoid .880797.
    int peak[4] = {3, 1, 2, 5}, HW = 16, pix = 2 * 4 + 1;
    for (int s = 0; s < 4; s++) maps[0][((size_t)1 * C + s * 16 + peak[s]) * HW + pix] = 20.0f;
    maps[0][((size_t)1 * C + 64 + 1) * HW + pix] = 2.0f;
    int A = head_anchor_count(IMG, IMG);
    check(A == 21, "anchor count at 32x32: %d want 21", A);
    float *dec = xmalloc(sizeof(float) * 2 * (4 + NC) * A);                            // (B, 4+NC, A)
    head_decode((const float *const *)maps, 2, NC, IMG, IMG, dec);
    float *d1 = dec + (4 + NC) * A;
    double want[4] = {8, 36, 40, 48}, worst = 0;
    for (int k = 0; k < 4; k++) worst = fmax(worst, fabs(d1[k * A + pix] - want[k]));
    check(worst <= 1e-3, "decode one-hot DFL box cx,cy,w,h = 8,36,40,48: worst |diff| %.3g tol 1e-3", worst);
    check_close("decode class-1 sigmoid(2)", d1[5 * A + pix], 1.0 / (1.0 + exp(-2.0)), 1e-6);
    // uniform logits everywhere else: distance = mean of 0..15 = 7.5 per side. Level 2
    // (stride 32) has one anchor, index 20, at (0.5, 0.5): cx = cy = 16, w = h = 15*32 = 480.
    double w2[4] = {16, 16, 480, 480};
    worst = 0;
    for (int k = 0; k < 4; k++) worst = fmax(worst, fabs(dec[k * A + 20] - w2[k]));
    check(worst <= 1e-3, "decode uniform DFL, stride 32: cx,cy,w,h 16,16,480,480 worst |diff| %.3g tol 1e-3", worst);
    // level 1 pixel (1,0) of image 0 -> anchor 16 + 1: anchor (1.5, .5)*16 = (24, 8)
    check(fabs(dec[0 * A + 17] - 24) < 1e-3 && fabs(dec[1 * A + 17] - 8) < 1e-3,
          "decode level-1 anchor centre (24, 8): %g %g", dec[17], dec[A + 17]);
    // NMS from the maps at conf 0.25: the only candidate is the peaked anchor of image 1
    Nms n;
    nms_init(&n, nms_config_predict(), NC, A);
    Det out[300];
    int k0 = nms_run_maps(&n, (const float *const *)maps, 0, IMG, IMG, out);
    int k1 = nms_run_maps(&n, (const float *const *)maps, 1, IMG, IMG, out);
    check(k0 == 0 && k1 == 1 && out[0].cls == 1 && fabs(out[0].x1 + 12) < 1e-3 && fabs(out[0].y1 - 12) < 1e-3 &&
          fabs(out[0].x2 - 28) < 1e-3 && fabs(out[0].y2 - 60) < 1e-3,
          "nms_run_maps: image 0 %d dets (want 0), image 1 %d (want 1: cls 1 box -12,12,28,60) got %g %g %g %g",
          k0, k1, out[0].x1, out[0].y1, out[0].x2, out[0].y2);
    nms_free(&n);
    free(dec);
    for (int l = 0; l < 3; l++) free(maps[l]);
}

// random maps: nms_run_maps, nms_run_decoded (on head_decode) and the brute-force NMS agree
static void test_nms_random(void) {
    enum { NC = 4, IMG = 96, B = 2, C = 64 + NC };
    Rng r;
    rng_seed(&r, 7);
    float *maps[3];
    int A = head_anchor_count(IMG, IMG);
    for (int l = 0; l < 3; l++) {
        int hw = (IMG / head_strides[l]) * (IMG / head_strides[l]);
        maps[l] = xmalloc(sizeof(float) * B * C * hw);
        for (int b = 0; b < B; b++)
            for (int c = 0; c < C; c++)
                for (int p = 0; p < hw; p++)
                    maps[l][((size_t)b * C + c) * hw + p] =
                            c < 64 ? (float)(2.0 * rng_normal(&r)) : (float)(2.0 * rng_normal(&r) - 3.0);
    }
    float *dec = xmalloc(sizeof(float) * B * (4 + NC) * A);
    head_decode((const float *const *)maps, B, NC, IMG, IMG, dec);
    Det *o1 = xmalloc(sizeof(Det) * 300), *o2 = xmalloc(sizeof(Det) * 300), *o3 = xmalloc(sizeof(Det) * 300);
    NmsConfig cfgs[4] = {nms_config_val(), nms_config_predict(), nms_config_val(), nms_config_val()};
    cfgs[2].agnostic = 1;
    cfgs[3].max_det = 20; cfgs[3].max_nms = 100; cfgs[3].iou = 0.3f;
    const char *names[4] = {"val", "predict", "val agnostic", "max_det 20 max_nms 100 iou 0.3"};
    for (int ci = 0; ci < 4; ci++)
        for (int b = 0; b < B; b++) {
            Nms n;
            nms_init(&n, cfgs[ci], NC, A);
            int k1 = nms_run_maps(&n, (const float *const *)maps, b, IMG, IMG, o1);
            int k2 = nms_run_decoded(&n, dec + (size_t)b * (4 + NC) * A, o2);
            int k3 = naive_nms(dec + (size_t)b * (4 + NC) * A, NC, A, cfgs[ci], o3);
            check(dets_equal(o1, k1, o3, k3, 0.0) && dets_equal(o2, k2, o3, k3, 0.0),
                  "random maps (%s) image %d: maps path %d, decoded path %d, brute force %d dets, identical (tol 0)",
                  names[ci], b, k1, k2, k3);
            nms_free(&n);
        }
    free(o1); free(o2); free(o3); free(dec);
    for (int l = 0; l < 3; l++) free(maps[l]);
}

// ------------------------------------------------------------------------------------------
// numpy reference fixture
// ------------------------------------------------------------------------------------------

static void test_fixture(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) { check(0, "fixture %s missing (run python3 test/ref_map.py)", path); return; }
    char line[512];
    int NC = 0, ndet = 0, ngt = 0, nimg = 0;
    Evaluator ev;
    Metrics m = {0};
    double want[4] = {0}, want_ap[64][2];
    int have_expect = 0, n_ap = 0, ap_cls[64], want_best = -1;
    Det *d = NULL;
    float *gb = NULL;
    int *gc = NULL;
    while (fgets(line, sizeof line, f)) {
        int M, N;
        if (line[0] == '#') continue;
        if (sscanf(line, "nc %d", &NC) == 1) { evaluator_init(&ev, NC); continue; }
        if (sscanf(line, "image %d %d", &M, &N) == 2) {
            d = realloc(d, sizeof(Det) * (N + 1));
            gb = realloc(gb, sizeof(float) * 4 * (M + 1));
            gc = realloc(gc, sizeof(int) * (M + 1));
            for (int i = 0; i < M; i++) {
                if (!fgets(line, sizeof line, f) ||
                    sscanf(line, "l %d %f %f %f %f", &gc[i], &gb[4 * i], &gb[4 * i + 1], &gb[4 * i + 2],
                           &gb[4 * i + 3]) != 5)
                    die("fixture %s: bad label line '%s'", path, line);
            }
            for (int j = 0; j < N; j++) {
                if (!fgets(line, sizeof line, f) ||
                    sscanf(line, "d %d %f %f %f %f %f", &d[j].cls, &d[j].score, &d[j].x1, &d[j].y1, &d[j].x2,
                           &d[j].y2) != 6)
                    die("fixture %s: bad detection line '%s'", path, line);
            }
            evaluator_add_image(&ev, d, N, gb, gc, M);
            ngt += M; ndet += N; nimg++;
            continue;
        }
        if (sscanf(line, "expect %lf %lf %lf %lf", &want[0], &want[1], &want[2], &want[3]) == 4) {
            have_expect = 1;
            continue;
        }
        if (sscanf(line, "best %d", &want_best) == 1) continue;
        if (n_ap < 64 && sscanf(line, "ap %d %lf %lf", &ap_cls[n_ap], &want_ap[n_ap][0], &want_ap[n_ap][1]) == 3) {
            n_ap++;
            continue;
        }
    }
    fclose(f);
    free(d); free(gb); free(gc);
    check(NC > 0 && have_expect && nimg > 0, "fixture %s: %d images, %d labels, %d detections, nc %d", path, nimg, ngt,
          ndet, NC);
    if (!(NC > 0 && have_expect)) return;
    evaluator_compute(&ev, &m);
    check_close("fixture P", m.P, want[0], 1e-6);
    check_close("fixture R", m.R, want[1], 1e-6);
    check_close("fixture mAP50", m.map50, want[2], 1e-6);
    check_close("fixture mAP50-95", m.map, want[3], 1e-6);
    int best = (int)lround(m.conf_best * (EVAL_NGRID - 1));
    check(best == want_best, "fixture max-F1 confidence grid index: got %d want %d", best, want_best);
    double worst = 0;
    for (int i = 0; i < n_ap; i++)
        worst = fmax(worst, fmax(fabs(m.ap50[ap_cls[i]] - want_ap[i][0]), fabs(m.ap[ap_cls[i]] - want_ap[i][1])));
    check(worst <= 1e-6 && m.n_cls == n_ap,
          "fixture per-class AP50 and AP50-95 (%d classes, %d averaged): worst |diff| %.3g tol 1e-6", n_ap, m.n_cls,
          worst);
    metrics_free(&m);
    evaluator_free(&ev);
}

int main(void) {
    test_ap_by_hand();
    test_nms_by_hand();
    test_decode();
    test_nms_random();
    test_fixture("test/fixtures/map_random.txt");
    return test_summary();
}
