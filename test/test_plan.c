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

// arena_layout on random schedules: persistent blocks, then segments (steps) that allocate and free
// in random order and end empty. The layout must give blocks live at the same time disjoint ranges
// and be at least the most bytes ever live (first-fit's size is printed: greedy by size is not
// always smaller, which is why gpu_plan_run keeps the smaller), and a real arena of its size must
// replay every step (each allocation at its planned offset, none strayed).
static void test_arena_layout(int seed) {
    Rng r;
    rng_seed(&r, (uint64_t)seed);
    enum { NSEG = 3, NLIVE = 40 };
    Arena *a = xcalloc(1, sizeof(Arena));
    a->cap = SIZE_MAX;
    arena_record(a);
    int np = 2 + rng_int(&r, 4);
    for (int i = 0; i < np; i++) arena_alloc(a, 64 * (1 + (size_t)rng_int(&r, 200)), G_PARAMS);
    // the schedule, to replay: per segment, ops (size > 0: allocate; size 0: free the k-th live block)
    int nops[NSEG];
    size_t op_size[NSEG][400];
    int op_k[NSEG][400];
    for (int s = 0; s < NSEG; s++) {
        void *live[NLIVE];
        int nl = 0, n = 0;
        arena_step_begin(a, s);
        while (n < 360 && (n < 200 || nl > 0)) {
            int alloc = nl < NLIVE && n < 200 && (nl == 0 || rng_int(&r, 3) > 0);
            if (alloc) {
                size_t sz = 64 * (1 + (size_t)rng_int(&r, rng_int(&r, 4) ? 50 : 5000));
                live[nl++] = arena_alloc(a, sz, G_ACTS);
                op_size[s][n] = sz, op_k[s][n] = 0;
            } else {
                int k = rng_int(&r, nl);
                arena_free(a, live[k]);
                live[k] = live[--nl];
                op_size[s][n] = 0, op_k[s][n] = k;
            }
            n++;
        }
        while (nl > 0) { arena_free(a, live[--nl]); op_size[s][n] = 0, op_k[s][n] = nl; n++; }
        nops[s] = n;
        arena_step_end(a);
    }
    // the recording, kept for the overlap check (arena_layout frees it)
    int nrec = a->nrec;
    ArenaRec *rec = xmalloc((size_t)nrec * sizeof(ArenaRec));
    memcpy(rec, a->rec, (size_t)nrec * sizeof(ArenaRec));
    size_t first_fit = a->high, live_max = a->live_max;
    ArenaLayout *L = arena_layout(a);
    int bad = 0;
    for (int i = np, k = 0; L && i < nrec; i++, k++) {   // the layout's offsets, in recording order
        rec[i].off = L->off[k];
        if (L->size[k] != rec[i].size) bad++;
    }
    for (int i = 0; L && i < nrec; i++)
        for (int j = i + 1; j < nrec; j++) {
            const ArenaRec *p = &rec[i], *q = &rec[j];
            int together = p->t0 < q->t1 && q->t0 < p->t1 && (p->seg < 0 || q->seg < 0 || p->seg == q->seg);
            if (together && p->off < q->off + q->size && q->off < p->off + p->size) bad++;
        }
    // replay on an arena of the layout's size (base: a host buffer; nothing is written to it)
    char *mem = L ? xmalloc(L->total) : NULL;
    Arena *b = xcalloc(1, sizeof(Arena));
    *b = (Arena){.base = mem, .cap = L ? L->total : 0, .lay = L};
    for (int i = 0; L && i < np; i++) arena_alloc(b, (size_t)rec[i].size, G_PARAMS);
    for (int s = 0; L && s < NSEG; s++) {
        void *live[NLIVE];
        int nl = 0;
        arena_step_begin(b, s);
        for (int n = 0; n < nops[s]; n++) {
            if (op_size[s][n]) live[nl++] = arena_alloc(b, op_size[s][n], G_ACTS);
            else { arena_free(b, live[op_k[s][n]]); live[op_k[s][n]] = live[--nl]; }
        }
        arena_step_end(b);
    }
    check(L && !bad && L->total >= live_max && b->replay_miss == 0 &&
                  b->replayed == nrec - np && b->high == L->total,
          "arena_layout, random schedule %d (%d persistent blocks, %d step allocations in %d steps): %d overlaps of "
          "blocks live together; layout %zu bytes, most live %zu, first-fit %zu; replayed %ld, strayed %ld",
          seed, np, nrec - np, NSEG, bad, L ? L->total : 0, live_max, first_fit, b->replayed, b->replay_miss);
    arena_layout_free(L);
    free(mem), free(rec), free(a), free(b);
}

int main(void) {
    for (int seed = 1; seed <= 4; seed++) test_arena_layout(seed);
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
    // issue 14's goal: yolov8n 640 batch 16 AMP within 800 MB (the layout's, first-fit planned 819.7 MB)
    PlanOpts g14 = {.scale = 'n', .nc = 80, .B = 16, .S = 640, .max_boxes = 400, .half = 1};
    double mb14 = plan_train(&g14, NULL, NULL) / 1e6;
    check(mb14 <= 800.0, "planned device arena yolov8n 640 batch 16 AMP: %.1f MB <= 800 MB", mb14);
    // amp=0 on the device: the same schedule with FP32 activations, larger than AMP's but below twice it
    PlanOpts a16 = {.scale = 'n', .nc = 80, .B = 16, .S = 640, .max_boxes = 400, .half = 1}, a32 = a16;
    a32.fp32 = 1;
    double g16 = plan_train(&a16, NULL, NULL) / 1e9, g32 = plan_train(&a32, NULL, NULL) / 1e9;
    check(g32 > g16 && g32 < 2 * g16,
          "device plan yolov8n 640 batch 16: amp=0 %.3f GB, between AMP's %.3f GB and twice it", g32, g16);
    return test_summary();
}
