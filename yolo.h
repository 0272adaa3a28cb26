// yolo.h: the interface between yolo.c (host, plain C) and yolo_kernels.cu (device code).
// Launcher prototypes, plain structs and the little math both sides compute (CIoU, the DFL softmax,
// sizes); includable from C and C++. Every launcher takes device pointers and a stream (a cudaStream_t
// passed as void *; NULL is the default stream), enqueues its kernels and checks the launch. Each has a CPU twin, the
// code of the CPU step that computes the same thing: YOLO_TWINS at the end of this file names it and the test that
// compares them.
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#ifdef __cplusplus
extern "C" {
#endif

// YOLO_HD: a function of this header that yolo.c and the kernels both call: __host__ __device__ under
// nvcc, nothing for the C compiler and for the CPU emulation of the kernels.
#ifdef __CUDACC__
#define YOLO_HD __host__ __device__
#else
#define YOLO_HD
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

// ---- training step (FP16 activations, FP32 accumulation; FP16 data as IEEE binary16 bit patterns) ----
// Each activation-typed launcher has an FP32 twin named _f32_cuda (the step with amp=0): the same
// semantics and strides with float activations, gradients and weights; FP32 math throughout.

// Convolution geometry: x (B, Cin, H, W) -> z (B, Cout, Ho, Wo), weights (Cout, Cin, K, K), padding
// K/2, stride S; Ho = (H + 2*(K/2) - K)/S + 1. xs, zs: elements between images of x (and dx) and of
// z (and dz); 0 means dense (Cin*H*W, Cout*Ho*Wo). A stride lets a conv read or write a channel
// slice of a larger concat buffer or a Detect head map. wstride: elements between output channels of
// w, 0 meaning dense (Cin*K*K); only the input gradients (conv_dgrad_cuda, conv_dgrad_f32_cuda) take
// another, to read the columns of one concat source in place from a wider conv's weights. Index math
// is 32-bit inside an image batch: B*H*W, B*Ho*Wo and Cout*wstride stay below 2^31. x8 (the FP16
// forward and weight gradient, conv_stem_takes_u8 shapes only): x is the uint8 image batch itself, each
// value read as v * (1/255) rounded to FP16, the bits u8_to_f16_cuda would store (xs in bytes), so the
// step keeps the batch as uploaded (1 byte a value) and never writes an FP16 copy.
typedef struct { int B, Cin, H, W, Cout, K, S; long xs, zs, wstride; int x8; } ConvDims;
// conv_out: an output side of a conv with padding K/2: (n + 2*(K/2) - K)/S + 1
static inline int conv_out(int n, int K, int S) { return (n + 2 * (K / 2) - K) / S + 1; }
// conv_stem_takes_u8: whether the stem's kernels (3 input channels, 3x3, stride 2, Cout 16, 32 or 48:
// the n, s and m stems) take d with x8, by its dims: output rows a multiple of 16 wide, rows of x a
// multiple of 8 bytes, z's image stride a multiple of 8 halves. (The pointers must be 8-byte (x) and
// 16-byte (z, dz) aligned, as the arena's blocks are.)
static inline int conv_stem_takes_u8(ConvDims d) {
    long xs = d.xs ? d.xs : 3L * d.H * d.W, zs = d.zs ? d.zs : (long)d.Cout * conv_out(d.H, 3, 2) * conv_out(d.W, 3, 2);
    int Ho = conv_out(d.H, 3, 2), Wo = conv_out(d.W, 3, 2);
    return d.Cin == 3 && d.K == 3 && d.S == 2 && d.Cout % 16 == 0 && d.Cout > 0 && d.Cout <= 48 && Wo % 16 == 0 &&
           d.W % 8 == 0 && xs % 8 == 0 && zs % 8 == 0 && (long)d.B * Ho * ((Wo + 31) / 32) < 2147483643L;
}

// FastDiv: n / d for 0 <= n < 2^31 by a multiply and a shift, the divisor's magic number made once on
// the host (as CUTLASS's FastDivmod: m = ceil(2^p / d), p = 31 + ceil(log2 d)). The convolutions'
// index math divides by runtime sizes (K*K, K, Ho*Wo, Wo, ...) for every gathered element, and an
// integer division by a runtime value costs a GPU some 20 instructions. kernels_test checks it.
typedef struct { int d, s; uint32_t m; } FastDiv;
static inline FastDiv fast_div(int d) {
    FastDiv f = {d, 0, 0};
    if (d > 1) {
        int l = 0;
        while ((1LL << l) < d) l++;
        f.m = (uint32_t)(((1ULL << (31 + l)) + (uint64_t)d - 1) / (uint64_t)d);
        f.s = l - 1;   // p - 32
    }
    return f;
}
YOLO_HD static inline int div_fast(int n, FastDiv f) {
#if defined(__CUDA_ARCH__)
    return f.d == 1 ? n : (int)(__umulhi((unsigned)n, f.m) >> f.s);
#else
    return f.d == 1 ? n : (int)((uint32_t)(((uint64_t)(uint32_t)n * f.m) >> 32) >> f.s);
#endif
}

// ConvAct: a conv whose input is SiLU(BN(z)) of the conv that made it, applied in the kernels' gather
// (the activated input is never materialised: one pass over memory and one buffer fewer). x is then
// the producer's pre-BN z (its channel slice; xs its image stride) and these its per-channel batch
// statistics and BN parameters from that slice's first channel. The gather computes exactly what
// bn_silu_forward_*_cuda writes. act NULL: x is the input itself.
typedef struct { const float *mean, *invstd, *gamma, *beta; } ConvAct;

// conv_forward_cuda: implicit GEMM on tensor cores (WMMA), FP32 accumulation. z = conv(x, w) (+ bias[co]
// when bias is not NULL), written to z (FP32) and/or zh (FP16); either may be NULL. wt: the same weights
// tap-major (conv_w_tapmajor_cuda), or NULL: a 3x3 conv takes the halo kernel, which copies its weights
// from there, only with it (without, the slower gather kernel).
void conv_forward_cuda(ConvDims d, const void *x, const ConvAct *act, const uint16_t *w, const uint16_t *wt,
                       const float *bias, float *z, uint16_t *zh, void *stream);
// conv_forward_stats_cuda: conv_forward_cuda's FP16 z (no bias) and, from the same kernel's epilogue, what
// bn_stats_cuda needs of that z (train): each block reduces the values it stores, rounded to FP16 as
// stored (the statistics describe the tensor BN normalises), per output channel to a count, a mean and a
// sum of squared deviations (two passes over registers), into part (conv_stats_floats(d) floats); returns
// the pixel tiles K of each channel there. z is not read again: bn_stats_finish_cuda(part, K, ..) ends it.
int conv_forward_stats_cuda(ConvDims d, const void *x, const ConvAct *act, const uint16_t *w,
                            const uint16_t *wt, uint16_t *zh, float *part, void *stream);
// ConvParts: the input of a 1x1 conv that is a concatenation, read in place part by part: n parts in
// channel order, part i C[i] channels (a multiple of 32, the last of 16) of FP16 x[i], (B, C[i], H, W) at
// image stride xs[i] (a multiple of 8; x[i] 16-byte aligned); act[i] set: x[i] is a BN conv's pre-BN z
// (its channel slice) and the gather applies acts[i] as ConvAct does, else x[i] is the part's values.
#define CONV_PARTS_MAX 8
typedef struct {
    int n, C[CONV_PARTS_MAX], act[CONV_PARTS_MAX];
    const uint16_t *x[CONV_PARTS_MAX];
    long xs[CONV_PARTS_MAX];
    ConvAct acts[CONV_PARTS_MAX];
} ConvParts;
// conv_forward_parts_cuda: conv_forward_stats_cuda (part NULL: conv_forward_cuda's FP16 zh, no bias) of a
// 1x1 stride-1 conv whose Cin channels are p's parts, the same bits as over the concatenation
// materialised (each value as bn_silu_forward_f16_cuda writes it, the products in the same order), which
// is then never written: for H*W a multiple of 8 and Cin at most CONV_PARTS_MAX_CIN. Returns the pixel
// tiles K, as conv_forward_stats_cuda.
int conv_forward_parts_cuda(ConvDims d, const ConvParts *p, const uint16_t *w, uint16_t *zh, float *part,
                            void *stream);
#define CONV_PARTS_MAX_CIN 2048
// bn_stats_finish_cuda: the K tiles of each of the C channels in part (count, mean, squared deviations
// and a 0: 16 bytes a tile) merged in a fixed order (Chan et al.'s update; the same bits on every run)
// into mean, invstd and the running stats (rm, rv; NULL to skip), as bn_stats_cuda (train) does with
// its own chunks.
void bn_stats_finish_cuda(const float *part, int K, int C, float *mean, float *invstd, float *rm, float *rv,
                          float eps, float momentum, void *stream);
// conv_tiles_bound: a bound on the pixel tiles of a conv kernel's output map of npix pixels (over the
// batch): tiles of 64 of them (the gather kernels), or the 3x3 kernel's tiles of bn pixels as 16- or
// 32-column blocks of rows of an OW x OH grid, B images, nz grids an image, whichever count is the
// largest (the 3x3 kernel's tiles of whole rows, at either stride, are taken only where they are fewer)
static inline long conv_tiles_bound(long npix, long B, long OW, long OH, long bn, long nz) {
    long t = (npix + 63) / 64;
    for (long tc = 16; tc <= 32; tc *= 2) {
        long h = B * ((OW + tc - 1) / tc) * ((OH + bn / tc - 1) / (bn / tc)) * nz;
        if (h > t) t = h;
    }
    return t > 0 ? t : 1;
}
// conv_stats_floats: a bound on conv_forward_stats_cuda's partials, 4 floats per output channel and pixel
// tile (conv_tiles_bound of the output map; the 3x3 kernel's tiles 128 pixels, 64 at stride 2)
static inline size_t conv_stats_floats(ConvDims d) {
    long Ho = conv_out(d.H, d.K, d.S), Wo = conv_out(d.W, d.K, d.S);
    return (size_t)4 * d.Cout * conv_tiles_bound((long)d.B * Ho * Wo, d.B, Wo, Ho, d.S == 2 ? 64 : 128, 1);
}
// conv_forward_f32_cuda: z = conv(x, w) (+ bias[co] when bias != NULL), FP32 in and out, FP32 accumulation
// (SIMT implicit GEMM, one fmaf chain per output in a fixed order: deterministic); xs, zs as above.
void conv_forward_f32_cuda(ConvDims d, const float *x, const ConvAct *act, const float *w, const float *bias, float *z,
                           void *stream);
// conv_dgrad_cuda: input gradient dx = conv_transpose(dz, w), implicit GEMM on tensor cores. Written to
// dx (FP32) and/or dxh (FP16), either may be NULL; accumulate != 0 adds to what is there. wt: the same
// weights tap-major (conv_w_tapmajor_cuda), or NULL: as for conv_forward_cuda, a 3x3 conv takes the halo
// kernel only with it (at stride 2 it reads only the taps each parity of input pixels needs); ignored
// where w is strided (wstride: the tap-major copy holds every column).
void conv_dgrad_cuda(ConvDims d, const uint16_t *dz, const uint16_t *w, const uint16_t *wt, float *dx, uint16_t *dxh,
                     int accumulate, void *stream);
// conv_dgrad_bn_cuda: conv_dgrad_cuda's FP16 dxh (written, not added to) where dxh is the whole dA of a
// BN+SiLU conv (bn: its batch statistics and BN parameters, z its FP16 pre-BN output in dxh's layout):
// from the same kernel's epilogue, per channel and pixel tile, the sums of gy = dA silu'(y) and gy xhat
// over the dA values it stores (rounded to FP16, as stored) into part (C = d.Cin channels of K tiles:
// part[c K + k], then part[C K + c K + k]), what bn_silu_backward_h_cuda's first pass would read dA and z
// again for. Returns K, or 0 where the kernel it takes has no such epilogue (the 1x1 and 3x3 ones whose
// operands do not allow 16-byte loads) or its tiles are more than kmax: dxh is written all the same.
long conv_dgrad_bn_cuda(ConvDims d, const uint16_t *dz, const uint16_t *w, const uint16_t *wt, uint16_t *dxh,
                        const uint16_t *z, const ConvAct *bn, float *part, long kmax, void *stream);
// conv_dgrad_bn_tiles: a bound on the K of conv_dgrad_bn_cuda (its part: 2 d.Cin K floats; 2 d.Cin (K + 1)
// for bn_silu_backward_apply_h_cuda, which adds them up after them): conv_tiles_bound of the input map
// (the 1x1 kernel's tiles of 64 pixels; the 3x3 kernel's of 128, at stride 2 64 pixel pairs of one row
// parity, the two parities' grids each as large as the first's)
static inline long conv_dgrad_bn_tiles(ConvDims d) {
    const int s2 = d.S == 2;
    return conv_tiles_bound((long)d.B * d.H * d.W, d.B, s2 ? (d.W + 1) / 2 : d.W, s2 ? (d.H + 1) / 2 : d.H,
                            s2 ? 64 : 128, s2 ? 2 : 1);
}
// conv_w_tapmajor_cuda: for each of n jobs, wt (cout, 9, cin) = w (cout, cin, 3, 3), FP16, bit for bit
typedef struct { const uint16_t *w; uint16_t *wt; int cout, cin; } ConvWtJob;
void conv_w_tapmajor_cuda(const ConvWtJob *jobs, int n, void *stream);
// conv_dgrad_f32_cuda: dx (+)= conv_transpose(dz, w), all FP32; accumulate != 0 adds to what is there.
void conv_dgrad_f32_cuda(ConvDims d, const float *dz, const float *w, float *dx, int accumulate, void *stream);
// conv_wgrad_split: the weight gradient reduces over B*Ho*Wo, long in the early layers where dW
// (Cout, Cin*K*K) has few 64x64 tiles. When the tiles alone would give fewer than 1024 blocks, the
// reduction is split into slices of *kchunk values (a multiple of the k-step bk: 32 FP16, 16 FP32;
// each slice at least 8 k-steps deep); returns the number of slices (1: no split). Each slice writes
// its partial dW to a workspace and one kernel adds the slices in a fixed order: no atomics, the same bits
// on every run and every block schedule. (1024: the 3x3 kernels' tiles are wider than 64, so fewer
// blocks left most of an H200's 132 SMs one 4-warp block each; the workspaces stay inside the step's
// plan, yolov8n 640 batch 16 710.8 MiB.)
static inline long conv_wgrad_split(ConvDims d, int f32, long *kchunk) {
    long bk = f32 ? 16 : 32, Ho = conv_out(d.H, d.K, d.S), Wo = conv_out(d.W, d.K, d.S);
    long N = (long)d.Cin * d.K * d.K, Kd = (long)d.B * Ho * Wo;
    long tiles = ((N + 63) / 64) * ((d.Cout + 63) / 64), splits = (1024 + tiles - 1) / tiles,
         maxs = (Kd + 8 * bk - 1) / (8 * bk);
    if (splits > maxs) splits = maxs;
    if (splits > 65535) splits = 65535;
    if (splits < 1) splits = 1;
    long kc = (Kd + splits - 1) / splits;
    kc = (kc + bk - 1) / bk * bk;
    if (kc < 1) kc = bk;
    *kchunk = kc;
    return (Kd + kc - 1) / kc;
}
// conv_wgrad_ws_bytes: the workspace a weight gradient of d needs (0: not split); under 8 MiB
static inline size_t conv_wgrad_ws_bytes(ConvDims d, int f32) {
    long kc, n = conv_wgrad_split(d, f32, &kc);
    return n > 1 ? (size_t)n * d.Cout * d.Cin * d.K * d.K * sizeof(float) : 0;
}
// conv_wgrad_cuda: weight gradient dW (Cout, Cin*K*K) (+)= sum over images and pixels of dz x col(x),
// FP32 accumulation; accumulate != 0 adds to dW (gradient accumulation), else overwrites. ws: the
// workspace of conv_wgrad_ws_bytes(d, 0) bytes (NULL when that is 0).
void conv_wgrad_cuda(ConvDims d, const uint16_t *dz, const void *x, const ConvAct *act, float *dw, float *ws,
                     int accumulate, void *stream);
// conv_wgrad_f32_cuda: dW (+)= dz x col(x), all FP32 (one fmaf chain per slice, the slices added in a
// fixed order); ws of conv_wgrad_ws_bytes(d, 1) bytes.
void conv_wgrad_f32_cuda(ConvDims d, const float *dz, const float *x, const ConvAct *act, float *dw, float *ws,
                         int accumulate, void *stream);

// BN reductions (bn_stats_cuda, bn_silu_backward_cuda) split each channel's B*HW values into
// bn_chunks chunks (about 4096 values each, at most 256), summed by blocks of their own and then in a
// fixed order: the early layers' 16-64 channels of ~10^6 values keep every SM busy, and the result is
// the same bits on every run. Their scratch: bn_stats_scratch_floats(B, C, HW) floats for bn_stats_cuda
// (4 a chunk), bn_scratch_floats(B, C, HW) for bn_silu_backward_cuda (2 a chunk). (Chunks of 4096
// keep several 256-thread blocks on every SM of an H200 for a 640 batch-16 step's maps.)
static inline int bn_chunks(int B, int HW) {
    long k = ((long)B * HW + 4095) / 4096;
    return k < 1 ? 1 : k > 256 ? 256 : (int)k;
}
static inline size_t bn_scratch_floats(int B, int C, int HW) { return (size_t)C * 2 * bn_chunks(B, HW); }
// bn_stats_cuda: per-channel batch statistics of z (B, C, HW) (image stride zs, 0 = C*HW), as
// conv_forward_cpu: train: mean and biased variance (FP32; two passes over each chunk, the chunks combined by
// bn_stats_finish_cuda),
// invstd = 1/sqrt(var + eps), running mean/var (rm, rv; NULL to skip) updated with momentum and the unbiased variance;
// eval (train == 0): mean = rm, invstd = 1/sqrt(rv + eps). scratch: bn_stats_scratch_floats (train).
void bn_stats_cuda(const uint16_t *z, long zs, int B, int C, int HW, float *mean, float *invstd, float *rm, float *rv,
                   float eps, float momentum, int train, float *scratch, void *stream);
// bn_stats_scratch_floats: bn_stats_cuda's scratch, 4 floats (count, mean, squared deviations, 0) per chunk
static inline size_t bn_stats_scratch_floats(int B, int C, int HW) { return (size_t)C * 4 * bn_chunks(B, HW); }
// bn_stats_f32_cuda: the same from an FP32 z.
void bn_stats_f32_cuda(const float *z, long zs, int B, int C, int HW, float *mean, float *invstd, float *rm, float *rv,
                       float eps, float momentum, int train, float *scratch, void *stream);
// bn_silu_forward_f16_cuda: y = silu(gamma*(z-mean)*invstd + beta), FP16 in and out, FP32 math.
// zs, ys: image strides of z and y (0 = dense): y may be a channel slice of a concat buffer.
// acc: y += that instead (a residual sum): the activation rounded to FP16, the sum rounded once,
// bit for bit what writing it to a buffer and add_f16_cuda(buffer -> y) give.
void bn_silu_forward_f16_cuda(const uint16_t *z, long zs, const float *mean, const float *invstd, const float *gamma,
                              const float *beta, uint16_t *y, long ys, int B, int C, int HW, int acc, void *stream);
// bn_silu_forward_f32_cuda: the same, FP32 in and out (acc: as add_f32_cuda).
void bn_silu_forward_f32_cuda(const float *z, long zs, const float *mean, const float *invstd, const float *gamma,
                              const float *beta, float *y, long ys, int B, int C, int HW, int acc, void *stream);
// bn_silu_sum_f16_cuda: y = silu(BN_1(z1)) + silu(BN_2(z2)) (a1, a2: each source's statistics and BN
// parameters, as ConvAct holds them; z1s, z2s, ys image strides, 0 dense) in one pass, bit for bit
// bn_silu_forward_f16_cuda(z1 -> y) followed by bn_silu_forward_f16_cuda(z2 -> y, acc).
void bn_silu_sum_f16_cuda(const uint16_t *z1, long z1s, const ConvAct *a1, const uint16_t *z2, long z2s,
                          const ConvAct *a2, uint16_t *y, long ys, int B, int C, int HW, void *stream);
// bn_silu_sum_f32_cuda: the same, FP32 in and out.
void bn_silu_sum_f32_cuda(const float *z1, long z1s, const ConvAct *a1, const float *z2, long z2s, const ConvAct *a2,
                          float *y, long ys, int B, int C, int HW, void *stream);
// bn_silu_backward_cuda: conv_backward's first half. From dA (FP32, gradient of the activated output,
// image stride zs like z) and z (FP16): gy = dA * silu'(y); dgamma[c] += sum gy*xhat, dbeta[c] +=
// sum gy; dz = gamma*invstd*(gy - mean(gy) - xhat*mean(gy*xhat)) (train; eval drops the means),
// written FP16 with image stride zs. gamma == NULL: a plain conv with bias (Detect output):
// dbeta[c] += sum dA, dz = dA. scratch: bn_scratch_floats(B, C, HW) floats. A channel of at most
// 32768 values (16384 where z or dA is FP32; H*W and zs multiples of 8, the tensors 16-byte aligned)
// is done in one pass by one block, which reads z and dA once and leaves scratch alone.
void bn_silu_backward_cuda(const uint16_t *z, const float *dA, long zs, const float *mean, const float *invstd,
                           const float *gamma, const float *beta, float *dgamma, float *dbeta, uint16_t *dz,
                           float *scratch, int B, int C, int HW, int train, void *stream);
// bn_silu_backward_h_cuda: the same with dA in FP16 (the AMP step's gradient buffers; the Detect
// outputs' dA, the loss's FP32 maps, take bn_silu_backward_cuda); dz may be dA itself (in place).
void bn_silu_backward_h_cuda(const uint16_t *z, const uint16_t *dA, long zs, const float *mean, const float *invstd,
                             const float *gamma, const float *beta, float *dgamma, float *dbeta, uint16_t *dz,
                             float *scratch, int B, int C, int HW, int train, void *stream);
// bn_silu_backward_apply_h_cuda: bn_silu_backward_h_cuda's second pass alone, from the K sums a channel
// that conv_dgrad_bn_cuda left in part, which holds 2 C (K + 1) floats: the channels' sums are added in a
// fixed order (the same bits on every run) into its last 2 C
void bn_silu_backward_apply_h_cuda(const uint16_t *z, const uint16_t *dA, long zs, const float *mean,
                                   const float *invstd, const float *gamma, const float *beta, float *dgamma,
                                   float *dbeta, uint16_t *dz, float *part, long K, int B, int C, int HW, int train,
                                   void *stream);
// bn_silu_backward_f32_cuda: the same with z and dz in FP32; dz may be dA itself (in place).
void bn_silu_backward_f32_cuda(const float *z, const float *dA, long zs, const float *mean, const float *invstd,
                               const float *gamma, const float *beta, float *dgamma, float *dbeta, float *dz,
                               float *scratch, int B, int C, int HW, int train, void *stream);

// upsample2_backward_cuda: dx (B,C,H,W) = sum of the 2x2 gradients in dy (B,C,2H,2W) (overwrites); dy's
// images gs apart (0: dense), dx dense.
void upsample2_backward_cuda(const float *dy, long gs, float *dx, int B, int C, int H, int W, void *stream);
// maxpool5_backward_cuda: dx (overwritten) from dy, argmax of each 5x5 window recomputed from x, ties
// to the first maximum in row-major window order; sums in output order (bit-exact with the CPU); x's
// images xs apart and dy's gs (0: dense), dx dense.
void maxpool5_backward_cuda(const float *x, long xs, const float *dy, long gs, float *dx, int B, int C, int H, int W,
                            void *stream);
// upsample2_backward_f16_cuda / maxpool5_backward_f16_cuda: the same in FP16 (sums in FP32, each dx rounded
// once).
void upsample2_backward_f16_cuda(const uint16_t *dy, long gs, uint16_t *dx, int B, int C, int H, int W, void *stream);
void maxpool5_backward_f16_cuda(const uint16_t *x, long xs, const uint16_t *dy, long gs, uint16_t *dx, int B, int C,
                                int H, int W, void *stream);
// copy_f16_cuda: B blocks of n FP16 values, src block b at src + b*ss -> dst + b*ds (concat by offset).
void copy_f16_cuda(const uint16_t *src, long ss, uint16_t *dst, long ds, int B, long n, void *stream);
// copy_f32_cuda: the same for floats (bit-exact).
void copy_f32_cuda(const float *src, long ss, float *dst, long ds, int B, long n, void *stream);
// u8_to_f16_cuda: y = x * (1/255) rounded to FP16 (the input image).
void u8_to_f16_cuda(const uint8_t *x, uint16_t *y, long n, void *stream);
// u8_to_f32_cuda: y = x * (1/255) in float, bit-exact with input_from_batch.
void u8_to_f32_cuda(const uint8_t *x, float *y, long n, void *stream);
// f32_to_f16_cuda: y = x rounded to nearest FP16 (the weights' FP16 copy).
void f32_to_f16_cuda(const float *x, uint16_t *y, long n, void *stream);
// Views of the device training step (yolo.c, GPU training step). FP16 data (the _f32 twins: FP32); ys, ss, ds: image
// strides (0 = dense for ys), so an output can be a channel slice of a concat buffer.
// upsample2_forward_f16_cuda: x dense (B, C, H, W) -> y (B, C, 2H, 2W), nearest (bit-exact with _cpu).
void upsample2_forward_f16_cuda(const uint16_t *x, uint16_t *y, long ys, int B, int C, int H, int W, void *stream);
void upsample2_forward_f32_cuda(const float *x, float *y, long ys, int B, int C, int H, int W, void *stream);
// bn_silu_upsample2_f16_cuda: y (B, C, 2H, 2W), image stride ys = nearest x2 of SiLU(BN(z)), z (B, C, H,
// W) with image stride zs (0 dense), BN as bn_silu_forward_f16_cuda: the bits of that kernel into a
// buffer, then upsample2_forward_f16_cuda (the upsampled source of the neck's concatenations).
void bn_silu_upsample2_f16_cuda(const uint16_t *z, long zs, const float *mean, const float *invstd, const float *gamma,
                                const float *beta, uint16_t *y, long ys, int B, int C, int H, int W, void *stream);
// bn_silu_upsample2_f32_cuda: the same in FP32.
void bn_silu_upsample2_f32_cuda(const float *z, long zs, const float *mean, const float *invstd, const float *gamma,
                                const float *beta, float *y, long ys, int B, int C, int H, int W, void *stream);
// maxpool5_forward_f16_cuda: x (B, C, H, W), image stride xs -> y, image stride ys (0: C*H*W, dense),
// 5x5 stride 1 pad 2 max (bit-exact with _cpu). x and y must not overlap (SPPF's chain: each pool reads
// the part before it in the concatenation and writes the next).
void maxpool5_forward_f16_cuda(const uint16_t *x, long xs, uint16_t *y, long ys, int B, int C, int H, int W,
                               void *stream);
void maxpool5_forward_f32_cuda(const float *x, long xs, float *y, long ys, int B, int C, int H, int W, void *stream);
// add_f16_cuda: B blocks of n FP16: dst + b*ds += src + b*ss (FP32 sum rounded once; V_ADD).
void add_f16_cuda(const uint16_t *src, long ss, uint16_t *dst, long ds, int B, long n, void *stream);
// add_f32_cuda: B blocks of n floats: dst + b*ds += src + b*ss (gradients into a conv's dA slice; add_f16_cuda
// does that in the AMP step).
void add_f32_cuda(const float *src, long ss, float *dst, long ds, int B, long n, void *stream);
// AddDst: up to ADD_DST_MAX destinations of one sum, each with its image stride (elements); bit j of
// set: destination j is written (= src: it holds no gradient yet), not added to
#define ADD_DST_MAX 4
typedef struct { void *p[ADD_DST_MAX]; long s[ADD_DST_MAX]; int k; unsigned set; } AddDst;
// add_n_f16_cuda: dst.p[j] + b*dst.s[j] += src + b*ss (= where set) for j < dst.k, src read once (a
// residual sum's gradient into every conv output it is made of); per destination the bits of
// add_f16_cuda (copy_f16_cuda where set), in order.
void add_n_f16_cuda(const uint16_t *src, long ss, AddDst dst, int B, long n, void *stream);
// add_n_f32_cuda: the same in FP32 (add_f32_cuda's bits).
void add_n_f32_cuda(const float *src, long ss, AddDst dst, int B, long n, void *stream);
// ema_update_cuda: ema = d*ema + (1-d)*p over n floats.
void ema_update_cuda(float *ema, const float *p, long n, float d, void *stream);

// ---- loss ----

// ---- loss math shared by the CPU loss (yolo.c) and loss_cuda: one text, the same float operations ----
// (the C and the emulated builds do not contract a*b+c into an fma, so there the two agree bit for bit;
// nvcc does, and its atanf/expf differ in the last bits: on a GPU they agree to rounding)

// bbox_ciou: complete IoU of xyxy boxes b1, b2 (4 floats each), in the exact operation order of
// Ultralytics bbox_iou(box1, box2, xywh=False, CIoU=True), eps 1e-7, in float. c (may be NULL) receives
// the intermediate values, for bbox_ciou_backward.
typedef struct {
    float w1, h1, w2, h2, iwr, ihr, iw, ih, inter, uni, iou, cw, ch, c2, dx, dy, rho2, r1, dat, v, alpha;
} CiouParts;
YOLO_HD static inline float bbox_ciou_parts(const float *b1, const float *b2, CiouParts *c) {
    const float eps = 1e-7f;
    CiouParts t;
    t.w1 = b1[2] - b1[0]; t.h1 = b1[3] - b1[1] + eps;
    t.w2 = b2[2] - b2[0]; t.h2 = b2[3] - b2[1] + eps;
    t.iwr = fminf(b1[2], b2[2]) - fmaxf(b1[0], b2[0]); t.iw = fmaxf(t.iwr, 0.0f);
    t.ihr = fminf(b1[3], b2[3]) - fmaxf(b1[1], b2[1]); t.ih = fmaxf(t.ihr, 0.0f);
    t.inter = t.iw * t.ih;
    t.uni = t.w1 * t.h1 + t.w2 * t.h2 - t.inter + eps;
    t.iou = t.inter / t.uni;
    t.cw = fmaxf(b1[2], b2[2]) - fminf(b1[0], b2[0]);
    t.ch = fmaxf(b1[3], b2[3]) - fminf(b1[1], b2[1]);
    t.c2 = t.cw * t.cw + t.ch * t.ch + eps;
    t.dx = b2[0] + b2[2] - b1[0] - b1[2]; t.dy = b2[1] + b2[3] - b1[1] - b1[3];
    t.rho2 = (t.dx * t.dx + t.dy * t.dy) / 4.0f;
    t.r1 = t.w1 / t.h1;
    t.dat = atanf(t.w2 / t.h2) - atanf(t.r1);
    t.v = (float)(4.0 / (3.14159265358979323846 * 3.14159265358979323846)) * (t.dat * t.dat);
    t.alpha = t.v / (t.v - t.iou + (1.0f + eps));
    if (c) *c = t;
    return t.iou - (t.rho2 / t.c2 + t.v * t.alpha);
}
YOLO_HD static inline float bbox_ciou(const float *b1, const float *b2) { return bbox_ciou_parts(b1, b2, NULL); }

// PyTorch's derivative of minimum/maximum w.r.t. its first argument: 1, 1/2 on ties, 0.
YOLO_HD static inline double loss_dmin(float a, float b) { return a < b ? 1.0 : a == b ? 0.5 : 0.0; }
YOLO_HD static inline double loss_dmax(float a, float b) { return a > b ? 1.0 : a == b ? 0.5 : 0.0; }

// bbox_ciou_backward: d1 (4) = g * dCIoU(b1, b2)/db1 with alpha held constant (Ultralytics computes it
// under no_grad; alpha_grad = 1, for the CPU's finite-difference tests, differentiates it too), with
// PyTorch's conventions for clamp (passes at 0) and min/max ties (half each).
YOLO_HD static inline void bbox_ciou_backward(const float *b1, const float *b2, double g, int alpha_grad, double *d1) {
    const float eps = 1e-7f;
    CiouParts c;
    bbox_ciou_parts(b1, b2, &c);
    float k = (float)(4.0 / (3.14159265358979323846 * 3.14159265358979323846));
    // ciou = iou - rho2/c2 - v*alpha
    double g_iou = g, g_q = -g, g_v = -g * c.alpha;
    if (alpha_grad) {   // alpha = v / D, D = v - iou + 1 + eps: d(v*alpha) = (alpha + v/D - v^2/D^2) dv + v^2/D^2 diou
        double D = (double)c.v - c.iou + (1.0f + eps), q = (double)c.v * c.v / (D * D);
        g_v = -g * (c.alpha + c.v / D - q);
        g_iou = g * (1.0 - q);
    }
    double g_inter = g_iou / c.uni, g_uni = -g_iou * (double)c.inter / ((double)c.uni * c.uni);
    double g_w1 = g_uni * c.h1, g_h1 = g_uni * c.w1;
    g_inter -= g_uni;
    double g_iw = c.iwr >= 0.0f ? g_inter * c.ih : 0.0, g_ih = c.ihr >= 0.0f ? g_inter * c.iw : 0.0;
    double g_rho2 = g_q / c.c2, g_c2 = -g_q * (double)c.rho2 / ((double)c.c2 * c.c2);
    double g_cw = g_c2 * 2.0 * c.cw, g_ch = g_c2 * 2.0 * c.ch;
    double g_dx = g_rho2 * c.dx / 2.0, g_dy = g_rho2 * c.dy / 2.0;
    double g_r1 = g_v * k * 2.0 * c.dat * -1.0 / (1.0 + (double)c.r1 * c.r1);
    g_w1 += g_r1 / c.h1;
    g_h1 -= g_r1 * (double)c.w1 / ((double)c.h1 * c.h1);
    d1[0] = -g_w1 - g_iw * loss_dmax(b1[0], b2[0]) - g_cw * loss_dmin(b1[0], b2[0]) - g_dx;
    d1[2] = g_w1 + g_iw * loss_dmin(b1[2], b2[2]) + g_cw * loss_dmax(b1[2], b2[2]) - g_dx;
    d1[1] = -g_h1 - g_ih * loss_dmax(b1[1], b2[1]) - g_ch * loss_dmin(b1[1], b2[1]) - g_dy;
    d1[3] = g_h1 + g_ih * loss_dmin(b1[3], b2[3]) + g_ch * loss_dmax(b1[3], b2[3]) - g_dy;
}

// dfl_side_decode: softmax over the 16 bins of one side, logits z[k*step], k = 0..15. Returns the
// expected distance sum_k k*p_k (grid units); p (16) receives the probabilities and *lse the log-sum-exp
// (for the DFL cross-entropy). Matches bbox_decode (softmax, matmul with arange(16)).
#define DFL_BINS 16
YOLO_HD static inline float dfl_side_decode(const float *z, long step, float *p, float *lse) {
    float m = z[0];
    for (int k = 1; k < DFL_BINS; k++) m = fmaxf(m, z[k * step]);
    float sum = 0.0f;
    for (int k = 0; k < DFL_BINS; k++) { p[k] = expf(z[k * step] - m); sum += p[k]; }
    float d = 0.0f;
    for (int k = 0; k < DFL_BINS; k++) { p[k] = p[k] / sum; d += (float)k * p[k]; }
    *lse = m + logf(sum);
    return d;
}

// One box of an image for the loss: pixels xyxy, class, valid (mask_gt); the layout of yolo.c's LossGt,
// so the host gathers with loss_gather_gts and uploads the array as it is.
typedef struct { float x1, y1, x2, y2; int cls, valid; } LossGtD;
// loss_cuda_scratch_bytes: the device scratch loss_cuda needs for B images of A anchors (all three
// levels) and at most M boxes per image, alignment slack included: 5.0 MB for B=16, A=8400, M=1024
// (nearly all of it (B, A) arrays).
static inline size_t loss_cuda_scratch_bytes(int B, int A, int M) {
    // the parts loss_cuda carves, each 256-byte aligned (it checks that it carves exactly this):
    // pbox (B,A,4) f32; owner, align, iou, score, cnt (B,A) 4 bytes each; max_align, max_iou (B,M)
    // 4 bytes each; block partial sums (nblk, 2) and (nblk, 3) doubles, nblk = ceil(B*A / 256); one
    // 256-byte record of the batch's normalisers; plus the slack to align an unaligned scratch
    size_t BA = (size_t)B * A, BM = (size_t)B * M, nblk = (BA + 255) / 256;
#define LOSS_PART_(n) (((size_t)(n) + 255) & ~(size_t)255)
    size_t n = 255 + LOSS_PART_(BA * 16) + 5 * LOSS_PART_(BA * 4) + 2 * LOSS_PART_(BM * 4) + LOSS_PART_(nblk * 16) +
               LOSS_PART_(nblk * 24) + 256;
#undef LOSS_PART_
    return n;
}
// loss_cuda: the YOLOv8 loss of a batch and its gradient, the twin of loss_forward_backward (yolo.c;
// same assignment, tie rules and float formulas; only the order of the double sums differs; CIoU's alpha
// is held constant as in training). head[l]: device FP32 maps (B, 64+NC, H_l, W_l), H_l = imgH/(8<<l),
// W_l = imgW/(8<<l), sizes multiples of 32. dhead[l]: same shape, fully overwritten with grad_scale *
// d(B*(box+cls+dfl))/d(head); dhead NULL (or any dhead[l] NULL): no gradient. gts: device (B, M), image
// b's boxes in its first m[b] rows (loss_gather_gts, capped at M); m: device (B). scratch: device,
// loss_cuda_scratch_bytes(B, A, M) bytes, any alignment. out: 5 device doubles, read after the stream
// synchronises: out[0] box, out[1] cls, out[2] dfl (after gains, before xB: LossOut.box/cls/dfl; the
// host forms total = B*(box+cls+dfl)), out[3] target_scores_sum (max(sum of scores, 1)), out[4] n_fg.
// Deterministic: the same inputs give the same bits on every run.
void loss_cuda(int B, int NC, int imgH, int imgW, const float *const head[3], float *const dhead[3], const LossGtD *gts,
               const int *m, int M, float box_gain, float cls_gain, float dfl_gain, float grad_scale, void *scratch,
               double *out, void *stream);

// Fused optimizer over the flat FP32 parameter array. group[i]: 0 bias, 1 weight, 2 BN gamma
// (yolo.c's PG_*), OPT_NO_GROUP for values outside every group (the frozen DFL weight: neither in
// the norm nor updated). Two kernels: optim_norm_cuda writes OPT_NORM_BLOCKS*2 partial results
// (sum of (g*inv_scale)^2, count of non-finite g) to partials; optim_step_cuda sums them in a fixed
// order (deterministic), writes the norm (inf when a gradient is inf/NaN) to norm_out[0] and, only
// when every gradient is finite, updates p, m, v with g*inv_scale*clip, clip = min(1, max_norm /
// (norm + 1e-6)) (max_norm <= 0: no clipping). Gradients are not modified. Host: a non-finite norm
// means the step was skipped (do not advance the step count). In the same pass (either may be NULL):
// w16[i] = p[i] rounded to FP16 (f32_to_f16_cuda's bits) for every i when the step is taken, and
// ema[i] = ema_d*ema[i] + (1-ema_d)*p[i] (ema_update_cuda's) on the parameters as the step leaves them,
// also when it is skipped if ema_skipped (AMP: Ultralytics updates the EMA after a skipped step).
#define OPT_NO_GROUP 255
#define OPT_NORM_BLOCKS 256
typedef struct {
    float lr[3];          // per group
    float wd[3];          // decay per group (SGD: added to the gradient; AdamW: p *= 1 - lr*wd)
    float adam_step[3];   // AdamW: (float)(lr / (1 - beta1^step)), computed in double
    float momentum;       // SGD momentum / AdamW beta1
    float beta2, eps;     // AdamW
    float bc2_sqrt;       // AdamW: (float)sqrt(1 - beta2^step)
    float inv_scale;      // 1 / loss scale
    float max_norm;       // gradient clipping (Ultralytics 10), <= 0 off
    int adamw;            // 0 SGD Nesterov, 1 AdamW
    int first;            // SGD: first step (momentum buffer = gradient)
} OptimHyper;
void optim_norm_cuda(const float *g, const uint8_t *group, long n, float inv_scale, float *partials, void *stream);
void optim_step_cuda(float *p, const float *g, float *m, float *v, const uint8_t *group, long n, const float *partials,
                     OptimHyper h, float *norm_out, uint16_t *w16, float *ema, float ema_d, int ema_skipped,
                     void *stream);

// GradScaler (torch.cuda.amp.GradScaler defaults): scale 65536, x2 after 2000 consecutive finite
// steps, x0.5 and skip the step on an inf/NaN gradient. Host-side; found_inf comes from the norm
// optim_step_cuda writes (not finite = found). grad_scaler_update returns 1 when the step was taken.
typedef struct { float scale; int growth_interval, good_steps; } GradScaler;
static inline void grad_scaler_init(GradScaler *s) {
    s->scale = 65536.0f;
    s->growth_interval = 2000;
    s->good_steps = 0;
}
static inline int grad_scaler_update(GradScaler *s, int found_inf) {
    if (found_inf) { s->scale *= 0.5f; s->good_steps = 0; return 0; }
    if (++s->good_steps >= s->growth_interval) { s->scale *= 2.0f; s->good_steps = 0; }
    return 1;
}

// YOLO_TWINS(X): every launcher above as X(launcher, twin, test): its CPU twin, a function of yolo.c
// (conv_forward / conv_backward: the convolution of the CPU step, im2col + gemm_cpu, col2im), or for a
// copy or add that the CPU step does inline, the plain loop named in test/kernels_test.c; and the test
// function of test/kernels_test.c that compares the two. kernels_test checks that every launcher
// declared here is listed, that each twin exists (it takes its address) and that each listed test
// compared its launcher.
#define YOLO_TWINS(X) \
    X(bn_silu_forward_cuda, bn_silu_forward_cpu, test_bn_silu) \
    X(upsample2_forward_cuda, upsample2_forward_cpu, test_upsample) \
    X(maxpool5_forward_cuda, maxpool5_forward_cpu, test_maxpool) \
    X(gemm_f16_cuda, gemm_cpu, test_gemm_f16) \
    X(conv_forward_cuda, conv_forward, test_conv) \
    X(conv_forward_stats_cuda, conv_forward, test_conv) \
    X(conv_forward_parts_cuda, conv_forward, test_conv_parts) \
    X(bn_stats_finish_cuda, bn_stats_cpu, test_conv) \
    X(conv_forward_f32_cuda, conv_forward, test_conv_f32) \
    X(conv_dgrad_cuda, conv_backward, test_conv) \
    X(conv_dgrad_bn_cuda, bn_silu_backward_cpu, test_dgrad_bn) \
    X(conv_dgrad_f32_cuda, conv_backward, test_conv_f32) \
    X(conv_wgrad_cuda, conv_backward, test_conv) \
    X(conv_wgrad_f32_cuda, conv_backward, test_conv_f32) \
    X(bn_stats_cuda, bn_stats_cpu, test_bn) \
    X(bn_stats_f32_cuda, bn_stats_cpu, test_bn_f32) \
    X(bn_silu_forward_f16_cuda, bn_silu_forward_cpu, test_bn) \
    X(bn_silu_forward_f32_cuda, bn_silu_forward_cpu, test_bn_f32) \
    X(bn_silu_sum_f16_cuda, bn_silu_forward_cpu, test_bn_silu_sum) \
    X(bn_silu_sum_f32_cuda, bn_silu_forward_cpu, test_bn_silu_sum) \
    X(bn_silu_backward_cuda, bn_silu_backward_cpu, test_bn_backward) \
    X(bn_silu_backward_h_cuda, bn_silu_backward_cpu, test_bn_backward) \
    X(bn_silu_backward_apply_h_cuda, bn_silu_backward_cpu, test_dgrad_bn) \
    X(bn_silu_backward_f32_cuda, bn_silu_backward_cpu, test_bn_backward_f32) \
    X(upsample2_backward_cuda, upsample2_backward, test_pool_up_backward) \
    X(maxpool5_backward_cuda, maxpool5_backward, test_pool_up_backward) \
    X(upsample2_backward_f16_cuda, upsample2_backward, test_pool_up_backward) \
    X(maxpool5_backward_f16_cuda, maxpool5_backward, test_pool_up_backward) \
    X(copy_f16_cuda, copy_strided_cpu, test_convert_copy) \
    X(copy_f32_cuda, copy_strided_cpu, test_views_f32) \
    X(u8_to_f16_cuda, input_from_batch, test_convert_copy) \
    X(u8_to_f32_cuda, input_from_batch, test_views_f32) \
    X(f32_to_f16_cuda, float_to_half, test_convert_copy) \
    X(conv_w_tapmajor_cuda, w_tapmajor_cpu, test_conv) \
    X(upsample2_forward_f16_cuda, upsample2_forward_cpu, test_views_f16) \
    X(upsample2_forward_f32_cuda, upsample2_forward_cpu, test_views_f32) \
    X(bn_silu_upsample2_f16_cuda, upsample2_forward_cpu, test_bn_silu_up) \
    X(bn_silu_upsample2_f32_cuda, upsample2_forward_cpu, test_bn_silu_up) \
    X(maxpool5_forward_f16_cuda, maxpool5_forward_cpu, test_views_f16) \
    X(maxpool5_forward_f32_cuda, maxpool5_forward_cpu, test_views_f32) \
    X(add_f16_cuda, add_strided_cpu, test_views_f16) \
    X(add_f32_cuda, add_strided_cpu, test_views_f16) \
    X(add_n_f16_cuda, add_strided_cpu, test_add_n) \
    X(add_n_f32_cuda, add_strided_cpu, test_add_n) \
    X(ema_update_cuda, ema_update, test_ema) \
    X(loss_cuda, loss_forward_backward, test_loss) \
    X(optim_norm_cuda, grad_clip_norm, test_optim) \
    X(optim_step_cuda, optim_step, test_optim)

#ifdef __cplusplus
}
#endif
