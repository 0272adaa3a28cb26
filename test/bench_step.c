// bench_step.c: CPU time of one whole training step of YOLOv8n (nc 80): forward and loss, backward,
// gradient clip and SGD, the same step test/bench_step.py times in PyTorch. Random input in
// [0, 1] and 4 random boxes per image. Best of N (default 5) after one warm-up step.
// Usage: test/bin/bench_step [B=8] [S=320] [reps=5]. The last line is machine-readable for make bench:
//   step S B threads best fwd+loss backward clip+sgd cpu   (seconds; cpu: the best CPU time, all threads)
#define TESTING
#include "../yolo.c"
#include "yolo_test.h"

static double cpu_sec(void) {   // CPU time of the process (all threads): steadier than wall time on a busy machine
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    omp_wait_policy_auto(argv);   // as ./yolo: a short spin on an idle machine, passive on a busy one
    int B = argc > 1 ? atoi(argv[1]) : 8, S = argc > 2 ? atoi(argv[2]) : 320, reps = argc > 3 ? atoi(argv[3]) : 5;
    if (B < 1 || S < 32 || S % 32 || reps < 1) die("usage: bench_step [B>=1] [S, a multiple of 32] [reps>=1]");
    Model *m = xmalloc(sizeof(Model));
    model_build(m, 'n', 80);
    LossConfig lcfg = loss_config_default();
    size_t loss_bytes = loss_scratch_bytes(B, loss_num_anchors(S, S), lcfg.max_boxes);
    Plan p = model_plan(m, B, S, S);
    Arena *a = xcalloc(1, sizeof(Arena));
    a->cap = p.total + loss_bytes + (size_t)m->nparams * sizeof(float) + 4096;   // + loss scratch, SGD momentum
    a->base = aligned_alloc(ARENA_ALIGN, (a->cap + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN);
    if (!a->base) die("cannot allocate the %.1f MiB arena", a->cap / 1048576.0);
    model_alloc_params(m, a);
    model_init_params(m, 0);
    Optimizer opt = {.kind = OPT_SGD, .lr = {0.01, 0.01, 0.01}, .momentum = 0.937, .weight_decay = 5e-4};
    opt.m = azfloat(a, m->nparams, G_OPTIM);

    float *x = xmalloc((size_t)B * 3 * S * S * sizeof(float));
    Rng r;
    rng_seed(&r, 1);
    for (size_t i = 0; i < (size_t)B * 3 * S * S; i++) x[i] = (float)rng_uniform(&r);
    enum { NBOX = 4 };
    int bi[8 * NBOX * 64], ci[8 * NBOX * 64], n = B * NBOX < 8 * NBOX * 64 ? B * NBOX : 8 * NBOX * 64;
    float box[4 * 8 * NBOX * 64];
    random_targets(&r, n, NBOX, 80, bi, ci, box);
    LossTargets tg = {n, bi, ci, box};

    m->train = 1;
    m->infer = 0;
    double best = 1e9, bf = 0, bb = 0, bo = 0, loss = 0, bcpu = 1e9;
    for (int it = 0; it <= reps; it++) {   // it 0 is the warm-up
        double t0 = now_sec(), c0 = cpu_sec();
        model_input(m, x, B, S, S);
        Exec e = exec_cpu(m, a);
        walk_forward(&e);
        walk_head_grad(&e, 0);
        LossOut lo = e.be->loss(&e, &tg, &lcfg);
        double t1 = now_sec();
        walk_backward(&e);
        double t2 = now_sec();
        grad_clip_norm(m, GRAD_CLIP_NORM);
        optim_step(&opt, m);
        model_zero_grad(m);
        double t3 = now_sec(), c3 = cpu_sec();
        loss = lo.total;
        if (it > 0 && c3 - c0 < bcpu) bcpu = c3 - c0;
        if (it > 0 && t3 - t0 < best) best = t3 - t0, bf = t1 - t0, bb = t2 - t1, bo = t3 - t2;
    }
    int th = omp_threads();
    const char *wait = getenv("YOLO_OMP_WAIT");
    printf("yolo.c  yolov8n whole training step, batch %d, %dx%d, %d threads, best of %d: %.3f s "
           "(forward+loss %.3f / backward %.3f / clip+SGD %.3f); CPU time %.3f s; last loss %.3f; waiting: %s\n",
           B, S, S, th, reps, best, bf, bb, bo, bcpu, loss,
           wait ? wait : getenv("OMP_WAIT_POLICY") ? getenv("OMP_WAIT_POLICY") : "GOMP_SPINCOUNT as set");
    printf("step %d %d %d %.4f %.4f %.4f %.4f %.4f\n", S, B, th, best, bf, bb, bo, bcpu);
    free(x), free(a->base), free(a), free(m);
    return 0;
}
