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

// ------------------------------------------------------------------------------------------
// arena: every byte of a step, planned by a dry run of the same schedule
// ------------------------------------------------------------------------------------------
/*
 * The arena is one block of memory. Its size is computed by running the training schedule
 * (forward, loss, backward) with dry = 1: every arena_alloc/arena_free happens exactly as in a
 * real step, but no memory is touched, so the high-water mark of the dry run is the exact size
 * a real step needs. The allocator is first-fit over a fixed table of live blocks, so it is
 * deterministic and never calls malloc. Each allocation carries a group tag so `yolo plan` can
 * say where the bytes go.
 */
enum { G_PARAMS, G_GRADS, G_OPTIM, G_EMA, G_BUFFERS, G_ACTS, G_BACKWARD, G_SCRATCH, G_LOSS, G_INPUT, G_NGROUPS };
static const char *const group_names[G_NGROUPS] = {
    "weights", "gradients", "optimizer state", "EMA", "BN running stats", "activations kept",
    "backward buffers", "scratch", "loss and assigner", "input staging"};

#define ARENA_MAX_BLOCKS 1024
#define ARENA_ALIGN 64
typedef struct { size_t off, size; int group; } ArenaBlock;
typedef struct {
    char *base;                     // NULL in a dry run
    int half;                       // dry run of the GPU layout: activation-sized buffers are FP16
                                    // and convolutions need no im2col buffer (implicit GEMM)
    size_t cap;                     // bytes available (SIZE_MAX in a dry run)
    size_t high;                    // high-water mark: end of the furthest block ever live
    size_t live[G_NGROUPS];         // bytes live per group now
    size_t at_high[G_NGROUPS];      // bytes live per group when `high` was last raised
    size_t peak[G_NGROUPS];         // each group's own peak
    int n;                          // live blocks, sorted by offset
    ArenaBlock blk[ARENA_MAX_BLOCKS];
} Arena;

static int arena_dry(const Arena *a) { return a->base == NULL; }

// arena_alloc: first-fit, 64-byte aligned. Returns a pointer (a fake, never-dereferenced one in
// a dry run: base address 0 plus the offset, kept in a uintptr_t until the cast).
static void *arena_alloc(Arena *a, size_t bytes, int group) {
    size_t size = (bytes + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN;
    if (size == 0) size = ARENA_ALIGN;
    size_t off = 0;
    int at = 0;
    for (; at < a->n; at++) {
        if (a->blk[at].off - off >= size) break;
        off = a->blk[at].off + a->blk[at].size;
    }
    if (a->n == ARENA_MAX_BLOCKS) die("arena: more than %d live blocks (raise ARENA_MAX_BLOCKS)", ARENA_MAX_BLOCKS);
    if (off + size > a->cap)
        die("arena: plan exceeded (%zu + %zu > %zu bytes): a step allocated more than its dry run did", off, size, a->cap);
    memmove(&a->blk[at + 1], &a->blk[at], (a->n - at) * sizeof(ArenaBlock));
    a->blk[at] = (ArenaBlock){off, size, group};
    a->n++;
    a->live[group] += size;
    if (a->live[group] > a->peak[group]) a->peak[group] = a->live[group];
    if (off + size > a->high) { a->high = off + size; memcpy(a->at_high, a->live, sizeof a->live); }
    return (void *)((uintptr_t)a->base + off + (a->base ? 0 : ARENA_ALIGN));
}
static void arena_free(Arena *a, void *p) {
    if (!p) return;
    size_t off = (uintptr_t)p - (uintptr_t)a->base - (a->base ? 0 : ARENA_ALIGN);
    for (int i = 0; i < a->n; i++)
        if (a->blk[i].off == off) {
            a->live[a->blk[i].group] -= a->blk[i].size;
            memmove(&a->blk[i], &a->blk[i + 1], (a->n - i - 1) * sizeof(ArenaBlock));
            a->n--;
            return;
        }
    die("arena_free: %p is not a live block", p);
}
// arena_zalloc: arena_alloc plus zero fill (skipped in a dry run)
static void *arena_zalloc(Arena *a, size_t bytes, int group) {
    void *p = arena_alloc(a, bytes, group);
    if (!arena_dry(a)) memset(p, 0, bytes);
    return p;
}
#define afloat(a, n, g) ((float *)arena_alloc((a), (size_t)(n) * sizeof(float), (g)))
#define azfloat(a, n, g) ((float *)arena_zalloc((a), (size_t)(n) * sizeof(float), (g)))
// activation-sized buffers: FP32 on the CPU, FP16 in the GPU layout
#define aact(a, n, g) ((float *)arena_alloc((a), (size_t)(n) * ((a)->half ? 2 : 4), (g)))
#define azact(a, n, g) ((float *)arena_zalloc((a), (size_t)(n) * ((a)->half ? 2 : 4), (g)))

// ------------------------------------------------------------------------------------------
// CPU ops: GEMM, im2col, BN + SiLU, upsample, max-pool
// ------------------------------------------------------------------------------------------

// The GEMM packs panels of A (MR rows) and B (NR columns) into per-thread buffers, then runs an
// MR x NR register-blocked micro-kernel written with GCC vector extensions (AVX-512 / AVX2 /
// SSE, whatever -march gives). Pack buffers are allocated once (gemm_init), never per call.
typedef float vf16 __attribute__((vector_size(64), aligned(4)));
#define GEMM_MR 8
#define GEMM_NR 32
#define GEMM_KC 256
#define GEMM_MC 128
#define GEMM_NC 512
#define GEMM_MAX_THREADS 64
static float *gemm_pack[GEMM_MAX_THREADS];    // per thread: A block (MC x KC) then B block (KC x NC)
static int gemm_nthreads;

static size_t gemm_workspace_bytes(int nthreads) {
    return (size_t)nthreads * (GEMM_MC * GEMM_KC + GEMM_KC * GEMM_NC) * sizeof(float) + 64 * (size_t)nthreads;
}
static void gemm_init(void) {
    if (gemm_nthreads) return;
#ifdef _OPENMP
    gemm_nthreads = omp_get_max_threads();
#else
    gemm_nthreads = 1;
#endif
    if (gemm_nthreads > GEMM_MAX_THREADS) gemm_nthreads = GEMM_MAX_THREADS;
    for (int t = 0; t < gemm_nthreads; t++) {
        gemm_pack[t] = aligned_alloc(64, (GEMM_MC * GEMM_KC + GEMM_KC * GEMM_NC) * sizeof(float));
        if (!gemm_pack[t]) die("out of host memory for GEMM pack buffers");
    }
}

// element (i, k) of op(A) and (k, j) of op(B), row-major storage
#define OPA(i, k) (tA ? A[(size_t)(k) * lda + (i)] : A[(size_t)(i) * lda + (k)])
#define OPB(k, j) (tB ? B[(size_t)(j) * ldb + (k)] : B[(size_t)(k) * ldb + (j)])

// gemm_kernel: c (MR x NR, row stride ldc) (+)= a_panel (KC x MR, k-major) * b_panel (KC x NR)
static inline void gemm_kernel(int kc, const float *restrict ap, const float *restrict bp, float *restrict c,
                               int ldc, int mr, int nr, int add) {
    vf16 acc[GEMM_MR][2];
    for (int i = 0; i < GEMM_MR; i++) acc[i][0] = acc[i][1] = (vf16){0};
    for (int k = 0; k < kc; k++) {
        vf16 b0 = *(const vf16 *)(bp + k * GEMM_NR), b1 = *(const vf16 *)(bp + k * GEMM_NR + 16);
        const float *a = ap + k * GEMM_MR;
        for (int i = 0; i < GEMM_MR; i++) {
            acc[i][0] += a[i] * b0;
            acc[i][1] += a[i] * b1;
        }
    }
    if (mr == GEMM_MR && nr == GEMM_NR) {
        for (int i = 0; i < GEMM_MR; i++) {
            vf16 *cv0 = (vf16 *)(c + (size_t)i * ldc), *cv1 = (vf16 *)(c + (size_t)i * ldc + 16);
            if (add) { *cv0 += acc[i][0]; *cv1 += acc[i][1]; }
            else { *cv0 = acc[i][0]; *cv1 = acc[i][1]; }
        }
    } else {
        float tmp[GEMM_MR][GEMM_NR];
        memcpy(tmp, acc, sizeof tmp);
        for (int i = 0; i < mr; i++)
            for (int j = 0; j < nr; j++) c[(size_t)i * ldc + j] = (add ? c[(size_t)i * ldc + j] : 0) + tmp[i][j];
    }
}

// gemm_cpu: row-major C (M x N) = op(A) (M x K) * op(B) (K x N) + beta * C, op = transpose if
// tX. beta is 0 or 1 in this project (0 never reads C). The CPU twin of the GPU GEMMs.
static void gemm_cpu(int tA, int tB, int M, int N, int K, const float *A, int lda, const float *B, int ldb,
                     float beta, float *C, int ldc) {
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {
        if (beta == 0) for (int i = 0; i < M; i++) memset(C + (size_t)i * ldc, 0, N * sizeof(float));
        return;
    }
    gemm_init();
    int mt = (M + GEMM_MC - 1) / GEMM_MC, nt = (N + GEMM_NC - 1) / GEMM_NC;
    int ntile = mt * nt;
#pragma omp parallel for schedule(dynamic, 1) if (ntile > 1 && (double)M * N * K > 1e5)
    for (int tile = 0; tile < ntile; tile++) {
#ifdef _OPENMP
        float *pa = gemm_pack[omp_get_thread_num()];
#else
        float *pa = gemm_pack[0];
#endif
        float *pb = pa + GEMM_MC * GEMM_KC;
        int i0 = (tile / nt) * GEMM_MC, j0 = (tile % nt) * GEMM_NC;
        int mc = M - i0 < GEMM_MC ? M - i0 : GEMM_MC, nc = N - j0 < GEMM_NC ? N - j0 : GEMM_NC;
        for (int p0 = 0; p0 < K; p0 += GEMM_KC) {
            int kc = K - p0 < GEMM_KC ? K - p0 : GEMM_KC;
            // pack B (kc x nc) into NR-wide panels, zero padded
            for (int jp = 0; jp < nc; jp += GEMM_NR) {
                float *dst = pb + (size_t)jp * kc;
                int nr = nc - jp < GEMM_NR ? nc - jp : GEMM_NR;
                for (int k = 0; k < kc; k++) {
                    float *d = dst + k * GEMM_NR;
                    if (!tB) {
                        const float *src = B + (size_t)(p0 + k) * ldb + j0 + jp;
                        for (int j = 0; j < nr; j++) d[j] = src[j];
                    } else {
                        for (int j = 0; j < nr; j++) d[j] = B[(size_t)(j0 + jp + j) * ldb + p0 + k];
                    }
                    for (int j = nr; j < GEMM_NR; j++) d[j] = 0;
                }
            }
            // pack A (mc x kc) into MR-high panels, zero padded
            for (int ip = 0; ip < mc; ip += GEMM_MR) {
                float *dst = pa + (size_t)ip * kc;
                int mr = mc - ip < GEMM_MR ? mc - ip : GEMM_MR;
                for (int k = 0; k < kc; k++) {
                    float *d = dst + k * GEMM_MR;
                    for (int i = 0; i < mr; i++) d[i] = OPA(i0 + ip + i, p0 + k);
                    for (int i = mr; i < GEMM_MR; i++) d[i] = 0;
                }
            }
            int add = p0 > 0 || beta != 0;
            for (int jp = 0; jp < nc; jp += GEMM_NR)
                for (int ip = 0; ip < mc; ip += GEMM_MR) {
                    int mr = mc - ip < GEMM_MR ? mc - ip : GEMM_MR, nr = nc - jp < GEMM_NR ? nc - jp : GEMM_NR;
                    gemm_kernel(kc, pa + (size_t)ip * kc, pb + (size_t)jp * kc, C + (size_t)(i0 + ip) * ldc + j0 + jp,
                                ldc, mr, nr, add);
                }
        }
    }
}

// gemm_naive: the same product with plain loops in double; the GEMM's own test reference.
static void gemm_naive(int tA, int tB, int M, int N, int K, const float *A, int lda, const float *B, int ldb,
                       float beta, float *C, int ldc) {
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = 0;
            for (int k = 0; k < K; k++) s += (double)OPA(i, k) * OPB(k, j);
            C[(size_t)i * ldc + j] = (float)(s + (beta != 0 ? beta * C[(size_t)i * ldc + j] : 0));
        }
}

// im2col: x (C, H, W) -> col (C*K*K, Ho*Wo) for a KxK conv with stride S and padding K/2.
// Matches PyTorch's Conv2d(padding=k//2) geometry: Ho = (H + 2p - K)/S + 1.
static void im2col(const float *x, int C, int H, int W, int K, int S, float *col) {
    int p = K / 2, Ho = (H + 2 * p - K) / S + 1, Wo = (W + 2 * p - K) / S + 1;
#pragma omp parallel for collapse(2) if ((size_t)C * K * K * Ho * Wo > 65536)
    for (int c = 0; c < C; c++)
        for (int kk = 0; kk < K * K; kk++) {
            int ky = kk / K, kx = kk % K;
            float *dst = col + ((size_t)c * K * K + kk) * Ho * Wo;
            const float *src = x + (size_t)c * H * W;
            for (int oy = 0; oy < Ho; oy++) {
                int iy = oy * S - p + ky;
                float *d = dst + oy * Wo;
                if (iy < 0 || iy >= H) { memset(d, 0, Wo * sizeof(float)); continue; }
                const float *r = src + (size_t)iy * W;
                for (int ox = 0; ox < Wo; ox++) {
                    int ix = ox * S - p + kx;
                    d[ox] = (ix >= 0 && ix < W) ? r[ix] : 0.f;
                }
            }
        }
}

// col2im: the adjoint of im2col: dx (C, H, W) = sum of col entries into the pixels they read.
static void col2im(const float *col, int C, int H, int W, int K, int S, float *dx) {
    int p = K / 2, Ho = (H + 2 * p - K) / S + 1, Wo = (W + 2 * p - K) / S + 1;
#pragma omp parallel for if ((size_t)C * K * K * Ho * Wo > 65536)
    for (int c = 0; c < C; c++) {
        float *d = dx + (size_t)c * H * W;
        memset(d, 0, (size_t)H * W * sizeof(float));
        for (int kk = 0; kk < K * K; kk++) {
            int ky = kk / K, kx = kk % K;
            const float *src = col + ((size_t)c * K * K + kk) * Ho * Wo;
            for (int oy = 0; oy < Ho; oy++) {
                int iy = oy * S - p + ky;
                if (iy < 0 || iy >= H) continue;
                float *r = d + (size_t)iy * W;
                const float *s = src + oy * Wo;
                for (int ox = 0; ox < Wo; ox++) {
                    int ix = ox * S - p + kx;
                    if (ix >= 0 && ix < W) r[ix] += s[ox];
                }
            }
        }
    }
}

static inline float silu_f(float y) { return y / (1.f + expf(-y)); }

// bn_silu_forward_cpu: y = SiLU(gamma * (z - mean) * invstd + beta), per channel.
// z, y: (B, C, HW); mean, invstd, gamma, beta: (C). Recomputes a Conv's output from its kept
// pre-BN values (spec/memory.md technique 1).
static void bn_silu_forward_cpu(const float *z, const float *mean, const float *invstd, const float *gamma,
                                const float *beta, float *y, int B, int C, int HW) {
#pragma omp parallel for collapse(2) if ((size_t)B * C * HW > 65536)
    for (int b = 0; b < B; b++)
        for (int c = 0; c < C; c++) {
            float sc = gamma[c] * invstd[c], sh = beta[c] - mean[c] * sc;
            const float *zi = z + ((size_t)b * C + c) * HW;
            float *yo = y + ((size_t)b * C + c) * HW;
            for (int i = 0; i < HW; i++) yo[i] = silu_f(zi[i] * sc + sh);
        }
}

// upsample2_forward_cpu: nearest-neighbour x2 (nn.Upsample(scale_factor=2)). x (B,C,H,W) -> y (B,C,2H,2W)
static void upsample2_forward_cpu(const float *x, float *y, int B, int C, int H, int W) {
    for (size_t bc = 0; bc < (size_t)B * C; bc++)
        for (int oy = 0; oy < 2 * H; oy++)
            for (int ox = 0; ox < 2 * W; ox++)
                y[(bc * 2 * H + oy) * 2 * W + ox] = x[(bc * H + oy / 2) * W + ox / 2];
}

// upsample2_backward: dx (B,C,H,W) = sum of the 2x2 gradients each input pixel was copied to.
static void upsample2_backward(const float *dy, float *dx, int B, int C, int H, int W) {
    for (size_t bc = 0; bc < (size_t)B * C; bc++)
        for (int y = 0; y < H; y++)
            for (int x = 0; x < W; x++) {
                const float *g = dy + (bc * 2 * H + 2 * y) * 2 * W + 2 * x;
                dx[(bc * H + y) * W + x] = g[0] + g[1] + g[2 * W] + g[2 * W + 1];
            }
}

// maxpool5_forward_cpu: MaxPool2d(5, stride 1, padding 2) with -inf padding (as PyTorch).
// x, y: (B, C, H, W)
static void maxpool5_forward_cpu(const float *x, float *y, int B, int C, int H, int W) {
    for (size_t bc = 0; bc < (size_t)B * C; bc++)
        for (int oy = 0; oy < H; oy++)
            for (int ox = 0; ox < W; ox++) {
                float m = -INFINITY;
                for (int dy = -2; dy <= 2; dy++)
                    for (int dx = -2; dx <= 2; dx++) {
                        int iy = oy + dy, ix = ox + dx;
                        if (iy >= 0 && iy < H && ix >= 0 && ix < W && x[(bc * H + iy) * W + ix] > m)
                            m = x[(bc * H + iy) * W + ix];
                    }
                y[(bc * H + oy) * W + ox] = m;
            }
}

// maxpool5_backward: routes each output gradient to the argmax of its window, found again from
// x (no stored indices). Ties go to the first maximum in row-major window order, as PyTorch's
// CPU kernel does. dx (B,C,H,W) is overwritten.
static void maxpool5_backward(const float *x, const float *dy, float *dx, int B, int C, int H, int W) {
    memset(dx, 0, (size_t)B * C * H * W * sizeof(float));
    for (size_t bc = 0; bc < (size_t)B * C; bc++)
        for (int oy = 0; oy < H; oy++)
            for (int ox = 0; ox < W; ox++) {
                float m = -INFINITY;
                int arg = -1;
                for (int dy = -2; dy <= 2; dy++)
                    for (int dx2 = -2; dx2 <= 2; dx2++) {
                        int iy = oy + dy, ix = ox + dx2;
                        if (iy >= 0 && iy < H && ix >= 0 && ix < W && x[(bc * H + iy) * W + ix] > m) {
                            m = x[(bc * H + iy) * W + ix];
                            arg = iy * W + ix;
                        }
                    }
                if (arg >= 0) dx[bc * H * W + arg] += dy[(bc * H + oy) * W + ox];
            }
}

// ------------------------------------------------------------------------------------------
// model: the YOLOv8 graph as convs and "values"
// ------------------------------------------------------------------------------------------
/*
 * Every tensor of the network is a Value. Only Conv outputs own memory, and what they keep is
 * the pre-BN convolution output z plus the batch mean and 1/std of each channel; the activated
 * output SiLU(BN(z)) is recomputed whenever a consumer needs it. Everything else is a view that
 * is materialised on demand, one image at a time, into scratch:
 *   V_CONV   SiLU(BN(z)) of a Conv (or the raw output of a Detect 1x1 conv)
 *   V_SLICE  channels [c0, c0+C) of a Conv (the C2f split)
 *   V_ADD    a + b (the Bottleneck shortcut)
 *   V_CAT    channel concat of up to 8 values (C2f, SPPF, neck)
 *   V_UP     nearest x2 upsample
 *   V_POOL   5x5 max-pool (SPPF; backward finds the argmax again)
 *   V_INPUT  the image batch
 * Gradients flow the same way: a Conv's gradient buffer dA (B, C, H, W) exists only from the
 * first consumer's backward to the Conv's own backward.
 */
enum { V_INPUT, V_CONV, V_SLICE, V_ADD, V_CAT, V_UP, V_POOL };
#define MAX_CONVS 160
#define MAX_VALUES 320
#define MAX_CAT 8
#define REG_MAX 16
#define BN_EPS 1e-3f
#define BN_MOMENTUM 0.03f

typedef struct {
    int kind, C, H, W;      // output channels and size for the current input size
    int conv;               // V_CONV, V_SLICE: the conv index
    int c0;                 // V_SLICE: first channel
    int n, src[MAX_CAT];    // V_ADD (2), V_CAT (n), V_UP/V_POOL (1): source values
} Value;

typedef struct {
    char name[48];          // Ultralytics module path, e.g. "model.2.m.0.cv1" (Detect: "model.22.cv2.0.2")
    int cin, cout, k, s;    // Conv2d geometry; padding k/2
    int bn;                 // 1: Conv = Conv2d(no bias) + BN + SiLU; 0: plain Conv2d with bias (Detect output)
    int level, branch;      // Detect output convs: level 0..2 and branch 0 box, 1 cls; else level -1
    int in;                 // input value
    int H, W, Ho, Wo;       // input and output size for the current input size
    size_t w_off, b_off, g_off;   // offsets into the flat parameter array: weight, bias/beta, gamma
    size_t rs_off;          // offset into the BN buffer array: running mean, then running var
    float *z;               // (B, Cout, Ho, Wo) pre-BN output, image stride zstride (Detect: into head)
    size_t zstride;         // floats between images in z and dA
    float *mean, *invstd;   // (Cout) statistics used by the last forward
    float *dA;              // (B, Cout, Ho, Wo) gradient of the output, live during backward only
} Conv;

// a row of the `yolo info` table, one per yaml layer
typedef struct { char from[16], module[16]; long params; int value, nrep; } LayerRow;

typedef struct {
    char scale;             // 'n', 's', 'm', 'l', 'x'
    int nc;
    int nconv, nvalue, nexec, nlayer;
    Conv conv[MAX_CONVS];   // in Ultralytics state_dict order
    int exec[MAX_CONVS];    // in execution order
    Value val[MAX_VALUES];
    LayerRow layer[23];
    int input;              // value id of the image
    int head_conv[3][2];    // Detect output convs: [level][0 box, 1 cls]
    int has_head;           // 0 for the small graphs the gradient checks build
    size_t nparams, nbuffers;
    size_t dfl_off;         // the frozen DFL weight (16 values 0..15) inside params
    // memory, set by model_alloc
    int B, H, W;            // batch and input size the arena was planned for
    float *params, *grads;  // (nparams) flat, state_dict order
    float *buffers;         // (nbuffers) BN running mean/var
    float *head[3];         // (B, 64+NC, H_i, W_i) raw Detect maps
    float *dhead[3];        // same shapes: gradient of the loss w.r.t. the maps
    const float *x;         // (B, 3, H, W) current input (not owned)
    int train;              // 1: BN uses batch statistics and updates running stats
} Model;

typedef struct { char name; double depth, width; int max_ch; } Scale;
static const Scale scales[] = {
    {'n', 0.33, 0.25, 1024}, {'s', 0.33, 0.50, 1024}, {'m', 0.67, 0.75, 768}, {'l', 1.00, 1.00, 512}, {'x', 1.00, 1.25, 512},
};

// scale_find: "yolov8n", "n", "yolov8n.yaml" -> the scale row, or NULL
static const Scale *scale_find(const char *s) {
    if (strncmp(s, "yolov8", 6) == 0) s += 6;
    if (!s[0] || (s[1] && strcmp(s + 1, ".yaml") != 0)) return NULL;
    for (size_t i = 0; i < sizeof scales / sizeof scales[0]; i++)
        if (scales[i].name == s[0]) return &scales[i];
    return NULL;
}

static int value_new(Model *m, int kind, int C) {
    if (m->nvalue == MAX_VALUES) die("model: too many values");
    Value *v = &m->val[m->nvalue];
    memset(v, 0, sizeof *v);
    v->kind = kind;
    v->C = C;
    return m->nvalue++;
}

// conv_new: declares a conv (in state_dict order) without an input yet; returns its index.
static int conv_new(Model *m, const char *name, int cin, int cout, int k, int s, int bn) {
    if (m->nconv == MAX_CONVS) die("model: too many convs");
    Conv *c = &m->conv[m->nconv];
    memset(c, 0, sizeof *c);
    snprintf(c->name, sizeof c->name, "%s", name);
    c->cin = cin; c->cout = cout; c->k = k; c->s = s; c->bn = bn; c->in = -1; c->level = -1;
    c->w_off = m->nparams;
    m->nparams += (size_t)cout * cin * k * k;
    if (bn) { c->g_off = m->nparams; m->nparams += cout; }
    c->b_off = m->nparams;
    m->nparams += cout;
    if (bn) { c->rs_off = m->nbuffers; m->nbuffers += 2 * (size_t)cout; }
    return m->nconv++;
}

// conv_connect: gives conv ci its input and schedules it; returns its output value.
static int conv_connect(Model *m, int ci, int in) {
    Conv *c = &m->conv[ci];
    if (m->val[in].C != c->cin) die("model: %s expects %d channels, got %d", c->name, c->cin, m->val[in].C);
    c->in = in;
    m->exec[m->nexec++] = ci;
    int v = value_new(m, V_CONV, c->cout);
    m->val[v].conv = ci;
    return v;
}
static int conv_add(Model *m, const char *name, int in, int cout, int k, int s, int bn) {
    return conv_connect(m, conv_new(m, name, m->val[in].C, cout, k, s, bn), in);
}
static int value_cat(Model *m, int n, const int *src) {
    int C = 0;
    for (int i = 0; i < n; i++) C += m->val[src[i]].C;
    int v = value_new(m, V_CAT, C);
    m->val[v].n = n;
    memcpy(m->val[v].src, src, n * sizeof(int));
    return v;
}
static int value_unary(Model *m, int kind, int src) {
    int v = value_new(m, kind, m->val[src].C);
    m->val[v].n = 1;
    m->val[v].src[0] = src;
    return v;
}

// c2f_add: C2f(c1, c2, n, shortcut) (ultralytics.nn.modules.block.C2f). cv1 1x1 -> split in
// halves y0, y1 -> n Bottlenecks on the last piece -> concat [y0, y1, m0 .. m(n-1)] -> cv2 1x1.
static int c2f_add(Model *m, const char *p, int in, int c2, int n, int shortcut) {
    char nm[48];
    int c = c2 / 2;
    snprintf(nm, sizeof nm, "%s.cv1", p);
    int cv1 = conv_new(m, nm, m->val[in].C, 2 * c, 1, 1, 1);
    snprintf(nm, sizeof nm, "%s.cv2", p);
    int cv2 = conv_new(m, nm, (2 + n) * c, c2, 1, 1, 1);
    int a = conv_connect(m, cv1, in);
    int parts[MAX_CAT];
    if (2 + n > MAX_CAT) die("model: C2f with %d bottlenecks exceeds MAX_CAT", n);
    for (int h = 0; h < 2; h++) {
        parts[h] = value_new(m, V_SLICE, c);
        m->val[parts[h]].conv = m->val[a].conv;
        m->val[parts[h]].c0 = h * c;
    }
    int last = parts[1];
    for (int i = 0; i < n; i++) {
        snprintf(nm, sizeof nm, "%s.m.%d.cv1", p, i);
        int t = conv_add(m, nm, last, c, 3, 1, 1);
        snprintf(nm, sizeof nm, "%s.m.%d.cv2", p, i);
        t = conv_add(m, nm, t, c, 3, 1, 1);
        if (shortcut) {
            int s = value_new(m, V_ADD, c);
            m->val[s].n = 2;
            m->val[s].src[0] = last;
            m->val[s].src[1] = t;
            t = s;
        }
        parts[2 + i] = last = t;
    }
    return conv_connect(m, cv2, value_cat(m, 2 + n, parts));
}

// sppf_add: SPPF(c1, c2, 5): cv1 1x1 to c1/2, three chained 5x5 max-pools, concat, cv2 1x1.
static int sppf_add(Model *m, const char *p, int in, int c2) {
    char nm[48];
    int c = m->val[in].C / 2;
    snprintf(nm, sizeof nm, "%s.cv1", p);
    int cv1 = conv_new(m, nm, m->val[in].C, c, 1, 1, 1);
    snprintf(nm, sizeof nm, "%s.cv2", p);
    int cv2 = conv_new(m, nm, 4 * c, c2, 1, 1, 1);
    int parts[4];
    parts[0] = conv_connect(m, cv1, in);
    for (int i = 1; i < 4; i++) parts[i] = value_unary(m, V_POOL, parts[i - 1]);
    return conv_connect(m, cv2, value_cat(m, 4, parts));
}

static int ceil8(double x) { return (int)ceil(x / 8.0) * 8; }

// model_build: the YOLOv8 detection graph for a scale and class count (yolov8.yaml; spec 1.2).
// Shapes are set later by model_shape; memory by model_alloc.
static void model_build(Model *m, char scale, int nc) {
    const Scale *sc = NULL;
    for (size_t i = 0; i < sizeof scales / sizeof scales[0]; i++)
        if (scales[i].name == scale) sc = &scales[i];
    if (!sc) die("unknown model scale '%c' (use yolov8n, yolov8s, yolov8m, yolov8l or yolov8x)", scale);
    if (nc < 1 || nc > 10000) die("nc=%d: the number of classes must be 1..10000", nc);
    memset(m, 0, sizeof *m);
    m->scale = scale;
    m->nc = nc;
#define CH(c) ceil8((c < sc->max_ch ? c : sc->max_ch) * sc->width)
#define REP(r) ((r) > 1 ? ((int)lround((r) * sc->depth) > 1 ? (int)lround((r) * sc->depth) : 1) : (r))
    int L[23];
    long pstart = 0;
    m->input = value_new(m, V_INPUT, 3);
    int prev = m->input;
    // one yaml row: records the table row after the layer is built
#define ROW(i, fromstr, mod, rep, expr) do { \
        L[i] = prev = (expr); LayerRow *r_ = &m->layer[i]; \
        snprintf(r_->from, sizeof r_->from, "%s", fromstr); snprintf(r_->module, sizeof r_->module, "%s", mod); \
        r_->params = (long)m->nparams - pstart; pstart = (long)m->nparams; r_->value = prev; r_->nrep = rep; } while (0)
    ROW(0, "-1", "Conv", 1, conv_add(m, "model.0", prev, CH(64), 3, 2, 1));
    ROW(1, "-1", "Conv", 1, conv_add(m, "model.1", prev, CH(128), 3, 2, 1));
    ROW(2, "-1", "C2f", REP(3), c2f_add(m, "model.2", prev, CH(128), REP(3), 1));
    ROW(3, "-1", "Conv", 1, conv_add(m, "model.3", prev, CH(256), 3, 2, 1));
    ROW(4, "-1", "C2f", REP(6), c2f_add(m, "model.4", prev, CH(256), REP(6), 1));
    ROW(5, "-1", "Conv", 1, conv_add(m, "model.5", prev, CH(512), 3, 2, 1));
    ROW(6, "-1", "C2f", REP(6), c2f_add(m, "model.6", prev, CH(512), REP(6), 1));
    ROW(7, "-1", "Conv", 1, conv_add(m, "model.7", prev, CH(1024), 3, 2, 1));
    ROW(8, "-1", "C2f", REP(3), c2f_add(m, "model.8", prev, CH(1024), REP(3), 1));
    ROW(9, "-1", "SPPF", 1, sppf_add(m, "model.9", prev, CH(1024)));
    ROW(10, "-1", "Upsample", 1, value_unary(m, V_UP, prev));
    ROW(11, "[-1, 6]", "Concat", 1, value_cat(m, 2, (int[]){prev, L[6]}));
    ROW(12, "-1", "C2f", REP(3), c2f_add(m, "model.12", prev, CH(512), REP(3), 0));
    ROW(13, "-1", "Upsample", 1, value_unary(m, V_UP, prev));
    ROW(14, "[-1, 4]", "Concat", 1, value_cat(m, 2, (int[]){prev, L[4]}));
    ROW(15, "-1", "C2f", REP(3), c2f_add(m, "model.15", prev, CH(256), REP(3), 0));
    ROW(16, "-1", "Conv", 1, conv_add(m, "model.16", prev, CH(256), 3, 2, 1));
    ROW(17, "[-1, 12]", "Concat", 1, value_cat(m, 2, (int[]){prev, L[12]}));
    ROW(18, "-1", "C2f", REP(3), c2f_add(m, "model.18", prev, CH(512), REP(3), 0));
    ROW(19, "-1", "Conv", 1, conv_add(m, "model.19", prev, CH(512), 3, 2, 1));
    ROW(20, "[-1, 9]", "Concat", 1, value_cat(m, 2, (int[]){prev, L[9]}));
    ROW(21, "-1", "C2f", REP(3), c2f_add(m, "model.21", prev, CH(1024), REP(3), 0));
    // Detect (legacy v8 head): per level a box branch cv2[i] and a class branch cv3[i]
    {
        int ch[3] = {m->val[L[15]].C, m->val[L[18]].C, m->val[L[21]].C}, lv[3] = {L[15], L[18], L[21]};
        int c2 = 16 > ch[0] / 4 ? 16 : ch[0] / 4;
        if (c2 < 4 * REG_MAX) c2 = 4 * REG_MAX;
        int c3 = ch[0] > (nc < 100 ? nc : 100) ? ch[0] : (nc < 100 ? nc : 100);
        char nm[48];
        for (int br = 0; br < 2; br++)
            for (int i = 0; i < 3; i++) {
                int w = br ? c3 : c2, out = br ? nc : 4 * REG_MAX;
                snprintf(nm, sizeof nm, "model.22.cv%d.%d.0", 2 + br, i);
                int t = conv_add(m, nm, lv[i], w, 3, 1, 1);
                snprintf(nm, sizeof nm, "model.22.cv%d.%d.1", 2 + br, i);
                t = conv_add(m, nm, t, w, 3, 1, 1);
                snprintf(nm, sizeof nm, "model.22.cv%d.%d.2", 2 + br, i);
                conv_add(m, nm, t, out, 1, 1, 0);
                m->head_conv[i][br] = m->nconv - 1;
                m->conv[m->nconv - 1].level = i;
                m->conv[m->nconv - 1].branch = br;
            }
        m->dfl_off = m->nparams;
        m->nparams += REG_MAX;
        m->has_head = 1;
        LayerRow *r = &m->layer[22];
        snprintf(r->from, sizeof r->from, "[15, 18, 21]");
        snprintf(r->module, sizeof r->module, "Detect");
        r->params = (long)m->nparams - pstart;
        r->value = -1;
        r->nrep = 1;
    }
    m->nlayer = 23;
#undef ROW
#undef CH
#undef REP
}

// model_shape: sets every value's and conv's spatial size for input H x W (multiples of 32).
static void model_shape(Model *m, int H, int W) {
    if (m->has_head && (H % 32 || W % 32 || H <= 0 || W <= 0)) die("input size %dx%d must be a positive multiple of 32", H, W);
    m->val[m->input].H = H;
    m->val[m->input].W = W;
    // values are created in topological order, so one pass suffices
    for (int i = 0; i < m->nvalue; i++) {
        Value *v = &m->val[i];
        if (v->kind == V_CONV || v->kind == V_SLICE) {
            Conv *c = &m->conv[v->conv];
            const Value *in = &m->val[c->in];
            c->H = in->H; c->W = in->W;
            c->Ho = (c->H + 2 * (c->k / 2) - c->k) / c->s + 1;
            c->Wo = (c->W + 2 * (c->k / 2) - c->k) / c->s + 1;
            v->H = c->Ho; v->W = c->Wo;
        } else if (v->kind != V_INPUT) {
            const Value *s = &m->val[v->src[0]];
            v->H = s->H * (v->kind == V_UP ? 2 : 1);
            v->W = s->W * (v->kind == V_UP ? 2 : 1);
            for (int j = 1; j < v->n; j++)
                if (m->val[v->src[j]].H != v->H || m->val[v->src[j]].W != v->W)
                    die("model: concat/add of mismatched sizes");
        }
    }
}

// model_init_params: PyTorch default init (kaiming-uniform a=sqrt(5): U(+-1/sqrt(fan_in)) for
// weights and biases), BN gamma 1 beta 0, running mean 0 var 1, then Detect.bias_init
// (box bias 1.0, class bias ln(5 / nc / (640/s)^2)) and the frozen DFL weights 0..15.
static void model_init_params(Model *m, uint64_t seed) {
    Rng r;
    rng_seed(&r, seed);
    for (int i = 0; i < m->nconv; i++) {
        Conv *c = &m->conv[i];
        float bound = 1.f / sqrtf((float)c->cin * c->k * c->k);
        float *w = m->params + c->w_off;
        for (size_t j = 0; j < (size_t)c->cout * c->cin * c->k * c->k; j++) w[j] = (float)rng_range(&r, -bound, bound);
        float *b = m->params + c->b_off;
        for (int j = 0; j < c->cout; j++) b[j] = c->bn ? 0.f : (float)rng_range(&r, -bound, bound);
        if (c->bn) {
            for (int j = 0; j < c->cout; j++) m->params[c->g_off + j] = 1.f;
            for (int j = 0; j < c->cout; j++) m->buffers[c->rs_off + j] = 0.f, m->buffers[c->rs_off + c->cout + j] = 1.f;
        }
    }
    static const int strides[3] = {8, 16, 32};
    for (int i = 0; i < 3; i++) {
        Conv *box = &m->conv[m->head_conv[i][0]], *cls = &m->conv[m->head_conv[i][1]];
        for (int j = 0; j < box->cout; j++) m->params[box->b_off + j] = 1.f;
        float cb = logf(5.f / m->nc / ((640.f / strides[i]) * (640.f / strides[i])));
        for (int j = 0; j < cls->cout; j++) m->params[cls->b_off + j] = cb;
    }
    for (int k = 0; k < REG_MAX; k++) m->params[m->dfl_off + k] = (float)k;
}

// model_flops: Ultralytics' GFLOPs figure (thop on a 32x32 input, x2, x(imgsz/32)^2): conv MACs
// plus 4 per BN output element (spec 1.1). fused=1 leaves out the BN term.
static double model_flops(Model *m, int imgsz, int fused) {
    model_shape(m, 32, 32);
    double macs = 0;
    for (int i = 0; i < m->nconv; i++) {
        Conv *c = &m->conv[i];
        double out = (double)c->cout * c->Ho * c->Wo;
        macs += out * c->cin * c->k * c->k;
        if (c->bn && !fused) macs += 4 * out;
    }
    macs += 4.0 * REG_MAX * (16 + 4 + 1);   // the DFL 1x1 conv over the 21 anchors of a 32x32 input
    return 2 * macs * (imgsz / 32.0) * (imgsz / 32.0) / 1e9;
}

// ------------------------------------------------------------------------------------------
// model: forward and backward on the CPU
// ------------------------------------------------------------------------------------------

// conv_act: the activated output of conv c for image b, channels [c0, c0+C), into out (C, Ho, Wo)
static void conv_act(const Model *m, const Conv *c, int b, int c0, int C, float *out) {
    int HW = c->Ho * c->Wo;
    const float *z = c->z + (size_t)b * c->zstride + (size_t)c0 * HW;
    if (c->bn)
        bn_silu_forward_cpu(z, c->mean + c0, c->invstd + c0, m->params + c->g_off + c0, m->params + c->b_off + c0,
                            out, 1, C, HW);
    else
        memcpy(out, z, (size_t)C * HW * sizeof(float));
}

#ifdef TESTING
// pool_hold: test-only record/replay of max-pool window choices, so finite differences of a
// graph with max-pools stay on one linear piece (see gradcheck in test/test_net.c).
static struct { int mode; size_t pos, cap; int *idx; } pool_hold;   // mode 0 off, 1 record, 2 replay

static void maxpool5_hold(const float *x, float *y, int C, int H, int W) {
    size_t n = (size_t)C * H * W;
    if (pool_hold.pos + n > pool_hold.cap) {
        if (pool_hold.mode == 2) die("pool_hold: replay past the recording");
        pool_hold.cap = (pool_hold.pos + n) * 2;
        pool_hold.idx = realloc(pool_hold.idx, pool_hold.cap * sizeof(int));
    }
    int *idx = pool_hold.idx + pool_hold.pos;
    pool_hold.pos += n;
    for (int c = 0; c < C; c++)
        for (int oy = 0; oy < H; oy++)
            for (int ox = 0; ox < W; ox++) {
                size_t o = ((size_t)c * H + oy) * W + ox;
                if (pool_hold.mode == 1) {
                    float mx = -INFINITY;
                    for (int dy = -2; dy <= 2; dy++)
                        for (int dx = -2; dx <= 2; dx++) {
                            int iy = oy + dy, ix = ox + dx;
                            if (iy >= 0 && iy < H && ix >= 0 && ix < W && x[((size_t)c * H + iy) * W + ix] > mx)
                                mx = x[((size_t)c * H + iy) * W + ix], idx[o] = iy * W + ix;
                        }
                }
                y[o] = x[(size_t)c * H * W + idx[o]];
            }
}
#endif

// value_materialize: value vi of image b, (C, H, W), into out. Views recurse into their
// sources; temporaries come from the arena (and are planned by the dry run like everything).
static void value_materialize(const Model *m, Arena *a, int vi, int b, float *out) {
    const Value *v = &m->val[vi];
    int dry = arena_dry(a);
    size_t n = (size_t)v->C * v->H * v->W;
    switch (v->kind) {
    case V_INPUT:
        if (!dry) memcpy(out, m->x + (size_t)b * n, n * sizeof(float));
        break;
    case V_CONV:
    case V_SLICE:
        if (!dry) conv_act(m, &m->conv[v->conv], b, v->kind == V_SLICE ? v->c0 : 0, v->C, out);
        break;
    case V_ADD: {
        value_materialize(m, a, v->src[0], b, out);
        float *t = aact(a, n, G_SCRATCH);
        value_materialize(m, a, v->src[1], b, t);
        if (!dry) for (size_t i = 0; i < n; i++) out[i] += t[i];
        arena_free(a, t);
        break;
    }
    case V_CAT: {
        size_t off = 0;
        for (int i = 0; i < v->n; i++) {
            value_materialize(m, a, v->src[i], b, out + off);
            off += (size_t)m->val[v->src[i]].C * v->H * v->W;
        }
        break;
    }
    case V_UP:
    case V_POOL: {
        const Value *s = &m->val[v->src[0]];
        float *t = aact(a, (size_t)s->C * s->H * s->W, G_SCRATCH);
        value_materialize(m, a, v->src[0], b, t);
        if (!dry) {
            if (v->kind == V_UP) upsample2_forward_cpu(t, out, 1, s->C, s->H, s->W);
#ifdef TESTING
            else if (pool_hold.mode) maxpool5_hold(t, out, s->C, s->H, s->W);
#endif
            else maxpool5_forward_cpu(t, out, 1, s->C, s->H, s->W);
        }
        arena_free(a, t);
        break;
    }
    }
}

// value_backprop: adds g (C, H, W), the gradient w.r.t. value vi of image b, into the gradient
// buffers of the convs it is made of. A conv's dA (B, C, H, W) is created zeroed on first use.
static void value_backprop(Model *m, Arena *a, int vi, int b, const float *g) {
    const Value *v = &m->val[vi];
    int dry = arena_dry(a);
    size_t n = (size_t)v->C * v->H * v->W;
    switch (v->kind) {
    case V_INPUT:
        break;
    case V_CONV:
    case V_SLICE: {
        Conv *c = &m->conv[v->conv];
        if (!c->dA) c->dA = azact(a, (size_t)m->B * c->zstride, G_BACKWARD);
        if (!dry) {
            float *d = c->dA + (size_t)b * c->zstride + (size_t)(v->kind == V_SLICE ? v->c0 : 0) * v->H * v->W;
            for (size_t i = 0; i < n; i++) d[i] += g[i];
        }
        break;
    }
    case V_ADD:
        value_backprop(m, a, v->src[0], b, g);
        value_backprop(m, a, v->src[1], b, g);
        break;
    case V_CAT: {
        size_t off = 0;
        for (int i = 0; i < v->n; i++) {
            value_backprop(m, a, v->src[i], b, g + off);
            off += (size_t)m->val[v->src[i]].C * v->H * v->W;
        }
        break;
    }
    case V_UP:
    case V_POOL: {
        const Value *s = &m->val[v->src[0]];
        size_t ns = (size_t)s->C * s->H * s->W;
        float *gs = aact(a, ns, G_SCRATCH);
        if (v->kind == V_UP) {
            if (!dry) upsample2_backward(g, gs, 1, s->C, s->H, s->W);
        } else {
            float *x = aact(a, ns, G_SCRATCH);
            value_materialize(m, a, v->src[0], b, x);
            if (!dry) maxpool5_backward(x, g, gs, 1, s->C, s->H, s->W);
            arena_free(a, x);
        }
        value_backprop(m, a, v->src[0], b, gs);
        arena_free(a, gs);
        break;
    }
    }
}

// conv_forward: z = conv(input) for the whole batch, then BN statistics (train: batch mean and
// biased variance, running stats updated with the unbiased one, momentum 0.03; eval: running
// stats). Detect output convs add their bias and keep the result as the head map.
static void conv_forward(Model *m, Arena *a, Conv *c) {
    int dry = arena_dry(a), HWo = c->Ho * c->Wo, KK = c->cin * c->k * c->k;
    int direct = (c->k == 1 && c->s == 1) || a->half;
    float *x = aact(a, (size_t)c->cin * c->H * c->W, G_SCRATCH);               // (Cin, H, W)
    float *col = direct ? x : aact(a, (size_t)KK * HWo, G_SCRATCH);            // (Cin*K*K, Ho*Wo)
    const float *w = m->params + c->w_off;                                      // (Cout, Cin*K*K)
    for (int b = 0; b < m->B; b++) {
        value_materialize(m, a, c->in, b, x);
        if (dry) continue;
        if (!direct) im2col(x, c->cin, c->H, c->W, c->k, c->s, col);
        float *z = c->z + (size_t)b * c->zstride;
        gemm_cpu(0, 0, c->cout, HWo, KK, w, KK, col, HWo, 0.f, z, HWo);
        if (!c->bn)
            for (int o = 0; o < c->cout; o++)
                for (int i = 0; i < HWo; i++) z[(size_t)o * HWo + i] += m->params[c->b_off + o];
    }
    if (!direct) arena_free(a, col);
    arena_free(a, x);
    if (!c->bn || dry) return;
    float *rm = m->buffers + c->rs_off, *rv = rm + c->cout;
    double cnt = (double)m->B * HWo;
#pragma omp parallel for if (c->cout * cnt > 65536)
    for (int o = 0; o < c->cout; o++) {
        if (!m->train) {
            c->mean[o] = rm[o];
            c->invstd[o] = 1.f / sqrtf(rv[o] + BN_EPS);
            continue;
        }
        double s = 0, ss = 0;
        for (int b = 0; b < m->B; b++) {
            const float *z = c->z + (size_t)b * c->zstride + (size_t)o * HWo;
            for (int i = 0; i < HWo; i++) s += z[i];
        }
        double mean = s / cnt;
        for (int b = 0; b < m->B; b++) {
            const float *z = c->z + (size_t)b * c->zstride + (size_t)o * HWo;
            for (int i = 0; i < HWo; i++) ss += (z[i] - mean) * (z[i] - mean);
        }
        double var = ss / cnt;
        c->mean[o] = (float)mean;
        c->invstd[o] = (float)(1.0 / sqrt(var + BN_EPS));
        rm[o] = (1 - BN_MOMENTUM) * rm[o] + BN_MOMENTUM * (float)mean;
        rv[o] = (1 - BN_MOMENTUM) * rv[o] + BN_MOMENTUM * (float)(cnt > 1 ? var * cnt / (cnt - 1) : var);
    }
}

// conv_backward: from dA (gradient of the activated output) to the weight, gamma/beta (or bias)
// gradients and, through value_backprop, the gradients of its input. BN and SiLU are recomputed
// from z. dA is overwritten with dz on the way.
static void conv_backward(Model *m, Arena *a, Conv *c) {
    int dry = arena_dry(a), HWo = c->Ho * c->Wo, KK = c->cin * c->k * c->k, B = m->B;
    int direct = (c->k == 1 && c->s == 1) || a->half;
    int need_dx = m->val[c->in].kind != V_INPUT;
    if (!c->dA) c->dA = azact(a, (size_t)B * c->zstride, G_BACKWARD);  // an output nobody used
    if (!dry) {
        double cnt = (double)B * HWo;
#pragma omp parallel for if (c->cout * cnt > 65536)
        for (int o = 0; o < c->cout; o++) {
            if (!c->bn) {
                double s = 0;
                for (int b = 0; b < B; b++)
                    for (int i = 0; i < HWo; i++) s += c->dA[(size_t)b * c->zstride + (size_t)o * HWo + i];
                m->grads[c->b_off + o] += (float)s;
                continue;
            }
            float gamma = m->params[c->g_off + o], beta = m->params[c->b_off + o];
            float mean = c->mean[o], istd = c->invstd[o];
            double sg = 0, sgx = 0;
            for (int b = 0; b < B; b++) {
                const float *z = c->z + (size_t)b * c->zstride + (size_t)o * HWo;
                float *d = c->dA + (size_t)b * c->zstride + (size_t)o * HWo;
                for (int i = 0; i < HWo; i++) {
                    float xh = (z[i] - mean) * istd, y = gamma * xh + beta;
                    float s = 1.f / (1.f + expf(-y));
                    float gy = d[i] * s * (1.f + y * (1.f - s));
                    d[i] = gy;
                    sg += gy;
                    sgx += (double)gy * xh;
                }
            }
            m->grads[c->g_off + o] += (float)sgx;
            m->grads[c->b_off + o] += (float)sg;
            float k1 = gamma * istd, mg = m->train ? (float)(sg / cnt) : 0.f, mgx = m->train ? (float)(sgx / cnt) : 0.f;
            for (int b = 0; b < B; b++) {
                const float *z = c->z + (size_t)b * c->zstride + (size_t)o * HWo;
                float *d = c->dA + (size_t)b * c->zstride + (size_t)o * HWo;
                for (int i = 0; i < HWo; i++) d[i] = k1 * (d[i] - mg - (z[i] - mean) * istd * mgx);
            }
        }
    }
    float *x = aact(a, (size_t)c->cin * c->H * c->W, G_SCRATCH);
    float *col = direct ? x : aact(a, (size_t)KK * HWo, G_SCRATCH);
    const float *w = m->params + c->w_off;
    float *gw = m->grads + c->w_off;
    for (int b = 0; b < B; b++) {
        const float *dz = c->dA + (size_t)b * c->zstride;     // (Cout, Ho*Wo)
        value_materialize(m, a, c->in, b, x);
        if (!dry) {
            if (!direct) im2col(x, c->cin, c->H, c->W, c->k, c->s, col);
            gemm_cpu(0, 1, c->cout, KK, HWo, dz, HWo, col, HWo, 1.f, gw, KK);
            if (need_dx) {
                gemm_cpu(1, 0, KK, HWo, c->cout, w, KK, dz, HWo, 0.f, col, HWo);
                if (!direct) col2im(col, c->cin, c->H, c->W, c->k, c->s, x);
            }
        }
        if (need_dx) value_backprop(m, a, c->in, b, x);
    }
    if (!direct) arena_free(a, col);
    arena_free(a, x);
}

// model_alloc_params: the persistent groups: weights and gradients (flat, state_dict order)
// and the BN running statistics.
static void model_alloc_params(Model *m, Arena *a) {
    m->params = azfloat(a, m->nparams, G_PARAMS);
    m->grads = azfloat(a, m->nparams, G_GRADS);
    m->buffers = azfloat(a, m->nbuffers, G_BUFFERS);
}

// model_forward: the whole network on x (B, 3, H, W) in [0,1]; leaves the three raw Detect
// maps in m->head. Allocates what backward needs (freed by model_backward, or by model_release
// after an eval-only forward).
static void model_forward(Model *m, Arena *a, const float *x, int B, int H, int W) {
    m->x = x;
    m->B = B;
    m->H = H;
    m->W = W;
    model_shape(m, H, W);
    for (int i = 0; i < 3 && m->has_head; i++) {
        const Conv *box = &m->conv[m->head_conv[i][0]];
        m->head[i] = afloat(a, (size_t)B * (REG_MAX * 4 + m->nc) * box->Ho * box->Wo, G_ACTS);
        m->dhead[i] = NULL;
    }
    for (int e = 0; e < m->nexec; e++) {
        Conv *c = &m->conv[m->exec[e]];
        int HWo = c->Ho * c->Wo;
        c->dA = NULL;
        c->mean = c->invstd = NULL;
        if (c->level >= 0) {   // a Detect output conv writes its channels of the level's map
            c->zstride = (size_t)(REG_MAX * 4 + m->nc) * HWo;
            c->z = m->head[c->level] + (c->branch ? (size_t)REG_MAX * 4 * HWo : 0);
        } else {
            c->zstride = (size_t)c->cout * HWo;
            c->z = aact(a, (size_t)B * c->zstride, G_ACTS);
        }
        if (c->bn) {
            c->mean = afloat(a, 2 * (size_t)c->cout, G_ACTS);
            c->invstd = c->mean + c->cout;
        }
        conv_forward(m, a, c);
    }
}

// model_head_grad: allocates the gradient buffers of the three head maps (zeroed); the loss
// writes them, model_backward consumes and frees them.
static void model_head_grad(Model *m, Arena *a) {
    for (int i = 0; i < 3; i++) {
        const Conv *box = &m->conv[m->head_conv[i][0]];
        m->dhead[i] = azfloat(a, (size_t)m->B * (REG_MAX * 4 + m->nc) * box->Ho * box->Wo, G_BACKWARD);
        for (int j = 0; j < 2; j++) {
            Conv *c = &m->conv[m->head_conv[i][j]];
            c->dA = m->dhead[i] + (j ? (size_t)REG_MAX * 4 * box->Ho * box->Wo : 0);
        }
    }
}

// model_backward: gradients of all parameters (accumulated into m->grads) from m->dhead; frees
// every buffer model_forward and model_head_grad allocated, in reverse order.
static void model_backward(Model *m, Arena *a) {
    for (int e = m->nexec - 1; e >= 0; e--) {
        Conv *c = &m->conv[m->exec[e]];
        conv_backward(m, a, c);
        if (c->level < 0) {
            arena_free(a, c->dA);
            arena_free(a, c->mean);
            arena_free(a, c->z);
        }
        c->dA = c->z = c->mean = c->invstd = NULL;
    }
    for (int i = 2; i >= 0 && m->has_head; i--) {
        arena_free(a, m->dhead[i]);
        arena_free(a, m->head[i]);
        m->dhead[i] = m->head[i] = NULL;
    }
}

// model_release: frees what an eval-only forward allocated (no backward).
static void model_release(Model *m, Arena *a) {
    for (int e = m->nexec - 1; e >= 0; e--) {
        Conv *c = &m->conv[m->exec[e]];
        if (c->level < 0) {
            arena_free(a, c->mean);
            arena_free(a, c->z);
        }
        c->z = c->mean = c->invstd = NULL;
    }
    for (int i = 2; i >= 0 && m->has_head; i--) {
        arena_free(a, m->head[i]);
        m->head[i] = NULL;
    }
}

// ------------------------------------------------------------------------------------------
// planning: the exact bytes of a training step, and `yolo info` / `yolo plan`
// ------------------------------------------------------------------------------------------

// Plan: what a dry run measured, for one layout.
typedef struct {
    size_t total;                   // the arena size: high-water mark of the dry run
    size_t at_peak[G_NGROUPS];      // bytes of each group live at that peak
    size_t peak[G_NGROUPS];         // each group's own maximum
} Plan;

// model_step_schedule: the allocation sequence of one training step (forward, head gradient,
// backward) on an arena that already holds the persistent groups. Real and dry runs share it.
static void model_step_schedule(Model *m, Arena *a, const float *x, int B, int H, int W) {
    model_forward(m, a, x, B, H, W);
    model_head_grad(m, a);
    model_backward(m, a);
}

// model_plan: dry-runs a step for (B, H, W) and reports the arena size and its composition.
static Plan model_plan_layout(Model *m, int B, int H, int W, int half) {
    Arena *a = xcalloc(1, sizeof(Arena));
    a->cap = SIZE_MAX;
    a->half = half;
    float *keep[3] = {m->params, m->grads, m->buffers};   // a dry run must not lose the real ones
    model_alloc_params(m, a);
    model_step_schedule(m, a, NULL, B, H, W);
    m->params = keep[0], m->grads = keep[1], m->buffers = keep[2];
    Plan p = {.total = a->high};
    memcpy(p.at_peak, a->at_high, sizeof p.at_peak);
    memcpy(p.peak, a->peak, sizeof p.peak);
    free(a);
    return p;
}

static Plan model_plan(Model *m, int B, int H, int W) { return model_plan_layout(m, B, H, W, 0); }

// model_open: builds the model and allocates its arena (one malloc) for a step of (B, H, W);
// returns the arena, whose high-water mark tests compare against the plan.
static Arena *model_open(Model *m, char scale, int nc, int B, int H, int W, uint64_t seed) {
    model_build(m, scale, nc);
    Plan p = model_plan(m, B, H, W);
    Arena *a = xcalloc(1, sizeof(Arena));
    a->base = aligned_alloc(ARENA_ALIGN, (p.total + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN);
    if (!a->base) die("cannot allocate the %.1f MiB arena (hint: lower batch or imgsz; see `yolo plan`)", p.total / 1048576.0);
    a->cap = p.total;
    model_alloc_params(m, a);
    model_init_params(m, seed);
    model_shape(m, H, W);
    m->B = B;
    m->H = H;
    m->W = W;
    return a;
}

static void model_zero_grad(Model *m) { memset(m->grads, 0, m->nparams * sizeof(float)); }

static const char *model_args_keys[] = {"model", "nc", "imgsz", "batch", NULL};

// model_from_args: model=yolov8n nc=80 from the command line.
static void model_from_args(Model *m, int argc, char **argv) {
    const char *name = arg_get(argc, argv, "model", "yolov8n");
    const Scale *sc = scale_find(name);
    if (!sc) die("model=%s: expected yolov8n, yolov8s, yolov8m, yolov8l or yolov8x", name);
    model_build(m, sc->name, (int)arg_int(argc, argv, "nc", 80));
}

// cmd_info: `yolo info model=yolov8n nc=80 imgsz=640`: the layer table and totals, counted as
// Ultralytics counts them (parameters incl. the frozen DFL weight; GFLOPs per spec 1.1).
static int cmd_info(int argc, char **argv) {
    arg_check(argc, argv, model_args_keys);
    Model *m = xmalloc(sizeof(Model));
    model_from_args(m, argc, argv);
    int imgsz = (int)arg_int(argc, argv, "imgsz", 640);
    if (imgsz < 32 || imgsz % 32) die("imgsz=%d: must be a positive multiple of 32", imgsz);
    model_shape(m, imgsz, imgsz);
    printf("%4s %14s %3s %10s  %-10s %s\n", "", "from", "n", "params", "module", "output (C, H, W)");
    for (int i = 0; i < m->nlayer; i++) {
        LayerRow *r = &m->layer[i];
        printf("%4d %14s %3d %10ld  %-10s", i, r->from, r->nrep, r->params, r->module);
        if (r->value >= 0) {
            Value *v = &m->val[r->value];
            printf(" (%d, %d, %d)\n", v->C, v->H, v->W);
        } else {
            printf(" 3 x (%d, H/s, W/s), s = 8, 16, 32\n", REG_MAX * 4 + m->nc);
        }
    }
    double gf = model_flops(m, imgsz, 0), gff = model_flops(m, imgsz, 1);
    printf("YOLOv8%c summary: %zu parameters, %zu gradients, %.1f GFLOPs (fused %.1f) at %d\n", m->scale,
           m->nparams, m->nparams - REG_MAX, gf, gff, imgsz);
    free(m);
    return 0;
}

static void plan_print(const char *title, Plan p, Plan p1, Plan p2) {
    printf("%s\n", title);
    for (int g = 0; g < G_NGROUPS; g++)
        if (p.peak[g]) printf("  %-20s %10.1f MiB at peak   (own max %.1f MiB)\n", group_names[g], p.at_peak[g] / 1048576.0, p.peak[g] / 1048576.0);
    printf("  %-20s %10.1f MiB\n", "total (one arena)", p.total / 1048576.0);
    printf("  %-20s %10.2f MiB per image\n", "step memory", ((double)p2.total - p1.total) / 1048576.0);
}

// cmd_plan: `yolo plan model=... nc=... batch=... imgsz=...`: the exact training-step memory by
// group for the CPU (FP32) layout and the GPU layout (FP16 activations, FP32 master weights).
static int cmd_plan(int argc, char **argv) {
    arg_check(argc, argv, model_args_keys);
    Model *m = xmalloc(sizeof(Model));
    model_from_args(m, argc, argv);
    int imgsz = (int)arg_int(argc, argv, "imgsz", 640), B = (int)arg_int(argc, argv, "batch", 16);
    if (imgsz < 32 || imgsz % 32) die("imgsz=%d: must be a positive multiple of 32", imgsz);
    if (B < 1) die("batch=%d: must be >= 1", B);
    printf("YOLOv8%c nc=%d batch=%d imgsz=%d: %zu parameters\n", m->scale, m->nc, B, imgsz, m->nparams);
    Plan p = model_plan(m, B, imgsz, imgsz), p1 = model_plan(m, 1, imgsz, imgsz), p2 = model_plan(m, 2, imgsz, imgsz);
    plan_print("CPU layout (FP32):", p, p1, p2);
    Plan g = model_plan_layout(m, B, imgsz, imgsz, 1), g1 = model_plan_layout(m, 1, imgsz, imgsz, 1);
    Plan g2 = model_plan_layout(m, 2, imgsz, imgsz, 1);
    plan_print("GPU layout (FP16 activations, FP32 master weights, implicit-GEMM convs):", g, g1, g2);
    free(m);
    return 0;
}

// ------------------------------------------------------------------------------------------
// loss: task-aligned assigner, BCE, CIoU, DFL
// ------------------------------------------------------------------------------------------
#include "parts/loss.c"

// ------------------------------------------------------------------------------------------
// optimizer, gradient clipping, EMA
// ------------------------------------------------------------------------------------------
/*
 * Ultralytics' three parameter groups (trainer.build_optimizer, spec 3): pg0 every "bias" (BN beta
 * and the Detect output biases, no decay), pg1 conv weights (decay), pg2 BN gamma (no decay). The
 * frozen DFL weight is in no group. Parameters live in one flat array, so a group is a list of
 * segments.
 */
enum { PG_BIAS, PG_WEIGHT, PG_BN, PG_N };
enum { OPT_SGD, OPT_ADAMW };

typedef struct {
    int kind;                  // OPT_SGD (Nesterov) or OPT_ADAMW (decoupled decay)
    double lr[PG_N];           // per-group learning rate (set every iteration by the schedule)
    double momentum;           // SGD momentum / Adam beta1
    double beta2, eps;         // AdamW
    double weight_decay;       // applied to PG_WEIGHT only
    long step;                 // optimizer steps taken (Adam bias correction)
    float *m, *v;              // (nparams) momentum buffer / Adam moments; v NULL for SGD
} Optimizer;

// param_group_of: the group of each conv tensor: 0 weight, 1 bias/beta, 2 gamma
static void model_segments(const Model *m, int conv, size_t off[3], size_t len[3], int pg[3]) {
    const Conv *c = &m->conv[conv];
    off[0] = c->w_off; len[0] = (size_t)c->cout * c->cin * c->k * c->k; pg[0] = PG_WEIGHT;
    off[1] = c->b_off; len[1] = c->cout; pg[1] = PG_BIAS;
    off[2] = c->g_off; len[2] = c->bn ? (size_t)c->cout : 0; pg[2] = PG_BN;
}

// grad_clip_norm: torch.nn.utils.clip_grad_norm_(params, max_norm): total L2 norm over all
// trainable gradients (DFL excluded); scales them by min(1, max_norm / (norm + 1e-6)).
// Returns the norm before clipping (inf/NaN propagate, so the caller can skip the step).
static double grad_clip_norm(Model *m, double max_norm) {
    double ss = 0;
#pragma omp parallel for reduction(+ : ss)
    for (size_t i = 0; i < m->dfl_off; i++) ss += (double)m->grads[i] * m->grads[i];
    for (size_t i = m->dfl_off + REG_MAX; i < m->nparams; i++) ss += (double)m->grads[i] * m->grads[i];
    double norm = sqrt(ss), coef = max_norm / (norm + 1e-6);
    if (coef < 1 && isfinite(norm)) {
        float c = (float)coef;
#pragma omp parallel for
        for (size_t i = 0; i < m->nparams; i++) m->grads[i] *= c;
    }
    return norm;
}

// optim_step: one SGD (torch.optim.SGD, nesterov, decay added to the gradient) or AdamW
// (torch.optim.AdamW: decoupled decay p *= 1 - lr*wd, bias-corrected moments, eps 1e-8) update of
// every trainable parameter, with the group's lr and decay.
static void optim_step(Optimizer *o, Model *m) {
    o->step++;
    double bc1 = 1 - pow(o->momentum, (double)o->step), bc2 = 1 - pow(o->beta2, (double)o->step);
    for (int ci = 0; ci < m->nconv; ci++) {
        size_t off[3], len[3];
        int pg[3];
        model_segments(m, ci, off, len, pg);
        for (int s = 0; s < 3; s++) {
            float lr = (float)o->lr[pg[s]], wd = pg[s] == PG_WEIGHT ? (float)o->weight_decay : 0.f, mom = (float)o->momentum;
            float *p = m->params + off[s], *g = m->grads + off[s], *mb = o->m + off[s];
            if (o->kind == OPT_SGD) {
                int first = o->step == 1;
                for (size_t i = 0; i < len[s]; i++) {
                    float gi = g[i] + wd * p[i];
                    mb[i] = first ? gi : mom * mb[i] + gi;
                    p[i] -= lr * (gi + mom * mb[i]);
                }
            } else {
                float *vb = o->v + off[s], b1 = mom, b2 = (float)o->beta2;
                float step = (float)(o->lr[pg[s]] / bc1), sq = (float)sqrt(bc2), eps = (float)o->eps;
                for (size_t i = 0; i < len[s]; i++) {
                    p[i] *= 1 - lr * wd;
                    mb[i] = b1 * mb[i] + (1 - b1) * g[i];
                    vb[i] = b2 * vb[i] + (1 - b2) * g[i] * g[i];
                    p[i] -= step * mb[i] / (sqrtf(vb[i]) / sq + eps);
                }
            }
        }
    }
}

// Ema: ModelEMA (utils/torch_utils.py): a copy of the weights and BN running stats,
// ema = d*ema + (1-d)*model after every optimizer step, d = 0.9999 * (1 - exp(-updates / 2000)).
typedef struct {
    float *params, *buffers;   // (nparams), (nbuffers)
    long updates;
} Ema;

static void ema_update(Ema *e, const Model *m) {
    e->updates++;
    float d = (float)(0.9999 * (1 - exp(-(double)e->updates / 2000.0)));
#pragma omp parallel for
    for (size_t i = 0; i < m->nparams; i++) e->params[i] = d * e->params[i] + (1 - d) * m->params[i];
    for (size_t i = 0; i < m->nbuffers; i++) e->buffers[i] = d * e->buffers[i] + (1 - d) * m->buffers[i];
}

// ------------------------------------------------------------------------------------------
// weights: safetensors with Ultralytics state_dict names
// ------------------------------------------------------------------------------------------
#include "parts/weights.c"

// ------------------------------------------------------------------------------------------
// evaluation: decode, NMS, matching, mAP
// ------------------------------------------------------------------------------------------
#include "parts/eval.c"

// ------------------------------------------------------------------------------------------
// state_dict: the model's tensors under Ultralytics names; `yolo check-ref`
// ------------------------------------------------------------------------------------------

// StateDict: the ParamRefs of a model (Ultralytics order and names) over given storage, so the
// same code serves the model, the EMA and checkpoints.
typedef struct {
    int n;
    ParamRef ref[MAX_CONVS * 6 + 1];
    char names[MAX_CONVS * 6 + 1][64];
    int64_t nbt;               // num_batches_tracked (one value for every BN)
} StateDict;

// state_dict_build: entries for params (nparams) and buffers (nbuffers) in module order:
// Conv: conv.weight, bn.weight, bn.bias, bn.running_mean, bn.running_var, bn.num_batches_tracked;
// Detect output conv: weight, bias; then model.22.dfl.conv.weight.
static void state_dict_build(StateDict *sd, const Model *m, float *params, float *buffers) {
    sd->n = 0;
#define SD_ADD(fmt, nm, knd, ptr, nd, s0, s1, s2, s3) do { \
        ParamRef *r_ = &sd->ref[sd->n]; snprintf(sd->names[sd->n], 64, fmt, nm); \
        *r_ = (ParamRef){.name = sd->names[sd->n], .ndim = nd, .shape = {s0, s1, s2, s3}, .data = ptr, .kind = knd}; \
        sd->n++; } while (0)
    for (int i = 0; i < m->nconv; i++) {
        const Conv *c = &m->conv[i];
        if (c->bn) {
            SD_ADD("%s.conv.weight", c->name, PARAM_TRAIN, params + c->w_off, 4, c->cout, c->cin, c->k, c->k);
            SD_ADD("%s.bn.weight", c->name, PARAM_TRAIN, params + c->g_off, 1, c->cout, 0, 0, 0);
            SD_ADD("%s.bn.bias", c->name, PARAM_TRAIN, params + c->b_off, 1, c->cout, 0, 0, 0);
            SD_ADD("%s.bn.running_mean", c->name, PARAM_BUFFER, buffers + c->rs_off, 1, c->cout, 0, 0, 0);
            SD_ADD("%s.bn.running_var", c->name, PARAM_BUFFER, buffers + c->rs_off + c->cout, 1, c->cout, 0, 0, 0);
            SD_ADD("%s.bn.num_batches_tracked", c->name, PARAM_COUNT, NULL, 0, 0, 0, 0, 0);
            sd->ref[sd->n - 1].count = sd->nbt;
        } else {
            SD_ADD("%s.weight", c->name, PARAM_TRAIN, params + c->w_off, 4, c->cout, c->cin, c->k, c->k);
            SD_ADD("%s.bias", c->name, PARAM_TRAIN, params + c->b_off, 1, c->cout, 0, 0, 0);
        }
    }
    SD_ADD("%s", "model.22.dfl.conv.weight", PARAM_TRAIN, params + m->dfl_off, 4, 1, REG_MAX, 1, 1);
#undef SD_ADD
}

// rel_diff: max |a - b| over max |b| (the per-tensor relative error used by check-ref)
static double rel_diff(const float *a, const float *b, size_t n) {
    double d = 0, mx = 0;
    for (size_t i = 0; i < n; i++) {
        d = fmax(d, fabs((double)a[i] - b[i]));
        mx = fmax(mx, fabs((double)b[i]));
    }
    return d / (mx > 0 ? mx : 1);
}

// st_tensor: a named float tensor of a fixture, read whole (dies with the file and name if absent)
static float *st_tensor(SafeTensors *st, const char *name, size_t *numel) {
    char err[512];
    const StEntry *e = st_find(st, name);
    if (!e) die("%s: no tensor '%s'", st->path, name);
    float *x = xmalloc((size_t)e->numel * sizeof(float) + 4);
    if (st_read_f32(st, e, x, err, sizeof err)) die("%s", err);
    if (numel) *numel = (size_t)e->numel;
    return x;
}

static int cref_pass, cref_fail;
static void cref_report(int ok, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("%s  ", ok ? "PASS" : "FAIL");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    if (ok) cref_pass++; else cref_fail++;
}

// check_ref: compares this implementation with a reference fixture written by
// test/reference.py (or any implementation with the same tensor names): eval and train head
// outputs, BN running stats, loss components and assignment, every parameter gradient, and the
// parameters after one SGD step (clip-norm 10, Nesterov, three groups). FP32 CPU. Returns the
// number of failed comparisons.
static int check_ref(const char *path) {
    char err[512];
    SafeTensors st;
    if (st_open(path, &st, err, sizeof err)) die("%s", err);
    const char *ms = st_meta(&st, "scale"), *mnc = st_meta(&st, "nc"), *mimg = st_meta(&st, "imgsz"), *mb = st_meta(&st, "batch");
    if (!ms || !mnc || !mimg || !mb) die("%s: metadata needs scale, nc, imgsz and batch", path);
    int nc = atoi(mnc), S = atoi(mimg), B = atoi(mb);
    double lr = st_meta(&st, "lr") ? atof(st_meta(&st, "lr")) : 0.01;
    double mom = st_meta(&st, "momentum") ? atof(st_meta(&st, "momentum")) : 0.937;
    double wd = st_meta(&st, "weight_decay") ? atof(st_meta(&st, "weight_decay")) : 0.0005;
    double clip = st_meta(&st, "clip") ? atof(st_meta(&st, "clip")) : 10.0;
    printf("fixture %s: yolov8%s nc=%d imgsz=%d batch=%d\n", path, ms, nc, S, B);

    Model *m = xmalloc(sizeof(Model));
    model_build(m, ms[0], nc);
    int A = loss_num_anchors(S, S);
    LossConfig lcfg = loss_config_default();
    size_t loss_bytes = loss_scratch_bytes(B, A, lcfg.max_boxes);
    Plan p = model_plan(m, B, S, S);
    Arena *a = xcalloc(1, sizeof(Arena));
    a->cap = p.total + loss_bytes + (size_t)3 * m->nparams * sizeof(float) + 4096;
    a->base = aligned_alloc(ARENA_ALIGN, (a->cap + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN);
    model_alloc_params(m, a);
    StateDict *sd = xcalloc(1, sizeof(StateDict));
    state_dict_build(sd, m, m->params, m->buffers);
    if (weights_load_st(&st, sd->ref, sd->n, "", 1, err, sizeof err)) die("%s", err);
    float *x = st_tensor(&st, "input.images", NULL);

    // 1. eval forward on the initial weights: raw maps and decoded output
    m->train = 0;
    model_forward(m, a, x, B, S, S);
    char nm[64];
    for (int l = 0; l < 3; l++) {
        snprintf(nm, sizeof nm, "out.eval_raw.%d", l);
        size_t n;
        float *ref = st_tensor(&st, nm, &n);
        double d = rel_diff(m->head[l], ref, n);
        cref_report(d <= 1e-4, "eval raw map P%d: max|diff|/max|ref| %.2e (tol 1e-4)", l + 3, d);
        free(ref);
    }
    {
        size_t n;
        float *ref = st_tensor(&st, "out.eval", &n), *dec = xmalloc(n * sizeof(float));
        head_decode((const float *const *)m->head, B, nc, S, S, dec);
        double d = rel_diff(dec, ref, n);
        cref_report(d <= 1e-4, "eval decoded (B, 4+nc, A): max|diff|/max|ref| %.2e (tol 1e-4)", d);
        free(ref);
        free(dec);
    }
    model_release(m, a);

    // 2. train forward: raw maps and the BN running stats it updates
    m->train = 1;
    model_forward(m, a, x, B, S, S);
    for (int l = 0; l < 3; l++) {
        snprintf(nm, sizeof nm, "out.train.%d", l);
        size_t n;
        float *ref = st_tensor(&st, nm, &n);
        double d = rel_diff(m->head[l], ref, n);
        cref_report(d <= 1e-4, "train raw map P%d: max|diff|/max|ref| %.2e (tol 1e-4)", l + 3, d);
        free(ref);
    }
    double worst_bn = 0;
    for (int i = 0; i < sd->n; i++)
        if (sd->ref[i].kind == PARAM_BUFFER) {
            snprintf(nm, sizeof nm, "bn_after.%s", sd->ref[i].name);
            size_t n;
            float *ref = st_tensor(&st, nm, &n);
            worst_bn = fmax(worst_bn, rel_diff(sd->ref[i].data, ref, n));
            free(ref);
        }
    cref_report(worst_bn <= 1e-4, "BN running stats after the train forward: worst max|diff|/max|ref| %.2e (tol 1e-4)", worst_bn);

    // 3. loss and assignment
    size_t nt;
    float *tb = st_tensor(&st, "targets.batch_idx", &nt), *tc = st_tensor(&st, "targets.cls", NULL);
    float *tbox = st_tensor(&st, "targets.bboxes", NULL);
    int *bi = xmalloc((nt + 1) * sizeof(int)), *ci = xmalloc((nt + 1) * sizeof(int));
    for (size_t i = 0; i < nt; i++) bi[i] = (int)tb[i], ci[i] = (int)tc[i];
    LossTargets tg = {(int)nt, bi, ci, tbox};
    model_head_grad(m, a);
    void *scratch = arena_alloc(a, loss_bytes, G_LOSS);
    LossOut lo = loss_forward_backward(&lcfg, B, nc, S, S, (const float *const *)m->head, m->dhead, &tg, 1.f, scratch, loss_bytes, 0);
    arena_free(a, scratch);
    static const char *const lnames[3] = {"loss.box", "loss.cls", "loss.dfl"};
    double lgot[3] = {lo.box, lo.cls, lo.dfl};
    for (int k = 0; k < 3; k++) {
        float *ref = st_tensor(&st, lnames[k], NULL);
        double d = fabs(lgot[k] - ref[0]) / fmax(fabs(ref[0]), 1e-12);
        cref_report(d <= 1e-5, "%s: got %.7g want %.7g, rel diff %.2e (tol 1e-5)", lnames[k], lgot[k], ref[0], d);
        free(ref);
    }
    {
        const StEntry *e = st_find(&st, "assign.fg_count");
        int64_t fg = -1;
        if (!e || st_read_i64(&st, e, &fg, err, sizeof err)) die("%s: assign.fg_count: %s", path, e ? err : "missing");
        cref_report(fg == lo.n_fg, "assigner foreground anchors: got %d want %lld (identical)", lo.n_fg, (long long)fg);
        float *ref = st_tensor(&st, "assign.target_scores_sum", NULL);
        double d = fabs(lo.target_scores_sum - ref[0]) / ref[0];
        cref_report(d <= 1e-5, "target_scores_sum: got %.7g want %.7g (tol 1e-5 rel)", lo.target_scores_sum, ref[0]);
        free(ref);
    }

    // 4. backward: every parameter gradient relative to that tensor's norm
    model_zero_grad(m);
    model_backward(m, a);
    double worst_g = 0;
    const char *worst_name = "";
    int ngrad = 0;
    for (int i = 0; i < sd->n; i++) {
        if (sd->ref[i].kind != PARAM_TRAIN || strstr(sd->ref[i].name, ".dfl")) continue;
        snprintf(nm, sizeof nm, "grad.%s", sd->ref[i].name);
        size_t n;
        float *ref = st_tensor(&st, nm, &n);
        const float *g = m->grads + (sd->ref[i].data - m->params);
        double dn = 0, rn = 0;
        for (size_t j = 0; j < n; j++) dn += ((double)g[j] - ref[j]) * ((double)g[j] - ref[j]), rn += (double)ref[j] * ref[j];
        double d = sqrt(dn) / fmax(sqrt(rn), 1e-20);
        if (d > worst_g) worst_g = d, worst_name = sd->ref[i].name;
        ngrad++;
        free(ref);
    }
    cref_report(worst_g <= 1e-3, "gradients of %d tensors: worst |g - ref| / |ref| %.2e (%s) (tol 1e-3)", ngrad, worst_g, worst_name);

    // 5. one optimizer step: clip-norm, SGD Nesterov, three groups
    Optimizer opt = {.kind = OPT_SGD, .lr = {lr, lr, lr}, .momentum = mom, .weight_decay = wd};
    opt.m = azfloat(a, m->nparams, G_OPTIM);
    double norm = grad_clip_norm(m, clip);
    if (st_meta(&st, "grad_norm")) {
        double rn = atof(st_meta(&st, "grad_norm"));
        cref_report(fabs(norm - rn) / rn <= 1e-4, "total gradient norm: got %.6g want %.6g (tol 1e-4 rel)", norm, rn);
    }
    optim_step(&opt, m);
    double worst_p = 0;
    worst_name = "";
    for (int i = 0; i < sd->n; i++) {
        if (sd->ref[i].kind != PARAM_TRAIN) continue;
        snprintf(nm, sizeof nm, "step.%s", sd->ref[i].name);
        size_t n;
        float *ref = st_tensor(&st, nm, &n);
        double d = 0;
        for (size_t j = 0; j < n; j++) d = fmax(d, fabs((double)sd->ref[i].data[j] - ref[j]));
        if (d > worst_p) worst_p = d, worst_name = sd->ref[i].name;
        free(ref);
    }
    cref_report(worst_p <= 1e-5, "parameters after one SGD step: worst max|diff| %.2e (%s) (tol 1e-5)", worst_p, worst_name);
    printf("%d passed, %d failed\n", cref_pass, cref_fail);
    st_close(&st);
    free(x); free(tb); free(tc); free(tbox); free(bi); free(ci); free(sd); free(a->base); free(a); free(m);
    return cref_fail;
}

static int cmd_check_ref(int argc, char **argv) {
    if (argc < 3) die("usage: yolo check-ref FIXTURE.safetensors");
    return check_ref(argv[2]) ? 1 : 0;
}

// ------------------------------------------------------------------------------------------
// data: yaml, labels, decoding, letterbox, augmentation, loader, synthetic shapes
// ------------------------------------------------------------------------------------------
#include "parts/data.c"

// ------------------------------------------------------------------------------------------
// training: the Ultralytics recipe, validation, checkpoints, predict
// ------------------------------------------------------------------------------------------
#include <sys/stat.h>
#include <signal.h>
#include <unistd.h>

// Config: every setting of `yolo train/val/predict`, with Ultralytics' keys and defaults.
typedef struct {
    char data[512], model[512], project[256], name[128], optimizer[16], device[32], cache[16], source[512];
    int epochs, imgsz, batch, workers, nbs, close_mosaic, patience, cos_lr, amp, resume, accumulate, max_boxes, exist_ok;
    double lr0, lrf, momentum, weight_decay, warmup_epochs, warmup_momentum, warmup_bias_lr, box, cls, dfl, conf, iou;
    uint64_t seed;
    AugConfig aug;
} Config;

static const char *const train_keys[] = {
    "data", "model", "epochs", "imgsz", "batch", "device", "workers", "optimizer", "lr0", "lrf", "momentum",
    "weight_decay", "warmup_epochs", "warmup_momentum", "warmup_bias_lr", "box", "cls", "dfl", "nbs", "cos_lr",
    "close_mosaic", "patience", "seed", "amp", "cache", "project", "name", "resume", "accumulate", "max_boxes",
    "exist_ok", "hsv_h", "hsv_s", "hsv_v", "degrees", "translate", "scale", "shear", "perspective", "flipud",
    "fliplr", "mosaic", "mixup", "conf", "iou", "source", NULL};

static void cfg_str(char *dst, size_t n, int argc, char **argv, const char *key, const char *def) {
    const char *v = arg_get(argc, argv, key, def);
    if (strlen(v) >= n) die("%s=%s: value too long", key, v);
    snprintf(dst, n, "%s", v);
}

// config_from_args: defaults of cfg/default.yaml, then key=value overrides, then checks that
// name the offending key.
static Config config_from_args(int argc, char **argv) {
    arg_check(argc, argv, train_keys);
    Config c;
    memset(&c, 0, sizeof c);
    cfg_str(c.data, sizeof c.data, argc, argv, "data", "");
    cfg_str(c.model, sizeof c.model, argc, argv, "model", "yolov8n");
    cfg_str(c.project, sizeof c.project, argc, argv, "project", "runs");
    cfg_str(c.name, sizeof c.name, argc, argv, "name", "");
    cfg_str(c.optimizer, sizeof c.optimizer, argc, argv, "optimizer", "auto");
    cfg_str(c.device, sizeof c.device, argc, argv, "device", "");
    cfg_str(c.cache, sizeof c.cache, argc, argv, "cache", "0");
    cfg_str(c.source, sizeof c.source, argc, argv, "source", "");
    c.epochs = (int)arg_int(argc, argv, "epochs", 100);
    c.imgsz = (int)arg_int(argc, argv, "imgsz", 640);
    c.batch = (int)arg_int(argc, argv, "batch", 16);
    c.workers = (int)arg_int(argc, argv, "workers", 2);
    c.nbs = (int)arg_int(argc, argv, "nbs", 64);
    c.close_mosaic = (int)arg_int(argc, argv, "close_mosaic", 10);
    c.patience = (int)arg_int(argc, argv, "patience", 100);
    c.cos_lr = (int)arg_int(argc, argv, "cos_lr", 0);
    c.amp = (int)arg_int(argc, argv, "amp", 1);
    c.resume = (int)arg_int(argc, argv, "resume", 0);
    c.accumulate = (int)arg_int(argc, argv, "accumulate", 0);
    c.max_boxes = (int)arg_int(argc, argv, "max_boxes", 400);
    c.exist_ok = (int)arg_int(argc, argv, "exist_ok", 0);
    c.lr0 = arg_num(argc, argv, "lr0", 0.01);
    c.lrf = arg_num(argc, argv, "lrf", 0.01);
    c.momentum = arg_num(argc, argv, "momentum", 0.937);
    c.weight_decay = arg_num(argc, argv, "weight_decay", 0.0005);
    c.warmup_epochs = arg_num(argc, argv, "warmup_epochs", 3.0);
    c.warmup_momentum = arg_num(argc, argv, "warmup_momentum", 0.8);
    c.warmup_bias_lr = arg_num(argc, argv, "warmup_bias_lr", 0.1);
    c.box = arg_num(argc, argv, "box", 7.5);
    c.cls = arg_num(argc, argv, "cls", 0.5);
    c.dfl = arg_num(argc, argv, "dfl", 1.5);
    c.conf = arg_num(argc, argv, "conf", -1);
    c.iou = arg_num(argc, argv, "iou", 0.7);
    c.seed = (uint64_t)arg_int(argc, argv, "seed", 0);
    c.aug = aug_defaults();
    aug_from_args(&c.aug, argc, argv);
    if (c.imgsz < 32) die("imgsz=%d: must be at least 32", c.imgsz);
    if (c.imgsz % 32) {
        int r = (c.imgsz + 31) / 32 * 32;
        fprintf(stderr, "imgsz=%d is not a multiple of 32 (the largest stride); using %d\n", c.imgsz, r);
        c.imgsz = r;
    }
    if (c.batch < 1) die("batch=%d: must be >= 1 (batch=-1 / AutoBatch needs a GPU memory size; see yolo plan)", c.batch);
    if (c.epochs < 1) die("epochs=%d: must be >= 1", c.epochs);
    if (c.workers < 0 || c.workers > 64) die("workers=%d: must be 0..64", c.workers);
    if (c.max_boxes < 1) die("max_boxes=%d: must be >= 1", c.max_boxes);
    if (c.nbs < 1) die("nbs=%d: must be >= 1", c.nbs);
    if (c.accumulate < 0) die("accumulate=%d: must be >= 1 (0 = nbs/batch)", c.accumulate);
    if (strcmp(c.optimizer, "auto") && strcmp(c.optimizer, "SGD") && strcmp(c.optimizer, "AdamW"))
        die("optimizer=%s: expected auto, SGD or AdamW", c.optimizer);
    if (c.device[0] && strcmp(c.device, "cpu")) {
        if (strchr(c.device, ',')) die("device=%s: multi-GPU training is not supported yet; use one device", c.device);
        die("device=%s: this build has no CUDA backend yet; use device=cpu", c.device);
    }
    if (strcmp(c.cache, "0") && strcmp(c.cache, "ram") && strcmp(c.cache, "False") && strcmp(c.cache, "false"))
        die("cache=%s: expected ram or 0 (disk caching is not supported)", c.cache);
    return c;
}

// Trainer: everything a run holds. All numeric state of the model, optimizer and EMA lives in the arena.
typedef struct {
    Config cfg;
    Model m;
    Arena *arena;
    Optimizer opt;
    Ema ema;
    StateDict sd, sd_ema;
    LossConfig lcfg;
    DataConfig data;
    Dataset train_ds, val_ds;
    Loader *train_ld, *val_ld;
    float *x;                  // (B, 3, H, W) input staging, sized for the largest batch
    int B, S, nb, accumulate;
    double wd, initial_lr;
    Nms nms;
    Det *dets;                 // (max_det)
    Evaluator ev;
    char dir[768];
    // progress (saved in checkpoints)
    int epoch;                 // next epoch to run
    long last_opt_step;
    double best_fitness;
    int best_epoch, nan_skips;
} Trainer;

// lr_lambda: the per-epoch LR factor (LambdaLR of trainer._setup_scheduler).
static double lr_lambda(const Config *c, int epoch) {
    if (c->cos_lr) return ((1 - cos(epoch * M_PI / c->epochs)) / 2) * (c->lrf - 1) + 1;
    return fmax(1 - (double)epoch / c->epochs, 0) * (1 - c->lrf) + c->lrf;
}

static double interp(double x, double x0, double x1, double y0, double y1) {
    if (x <= x0) return y0;
    if (x >= x1) return y1;
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0);
}

// input_from_batch: uint8 RGB (B, 3, H, W) -> float [0, 1] into the staging buffer
static void input_from_batch(float *x, const Batch *bt) {
    size_t n = (size_t)bt->B * 3 * bt->H * bt->W;
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) x[i] = bt->img[i] * (1.f / 255.f);
}

// trainer_step: one forward (+ loss, + backward when train) on the arena. In a dry run (no
// batch) it makes exactly the allocations of a real one, which is how the plan is computed.
static LossOut trainer_step(Trainer *t, const Batch *bt, int B, int H, int W, int train) {
    Model *m = &t->m;
    Arena *a = t->arena;
    LossOut lo = {0};
    m->train = train;
    model_forward(m, a, t->x, B, H, W);
    if (train) model_head_grad(m, a);
    size_t lb = loss_scratch_bytes(B, loss_num_anchors(H, W), t->lcfg.max_boxes);
    void *scratch = arena_alloc(a, lb, G_LOSS);
    if (bt) {
        LossTargets tg = {bt->n, bt->batch_idx, bt->cls, bt->box};
        lo = loss_forward_backward(&t->lcfg, B, m->nc, H, W, (const float *const *)m->head, train ? m->dhead : NULL, &tg, 1.f,
                                   scratch, lb, 0);
    }
    arena_free(a, scratch);
    if (!train) return lo;   // the caller reads m->head, then model_release
    if (bt && !isfinite(lo.total)) {   // never let a NaN reach the gradients
        for (int i = 0; i < 3; i++) arena_free(a, m->dhead[i]), m->dhead[i] = NULL;
        model_release(m, a);
        return lo;
    }
    model_backward(m, a);
    return lo;
}

// trainer_alloc: the persistent groups, in a fixed order (the same in the plan and the run).
static void trainer_alloc(Trainer *t, Arena *a, size_t xfloats, int train) {
    Model *m = &t->m;
    model_alloc_params(m, a);
    if (!train) {   // val / predict: the weights themselves play the EMA's part
        t->ema.params = m->params;
        t->ema.buffers = m->buffers;
        t->x = afloat(a, xfloats, G_INPUT);
        return;
    }
    t->opt.m = azfloat(a, m->nparams, G_OPTIM);
    t->opt.v = t->opt.kind == OPT_ADAMW ? azfloat(a, m->nparams, G_OPTIM) : NULL;
    t->ema.params = afloat(a, m->nparams, G_EMA);
    t->ema.buffers = afloat(a, m->nbuffers, G_EMA);
    t->x = afloat(a, xfloats, G_INPUT);
}

// trainer_plan: dry-runs the persistent allocations, a training step at (B, S, S) and a
// validation step at every validation batch shape; the arena is the largest high-water mark.
static Plan trainer_plan(Trainer *t, int nshape, const int (*shape)[2], size_t xfloats, int train) {
    Arena *a = xcalloc(1, sizeof(Arena));
    a->cap = SIZE_MAX;
    Arena *keep = t->arena;
    t->arena = a;
    trainer_alloc(t, a, xfloats, train);
    if (train) trainer_step(t, NULL, t->B, t->S, t->S, 1);
    for (int i = 0; i < nshape; i++) {
        trainer_step(t, NULL, t->B, shape[i][0], shape[i][1], 0);
        model_release(&t->m, a);
    }
    Plan p = {.total = a->high};
    memcpy(p.at_peak, a->at_high, sizeof p.at_peak);
    memcpy(p.peak, a->peak, sizeof p.peak);
    t->arena = keep;
    free(a);
    return p;
}

static void mkdir_p(const char *path) {
    char tmp[1024];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++)
        if (*p == '/') { *p = 0; mkdir(tmp, 0755); *p = '/'; }
    if (mkdir(tmp, 0755) && errno != EEXIST) die("cannot create directory '%s': %s", tmp, strerror(errno));
}

// model_load_weights: model= a scale name (random init) or a safetensors file (fine-tuning; a
// head for a different nc is re-initialised with a message).
static void model_load_weights(Model *m, const char *spec, int nc, uint64_t seed, int build_only) {
    const Scale *sc = scale_find(spec);
    char err[1024];
    if (sc) {
        if (!build_only) model_init_params(m, seed);
        return;
    }
    int fnc;
    char fscale;
    if (weights_infer(spec, &fnc, &fscale, err, sizeof err)) die("model=%s: %s", spec, err);
    if (build_only) return;
    model_init_params(m, seed);
    StateDict *sd = xcalloc(1, sizeof(StateDict));
    state_dict_build(sd, m, m->params, m->buffers);
    if (fnc == nc) {
        if (weights_load(spec, sd->ref, sd->n, err, sizeof err)) die("%s", err);
    } else {   // load everything except the class branch outputs, which depend on nc
        Model *src = xmalloc(sizeof(Model));
        model_build(src, fscale, fnc);
        Arena *a = xcalloc(1, sizeof(Arena));
        a->cap = SIZE_MAX;
        Plan p = model_plan(src, 1, 64, 64);
        (void)p;
        src->params = xmalloc(src->nparams * sizeof(float));
        src->buffers = xmalloc(src->nbuffers * sizeof(float));
        StateDict *ssd = xcalloc(1, sizeof(StateDict));
        state_dict_build(ssd, src, src->params, src->buffers);
        if (weights_load(spec, ssd->ref, ssd->n, err, sizeof err)) die("%s", err);
        int copied = 0;
        for (int i = 0; i < sd->n; i++)
            if (sd->ref[i].data && !(strstr(sd->ref[i].name, "model.22.cv3.") && strstr(sd->ref[i].name, ".2."))) {
                memcpy(sd->ref[i].data, ssd->ref[i].data, param_numel(&sd->ref[i]) * sizeof(float));
                copied++;
            }
        fprintf(stderr, "model=%s has nc=%d, the data has nc=%d: the class outputs (model.22.cv3.*.2) are re-initialised, "
                "%d other tensors loaded\n", spec, fnc, nc, copied);
        free(src->params); free(src->buffers); free(src); free(ssd); free(a);
    }
    free(sd);
}

// model_spec_scale: the scale of model= (name or file)
static char model_spec_scale(const char *spec, int *file_nc) {
    const Scale *sc = scale_find(spec);
    *file_nc = -1;
    if (sc) return sc->name;
    char err[1024], s;
    if (weights_infer(spec, file_nc, &s, err, sizeof err)) die("model=%s: %s", spec, err);
    return s;
}

// ckpt_save: the resume checkpoint, model + EMA + optimizer + progress, written atomically (a kill
// at any moment leaves the previous file intact), and the EMA weights as last/best.safetensors.
static void trainer_save(Trainer *t, int best) {
    char path[1024], err[1024], meta[8][64];
    Model *m = &t->m;
    int n = 0;
    StTensor *ts = xcalloc((size_t)t->sd.n * 2 + 8, sizeof(StTensor));
    char (*names)[80] = xcalloc((size_t)t->sd.n * 2 + 8, 80);
    const char *pre[2] = {"model.", "ema."};
    for (int k = 0; k < 2; k++) {
        StateDict *sd = k ? &t->sd_ema : &t->sd;
        for (int i = 0; i < sd->n; i++) {
            if (sd->ref[i].kind == PARAM_COUNT) continue;
            snprintf(names[n], 80, "%s%s", pre[k], sd->ref[i].name + 6);
            ts[n] = (StTensor){.name = names[n], .dtype = ST_F32, .ndim = sd->ref[i].ndim, .data = sd->ref[i].data};
            memcpy(ts[n].shape, sd->ref[i].shape, sizeof sd->ref[i].shape);
            n++;
        }
    }
    ts[n++] = (StTensor){.name = "optim.m", .dtype = ST_F32, .ndim = 1, .shape = {(int64_t)m->nparams}, .data = t->opt.m};
    if (t->opt.v) ts[n++] = (StTensor){.name = "optim.v", .dtype = ST_F32, .ndim = 1, .shape = {(int64_t)m->nparams}, .data = t->opt.v};
    snprintf(meta[0], 64, "%d", t->epoch);
    snprintf(meta[1], 64, "%ld", t->opt.step);
    snprintf(meta[2], 64, "%ld", t->ema.updates);
    snprintf(meta[3], 64, "%ld", t->last_opt_step);
    snprintf(meta[4], 64, "%.17g", t->best_fitness);
    snprintf(meta[5], 64, "%d", t->best_epoch);
    snprintf(meta[6], 64, "%lld", (long long)t->sd.nbt);
    const char *kv[] = {"epoch", meta[0], "opt_step", meta[1], "ema_updates", meta[2], "last_opt_step", meta[3],
                        "best_fitness", meta[4], "best_epoch", meta[5], "num_batches_tracked", meta[6], NULL};
    snprintf(path, sizeof path, "%s/weights/last.ckpt", t->dir);
    if (st_write(path, ts, n, kv, err, sizeof err)) fprintf(stderr, "warning: checkpoint not saved: %s\n", err);
    free(ts);
    free(names);
    t->sd_ema.nbt = t->sd.nbt;
    state_dict_build(&t->sd_ema, m, t->ema.params, t->ema.buffers);
    char scale[2] = {m->scale, 0}, ncs[16];
    snprintf(ncs, sizeof ncs, "%d", m->nc);
    const char *wkv[] = {"format", "yolo.c", "scale", scale, "nc", ncs, "epoch", meta[0], NULL};
    snprintf(path, sizeof path, "%s/weights/last.safetensors", t->dir);
    if (weights_save(path, t->sd_ema.ref, t->sd_ema.n, wkv, ST_F32, err, sizeof err)) fprintf(stderr, "warning: %s\n", err);
    if (best) {
        snprintf(path, sizeof path, "%s/weights/best.safetensors", t->dir);
        if (weights_save(path, t->sd_ema.ref, t->sd_ema.n, wkv, ST_F32, err, sizeof err)) fprintf(stderr, "warning: %s\n", err);
    }
}

// trainer_resume: restores everything trainer_save wrote.
static void trainer_resume(Trainer *t) {
    char path[1024], err[1024];
    snprintf(path, sizeof path, "%s/weights/last.ckpt", t->dir);
    SafeTensors st;
    if (st_open(path, &st, err, sizeof err)) die("resume: %s", err);
    StateDict *sd = xcalloc(1, sizeof(StateDict));
    const char *pre[2] = {"model.", "ema."};
    for (int k = 0; k < 2; k++) {
        state_dict_build(sd, &t->m, k ? t->ema.params : t->m.params, k ? t->ema.buffers : t->m.buffers);
        for (int i = 0; i < sd->n; i++) {
            if (sd->ref[i].kind == PARAM_COUNT) continue;
            char nm[96];
            snprintf(nm, sizeof nm, "%s%s", pre[k], sd->ref[i].name + 6);
            const StEntry *e = st_find(&st, nm);
            if (!e || e->numel != param_numel(&sd->ref[i])) die("resume: %s: tensor '%s' missing or of the wrong size", path, nm);
            if (st_read_f32(&st, e, sd->ref[i].data, err, sizeof err)) die("resume: %s", err);
        }
    }
    const StEntry *e = st_find(&st, "optim.m");
    if (!e || (size_t)e->numel != t->m.nparams || st_read_f32(&st, e, t->opt.m, err, sizeof err)) die("resume: %s: optim.m", path);
    if (t->opt.v) {
        e = st_find(&st, "optim.v");
        if (!e || (size_t)e->numel != t->m.nparams || st_read_f32(&st, e, t->opt.v, err, sizeof err))
            die("resume: %s: optim.v missing (was the run started with another optimizer?)", path);
    }
    const char *k[] = {"epoch", "opt_step", "ema_updates", "last_opt_step", "best_fitness", "best_epoch", "num_batches_tracked"};
    for (int i = 0; i < 7; i++)
        if (!st_meta(&st, k[i])) die("resume: %s: metadata '%s' missing", path, k[i]);
    t->epoch = atoi(st_meta(&st, "epoch"));
    t->opt.step = atol(st_meta(&st, "opt_step"));
    t->ema.updates = atol(st_meta(&st, "ema_updates"));
    t->last_opt_step = atol(st_meta(&st, "last_opt_step"));
    t->best_fitness = atof(st_meta(&st, "best_fitness"));
    t->best_epoch = atoi(st_meta(&st, "best_epoch"));
    t->sd.nbt = atoll(st_meta(&st, "num_batches_tracked"));
    st_close(&st);
    free(sd);
    printf("resuming %s from epoch %d\n", path, t->epoch + 1);
}

// trainer_validate: the EMA in eval mode over the validation set: loss, NMS (conf 0.001, IoU
// 0.7, multi-label, max_det 300), matching and mAP (spec 5). Runs inside the training arena.
static Metrics trainer_validate(Trainer *t, double vloss[3], int draw) {
    Model *m = &t->m;
    float *keep_p = m->params, *keep_b = m->buffers;
    m->params = t->ema.params;
    m->buffers = t->ema.buffers;
    evaluator_reset(&t->ev);
    vloss[0] = vloss[1] = vloss[2] = 0;
    int nbv = 0;
    loader_start_epoch(t->val_ld, 0, 0);
    const Batch *bt;
    float *gt = xmalloc((size_t)(t->B * t->cfg.max_boxes + 1) * 4 * sizeof(float));
    int *gc = xmalloc((size_t)(t->B * t->cfg.max_boxes + 1) * sizeof(int));
    Image pic = {0};
    while ((bt = loader_next(t->val_ld))) {
        input_from_batch(t->x, bt);
        LossOut lo = trainer_step(t, bt, bt->B, bt->H, bt->W, 0);
        vloss[0] += lo.box, vloss[1] += lo.cls, vloss[2] += lo.dfl;
        nbv++;
        if (draw && nbv == 1) {
            int gw = bt->B < 4 ? bt->B : 4;
            image_reserve(&pic, gw * bt->W, bt->H);
            memset(pic.px, 114, (size_t)pic.w * pic.h * 3);
        }
        for (int b = 0; b < bt->B; b++) {
            int n = nms_run_maps(&t->nms, (const float *const *)m->head, b, bt->H, bt->W, t->dets);
            int M = 0;
            for (int i = 0; i < bt->n; i++)
                if (bt->batch_idx[i] == b) {
                    const float *bx = bt->box + 4 * i;
                    gt[4 * M + 0] = (bx[0] - bx[2] / 2) * bt->W;
                    gt[4 * M + 1] = (bx[1] - bx[3] / 2) * bt->H;
                    gt[4 * M + 2] = (bx[0] + bx[2] / 2) * bt->W;
                    gt[4 * M + 3] = (bx[1] + bx[3] / 2) * bt->H;
                    gc[M++] = bt->cls[i];
                }
            evaluator_add_image(&t->ev, t->dets, n, gt, gc, M);
            if (draw && nbv == 1 && b < 4) {   // val_batch0_pred.jpg: the first images with predictions >= 0.25
                for (int y = 0; y < bt->H; y++)
                    for (int x = 0; x < bt->W; x++)
                        for (int c = 0; c < 3; c++)
                            pic.px[((size_t)y * pic.w + b * bt->W + x) * 3 + c] = bt->img[(((size_t)b * 3 + c) * bt->H + y) * bt->W + x];
                for (int i = 0; i < n; i++) {
                    if (t->dets[i].score < 0.25f) continue;
                    Det *d = &t->dets[i];
                    static const uint8_t pal[6][3] = {{255, 56, 56}, {56, 56, 255}, {56, 200, 56}, {255, 157, 0}, {200, 0, 200}, {0, 180, 180}};
                    const uint8_t *cl = pal[d->cls % 6];
                    image_draw_box(&pic, (int)d->x1 + b * bt->W, (int)d->y1, (int)d->x2 + b * bt->W, (int)d->y2, cl[0], cl[1], cl[2], 1);
                    char lab[96];
                    snprintf(lab, sizeof lab, "%s %.2f", t->data.names[d->cls], d->score);
                    image_draw_label(&pic, (int)d->x1 + b * bt->W, (int)d->y1 - 9, lab, cl[0], cl[1], cl[2]);
                }
            }
        }
        model_release(m, t->arena);
    }
    if (draw && pic.px) {
        char path[1024];
        snprintf(path, sizeof path, "%s/val_batch0_pred.jpg", t->dir);
        image_save_jpg(path, &pic, 90);
        image_free(&pic);
    }
    free(gt);
    free(gc);
    for (int k = 0; k < 3; k++) vloss[k] /= nbv > 0 ? nbv : 1;
    m->params = keep_p;
    m->buffers = keep_b;
    Metrics mt;
    evaluator_compute(&t->ev, &mt);
    return mt;
}

// plot_results: results.png, one small panel per curve (losses and metrics over epochs).
static void plot_results(const char *dir, double (*rows)[11], int n) {
    static const char *titles[10] = {"train/box_loss", "train/cls_loss", "train/dfl_loss", "metrics/precision(B)",
                                     "metrics/recall(B)", "val/box_loss", "val/cls_loss", "val/dfl_loss",
                                     "metrics/mAP50(B)", "metrics/mAP50-95(B)"};
    static const int col[10] = {1, 2, 3, 4, 5, 8, 9, 10, 6, 7};
    int pw = 240, ph = 180;
    Image img = image_alloc(5 * pw, 2 * ph);
    memset(img.px, 255, (size_t)img.w * img.h * 3);
    for (int k = 0; k < 10; k++) {
        int ox = (k % 5) * pw, oy = (k / 5) * ph, x0 = ox + 30, x1 = ox + pw - 10, y0 = oy + 20, y1 = oy + ph - 20;
        image_draw_text(&img, ox + 8, oy + 5, titles[k], 0, 0, 0, 1);
        image_draw_box(&img, x0, y0, x1, y1, 160, 160, 160, 1);
        double lo = 1e30, hi = -1e30;
        for (int i = 0; i < n; i++) lo = fmin(lo, rows[i][col[k]]), hi = fmax(hi, rows[i][col[k]]);
        if (!(hi > lo)) hi = lo + 1;
        char lab[32];
        snprintf(lab, sizeof lab, "%.3g", hi);
        image_draw_text(&img, ox + 2, y0 + 2, lab, 90, 90, 90, 1);
        snprintf(lab, sizeof lab, "%.3g", lo);
        image_draw_text(&img, ox + 2, y1 - 8, lab, 90, 90, 90, 1);
        for (int i = 1; i < n; i++) {
            double xa = x0 + (double)(i - 1) / (n - 1) * (x1 - x0), xb = x0 + (double)i / (n - 1) * (x1 - x0);
            double ya = y1 - (rows[i - 1][col[k]] - lo) / (hi - lo) * (y1 - y0), yb = y1 - (rows[i][col[k]] - lo) / (hi - lo) * (y1 - y0);
            int steps = (int)fmax(fabs(xb - xa), fabs(yb - ya)) + 1;
            for (int s = 0; s <= steps; s++) {
                int px = (int)lround(xa + (xb - xa) * s / steps), py = (int)lround(ya + (yb - ya) * s / steps);
                image_fill_rect(&img, px, py, px + 2, py + 2, 31, 119, 180);
            }
        }
    }
    char path[1024];
    snprintf(path, sizeof path, "%s/results.png", dir);
    image_save_png(path, &img);
    image_free(&img);
}

static int tty_out;
static int strcmp_ptr(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

// train_run: the whole training run (trainer.py _do_train).
static int train_run(Config cfg) {
    Trainer *t = xcalloc(1, sizeof(Trainer));
    t->cfg = cfg;
    char err[1024];
    if (!cfg.data[0]) die("train: data= is required (a data.yaml; `yolo shapes out=DIR` makes one)");
    if (data_yaml_load(cfg.data, &t->data, err, sizeof err)) die("%s", err);
    int nc = t->data.nc;
    int file_nc;
    char scale = model_spec_scale(cfg.model, &file_nc);
    model_build(&t->m, scale, nc);
    t->B = cfg.batch;
    t->S = cfg.imgsz;
    // output folder runs/train/NAME (NAME2, NAME3, ... when it exists, unless resume/exist_ok)
    char base[700];
    snprintf(base, sizeof base, "%s/train/%s", cfg.project, cfg.name[0] ? cfg.name : "train");
    snprintf(t->dir, sizeof t->dir, "%s", base);
    struct stat sb;
    for (int i = 2; !cfg.resume && !cfg.exist_ok && stat(t->dir, &sb) == 0; i++) snprintf(t->dir, sizeof t->dir, "%s%d", base, i);
    char wdir[800];
    snprintf(wdir, sizeof wdir, "%s/weights", t->dir);
    mkdir_p(wdir);

    if (dataset_load(&t->data, 0, &t->train_ds)) die("train: no usable training images in %s", cfg.data);
    if (dataset_load(&t->data, 1, &t->val_ds)) die("train: no usable validation images in %s", cfg.data);
    int cache = !strcmp(cfg.cache, "ram");
    LoaderConfig lc = {.batch = t->B, .imgsz = t->S, .workers = cfg.workers, .max_boxes = cfg.max_boxes, .train = 1,
                       .cache_ram = cache, .seed = cfg.seed, .aug = cfg.aug};
    t->train_ld = loader_open(&t->train_ds, &lc);
    LoaderConfig vc = lc;
    vc.train = 0;
    t->val_ld = loader_open(&t->val_ds, &vc);
    t->nb = loader_batches(t->train_ld);

    // optimizer (trainer.build_optimizer), decay scaling and accumulation
    t->accumulate = cfg.accumulate ? cfg.accumulate : (int)fmax(lround((double)cfg.nbs / t->B), 1);
    t->wd = cfg.weight_decay * t->B * t->accumulate / cfg.nbs;
    double lr = cfg.lr0, mom = cfg.momentum, wbias = cfg.warmup_bias_lr;
    int kind = OPT_SGD;
    if (!strcmp(cfg.optimizer, "auto")) {
        long iters = (long)ceil((double)t->train_ds.n / fmax(t->B, cfg.nbs)) * cfg.epochs;
        if (iters > 10000) lr = 0.01, mom = 0.9, kind = OPT_SGD;
        else lr = round(0.002 * 5 / (4 + nc) * 1e6) / 1e6, mom = 0.9, kind = OPT_ADAMW;
        wbias = 0;
        printf("optimizer: 'optimizer=auto' found, choosing %s(lr=%g, momentum=%g) from %ld iterations\n",
               kind == OPT_SGD ? "SGD" : "AdamW", lr, mom, iters);
    } else if (!strcmp(cfg.optimizer, "AdamW")) {
        kind = OPT_ADAMW;
    }
    t->opt = (Optimizer){.kind = kind, .momentum = mom, .beta2 = 0.999, .eps = 1e-8, .weight_decay = t->wd};
    t->initial_lr = lr;
    t->cfg.warmup_bias_lr = wbias;
    t->lcfg = loss_config_default();
    t->lcfg.box = (float)cfg.box, t->lcfg.cls = (float)cfg.cls, t->lcfg.dfl = (float)cfg.dfl, t->lcfg.max_boxes = cfg.max_boxes;

    // the memory plan: training step and every validation shape, one arena
    const Loader *vl = t->val_ld;
    size_t xfloats = (size_t)t->B * 3 * t->S * t->S;
    for (int i = 0; i < vl->nbatch; i++) xfloats = (size_t)fmax(xfloats, (double)t->B * 3 * vl->shape[i][0] * vl->shape[i][1]);
    Plan p = trainer_plan(t, vl->nbatch, (const int (*)[2])vl->shape, xfloats, 1);
    t->arena = xcalloc(1, sizeof(Arena));
    t->arena->cap = p.total;
    t->arena->base = aligned_alloc(ARENA_ALIGN, (p.total + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN);
    if (!t->arena->base) die("cannot allocate the %.1f MiB arena (see `yolo plan`; lower batch or imgsz)", p.total / 1048576.0);
    trainer_alloc(t, t->arena, xfloats, 1);
    printf("memory plan: %.1f MiB in one arena (weights %.1f, gradients %.1f, optimizer %.1f, EMA %.1f, activations %.1f, "
           "backward %.1f, loss %.1f, input %.1f MiB); nothing is allocated after this\n",
           p.total / 1048576.0, p.at_peak[G_PARAMS] / 1048576.0, p.at_peak[G_GRADS] / 1048576.0, p.at_peak[G_OPTIM] / 1048576.0,
           p.at_peak[G_EMA] / 1048576.0, p.at_peak[G_ACTS] / 1048576.0, p.at_peak[G_BACKWARD] / 1048576.0,
           p.peak[G_LOSS] / 1048576.0, p.at_peak[G_INPUT] / 1048576.0);
    model_load_weights(&t->m, cfg.model, nc, cfg.seed, 0);
    memcpy(t->ema.params, t->m.params, t->m.nparams * sizeof(float));
    memcpy(t->ema.buffers, t->m.buffers, t->m.nbuffers * sizeof(float));
    t->best_fitness = -1;
    t->last_opt_step = -1;
    if (cfg.resume) trainer_resume(t);
    state_dict_build(&t->sd, &t->m, t->m.params, t->m.buffers);
    state_dict_build(&t->sd_ema, &t->m, t->ema.params, t->ema.buffers);
    {   // the NMS buffers must hold the largest validation shape
        int Amax = head_anchor_count(t->S, t->S);
        for (int i = 0; i < vl->nbatch; i++) Amax = (int)fmax(Amax, head_anchor_count(vl->shape[i][0], vl->shape[i][1]));
        nms_init(&t->nms, nms_config_val(), nc, Amax);
    }
    t->dets = xmalloc(sizeof(Det) * 300);
    evaluator_init(&t->ev, nc);

    // args.yaml
    {
        char path[1024];
        snprintf(path, sizeof path, "%s/args.yaml", t->dir);
        FILE *f = xfopen(path, "w");
        fprintf(f, "task: detect\nmode: train\nmodel: %s\ndata: %s\nepochs: %d\npatience: %d\nbatch: %d\nimgsz: %d\n"
                   "workers: %d\nproject: %s\nname: %s\noptimizer: %s\nseed: %llu\ncos_lr: %s\nclose_mosaic: %d\nresume: %s\n"
                   "amp: false\nlr0: %g\nlrf: %g\nmomentum: %g\nweight_decay: %g\nwarmup_epochs: %g\nwarmup_momentum: %g\n"
                   "warmup_bias_lr: %g\nbox: %g\ncls: %g\ndfl: %g\nnbs: %d\nhsv_h: %g\nhsv_s: %g\nhsv_v: %g\ndegrees: %g\n"
                   "translate: %g\nscale: %g\nshear: %g\nperspective: %g\nflipud: %g\nfliplr: %g\nmosaic: %g\nmixup: %g\n"
                   "cache: %s\nmax_boxes: %d\naccumulate: %d\n",
                cfg.model, cfg.data, cfg.epochs, cfg.patience, cfg.batch, cfg.imgsz, cfg.workers, cfg.project, t->dir,
                cfg.optimizer, (unsigned long long)cfg.seed, cfg.cos_lr ? "true" : "false", cfg.close_mosaic,
                cfg.resume ? "true" : "false", cfg.lr0, cfg.lrf, cfg.momentum, cfg.weight_decay, cfg.warmup_epochs,
                cfg.warmup_momentum, cfg.warmup_bias_lr, cfg.box, cfg.cls, cfg.dfl, cfg.nbs, cfg.aug.hsv_h, cfg.aug.hsv_s,
                cfg.aug.hsv_v, cfg.aug.degrees, cfg.aug.translate, cfg.aug.scale, cfg.aug.shear, cfg.aug.perspective,
                cfg.aug.flipud, cfg.aug.fliplr, cfg.aug.mosaic, cfg.aug.mixup, cache ? "ram" : "false", cfg.max_boxes,
                t->accumulate);
        fclose(f);
    }
    char csv[1024];
    snprintf(csv, sizeof csv, "%s/results.csv", t->dir);
    if (!cfg.resume) {
        FILE *f = xfopen(csv, "w");
        fprintf(f, "epoch,time,train/box_loss,train/cls_loss,train/dfl_loss,metrics/precision(B),metrics/recall(B),"
                   "metrics/mAP50(B),metrics/mAP50-95(B),val/box_loss,val/cls_loss,val/dfl_loss,lr/pg0,lr/pg1,lr/pg2\n");
        fclose(f);
    }
    printf("training yolov8%c nc=%d on %d images (%d val), batch %d, imgsz %d, accumulate %d, weight_decay %g, %d epochs -> %s\n",
           scale, nc, t->train_ds.n, t->val_ds.n, t->B, t->S, t->accumulate, t->wd, cfg.epochs, t->dir);
    tty_out = isatty(1);
    int nw = cfg.warmup_epochs > 0 ? (int)fmax(lround(cfg.warmup_epochs * t->nb), 100) : -1;
    double t_start = now_sec();
    double (*rows)[11] = xcalloc((size_t)cfg.epochs, sizeof *rows);
    int nrows = 0, stop = 0, consecutive_nan = 0;
    for (int epoch = t->epoch; epoch < cfg.epochs && !stop; epoch++) {
        double lf = lr_lambda(&cfg, epoch), lrs[PG_N];
        for (int g = 0; g < PG_N; g++) lrs[g] = t->initial_lr * lf;
        int closing = epoch >= cfg.epochs - cfg.close_mosaic;
        if (closing && epoch == cfg.epochs - cfg.close_mosaic) printf("closing dataloader mosaic\n");
        loader_start_epoch(t->train_ld, epoch, closing);
        double tl[3] = {0, 0, 0}, t0 = now_sec();
        int nbatch = 0;
        const Batch *bt;
        model_zero_grad(&t->m);
        while ((bt = loader_next(t->train_ld))) {
            long ni = (long)nbatch + (long)t->nb * epoch;
            int accumulate = t->accumulate;
            if (ni <= nw) {   // warmup: lr, momentum and accumulation ramp up (trainer._do_train)
                accumulate = (int)fmax(1, lround(interp((double)ni, 0, nw, 1, (double)cfg.nbs / t->B)));
                for (int g = 0; g < PG_N; g++)
                    t->opt.lr[g] = interp((double)ni, 0, nw, g == PG_BIAS ? t->cfg.warmup_bias_lr : 0.0, t->initial_lr * lf);
                if (t->opt.kind == OPT_SGD) t->opt.momentum = interp((double)ni, 0, nw, cfg.warmup_momentum, cfg.momentum);
            } else {
                for (int g = 0; g < PG_N; g++) t->opt.lr[g] = lrs[g];
            }
            input_from_batch(t->x, bt);
            LossOut lo = trainer_step(t, bt, bt->B, bt->H, bt->W, 1);
            if (!isfinite(lo.total)) {
                t->nan_skips++;
                consecutive_nan++;
                fprintf(stderr, "warning: non-finite loss at epoch %d batch %d: step skipped (%d so far)\n", epoch + 1, nbatch, t->nan_skips);
                model_zero_grad(&t->m);
                if (consecutive_nan >= 10) {
                    fprintf(stderr, "stopping: 10 consecutive non-finite losses; the last checkpoint %s/weights/last.ckpt is intact "
                                    "(hint: lower lr0, check the labels)\n", t->dir);
                    stop = 2;
                    break;
                }
                nbatch++;
                continue;
            }
            consecutive_nan = 0;
            t->sd.nbt++;
            tl[0] += lo.box, tl[1] += lo.cls, tl[2] += lo.dfl;
            if (ni - t->last_opt_step >= accumulate) {
                double norm = grad_clip_norm(&t->m, 10.0);
                if (isfinite(norm)) {
                    optim_step(&t->opt, &t->m);
                    ema_update(&t->ema, &t->m);
                } else {
                    t->nan_skips++;
                    fprintf(stderr, "warning: non-finite gradient norm: step skipped\n");
                }
                model_zero_grad(&t->m);
                t->last_opt_step = ni;
            }
            nbatch++;
            double el = now_sec() - t0;
            if (tty_out || nbatch == t->nb)
                printf("%s%6d/%-4d %6.1f MiB %9.4f %9.4f %9.4f %6d %5d: %3d/%d %5.2f it/s%s", tty_out ? "\r" : "", epoch + 1, cfg.epochs,
                       t->arena->cap / 1048576.0, tl[0] / nbatch, tl[1] / nbatch, tl[2] / nbatch, bt->n, bt->W, nbatch, t->nb,
                       nbatch / el, tty_out && nbatch < t->nb ? "" : "\n");
            fflush(stdout);
        }
        if (stop) break;
        // end of epoch: validate the EMA, log, checkpoint
        double vl3[3];
        Metrics mt = trainer_validate(t, vl3, 1);
        double fit = mt.map;
        int best = fit > t->best_fitness;
        if (best) t->best_fitness = fit, t->best_epoch = epoch;
        printf("%22s %9s %9s %9s %9s\n", "", "P", "R", "mAP50", "mAP50-95");
        printf("%22s %9.3f %9.3f %9.3f %9.3f\n", "all", mt.P, mt.R, mt.map50, mt.map);
        double *row = rows[nrows < cfg.epochs ? nrows : cfg.epochs - 1];
        double row11[11] = {epoch + 1, tl[0] / (nbatch ? nbatch : 1), tl[1] / (nbatch ? nbatch : 1), tl[2] / (nbatch ? nbatch : 1),
                            mt.P, mt.R, mt.map50, mt.map, vl3[0], vl3[1], vl3[2]};
        memcpy(row, row11, sizeof row11);
        metrics_free(&mt);
        nrows++;
        FILE *f = fopen(csv, "a");
        if (f) {
            fprintf(f, "%d,%.3f,%.5g,%.5g,%.5g,%.5g,%.5g,%.5g,%.5g,%.5g,%.5g,%.5g,%.5g,%.5g,%.5g\n", epoch + 1, now_sec() - t_start,
                    row[1], row[2], row[3], row[4], row[5], row[6], row[7], row[8], row[9], row[10], t->opt.lr[0], t->opt.lr[1], t->opt.lr[2]);
            fclose(f);
        }
        t->epoch = epoch + 1;
        trainer_save(t, best);
        if (nrows > 1) plot_results(t->dir, rows, nrows);
        if (epoch - t->best_epoch >= cfg.patience) {
            printf("stopping early: no improvement in %d epochs (best epoch %d)\n", cfg.patience, t->best_epoch + 1);
            break;
        }
    }
    double total = now_sec() - t_start;
    printf("%d epochs completed in %.1f s (%.3f hours); best fitness (mAP50-95) %.4f at epoch %d; %d steps skipped for "
           "non-finite values\nresults saved to %s\n", t->epoch, total, total / 3600, t->best_fitness, t->best_epoch + 1,
           t->nan_skips, t->dir);
    loader_close(t->train_ld);
    loader_close(t->val_ld);
    nms_free(&t->nms);
    evaluator_free(&t->ev);
    int rc = stop == 2 ? 1 : 0;
    free(rows);
    free(t->dets);
    free(t->arena->base);
    free(t->arena);
    free(t);
    return rc;
}

// cmd_val: `yolo val model=FILE data=FILE [imgsz= batch=]`: the metrics of a weights file on the
// validation split, in one planned arena, as the trainer computes them.
static int cmd_val(int argc, char **argv) {
    Config c = config_from_args(argc, argv);
    Trainer *t = xcalloc(1, sizeof(Trainer));
    t->cfg = c;
    char err[1024];
    if (!c.data[0]) die("val: data= is required");
    if (data_yaml_load(c.data, &t->data, err, sizeof err)) die("%s", err);
    int fnc;
    char scale = model_spec_scale(c.model, &fnc);
    if (fnc < 0) die("val: model= must be a weights file (.safetensors), not a scale name");
    if (fnc != t->data.nc) die("val: model=%s has nc=%d but %s has nc=%d", c.model, fnc, c.data, t->data.nc);
    model_build(&t->m, scale, fnc);
    t->B = c.batch;
    t->S = c.imgsz;
    if (dataset_load(&t->data, 1, &t->val_ds)) die("val: no usable validation images in %s", c.data);
    LoaderConfig vc = {.batch = t->B, .imgsz = t->S, .workers = c.workers, .max_boxes = c.max_boxes, .train = 0, .seed = c.seed};
    t->val_ld = loader_open(&t->val_ds, &vc);
    t->lcfg = loss_config_default();
    t->lcfg.max_boxes = c.max_boxes;
    const Loader *vl = t->val_ld;
    size_t xfloats = 0;
    int Amax = 0;
    for (int i = 0; i < vl->nbatch; i++) {
        xfloats = (size_t)fmax(xfloats, (double)t->B * 3 * vl->shape[i][0] * vl->shape[i][1]);
        Amax = (int)fmax(Amax, head_anchor_count(vl->shape[i][0], vl->shape[i][1]));
    }
    Plan p = trainer_plan(t, vl->nbatch, (const int (*)[2])vl->shape, xfloats, 0);
    t->arena = xcalloc(1, sizeof(Arena));
    t->arena->cap = p.total;
    t->arena->base = aligned_alloc(ARENA_ALIGN, (p.total + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN);
    if (!t->arena->base) die("cannot allocate the %.1f MiB arena", p.total / 1048576.0);
    trainer_alloc(t, t->arena, xfloats, 0);
    model_load_weights(&t->m, c.model, fnc, 0, 0);
    NmsConfig nc = nms_config_val();
    if (c.conf >= 0) nc.conf = (float)c.conf;
    nc.iou = (float)c.iou;
    nms_init(&t->nms, nc, fnc, Amax);
    t->dets = xmalloc(sizeof(Det) * 300);
    evaluator_init(&t->ev, fnc);
    printf("val: %s on %d images, batch %d, imgsz %d, memory plan %.1f MiB\n", c.model, t->val_ds.n, t->B, t->S, p.total / 1048576.0);
    double vloss[3], t0 = now_sec();
    snprintf(t->dir, sizeof t->dir, "%s/val/%s", c.project, c.name[0] ? c.name : "val");
    mkdir_p(t->dir);
    Metrics mt = trainer_validate(t, vloss, 1);
    printf("%22s %9s %9s %9s %9s\n", "class", "P", "R", "mAP50", "mAP50-95");
    printf("%22s %9.3f %9.3f %9.3f %9.3f\n", "all", mt.P, mt.R, mt.map50, mt.map);
    for (int k = 0; k < fnc; k++)
        if (mt.ap[k] >= 0) printf("%22s %9.3f %9.3f %9.3f %9.3f\n", t->data.names[k], mt.p[k], mt.r[k], mt.ap50[k], mt.ap[k]);
    printf("val losses box %.4f cls %.4f dfl %.4f; %.2f s; predictions picture %s/val_batch0_pred.jpg\n", vloss[0], vloss[1],
           vloss[2], now_sec() - t0, t->dir);
    metrics_free(&mt);
    loader_close(t->val_ld);
    nms_free(&t->nms);
    evaluator_free(&t->ev);
    free(t->dets);
    free(t->arena->base);
    free(t->arena);
    free(t);
    return 0;
}

static int has_image_ext(const char *p) {
    const char *e = strrchr(p, '.');
    if (!e) return 0;
    static const char *const ext[] = {".jpg", ".jpeg", ".png", ".JPG", ".JPEG", ".PNG", NULL};
    for (int i = 0; ext[i]; i++)
        if (!strcmp(e, ext[i])) return 1;
    return 0;
}

// cmd_predict: `yolo predict model=FILE source=IMAGE|DIR [conf=0.25 iou=0.7 imgsz=640]`: each
// image letterboxed to imgsz, detections drawn with class names and scores into
// runs/predict/NAME/, and YOLO-format results (class cx cy w h conf, normalised) in labels/.
static int cmd_predict(int argc, char **argv) {
    Config c = config_from_args(argc, argv);
    if (!c.source[0]) die("predict: source= is required (an image or a directory of images)");
    int fnc;
    char scale = model_spec_scale(c.model, &fnc), err[1024];
    if (fnc < 0) die("predict: model= must be a weights file (.safetensors)");
    Model *m = xcalloc(1, sizeof(Model));
    model_build(m, scale, fnc);
    const char *names_file = c.data[0] ? c.data : NULL;
    DataConfig dc = {0};
    if (names_file && data_yaml_load(names_file, &dc, err, sizeof err)) die("%s", err);
    // files to process
    int nfiles = 0, cap = 16;
    char **files = xmalloc(cap * sizeof(char *));
    struct stat sb;
    if (stat(c.source, &sb)) die("predict: source=%s: %s", c.source, strerror(errno));
    if (S_ISDIR(sb.st_mode)) {
        DIR *d = opendir(c.source);
        if (!d) die("predict: cannot list %s", c.source);
        struct dirent *e;
        while ((e = readdir(d)))
            if (has_image_ext(e->d_name)) {
                if (nfiles == cap) files = realloc(files, (cap *= 2) * sizeof(char *));
                files[nfiles] = xmalloc(strlen(c.source) + strlen(e->d_name) + 2);
                sprintf(files[nfiles++], "%s/%s", c.source, e->d_name);
            }
        closedir(d);
        qsort(files, nfiles, sizeof(char *), (int (*)(const void *, const void *))strcmp_ptr);
    } else {
        files[nfiles++] = strdup(c.source);
    }
    int S = c.imgsz;
    Arena *a = xcalloc(1, sizeof(Arena));
    a->cap = SIZE_MAX;
    model_alloc_params(m, a);
    float *x = afloat(a, (size_t)3 * S * S, G_INPUT);
    model_forward(m, a, NULL, 1, S, S);
    model_release(m, a);
    size_t total = a->high;
    free(a);
    a = xcalloc(1, sizeof(Arena));
    a->cap = total;
    a->base = aligned_alloc(ARENA_ALIGN, (total + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN);
    model_alloc_params(m, a);
    x = afloat(a, (size_t)3 * S * S, G_INPUT);
    model_load_weights(m, c.model, fnc, 0, 0);
    m->train = 0;
    NmsConfig ncfg = nms_config_predict();
    if (c.conf >= 0) ncfg.conf = (float)c.conf;
    ncfg.iou = (float)c.iou;
    Nms nms;
    nms_init(&nms, ncfg, fnc, head_anchor_count(S, S));
    Det *dets = xmalloc(sizeof(Det) * ncfg.max_det);
    char dir[800], ldir[900];
    snprintf(dir, sizeof dir, "%s/predict/%s", c.project, c.name[0] ? c.name : "predict");
    snprintf(ldir, sizeof ldir, "%s/labels", dir);
    mkdir_p(ldir);
    uint8_t *lb_img = xmalloc((size_t)S * S * 3);
    int ndone = 0, nbad = 0;
    for (int f = 0; f < nfiles; f++) {
        Image img = {0};
        if (image_load(files[f], 0, &img, err, sizeof err)) {
            fprintf(stderr, "skipping %s\n", err);
            nbad++;
            continue;
        }
        Letterbox lb;
        letterbox_params(img.w, img.h, S, S, 1, &lb);
        letterbox_apply(img.px, img.w, img.h, lb_img, S, S, &lb);
        for (int ch = 0; ch < 3; ch++)
            for (size_t i = 0; i < (size_t)S * S; i++) x[(size_t)ch * S * S + i] = lb_img[i * 3 + ch] * (1.f / 255.f);
        double t0 = now_sec();
        model_forward(m, a, x, 1, S, S);
        int n = nms_run_maps(&nms, (const float *const *)m->head, 0, S, S, dets);
        model_release(m, a);
        double ms = (now_sec() - t0) * 1e3;
        const char *base = strrchr(files[f], '/') ? strrchr(files[f], '/') + 1 : files[f];
        char stem[512], path[2048];
        snprintf(stem, sizeof stem, "%s", base);
        if (strrchr(stem, '.')) *strrchr(stem, '.') = 0;
        snprintf(path, sizeof path, "%s/%s.txt", ldir, stem);
        FILE *tf = xfopen(path, "w");
        printf("%s: %dx%d, %d detections, %.1f ms\n", files[f], img.w, img.h, n, ms);
        static const uint8_t pal[6][3] = {{255, 56, 56}, {56, 56, 255}, {56, 200, 56}, {255, 157, 0}, {200, 0, 200}, {0, 180, 180}};
        for (int i = 0; i < n; i++) {
            Det *d = &dets[i];
            float x1 = fmaxf((d->x1 - lb.left) / (float)lb.r, 0), y1 = fmaxf((d->y1 - lb.top) / (float)lb.r, 0);
            float x2 = fminf((d->x2 - lb.left) / (float)lb.r, img.w), y2 = fminf((d->y2 - lb.top) / (float)lb.r, img.h);
            fprintf(tf, "%d %.6f %.6f %.6f %.6f %.5f\n", d->cls, (x1 + x2) / 2 / img.w, (y1 + y2) / 2 / img.h, (x2 - x1) / img.w,
                    (y2 - y1) / img.h, d->score);
            const uint8_t *cl = pal[d->cls % 6];
            image_draw_box(&img, (int)x1, (int)y1, (int)x2, (int)y2, cl[0], cl[1], cl[2], 2);
            char lab[128];
            snprintf(lab, sizeof lab, "%s %.2f", dc.names ? dc.names[d->cls] : "", d->score);
            if (!dc.names) snprintf(lab, sizeof lab, "%d %.2f", d->cls, d->score);
            image_draw_label(&img, (int)x1, (int)y1 - 9 < 0 ? (int)y1 : (int)y1 - 9, lab, cl[0], cl[1], cl[2]);
        }
        fclose(tf);
        snprintf(path, sizeof path, "%s/%s.jpg", dir, stem);
        image_save_jpg(path, &img, 90);
        image_free(&img);
        ndone++;
    }
    printf("predict: %d images -> %s (labels in %s), %d unreadable\n", ndone, dir, ldir, nbad);
    for (int f = 0; f < nfiles; f++) free(files[f]);
    free(files); free(lb_img); free(dets); nms_free(&nms); free(a->base); free(a); free(m);
    return nbad && !ndone ? 1 : 0;
}

static int cmd_train(int argc, char **argv) {
    Config c = config_from_args(argc, argv);
    if (c.resume && !c.name[0]) die("resume=1 needs name= (the run to resume, in %s/train/)", c.project);
    return train_run(c);
}

// ------------------------------------------------------------------------------------------
// main
// ------------------------------------------------------------------------------------------
#ifndef TESTING
typedef struct { const char *name; int (*fn)(int, char **); const char *help; } Command;

int main(int argc, char **argv) {
    static const Command cmds[] = {
        {"info", cmd_info, "layer table and totals: model=yolov8n nc=80 imgsz=640"},
        {"plan", cmd_plan, "memory plan of a training step: model= nc= batch= imgsz="},
        {"check-ref", cmd_check_ref, "compare with a reference fixture: yolo check-ref FILE.safetensors"},
        {"train", cmd_train, "train: data=FILE model=yolov8n|FILE.safetensors epochs= imgsz= batch= ... (Ultralytics keys)"},
        {"val", cmd_val, "validate weights: model=FILE.safetensors data=FILE [imgsz= batch= conf= iou=]"},
        {"predict", cmd_predict, "detect objects: model=FILE.safetensors source=IMAGE|DIR [conf=0.25 imgsz= data=FILE for names]"},
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
