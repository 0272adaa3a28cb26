// gpu_count.c: one training step of the device path (forward, loss, backward, optimizer) under the
// CPU emulation's counter mode (make emu-count; test/cuda_emu.cpp), for test/gpu_model.sh.
// YOLOv8n, 80 classes, batch 16 at 640x640 (or GPU_COUNT="B S" with a model scale letter as a third
// field, e.g. "16 640 s"), with YOLO_PROFILE=1 so that every launch is named after the row of the
// profile table it belongs to ("conv fwd 3x3 s1", "bn+silu backward", ...); the counts go to the
// file EMU_COUNT names; EMU_SAMPLE=N runs N blocks of each larger grid (the figures are scaled).
// It measures memory traffic; the values computed are not checked (sampled blocks leave the rest
// of each output poisoned). Not named test_*.c: the main Makefile would build it without kernels.
#ifndef TESTING
#define TESTING
#endif
#define YOLO_CUDA
#include "../yolo.c"
#include "../yolo.h"
#include "yolo_test.h"

void emu_count_clear(void);   // test/cuda_emu.cpp (counter mode): the launches counted so far dropped

int main(void) {
    int B = 16, S = 640;
    char scale = 'n';
    const char *e = getenv("GPU_COUNT");
    if (e && sscanf(e, "%d %d %c", &B, &S, &scale) < 2) {
        fprintf(stderr, "GPU_COUNT=%s: expected \"B S [scale]\"\n", e);
        return 2;
    }
    if (!getenv("EMU_COUNT")) {
        fprintf(stderr, "gpu_count: set EMU_COUNT=FILE (the counts are written there)\n");
        return 2;
    }
    setenv("YOLO_PROFILE", "1", 1);
    char step[64];   // the counts' "# step:" line (test/gpu_model.sh labels the step and its images/s by it)
    snprintf(step, sizeof step, "yolov8%c imgsz %d batch %d", scale, S, B);
    setenv("EMU_COUNT_STEP", step, 1);
    // the loss kernels run whole: a loss computed from sampled blocks could be non-finite, and the
    // step skips its backward after a non-finite loss; so do the optimizer's, whose first block writes
    // the gradients' norm that decides (on the device and on the host) whether the update runs
    setenv("EMU_SAMPLE_FULL", "loss_,optim_", 0);
    Model *m = xcalloc(1, sizeof(Model));
    model_open(m, scale, 80, 1, 64, 64, 11);   // the host arena only holds the parameters here
    size_t nimg = (size_t)B * 3 * S * S;
    uint8_t *img = xmalloc(nimg);
    Rng r;
    rng_seed(&r, 5);
    for (size_t i = 0; i < nimg; i++) img[i] = (uint8_t)rng_range(&r, 0, 255);
    int nb = 3 * B, *bidx = xmalloc(nb * sizeof(int)), *cls = xmalloc(nb * sizeof(int));
    float *box = xmalloc(nb * 4 * sizeof(float));
    for (int i = 0; i < nb; i++) {
        bidx[i] = i / 3; cls[i] = (i * 7) % 80;
        box[4 * i] = 0.2f + 0.25f * (i % 3);
        box[4 * i + 1] = 0.5f;
        box[4 * i + 2] = 0.1f + 0.1f * (i % 3);
        box[4 * i + 3] = 0.2f;
    }
    LossTargets tg = {nb, bidx, cls, box};
    LossConfig lc = loss_config_default();
    Optimizer opt = sgd_test();
    GpuShape shp = {B, S, S, 1};
    Gpu *g = gpu_open(m, 0, 1, 1, &shp, &opt, NULL, NULL, &lc);
    // the setup's launches (the arena's zeroing, the weights' FP16 copies) are not the step's
    emu_count_clear();
    double t0 = now_sec();
    gpu_zero_grad(g);
    // gpu_train_step's sequence, with the backward run whatever the loss: outputs of the blocks a
    // sampled launch skipped are stale, so the loss is often not finite here, and walk_step would
    // skip the backward after a non-finite loss
    gpu_shape(g, &shp);
    gpu_input_begin(g, img);
    Exec ex = exec_gpu(g);
    walk_forward(&ex);
    walk_head_grad(&ex, 0);
    ex.be->loss(&ex, &tg, &lc);
    walk_backward(&ex);
    gpu_input_end(g);
    // the gradients the sampled launches left poisoned made the norm non-finite, and the optimizer
    // then skipped its update (reading the norm's partials alone): they are made finite first (and
    // small enough that their squares' sum is), by a copy through the host, which the counts do not
    // see, so that the update is counted
    {
        long n = (long)m->nparams;
        float *gh = xmalloc((size_t)n * sizeof(float));
        cudaDeviceSynchronize();
        cudaMemcpy(gh, g->grads, (size_t)n * sizeof(float), cudaMemcpyDeviceToHost);
        long bad = 0;
        for (long i = 0; i < n; i++)
            if (!(fabsf(gh[i]) <= 1e15f)) gh[i] = 0.0f, bad++;   // (no square past FP32's range either)
        cudaMemcpy(g->grads, gh, (size_t)n * sizeof(float), cudaMemcpyHostToDevice);
        free(gh);
        printf("gpu_count: %ld of %ld gradients not finite or over 1e15 (sampled launches), set to 0\n", bad, n);
    }
    double norm = 0;
    const int taken = gpu_optimize(g, &norm);
    if (!taken) {
        fprintf(stderr, "gpu_count: the optimizer skipped its update (gradient norm %g): the count would miss it\n",
                norm);
        return 1;
    }
    cudaDeviceSynchronize();
    printf("gpu_count: yolov8%c batch %d at %dx%d, one step counted in %.1f s (EMU_SAMPLE=%s), device arena %.1f MiB\n",
           scale, B, S, S, now_sec() - t0, getenv("EMU_SAMPLE") ? getenv("EMU_SAMPLE") : "all", g->plan / 1048576.0);
    return 0;
}
