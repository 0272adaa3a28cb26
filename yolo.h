// yolo.h: the interface between yolo.c (host, plain C) and yolo_kernels.cu (device code).
// Only launcher prototypes and plain structs; includable from C and C++. Every launcher takes
// device pointers and a stream (a cudaStream_t passed as void *; NULL is the default stream),
// enqueues its kernels and checks the launch. Each has a CPU twin in yolo.c with the same name
// ending in _cpu instead of _cuda.
#pragma once
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif

// y = silu(gamma[c] * (z - mean[c]) * invstd[c] + beta[c]), inference-form BN fused with SiLU.
// z, y: (B, C, HW); mean, invstd, gamma, beta: (C)
void bn_silu_forward_cuda(const float *z, const float *mean, const float *invstd, const float *gamma, const float *beta,
                          float *y, int B, int C, int HW, void *stream);
// nearest-neighbour x2 upsampling (nn.Upsample(scale_factor=2)). x: (B, C, H, W) -> y: (B, C, 2H, 2W)
void upsample2_forward_cuda(const float *x, float *y, int B, int C, int H, int W, void *stream);
// 5x5 max pool, stride 1, padding 2 (SPPF's nn.MaxPool2d(5, 1, 2)); padding acts as -inf.
// x, y: (B, C, H, W)
void maxpool5_forward_cuda(const float *x, float *y, int B, int C, int H, int W, void *stream);
// C = A B on tensor cores (WMMA), row-major, FP16 inputs given as IEEE binary16 bit patterns,
// FP32 accumulation and output; any M, N, K. A: (M, K), B: (K, N), C: (M, N)
void gemm_f16_cuda(int M, int N, int K, const uint16_t *A, const uint16_t *B, float *C, void *stream);

#ifdef __cplusplus
}
#endif
