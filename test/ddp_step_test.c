// ddp_step_test.c: one data-parallel training step over the emulated NCCL (test/emu_include/nccl.h,
// across processes) against the single-process step that accumulates the same sub-batches.
// YOLOv8n, nc 3, one 64x64 image per sub-batch, amp=0 (the FP32 device step), SGD.
// For WORLD = 2 and 3: WORLD rank processes and one reference process are forked (before any
// OpenMP or CUDA use, so each starts clean). Rank r steps on sub-batch r through the trainer's own
// data-parallel backend twice: first as a backward inside an accumulation window (no all-reduce, as
// DDP's no_sync) followed by ddp_allreduce_grads (the whole gradient at once); then, from the same
// state, as the window's last backward, whose buckets (YOLO_DDP_BUCKET_MB=1 here: 12 buckets) are
// all-reduced from gpu_conv_grads while the backward goes on (ddp_grads_done); then
// ddp_trainer_optimize. ddp_trainer_step also agrees on a non-finite loss and broadcasts rank 0's
// running stats. The reference runs gpu_trainer_step on
// sub-batches 0..WORLD-1 in turn, gradients accumulating, then the same optimizer step. Each sub-batch
// is normalised by its own BN batch statistics on both sides. Checked:
//   - the summed gradient equals the reference's accumulated one: bit for bit where the order
//     matches, else within FP32 summation-order tolerance: |diff| <= (WORLD-1) * 2^-23 * sum_r |g_r|
//     per element (g_r: rank r's own gradient, downloaded before the all-reduce);
//   - the updated weights after the optimizer step: within the tolerance the gradient difference
//     allows (the SGD step is lr * g, so lr x that bound, plus one ulp of the weight);
//   - the overlapped all-reduce gives the same bits as the one after the backward, and every bucket
//     started before the backward ended;
//   - every rank holds the same bits (gradients, weights, BN running stats);
//   - the running stats equal the reference's after sub-batch 0 (rank 0's, as DDP's buffer broadcast).
// Built by test/emu.mk against the CPU emulation of yolo_kernels.cu; run by test/run_emu.sh.
#ifndef TESTING
#define TESTING
#endif
#define YOLO_CUDA
#define YOLO_NCCL
#include "../yolo.c"

#include "test.h"
#include "yolo_test.h"
#include <sys/mman.h>
#include <sys/wait.h>

enum { TS = 64, TNC = 3, MAXW = 3 };

// Result: what one process reports through the shared map (floats of the model's sizes)
typedef struct { float *local, *reduced, *params, *buffers, *buffers0, *overlap, *info; } Result;
static size_t NP, NB;
static float *shared_map;
#define SLOT_FLOATS (4 * NP + 2 * NB + 2)
static Result result_at(int slot) {   // slot 0..WORLD-1: ranks; WORLD: the reference
    float *p = shared_map + (size_t)slot * SLOT_FLOATS;
    return (Result){p, p + NP, p + 2 * NP, p + 3 * NP, p + 3 * NP + NB, p + 3 * NP + 2 * NB, p + 4 * NP + 2 * NB};
}

// sub_batch: image and labels of sub-batch s (one image): smooth blobs plus noise, two boxes
static void sub_batch(int s, Batch *bt, uint8_t *img, int *bidx, int *cls, float *box) {
    Rng r;
    rng_seed(&r, 100 + s);
    for (int i = 0; i < 3 * TS * TS; i++) {
        int px = i % TS, py = i / TS % TS, ch = i / (TS * TS);
        double v = 128 + 90 * sin(px * (0.15 + 0.03 * s) + ch) * cos(py * 0.17 - ch - s) + rng_range(&r, -30, 30);
        img[i] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
    }
    float bx[2][4] = {{0.3f + 0.1f * s, 0.35f, 0.3f, 0.25f}, {0.65f, 0.6f - 0.05f * s, 0.4f, 0.45f}};
    for (int k = 0; k < 2; k++) bidx[k] = 0, cls[k] = (s + k) % TNC, memcpy(box + 4 * k, bx[k], sizeof bx[k]);
    memset(bt, 0, sizeof *bt);
    bt->img = img, bt->batch_idx = bidx, bt->cls = cls, bt->box = box;
    bt->B = 1, bt->H = bt->W = TS, bt->n = 2;
}

// trainer_for_test: the pieces of a Trainer the device step and optimizer read: YOLOv8n from
// seed 11, SGD lr 0.01, its device arena for one 64x64 image, amp=0
static Trainer *trainer_for_test(void) {
    Trainer *t = xcalloc(1, sizeof(Trainer));
    model_open(&t->m, 'n', TNC, 1, TS, TS, 11);
    t->lcfg = loss_config_default();
    t->opt = (Optimizer){.kind = OPT_SGD, .lr = {0.01, 0.01, 0.01}, .momentum = 0.9, .beta2 = 0.999, .eps = 1e-8,
                         .weight_decay = 5e-4};
    t->cfg.amp = 0;
    snprintf(t->dir, sizeof t->dir, "(test)");
    GpuShape shp = {1, TS, TS, 1};
    t->gpu = gpu_open(&t->m, 0, 0, 1, &shp, &t->opt, NULL, NULL, &t->lcfg);
    gpu_zero_grad(t->gpu);
    return t;
}

// sub_step: sub-batch s through step (the data-parallel or the single-device trainer step); 1 if
// its loss was not finite
static int sub_step(Trainer *t, int s, LossOut (*step)(Trainer *, const Batch *, int *)) {
    Batch bt;
    uint8_t img[3 * TS * TS];
    int bidx[2], cls[2], bad;
    float box[8];
    sub_batch(s, &bt, img, bidx, cls, box);
    step(t, &bt, &bad);
    if (bad) fprintf(stderr, "sub-batch %d: non-finite loss\n", s);
    return bad;
}

// rank_main: rank r of world: its sub-batch through the data-parallel backend
static int rank_main(int world, int r, ncclUniqueId id) {
    ddp.world = world, ddp.rank = r, ddp.local_rank = r, ddp.dev = 0;
    ddp_comm_open(id);
    Trainer *t = trainer_for_test();
    ddp_buckets_open(&t->m);
    t->gpu->grads_done = ddp_grads_done;
    // a backward inside the window: no all-reduce; then the whole gradient summed at once
    t->will_optimize = 0;
    if (sub_step(t, r, ddp_trainer_step)) return 1;
    Result res = result_at(r);
    gpu_download(t->gpu, NULL, NULL, res.local, NULL, NULL, NULL, NULL);
    ddp_allreduce_grads(t->gpu);
    gpu_download(t->gpu, NULL, res.buffers0, res.reduced, NULL, NULL, NULL, NULL);
    // the same sub-batch from the same state as the window's last backward: the buckets all-reduced
    // as the backward reaches them
    gpu_zero_grad(t->gpu);
    gpu_bn_restore(t->gpu);
    ddp.reduced = 0, t->will_optimize = 1;
    if (sub_step(t, r, ddp_trainer_step)) return 1;
    gpu_download(t->gpu, NULL, NULL, res.overlap, NULL, NULL, NULL, NULL);
    res.info[0] = (float)ddp.early, res.info[1] = (float)ddp.nbucket;
    ddp_trainer_optimize(t);   // the gradients are summed already: no second all-reduce
    gpu_download(t->gpu, res.params, res.buffers, NULL, NULL, NULL, NULL, NULL);
    gpu_close(t->gpu);
    ncclCommDestroy(ddp.comm);
    return 0;
}

// reference_main: one process, the same sub-batches accumulated, the same optimizer step
static int reference_main(int world) {
    Trainer *t = trainer_for_test();
    Result res = result_at(world);
    for (int s = 0; s < world; s++) {
        if (sub_step(t, s, gpu_trainer_step)) return 1;
        if (s == 0) gpu_download(t->gpu, NULL, res.buffers0, NULL, NULL, NULL, NULL, NULL);
    }
    gpu_download(t->gpu, NULL, NULL, res.reduced, NULL, NULL, NULL, NULL);
    gpu_trainer_optimize(t);
    gpu_download(t->gpu, res.params, res.buffers, NULL, NULL, NULL, NULL, NULL);
    gpu_close(t->gpu);
    return 0;
}

// compare: the checks for one world size (the children have exited)
static void compare(int world, double lr) {
    Result ref = result_at(world), r0 = result_at(0);
    // gradients: reference vs the all-reduced sum, with the summation-order bound from the ranks' own
    size_t nexact = 0, nover = 0;
    double worst = 0, worst_tol = 0, worst_rel = 0;
    for (size_t i = 0; i < NP; i++) {
        double sabs = 0;
        for (int r = 0; r < world; r++) sabs += fabs(result_at(r).local[i]);
        double tol = (world - 1) * FLT_EPSILON / 2 * sabs, d = fabs((double)r0.reduced[i] - ref.reduced[i]);
        nexact += r0.reduced[i] == ref.reduced[i];
        if (d > tol) nover++;
        if (d > 0 && d / (tol > 0 ? tol : 1e-30) > worst_rel)
            worst_rel = d / (tol > 0 ? tol : 1e-30), worst = d, worst_tol = tol;
    }
    check(nover == 0,
          "%d ranks: summed gradient vs single process accumulating the %d sub-batches: %zu of %zu elements bit-exact, "
          "worst |diff| %.3g against its bound %.3g ((WORLD-1) x 2^-24 x sum_r |g_r|), %zu over",
          world, world, nexact, NP, worst, worst_tol, nover);
    // weights after the step
    size_t pexact = 0, pover = 0;
    double pw = 0;
    for (size_t i = 0; i < NP; i++) {
        double sabs = 0;
        for (int r = 0; r < world; r++) sabs += fabs(result_at(r).local[i]);
        double tol = lr * (world - 1) * FLT_EPSILON / 2 * sabs * 2 + FLT_EPSILON * fabs(ref.params[i]);
        double d = fabs((double)r0.params[i] - ref.params[i]);
        pexact += r0.params[i] == ref.params[i];
        if (d > tol) pover++;
        if (d > pw) pw = d;
    }
    check(pover == 0, "%d ranks: weights after the SGD step vs single process: %zu of %zu bit-exact, worst |diff| %.3g "
          "(bound per element: lr x 2 x the gradient bound + 1 ulp), %zu over", world, pexact, NP, pw, pover);
    // every rank the same bits
    int same = 1;
    for (int r = 1; r < world; r++) {
        Result x = result_at(r);
        same &= !memcmp(x.reduced, r0.reduced, NP * 4) && !memcmp(x.params, r0.params, NP * 4) &&
                !memcmp(x.buffers, r0.buffers, NB * 4);
    }
    check(same,
          "%d ranks: summed gradients, updated weights and BN running stats identical on every rank (bit for bit)",
          world);
    check(!memcmp(r0.buffers0, ref.buffers0, NB * 4),
          "%d ranks: BN running stats after the step are rank 0's: equal (bit for bit) to the single process's after "
          "sub-batch 0",
          world);
    int oexact = 1, early = 1;
    for (int r = 0; r < world; r++) {
        Result x = result_at(r);
        oexact &= !memcmp(x.overlap, x.reduced, NP * 4);
        early &= x.info[0] == x.info[1] && x.info[1] >= 10;
    }
    check(oexact && early,
          "%d ranks: the all-reduce overlapped with the backward (%g buckets, %g of them started before the backward "
          "ended) sums to the same bits as the one after it, on every rank",
          world, r0.info[1], r0.info[0]);
    int differ = 0;
    for (int r = 1; r < world; r++) differ |= !!memcmp(result_at(r).local, r0.local, NP * 4);
    check(differ, "%d ranks: the ranks' own gradients differ before the all-reduce (each stepped on its own sub-batch)",
          world);
}

int main(void) {
    double t0 = now_sec();
    Model probe;
    memset(&probe, 0, sizeof probe);
    model_build(&probe, 'n', TNC);
    NP = probe.nparams, NB = probe.nbuffers;
    size_t bytes = (size_t)(MAXW + 1) * SLOT_FLOATS * sizeof(float);
    setenv("YOLO_DDP_BUCKET_MB", "1", 1);   // YOLOv8n's 11.5 MiB of gradients in 12 buckets
    shared_map = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (shared_map == MAP_FAILED) die("mmap %zu bytes: %s", bytes, strerror(errno));
    for (int world = 2; world <= MAXW; world++) {
        memset(shared_map, 0xff, bytes);
        ncclUniqueId id;
        ncclGetUniqueId(&id);
        pid_t pid[MAXW + 1];
        fflush(stdout);
        for (int p = 0; p <= world; p++) {   // the ranks, then the reference
            pid[p] = fork();
            if (pid[p] < 0) die("fork: %s", strerror(errno));
            if (pid[p] == 0) {
                if (!freopen("/dev/null", "w", stdout)) _exit(3);
                _exit(p < world ? rank_main(world, p, id) : reference_main(world));
            }
        }
        int ok = 1;
        for (int p = 0; p <= world; p++) {
            int st;
            waitpid(pid[p], &st, 0);
            ok &= WIFEXITED(st) && WEXITSTATUS(st) == 0;
        }
        check(ok, "%d ranks: the %d rank processes and the reference process finished", world, world);
        if (ok) compare(world, 0.01);
    }
    printf("(%.1f s)\n", now_sec() - t0);
    return test_summary();
}
