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
