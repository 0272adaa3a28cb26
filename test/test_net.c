// test_net.c: the network. Totals against Ultralytics, the GEMM against plain loops,
// finite-difference gradient checks of every op and of a whole YOLOv8n, and the arena plan.
#define TESTING
#include "../yolo.c"
#include "test.h"
#include "yolo_test.h"
#include <malloc.h>

// --- counting heap allocations ----------------------------------------------------------
// The plain build interposes malloc, calloc, realloc and aligned_alloc. Under AddressSanitizer
// or ThreadSanitizer that would bypass the sanitizer's own allocator (ASan dies at start-up, its
// interceptors never set up), so there the sanitizer runtime's malloc hook counts instead: it is
// called on every allocation the sanitizer's allocator makes and replaces nothing. The hook also
// sees memalign, which libgomp uses for its per-region team records (a region whose `if` is
// false allocates and frees one each time) and which the interposer never sees: the hook skips
// allocations with libgomp on the stack, so both builds count the same thing: every heap
// allocation made by yolo.c and the libraries it calls, outside the OpenMP runtime.
static long n_allocs;
static void count_one(void) { __atomic_add_fetch(&n_allocs, 1, __ATOMIC_RELAXED); }
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#include <execinfo.h>
#include <link.h>
#define ALLOC_COUNTER "sanitizer malloc hook, libgomp's own skipped"
int __sanitizer_install_malloc_and_free_hooks(void (*malloc_hook)(const volatile void *, size_t),
                                              void (*free_hook)(const volatile void *));
static uintptr_t gomp_lo, gomp_hi;   // the address range libgomp is loaded at
static int gomp_range(struct dl_phdr_info *info, size_t size, void *pc) {
    (void)size;
    uintptr_t lo = UINTPTR_MAX, hi = 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD) continue;
        uintptr_t a = info->dlpi_addr + ph->p_vaddr;
        if (a < lo) lo = a;
        if (a + ph->p_memsz > hi) hi = a + ph->p_memsz;
    }
    if ((uintptr_t)pc < lo || (uintptr_t)pc >= hi) return 0;
    gomp_lo = lo;
    gomp_hi = hi;
    return 1;
}
static void count_malloc(const volatile void *p, size_t n) {
    (void)p; (void)n;
    void *pc[12];
    int k = backtrace(pc, 12);   // the hook, the sanitizer's allocator, then the caller
    for (int i = 0; i < k; i++)
        if ((uintptr_t)pc[i] >= gomp_lo && (uintptr_t)pc[i] < gomp_hi) return;
    count_one();
}
static void count_free(const volatile void *p) { (void)p; }
static int alloc_counter_start(void) {
    void *pc[2];
    backtrace(pc, 2);   // its first call loads libgcc_s (and allocates): not from inside the hook
    if (!dl_iterate_phdr(gomp_range, (void *)(uintptr_t)&omp_get_max_threads)) return 0;
    return __sanitizer_install_malloc_and_free_hooks(count_malloc, count_free) != 0;
}
#else
#define ALLOC_COUNTER "interposed malloc"
extern void *__libc_malloc(size_t), *__libc_calloc(size_t, size_t), *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);
void *malloc(size_t n) { count_one(); return __libc_malloc(n); }
void *calloc(size_t n, size_t s) { count_one(); return __libc_calloc(n, s); }
void *realloc(void *p, size_t n) { count_one(); return __libc_realloc(p, n); }
void *aligned_alloc(size_t al, size_t n) { count_one(); return __libc_memalign(al, n); }
static int alloc_counter_start(void) { return 1; }
#endif
static long alloc_count(void) { return __atomic_load_n(&n_allocs, __ATOMIC_RELAXED); }

// --- helpers ------------------------------------------------------------------------------

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

// pool_hold: record/replay of max-pool window choices, so finite differences of a graph with
// max-pools stay on one linear piece (see gradcheck). hold_backend, the CPU backend with this
// max-pool, is the CPU walk's backend in this test (model_cpu_backend, set in main).
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
static void hold_maxpool(Exec *e, const void *x, long xs, void *y, long ys, int C, int H, int W) {
    if (pool_hold.mode) maxpool5_hold(x, y, C, H, W);
    else cpu_backend.maxpool(e, x, xs, y, ys, C, H, W);
}
static Backend hold_backend;

// graph_new: an empty model with an input of C channels, for building small test graphs.
static void graph_new(Model *m, int C) {
    memset(m, 0, sizeof *m);
    m->nc = 1;
    m->input = value_new(m, V_INPUT, C);
}

// graph_open: allocates the arena of graph m for one forward+backward of (B, C, H, W) with
// `out` as the graph output, and randomises parameters and BN state.
static Arena *graph_open(Model *m, int B, int H, int W, Rng *r) {
    Arena *d = xcalloc(1, sizeof(Arena));
    d->cap = SIZE_MAX;
    model_alloc_params(m, d);
    model_forward(m, d, NULL, B, H, W);
    model_backward(m, d);
    Arena *a = xcalloc(1, sizeof(Arena));
    a->cap = d->high + ((size_t)1 << 24);   // graphs also materialise their output in the test
    a->base = aligned_alloc(64, a->cap);
    free(d);
    model_alloc_params(m, a);
    for (int i = 0; i < m->nconv; i++) {
        Conv *c = &m->conv[i];
        float bound = 2.f / sqrtf((float)c->cin * c->k * c->k);   // twice PyTorch's default bound
        for (size_t j = 0; j < (size_t)c->cout * c->cin * c->k * c->k; j++)
            m->params[c->w_off + j] = (float)rng_range(r, -bound, bound);
        for (int o = 0; o < c->cout; o++) m->params[c->b_off + o] = (float)rng_range(r, -0.3, 0.3);
        for (int o = 0; o < c->cout && c->bn; o++) {
            m->params[c->g_off + o] = (float)rng_range(r, 0.5, 1.5);
            m->buffers[c->rs_off + o] = (float)rng_range(r, -0.2, 0.2);
            m->buffers[c->rs_off + c->cout + o] = (float)rng_range(r, 0.5, 2);
        }
    }
    m->B = B; m->H = H; m->W = W;
    return a;
}

// graph_f: f = sum(rw * out) over the batch, out = value `out` (or the three head maps when
// out < 0), in double. With grad = 1 also runs backward (gradients into m->grads, zeroed first).
static double graph_fabs;   // sum |rw * out| of the last graph_f: the scale of FP32 rounding in f
static double graph_f(Model *m, Arena *a, int out, const float *x, const float *rw, int grad) {
    int B = m->B;
    float *saved_buf = xmalloc(m->nbuffers * sizeof(float) + 1);
    memcpy(saved_buf, m->buffers, m->nbuffers * sizeof(float));   // keep running stats fixed
    model_forward(m, a, x, B, m->H, m->W);
    double f = 0;
    graph_fabs = 0;
    if (out >= 0) {
        Value *v = &m->val[out];
        size_t n = (size_t)v->C * v->H * v->W;
        float *o = afloat(a, n, G_SCRATCH);
        Exec e = exec_cpu(m, a);
        for (int b = 0; b < B; b++) {
            value_materialize(&e, out, b, o, (long)n);
            for (size_t i = 0; i < n; i++)
                f += (double)rw[b * n + i] * o[i], graph_fabs += fabs((double)rw[b * n + i] * o[i]);
        }
        arena_free(a, o);
        if (grad) {
            model_zero_grad(m);
            for (int b = 0; b < B; b++) value_backprop(&e, out, b, rw + b * n, (long)n);
            model_backward(m, a);
        } else {
            model_release(m, a);
        }
    } else {
        size_t off = 0;
        for (int l = 0; l < 3; l++) {
            const Conv *c = &m->conv[m->head_conv[l][0]];
            size_t n = (size_t)B * (4 * REG_MAX + m->nc) * c->Ho * c->Wo;
            for (size_t i = 0; i < n; i++)
                f += (double)rw[off + i] * m->head[l][i], graph_fabs += fabs((double)rw[off + i] * m->head[l][i]);
            off += n;
        }
        if (grad) {
            model_zero_grad(m);
            model_head_grad(m, a);
            off = 0;
            for (int l = 0; l < 3; l++) {
                const Conv *c = &m->conv[m->head_conv[l][0]];
                size_t n = (size_t)B * (4 * REG_MAX + m->nc) * c->Ho * c->Wo;
                memcpy(m->dhead[l], rw + off, n * sizeof(float));
                off += n;
            }
            model_backward(m, a);
        } else {
            model_release(m, a);
        }
    }
    memcpy(m->buffers, saved_buf, m->nbuffers * sizeof(float));
    free(saved_buf);
    return f;
}

// gradcheck: for every parameter tensor of every conv (weight, gamma, beta or bias), compares
// the analytic directional derivative g.d with a fourth-order central difference
// (8(f(h)-f(-h)) - (f(2h)-f(-2h)))/12h along a random direction d over the whole tensor,
// h = 2e-2 * max(RMS of the tensor, 0.03): large enough that FP32 rounding in f stays small, while
// the stencil's O(h^4) truncation is negligible. (At 1e-2 the rounding still showed: built with
// contracted multiply-adds, as on aarch64, the SPPF check's numeric derivative of cv1's beta read
// 3.2340 at h and 3.2407 at h/2, but 3.2232 and 3.2234 at 4h and 2h, against the analytic 3.2238.)
// Max-pools are non-smooth, so the perturbed forwards replay the window choices of the unperturbed
// one (pool_hold): the difference is then taken on the same linear piece the analytic gradient
// describes. FP32 forward, f in double.
// Tolerance: |num - ana| <= tol * (|ana| + |g||d|*1e-3 + 1e-5*sum|rw*out|/h): relative to the
// derivative, with a floor at the FP32 rounding noise of f divided by the step.
// gradcheck_every: gradcheck perturbs every k-th parameter tensor (1: all). The whole-YOLOv8n
// check sets it from TEST_NET_SAMPLE; make asan runs a sample there (every 8th tensor), its ~750
// forward passes taking several minutes under AddressSanitizer.
static int gradcheck_every = 1;

static void gradcheck(const char *what, Model *m, Arena *a, int out, const float *x, size_t nout, Rng *r, double tol) {
    float *rw = xmalloc(nout * sizeof(float));
    for (size_t i = 0; i < nout; i++) rw[i] = (float)rng_normal(r);
    pool_hold.mode = 1;   // record which window element each max-pool output took
    pool_hold.pos = 0;
    graph_f(m, a, out, x, rw, 0);
    pool_hold.mode = 0;
    graph_f(m, a, out, x, rw, 1);
    float *g = xmalloc(m->nparams * sizeof(float));
    memcpy(g, m->grads, m->nparams * sizeof(float));
    double worst = 0;
    int ntensor = 0, bad = 0, nall = 0;
    for (int i = 0; i < m->nconv; i++) {
        Conv *c = &m->conv[i];
        size_t offs[3] = {c->w_off, c->b_off, c->g_off};
        size_t lens[3] = {(size_t)c->cout * c->cin * c->k * c->k, (size_t)c->cout, (size_t)c->cout};
        for (int t = 0; t < (c->bn ? 3 : 2); t++) {
            if (nall++ % gradcheck_every) continue;
            float *p = m->params + offs[t];
            size_t n = lens[t];
            float *d = xmalloc(n * sizeof(float)), *p0 = xmalloc(n * sizeof(float));
            memcpy(p0, p, n * sizeof(float));
            double rms = 0, ana = 0, gn = 0, dn = 0;
            for (size_t j = 0; j < n; j++) rms += (double)p[j] * p[j];
            rms = fmax(sqrt(rms / n), 0.03);
            for (size_t j = 0; j < n; j++) {
                d[j] = (float)rng_normal(r);
                ana += (double)g[offs[t] + j] * d[j];
                gn += (double)g[offs[t] + j] * g[offs[t] + j];
                dn += (double)d[j] * d[j];
            }
            double h = 2e-2 * rms, fs[4];
            static const double steps[4] = {1, -1, 2, -2};
            for (int q = 0; q < 4; q++) {
                for (size_t j = 0; j < n; j++) p[j] = p0[j] + (float)(steps[q] * h * d[j]);
                pool_hold.mode = 2;   // replay the max-pool choices of the unperturbed forward
                pool_hold.pos = 0;
                fs[q] = graph_f(m, a, out, x, rw, 0);
                pool_hold.mode = 0;
            }
            memcpy(p, p0, n * sizeof(float));
            double num = (8 * (fs[0] - fs[1]) - (fs[2] - fs[3])) / (12 * h);
            // FP32 rounding through many layers leaves up to ~1e-5 * sum|rw*out| of noise in each f
            double scale = fabs(ana) + sqrt(gn * dn) * 1e-3 + 1e-5 * graph_fabs / h;
            double err = fabs(num - ana) / scale;
            if (err > worst) worst = err;
            if (err > tol) {
                bad++;
                if (bad <= 3) printf("      %s %s[%d]: analytic %.6g numeric %.6g\n", what, c->name, t, ana, num);
            }
            ntensor++;
            free(d);
            free(p0);
        }
    }
    check(bad == 0, "gradcheck %-28s %3d of %3d tensors, worst |num-ana|/scale %.2e, tol %.0e", what, ntensor, nall,
          worst, tol);
    free(g);
    free(rw);
}

// run_graph_check: random input of (B, C, H, W), output value `out`
static void run_graph_check(const char *what, Model *m, int out, int B, int C, int H, int W, int train, double tol) {
    Rng r;
    rng_seed(&r, 1234);
    Arena *a = graph_open(m, B, H, W, &r);
    m->train = train;
    float *x = xmalloc((size_t)B * C * H * W * sizeof(float));
    for (size_t i = 0; i < (size_t)B * C * H * W; i++) x[i] = (float)rng_range(&r, 0, 1);
    model_shape(m, H, W);
    size_t nout = (size_t)B * m->val[out].C * m->val[out].H * m->val[out].W;
    gradcheck(what, m, a, out, x, nout, &r, tol);
    free(x);
    free(a->base);
    free(a);
}

// --- tests --------------------------------------------------------------------------------

static void test_totals(void) {
    // Ultralytics' own figures for nc=80 (from running its code)
    static const struct { char s; size_t params; double gflops;
    } want[] = {{'n', 3157200, 8.9},
                {'s', 11166560, 28.8},
                {'m', 25902640, 79.3},
                {'l', 43691520, 165.7},
                {'x', 68229648, 258.5}};
    Model *m = xmalloc(sizeof(Model));
    for (int i = 0; i < 5; i++) {
        model_build(m, want[i].s, 80);
        check(m->nparams == want[i].params, "yolov8%c params: got %zu want %zu", want[i].s, m->nparams, want[i].params);
        double gf = model_flops(m, 640, 0);
        check(fabs(round(gf * 10) / 10 - want[i].gflops) < 1e-9,
              "yolov8%c GFLOPs@640 (one decimal): got %.3f want %.1f", want[i].s, gf, want[i].gflops);
    }
    model_build(m, 'n', 80);
    check_close("yolov8n GFLOPs@640 unrounded (Ultralytics 8.855)", model_flops(m, 640, 0), 8.855, 5e-4);
    check_close("yolov8n fused GFLOPs@640 (Ultralytics 8.744)", model_flops(m, 640, 1), 8.744, 5e-4);
    free(m);
}

// test_im2col: im2col against its definition (col[(c K + ky) K + kx][oy Wo + ox] = x[c][oy S - p + ky]
// [ox S - p + kx], 0 outside), exactly; col2im as its adjoint: <im2col(x), g> = <x, col2im(g)>
// (double sums of float products; tol 1e-5 relative). Narrow inputs (W < K) included.
static void test_im2col(void) {
    Rng r;
    rng_seed(&r, 9);
    int shapes[][4] = {{3, 1, 1, 3}, {2, 2, 3, 3}, {2, 7, 5, 3}, {3, 6, 9, 5}, {2, 4, 2, 5}, {1, 5, 5, 1}};
    for (size_t t = 0; t < sizeof shapes / sizeof shapes[0]; t++)
        for (int S = 1; S <= 2; S++) {
            int C = shapes[t][0], H = shapes[t][1], W = shapes[t][2], K = shapes[t][3], p = K / 2;
            int Ho = (H + 2 * p - K) / S + 1, Wo = (W + 2 * p - K) / S + 1;
            size_t nx = (size_t)C * H * W, nc = (size_t)C * K * K * Ho * Wo;
            float *x = xmalloc(nx * 4), *col = xmalloc(nc * 4), *g = xmalloc(nc * 4), *dx = xmalloc(nx * 4);
            for (size_t i = 0; i < nx; i++) x[i] = (float)rng_normal(&r);
            for (size_t i = 0; i < nc; i++) g[i] = (float)rng_normal(&r);
            im2col(x, C, H, W, K, S, col);
            int bad = 0;
            for (int c = 0; c < C; c++)
                for (int ky = 0; ky < K; ky++)
                    for (int kx = 0; kx < K; kx++)
                        for (int oy = 0; oy < Ho; oy++)
                            for (int ox = 0; ox < Wo; ox++) {
                                int iy = oy * S - p + ky, ix = ox * S - p + kx;
                                float want =
                                        iy >= 0 && iy < H && ix >= 0 && ix < W ? x[((size_t)c * H + iy) * W + ix] : 0.f;
                                bad += col[(((size_t)c * K + ky) * K + kx) * Ho * Wo + (size_t)oy * Wo + ox] != want;
                            }
            col2im(g, C, H, W, K, S, dx);
            double a = 0, b = 0, mag = 0;
            for (size_t i = 0; i < nc; i++) a += (double)col[i] * g[i], mag += fabs((double)col[i] * g[i]);
            for (size_t i = 0; i < nx; i++) b += (double)x[i] * dx[i];
            double d = fabs(a - b) / fmax(mag, 1e-30);
            check(!bad && d <= 1e-5, "im2col C=%d H=%d W=%d K=%d S=%d: %d entries off their definition (exact); "
                  "col2im adjoint |<im2col x, g> - <x, col2im g>| / sum|.| %.2e (tol 1e-5)", C, H, W, K, S, bad, d);
            free(x); free(col); free(g); free(dx);
        }
}

static void test_gemm(void) {
    Rng r;
    rng_seed(&r, 7);
    int shapes[][3] = {{1, 1, 1}, {7, 33, 5}, {64, 400, 27}, {130, 70, 300}, {16, 1600, 144}, {9, 517, 260},
                       {16, 27, 2500}, {33, 150, 4100}};   // the last two: K cut in slices (GEMM_KSPLIT)
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int t = 0; t < 4; t++)
            for (int beta = 0; beta < 2; beta++) {
                int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2], tA = t & 1, tB = t >> 1;
                int lda = (tA ? M : K) + 3, ldb = (tB ? K : N) + 1, ldc = N + 2;
                float *A = xmalloc((size_t)(tA ? K : M) * lda * 4), *B = xmalloc((size_t)(tB ? N : K) * ldb * 4);
                float *C = xmalloc((size_t)M * ldc * 4), *R = xmalloc((size_t)M * ldc * 4);
                for (size_t i = 0; i < (size_t)(tA ? K : M) * lda; i++) A[i] = (float)rng_normal(&r);
                for (size_t i = 0; i < (size_t)(tB ? N : K) * ldb; i++) B[i] = (float)rng_normal(&r);
                for (size_t i = 0; i < (size_t)M * ldc; i++) C[i] = R[i] = (float)rng_normal(&r);
                gemm_cpu(tA, tB, M, N, K, A, lda, B, ldb, (float)beta, C, ldc);
                gemm_naive(tA, tB, M, N, K, A, lda, B, ldb, (float)beta, R, ldc);
                double worst = 0;
                int ok = 1;
                for (int i = 0; i < M; i++)
                    for (int j = 0; j < N; j++) {
                        double sabs = 0;   // sum |a_i b_i| bounds the rounding error of a dot product
                        for (int k = 0; k < K; k++)
                            sabs += fabs((double)(tA ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k]) *
                                         (tB ? B[(size_t)j * ldb + k] : B[(size_t)k * ldb + j]));
                        double e = fabs(C[(size_t)i * ldc + j] - R[(size_t)i * ldc + j]);
                        double tol = 1e-5 * sabs + 1e-6 + (beta ? 1e-6 * fabs(R[(size_t)i * ldc + j]) : 0);
                        if (e > tol) ok = 0;
                        if (e / tol > worst) worst = e / tol;
                    }
                check(ok, "gemm M=%d N=%d K=%d tA=%d tB=%d beta=%d: worst err/tol %.3f (tol 1e-5*sum|ab|+1e-6)", M, N,
                      K, tA, tB, beta, worst);
                free(A); free(B); free(C); free(R);
            }
}

// Winograd F(2x2, 3x3) (wino_conv, wino_wgrad) against the direct sums in double: a conv's forward,
// its input gradient and its weight gradient (two images, added into a gradient already holding
// values), on odd and even maps down to 1x1 and channel counts that are no multiple of a block;
// tolerance 2e-6 * sum |products| + 2e-7 (about 30 FP32 roundings of the largest terms: the
// transforms add up to 4 values twice and the products of up to 630 terms), and the same bits at
// 1 and 2 threads.
// direct3x3: output (o, y, x) of a 3x3 conv (padding 1) summed directly in double, and the sum of
// its products' magnitudes into *sabs. flip 0, a forward: sum over ci and taps t of w[o][ci][t]
// src[ci][y + t/3 - 1][x + t%3 - 1] (src: Cin planes); flip 1, an input gradient: sum over co of
// w[co][o][t] src[co][y + 1 - t/3][x + 1 - t%3] (src: Cout planes). Outside the planes: zeros.
static double direct3x3(const float *w, int Cout, int Cin, const float *src, int H, int W, int o, int y, int x, int flip,
                        double *sabs) {
    double sum = 0;
    *sabs = 0;
    for (int c = 0; c < (flip ? Cout : Cin); c++)
        for (int t = 0; t < 9; t++) {
            int yy = flip ? y + 1 - t / 3 : y + t / 3 - 1, xx = flip ? x + 1 - t % 3 : x + t % 3 - 1;
            if (yy < 0 || yy >= H || xx < 0 || xx >= W) continue;
            double v = (double)w[((size_t)(flip ? c : o) * Cin + (flip ? o : c)) * 9 + t] * src[((size_t)c * H + yy) * W + xx];
            sum += v, *sabs += fabs(v);
        }
    return sum;
}
static void test_winograd(void) {
    Rng r;
    rng_seed(&r, 11);
    static const int sh[][4] = {{64, 64, 20, 21}, {5, 7, 1, 1}, {3, 4, 2, 3}, {16, 9, 9, 8}, {70, 66, 23, 20}};
    int T0 = omp_threads();
    const char *mx = getenv("TEST_MAX_THREADS");   // make test-arm64: 1 (see test_threads)
    int TN = mx && atoi(mx) < 2 ? 1 : 2;
    for (size_t s = 0; s < sizeof sh / sizeof sh[0]; s++) {
        int Cin = sh[s][0], Cout = sh[s][1], H = sh[s][2], W = sh[s][3], Wp = W + 1, NB = 2;
        size_t plane = (size_t)(H + 2) * Wp, nx = (size_t)Cin * H * W, nz = (size_t)Cout * H * W, nw = (size_t)Cout * Cin * 9;
        float *x = xmalloc(NB * nx * 4), *dz = xmalloc(NB * nz * 4), *w = xmalloc(nw * 4);
        for (size_t i = 0; i < NB * nx; i++) x[i] = (float)rng_normal(&r);
        for (size_t i = 0; i < NB * nz; i++) dz[i] = (float)rng_normal(&r);
        for (size_t i = 0; i < nw; i++) w[i] = (float)rng_normal(&r);
        float *xp = xmalloc(NB * pad_floats(Cin, H, 3, Wp) * 4), *dzp = xmalloc(NB * pad_floats(Cout, H, 3, Wp) * 4);
        for (int b = 0; b < NB; b++) {
            pad_fill(xp + b * pad_floats(Cin, H, 3, Wp), x + b * nx, Cin, H, W, 3, Wp);
            pad_fill(dzp + b * pad_floats(Cout, H, 3, Wp), dz + b * nz, Cout, H, W, 3, Wp);
        }
        int KM = Cin > Cout ? Cin : Cout;
        float *U = xmalloc(16 * wino_ues(KM, KM) * 4), *V = xmalloc(wino_floats(KM, 2) * 4);
        float *VZ = xmalloc(wino_wgrad_floats(Cin, Cout, 2) * 4), *S = xmalloc(NB * 16 * wino_ues(Cin, Cout) * 4);
        float *out[2] = {xmalloc((nx > nz ? nx : nz) * 4), xmalloc((nx > nz ? nx : nz) * 4)};
        float *gw[2] = {xmalloc(nw * 4), xmalloc(nw * 4)};
        double worst[3] = {0};
        // image b's input at (c, y, x), zero outside
#define WX(b, c, y, xx) ((y) < 0 || (y) >= H || (xx) < 0 || (xx) >= W ? 0.0 : (double)x[(b) * nx + ((size_t)(c) * H + (y)) * W + (xx)])
        for (int T = 1; T <= TN; T++) {
            omp_set_num_threads(T);
            // forward: out (Cout, H, W) = x conv w (added to 1: add = 1 checks the += path)
            wino_weights(w, Cout, Cin, 0, U);
            for (size_t i = 0; i < nz; i++) out[T - 1][i] = 1.f;
            wino_conv(Cout, Cin, H, W, U, xp, plane, Wp, V, out[T - 1], 1);
            for (int co = 0; co < Cout && T == 1; co++)
                for (int y = 0; y < H; y++)
                    for (int xx = 0; xx < W; xx++) {
                        double sabs, ref = 1 + direct3x3(w, Cout, Cin, x, H, W, co, y, xx, 0, &sabs);
                        double e = fabs(out[0][((size_t)co * H + y) * W + xx] - ref) / (2e-6 * sabs + 2e-7);
                        if (e > worst[0]) worst[0] = e;
                    }
            // input gradient: out (Cin, H, W) = the full correlation of dz with the flipped weights
            wino_weights(w, Cout, Cin, 1, U);
            wino_conv(Cin, Cout, H, W, U, dzp, plane, Wp, V, out[T - 1], 0);
            for (int ci = 0; ci < Cin && T == 1; ci++)
                for (int y = 0; y < H; y++)
                    for (int xx = 0; xx < W; xx++) {
                        double sabs, ref = direct3x3(w, Cout, Cin, dz, H, W, ci, y, xx, 1, &sabs);
                        double e = fabs(out[0][((size_t)ci * H + y) * W + xx] - ref) / (2e-6 * sabs + 2e-7);
                        if (e > worst[1]) worst[1] = e;
                    }
            // weight gradient of the two images, into gw = w (as a gradient already holding values)
            memset(S, 0, NB * 16 * wino_ues(Cin, Cout) * 4);
            for (int b = 0; b < NB; b++)
                wino_wgrad(Cin, Cout, H, W, xp + b * pad_floats(Cin, H, 3, Wp), plane, dzp + b * pad_floats(Cout, H, 3, Wp),
                           plane, Wp, VZ, S + b * 16 * wino_ues(Cin, Cout));
            memcpy(gw[T - 1], w, nw * 4);
            wino_wgrad_finish(S, NB, Cin, Cout, gw[T - 1]);
            for (int co = 0; co < Cout && T == 1; co++)
                for (int ci = 0; ci < Cin; ci++)
                    for (int t = 0; t < 9; t++) {
                        double ref = w[((size_t)co * Cin + ci) * 9 + t], sabs = fabs(ref);
                        for (int b = 0; b < NB; b++)
                            for (int y = 0; y < H; y++)
                                for (int xx = 0; xx < W; xx++) {
                                    double v = dz[b * nz + ((size_t)co * H + y) * W + xx] * WX(b, ci, y + t / 3 - 1, xx + t % 3 - 1);
                                    ref += v, sabs += fabs(v);
                                }
                        double e = fabs(gw[0][((size_t)co * Cin + ci) * 9 + t] - ref) / (2e-6 * sabs + 2e-7);
                        if (e > worst[2]) worst[2] = e;
                    }
        }
#undef WX
        int same = TN < 2 || (memcmp(out[0], out[1], nx * 4) == 0 && memcmp(gw[0], gw[1], nw * 4) == 0);
        check(worst[0] <= 1 && worst[1] <= 1 && worst[2] <= 1 && same,
              "Winograd %d -> %d at %dx%d: forward, input and weight gradients within tol (worst err/tol %.3f %.3f %.3f); "
              "bit-identical at 1 and 2 threads: %s", Cin, Cout, H, W, worst[0], worst[1], worst[2],
              TN < 2 ? "not run (TEST_MAX_THREADS=1)" : same ? "yes" : "NO");
        free(x); free(dz); free(w); free(xp); free(dzp); free(U); free(V); free(VZ); free(S);
        free(out[0]); free(out[1]); free(gw[0]); free(gw[1]);
    }
    omp_set_num_threads(T0);
}

static void test_pool_up(void) {
    // max-pool with -inf padding: an all-negative map must stay all-negative (zero padding would not)
    float x[2 * 4 * 5], y[2 * 4 * 5];
    for (int i = 0; i < 40; i++) x[i] = -1.f - i;
    maxpool5_forward_cpu(x, y, 1, 2, 4, 5);
    int ok = 1;
    for (int i = 0; i < 40; i++) ok &= y[i] < 0;
    check(ok && y[0] == -1.f && y[20] == -21.f, "maxpool5 pads with -inf: y[0]=%g (want -1), y[20]=%g (want -21)", y[0],
          y[20]);
    float u[2 * 8 * 10];
    upsample2_forward_cpu(x, u, 1, 2, 4, 5);
    check(u[0] == x[0] && u[1] == x[0] && u[10] == x[0] && u[11] == x[0] && u[2] == x[1] && u[80 + 19] == x[20 + 4],
          "upsample2 nearest: 2x2 copies of each pixel");
}

static void test_gradchecks(void) {
    Model *m = xmalloc(sizeof(Model));
    // (k 5: the direct wide-grid GEMMs, which 3x3 convs leave for Winograd)
    static const struct { int k, s; } ks[] = {{1, 1}, {3, 1}, {3, 2}, {1, 2}, {5, 1}};
    char what[64];
    for (int i = 0; i < 5; i++)
        for (int train = 1; train >= 0; train--) {
            graph_new(m, 3);
            int v = conv_add(m, "c0", m->input, 6, 3, 1, 1);   // gives the tested conv a non-image input
            v = conv_add(m, "c1", v, 5, ks[i].k, ks[i].s, 1);
            snprintf(what, sizeof what, "conv k%d s%d BN %s", ks[i].k, ks[i].s, train ? "train" : "eval");
            run_graph_check(what, m, v, 2, 3, 9, 10, train, 2e-3);
        }
    // the CPU convolutions' edges: images narrower than the kernel or a single pixel (the padded
    // wide grid and its zero tail), a row wider than one 32-wide panel, an odd batch over the
    // threads; eval BN (train-mode BN over a handful of values is too curved for the differences)
    static const struct { int H, W; } hw[] = {{1, 1}, {1, 2}, {2, 1}, {3, 37}};
    for (int i = 0; i < 4; i++)
        for (int s = 1; s <= 2; s++) {
            graph_new(m, 3);
            int v = conv_add(m, "c0", m->input, 6, 3, 1, 1);
            v = conv_add(m, "c1", v, 5, 3, s, 1);
            snprintf(what, sizeof what, "conv k3 s%d on %dx%d, B=3 (eval BN)", s, hw[i].H, hw[i].W);
            run_graph_check(what, m, v, 3, 3, hw[i].H, hw[i].W, 0, 2e-3);
        }
    // a conv whose three products all run by Winograd (>= 64 channels, maps >= 20 x 20), odd width
    graph_new(m, 3);
    int v0 = conv_add(m, "c0", m->input, 64, 3, 1, 1);
    v0 = conv_add(m, "c1", v0, 64, 3, 1, 1);
    run_graph_check("conv k3 s1 64->64 on 20x21 (Winograd)", m, v0, 2, 3, 20, 21, 1, 2e-3);
    for (int sc = 0; sc < 2; sc++) {
        graph_new(m, 3);
        int v = conv_add(m, "c0", m->input, 8, 3, 1, 1);
        v = c2f_add(m, "c2f", v, 8, 2, sc);
        snprintf(what, sizeof what, "C2f n=2 shortcut=%d", sc);
        run_graph_check(what, m, v, 2, 3, 8, 8, 1, 2e-3);
    }
    graph_new(m, 3);
    int v = conv_add(m, "c0", m->input, 8, 3, 1, 1);
    v = sppf_add(m, "sppf", v, 6);
    run_graph_check("SPPF k5 (chained max-pools)", m, v, 2, 3, 7, 6, 1, 2e-3);

    graph_new(m, 3);
    int a = conv_add(m, "a", m->input, 4, 3, 1, 1);
    int b = conv_add(m, "b", a, 6, 3, 2, 1);
    int u = value_unary(m, V_UP, b);
    v = conv_add(m, "c", value_cat(m, 2, (int[]){u, a}), 5, 1, 1, 1);
    run_graph_check("upsample + concat", m, v, 2, 3, 8, 6, 1, 2e-3);

    graph_new(m, 3);
    a = conv_add(m, "a", m->input, 4, 3, 1, 1);
    v = conv_add(m, "head", a, 7, 1, 1, 0);
    run_graph_check("Detect 1x1 conv with bias", m, v, 2, 3, 6, 6, 1, 2e-3);
    free(m);
}

static void test_whole_net(void) {
    Model *m = xmalloc(sizeof(Model));
    Rng r;
    rng_seed(&r, 99);
    int B = 2, S = 64;
    Arena *a = model_open(m, 'n', 3, B, S, S, 1);
    for (int i = 0; i < m->nconv; i++) {   // move BN away from identity so every path matters
        Conv *c = &m->conv[i];
        for (int o = 0; o < c->cout && c->bn; o++) {
            m->params[c->g_off + o] = (float)rng_range(&r, 0.5, 1.5);
            m->params[c->b_off + o] = (float)rng_range(&r, -0.3, 0.3);
        }
    }
    float *x = xmalloc((size_t)B * 3 * S * S * 4);
    for (int i = 0; i < B * 3 * S * S; i++) x[i] = (float)rng_range(&r, 0, 1);
    size_t nout = 0;
    for (int l = 0; l < 3; l++) nout += (size_t)B * (64 + 3) * (S >> (3 + l)) * (S >> (3 + l));
    // BN in eval mode here: with only 2x2x2 values per channel at stride 32, train-mode BN makes
    // f so curved that no FP32 step resolves it. Train-mode BN backward is checked op by op
    // above, and the whole train-mode network against PyTorch's gradients in test_ref.
    m->train = 0;
    const char *sample = getenv("TEST_NET_SAMPLE");
    gradcheck_every = sample && atoi(sample) > 1 ? atoi(sample) : 1;
    gradcheck("YOLOv8n 64x64 B=2 nc=3 (eval BN)", m, a, -1, x, nout, &r, 1e-3);
    gradcheck_every = 1;

    // the arena: a real step reaches exactly the planned size, and allocates nothing on the heap
    Plan p = model_plan(m, B, S, S);
    a->high = 0;
    for (int g = 0; g < G_NGROUPS; g++) a->peak[g] = a->live[g];
    model_zero_grad(m);
    model_step_schedule(m, a, x, B, S, S);   // warm-up (OpenMP threads start here)
    long before = alloc_count();
    model_step_schedule(m, a, x, B, S, S);
    long after = alloc_count();
    check(a->high == p.total, "arena high-water %zu bytes == planned %zu", a->high, p.total);
    check(after == before, "heap allocations during a forward+backward (%s): %ld (want 0)", ALLOC_COUNTER,
          after - before);
    check(a->n == 3, "after the step only weights, gradients and BN stats are live: %d blocks", a->n);
    free(x);
    free(a->base);
    free(a);
    free(m);
}

static void test_plans(void) {
    // the plan for other configurations equals the high-water mark of a real step
    static const struct { char s; int B, S; } cfg[] = {{'n', 1, 96}, {'n', 3, 64}, {'s', 2, 64}};
    Model *m = xmalloc(sizeof(Model));
    for (int i = 0; i < 3; i++) {
        Arena *a = model_open(m, cfg[i].s, 5, cfg[i].B, cfg[i].S, cfg[i].S, 3);
        float *x = xcalloc((size_t)cfg[i].B * 3 * cfg[i].S * cfg[i].S, 4);
        m->train = 1;
        model_step_schedule(m, a, x, cfg[i].B, cfg[i].S, cfg[i].S);
        check(a->high == a->cap, "yolov8%c B=%d %dx%d: high-water %zu == plan %zu", cfg[i].s, cfg[i].B, cfg[i].S,
              cfg[i].S, a->high, a->cap);
        free(x);
        free(a->base);
        free(a);
    }
    free(m);
}

// train_step_heads: one train forward and backward of x (B, 3, S, S), with fixed head-map gradients
// (sin(0.37 i + l)); the head maps are copied into h[l] (nh[l] values each, allocated here), the
// gradients are left in m->grads
static void train_step_heads(Model *m, Arena *a, const float *x, int B, int S, float *h[3], size_t nh[3]) {
    m->train = 1;
    model_zero_grad(m);
    model_forward(m, a, x, B, S, S);
    model_head_grad(m, a);
    for (int l = 0; l < 3; l++) {
        const Conv *c = &m->conv[m->head_conv[l][0]];
        nh[l] = (size_t)B * (64 + 3) * c->Ho * c->Wo;
        h[l] = xmalloc(nh[l] * 4);
        memcpy(h[l], m->head[l], nh[l] * 4);
        for (size_t i = 0; i < nh[l]; i++) m->dhead[l][i] = (float)sin(0.37 * i + l);
    }
    model_backward(m, a);
}

// recompute=1 must give bit-identical head maps and gradients, and its plan must be exact and smaller
static void test_recompute(void) {
    Model *m = xmalloc(sizeof(Model));
    int B = 2, S = 96;
    Arena *a = model_open(m, 'n', 3, B, S, S, 5);
    Rng r;
    rng_seed(&r, 5);
    float *x = xmalloc((size_t)B * 3 * S * S * 4);
    for (int i = 0; i < B * 3 * S * S; i++) x[i] = (float)rng_range(&r, 0, 1);
    float *buf0 = xmalloc(m->nbuffers * 4), *g0 = xmalloc(m->nparams * 4);
    memcpy(buf0, m->buffers, m->nbuffers * 4);
    size_t nh[3], tot = 0;
    float *h[2][3];
    double worst = 0;
    for (int rc = 0; rc < 2; rc++) {
        m->recompute = rc;
        memcpy(m->buffers, buf0, m->nbuffers * 4);
        train_step_heads(m, a, x, B, S, h[rc], nh);
        if (rc == 0) memcpy(g0, m->grads, m->nparams * 4);
    }
    int same = memcmp(g0, m->grads, m->nparams * 4) == 0;
    for (int l = 0; l < 3; l++) same &= memcmp(h[0][l], h[1][l], nh[l] * 4) == 0, tot += nh[l];
    for (size_t i = 0; i < m->nparams; i++) worst = fmax(worst, fabs(g0[i] - m->grads[i]));
    check(same, "recompute=1 vs 0: head maps (%zu values) and gradients (%zu) bit-identical (worst |diff| %g)", tot,
          m->nparams, worst);
    free(x); free(buf0); free(g0);
    for (int rc = 0; rc < 2; rc++) for (int l = 0; l < 3; l++) free(h[rc][l]);
    free(a->base); free(a);
    // plans: exact for several configurations, and recompute needs less
    static const struct { char s; int B, S; } cfg[] = {{'n', 2, 64}, {'s', 1, 96}, {'n', 3, 128}};
    for (int i = 0; i < 3; i++) {
        m->recompute = 0;
        Arena *a2 = model_open(m, cfg[i].s, 4, cfg[i].B, cfg[i].S, cfg[i].S, 3);
        size_t p0 = a2->cap;
        free(a2->base); free(a2);
        model_build(m, cfg[i].s, 4);
        m->recompute = 1;
        Plan p = model_plan(m, cfg[i].B, cfg[i].S, cfg[i].S);
        a2 = xcalloc(1, sizeof(Arena));
        a2->cap = p.total;
        a2->base = aligned_alloc(64, p.total);
        model_alloc_params(m, a2);
        model_init_params(m, 3);
        float *x2 = xcalloc((size_t)cfg[i].B * 3 * cfg[i].S * cfg[i].S, 4);
        m->train = 1;
        model_step_schedule(m, a2, x2, cfg[i].B, cfg[i].S, cfg[i].S);
        check(a2->high == p.total && p.total < p0,
              "recompute=1 yolov8%c B=%d %d: high-water %zu == plan %zu < plan without recompute %zu", cfg[i].s,
              cfg[i].B, cfg[i].S, a2->high, p.total, p0);
        free(x2); free(a2->base); free(a2);
    }
    free(m);
}

// The CPU step's bits must not depend on the thread count: the convs run the images in parallel
// (batch >= threads) or each GEMM over the threads (smaller batches), and the weight gradient sums
// in an order fixed by the shape. One train step at 1, 2 and 3 threads (B = 3: images over 2 and 3
// threads, the 2-thread split uneven; B = 1: GEMMs over the threads), compared bit for bit, and
// each thread count's plan is the step's high-water mark.
static void test_threads(void) {
    const char *mx = getenv("TEST_MAX_THREADS");   // make test-arm64: 1 (a second thread stalls under qemu-user)
    if (mx && atoi(mx) < 3) {
        printf("SKIP  one train step at 1, 2 and 3 threads: TEST_MAX_THREADS=%s\n", mx);
        return;
    }
    Model *m = xmalloc(sizeof(Model));
    static const struct { int B, S; } cfg[] = {{3, 96}, {1, 64}};
    int T0 = omp_threads();
    for (int i = 0; i < 2; i++) {
        int B = cfg[i].B, S = cfg[i].S, same = 1, exact = 1;
        Rng r;
        rng_seed(&r, 17);
        float *x = xmalloc((size_t)B * 3 * S * S * 4), *g1 = NULL, *h1[3] = {0};
        for (int j = 0; j < B * 3 * S * S; j++) x[j] = (float)rng_range(&r, 0, 1);
        size_t nh[3];
        for (int T = 1; T <= 3; T++) {
            omp_set_num_threads(T);
            Arena *a = model_open(m, 'n', 3, B, S, S, 7);
            float *h[3];
            train_step_heads(m, a, x, B, S, h, nh);
            for (int l = 0; l < 3; l++)
                if (T == 1) h1[l] = h[l];
                else same &= memcmp(h1[l], h[l], nh[l] * 4) == 0, free(h[l]);
            if (T == 1) g1 = xmalloc(m->nparams * 4), memcpy(g1, m->grads, m->nparams * 4);
            else same &= memcmp(g1, m->grads, m->nparams * 4) == 0;
            exact &= a->high == a->cap;
            free(a->base);
            free(a);
        }
        check(same && exact, "yolov8n B=%d %dx%d: head maps and gradients bit-identical at 1, 2 and 3 threads%s; "
              "plan == high-water at each: %s", B, S, S, same ? "" : " (DIFFER)", exact ? "yes" : "no");
        free(x), free(g1);
        for (int l = 0; l < 3; l++) free(h1[l]);
    }
    omp_set_num_threads(T0);
    free(m);
}

int main(void) {
    hold_backend = cpu_backend;
    hold_backend.maxpool = hold_maxpool;
    model_cpu_backend = &hold_backend;
    int counting = alloc_counter_start();
    check(counting, "heap allocation counter (%s) installed", ALLOC_COUNTER);
    long n0 = alloc_count();
    void *volatile probe = malloc(24);   // volatile: the compiler may not drop the pair
    free(probe);
    check(alloc_count() - n0 == 1, "the counter sees a malloc: %ld counted (want 1)", alloc_count() - n0);
    test_totals();
    test_gemm();
    test_winograd();
    test_im2col();
    test_pool_up();
    test_gradchecks();
    test_whole_net();
    test_plans();
    test_recompute();
    test_threads();
    return test_summary();
}
