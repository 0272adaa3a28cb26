// yolo_kernels.cu: all device code of yolo.c, in the same section order, with extern "C"
// launchers declared in yolo.h. Each launcher has a CPU twin in the CPU step, named with the test that
// compares the two by YOLO_TWINS in yolo.h; the tests run on a GPU and in the CPU emulation (test/emu.mk).
// Kernels follow the rules that keep the emulation faithful (listed in test/cuda_emu.h): no inline PTX,
// every exchange between threads through *_sync intrinsics or barriers, barriers in block-uniform code.
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <mma.h>
#include <cuda_pipeline_primitives.h>
#include <type_traits>
#include <stdio.h>
#include <stdlib.h>
#include <limits.h>
#include "yolo.h"

// CUDA_CHECK: a failed runtime call or launch names the file:line, the error and a hint, then exits.
#define CUDA_CHECK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    fprintf(stderr, "CUDA error (%s:%d): %s: %s (hint: run the emulated tests, make test-emu)\n", \
            __FILE__, __LINE__, #x, cudaGetErrorString(e_)); exit(1); } } while (0)

static inline unsigned cdiv(long a, long b) { return (unsigned)((a + b - 1) / b); }

// Activation element type of the training step: __half (AMP) or float (amp=0). The activation-typed
// kernels are templates on it: they load through act_f and store through act_from<T>, with FP32 math
// in between, so the FP16 and FP32 launchers run one body (the FP16 code is what it was before).
__device__ __forceinline__ float act_f(float v) { return v; }
__device__ __forceinline__ float act_f(__half v) { return __half2float(v); }
template <class T> __device__ __forceinline__ T act_from(float v);
template <> __device__ __forceinline__ float act_from<float>(float v) { return v; }
template <> __device__ __forceinline__ __half act_from<__half>(float v) { return __float2half(v); }
// bn_silu_value: SiLU(BN(v)) in FP32: the one formula of bn_silu_forward_*_cuda and the fused conv gathers
// bn_silu_folded: the same with BN folded to sc = gamma*invstd, sh = beta - mean*sc (the same bits)
__device__ __forceinline__ float bn_silu_folded(float v, float sc, float sh) {
    v = v * sc + sh;
    return __fdividef(v, 1.0f + __expf(-v));
}
__device__ __forceinline__ float bn_silu_value(float v, float mean, float invstd, float gamma, float beta) {
    float sc = gamma * invstd;
    return bn_silu_folded(v, sc, beta - mean * sc);
}
// h2f2: the two halves of a __half2 as floats (__half22float2); under nvcc one register split and two
// conversions (cuda_fp16's splits the register once per half)
#ifdef CUDA_EMU_MMA
__device__ __forceinline__ float2 h2f2(__half2 h) { return __half22float2(h); }
#else
__device__ __forceinline__ float2 h2f2(__half2 h) {
    union { __half2 h; uint32_t u; } c;
    c.h = h;
    float2 f;
    asm("{.reg .f16 lo, hi;\n mov.b32 {lo, hi}, %2;\n cvt.f32.f16 %0, lo;\n cvt.f32.f16 %1, hi;}\n"
        : "=f"(f.x), "=f"(f.y) : "r"(c.u));
    return f;
}
#endif
// bn_silu8: bn_silu_folded on the 8 FP16 values of a 16-byte word, each rounded to FP16 (the same bits as
// one by one: the pairs converted with h2f2 / __floats2half2_rn, one conversion instruction per pair to FP16
// on sm_80 and later)
// bn_silu_words: the same on the FP16 pairs of a word vector V (uint4: 8 values, uint2: 4)
template <class V> __device__ __forceinline__ V bn_silu_words(V u, float sc, float sh) {
    constexpr int NW = sizeof(V) / 4;
    union { V u; __half2 h[NW]; } v;
    v.u = u;
#pragma unroll
    for (int e = 0; e < NW; e++) {
        const float2 f = h2f2(v.h[e]);
        v.h[e] = __floats2half2_rn(bn_silu_folded(f.x, sc, sh), bn_silu_folded(f.y, sc, sh));
    }
    return v.u;
}
__device__ __forceinline__ uint4 bn_silu8(uint4 u, float sc, float sh) { return bn_silu_words(u, sc, sh); }
// bn_fold: channel c's BN as bn_silu_folded's (sc, sh), from the four per-channel arrays or a ConvAct
__device__ __forceinline__ float2 bn_fold(const float *mean, const float *invstd, const float *gamma,
                                          const float *beta, int c) {
    float sc = gamma[c] * invstd[c];
    return make_float2(sc, beta[c] - mean[c] * sc);
}
__device__ __forceinline__ float2 bn_fold(const ConvAct &a, int c) { return bn_fold(a.mean, a.invstd, a.gamma, a.beta, c); }

// ------------------------------------------------------------------------------------------
// CPU ops, device side: elementwise and data movement
// ------------------------------------------------------------------------------------------

// bn_silu_forward: y = silu(gamma*(z-mean)*invstd + beta) per channel. One thread per element.
// z, y: (B, C, HW). Matches Conv's BatchNorm2d (eval form) + SiLU in ultralytics/nn/modules/conv.py.
__global__ void bn_silu_forward_kernel(const float *z, const float *mean, const float *invstd, const float *gamma,
                                       const float *beta, float *y, int C, int HW, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int c = (int)((i / HW) % C);
    float v = gamma[c] * (z[i] - mean[c]) * invstd[c] + beta[c];
    y[i] = v / (1.0f + expf(-v));
}
extern "C" void bn_silu_forward_cuda(const float *z, const float *mean, const float *invstd, const float *gamma,
                                     const float *beta, float *y, int B, int C, int HW, void *stream) {
    long n = (long)B * C * HW;
    if (n == 0) return;
    bn_silu_forward_kernel<<<cdiv(n, 256), 256, 0, (cudaStream_t)stream>>>(z, mean, invstd, gamma, beta, y, C, HW, n);
    CUDA_CHECK(cudaGetLastError());
}

// upsample2_forward: nearest x2, one thread per output element. x: (B, C, H, W), y: (B, C, 2H, 2W)
__global__ void upsample2_forward_kernel(const float *x, float *y, int H, int W, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int W2 = 2 * W, H2 = 2 * H;
    int ox = (int)(i % W2), oy = (int)((i / W2) % H2);
    long bc = i / ((long)W2 * H2);
    y[i] = x[(bc * H + oy / 2) * W + ox / 2];
}
extern "C" void upsample2_forward_cuda(const float *x, float *y, int B, int C, int H, int W, void *stream) {
    long n = (long)B * C * 4 * H * W;
    if (n == 0) return;
    upsample2_forward_kernel<<<cdiv(n, 256), 256, 0, (cudaStream_t)stream>>>(x, y, H, W, n);
    CUDA_CHECK(cudaGetLastError());
}

// maxpool5_forward: 5x5 window, stride 1, pad 2 (-inf), as SPPF's MaxPool2d(5, 1, 2).
// A 16x16 block computes a 16x16 output tile from a 20x20 input tile staged in shared memory.
// grid (ceil(W/16), ceil(H/16), B*C); x, y: (B, C, H, W)
#define MP_T 16
#define MP_S (MP_T + 4)
#define MP_PLANE (68 * 68)   // the plane kernels: a (H + 4) x (W + 4) padded plane in shared memory
// the plane kernels' dynamic shared memory: the padded plane and the row pass (floats), and for the
// backward the row pass's argmax columns and the outputs' argmax codes (bytes)
static inline size_t mp_fwd_smem(int H, int W) { return sizeof(float) * (size_t)(H + 4) * (W + 4 + W); }
static inline size_t mp_bwd_smem(int H, int W) {
    return sizeof(float) * (size_t)(H + 4) * (W + 4 + W) + (size_t)(H + 4) * W + (size_t)H * W;
}
// maxpool5_plane_stage: the plane p (H, W) into t at (2, 2), a border of -inf around it (a window's
// padding is never its maximum); ends with a barrier
template <class T>
__device__ __forceinline__ void maxpool5_plane_stage(const T *p, float *t, int H, int W) {
    const int PW = W + 4, PH = H + 4;
    for (int i = threadIdx.x; i < PH * PW; i += blockDim.x) {
        int py = i / PW, px = i - py * PW, iy = py - 2, ix = px - 2;
        t[i] = iy >= 0 && iy < H && ix >= 0 && ix < W ? act_f(p[iy * W + ix]) : -INFINITY;
    }
    __syncthreads();
}
__global__ void maxpool5_forward_kernel(const float *x, float *y, int H, int W) {
    __shared__ float tile[MP_S][MP_S + 1];
    const float *xp = x + (long)blockIdx.z * H * W;
    int x0 = blockIdx.x * MP_T - 2, y0 = blockIdx.y * MP_T - 2;
    for (int t = threadIdx.y * MP_T + threadIdx.x; t < MP_S * MP_S; t += MP_T * MP_T) {
        int ty = t / MP_S, tx = t % MP_S, gy = y0 + ty, gx = x0 + tx;
        tile[ty][tx] = (gy >= 0 && gy < H && gx >= 0 && gx < W) ? xp[(long)gy * W + gx] : -INFINITY;
    }
    __syncthreads();
    int ox = blockIdx.x * MP_T + threadIdx.x, oy = blockIdx.y * MP_T + threadIdx.y;
    if (ox < W && oy < H) {
        float m = -INFINITY;
        for (int dy = 0; dy < 5; dy++)
            for (int dx = 0; dx < 5; dx++) m = fmaxf(m, tile[threadIdx.y + dy][threadIdx.x + dx]);
        y[(long)blockIdx.z * H * W + (long)oy * W + ox] = m;
    }
}
extern "C" void maxpool5_forward_cuda(const float *x, float *y, int B, int C, int H, int W, void *stream) {
    if ((long)B * C * H * W == 0) return;
    dim3 grid(cdiv(W, MP_T), cdiv(H, MP_T), (unsigned)(B * C)), block(MP_T, MP_T);
    maxpool5_forward_kernel<<<grid, block, 0, (cudaStream_t)stream>>>(x, y, H, W);
    CUDA_CHECK(cudaGetLastError());
}

// ------------------------------------------------------------------------------------------
// GEMM on tensor cores
// ------------------------------------------------------------------------------------------

// gemm_f16: C = A B with A (M, K), B (K, N) in FP16, C (M, N) in FP32, row-major, any sizes.
// A block of 4 warps computes a 32x32 tile of C; each warp one 16x16 WMMA tile. The 32x16 and
// 16x32 input tiles are staged in shared memory with zero fill past the edges, so WMMA loads
// never leave the matrices; the accumulator goes through shared memory for the edge-checked store.
#define GT 32
__global__ void gemm_f16_kernel(int M, int N, int K, const __half *A, const __half *B, float *C) {
    using namespace nvcuda;
    __shared__ __align__(32) __half As[GT][16 + 8];     // (32 rows of C, 16 of K), ldm 24
    __shared__ __align__(32) __half Bs[16][GT + 8];     // (16 of K, 32 cols of C), ldm 40
    __shared__ __align__(32) float Cs[4][16][16];       // per-warp accumulator staging
    int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    int wy = warp / 2, wx = warp % 2;
    int row0 = blockIdx.y * GT, col0 = blockIdx.x * GT;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::fill_fragment(acc, 0.0f);
    for (int k0 = 0; k0 < K; k0 += 16) {
        for (int t = tid; t < GT * 16; t += 128) {
            int r = t / 16, c = t % 16, gr = row0 + r, gc = k0 + c;
            As[r][c] = (gr < M && gc < K) ? A[(long)gr * K + gc] : __float2half(0.0f);
            int br = t / GT, bc = t % GT, gbr = k0 + br, gbc = col0 + bc;
            Bs[br][bc] = (gbr < K && gbc < N) ? B[(long)gbr * N + gbc] : __float2half(0.0f);
        }
        __syncthreads();
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> b;
        wmma::load_matrix_sync(a, &As[wy * 16][0], 16 + 8);
        wmma::load_matrix_sync(b, &Bs[0][wx * 16], GT + 8);
        wmma::mma_sync(acc, a, b, acc);
        __syncthreads();
    }
    wmma::store_matrix_sync(&Cs[warp][0][0], acc, 16, wmma::mem_row_major);
    __syncwarp();
    for (int e = lane; e < 256; e += 32) {
        int r = row0 + wy * 16 + e / 16, c = col0 + wx * 16 + e % 16;
        if (r < M && c < N) C[(long)r * N + c] = Cs[warp][e / 16][e % 16];
    }
}
extern "C" void gemm_f16_cuda(int M, int N, int K, const uint16_t *A, const uint16_t *B, float *C, void *stream) {
    if (M == 0 || N == 0) return;
    if (K == 0) { CUDA_CHECK(cudaMemsetAsync(C, 0, sizeof(float) * M * N, (cudaStream_t)stream)); return; }
    dim3 grid(cdiv(N, GT), cdiv(M, GT)), block(128);
    gemm_f16_kernel<<<grid, block, 0, (cudaStream_t)stream>>>(M, N, K, (const __half *)A, (const __half *)B, C);
    CUDA_CHECK(cudaGetLastError());
}

// ------------------------------------------------------------------------------------------
// convolution as implicit GEMM on tensor cores
// ------------------------------------------------------------------------------------------
/*
 * The three products of a conv, none of which materialises im2col (p = K/2, KK = K*K):
 *   forward  z[co, n]  = sum_k w[co, k] col[k, n]        M = Cout, N = B*Ho*Wo, Kd = Cin*KK
 *   dgrad    dx[ci, n] = sum_k w[co, ci, kk] dzg[k, n]   M = Cin,  N = B*H*W,   Kd = Cout*KK
 *            (k = (co, kk); dzg gathers dz at the output pixel that read input pixel n through
 *            tap kk, zero where there is none: the transpose conv without col2im)
 *   wgrad    dw[co, k]  = sum_n dz[co, n] col[k, n]     M = Cout, N = Cin*KK,  Kd = B*Ho*Wo
 * Each has its own kernel below, all three built the same way: a block computes one 64x64 tile of
 * the product, 4 warps, each a 32x32 quarter as 2x2 WMMA 16x16x16 FP16 fragments with FP32
 * accumulators, Kd stepped 32 at a time in ascending order; the operands are staged in shared
 * memory, zero-filled past every edge, so the fragments never read outside the tensors. What makes
 * them fast is kept out of the K loop: no division there (pixels decoded once per block or once
 * per K step, taps through a small shared table), 16-byte cp.async wherever an operand's rows are
 * contiguous, two shared stages so that one barrier ends each K step, and an epilogue that stores 8
 * consecutive outputs per lane. These gather kernels take the 1x1 convs and the 3x3 ones the halo
 * kernels (conv_halo_kernel, conv_halo_wgrad_kernel: stride-1 products, the stride-2 input and
 * weight gradients) cannot: the 3-channel stem, the stride-2 forward, maps whose rows are not a
 * multiple of 4.
 */
#define IG_BM 64
#define IG_BN 64
// ig_row4: the shared row a thread stores when 4 threads share a row of 32 halves (IG_BK + 8 = 80-byte
// pitch), 16 bytes each: threads 8j .. 8j + 7 (a store phase) take rows r and r + 4 (q = tid / 4 in
// order 0, 4, 1, 5, 2, 6, 3, 7 of each 8), 320 = 64 mod 128 bytes apart: the two rows' 64 bytes fill
// the 32 banks once (rows r and r + 1, 80 bytes apart, share a bank group: 2-way conflicts)
__device__ __forceinline__ int ig_row4(int tid) {
    const int q = tid / 4;
    return (q & ~7) | ((q & 1) << 2) | ((q >> 1) & 3);
}
#define IG_BK 32
struct ConvGeo {
    int B, Cin, H, W, Cout, K, S, Ho, Wo, KK, pad, wst;   // wst: w's elements per output channel
    long xs, zs;
    FastDiv fK, fKK, fS, fW, fHW, fWo, fHWo;   // the divisors of the index math (yolo.h)
};
static ConvGeo conv_geo(const ConvDims &d) {
    ConvGeo g;
    g.B = d.B; g.Cin = d.Cin; g.H = d.H; g.W = d.W; g.Cout = d.Cout; g.K = d.K; g.S = d.S; g.pad = d.K / 2;
    g.Ho = conv_out(d.H, d.K, d.S); g.Wo = conv_out(d.W, d.K, d.S); g.KK = d.K * d.K;
    g.xs = d.xs ? d.xs : (long)d.Cin * d.H * d.W;
    g.zs = d.zs ? d.zs : (long)d.Cout * g.Ho * g.Wo;
    g.wst = d.wstride ? (int)d.wstride : d.Cin * g.KK;
    g.fK = fast_div(g.K); g.fKK = fast_div(g.KK); g.fS = fast_div(g.S);
    g.fW = fast_div(g.W); g.fHW = fast_div(g.H * g.W); g.fWo = fast_div(g.Wo); g.fHWo = fast_div(g.Ho * g.Wo);
    return g;
}

// im2col element: col[k = (ci, ky, kx)][n = (b, oy, ox)] of x (0 in the padding). T: __half or float.
// ACT (a ConvAct conv): x holds the producer's pre-BN z and the element is SiLU(BN(z)) rounded to T,
// as bn_silu_forward_act writes it; the padding stays 0 (it pads the activated input).
template <bool ACT = false, class T>
__device__ __forceinline__ T conv_col(const ConvGeo &g, const T *x, int k, int n, const ConvAct &a = ConvAct()) {
    int ci = div_fast(k, g.fKK), kk = k - ci * g.KK, ky = div_fast(kk, g.fK), kx = kk - ky * g.K;
    int b = div_fast(n, g.fHWo), p = n - b * (g.Ho * g.Wo), oy = div_fast(p, g.fWo), ox = p - oy * g.Wo;
    int iy = oy * g.S - g.pad + ky, ix = ox * g.S - g.pad + kx;
    if (iy < 0 || iy >= g.H || ix < 0 || ix >= g.W) return act_from<T>(0.0f);
    T v = x[b * g.xs + ((long)ci * g.H + iy) * g.W + ix];
    if (!ACT) return v;
    return act_from<T>(bn_silu_value(act_f(v), a.mean[ci], a.invstd[ci], a.gamma[ci], a.beta[ci]));
}
// dgrad's gathered operand: dzg[k = (co, kk)][n = (b, iy, ix)] = dz at the output pixel that read input
// pixel n through tap kk, 0 where no output did (stride gaps, borders). n comes split, as the caller
// keeps it across k: zb = b zs (dz's image), ty0 = iy + pad, tx0 = ix + pad.
template <class T>
__device__ __forceinline__ T conv_dz_gather(const ConvGeo &g, const T *dz, int k, long zb, int ty0, int tx0) {
    int co = div_fast(k, g.fKK), kk = k - co * g.KK, ky = div_fast(kk, g.fK), kx = kk - ky * g.K;
    int ty = ty0 - ky, tx = tx0 - kx;
    if (ty < 0 || tx < 0) return act_from<T>(0.0f);
    int oy = div_fast(ty, g.fS), ox = div_fast(tx, g.fS);
    if (oy * g.S != ty || ox * g.S != tx || oy >= g.Ho || ox >= g.Wo) return act_from<T>(0.0f);
    return dz[zb + ((long)co * g.Ho + oy) * g.Wo + ox];
}

// out: FP32 and/or FP16 destination of a conv product element, optionally added to what is there
__device__ __forceinline__ void conv_store(float *of, __half *oh, long i, float v, int accumulate) {
    if (of) of[i] = accumulate ? of[i] + v : v;
    if (oh) oh[i] = __float2half(accumulate ? __half2float(oh[i]) + v : v);
}

// The warp's share of all three conv kernels: a 32x32 quarter of the block's 64x64 tile as 2x2 WMMA
// fragments. conv_warp_step: one 32-deep K step from shared memory, pa(i, kk) / pb(j, kk) the
// addresses of fragment row i / column j at depth kk (LA, LB their layouts, lda, ldb their ldm).
// conv_warp_store: each accumulator through the warp's 16x16 staging tile cs (80-byte rows), then
// st(m, n, v) with v the 8 consecutive values (m, n .. n+7) this lane owns (row lane % 16, columns
// 8 (lane / 16) ..), read as two 16-byte words: the 8 rows of a store phase and the 8 lanes of a read
// phase fall into different bank groups (at 64-byte rows the tile's store had 4-way conflicts).
// (conv_wgrad_kernel keeps 64-byte rows, LD 16: its epilogue runs once after a long K loop, and with 80
// ptxas spilled around the BN+SiLU variant's division calls.)
#define CS_LD 20
typedef nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float> ConvAcc;
__device__ __forceinline__ void conv_warp_zero(ConvAcc (&acc)[2][2]) {
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 2; j++) nvcuda::wmma::fill_fragment(acc[i][j], 0.0f);
}
template <class LA, class LB, class PA, class PB>
__device__ __forceinline__ void conv_warp_step(ConvAcc (&acc)[2][2], PA pa, unsigned lda, PB pb, unsigned ldb) {
    using namespace nvcuda;
#pragma unroll
    for (int kk = 0; kk < IG_BK; kk += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, LA> fa[2];
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, LB> fb[2];
#pragma unroll
        for (int i = 0; i < 2; i++) wmma::load_matrix_sync(fa[i], pa(i, kk), lda);
#pragma unroll
        for (int j = 0; j < 2; j++) wmma::load_matrix_sync(fb[j], pb(j, kk), ldb);
#pragma unroll
        for (int i = 0; i < 2; i++)
#pragma unroll
            for (int j = 0; j < 2; j++) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
    }
}
struct ConvRowNop { __device__ void operator()(int) const {} };
template <int LD, class ST, class RD = ConvRowNop>
__device__ __forceinline__ void conv_warp_store(ConvAcc (&acc)[2][2], float (*cs)[LD], int m0, int n0, ST st,
                                                RD row_done = RD()) {
    int lane = threadIdx.x % 32, er = lane % 16, ec = (lane / 16) * 8;
#pragma unroll
    for (int i = 0; i < 2; i++) {
#pragma unroll
        for (int j = 0; j < 2; j++) {
            nvcuda::wmma::store_matrix_sync(&cs[0][0], acc[i][j], LD, nvcuda::wmma::mem_row_major);
            __syncwarp();
            const float4 q0 = *(const float4 *)&cs[er][ec], q1 = *(const float4 *)&cs[er][ec + 4];
            const float v[8] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w};
            st(m0 + i * 16 + er, n0 + j * 16 + ec, v);
            __syncwarp();
        }
        row_done(i);   // (row_done: after row i's 32 columns, for conv_fwd_kernel's statistics)
    }
}
// kstep_mark: an inline asm holding only the comment "// K step", which the PTX keeps where the step is:
// make kernel-report counts a loop trip's K steps by these marks (nothing under the emulation)
#ifdef CUDA_EMU_MMA
__device__ __forceinline__ void kstep_mark() {}
#else
__device__ __forceinline__ void kstep_mark() { asm volatile("// K step"); }
#endif
// conv_k_loop: the two-stage K loop of the three conv kernels (and the stem's two). taps(s) writes step
// s's shared tables (one step ahead, into slot s & 1), fetch(s) issues step s's global loads (cp.async
// into stage s & 1, or into registers), store(s) moves those registers into stage s & 1, mma(s)
// multiplies stage s & 1. Step s+1 is fetched before step s is multiplied and stored after it, so one
// barrier ends each step: stage (s+1) & 1 and table slot s & 1 were last read before the previous
// barrier. fetch and store take the steps in order, each once; U: the steps a loop trip (below), each
// with its kstep_mark.
template <int U = 1, class TA, class FE, class SO, class MM>
__device__ __forceinline__ void conv_k_loop(int nsteps, TA taps, FE fetch, SO store, MM mma) {
    taps(0);
    if (nsteps > 1) taps(1);
    __syncthreads();
    if (nsteps > 0) { fetch(0); store(0); }
    __pipeline_commit();
    __pipeline_wait_prior(0);
    __syncthreads();
    auto step = [&](int s) {
        kstep_mark();
        bool next = s + 1 < nsteps;
        if (next) fetch(s + 1);
        __pipeline_commit();
        if (s + 2 < nsteps) taps(s + 2);
        mma(s);
        if (next) store(s + 1);
        __pipeline_wait_prior(0);
        __syncthreads();
    };
    // U 2: two steps a trip, the first even: the stage of either (s & 1) is then known where it is compiled,
    // its shared addresses constants (at one step a trip they are selected each step: the 1x1 forward's
    // loop took 5.8 PTX instructions per mma, 4.6 at two), for more registers
    static_assert(U == 1 || U == 2, "one or two K steps a trip");
#pragma unroll 1
    for (int s = 0; s < nsteps; s += U) {
        step(s);
        if (U == 2 && s + 1 < nsteps) step(s + 1);
    }
}

// conv_store_run: 8 final values v to of + o (FP32) and/or oh + o (FP16) in pieces of PB bytes (16 or
// 8; both addresses PB-aligned), added to what is there when accumulate: the same values as one by one
template <int PB> __device__ __forceinline__ void conv_store_run(float *of, __half *oh, long o, const float *v,
                                                                int accumulate) {
    typedef typename std::conditional<PB == 16, uint4, uint2>::type P;
    constexpr int NF = PB / 4, NH = PB / 2;   // FP32 and FP16 values a piece
    if (of)
#pragma unroll
        for (int e = 0; e < 8; e += NF) {
            union { P p; float f[NF]; } r, u;
            if (accumulate) u.p = *(const P *)(of + o + e);
#pragma unroll
            for (int k = 0; k < NF; k++) r.f[k] = accumulate ? u.f[k] + v[e + k] : v[e + k];
            *(P *)(of + o + e) = r.p;
        }
    if (oh)
#pragma unroll
        for (int e = 0; e < 8; e += NH) {
            union { P p; __half2 h[NH / 2]; } q, in;
            if (accumulate) in.p = *(const P *)(oh + o + e);
#pragma unroll
            for (int k = 0; k < NH / 2; k++)
                q.h[k] = accumulate ? __floats2half2_rn(__low2float(in.h[k]) + v[e + 2 * k],
                                                        __high2float(in.h[k]) + v[e + 2 * k + 1])
                                    : __floats2half2_rn(v[e + 2 * k], v[e + 2 * k + 1]);
            *(P *)(oh + o + e) = q.p;
        }
}
// conv_store8: outputs (m, n .. n+7) of a product whose columns n are pixels of NCHW images (HWn pixels,
// images istride apart), v already final (bias added): FP32 to of and/or FP16 to oh, added to what is
// there when accumulate. Where the 8 lie in one image, 16-byte pieces if they are aligned so, else
// 8-byte ones if they are (a run that starts 4 values into a 16-byte word, as the stride-2 row tiles'
// odd tiles of a 20-wide map); else one by one.
__device__ __forceinline__ void conv_store8(float *of, __half *oh, const float *v, int m, int n, int N, int HWn,
                                            FastDiv f, long istride, int accumulate) {
    int b = div_fast(n, f), p = n - b * HWn;
    long o = b * istride + (long)m * HWn + p;
    const bool run = n + 8 <= N && p + 8 <= HWn;   // the 8 in one image
    auto aligned = [&](unsigned a) {
        return (!of || ((uintptr_t)(of + o) & (a - 1)) == 0) && (!oh || ((uintptr_t)(oh + o) & (a - 1)) == 0);
    };
    if (run && aligned(16)) {
        conv_store_run<16>(of, oh, o, v, accumulate);
    } else if (run && aligned(8)) {
        conv_store_run<8>(of, oh, o, v, accumulate);
    } else {
        for (int e = 0; e < 8 && n + e < N; e++) {   // the tile's edge or an image boundary
            if (p + e == HWn) { b++; p -= HWn; o = b * istride + (long)m * HWn + p; }
            conv_store(of, oh, o + e, v[e], accumulate);
        }
    }
}
// BN statistics from a forward conv's epilogue (conv_forward_stats_cuda). BnTile: a count, a mean and the
// sum of squared deviations from it (M2) of some values of one channel. bn_tile_merge: two of them as one
// (Chan et al.'s update; a tile of count 0 adds nothing). bn_tile8: the first nv (0 .. 8) of v rounded to
// FP16 as conv_store8 stores them (v rounded in place), in two passes over registers. bn_tile_xor16: lane
// l's tile merged with lane l ^ 16's, the lower lane's first (the same bits in both). bn_tiles_out: the
// block's tile of each of its output channels m0 + r (r < 64, m0 + r < M), merged from G groups of its
// pixels in group order (group g's tile of row r at st[g * 64 + r]), into part[4 (c gridDim.x +
// blockIdx.x) ..] (one 16-byte store: count, mean, M2, 0): after a barrier.
struct BnTile { float n, m, q; };
__device__ __forceinline__ BnTile bn_tile_merge(const BnTile &a, const BnTile &b) {
    if (b.n == 0.0f) return a;
    if (a.n == 0.0f) return b;
    const float n = a.n + b.n, d = b.m - a.m, r = __fdividef(b.n, n);
    return {n, a.m + d * r, a.q + b.q + d * d * a.n * r};
}
__device__ __forceinline__ BnTile bn_tile8(float *v, int nv) {   // (rounds v in place)
    float s = 0.0f, q = 0.0f;
#pragma unroll
    for (int e = 0; e < 8; e++) {
        v[e] = __half2float(__float2half(v[e]));
        if (e < nv) s += v[e];
    }
    if (nv <= 0) return {0.0f, 0.0f, 0.0f};
    const float m = nv == 8 ? s * 0.125f : __fdividef(s, (float)nv);
#pragma unroll
    for (int e = 0; e < 8; e++)
        if (e < nv) q += (v[e] - m) * (v[e] - m);
    return {(float)nv, m, q};
}
__device__ __forceinline__ BnTile bn_tile_xor(const BnTile &t, int m) {
    const BnTile o = {__shfl_xor_sync(0xffffffffu, t.n, m), __shfl_xor_sync(0xffffffffu, t.m, m),
                      __shfl_xor_sync(0xffffffffu, t.q, m)};
    return threadIdx.x & m ? bn_tile_merge(o, t) : bn_tile_merge(t, o);
}
__device__ __forceinline__ BnTile bn_tile_xor16(const BnTile &t) { return bn_tile_xor(t, 16); }
template <int G>
__device__ __forceinline__ void bn_tiles_out(const BnTile *st, int m0, int M, float *part) {
    const int r = threadIdx.x;
    if (r >= 64 || m0 + r >= M) return;
    BnTile t = st[r];
#pragma unroll
    for (int g = 1; g < G; g++) t = bn_tile_merge(t, st[g * 64 + r]);
    *(float4 *)(part + 4 * ((long)(m0 + r) * gridDim.x + blockIdx.x)) = make_float4(t.n, t.m, t.q, 0.0f);
}
// conv_store_row8: outputs (m, pixels x .. x+7 of the W-wide row that starts at pixel r of image b) of
// NCHW images of HWn pixels: conv_store8 where the 8 lie in the row, else the row's last one by one
__device__ __forceinline__ void conv_store_row8(float *of, __half *oh, const float *v, int m, int b, int r, int x, int W,
                                                int N, int HWn, FastDiv f, long istride, int accumulate) {
    if (x + 8 <= W) {
        conv_store8(of, oh, v, m, b * HWn + r + x, N, HWn, f, istride, accumulate);
        return;
    }
#pragma unroll
    for (int e = 0; e < 8; e++)
        if (x + e < W) conv_store(of, oh, b * istride + (long)m * HWn + r + x + e, v[e], accumulate);
}

// load8 / store8: 8 consecutive activations as FP32, one 16-byte access for FP16 and two for FP32
// (p 16-byte aligned); the conversions are act_f's and act_from's, so the values are the scalar ones
__device__ __forceinline__ void load8(const __half *p, float *v) {
    union { uint4 u; __half2 h[4]; } q;
    q.u = *(const uint4 *)p;
#pragma unroll
    for (int e = 0; e < 4; e++) v[2 * e] = __low2float(q.h[e]), v[2 * e + 1] = __high2float(q.h[e]);
}
__device__ __forceinline__ void load8(const float *p, float *v) {
    float4 a = *(const float4 *)p, b = *(const float4 *)(p + 4);
    v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w; v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
}
__device__ __forceinline__ void store8(__half *p, const float *v) {
    union { uint4 u; __half2 h[4]; } q;
#pragma unroll
    for (int e = 0; e < 4; e++) q.h[e] = __floats2half2_rn(v[2 * e], v[2 * e + 1]);
    *(uint4 *)p = q.u;
}
__device__ __forceinline__ void store8(float *p, const float *v) {
    *(float4 *)p = make_float4(v[0], v[1], v[2], v[3]);
    *(float4 *)(p + 4) = make_float4(v[4], v[5], v[6], v[7]);
}
// gy = dA * silu'(y) at y = gamma*xhat + beta, xhat = (z - mean)*invstd (bn_silu_backward_cpu's first loop);
// the sigmoid by the fast exp and division, as the forward's bn_silu_folded (each within a few ulp; with
// expf and IEEE division each value took 11 more PTX instructions in either pass, sm_90, of 45-55)
__device__ __forceinline__ float bn_silu_gy(float dA, float xh, float gamma, float beta) {
    float y = gamma * xh + beta, s = __fdividef(1.0f, 1.0f + __expf(-y));
    return dA * s * (1.0f + y * (1.0f - s));
}
// The BN backward's sums from an input gradient's epilogue (conv_dgrad_bn_cuda). That input gradient is
// the dA of a BN+SiLU conv; where one kernel writes all of it (nothing added to it before or after) and
// that conv's BN backward would take two passes over dA and z (a channel of more values than one block
// holds: bn_bwd_partial_kernel's sums, then bn_bwd_apply_kernel), the kernel adds up, per channel of its
// tile, gy and gy * xhat over the values it stores (as stored: rounded to FP16), z read beside them,
// and writes the two sums to part[c K + k] and part[C K + c K + k] (k: the block's pixel tile, K of
// them): what bn_bwd_partial_kernel writes per chunk, so that bn_bwd_apply_kernel goes on from there and
// dA is not read a second time. BnbSums: a lane's two sums. bnb_par: channel c's mean, invstd, gamma and
// beta. bnb_add8: the first n (0 .. 8) of v (FP32, before rounding) added in, stored at o in the layout of
// z (16-byte reads of z where aligned), p their channel's bnb_par.
struct BnbSums { float g, gx; };
__device__ __forceinline__ float4 bnb_par(const ConvAct &a, int c) {
    return make_float4(a.mean[c], a.invstd[c], a.gamma[c], a.beta[c]);
}
__device__ __forceinline__ void bnb_add8(BnbSums &s, const __half *z, long o, const float *v, int n, float4 p) {
    if (n <= 0) return;
    const float mu = p.x, is = p.y, ga = p.z, be = p.w;
    float zv[8];
    if (n == 8 && ((uintptr_t)(z + o) & 15) == 0) {
        load8(z + o, zv);
    } else {
#pragma unroll
        for (int e = 0; e < 8; e++) zv[e] = e < n ? __half2float(z[o + e]) : 0.0f;
    }
#pragma unroll
    for (int e = 0; e < 8; e++)
        if (e < n) {
            const float xh = (zv[e] - mu) * is, gy = bn_silu_gy(__half2float(__float2half(v[e])), xh, ga, be);
            s.g += gy;
            s.gx += gy * xh;
        }
}
// bnb_sums_out: the block's sums of each of its channels m0 + r (r < 64, m0 + r < M), added over G groups
// of its pixels in group order (group q's sums of row r at st[q * 64 + r]), into part (M channels, K tiles,
// this block's tile k): after a barrier
template <int G>
__device__ __forceinline__ void bnb_sums_out(const BnbSums *st, int m0, int M, float *part, long K, long k) {
    const int r = threadIdx.x;
    if (r >= 64 || m0 + r >= M) return;
    BnbSums t = st[r];
#pragma unroll
    for (int q = 1; q < G; q++) t.g += st[q * 64 + r].g, t.gx += st[q * 64 + r].gx;
    part[(long)(m0 + r) * K + k] = t.g;
    part[(long)M * K + (long)(m0 + r) * K + k] = t.gx;
}

// ldsm_x4 / ldsm_x4_t / mma_16816: ldmatrix.x4 (.trans) and mma.sync m16n8k16 (FP16 products, FP32
// accumulators; two m16n8k8 on sm_75), on the PTX ISA's register layouts: lanes 8i .. 8i+7 give the
// row addresses of matrix i; A's registers are rows g, g+8 of columns 2t.. and 2t+8.., B's rows 2t..
// and 2t+8.. of column g, the accumulator's rows g, g+8 of columns 2t, 2t+1 (g = lane / 4, t = lane % 4).
// Under the emulation they are cuda_emu.h's warp collectives of the same layouts.
#ifdef CUDA_EMU_MMA
#define ldsm_x4(r, p) emu::ldmatrix_x4(r, p, false, __FILE__, __LINE__)
#define ldsm_x4_t(r, p) emu::ldmatrix_x4(r, p, true, __FILE__, __LINE__)
#define mma_16816(d, a, b) emu::mma_16816(d, a, b, __FILE__, __LINE__)
// (emulated: a copy of N or 0 bytes, zero-filled; either lands when its thread waits, as on the GPU)
template <int N> __device__ __forceinline__ void cp_asyncz(void *dst, const void *src, bool full) {
    __pipeline_memcpy_async(dst, src, N, full ? 0 : N);
}
__device__ __forceinline__ void cp_async16z(void *dst, const void *src, bool full) { cp_asyncz<16>(dst, src, full); }
template <class T> __device__ __forceinline__ void pin_reg(T *&) {}
#define bar_sync_n(id, n) emu::named_barrier(id, n, 0, __FILE__, __LINE__)
#define bar_arrive_n(id, n) emu::named_barrier(id, n, 1, __FILE__, __LINE__)
#else
// bar_sync_n / bar_arrive_n: named barrier id (1-15; 0 is __syncthreads') of n threads (whole warps):
// bar.sync waits until n threads have arrived, bar.arrive counts the thread and goes on; shared-memory
// writes made before either are seen by the threads that wait on the same barrier
__device__ __forceinline__ void bar_sync_n(int id, int n) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ void bar_arrive_n(int id, int n) { asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }
// pin_reg: p computed here, in a register (an empty asm that reads and writes it), so that the compiler
// does not compute it again inside each of the branches that use it
template <class T> __device__ __forceinline__ void pin_reg(T *&p) { asm volatile("" : "+l"(p)); }
// cp_asyncz<N>: an N-byte cp.async (N 8 or 16; .cg takes 16 only, .ca 8) of src to dst (shared), or N
// zero bytes (source size 0: nothing read) when !full, without a branch; cp_async16z: N = 16
// (sm_75 has no cp.async: a plain N-byte copy, as __pipeline_memcpy_async makes there)
template <int N> __device__ __forceinline__ void cp_asyncz(void *dst, const void *src, bool full) {
    static_assert(N == 8 || N == 16, "cp_asyncz copies 8 or 16 bytes");
#if __CUDA_ARCH__ >= 800
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    if constexpr (N == 16)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(full ? 16 : 0));
    else asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(d), "l"(src), "r"(full ? 8 : 0));
#else
    typedef typename std::conditional<N == 16, uint4, uint2>::type V;
    *(V *)dst = full ? *(const V *)src : V();
#endif
}
__device__ __forceinline__ void cp_async16z(void *dst, const void *src, bool full) { cp_asyncz<16>(dst, src, full); }
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void *p) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], const void *p) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s));
}
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#if __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) : "r"(a[0]), "r"(a[1]), "r"(b[0]));
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) : "r"(a[2]), "r"(a[3]), "r"(b[1]));
#endif
}
#endif

// ------------------------------------------------------------------------------------------
// 3x3 convolutions by halo tiles (stride 1; the stride-2 input and weight gradients)
// ------------------------------------------------------------------------------------------
/*
 * conv_halo_kernel: a 3x3, stride-1, pad-1 convolution out[m, y, x] = sum_{c, ky, kx} A_{ky,kx}[m, c]
 * in[c, y+ky-1, x+kx-1]. The forward is it with in = x, A_t[co, ci] = w[co, ci, t]; the input gradient
 * (DGRAD) too, with in = dz and A_t[ci, co] = w[co, ci, 8-t]: a stride-1 3x3 conv's input gradient is
 * the same conv of dz by the weights transposed and flipped; that of a stride-2 conv (S2) is four
 * such convs of dz, one per parity (py, px) of the input pixels, each with only the 1, 2 or 4 taps
 * that reach its pixels: a block takes one row parity (grid.z) and both column parities, 3 or 6 taps
 * per K step, and stores whole rows of input pixels. The stride-2 forward (S2 without DGRAD) reads a
 * stride-2 window of x. A block computes 64 output channels by 128 output pixels (S2: 64), TR rows by
 * TC columns of one image. Per K step it stages 16 input channels of
 * the tile's halo (TR+2 rows by TC+2 columns) once, position-major: the 16 channels of a pixel are a
 * 32-byte row of shared memory, so the 16 pixels a WMMA tile of any tap reads are matrix_b
 * col-major at a 32-byte aligned address, a tap's shift a whole number of rows. With the halo come the
 * 9 taps of A for those 16 channels; then each warp multiplies 9 taps x 4 x 2 WMMA tiles of what was
 * staged (all 64 channels by its 32 pixels). So an input value is loaded from global memory once per block
 * and K step, not once per tap as in the gather kernels, VW halves at a time (8: 16-byte loads, or 4:
 * rows whose width is a multiple of 4 only); ACT's BN+SiLU is applied once per staged value. A is copied
 * by cp.async from a tap-major copy of the weights (Cout, 9, Cin), in which the 16 input channels of an
 * (output channel, tap) or 64 of a (dz channel, tap) are contiguous: no registers, no transposes.
 * Staging and multiplying are done by different warps of the block (see conv_halo_kernel): while the
 * consumer warps multiply step s, the producers write step s + 1 into the other shared stage, the
 * halo's global loads issued before they wait for it. Each output is the sum of the same FP16
 * products in FP32 as the gather kernels', in a different order (channel-major within the tap-major
 * K step), so results match the twin within the same tolerance.
 */
#define H3_BM 64    // output channels per block
#define H3_BN 128   // output pixels per block
#define H3_KC 16    // input channels per K step
#define H3_ROW_TC 20   // row tiles: staged 20 output columns wide (see conv_halo_kernel)
#define H3_ROW_RT 3    // stride 2: 3 rows (60 pixels of 64: the most whole rows of 20 a 64-pixel tile holds)
#define H3_ROW_RT1 6   // stride 1: 6 rows (120 pixels of 128)
#define H3_ROW_TC40 40 // stride 1's wider row tiles: 40 columns (16-byte pieces; see conv_halo_rows)
#define H3_ROW_RT40 3  // and 3 rows (120 pixels of 128)
// h3_rows(TC): whether a halo kernel of TC columns takes row tiles (the column tiles are 16 or 32 wide);
// h3_row_rt: a row tile's rows at stride 2 (s2) or 1 and TC columns
__host__ __device__ constexpr bool h3_rows(int tc) { return tc == H3_ROW_TC || tc == H3_ROW_TC40; }
__host__ __device__ constexpr int h3_row_rt(bool s2, int tc) {
    return s2 ? H3_ROW_RT : tc == H3_ROW_TC40 ? H3_ROW_RT40 : H3_ROW_RT1;
}
template <int VW> struct H3Piece {   // VW consecutive halves of one row of one channel
    typedef typename std::conditional<VW == 8, uint4, uint2>::type V;
    union {
        V v;
        __half h[VW];
    };
};
// H3Halo: one thread's share of staging a halo tile (HR = TR + 2 rows by HC = TC + 2 columns of 16
// channels; column 0 is x0 - 1): each row's TC inner columns as pieces of VW halves, its two edge
// columns as single halves, so that every value loaded is used. Piece q = tid + 128 i is channel
// (q >> 1) & 15 (lanes pair neighbouring pieces of a row, 16 channels per warp half; with an odd
// number of pieces a row, PR, neighbouring pieces of the channel's window, so that a pair may span two
// rows), so all of a thread's pieces are one channel, pc; its single halves are all on one side, tid & 1.
// QUAD (the stride-1 halo of 8-byte pieces with an odd PR: the 20-column row tiles' dz at stride 2, their x
// or dz at stride 1; the 40-column ones, 16-byte pieces, are numbered in pairs): 4 lanes take 4
// neighbouring pieces of a channel's window (32 bytes, where a pair's 16 used half of each sector), 8
// channels a warp: pc is bits 2-4 and 6 of tid, bit 5 the quad's place among the channel's two a row of 128
// threads, bits 1 and 5 a single half's row (chan, init).
// fetch loads them (global -> registers), zero past the image or past Cr channels; store writes them
// into shared memory, ACT's BN+SiLU applied to the values inside the image (the padding stays 0).
// S2: the input window of a stride-2 tile of BN output pixels, HR = 2 TR + 1 rows by HC = 2 TC + 1
// columns from input (2 y0 - 1, 2 x0 - 1): 2 TC inner columns and one edge column (the left), whose
// single halves the two lanes of a pair take on alternate rows. A row is stored de-interleaved: its
// TC + 1 even columns first, then its TC odd ones, so that the 16 output pixels of a B tile (every
// other column) are 16 consecutive positions, as at stride 1 (col(kx): where tap kx's columns start).
// KP: halves per position, chosen so that the 8 rows an ldmatrix phase reads (8 consecutive positions,
// one 16-byte half each) fall into 8 different bank groups (at a plain 32-byte pitch positions p and
// p + 4 share theirs): 24 pads each position to 48 bytes; 16 (where shared memory is short) keeps 32
// bytes and swaps a position's two halves (channels 0-7, 8-15) where bit 2 of its index is set (at).
template <int TC, int VW, bool S2 = false, int BN = H3_BN, int KP = H3_KC>
struct H3Halo {
    static constexpr int TR = BN / TC, HR = S2 ? 2 * TR + 1 : TR + 2, HC = S2 ? 2 * TC + 1 : TC + 2;
    // PR pieces a row, HR * PR a channel, numbered in pairs: an even PR pairs the pieces of a row; an
    // odd one (the row tiles') numbers a channel's pieces row by row, so that a pair may span two rows,
    // from -sh (init): a piece numbered past the window (-1, or HR * PR) is neither loaded nor stored
    static constexpr int PR = (S2 ? 2 * TC : TC) / VW, NF = (PR % 2 ? (HR * PR + 2) / 2 : HR * PR / 2) * 2 * H3_KC;
    static constexpr bool QUAD = !S2 && VW == 4 && PR % 2;   // (8 pieces a channel per 128 threads, from -3)
    // ROT: the pairs' pieces are rotated (store; QUAD by lane and row): where a pair's two pieces lie a
    // multiple of 128 bytes apart, and in QUAD
    static constexpr bool ROT = QUAD || (S2 ? VW / 2 : VW) * 2 * KP % 128 == 0;
    static constexpr int NS = HR * (S2 ? 1 : 2) * H3_KC;
    static constexpr int FPT = QUAD ? (HR * PR + 3 + 7) / 8 : (NF + 127) / 128;
    static constexpr int SPT = QUAD ? (HR + 3) / 4 : S2 ? (HR + 7) / 8 : (NS + 127) / 128;
    static_assert(!(S2 && VW == 4 && PR % 2), "an odd stride-2 row of 8-byte pieces has no numbering");
    // chan: the channel (of 16) thread tid stages
    __device__ __forceinline__ static int chan(int tid) {
        return QUAD ? ((tid >> 2) & 7) | ((tid >> 3) & 8) : (tid >> 1) & 15;
    }
    static_assert(TC % 4 == 0 && BN % TC == 0, "halo geometry");
    typedef typename H3Piece<VW>::V V;
    // col(kx): the position in a stored row of the tile's first pixel's column for tap kx (S2: of halo
    // column kx, then every other column; stride 1: kx, then every column)
    __device__ __forceinline__ static constexpr int col(int kx) { return S2 ? (kx == 1 ? TC + 1 : kx >> 1) : kx; }
    static_assert(KP == H3_KC || KP == H3_KC + 8, "halo pitch");
    static constexpr int PITCH = KP;   // halves per position
    // at(Bs, p, ch): where channel ch of position p lies (what store writes, ldmatrix reads). KP 16:
    // the byte offset p * 32 + ch * 2 has bit 7 = bit 2 of p and bit 4 = ch's half, so the swap is one
    // XOR of the offset's bit 7 into its bit 4 (Bs is 128-byte aligned)
    __device__ __forceinline__ static __half *at(__half (*Bs)[KP], int p, int ch) {
        if constexpr (KP != H3_KC) return &Bs[p][ch];
        const unsigned a = (unsigned)p * 32u + (unsigned)ch * 2u;
        return (__half *)((char *)Bs + (a ^ (a >> 3 & 16u)));
    }
    int frow[FPT], fcol[FPT], srow[SPT], side, pc;   // halo row (-1: no piece), first halo column
    unsigned fin, sin;                               // bit i: piece i lies inside the image
    H3Piece<VW> fv[FPT];
    __half sv[SPT];
    // row_pos: where pixel q of a row tile (whole rows of an OW-wide map; q past the tile's TR x OW its
    // last) lies in the window, for tap (0, 0): its row's first position plus its column
    __device__ __forceinline__ static int row_pos(int q, int OW) {
        q = min(q, TR * OW - 1);
        const int r = q / OW;
        return (S2 ? 2 : 1) * r * HC + q - r * OW;
    }
    // tile_y, tile_x: the top row and left column of tile t of an image (tilesX tiles per row of tiles)
    __device__ __forceinline__ static int tile_y(int t, int tilesX) { return t / tilesX * TR; }
    __device__ __forceinline__ static int tile_x(int t, int tilesX) { return (t - t / tilesX * tilesX) * TC; }
    // sh (odd PR): numbers the channel's pieces from -sh, so that each pair (QUAD: quad) starts sh pieces
    // earlier. A row tile's window is whole rows, a channel's pieces one run of memory, and pair_shift's sh
    // puts its pairs (quads) at multiples of their size, 32 bytes (16-byte pieces: the stride-2 forward's,
    // stride 1's 40-column tiles') or 16 (a pair of 8-byte ones) or 32 (a quad of them): none across two
    // 32-byte sectors (the forward's 32-byte pairs, on 80-byte rows starting 16 bytes into a sector, took
    // two sectors each)
    __device__ __forceinline__ void init(int tid, int sh = 0) {
        pc = chan(tid); side = tid & 1;
#pragma unroll
        for (int i = 0; i < FPT; i++) {
            int q = tid + 128 * i, rest = q >> 5;
            if constexpr (PR % 2 == 0) {   // piece 2 (rest / HR) + (q & 1) of row rest % HR
                frow[i] = q < NF ? rest % HR : -1;
                fcol[i] = VW * (2 * (rest / HR) + (q & 1)) + 1;
            } else {   // the channel's piece u, row u / PR (QUAD: 8 a channel per i, this quad's 4 at 4 (tid
                       // >> 5 & 1), lanes 0-3 of it pieces 0, 2, 1, 3: see store)
                const int u = (QUAD ? 8 * i + 4 * ((tid >> 5) & 1) + ((tid & 1) << 1 | (tid >> 1 & 1))
                                    : 2 * rest + (q & 1)) - sh;
                frow[i] = (QUAD || q < NF) && u >= 0 && u < HR * PR ? u / PR : -1;
                fcol[i] = VW * (u < 0 ? 0 : u % PR) + 1;
            }
        }
#pragma unroll
        for (int i = 0; i < SPT; i++) {
            if constexpr (QUAD) {
                const int r = 4 * i + ((tid >> 1) & 1) + ((tid >> 4) & 2);
                srow[i] = r < HR ? r : -1;
                continue;
            }
            int r = S2 ? 2 * ((tid + 128 * i) >> 5) + side : (tid + 128 * i) >> 5;
            srow[i] = (S2 ? r < HR : tid + 128 * i < NS) ? r : -1;
        }
    }
    // staged(i): whether piece i of every thread lies in the window whatever tid and sh (a test the
    // store need not make; the compiler did not find it once sh was an argument)
    __device__ __forceinline__ static constexpr bool staged(int i) {
        return PR % 2 == 0 ? 128 * (i + 1) <= NF : 8 * i >= 1 && 8 * i + 7 < HR * PR;
    }
    // pair_shift: init's sh for the thread's channel image src (W wide) at K step 0 and the tile whose
    // halo position (1, 1) is pixel (y0, x0): from the address of the window's first piece (row 0,
    // column 1, as piece_at places it; integer arithmetic, it may lie before the image). Its later
    // channels lie 16 images on, 32 x the map's pixels bytes: the same sh
    __device__ __forceinline__ static int pair_shift(const __half *src, int y0, int x0, int W) {
        const uintptr_t a = (uintptr_t)src + 2 * ((long)(y0 - 1) * W + x0);
        return QUAD ? (int)(a / 8) & 3 : PR % 2 ? (int)(a / (2 * VW)) & 1 : 0;
    }
    // piece_at / single_at: whether the thread's piece (single half) i lies inside a channel's (H, W)
    // image for the tile whose halo position (1, 1) is input pixel (y0, x0), and its offset there
    __device__ __forceinline__ bool piece_at(int i, int y0, int x0, int H, int W, int &off) const {
        const int y = y0 - 1 + frow[i], x = x0 + fcol[i] - 1;
        off = y * W + x;
        return frow[i] >= 0 && y >= 0 && y < H && x < W;
    }
    __device__ __forceinline__ bool single_at(int i, int y0, int x0, int H, int W, int &off) const {
        const int y = y0 - 1 + srow[i], x = !S2 && side ? x0 + TC : x0 - 1;
        off = y * W + x;
        return srow[i] >= 0 && y >= 0 && y < H && x >= 0 && x < W;
    }
    // place: the offsets of the thread's pieces and single halves, and in fgeo / sgeo which lie inside
    // the image (fixed for a block of conv_halo_kernel, whose K steps change only the channel)
    int foff[FPT], soff[SPT];
    unsigned fgeo, sgeo;
    __device__ __forceinline__ void place(int y0, int x0, int H, int W) {
        fgeo = sgeo = 0;
#pragma unroll
        for (int i = 0; i < FPT; i++) {
            int o;
            const bool ok = piece_at(i, y0, x0, H, W, o);
            foff[i] = ok ? o : 0;
            fgeo |= (unsigned)ok << i;
        }
#pragma unroll
        for (int i = 0; i < SPT; i++) {
            int o;
            const bool ok = single_at(i, y0, x0, H, W, o);
            soff[i] = ok ? o : 0;
            sgeo |= (unsigned)ok << i;
        }
    }
    // fetch_placed: the pieces and halves of channel image src (nullptr: a channel past the tensor's,
    // all zeros) at the places place computed
    __device__ __forceinline__ void fetch_placed(const __half *src) {
        fin = src ? fgeo : 0u;
        sin = src ? sgeo : 0u;
#pragma unroll
        for (int i = 0; i < FPT; i++) fv[i].v = (fin >> i) & 1 ? *(const V *)(src + foff[i]) : V();
#pragma unroll
        for (int i = 0; i < SPT; i++) sv[i] = (sin >> i) & 1 ? src[soff[i]] : __float2half(0.0f);
    }
    // fetch: the same in one pass, for conv_halo_wgrad_kernel, whose K steps move the tile (place and
    // fetch_placed there cost its loop 0.1-0.5 more PTX instructions per mma)
    __device__ __forceinline__ void fetch(const __half *src, int y0, int x0, int H, int W) {
        fin = sin = 0;
#pragma unroll
        for (int i = 0; i < FPT; i++) {
            int o;
            const bool ok = src && piece_at(i, y0, x0, H, W, o);
            fv[i].v = ok ? *(const V *)(src + o) : V();
            fin |= (unsigned)ok << i;
        }
#pragma unroll
        for (int i = 0; i < SPT; i++) {
            int o;
            const bool ok = src && single_at(i, y0, x0, H, W, o);
            sv[i] = ok ? src[o] : __float2half(0.0f);
            sin |= (unsigned)ok << i;
        }
    }
    template <bool ACT>
    __device__ __forceinline__ void store(__half (*Bs)[KP], float2 bn) const {
#pragma unroll
        for (int i = 0; i < FPT; i++) {
            if (!staged(i) && frow[i] < 0) continue;
            // ROT: the two lanes of a pair store the two pieces' values in orders 2 apart (side 1 starts at
            // its third: its piece rotated by one 32-bit word, its positions by 2, or at stride 2 by 1 in
            // each half of the de-interleaved row). Where the pair's pieces lie a multiple of 128 bytes
            // apart (D positions, D = VW, or VW / 2 at stride 2: 16-byte pieces at stride 1, or any at the
            // 32-byte pitch but the stride-2 window's 8-byte ones), the 16 lanes of each side would write
            // the same banks, 2 passes a store; rotated they do not (480 bytes apart at the 48-byte pitch;
            // 320, 192 or 160 at the 32-byte one, whose swizzle only swaps halves within a position; the
            // last two values, wrapped, lie 1 or 2 positions apart, in other banks too). Elsewhere (D x the
            // pitch 64, 96 or 192 bytes) the unrotated sides already write different banks, and rotating
            // moved a stride-2 pair of 16-byte pieces to 240 bytes, half its bytes in the same banks (a
            // store 1.75 passes where unrotated 1; figures from a simulation of this code over every lane,
            // piece and sh). A pair that spans two rows, odd PR, is stored right either way, its banks as
            // they fall.
            // QUAD: lanes 0-3 of a quad take pieces 0, 2, 1, 3, so that the odd lanes' rotation puts 4
            // pieces of a row at positions 0, 10, 4, 14 on: 0, 480, 192, 672 bytes at the 48-byte
            // pitch, 4 different bank groups; a quad that spans two rows (the next row 2 positions
            // further on) would put two in one group, so a piece on an odd row rotates the other way (of
            // a quad's 112 stores, over every sh, 16 take an extra pass where 48 did: the best of the
            // rules by lane and row parity)
            const int rot = !ROT ? 0 : QUAD ? side ^ (frow[i] & 1) : side;
            H3Piece<VW> r;
            // ACT: BN+SiLU on the whole piece where it lies inside the image, pairs of values at a time
            // (one branch a piece, one conversion a pair to FP16; the same bits as value by value)
            V in = fv[i].v;
            if (ACT && ((fin >> i) & 1)) in = bn_silu_words(in, bn.x, bn.y);
            {   // word by word (a select each: the whole vector's select became branches and moves)
                constexpr int NW = VW / 2;
                union { V v; uint32_t w[NW]; } u, q;
                u.v = in;
#pragma unroll
                for (int k = 0; k < NW; k++) q.w[k] = rot ? u.w[(k + 1) % NW] : u.w[k];
                r.v = q.v;
            }
            // value e of the piece is halo column fcol + e: stride 1, position fcol + e; S2 (fcol odd),
            // odd columns (even e) in the row's second half, even ones (odd e) in its first
            const int p0 = S2 ? frow[i] * HC + (fcol[i] >> 1) + rot : frow[i] * HC + fcol[i] + 2 * rot;
            const int wrap = (S2 ? VW / 2 : VW) * rot;   // the last two values wrap to the piece's start
#pragma unroll
            for (int e = 0; e < VW; e++) {
                const __half v = r.h[e];
                const int p = p0 + (S2 ? ((e & 1) ? (e + 1) >> 1 : TC + 1 + (e >> 1)) : e) - (e >= VW - 2 ? wrap : 0);
                *at(Bs, p, pc) = v;
            }
        }
        const int col = !S2 && side ? TC + 1 : 0;
#pragma unroll
        for (int i = 0; i < SPT; i++) {
            if (srow[i] < 0) continue;
            __half v = sv[i];
            if (ACT && ((sin >> i) & 1)) v = __float2half(bn_silu_folded(__half2float(v), bn.x, bn.y));
            const int p = srow[i] * HC + col;
            *at(Bs, p, pc) = v;
        }
    }
};
// A comes from wt, the weights tap-major (Cout, 9, Cin) (conv_w_tapmajor_cuda), by cp.async: an (output
// channel, tap) row's input channels are contiguous there, so 16 bytes of it are 8 values of one row of
// A_t (forward) or of A_t^T (DGRAD) as the stage holds them. PS2: a block of row parity py copies only
// the 3 (py 0) or 6 (py 1) taps that reach its pixels.
// H3Shape: the shared memory of one conv_halo_kernel variant: two stages, each A's 9 taps then the halo,
// every piece at a multiple of 128 bytes: 46-64 KB, within the 64 KB a block may have on sm_75 (the
// forward's A, 64 x 16 values a tap, swizzled by h3_a: padded to 48-byte rows it would take 71-82 KB).
template <bool DGRAD, bool S2, int TC, int VW> struct H3Shape {
    static constexpr bool PS2 = S2 && DGRAD, FS2 = S2 && !DGRAD, ROWS = h3_rows(TC);
    static constexpr int BNK = S2 ? 64 : H3_BN, RT = h3_row_rt(S2, TC);
    // the halo padded to 48 bytes a position (8 ldmatrix rows in 8 bank groups; the stride-2 forward
    // has no 32-column tiles, whose 65-wide window would fit 64 KB only at 32 bytes, swizzled).
    // Row tiles stage 3 output rows, the forward's a 7 x 41 window (60 pixels'; the tile computes 64,
    // the last 4 discarded), PS2's a 5 x 22 halo of dz. (The forward's at 24 columns, 7 x 49, fitted
    // only swizzled, and the swizzle's address math took the loop from 11.3 to 16.8 PTX instructions
    // per mma, sm_80.)
    // Stride 1's row tiles stage 6 rows of 20 columns, an 8 x 22 halo of 8-byte pieces (QUAD: a 20-wide
    // row is 5 of them; of 16 bytes it would be 2.5), or 3 rows of 40, a 5 x 42 halo of 16-byte pieces (5
    // a row, numbered in pairs that may span two rows, as the stride-2 forward's window).
    static_assert(!(FS2 && TC == 32), "the stride-2 forward takes 16-column or row tiles (conv_halo_grid)");
    static_assert(!ROWS || S2 || VW == (TC == H3_ROW_TC ? 4 : 8), "stride 1's row tiles load 8- or 16-byte pieces");
    static_assert(!(S2 && TC == H3_ROW_TC40), "40-column row tiles are stride 1's");
    typedef H3Halo<TC, VW, FS2, ROWS ? RT * TC : BNK, H3_KC + 8> Halo;
    static constexpr int A_HALVES = DGRAD ? 9 * H3_KC * (H3_BM + 8) : 9 * H3_BM * H3_KC;
    static constexpr int STAGE = A_HALVES + (Halo::HR * Halo::HC * Halo::PITCH + 63) / 64 * 64;   // halves
    static constexpr size_t BYTES = 2 * (size_t)STAGE * sizeof(__half);
    static_assert(BYTES <= 64 * 1024, "sm_75 gives a block at most 64 KB of shared memory");
};
// h3_a: where A's 8 values (16 bytes) j of row r of tap t lie in a stage. The forward's A is (m, k): 64
// rows of 16 input channels (two 16-byte halves, j 0-1) per tap, the half swapped in rows whose bit 2
// is set; DGRAD's is (k, m): 16 rows of 64 (j 0-7) per tap, padded to 144 bytes. Either way the 8 rows
// an ldmatrix phase reads (8 consecutive rows, one j) and the 8 lanes of a store phase fall into 8
// different 16-byte bank groups.
template <bool DGRAD> __device__ __forceinline__ __half *h3_a(__half *A, int t, int r, int j) {
    if (DGRAD) return A + (t * H3_KC + r) * (H3_BM + 8) + 8 * j;
    return A + (t * H3_BM + r) * H3_KC + 8 * (j ^ ((r >> 2) & 1));
}
// Warp-specialised: 256 threads, warps 4-7 the producers (fetch a K step's operands from global memory,
// apply BN+SiLU, write them into a stage), warps 0-3 the consumers (the mma products and the epilogue),
// so that the staging of K step s + 1 runs while step s is multiplied. Two stages, handed over by named
// barriers: FULL(st) = 1 + st (producers arrive after writing stage st, consumers wait before reading
// it), EMPTY(st) = 3 + st (consumers arrive when done reading it, producers wait before writing it
// again), each counting the 128 threads of either side; 5 is the consumers' own (128).
// Two blocks an SM where shared memory allows (16 warps; 128 registers a thread: with A copied by
// cp.async the producers hold only the halo, 96-128 registers on sm_80 without spills, where loading and
// transposing A through registers had needed 134-210 and one block an SM).
// H3_MIN_BLOCKS: the blocks an SM conv_halo_kernel and conv_halo_wgrad_kernel ask registers for: 1 on
// sm_75 (64 KB of shared memory an SM hold one block; at 128 registers ptxas spilled there), else 2. (The
// stride-2 forward's 32-column tiles, since dropped, asked for 1 until their A copies took their source
// and test once a K step.)
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#define H3_MIN_BLOCKS 1
#else
#define H3_MIN_BLOCKS 2
#endif
template <bool ACT, bool DGRAD, bool S2, int TC, int VW>
__global__ __launch_bounds__(256, H3_MIN_BLOCKS)
void conv_halo_kernel(ConvGeo g, const __half *in, ConvAct a, const __half *wt, const float *bias, float *of,
                      __half *oh, int accumulate, float *part, const __half *zb) {
    // S2 with DGRAD: the input gradient of a stride-2 conv, one row parity py of the input pixels per
    // block and both column parities (PS2), its halo of dz at stride 1; S2 without: the stride-2
    // forward (FS2), its halo a stride-2 window of x
    constexpr bool PS2 = S2 && DGRAD, FS2 = S2 && !DGRAD;
    // S2's tiles are 64 pixels, each warp 32 channels (2 A tiles) by 32 pixels (FS2: its window holds
    // 4x the values of its tile, and at 128 the staging registers spilled; PS2: a pixel of the tile is
    // two input pixels, (2x, 2y + py) and (2x + 1, 2y + py), each with its own accumulator, NJ 4); else
    // 128, each warp all 64 channels (4 A tiles) by 32 pixels
    constexpr int BNK = S2 ? 64 : H3_BN, WA = BNK == H3_BN ? 4 : 2, NJ = PS2 ? 4 : 2;
    typedef H3Shape<DGRAD, S2, TC, VW> Shape;
    typedef typename Shape::Halo Halo;
    constexpr int TR = Halo::TR, HC = Halo::HC, FPR = TC / 16, SH = FS2 ? 2 : 1;
    // ROWS (TC H3_ROW_TC, or at stride 1 H3_ROW_TC40): a tile is RT whole output rows (PS2: rows of pixel
    // pairs) of a map at most TC wide, H3_ROW_RT at stride 2 (a 20-wide map: 60 of the tile's 64 pixels
    // computed, where 16-column tiles of 4 rows computed 640 a 400-pixel image), H3_ROW_RT1 at stride 1
    // (120 of 128, where 32-column tiles of 4 rows computed 640 a 20 x 20 image, row tiles 448: a warp
    // whose 32 pixels lie past the last tile's 2 rows skips its products), H3_ROW_RT40 on 40 columns (a
    // 40 x 40 image 14 tiles, 1728 pixels computed where 16-column tiles computed 1920); its window (2 RT
    // + 1 rows of x, or RT + 2 of x or dz, the input's whole width) is staged as a TC-column tile's (the
    // columns past the image zero)
    constexpr bool ROWS = Shape::ROWS;
    // A per tap: the forward's row-major (m, k), the 16 input channels of an output channel contiguous;
    // DGRAD's col-major (m, k), 64 output channels contiguous per dz channel; 16-byte pieces copied from
    // wt placed by h3_a (the forward's swizzled, DGRAD's padded), so that the 8 rows an ldmatrix phase
    // reads fall into different banks.
    constexpr int A_HALVES = Shape::A_HALVES;
    extern __shared__ uint4 h3_smem[];   // Shape::BYTES: stage st at st * STAGE halves, A's taps then the halo
    __half *const Araw = (__half *)h3_smem;
    // stage st's A (h3_a) and halo (16 channels per position, H3Halo::at)
    auto Ast = [&](int st) { return Araw + st * Shape::STAGE; };
    auto Bs = [&](int st) { return (__half(*)[Halo::PITCH])(Araw + st * Shape::STAGE + A_HALVES); };
    // the epilogue's tiles per warp (16 x 16 floats; PS2: one per column parity), in stage 0's A, once
    // every consumer is past the K loop. cs(r, c): where column c of row r lies in its 64-byte row, its
    // 16-byte word index XORed with (r & 2) | (r >> 2 & 1), so that the 4 rows an 8-byte store's half warp
    // writes (32 bytes of each) and the 8 a 16-byte read's phase reads take 8 different bank groups
    // (unswizzled, at pitches of 64 to 112 bytes, at least one of the two had conflicts: at 80 bytes the
    // stores took two passes each; of the XOR rules by 2 bits of the row, none works at 80 bytes, this one
    // and 3 others at 64)
    typedef float CsTiles[2][16][16];   // one consumer warp's
    static_assert(A_HALVES * sizeof(__half) >= 4 * sizeof(CsTiles) + 4 * 64 * sizeof(BnTile),
                  "the epilogue's tiles and the statistics' groups fit in A's space");
    CsTiles *const Cs = (CsTiles *)Araw;
    auto cs = [](int r, int c) { return c ^ (((r & 2) | (r >> 2 & 1)) << 2); };
    BnTile *const bst = (BnTile *)(Cs + 4);   // part: [pixel group][row] (after the 4 warps' tiles)
    // each side numbers its 128 threads 0-127 and its warps 0-3
    const bool producer = threadIdx.x >= 128;
    const int tid = threadIdx.x & 127, warp = tid / 32;
    const int M = DGRAD ? g.Cin : g.Cout, Cr = DGRAD ? g.Cout : g.Cin, H = g.H, W = g.W, HW = H * W;
    const long is = DGRAD ? g.zs : g.xs, os = DGRAD ? g.xs : g.zs;
    // PS2: block z computes the input pixels of row parity py, an OH x OW grid of pixel pairs (x: input
    // columns 2x and 2x + 1); dz (IH x IW) is its input, the halo's row r / column c dz's row y0 - 1 + r
    // / column x0 - 1 + c. FS2: the output is Ho x Wo, the halo's row r / column c x's row 2 y0 - 1 + r
    // / column 2 x0 - 1 + c
    const int py = PS2 ? blockIdx.z : 0;
    const int OH = PS2 ? (H - py + 1) >> 1 : FS2 ? g.Ho : H, OW = PS2 ? (W + 1) >> 1 : FS2 ? g.Wo : W;
    const int IH = PS2 ? g.Ho : H, IW = PS2 ? g.Wo : W, HWi = IH * IW;
    const int OHW = FS2 ? g.Ho * g.Wo : HW;   // the output's map (PS2: all parities, H x W)
    // PS2's grid is sized for parity 0, whose grid is the larger: a block of a smaller parity's grid that
    // falls past it (or into an empty one) is idle: it runs the K loop on image 0's data (in bounds; the
    // loop the same code as every block's) and stores nothing
    constexpr int RT = TR;   // rows a tile (ROWS: Shape::RT)
    const int tilesX = ROWS ? 1 : (OW + TC - 1) / TC, tilesY = (OH + RT - 1) / RT, per_img = max(tilesX * tilesY, 1);
    const int b = blockIdx.x / per_img, tile = blockIdx.x - b * per_img;
    const bool live = b < g.B && tilesX * tilesY > 0;
    const int tx = max(tilesX, 1), m0 = blockIdx.y * H3_BM;
    const int y0 = ROWS ? tile * RT : Halo::tile_y(tile, tx), x0 = ROWS ? 0 : Halo::tile_x(tile, tx);
    const int nsteps = (Cr + H3_KC - 1) / H3_KC;
    const __half *inb = in + (live ? b : 0) * is;
    Halo halo;
    halo.init(tid, Halo::pair_shift(inb + (long)Halo::chan(tid) * HWi, SH * y0, SH * x0, IW));
    halo.place(SH * y0, SH * x0, IH, IW);   // (the same places in every K step's channel)
    float2 bnf = make_float2(0.0f, 0.0f);   // ACT: the piece channel's BN folded to scale and shift
    // A comes from wt, the weights tap-major (Cout, 9, Cin) (conv_w_tapmajor_cuda), where the input
    // channels of an (output channel, tap) row are contiguous: cp.async copies it 16 bytes at a time
    // straight into the stage (h3_a's places), no registers, no transposes. Copy i of a thread (i < NA)
    // is chunk q = tid + 128 i of the step. Forward: A_t[co][ci] = row (m0 + r, t) of wt, channels c0 + 8 j
    // ..: j = q & 1, r = q / 2 % 64, t = i (two lanes a 32-byte row). DGRAD: A_t[k][m] = w[c0 + k, m, 8 -
    // t] = row (c0 + k, 8 - t), channels m0 + 8 j ..: j = q & 7, k = q / 8 % 16, t = i (8 lanes a 128-byte
    // row). PS2: the block's NT taps (py 0: 3, 4, 5; py 1: 0, 1, 2, 6, 7, 8), slot u of them tap u + 3
    // for py 0 or u >= 3, else u; q = tid / 8 + 16 i (< 16 NT) the step's (channel q / NT, slot q % NT)
    // row, its channels m0 + 8 (tid % 8) ... A row past the tensor's, or its chunk past its channels, is
    // zeroed instead. aoff: copy 0's offset in wt for step 0 (-1: no row); ach: PS2's channel of copy i,
    // DGRAD's k, the forward's first channel 8 j (of the step's 16)
    const int NT = py ? 6 : 3;
    constexpr int NA = PS2 ? 6 : 9;
    int aoff[PS2 ? NA : 1], ach[PS2 ? NA : 1];
    if constexpr (PS2) {
        const bool live_m = m0 + 8 * (tid & 7) < M;
#pragma unroll
        for (int i = 0; i < NA; i++) {
            const int q = (tid >> 3) + 16 * i, c = q / NT, u = q - c * NT;
            ach[i] = c;
            aoff[i] = q < 16 * NT && live_m ? (c * 9 + u + (py == 0 || u >= 3 ? 3 : 0)) * M + m0 + 8 * (tid & 7) : -1;
        }
    } else if constexpr (!DGRAD) {
        const int r = (tid >> 1) & 63, j = tid & 1;
        ach[0] = 8 * j;
        aoff[0] = m0 + r < M ? (m0 + r) * 9 * Cr + 8 * j : -1;
    } else {
        const int k = (tid >> 3) & 15, j = tid & 7;
        ach[0] = k;
        aoff[0] = m0 + 8 * j < M ? (k * 9 + 8) * M + m0 + 8 * j : -1;
    }
    // fetch_a: step s's A into stage st (cp.async; the caller commits and waits)
    auto fetch_a = [&](int st, int s) {
        const int c0 = s * H3_KC;
        __half *A = Ast(st);
        if constexpr (PS2) {
#pragma unroll
            for (int i = 0; i < NA; i++) {
                const int q = (tid >> 3) + 16 * i;
                if (q >= 16 * NT) continue;
                const bool ok = aoff[i] >= 0 && c0 + ach[i] < Cr;
                cp_async16z(h3_a<true>(A, q - ach[i] * NT, ach[i], tid & 7), ok ? wt + (long)c0 * 9 * M + aoff[i] : wt,
                            ok);   // (no row: zero-filled, nothing read)
            }
        } else {
            // one row of wt for all 9 taps, a tap apart: the test and the first tap's source once a
            // step, then a constant stride (forward Cr; DGRAD -M, its taps flipped)
            const bool ok = aoff[0] >= 0 && c0 + ach[0] < Cr;
            const __half *src = !ok ? wt : DGRAD ? wt + (long)c0 * 9 * M + aoff[0] : wt + aoff[0] + c0;
            const long step = !ok ? 0 : DGRAD ? -(long)M : (long)Cr;
#pragma unroll
            for (int i = 0; i < NA; i++)
                cp_async16z(DGRAD ? h3_a<true>(A, i, ach[0], tid & 7) : h3_a<false>(A, i, (tid >> 1) & 63, tid & 1),
                            src + i * step, ok);
        }
    };
    auto fetch = [&](int s) {   // step s's halo into registers (and ACT's BN for its channel)
        const int c0 = s * H3_KC, cc = c0 + halo.pc;
        halo.fetch_placed(cc < Cr ? inb + (long)cc * HWi : nullptr);
        if (ACT) {   // the two lanes of a pair stage one channel: the even one loads its BN, the odd one
                     // takes the folded pair by shuffle (half the parameter bytes)
            float2 f = make_float2(0.0f, 0.0f);
            if (halo.side == 0 && cc < Cr) f = bn_fold(a, cc);
            f.x = __shfl_sync(0xffffffffu, f.x, tid & 30);
            f.y = __shfl_sync(0xffffffffu, f.y, tid & 30);
            if (cc < Cr) bnf = f;
        }
    };
    // each warp: all 64 output channels (4 A tiles) by 32 pixels (2 B tiles of 16, fragments 2 warp, +1
    // of the tile's 8 runs of 16 pixels; S2: 2 A tiles), as mma.sync m16n8k16 products: per tap one
    // ldmatrix.x4 per B tile (the halo: its 16 pixels' two channel halves, serving 2 x WA
    // products) and one per A tile (forward: As row-major; DGRAD: Ad k-major, .trans)
    const int wa = WA == 4 ? 0 : (warp >> 1) * 2, wf = (WA == 4 ? warp : warp & 1) * 2;   // first A / B tile
    const int ln = tid & 31;
    float acc[WA][NJ][2][4];   // [A tile][B tile (PS2: 2 B tile + column parity)][8 pixels][accumulators]
#pragma unroll
    for (int i = 0; i < WA; i++)
#pragma unroll
        for (int j = 0; j < NJ; j++)
#pragma unroll
            for (int h = 0; h < 2; h++)
#pragma unroll
                for (int e = 0; e < 4; e++) acc[i][j][h][e] = 0.0f;
    // this lane's ldmatrix rows: B, pixel bpx of a tile, channel half bh; A forward, row arow, columns
    // acol ..; A DGRAD (k-major), k row bpx, columns 8 bh ..
    const int bpx = (ln & 7) + 8 * (ln >> 4), bh = (ln >> 3) & 1;
    const int arow = (ln & 7) + 8 * ((ln >> 3) & 1), acol = 8 * (ln >> 4);
    // a warp whose products cannot reach the output skips its K steps' products: its 32 pixels (PS2:
    // pixel pairs) all past the map's bottom (a 20-row map in 8-row tiles: 4 rows of the last), its
    // block outside the grid, or its first A tile's 16 channels at or past M (S2, whose warps split the
    // 64 channels in two: 32 or fewer left in the block; M is the output channels, or PS2's input
    // channels). Warp-uniform and fixed for the block: one branch per K step (not in the stride-2
    // forward's row tiles, nor in its 32-column tiles, since dropped, where it cost that loop 1.5
    // instructions per mma and pushed one variant past 128 registers on sm_80). At
    // stride 1 (each warp all 4 A tiles) A tile i is skipped where its 16 channels start at or past M
    // (a layer of 16, 32 or 80 channels in 64-channel blocks): one branch per A tile and tap, 1-1.3 PTX
    // instructions per mma (at stride 2, whose loop is the longer, not tried: a warp's second A tile is
    // multiplied even where it has no channels).
    // The products kept are the same ones in the same order, so every output is the same bits
    // (ROWS: the warp's first pixel inside the tile's rows)
    const bool any = (FS2 && ROWS) ||
                     (live && (ROWS ? 16 * wf < min(RT, OH - y0) * OW : y0 + wf / FPR < OH) && m0 + wa * 16 < M);
    const int na = S2 ? WA : min(WA, (M - m0 + 15) / 16);   // stride 1: the A tiles with channels
    // ROWS: where this lane's ldmatrix pixel of B tile j, 16 (wf + j) + bpx of the tile's RT x OW, lies
    // in the window, for tap (0, 0) (a pixel past the tile's reads its last one: its products are not
    // stored)
    int pb[2] = {0, 0};
    if constexpr (ROWS)
#pragma unroll
        for (int j = 0; j < 2; j++) pb[j] = Halo::row_pos(16 * (wf + j) + bpx, OW);
    // the producers: step s + 1's halo loads are in flight while the consumers may still hold its stage;
    // its A is copied once they have released it, while the halo is stored
    if (producer) {
        fetch(0);
        for (int s = 0; s < nsteps; s++) {
            const int st = s & 1;
            if (s >= 2) bar_sync_n(3 + st, 256);
            fetch_a(st, s);
            __pipeline_commit();
            halo.template store<ACT>(Bs(st), bnf);
            __pipeline_wait_prior(0);
            bar_arrive_n(1 + st, 256);
            if (s + 1 < nsteps) fetch(s + 1);
        }
        return;
    }
    // the consumers' K loop. FULL: no per-tile test (stride 1: every A tile of the warp has channels,
    // na == WA; stride 2: always); else a branch per A tile and tap skips those without. Two copies of
    // the loop, so that the blocks whose channels fill the tile (every block but the last of a layer
    // whose channels leave 48 or fewer in it) run no test (the kernel report reads the FULL loop; the
    // other costs 1-1.3 more PTX instructions per mma, sm_80-sm_90)
    auto kloop = [&](auto full) {
        constexpr bool FULL = decltype(full)::value;
        for (int s = 0; s < nsteps; s++) {
            const int st = s & 1;
            bar_sync_n(1 + st, 256);
            if (!any) {   // (the barriers still count the warp)
                if (s + 2 < nsteps) bar_arrive_n(3 + st, 256);
                continue;
            }
#pragma unroll
            for (int t = 0; t < 9; t++) {
                // the halo offset of tap t; PS2: the weight tap t reaches the input pixels of parity (py, px)
                // only where ky (kx) is 1 for an even row (column), 0 or 2 for an odd one, from dz row u + 1
                // (ky 0) or u (halo row r + 2 or r + 1): each tap serves one column parity, jp (a constant
                // once unrolled), and the rows of one parity; FS2: output row r reads halo row 2 r + ky
                int ky = t / 3, kx = t % 3;
                const int jp = PS2 && kx != 1 ? 1 : 0;
                if (PS2) {
                    if ((ky == 1) != (py == 0)) continue;   // block-uniform
                    ky = 1 + (ky == 0); kx = 1 + (kx == 0);
                }
                uint32_t fb[2][4];
#pragma unroll
                for (int j = 0; j < 2; j++) {
                    const int f = wf + j, r = f / FPR, sg = f - r * FPR;
                    const int p = ROWS ? pb[j] + ky * HC + Halo::col(kx) : (SH * r + ky) * HC + Halo::col(kx) + sg * 16 + bpx;
                    ldsm_x4(fb[j], Halo::at(Bs(st), p, 8 * bh));
                }
#pragma unroll
                for (int i = 0; i < WA; i++) {
                    if (!FULL && i >= na) break;
                    uint32_t fa[4];
                    if (DGRAD) ldsm_x4_t(fa, h3_a<true>(Ast(st), PS2 ? (t < 3 ? t : t - 3) : t, bpx, 2 * (wa + i) + bh));
                    else ldsm_x4(fa, h3_a<false>(Ast(st), t, (wa + i) * 16 + arow, acol / 8));
#pragma unroll
                    for (int j = 0; j < 2; j++)
#pragma unroll
                        for (int h = 0; h < 2; h++) {
                            const uint32_t bj[2] = {fb[j][2 * h], fb[j][2 * h + 1]};
                            mma_16816(acc[i][PS2 ? 2 * j + jp : j][h], fa, bj);
                        }
                }
            }
            if (s + 2 < nsteps) bar_arrive_n(3 + st, 256);   // (the producers wait for it only to write step s + 2)
        }
    };
    if constexpr (S2) kloop(std::true_type());
    else if (na == WA) kloop(std::true_type());
    else kloop(std::false_type());
    bar_sync_n(5, 128);   // every consumer is past the K loop: the epilogue's tiles overwrite stage 0's A
    // epilogue: each lane 8 consecutive pixels of one output row (16-byte stores where aligned), read
    // from the warp's tile as two 16-byte words: rows lane % 16 (cs: the 8 lanes of a phase hit 8
    // different bank groups), columns 8 (lane / 16). PS2: the two column parities' tiles
    // interleaved, 2 x 8 consecutive input pixels of a row per lane (16-byte stores where aligned)
    // part (the forward): the statistics of what the lane stores, merged over its two B tiles, then with
    // lane ^ 16 (the same row's other 8 columns), into the warp's pixel group's row of bst. part with DGRAD
    // (conv_dgrad_bn_cuda): the BN backward's sums (a: that BN's statistics and parameters, zb its z, in
    // dA's layout) of what the lane stores, added up the same way into bsm (bst's space)
    const int lane = tid % 32, er = lane % 16, ec = (lane / 16) * 8, N = g.B * OHW;
    const bool stats = !DGRAD && part, bsums = DGRAD && part;
    BnbSums *const bsm = (BnbSums *)bst;
#pragma unroll
    for (int i = 0; i < WA; i++) {
        BnTile cur = {0.0f, 0.0f, 0.0f};
        BnbSums bs = {0.0f, 0.0f};
        if (m0 + (wa + i) * 16 >= M) break;   // warp-uniform
        const int mi = m0 + (wa + i) * 16 + er;   // the lane's channel
        const float4 bp = bsums && live && mi < M ? bnb_par(a, mi) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
        for (int j = 0; j < 2; j++) {
#pragma unroll
            for (int q = 0; q < (PS2 ? 2 : 1); q++)   // the accumulators' rows ln / 4 (+ 8), columns 2 (ln % 4) (+ 1)
#pragma unroll
                for (int h = 0; h < 2; h++)
#pragma unroll
                    for (int e = 0; e < 4; e += 2)
                        *(float2 *)&Cs[warp][q][(ln >> 2) + 4 * e][cs((ln >> 2) + 4 * e, 8 * h + 2 * (ln & 3))] =
                            make_float2(acc[i][PS2 ? 2 * j + q : j][h][e], acc[i][PS2 ? 2 * j + q : j][h][e + 1]);
            __syncwarp();
            const int f = wf + j, r = f / FPR, sg = f - r * FPR;
            const int m = m0 + (wa + i) * 16 + er, y = y0 + r, x = x0 + sg * 16 + ec;
            if (PS2) {   // input row 2y + py: store h, lanes l and l + 16 the two halves of 16 input pixels
                         // from column 2 (x0 + 16 sg) + 16 h: one whole 32-byte sector per channel. ROWS:
                         // the lane's 4 pairs 16 f + p0 .. are one row's (OW a multiple of 4)
                if (live && m < M && (ROWS || y < OH)) {
                    const int sub = lane / 16;
#pragma unroll 1
                    for (int h = 0; h < 2; h++) {
                        const int p0 = 8 * h + 4 * sub, q = 16 * f + p0, rq = ROWS ? q / OW : 0;
                        const int iy = 2 * (ROWS ? y0 + rq : y) + py;
                        const int c0 = ROWS ? 2 * (q - rq * OW) : 2 * (x0 + sg * 16) + 16 * h + 8 * sub;
                        if (ROWS && q >= min(RT, OH - y0) * OW) break;
                        // the two parities' 4 pixels as one 16-byte word each (p0 a multiple of 4; cs:
                        // the 8 lanes of a phase in 8 bank groups), interleaved (4-byte reads here had put
                        // lanes er, er + 8 and the other sub's in one bank: 4 passes each)
                        const float4 u0 = *(const float4 *)&Cs[warp][0][er][cs(er, p0)],
                                     u1 = *(const float4 *)&Cs[warp][1][er][cs(er, p0)];
                        float v[8] = {u0.x, u1.x, u0.y, u1.y, u0.z, u1.z, u0.w, u1.w};
                        conv_store_row8(of, oh, v, m, b, iy * W, c0, W, N, HW, g.fHW, os, accumulate);
                        if (bsums) bnb_add8(bs, zb, b * os + (long)m * HW + iy * W + c0, v, min(W - c0, 8), bp);
                    }
                }
            } else {
                // the lane's 8 pixels: columns xs .. of the wl-wide row that starts at pixel rb; ROWS: the
                // tile's pixels 16 f + ec .. are the image's y0 OW + 16 f + ec .. (its rows are whole)
                const int rb = ROWS ? y0 * OW : y * OW, xs = ROWS ? 16 * f + ec : x,
                          wl = ROWS ? min(RT, OH - y0) * OW : OW;
                if (live && m < M && (ROWS || y < OH) && xs < wl) {
                    float v[8], bm = !DGRAD && bias ? bias[m] : 0.0f;
                    const float4 q0 = *(const float4 *)&Cs[warp][0][er][cs(er, ec)],
                                 q1 = *(const float4 *)&Cs[warp][0][er][cs(er, ec + 4)];
                    v[0] = q0.x + bm; v[1] = q0.y + bm; v[2] = q0.z + bm; v[3] = q0.w + bm;
                    v[4] = q1.x + bm; v[5] = q1.y + bm; v[6] = q1.z + bm; v[7] = q1.w + bm;
                    conv_store_row8(of, oh, v, m, b, rb, xs, wl, N, OHW, FS2 ? g.fHWo : g.fHW, os, accumulate);   // OW % 8 == 4: a row's last 4
                    if (stats) cur = bn_tile_merge(cur, bn_tile8(v, min(wl - xs, 8)));
                    if (bsums) bnb_add8(bs, zb, b * os + (long)m * OHW + rb + xs, v, min(wl - xs, 8), bp);
                }
            }
            __syncwarp();
        }
        if (stats) {
            const BnTile t = bn_tile_xor16(cur);
            if (lane < 16) bst[(WA == 4 ? warp : warp & 1) * 64 + (wa + i) * 16 + lane] = t;
        }
        if (bsums) {   // (a + b in one lane, b + a in the other: the same bits)
            bs.g += __shfl_xor_sync(0xffffffffu, bs.g, 16);
            bs.gx += __shfl_xor_sync(0xffffffffu, bs.gx, 16);
            if (lane < 16) bsm[(WA == 4 ? warp : warp & 1) * 64 + (wa + i) * 16 + lane] = bs;
        }
    }
    if (stats) {
        bar_sync_n(5, 128);
        bn_tiles_out<WA == 4 ? 4 : 2>(bst, m0, M, part);
    }
    if (bsums) {   // the block's tile: blockIdx.x of gridDim.x, in parity blockIdx.z (PS2)
        bar_sync_n(5, 128);
        bnb_sums_out<WA == 4 ? 4 : 2>(bsm, m0, M, part, (long)gridDim.x * gridDim.z,
                                      (long)blockIdx.z * gridDim.x + blockIdx.x);
    }
}
// conv_halo_vw: the halves per halo load for this conv (8: the input's rows of Win, its image stride and
// pointer allow 16-byte loads; 4: 8-byte ones), or 0: not a 3x3 conv of stride <= smax, or its rows cannot
// be loaded 4 halves at a time, or the channels that index A's rows are not a multiple of 8, or the
// weights w (nullptr: a kernel that does not read them) are not 16-byte aligned: the gather kernels take it
static int conv_halo_vw(const ConvGeo &g, long is, const void *in, const void *w, int Cm, int Win, int smax) {
    if (g.K != 3 || g.S > smax || Cm % 8 || (uintptr_t)w % 16) return 0;
    if (Win % 8 == 0 && is % 8 == 0 && (uintptr_t)in % 16 == 0) return 8;
    if (Win % 4 == 0 && is % 4 == 0 && (uintptr_t)in % 8 == 0) return 4;
    return 0;
}
// conv_halo_tc: the tile width for a W x H map (16 or 32 columns, bn / TC rows): the one that computes
// the fewest pixels past the map's edges, the narrower on a tie (its halo is smaller: 18 x 10 positions
// against 34 x 6 for 128 pixels at stride 1; at stride 2, 33 x 9 against 65 x 5 for 64)
static int conv_halo_tc(int W, int H, int bn = H3_BN) {
    long c16 = (long)cdiv(W, 16) * 16 * cdiv(H, bn / 16) * (bn / 16), c32 = (long)cdiv(W, 32) * 32 * cdiv(H, bn / 32) * (bn / 32);
    return c32 < c16 ? 32 : 16;
}
// conv_halo_rows: the rows of a row tile on an OW x OH map where they make fewer tiles a map than the
// column tiles' ctiles, else 0, and in *tc its columns: stride 2, H3_ROW_RT rows of H3_ROW_TC; stride 1
// with 8-byte pieces (vw 4), H3_ROW_RT1 rows of H3_ROW_TC, with 16-byte ones (vw 8), H3_ROW_RT40 rows of
// H3_ROW_TC40; only on maps at most the columns they stage wide, their rows whole pieces (stride 2: a
// multiple of 4, whole pixel pairs and 8-byte pieces of dz; the forward's 16-byte pieces of x give that
// too). vw: the pieces the kernel would load (stride 2: of dz for the input and weight gradients, of x
// for the forward). Maps at least 16 wide (on narrower ones a column tile's more rows make no more
// tiles; conv_halo_wgrad_kernel steps 16 pixels at most one row on). The one choice of conv_halo_grid
// and conv_wgrad_cuda
static int conv_halo_rows(int OW, int OH, long ctiles, int stride, int vw, int *tc) {
    const bool wide = stride == 1 && vw == 8;
    *tc = wide ? H3_ROW_TC40 : H3_ROW_TC;
    const bool fits = OW >= 16 && OW <= *tc && OW % (wide ? 8 : 4) == 0;
    const int rt = h3_row_rt(stride == 2, *tc);
    return fits && cdiv(OH, rt) < ctiles ? rt : 0;
}
// conv_halo_grid: conv_halo_launch's grid and tile columns (*tc: 16 or 32, or a row tile's H3_ROW_TC or
// H3_ROW_TC40, taken where they compute the fewest pixels: at stride 2 the forward with 16-byte pieces
// of x (vw 8), the input gradient with 8-byte ones of dz (vw 4: its 20-wide rows) on rows of pairs a
// multiple of 4; at stride 1 20 columns with 8-byte pieces (vw 4), 40 with 16-byte ones, which take
// them on 20- and 40-wide maps (on narrower ones 16- or 32-column tiles are as few or fewer))
static dim3 conv_halo_grid(const ConvGeo &g, bool dgrad, int vw, int *tc) {
    bool s2 = g.S == 2;   // dgrad: the two row parities of the input pixels, grid.z, pixel pairs; forward: Ho x Wo
    int OW = s2 ? dgrad ? (g.W + 1) / 2 : g.Wo : g.W, OH = s2 ? dgrad ? (g.H + 1) / 2 : g.Ho : g.H;
    int bn = s2 ? 64 : H3_BN, tr;   // conv_halo_kernel's BNK
    // (the stride-2 forward takes 16 columns, or row tiles, as the stride-2 weight gradient does: its
    // 32-column tiles, 2 rows of a 65-wide window, fit 64 KB only at a 32-byte pitch, swizzled, and ran
    // 15.4 PTX instructions per HMMA with BN+SiLU where the 16-column tiles run 10.8, 10.4 without where
    // they run 5.7-6.0 (sm_80): the 16-column tiles' extra rows, where a map's height made those fewer,
    // cost less than that)
    *tc = s2 && !dgrad ? 16 : conv_halo_tc(OW, OH, bn);
    tr = bn / *tc;
    int rtc = 0;
    if (const int rt = !s2 || vw == (dgrad ? 4 : 8) ? conv_halo_rows(OW, OH, (long)cdiv(OW, *tc) * cdiv(OH, tr), g.S, vw, &rtc) : 0) {
        *tc = rtc;
        return dim3(g.B * cdiv(OH, rt), cdiv(dgrad ? g.Cin : g.Cout, H3_BM), s2 && dgrad ? 2 : 1);
    }
    return dim3(g.B * cdiv(OW, *tc) * cdiv(OH, tr), cdiv(dgrad ? g.Cin : g.Cout, H3_BM), s2 && dgrad ? 2 : 1);
}
// h3_smem: the dynamic shared memory of a conv_halo_kernel variant (over the 48 KB a launch gets without
// asking), its limit raised once per device
template <bool ACT, bool DGRAD, bool S2, int TC, int VW> static size_t h3_smem() {
    constexpr size_t bytes = H3Shape<DGRAD, S2, TC, VW>::BYTES;
    static unsigned char raised[64];
    int dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    if (dev < 0 || dev >= 64 || !raised[dev]) {
        CUDA_CHECK(cudaFuncSetAttribute(conv_halo_kernel<ACT, DGRAD, S2, TC, VW>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        (int)bytes));
        if (dev >= 0 && dev < 64) raised[dev] = 1;
    }
    return bytes;
}
// conv_halo_launch: every variant launched by its literal name (the emulator's launch log and the
// kernel report name kernels that way)
static void conv_halo_launch(const ConvGeo &g, int vw, bool act, bool dgrad, const __half *in, const ConvAct &a,
                             const __half *wt, const float *bias, float *of, __half *oh, int accumulate, cudaStream_t s,
                             float *part = nullptr, const __half *zb = nullptr) {
    int tc;
    dim3 grid = conv_halo_grid(g, dgrad, vw, &tc);
    bool s2 = g.S == 2;
    static_assert(H3_ROW_TC == 20 && H3_ROW_TC40 == 40, "the row tiles' launches below name their TC");
    if (tc == H3_ROW_TC40) {   // stride 1's 40-column row tiles (16-byte pieces)
        if (dgrad) conv_halo_kernel<false, true, false, 40, 8><<<grid, 256, h3_smem<false, true, false, 40, 8>(), s>>>(g, in, a, wt, bias, of, oh, accumulate, part, zb);
        else if (act) conv_halo_kernel<true, false, false, 40, 8><<<grid, 256, h3_smem<true, false, false, 40, 8>(), s>>>(g, in, a, wt, bias, of, oh, accumulate, part, zb);
        else conv_halo_kernel<false, false, false, 40, 8><<<grid, 256, h3_smem<false, false, false, 40, 8>(), s>>>(g, in, a, wt, bias, of, oh, accumulate, part, zb);
        CUDA_CHECK(cudaGetLastError());
        return;
    }
    if (tc == H3_ROW_TC && !s2) {   // stride 1's row tiles (8-byte pieces)
        if (dgrad) conv_halo_kernel<false, true, false, 20, 4><<<grid, 256, h3_smem<false, true, false, 20, 4>(), s>>>(g, in, a, wt, bias, of, oh, accumulate, part, zb);
        else if (act) conv_halo_kernel<true, false, false, 20, 4><<<grid, 256, h3_smem<true, false, false, 20, 4>(), s>>>(g, in, a, wt, bias, of, oh, accumulate, part, zb);
        else conv_halo_kernel<false, false, false, 20, 4><<<grid, 256, h3_smem<false, false, false, 20, 4>(), s>>>(g, in, a, wt, bias, of, oh, accumulate, part, zb);
        CUDA_CHECK(cudaGetLastError());
        return;
    }
    if (tc == H3_ROW_TC) {   // stride 2's row tiles (the forward's 16-byte pieces, the input gradient's 8-byte)
        if (dgrad) conv_halo_kernel<false, true, true, 20, 4><<<grid, 256, h3_smem<false, true, true, 20, 4>(), s>>>(g, in, a, wt, bias, of, oh, accumulate, part, zb);
        else if (act) conv_halo_kernel<true, false, true, 20, 8><<<grid, 256, h3_smem<true, false, true, 20, 8>(), s>>>(g, in, a, wt, bias, of, oh, accumulate, part, zb);
        else conv_halo_kernel<false, false, true, 20, 8><<<grid, 256, h3_smem<false, false, true, 20, 8>(), s>>>(g, in, a, wt, bias, of, oh, accumulate, part, zb);
        CUDA_CHECK(cudaGetLastError());
        return;
    }
    switch ((s2 ? dgrad ? 12 : act ? 20 : 16 : dgrad ? 8 : act ? 4 : 0) | (tc == 32 ? 2 : 0) | (vw == 8 ? 1 : 0)) {
    case 0: conv_halo_kernel<false, false, false, 16, 4><<<grid, 256, h3_smem<false, false, false, 16, 4>(), s>>>(g, in, a, wt, bias, of, oh, accumulate, part, zb); break;
    case 1: conv_halo_kernel<false, false, false, 16, 8><<<grid, 256, h3_smem<false, false, false, 16, 8>(), s>>>(g, in, a, wt, bias, of, oh, accumulate, part, zb); break;
    case 2: conv_halo_kernel<false, false, false, 32, 4><<<grid, 256, h3_smem<false, false, false, 32, 4>(), s>>>(g, in, a, wt, bias, of, oh, accumulate, part, zb); break;
    case 3: conv_halo_kernel<false, false, false, 32, 8><<<grid, 256, h3_smem<false, false, false, 32, 8>(), s>>>(g, in, a, wt, bias, of, oh, accumulate, part, zb); break;
    case 4: conv_halo_kernel<true, false, false, 16, 4><<<grid, 256, h3_smem<true, false, false, 16, 4>(), s>>>(g, in, a, wt, bias, of, oh, accumulate, part, zb); break;
    case 5: conv_halo_kernel<true, false, false, 16, 8><<<grid, 256, h3_smem<true, false, false, 16, 8>(), s>>>(g, in, a, wt, bias, of, oh, accumulate, part, zb); break;
    case 6: conv_halo_kernel<true, false, false, 32, 4><<<grid, 256, h3_smem<true, false, false, 32, 4>(), s>>>(g, in, a, wt, bias, of, oh, accumulate, part, zb); break;
    case 7: conv_halo_kernel<true, false, false, 32, 8><<<grid, 256, h3_smem<true, false, false, 32, 8>(), s>>>(g, in, a, wt, bias, of, oh, accumulate, part, zb); break;
    case 8: conv_halo_kernel<false, true, false, 16, 4><<<grid, 256, h3_smem<false, true, false, 16, 4>(), s>>>(g, in, a, wt, bias, of, oh, accumulate, part, zb); break;
    case 9: conv_halo_kernel<false, true, false, 16, 8><<<grid, 256, h3_smem<false, true, false, 16, 8>(), s>>>(g, in, a, wt, bias, of, oh, accumulate, part, zb); break;
    case 10: conv_halo_kernel<false, true, false, 32, 4><<<grid, 256, h3_smem<false, true, false, 32, 4>(), s>>>(g, in, a, wt, bias, of, oh, accumulate, part, zb); break;
    case 11: conv_halo_kernel<false, true, false, 32, 8><<<grid, 256, h3_smem<false, true, false, 32, 8>(), s>>>(g, in, a, wt, bias, of, oh, accumulate, part, zb); break;
    case 12: conv_halo_kernel<false, true, true, 16, 4><<<grid, 256, h3_smem<false, true, true, 16, 4>(), s>>>(g, in, a, wt, bias, of, oh, accumulate, part, zb); break;
    case 13: conv_halo_kernel<false, true, true, 16, 8><<<grid, 256, h3_smem<false, true, true, 16, 8>(), s>>>(g, in, a, wt, bias, of, oh, accumulate, part, zb); break;
    case 14: conv_halo_kernel<false, true, true, 32, 4><<<grid, 256, h3_smem<false, true, true, 32, 4>(), s>>>(g, in, a, wt, bias, of, oh, accumulate, part, zb); break;
    case 15: conv_halo_kernel<false, true, true, 32, 8><<<grid, 256, h3_smem<false, true, true, 32, 8>(), s>>>(g, in, a, wt, bias, of, oh, accumulate, part, zb); break;
    case 16: conv_halo_kernel<false, false, true, 16, 4><<<grid, 256, h3_smem<false, false, true, 16, 4>(), s>>>(g, in, a, wt, bias, of, oh, accumulate, part, zb); break;
    case 17: conv_halo_kernel<false, false, true, 16, 8><<<grid, 256, h3_smem<false, false, true, 16, 8>(), s>>>(g, in, a, wt, bias, of, oh, accumulate, part, zb); break;
    case 20: conv_halo_kernel<true, false, true, 16, 4><<<grid, 256, h3_smem<true, false, true, 16, 4>(), s>>>(g, in, a, wt, bias, of, oh, accumulate, part, zb); break;
    default: conv_halo_kernel<true, false, true, 16, 8><<<grid, 256, h3_smem<true, false, true, 16, 8>(), s>>>(g, in, a, wt, bias, of, oh, accumulate, part, zb); break;
    }   // (the stride-2 forward has no 32-column tiles: conv_halo_grid)
    CUDA_CHECK(cudaGetLastError());
}

// conv_fwd_kernel: z = w col(x) (+ bias), a 64x64 tile of (Cout, B*Ho*Wo) per block; nothing is divided
// inside the K loop:
//   - each thread's output pixel (b, oy, ox) is decoded once per block; the 32 taps k = (ci, ky, kx)
//     of a K step are decoded by 32 threads into a shared table (offset ci*H*W + ky*W + kx, ky, kx,
//     and for ACT the producer's BN folded to a scale and shift per channel), one K step ahead; BVEC
//     (tap k is channel k) decodes none, and with ACT folds every channel's BN into ig_fold before the
//     K loop;
//   - w rows are contiguous along Kd: AVEC (Kd % 8 == 0, w 16-byte aligned) moves them with 16-byte
//     cp.async (cp_async16z: zeros past the edges, nothing read);
//   - BVEC (1x1, stride 1, H*W, the image stride and x all multiples of 8 halves): the col rows are
//     rows of x, 8 pixels of one image per 16-byte load (cp.async; through registers when ACT
//     applies BN+SiLU on the way), w and x from running pointers; otherwise every element is gathered
//     through the tap table;
//   - two shared stages: step s+1 is in flight (cp.async, or gathered into registers) while step s
//     is multiplied, so each K step ends in a single barrier (BVEC: two steps a loop trip, conv_k_loop's
//     U);
//   - the epilogue writes 8 consecutive outputs of a row per lane, as 16-byte stores where aligned.
// Every output is the sum of the same FP16 products in the same K order as the generic tile loop this
// replaced, the ACT element the same bn_silu_value rounding, so results match the twin as before.
struct __align__(16) ConvTap { int off, ky, kx, pad_; };   // one 16-byte shared load per gathered element
// IG_ACT_FWD_BLOCKS, IG_ACT_WGRAD_BLOCKS: the blocks an SM the 1x1 BN+SiLU variants (ACT, BVEC) of
// conv_fwd_kernel and conv_wgrad_kernel ask registers for, none spilling: 6 (80 registers), but the
// forward on sm_90, which asks none (it takes 80; asked 6 it spilled). At 72 registers, 7 blocks on
// sm_90, both spill since they run two K steps a loop trip without per-step tests (they had, at 15.8 and
// 14.4 PTX instructions per HMMA against 11.9 and 11.9). (On sm_86 and sm_89 shared memory holds 3 blocks
// an SM either way.) 0, none asked, on sm_75 and for the other variants (an explicit 1 lets ptxas take
// 96-114 registers where it takes 71-107 unasked)
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define IG_ACT_FWD_BLOCKS 0
#define IG_ACT_WGRAD_BLOCKS 6
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define IG_ACT_FWD_BLOCKS 6
#define IG_ACT_WGRAD_BLOCKS 6
#else
#define IG_ACT_FWD_BLOCKS 0
#define IG_ACT_WGRAD_BLOCKS 0
#endif
#define IG_FOLD_MAX 2048   // conv_fwd_kernel's BN table: 16 KB at most, beside its 24 KB of static shared memory
// PARTS (with ACT, BVEC, AVEC: conv_forward_parts_cuda): x is a concatenation read in place, ConvParts pp,
// every part but the last a multiple of 32 channels (IG_BK: a K step lies in one part), the last of 16.
// The K loop runs once a part, from a running source as BVEC's (the pipeline drained between parts: n
// at most CONV_PARTS_MAX), with BN+SiLU (ACT's path, ig_fold holding each channel's scale and shift
// from its part's BN) or without (cp.async, as the plain kernel): each loop is that of a kernel without
// PARTS. The weights' running source goes on across the parts, which follow each other in Kd.
template <bool ACT, bool BVEC, bool AVEC, bool PARTS = false>
__global__ __launch_bounds__(128, BVEC && ACT ? IG_ACT_FWD_BLOCKS : 0)
void conv_fwd_kernel(ConvGeo g, const __half *x, ConvAct a, const __half *w, const float *bias, float *z, __half *zh,
                     float *part, ConvParts pp) {
    using namespace nvcuda;
    static_assert(!PARTS || (ACT && BVEC && AVEC), "a concatenation's parts are read as BVEC with ACT");
    __shared__ __align__(128) __half As[2][IG_BM][IG_BK + 8];   // (stage, 64 rows of Cout, 32 of Kd)
    __shared__ __align__(128) __half Bs[2][IG_BK][IG_BN + 8];   // (stage, 32 of Kd, 64 of B*Ho*Wo)
    __shared__ ConvTap tap[2][IG_BK];                           // the taps of a K step
    __shared__ float2 tbn[2][IG_BK];                            // ACT: BN scale and shift of the tap's channel
    __shared__ __align__(32) float Cs[4][16][CS_LD];
    extern __shared__ float2 ig_fold[];   // BVEC and ACT: each channel's BN scale and shift (nsteps * 32)
    const int tid = threadIdx.x, warp = tid / 32, wy = warp / 2, wx = warp % 2;
    const int M = g.Cout, Kd = g.Cin * g.KK, HW = g.H * g.W, HWo = g.Ho * g.Wo, N = g.B * HWo;
    const int row0 = blockIdx.y * IG_BM, col0 = blockIdx.x * IG_BN, nsteps = (Kd + IG_BK - 1) / IG_BK;
    const __half hzero = __float2half(0.0f);
    // BVEC and ACT (1x1: tap k is channel k, and only its BN is read): the table of every channel's BN
    // before the K loop (whose first barrier is behind it), (0, 0) past Kd, so that no K step decodes
    // taps or tests its rows (see fetch_b)
    if (PARTS) {
        for (int k = tid; k < nsteps * IG_BK; k += 128) {
            int i = 0, c0 = 0;
            while (i + 1 < pp.n && c0 + pp.C[i] <= k) c0 += pp.C[i++];
            ig_fold[k] = k < Kd && pp.act[i] ? bn_fold(pp.acts[i], k - c0) : make_float2(0.0f, 0.0f);
        }
    } else if (BVEC && ACT)
        for (int k = tid; k < nsteps * IG_BK; k += 128) ig_fold[k] = k < Kd ? bn_fold(a, k) : make_float2(0.0f, 0.0f);
    // the tap table of step s into slot s & 1 (threads 0..31); a tap past Kd gets ky out of every image
    auto taps = [&](int s) {
        if (tid < IG_BK) {
            const int k = s * IG_BK + tid;
            if (BVEC) return;
            int ci = div_fast(k, g.fKK), kk = k - ci * g.KK, ky = div_fast(kk, g.fK);
            ConvTap t = {ci * HW + ky * g.W + (kk - ky * g.K), k < Kd ? ky : 1 << 24, kk - ky * g.K, 0};
            tap[s & 1][tid] = t;
            if (ACT) tbn[s & 1][tid] = k < Kd ? bn_fold(a, ci) : make_float2(0.0f, 0.0f);
        }
    };
    int sbase = 0;   // PARTS: the K step (of all Kd) of the part's first
    // A (w, Cout x Kd row-major): AVEC 2 x 16 bytes per thread by cp.async, else element by element
    const int ar = ig_row4(tid), ac = (tid % 4) * 8;
    // AVEC: the thread's two rows (row0 + ar, + 32) tested once; with BVEC their source a running pointer,
    // moved 32 columns a step (load_a takes the steps in order, each once; the gathered variants compute
    // it each step: held, it cost them registers on sm_90)
    const bool am[2] = {row0 + ar < M, row0 + ar + 32 < M};
    const __half *asrc = w + ((long)(am[0] ? row0 + ar : 0) * Kd + ac);
    auto load_a = [&](int s) {
        int k0 = ((PARTS ? sbase : 0) + s) * IG_BK;
        if (AVEC) {
            const bool kok = k0 + ac < Kd;
#pragma unroll
            for (int i = 0; i < 2; i++) {
                const bool ok = am[i] && kok;   // (else 16 zero bytes, nothing read)
                const __half *src =
                    BVEC ? asrc + (i ? 32L * Kd : 0L) : w + ((long)(row0 + ar + 32 * i) * Kd + k0 + ac);
                cp_async16z(&As[s & 1][ar + 32 * i][ac], ok ? src : w, ok);
            }
            if (BVEC) asrc += IG_BK;
        } else {
            for (int t = tid; t < IG_BM * IG_BK; t += 128) {
                int r = t / IG_BK, c = t % IG_BK, m = row0 + r, k = k0 + c;
                As[s & 1][r][c] = (m < M && k < Kd) ? w[(long)m * Kd + k] : hzero;
            }
        }
    };
    // B, BVEC: thread t moves 8 pixels (columns bc..bc+7) of rows br and br + 16
    const int br = tid / 8, bc = (tid % 8) * 8;
    const __half *bsrc = x;   // BVEC: row br of the thread's 8 pixels (rows past Kd are never read)
    const __half *bact = x;   // BVEC and ACT: row Kd - 1 of them, what a row past Kd reads
    bool bvok = false;
    long pimg = 0, ppix = 0;   // PARTS: the image and pixel of the thread's 8 (0, 0 past N)
    // B, gathered: thread t owns column gc and rows gr + 2j, j < 16
    const int gc = tid % IG_BN, gr = tid / IG_BN;
    const __half *xb = x;   // x at the (possibly padded) top-left input pixel of the thread's output pixel
    int giy = 0, gix = 0;
    {
        int n = col0 + (BVEC ? bc : gc), b = div_fast(n, g.fHWo), p = n - b * HWo;
        if (BVEC && n < N) bvok = true, bsrc = x + (b * g.xs + p + (long)br * HW);
        if (PARTS && n < N) pimg = b, ppix = p;
        if (BVEC && ACT) bact = (bvok ? bsrc - (long)br * HW : x) + (long)(Kd - 1) * HW;
        if (!BVEC) {
            int oy = div_fast(p, g.fWo), ox = p - oy * g.Wo;
            giy = n < N ? oy * g.S - g.pad : -(1 << 26); gix = ox * g.S - g.pad;
            xb = n < N ? x + b * g.xs + giy * g.W + gix : x;
        }
    }
    union { uint4 u[2]; __half h[16]; } gv;   // gathered (or ACT vector) values of the next step, stored after the mma
    // fetch_bv: BVEC's rows k0 + br and k0 + br + 16 of x, from a running source moved 32 rows a step
    // (fetch_b takes the steps in order, each once); A: through registers, BN+SiLU applied (ACT, or a
    // BN part of PARTS), else by cp.async
    auto fetch_bv = [&](int s, auto a_c) {
        constexpr bool A = decltype(a_c)::value;
        int k0 = ((PARTS ? sbase : 0) + s) * IG_BK;
#pragma unroll
        for (int i = 0; i < 2; i++) {
            int r = br + 16 * i, k = k0 + r;
            bool ok = bvok && k < Kd;
            const __half *src = i ? bsrc + 16L * HW : bsrc;
            if (!A) {
                cp_async16z(&Bs[s & 1][r][bc], ok ? src : x, ok);
            } else {
                // no test: a row past Kd reads row Kd - 1 of the same pixels (bact) with the scale and
                // shift (0, 0), so 0 (x 0 + 0; an x that is not finite gives NaN, in columns whose products
                // read it anyway: the same outputs are not finite as before, NaN where one may have been
                // inf); pixels past N (not bvok) read image 0's first, columns the epilogue drops
                const float2 bn = ig_fold[k];
                gv.u[i] = bn_silu8(*(const uint4 *)(k < Kd ? src : bact), bn.x, bn.y);
            }
        }
        bsrc += (long)IG_BK * HW;
    };
    auto fetch_b = [&](int s) {   // global -> registers (gathered, or ACT vectors), or cp.async (BVEC, no ACT)
        if (BVEC) {
            fetch_bv(s, std::integral_constant<bool, ACT>());
        } else {
#pragma unroll
            for (int j = 0; j < 16; j++) {
                int r = gr + 2 * j;
                ConvTap t = tap[s & 1][r];
                int iy = giy + t.ky, ix = gix + t.kx;
                __half v = hzero;
                if ((unsigned)iy < (unsigned)g.H && (unsigned)ix < (unsigned)g.W) {
                    v = xb[t.off];
                    if (ACT) {
                        float2 bn = tbn[s & 1][r];
                        v = __float2half(bn_silu_folded(__half2float(v), bn.x, bn.y));
                    }
                }
                gv.h[j] = v;
            }
        }
    };
    auto store_b = [&](int s) {   // registers -> shared stage s & 1
        if (BVEC) {
            if (ACT) {   // (PARTS: a BN part's loop; the others store nothing, their copies cp.async)
#pragma unroll
                for (int i = 0; i < 2; i++) *(uint4 *)&Bs[s & 1][br + 16 * i][bc] = gv.u[i];
            }
        } else {
#pragma unroll
            for (int j = 0; j < 16; j++) Bs[s & 1][gr + 2 * j][gc] = gv.h[j];
        }
    };

    ConvAcc acc[2][2];
    conv_warp_zero(acc);
    auto mma = [&](int s) {
        conv_warp_step<wmma::row_major, wmma::row_major>(
            acc, [&](int i, int kk) { return &As[s & 1][wy * 32 + i * 16][kk]; }, IG_BK + 8,
            [&](int j, int kk) { return &Bs[s & 1][kk][wx * 32 + j * 16]; }, IG_BN + 8);
    };
    if constexpr (PARTS) {
        for (int i = 0, c0 = 0; i < pp.n; c0 += pp.C[i++]) {   // part i: channels c0 .. of Kd, steps from sbase
            const __half *px = x + ((const __half *)pp.x[i] - x);   // (x + an offset: a global address)
            const long o = bvok ? pimg * pp.xs[i] + ppix : 0;
            bsrc = px + o + (long)br * HW;
            bact = px + o + (long)(pp.C[i] - 1) * HW;
            sbase = c0 / IG_BK;
            const int steps = (pp.C[i] + IG_BK - 1) / IG_BK;
            if (pp.act[i])
                conv_k_loop<2>(steps, taps, [&](int s) { load_a(s); fetch_bv(s, std::true_type()); }, store_b, mma);
            else
                conv_k_loop<2>(steps, taps, [&](int s) { load_a(s); fetch_bv(s, std::false_type()); }, [](int) {}, mma);
        }
    } else conv_k_loop<BVEC ? 2 : 1>(nsteps, taps, [&](int s) { load_a(s); fetch_b(s); }, store_b, mma);
    // part: the statistics of what each lane stores, merged over its row's two 16-column tiles, then with
    // lane ^ 16's, into the warp's column half (pixel group wx) of bst (in As: the K loop's last barrier is
    // behind it); the block's after a barrier
    static_assert(sizeof(As) >= 2 * 64 * sizeof(BnTile), "the statistics' groups fit in As");
    BnTile *bst = (BnTile *)&As[0][0][0];
    BnTile cur = {0.0f, 0.0f, 0.0f};
    conv_warp_store(acc, Cs[warp], row0 + wy * 32, col0 + wx * 32, [&](int m, int n, const float *c) {
        if (m >= M || n >= N) return;
        float bm = bias ? bias[m] : 0.0f, v[8];
#pragma unroll
        for (int e = 0; e < 8; e++) v[e] = bias ? c[e] + bm : c[e];
        conv_store8(z, zh, v, m, n, N, HWo, g.fHWo, g.zs, 0);
        if (part) cur = bn_tile_merge(cur, bn_tile8(v, min(N - n, 8)));
    }, [&](int i) {
        if (!part) return;
        const BnTile t = bn_tile_xor16(cur);
        if (tid % 32 < 16) bst[wx * 64 + wy * 32 + i * 16 + tid % 32] = t;
        cur = {0.0f, 0.0f, 0.0f};
    });
    if (part) {
        __syncthreads();
        bn_tiles_out<2>(bst, row0, M, part);
    }
}
// ------------------------------------------------------------------------------------------
// the stem: 3 input channels, 3x3, stride 2
// ------------------------------------------------------------------------------------------
#define STEM_PX 32                 // output pixels of a warp's chunk (one row)
#define STEM_DP (STEM_PX + 8)      // dz tile pitch (halves): 80 bytes, ldmatrix rows in 8 bank groups
#define STEM_PP (2 * STEM_PX + 8)  // window pitch (halves): columns 2 ox0 - 8 .. 2 ox0 + 63
// StemWin: a lane's share of staging the input window of a chunk (output row oy of image b, pixels ox0 ..
// ox0 + 31): x's 3 channels x 3 rows (2 oy - 1 ..) x 72 columns (2 ox0 - 8 ..), as 81 pieces of 8 values;
// lane l takes pieces q = l + 32 i < 81 (row q / 9 = 3 ci + ky, columns 8 (q % 9)), their offsets fixed.
// x is the uint8 batch (ConvDims.x8): fetch loads a piece's 8 bytes into registers (zeros past the
// image: a piece lies wholly inside or outside, W and the columns being multiples of 8), store writes
// them into the window as 8 halves v * (1/255), the bits u8_to_f16_cuda stores (so the products are
// those of the FP16 input the step once converted the batch into, at half the bytes read and without
// that copy). The window's rows are 16-byte aligned: one shared store a piece.
// u8_unit: byte e of w times 1/255, RN(v * c) with c = 1/255 in float, the bits of (float)v * c: the byte
// put into the low bits of 2^23 (one byte permute: the float 2^23 + v, exactly), then fma(2^23 + v, c,
// -2^23 c), whose exact value is v c (2^23 c is exact, a power of two apart from c) rounded once. Two
// PTX instructions a value, where the byte's extraction, its conversion and the product took four.
__device__ __forceinline__ float u8_unit(uint32_t w, int e) {
    const float c = 1.f / 255.f;
    return fmaf(__uint_as_float(__byte_perm(w, 0x4B000000u, 0x7540u + e)), c, -8388608.f * c);
}
// u8_pair_unit: bytes 2p and 2p + 1 of w as a half2 of v * (1/255), the bits of u8_unit's values rounded to
// FP16, in four PTX instructions a pair where the two u8_unit and the conversion took seven: a byte permute
// puts each byte in the low bits of 1024 (the half 1024 + v, exactly), 1024 is taken off, and one fused
// multiply-add forms v c16 + v 2^-24, rounded once: c16 is 1/255 in FP16 (2^-8 + 2^-16; v c16 alone rounds
// 10 of the 256 bytes otherwise) and v 2^-24 the FP16 subnormal whose bits are v (the second permute). v
// (2^-8 + 2^-16 + 2^-24) lies just over v 2^-32 below v / 255 and rounds as it does for every byte
// (test/emu_selftest.cu checks all 256)
__device__ __forceinline__ __half2 u8_pair_unit(uint32_t w, int p) {
    union { uint32_t u; __half2 h; } big, sub, k1024, c16;
    big.u = __byte_perm(w, 0x64646464u, p ? 0x4342u : 0x4140u);
    sub.u = __byte_perm(w, 0u, p ? 0x4342u : 0x4140u);
    k1024.u = 0x64006400u, c16.u = 0x1C041C04u;
    return __hfma2(__hsub2(big.h, k1024.h), c16.h, sub.h);
}
struct StemWin {
    int ky[3], c[3];
    long xo[3];
    uint2 raw[3];
    __device__ StemWin(const ConvGeo &g, int lane) {
#pragma unroll
        for (int i = 0; i < 3; i++) {
            const int q = min(lane + 32 * i, 80), r = q / 9, ci = r / 3;
            ky[i] = r - 3 * ci, c[i] = 8 * (q % 9), xo[i] = ((long)ci * g.H + ky[i]) * g.W + c[i];
        }
    }
    __device__ __forceinline__ void fetch(const ConvGeo &g, const uint8_t *x, int lane, int b, int oy, int ox0) {
        const int iy0 = 2 * oy - 1, ix0 = 2 * ox0 - 8;
        const uint8_t *xb = x + ((long)b * g.xs + (long)iy0 * g.W + ix0);
#pragma unroll
        for (int i = 0; i < 3; i++) {
            const bool in = (i < 2 || lane < 17) && (unsigned)(iy0 + ky[i]) < (unsigned)g.H &&
                            (unsigned)(ix0 + c[i]) <= (unsigned)(g.W - 8);
            raw[i] = in ? *(const uint2 *)(xb + xo[i]) : make_uint2(0u, 0u);
        }
    }
    // PAIRS: by u8_pair_unit, else by u8_unit and a conversion (the same bits; STEM_WGRAD_PAIRS)
    template <bool PAIRS = true> __device__ __forceinline__ void store(__half (*win)[STEM_PP], int lane) const {
#pragma unroll
        for (int i = 0; i < 3; i++) {
            if (i < 2 || lane < 17) {   // (pieces 64 .. 80)
                union { uint4 u; __half2 h[4]; } o;
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const uint32_t w = e < 2 ? raw[i].x : raw[i].y;
                    o.h[e] = PAIRS ? u8_pair_unit(w, e & 1)
                                   : __floats2half2_rn(u8_unit(w, 2 * (e & 1)), u8_unit(w, 2 * (e & 1) + 1));
                }
                *(uint4 *)&win[(lane + 32 * i) / 9][c[i]] = o.u;
            }
        }
    }
};
// StemWalk: a warp's walk over the batch's chunks, 4 on per step (the block's 4 warps take every fourth):
// chunk c = (b Ho + oy) nseg + seg, nseg chunks to an output row (the batch's chunks fit an int:
// conv_stem_takes_u8)
struct StemWalk {
    int c, seg, b, oy;
    __device__ StemWalk(int c0, int nseg, int Ho) : c(c0) {
        const int row = c0 / nseg;
        seg = c0 - row * nseg, b = row / Ho, oy = row - b * Ho;
    }
    __device__ __forceinline__ void next(int nseg, int Ho) {
        c += 4;
        for (seg += 4; seg >= nseg; seg -= nseg)
            if (++oy == Ho) oy = 0, b++;
    }
};
// conv_stem_kernel: the stem's forward (3 input channels, 3x3, stride 2, pad 1), z = conv(x, w) (+ bias) in
// FP16 (zh), x the uint8 batch (StemWin; an FP16 x, or an FP32 z, goes to the gather kernel).
// The gather kernel's 64 x 64 tile would be 16 output channels and 27 of 32 K columns in a 64 x 32 A:
// here a block owns all of Cout (16 MT) and walks its share of the batch's 32-pixel chunks (of one
// output row each; blocks take consecutive runs of chunks, a warp every fourth), the K of a pixel its 27
// taps in 2 steps of mma.sync m16n8k16 (M output channels, N 8 pixels). A warp stages its chunk's input
// window (StemWin) and multiplies it by the weights, which stay in registers for the whole block. The
// taps are ordered as 16 pairs that the window holds as 32-bit words: pairs 0-8 kx = 1, 2 of window row
// p (input columns 2 ox, 2 ox + 1: one aligned word); pairs 9-12 kx = 0 of rows 2i, 2i + 1 (the high
// halves of two words, one byte permute); pair 13 kx = 0 of row 8 and a zero weight; 14-15 zero weights.
// The accumulators start from the bias; the epilogue stores each lane's pixel pairs as half2 and, for the
// statistics (part), adds the values as stored to the lane's sums per channel: their count, deviations from
// a shift (the lane's first value of the channel: close to the mean, so that M2 = S2 - S1^2 / n keeps its
// precision) and squared deviations. At the end each lane's sums become a BnTile, merged over the 4 lanes of
// a channel and the 4 warps in a fixed order into one tile per (channel, block), as the other forward
// kernels write them.
template <int MT>
__global__ __launch_bounds__(128) void conv_stem_kernel(ConvGeo g, const uint8_t *x, const __half *w,
                                                        const float *bias, __half *zh, float *part) {
    __shared__ __align__(16) __half win[2][4][9][STEM_PP];
    __shared__ BnTile bst[4 * 64];
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, gq = lane / 4, tq = lane % 4;
    const int HWo = g.Ho * g.Wo, nseg = (g.Wo + STEM_PX - 1) / STEM_PX;
    const long nch = (long)g.B * g.Ho * nseg;
    const int c0 = (int)(blockIdx.x * nch / gridDim.x), c1 = (int)((blockIdx.x + 1) * nch / gridDim.x);
    const int nsteps = (int)((c1 - c0 + 3) / 4);
    // two walkers over the warp's chunks c0 + warp + 4 s: the fetch's (one step ahead) and the mma's
    StemWalk wf(c0 + warp, nseg, g.Ho), wm = wf;
    StemWin sw(g, lane);
    bool fetched = false;   // the last fetch's chunk lies in the block's share (its store writes the window)
    // A: the pairs' weights, rows co = 16 mt + gq (+ 8), k columns 2 tq .. of K step kk (pairs 8 kk + tq, + 4)
    uint32_t a[MT][2][4];
    auto wtap = [&](int co, int k) { return k >= 0 ? w[co * 27 + k] : __float2half(0.0f); };
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int kk = 0; kk < 2; kk++)
#pragma unroll
            for (int r = 0; r < 4; r++) {
                const int co = 16 * mt + gq + 8 * (r & 1), p = 8 * kk + tq + 4 * (r >> 1);
                const int k0 = p < 9 ? 3 * p + 1 : p < 13 ? 6 * (p - 9) : p == 13 ? 24 : -1;
                const int k1 = p < 9 ? 3 * p + 2 : p < 13 ? 6 * (p - 9) + 3 : -1;
                union { __half2 h; uint32_t u; } v;
                v.h = __halves2half2(wtap(co, k0), wtap(co, k1));
                a[mt][kk][r] = v.u;
            }
    // this lane's outputs: channels 16 mt + gq + 8 h (their offsets cho), pixels 8 nt + 2 tq, + 1 of a chunk
    float bv[MT][2];
    long cho[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int co = 16 * mt + gq + 8 * h;
            bv[mt][h] = bias ? bias[co] : 0.0f, cho[mt][h] = (long)co * HWo + 2 * tq;
        }
    // B: this lane's words of the window (32-bit units, rows STEM_PP / 2 apart) for pixel gq of an 8-pixel
    // tile: pairs tq, tq + 4 (one word each), pairs tq + 8, tq + 12 (two words and a byte permute)
    constexpr int RW = STEM_PP / 2;
    const int o0 = tq * RW + 4 + gq, o1 = (tq + 4) * RW + 4 + gq;
    const int oa2 = (tq ? 2 * (tq - 1) * RW + 3 : 8 * RW + 4) + gq, ob2 = tq ? oa2 + RW : oa2;
    const int oa3 = (tq ? 8 : 6) * RW + 3 + gq, ob3 = tq ? oa3 : oa3 + RW;
    const unsigned sel2 = tq ? 0x7632u : 0x3210u;
    // the statistics: per channel of the lane, the count, a shift (the lane's first value of
    // the channel) and the sums of the values' deviations from it and of their squares
    float sn = 0.0f, sk[MT][2], s1[MT][2], s2[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int h = 0; h < 2; h++) sk[mt][h] = s1[mt][h] = s2[mt][h] = 0.0f;
    auto fetch = [&](int) {
        fetched = wf.c < c1;
        if (fetched) sw.fetch(g, x, lane, wf.b, wf.oy, wf.seg * STEM_PX);
        wf.next(nseg, g.Ho);
    };
    auto store = [&](int s) {
        if (fetched) sw.store(win[s & 1][warp], lane);
    };
    auto mma = [&](int s) {
        if (wm.c < c1) {
            const uint32_t *wv = (const uint32_t *)&win[s & 1][warp][0][0];
            float acc[MT][4][4];   // from the bias
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int nt = 0; nt < 4; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++) acc[mt][nt][e] = bv[mt][e >> 1];
#pragma unroll
            for (int nt = 0; nt < 4; nt++) {
                const uint32_t *pv = wv + 8 * nt;
                const uint32_t b0[2] = {pv[o0], pv[o1]};
                const uint32_t b1[2] = {__byte_perm(pv[oa2], pv[ob2], sel2), __byte_perm(pv[oa3], pv[ob3], 0x7632)};
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    mma_16816(acc[mt][nt], a[mt][0], b0);
                    mma_16816(acc[mt][nt], a[mt][1], b1);
                }
            }
            const int ox0 = wm.seg * STEM_PX, ntv = min(4, (g.Wo - ox0) / 8);   // the valid 8-pixel tiles
            const long o = (long)wm.b * g.zs + (long)wm.oy * g.Wo + ox0;
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    {
                        __half *q = zh + o + cho[mt][h];
                        pin_reg(q);
                        if (sn == 0.0f) sk[mt][h] = __half2float(__float2half(acc[mt][0][2 * h]));
                        const float k = sk[mt][h];
#pragma unroll
                        for (int nt = 0; nt < 4; nt++) {
                            if (nt < ntv) {
                                const __half2 hv = __floats2half2_rn(acc[mt][nt][2 * h], acc[mt][nt][2 * h + 1]);
                                *(__half2 *)(q + 8 * nt) = hv;
                                if (part) {   // the values as stored
                                    const float2 f = h2f2(hv);
                                    const float d0 = f.x - k, d1 = f.y - k;
                                    s1[mt][h] += d0 + d1;
                                    s2[mt][h] = fmaf(d0, d0, fmaf(d1, d1, s2[mt][h]));
                                }
                            }
                        }
                    }
                }
            sn += 2.0f * ntv;
        }
        wm.next(nseg, g.Ho);
    };
    conv_k_loop(nsteps, [](int) {}, fetch, store, mma);
    if (!part) return;
    // each channel's tile: the lane's (mean k + s1 / n, M2 = s2 - s1^2 / n), merged over the 4 lanes of the
    // channel (lane ^ 1, then ^ 2), then the warps in order
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const float m1 = sn > 0.0f ? __fdividef(s1[mt][h], sn) : 0.0f;
            BnTile t = {sn, sk[mt][h] + m1, fmaxf(s2[mt][h] - s1[mt][h] * m1, 0.0f)};
            t = bn_tile_xor(bn_tile_xor(t, 1), 2);
            if (tq == 0) bst[warp * 64 + 16 * mt + 8 * h + gq] = t;
        }
    __syncthreads();
    bn_tiles_out<4>(bst, 0, g.Cout, part);
}
// conv_stem_wgrad_kernel: the weight gradient of the stem (3 input channels, 3x3, stride 2, pad 1), dW[co,
// k] = sum over output pixels of dz[co, p] col[k, p] with K = 27 taps. The gather kernel's 64 x 64 tile
// would be a 16 x 27 corner of mostly padding; here a block owns all of Cout (16 MT) by the 27 taps (4 n8
// tiles of mma.sync m16n8k16: M output channels, N taps, K pixels) and walks its slice of the batch's
// output rows (grid.x slices of B*Ho rows in order) in chunks of 32 pixels of one row, one chunk per warp
// and step. A warp stages its own chunk: dz's Cout x 32 tile by 16-byte cp.async, zero past the image,
// and the uint8 input window of 3 channels x 3 rows x 72 columns (x from 2 ox0 - 8) by StemWin. The
// taps are ordered so that a lane's taps in n-tiles 0-2 are kx = 0, 1, 2 of one (channel, row) pair g:
// then the B registers of a pixel pair (p, p+1) come from the three 32-bit words of that row that hold
// input columns 2p-1 .. 2p+3 (the window's columns 2p+7 ..), one byte permute per register; n-tile 3
// holds pair 8's three taps in lanes 0-2. A (dz) comes by ldmatrix.x4. Two stages, one barrier per step.
// The warps' sums are added in warp order through shared memory and written as the block's slice of the
// workspace (or dW, with accumulate, when there is one slice): the same bits on every run.
// STEM_WGRAD_BLOCKS(MT), STEM_WGRAD_PAIRS(MT): the blocks an SM conv_stem_wgrad_kernel asks registers for
// and whether it converts its window by u8_pair_unit (the same bits either way). On sm_90 the pairs took
// the kernel from 80 to 102 registers at MT 1 (6 -> 4 blocks an SM; asked 6 or 5 it spilled), so that one
// converts as before; at MT 2 from 96 to 99, 96 when asked 5 blocks (as unasked before); elsewhere the
// registers are those of before, unasked
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define STEM_WGRAD_BLOCKS(MT) ((MT) == 2 ? 5 : 0)
#define STEM_WGRAD_PAIRS(MT) ((MT) != 1)
#else
#define STEM_WGRAD_BLOCKS(MT) 0
#define STEM_WGRAD_PAIRS(MT) true
#endif
template <int MT>
__global__ __launch_bounds__(128, STEM_WGRAD_BLOCKS(MT))
void conv_stem_wgrad_kernel(ConvGeo g, const __half *dz, const uint8_t *x, float *dw, float *ws, int accumulate) {
    constexpr int CO = 16 * MT;
    __shared__ __align__(16) __half dzs[2][4][CO][STEM_DP];
    __shared__ __align__(16) __half win[2][4][9][STEM_PP];
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, gq = lane / 4, tq = lane % 4;
    const int HWo = g.Ho * g.Wo, R = g.B * g.Ho, nseg = (g.Wo + STEM_PX - 1) / STEM_PX;
    const int r0 = (int)((long)blockIdx.x * R / gridDim.x), r1 = (int)((long)(blockIdx.x + 1) * R / gridDim.x);
    const int nsteps = ((r1 - r0) * nseg + 3) / 4;
    // the chunk of this warp's next fetch (the slice: chunks r0 nseg .. r1 nseg)
    StemWalk wf(r0 * nseg + warp, nseg, g.Ho);
    const int cend = r1 * nseg;
    bool v0 = false, v1 = false;   // the chunk in stage 0 / 1 is inside the slice
    // this lane's copies of dz, their offsets fixed: rows lane / 4 + 8 i (2 MT of them), 8 pixels at dc =
    // 8 (lane % 4) of the chunk, zeros past the row; of the window, StemWin's
    const int dc = 8 * (lane % 4);
    const long zlane = (long)(lane / 4) * HWo + dc, zstep = 8L * HWo;
    StemWin sw(g, lane);
    auto fetch = [&](int s) {
        const bool ok = wf.c < cend;
        if (s & 1) v1 = ok; else v0 = ok;
        if (ok) {
            const int ox0 = wf.seg * STEM_PX;
            const bool zok = ox0 + dc < g.Wo;
            const __half *zp = zok ? dz + ((long)wf.b * g.zs + (long)wf.oy * g.Wo + ox0 + zlane) : dz;
#pragma unroll
            for (int i = 0; i < 2 * MT; i++) cp_async16z(&dzs[s & 1][warp][lane / 4 + 8 * i][dc], zp + (zok ? i * zstep : 0), zok);
            sw.fetch(g, x, lane, wf.b, wf.oy, ox0);
        }
        wf.next(nseg, g.Ho);
    };
    auto store = [&](int s) {
        if ((s & 1) ? v1 : v0) sw.store<STEM_WGRAD_PAIRS(MT)>(win[s & 1][warp], lane);
    };
    float acc[MT][4][4] = {};
    // pair 8's tap of n-tile 3 in this lane (lanes 3-7: a copy of lane 0's, not stored)
    const int kx8 = gq < 3 ? gq : 0, w8 = 8 * (STEM_PP / 2) + (kx8 ? 4 : 3);
    const unsigned sel8 = kx8 == 1 ? 0x5410u : 0x7632u;
    auto mma = [&](int s) {
        if (!((s & 1) ? v1 : v0)) return;
        const uint32_t *wv = (const uint32_t *)&win[s & 1][warp][0][0];
#pragma unroll
        for (int h = 0; h < 2; h++) {   // the chunk's two 16-pixel K slices
            uint32_t a[MT][4], bf[4][2];
#pragma unroll
            for (int mt = 0; mt < MT; mt++) ldsm_x4(a[mt], &dzs[s & 1][warp][mt * 16 + lane % 16][16 * h + 8 * (lane / 16)]);
#pragma unroll
            for (int e = 0; e < 2; e++) {   // pixels p, p + 1 (p = 16 h + 2 tq + 8 e): words p + 3 .. p + 5
                const int p = 16 * h + 2 * tq + 8 * e;
                const uint32_t *pw = wv + gq * (STEM_PP / 2) + p + 3;
                const uint32_t w0 = pw[0], w1 = pw[1], w2 = pw[2];
                bf[0][e] = __byte_perm(w0, w1, 0x7632);   // kx 0: columns 2p+7, 2p+9 (high halves)
                bf[1][e] = __byte_perm(w1, w2, 0x5410);   // kx 1: 2p+8, 2p+10 (low halves)
                bf[2][e] = __byte_perm(w1, w2, 0x7632);   // kx 2: 2p+9, 2p+11
                bf[3][e] = __byte_perm(wv[w8 + p], wv[w8 + p + 1], sel8);
            }
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int j = 0; j < 4; j++) mma_16816(acc[mt][j], a[mt], bf[j]);
        }
    };
    conv_k_loop(nsteps, [](int) {}, fetch, store, mma);
    // the warps' sums in warp order, in dzs (free after the loop's last barrier): red[co][k], k < 27
    float (*red)[28] = (float (*)[28]) & dzs[0][0][0][0];
    static_assert(sizeof(dzs) >= sizeof(float) * CO * 28, "the reduction fits the dz stages");
    for (int w = 0; w < 4; w++) {
        if (warp == w) {
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int j = 0; j < 4; j++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int co = mt * 16 + gq + 8 * (e >> 1), n = 2 * tq + (e & 1);
                        const int k = j < 3 ? 3 * n + j : n < 3 ? 24 + n : -1;
                        if (k >= 0) red[co][k] = w ? red[co][k] + acc[mt][j][e] : acc[mt][j][e];
                    }
        }
        __syncthreads();
    }
    const bool split = gridDim.x > 1;
    float *out = split ? ws + (long)blockIdx.x * CO * 27 : dw;
    for (int i = tid; i < CO * 27; i += 128) {
        const float v = red[i / 27][i % 27];
        out[i] = !split && accumulate ? out[i] + v : v;
    }
}
// conv_stem_x8: whether d's x is the uint8 batch (ConvDims.x8), which the stem's kernels alone read (an
// FP16 x takes the gather kernel whatever its shape). with: what else the call asks (BN+SiLU in the
// gather, an FP32 z), which they do not do. A call with x8 that they cannot take (that, the shape:
// conv_stem_takes_u8, or x not 8-byte, z / dz not 16-byte aligned) is the caller's error.
static bool conv_stem_x8(const char *who, ConvDims d, const void *x, const void *zdz, bool with) {
    if (!d.x8) return false;
    if (!with && conv_stem_takes_u8(d) && (uintptr_t)x % 8 == 0 && (uintptr_t)zdz % 16 == 0) return true;
    fprintf(stderr, "%s: a uint8 x (x8) only the stem's kernels read, and they do not take this call (Cin %d, K %d, "
            "S %d, Cout %d, %dx%d, BN+SiLU or FP32 z %d)\n", who, d.Cin, d.K, d.S, d.Cout, d.H, d.W, (int)with);
    abort();
}
// conv_stats_fit: before a launch with partials, that its tiles fit conv_stats_floats (a bound kept by
// hand beside the kernels' tilings: a programming error, not an input's)
static void conv_stats_fit(ConvDims d, unsigned tiles) {
    if ((size_t)4 * d.Cout * tiles <= conv_stats_floats(d)) return;
    fprintf(stderr, "conv_forward_stats_cuda: %u pixel tiles exceed conv_stats_floats\n", tiles);
    abort();
}
// conv_forward_launch: conv_forward_cuda, with the statistics' partials when part is not NULL; returns the
// pixel tiles (the grid's x: the partials of each channel), 0 when nothing was launched
static int conv_forward_launch(ConvDims d, const void *x, const ConvAct *act, const uint16_t *w,
                               const uint16_t *wt, const float *bias, float *z, uint16_t *zh, float *part,
                               void *stream) {
    ConvGeo g = conv_geo(d);
    long N = (long)g.B * g.Ho * g.Wo;
    if (N == 0 || g.Cout == 0 || (!z && !zh)) return 0;
    dim3 grid(cdiv(N, IG_BN), cdiv(g.Cout, IG_BM));
    cudaStream_t s = (cudaStream_t)stream;
    bool avec = (g.Cin * g.KK) % 8 == 0 && (uintptr_t)w % 16 == 0;   // all but a 3-channel stem
    bool bvec = g.K == 1 && g.S == 1 && (g.H * g.W) % 8 == 0 && g.xs % 8 == 0 && (uintptr_t)x % 16 == 0;
    // BVEC with ACT: its table of the input channels' BN (dynamic shared memory, 8 bytes a channel, to a
    // multiple of 32); past IG_FOLD_MAX channels the gathered variant, which folds 32 a K step, takes it
    if (act && bvec && g.Cin > IG_FOLD_MAX) bvec = false;
    const size_t fold = act && bvec ? (size_t)cdiv(g.Cin, IG_BK) * IG_BK * sizeof(float2) : 0;
    const __half *xh = (const __half *)x, *wh = (const __half *)w;
    ConvAct a = act ? *act : ConvAct();
    __half *zo = (__half *)zh;
    // the stem, from the uint8 batch (into zh, FP16; with the statistics when part)
    if (conv_stem_x8("conv_forward_cuda", d, x, zh, act || z)) {
        const uint8_t *x8 = (const uint8_t *)x;
        const unsigned blocks = cdiv((long)g.B * g.Ho * cdiv(g.Wo, STEM_PX), 16);   // 16 chunks a block
        if (part) conv_stats_fit(d, blocks);
        switch (g.Cout / 16) {
        case 1: conv_stem_kernel<1><<<blocks, 128, 0, s>>>(g, x8, wh, bias, zo, part); break;
        case 2: conv_stem_kernel<2><<<blocks, 128, 0, s>>>(g, x8, wh, bias, zo, part); break;
        default: conv_stem_kernel<3><<<blocks, 128, 0, s>>>(g, x8, wh, bias, zo, part); break;
        }
        CUDA_CHECK(cudaGetLastError());
        return (int)blocks;
    }
    // a 3x3 conv: the halo kernel, which reads the weights tap-major (wt)
    if (int vw = wt ? conv_halo_vw(g, g.xs, x, wt, g.Cin, g.W, 2) : 0) {
        int tc;
        const unsigned tiles = conv_halo_grid(g, false, vw, &tc).x;   // (conv_halo_launch's grid)
        if (part) conv_stats_fit(d, tiles);
        conv_halo_launch(g, vw, act != nullptr, false, xh, a, (const __half *)wt, bias, z, zo, 0, s, part);
        return (int)tiles;
    }
    if (part) conv_stats_fit(d, grid.x);
    switch ((act ? 4 : 0) | (bvec ? 2 : 0) | (avec ? 1 : 0)) {
    case 0: conv_fwd_kernel<false, false, false, false><<<grid, 128, 0, s>>>(g, xh, a, wh, bias, z, zo, part, ConvParts()); break;
    case 1: conv_fwd_kernel<false, false, true, false><<<grid, 128, 0, s>>>(g, xh, a, wh, bias, z, zo, part, ConvParts()); break;
    case 2: conv_fwd_kernel<false, true, false, false><<<grid, 128, 0, s>>>(g, xh, a, wh, bias, z, zo, part, ConvParts()); break;
    case 3: conv_fwd_kernel<false, true, true, false><<<grid, 128, 0, s>>>(g, xh, a, wh, bias, z, zo, part, ConvParts()); break;
    case 4: conv_fwd_kernel<true, false, false, false><<<grid, 128, 0, s>>>(g, xh, a, wh, bias, z, zo, part, ConvParts()); break;
    case 5: conv_fwd_kernel<true, false, true, false><<<grid, 128, 0, s>>>(g, xh, a, wh, bias, z, zo, part, ConvParts()); break;
    case 6: conv_fwd_kernel<true, true, false, false><<<grid, 128, fold, s>>>(g, xh, a, wh, bias, z, zo, part, ConvParts()); break;
    default: conv_fwd_kernel<true, true, true, false><<<grid, 128, fold, s>>>(g, xh, a, wh, bias, z, zo, part, ConvParts()); break;
    }
    CUDA_CHECK(cudaGetLastError());
    return (int)grid.x;
}
// conv_forward_parts_cuda: conv_fwd_kernel<true, true, true, true> over p's parts. What it takes (a 1x1
// stride-1 conv, H*W and every image stride a multiple of 8, the parts' channels multiples of 32, the
// last's of 16, adding up to Cin, at most CONV_PARTS_MAX_CIN, 16-byte aligned sources and weights) the
// caller has checked: a call that breaks it is a programming error, reported and stopped.
extern "C" int conv_forward_parts_cuda(ConvDims d, const ConvParts *p, const uint16_t *w, uint16_t *zh, float *part,
                                       void *stream) {
    static_assert(IG_FOLD_MAX == CONV_PARTS_MAX_CIN, "the parts' BN table is ig_fold");
    ConvGeo g = conv_geo(d);
    long N = (long)g.B * g.Ho * g.Wo;
    int cin = 0;
    bool ok = g.K == 1 && g.S == 1 && g.pad == 0 && (g.H * g.W) % 8 == 0 && p->n >= 1 && p->n <= CONV_PARTS_MAX &&
              g.Cin <= CONV_PARTS_MAX_CIN && (uintptr_t)w % 16 == 0 && zh;
    for (int i = 0; ok && i < p->n; i++) {
        ok = p->C[i] > 0 && p->C[i] % (i + 1 < p->n ? IG_BK : 16) == 0 && p->xs[i] % 8 == 0 &&
             (uintptr_t)p->x[i] % 16 == 0;
        cin += p->C[i];
    }
    if (!ok || cin != g.Cin) {
        fprintf(stderr, "conv_forward_parts_cuda: a call it does not take (K %d, S %d, %dx%d, Cin %d, %d parts of %d "
                "channels)\n", g.K, g.S, g.H, g.W, g.Cin, p->n, cin);
        abort();
    }
    if (N == 0 || g.Cout == 0) return 0;
    dim3 grid(cdiv(N, IG_BN), cdiv(g.Cout, IG_BM));
    const int nsteps = cdiv(g.Cin, IG_BK);
    const size_t smem = (size_t)nsteps * IG_BK * sizeof(float2);
    if (part) conv_stats_fit(d, grid.x);
    conv_fwd_kernel<true, true, true, true><<<grid, 128, smem, (cudaStream_t)stream>>>(
        g, (const __half *)p->x[0], ConvAct(), (const __half *)w, nullptr, nullptr, (__half *)zh, part, *p);
    CUDA_CHECK(cudaGetLastError());
    return (int)grid.x;
}
extern "C" void conv_forward_cuda(ConvDims d, const void *x, const ConvAct *act, const uint16_t *w,
                                  const uint16_t *wt, const float *bias, float *z, uint16_t *zh, void *stream) {
    conv_forward_launch(d, x, act, w, wt, bias, z, zh, nullptr, stream);
}

// conv_dgrad_kernel: dx (+)= w^T dzg, a 64x64 tile of (Cin, B*H*W) per block, the index math out of the
// K loop as in conv_fwd_kernel: each thread's
// input pixel (b, qy, qx) is decoded once per block, the 32 taps k = (co, ky, kx) of a K step into a
// shared table one step ahead (dz offset, ky, kx and w's offset of the tap). SS: the stride's test for
// "this output pixel read input pixel n through tap k" (1: a bounds test; 2: parity and shifts;
// 0: any stride, by division). VEC1 (1x1, stride 1, Cin, H*W and the image strides multiples of 8):
// w^T is staged column-major (its rows along Cin are contiguous) and both operands move as 16-byte
// cp.async. Two stages, one barrier per K step; conv_store8 epilogue. SUMS (VEC1 alone: a lane's 8
// values lie in one image): the BN backward's sums of what it stores into part (bnb_add8; bn: that BN's
// statistics and parameters, zb its z in dx's layout), per lane over its row's two 16-column tiles, then
// with lane ^ 16, then the two warps of the block's row half in order (bsm), a tile blockIdx.x of
// gridDim.x. (A variant of its own: with that epilogue in the one kernel, NVVM kept fewer of the K
// loop's shared addresses out of it, 4.4 -> 4.7 PTX instructions per HMMA, sm_80.)
// (128, 1): with the default minimum, ptxas for sm_80 caps this kernel's registers and spills
template <bool VEC1, int SS, bool SUMS = false>
__global__ __launch_bounds__(128, 1) void conv_dgrad_kernel(ConvGeo g, const __half *dz, const __half *w, float *dx,
                                                         __half *dxh, int accumulate, ConvAct bn, const __half *zb,
                                                         float *part) {
    static_assert(!SUMS || VEC1, "the sums take a lane's 8 values in one image");
    using namespace nvcuda;
    typedef typename std::conditional<VEC1, wmma::col_major, wmma::row_major>::type ALayout;
    // A: VEC1 (stage, 32 of Kd, 64 of Cin) column-major, else (stage, 64 of Cin, 32 of Kd)
    __shared__ __align__(128) __half As[2][VEC1 ? IG_BK : IG_BM][VEC1 ? IG_BM + 8 : IG_BK + 8];
    __shared__ __align__(128) __half Bs[2][IG_BK][IG_BN + 8];   // (stage, 32 of Kd, 64 of B*H*W)
    __shared__ ConvTap tap[2][IG_BK];                           // off: dz offset; pad_: w offset (-1 past Kd)
    __shared__ __align__(32) float Cs[4][16][CS_LD];
    const int tid = threadIdx.x, warp = tid / 32, wy = warp / 2, wx = warp % 2;
    const int M = g.Cin, Kd = g.Cout * g.KK, HW = g.H * g.W, HWo = g.Ho * g.Wo, N = g.B * HW;
    const int row0 = blockIdx.y * IG_BM, col0 = blockIdx.x * IG_BN, nsteps = (Kd + IG_BK - 1) / IG_BK;
    const __half hzero = __float2half(0.0f);
    auto taps = [&](int s) {
        if (!VEC1 && tid < IG_BK) {
            int k = s * IG_BK + tid, co = div_fast(k, g.fKK), kk = k - co * g.KK, ky = div_fast(kk, g.fK),
                kx = kk - ky * g.K;
            ConvTap t = {SS == 1 ? co * HWo - ky * g.Wo - kx : co * HWo, k < Kd ? ky : -(1 << 24), kx,
                         k < Kd ? co * g.wst + kk : -1};
            tap[s & 1][tid] = t;
        }
    };
    // gathered B: column gc, rows gr + 2j; scalar A: column ac (a tap), rows ar + 4j
    const int gc = tid % IG_BN, gr = tid / IG_BN, ac = tid % IG_BK, ar = tid / IG_BK;
    const int vr = tid / 8, vc = (tid % 8) * 8;   // VEC1: rows vr + 16i, 8 columns from vc
    const __half *dzb = dz;
    int tyb = 0, txb = 0;
    long vboff = 0;
    bool vbok = false;
    {
        int n = col0 + (VEC1 ? vc : gc), b = div_fast(n, g.fHW), q = n - b * HW;
        if (VEC1) { vbok = n < N; vboff = vbok ? b * g.zs + q : 0; }
        else {
            int qy = div_fast(q, g.fW), qx = q - qy * g.W;
            tyb = n < N ? qy + g.pad : -(1 << 26); txb = qx + g.pad;
            dzb = dz + (n < N ? b * g.zs + (SS == 1 ? (long)tyb * g.Wo + txb : 0) : 0);
        }
    }
    union { uint4 u[2]; __half h[16]; } av, bv;
    auto fetch = [&](int s) {
        int k0 = s * IG_BK;
        if (VEC1) {
#pragma unroll
            for (int i = 0; i < 2; i++) {
                int r = vr + 16 * i, k = k0 + r;
                __half *da = &As[s & 1][r][vc], *db = &Bs[s & 1][r][vc];
                if (k < Kd && row0 + vc < M) __pipeline_memcpy_async(da, w + (long)k * g.wst + row0 + vc, 16);
                else *(uint4 *)da = make_uint4(0, 0, 0, 0);
                if (k < Kd && vbok) __pipeline_memcpy_async(db, dz + vboff + (long)k * HWo, 16);
                else *(uint4 *)db = make_uint4(0, 0, 0, 0);
            }
        } else {
            int wo = tap[s & 1][ac].pad_;
#pragma unroll
            for (int j = 0; j < 16; j++) {
                int m = row0 + ar + 4 * j;
                av.h[j] = wo >= 0 && m < M ? w[wo + (long)m * g.KK] : hzero;
            }
#pragma unroll
            for (int j = 0; j < 16; j++) {
                ConvTap t = tap[s & 1][gr + 2 * j];
                int ty = tyb - t.ky, tx = txb - t.kx;
                __half v = hzero;
                if (SS == 1) {
                    if ((unsigned)ty < (unsigned)g.Ho && (unsigned)tx < (unsigned)g.Wo) v = dzb[t.off];
                } else if (SS == 2) {
                    if (((ty | tx) & 1) == 0 && (unsigned)(ty >> 1) < (unsigned)g.Ho &&
                        (unsigned)(tx >> 1) < (unsigned)g.Wo)
                        v = dzb[t.off + (ty >> 1) * g.Wo + (tx >> 1)];
                } else if (ty >= 0 && tx >= 0) {
                    int oy = div_fast(ty, g.fS), ox = div_fast(tx, g.fS);
                    if (oy * g.S == ty && ox * g.S == tx && oy < g.Ho && ox < g.Wo) v = dzb[t.off + oy * g.Wo + ox];
                }
                bv.h[j] = v;
            }
        }
    };
    auto store = [&](int s) {
        if (!VEC1) {
#pragma unroll
            for (int j = 0; j < 16; j++) As[s & 1][ar + 4 * j][ac] = av.h[j];
#pragma unroll
            for (int j = 0; j < 16; j++) Bs[s & 1][gr + 2 * j][gc] = bv.h[j];
        }
    };

    ConvAcc acc[2][2];
    conv_warp_zero(acc);
    conv_k_loop<VEC1 ? 2 : 1>(nsteps, taps, fetch, store, [&](int s) {
        conv_warp_step<ALayout, wmma::row_major>(
                acc,
                [&](int i, int kk) {
                    return VEC1 ? &As[s & 1][kk][wy * 32 + i * 16] : &As[s & 1][wy * 32 + i * 16][kk];
                },
                VEC1 ? IG_BM + 8 : IG_BK + 8, [&](int j, int kk) { return &Bs[s & 1][kk][wx * 32 + j * 16]; },
                IG_BN + 8);
    });
    if constexpr (!SUMS) {
        conv_warp_store(acc, Cs[warp], row0 + wy * 32, col0 + wx * 32, [&](int m, int n, const float *c) {
            if (m < M && n < N) conv_store8(dx, dxh, c, m, n, N, HW, g.fHW, g.xs, accumulate);
        });
        return;
    }
    __shared__ BnbSums bsm[2][64];   // [wx][row of the block]
    const int lane = tid % 32;
    BnbSums bs = {0.0f, 0.0f};
    float4 bp = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    int bpm = -1;   // bp's channel
    conv_warp_store(
            acc, Cs[warp], row0 + wy * 32, col0 + wx * 32,
            [&](int m, int n, const float *c) {
                if (m < M && n < N) {
                    conv_store8(dx, dxh, c, m, n, N, HW, g.fHW, g.xs, accumulate);
                    const int b = div_fast(n, g.fHW);
                    if (m != bpm) bp = bnb_par(bn, m), bpm = m;
                    bnb_add8(bs, zb, b * g.xs + (long)m * HW + (n - b * HW), c, 8, bp);
                }
            },
            [&](int i) {   // row i's two 16-column tiles done: the row's sums to bsm
                bs.g += __shfl_xor_sync(0xffffffffu, bs.g, 16);
                bs.gx += __shfl_xor_sync(0xffffffffu, bs.gx, 16);
                if (lane < 16) bsm[wx][wy * 32 + i * 16 + lane] = bs;
                bs = BnbSums{0.0f, 0.0f};
            });
    __syncthreads();
    bnb_sums_out<2>(&bsm[0][0], row0, M, part, gridDim.x, blockIdx.x);
}
// conv_dgrad_run: conv_dgrad_cuda; with part (FP16 dxh written, not added to) also the BN backward's sums
// of z and the dxh it writes (bn: that BN's statistics and parameters) into part, where the kernel it
// takes has them (the halo kernels; the 1x1 kernel's 16-byte variant) and its pixel tiles are at most
// kmax: returns their count K (part's sums per channel), else 0 (dxh written all the same)
static long conv_dgrad_run(ConvDims d, const uint16_t *dz, const uint16_t *w, const uint16_t *wt, float *dx,
                           uint16_t *dxh, int accumulate, void *stream, const uint16_t *z, const ConvAct *bn,
                           float *part, long kmax) {
    ConvGeo g = conv_geo(d);
    long N = (long)g.B * g.H * g.W;
    if (N == 0 || g.Cin == 0 || (!dx && !dxh)) return 0;
    if (dx || accumulate || !z || !bn) part = nullptr;
    dim3 grid(cdiv(N, IG_BN), cdiv(g.Cin, IG_BM));
    cudaStream_t s = (cudaStream_t)stream;
    const __half *dzh = (const __half *)dz, *wh = (const __half *)w, *zb = (const __half *)z;
    __half *xo = (__half *)dxh;
    const ConvAct a = bn ? *bn : ConvAct();
    // w's rows (one per output channel) 16-byte aligned: the 16-byte kernels; strided (a concat source's
    // columns of a wider conv's weights): no tap-major copy, which holds the whole weights
    const bool wrow16 = g.wst % 8 == 0;
    if (g.wst != g.Cin * g.KK) wt = nullptr;
    // a 3x3 conv: the halo kernel, which reads the weights tap-major (wt)
    if (int vw = wt ? conv_halo_vw(g, g.zs, dz, wt, g.Cin, g.Wo, 2) : 0) {
        int tc;
        const dim3 hg = conv_halo_grid(g, true, vw, &tc);
        const long K = (long)hg.x * hg.z;
        if (K > kmax) part = nullptr;
        conv_halo_launch(g, vw, false, true, dzh, a, (const __half *)wt, nullptr, dx, xo, accumulate, s, part,
                         part ? zb : nullptr);
        return part ? K : 0;
    }
    bool vec1 = g.K == 1 && g.S == 1 && g.Cin % 8 == 0 && (g.H * g.W) % 8 == 0 && g.zs % 8 == 0 && wrow16 &&
            (uintptr_t)dz % 16 == 0 && (uintptr_t)w % 16 == 0;
    if (!vec1 || (long)grid.x > kmax) part = nullptr;
    if (vec1 && part) conv_dgrad_kernel<true, 1, true><<<grid, 128, 0, s>>>(g, dzh, wh, dx, xo, accumulate, a, zb, part);
    else if (vec1) conv_dgrad_kernel<true, 1, false><<<grid, 128, 0, s>>>(g, dzh, wh, dx, xo, accumulate, a, zb, nullptr);
    else if (g.S == 1) conv_dgrad_kernel<false, 1><<<grid, 128, 0, s>>>(g, dzh, wh, dx, xo, accumulate, a, zb, nullptr);
    else if (g.S == 2) conv_dgrad_kernel<false, 2><<<grid, 128, 0, s>>>(g, dzh, wh, dx, xo, accumulate, a, zb, nullptr);
    else conv_dgrad_kernel<false, 0><<<grid, 128, 0, s>>>(g, dzh, wh, dx, xo, accumulate, a, zb, nullptr);
    CUDA_CHECK(cudaGetLastError());
    return part ? (long)grid.x : 0;
}
extern "C" void conv_dgrad_cuda(ConvDims d, const uint16_t *dz, const uint16_t *w, const uint16_t *wt, float *dx,
                                uint16_t *dxh, int accumulate, void *stream) {
    conv_dgrad_run(d, dz, w, wt, dx, dxh, accumulate, stream, nullptr, nullptr, nullptr, 0);
}
extern "C" long conv_dgrad_bn_cuda(ConvDims d, const uint16_t *dz, const uint16_t *w, const uint16_t *wt, uint16_t *dxh,
                                   const uint16_t *z, const ConvAct *bn, float *part, long kmax, void *stream) {
    return conv_dgrad_run(d, dz, w, wt, nullptr, dxh, 0, stream, z, bn, part, kmax);
}

// wgrad reduces over B*Ho*Wo, long for the early layers while M and N are small: the launcher
// splits that range over grid.z (conv_wgrad_split: kchunk values each) when the tile grid alone would
// leave the GPU idle; each slice then stores its partial dW into the workspace ws (Cout*N floats per
// slice) and wgrad_reduce_kernel adds the slices in a fixed order (deterministic).
// conv_wgrad_kernel: dW[co, n = (ci, ky, kx)] over pixels k = (b, oy, ox), a 64x64 tile of (Cout, Cin*KK)
// per block, with the index math out of the K loop as in conv_fwd_kernel: the block's 64 taps (and, for ACT, their
// channels' BN scale and shift) are decoded once into shared memory; per K step each thread decodes one pixel (b, oy,
// ox) and gathers 16 taps of it. col(x) is staged transposed (tap-major, pixels contiguous: matrix_b col_major) so that
// a warp's 32 pixels of one tap land in consecutive shared addresses. Where the pixels are contiguous in memory (AVEC:
// dz with Ho*Wo and the image stride multiples of 8; BVEC: 1x1 stride-1 x likewise) operands move as 16-byte cp.async
// (ACT through registers). Two stages, one barrier per K step; the epilogue stores 8 consecutive dW values per lane
// (16-byte where aligned).
template <bool ACT, bool AVEC, bool BVEC>
__global__ __launch_bounds__(128, BVEC && ACT ? IG_ACT_WGRAD_BLOCKS : 0)
void conv_wgrad_kernel(ConvGeo g, const __half *dz, const __half *x, ConvAct a, float *dw, float *ws, int accumulate,
                       int kchunk) {
    using namespace nvcuda;
    __shared__ __align__(128) __half As[2][IG_BM][IG_BK + 8];    // (stage, 64 of Cout, 32 pixels)
    __shared__ __align__(128) __half Bt[2][IG_BN][IG_BK + 8];    // (stage, 64 taps, 32 pixels): col(x)^T
    __shared__ ConvTap tap[IG_BN];
    __shared__ float2 tbn[IG_BN];
    __shared__ __align__(32) float Cs[4][16][16];
    const int tid = threadIdx.x, warp = tid / 32, wy = warp / 2, wx = warp % 2;
    const int M = g.Cout, N = g.Cin * g.KK, HW = g.H * g.W, HWo = g.Ho * g.Wo, Kd = g.B * HWo;
    const int kbeg = blockIdx.z * kchunk, kend = min(Kd, kbeg + kchunk);
    const int row0 = blockIdx.y * IG_BM, col0 = blockIdx.x * IG_BN, nsteps = (kend - kbeg + IG_BK - 1) / IG_BK;
    float *part = gridDim.z > 1 ? ws + (long)blockIdx.z * M * N : nullptr;
    const __half hzero = __float2half(0.0f);
    if (tid < IG_BN) {
        int n = col0 + tid, ci = div_fast(n, g.fKK), kk = n - ci * g.KK, ky = div_fast(kk, g.fK);
        ConvTap t = {ci * HW + ky * g.W + (kk - ky * g.K), n < N ? ky : 1 << 24, kk - ky * g.K, 0};
        tap[tid] = t;
        if (ACT) tbn[tid] = n < N ? bn_fold(a, ci) : make_float2(0.0f, 0.0f);
    }
    __syncthreads();
    const int pr = tid % IG_BK, pc = tid / IG_BK;        // scalar paths: pixel row pr, rows/taps pc + 4j
    const int vr = ig_row4(tid), vk = (tid % 4) * 8;      // vector paths: rows/taps vr + 32i, pixels vk..vk+7
    union { uint4 u[2]; __half h[16]; } bv;               // B of the next step in registers (gather, or BVEC+ACT)
    union { uint4 u[2]; __half h[16]; } av;               // A of the next step in registers (scalar A)
    // AVEC or BVEC: the thread's chunk of 8 pixels, kbeg + vk + 32 s in step s (wholly one image's: HWo,
    // kbeg and vk are multiples of 8), walked by running pointers, one K step at a time: zc, dz's row
    // row0 + vr at it (am: rows vr + 32 i inside M, a32 apart); xc0 / xc1, BVEC's x channels col0 + vr
    // (+ 32), past N the last, N - 1, whose first pixels (image 0) are pb0 / pb1; zq / xq a step's move in
    // dz and x (32 pixels: q32 images and r32 pixels on), zw / xw the move where p8, the chunk's pixel in
    // its image, passes HWo (one image more, HWo pixels fewer); rem: the slice's pixels from the chunk on
    // (none: past its end)
    int p8 = 0, r32 = 0, rem = 0;
    long zq = 0, xq = 0, zw = 0, xw = 0;
    const long a32 = 32L * HWo;
    const __half *zc = dz, *pb0 = x, *pb1 = x, *xc0 = x, *xc1 = x;
    bool am[2] = {false, false};
    if (AVEC || BVEC) {
        const int k8 = kbeg + vk, b8 = div_fast(k8, g.fHWo), q32 = div_fast(IG_BK, g.fHWo);
        p8 = k8 - b8 * HWo;
        r32 = IG_BK - q32 * HWo;
        rem = kend - k8;
        zq = q32 * g.zs + r32; xq = q32 * g.xs + r32;
        zw = zq + g.zs - HWo; xw = xq + g.xs - HWo;
        zc = dz + (b8 * g.zs + (long)(row0 + vr) * HWo + p8);
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const int r = vr + 32 * i;
            am[i] = row0 + r < M;
            (i ? pb1 : pb0) = x + (long)min(col0 + r, N - 1) * HW;
        }
        xc0 = pb0 + (b8 * g.xs + p8); xc1 = pb1 + (b8 * g.xs + p8);
    }
    auto fetch = [&](int s) {
        int k0 = kbeg + s * IG_BK;
        // the thread's scalar pixel, decoded once per K step
        int k = k0 + pr, kok = k < kend, b = div_fast(k, g.fHWo), p = k - b * HWo;
        if (!AVEC) {
            const __half *src = dz + b * g.zs + p;
#pragma unroll
            for (int j = 0; j < 16; j++) {
                int m = row0 + pc + 4 * j;
                av.h[j] = kok && m < M ? src[(long)m * HWo] : hzero;
            }
        }
        if (!BVEC) {
            int oy = div_fast(p, g.fWo), ox = p - oy * g.Wo;
            int iy0 = kok ? oy * g.S - g.pad : -(1 << 26), ix0 = ox * g.S - g.pad;
            const __half *xb = kok ? x + b * g.xs + iy0 * g.W + ix0 : x;
#pragma unroll
            for (int j = 0; j < 16; j++) {
                int c = pc + 4 * j;
                ConvTap t = tap[c];
                int iy = iy0 + t.ky, ix = ix0 + t.kx;
                __half v = hzero;
                if ((unsigned)iy < (unsigned)g.H && (unsigned)ix < (unsigned)g.W) {
                    v = xb[t.off];
                    if (ACT) { float2 bn = tbn[c]; v = __float2half(bn_silu_folded(__half2float(v), bn.x, bn.y)); }
                }
                bv.h[j] = v;
            }
        }
        if (AVEC || BVEC) {   // 8 pixels of one image: the thread's chunk (zc, xc0, xc1), then 32 pixels on
            const bool ok8 = rem > 0;
            rem -= IG_BK;
#pragma unroll
            for (int i = 0; i < 2; i++) {
                int r = vr + 32 * i;
                if (AVEC) {   // (16 zero bytes past the edges, nothing read)
                    const bool ok = ok8 && am[i];
                    cp_async16z(&As[s & 1][r][vk], ok ? zc + (i ? a32 : 0L) : dz, ok);
                }
                if (BVEC) {   // 1x1 stride 1: tap n is channel n
                    if (!ACT) {
                        const bool ok = ok8 && col0 + r < N;
                        cp_async16z(&Bt[s & 1][r][vk], ok ? (i ? xc0 + 32L * HW : xc0) : x, ok);
                    } else {
                        // no test but the slice's end: a tap past N reads channel N - 1 (pb) and has the scale
                        // and shift (0, 0), so 0 (x 0 + 0); past the slice (ok8) the chunk is its channel's first
                        // 8 pixels, with (0, 0) too (silu(shift) itself could round to an FP16 inf, which times
                        // dz's zeros would be NaN). An x there that is not finite gives NaN in this slice's
                        // partial sums; slice 0 reads the same pixels of the channel, so its column of dW is
                        // not finite after the reduction either way (NaN where it may have been inf)
                        const float2 t = tbn[r], bn = ok8 ? t : make_float2(0.0f, 0.0f);
                        const __half *src = i ? (ok8 ? xc1 : pb1) : (ok8 ? xc0 : pb0);
                        bv.u[i] = bn_silu8(*(const uint4 *)src, bn.x, bn.y);
                    }
                }
            }
            // the next step's chunk: 32 pixels on, q32 images and r32 pixels, one image more where p8 passes
            // the map's end (HWo and the chunks multiples of 8: a chunk is one image's)
            p8 += r32;
            const bool wrap = p8 >= HWo;
            p8 -= wrap ? HWo : 0;
            const long dz8 = wrap ? zw : zq, dx8 = wrap ? xw : xq;
            zc += dz8;
            xc0 += dx8;
            if (ACT) xc1 += dx8;   // (without ACT a channel past N is not read: xc0's 32 channels on)
        }
    };
    auto store = [&](int s) {   // registers -> shared stage s & 1
        if (!AVEC) {
#pragma unroll
            for (int j = 0; j < 16; j++) As[s & 1][pc + 4 * j][pr] = av.h[j];
        }
        if (!BVEC) {
#pragma unroll
            for (int j = 0; j < 16; j++) Bt[s & 1][pc + 4 * j][pr] = bv.h[j];
        } else if (ACT) {
#pragma unroll
            for (int i = 0; i < 2; i++) *(uint4 *)&Bt[s & 1][vr + 32 * i][vk] = bv.u[i];
        }
    };

    ConvAcc acc[2][2];
    conv_warp_zero(acc);
    conv_k_loop<AVEC && BVEC ? 2 : 1>(nsteps, [](int) {}, fetch, store, [&](int s) {
        conv_warp_step<wmma::row_major, wmma::col_major>(
            acc, [&](int i, int kk) { return &As[s & 1][wy * 32 + i * 16][kk]; }, IG_BK + 8,
            [&](int j, int kk) { return &Bt[s & 1][wx * 32 + j * 16][kk]; }, IG_BK + 8);
    });
    float *out = part ? part : dw;
    const int acm = part ? 0 : accumulate, ldo = part ? N : g.wst;   // (dW's rows: g.wst apart, a slice's N)
    conv_warp_store(acc, Cs[warp], row0 + wy * 32, col0 + wx * 32, [&](int m, int n, const float *c) {
        if (m >= M || n >= N) return;
        long o = (long)m * ldo + n;
        if (n + 8 <= N && ((uintptr_t)(out + o) & 15) == 0) {
            float4 v0 = make_float4(c[0], c[1], c[2], c[3]), v1 = make_float4(c[4], c[5], c[6], c[7]);
            if (acm) {
                float4 u0 = *(const float4 *)(out + o), u1 = *(const float4 *)(out + o + 4);
                v0 = make_float4(u0.x + v0.x, u0.y + v0.y, u0.z + v0.z, u0.w + v0.w);
                v1 = make_float4(u1.x + v1.x, u1.y + v1.y, u1.z + v1.z, u1.w + v1.w);
            }
            *(float4 *)(out + o) = v0; *(float4 *)(out + o + 4) = v1;
        } else {
#pragma unroll
            for (int e = 0; e < 8; e++)   // (unrolled: c is in registers)
                if (n + e < N) out[o + e] = acm ? out[o + e] + c[e] : c[e];
        }
    });
}
// conv_halo_wgrad_kernel: the weight gradient of a 3x3 conv, dW[co, ci, t] = sum over output pixels of
// dz[co, p] in[ci, S p shifted by tap t], by the same halo tiles. A block owns 64 output channels by 16
// input channels x 9 taps (each warp 32 output channels by 5 or 4 of the taps) and steps
// through its slice of the batch's pixel tiles (TR x TC pixels of one image, grid.z slices in order,
// as conv_wgrad_split splits the pixels for the gather kernel). Per K step: dz's 64 x 128 tile by
// cp.async (VW halves per copy), and the 16 channels' halo, position-major as in conv_halo_kernel
// (through registers, ACT's BN+SiLU applied once per value), so that tap t's B tile (16 pixels by 16
// channels) is matrix_b row-major at a 32-byte aligned address. Two shared stages, warp-specialised as
// conv_halo_kernel: warps 4-7 stage K step s + 1 (dz by cp.async, the halo through registers) while
// warps 0-3 multiply step s, the stages handed over by named barriers (FULL 1 + st, EMPTY 3 + st). The
// epilogue gathers the warps' taps into the block's 64 rows of dW (16 channels x 9 taps
// contiguous) and stores them 16 bytes at a time where dW is aligned. S2 (stride 2): tiles of 4 x 16
// output pixels (64, so that two stages of the 9 x 33 input window fit 48 KB), whose B tiles are
// every other halo column (consecutive positions of H3Halo's de-interleaved rows); dz's rows are Wo
// wide, x's W.
template <bool ACT, bool S2, int TC, int VW>
__global__ __launch_bounds__(256, H3_MIN_BLOCKS)
void conv_halo_wgrad_kernel(ConvGeo g, const __half *dz, const __half *x, ConvAct a, float *dw, float *ws, int accumulate,
                            int nslices) {
    constexpr int BNW = S2 ? 64 : H3_BN;   // pixels per tile: a stride-2 halo is 4x the input of its tile
    // ROWS (TC H3_ROW_TC, dz rows a multiple of 4 copied 8 bytes at a time): tiles of RT whole rows of
    // dz's map (as conv_halo_kernel's: stride 2, H3_ROW_RT rows, 64 pixels; a 20-wide map's 60
    // consecutive pixels of dz, the 4 past them zero-filled, their 7 x 41 window staged as a 20-column
    // tile's, x's rows in 16-byte pieces, VW 8: x's own width, whatever dz's; stride 1, H3_ROW_RT1 rows,
    // 128 pixels, 120 of them a 20-wide map's, the window 8 x 22 in 8-byte pieces, VW 4)
    // (or stride 1's 40-column tiles: H3_ROW_RT40 rows, their 5 x 42 window in 16-byte pieces, VW 8)
    constexpr bool ROWS = h3_rows(TC);
    static_assert(!ROWS || VW == (S2 || TC == H3_ROW_TC40 ? 8 : 4), "row tiles load x 16 bytes at a time (stride 1's 20-column ones 8)");
    static_assert(!(S2 && TC == H3_ROW_TC40), "40-column row tiles are stride 1's");
    // the halo: at stride 2 padded to 48 bytes a position (two stages of its 9 x 33 window and dz's tile
    // fit 48 KB), at stride 1 32 bytes and swizzled (padded they would not)
    typedef H3Halo<TC, VW, S2, ROWS ? h3_row_rt(S2, TC) * TC : BNW, S2 ? H3_KC + 8 : H3_KC> Halo;
    constexpr int KP = Halo::PITCH;
    constexpr int TR = Halo::TR, HC = Halo::HC, FPR = TC / 16, SH = S2 ? 2 : 1;
    constexpr int LDA = BNW + 8, A_BYTES = H3_BM * LDA * 2, B_BYTES = (Halo::HR * HC * KP * 2 + 127) / 128 * 128;
    // the epilogue's rows of 144 floats at a pitch of 148 (16-byte aligned: read back as float4). A
    // store's 32 lanes write rows gq (0-7) at columns 18 tq (0-3) + a constant: at the pitch of 144
    // (16 banks a row) 4 lanes a bank. With rows 16-byte aligned every such address is an even number
    // of words from the first (16 banks of 32), so the odd rows swap their accumulator pair's two
    // columns (9 words apart) between the two stores: at the pitch of 148 the 32 lanes then write 32
    // banks (at 144 no such rule does better than 2 lanes a bank; a search over the swaps decided by
    // bits of gq and tq)
    constexpr int STAGE = A_BYTES + B_BYTES, LDE = 9 * H3_KC + 4, E_BYTES = 4 * 16 * LDE * 4;
    constexpr int SMEM = 2 * STAGE > E_BYTES ? 2 * STAGE : E_BYTES;
    static_assert(A_BYTES % 128 == 0 && B_BYTES % 128 == 0 && SMEM <= 48 * 1024, "shared memory plan");
    __shared__ __align__(128) unsigned char sm[SMEM];   // two stages (dz tile, halo); then the epilogue's rows
    auto As = [&](int st) { return (__half(*)[LDA])(sm + st * STAGE); };
    auto Bs = [&](int st) { return (__half(*)[KP])(sm + st * STAGE + A_BYTES); };
    // producers (warps 4-7) and consumers (0-3) each number their threads 0-127
    const bool producer = threadIdx.x >= 128;
    const int tid = threadIdx.x & 127, warp = tid / 32, lane = tid % 32;
    const int Cout = g.Cout, Cin = g.Cin, H = g.H, W = g.W, HW = H * W, N = Cin * 9;
    const int OH = g.Ho, OW = g.Wo, OHW = OH * OW;   // dz's map (S2: every other input pixel's)
    constexpr int RT = TR;   // rows a tile (ROWS: H3_ROW_RT, H3_ROW_RT1 or H3_ROW_RT40)
    const int tilesX = ROWS ? 1 : (OW + TC - 1) / TC, per_img = tilesX * ((OH + RT - 1) / RT), ntiles = g.B * per_img;
    const int c0 = blockIdx.x * H3_KC, m0 = blockIdx.y * H3_BM, z = blockIdx.z;
    const int kt0 = (int)((long)ntiles * z / nslices), kt1 = (int)((long)ntiles * (z + 1) / nslices);
    // the block's 16 input channels: the thread's is cc (row tiles: its pairs of pieces aligned for the
    // slice's first tile, whose later ones' windows lie a multiple of 32 bytes on where x's rows, planes
    // and images are; others' or not, the same values. At stride 1 a tile's window lies 240 bytes on (6
    // rows of 20, or 3 of 40): every other tile's quads (pairs) span two sectors, a cost left as it is:
    // renumbering the pieces each K step would take the producers' loop more instructions)
    const int cc = c0 + Halo::chan(tid), kb0 = kt0 / per_img;
    Halo halo;
    halo.init(tid, Halo::pair_shift(x + kb0 * g.xs + (long)cc * HW, SH * (kt0 - kb0 * per_img) * RT, 0, W));
    const float2 bnf = ACT && cc < Cin ? bn_fold(a, cc) : make_float2(0.0f, 0.0f);
    int tb = 0, ty0 = 0, tx0 = 0;   // the tile being fetched
    auto tile = [&](int kt) {
        tb = kt / per_img;
        ty0 = ROWS ? (kt - tb * per_img) * RT : Halo::tile_y(kt - tb * per_img, tilesX);
        tx0 = ROWS ? 0 : Halo::tile_x(kt - tb * per_img, tilesX);
    };
    auto fetch_dz = [&](int st) {   // the tile's dz by cp.async into stage st
        const __half *zb = dz + tb * g.zs;
        __half(*A)[LDA] = As(st);
        if constexpr (ROWS) {   // copy i of a thread: pixels CW (tid % TPR) .. of channel row tid / TPR + RPI i
            // CW halves a copy: 8 (16 bytes) on 40 columns, whose dz rows, map and tiles are multiples of
            // 8 halves (conv_halo_rows' vw 8), else 4; TPR threads a channel row, RPI rows a copy
            constexpr int CW = TC == H3_ROW_TC40 ? 8 : 4, TPR = BNW / CW, RPI = 128 / TPR;
            const int px = CW * (tid % TPR), mt = tid / TPR;
            const bool in_map = px < min(RT, OH - ty0) * OW;
            const long off = (long)(m0 + mt) * OHW + ty0 * OW + px;
#pragma unroll
            for (int i = 0; i < H3_BM / RPI; i++) {
                const bool ok = in_map && m0 + mt + RPI * i < Cout;
                cp_asyncz<2 * CW>(&A[mt + RPI * i][px], ok ? zb + off + (long)RPI * i * OHW : dz, ok);
            }
        } else {
            // copy q = tid + 128 i: column q % CPR of tile row q / CPR % TR of channel row q / RPC; 128 being
            // a multiple of RPC, a thread's copies share their column and tile row, their channel rows MS
            // apart: the test of the map and the first source once a step, then constant strides. Past the
            // map or the channels a copy reads nothing and zero-fills (source size 0; dz as its address).
            constexpr int CPR = TC / VW, RPC = CPR * TR, MS = 128 / RPC, NA = H3_BM * RPC;
            static_assert(128 % RPC == 0 && NA % 128 == 0, "dz tile copies");
            const int col = tid % CPR, rr = tid / CPR % TR, mt = tid / RPC, y = ty0 + rr, xx = tx0 + col * VW;
            const bool in_map = y < OH && xx < OW;
            const long off = (long)(m0 + mt) * OHW + y * OW + xx;
#pragma unroll
            for (int i = 0; i < NA / 128; i++) {
                const bool ok = in_map && m0 + mt + MS * i < Cout;
                cp_asyncz<2 * VW>(&A[mt + MS * i][rr * TC + col * VW], ok ? zb + off + (long)MS * i * OHW : dz, ok);
            }
        }
    };
    auto fetch_halo = [&]() {   // the tile's halo into registers
        halo.fetch(cc < Cin ? x + tb * g.xs + (long)cc * HW : nullptr, SH * ty0, SH * tx0, H, W);
    };
    auto store = [&](int st) { halo.template store<ACT>(Bs(st), bnf); };
    // each warp: 32 output channels (2 A tiles, rows 32 wy ..) by 16 input channels of 5 taps (wx 0:
    // taps 0..4) or 4 (wx 1: taps 5..8), as mma.sync m16n8k16 tiles (acc[i][u][j]: A tile i, tap u,
    // channels 8j ..): per 16 pixels 2 ldmatrix.x4 of dz and one ldmatrix.x4.trans of the halo
    // per tap (both halves of its 16 channels), which serves 4 products
    const int wy = warp >> 1, wx = warp & 1;
    float acc[2][5][2][4];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int u = 0; u < 5; u++)
#pragma unroll
            for (int j = 0; j < 2; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) acc[i][u][j][e] = 0.0f;
    const int nsteps = kt1 - kt0;
    const bool wlive = m0 + wy * 32 < Cout;   // the warp's output channels are not all past Cout (warp-uniform)
    // this lane's ldmatrix rows: row lane % 16 of an A tile, its columns 8 (lane / 16) ..; position
    // lane % 16 of a B tile, its channels 8 (lane / 16) .. (H3Halo::at: the halves swapped where they are)
    const int lr = lane & 15, lh = lane >> 4;
    if (producer) {   // step s + 1's halo loads are in flight while the consumers may still hold its stage
        if (nsteps > 0) { tile(kt0); fetch_halo(); }
        for (int s = 0; s < nsteps; s++) {
            const int st = s & 1;
            if (s >= 2) bar_sync_n(3 + st, 256);
            fetch_dz(st);
            __pipeline_commit();
            store(st);
            __pipeline_wait_prior(0);
            bar_arrive_n(1 + st, 256);
            if (s + 1 < nsteps) { tile(kt0 + s + 1); fetch_halo(); }
        }
        return;
    }
    // stride 1's row tiles: a K step multiplies only the B tiles with pixels of the tile (nf; the last
    // tile of a 20-row map is 2 rows, 40 of its 128 pixels: 3 B tiles of 8), the rest being dz's zeros
    // (block-uniform; the products kept are the same, in the same order)
    int rt_img = ROWS && !S2 ? (kt0 - kt0 / per_img * per_img) * RT : 0;   // the step's tile's first row
    // a K step's NB B tiles, FU unrolled a trip: at stride 2 all 4 in one; at stride 1 two trips of 4 (all
    // 8 unrolled, ptxas kept each tile's shared addresses live across the K loop: 149-152 registers, one
    // block an SM, 4 warps multiplying; two trips: 119-128 (sm_80) and two blocks, 8 warps, at 2.1-2.8 more
    // PTX instructions per HMMA, 7.0-9.9)
    constexpr int NB = BNW / 16, FU = S2 ? NB : 4;
    static_assert(FU % FPR == 0 && NB % FU == 0, "B tiles a trip");
    for (int s = 0; s < nsteps; s++) {
        const int st = s & 1;
        kstep_mark();
        bar_sync_n(1 + st, 256);
        __half(*A)[LDA] = As(st);
        __half(*B)[KP] = Bs(st);
        int nf = NB;
        if constexpr (ROWS && !S2) {
            nf = (min(RT, OH - rt_img) * OW + 15) / 16;
            rt_img = rt_img + RT < OH ? rt_img + RT : 0;
        }
        // ROWS: where this lane's ldmatrix pixel of B tile f, 16 f + lr of the tile's RT x OW, lies in
        // the window, for tap (0, 0): row qr, column qc of the tile, 16 pixels on from tile to tile (at
        // most one row: such maps are at least 16 wide, conv_halo_rows); a pixel past the tile's reads
        // its last one, by a zero of dz
        int qr = 0, qc = lr;
#pragma unroll 1
        for (int f0 = 0; f0 < NB; f0 += FU) {
            if (!wlive || (!S2 && ROWS && f0 >= nf)) break;
#pragma unroll
            for (int fi = 0; fi < FU; fi++) {
                const int f = f0 + fi;
                if (!S2 && ROWS && f >= nf) break;
                const int r = f0 / FPR + fi / FPR, sg = fi % FPR;
                int pb = 0;
                if constexpr (ROWS) {
                    pb = qr < RT ? SH * qr * HC + qc : SH * (RT - 1) * HC + OW - 1;
                    qc += 16;
                    if (qc >= OW) qc -= OW, qr++;
                }
                uint32_t fa[2][4];
#pragma unroll
                for (int i = 0; i < 2; i++) ldsm_x4(fa[i], &A[wy * 32 + i * 16 + lr][f * 16 + 8 * lh]);
#pragma unroll
                for (int u = 0; u < 5; u++) {
                    const int t = 5 * wx + u;
                    if (t < 9) {   // warp-uniform
                        // S2: the tile's pixels are every other halo column, consecutive positions of
                        // the de-interleaved row
                        const int p = ROWS ? pb + t / 3 * HC + Halo::col(t % 3)
                                           : (SH * r + t / 3) * HC + Halo::col(t % 3) + sg * 16 + lr;
                        uint32_t fb[4];
                        ldsm_x4_t(fb, Halo::at(B, p, 8 * lh));
#pragma unroll
                        for (int i = 0; i < 2; i++)
#pragma unroll
                            for (int j = 0; j < 2; j++) {
                                const uint32_t bj[2] = {fb[2 * j], fb[2 * j + 1]};
                                mma_16816(acc[i][u][j], fa[i], bj);
                            }
                    }
                }
            }
        }
        if (s + 2 < nsteps) bar_arrive_n(3 + st, 256);   // (the producers wait for it only to write step s + 2)
    }
    bar_sync_n(5, 128);   // every consumer is past the K loop: the epilogue's rows overwrite the stages
    // epilogue: the block's 64 x 16 x 9 results as 64 rows of 144 floats (channel-major, then tap), each
    // row dW[co, c0*9 .. c0*9 + 143] (or the slice's share of ws), 16-byte stores
    float(*E)[LDE] = (float(*)[LDE])sm;
    const int gq = lane >> 2, tq = lane & 3;   // the accumulators' rows gq, gq + 8 and columns 2 tq, 2 tq + 1
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int u = 0; u < 5; u++) {
            const int t = 5 * wx + u;
            if (t >= 9 || m0 + wy * 32 + i * 16 >= Cout) continue;   // warp-uniform
#pragma unroll
            for (int j = 0; j < 2; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) {   // (odd rows gq swap a pair's columns: see E)
                    const int f = e ^ (gq & 1);
                    E[wy * 32 + i * 16 + gq + 8 * (e >> 1)][(8 * j + 2 * tq + (f & 1)) * 9 + t] =
                            gq & 1 ? acc[i][u][j][e ^ 1] : acc[i][u][j][e];
                }
        }
    bar_sync_n(5, 128);
    float *out = nslices > 1 ? ws + (long)z * Cout * N : dw;
    const int acm = nslices > 1 ? 0 : accumulate, nv = min(H3_KC, Cin - c0) * 9;   // valid floats per row
#pragma unroll
    for (int e = 0; e < 18; e++) {
        int i = tid + 128 * e, r = i / 36, c4 = (i % 36) * 4, m = m0 + r;
        if (m >= Cout || c4 >= nv) continue;
        float *o = out + (long)m * N + c0 * 9 + c4;
        float4 v = *(const float4 *)&E[r][c4];   // 16-byte reads, 8 lanes a phase (one a row ends in: 2 passes)
        if (((uintptr_t)o & 15) == 0) {   // dW is a slice of the gradient buffer: 16-byte aligned or not
            if (acm) { float4 u = *(const float4 *)o; v = make_float4(u.x + v.x, u.y + v.y, u.z + v.z, u.w + v.w); }
            *(float4 *)o = v;
        } else {
            o[0] = acm ? o[0] + v.x : v.x; o[1] = acm ? o[1] + v.y : v.y;
            o[2] = acm ? o[2] + v.z : v.z; o[3] = acm ? o[3] + v.w : v.w;
        }
    }
}
// wgrad_reduce: dw[i] (+)= the sum of the S slices ws[z][i] in a fixed order: lane y of WRED_LANES adds
// slices y, y + WRED_LANES, y + 2 WRED_LANES, ... in turn (8 slices' loads issued before their adds), then
// the lanes' sums are added in lane order, then (accumulate) dw[i] + that: the same bits on every run
// and every block schedule. Blocks of (WRED_COLS columns, WRED_LANES lanes); V: float4 (n a multiple of 4,
// ws and dw 16-byte aligned: 4 consecutive i per column, 16-byte loads and stores) or float. The lanes
// keep a deep split (the early layers' ~1000 slices) from being one chain of dependent loads.
enum { WRED_COLS = 16, WRED_LANES = 16 };
__device__ __forceinline__ void wred_add(float4 &a, const float4 &b) { a.x += b.x; a.y += b.y; a.z += b.z; a.w += b.w; }
__device__ __forceinline__ void wred_add(float &a, const float &b) { a += b; }
// wred_ld: *p, one access of sizeof(V) bytes. nvcc loads a float4 with one ld.global.v4.f32; g++, which
// builds the emulation's counting kernels (make emu-count), split the copy of a float4 whose parts are
// then added into four 4-byte loads, and the counts took each for a 4-byte request of 32 lanes 16 bytes
// apart (4 times the sectors). Under the emulation the 16 bytes are copied as one GCC vector
#ifdef CUDA_EMU_MMA
template <class V> __device__ __forceinline__ V wred_ld(const V *p) {
    if constexpr (sizeof(V) == 16) {
        typedef float W __attribute__((vector_size(16)));
        const W w = *(const W *)p;
        V v;
        __builtin_memcpy(&v, &w, sizeof v);
        return v;
    } else return *p;
}
#else
template <class V> __device__ __forceinline__ V wred_ld(const V *p) { return *p; }
#endif
template <class V>
__global__ __launch_bounds__(WRED_COLS * WRED_LANES) void wgrad_reduce_kernel(const float *ws, long n, int S, float *dw,
                                                                             int accumulate, int N, int ldw) {
    __shared__ V part[WRED_LANES][WRED_COLS];
    const long nv = n / (long)(sizeof(V) / sizeof(float));
    const long c = (long)blockIdx.x * WRED_COLS + threadIdx.x;
    const int y = threadIdx.y;
    V sum = V();
    if (c < nv) {
        const V *p = (const V *)ws + c;
        int z = y;
        for (; z + 7 * WRED_LANES < S; z += 8 * WRED_LANES) {
            V u[8];
#pragma unroll
            for (int q = 0; q < 8; q++) u[q] = wred_ld(p + (long)(z + q * WRED_LANES) * nv);
#pragma unroll
            for (int q = 0; q < 8; q++) wred_add(sum, u[q]);
        }
        for (; z < S; z += WRED_LANES) wred_add(sum, wred_ld(p + (long)z * nv));
    }
    part[y][threadIdx.x] = sum;
    __syncthreads();
    if (y || c >= nv) return;
    V t = part[0][threadIdx.x];
    for (int l = 1; l < WRED_LANES; l++) wred_add(t, part[l][threadIdx.x]);
    constexpr int E = sizeof(V) / sizeof(float);   // (dW's rows of N values ldw apart: row c / (N / E))
    V *d = (V *)dw + (ldw == N ? c : c / (N / E) * (ldw / E) + c % (N / E));
    if (accumulate) {
        V o = wred_ld(d);
        wred_add(o, t);
        t = o;
    }
    *d = t;
}
// wgrad_begin / wgrad_end: what both weight-gradient launchers (FP16 and FP32, 64x64 tiles) do around
// their kernel: the grid with its slices (false: nothing to launch; an empty reduction zeroes dw
// when overwriting), then the ordered sum of the slices
static bool wgrad_begin(const ConvGeo &g, const ConvDims &d, int f32, float *dw, const float *ws, int accumulate,
                        cudaStream_t s, dim3 *grid, long *kchunk) {
    long N = (long)g.Cin * g.KK, Kd = (long)g.B * g.Ho * g.Wo;
    // a strided dW (d.wstride: these Cin columns of a wider conv's rows, a concat's part) only where the
    // kernel is conv_wgrad_kernel, the 1x1 FP16 one (the others write their rows dense)
    if (g.wst != N && (f32 || g.K != 1)) {
        fprintf(stderr, "conv_wgrad%s_cuda: a strided dW (wstride %d for %ld columns) is the 1x1 FP16 kernel's only\n",
                f32 ? "_f32" : "", g.wst, N);
        exit(1);
    }
    if (N == 0 || g.Cout == 0) return false;
    if (Kd == 0) {
        for (int r = 0; !accumulate && r < (g.wst == N ? 1 : g.Cout); r++)   // (a strided dW row by row)
            CUDA_CHECK(cudaMemsetAsync(dw + (long)r * g.wst, 0, sizeof(float) * N * (g.wst == N ? g.Cout : 1), s));
        return false;
    }
    *grid = dim3(cdiv(N, 64), cdiv(g.Cout, 64), (unsigned)conv_wgrad_split(d, f32, kchunk));
    if (grid->z > 1 && !ws) {
        fprintf(stderr, "conv_wgrad%s_cuda: a split of %u slices needs its workspace\n", f32 ? "_f32" : "", grid->z);
        exit(1);
    }
    return true;
}
static void wgrad_end(const ConvGeo &g, dim3 grid, const float *ws, float *dw, int accumulate, cudaStream_t s) {
    CUDA_CHECK(cudaGetLastError());
    if (grid.z < 2) return;
    const int N = g.Cin * g.KK;
    long n = (long)g.Cout * N;
    const dim3 blk(WRED_COLS, WRED_LANES);
    if ((g.wst == N ? n % 4 == 0 : N % 4 == 0 && g.wst % 4 == 0) && (uintptr_t)ws % 16 == 0 && (uintptr_t)dw % 16 == 0)
        wgrad_reduce_kernel<float4><<<cdiv(n / 4, WRED_COLS), blk, 0, s>>>(ws, n, (int)grid.z, dw, accumulate, N, g.wst);
    else
        wgrad_reduce_kernel<float><<<cdiv(n, WRED_COLS), blk, 0, s>>>(ws, n, (int)grid.z, dw, accumulate, N, g.wst);
    CUDA_CHECK(cudaGetLastError());
}
// device_attr: attribute attr of the current device, asked once per device (cache: one slot a device,
// 0 not asked yet; a value under 1 is read as 1)
static int device_attr(cudaDeviceAttr attr, int (&cache)[64]) {
    int dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    if (dev >= 0 && dev < 64 && cache[dev]) return cache[dev];
    int n = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&n, attr, dev));
    if (n < 1) n = 1;
    if (dev >= 0 && dev < 64) cache[dev] = n;
    return n;
}
// sm_count: the current device's SMs
static int sm_count() {
    static int sms[64];
    return device_attr(cudaDevAttrMultiProcessorCount, sms);
}
// halo_wgrad_resident: the blocks of conv_halo_wgrad_kernel an SM holds: two where its shared memory
// holds two (at most 48 KB a block, and the 1 KB the system keeps for each), their registers asked for
// two (H3_MIN_BLOCKS): sm_80-sm_90 (100-228 KB an SM); sm_75's 64 KB hold one
static int halo_wgrad_resident() {
    static int smem[64];
    return device_attr(cudaDevAttrMaxSharedMemoryPerMultiprocessor, smem) >= 2 * (48 + 1) * 1024 ? 2 : 1;
}
// halo_wgrad_slices: how many slices conv_halo_wgrad_kernel splits a weight gradient's ntiles pixel
// tiles into, given its cols blocks a slice (input-channel groups x output-channel groups), at most
// maxs (the gather kernel's split, whose workspace the plan holds), with sms blocks running at once
// (halo_wgrad_resident's an SM: two, 16 warps, where one was sized for before stride 1's ran two), each
// a 64 x 144 tile, 2.25 of the gather kernel's 64 x 64: the
// gather kernel's split (about 1024 of its blocks, slices of at least 8 of its 32-pixel k-steps) gave
// them 400-480 blocks of 2-7 halo K steps (128 pixels), 3-4 waves on an H200's 132 SMs with the last
// nearly idle, each block's pipeline fill and epilogue (36 KB of FP32 partials) paid once per wave, and
// ~15 MB of partials written and read back per conv. Instead the split with the least modeled time,
// waves x (F + K steps a slice), F = 2 K steps' worth for the fill and the epilogue (an assumption);
// the fewer slices on a tie (less workspace traffic). An H200, 64 -> 64 channels on 40 x 40, batch
// 16, when the waves were counted at one block an SM and before the row tiles: 30 slices, 120 blocks
// of 8 K steps (was 100 slices, 400 blocks of 2-3).
static int halo_wgrad_slices(int cols, long ntiles, int maxs, int sms) {
    int best = 1;
    long bt = -1;
    for (int ns = 1; ns <= maxs && ns <= ntiles; ns++) {
        const long waves = ((long)cols * ns + sms - 1) / sms, t = waves * (2 + (ntiles + ns - 1) / ns);
        if (bt < 0 || t < bt) bt = t, best = ns;
    }
    return best;
}
extern "C" void conv_wgrad_cuda(ConvDims d, const uint16_t *dz, const void *x, const ConvAct *act, float *dw,
                                float *ws, int accumulate, void *stream) {
    ConvGeo g = conv_geo(d);
    cudaStream_t s = (cudaStream_t)stream;
    dim3 grid;
    long kchunk;
    if (!wgrad_begin(g, d, 0, dw, ws, accumulate, s, &grid, &kchunk)) return;
    if (conv_stem_x8("conv_wgrad_cuda", d, x, dz, act)) {   // the stem: its own kernel, grid.z slices of the rows
        const __half *dzh = (const __half *)dz;
        const uint8_t *x8 = (const uint8_t *)x;
        switch (g.Cout / 16) {
        case 1: conv_stem_wgrad_kernel<1><<<grid.z, 128, 0, s>>>(g, dzh, x8, dw, ws, accumulate); break;
        case 2: conv_stem_wgrad_kernel<2><<<grid.z, 128, 0, s>>>(g, dzh, x8, dw, ws, accumulate); break;
        default: conv_stem_wgrad_kernel<3><<<grid.z, 128, 0, s>>>(g, dzh, x8, dw, ws, accumulate); break;
        }
        wgrad_end(g, grid, ws, dw, accumulate, s);
        return;
    }
    // the halo kernels where x's rows load 8 or 4 halves at a time and dz's rows (dz's map: every
    // other pixel at stride 2) do too; at stride 2 only where the 16-column tiles pad dz's rows by at
    // most 60 %: a row of 20 padded to 32 (1.6x the products) still beats the gather kernel's flat
    // pixel tiles (make gpu-model, A100: 128 -> 256 channels on 40x40, 60.5 -> 40.9 us), 8 padded to
    // 16 (2x) is left to it
    const int vwx = g.S == 2 && (long)cdiv(g.Wo, 16) * 10 > g.Wo ? 0 : conv_halo_vw(g, g.xs, x, nullptr, g.Cin, g.W, 2);
    int vw = vwx;   // (x's alone: the row tiles' pieces of x)
    for (; vw; vw = vw == 8 ? 4 : 0)
        if (g.zs % vw == 0 && (uintptr_t)dz % (2 * vw) == 0 && g.Wo % vw == 0) break;
    if (vw) {
        ConvAct a = act ? *act : ConvAct();
        int tc = g.S == 2 ? 16 : conv_halo_tc(g.W, g.H), tr = (g.S == 2 ? 64 : H3_BN) / tc;
        long ntiles = (long)g.B * cdiv(g.Wo, tc) * cdiv(g.Ho, tr);
        // row tiles (dz's rows a multiple of 4, 8-byte copies; x's rows 16-byte pieces at stride 2; at
        // stride 1 8-byte ones on 20 columns, 16-byte ones, rows a multiple of 8, on 40) where they are fewer
        int rtc = 0;
        if (const int rt = g.S == 2 ? vw == 4 && vwx == 8 ? conv_halo_rows(g.Wo, g.Ho, (long)cdiv(g.Wo, tc) * cdiv(g.Ho, tr), 2, 4, &rtc) : 0
                                    : vw == vwx ? conv_halo_rows(g.Wo, g.Ho, (long)cdiv(g.Wo, tc) * cdiv(g.Ho, tr), 1, vw, &rtc) : 0)
            tc = rtc, ntiles = (long)g.B * cdiv(g.Ho, rt);
        const int cols = cdiv(g.Cin, H3_KC) * cdiv(g.Cout, H3_BM);
        const int ns = halo_wgrad_slices(cols, ntiles, (int)grid.z, sm_count() * halo_wgrad_resident());
        grid.z = (unsigned)ns;   // (wgrad_end: the slices to add)
        dim3 hg(cdiv(g.Cin, H3_KC), cdiv(g.Cout, H3_BM), grid.z);
        const __half *dzh = (const __half *)dz, *xh = (const __half *)x;
        static_assert(H3_ROW_TC == 20 && H3_ROW_TC40 == 40, "the row tiles' launches below name their TC");
        if (tc == H3_ROW_TC40) {
            if (act) conv_halo_wgrad_kernel<true, false, 40, 8><<<hg, 256, 0, s>>>(g, dzh, xh, a, dw, ws, accumulate, ns);
            else conv_halo_wgrad_kernel<false, false, 40, 8><<<hg, 256, 0, s>>>(g, dzh, xh, a, dw, ws, accumulate, ns);
        } else if (tc == H3_ROW_TC && g.S == 1) {
            if (act) conv_halo_wgrad_kernel<true, false, 20, 4><<<hg, 256, 0, s>>>(g, dzh, xh, a, dw, ws, accumulate, ns);
            else conv_halo_wgrad_kernel<false, false, 20, 4><<<hg, 256, 0, s>>>(g, dzh, xh, a, dw, ws, accumulate, ns);
        } else if (tc == H3_ROW_TC) {
            if (act) conv_halo_wgrad_kernel<true, true, 20, 8><<<hg, 256, 0, s>>>(g, dzh, xh, a, dw, ws, accumulate, ns);
            else conv_halo_wgrad_kernel<false, true, 20, 8><<<hg, 256, 0, s>>>(g, dzh, xh, a, dw, ws, accumulate, ns);
        } else switch ((g.S == 2 ? 8 : 0) | (act ? 4 : 0) | (tc == 32 ? 2 : 0) | (vw == 8 ? 1 : 0)) {
        case 0: conv_halo_wgrad_kernel<false, false, 16, 4><<<hg, 256, 0, s>>>(g, dzh, xh, a, dw, ws, accumulate, ns); break;
        case 1: conv_halo_wgrad_kernel<false, false, 16, 8><<<hg, 256, 0, s>>>(g, dzh, xh, a, dw, ws, accumulate, ns); break;
        case 2: conv_halo_wgrad_kernel<false, false, 32, 4><<<hg, 256, 0, s>>>(g, dzh, xh, a, dw, ws, accumulate, ns); break;
        case 3: conv_halo_wgrad_kernel<false, false, 32, 8><<<hg, 256, 0, s>>>(g, dzh, xh, a, dw, ws, accumulate, ns); break;
        case 4: conv_halo_wgrad_kernel<true, false, 16, 4><<<hg, 256, 0, s>>>(g, dzh, xh, a, dw, ws, accumulate, ns); break;
        case 5: conv_halo_wgrad_kernel<true, false, 16, 8><<<hg, 256, 0, s>>>(g, dzh, xh, a, dw, ws, accumulate, ns); break;
        case 6: conv_halo_wgrad_kernel<true, false, 32, 4><<<hg, 256, 0, s>>>(g, dzh, xh, a, dw, ws, accumulate, ns); break;
        case 7: conv_halo_wgrad_kernel<true, false, 32, 8><<<hg, 256, 0, s>>>(g, dzh, xh, a, dw, ws, accumulate, ns); break;
        case 8: conv_halo_wgrad_kernel<false, true, 16, 4><<<hg, 256, 0, s>>>(g, dzh, xh, a, dw, ws, accumulate, ns); break;
        case 9: conv_halo_wgrad_kernel<false, true, 16, 8><<<hg, 256, 0, s>>>(g, dzh, xh, a, dw, ws, accumulate, ns); break;
        case 12: conv_halo_wgrad_kernel<true, true, 16, 4><<<hg, 256, 0, s>>>(g, dzh, xh, a, dw, ws, accumulate, ns); break;
        default: conv_halo_wgrad_kernel<true, true, 16, 8><<<hg, 256, 0, s>>>(g, dzh, xh, a, dw, ws, accumulate, ns); break;
        }
        wgrad_end(g, grid, ws, dw, accumulate, s);
        return;
    }
    bool avec = (g.Ho * g.Wo) % 8 == 0 && g.zs % 8 == 0 && (uintptr_t)dz % 16 == 0;
    bool bvec = avec && g.K == 1 && g.S == 1 && g.xs % 8 == 0 && (uintptr_t)x % 16 == 0;   // then H*W = Ho*Wo
    const __half *dzh = (const __half *)dz, *xh = (const __half *)x;
    ConvAct a = act ? *act : ConvAct();
    int kc = (int)kchunk;
    switch ((act ? 4 : 0) | (avec ? 2 : 0) | (bvec ? 1 : 0)) {
    case 0: conv_wgrad_kernel<false, false, false><<<grid, 128, 0, s>>>(g, dzh, xh, a, dw, ws, accumulate, kc); break;
    case 2: conv_wgrad_kernel<false, true, false><<<grid, 128, 0, s>>>(g, dzh, xh, a, dw, ws, accumulate, kc); break;
    case 3: conv_wgrad_kernel<false, true, true><<<grid, 128, 0, s>>>(g, dzh, xh, a, dw, ws, accumulate, kc); break;
    case 4: conv_wgrad_kernel<true, false, false><<<grid, 128, 0, s>>>(g, dzh, xh, a, dw, ws, accumulate, kc); break;
    case 6: conv_wgrad_kernel<true, true, false><<<grid, 128, 0, s>>>(g, dzh, xh, a, dw, ws, accumulate, kc); break;
    default: conv_wgrad_kernel<true, true, true><<<grid, 128, 0, s>>>(g, dzh, xh, a, dw, ws, accumulate, kc); break;
    }
    wgrad_end(g, grid, ws, dw, accumulate, s);
}

// ------------------------------------------------------------------------------------------
// convolution in FP32 (amp=0): the same three implicit GEMMs on the FP32 cores
// ------------------------------------------------------------------------------------------
/*
 * WMMA takes no FP32 inputs, so the FP32 step runs the products above as a SIMT tiled GEMM:
 * sgemm_block computes one 64x64 tile with 256 threads, staging 16-deep slices of both operands in
 * shared memory (gathered by the caller's functors, zero past every edge); each thread keeps a 4x4
 * register block, rows ty + 16i and columns tx + 16j. In shared memory a slice's row (one k) holds its
 * 64 values permuted, value v at 4 (v % 16) + v / 16 (sg_perm), so that a thread's 4 rows or columns
 * are one 16-byte word: per k one 16-byte read of each operand (a warp's A word is one of two, B's one
 * of 16 consecutive) where it took 8 4-byte reads, and the outputs a warp stores stay 16 consecutive
 * columns (the staging's stores conflict more: 2- to 4-way). Every output is one chain of fmaf over Kd
 * in ascending order: no atomics and no split of Kd, so a result is the same bits on every run and
 * every block schedule. wgrad's Kd (B*Ho*Wo) is split as the FP16 one's (conv_wgrad_split), each
 * slice one chain, the slices added in a fixed order by wgrad_reduce_kernel.
 */
#define SG_BM 64
#define SG_BN 64
#define SG_BK 16
#define SG_THREADS 256
static_assert(IG_BM == 64 && IG_BN == 64 && IG_BK == 32 && SG_BM == 64 && SG_BN == 64 && SG_BK == 16,
              "conv_wgrad_split (yolo.h) and wgrad_begin assume these tiles");
__device__ __forceinline__ int sg_perm(int v) { return 4 * (v & 15) + (v >> 4); }
// sg_col: the one column of B a thread of sgemm_block<false> stages (it stages k rows tid / 64 + 4 e of
// column tid % 64), for callers that decompose it once (conv_dgrad_f32_kernel); sg_kcol(e): sgemm_block
// <true>'s column of its staged element e (row tid % 16 of columns tid / 16 + 16 e, the same 4 in every
// slice: conv_wgrad_f32_kernel). lb(k, n, e) is called with e, 0-3: which of the thread's 4 staged
// elements of B it gives
__device__ __forceinline__ int sg_col() { return blockIdx.x * SG_BN + (int)threadIdx.x % SG_BN; }
__device__ __forceinline__ int sg_kcol(int e) { return blockIdx.x * SG_BN + (int)threadIdx.x / SG_BK + 16 * e; }
template <bool B_KFAST, class LA, class LB, class ST>
__device__ void sgemm_block(int M, int N, int kbeg, int Kd, LA la, LB lb, ST st) {
    static_assert(SG_THREADS % SG_BN == 0 && SG_THREADS / SG_BK == 16 && SG_BK * SG_BN / SG_THREADS == 4,
                  "sg_col, sg_kcol: a thread's staged columns");
    __shared__ __align__(16) float As[SG_BK][SG_BM + 4];   // (16 of Kd, 64 rows, sg_perm): A transposed, k-major
    __shared__ __align__(16) float Bs[SG_BK][SG_BN + 4];   // (16 of Kd, 64 columns, sg_perm)
    int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
    int row0 = blockIdx.y * SG_BM, col0 = blockIdx.x * SG_BN;
    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) acc[i][j] = 0.0f;
    for (int k0 = kbeg; k0 < Kd; k0 += SG_BK) {
#pragma unroll
        for (int e = 0; e < SG_BM * SG_BK / SG_THREADS; e++) {   // consecutive threads along Kd
            int t = tid + e * SG_THREADS, r = t / SG_BK, c = t % SG_BK, gk = k0 + c;
            As[c][sg_perm(r)] = (row0 + r < M && gk < Kd) ? la(row0 + r, gk) : 0.0f;
        }
#pragma unroll
        for (int e = 0; e < SG_BK * SG_BN / SG_THREADS; e++) {   // along Kd (B_KFAST) or along N
            int t = tid + e * SG_THREADS;
            int r = B_KFAST ? t % SG_BK : t / SG_BN, c = B_KFAST ? t / SG_BK : t % SG_BN;
            int gk = k0 + r, gn = col0 + c;
            Bs[r][sg_perm(c)] = (gk < Kd && gn < N) ? lb(gk, gn, e) : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < SG_BK; kk++) {
            const float4 a4 = *(const float4 *)&As[kk][4 * ty], b4 = *(const float4 *)&Bs[kk][4 * tx];
            const float a[4] = {a4.x, a4.y, a4.z, a4.w}, b[4] = {b4.x, b4.y, b4.z, b4.w};
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) {
            int r = row0 + ty + 16 * i, c = col0 + tx + 16 * j;
            if (r < M && c < N) st(r, c, acc[i][j]);
        }
}

// conv_fwd_f32: z = w col(x) (+ bias); M = Cout, N = B*Ho*Wo, Kd = Cin*KK. grid (ceil(N/64), ceil(Cout/64)).
// (A thread stages one output pixel, sg_col, in every slice; its decomposition kept across the slices
// took sm_90 from 63 to 75 registers, 3 blocks an SM where 4 ran, or spills at 64: left per element)
template <bool ACT>
__global__ __launch_bounds__(SG_THREADS) void conv_fwd_f32_kernel(ConvGeo g, const float *x, ConvAct a, const float *w,
                                                                  const float *bias, float *z) {
    int Kd = g.Cin * g.KK, N = g.B * g.Ho * g.Wo, HWo = g.Ho * g.Wo;
    sgemm_block<false>(g.Cout, N, 0, Kd,
        [=](int m, int k) { return w[(long)m * Kd + k]; },
        [=](int k, int n, int) { return conv_col<ACT>(g, x, k, n, a); },
        [=](int m, int n, float v) {
            int b = div_fast(n, g.fHWo);
            z[b * g.zs + (long)m * HWo + (n - b * HWo)] = bias ? v + bias[m] : v;
        });
}
extern "C" void conv_forward_f32_cuda(ConvDims d, const float *x, const ConvAct *act, const float *w, const float *bias,
                                      float *z, void *stream) {
    ConvGeo g = conv_geo(d);
    long N = (long)g.B * g.Ho * g.Wo;
    if (N == 0 || g.Cout == 0 || !z) return;
    dim3 grid(cdiv(N, SG_BN), cdiv(g.Cout, SG_BM));
    cudaStream_t s = (cudaStream_t)stream;
    if (act) conv_fwd_f32_kernel<true><<<grid, SG_THREADS, 0, s>>>(g, x, *act, w, bias, z);
    else conv_fwd_f32_kernel<false><<<grid, SG_THREADS, 0, s>>>(g, x, ConvAct(), w, bias, z);
    CUDA_CHECK(cudaGetLastError());
}

// conv_dgrad_f32: dx (+)= w^T dzg; M = Cin, N = B*H*W, Kd = Cout*KK. grid (ceil(N/64), ceil(Cin/64)).
// A thread's staged input pixel n (sg_col) is decomposed once, for conv_dz_gather's every element (64
// registers, 4 blocks an SM, as before; unbounded it took more on sm_90)
__global__ __launch_bounds__(SG_THREADS, 4) void conv_dgrad_f32_kernel(ConvGeo g, const float *dz, const float *w,
                                                                    float *dx, int accumulate) {
    int Kd = g.Cout * g.KK, N = g.B * g.H * g.W, HW = g.H * g.W;
    const int n = min(sg_col(), max(N - 1, 0)), b = div_fast(n, g.fHW), q = n - b * HW, qy = div_fast(q, g.fW);
    const int ty0 = qy + g.pad, tx0 = q - qy * g.W + g.pad;
    const long zb = b * g.zs;
    sgemm_block<false>(g.Cin, N, 0, Kd,
        [=](int m, int k) { int co = div_fast(k, g.fKK); return w[(long)co * g.wst + m * g.KK + (k - co * g.KK)]; },
        [=](int k, int, int) { return conv_dz_gather(g, dz, k, zb, ty0, tx0); },
        [=](int m, int n, float v) {
            int b = div_fast(n, g.fHW);
            long i = b * g.xs + (long)m * HW + (n - b * HW);
            dx[i] = accumulate ? dx[i] + v : v;
        });
}
extern "C" void conv_dgrad_f32_cuda(ConvDims d, const float *dz, const float *w, float *dx, int accumulate,
                                    void *stream) {
    ConvGeo g = conv_geo(d);
    long N = (long)g.B * g.H * g.W;
    if (N == 0 || g.Cin == 0 || !dx) return;
    dim3 grid(cdiv(N, SG_BN), cdiv(g.Cin, SG_BM));
    conv_dgrad_f32_kernel<<<grid, SG_THREADS, 0, (cudaStream_t)stream>>>(g, dz, w, dx, accumulate);
    CUDA_CHECK(cudaGetLastError());
}

// conv_wgrad_f32: dW (+)= dz col(x)^T; M = Cout, N = Cin*KK, Kd = B*Ho*Wo (images, then pixels, in
// order), split over grid.z as the FP16 wgrad. grid (ceil(Cin*KK/64), ceil(Cout/64), slices).
// Without ACT a thread's 4 staged columns (sg_kcol: input channel and tap) are decomposed once, and an
// element is conv_col's value, its pixel k split once for all 4. With ACT (BN+SiLU of x) each element is
// conv_col's (the columns kept, with their BN folded, took 79 registers on sm_86-sm_90 and spilled at 64;
// cy, cx and co are then unused, and compiled away). Both at most 64 registers, 4 blocks an SM, no spill
template <bool ACT>
__global__ __launch_bounds__(SG_THREADS, 4) void conv_wgrad_f32_kernel(ConvGeo g, const float *dz, const float *x,
                                                                    ConvAct a, float *dw, float *ws, int accumulate,
                                                                    int kchunk) {
    int N = g.Cin * g.KK, Kd = g.B * g.Ho * g.Wo, HWo = g.Ho * g.Wo, kbeg = blockIdx.z * kchunk;
    float *part = gridDim.z > 1 ? ws + (long)blockIdx.z * g.Cout * N : nullptr;
    int cy[4], cx[4], co[4];   // co: the channel's and the tap's offset in an image (Cin H W < 2^31, as ConvTap's)
#pragma unroll
    for (int e = 0; e < 4; e++) {
        const int n = min(sg_kcol(e), max(N - 1, 0)), ci = div_fast(n, g.fKK), kk = n - ci * g.KK;
        cy[e] = div_fast(kk, g.fK);
        cx[e] = kk - cy[e] * g.K;
        co[e] = ci * g.H * g.W + cy[e] * g.W + cx[e];
    }
    sgemm_block<true>(g.Cout, N, kbeg, min(Kd, kbeg + kchunk),
        [=](int m, int k) { int b = div_fast(k, g.fHWo); return dz[b * g.zs + (long)m * HWo + (k - b * HWo)]; },
        [=](int k, int n, int e) {
            if constexpr (ACT) {
                return conv_col<true>(g, x, n, k, a);
            } else {
                const int b = div_fast(k, g.fHWo), p = k - b * HWo, oy = div_fast(p, g.fWo);
                const int y0 = oy * g.S - g.pad, x0 = (p - oy * g.Wo) * g.S - g.pad;   // the window's tap (0, 0)
                if ((unsigned)(y0 + cy[e]) >= (unsigned)g.H || (unsigned)(x0 + cx[e]) >= (unsigned)g.W) return 0.0f;
                return x[b * g.xs + (long)y0 * g.W + x0 + co[e]];
            }
        },
        [=](int m, int n, float v) {
            long i = (long)m * N + n;
            if (part) part[i] = v;
            else dw[i] = accumulate ? dw[i] + v : v;
        });
}
extern "C" void conv_wgrad_f32_cuda(ConvDims d, const float *dz, const float *x, const ConvAct *act, float *dw,
                                    float *ws, int accumulate, void *stream) {
    ConvGeo g = conv_geo(d);
    cudaStream_t s = (cudaStream_t)stream;
    dim3 grid;
    long kchunk;
    if (!wgrad_begin(g, d, 1, dw, ws, accumulate, s, &grid, &kchunk)) return;
    if (act) conv_wgrad_f32_kernel<true><<<grid, SG_THREADS, 0, s>>>(g, dz, x, *act, dw, ws, accumulate, (int)kchunk);
    else conv_wgrad_f32_kernel<false><<<grid, SG_THREADS, 0, s>>>(g, dz, x, ConvAct(), dw, ws, accumulate, (int)kchunk);
    wgrad_end(g, grid, ws, dw, accumulate, s);
}

// ------------------------------------------------------------------------------------------
// BatchNorm statistics and BN+SiLU, forward and backward (FP16 or FP32 activations, FP32 math)
// ------------------------------------------------------------------------------------------

// block_sum: the sum of v (float or double) over the block (blockDim.x a multiple of 32, at most
// 1024), the same value in every thread and the same summation order in every block and run.
// Block-uniform call sites only.
template <class V>
__device__ V block_sum(V v) {
    __shared__ V red[32];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = v;
    __syncthreads();
    V t = 0;
    for (int w = 0; w < (int)blockDim.x / 32; w++) t += red[w];
    __syncthreads();   // red is reused by the next call
    return t;
}

// load4 / store4: 4 consecutive activations as FP32 in one 8- (FP16) or 16-byte (FP32) access
__device__ __forceinline__ void load4(const __half *p, float *v) {
    union { uint2 u; __half2 h[2]; } q;
    q.u = *(const uint2 *)p;
    v[0] = __low2float(q.h[0]), v[1] = __high2float(q.h[0]), v[2] = __low2float(q.h[1]), v[3] = __high2float(q.h[1]);
}
__device__ __forceinline__ void load4(const float *p, float *v) {
    float4 a = *(const float4 *)p;
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
}
__device__ __forceinline__ void store4(__half *p, const float *v) {
    union { uint2 u; __half2 h[2]; } q;
    q.h[0] = __floats2half2_rn(v[0], v[1]);
    q.h[1] = __floats2half2_rn(v[2], v[3]);
    *(uint2 *)p = q.u;
}
__device__ __forceinline__ void store4(float *p, const float *v) { *(float4 *)p = make_float4(v[0], v[1], v[2], v[3]); }
// bn_vec8: may an elementwise BN kernel move 8 values per thread (H*W and the image strides multiples
// of 8, every pointer 16-byte aligned)?
static bool bn_vec8(int HW, long s1, long s2, const void *p1, const void *p2, const void *p3) {
    return HW % 8 == 0 && s1 % 8 == 0 && s2 % 8 == 0 && (uintptr_t)p1 % 16 == 0 && (uintptr_t)p2 % 16 == 0 &&
           (uintptr_t)p3 % 16 == 0;
}

// BnFlat: the elementwise BN kernels' numbering of a channel's values, one group a thread (V8: 8
// values, else 1) across its images: ng groups, fg the divisor that splits group g into its image and
// its group in that image. bn_flat refuses B*HW past int indexing (with a block's headroom; the
// planner's sizes stay far under it).
struct BnFlat { int ng; FastDiv fg; };
static BnFlat bn_flat(const char *fn, int B, int HW, bool v8) {
    if ((long)B * HW > INT_MAX - 256) {
        fprintf(stderr, "%s: %d images of %d values a channel exceed the kernel's int indexing\n", fn, B, HW);
        exit(1);
    }
    const int per = v8 ? HW / 8 : HW;
    return BnFlat{B * per, fast_div(per)};
}

// BN reductions, chunked (yolo.h's bn_chunks): grid (K chunks, C channels), block 256; chunk k of a
// channel holds its values j in [k*len, (k+1)*len) of B*HW (image j / HW, pixel j % HW); each block
// writes its partial sums, then another launch (the statistics: bn_stats_finish_kernel) or each block of
// the next pass (the backward: bn_bwd_apply_kernel) combines a channel's K partials in a fixed order.
struct BnGeo { long n, len, zs; int HW, K; FastDiv fHW; };
static BnGeo bn_geo(int B, int C, int HW, long zs) {
    BnGeo q;
    q.n = (long)B * HW; q.K = bn_chunks(B, HW); q.len = (q.n + q.K - 1) / q.K;
    q.zs = zs ? zs : (long)C * HW; q.HW = HW; q.fHW = fast_div(HW > 0 ? HW : 1);
    return q;
}
// BnWalk: the offsets o in z (and dA, same layout) of values j, j + step, j + 2 step, ... of channel c:
// one division to start, then an add and a compare per value (step < 2^31)
struct BnWalk {
    long j, o, dq;       // value, its offset; the whole images of a step, times zs
    int p, HW, dr, stp;  // pixel of value j; the pixels of a step beyond those images; the step
    long zs;
    __device__ BnWalk(const BnGeo &q, int c, long j0, int step) : j(j0), HW(q.HW), zs(q.zs) {
        int b = div_fast((int)j0, q.fHW), sq = div_fast(step, q.fHW);
        p = (int)j0 - b * q.HW;
        o = b * q.zs + (long)c * q.HW + p;
        dq = sq * q.zs; dr = step - sq * q.HW; stp = step;
    }
    __device__ void next() {
        j += stp; p += dr; o += dq + dr;
        if (p >= HW) { p -= HW; o += zs - HW; }
    }
};
// bn_chunk_for: f(o, o2, n) over the values [j0, j1) of channel c that this thread takes, n values at
// offset o (and with n = 16, 8 at o and 8 at o2), n a std::integral_constant (16, 8 or 1: the functor's
// loops unroll). V8 (bn_vec8: H*W and the image stride multiples of 8, the tensors 16-byte aligned): the
// chunk's whole groups of 8 (j a multiple of 8: one image, a 16-byte aligned offset), the thread's every
// blockDim-th group, two at a time (n = 16: the functor issues both groups' loads before it uses either,
// so that a chunk's 2 groups a thread cost one trip to memory, not two), an odd last one alone (n = 8),
// then its value of the unaligned head and of the tail (n = 1); else one value per call, the thread's
// every blockDim-th. Each thread's sum is in that order, the same as one group at a time.
template <bool V8, class F>
__device__ __forceinline__ void bn_chunk_for(const BnGeo &q, int c, long j0, long j1, F f) {
    const int t = threadIdx.x, nt = blockDim.x;
    const std::integral_constant<int, 1> one;
    if constexpr (V8) {
        const long a0 = min(j1, (j0 + 7) & ~7L), a1 = max(a0, j1 & ~7L);
        for (BnWalk it(q, c, a0 + 8 * t, 8 * nt); it.j < a1;) {
            const long o = it.o;
            it.next();
            if (it.j < a1) {
                f(o, it.o, std::integral_constant<int, 16>());
                it.next();
            } else
                f(o, 0L, std::integral_constant<int, 8>());
        }
        if (j0 + t < a0) f(BnWalk(q, c, j0 + t, nt).o, 0L, one);
        if (a1 + t < j1) f(BnWalk(q, c, a1 + t, nt).o, 0L, one);
    } else {
        for (BnWalk it(q, c, j0 + t, nt); it.j < j1; it.next()) f(it.o, 0L, one);
    }
}
// BnVals: the N (16, 8 or 1) values of p at o (16: 8 at o, then 8 at o2; 8 and 16 in 16-byte loads),
// v[e] as a float. FP16 values stay as loaded until v[e] converts them, so that a thread holding two
// groups of z and dA over the loads' latency keeps 16 registers of them, not 32 floats.
template <int N, class T> struct BnVals {
    float f[N];
    BnVals() = default;
    __device__ __forceinline__ BnVals(const T *p, long o, long o2) { load(p, o, o2); }
    __device__ __forceinline__ void load(const T *p, long o, long o2) {
        if constexpr (N == 1) f[0] = act_f(p[o]);
        else {
            load8(p + o, f);
            if constexpr (N == 16) load8(p + o2, f + 8);
        }
    }
    __device__ __forceinline__ float operator[](int e) const { return f[e]; }
};
template <int N> struct BnVals<N, __half> {
    union W8 { uint4 u; __half2 h[4]; } r[N == 16 ? 2 : 1];
    __half h1;
    BnVals() = default;
    __device__ __forceinline__ BnVals(const __half *p, long o, long o2) { load(p, o, o2); }
    __device__ __forceinline__ void load(const __half *p, long o, long o2) {
        if constexpr (N == 1) h1 = p[o];
        else {
            r[0].u = *(const uint4 *)(p + o);
            if constexpr (N == 16) r[1].u = *(const uint4 *)(p + o2);
        }
    }
    __device__ __forceinline__ float operator[](int e) const {
        if constexpr (N == 1) return __half2float(h1);
        const __half2 h = r[e >> 3].h[(e & 7) >> 1];
        return e & 1 ? __high2float(h) : __low2float(h);
    }
};

// bn_stats_partial: chunk k of channel c in two passes over the chunk (the second from cache): its
// count, its mean and its sum of squared deviations from that mean, into part[4*(c*K + k) ..] (and a 0)
template <class T, bool V8>
__global__ void bn_stats_partial_kernel(const T *z, BnGeo q, float *part) {
    int k = blockIdx.x, c = blockIdx.y;
    long j0 = k * q.len, j1 = min(q.n, j0 + q.len);
    float s = 0.0f, ss = 0.0f, cnt = (float)(j1 > j0 ? j1 - j0 : 1);
    bn_chunk_for<V8>(q, c, j0, j1, [&](long o, long o2, auto n) {
        constexpr int N = decltype(n)::value;
        const BnVals<N, T> v(z, o, o2);
#pragma unroll
        for (int e = 0; e < N; e++) s += v[e];
    });
    float mu = block_sum(s) / cnt;
    bn_chunk_for<V8>(q, c, j0, j1, [&](long o, long o2, auto n) {
        constexpr int N = decltype(n)::value;
        const BnVals<N, T> v(z, o, o2);
#pragma unroll
        for (int e = 0; e < N; e++) ss += (v[e] - mu) * (v[e] - mu);
    });
    ss = block_sum(ss);
    if (threadIdx.x == 0)
        *(float4 *)(part + 4 * ((long)c * q.K + k)) = make_float4(j1 > j0 ? (float)(j1 - j0) : 0.0f, mu, ss, 0.0f);
}
// bn_stats_finish: one block of BN_FIN threads per channel. train: the channel's K tiles (16 bytes each
// in part: count, mean, M2, 0; bn_stats_partial's chunks or a conv's pixel tiles), thread t merging
// tiles t, t + BN_FIN, .. in that order (16-byte loads, consecutive across the warp), then the threads'
// pairwise in a fixed tree (the same bits on every run), into the mean, invstd and the running stats
// (rm, rv: NULL to skip); eval: mean = rm, invstd from rv
// (512 threads: a 320x320 batch-16 map has 6400 tiles a channel, and each merge has a division, so
// that fewer threads make long chains). A thread requests BN_FIN_U of its tiles before merging them (in
// the same order), so a channel of K tiles waits for memory ceil(K / 2048) times, not ceil(K / 512);
// the tree's last 5 levels run in warp 0 by shuffles, the same pairs as through shared memory.
#define BN_FIN 512
#define BN_FIN_U 4
__global__ void bn_stats_finish_kernel(const float *part, int K, float *mean, float *invstd, float *rm, float *rv,
                                       float eps, float momentum, int train) {
    const int c = blockIdx.x, t = threadIdx.x;
    if (!train) {
        if (t == 0) mean[c] = rm[c], invstd[c] = 1.0f / sqrtf(rv[c] + eps);
        return;
    }
    __shared__ BnTile red[BN_FIN];
    BnTile r = {0.0f, 0.0f, 0.0f};
    const float4 *tiles = (const float4 *)(part + 4 * (long)c * K);
    for (int k0 = t; k0 < K; k0 += BN_FIN_U * BN_FIN) {   // BN_FIN_U loads in flight, then their merges
        float4 p[BN_FIN_U];
#pragma unroll
        for (int u = 0; u < BN_FIN_U; u++)
            if (k0 + u * BN_FIN < K) p[u] = tiles[k0 + u * BN_FIN];
#pragma unroll
        for (int u = 0; u < BN_FIN_U; u++)
            if (k0 + u * BN_FIN < K) r = bn_tile_merge(r, BnTile{p[u].x, p[u].y, p[u].z});
    }
    red[t] = r;
    for (int h = BN_FIN / 2; h >= 32; h /= 2) {   // (red[t] is r: thread t alone writes it)
        __syncthreads();
        if (t < h) red[t] = r = bn_tile_merge(r, red[t + h]);
    }
    if (t >= 32) return;
    // the tree's last 5 levels in warp 0: lane t merges lane t + h's tile as it merged red[t + h]
#pragma unroll
    for (int h = 16; h > 0; h /= 2) {
        BnTile o;
        o.n = __shfl_down_sync(0xffffffffu, r.n, h);
        o.m = __shfl_down_sync(0xffffffffu, r.m, h);
        o.q = __shfl_down_sync(0xffffffffu, r.q, h);
        r = bn_tile_merge(r, o);
    }
    if (t) return;
    const float cnt = r.n, mu = r.m, var = cnt > 0 ? r.q / cnt : 0.0f;
    mean[c] = mu;
    invstd[c] = 1.0f / sqrtf(var + eps);
    if (rm) rm[c] = (1 - momentum) * rm[c] + momentum * mu;
    if (rv) rv[c] = (1 - momentum) * rv[c] + momentum * (cnt > 1 ? var * cnt / (cnt - 1) : var);
}
template <class T>
static void bn_stats_launch(const T *z, long zs, int B, int C, int HW, float *mean, float *invstd, float *rm, float *rv,
                            float eps, float momentum, int train, float *scratch, void *stream) {
    if (C == 0) return;
    cudaStream_t s = (cudaStream_t)stream;
    BnGeo q = bn_geo(B, C, HW, zs);
    if (train) {
        if (bn_vec8(HW, q.zs, q.zs, z, z, z))
            bn_stats_partial_kernel<T, true><<<dim3((unsigned)q.K, (unsigned)C), 256, 0, s>>>(z, q, scratch);
        else bn_stats_partial_kernel<T, false><<<dim3((unsigned)q.K, (unsigned)C), 256, 0, s>>>(z, q, scratch);
        CUDA_CHECK(cudaGetLastError());
    }
    bn_stats_finish_kernel<<<C, BN_FIN, 0, s>>>(scratch, q.K, mean, invstd, rm, rv, eps, momentum, train);
    CUDA_CHECK(cudaGetLastError());
}
extern "C" void bn_stats_cuda(const uint16_t *z, long zs, int B, int C, int HW, float *mean, float *invstd, float *rm,
                              float *rv, float eps, float momentum, int train, float *scratch, void *stream) {
    bn_stats_launch((const __half *)z, zs, B, C, HW, mean, invstd, rm, rv, eps, momentum, train, scratch, stream);
}
extern "C" void bn_stats_f32_cuda(const float *z, long zs, int B, int C, int HW, float *mean, float *invstd, float *rm,
                                  float *rv, float eps, float momentum, int train, float *scratch, void *stream) {
    bn_stats_launch(z, zs, B, C, HW, mean, invstd, rm, rv, eps, momentum, train, scratch, stream);
}
extern "C" int conv_forward_stats_cuda(ConvDims d, const void *x, const ConvAct *act, const uint16_t *w,
                                       const uint16_t *wt, uint16_t *zh, float *part, void *stream) {
    return conv_forward_launch(d, x, act, w, wt, nullptr, nullptr, zh, part, stream);
}
extern "C" void bn_stats_finish_cuda(const float *part, int K, int C, float *mean, float *invstd, float *rm, float *rv,
                                     float eps, float momentum, void *stream) {
    if (C == 0) return;   // (K 0, no pixels: mean 0 and variance 0, as bn_stats_cuda gives)
    bn_stats_finish_kernel<<<C, BN_FIN, 0, (cudaStream_t)stream>>>(part, K, mean, invstd, rm, rv, eps, momentum, 1);
    CUDA_CHECK(cudaGetLastError());
}

// bn_silu_forward_act: the training step's BN+SiLU in its activation type T (__half or float), FP32
// math; grid (ceil(B*HW/(256 V)), C), V consecutive elements per thread (V8: 8, one or two 16-byte
// loads and stores, else 1), a channel's groups of V numbered across its images as bn_bwd_apply's; BN
// folded to a scale and shift once per thread (bn_silu_value's bits).
// ACC (a Bottleneck's shortcut, V_ADD): y += the activation, rounded to T first, then the FP32 sum
// rounded once: the bits of writing the activation to a buffer and add_f16/add_f32 adding it to y.
// The sum is __fadd_rn: in FP32 nvcc would otherwise fuse it with the activation's last multiply
// (__fdividef is a multiply by a reciprocal) into one FMA, rounding once where the buffer rounds twice
// (seen on an H200: 336 of 4000 values 1 ulp apart; the emulator's compiler does not fuse).
template <class T, bool V8, bool ACC>
__global__ void bn_silu_forward_act_kernel(const T *z, long zs, const float *mean, const float *invstd,
                                           const float *gamma, const float *beta, T *y, long ys, int HW, BnFlat f) {
    const int g = blockIdx.x * blockDim.x + threadIdx.x, c = blockIdx.y;
    if (g >= f.ng) return;
    const int b = div_fast(g, f.fg), i = (g - b * f.fg.d) * (V8 ? 8 : 1);
    const float2 bn = bn_fold(mean, invstd, gamma, beta, c);
    const T *zp = z + b * zs + (long)c * HW + i;
    T *yp = y + b * ys + (long)c * HW + i;
    if (!V8) {
        float a = bn_silu_folded(act_f(*zp), bn.x, bn.y);
        *yp = act_from<T>(ACC ? __fadd_rn(act_f(*yp), act_f(act_from<T>(a))) : a);
        return;
    }
    float v[8], u[8];
    load8(zp, v);
    if (ACC) load8(yp, u);
#pragma unroll
    for (int e = 0; e < 8; e++) {
        v[e] = bn_silu_folded(v[e], bn.x, bn.y);
        if (ACC) v[e] = __fadd_rn(u[e], act_f(act_from<T>(v[e])));
    }
    store8(yp, v);
}
template <class T, bool ACC>
static void bn_silu_forward_act_grid(bool v8, const T *z, long zs, const float *mean, const float *invstd,
                                     const float *gamma, const float *beta, T *y, long ys, int B, int C, int HW,
                                     cudaStream_t s) {
    const BnFlat f = bn_flat("bn_silu_forward_cuda", B, HW, v8);
    const dim3 grid(cdiv(f.ng, 256), (unsigned)C);
    if (v8)
        bn_silu_forward_act_kernel<T, true, ACC><<<grid, 256, 0, s>>>(z, zs, mean, invstd, gamma, beta, y, ys, HW, f);
    else
        bn_silu_forward_act_kernel<T, false, ACC><<<grid, 256, 0, s>>>(z, zs, mean, invstd, gamma, beta, y, ys, HW, f);
}
template <class T>
static void bn_silu_forward_act_launch(const T *z, long zs, const float *mean, const float *invstd, const float *gamma,
                                       const float *beta, T *y, long ys, int B, int C, int HW, int acc,
                                       void *stream) {
    if ((long)B * C * HW == 0) return;
    if (!zs) zs = (long)C * HW;
    if (!ys) ys = (long)C * HW;
    cudaStream_t s = (cudaStream_t)stream;
    bool v8 = bn_vec8(HW, zs, ys, z, y, y);
    if (acc) bn_silu_forward_act_grid<T, true>(v8, z, zs, mean, invstd, gamma, beta, y, ys, B, C, HW, s);
    else bn_silu_forward_act_grid<T, false>(v8, z, zs, mean, invstd, gamma, beta, y, ys, B, C, HW, s);
    CUDA_CHECK(cudaGetLastError());
}
extern "C" void bn_silu_forward_f16_cuda(const uint16_t *z, long zs, const float *mean, const float *invstd,
                                         const float *gamma, const float *beta, uint16_t *y, long ys, int B, int C,
                                         int HW, int acc, void *stream) {
    bn_silu_forward_act_launch((const __half *)z, zs, mean, invstd, gamma, beta, (__half *)y, ys, B, C, HW, acc,
                               stream);
}
extern "C" void bn_silu_forward_f32_cuda(const float *z, long zs, const float *mean, const float *invstd,
                                         const float *gamma, const float *beta, float *y, long ys, int B, int C, int HW,
                                         int acc, void *stream) {
    bn_silu_forward_act_launch(z, zs, mean, invstd, gamma, beta, y, ys, B, C, HW, acc, stream);
}
// bn_silu_sum: y = SiLU(BN_1(z1)) + SiLU(BN_2(z2)), a residual sum of two BN convs' activations (a
// Bottleneck's input slice plus its cv2) made in one pass: each activation rounded to T, the sum then
// rounded once, so the bits of bn_silu_forward_act writing the first into y and then adding the second
// (ACC), with one read of each z and one write of y where that took two writes and a read of y. Grid,
// V8 and the fold as bn_silu_forward_act's (each source folded with its own channel's BN).
template <class T, bool V8>
__global__ void bn_silu_sum_kernel(const T *z1, long z1s, ConvAct a1, const T *z2, long z2s, ConvAct a2, T *y,
                                   long ys, int HW, BnFlat f) {
    const int g = blockIdx.x * blockDim.x + threadIdx.x, c = blockIdx.y;
    if (g >= f.ng) return;
    const int b = div_fast(g, f.fg), i = (g - b * f.fg.d) * (V8 ? 8 : 1);
    const float2 n1 = bn_fold(a1, c), n2 = bn_fold(a2, c);
    const long o = (long)c * HW + i;
    const T *p1 = z1 + b * z1s + o, *p2 = z2 + b * z2s + o;
    T *yp = y + b * ys + o;
    if (!V8) {
        const float u = act_f(act_from<T>(bn_silu_folded(act_f(*p1), n1.x, n1.y)));
        *yp = act_from<T>(__fadd_rn(u, act_f(act_from<T>(bn_silu_folded(act_f(*p2), n2.x, n2.y)))));
        return;
    }
    float v[8], u[8];
    load8(p1, u);
    load8(p2, v);
#pragma unroll
    for (int e = 0; e < 8; e++) {
        u[e] = act_f(act_from<T>(bn_silu_folded(u[e], n1.x, n1.y)));
        v[e] = __fadd_rn(u[e], act_f(act_from<T>(bn_silu_folded(v[e], n2.x, n2.y))));
    }
    store8(yp, v);
}
template <class T>
static void bn_silu_sum_launch(const T *z1, long z1s, const ConvAct *a1, const T *z2, long z2s, const ConvAct *a2,
                               T *y, long ys, int B, int C, int HW, void *stream) {
    if ((long)B * C * HW == 0) return;
    if (!z1s) z1s = (long)C * HW;
    if (!z2s) z2s = (long)C * HW;
    if (!ys) ys = (long)C * HW;
    cudaStream_t s = (cudaStream_t)stream;
    const bool v8 = bn_vec8(HW, z1s, ys, z1, y, y) && bn_vec8(HW, z2s, ys, z2, y, y);
    const BnFlat f = bn_flat("bn_silu_sum_cuda", B, HW, v8);
    const dim3 grid(cdiv(f.ng, 256), (unsigned)C);
    if (v8) bn_silu_sum_kernel<T, true><<<grid, 256, 0, s>>>(z1, z1s, *a1, z2, z2s, *a2, y, ys, HW, f);
    else bn_silu_sum_kernel<T, false><<<grid, 256, 0, s>>>(z1, z1s, *a1, z2, z2s, *a2, y, ys, HW, f);
    CUDA_CHECK(cudaGetLastError());
}
extern "C" void bn_silu_sum_f16_cuda(const uint16_t *z1, long z1s, const ConvAct *a1, const uint16_t *z2, long z2s,
                                     const ConvAct *a2, uint16_t *y, long ys, int B, int C, int HW, void *stream) {
    bn_silu_sum_launch((const __half *)z1, z1s, a1, (const __half *)z2, z2s, a2, (__half *)y, ys, B, C, HW, stream);
}
extern "C" void bn_silu_sum_f32_cuda(const float *z1, long z1s, const ConvAct *a1, const float *z2, long z2s,
                                     const ConvAct *a2, float *y, long ys, int B, int C, int HW, void *stream) {
    bn_silu_sum_launch(z1, z1s, a1, z2, z2s, a2, y, ys, B, C, HW, stream);
}

// bn_bwd_dz: the dz of one value from its dA and z, as bn_silu_backward_cpu's second loop (gs = gamma *
// invstd; mg, mgx: the channel's means of gy and gy*xhat, 0 in eval): bn_bwd_apply's and bn_bwd_fused's
__device__ __forceinline__ float bn_bwd_dz(float dA, float z, float mu, float is, float ga, float be, float gs, float mg,
                                           float mgx) {
    const float xh = (z - mu) * is, gy = bn_silu_gy(dA, xh, ga, be);
    return gs * (gy - mg - xh * mgx);
}
// bn_bwd_partial: per chunk (as bn_stats_partial) the sums of gy and of gy*xhat (of dA without BN)
// into part[c*K + k] and part[C*K + c*K + k]. Without BN (a Detect output's bias) dz is dA whatever the
// sums: with dz given, each value is also stored there (as T, by the thread that read it) in this pass,
// and the second pass only adds the sums into dbeta.
template <class T, class TD, bool V8>
__global__ void bn_bwd_partial_kernel(const T *z, const TD *dA, BnGeo q, int C, const float *mean,
                                      const float *invstd, const float *gamma, const float *beta, float *part,
                                      T *dz) {
    int k = blockIdx.x, c = blockIdx.y;
    long j1 = min(q.n, (k + 1) * q.len);
    float sg = 0.0f, sgx = 0.0f;
    float mu = gamma ? mean[c] : 0.0f, is = gamma ? invstd[c] : 0.0f, ga = gamma ? gamma[c] : 0.0f,
          be = gamma ? beta[c] : 0.0f;
    bn_chunk_for<V8>(q, c, k * q.len, j1, [&](long o, long o2, auto n) {
        constexpr int N = decltype(n)::value;
        const BnVals<N, TD> d(dA, o, o2);
        if (!gamma) {
            float v[N];
#pragma unroll
            for (int e = 0; e < N; e++) sg += v[e] = d[e];
            if (!dz) return;
            if constexpr (N == 1) dz[o] = act_from<T>(v[0]);
            else {
                store8(dz + o, v);
                if constexpr (N == 16) store8(dz + o2, v + 8);
            }
            return;
        }
        const BnVals<N, T> x(z, o, o2);
#pragma unroll
        for (int e = 0; e < N; e++) {
            float xh = (x[e] - mu) * is, gy = bn_silu_gy(d[e], xh, ga, be);
            sg += gy;
            sgx += gy * xh;
        }
    });
    sg = block_sum(sg);
    sgx = block_sum(sgx);
    if (threadIdx.x == 0) {
        part[(long)c * q.K + k] = sg;
        part[(long)C * q.K + (long)c * q.K + k] = sgx;
    }
}
// bn_bwd_apply: dz = gamma*invstd*(gy - mg - xhat*mgx) in T (or dz = dA without BN), mg and mgx the
// channel's means of gy and gy*xhat (0 in eval). grid (ceil(B*HW/(256 V)), C): a channel's B*HW/V
// groups of V values (V8: 8, 16-byte accesses, else 1) numbered across its images (g = b*HW/V + i/V:
// one division a thread), one group a thread, so that every block but a channel's last is full (the grid
// was (ceil(HW/(256 V)), C, B): at 20x20 a block of 256 threads had 50 groups, and an H200 ran those
// launches at under a third of the larger maps' bytes per second). Each block adds its channel's K
// partials in a fixed order (lane l of the first warp adds partials l, l + 32, ... in turn, then the
// lanes' sums in a fixed xor tree: the same bits on every run, without the block waiting on K dependent
// loads), and the channel's first block adds the sums into dbeta (+ dgamma with BN). Without BN the
// first pass writes dz, and this kernel runs over no values (ng 0): the sums into dbeta alone.
// V8: 32-40 registers with FP16 dA (sm_90: 40, 6 blocks an SM where it ran 8: the values held over the
// partials' wait, as raw halves), 40-48 with FP32 dA (bn_silu_backward_cuda with BN); capped at 32, those
// spill.
template <class T, class TD, bool V8>
__global__ void bn_bwd_apply_kernel(const T *z, const TD *dA, long zs, const float *mean, const float *invstd,
                                    const float *gamma, const float *beta, const float *part, int K, float cnt,
                                    int train, float *dgamma, float *dbeta, T *dz, int C, int HW, BnFlat f) {
    constexpr int V = V8 ? 8 : 1;
    __shared__ float msum[2];
    const int g = blockIdx.x * blockDim.x + threadIdx.x, c = blockIdx.y;
    const bool mine = g < f.ng;
    const int b = div_fast(g, f.fg), i = (g - b * f.fg.d) * V;
    const long o = b * zs + (long)c * HW + i;
    // the thread's values are loaded before the channel's partials are added, so that the block waits
    // for both at once (the partials were added first, then the values loaded: two trips to memory)
    BnVals<V, TD> d;
    BnVals<V, T> x;
    if (mine) {
        d.load(dA, o, 0);
        if (gamma) x.load(z, o, 0);
    }
    float sg = 0.0f, sgx = 0.0f;
    if (threadIdx.x < 32) {
        for (int k = threadIdx.x; k < K; k += 32) sg += part[(long)c * K + k], sgx += part[(long)C * K + (long)c * K + k];
#pragma unroll
        for (int m = 16; m > 0; m >>= 1) {
            sg += __shfl_xor_sync(0xffffffffu, sg, m);
            sgx += __shfl_xor_sync(0xffffffffu, sgx, m);
        }
    }
    if (threadIdx.x == 0) {
        if (blockIdx.x == 0) {
            dbeta[c] += sg;
            if (gamma) dgamma[c] += sgx;
        }
        msum[0] = train ? sg / cnt : 0.0f;
        msum[1] = train ? sgx / cnt : 0.0f;
    }
    __syncthreads();
    if (!mine) return;
    float gv[V];
#pragma unroll
    for (int e = 0; e < V; e++) gv[e] = d[e];
    if (gamma) {
        float mu = mean[c], is = invstd[c], ga = gamma[c], be = beta[c], gs = ga * is, mg = msum[0], mgx = msum[1];
#pragma unroll
        for (int e = 0; e < V; e++) gv[e] = bn_bwd_dz(gv[e], x[e], mu, is, ga, be, gs, mg, mgx);
    }
    if (V8) store8(dz + o, gv); else dz[o] = act_from<T>(gv[0]);
}
// bn_bwd_fused: both passes of bn_bwd_partial and bn_bwd_apply in one block per channel (grid C), for
// a channel of at most 1024 G groups of 8 values (V8 only): each thread loads its G groups of dA (and
// z), groups threadIdx.x + k blockDim.x, k < G (a warp's 32 consecutive groups a load), sums gy and
// gy*xhat over them, the block adds the threads' sums (block_sum: the same order in every block and
// run), thread 0 adds them into dbeta (+ dgamma), and every thread applies the means to the values it
// still holds. So z and dA are read once, not twice, and one launch does what two did. The sums are
// added in another order than the two passes' chunks (a few ulp apart, as any order; deterministic).
// In place (dz == dA) is safe: each value is written by the thread that read it, after the barrier that
// every read precedes. G 4 with FP16 z and dA (1024 threads: 64 registers a thread, 32 of them the
// values as loaded); FP32 dA or z take G 2 (bn_fused_groups).
template <class T, class TD, int G>
__global__ __launch_bounds__(1024) void bn_bwd_fused_kernel(const T *z, const TD *dA, long zs, const float *mean,
                                                          const float *invstd, const float *gamma, const float *beta,
                                                          float cnt, int train, float *dgamma, float *dbeta, T *dz,
                                                          int HW, BnFlat f) {
    const int c = blockIdx.x;
    BnVals<8, TD> d[G];
    BnVals<8, T> x[G];
    long o[G];
#pragma unroll
    for (int k = 0; k < G; k++) {
        const int g = threadIdx.x + k * blockDim.x, b = div_fast(g, f.fg);
        o[k] = g < f.ng ? b * zs + (long)c * HW + (g - b * f.fg.d) * 8 : -1;
        if (o[k] >= 0) {
            d[k].load(dA, o[k], 0);
            if (gamma) x[k].load(z, o[k], 0);
        }
    }
    const float mu = gamma ? mean[c] : 0.0f, is = gamma ? invstd[c] : 0.0f, ga = gamma ? gamma[c] : 0.0f,
                be = gamma ? beta[c] : 0.0f;
    float sg = 0.0f, sgx = 0.0f;
#pragma unroll
    for (int k = 0; k < G; k++) {
        if (o[k] < 0) continue;
#pragma unroll
        for (int e = 0; e < 8; e++) {
            if (!gamma) {
                sg += d[k][e];
                continue;
            }
            const float xh = (x[k][e] - mu) * is, gy = bn_silu_gy(d[k][e], xh, ga, be);
            sg += gy;
            sgx += gy * xh;
        }
    }
    sg = block_sum(sg);
    sgx = block_sum(sgx);
    if (threadIdx.x == 0) {
        dbeta[c] += sg;
        if (gamma) dgamma[c] += sgx;
    }
    const float mg = train ? sg / cnt : 0.0f, mgx = train ? sgx / cnt : 0.0f, gs = ga * is;
#pragma unroll
    for (int k = 0; k < G; k++) {
        if (o[k] < 0) continue;
        float gv[8];
#pragma unroll
        for (int e = 0; e < 8; e++) {
            gv[e] = d[k][e];
            if (gamma) gv[e] = bn_bwd_dz(gv[e], x[k][e], mu, is, ga, be, gs, mg, mgx);
        }
        store8(dz + o[k], gv);
    }
}
// bn_fused_groups: the G of bn_bwd_fused_kernel for a channel of ng groups of 8 (the fewest that keep a
// block at 1024 threads), or 0: too many for one block (more than 4096 groups, 32768 values; 2048 where
// z or dA is FP32, whose held values would take the registers of G 4); then the two passes run
template <class T, class TD> static int bn_fused_groups(long ng) {
    const int gmax = sizeof(T) + sizeof(TD) == 4 ? 4 : 2;
    for (int G = 1; G <= gmax; G *= 2)
        if (ng <= 1024L * G) return G;
    return 0;
}
// bn_bwd_apply_launch: bn_bwd_apply_kernel over the channels' K partials in part
template <class T, class TD>
static void bn_bwd_apply_launch(const T *z, const TD *dA, long zs, const float *mean, const float *invstd,
                                const float *gamma, const float *beta, float *dgamma, float *dbeta, T *dz,
                                const float *part, int K, int B, int C, int HW, int train, cudaStream_t s) {
    const float cnt = (float)B * HW;
    const bool v8 = bn_vec8(HW, zs, zs, z, dA, dz);
    const BnFlat f = bn_flat("bn_silu_backward_cuda", B, HW, v8);
    const dim3 ga(cdiv(f.ng, 256), (unsigned)C);
    if (v8)
        bn_bwd_apply_kernel<T, TD, true><<<ga, 256, 0, s>>>(z, dA, zs, mean, invstd, gamma, beta, part, K, cnt, train,
                                                           dgamma, dbeta, dz, C, HW, f);
    else
        bn_bwd_apply_kernel<T, TD, false><<<ga, 256, 0, s>>>(z, dA, zs, mean, invstd, gamma, beta, part, K, cnt, train,
                                                            dgamma, dbeta, dz, C, HW, f);
    CUDA_CHECK(cudaGetLastError());
}
template <class T, class TD>
static void bn_silu_backward_launch(const T *z, const TD *dA, long zs, const float *mean, const float *invstd,
                                    const float *gamma, const float *beta, float *dgamma, float *dbeta, T *dz,
                                    float *scratch, int B, int C, int HW, int train, void *stream) {
    if (C == 0) return;
    if (!zs) zs = (long)C * HW;
    cudaStream_t s = (cudaStream_t)stream;
    // no values: the partials would be 0, and so would what the apply pass adds to dbeta / dgamma
    if ((long)B * HW == 0) return;
    const float cnt = (float)B * HW;
    const bool v8 = bn_vec8(HW, zs, zs, z, dA, dz);
    const BnFlat f = bn_flat("bn_silu_backward_cuda", B, HW, v8);
    // a channel one block can hold: one pass (bn_bwd_fused_kernel); no scratch
    if (const int G = v8 ? bn_fused_groups<T, TD>(f.ng) : 0) {
        const unsigned nt = (unsigned)(cdiv(cdiv(f.ng, G), 32) * 32);
        if (G == 1)
            bn_bwd_fused_kernel<T, TD, 1><<<C, nt, 0, s>>>(z, dA, zs, mean, invstd, gamma, beta, cnt, train, dgamma,
                                                          dbeta, dz, HW, f);
        else if (G == 2)
            bn_bwd_fused_kernel<T, TD, 2><<<C, nt, 0, s>>>(z, dA, zs, mean, invstd, gamma, beta, cnt, train, dgamma,
                                                          dbeta, dz, HW, f);
        else if constexpr (sizeof(T) + sizeof(TD) == 4)   // (G 4 is FP16's alone: not compiled for the others)
            bn_bwd_fused_kernel<T, TD, 4><<<C, nt, 0, s>>>(z, dA, zs, mean, invstd, gamma, beta, cnt, train, dgamma,
                                                          dbeta, dz, HW, f);
        CUDA_CHECK(cudaGetLastError());
        return;
    }
    const BnGeo q = bn_geo(B, C, HW, zs);
    float *part = scratch;
    dim3 grid((unsigned)q.K, (unsigned)C);
    // without BN the first pass writes dz too (bn_bwd_partial), its 16-byte stores where dz is aligned
    T *dz1 = gamma ? nullptr : dz;
    if (bn_vec8(HW, zs, zs, z, dA, gamma ? (const void *)dA : dz))
        bn_bwd_partial_kernel<T, TD, true><<<grid, 256, 0, s>>>(z, dA, q, C, mean, invstd, gamma, beta, part, dz1);
    else bn_bwd_partial_kernel<T, TD, false><<<grid, 256, 0, s>>>(z, dA, q, C, mean, invstd, gamma, beta, part, dz1);
    CUDA_CHECK(cudaGetLastError());
    if (!gamma) {   // dz is written: of the apply pass, the block that adds the partials into dbeta alone
        BnFlat f0 = f;
        f0.ng = 0;
        bn_bwd_apply_kernel<T, TD, false><<<dim3(1, (unsigned)C), 32, 0, s>>>(z, dA, zs, mean, invstd, gamma, beta,
                                                                              part, q.K, cnt, train, dgamma, dbeta,
                                                                              dz, C, HW, f0);
        CUDA_CHECK(cudaGetLastError());
        return;
    }
    bn_bwd_apply_launch(z, dA, zs, mean, invstd, gamma, beta, dgamma, dbeta, dz, part, q.K, B, C, HW, train, s);
}
extern "C" void bn_silu_backward_cuda(const uint16_t *z, const float *dA, long zs, const float *mean,
                                      const float *invstd, const float *gamma, const float *beta, float *dgamma,
                                      float *dbeta, uint16_t *dz, float *scratch, int B, int C, int HW, int train,
                                      void *stream) {
    bn_silu_backward_launch((const __half *)z, dA, zs, mean, invstd, gamma, beta, dgamma, dbeta, (__half *)dz, scratch,
                            B, C, HW, train, stream);
}
// bn_bwd_sums_kernel: a channel's K sums of gy and of gy*xhat in part (conv_dgrad_bn_cuda's: one a pixel
// tile, thousands in the early layers, where bn_bwd_partial_kernel's chunks are at most 256) added in a
// fixed order (thread t the sums t, t + 256, ... in turn, then block_sum), into out[c] and out[C + c]:
// bn_bwd_apply_kernel's blocks then each read one sum of each kind, not K. Grid C, 256 threads.
__global__ void bn_bwd_sums_kernel(const float *part, long K, int C, float *out) {
    const int c = blockIdx.x;
    float sg = 0.0f, sgx = 0.0f;
    for (long k = threadIdx.x; k < K; k += blockDim.x) sg += part[c * K + k], sgx += part[C * K + c * K + k];
    sg = block_sum(sg);
    sgx = block_sum(sgx);
    if (threadIdx.x == 0) out[c] = sg, out[C + c] = sgx;
}
extern "C" void bn_silu_backward_apply_h_cuda(const uint16_t *z, const uint16_t *dA, long zs, const float *mean,
                                              const float *invstd, const float *gamma, const float *beta,
                                              float *dgamma, float *dbeta, uint16_t *dz, float *part, long K, int B,
                                              int C, int HW, int train, void *stream) {
    if (C == 0 || (long)B * HW == 0) return;
    if (K < 1) {
        fprintf(stderr, "bn_silu_backward_apply_h_cuda: %ld partial sums a channel\n", K);
        exit(1);
    }
    cudaStream_t s = (cudaStream_t)stream;
    float *sums = part + 2 * (long)C * K;
    bn_bwd_sums_kernel<<<C, 256, 0, s>>>(part, K, C, sums);
    CUDA_CHECK(cudaGetLastError());
    bn_bwd_apply_launch((const __half *)z, (const __half *)dA, zs ? zs : (long)C * HW, mean, invstd, gamma, beta,
                        dgamma, dbeta, (__half *)dz, sums, 1, B, C, HW, train, s);
}
extern "C" void bn_silu_backward_h_cuda(const uint16_t *z, const uint16_t *dA, long zs, const float *mean,
                                        const float *invstd, const float *gamma, const float *beta, float *dgamma,
                                        float *dbeta, uint16_t *dz, float *scratch, int B, int C, int HW, int train,
                                        void *stream) {
    bn_silu_backward_launch((const __half *)z, (const __half *)dA, zs, mean, invstd, gamma, beta, dgamma, dbeta,
                            (__half *)dz, scratch, B, C, HW, train, stream);
}
extern "C" void bn_silu_backward_f32_cuda(const float *z, const float *dA, long zs, const float *mean,
                                          const float *invstd, const float *gamma, const float *beta, float *dgamma,
                                          float *dbeta, float *dz, float *scratch, int B, int C, int HW, int train,
                                          void *stream) {
    bn_silu_backward_launch(z, dA, zs, mean, invstd, gamma, beta, dgamma, dbeta, dz, scratch, B, C, HW, train, stream);
}

// ------------------------------------------------------------------------------------------
// upsample, max-pool backward; copies and conversions
// ------------------------------------------------------------------------------------------

// upsample2_backward: dx = the 2x2 sum of dy, in the CPU's order (in FP32; an FP16 gradient is rounded
// once, when stored); dy's images gs apart (0: dense), dx dense. One thread per dx element, or with V4
// (W a multiple of 4, gs of 8, both pointers 16-byte aligned) per 4 of a row: its two dy rows' 8 values
// each in 16-byte loads (one for FP16, two for FP32), the 4 sums in one 8- or 16-byte store
template <class T, bool V4>
__global__ void upsample2_backward_kernel(const T *dy, long gs, T *dx, int C, int H, int W, long n) {
    constexpr int V = V4 ? 4 : 1;
    long i = ((long)blockIdx.x * blockDim.x + threadIdx.x) * V;
    if (i >= n) return;
    int x = (int)(i % W), y = (int)((i / W) % H);
    long bc = i / ((long)W * H), b = bc / C;
    const T *g = dy + b * gs + ((bc - b * C) * 2 * H + 2 * y) * 2 * W + 2 * x;
    if (V4) {   // dx x .. x+3 of the row: dy columns 2x .. 2x+7 of rows 2y and 2y+1
        float t[8], u[8], s[4];
        load8(g, t);
        load8(g + 2 * W, u);
#pragma unroll
        for (int e = 0; e < 4; e++) s[e] = t[2 * e] + t[2 * e + 1] + u[2 * e] + u[2 * e + 1];
        store4(dx + i, s);
    } else {
        dx[i] = act_from<T>(act_f(g[0]) + act_f(g[1]) + act_f(g[2 * W]) + act_f(g[2 * W + 1]));
    }
}
template <class T>
static void upsample2_backward_launch(const T *dy, long gs, T *dx, int B, int C, int H, int W, void *stream) {
    long n = (long)B * C * H * W;
    if (n == 0) return;
    if (!gs) gs = 4L * C * H * W;
    cudaStream_t s = (cudaStream_t)stream;
    if (W % 4 == 0 && gs % 8 == 0 && (uintptr_t)dy % 16 == 0 && (uintptr_t)dx % 16 == 0)
        upsample2_backward_kernel<T, true><<<cdiv(n / 4, 256), 256, 0, s>>>(dy, gs, dx, C, H, W, n);
    else upsample2_backward_kernel<T, false><<<cdiv(n, 256), 256, 0, s>>>(dy, gs, dx, C, H, W, n);
    CUDA_CHECK(cudaGetLastError());
}
extern "C" void upsample2_backward_cuda(const float *dy, long gs, float *dx, int B, int C, int H, int W,
                                        void *stream) {
    upsample2_backward_launch(dy, gs, dx, B, C, H, W, stream);
}
extern "C" void upsample2_backward_f16_cuda(const uint16_t *dy, long gs, uint16_t *dx, int B, int C, int H, int W,
                                            void *stream) {
    upsample2_backward_launch((const __half *)dy, gs, (__half *)dx, B, C, H, W, stream);
}

// maxpool5_backward: a 16x16 block owns a 16x16 tile of dx. It stages the 24x24 input tile, finds
// the argmax of the 20x20 windows whose output reads the tile (first maximum in row-major window
// order, padding skipped, as the CPU), then every input pixel gathers the dy of the outputs whose
// argmax it is, in output row-major order (the CPU's summation order), in FP32 (an FP16 gradient is
// rounded once, when stored; FP16 inputs are compared as the exact floats they are).
// grid (ceil(W/16), ceil(H/16), B*C); dx dense, x's images xs apart, dy's gs
template <class T>
__global__ void maxpool5_backward_kernel(const T *x, long xs, const T *dy, long gs, T *dx, int C, int H, int W) {
    __shared__ float xt[MP_T + 8][MP_T + 9];
    __shared__ int arg[MP_S][MP_S];
    __shared__ float g[MP_S][MP_S];
    const long base = (long)blockIdx.z * H * W, b = blockIdx.z / C, cn = (blockIdx.z - b * C) * (long)H * W,
               gbase = b * gs + cn, xbase = b * xs + cn;
    int tx0 = blockIdx.x * MP_T, ty0 = blockIdx.y * MP_T, tid = threadIdx.y * MP_T + threadIdx.x;
    for (int t = tid; t < (MP_T + 8) * (MP_T + 8); t += MP_T * MP_T) {
        int r = t / (MP_T + 8), c = t % (MP_T + 8), iy = ty0 - 4 + r, ix = tx0 - 4 + c;
        xt[r][c] = (iy >= 0 && iy < H && ix >= 0 && ix < W) ? act_f(x[xbase + (long)iy * W + ix]) : 0.0f;
    }
    __syncthreads();
    for (int t = tid; t < MP_S * MP_S; t += MP_T * MP_T) {
        int r = t / MP_S, c = t % MP_S, oy = ty0 - 2 + r, ox = tx0 - 2 + c, a = -1;
        if (oy >= 0 && oy < H && ox >= 0 && ox < W) {
            float m = -INFINITY;
            for (int dy2 = -2; dy2 <= 2; dy2++)
                for (int dx2 = -2; dx2 <= 2; dx2++) {
                    int iy = oy + dy2, ix = ox + dx2;
                    if (iy >= 0 && iy < H && ix >= 0 && ix < W && xt[r + 2 + dy2][c + 2 + dx2] > m) {
                        m = xt[r + 2 + dy2][c + 2 + dx2];
                        a = iy * W + ix;
                    }
                }
            g[r][c] = act_f(dy[gbase + (long)oy * W + ox]);
        } else g[r][c] = 0.0f;
        arg[r][c] = a;
    }
    __syncthreads();
    int iy = ty0 + threadIdx.y, ix = tx0 + threadIdx.x;
    if (iy < H && ix < W) {
        float s = 0.0f;
        int me = iy * W + ix;
        for (int r = (int)threadIdx.y; r < (int)threadIdx.y + 5; r++)
            for (int c = (int)threadIdx.x; c < (int)threadIdx.x + 5; c++)
                if (arg[r][c] == me) s += g[r][c];
        dx[base + me] = act_from<T>(s);
    }
}
// maxpool5_backward_plane: the same for a plane up to 64 x 64 (SPPF's), one block per (channel, image),
// the plane read once into shared memory (-inf around it: a window's padding is never its maximum,
// as the CPU skips it). The argmax is separable: a row pass finds each 5-wide row segment's maximum
// and its first column (strictly greater wins, from -inf), a column pass the first of the 5 rows whose
// maximum is strictly greater than those above: the first maximum in row-major window order, the
// CPU's (NaN never wins, an all -inf window has none). Each output keeps its argmax as its offset in
// the window (0..24, -1 none); each input pixel then sums the dy of the outputs whose argmax it is, in
// output row-major order. About 16 shared reads per output (5 per row segment, 10 in the column
// pass) and 25 per input, where the 16x16 tiles read 25 per output and 25-50 per input, and a 20x20
// plane took 4 tiles. grid (C, B)
// Shared memory: mp_bwd_smem(H, W) bytes, sized to the plane (5.0 KB for SPPF's 20x20 planes, so that
// an SM holds 8 blocks; the 68x68 maximum needs 44 KB).
template <class T>
__global__ void maxpool5_backward_plane_kernel(const T *x, long xs, const T *dy, long gs, T *dx, int C, int H,
                                               int W) {
    extern __shared__ float mp_smem[];
    const int c = blockIdx.x, b = blockIdx.y, PW = W + 4, PH = H + 4, n = H * W;
    float *t = mp_smem, *rm = t + PH * PW;
    signed char *rc = (signed char *)(rm + PH * W), *code = rc + PH * W;
    const long base = ((long)b * C + c) * n, gbase = b * gs + (long)c * n;
    maxpool5_plane_stage(x + b * xs + (long)c * n, t, H, W);
    for (int i = threadIdx.x; i < PH * W; i += blockDim.x) {   // rows: rm, rc (PH, W)
        int py = i / W, ox = i - py * W;
        const float *q = t + py * PW + ox;
        float m = -INFINITY;
        int a = -1;
#pragma unroll
        for (int k = 0; k < 5; k++)
            if (q[k] > m) m = q[k], a = k;
        rm[i] = m;
        rc[i] = (signed char)a;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x) {   // columns: output (oy, ox) = i, rows oy .. oy+4
        float m = -INFINITY;
        int a = -1;
#pragma unroll
        for (int k = 0; k < 5; k++)
            if (rm[i + k * W] > m) m = rm[i + k * W], a = 5 * k + rc[i + k * W];
        code[i] = (signed char)a;
    }
    // dy's plane into the padded plane's place (dead since the row pass): the sums below then read
    // shared memory only. They read dy from global memory, each load behind its own argmax test, so
    // that a warp waited on several dependent trips to memory per input pixel (an H200 took 30 us a
    // launch at SPPF's 20x20 planes; the forward plane kernel 8)
    for (int i = threadIdx.x; i < n; i += blockDim.x) t[i] = act_f(dy[gbase + i]);
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const int iy = i / W, ix = i - iy * W;
        float s = 0.0f;
        for (int oy = max(iy - 2, 0); oy <= min(iy + 2, H - 1); oy++)
            for (int ox = max(ix - 2, 0); ox <= min(ix + 2, W - 1); ox++)
                if (code[oy * W + ox] == 5 * (iy - oy + 2) + ix - ox + 2) s += t[oy * W + ox];
        dx[base + i] = act_from<T>(s);
    }
}
template <class T>
static void maxpool5_backward_launch(const T *x, long xs, const T *dy, long gs, T *dx, int B, int C, int H, int W,
                                      void *stream) {
    if ((long)B * C * H * W == 0) return;
    if (!xs) xs = (long)C * H * W;
    if (!gs) gs = (long)C * H * W;
    cudaStream_t s = (cudaStream_t)stream;
    dim3 grid(cdiv(W, MP_T), cdiv(H, MP_T), (unsigned)(B * C)), block(MP_T, MP_T);
    if ((H + 4) * (W + 4) <= MP_PLANE && B <= 65535)   // B is grid.y
        maxpool5_backward_plane_kernel<T><<<dim3((unsigned)C, (unsigned)B), 256, mp_bwd_smem(H, W), s>>>(x, xs, dy, gs,
                                                                                                      dx, C, H, W);
    else
        maxpool5_backward_kernel<T><<<grid, block, 0, s>>>(x, xs, dy, gs, dx, C, H, W);
    CUDA_CHECK(cudaGetLastError());
}
extern "C" void maxpool5_backward_cuda(const float *x, long xs, const float *dy, long gs, float *dx, int B, int C,
                                       int H, int W, void *stream) {
    maxpool5_backward_launch(x, xs, dy, gs, dx, B, C, H, W, stream);
}
extern "C" void maxpool5_backward_f16_cuda(const uint16_t *x, long xs, const uint16_t *dy, long gs, uint16_t *dx,
                                           int B, int C, int H, int W, void *stream) {
    maxpool5_backward_launch((const __half *)x, xs, (const __half *)dy, gs, (__half *)dx, B, C, H, W, stream);
}

// copy_act: B blocks of n values of T (__half or float). V16: each thread moves 16 bytes (8 halves or 4
// floats; the strides and both pointers allow it), the last thread of a block the n % (16 / sizeof T)
// values past the last whole word one by one; else one value a thread. grid (ceil(n/(256*V)), B)
template <class T, bool V16>
__global__ void copy_act_kernel(const T *src, long ss, T *dst, long ds, long n) {
    constexpr int V = V16 ? 16 / (int)sizeof(T) : 1;
    long i = ((long)blockIdx.x * blockDim.x + threadIdx.x) * V;
    const T *a = src + blockIdx.y * ss;
    T *d = dst + blockIdx.y * ds;
    if constexpr (V16) {
        if (i + V <= n) {
            *(uint4 *)(d + i) = *(const uint4 *)(a + i);
            return;
        }
    }
    for (long e = i; e < n && e < i + V; e++) d[e] = a[e];
}
template <class T>
static void copy_act_launch(const T *src, long ss, T *dst, long ds, int B, long n, void *stream) {
    if (B == 0 || n == 0) return;
    constexpr int V = 16 / (int)sizeof(T);
    cudaStream_t s = (cudaStream_t)stream;
    if (ss % V == 0 && ds % V == 0 && (uintptr_t)src % 16 == 0 && (uintptr_t)dst % 16 == 0)
        copy_act_kernel<T, true><<<dim3(cdiv(cdiv(n, V), 256), (unsigned)B), 256, 0, s>>>(src, ss, dst, ds, n);
    else copy_act_kernel<T, false><<<dim3(cdiv(n, 256), (unsigned)B), 256, 0, s>>>(src, ss, dst, ds, n);
    CUDA_CHECK(cudaGetLastError());
}
extern "C" void copy_f16_cuda(const uint16_t *src, long ss, uint16_t *dst, long ds, int B, long n, void *stream) {
    copy_act_launch((const __half *)src, ss, (__half *)dst, ds, B, n, stream);
}
extern "C" void copy_f32_cuda(const float *src, long ss, float *dst, long ds, int B, long n, void *stream) {
    copy_act_launch(src, ss, dst, ds, B, n, stream);
}
// u8_to_act: the input image, x * (1/255) in float (input_from_batch; u8_unit, as the stem's kernels convert
// it where they read the uint8 batch), stored as T. V16: each thread writes one 16-byte word (8 halves or 4
// floats) from one 8- or 4-byte load, so that a warp's loads and its stores are each one contiguous span (x
// and y aligned for those); the last thread takes the tail past the last whole word one by one. Else one
// byte a thread. grid ceil(n/(256 V))
template <class T, bool V16>
__global__ void u8_to_act_kernel(const uint8_t *x, T *y, long n) {
    constexpr int V = V16 ? 16 / (int)sizeof(T) : 1;
    long i = ((long)blockIdx.x * blockDim.x + threadIdx.x) * V;
    if constexpr (V16) {
        if (i + V <= n) {
            union { uint2 u2; unsigned u1; uint32_t w[2]; } q;
            float v[V];
            if constexpr (V == 8) q.u2 = *(const uint2 *)(x + i);
            else q.u1 = *(const unsigned *)(x + i);
#pragma unroll
            for (int e = 0; e < V; e++) v[e] = u8_unit(q.w[e >> 2], e & 3);
            if constexpr (V == 8) store8(y + i, v);
            else store4(y + i, v);
            return;
        }
    }
    for (long e = i; e < n && e < i + V; e++) y[e] = act_from<T>(u8_unit(x[e], 0));
}
template <class T>
static void u8_to_act_launch(const uint8_t *x, T *y, long n, void *stream) {
    if (n == 0) return;
    constexpr int V = 16 / (int)sizeof(T);
    cudaStream_t s = (cudaStream_t)stream;
    if ((uintptr_t)x % V == 0 && (uintptr_t)y % 16 == 0)
        u8_to_act_kernel<T, true><<<cdiv(cdiv(n, V), 256), 256, 0, s>>>(x, y, n);
    else u8_to_act_kernel<T, false><<<cdiv(n, 256), 256, 0, s>>>(x, y, n);
    CUDA_CHECK(cudaGetLastError());
}
extern "C" void u8_to_f16_cuda(const uint8_t *x, uint16_t *y, long n, void *stream) {
    u8_to_act_launch(x, (__half *)y, n, stream);
}
extern "C" void u8_to_f32_cuda(const uint8_t *x, float *y, long n, void *stream) { u8_to_act_launch(x, y, n, stream); }
__global__ void f32_to_f16_kernel(const float *x, __half *y, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = __float2half(x[i]);
}
extern "C" void f32_to_f16_cuda(const float *x, uint16_t *y, long n, void *stream) {
    if (n == 0) return;
    f32_to_f16_kernel<<<cdiv(n, 256), 256, 0, (cudaStream_t)stream>>>(x, (__half *)y, n);
    CUDA_CHECK(cudaGetLastError());
}

// conv_w_tapmajor: wt (Cout, 9, Cin) = w (Cout, Cin, 9) of job blockIdx.y, one thread per element of wt
// (the reads 9 halves apart, the writes consecutive); up to 16 jobs a launch
struct TapMajorJobs { ConvWtJob j[16]; };
__global__ void conv_w_tapmajor_kernel(TapMajorJobs jobs) {
    const ConvWtJob &jb = jobs.j[blockIdx.y];
    const long n = (long)jb.cout * jb.cin * 9, i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const long row = i / jb.cin, m = i - row * jb.cin, c = row / 9, t = row - c * 9;
    ((__half *)jb.wt)[i] = ((const __half *)jb.w)[(c * jb.cin + m) * 9 + t];
}
extern "C" void conv_w_tapmajor_cuda(const ConvWtJob *jobs, int n, void *stream) {
    for (int k = 0; k < n; k += 16) {
        TapMajorJobs b = {};
        long most = 0;
        int nb = min(n - k, 16);
        for (int j = 0; j < nb; j++) {
            b.j[j] = jobs[k + j];
            const long nj = (long)jobs[k + j].cout * jobs[k + j].cin * 9;
            if (nj > most) most = nj;
        }
        if (most == 0) continue;
        conv_w_tapmajor_kernel<<<dim3(cdiv(most, 256), nb), 256, 0, (cudaStream_t)stream>>>(b);
        CUDA_CHECK(cudaGetLastError());
    }
}

// ------------------------------------------------------------------------------------------
// views of the training step (yolo.c gpu_*): upsample / max-pool (FP16 or FP32) into a concat slice, adds
// ------------------------------------------------------------------------------------------

// upsample2_forward_act: nearest x2 of T (__half or float), one thread per output element; grid
// (ceil(4HW/256), C, B). x dense (B, C, H, W) -> y (B, C, 2H, 2W) with image stride ys (a channel slice).
template <class T>
__global__ void upsample2_forward_act_kernel(const T *x, T *y, long ys, int C, int H, int W) {
    int i = blockIdx.x * blockDim.x + threadIdx.x, c = blockIdx.y, b = blockIdx.z;
    if (i >= 4 * H * W) return;
    int ox = i % (2 * W), oy = i / (2 * W);
    y[b * ys + (long)c * 4 * H * W + i] = x[((long)b * C + c) * H * W + (oy / 2) * W + ox / 2];
}
template <class T>
static void upsample2_forward_act_launch(const T *x, T *y, long ys, int B, int C, int H, int W, void *stream) {
    if ((long)B * C * H * W == 0) return;
    dim3 grid(cdiv(4L * H * W, 256), (unsigned)C, (unsigned)B);
    upsample2_forward_act_kernel<T><<<grid, 256, 0, (cudaStream_t)stream>>>(x, y, ys ? ys : 4L * C * H * W, C, H, W);
    CUDA_CHECK(cudaGetLastError());
}
extern "C" void upsample2_forward_f16_cuda(const uint16_t *x, uint16_t *y, long ys, int B, int C, int H, int W,
                                           void *stream) {
    upsample2_forward_act_launch((const __half *)x, (__half *)y, ys, B, C, H, W, stream);
}
extern "C" void upsample2_forward_f32_cuda(const float *x, float *y, long ys, int B, int C, int H, int W,
                                           void *stream) {
    upsample2_forward_act_launch(x, y, ys, B, C, H, W, stream);
}

// bn_silu_upsample2: nearest x2 of SiLU(BN(z)) (bn_silu_value's bits, rounded to T once) in three shapes.
// V4: each thread takes 4 inputs of a row (W a multiple of 4) in one 8- (FP16) or 16-byte (FP32) load and
// writes each output row's 8 values in 16-byte stores (zs a multiple of 4, ys of 8, z and y aligned for
// those); else one input a thread writing its 2x2 outputs, with PAIR each output row's two in one 4- or
// 8-byte store (y and ys allow it). grid (ceil(HW/(256 V)), C, B), V = 4 or 1; z image stride zs, y
// image stride ys.
template <class T> __device__ __forceinline__ void store_pair(T *p, T v);
template <> __device__ __forceinline__ void store_pair<__half>(__half *p, __half v) {
    *(__half2 *)p = __halves2half2(v, v);
}
template <> __device__ __forceinline__ void store_pair<float>(float *p, float v) { *(float2 *)p = make_float2(v, v); }
template <class T, bool PAIR, bool V4>
__global__ void bn_silu_upsample2_kernel(const T *z, long zs, const float *mean, const float *invstd,
                                         const float *gamma, const float *beta, T *y, long ys, int H, int W) {
    constexpr int V = V4 ? 4 : 1;
    int i = (blockIdx.x * blockDim.x + threadIdx.x) * V, c = blockIdx.y, b = blockIdx.z;
    if (i >= H * W) return;
    const float2 bn = bn_fold(mean, invstd, gamma, beta, c);
    const T *zp = z + b * zs + (long)c * H * W + i;
    int ix = i % W, iy = i / W;
    T *p = y + b * ys + (long)c * 4 * H * W + (long)(2 * iy) * (2 * W) + 2 * ix;
    if (V4) {   // inputs ix .. ix+3 of row iy: outputs 2ix .. 2ix+7 of rows 2iy and 2iy+1
        float v[4], o[8];
        load4(zp, v);
#pragma unroll
        for (int e = 0; e < 4; e++)   // rounded to T and back: each output holds the scalar path's bits
            o[2 * e] = o[2 * e + 1] = act_f(act_from<T>(bn_silu_folded(v[e], bn.x, bn.y)));
        store8(p, o);
        store8(p + 2 * W, o);
        return;
    }
    T a = act_from<T>(bn_silu_folded(act_f(*zp), bn.x, bn.y));
    if (PAIR) {
        store_pair(p, a);
        store_pair(p + 2 * W, a);
    } else {
        p[0] = a, p[1] = a, p[2 * W] = a, p[2 * W + 1] = a;
    }
}
template <class T>
static void bn_silu_upsample2_launch(const T *z, long zs, const float *mean, const float *invstd, const float *gamma,
                                     const float *beta, T *y, long ys, int B, int C, int H, int W, void *stream) {
    if ((long)B * C * H * W == 0) return;
    if (!zs) zs = (long)C * H * W;
    if (!ys) ys = 4L * C * H * W;
    cudaStream_t s = (cudaStream_t)stream;
    const bool v4 =
        W % 4 == 0 && zs % 4 == 0 && ys % 8 == 0 && (uintptr_t)z % (4 * sizeof(T)) == 0 && (uintptr_t)y % 16 == 0;
    const dim3 grid(cdiv(H * W / (v4 ? 4 : 1), 256), (unsigned)C, (unsigned)B);
    if (v4) bn_silu_upsample2_kernel<T, true, true><<<grid, 256, 0, s>>>(z, zs, mean, invstd, gamma, beta, y, ys, H, W);
    else if (ys % 2 == 0 && (uintptr_t)y % (2 * sizeof(T)) == 0)
        bn_silu_upsample2_kernel<T, true, false><<<grid, 256, 0, s>>>(z, zs, mean, invstd, gamma, beta, y, ys, H, W);
    else bn_silu_upsample2_kernel<T, false, false><<<grid, 256, 0, s>>>(z, zs, mean, invstd, gamma, beta, y, ys, H, W);
    CUDA_CHECK(cudaGetLastError());
}
extern "C" void bn_silu_upsample2_f16_cuda(const uint16_t *z, long zs, const float *mean, const float *invstd,
                                           const float *gamma, const float *beta, uint16_t *y, long ys, int B, int C,
                                           int H, int W, void *stream) {
    bn_silu_upsample2_launch((const __half *)z, zs, mean, invstd, gamma, beta, (__half *)y, ys, B, C, H, W, stream);
}
extern "C" void bn_silu_upsample2_f32_cuda(const float *z, long zs, const float *mean, const float *invstd,
                                           const float *gamma, const float *beta, float *y, long ys, int B, int C,
                                           int H, int W, void *stream) {
    bn_silu_upsample2_launch(z, zs, mean, invstd, gamma, beta, y, ys, B, C, H, W, stream);
}

// maxpool5_forward_act: 5x5, stride 1, pad 2 (-inf) of T (__half or float), one thread per output
// reading its window (max is exact, so the FP16 result equals the FP32 pool of the same values); grid
// (ceil(HW/256), C, B). x (B, C, H, W) with image stride xs -> y with image stride ys.
template <class T>
__global__ void maxpool5_forward_act_kernel(const T *x, long xs, T *y, long ys, int H, int W) {
    int i = blockIdx.x * blockDim.x + threadIdx.x, c = blockIdx.y, b = blockIdx.z;
    if (i >= H * W) return;
    int ox = i % W, oy = i / W;
    const T *p = x + b * xs + (long)c * H * W;
    float m = -INFINITY;
    for (int dy = -2; dy <= 2; dy++)
        for (int dx = -2; dx <= 2; dx++) {
            int iy = oy + dy, ix = ox + dx;
            if (iy >= 0 && iy < H && ix >= 0 && ix < W) m = fmaxf(m, act_f(p[iy * W + ix]));
        }
    y[b * ys + (long)c * H * W + i] = act_from<T>(m);
}
// maxpool5_plane: the same pool, one block per (c, b) plane that fits MP_PLANE floats with its -inf
// border (SPPF's 20x20 maps at imgsz 640, up to 64x64): the plane is read once into shared memory,
// then a row pass (max of 5 across) and a column pass (max of 5 down). Max is exact, so the
// separable order gives the same values as the 25-value window; each input is loaded once, where
// maxpool5_forward_act's threads load 25 each. grid (C, B)
// Shared memory: mp_fwd_smem(H, W) bytes, sized to the plane.
template <class T>
__global__ void maxpool5_plane_kernel(const T *x, long xs, T *y, long ys, int H, int W) {
    extern __shared__ float mp_smem[];
    const int c = blockIdx.x, b = blockIdx.y, PW = W + 4, PH = H + 4, n = H * W;
    float *t = mp_smem, *r = t + PH * PW;
    maxpool5_plane_stage(x + b * xs + (long)c * n, t, H, W);
    for (int i = threadIdx.x; i < PH * W; i += blockDim.x) {   // rows: r (PH, W)
        int py = i / W, ox = i - py * W;
        const float *q = t + py * PW + ox;
        r[i] = fmaxf(fmaxf(fmaxf(q[0], q[1]), fmaxf(q[2], q[3])), q[4]);
    }
    __syncthreads();
    T *o = y + b * ys + (long)c * n;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {   // columns
        const float *q = r + i;   // output (oy, ox) = i: rows oy .. oy+4 of r, W apart
        o[i] = act_from<T>(fmaxf(fmaxf(fmaxf(q[0], q[W]), fmaxf(q[2 * W], q[3 * W])), q[4 * W]));
    }
}
template <class T>
static void maxpool5_forward_act_launch(const T *x, long xs, T *y, long ys, int B, int C, int H, int W,
                                        void *stream) {
    if ((long)B * C * H * W == 0) return;
    if (!xs) xs = (long)C * H * W;
    if (!ys) ys = (long)C * H * W;
    cudaStream_t s = (cudaStream_t)stream;
    dim3 planes((unsigned)C, (unsigned)B), grid(cdiv((long)H * W, 256), (unsigned)C, (unsigned)B);
    if ((H + 4) * (W + 4) <= MP_PLANE && B <= 65535)   // B is grid.y
        maxpool5_plane_kernel<T><<<planes, 256, mp_fwd_smem(H, W), s>>>(x, xs, y, ys, H, W);
    else
        maxpool5_forward_act_kernel<T><<<grid, 256, 0, s>>>(x, xs, y, ys, H, W);
    CUDA_CHECK(cudaGetLastError());
}
extern "C" void maxpool5_forward_f16_cuda(const uint16_t *x, long xs, uint16_t *y, long ys, int B, int C, int H,
                                          int W, void *stream) {
    maxpool5_forward_act_launch((const __half *)x, xs, (__half *)y, ys, B, C, H, W, stream);
}
extern "C" void maxpool5_forward_f32_cuda(const float *x, long xs, float *y, long ys, int B, int C, int H, int W,
                                          void *stream) {
    maxpool5_forward_act_launch(x, xs, y, ys, B, C, H, W, stream);
}

// add_f16: dst[b*ds + i] += src[b*ss + i] (FP32 sum, rounded once); grid (ceil(n/256), B), or with
// V8 (n, ss, ds multiples of 8, 16-byte aligned) ceil(n/2048) blocks of 8 values a thread
template <bool V8>
__global__ void add_f16_kernel(const __half *src, long ss, __half *dst, long ds, long n) {
    long i = ((long)blockIdx.x * blockDim.x + threadIdx.x) * (V8 ? 8 : 1);
    if (i < n) {
        __half *d = dst + blockIdx.y * ds + i;
        const __half *a = src + blockIdx.y * ss + i;
        if (V8) {   // n, the strides and both pointers allow 16-byte words: the same sums, 8 at a time
            float u[8], v[8];
            load8(d, u);
            load8(a, v);
#pragma unroll
            for (int e = 0; e < 8; e++) u[e] += v[e];
            store8(d, u);
        } else *d = __float2half(__half2float(*d) + __half2float(*a));
    }
}
extern "C" void add_f16_cuda(const uint16_t *src, long ss, uint16_t *dst, long ds, int B, long n, void *stream) {
    if (B == 0 || n == 0) return;
    const __half *a = (const __half *)src;
    __half *d = (__half *)dst;
    cudaStream_t s = (cudaStream_t)stream;
    if (n % 8 == 0 && bn_vec8(8, ss, ds, src, dst, dst))
        add_f16_kernel<true><<<dim3(cdiv(n / 8, 256), (unsigned)B), 256, 0, s>>>(a, ss, d, ds, n);
    else add_f16_kernel<false><<<dim3(cdiv(n, 256), (unsigned)B), 256, 0, s>>>(a, ss, d, ds, n);
    CUDA_CHECK(cudaGetLastError());
}

// add_f32: dst[b*ds + i] += src[b*ss + i]; grid (ceil(n/256), B)
__global__ void add_f32_kernel(const float *src, long ss, float *dst, long ds, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[blockIdx.y * ds + i] += src[blockIdx.y * ss + i];
}
extern "C" void add_f32_cuda(const float *src, long ss, float *dst, long ds, int B, long n, void *stream) {
    if (B == 0 || n == 0) return;
    add_f32_kernel<<<dim3(cdiv(n, 256), (unsigned)B), 256, 0, (cudaStream_t)stream>>>(src, ss, dst, ds, n);
    CUDA_CHECK(cudaGetLastError());
}

// add_n: dst.p[j][b*dst.s[j] + i] += src[b*ss + i] for each j < dst.k in turn (each sum in FP32, rounded
// once to T: add_f16's and add_f32's bits), or = where bit j of dst.set is; grid (ceil(n/256), B), or
// with V8 (n, the strides and pointers allow 16-byte words) ceil(n/2048) blocks of 8 values a thread
template <class T, bool V8>
__global__ void add_n_kernel(const T *src, long ss, AddDst dst, long n) {
    long i = ((long)blockIdx.x * blockDim.x + threadIdx.x) * (V8 ? 8 : 1);
    if (i >= n) return;
    const T *a = src + blockIdx.y * ss + i;
    if (V8) {
        float v[8], u[8];
        load8(a, v);
#pragma unroll
        for (int j = 0; j < ADD_DST_MAX; j++) {   // (unrolled: dst stays in parameter space, no stack copy)
            if (j >= dst.k) break;
            T *d = (T *)dst.p[j] + blockIdx.y * dst.s[j] + i;
            if (dst.set >> j & 1) {   // (no gradient there yet: written, the source's bits)
                store8(d, v);
                continue;
            }
            load8(d, u);
#pragma unroll
            for (int e = 0; e < 8; e++) u[e] += v[e];
            store8(d, u);
        }
    } else {
        float v = act_f(*a);
#pragma unroll
        for (int j = 0; j < ADD_DST_MAX; j++) {
            if (j >= dst.k) break;
            T *d = (T *)dst.p[j] + blockIdx.y * dst.s[j] + i;
            *d = dst.set >> j & 1 ? *a : act_from<T>(act_f(*d) + v);
        }
    }
}
template <class T>
static void add_n_launch(const T *src, long ss, AddDst dst, int B, long n, void *stream) {
    if (B == 0 || n == 0 || dst.k == 0) return;
    if (dst.k < 0 || dst.k > ADD_DST_MAX) {   // (a caller's bug: yolo.c passes at most ADD_DST_MAX)
        fprintf(stderr, "add_n: %d destinations (at most %d)\n", dst.k, ADD_DST_MAX);
        abort();
    }
    bool v8 = n % 8 == 0 && bn_vec8(8, ss, ss, src, src, src);
    for (int j = 0; j < dst.k; j++) v8 = v8 && bn_vec8(8, dst.s[j], dst.s[j], dst.p[j], dst.p[j], dst.p[j]);
    cudaStream_t s = (cudaStream_t)stream;
    if (v8) add_n_kernel<T, true><<<dim3(cdiv(n / 8, 256), (unsigned)B), 256, 0, s>>>(src, ss, dst, n);
    else add_n_kernel<T, false><<<dim3(cdiv(n, 256), (unsigned)B), 256, 0, s>>>(src, ss, dst, n);
    CUDA_CHECK(cudaGetLastError());
}
extern "C" void add_n_f16_cuda(const uint16_t *src, long ss, AddDst dst, int B, long n, void *stream) {
    add_n_launch((const __half *)src, ss, dst, B, n, stream);
}
extern "C" void add_n_f32_cuda(const float *src, long ss, AddDst dst, int B, long n, void *stream) {
    add_n_launch(src, ss, dst, B, n, stream);
}

// ------------------------------------------------------------------------------------------
// loss: task-aligned assigner, BCE, CIoU and DFL, forward and backward (loss_forward_backward)
// ------------------------------------------------------------------------------------------
/*
 * The twin of loss_forward_backward in yolo.c, with the same float formulas in the same operation order
 * (only the order of the double sums differs; on a GPU nvcc contracts a*b + c into FMAs and its expf,
 * atanf differ in the last bits, so there the results agree to rounding, not bit for bit). The host gathers the boxes
 * of each image (loss_gather_gts); then a memset of the claim counters and eight kernels on the stream:
 *   kernel   threads   computes                                                      yolo.c
 *   decode   B*A       predicted boxes in pixels (images with boxes)                 tal_decode_batch
 *   topk     B*M       each gt's top-10 over its anchor rectangle; its claims        tal_topk_gt
 *   resolve  B*A       an anchor claimed twice goes to the gt of largest overlap;    tal_resolve_image
 *                      per-gt max align and max overlap (atomicMax on float bits)
 *   score    B*A       target score of each foreground anchor; block sums           tal_resolve_image
 *   norm     1 block   target_scores_sum, n_fg, the gradient scales                  step 1 end
 *   terms    B*A       BCE of every class logit and its gradient; the box logits'    steps 2-3
 *                      gradients 0 at background anchors; block sums
 *   fg       B*A       at foreground anchors: the class correction, CIoU and DFL     steps 2-3, loss_fg_term
 *                      and their gradients; block sums
 *   out      1 block   the block sums in a fixed order -> out
 * No foreground list: the per-anchor kernels skip background anchors (fg's threads there only join the
 * block sum), and every sum is a block sum in a fixed tree plus a fixed-order sum of the block
 * partials, so results do not depend on scheduling. The integer claim counts are atomic (order-free); an anchor claimed
 * by one gt keeps that gt's metrics, written by the one thread that claimed it. Known cost: topk walks a gt's rectangle
 * in one thread, so a box covering the image costs that thread all A metric evaluations (as one CPU thread does).
 */
enum { LOSS_R = DFL_BINS, LOSS_TOPK = 10, LOSS_BLOCK = 256 };

// LossGeo: the batch geometry, by value to every loss kernel. Level l: H[l] x W[l] anchors from global
// anchor off[l], stride 8<<l. head[l], dhead[l]: (B, 64+NC, H[l], W[l]); dhead all NULL: no gradient.
struct LossGeo {
    int B, NC, A, M;
    int H[3], W[3], off[3];
    const float *head[3];
    float *dhead[3];
};

// LossAt: anchor a of image b: its level l, index r in the level (row-major), level width W, plane size HW,
// stride s, and its head (z) and gradient (dz, NULL without gradient) values, channel c at [c * HW].
// Built with constant indices only: a dynamic index would copy the parameter struct to the stack.
struct LossAt { int l, r, W; long HW; float s; const float *z; float *dz; };
__device__ __forceinline__ LossAt loss_at(const LossGeo &g, int b, int a) {
    LossAt t;
    t.l = a >= g.off[2] ? 2 : a >= g.off[1] ? 1 : 0;
    int H = t.l == 0 ? g.H[0] : t.l == 1 ? g.H[1] : g.H[2];
    t.W = t.l == 0 ? g.W[0] : t.l == 1 ? g.W[1] : g.W[2];
    t.r = a - (t.l == 0 ? g.off[0] : t.l == 1 ? g.off[1] : g.off[2]);
    t.HW = (long)H * t.W;
    t.s = (float)(8 << t.l);
    long o = (long)b * (64 + g.NC) * t.HW + t.r;
    t.z = (t.l == 0 ? g.head[0] : t.l == 1 ? g.head[1] : g.head[2]) + o;
    float *dh = t.l == 0 ? g.dhead[0] : t.l == 1 ? g.dhead[1] : g.dhead[2];
    t.dz = dh ? dh + o : nullptr;
    return t;
}

// CIoU (bbox_ciou, bbox_ciou_backward) and the DFL softmax (dfl_side_decode) are yolo.h's, the CPU loss's own text.

// loss_decode_box: dfl_side_decode + loss_decode_box of yolo.c: box (4) xyxy in grid units of anchor t,
// lse (4) each side's log-sum-exp. The probabilities are not kept (one side's 16 at a time): loss_fg_term
// recomputes a side's by the same operations where its gradient needs them.
__device__ void loss_decode_box(const LossAt &t, float *box, float *lse) {
    float d[4], p[LOSS_R];
#pragma unroll
    for (int s = 0; s < 4; s++) d[s] = dfl_side_decode(t.z + (long)s * LOSS_R * t.HW, t.HW, p, lse + s);
    float ax = (float)(t.r % t.W) + 0.5f, ay = (float)(t.r / t.W) + 0.5f;
    box[0] = ax - d[0]; box[1] = ay - d[1]; box[2] = ax + d[2]; box[3] = ay + d[3];
}

// loss_metric: tal_metric of yolo.c: 1 with o = max(CIoU(gt, pb), 0) and align = sigmoid(logit)^0.5 * o^6
// when the anchor centre (ax, ay) (pixels) is strictly inside the valid gt, else 0 (o = align = 0).
__device__ int loss_metric(const LossGtD &gt, float ax, float ay, const float *pb, float logit, float *o,
                           float *align) {
    float dmin = fminf(fminf(ax - gt.x1, ay - gt.y1), fminf(gt.x2 - ax, gt.y2 - ay));
    *o = 0.0f;
    *align = 0.0f;
    if (!gt.valid || !(dmin > 1e-9f)) return 0;
    float gb[4] = {gt.x1, gt.y1, gt.x2, gt.y2};
    float ov = fmaxf(bbox_ciou(gb, pb), 0.0f);
    float s = 1.0f / (1.0f + expf(-logit));
    *o = ov;
    *align = sqrtf(s) * powf(ov, 6.0f);
    return 1;
}

// loss_decode: pbox (B, A, 4) = predicted box of every anchor in pixels, for images with boxes (m > 0).
__global__ void loss_decode_kernel(LossGeo g, const int *m, float *pbox) {
    int i = blockIdx.x * blockDim.x + threadIdx.x, b = i / g.A;
    if (i >= g.B * g.A || m[b] == 0) return;
    LossAt t = loss_at(g, b, i % g.A);
    float lse[4], box[4];
    loss_decode_box(t, box, lse);
    for (int k = 0; k < 4; k++) pbox[(long)i * 4 + k] = box[k] * t.s;
}

// loss_topk: one block of LOSS_TOPK_THREADS per gt j < m[b] of image b: tal_topk_gt of yolo.c (top-10 align
// over the anchor rectangle of each level, ties to the lower anchor, the zero-align fill of CUDA torch.topk), then
// claims the candidates: cnt[b, a] += 1 and owner, align, iou of (b, a) = this gt's (kept only when cnt ends at 1).
// Each thread scores every LOSS_TOPK_THREADS-th anchor of the rectangles (in increasing anchor order) and keeps
// its own top 10 positives and first 10 zero-align anchors; the threads' lists are merged pairwise in shared
// memory. The order (align descending, then the lower anchor) is strict, so the merged lists are what one
// thread scanning every anchor in order keeps, whatever the split. (A large box spans ~2000 anchors, each
// a CIoU: one thread per gt took 1.4 ms of a yolov8n 640 batch-16 step on an H200.)
// gts (B, M); pbox (B, A, 4); cnt, owner, align, iou (B, A).
enum { LOSS_TOPK_THREADS = 64 };
struct LossCand { int a; float align, o; };
__device__ __forceinline__ bool loss_cand_before(const LossCand &x, const LossCand &y) {
    return x.align > y.align || (x.align == y.align && x.a < y.a);
}
__global__ void loss_topk_kernel(LossGeo g, const LossGtD *gts, const int *m, const float *pbox, int *cnt, int *owner,
                                 float *align, float *iou) {
    int i = blockIdx.x, b = i / g.M, j = i % g.M, t = threadIdx.x;
    if (i >= g.B * g.M || j >= m[b] || !gts[i].valid) return;   // the same for the whole block
    LossGtD gt = gts[i];
    const float *pb = pbox + (long)b * g.A * 4;
    typedef LossCand Cand;
    Cand pos[LOSS_TOPK], zero[LOSS_TOPK];
    int npos = 0, nzero = 0, npos_total = 0;
    // the three levels' rectangles, clipped to the maps
    int rx0[3], rx1[3], ry0[3], rn[3];
#pragma unroll
    for (int l = 0; l < 3; l++) {
        LossAt at = loss_at(g, b, l == 0 ? g.off[0] : l == 1 ? g.off[1] : g.off[2]);
        int H = (int)(at.HW / at.W);
        float s = at.s;
        int x0 = (int)floorf(gt.x1 / s - 0.5f) - 1, x1 = (int)ceilf(gt.x2 / s - 0.5f) + 1;
        int y0 = (int)floorf(gt.y1 / s - 0.5f) - 1, y1 = (int)ceilf(gt.y2 / s - 0.5f) + 1;
        if (x0 < 0) x0 = 0;
        if (y0 < 0) y0 = 0;
        if (x1 > at.W - 1) x1 = at.W - 1;
        if (y1 > H - 1) y1 = H - 1;
        rx0[l] = x0, rx1[l] = x1, ry0[l] = y0;
        rn[l] = x1 >= x0 && y1 >= y0 ? (x1 - x0 + 1) * (y1 - y0 + 1) : 0;
    }
    // (the per-level values picked by constant indices: the arrays stay in registers)
#define LOSS_LEVEL(v) (l == 0 ? (v)[0] : l == 1 ? (v)[1] : (v)[2])
    for (int k = t; k < rn[0] + rn[1] + rn[2]; k += LOSS_TOPK_THREADS) {
        int l = k < rn[0] ? 0 : k < rn[0] + rn[1] ? 1 : 2, kk = k - (l > 0 ? rn[0] : 0) - (l > 1 ? rn[1] : 0);
        int off = LOSS_LEVEL(g.off), x0 = LOSS_LEVEL(rx0);
        LossAt at = loss_at(g, b, off);   // r = 0 of level l
        int w = LOSS_LEVEL(rx1) - x0 + 1, y = LOSS_LEVEL(ry0) + kk / w, x = x0 + kk % w;
        float s = at.s;
        int r = y * at.W + x, a = off + r;
        float o, al;
        if (!loss_metric(gt, ((float)x + 0.5f) * s, ((float)y + 0.5f) * s, pb + (long)a * 4,
                         at.z[(long)(64 + gt.cls) * at.HW + r], &o, &al))
            continue;
        Cand c = {a, al, o};
        // (every index into pos and zero below is a compile-time constant after unrolling, so the
        // two lists live in registers, not in local memory)
        if (al > 0.0f) {
            npos_total++;
            // sorted by align descending; equal align keeps the lower (earlier) anchor first
            if (npos == LOSS_TOPK && !(al > pos[LOSS_TOPK - 1].align)) continue;
            int slot = npos < LOSS_TOPK ? npos++ : LOSS_TOPK - 1, ins = 0;
#pragma unroll
            for (int q = 0; q < LOSS_TOPK - 1; q++) ins += q < slot && !(al > pos[q].align);
#pragma unroll
            for (int q = LOSS_TOPK - 1; q >= 0; q--) {   // pos[ins..slot] = c, pos[ins..slot-1]
                if (q > ins && q <= slot) pos[q] = pos[q - 1 < 0 ? 0 : q - 1];
                else if (q == ins) pos[q] = c;
            }
        } else if (nzero < LOSS_TOPK) {
            // this thread's anchors come in increasing index: its first zeros are its lowest
#pragma unroll
            for (int q = 0; q < LOSS_TOPK; q++)
                if (q == nzero) zero[q] = c;
            nzero++;
        }
    }
#undef LOSS_LEVEL
    // the threads' lists merged pairwise: list t takes list t + h, for h = 32, 16, ..., 1
    __shared__ Cand sp[LOSS_TOPK_THREADS][LOSS_TOPK], sz[LOSS_TOPK_THREADS][LOSS_TOPK];
    __shared__ int snp[LOSS_TOPK_THREADS], snz[LOSS_TOPK_THREADS], stot[LOSS_TOPK_THREADS];
#pragma unroll
    for (int q = 0; q < LOSS_TOPK; q++) {
        if (q < npos) sp[t][q] = pos[q];
        if (q < nzero) sz[t][q] = zero[q];
    }
    snp[t] = npos, snz[t] = nzero, stot[t] = npos_total;
    for (int h = LOSS_TOPK_THREADS / 2; h > 0; h >>= 1) {
        __syncthreads();
        if (t < h) {
            int na = snp[t], nb = snp[t + h], ia = 0, ib = 0, n = 0;
#pragma unroll
            for (int q = 0; q < LOSS_TOPK; q++) {   // the first 10 of the two sorted lists
                bool fa = ia < na && (ib >= nb || loss_cand_before(sp[t][ia], sp[t + h][ib]));
                bool fb = !fa && ib < nb;
                if (fa) pos[q] = sp[t][ia++];
                else if (fb) pos[q] = sp[t + h][ib++];
                n += fa || fb;
            }
            na = snz[t], nb = snz[t + h], ia = 0, ib = 0;
            int nz = 0;
#pragma unroll
            for (int q = 0; q < LOSS_TOPK; q++) {   // the 10 lowest anchors of the two
                bool fa = ia < na && (ib >= nb || sz[t][ia].a < sz[t + h][ib].a);
                bool fb = !fa && ib < nb;
                if (fa) zero[q] = sz[t][ia++];
                else if (fb) zero[q] = sz[t + h][ib++];
                nz += fa || fb;
            }
            stot[t] += stot[t + h];
            snp[t] = n, snz[t] = nz;
        }
        __syncthreads();
        if (t < h) {
#pragma unroll
            for (int q = 0; q < LOSS_TOPK; q++) {
                if (q < snp[t]) sp[t][q] = pos[q];
                if (q < snz[t]) sz[t][q] = zero[q];
            }
        }
    }
    if (t) return;
    npos = snp[0], nzero = snz[0], npos_total = stot[0];
#pragma unroll
    for (int q = 0; q < LOSS_TOPK; q++) {
        if (q < npos) pos[q] = sp[0][q];
        if (q < nzero) zero[q] = sz[0][q];
    }
    // topk fills the slots left by fewer than 10 positives with the lowest-index align-0 anchors over all A;
    // an inside zero at index a is preceded by a - (positives before a) of them
    int need = npos_total < LOSS_TOPK ? LOSS_TOPK - (int)npos_total : 0, nfill = 0;
    bool stop = need <= 0;
#pragma unroll
    for (int k = 0; k < LOSS_TOPK; k++) {
        if (stop || k >= nzero) break;
        int before = 0;
#pragma unroll
        for (int q = 0; q < LOSS_TOPK; q++) before += q < npos && pos[q].a < zero[k].a;
        if (zero[k].a - before >= need) break;
        nfill++;
    }
#pragma unroll
    for (int k = 0; k < 2 * LOSS_TOPK; k++) {
        bool isp = k < LOSS_TOPK;
        int q = isp ? k : k - LOSS_TOPK;
        if (isp ? q >= npos : q >= nfill) continue;
        const Cand &c = isp ? pos[q] : zero[q];
        long at = (long)b * g.A + c.a;
        atomicAdd(&cnt[at], 1);
        owner[at] = j;
        align[at] = c.align;
        iou[at] = c.o;
    }
}

// loss_resolve: one thread per anchor of every image (tal_resolve_image of yolo.c). Unclaimed: owner -1.
// Claimed more than once: the gt of largest overlap over all m gts of the image (first max on ties) and its
// metrics. Then max_align and max_iou (B, M) of the owner (float bits of non-negative values, zeroed
// before, so int atomicMax orders them; NaN and -0 count as 0 like the CPU's "> max" from 0).
__global__ void loss_resolve_kernel(LossGeo g, const LossGtD *gts, const int *m, const float *pbox, const int *cnt,
                                    int *owner, float *align, float *iou, int *max_align, int *max_iou) {
    int i = blockIdx.x * blockDim.x + threadIdx.x, b = i / g.A, a = i % g.A;
    if (i >= g.B * g.A) return;
    if (cnt[i] == 0) { owner[i] = -1; return; }
    if (cnt[i] > 1) {
        LossAt t = loss_at(g, b, a);
        float ax = ((float)(t.r % t.W) + 0.5f) * t.s, ay = ((float)(t.r / t.W) + 0.5f) * t.s;
        const LossGtD *gi = gts + (long)b * g.M;
        int best = 0;
        float best_o = -1.0f, best_al = 0.0f;
        for (int j = 0; j < m[b]; j++) {
            float o, al;
            loss_metric(gi[j], ax, ay, pbox + (long)i * 4, t.z[(long)(64 + gi[j].cls) * t.HW], &o, &al);
            if (o > best_o) { best_o = o; best = j; best_al = al; }
        }
        owner[i] = best;
        align[i] = best_al;
        iou[i] = best_o;
    }
    long bj = (long)b * g.M + owner[i];
    float al = align[i], o = iou[i];
    atomicMax(&max_align[bj], __float_as_int(al > 0.0f ? al : 0.0f));
    atomicMax(&max_iou[bj], __float_as_int(o > 0.0f ? o : 0.0f));
}

// loss_score: score (B, A) = align * max_iou / (max_align + 1e-9) of every foreground anchor (the CPU's
// LossFg.score); part (blocks, 2) = the block's sum of scores and its foreground count.
__global__ void loss_score_kernel(LossGeo g, const int *owner, const float *align, const int *max_align,
                                  const int *max_iou, float *score, double *part) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    double s = 0.0, n = 0.0;
    if (i < g.B * g.A && owner[i] >= 0) {
        long bj = (long)(i / g.A) * g.M + owner[i];
        float sc = align[i] * __int_as_float(max_iou[bj]) / (__int_as_float(max_align[bj]) + 1e-9f);
        score[i] = sc;
        s = sc;
        n = 1.0;
    }
    s = block_sum(s);
    n = block_sum(n);
    if (threadIdx.x == 0) { part[2 * blockIdx.x] = s; part[2 * blockIdx.x + 1] = n; }
}

// LossNorm: what the terms kernel needs from the whole assignment (written by loss_norm_kernel)
struct LossNorm {
    double tss;      // target_scores_sum = max(sum of scores, 1)
    double n_fg;     // foreground anchors
    double g_cls;    // B * cls_gain * grad_scale / tss: gradient of a class logit per unit of BCE'
    double kb, kd;   // the same with box_gain and dfl_gain (times the score of each anchor)
};

// loss_norm: one block; the score partials of nblk blocks summed in a fixed order -> LossNorm.
__global__ void loss_norm_kernel(const double *part, int nblk, int B, float box_gain, float cls_gain, float dfl_gain,
                                 float grad_scale, LossNorm *nrm) {
    double s = 0.0, n = 0.0;
    for (int k = threadIdx.x; k < nblk; k += blockDim.x) { s += part[2 * k]; n += part[2 * k + 1]; }
    s = block_sum(s);
    n = block_sum(n);
    if (threadIdx.x == 0) {
        double tss = s > 1.0 ? s : 1.0;
        nrm->tss = tss;
        nrm->n_fg = n;
        nrm->g_cls = (double)B * cls_gain * grad_scale / tss;
        nrm->kb = (double)B * box_gain * grad_scale / tss;
        nrm->kd = (double)B * dfl_gain * grad_scale / tss;
    }
}

// loss_fg_term: loss_fg_term of yolo.c for foreground anchor t with target box gt (pixels): box (1 - CIoU)
// and DFL terms, unweighted; when t.dz is set also the gradient gb * d(1-CIoU) + gd * d(DFL) of the
// anchor's 64 box logits, written to t.dz.
__device__ void loss_fg_term(const LossAt &t, const LossGtD &gt, double gb, double gd, double *box_term,
                             double *dfl_term) {
    float p[LOSS_R], lse[4], pb[4];
    loss_decode_box(t, pb, lse);
    float s = t.s, tb[4] = {gt.x1 / s, gt.y1 / s, gt.x2 / s, gt.y2 / s};   // target_bboxes /= stride_tensor
    *box_term = 1.0 - (double)bbox_ciou(pb, tb);
    // DFL: bbox2dist then DFLoss, targets clamped to [0, 14.99]
    float ax = (float)(t.r % t.W) + 0.5f, ay = (float)(t.r / t.W) + 0.5f;
    float d[4] = {ax - tb[0], ay - tb[1], tb[2] - ax, tb[3] - ay};
    double dfl = 0.0;
    int tl[4];
    float wl[4], wr[4];
#pragma unroll
    for (int k = 0; k < 4; k++) {
        float tk = fminf(fmaxf(d[k], 0.0f), (float)(LOSS_R - 1 - 0.01));
        tl[k] = (int)tk;
        wl[k] = (float)(tl[k] + 1) - tk;
        wr[k] = 1.0f - wl[k];
        const float *zk = t.z + (long)k * LOSS_R * t.HW;
        float ce_l = lse[k] - zk[tl[k] * t.HW], ce_r = lse[k] - zk[(tl[k] + 1) * t.HW];
        dfl += (double)(ce_l * wl[k] + ce_r * wr[k]);
    }
    *dfl_term = dfl / 4.0;
    if (!t.dz) return;
    double db[4], dd[4];
    bbox_ciou_backward(pb, tb, -gb, 0, db);
    dd[0] = -db[0]; dd[1] = -db[1]; dd[2] = db[2]; dd[3] = db[3];   // x1 = ax - l, x2 = ax + r
#pragma unroll 1
    for (int k = 0; k < 4; k++) {   // one side at a time (not unrolled: its 16 probabilities, not 64, live)
        float lk;
        dfl_side_decode(t.z + (long)k * LOSS_R * t.HW, t.HW, p, &lk);
        // side k's figures by selection, not indexing, so that the small arrays stay in registers
        double ddk = k == 0 ? dd[0] : k == 1 ? dd[1] : k == 2 ? dd[2] : dd[3];
        int tlk = k == 0 ? tl[0] : k == 1 ? tl[1] : k == 2 ? tl[2] : tl[3];
        float wlk = k == 0 ? wl[0] : k == 1 ? wl[1] : k == 2 ? wl[2] : wl[3];
        float wrk = k == 0 ? wr[0] : k == 1 ? wr[1] : k == 2 ? wr[2] : wr[3];
        double dist = 0.0;
#pragma unroll
        for (int i = 0; i < LOSS_R; i++) dist += (double)i * p[i];
#pragma unroll
        for (int i = 0; i < LOSS_R; i++) {
            double gz = ddk * p[i] * (i - dist);                    // through the expectation
            double tgt = (i == tlk ? wlk : 0.0) + (i == tlk + 1 ? wrk : 0.0);
            gz += gd / 4.0 * ((double)p[i] * ((double)wlk + wrk) - tgt);   // through the CE
            t.dz[(k * LOSS_R + i) * t.HW] = (float)gz;
        }
    }
}

// loss_terms: one thread per anchor of every image: BCE(x, 0) of its NC class logits (and gradient
// g_cls*sigmoid(x)); the 64 box-logit gradients of a background anchor are 0. part (blocks, 2): the
// block's BCE sum in part[2*block] (the score partials are spent by then). The foreground anchors'
// terms are loss_fg_kernel's, so that this pass over every anchor stays light (registers, occupancy).
__global__ void loss_terms_kernel(LossGeo g, const int *owner, const LossNorm *nrm, double *part) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    double bce = 0.0;
    if (i < g.B * g.A) {
        LossAt t = loss_at(g, i / g.A, i % g.A);
        float g_clsf = (float)nrm->g_cls;
        for (int c = 0; c < g.NC; c++) {
            float x = t.z[(long)(64 + c) * t.HW], e = expf(-fabsf(x));
            bce += (double)(fmaxf(x, 0.0f) + log1pf(e));
            if (t.dz) t.dz[(long)(64 + c) * t.HW] = g_clsf * ((x >= 0.0f ? 1.0f : e) / (1.0f + e));   // sigmoid(x)
        }
        if (t.dz && owner[i] < 0)
            for (int c = 0; c < 64; c++) t.dz[(long)c * t.HW] = 0.0f;
    }
    bce = block_sum(bce);
    if (threadIdx.x == 0) part[2 * blockIdx.x] = bce;
}
// loss_fg: after loss_terms, one thread per anchor, working at the foreground ones: the correction
// -x*score of its class logit (gradient g_cls*(sigmoid(x) - score), in double as the CPU, over
// loss_terms' value) and loss_fg_term with the score as weight. part (blocks, 3): the block's BCE
// correction, box and DFL sums.
__global__ void loss_fg_kernel(LossGeo g, const LossGtD *gts, const int *owner, const float *score,
                               const LossNorm *nrm, double *part) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    double bce = 0.0, box = 0.0, dfl = 0.0;
    int j = i < g.B * g.A ? owner[i] : -1;
    if (j >= 0) {
        int b = i / g.A;
        LossAt t = loss_at(g, b, i % g.A);
        const LossGtD gt = gts[(long)b * g.M + j];
        float sc = score[i];
        long at = (long)(64 + gt.cls) * t.HW;
        float x = t.z[at];
        bce = -(double)x * sc;
        if (t.dz) t.dz[at] = (float)(nrm->g_cls * (1.0 / (1.0 + exp(-(double)x)) - sc));
        double bt, dt, wa = sc;
        loss_fg_term(t, gt, nrm->kb * wa, nrm->kd * wa, &bt, &dt);
        box = bt * wa;
        dfl = dt * wa;
    }
    bce = block_sum(bce);
    box = block_sum(box);
    dfl = block_sum(dfl);
    if (threadIdx.x == 0) {
        part[3 * blockIdx.x] = bce;
        part[3 * blockIdx.x + 1] = box;
        part[3 * blockIdx.x + 2] = dfl;
    }
}

// loss_out: one block; the partials of nblk blocks in a fixed order (loss_terms' BCE in bg, loss_fg's
// BCE correction, box and DFL in part) -> out (see yolo.h).
__global__ void loss_out_kernel(const double *bg, const double *part, int nblk, const LossNorm *nrm, float box_gain,
                                float cls_gain, float dfl_gain, double *out) {
    double bce = 0.0, box = 0.0, dfl = 0.0;
    for (int k = threadIdx.x; k < nblk; k += blockDim.x) {
        bce += bg[2 * k] + part[3 * k];
        box += part[3 * k + 1];
        dfl += part[3 * k + 2];
    }
    bce = block_sum(bce);
    box = block_sum(box);
    dfl = block_sum(dfl);
    if (threadIdx.x == 0) {
        double tss = nrm->tss;
        out[0] = box_gain * box / tss;
        out[1] = cls_gain * bce / tss;
        out[2] = dfl_gain * dfl / tss;
        out[3] = tss;
        out[4] = nrm->n_fg;
    }
}

// LossScratch: loss_cuda's working memory, carved from the caller's scratch (each part 256-byte aligned).
struct LossScratch {
    float *pbox;                     // (B, A, 4) predicted boxes, pixels xyxy
    int *owner;                      // (B, A) the anchor's gt, -1 background
    float *align, *iou, *score;      // (B, A) metrics of the owner; target score (foreground only)
    int *cnt;                        // (B, A) claims            } zeroed together
    int *max_align, *max_iou;        // (B, M) float bits        }  at the start of each call
    size_t zero_bytes;               // bytes from cnt to the end of max_iou
    double *part_score, *part_terms; // (nblk, 2): score's block sums, then terms' BCE; (nblk, 3): fg's;
                                     // nblk = ceil(B*A / 256)
    LossNorm *nrm;
};
// loss_scratch_carve: the parts at the first 256-byte boundary of scratch; returns the bytes needed
// (with the alignment slack). Integer arithmetic only, so that a sizing call may pass scratch = 0.
static size_t loss_scratch_carve(uintptr_t scratch, int B, int A, int M, LossScratch *w) {
    size_t BA = (size_t)B * A, BM = (size_t)B * M, nblk = cdiv((long)BA, LOSS_BLOCK);
    uintptr_t p0 = (scratch + 255) & ~(uintptr_t)255, p = p0;
    auto take = [&p](size_t bytes) { uintptr_t r = p; p += (bytes + 255) & ~(size_t)255; return r; };
    w->pbox = (float *)take(BA * 4 * sizeof(float));
    w->owner = (int *)take(BA * sizeof(int));
    w->align = (float *)take(BA * sizeof(float));
    w->iou = (float *)take(BA * sizeof(float));
    w->score = (float *)take(BA * sizeof(float));
    w->cnt = (int *)take(BA * sizeof(int));
    w->max_align = (int *)take(BM * sizeof(int));
    w->max_iou = (int *)take(BM * sizeof(int));
    w->zero_bytes = p - (uintptr_t)w->cnt;
    w->part_score = (double *)take(nblk * 2 * sizeof(double));
    w->part_terms = (double *)take(nblk * 3 * sizeof(double));
    w->nrm = (LossNorm *)take(sizeof(LossNorm));
    return 255 + (p - p0);
}
static_assert(sizeof(LossNorm) <= 256, "loss_cuda_scratch_bytes (yolo.h) keeps 256 bytes for LossNorm");

extern "C" void loss_cuda(int B, int NC, int imgH, int imgW, const float *const head[3], float *const dhead[3],
                          const LossGtD *gts, const int *m, int M, float box_gain, float cls_gain, float dfl_gain,
                          float grad_scale, void *scratch, double *out, void *stream) {
    if (B <= 0 || M <= 0 || imgH <= 0 || imgW <= 0 || imgH % 32 || imgW % 32) {
        fprintf(stderr, "loss_cuda: B=%d, M=%d, image %dx%d: need B, M > 0 and sizes positive multiples of 32\n", B, M,
                imgW, imgH);
        exit(1);
    }
    LossGeo g;
    g.B = B; g.NC = NC; g.M = M; g.A = 0;
    int grad = dhead && dhead[0] && dhead[1] && dhead[2];
    for (int l = 0; l < 3; l++) {
        g.H[l] = imgH / (8 << l);
        g.W[l] = imgW / (8 << l);
        g.off[l] = g.A;
        g.A += g.H[l] * g.W[l];
        g.head[l] = head[l];
        g.dhead[l] = grad ? dhead[l] : nullptr;
    }
    LossScratch w;
    if (loss_scratch_carve((uintptr_t)scratch, B, g.A, M, &w) != loss_cuda_scratch_bytes(B, g.A, M)) {
        fprintf(stderr,
                "loss_cuda: internal error: the scratch layout and loss_cuda_scratch_bytes (yolo.h) disagree\n");
        exit(1);
    }
    cudaStream_t s = (cudaStream_t)stream;
    unsigned nba = cdiv((long)B * g.A, LOSS_BLOCK);
    CUDA_CHECK(cudaMemsetAsync(w.cnt, 0, w.zero_bytes, s));
    loss_decode_kernel<<<nba, LOSS_BLOCK, 0, s>>>(g, m, w.pbox);
    CUDA_CHECK(cudaGetLastError());
    loss_topk_kernel<<<(unsigned)(B * M), LOSS_TOPK_THREADS, 0, s>>>(g, gts, m, w.pbox, w.cnt, w.owner, w.align, w.iou);
    CUDA_CHECK(cudaGetLastError());
    loss_resolve_kernel<<<nba, LOSS_BLOCK, 0, s>>>(g, gts, m, w.pbox, w.cnt, w.owner, w.align, w.iou, w.max_align,
                                                   w.max_iou);
    CUDA_CHECK(cudaGetLastError());
    loss_score_kernel<<<nba, LOSS_BLOCK, 0, s>>>(g, w.owner, w.align, w.max_align, w.max_iou, w.score, w.part_score);
    CUDA_CHECK(cudaGetLastError());
    loss_norm_kernel<<<1, LOSS_BLOCK, 0, s>>>(w.part_score, (int)nba, B, box_gain, cls_gain, dfl_gain, grad_scale,
                                              w.nrm);
    CUDA_CHECK(cudaGetLastError());
    loss_terms_kernel<<<nba, LOSS_BLOCK, 0, s>>>(g, w.owner, w.nrm, w.part_score);
    CUDA_CHECK(cudaGetLastError());
    loss_fg_kernel<<<nba, LOSS_BLOCK, 0, s>>>(g, gts, w.owner, w.score, w.nrm, w.part_terms);
    CUDA_CHECK(cudaGetLastError());
    loss_out_kernel<<<1, LOSS_BLOCK, 0, s>>>(w.part_score, w.part_terms, (int)nba, w.nrm, box_gain, cls_gain, dfl_gain,
                                             out);
    CUDA_CHECK(cudaGetLastError());
}

// ------------------------------------------------------------------------------------------
// optimizer, gradient clipping, EMA
// ------------------------------------------------------------------------------------------

// ema_mix: an EMA value moved towards p by decay d (ModelEMA: d*ema + (1-d)*p), ema_update_kernel's and
// optim_step_kernel's
__device__ __forceinline__ float ema_mix(float e, float p, float d) { return d * e + (1 - d) * p; }
__global__ void ema_update_kernel(float *ema, const float *p, long n, float d) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) ema[i] = ema_mix(ema[i], p[i], d);
}
extern "C" void ema_update_cuda(float *ema, const float *p, long n, float d, void *stream) {
    if (n == 0) return;
    ema_update_kernel<<<cdiv(n, 256), 256, 0, (cudaStream_t)stream>>>(ema, p, n, d);
    CUDA_CHECK(cudaGetLastError());
}

// optim_norm: OPT_NORM_BLOCKS blocks of 256 threads stride over the gradients; block b writes
// partials[2b] = sum of (g*inv_scale)^2 over its finite values and partials[2b+1] = how many are not finite.
__global__ void optim_norm_kernel(const float *g, const uint8_t *group, long n, float inv_scale, float *partials) {
    float ss = 0.0f, bad = 0.0f;
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
        if (group[i] == OPT_NO_GROUP) continue;
        float v = g[i] * inv_scale;
        if (isfinite(v)) ss += v * v;
        else bad += 1.0f;
    }
    ss = block_sum(ss);
    bad = block_sum(bad);
    if (threadIdx.x == 0) { partials[2 * blockIdx.x] = ss; partials[2 * blockIdx.x + 1] = bad; }
}
extern "C" void optim_norm_cuda(const float *g, const uint8_t *group, long n, float inv_scale, float *partials,
                                void *stream) {
    optim_norm_kernel<<<OPT_NORM_BLOCKS, 256, 0, (cudaStream_t)stream>>>(g, group, n, inv_scale, partials);
    CUDA_CHECK(cudaGetLastError());
}

// optim_step: block size OPT_NORM_BLOCKS; every block reduces the partials the same way (so all
// agree on the norm bit for bit), then strides over the parameters. No update at all when a
// gradient or the norm is not finite. In the same pass, each value as it leaves the step (updated or
// not) goes into w16 (its FP16 copy: f32_to_f16's rounding) and into the EMA (ema = d*ema + (1-d)*p:
// ema_update's expression), so that neither reads the parameters again; with the update skipped, w16 is
// left as it is and the EMA follows the unchanged parameters only where ema_skipped says so.
__global__ void optim_step_kernel(float *p, const float *g, float *m, float *v, const uint8_t *group, long n,
                                  const float *partials, OptimHyper h, float *norm_out, __half *w16, float *ema,
                                  float ema_d, int ema_skipped) {
    float ss = block_sum(partials[2 * threadIdx.x]), bad = block_sum(partials[2 * threadIdx.x + 1]);
    float norm = bad > 0 ? INFINITY : sqrtf(ss);   // finite gradients whose squares overflow FP32: inf too
    if (blockIdx.x == 0 && threadIdx.x == 0) norm_out[0] = norm;
    const long i0 = (long)blockIdx.x * blockDim.x + threadIdx.x, di = (long)gridDim.x * blockDim.x;
    if (!isfinite(norm)) {   // the host sees the same inf and counts the step as skipped
        if (ema && ema_skipped)
            for (long i = i0; i < n; i += di) ema[i] = ema_mix(ema[i], p[i], ema_d);
        return;
    }
    float coef = h.max_norm / (norm + 1e-6f);
    bool clip = h.max_norm > 0 && coef < 1.0f;   // grad_clip_norm: g *= coef after unscaling
    for (long i = i0; i < n; i += di) {
        int gr = group[i];
        float pv = p[i];
        if (gr != OPT_NO_GROUP) {
            float gv = g[i] * h.inv_scale;
            if (clip) gv *= coef;
            // constant indices only: a dynamic index would put the parameter struct on the stack
            float lr = gr == 0 ? h.lr[0]
                    : gr == 1  ? h.lr[1]
                               : h.lr[2],
                  wd = gr == 0 ? h.wd[0]
                    : gr == 1  ? h.wd[1]
                               : h.wd[2];
            float astep = gr == 0 ? h.adam_step[0] : gr == 1 ? h.adam_step[1] : h.adam_step[2], mom = h.momentum;
            if (!h.adamw) {
                float gi = gv + wd * pv;
                float mb = h.first ? gi : mom * m[i] + gi;
                m[i] = mb;
                pv -= lr * (gi + mom * mb);
            } else {
                float pi = pv * (1 - lr * wd);
                float mb = mom * m[i] + (1 - mom) * gv, vb = h.beta2 * v[i] + (1 - h.beta2) * gv * gv;
                m[i] = mb; v[i] = vb;
                pv = pi - astep * mb / (sqrtf(vb) / h.bc2_sqrt + h.eps);
            }
            p[i] = pv;
        }
        if (w16) w16[i] = __float2half(pv);
        if (ema) ema[i] = ema_mix(ema[i], pv, ema_d);
    }
}
extern "C" void optim_step_cuda(float *p, const float *g, float *m, float *v, const uint8_t *group, long n,
                                const float *partials, OptimHyper h, float *norm_out, uint16_t *w16, float *ema,
                                float ema_d, int ema_skipped, void *stream) {
    unsigned blocks = n ? cdiv(n, OPT_NORM_BLOCKS) : 1;
    if (blocks > 4096) blocks = 4096;
    optim_step_kernel<<<blocks, OPT_NORM_BLOCKS, 0, (cudaStream_t)stream>>>(p, g, m, v, group, n, partials, h,
                                                                            norm_out, (__half *)w16, ema, ema_d,
                                                                            ema_skipped);
    CUDA_CHECK(cudaGetLastError());
}
