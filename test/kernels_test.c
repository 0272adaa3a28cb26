// kernels_test.c: every launcher of yolo_kernels.cu against its CPU twin in yolo.c. Built by
// test/emu.mk twice: against the CPU emulation of the .cu (make test-emu, run in three thread
// orders, strict mode and async mode by test/run_emu.sh) and against the nvcc build with the real
// cudart (make test-gpu). Not named test_*.c: the main Makefile would build it without kernels.
// Tolerances (../shared/spec/cuda-on-cpu.md): fp32 |got-ref| <= 1e-5 * sum|terms| + 1e-6;
// fp16 inputs <= 2e-3 * max(1, |ref|); data movement bit-exact.
#ifndef TESTING
#define TESTING
#endif
#include "../yolo.c"
#include "../yolo.h"
#include <cuda_runtime_api.h>
#include "test.h"

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) die("%s: %s", #x, cudaGetErrorString(e_)); } while (0)


// IEEE binary16 <-> float in software (round to nearest even), independent of any CUDA header.
static uint16_t f32_to_f16(float f) {
    uint32_t x; memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000, e = (x >> 23) & 0xff, m = x & 0x7fffff;
    if (e == 0xff) return (uint16_t)(sign | 0x7c00 | (m ? 0x200 : 0));
    int E = (int)e - 127 + 15;
    if (E >= 31) return (uint16_t)(sign | 0x7c00);
    if (E <= 0) {
        if (E < -10) return (uint16_t)sign;
        m |= 0x800000;
        int shift = 14 - E;
        uint32_t h = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (h & 1))) h++;
        return (uint16_t)(sign | h);
    }
    uint32_t h = ((uint32_t)E << 10) | (m >> 13), rem = m & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++;
    return (uint16_t)(sign | h);
}
static float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff, x;
    if (e == 0) { float f = ldexpf((float)m, -24); return sign ? -f : f; }
    if (e == 31) x = sign | 0x7f800000 | (m << 13);
    else x = sign | ((e - 15 + 127) << 23) | (m << 13);
    float f; memcpy(&f, &x, 4); return f;
}

static Rng rng;
static float *rand_host(long n, float lo, float hi) {
    float *p = xmalloc(sizeof(float) * (n ? n : 1));
    for (long i = 0; i < n; i++) p[i] = (float)rng_range(&rng, lo, hi);
    return p;
}
static float *to_dev(const void *h, size_t bytes) {
    void *d; CK(cudaMalloc(&d, bytes ? bytes : 1));
    if (bytes) CK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    return d;
}
static float *from_dev(const void *d, size_t bytes) {
    float *h = xmalloc(bytes ? bytes : 1);
    if (bytes) CK(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost));
    return h;
}

static void test_bn_silu(int B, int C, int HW, void *stream) {
    long n = (long)B * C * HW;
    float *z = rand_host(n, -4, 4), *mean = rand_host(C, -1, 1), *invstd = rand_host(C, 0.2f, 3), *gamma = rand_host(C, -2, 2),
          *beta = rand_host(C, -1, 1), *ref = xmalloc(sizeof(float) * n);
    float *dz = to_dev(z, 4 * n), *dm = to_dev(mean, 4 * C), *di = to_dev(invstd, 4 * C), *dg = to_dev(gamma, 4 * C), *db = to_dev(beta, 4 * C), *dy;
    CK(cudaMalloc((void **)&dy, 4 * n));
    bn_silu_forward_cuda(dz, dm, di, dg, db, dy, B, C, HW, stream);
    float *got = from_dev(dy, 4 * n);
    bn_silu_forward_cpu(z, mean, invstd, gamma, beta, ref, B, C, HW);
    double worst = 0, worst_tol = 0; int bad = 0;
    for (long i = 0; i < n; i++) {
        int c = (int)((i / HW) % C);
        // terms of the affine pre-activation (contracted to fma on a GPU) set the scale
        double tol = 1e-5 * (fabs(gamma[c] * (z[i] - mean[c]) * invstd[c]) + fabs(beta[c]) + fabs(ref[i])) + 1e-6, d = fabs(got[i] - ref[i]);
        if (!(d <= tol)) bad++;
        if (!(d <= worst)) { worst = d; worst_tol = tol; }
    }
    check(!bad, "bn_silu_forward_cuda B=%d C=%d HW=%d vs _cpu: worst |diff| %.3g (tol there %.3g = 1e-5*sum|terms|+1e-6), %d over", B, C, HW, worst, worst_tol, bad);
    cudaFree(dz); cudaFree(dm); cudaFree(di); cudaFree(dg); cudaFree(db); cudaFree(dy);
    free(z); free(mean); free(invstd); free(gamma); free(beta); free(ref); free(got);
}

// data movement: bit-exact comparison, NaN payloads included
static void check_bits(const char *what, const float *got, const float *ref, long n) {
    long bad = 0, first = -1;
    for (long i = 0; i < n; i++) if (memcmp(&got[i], &ref[i], 4)) { bad++; if (first < 0) first = i; }
    check(!bad, "%s: bit-exact over %ld values, %ld differ (first at %ld)", what, n, bad, first);
}
static void test_upsample(int B, int C, int H, int W, void *stream) {
    long n = (long)B * C * H * W;
    float *x = rand_host(n, -3, 3), *ref = xmalloc(sizeof(float) * 4 * n), *dx = to_dev(x, 4 * n), *dy;
    CK(cudaMalloc((void **)&dy, 16 * n));
    upsample2_forward_cuda(dx, dy, B, C, H, W, stream);
    float *got = from_dev(dy, 16 * n);
    upsample2_forward_cpu(x, ref, B, C, H, W);
    char what[128]; snprintf(what, sizeof what, "upsample2_forward_cuda B=%d C=%d H=%d W=%d vs _cpu", B, C, H, W);
    check_bits(what, got, ref, 4 * n);
    cudaFree(dx); cudaFree(dy); free(x); free(ref); free(got);
}
static void test_maxpool(int B, int C, int H, int W, void *stream) {
    long n = (long)B * C * H * W;
    float *x = rand_host(n, -3, 3), *ref = xmalloc(sizeof(float) * n), *dx = to_dev(x, 4 * n), *dy;
    CK(cudaMalloc((void **)&dy, 4 * n));
    maxpool5_forward_cuda(dx, dy, B, C, H, W, stream);
    float *got = from_dev(dy, 4 * n);
    maxpool5_forward_cpu(x, ref, B, C, H, W);
    char what[128]; snprintf(what, sizeof what, "maxpool5_forward_cuda B=%d C=%d H=%d W=%d vs _cpu", B, C, H, W);
    check_bits(what, got, ref, n);
    cudaFree(dx); cudaFree(dy); free(x); free(ref); free(got);
}
static void test_gemm_f16(int M, int N, int K, void *stream) {
    uint16_t *a = xmalloc(2 * (size_t)M * K + 2), *b = xmalloc(2 * (size_t)K * N + 2);
    float *af = xmalloc(4 * (size_t)M * K + 4), *bf = xmalloc(4 * (size_t)K * N + 4), *ref = xmalloc(4 * (size_t)M * N);
    for (long i = 0; i < (long)M * K; i++) { a[i] = f32_to_f16((float)rng_range(&rng, -1, 1)); af[i] = f16_to_f32(a[i]); }
    for (long i = 0; i < (long)K * N; i++) { b[i] = f32_to_f16((float)rng_range(&rng, -1, 1)); bf[i] = f16_to_f32(b[i]); }
    void *da = to_dev(a, 2 * (size_t)M * K), *db = to_dev(b, 2 * (size_t)K * N);
    float *dc; CK(cudaMalloc((void **)&dc, 4 * (size_t)M * N));
    gemm_f16_cuda(M, N, K, da, db, dc, stream);
    float *got = from_dev(dc, 4 * (size_t)M * N);
    gemm_cpu(0, 0, M, N, K, af, K, bf, N, 0.0f, ref, N);
    double worst = 0; long bad = 0;
    for (long i = 0; i < (long)M * N; i++) {
        double d = fabs(got[i] - ref[i]), tol = 2e-3 * fmax(1.0, fabs(ref[i]));
        if (!(d <= tol)) bad++;
        if (!(d <= worst)) worst = d;
    }
    check(!bad, "gemm_f16_cuda M=%d N=%d K=%d vs gemm_cpu on fp16-rounded inputs: worst |diff| %.3g, tol 2e-3*max(1,|ref|), %ld over", M, N, K, worst, bad);
    cudaFree(da); cudaFree(db); cudaFree(dc); free(a); free(b); free(af); free(bf); free(ref); free(got);
}

// ---- training step kernels ----

// fp16-input comparison: |got - ref| <= 2e-3 * max(1, |ref|); names the worst element
static void check_f16tol(const char *what, const float *got, const float *ref, long n) {
    double worst = 0; long bad = 0, wi = 0;
    for (long i = 0; i < n; i++) {
        double d = fabs((double)got[i] - ref[i]);
        if (!(d <= 2e-3 * fmax(1.0, fabs(ref[i])))) bad++;
        if (!(d <= worst)) { worst = d; wi = i; }
    }
    check(!bad, "%s: worst |diff| %.3g at %ld (got %g ref %g), tol 2e-3*max(1,|ref|), %ld of %ld over", what, worst, wi, got[wi], ref[wi], bad, n);
}
static uint16_t *rand_f16(long n, float lo, float hi, float *rounded) {
    uint16_t *h = xmalloc(2 * (size_t)(n ? n : 1));
    for (long i = 0; i < n; i++) { h[i] = f32_to_f16((float)rng_range(&rng, lo, hi)); if (rounded) rounded[i] = f16_to_f32(h[i]); }
    return h;
}
static float *f16_host_to_f32(const uint16_t *h, long n) {
    float *f = xmalloc(4 * (size_t)(n ? n : 1));
    for (long i = 0; i < n; i++) f[i] = f16_to_f32(h[i]);
    return f;
}

// conv forward, dgrad and wgrad against im2col/col2im + gemm_cpu on the same fp16-rounded values.
// xextra/zextra: channels of padding between images (x, z as slices of larger buffers), filled with
// NaN so that a read outside the slice shows.
static void test_conv(int B, int Cin, int H, int W, int Cout, int K, int S, int xextra, int zextra, void *stream) {
    int p = K / 2, Ho = (H + 2 * p - K) / S + 1, Wo = (W + 2 * p - K) / S + 1, KK = K * K, HW = H * W, HWo = Ho * Wo;
    long xs = (long)(Cin + xextra) * HW, zs = (long)(Cout + zextra) * HWo, nx = B * xs, nz = B * zs, nw = (long)Cout * Cin * KK;
    ConvDims d = {B, Cin, H, W, Cout, K, S, xextra ? xs : 0, zextra ? zs : 0};
    float *xf = xmalloc(4 * nx), *wf = xmalloc(4 * nw), *dzf = xmalloc(4 * nz), *bias = rand_host(Cout, -1, 1);
    uint16_t *xh = rand_f16(nx, -1, 1, xf), *wh = rand_f16(nw, -1, 1, wf), *dzh = rand_f16(nz, -1, 1, dzf);
    for (int b = 0; b < B; b++) {   // padding channels: NaN
        for (long i = (long)Cin * HW; i < xs; i++) xh[b * xs + i] = 0x7e00;
        for (long i = (long)Cout * HWo; i < zs; i++) dzh[b * zs + i] = 0x7e00;
    }
    float *col = xmalloc(4 * (size_t)KK * Cin * (HWo > HW ? HWo : HW) + 4 * (size_t)Cout * HW * KK);
    float *zref = xmalloc(4 * nz), *dxref = rand_host(nx, -1, 1), *dx0 = xmalloc(4 * nx), *dwref = rand_host(nw, -1, 1), *dw0 = xmalloc(4 * nw);
    memcpy(dx0, dxref, 4 * nx); memcpy(dw0, dwref, 4 * nw);
    float *dcol = xmalloc(4 * (size_t)Cin * KK * HWo), *dxi = xmalloc(4 * (size_t)Cin * HW);
    for (int b = 0; b < B; b++) {
        im2col(xf + b * xs, Cin, H, W, K, S, col);
        gemm_cpu(0, 0, Cout, HWo, Cin * KK, wf, Cin * KK, col, HWo, 0.f, zref + b * zs, HWo);
        for (int o = 0; o < Cout; o++) for (int i = 0; i < HWo; i++) zref[b * zs + (long)o * HWo + i] += bias[o];
        gemm_cpu(0, 1, Cout, Cin * KK, HWo, dzf + b * zs, HWo, col, HWo, 1.f, dwref, Cin * KK);
        gemm_cpu(1, 0, Cin * KK, HWo, Cout, wf, Cin * KK, dzf + b * zs, HWo, 0.f, dcol, HWo);
        col2im(dcol, Cin, H, W, K, S, dxi);
        for (long i = 0; i < (long)Cin * HW; i++) dxref[b * xs + i] += dxi[i];
    }
    void *dxh_ = to_dev(xh, 2 * nx), *dwh = to_dev(wh, 2 * nw), *ddz = to_dev(dzh, 2 * nz);
    float *dbias = to_dev(bias, 4 * Cout), *dz32, *ddx = to_dev(dx0, 4 * nx), *ddw = to_dev(dw0, 4 * nw);
    uint16_t *dz16, *ddx16;
    CK(cudaMalloc((void **)&dz32, 4 * nz)); CK(cudaMalloc((void **)&dz16, 2 * nz)); CK(cudaMalloc((void **)&ddx16, 2 * nx));
    conv_forward_cuda(d, dxh_, dwh, dbias, dz32, dz16, stream);
    conv_dgrad_cuda(d, ddz, dwh, ddx, NULL, 1, stream);
    conv_dgrad_cuda(d, ddz, dwh, NULL, ddx16, 0, stream);
    conv_wgrad_cuda(d, ddz, dxh_, ddw, 1, stream);
    float *z = from_dev(dz32, 4 * nz), *dx = from_dev(ddx, 4 * nx), *dw = from_dev(ddw, 4 * nw);
    uint16_t *zh = (uint16_t *)from_dev(dz16, 2 * nz), *dxh = (uint16_t *)from_dev(ddx16, 2 * nx);
    float *zhf = f16_host_to_f32(zh, nz), *dxhf = f16_host_to_f32(dxh, nx);
    // compare the slices only; outside them the outputs must be untouched
    long bad_out = 0;
    for (int b = 0; b < B; b++) {
        for (long i = (long)Cout * HWo; i < zs; i++) { bad_out += !isnan(zhf[b * zs + i]) || !isnan(z[b * zs + i]); zref[b * zs + i] = z[b * zs + i] = zhf[b * zs + i] = 0; }
        for (long i = (long)Cin * HW; i < xs; i++) { bad_out += memcmp(&dx[b * xs + i], &dx0[b * xs + i], 4) != 0; dxhf[b * xs + i] = dxref[b * xs + i]; }
    }
    char what[200];
    snprintf(what, sizeof what, "conv_forward_cuda B=%d Cin=%d %dx%d Cout=%d K=%d S=%d xs+%d zs+%d, FP32 z + bias vs im2col+gemm_cpu", B, Cin, H, W, Cout, K, S, xextra, zextra);
    check_f16tol(what, z, zref, nz);
    snprintf(what, sizeof what, "conv_forward_cuda B=%d Cin=%d %dx%d Cout=%d K=%d S=%d, FP16 z", B, Cin, H, W, Cout, K, S);
    check_f16tol(what, zhf, zref, nz);
    snprintf(what, sizeof what, "conv_dgrad_cuda B=%d Cin=%d %dx%d Cout=%d K=%d S=%d, FP32 accumulate vs gemm_cpu^T+col2im", B, Cin, H, W, Cout, K, S);
    check_f16tol(what, dx, dxref, nx);
    for (long i = 0; i < nx; i++) dxref[i] -= dx0[i];
    for (int b = 0; b < B; b++) for (long i = (long)Cin * HW; i < xs; i++) dxhf[b * xs + i] = dxref[b * xs + i];
    snprintf(what, sizeof what, "conv_dgrad_cuda B=%d Cin=%d %dx%d Cout=%d K=%d S=%d, FP16 overwrite", B, Cin, H, W, Cout, K, S);
    check_f16tol(what, dxhf, dxref, nx);
    snprintf(what, sizeof what, "conv_wgrad_cuda B=%d Cin=%d %dx%d Cout=%d K=%d S=%d, FP32 accumulate vs gemm_cpu(dz, col^T)", B, Cin, H, W, Cout, K, S);
    check_f16tol(what, dw, dwref, nw);
    check(!bad_out, "conv B=%d Cin=%d Cout=%d K=%d S=%d: nothing written outside the channel slices (%ld values touched)", B, Cin, Cout, K, S, bad_out);
    // wgrad overwrite
    conv_wgrad_cuda(d, ddz, dxh_, ddw, 0, stream);
    free(dw); dw = from_dev(ddw, 4 * nw);
    for (long i = 0; i < nw; i++) dwref[i] -= dw0[i];
    snprintf(what, sizeof what, "conv_wgrad_cuda B=%d Cin=%d Cout=%d K=%d S=%d, overwrite", B, Cin, Cout, K, S);
    check_f16tol(what, dw, dwref, nw);
    cudaFree(dxh_); cudaFree(dwh); cudaFree(ddz); cudaFree(dbias); cudaFree(dz32); cudaFree(ddx); cudaFree(ddw); cudaFree(dz16); cudaFree(ddx16);
    free(xf); free(wf); free(dzf); free(bias); free(xh); free(wh); free(dzh); free(col); free(zref); free(dxref); free(dx0); free(dwref); free(dw0);
    free(dcol); free(dxi); free(z); free(dx); free(dw); free(zh); free(dxh); free(zhf); free(dxhf);
}

int main(void) {
    rng_seed(&rng, 6);
    // software fp16 conversion against known encodings (the reference must be right on its own)
    check(f32_to_f16(1.0f) == 0x3c00 && f32_to_f16(-2.0f) == 0xc000 && f32_to_f16(65504.0f) == 0x7bff && f32_to_f16(1e6f) == 0x7c00 &&
          f32_to_f16(5.9604645e-8f) == 0x0001 && f32_to_f16(1.0f + 1.0f / 2048) == 0x3c00 && f32_to_f16(1.0f + 3.0f / 2048) == 0x3c02 &&
          f16_to_f32(0x3555) == 0.333251953125f && f16_to_f32(0x0001) == 5.9604645e-8f,
          "software fp16 conversion: 8 known encodings incl. ties-to-even, subnormal, overflow");
    cudaStream_t s; CK(cudaStreamCreate(&s));
    test_bn_silu(2, 3, 37, NULL);
    test_bn_silu(2, 16, 400, s);
    test_upsample(2, 3, 5, 7, NULL);
    test_upsample(1, 4, 20, 20, s);
    test_maxpool(2, 3, 19, 35, NULL);
    test_maxpool(1, 2, 1, 1, s);
    test_maxpool(1, 3, 16, 16, s);
    test_gemm_f16(37, 45, 29, NULL);
    test_gemm_f16(64, 64, 64, s);
    test_gemm_f16(1, 1, 1, s);
    test_gemm_f16(16, 33, 50, NULL);
    test_conv(2, 5, 9, 7, 7, 3, 1, 0, 0, NULL);
    test_conv(1, 3, 10, 9, 70, 3, 2, 2, 1, s);
    test_conv(2, 20, 6, 6, 9, 1, 1, 1, 3, s);
    test_conv(1, 6, 7, 5, 4, 1, 2, 0, 0, NULL);
    test_conv(1, 1, 1, 1, 1, 3, 2, 0, 0, s);
    CK(cudaStreamSynchronize(s));
    CK(cudaStreamDestroy(s));
    return test_summary();
}
