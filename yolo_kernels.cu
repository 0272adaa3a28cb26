// yolo_kernels.cu: all device code of yolo.c, in the same section order, with extern "C"
// launchers declared in yolo.h. Each kernel has a CPU twin in yolo.c (same name, _cpu) that the
// tests compare against, on a GPU and in the CPU emulation (test/cuda_emu.h, `make test-emu`).
// Kernel-writing rules that keep the emulation faithful: ../shared/spec/cuda-on-cpu.md.
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <mma.h>
#include <stdio.h>
#include <stdlib.h>
#include "yolo.h"

// CUDA_CHECK: a failed runtime call or launch names the file:line, the error and a hint, then exits.
#define CUDA_CHECK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    fprintf(stderr, "CUDA error (%s:%d): %s: %s (hint: run the emulated tests, make test-emu)\n", \
            __FILE__, __LINE__, #x, cudaGetErrorString(e_)); exit(1); } } while (0)

static inline unsigned cdiv(long a, long b) { return (unsigned)((a + b - 1) / b); }

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
 * igemm_block computes one 64x64 tile of such a product: 4 warps, each a 32x32 quarter as 2x2 WMMA
 * 16x16x16 FP16 fragments with FP32 accumulators; the operands are gathered by the caller's
 * functors into shared memory 32 deep along Kd, zero-filled past every edge, so the fragments
 * never read outside the tensors. The epilogue stages each fragment through shared memory and
 * hands element (m, n) to the caller's store functor (edge-checked there).
 */
#define IG_BM 64
#define IG_BN 64
#define IG_BK 32
struct ConvGeo { int B, Cin, H, W, Cout, K, S, Ho, Wo, KK, pad; long xs, zs; };
static ConvGeo conv_geo(const ConvDims &d) {
    ConvGeo g;
    g.B = d.B; g.Cin = d.Cin; g.H = d.H; g.W = d.W; g.Cout = d.Cout; g.K = d.K; g.S = d.S; g.pad = d.K / 2;
    g.Ho = (d.H + 2 * g.pad - d.K) / d.S + 1; g.Wo = (d.W + 2 * g.pad - d.K) / d.S + 1; g.KK = d.K * d.K;
    g.xs = d.xs ? d.xs : (long)d.Cin * d.H * d.W;
    g.zs = d.zs ? d.zs : (long)d.Cout * g.Ho * g.Wo;
    return g;
}

// im2col element: col[k = (ci, ky, kx)][n = (b, oy, ox)] of x (0 in the padding)
__device__ __forceinline__ __half conv_col(const ConvGeo &g, const __half *x, int k, int n) {
    int ci = k / g.KK, kk = k % g.KK, HWo = g.Ho * g.Wo;
    int b = n / HWo, p = n % HWo;
    int iy = (p / g.Wo) * g.S - g.pad + kk / g.K, ix = (p % g.Wo) * g.S - g.pad + kk % g.K;
    if (iy < 0 || iy >= g.H || ix < 0 || ix >= g.W) return __float2half(0.0f);
    return x[b * g.xs + ((long)ci * g.H + iy) * g.W + ix];
}

template <bool B_KFAST, class LA, class LB, class ST>
__device__ void igemm_block(int M, int N, int kbeg, int Kd, LA la, LB lb, ST st) {
    using namespace nvcuda;
    __shared__ __align__(32) __half As[IG_BM][IG_BK + 8];
    __shared__ __align__(32) __half Bs[IG_BK][IG_BN + 8];
    __shared__ __align__(32) float Cs[4][16][16];
    int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, wy = warp / 2, wx = warp % 2;
    int row0 = blockIdx.y * IG_BM;
    int col0 = blockIdx.x * IG_BN;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 2; j++) wmma::fill_fragment(acc[i][j], 0.0f);
    const __half zero = __float2half(0.0f);
    for (int k0 = kbeg; k0 < Kd; k0 += IG_BK) {
        for (int t = tid; t < IG_BM * IG_BK; t += 128) {
            int r = t / IG_BK, c = t % IG_BK;
            int gk = k0 + c;
            As[r][c] = (row0 + r < M && gk < Kd) ? la(row0 + r, gk) : zero;
        }
        for (int t = tid; t < IG_BK * IG_BN; t += 128) {
            int r = B_KFAST ? t % IG_BK : t / IG_BN, c = B_KFAST ? t / IG_BK : t % IG_BN;
            int gk = k0 + r, gn = col0 + c;
            Bs[r][c] = (gk < Kd && gn < N) ? lb(gk, gn) : zero;
        }
        __syncthreads();
        for (int kk = 0; kk < IG_BK; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> a[2];
            wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> b[2];
#pragma unroll
            for (int i = 0; i < 2; i++) wmma::load_matrix_sync(a[i], &As[wy * 32 + i * 16][kk], IG_BK + 8);
#pragma unroll
            for (int j = 0; j < 2; j++) wmma::load_matrix_sync(b[j], &Bs[kk][wx * 32 + j * 16], IG_BN + 8);
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int j = 0; j < 2; j++) wmma::mma_sync(acc[i][j], a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 2; j++) {
            wmma::store_matrix_sync(&Cs[warp][0][0], acc[i][j], 16, wmma::mem_row_major);
            __syncwarp();
            for (int e = lane; e < 256; e += 32) {
                int r = row0 + wy * 32 + i * 16 + e / 16;
                int c = col0 + wx * 32 + j * 16 + e % 16;
                if (r < M && c < N) st(r, c, Cs[warp][e / 16][e % 16]);
            }
            __syncwarp();
        }
}

// out: FP32 and/or FP16 destination of a conv product element, optionally added to what is there
__device__ __forceinline__ void conv_store(float *of, __half *oh, long i, float v, int accumulate) {
    if (of) of[i] = accumulate ? of[i] + v : v;
    if (oh) oh[i] = __float2half(accumulate ? __half2float(oh[i]) + v : v);
}

__global__ __launch_bounds__(128) void conv_fwd_kernel(ConvGeo g, const __half *x, const __half *w, const float *bias,
                                                       float *z, __half *zh) {
    int Kd = g.Cin * g.KK, N = g.B * g.Ho * g.Wo;
    int HWo = g.Ho * g.Wo;
    igemm_block<false>(g.Cout, N, 0, Kd,
        [=](int m, int k) { return w[(long)m * Kd + k]; },
        [=](int k, int n) { return conv_col(g, x, k, n); },
        [=](int m, int n, float v) {
            long i = (n / HWo) * g.zs + (long)m * HWo + n % HWo;
            conv_store(z, zh, i, bias ? v + bias[m] : v, 0);
        });
}
extern "C" void conv_forward_cuda(ConvDims d, const uint16_t *x, const uint16_t *w, const float *bias, float *z,
                                  uint16_t *zh, void *stream) {
    ConvGeo g = conv_geo(d);
    long N = (long)g.B * g.Ho * g.Wo;
    if (N == 0 || g.Cout == 0 || (!z && !zh)) return;
    dim3 grid(cdiv(N, IG_BN), cdiv(g.Cout, IG_BM));
    conv_fwd_kernel<<<grid, 128, 0, (cudaStream_t)stream>>>(g, (const __half *)x, (const __half *)w, bias, z, (__half *)zh);
    CUDA_CHECK(cudaGetLastError());
}

__global__ __launch_bounds__(128) void conv_dgrad_kernel(ConvGeo g, const __half *dz, const __half *w, float *dx,
                                                         __half *dxh, int accumulate) {
    int Kd = g.Cout * g.KK, N = g.B * g.H * g.W;
    int HW = g.H * g.W;
    igemm_block<false>(g.Cin, N, 0, Kd,
        [=](int m, int k) { return w[((long)(k / g.KK) * g.Cin + m) * g.KK + k % g.KK]; },
        [=](int k, int n) {
            int co = k / g.KK, kk = k % g.KK, b = n / HW, q = n % HW;
            int ty = q / g.W + g.pad - kk / g.K, tx = q % g.W + g.pad - kk % g.K;
            if (ty < 0 || tx < 0 || ty % g.S || tx % g.S) return __float2half(0.0f);
            int oy = ty / g.S, ox = tx / g.S;
            if (oy >= g.Ho || ox >= g.Wo) return __float2half(0.0f);
            return dz[b * g.zs + ((long)co * g.Ho + oy) * g.Wo + ox];
        },
        [=](int m, int n, float v) { conv_store(dx, dxh, (n / HW) * g.xs + (long)m * HW + n % HW, v, accumulate); });
}
extern "C" void conv_dgrad_cuda(ConvDims d, const uint16_t *dz, const uint16_t *w, float *dx, uint16_t *dxh, int accumulate,
                                void *stream) {
    ConvGeo g = conv_geo(d);
    long N = (long)g.B * g.H * g.W;
    if (N == 0 || g.Cin == 0 || (!dx && !dxh)) return;
    dim3 grid(cdiv(N, IG_BN), cdiv(g.Cin, IG_BM));
    conv_dgrad_kernel<<<grid, 128, 0, (cudaStream_t)stream>>>(g, (const __half *)dz, (const __half *)w, dx, (__half *)dxh, accumulate);
    CUDA_CHECK(cudaGetLastError());
}

// wgrad reduces over B*Ho*Wo, long for the early layers while M and N are small: the launcher
// splits that range over grid.z (kchunk values each, a multiple of IG_BK) when the tile grid alone
// would leave the GPU idle; the slices then add into dw atomically (summation order not fixed).
__global__ __launch_bounds__(128) void conv_wgrad_kernel(ConvGeo g, const __half *dz, const __half *x, float *dw,
                                                         int accumulate, int kchunk) {
    int N = g.Cin * g.KK, Kd = g.B * g.Ho * g.Wo, HWo = g.Ho * g.Wo, kbeg = blockIdx.z * kchunk;
    int kend = min(Kd, kbeg + kchunk);
    bool split = gridDim.z > 1;
    igemm_block<true>(g.Cout, N, kbeg, kend,
        [=](int m, int k) { return dz[(k / HWo) * g.zs + (long)m * HWo + k % HWo]; },
        [=](int k, int n) { return conv_col(g, x, n, k); },
        [=](int m, int n, float v) {
            if (split) atomicAdd(&dw[(long)m * N + n], v);
            else conv_store(dw, nullptr, (long)m * N + n, v, accumulate);
        });
}
extern "C" void conv_wgrad_cuda(ConvDims d, const uint16_t *dz, const uint16_t *x, float *dw, int accumulate, void *stream) {
    ConvGeo g = conv_geo(d);
    long N = (long)g.Cin * g.KK, Kd = (long)g.B * g.Ho * g.Wo;
    cudaStream_t s = (cudaStream_t)stream;
    if (N == 0 || g.Cout == 0) return;
    if (Kd == 0) {
        if (!accumulate) CUDA_CHECK(cudaMemsetAsync(dw, 0, sizeof(float) * g.Cout * N, s));
        return;
    }
    dim3 grid(cdiv(N, IG_BN), cdiv(g.Cout, IG_BM));
    // aim at >= 256 blocks, each slice at least 8 k-steps deep
    long tiles = (long)grid.x * grid.y, splits = (256 + tiles - 1) / tiles, maxs = (Kd + 8 * IG_BK - 1) / (8 * IG_BK);
    if (splits > maxs) splits = maxs;
    if (splits > 65535) splits = 65535;
    long kchunk = (Kd + splits - 1) / splits;
    kchunk = (kchunk + IG_BK - 1) / IG_BK * IG_BK;
    grid.z = cdiv(Kd, kchunk);
    if (grid.z > 1 && !accumulate) CUDA_CHECK(cudaMemsetAsync(dw, 0, sizeof(float) * g.Cout * N, s));
    conv_wgrad_kernel<<<grid, 128, 0, s>>>(g, (const __half *)dz, (const __half *)x, dw, accumulate, (int)kchunk);
    CUDA_CHECK(cudaGetLastError());
}

// ------------------------------------------------------------------------------------------
// BatchNorm statistics and BN+SiLU, forward and backward (FP16 activations, FP32 math)
// ------------------------------------------------------------------------------------------

// block_sum: the sum of v over the block (blockDim.x a multiple of 32, at most 1024), the same
// value in every thread and the same summation order in every block. Block-uniform call sites only.
__device__ float block_sum(float v) {
    __shared__ float red[32];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = v;
    __syncthreads();
    float t = 0.0f;
    for (int w = 0; w < (int)blockDim.x / 32; w++) t += red[w];
    __syncthreads();   // red is reused by the next call
    return t;
}

// bn_stats: one block per channel; train: two passes over the channel (sum, then centred sum of
// squares) as conv_forward_cpu, FP32 accumulation. grid (C), block 256.
__global__ void bn_stats_kernel(const __half *z, long zs, int B, int HW, float *mean, float *invstd, float *rm, float *rv,
                                float eps, float momentum, int train) {
    int c = blockIdx.x;
    if (!train) {
        if (threadIdx.x == 0) { mean[c] = rm[c]; invstd[c] = 1.0f / sqrtf(rv[c] + eps); }
        return;
    }
    float s = 0.0f, cnt = (float)B * HW;
    for (int b = 0; b < B; b++) {
        const __half *zc = z + b * zs + (long)c * HW;
        for (int i = threadIdx.x; i < HW; i += blockDim.x) s += __half2float(zc[i]);
    }
    float mu = block_sum(s) / cnt, ss = 0.0f;
    for (int b = 0; b < B; b++) {
        const __half *zc = z + b * zs + (long)c * HW;
        for (int i = threadIdx.x; i < HW; i += blockDim.x) { float d = __half2float(zc[i]) - mu; ss += d * d; }
    }
    float var = block_sum(ss) / cnt;
    if (threadIdx.x == 0) {
        mean[c] = mu;
        invstd[c] = 1.0f / sqrtf(var + eps);
        if (rm) rm[c] = (1 - momentum) * rm[c] + momentum * mu;
        if (rv) rv[c] = (1 - momentum) * rv[c] + momentum * (cnt > 1 ? var * cnt / (cnt - 1) : var);
    }
}
extern "C" void bn_stats_cuda(const uint16_t *z, long zs, int B, int C, int HW, float *mean, float *invstd, float *rm, float *rv,
                              float eps, float momentum, int train, void *stream) {
    if (C == 0) return;
    if (!zs) zs = (long)C * HW;
    bn_stats_kernel<<<C, 256, 0, (cudaStream_t)stream>>>((const __half *)z, zs, B, HW, mean, invstd, rm, rv, eps, momentum, train);
    CUDA_CHECK(cudaGetLastError());
}

// bn_silu_forward_f16: grid (ceil(HW/256), C, B), one thread per element
__global__ void bn_silu_forward_f16_kernel(const __half *z, long zs, const float *mean, const float *invstd, const float *gamma,
                                           const float *beta, __half *y, long ys, int HW) {
    int i = blockIdx.x * blockDim.x + threadIdx.x, c = blockIdx.y, b = blockIdx.z;
    if (i >= HW) return;
    float sc = gamma[c] * invstd[c], sh = beta[c] - mean[c] * sc;
    float v = __half2float(z[b * zs + (long)c * HW + i]) * sc + sh;
    y[b * ys + (long)c * HW + i] = __float2half(v / (1.0f + expf(-v)));
}
extern "C" void bn_silu_forward_f16_cuda(const uint16_t *z, long zs, const float *mean, const float *invstd, const float *gamma,
                                         const float *beta, uint16_t *y, long ys, int B, int C, int HW, void *stream) {
    if ((long)B * C * HW == 0) return;
    dim3 grid(cdiv(HW, 256), (unsigned)C, (unsigned)B);
    bn_silu_forward_f16_kernel<<<grid, 256, 0, (cudaStream_t)stream>>>((const __half *)z, zs ? zs : (long)C * HW, mean, invstd, gamma,
                                                                       beta, (__half *)y, ys ? ys : (long)C * HW, HW);
    CUDA_CHECK(cudaGetLastError());
}

// gy = dA * silu'(y) at y = gamma*xhat + beta, xhat = (z - mean)*invstd (conv_backward_cpu's first loop)
__device__ __forceinline__ float bn_silu_gy(float dA, float xh, float gamma, float beta) {
    float y = gamma * xh + beta, s = 1.0f / (1.0f + expf(-y));
    return dA * s * (1.0f + y * (1.0f - s));
}
// bn_bwd_reduce: one block per channel: sums of gy and gy*xhat into dgamma/dbeta (+=) and the two
// means the apply pass needs into scratch (C mean(gy), then C mean(gy*xhat); 0 in eval).
__global__ void bn_bwd_reduce_kernel(const __half *z, const float *dA, long zs, const float *mean, const float *invstd,
                                     const float *gamma, const float *beta, float *dgamma, float *dbeta, float *scratch, int B,
                                     int C, int HW, int train) {
    int c = blockIdx.x;
    float sg = 0.0f, sgx = 0.0f, cnt = (float)B * HW;
    float mu = gamma ? mean[c] : 0.0f, is = gamma ? invstd[c] : 0.0f, ga = gamma ? gamma[c] : 0.0f, be = gamma ? beta[c] : 0.0f;
    for (int b = 0; b < B; b++) {
        long o = b * zs + (long)c * HW;
        for (int i = threadIdx.x; i < HW; i += blockDim.x) {
            if (!gamma) { sg += dA[o + i]; continue; }
            float xh = (__half2float(z[o + i]) - mu) * is, gy = bn_silu_gy(dA[o + i], xh, ga, be);
            sg += gy;
            sgx += gy * xh;
        }
    }
    sg = block_sum(sg);
    sgx = block_sum(sgx);
    if (threadIdx.x == 0) {
        dbeta[c] += sg;
        if (gamma) {
            dgamma[c] += sgx;
            scratch[c] = train ? sg / cnt : 0.0f;
            scratch[C + c] = train ? sgx / cnt : 0.0f;
        }
    }
}
// bn_bwd_apply: dz = gamma*invstd*(gy - mg - xhat*mgx) in FP16 (or dz = dA without BN).
// grid (ceil(HW/256), C, B)
__global__ void bn_bwd_apply_kernel(const __half *z, const float *dA, long zs, const float *mean, const float *invstd,
                                    const float *gamma, const float *beta, const float *scratch, __half *dz, int C, int HW) {
    int i = blockIdx.x * blockDim.x + threadIdx.x, c = blockIdx.y;
    if (i >= HW) return;
    long o = blockIdx.z * zs + (long)c * HW + i;
    if (!gamma) { dz[o] = __float2half(dA[o]); return; }
    float is = invstd[c], xh = (__half2float(z[o]) - mean[c]) * is, gy = bn_silu_gy(dA[o], xh, gamma[c], beta[c]);
    dz[o] = __float2half(gamma[c] * is * (gy - scratch[c] - xh * scratch[C + c]));
}
extern "C" void bn_silu_backward_cuda(const uint16_t *z, const float *dA, long zs, const float *mean, const float *invstd,
                                      const float *gamma, const float *beta, float *dgamma, float *dbeta, uint16_t *dz,
                                      float *scratch, int B, int C, int HW, int train, void *stream) {
    if (C == 0) return;
    if (!zs) zs = (long)C * HW;
    cudaStream_t s = (cudaStream_t)stream;
    bn_bwd_reduce_kernel<<<C, 256, 0, s>>>((const __half *)z, dA, zs, mean, invstd, gamma, beta, dgamma, dbeta, scratch, B, C, HW, train);
    CUDA_CHECK(cudaGetLastError());
    if ((long)B * HW == 0) return;
    dim3 grid(cdiv(HW, 256), (unsigned)C, (unsigned)B);
    bn_bwd_apply_kernel<<<grid, 256, 0, s>>>((const __half *)z, dA, zs, mean, invstd, gamma, beta, scratch, (__half *)dz, C, HW);
    CUDA_CHECK(cudaGetLastError());
}

// ------------------------------------------------------------------------------------------
// upsample, max-pool backward; copies and conversions
// ------------------------------------------------------------------------------------------

// upsample2_backward: one thread per dx element, the 2x2 sum in the CPU's order
__global__ void upsample2_backward_kernel(const float *dy, float *dx, int H, int W, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int x = (int)(i % W), y = (int)((i / W) % H);
    long bc = i / ((long)W * H);
    const float *g = dy + (bc * 2 * H + 2 * y) * 2 * W + 2 * x;
    dx[i] = g[0] + g[1] + g[2 * W] + g[2 * W + 1];
}
extern "C" void upsample2_backward_cuda(const float *dy, float *dx, int B, int C, int H, int W, void *stream) {
    long n = (long)B * C * H * W;
    if (n == 0) return;
    upsample2_backward_kernel<<<cdiv(n, 256), 256, 0, (cudaStream_t)stream>>>(dy, dx, H, W, n);
    CUDA_CHECK(cudaGetLastError());
}

// maxpool5_backward: a 16x16 block owns a 16x16 tile of dx. It stages the 24x24 input tile, finds
// the argmax of the 20x20 windows whose output reads the tile (first maximum in row-major window
// order, padding skipped, as the CPU), then every input pixel gathers the dy of the outputs whose
// argmax it is, in output row-major order (the CPU's summation order). grid (ceil(W/16), ceil(H/16), B*C)
__global__ void maxpool5_backward_kernel(const float *x, const float *dy, float *dx, int H, int W) {
    __shared__ float xt[MP_T + 8][MP_T + 9];
    __shared__ int arg[MP_S][MP_S];
    __shared__ float g[MP_S][MP_S];
    long base = (long)blockIdx.z * H * W;
    int tx0 = blockIdx.x * MP_T, ty0 = blockIdx.y * MP_T, tid = threadIdx.y * MP_T + threadIdx.x;
    for (int t = tid; t < (MP_T + 8) * (MP_T + 8); t += MP_T * MP_T) {
        int r = t / (MP_T + 8), c = t % (MP_T + 8), iy = ty0 - 4 + r, ix = tx0 - 4 + c;
        xt[r][c] = (iy >= 0 && iy < H && ix >= 0 && ix < W) ? x[base + (long)iy * W + ix] : 0.0f;
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
            g[r][c] = dy[base + (long)oy * W + ox];
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
        dx[base + me] = s;
    }
}
extern "C" void maxpool5_backward_cuda(const float *x, const float *dy, float *dx, int B, int C, int H, int W, void *stream) {
    if ((long)B * C * H * W == 0) return;
    dim3 grid(cdiv(W, MP_T), cdiv(H, MP_T), (unsigned)(B * C)), block(MP_T, MP_T);
    maxpool5_backward_kernel<<<grid, block, 0, (cudaStream_t)stream>>>(x, dy, dx, H, W);
    CUDA_CHECK(cudaGetLastError());
}

// copy_f16: grid (ceil(n/256), B)
__global__ void copy_f16_kernel(const __half *src, long ss, __half *dst, long ds, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[blockIdx.y * ds + i] = src[blockIdx.y * ss + i];
}
extern "C" void copy_f16_cuda(const uint16_t *src, long ss, uint16_t *dst, long ds, int B, long n, void *stream) {
    if (B == 0 || n == 0) return;
    copy_f16_kernel<<<dim3(cdiv(n, 256), (unsigned)B), 256, 0, (cudaStream_t)stream>>>((const __half *)src, ss, (__half *)dst, ds, n);
    CUDA_CHECK(cudaGetLastError());
}
__global__ void u8_to_f16_kernel(const uint8_t *x, __half *y, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = __float2half(x[i] * (1.f / 255.f));
}
extern "C" void u8_to_f16_cuda(const uint8_t *x, uint16_t *y, long n, void *stream) {
    if (n == 0) return;
    u8_to_f16_kernel<<<cdiv(n, 256), 256, 0, (cudaStream_t)stream>>>(x, (__half *)y, n);
    CUDA_CHECK(cudaGetLastError());
}
__global__ void f32_to_f16_kernel(const float *x, __half *y, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = __float2half(x[i]);
}
extern "C" void f32_to_f16_cuda(const float *x, uint16_t *y, long n, void *stream) {
    if (n == 0) return;
    f32_to_f16_kernel<<<cdiv(n, 256), 256, 0, (cudaStream_t)stream>>>(x, (__half *)y, n);
    CUDA_CHECK(cudaGetLastError());
}

// ------------------------------------------------------------------------------------------
// views of the training step (parts/gpu.c): FP16 upsample / max-pool into a concat slice, adds
// ------------------------------------------------------------------------------------------

// upsample2_forward_f16: nearest x2, one thread per output element; grid (ceil(4HW/256), C, B).
// x dense (B, C, H, W) -> y (B, C, 2H, 2W) with image stride ys (a channel slice of a concat).
__global__ void upsample2_forward_f16_kernel(const __half *x, __half *y, long ys, int C, int H, int W) {
    int i = blockIdx.x * blockDim.x + threadIdx.x, c = blockIdx.y, b = blockIdx.z;
    if (i >= 4 * H * W) return;
    int ox = i % (2 * W), oy = i / (2 * W);
    y[b * ys + (long)c * 4 * H * W + i] = x[((long)b * C + c) * H * W + (oy / 2) * W + ox / 2];
}
extern "C" void upsample2_forward_f16_cuda(const uint16_t *x, uint16_t *y, long ys, int B, int C, int H, int W, void *stream) {
    if ((long)B * C * H * W == 0) return;
    dim3 grid(cdiv(4L * H * W, 256), (unsigned)C, (unsigned)B);
    upsample2_forward_f16_kernel<<<grid, 256, 0, (cudaStream_t)stream>>>((const __half *)x, (__half *)y,
                                                                        ys ? ys : 4L * C * H * W, C, H, W);
    CUDA_CHECK(cudaGetLastError());
}

// maxpool5_forward_f16: 5x5, stride 1, pad 2 (-inf), one thread per output reading its window
// (FP16 max is exact, so the result equals the FP32 pool of the same values); grid (ceil(HW/256), C, B).
// x dense (B, C, H, W) -> y with image stride ys.
__global__ void maxpool5_forward_f16_kernel(const __half *x, __half *y, long ys, int C, int H, int W) {
    int i = blockIdx.x * blockDim.x + threadIdx.x, c = blockIdx.y, b = blockIdx.z;
    if (i >= H * W) return;
    int ox = i % W, oy = i / W;
    const __half *p = x + ((long)b * C + c) * H * W;
    float m = -INFINITY;
    for (int dy = -2; dy <= 2; dy++)
        for (int dx = -2; dx <= 2; dx++) {
            int iy = oy + dy, ix = ox + dx;
            if (iy >= 0 && iy < H && ix >= 0 && ix < W) m = fmaxf(m, __half2float(p[iy * W + ix]));
        }
    y[b * ys + (long)c * H * W + i] = __float2half(m);
}
extern "C" void maxpool5_forward_f16_cuda(const uint16_t *x, uint16_t *y, long ys, int B, int C, int H, int W, void *stream) {
    if ((long)B * C * H * W == 0) return;
    dim3 grid(cdiv((long)H * W, 256), (unsigned)C, (unsigned)B);
    maxpool5_forward_f16_kernel<<<grid, 256, 0, (cudaStream_t)stream>>>((const __half *)x, (__half *)y,
                                                                       ys ? ys : (long)C * H * W, C, H, W);
    CUDA_CHECK(cudaGetLastError());
}

// add_f16: dst[b*ds + i] += src[b*ss + i] (FP32 sum, rounded once); grid (ceil(n/256), B)
__global__ void add_f16_kernel(const __half *src, long ss, __half *dst, long ds, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        __half *d = dst + blockIdx.y * ds + i;
        *d = __float2half(__half2float(*d) + __half2float(src[blockIdx.y * ss + i]));
    }
}
extern "C" void add_f16_cuda(const uint16_t *src, long ss, uint16_t *dst, long ds, int B, long n, void *stream) {
    if (B == 0 || n == 0) return;
    add_f16_kernel<<<dim3(cdiv(n, 256), (unsigned)B), 256, 0, (cudaStream_t)stream>>>((const __half *)src, ss, (__half *)dst, ds, n);
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

// f16_to_f32: y = x (exact)
__global__ void f16_to_f32_kernel(const __half *x, float *y, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = __half2float(x[i]);
}
extern "C" void f16_to_f32_cuda(const uint16_t *x, float *y, long n, void *stream) {
    if (n == 0) return;
    f16_to_f32_kernel<<<cdiv(n, 256), 256, 0, (cudaStream_t)stream>>>((const __half *)x, y, n);
    CUDA_CHECK(cudaGetLastError());
}

// ------------------------------------------------------------------------------------------
// optimizer, gradient clipping, EMA
// ------------------------------------------------------------------------------------------

__global__ void ema_update_kernel(float *ema, const float *p, long n, float d) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) ema[i] = d * ema[i] + (1 - d) * p[i];
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
extern "C" void optim_norm_cuda(const float *g, const uint8_t *group, long n, float inv_scale, float *partials, void *stream) {
    optim_norm_kernel<<<OPT_NORM_BLOCKS, 256, 0, (cudaStream_t)stream>>>(g, group, n, inv_scale, partials);
    CUDA_CHECK(cudaGetLastError());
}

// optim_step: block size OPT_NORM_BLOCKS; every block reduces the partials the same way (so all
// agree on the norm bit for bit), then strides over the parameters. No update at all when a
// gradient is not finite.
__global__ void optim_step_kernel(float *p, const float *g, float *m, float *v, const uint8_t *group, long n,
                                  const float *partials, OptimHyper h, float *norm_out) {
    float ss = block_sum(partials[2 * threadIdx.x]), bad = block_sum(partials[2 * threadIdx.x + 1]);
    float norm = bad > 0 ? INFINITY : sqrtf(ss);
    if (blockIdx.x == 0 && threadIdx.x == 0) norm_out[0] = norm;
    if (bad > 0) return;
    float coef = h.max_norm / (norm + 1e-6f);
    bool clip = h.max_norm > 0 && coef < 1.0f;   // grad_clip_norm: g *= coef after unscaling
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
        int gr = group[i];
        if (gr == OPT_NO_GROUP) continue;
        float gv = g[i] * h.inv_scale;
        if (clip) gv *= coef;
        // constant indices only: a dynamic index would put the parameter struct on the stack
        float lr = gr == 0 ? h.lr[0] : gr == 1 ? h.lr[1] : h.lr[2], wd = gr == 0 ? h.wd[0] : gr == 1 ? h.wd[1] : h.wd[2];
        float astep = gr == 0 ? h.adam_step[0] : gr == 1 ? h.adam_step[1] : h.adam_step[2], mom = h.momentum;
        if (!h.adamw) {
            float gi = gv + wd * p[i];
            float mb = h.first ? gi : mom * m[i] + gi;
            m[i] = mb;
            p[i] -= lr * (gi + mom * mb);
        } else {
            float pi = p[i] * (1 - lr * wd);
            float mb = mom * m[i] + (1 - mom) * gv, vb = h.beta2 * v[i] + (1 - h.beta2) * gv * gv;
            m[i] = mb; v[i] = vb;
            p[i] = pi - astep * mb / (sqrtf(vb) / h.bc2_sqrt + h.eps);
        }
    }
}
extern "C" void optim_step_cuda(float *p, const float *g, float *m, float *v, const uint8_t *group, long n, const float *partials,
                                OptimHyper h, float *norm_out, void *stream) {
    unsigned blocks = n ? cdiv(n, OPT_NORM_BLOCKS) : 1;
    if (blocks > 4096) blocks = 4096;
    optim_step_kernel<<<blocks, OPT_NORM_BLOCKS, 0, (cudaStream_t)stream>>>(p, g, m, v, group, n, partials, h, norm_out);
    CUDA_CHECK(cudaGetLastError());
}
