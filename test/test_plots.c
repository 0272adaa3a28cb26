// test_plots.c: a run's folder as Ultralytics lays it out, and the pictures in it.
//   1. the confusion matrix of a hand-made image (every case: a match, a class mix-up, a duplicate,
//      a detection whose label was taken, one below the score threshold, a missed label, images
//      without labels or without detections) against counts worked out by hand;
//   2. on 40 random images: each true-class column sums to that class's labels, and the predicted
//      rows hold each detection above the score threshold exactly once;
//   3. the P, R and PR curves evaluator_compute keeps, on a two-detection case, against numpy's
//      interpolation worked by hand;
//   4. ./yolo (built by `make`) on a tiny synthetic set: train, val twice, val exist_ok=1 and
//      predict write PROJECT/train, val, val2, val, predict; every picture is there, decodes, has
//      the expected size and is not blank.
#define TESTING
#include "../yolo.c"
#include "test.h"
#include <ftw.h>

// cm_check: every cell of ev's confusion matrix against want ((NC+1)^2), worst difference printed.
static void cm_check(const Evaluator *ev, const int64_t *want, const char *what) {
    int N = ev->NC + 1;
    int64_t worst = 0, sum = 0;
    for (int i = 0; i < N * N; i++) {
        worst = llabs(ev->cm[i] - want[i]) > worst ? llabs(ev->cm[i] - want[i]) : worst;
        sum += ev->cm[i];
    }
    check(worst == 0, "%s: %d cells (sum %lld), worst |diff| %lld, tol 0", what, N * N, (long long)sum,
          (long long)worst);
}

static void test_confusion_hand(void) {
    Evaluator ev;
    evaluator_init(&ev, 2);
    const float gb[4][4] = {{0, 0, 10, 10}, {20, 20, 30, 30}, {40, 40, 50, 50}, {60, 60, 70, 70}};
    const int gc[4] = {0, 1, 0, 1};
    const Det d[7] = {
        {0, 0, 10, 10, 0.9f, 0},       // L0, IoU 1: (0, 0)
        {20, 20, 30, 31, 0.8f, 0},     // L1 (class 1), IoU 0.909: (0, 1)
        {100, 100, 110, 110, 0.7f, 1}, // nothing: (1, background)
        {60, 60, 70, 70, 0.6f, 1},     // L3, IoU 1: (1, 1)
        {60, 60, 70, 71, 0.5f, 1},     // L3 again, IoU 0.909, L3 is taken: (1, background)
        {0, 0, 10, 12, 0.4f, 0},       // L0 at IoU 0.833, taken by the first: (0, background)
        {40, 40, 50, 50, 0.2f, 0},     // L2 exactly, but score <= 0.25: ignored, so L2 is (background, 0)
    };
    evaluator_add_image(&ev, d, 7, &gb[0][0], gc, 4);
    // rows predicted 0, 1, background; columns true 0, 1, background
    const int64_t want1[9] = {1, 1, 1, 0, 1, 2, 1, 0, 0};
    cm_check(&ev, want1, "confusion matrix of the hand-made image");
    const Det fp = {5, 5, 9, 9, 0.5f, 1};
    evaluator_add_image(&ev, &fp, 1, NULL, NULL, 0);     // an image without labels: one false positive
    const float g2[4] = {1, 1, 5, 5};
    const int c2 = 0;
    evaluator_add_image(&ev, NULL, 0, g2, &c2, 1);       // an image without detections: one missed label
    const Det weak = {0, 0, 10, 10, 0.25f, 0};           // score exactly 0.25 is not > 0.25
    evaluator_add_image(&ev, &weak, 1, &gb[0][0], gc, 1);
    const int64_t want2[9] = {1, 1, 1, 0, 1, 3, 3, 0, 0};
    cm_check(&ev, want2, "after an image without labels, one without detections and a 0.25 score");
    evaluator_reset(&ev);
    const int64_t zero[9] = {0};
    cm_check(&ev, zero, "evaluator_reset clears the confusion matrix");
    evaluator_free(&ev);
}

static void test_confusion_sums(void) {
    enum { NC = 3, NIMG = 40 };
    Evaluator ev;
    evaluator_init(&ev, NC);
    Rng r;
    rng_seed(&r, 7);
    int64_t labels[NC] = {0}, strong = 0;
    for (int im = 0; im < NIMG; im++) {
        float gb[8][4];
        int gc[8], M = rng_int(&r, 8), N = rng_int(&r, 12);
        Det d[12];
        for (int i = 0; i < M; i++) {
            float x = (float)rng_range(&r, 0, 80), y = (float)rng_range(&r, 0, 80);
            float w = (float)rng_range(&r, 5, 30), h = (float)rng_range(&r, 5, 30);
            gb[i][0] = x; gb[i][1] = y; gb[i][2] = x + w; gb[i][3] = y + h;
            gc[i] = rng_int(&r, NC);
            labels[gc[i]]++;
        }
        for (int j = 0; j < N; j++) {   // half near a label, half anywhere; scores descending
            float jit = (float)rng_range(&r, -4, 4);
            if (M && j % 2 == 0) {
                const float *g = gb[rng_int(&r, M)];
                d[j] = (Det){g[0] + jit, g[1] - jit, g[2] + jit, g[3], 0, rng_int(&r, NC)};
            } else {
                float x = (float)rng_range(&r, 0, 80), y = (float)rng_range(&r, 0, 80);
                d[j] = (Det){x, y, x + 20, y + 15, 0, rng_int(&r, NC)};
            }
            d[j].score = 0.9f - 0.07f * (float)j;
            strong += d[j].score > 0.25f;
        }
        evaluator_add_image(&ev, d, N, &gb[0][0], gc, M);
    }
    int64_t worst_col = 0, rows = 0, total = 0, nlab = 0;
    for (int c = 0; c < NC; c++) {
        int64_t s = 0;
        for (int i = 0; i <= NC; i++) s += ev.cm[i * (NC + 1) + c];
        worst_col = llabs(s - labels[c]) > worst_col ? llabs(s - labels[c]) : worst_col;
        nlab += labels[c];
    }
    for (int i = 0; i < NC; i++)
        for (int j = 0; j <= NC; j++) rows += ev.cm[i * (NC + 1) + j];
    for (int i = 0; i < (NC + 1) * (NC + 1); i++) total += ev.cm[i];
    check(worst_col == 0 && ev.cm[NC * (NC + 1) + NC] == 0,
          "true-class columns sum to the labels of each class (%lld labels): worst |diff| %lld, tol 0",
          (long long)nlab, (long long)worst_col);
    check(rows == strong, "predicted rows hold each detection with score > 0.25 once: %lld vs %lld, tol 0",
          (long long)rows, (long long)strong);
    check(total == nlab + ev.cm[0 * (NC + 1) + NC] + ev.cm[1 * (NC + 1) + NC] + ev.cm[2 * (NC + 1) + NC],
          "the matrix sums to labels + false positives: %lld = %lld + background column", (long long)total,
          (long long)nlab);
    evaluator_free(&ev);
}

static void test_curves(void) {
    Evaluator ev;
    evaluator_init(&ev, 2);
    const float gb[2][4] = {{0, 0, 10, 10}, {20, 20, 30, 30}};
    const int gc[2] = {1, 1};
    const Det d[2] = {{0, 0, 10, 10, 0.9f, 1}, {50, 50, 60, 60, 0.6f, 1}};   // a TP, then an FP
    evaluator_add_image(&ev, d, 2, &gb[0][0], gc, 2);
    Metrics m;
    evaluator_compute(&ev, &m);
    check(m.n_cls == 1 && m.curve_cls[0] == 1, "one curve row, for class 1 (the class with labels): %d rows, class %d",
          m.n_cls, m.curve_cls[0]);
    // recall 0.5 then 0.5, precision 1 then 0.5: the envelope is 1 up to recall 0.5, then falls to 0 at 1
    double x = 400.0 / 999, worst = fabs(m.curve_pr[400] - 1.0);
    x = 750.0 / 999;
    worst = fmax(worst, fabs(m.curve_pr[750] - (0.5 - (x - 0.5))));
    worst = fmax(worst, fabs(m.curve_pr[999] - 0.0));
    check(worst <= 1e-12, "PR curve at recall 0.4004, 0.7508, 1: worst |diff| %.3g, tol 1e-12", worst);
    // P and R against confidence: numpy.interp over the detections' scores (0.9f, 0.6f)
    double c0 = 0.9f, c1 = 0.6f;
    x = 700.0 / 999;
    worst = fabs(m.curve_p[700] - (1.0 + (c0 - x) / (c0 - c1) * (0.5 - 1.0)));
    worst = fmax(worst, fabs(m.curve_r[700] - 0.5));
    worst = fmax(worst, fabs(m.curve_p[950] - 1.0) + fabs(m.curve_r[950] - 0.0));   // above every score
    worst = fmax(worst, fabs(m.curve_p[100] - 0.5) + fabs(m.curve_r[100] - 0.5));   // below every score
    check(worst <= 1e-12, "P and R at confidence 0.1, 0.7007, 0.951: worst |diff| %.3g, tol 1e-12", worst);
    metrics_free(&m);
    evaluator_free(&ev);
}

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *f) {
    (void)sb; (void)flag; (void)f;
    return remove(p);
}

// sh: run a shell command line, output to log; 1 when it exits 0 (else the log's tail is printed).
static int sh(const char *log, const char *fmt, ...) {
    char cmd[4096], full[4600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    char y[4200];
    snprintf(full, sizeof full, "%s > %s 2>&1", yolo_cmd(cmd, y, sizeof y), log);
    int st = system(full);
    if (st != 0) {
        snprintf(full, sizeof full, "tail -n 15 %s", log);
        if (system(full)) {}
    }
    return st == 0;
}

// picture_check: dir/name exists, decodes to w x h (0: at least 100) and is not one flat colour.
static void picture_check(const char *dir, const char *name, int w, int h) {
    char path[1024], err[1200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    Image im = {0};
    if (image_load(path, 0, &im, err, sizeof err)) {
        check(0, "%s decodes: %s", path, err);
        return;
    }
    long differ = 0;
    for (size_t i = 3; i < (size_t)im.w * im.h * 3; i++) differ += im.px[i] != im.px[i % 3];
    int size_ok = w ? im.w == w && im.h == h : im.w >= 100 && im.h >= 100;
    check(size_ok && differ > (long)im.w * im.h / 100, "%s: %dx%d (want %dx%d), %ld values differ from the first pixel",
          name, im.w, im.h, w, h, differ);
    image_free(&im);
}

static int exists(const char *dir, const char *name) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return access(path, F_OK) == 0;
}

static void test_run_folder(void) {
    if (access(yolo_bin(), X_OK) != 0) {
        check(0, "%s exists (run `make` first, from the repo root)", yolo_bin());
        return;
    }
    setenv("OMP_WAIT_POLICY", "PASSIVE", 0);
    char root[64] = "/tmp/yolo_test_plots.XXXXXX", log[128], dir[256];
    if (!mkdtemp(root)) die("mkdtemp: %s", strerror(errno));
    snprintf(log, sizeof log, "%s/log", root);
    int ok = sh(log, "./yolo shapes out=%s/data ntrain=16 nval=8 imgsz=64 seed=1", root);
    ok = ok && sh(log, "./yolo train data=%s/data/data.yaml model=yolov8n epochs=1 imgsz=64 batch=4 workers=1 seed=1 "
                       "project=%s/runs", root, root);
    check(ok, "tiny training run (16 images, batch 4, 1 epoch) exits 0");
    snprintf(dir, sizeof dir, "%s/runs/train", root);
    static const char *const curves[] = {"PR_curve.png", "F1_curve.png", "P_curve.png", "R_curve.png"};
    for (int k = 0; k < 4; k++) picture_check(dir, curves[k], 1400, 860);
    picture_check(dir, "confusion_matrix.png", 0, 0);
    picture_check(dir, "confusion_matrix_normalized.png", 0, 0);
    picture_check(dir, "labels.jpg", 1200, 1200);
    for (int k = 0; k < 3; k++) {   // 4 images of 64 px: a 2 x 2 grid
        char nm[64];
        snprintf(nm, sizeof nm, "train_batch%d.jpg", k);
        picture_check(dir, nm, 128, 128);
    }
    // 8 images of 96 px (validation pads a square 64 px image to 64 + 32): a 3 x 3 grid
    picture_check(dir, "val_batch0_labels.jpg", 288, 288);
    picture_check(dir, "val_batch0_pred.jpg", 288, 288);
    check(!exists(dir, "train_batch3.jpg") && !exists(dir, "val_batch1_labels.jpg"),
          "only the first three training batches are drawn, and the one validation batch there is");
    char model[512];
    snprintf(model, sizeof model, "model=%s/weights/last.safetensors data=%s/data/data.yaml imgsz=64", dir, root);
    ok = sh(log, "./yolo val %s batch=8 project=%s/runs", model, root) &&
         sh(log, "./yolo val %s batch=8 project=%s/runs", model, root) &&
         sh(log, "./yolo val %s batch=8 project=%s/runs exist_ok=1", model, root) &&
         sh(log, "./yolo predict %s source=%s/data/images/val project=%s/runs", model, root, root);
    snprintf(dir, sizeof dir, "%s/runs", root);
    check(ok && exists(dir, "val") && exists(dir, "val2") && !exists(dir, "val3") && exists(dir, "predict/labels"),
          "val, val again, val exist_ok=1 and predict write PROJECT/val, val2, val (again) and predict");
    snprintf(dir, sizeof dir, "%s/runs/val", root);
    picture_check(dir, "confusion_matrix.png", 0, 0);
    picture_check(dir, "PR_curve.png", 1400, 860);
    picture_check(dir, "val_batch0_labels.jpg", 288, 288);
    picture_check(dir, "val_batch0_pred.jpg", 288, 288);
    if (getenv("KEEP_TMP")) printf("  KEEP_TMP set: left %s\n", root);
    else nftw(root, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

int main(void) {
    test_confusion_hand();
    test_confusion_sums();
    test_curves();
    test_run_folder();
    return test_summary();
}
