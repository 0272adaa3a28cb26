// test_plan.c: the training memory plan (yolo plan, batch=-1, recompute): planned bytes equal the
// high-water mark of a real training and validation step; the largest batch that fits really is
// the largest; the planned totals the issues promise.
#define TESTING
#include "../yolo.c"
#include "test.h"

// fake_batch: B random images of H x W with a few boxes each (what the loader would hand over)
static Batch *fake_batch(int B, int H, int W, Rng *r) {
    Batch *bt = xcalloc(1, sizeof(Batch));
    bt->B = B, bt->H = H, bt->W = W;
    bt->img = xmalloc((size_t)B * 3 * H * W);
    for (size_t i = 0; i < (size_t)B * 3 * H * W; i++) bt->img[i] = (uint8_t)rng_int(r, 256);
    bt->n = 3 * B;
    bt->batch_idx = xmalloc(bt->n * sizeof(int));
    bt->cls = xmalloc(bt->n * sizeof(int));
    bt->box = xmalloc(bt->n * 4 * sizeof(float));
    for (int i = 0; i < bt->n; i++) {
        bt->batch_idx[i] = i / 3;
        bt->cls[i] = rng_int(r, 3);
        float w = (float)rng_range(r, 0.1, 0.5), h = (float)rng_range(r, 0.1, 0.5);
        float *b = bt->box + 4 * i;
        b[0] = (float)rng_range(r, w / 2, 1 - w / 2), b[1] = (float)rng_range(r, h / 2, 1 - h / 2), b[2] = w, b[3] = h;
    }
    return bt;
}

static void free_batch(Batch *bt) { free(bt->img); free(bt->batch_idx); free(bt->cls); free(bt->box); free(bt); }

// a real trainer arena: training step then validation step; both must reach exactly the plan
static void test_trainer_plan(char scale, int B, int S, int recompute, int adamw) {
    Rng r;
    rng_seed(&r, 11);
    PlanOpts o = {.scale = scale, .nc = 3, .B = B, .S = S, .max_boxes = 50, .adamw = adamw, .recompute = recompute};
    Plan tr, va;
    size_t planned = plan_train(&o, &tr, &va);
    Trainer *t = xcalloc(1, sizeof(Trainer));
    model_build(&t->m, scale, 3);
    t->m.recompute = recompute;
    t->B = B, t->S = S, t->vB = 2 * B;
    t->lcfg = loss_config_default();
    t->lcfg.max_boxes = 50;
    t->opt.kind = adamw ? OPT_ADAMW : OPT_SGD;
    int V = S + 32;
    t->arena = xcalloc(1, sizeof(Arena));
    t->arena->cap = planned;
    t->arena->base = aligned_alloc(64, planned);
    trainer_alloc(t, t->arena, (size_t)2 * B * 3 * V * V, 1);
    model_init_params(&t->m, 1);
    Batch *bt = fake_batch(B, S, S, &r);
    input_from_batch(t->x, bt);
    LossOut lo = trainer_step(t, bt, B, S, S, 1);
    size_t high_train = t->arena->high;
    Batch *bv = fake_batch(2 * B, V, V, &r);   // validation batches are twice the training batch
    input_from_batch(t->x, bv);
    trainer_step(t, bv, 2 * B, V, V, 0);
    model_release(&t->m, t->arena);
    check(isfinite(lo.total) && high_train == tr.total && t->arena->high == planned,
          "yolov8%c B=%d imgsz=%d recompute=%d %s: train high-water %zu == plan %zu, with validation (2B) at %d: %zu "
          "== %zu",
          scale, B, S, recompute, adamw ? "AdamW" : "SGD", high_train, tr.total, V, t->arena->high, planned);
    free_batch(bt);
    free_batch(bv);
    free(t->arena->base);
    free(t->arena);
    free(t);
}

int main(void) {
    test_trainer_plan('n', 2, 64, 0, 0);
    test_trainer_plan('n', 3, 96, 1, 1);
    test_trainer_plan('s', 1, 64, 1, 0);

    // batch=-1: the batch plan_max_batch returns fits, the next one does not
    PlanOpts o = {.scale = 'n', .nc = 80, .S = 640, .max_boxes = 400, .half = 1};
    size_t budgets[3] = {(size_t)2 << 30, (size_t)6 << 30, (size_t)8 << 30};
    for (int i = 0; i < 3; i++) {
        int b = plan_max_batch(o, (size_t)(budgets[i] * AUTOBATCH_FRACTION));
        PlanOpts p = o, q = o;
        p.B = b, q.B = b + 1;
        size_t fb = plan_device_bytes(&p), fb1 = plan_device_bytes(&q);
        check(b >= 1 && fb <= budgets[i] * 0.6 && fb1 > budgets[i] * 0.6,
              "batch=-1 for %.0f GiB: batch %d needs %.1f MiB <= 60%% (%.1f MiB) < batch %d's %.1f MiB",
              budgets[i] / 1073741824.0, b, fb / 1048576.0, budgets[i] * 0.6 / 1048576.0, b + 1, fb1 / 1048576.0);
    }

    // `yolo plan` takes batch=-1 and a fraction (it refused -1 before checking for it), and refuses
    // 0, -2 and 2.5 with a message naming the key
    static const struct {
        const char *b;
        int ok;
    } cli[] = {{"-1", 1}, {"0.6", 1}, {"16", 1}, {"0", 0}, {"-2", 0}, {"2.5", 0}};
    for (int i = 0; i < 6 && access("./yolo", X_OK) == 0; i++) {
        char cmd[256], out[4096] = "";
        snprintf(cmd, sizeof cmd, "./yolo plan model=yolov8n nc=80 imgsz=640 gpu_mem=8G batch=%s 2>&1", cli[i].b);
        FILE *f = popen(cmd, "r");
        size_t n = f ? fread(out, 1, sizeof out - 1, f) : 0;
        out[n] = 0;
        int rc = f ? pclose(f) : -1;
        int ok = rc == 0 && strstr(out, "FITS");
        check(cli[i].ok ? ok : rc != 0 && strstr(out, "batch="), "yolo plan batch=%s: %s", cli[i].b,
              cli[i].ok ? "plans and reports FITS" : "refused, naming batch=");
    }

    // the figures the issues promise, on the device step's own dry run (AMP, 640, batch 16, whole arena)
    static const struct { char s; int rc; double limit_gb; } want[] = {{'n', 0, 1.0}, {'n', 1, 0.7}, {'x', 0, 5.0}};
    for (int i = 0; i < 3; i++) {
        PlanOpts p = {
                .scale = want[i].s, .nc = 80, .B = 16, .S = 640, .max_boxes = 400, .half = 1, .recompute = want[i].rc};
        double gb = plan_train(&p, NULL, NULL) / 1e9;
        check(gb < want[i].limit_gb, "planned device arena yolov8%c 640 batch 16 AMP recompute=%d: %.3f GB < %.1f GB",
              want[i].s, want[i].rc, gb, want[i].limit_gb);
    }
    // amp=0 on the device: the same schedule with FP32 activations, larger than AMP's but below twice it
    PlanOpts a16 = {.scale = 'n', .nc = 80, .B = 16, .S = 640, .max_boxes = 400, .half = 1}, a32 = a16;
    a32.fp32 = 1;
    double g16 = plan_train(&a16, NULL, NULL) / 1e9, g32 = plan_train(&a32, NULL, NULL) / 1e9;
    check(g32 > g16 && g32 < 2 * g16,
          "device plan yolov8n 640 batch 16: amp=0 %.3f GB, between AMP's %.3f GB and twice it", g32, g16);
    return test_summary();
}
