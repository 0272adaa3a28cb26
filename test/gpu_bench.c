// gpu_bench.c: wall time of the device training step, the GPU counterpart of bench_step.c (make test-gpu
// builds it against the nvcc-built kernels; it needs a GPU and is a benchmark, never a test; not named
// bench_*.c: the main Makefile would build it without kernels).
// One step as the trainer runs it on a batch already in host memory (pageable, then page-locked as the
// trainer's loader buffers are; the last line is the page-locked figure): the uint8 images uploaded and
// converted, forward, loss (its five sums read back: the step's one synchronisation), backward,
// gradient clip and optimizer step (SGD, Ultralytics' momentum and weight decay), gradients zeroed.
// Random images and 4 random boxes per image, nc 80. The mean of N steps after 5 warm-up steps, timed
// from the host (launch overhead included); with YOLO_PROFILE=1 each launch is waited for and the
// device time by kind printed at the end (slower, for the shares). test/bench_step.py --device cuda
// times PyTorch's step on the same machine.
// GPU_BENCH_PROFILE_LAST=1: cudaProfilerStart/Stop around the last step alone (ncu --profile-from-start off).
// Usage: test/bin/gpu/gpu_bench [scale n|s|m|l|x] [B=16] [S=640] [steps=30] [amp=1]
// The last line is machine-readable:  gpustep scale S B amp ms_per_step images_per_s
#ifndef TESTING
#define TESTING
#endif
#define YOLO_CUDA
#include "../yolo.c"

#include "yolo_test.h"
#include <cuda_profiler_api.h>

int main(int argc, char **argv) {
    char scale = argc > 1 ? argv[1][0] : 'n';
    int B = argc > 2 ? atoi(argv[2]) : 16, S = argc > 3 ? atoi(argv[3]) : 640, N = argc > 4 ? atoi(argv[4]) : 30,
        amp = argc > 5 ? atoi(argv[5]) : 1;
    if (!strchr("nsmlx", scale) || B < 1 || S < 32 || S % 32 || N < 1)
        die("usage: gpu_bench [n|s|m|l|x] [B>=1] [S, a multiple of 32] [steps>=1] [amp 0|1]");
    Model *m = xcalloc(1, sizeof(Model));
    model_open(m, scale, 80, 1, 32, 32, 1);   // the host arena only holds the weights here
    size_t nimg = (size_t)B * 3 * S * S;
    uint8_t *img = xmalloc(nimg);
    Rng r;
    rng_seed(&r, 1);
    for (size_t i = 0; i < nimg; i++) img[i] = (uint8_t)(rng_uniform(&r) * 255);
    enum { NBOX = 4 };
    int n = B * NBOX, *bi = xmalloc(n * sizeof(int)), *ci = xmalloc(n * sizeof(int));
    float *box = xmalloc(4 * n * sizeof(float));
    random_targets(&r, n, NBOX, 80, bi, ci, box);
    LossTargets tg = {n, bi, ci, box};
    LossConfig lc = loss_config_default();
    Optimizer opt = sgd_test();
    GpuShape shp = {B, S, S, 1};
    Gpu *g = gpu_open(m, 0, amp, 1, &shp, &opt, NULL, NULL, &lc);
    double ms = 0, loss = 0;
    int prof_last = getenv("GPU_BENCH_PROFILE_LAST") != NULL;
    // the batch first in pageable memory, then page-locked as the trainer holds it (gpu_pin_loader)
    for (int pinned = 0; pinned < 2; pinned++) {
        if (pinned) GPU_CHECK(cudaHostRegister(img, nimg, cudaHostRegisterDefault));
        double t0 = 0;
        int taken = 0;
        for (int it = 0; it < 5 + N; it++) {
            if (it == 5) {
                GPU_CHECK(cudaDeviceSynchronize());
                t0 = now_sec();
            }
            if (prof_last && pinned && it == 5 + N - 1) GPU_CHECK(cudaProfilerStart());
            gpu_zero_grad(g);
            LossOut lo = gpu_train_step(g, &shp, img, &tg, &lc);
            taken += gpu_optimize(g, NULL) && it >= 5;
            loss = lo.total;
        }
        GPU_CHECK(cudaDeviceSynchronize());
        if (prof_last && pinned) GPU_CHECK(cudaProfilerStop());
        ms = (now_sec() - t0) * 1e3 / N;
        printf("yolo.c yolov8%c device training step, batch %d, %dx%d, %s, the batch in %s host memory: %.2f ms a step "
               "(mean of %d after 5 warm-ups, %d optimizer steps taken), %.0f images/s; last loss %.3f; device arena "
               "%.1f MiB\n",
               scale, B, S, S, amp ? "FP16 (amp)" : "FP32", pinned ? "page-locked" : "pageable", ms, N, taken,
               B * 1e3 / ms, loss, g->plan / 1048576.0);
    }
    GPU_CHECK(cudaHostUnregister(img));
    printf("gpustep %c %d %d %d %.4f %.1f\n", scale, S, B, amp, ms, B * 1e3 / ms);
    gpu_close(g);
    return 0;
}
