// yolo_test.h: helpers for the programs in test/ that include yolo.c (after it).
#pragma once

// sgd_test: the optimizer the device-step tests use: SGD at lr 0.01 with Ultralytics' momentum and
// weight decay
static Optimizer sgd_test(void) {
    return (Optimizer){.kind = OPT_SGD, .lr = {0.01, 0.01, 0.01}, .momentum = 0.937, .beta2 = 0.999, .eps = 1e-8,
                       .weight_decay = 5e-4};
}

// model_open: builds the model and allocates its arena (one malloc) for a step of (B, H, W);
// returns the arena, whose high-water mark tests compare against the plan.
static Arena *model_open(Model *m, char scale, int nc, int B, int H, int W, uint64_t seed) {
    model_build(m, scale, nc);
    Plan p = model_plan(m, B, H, W);
    Arena *a = xcalloc(1, sizeof(Arena));
    a->base = aligned_alloc(ARENA_ALIGN, (p.total + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN);
    if (!a->base) die("cannot allocate the %.1f MiB arena (hint: lower batch or imgsz)", p.total / 1048576.0);
    a->cap = p.total;
    model_alloc_params(m, a);
    model_init_params(m, seed);
    model_shape(m, H, W);
    m->B = B;
    m->H = H;
    m->W = W;
    return a;
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

// random_targets: n random boxes for the benchmarks' steps, per_image a image (box i in image
// i / per_image), classes in [0, nc), normalised (cx, cy, w, h) with w, h in [0.05, 0.5] and the box inside
// the image; drawn from r in a fixed order (class, w, h, cx, cy per box)
static inline void random_targets(Rng *r, int n, int per_image, int nc, int *bi, int *ci, float *box) {
    for (int i = 0; i < n; i++) {
        bi[i] = i / per_image, ci[i] = (int)(rng_uniform(r) * nc) % nc;
        float w = (float)rng_range(r, 0.05, 0.5), h = (float)rng_range(r, 0.05, 0.5);
        box[4 * i] = (float)rng_range(r, w / 2, 1 - w / 2), box[4 * i + 1] = (float)rng_range(r, h / 2, 1 - h / 2);
        box[4 * i + 2] = w, box[4 * i + 3] = h;
    }
}
