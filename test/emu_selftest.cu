// emu_selftest.cu: tests of the CUDA-on-CPU emulation itself (test/cuda_emu.*). Correct kernels
// must give the right answer in every thread order; deliberately broken ones (missing barrier,
// missing __syncwarp, out-of-bounds write, host pointer, deadlock) must be caught. Negative tests
// that expect an abort run in a forked child whose stderr is searched for the diagnosis.
// Built only in the emulation (test/emu.mk); it calls emu_set_* hooks no GPU has.
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <mma.h>
#include <cuda_pipeline_primitives.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdarg.h>
#include <string.h>
#include <math.h>
#include <unistd.h>
#include <sys/wait.h>
#include <vector>
#include <string>
#include "test.h"
using namespace nvcuda;

extern "C" void emu_set_order(int o);
extern "C" void emu_set_strict(int s);
extern "C" void emu_set_async(int a);
extern "C" void emu_set_hosttrap(int h);
static const char *order_name[3] = {"forward", "reverse", "random"};

#define CK(x)                                                                                                          \
    do {                                                                                                               \
        cudaError_t e_ = (x);                                                                                          \
        if (e_ != cudaSuccess) {                                                                                       \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));                         \
            exit(1);                                                                                                   \
        }                                                                                                              \
    } while (0)
static uint64_t rs = 88172645463325252ULL;
static float frand() {
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (float)((rs >> 11) * (1.0 / 9007199254740992.0)) * 2 - 1;
}
template <class T> static T *dev_from(const std::vector<T> &h) {
    T *d;
    CK(cudaMalloc((void **)&d, h.size() * sizeof(T)));
    CK(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
    return d;
}
template <class T> static std::vector<T> host_from(const T *d, size_t n) {
    std::vector<T> h(n);
    CK(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
}

// runs fn in a child with stderr captured; passes when the child dies and stderr contains needle
// Under qemu-user 7.2 (make test-arm64) these forked children hang (a SIGSEGV in a forked child
// spins there), so EMU_SELFTEST_NO_FORK=1 skips them with a SKIP line.
static void expect_abort(const char *what, void (*fn)(), const char *needle) {
    if (getenv("EMU_SELFTEST_NO_FORK")) { printf("SKIP  %s (EMU_SELFTEST_NO_FORK)\n", what); return; }
    fflush(stdout); fflush(stderr);
    int p[2]; if (pipe(p)) abort();
    pid_t pid = fork();
    if (pid == 0) {
        close(p[0]);
        dup2(p[1], 2);
        dup2(p[1], 1);
        fn();
        cudaDeviceSynchronize();
        fprintf(stderr, "child finished normally\n");
        _exit(0);
    }
    close(p[1]);
    std::string out; char buf[4096]; ssize_t r;
    while ((r = read(p[0], buf, sizeof buf)) > 0) out.append(buf, (size_t)r);
    close(p[0]);
    int st; waitpid(pid, &st, 0);
    bool died = !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    size_t at = out.find("EMU ERROR");
    std::string line = at == std::string::npos ? out.substr(0, 160) : out.substr(at, out.find('\n', at) - at);
    check(died && out.find(needle) != std::string::npos, "%s: caught (child %s, message has \"%s\"): %s", what,
          died ? "aborted" : "exited 0", needle, line.c_str());
}

// ---- barriers ----
__global__ void block_sum(const float *x, float *out, int n) {
    __shared__ float s[256];
    int t = threadIdx.x;
    float v = 0;
    for (int i = t; i < n; i += blockDim.x) v += x[i];
    s[t] = v;
    __syncthreads();
    for (int h = blockDim.x / 2; h > 0; h /= 2) {
        if (t < h) s[t] += s[t + h];
        __syncthreads();
    }
    int cnt = __syncthreads_count(x[t] > 0), any = __syncthreads_or(t == 77), all = __syncthreads_and(t < 1000);
    if (t == 0) { out[0] = s[0]; out[1] = (float)cnt; out[2] = (float)any; out[3] = (float)all; }
}
// neighbour exchange through dynamic shared memory; `barrier` selects the correct version
__global__ void rotate(const float *x, float *y, int barrier) {
    extern __shared__ float s[];
    int t = threadIdx.x, n = blockDim.x;
    s[t] = x[blockIdx.x * n + t];
    if (barrier) __syncthreads();
    y[blockIdx.x * n + t] = s[(t + 1) % n];
}
// producer / consumer through two shared stages and named barriers, as conv_halo_kernel hands over its
// K steps: warp 1 writes step s into stage s % 2 (after EMPTY when wait_empty), arrives at FULL; warp 0
// waits at FULL, reads the stage rotated by one lane, arrives at EMPTY. Without the EMPTY wait the
// producer may overwrite a stage the consumer has not read yet.
__global__ void handoff(const float *x, float *y, int nsteps, int wait_empty) {
    __shared__ float st[2][32];
    const int lane = threadIdx.x % 32;
    if (threadIdx.x >= 32) {
        for (int s = 0; s < nsteps; s++) {
            if (s >= 2 && wait_empty) emu::named_barrier(3 + s % 2, 64, 0, __FILE__, __LINE__);
            st[s % 2][lane] = x[s * 32 + lane];
            if (s >= 2 && !wait_empty) emu::named_barrier(3 + s % 2, 64, 0, __FILE__, __LINE__);
            emu::named_barrier(1 + s % 2, 64, 1, __FILE__, __LINE__);
        }
        return;
    }
    for (int s = 0; s < nsteps; s++) {
        emu::named_barrier(1 + s % 2, 64, 0, __FILE__, __LINE__);
        y[s * 32 + lane] = st[s % 2][(lane + 1) % 32];
        if (s + 2 < nsteps) emu::named_barrier(3 + s % 2, 64, 1, __FILE__, __LINE__);
    }
}
// the same hand-over with the stage copied by cp.async (as conv_halo_kernel's A): the copies waited for
// before the FULL arrive (wait_first), or after it (wrong: a consumer may read the stage first)
__global__ void handoff_async(const float *x, float *y, int nsteps, int wait_first) {
    __shared__ __align__(16) float st[2][32];
    const int lane = threadIdx.x % 32;
    if (threadIdx.x >= 32) {
        for (int s = 0; s < nsteps; s++) {
            if (s >= 2) emu::named_barrier(3 + s % 2, 64, 0, __FILE__, __LINE__);
            __pipeline_memcpy_async(&st[s % 2][lane], &x[s * 32 + lane], 4);
            __pipeline_commit();
            if (wait_first) __pipeline_wait_prior(0);
            emu::named_barrier(1 + s % 2, 64, 1, __FILE__, __LINE__);
            if (!wait_first) __pipeline_wait_prior(0);
        }
        return;
    }
    for (int s = 0; s < nsteps; s++) {
        emu::named_barrier(1 + s % 2, 64, 0, __FILE__, __LINE__);
        y[s * 32 + lane] = st[s % 2][(lane + 1) % 32];
        if (s + 2 < nsteps) emu::named_barrier(3 + s % 2, 64, 1, __FILE__, __LINE__);
    }
}
// cp.async groups: two groups of one copy each; after wait_prior(1) the first has landed and the second
// not (the destination still holds its old value); after wait_prior(0) both
__global__ void async_groups(const float *x, float *y) {
    __shared__ __align__(16) float s[2];
    s[0] = -1.0f; s[1] = -1.0f;
    __pipeline_memcpy_async(&s[0], &x[0], 4);
    __pipeline_commit();
    __pipeline_memcpy_async(&s[1], &x[1], 4);
    __pipeline_commit();
    __pipeline_wait_prior(1);
    y[0] = s[0]; y[1] = s[1];
    __pipeline_wait_prior(0);
    y[2] = s[0]; y[3] = s[1];
}
__global__ void nbar_nobody(float *) { if (threadIdx.x < 32) emu::named_barrier(2, 64, 0, __FILE__, __LINE__); }
__global__ void nbar_counts(float *) { emu::named_barrier(2, threadIdx.x < 32 ? 64 : 96, 0, __FILE__, __LINE__); }
static void run_nbar_nobody() { nbar_nobody<<<1, 64>>>(nullptr); }
static void run_nbar_counts() { nbar_counts<<<1, 128>>>(nullptr); }
static void test_named_barriers() {
    const int n = 9;
    std::vector<float> x(32 * n);
    for (auto &v : x) v = frand();
    float *dx = dev_from(x), *dy;
    CK(cudaMalloc((void **)&dy, 4 * 32 * n));
    // wrong_runs: 10 runs of either hand-over (forward, reverse, 8 random orders), how many gave a wrong value
    auto wrong_runs = [&](bool async, int wait) {
        int wrong = 0;
        for (int o = 0; o < 3; o++)
            for (int rep = 0; rep < (o == 2 ? 8 : 1); rep++) {
                emu_set_order(o);
                if (async) handoff_async<<<2, 64>>>(dx, dy, n, wait);
                else handoff<<<2, 64>>>(dx, dy, n, wait);
                auto h = host_from(dy, 32 * n);
                int bad = 0;
                for (int s = 0; s < n; s++)
                    for (int l = 0; l < 32; l++) bad += h[s * 32 + l] != x[s * 32 + (l + 1) % 32];
                wrong += bad > 0;
            }
        return wrong;
    };
    int wrong = wrong_runs(false, 1);
    check(wrong == 0, "two stages handed over by named barriers (FULL, EMPTY): right in all orders (%d wrong)", wrong);
    wrong = wrong_runs(false, 0);
    check(wrong > 0, "the same with the stage written before its EMPTY wait: wrong in %d of 10 runs (must be >= 1)", wrong);
    wrong = wrong_runs(true, 1);
    check(wrong == 0, "stages copied by cp.async, waited for before the FULL arrive: right in all orders (%d wrong)", wrong);
    wrong = wrong_runs(true, 0);
    check(wrong > 0, "the same waited for after the arrive: wrong in %d of 10 runs (must be >= 1)", wrong);
    emu_set_order(0);
    async_groups<<<1, 1>>>(dx, dy);
    auto g = host_from(dy, 4);
    check(g[0] == x[0] && g[1] == -1.0f && g[2] == x[0] && g[3] == x[1],
          "cp.async groups: wait_prior(1) lands the first of two groups only (%g %g), wait_prior(0) both (%g %g)", g[0],
          g[1], g[2], g[3]);
    expect_abort("a named barrier that too few threads reach", run_nbar_nobody, "deadlock");
    expect_abort("one named barrier given two thread counts", run_nbar_counts, "counts");
    cudaFree(dx); cudaFree(dy);
}
static void test_barriers() {
    std::vector<float> x(1000);
    for (auto &v : x) v = frand();
    double ref = 0; int pos = 0;
    for (int i = 0; i < 1000; i++) ref += x[i];
    for (int i = 0; i < 256; i++) pos += x[i] > 0;
    float *dx = dev_from(x), *dout; CK(cudaMalloc((void **)&dout, 16));
    for (int o = 0; o < 3; o++) {
        emu_set_order(o);
        block_sum<<<1, 256>>>(dx, dout, 1000);
        auto h = host_from(dout, 4);
        check(fabs(h[0] - ref) <= 1e-5 * 1000 && h[1] == pos && h[2] == 1 && h[3] == 1,
              "tree reduction with __syncthreads, %s order: sum %.6f want %.6f (tol 1e-2), count %g want %d, or %g, "
              "and %g",
              order_name[o], h[0], ref, h[1], pos, h[2], h[3]);
    }
    int wrong_orders = 0;
    float *dy; CK(cudaMalloc((void **)&dy, 4 * 1000));
    for (int barrier = 1; barrier >= 0; barrier--) {
        wrong_orders = 0;
        for (int o = 0; o < 3; o++) {
            emu_set_order(o);
            rotate<<<4, 250, 250 * sizeof(float)>>>(dx, dy, barrier);
            auto h = host_from(dy, 1000);
            int bad = 0;
            for (int b = 0; b < 4; b++)
                for (int t = 0; t < 250; t++) bad += memcmp(&h[b * 250 + t], &x[b * 250 + (t + 1) % 250], 4) != 0;
            wrong_orders += bad > 0;
        }
        if (barrier)
            check(wrong_orders == 0, "shared-memory rotate with __syncthreads: right in all 3 orders (%d wrong)",
                  wrong_orders);
        else
            check(wrong_orders > 0,
                  "shared-memory rotate WITHOUT __syncthreads: wrong in %d of 3 orders (must be >= 1)", wrong_orders);
    }
    emu_set_order(0);
    cudaFree(dx); cudaFree(dout); cudaFree(dy);
}

// ---- warp collectives ----
__global__ void warp_ops(int *out) {
    int l = threadIdx.x % 32, w = threadIdx.x / 32;
    int *o = out + threadIdx.x * 12;
    o[0] = __shfl_sync(0xffffffffu, l * 10 + w, (l + 5) % 32);
    o[1] = __shfl_up_sync(0xffffffffu, l, 3);
    o[2] = __shfl_down_sync(0xffffffffu, l, 3);
    o[3] = __shfl_xor_sync(0xffffffffu, l, 1);
    o[4] = __shfl_down_sync(0xffffffffu, l, 2, 8);
    o[5] = (int)__ballot_sync(0xffffffffu, l % 3 == 0);
    o[6] = __any_sync(0xffffffffu, l == 31);
    o[7] = __all_sync(0xffffffffu, l < 31);
    o[8] = __reduce_add_sync(0xffffffffu, l);
    o[9] = __reduce_min_sync(0xffffffffu, 100 - l);
    o[10] = __reduce_max_sync(0xffffffffu, l * (w + 1));
    float v = (float)l;
    for (int d = 16; d > 0; d /= 2) v += __shfl_xor_sync(0xffffffffu, v, d);
    o[11] = (int)v;
}
// lanes exchange through shared memory; `sync` selects the correct version
__global__ void warp_exchange(int *out, int sync) {
    __shared__ int s[64];
    int t = threadIdx.x;
    s[t] = t * 7 + 1;
    if (sync) __syncwarp();
    out[t] = s[t ^ 31];
}
static void test_warps() {
    int *d; CK(cudaMalloc((void **)&d, 64 * 12 * sizeof(int)));
    for (int o = 0; o < 3; o++) {
        emu_set_order(o);
        warp_ops<<<1, 64>>>(d);
        auto h = host_from(d, 64 * 12);
        int bad = 0;
        unsigned ballot = 0;
        for (int l = 0; l < 32; l++) if (l % 3 == 0) ballot |= 1u << l;
        for (int t = 0; t < 64; t++) {
            int l = t % 32, w = t / 32, *r = &h[t * 12];
            int want[12] = {((l + 5) % 32) * 10 + w,
                            l >= 3 ? l - 3 : l,
                            l + 3 < 32 ? l + 3 : l,
                            l ^ 1,
                            (l % 8) + 2 < 8 ? l + 2 : l,
                            (int)ballot,
                            1,
                            0,
                            496,
                            69,
                            31 * (w + 1),
                            496};
            for (int k = 0; k < 12; k++) bad += r[k] != want[k];
        }
        check(!bad,
              "shfl/up/down/xor/width 8/ballot/any/all/reduce add,min,max/xor-butterfly, %s order: %d of 768 wrong",
              order_name[o], bad);
    }
    for (int sync = 1; sync >= 0; sync--) {
        int wrong = 0;
        for (int o = 0; o < 3; o++) {
            emu_set_order(o);
            warp_exchange<<<1, 32>>>(d, sync);
            auto h = host_from(d, 32);
            int bad = 0;
            for (int t = 0; t < 32; t++) bad += h[t] != (t ^ 31) * 7 + 1;
            wrong += bad > 0;
        }
        if (sync)
            check(wrong == 0, "warp exchange through shared memory with __syncwarp: right in all 3 orders (%d wrong)",
                  wrong);
        else check(wrong > 0, "warp exchange WITHOUT __syncwarp: wrong in %d of 3 orders (must be >= 1)", wrong);
    }
    emu_set_order(0);
    cudaFree(d);
}

// ---- WMMA ----
// C (M, N) = A (M, K) B (K, N), row-major halves, one warp per 16x16 tile; M, N, K multiples of 16.
// `sync` = 0 reads the stored tile back without __syncwarp (broken on purpose).
__global__ void wmma_gemm(const __half *A, const __half *B, float *C, int M, int N, int K, int sync) {
    __shared__ __align__(32) float t[16 * 16];
    int tm = blockIdx.y * 16, tn = blockIdx.x * 16;
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> a;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> b;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> c;
    wmma::fill_fragment(c, 0.0f);
    for (int k = 0; k < K; k += 16) {
        wmma::load_matrix_sync(a, A + (size_t)tm * K + k, K);
        wmma::load_matrix_sync(b, B + (size_t)tn * K + k, K);   // B given as (N, K): column-major (K, N)
        wmma::mma_sync(c, a, b, c);
    }
    wmma::store_matrix_sync(t, c, 16, wmma::mem_row_major);
    if (sync) __syncwarp();
    for (int e = threadIdx.x; e < 256; e += 32)
        if (tm + e / 16 < M) C[(size_t)(tm + e / 16) * N + tn + e % 16] = t[e];
}
static void test_wmma() {
    int M = 32, N = 48, K = 64;
    std::vector<__half> a(M * K), bt(N * K);
    std::vector<float> af(M * K), bf(N * K);
    for (int i = 0; i < M * K; i++) { a[i] = __float2half(frand()); af[i] = __half2float(a[i]); }
    for (int i = 0; i < N * K; i++) { bt[i] = __float2half(frand()); bf[i] = __half2float(bt[i]); }
    __half *da = dev_from(a), *db = dev_from(bt);
    float *dc; CK(cudaMalloc((void **)&dc, 4 * M * N));
    for (int sync = 1; sync >= 0; sync--) {
        int wrong = 0; double worst = 0;
        for (int o = 0; o < 3; o++) {
            emu_set_order(o);
            wmma_gemm<<<dim3(N / 16, M / 16), 32>>>(da, db, dc, M, N, K, sync);
            auto h = host_from(dc, M * N);
            int bad = 0;
            for (int i = 0; i < M; i++)
                for (int j = 0; j < N; j++) {
                    double s = 0, sa = 0;
                    for (int k = 0; k < K; k++) {
                        s += (double)af[i * K + k] * bf[j * K + k];
                        sa += fabs((double)af[i * K + k] * bf[j * K + k]);
                    }
                    double d = fabs(h[i * N + j] - s);
                    if (!(d <= 1e-5 * sa + 1e-6)) bad++;
                    if (sync && d > worst) worst = d;
                }
            wrong += bad > 0;
        }
        if (sync)
            check(wrong == 0,
                  "WMMA 16x16x16 GEMM (32x48x64, A row-major, B col-major) vs naive: right in all 3 orders, worst "
                  "|diff| %.3g (tol 1e-5*sum|ab|+1e-6)",
                  worst);
        else
            check(wrong > 0,
                  "WMMA store_matrix_sync read back WITHOUT __syncwarp: wrong in %d of 3 orders (must be >= 1)", wrong);
    }
    emu_set_order(0);
    cudaFree(da); cudaFree(db); cudaFree(dc);
}

// ---- ldmatrix and mma.sync m16n8k16 on the PTX register layouts (emu::ldmatrix_x4, emu::mma_16816) ----
// One warp: A (16 x 16, row-major in shared memory at a 48-byte pitch) by ldmatrix.x4, B (16 x 16, stored
// k-major: row k holds n = 0..15, as a halo position holds its channels) by ldmatrix.x4.trans, two
// m16n8k16 products (n 0-7, n 8-15) added to C = 1, D written from the accumulator layout.
__global__ void ldsm_mma(const __half *A, const __half *B, float *D) {
    __shared__ __align__(16) __half As[16][24], Bs[16][24];
    const int l = threadIdx.x;
    for (int i = l; i < 256; i += 32) As[i / 16][i % 16] = A[i], Bs[i / 16][i % 16] = B[i];
    __syncthreads();
    const int mi = l >> 3, j = l & 7, g = l >> 2, t = l & 3;
    uint32_t a[4], b[4];
    emu::ldmatrix_x4(a, &As[j + 8 * (mi & 1)][8 * (mi >> 1)], false, __FILE__, __LINE__);
    emu::ldmatrix_x4(b, &Bs[j + 8 * (mi & 1)][8 * (mi >> 1)], true, __FILE__, __LINE__);
    for (int nt = 0; nt < 2; nt++) {
        float d[4] = {1.0f, 1.0f, 1.0f, 1.0f};
        const uint32_t bb[2] = {b[2 * nt], b[2 * nt + 1]};
        emu::mma_16816(d, a, bb, __FILE__, __LINE__);
        for (int e = 0; e < 4; e++) D[(g + 8 * (e >> 1)) * 16 + 8 * nt + 2 * t + (e & 1)] = d[e];
    }
}
static void test_ldsm_mma() {
    std::vector<__half> a(256), b(256);
    std::vector<float> af(256), bf(256);
    for (int i = 0; i < 256; i++) {
        a[i] = __float2half(frand()); af[i] = __half2float(a[i]);
        b[i] = __float2half(frand()); bf[i] = __half2float(b[i]);
    }
    __half *da = dev_from(a), *db = dev_from(b);
    float *dd; CK(cudaMalloc((void **)&dd, 4 * 256));
    int wrong = 0; double worst = 0;
    for (int o = 0; o < 3; o++) {
        emu_set_order(o);
        ldsm_mma<<<1, 32>>>(da, db, dd);
        auto h = host_from(dd, 256);
        for (int m = 0; m < 16; m++)
            for (int n = 0; n < 16; n++) {
                double s = 1.0, sa = 1.0;
                for (int k = 0; k < 16; k++) s += (double)af[m * 16 + k] * bf[k * 16 + n], sa += fabs((double)af[m * 16 + k] * bf[k * 16 + n]);
                double d = fabs(h[m * 16 + n] - s);
                if (!(d <= 1e-5 * sa)) wrong++;
                worst = d > worst ? d : worst;
            }
    }
    emu_set_order(0);
    check(wrong == 0, "ldmatrix.x4 (A row-major, B k-major .trans) + two mma.sync m16n8k16 vs naive, 3 orders: "
                      "%d wrong, worst |diff| %.3g", wrong, worst);
    cudaFree(da); cudaFree(db); cudaFree(dd);
}

// ---- asynchronous copies (cuda_pipeline_primitives.h): 16 bytes at a time, the tail zero-filled ----
__global__ void pipeline_copy(const __half *src, __half *dst) {
    __shared__ __align__(16) __half s[4][8];
    int t = threadIdx.x;
    for (int i = 0; i < 8; i++) s[t][i] = __float2half(-1.0f);   // overwritten by the copy
    __syncthreads();
    __pipeline_memcpy_async(&s[t][0], src + 8 * t, 16, 2 * t);   // thread t: 8 - t values, t zeros
    __pipeline_commit();
    __pipeline_wait_prior(0);
    __syncthreads();
    for (int i = 0; i < 8; i++) dst[8 * t + i] = s[3 - t][i];     // another thread's copy
}
static void test_pipeline() {
    std::vector<__half> h(32);
    for (int i = 0; i < 32; i++) h[i] = __float2half((float)(i + 1));
    __half *d = dev_from(h), *o; CK(cudaMalloc((void **)&o, 64));
    int bad = 0;
    for (int ord = 0; ord < 3; ord++) {
        emu_set_order(ord);
        pipeline_copy<<<1, 4>>>(d, o);
        auto r = host_from(o, 32);
        for (int t = 0; t < 4; t++)
            for (int i = 0; i < 8; i++)
                bad += __half2float(r[8 * (3 - t) + i]) != (i < 8 - t ? (float)(8 * t + i + 1) : 0.0f);
    }
    emu_set_order(0);
    check(bad == 0,
          "__pipeline_memcpy_async 16 bytes with zfill 0..6 bytes, read by another thread after wait and barrier: %d "
          "wrong values in 3 orders",
          bad);
    cudaFree(d); cudaFree(o);
}
__global__ void pipeline_misaligned(const __half *src) {
    __shared__ __align__(16) __half s[8];
    __pipeline_memcpy_async(s, src + 1, 16);
}
static void pipeline_misaligned_run() {
    __half *d;
    cudaMalloc((void **)&d, 64);
    pipeline_misaligned<<<1, 1>>>(d);
    cudaDeviceSynchronize();
}

// ---- atomics ----
__global__ void atomics(float *f, int *i, unsigned *mx) {
    atomicAdd(f, 0.5f);
    atomicAdd(i, 1);
    atomicMax(mx, blockIdx.x * blockDim.x + threadIdx.x);
}
static void test_atomics() {
    float *f; int *i; unsigned *m;
    CK(cudaMalloc((void **)&f, 4)); CK(cudaMalloc((void **)&i, 4)); CK(cudaMalloc((void **)&m, 4));
    CK(cudaMemset(f, 0, 4)); CK(cudaMemset(i, 0, 4)); CK(cudaMemset(m, 0, 4));
    atomics<<<7, 96>>>(f, i, m);
    float hf; int hi; unsigned hm;
    CK(cudaMemcpy(&hf, f, 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(&hi, i, 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(&hm, m, 4, cudaMemcpyDeviceToHost));
    check(hf == 336.0f && hi == 672 && hm == 671,
          "atomicAdd float/int, atomicMax over 672 threads: %g %d %u (want 336 672 671, exact)", hf, hi, hm);
    cudaFree(f); cudaFree(i); cudaFree(m);
}

// block order follows EMU_ORDER: a float sum by atomics across blocks whose result depends on the
// order (1e8 first absorbs the small terms) comes out differently forward and reverse, as it may on
// hardware; each block records its turn, so the orders themselves are checked too
__global__ void order_sum(float *f, int *turn, int *seen) {
    if (threadIdx.x) return;
    atomicAdd(f, blockIdx.x == 0 ? 1e8f : 3.0f);
    seen[blockIdx.x] = atomicAdd(turn, 1);
}
static void test_block_order() {
    float *f, got[3];
    int *turn, *seen, hs[3][8];
    CK(cudaMalloc((void **)&f, 4)); CK(cudaMalloc((void **)&turn, 4)); CK(cudaMalloc((void **)&seen, 32));
    for (int o = 0; o < 3; o++) {
        emu_set_order(o);
        CK(cudaMemset(f, 0, 4)); CK(cudaMemset(turn, 0, 4));
        order_sum<<<8, 32>>>(f, turn, seen);
        CK(cudaMemcpy(&got[o], f, 4, cudaMemcpyDeviceToHost)); CK(cudaMemcpy(hs[o], seen, 32, cudaMemcpyDeviceToHost));
    }
    emu_set_order(0);
    int fwd = 1, rev = 1, perm = 0;
    for (int b = 0; b < 8; b++) fwd &= hs[0][b] == b, rev &= hs[1][b] == 7 - b, perm |= 1 << hs[2][b];
    check(fwd && rev && perm == 0xff && got[0] != got[1],
          "EMU_ORDER orders blocks too: forward 0..7, reverse 7..0, random a permutation; "
          "an order-dependent float atomic sum differs (forward %.9g, reverse %.9g)",
          got[0], got[1]);
    cudaFree(f); cudaFree(turn); cudaFree(seen);
}

// ---- __half conversions (test/emu_include/cuda_fp16.h) against a decode written with ldexp ----
static double half_value(unsigned h) {   // finite binary16 bits -> value
    int e = (h >> 10) & 31, m = h & 1023;
    double v = e ? ldexp(1024 + m, e - 25) : ldexp(m, -24);
    return (h & 0x8000) ? -v : v;
}
static unsigned half_bits(__half h) { unsigned short b; memcpy(&b, &h, 2); return b; }
static void test_half_conversion() {
    long bad_exact = 0, bad_round = 0;
    for (unsigned h = 0; h < 0x10000; h++) {
        if (((h >> 10) & 31) == 31) continue;
        unsigned short b = (unsigned short)h;
        __half x; memcpy(&x, &b, 2);
        double v = half_value(h);
        if ((double)__half2float(x) != v || half_bits(__float2half((float)v)) != h) bad_exact++;
        if ((h & 0x7fff) == 0x7bff) continue;                   // the largest finite: no upper neighbour
        double w = half_value(h + 1);                            // the next half away from zero
        float mid = (float)((v + w) / 2), below = nextafterf(mid, (float)v), above = nextafterf(mid, (float)w);
        unsigned even = (h & 1) ? h + 1 : h;
        if (half_bits(__float2half(mid)) != even || half_bits(__float2half(below)) != h ||
            half_bits(__float2half(above)) != h + 1) bad_round++;
    }
    unsigned inf = half_bits(__float2half(65520.0f)), big = half_bits(__float2half(nextafterf(65520.0f, 0))),
             nan = half_bits(__float2half(NAN)), tiny = half_bits(__float2half(ldexpf(1, -25))),
             over = half_bits(__float2half(nextafterf(ldexpf(1, -25), 1)));
    check(bad_exact == 0 && bad_round == 0 && inf == 0x7c00 && big == 0x7bff && nan == 0x7fff && tiny == 0 && over == 1,
          "__half: all 63488 finite values convert exactly both ways (%ld wrong); float midpoints round to even and "
          "their float neighbours to the nearer half (%ld wrong); 65520 -> 0x%04x (want inf 0x7c00), "
          "just below -> 0x%04x "
          "(0x7bff), NaN -> 0x%04x (0x7fff), 2^-25 -> 0x%04x (0), just above -> 0x%04x (1)",
          bad_exact, bad_round, inf, big, nan, tiny, over);
}

// ---- device math, __half2 arithmetic and __half atomics on the host path ----
__global__ void math_half(const float *x, float *y, __half *hsum) {
    int t = threadIdx.x;
    float v = x[t], *o = y + t * 6;
    o[0] = __expf(v);
    o[1] = rsqrtf(fabsf(v) + 1.0f);
    o[2] = __saturatef(v);
    o[3] = (float)__popc(__float_as_uint(v));
    __half2 h = __floats2half2_rn(v, 2.0f * v);
    h = __hmul2(h, h);
    o[4] = __low2float(h) + __high2float(h);
    o[5] = __half2float(hexp(__float2half(0.5f * v)));
    atomicAdd(hsum, __float2half(1.0f));
}
static void test_math() {
    std::vector<float> x(64);
    for (auto &v : x) v = 2 * frand();
    float *dx = dev_from(x), *dy; CK(cudaMalloc((void **)&dy, 4 * 64 * 6));
    __half *dh; CK(cudaMalloc((void **)&dh, 2)); CK(cudaMemset(dh, 0, 2));
    math_half<<<1, 64>>>(dx, dy, dh);
    auto y = host_from(dy, 64 * 6);
    auto hs = host_from(dh, 1);
    double worst = 0;
    for (int t = 0; t < 64; t++) {
        float v = x[t], sat = v < 0 ? 0 : v > 1 ? 1 : v;
        float hl = __half2float(__float2half(v)), hh = __half2float(__float2half(2 * v));
        float want[6] = {expf(v),
                         1.0f / sqrtf(fabsf(v) + 1.0f),
                         sat,
                         (float)__builtin_popcount(__float_as_uint(v)),
                         __half2float(__float2half(hl * hl)) + __half2float(__float2half(hh * hh)),
                         __half2float(__float2half(expf(__half2float(__float2half(0.5f * v)))))};
        for (int k = 0; k < 6; k++) worst = fmax(worst, fabs(y[t * 6 + k] - want[k]) / fmax(1.0, fabs(want[k])));
    }
    check(worst <= 1e-6 && __half2float(hs[0]) == 64.0f,
          "device math (__expf, rsqrtf, __saturatef, __popc), __half2 multiply, hexp: worst rel diff %.3g (tol 1e-6); "
          "__half atomicAdd x64 = %g (want 64)",
          worst, __half2float(hs[0]));
    cudaFree(dx); cudaFree(dy); cudaFree(dh);
    // __byte_perm (prmt): the selectors conv_stem_wgrad_kernel uses, a byte reversal and a repeated byte
    const unsigned bx = 0x33221100u, by = 0x77665544u;
    check(__byte_perm(bx, by, 0x7632) == 0x77663322u && __byte_perm(bx, by, 0x5410) == 0x55441100u &&
              __byte_perm(bx, by, 0x0123) == 0x00112233u && __byte_perm(bx, by, 0x4444) == 0x44444444u,
          "__byte_perm: high halves, low halves, byte reversal, a repeated byte of y");
    // __hsub2, __hfma2 (fma.rn.f16x2, rounded once): (1 + 2^-10)^2 + 2^-11 is 2.5 + 2^-10 ulps of 1 over 1,
    // which rounds up once (1 + 3 2^-10) and to even twice (1 + 2^-9); and conv_stem's byte conversion
    // (u8_pair_unit: (1024 + v) - 1024, then v c16 + v 2^-24) for every byte, against fp16(v * (1/255))
    union U { unsigned u; __half2 h; };
    const __half a1 = __float2half(1.0f + 1.0f / 1024), c11 = __float2half(1.0f / 2048);
    const __half2 r1 = __hfma2(__halves2half2(a1, a1), __halves2half2(a1, a1), __halves2half2(c11, c11));
    int nbad = 0;
    for (unsigned v = 0; v < 256; v++) {
        U big, sub, k, c;
        big.u = 0x64006400u | v << 16 | v, sub.u = v << 16 | v, k.u = 0x64006400u, c.u = 0x1C041C04u;
        const __half2 r = __hfma2(__hsub2(big.h, k.h), c.h, sub.h);
        const __half want = __float2half((float)v * (1.f / 255.f));
        nbad += r.x.bits != want.bits || r.y.bits != want.bits;
    }
    check(__half2float(r1.x) == 1.0f + 3.0f / 1024 && __half2float(r1.y) == 1.0f + 3.0f / 1024 && nbad == 0,
          "__hfma2 rounds once: %.9g (want %.9g); the stem's byte conversion by __hsub2 and __hfma2: %d of 256 "
          "bytes differ from fp16(v / 255)", __half2float(r1.x), 1.0 + 3.0 / 1024, nbad);
}

// ---- launch limits, as the driver rejects them ----
__global__ void noop(float *p) { if (p && threadIdx.x == 0 && blockIdx.x == 0) p[0] = 1; }
static void test_limits() {
    struct { dim3 g, b; size_t smem; cudaError_t want; const char *what; } cases[] = {
        {dim3(1), dim3(1025), 0, cudaErrorInvalidConfiguration, "block of 1025 threads"},
        {dim3(1), dim3(32, 33), 0, cudaErrorInvalidConfiguration, "block 32x33 = 1056 threads"},
        {dim3(1), dim3(1, 1, 65), 0, cudaErrorInvalidConfiguration, "block.z = 65"},
        {dim3(1, 65536), dim3(32), 0, cudaErrorInvalidConfiguration, "grid.y = 65536"},
        {dim3(0), dim3(32), 0, cudaErrorInvalidConfiguration, "grid.x = 0"},
        {dim3(1), dim3(32), 48 * 1024 + 1, cudaErrorInvalidValue, "48 KB + 1 of dynamic shared memory without opt-in"},
        {dim3(1), dim3(1024), 48 * 1024, cudaSuccess, "1024 threads and 48 KB shared memory (allowed)"},
    };
    float *p; CK(cudaMalloc((void **)&p, 4));
    for (auto &c : cases) {
        cudaGetLastError();
        noop<<<c.g, c.b, c.smem>>>(p);
        cudaError_t e = cudaGetLastError();
        check(e == c.want, "launch with %s: %s (want %s)", c.what, cudaGetErrorName(e), cudaGetErrorName(c.want));
    }
    CK(cudaFuncSetAttribute(noop, cudaFuncAttributeMaxDynamicSharedMemorySize, 96 * 1024));
    noop<<<1, 32, 96 * 1024>>>(p);
    cudaError_t e = cudaGetLastError();
    check(e == cudaSuccess, "96 KB dynamic shared memory after cudaFuncSetAttribute opt-in: %s", cudaGetErrorName(e));
    cudaFree(p);
}

// ---- async streams: a result read without synchronising is stale ----
__global__ void fill(float *p, float v, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) p[i] = v; }
static void test_async() {
    emu_set_async(1);
    float *d; CK(cudaMalloc((void **)&d, 4 * 100));
    cudaStream_t s; CK(cudaStreamCreate(&s));
    float *h; CK(cudaMallocHost((void **)&h, 4 * 100));
    for (int i = 0; i < 100; i++) h[i] = -1;
    fill<<<1, 128, 0, s>>>(d, 3.0f, 100);
    CK(cudaMemcpyAsync(h, d, 400, cudaMemcpyDeviceToHost, s));
    float before = h[50];
    CK(cudaStreamSynchronize(s));
    check(before == -1 && h[50] == 3,
          "async mode: host copy read before cudaStreamSynchronize is stale (%g, want -1), after it %g (want 3)",
          before, h[50]);
    emu_set_async(0);
    cudaFreeHost(h); cudaStreamDestroy(s); cudaFree(d);
}

__global__ void write_at(float *p, long i) { if (threadIdx.x == 0) p[i] = 1; }
static void oob_page() {
    float *d;
    cudaMalloc((void **)&d, 4 * 64);
    write_at<<<1, 32>>>(d, 64 + 8);
    cudaDeviceSynchronize();
}
static void oob_slack() {
    float *d;
    cudaMalloc((void **)&d, 4 * 3);
    write_at<<<1, 32>>>(d, 3);
    cudaDeviceSynchronize();
}
static void oob_under() {
    float *d;
    cudaMalloc((void **)&d, 4 * 8);
    write_at<<<1, 32>>>(d, -1);
    cudaDeviceSynchronize();
}
static void host_ptr_arg() { static float h[64]; write_at<<<1, 32>>>(h, 0); }
static void host_deref() {
    emu_set_hosttrap(1);
    float *d;
    cudaMalloc((void **)&d, 64);
    volatile float x = d[0];
    (void)x;
}
static void memcpy_overrun() {
    float *d, h[32];
    cudaMalloc((void **)&d, 4 * 16);
    cudaMemcpy(d, h, sizeof h, cudaMemcpyHostToDevice);
}
static void memcpy_kind() { float *d, h[4]; cudaMalloc((void **)&d, 16); cudaMemcpy(d, h, 16, cudaMemcpyDeviceToHost); }
static void double_free() { float *d; cudaMalloc((void **)&d, 16); cudaFree(d); cudaFree(d); }
static void use_after_free() { float *d; cudaMalloc((void **)&d, 16); cudaFree(d); write_at<<<1, 32>>>(d, 0); }
__global__ void deadlock_kernel(int *p) {
    if (threadIdx.x % 32 < 16) __syncwarp();
    else __syncthreads();
    p[threadIdx.x] = 1;
}
static void deadlock() {
    int *d;
    cudaMalloc((void **)&d, 4 * 64);
    deadlock_kernel<<<1, 64>>>(d);
    cudaDeviceSynchronize();
}
__global__ void early_return(float *p) {
    if (threadIdx.x == 5) return;
    __syncthreads();
    p[threadIdx.x] = 1;
}
static void early_return_strict() {
    emu_set_strict(1);
    float *d;
    cudaMalloc((void **)&d, 4 * 64);
    early_return<<<1, 64>>>(d);
    cudaDeviceSynchronize();
}
__global__ void shfl_exited(int *p) {
    if (threadIdx.x == 3) return;
    p[threadIdx.x] = __shfl_sync(0xffffffffu, (int)threadIdx.x, 0);
}
static void shfl_after_exit() {
    int *d;
    cudaMalloc((void **)&d, 4 * 32);
    shfl_exited<<<1, 32>>>(d);
    cudaDeviceSynchronize();
}
__global__ void smem_over(float *p) {
    extern __shared__ float s[];
    s[threadIdx.x * 64] = 1;
    __syncthreads();
    p[0] = s[0];
}
static void smem_overrun() {
    float *d;
    cudaMalloc((void **)&d, 4);
    smem_over<<<1, 128, 4096>>>(d);
    cudaDeviceSynchronize();
}
// a fragment element changed in one lane only: its elements belong to unspecified lanes on hardware, so
// a kernel must change them alike in every lane; the emulation's shared mma_sync reports it
__global__ void wmma_lane_divergent(const __half *A, float *C) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> a;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> b;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> c;
    wmma::fill_fragment(c, 0.0f);
    wmma::load_matrix_sync(a, A, 16);
    wmma::load_matrix_sync(b, A, 16);
    if (threadIdx.x == 7) a.x[0] = __float2half(2.0f);
    wmma::mma_sync(c, a, b, c);
    wmma::store_matrix_sync(C, c, 16, wmma::mem_row_major);
}
static void wmma_divergent() {
    __half *a; float *c;
    cudaMalloc((void **)&a, 2 * 256);
    cudaMemset(a, 0, 2 * 256);
    cudaMalloc((void **)&c, 4 * 256);
    wmma_lane_divergent<<<1, 32>>>(a, c);
    cudaDeviceSynchronize();
}

int main() {
    test_barriers();
    test_named_barriers();
    test_warps();
    test_wmma();
    test_ldsm_mma();
    test_pipeline();
    test_atomics();
    test_block_order();
    test_half_conversion();
    test_math();
    test_limits();
    test_async();
    expect_abort("out-of-bounds write past a page-sized allocation", oob_page, "out-of-bounds");
    expect_abort("out-of-bounds write into the alignment slack", oob_slack, "past the end");
    expect_abort("write before the start of an allocation", oob_under, "before the start");
    expect_abort("host pointer passed to a kernel", host_ptr_arg, "not device memory");
    expect_abort("WMMA fragment changed in one lane only", wmma_divergent, "hold different fragments");
    expect_abort("host dereference of device memory (host trap)", host_deref, "host code dereferenced");
    expect_abort("cudaMemcpy overrunning the allocation", memcpy_overrun, "overrun");
    expect_abort("cudaMemcpy with the wrong kind", memcpy_kind, "kind");
    expect_abort("double cudaFree", double_free, "double free");
    expect_abort("kernel on freed memory", use_after_free, "freed");
    expect_abort("deadlock: half a warp at __syncwarp, half at __syncthreads", deadlock, "deadlock");
    expect_abort("strict mode: a thread returns before __syncthreads", early_return_strict, "returned while");
    expect_abort("__shfl_sync waiting for a lane that returned", shfl_after_exit, "returned");
    expect_abort("__pipeline_memcpy_async from a misaligned address", pipeline_misaligned_run,
                 "__pipeline_memcpy_async");
    expect_abort("dynamic shared memory overrun", smem_overrun, "dynamic shared memory");
    return test_summary();
}
