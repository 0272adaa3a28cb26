/*
 * yolo.c: YOLOv8 object detection training in plain C, with a CPU reference of every op.
 *
 * Build:  make            (CPU binary; the CUDA backend is built too when nvcc is found)
 * Run:    ./yolo info model=yolov8n nc=80 imgsz=640
 *         ./yolo plan model=yolov8n nc=80 batch=16 imgsz=640
 *         ./yolo shapes out=data/shapes      (synthetic dataset)
 * Tests:  make test   (each test/test_X.c includes this file with -DTESTING and call its functions)
 *
 * The network is the Ultralytics YOLOv8 detection model (../shared/spec/yolov8.md section 1):
 * same layer graph, parameter names and numbers. Memory is planned before the first step:
 * every buffer a forward+backward uses comes out of one arena whose size is computed by
 * running the same schedule in "dry" mode (no memory touched), see the arena section.
 *
 * DEVIATIONS from Ultralytics (known, deliberate):
 *  - BN batch statistics are computed in one pass in double precision (PyTorch: Welford in
 *    float); differences are at the 1e-7 relative level.
 *  - The conv weight init uses our own RNG, so a seed does not reproduce PyTorch's draws.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <stdarg.h>
#include <string.h>
#include <math.h>
#include <float.h>
#include <time.h>
#include <errno.h>
#include <limits.h>
#ifdef _OPENMP
#include <omp.h>
#endif

// ------------------------------------------------------------------------------------------
// checks and small utilities
// ------------------------------------------------------------------------------------------

// die: print file:line, what failed and a hint, then exit(1). Used for impossible settings and
// programmer errors; bad user data gets a message and is skipped instead (see the data section).
#define die(...) die_at(__FILE__, __LINE__, __VA_ARGS__)
static void die_at(const char *file, int line, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "error (%s:%d): ", file, line);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(1);
}

static void *xmalloc_at(size_t n, const char *file, int line) {
    void *p = malloc(n ? n : 1);
    if (!p) die_at(file, line, "out of host memory allocating %zu bytes (hint: lower batch, imgsz or cache)", n);
    return p;
}
static void *xcalloc_at(size_t n, size_t s, const char *file, int line) {
    void *p = calloc(n ? n : 1, s ? s : 1);
    if (!p) die_at(file, line, "out of host memory allocating %zu x %zu bytes", n, s);
    return p;
}
static FILE *xfopen_at(const char *path, const char *mode, const char *file, int line) {
    FILE *f = fopen(path, mode);
    if (!f) die_at(file, line, "cannot open '%s' (%s): %s", path, mode, strerror(errno));
    return f;
}
#define xmalloc(n) xmalloc_at((n), __FILE__, __LINE__)
#define xcalloc(n, s) xcalloc_at((n), (s), __FILE__, __LINE__)
#define xfopen(p, m) xfopen_at((p), (m), __FILE__, __LINE__)

static double now_sec(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// Rng: a small, fast, seedable generator (splitmix64 seeding, xoshiro256** stepping).
// Every random decision in the project draws from an Rng that is part of saved state.
typedef struct { uint64_t s[4]; } Rng;

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}
static void rng_seed(Rng *r, uint64_t seed) {
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&seed);
}
static inline uint64_t rotl64(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
static uint64_t rng_u64(Rng *r) {
    uint64_t *s = r->s, out = rotl64(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0]; s[3] ^= s[1]; s[1] ^= s[2]; s[0] ^= s[3]; s[2] ^= t; s[3] = rotl64(s[3], 45);
    return out;
}
// uniform double in [0, 1)
static double rng_uniform(Rng *r) { return (rng_u64(r) >> 11) * (1.0 / 9007199254740992.0); }
// uniform double in [a, b)
static double rng_range(Rng *r, double a, double b) { return a + (b - a) * rng_uniform(r); }
// uniform integer in [0, n)
static int rng_int(Rng *r, int n) { return n <= 0 ? 0 : (int)(rng_uniform(r) * n); }
static double rng_normal(Rng *r) {
    double u1 = rng_uniform(r), u2 = rng_uniform(r);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

// ------------------------------------------------------------------------------------------
// command-line arguments: Ultralytics style key=value
// ------------------------------------------------------------------------------------------

// arg_get: the value of key=value among argv[first..argc), or def when absent.
static const char *arg_get(int argc, char **argv, const char *key, const char *def) {
    size_t n = strlen(key);
    for (int i = 1; i < argc; i++)
        if (strncmp(argv[i], key, n) == 0 && argv[i][n] == '=') return argv[i] + n + 1;
    return def;
}
// arg_check: every argument must be key=value with a key from the list; names the offender.
static void arg_check(int argc, char **argv, const char *const *keys) {
    for (int i = 2; i < argc; i++) {
        const char *eq = strchr(argv[i], '=');
        if (!eq) die("argument '%s' is not key=value (e.g. imgsz=640)", argv[i]);
        int ok = 0;
        for (int k = 0; keys[k]; k++)
            if ((size_t)(eq - argv[i]) == strlen(keys[k]) && strncmp(argv[i], keys[k], eq - argv[i]) == 0) ok = 1;
        if (!ok) die("unknown key '%.*s' in '%s' for '%s'", (int)(eq - argv[i]), argv[i], argv[i], argv[1]);
    }
}
static double arg_num(int argc, char **argv, const char *key, double def) {
    const char *v = arg_get(argc, argv, key, NULL);
    if (!v) return def;
    char *end;
    double x = strtod(v, &end);
    if (end == v || *end) die("%s=%s: expected a number", key, v);
    return x;
}
static long arg_int(int argc, char **argv, const char *key, long def) {
    double x = arg_num(argc, argv, key, (double)def);
    if (x != floor(x) || fabs(x) > 1e15) die("%s=%g: expected an integer", key, x);
    return (long)x;
}

// ==========================================================================================
// (the network sections go here)
// ==========================================================================================

// ------------------------------------------------------------------------------------------
// loss: task-aligned assigner, BCE, CIoU, DFL
// ------------------------------------------------------------------------------------------
#include "parts/loss.c"

// ------------------------------------------------------------------------------------------
// weights: safetensors with Ultralytics state_dict names
// ------------------------------------------------------------------------------------------
#include "parts/weights.c"

// ------------------------------------------------------------------------------------------
// data: yaml, labels, decoding, letterbox, augmentation, loader, synthetic shapes
// ------------------------------------------------------------------------------------------
#include "parts/data.c"

// ------------------------------------------------------------------------------------------
// evaluation: decode, NMS, matching, mAP
// ------------------------------------------------------------------------------------------
#include "parts/eval.c"

// ------------------------------------------------------------------------------------------
// main
// ------------------------------------------------------------------------------------------
#ifndef TESTING
typedef struct { const char *name; int (*fn)(int, char **); const char *help; } Command;

int main(int argc, char **argv) {
    static const Command cmds[] = {
        {"shapes", cmd_shapes, "write the synthetic shapes dataset: out=DIR [ntrain= nval= imgsz= seed=]"},
        {"augment", cmd_augment, "write a grid of augmented training samples: data=FILE out=FILE.jpg"},
    };
    int n = (int)(sizeof cmds / sizeof cmds[0]);
    if (argc >= 2)
        for (int i = 0; i < n; i++)
            if (strcmp(argv[1], cmds[i].name) == 0) return cmds[i].fn(argc, argv);
    fprintf(stderr, "usage: yolo COMMAND key=value ...\n");
    for (int i = 0; i < n; i++) fprintf(stderr, "  %-8s %s\n", cmds[i].name, cmds[i].help);
    return argc >= 2 ? 1 : 0;
}
#endif
