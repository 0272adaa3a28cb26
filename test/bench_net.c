// bench_net.c: CPU time of one forward+backward of YOLOv8n (batch 8, 320x320), images/s and
// effective GFLOP/s (3 x the fused forward FLOPs per image, the usual training-step estimate).
#define TESTING
#include "../yolo.c"
#include "yolo_test.h"

int main(int argc, char **argv) {
    int B = argc > 1 ? atoi(argv[1]) : 8, S = argc > 2 ? atoi(argv[2]) : 320, reps = argc > 3 ? atoi(argv[3]) : 5;
    Model *m = xmalloc(sizeof(Model));
    Arena *a = model_open(m, 'n', 80, B, S, S, 0);
    m->train = 1;
    float *x = xmalloc((size_t)B * 3 * S * S * sizeof(float));
    Rng r;
    rng_seed(&r, 1);
    for (size_t i = 0; i < (size_t)B * 3 * S * S; i++) x[i] = (float)rng_uniform(&r);
    double gflop = 3 * model_flops(m, S, 1) * B;   // model_flops reshapes to 32x32; reshape back below
    model_step_schedule(m, a, x, B, S, S);         // warm-up
    double best = 1e9, tf = 1e9;
    for (int i = 0; i < reps; i++) {
        double t0 = now_sec();
        model_forward(m, a, x, B, S, S);
        double t1 = now_sec();
        model_head_grad(m, a);
        model_backward(m, a);
        double t2 = now_sec();
        if (t2 - t0 < best) best = t2 - t0;
        if (t1 - t0 < tf) tf = t1 - t0;
    }
#ifdef _OPENMP
    int th = omp_get_max_threads();
#else
    int th = 1;
#endif
    printf("yolov8n forward+backward, batch %d, %dx%d, %d threads: %.3f s (forward %.3f s), %.1f images/s, %.1f "
           "GFLOP/s effective\n",
           B, S, S, th, best, tf, B / best, gflop / best);
    return 0;
}
