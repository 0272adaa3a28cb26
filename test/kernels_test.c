// kernels_test.c: every launcher of yolo_kernels.cu against its CPU twin in yolo.c. Built by
// test/emu.mk twice: against the CPU emulation of the .cu (make test-emu, run in three thread
// orders, strict mode and async mode by test/run_emu.sh) and against the nvcc build with the real
// cudart (make test-gpu). Not named test_*.c: the main Makefile would build it without kernels.
// Tolerances (they hold in the emulation and on a GPU alike, whose FMA contraction and summation order
// differ from the CPU's): fp32 |got-ref| <= 1e-5 * sum|terms| + 1e-6 per dot product; fp16 inputs
// <= 2e-3 * max(1, |ref|); integer and data-movement kernels bit-exact.
#ifndef TESTING
#define TESTING
#endif
#define YOLO_CUDA   // the GPU section of yolo.c too (gpu_optim_hyper)
#include "../yolo.c"
#include "../yolo.h"
#include <cuda_runtime_api.h>
#include "test.h"

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) die("%s: %s", #x, cudaGetErrorString(e_)); } while (0)


// fp16 on the host: yolo.c's float_to_half / half_to_float (software, round to nearest even), the CPU
// twins of f32_to_f16_cuda.

// copy_strided_cpu / add_strided_cpu: the copies and adds that the CPU step does inline (concat slices in
// value_materialize, gradient sums in value_backprop), written as the device does them: B blocks of n
// values, block b from src + b*ss copied to (or added onto) dst + b*ds.
static void copy_strided_cpu(const float *src, long ss, float *dst, long ds, int B, long n) {
    for (int b = 0; b < B; b++) memcpy(dst + b * ds, src + b * ss, 4 * (size_t)n);
}
static void add_strided_cpu(const float *src, long ss, float *dst, long ds, int B, long n) {
    for (int b = 0; b < B; b++)
        for (long i = 0; i < n; i++) dst[b * ds + i] += src[b * ss + i];
}

// w_tapmajor_cpu: wt (cout, 9, cin) = w (cout, cin, 3, 3), the twin of conv_w_tapmajor_cuda
static void w_tapmajor_cpu(const uint16_t *w, uint16_t *wt, int cout, int cin) {
    for (int c = 0; c < cout; c++)
        for (int t = 0; t < 9; t++)
            for (int m = 0; m < cin; m++) wt[((long)c * 9 + t) * cin + m] = w[((long)c * cin + m) * 9 + t];
}

// the launchers each test compared with their CPU twins (YOLO_TWINS in yolo.h): twin_compared(launcher)
// right after the checks records the launcher and the test function it ran in
static struct { const char *launcher, *test; } twin_seen[256];
static int twin_nseen;
#define twin_compared(launcher) twin_mark(#launcher, __func__, (void (*)(void))launcher)
static void twin_mark(const char *launcher, const char *test, void (*fn)(void)) {
    (void)fn;   // the launcher must exist
    for (int i = 0; i < twin_nseen; i++)
        if (!strcmp(twin_seen[i].launcher, launcher) && !strcmp(twin_seen[i].test, test)) return;
    if (twin_nseen == 256) die("twin_mark: more than 256 (launcher, test) pairs");
    twin_seen[twin_nseen].launcher = launcher;
    twin_seen[twin_nseen++].test = test;
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

static float *poisoned_dev(long n);
static void check_rel(const char *what, const float *got, const float *ref, const float *scale, long n, double rel);
static void check_bn_stats(const char *what, const float *z, long zs, int B, int C, int HW, const float *gm,
                           const float *gi, const float *grm, const float *grv, const float *mean, const float *invstd,
                           const float *rm, const float *rv, const float *rm0, const float *rv0);

static void test_bn_silu(int B, int C, int HW, void *stream) {
    long n = (long)B * C * HW;
    float *z = rand_host(n, -4, 4), *mean = rand_host(C, -1, 1), *invstd = rand_host(C, 0.2f, 3),
          *gamma = rand_host(C, -2, 2), *beta = rand_host(C, -1, 1), *ref = xmalloc(sizeof(float) * n);
    float *dz = to_dev(z, 4 * n), *dm = to_dev(mean, 4 * C), *di = to_dev(invstd, 4 * C), *dg = to_dev(gamma, 4 * C),
          *db = to_dev(beta, 4 * C), *dy;
    CK(cudaMalloc((void **)&dy, 4 * n));
    bn_silu_forward_cuda(dz, dm, di, dg, db, dy, B, C, HW, stream);
    float *got = from_dev(dy, 4 * n);
    bn_silu_forward_cpu(z, mean, invstd, gamma, beta, ref, B, C, HW);
    double worst = 0, worst_tol = 0; int bad = 0;
    for (long i = 0; i < n; i++) {
        int c = (int)((i / HW) % C);
        // terms of the affine pre-activation (contracted to fma on a GPU) set the scale
        double tol = 1e-5 * (fabs(gamma[c] * (z[i] - mean[c]) * invstd[c]) + fabs(beta[c]) + fabs(ref[i])) + 1e-6,
               d = fabs(got[i] - ref[i]);
        if (!(d <= tol)) bad++;
        if (!(d <= worst)) { worst = d; worst_tol = tol; }
    }
    check(!bad,
          "bn_silu_forward_cuda B=%d C=%d HW=%d vs _cpu: worst |diff| %.3g (tol there %.3g = 1e-5*sum|terms|+1e-6), %d "
          "over",
          B, C, HW, worst, worst_tol, bad);
    cudaFree(dz); cudaFree(dm); cudaFree(di); cudaFree(dg); cudaFree(db); cudaFree(dy);
    free(z); free(mean); free(invstd); free(gamma); free(beta); free(ref); free(got);
    twin_compared(bn_silu_forward_cuda);
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
    twin_compared(upsample2_forward_cuda);
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
    twin_compared(maxpool5_forward_cuda);
}
static void test_gemm_f16(int M, int N, int K, void *stream) {
    uint16_t *a = xmalloc(2 * (size_t)M * K + 2), *b = xmalloc(2 * (size_t)K * N + 2);
    float *af = xmalloc(4 * (size_t)M * K + 4), *bf = xmalloc(4 * (size_t)K * N + 4), *ref = xmalloc(4 * (size_t)M * N);
    for (long i = 0; i < (long)M * K; i++) a[i] = float_to_half((float)rng_range(&rng, -1, 1));
    for (long i = 0; i < (long)K * N; i++) b[i] = float_to_half((float)rng_range(&rng, -1, 1));
    for (long i = 0; i < (long)M * K; i++) af[i] = half_to_float(a[i]);
    for (long i = 0; i < (long)K * N; i++) bf[i] = half_to_float(b[i]);
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
    check(!bad,
          "gemm_f16_cuda M=%d N=%d K=%d vs gemm_cpu on fp16-rounded inputs: worst |diff| %.3g, tol 2e-3*max(1,|ref|), "
          "%ld over",
          M, N, K, worst, bad);
    cudaFree(da); cudaFree(db); cudaFree(dc); free(a); free(b); free(af); free(bf); free(ref); free(got);
    twin_compared(gemm_f16_cuda);
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
    check(!bad, "%s: worst |diff| %.3g at %ld (got %g ref %g), tol 2e-3*max(1,|ref|), %ld of %ld over", what, worst, wi,
          got[wi], ref[wi], bad, n);
}
static uint16_t *rand_f16(long n, float lo, float hi, float *rounded) {
    uint16_t *h = xmalloc(2 * (size_t)(n ? n : 1));
    for (long i = 0; i < n; i++) {
        h[i] = float_to_half((float)rng_range(&rng, lo, hi));
        if (rounded) rounded[i] = half_to_float(h[i]);
    }
    return h;
}
static float *f16_host_to_f32(const uint16_t *h, long n) {
    float *f = xmalloc(4 * (size_t)(n ? n : 1));
    for (long i = 0; i < n; i++) f[i] = half_to_float(h[i]);
    return f;
}

// conv forward, dgrad and wgrad against im2col/col2im + gemm_cpu on the same fp16-rounded values.
// xextra/zextra: channels of padding between images (x, z as slices of larger buffers), filled with
// NaN so that a read outside the slice shows.
// test_stem_u8_bits: the stem's kernel reads the uint8 batch as the bits u8_to_f16_cuda stores (the
// software fp16 of v * (1/255), which test_convert_copy checks it against): with the weights a one-hot
// tap (output channel co takes input channel co % 3, weight 1, at the centre tap for co < 8, whose
// input columns 2 ox are even, else at kx 2, columns 2 ox + 1, odd: the kernel converts the bytes of a
// pair into the two halves of a half2, and each half is checked), z is the input at those pixels,
// exactly (one product by 1, the others by 0, summed in FP32, stored in FP16). The input holds every
// byte value in the even columns read and in the odd ones.
static void test_stem_u8_bits(void *stream) {
    const int B = 1, H = 64, W = 64, Co = 16, Ho = 32, Wo = 32;
    long nx = 3L * H * W, nz = (long)Co * Ho * Wo, nw = Co * 27L;
    uint8_t *xu = xmalloc((size_t)nx);
    for (int c = 0; c < 3; c++)
        for (int y = 0; y < H; y++)
            for (int x = 0; x < W; x++) xu[((long)c * H + y) * W + x] = (uint8_t)((y * 131 + x * 7 + c * 59) % 256);
    uint16_t *wh = xmalloc(2 * (size_t)nw);
    for (long i = 0; i < nw; i++) wh[i] = float_to_half(0.f);
    for (int co = 0; co < Co; co++) wh[co * 27 + (co % 3) * 9 + (co < Co / 2 ? 4 : 5)] = float_to_half(1.f);
    void *dxu = to_dev(xu, nx), *dwh = to_dev(wh, 2 * nw);
    uint16_t *dz;
    CK(cudaMalloc((void **)&dz, 2 * nz));
    ConvDims d = {B, 3, H, W, Co, 3, 2, 0, 0, 0, 1};
    conv_forward_cuda(d, dxu, NULL, dwh, NULL, NULL, NULL, dz, stream);
    uint16_t *z = (uint16_t *)from_dev(dz, 2 * nz);
    long bad = 0, seen[2][256] = {{0}}, nseen[2] = {0, 0};
    for (int co = 0; co < Co; co++)
        for (int oy = 0; oy < Ho; oy++)
            for (int ox = 0; ox < Wo; ox++) {
                const int odd = co >= Co / 2;   // (the input column 2 ox + odd)
                const uint8_t v = xu[((long)(co % 3) * H + 2 * oy) * W + 2 * ox + odd];
                nseen[odd] += !seen[odd][v]++;
                bad += z[((long)co * Ho + oy) * Wo + ox] != float_to_half(v * (1.f / 255.f));
            }
    check(!bad && nseen[0] == 256 && nseen[1] == 256,
          "conv_forward_cuda, the stem from a uint8 batch, one-hot taps: z the bits of fp16(v * (1/255)) at the "
          "even and odd input columns, all 256 byte values in each (%ld, %ld seen), %ld differ", nseen[0], nseen[1],
          bad);
    cudaFree(dxu); cudaFree(dwh); cudaFree(dz);
    free(xu); free(wh); free(z);
}
// test_conv_no_dgrad: test_conv leaves the input gradient out (the stem's shapes: a step never asks for
// the image's gradient, and the 3-channel input gradient's gather kernel, slow under the emulation, is
// checked on the two stem-like shapes that come before them). test_conv_x8: x is a uint8 image batch
// (v / 255 as FP16, what u8_to_f16_cuda stores), and the calls the stem's kernels serve (the forward
// into FP16 z, with and without its statistics, and the weight gradient) read it as uploaded
// (ConvDims.x8); the FP32 z and the gather kernel's forward read its FP16 copy.
// bn_backward_compare: a BN+SiLU backward's results on the device (dz FP16 in ddz, dgamma and dbeta in ddg,
// ddb) against bn_silu_backward_cpu's of the same z, dA (host FP32, the values the device read), statistics
// and parameters (gamma NULL: a plain conv's bias), dgam and dbet as they were before (the sums are added
// to them); dz's values outside the slices (image stride zs) must still be 0xffff: the count of those that
// are is returned. Tolerances: dz as any FP16 tensor, dbeta and dgamma 1e-5 of the sums of |gy| and |gy
// xhat|. who: the call's name and shape in the checks' lines
static long bn_backward_compare(const char *who, const float *zf, const float *dA, long zs, int B, int C, int HW,
                                const float *mean, const float *invstd, const float *gamma, const float *beta,
                                float *dgam, float *dbet, int train, const void *ddz, const float *ddg,
                                const float *ddb) {
    const long nz = B * zs;
    // scales of the sums: sum |gy| and sum |gy * xhat| (the CPU pass leaves gy in place first)
    float *sg = xmalloc(4 * C), *sgx = xmalloc(4 * C), *ref = xmalloc(4 * nz);
    memcpy(ref, dA, 4 * nz);
    for (int c = 0; c < C; c++) {
        double a = fabs(dbet[c]), ax = fabs(dgam[c]);
        for (int b = 0; b < B; b++) for (int i = 0; i < HW; i++) {
            long o = b * zs + (long)c * HW + i;
            float xh = (zf[o] - mean[c]) * invstd[c], y = gamma ? gamma[c] * xh + beta[c] : 0.f,
                  s1 = 1.f / (1.f + expf(-y));
            float gy = gamma ? dA[o] * s1 * (1.f + y * (1.f - s1)) : dA[o];
            a += fabs(gy); ax += fabs(gy * xh);
        }
        sg[c] = (float)a; sgx[c] = (float)ax;
    }
    bn_silu_backward_cpu(zf, ref, zs, mean, invstd, gamma, beta, dgam, dbet, B, C, HW, train);
    float *gdg = from_dev(ddg, 4 * C), *gdb = from_dev(ddb, 4 * C);
    uint16_t *gz = (uint16_t *)from_dev(ddz, 2 * nz);
    float *gzf = f16_host_to_f32(gz, nz);
    long untouched = 0;
    for (int b = 0; b < B; b++)
        for (long i = (long)C * HW; i < zs; i++) {
            untouched += gz[b * zs + i] == 0xffff;
            gzf[b * zs + i] = ref[b * zs + i] = 0;
        }
    char what[300];
    snprintf(what, sizeof what, "%s: dz (FP16) vs conv_backward's (bn_silu_backward_cpu)", who);
    check_f16tol(what, gzf, ref, nz);
    snprintf(what, sizeof what, "%s: dbeta (+=)", who);
    check_rel(what, gdb, dbet, sg, C, 1e-5);
    if (gamma) {
        snprintf(what, sizeof what, "%s: dgamma (+=)", who);
        check_rel(what, gdg, dgam, sgx, C, 1e-5);
    }
    free(sg); free(sgx); free(ref); free(gdg); free(gdb); free(gz); free(gzf);
    return untouched;
}
// test_dgrad_bn: the input gradient of d (FP16, written) with the BN backward's sums of the conv whose dA
// it is (conv_dgrad_bn_cuda: random z, statistics and BN parameters), then that backward's second pass
// from them (bn_silu_backward_apply_h_cuda): dA the bits of the plain call's (dxh, host), outside the
// slices untouched; dz, dgamma and dbeta as bn_silu_backward_cpu makes them of that dA. The sums' slots
// start NaN (one a kernel left unwritten would show). Returns K (0: the kernel taken has no sums)
static long test_dgrad_bn(ConvDims d, const void *ddz, const void *dwh, const uint16_t *dwt, const uint16_t *dxh,
                          void *stream) {
    const int B = d.B, C = d.Cin, HW = d.H * d.W;
    const long xs = d.xs ? d.xs : (long)C * HW, nx = B * xs, kmax = conv_dgrad_bn_tiles(d);
    float *zf = xmalloc(4 * nx), *mean = rand_host(C, -0.5f, 0.5f), *invstd = rand_host(C, 0.5f, 2),
          *gamma = rand_host(C, 0.5f, 2), *beta = rand_host(C, -1, 1), *dgam = rand_host(C, -1, 1),
          *dbet = rand_host(C, -1, 1), *dA = f16_host_to_f32(dxh, nx);
    uint16_t *zh = rand_f16(nx, -3, 3, zf);
    for (int b = 0; b < B; b++) for (long i = (long)C * HW; i < xs; i++) zh[b * xs + i] = 0x7e00;   // NaN
    float *dm = to_dev(mean, 4 * C), *di = to_dev(invstd, 4 * C), *dg = to_dev(gamma, 4 * C), *db = to_dev(beta, 4 * C),
          *ddg = to_dev(dgam, 4 * C), *ddb = to_dev(dbet, 4 * C), *part = poisoned_dev(2 * C * (kmax + 1));
    void *dzz = to_dev(zh, 2 * nx);
    uint16_t *ddA;
    CK(cudaMalloc((void **)&ddA, 2 * nx));
    CK(cudaMemset(ddA, 0xff, 2 * nx));
    ConvAct bn = {dm, di, dg, db};
    long K = conv_dgrad_bn_cuda(d, ddz, dwh, dwt, ddA, dzz, &bn, part, kmax, stream);
    uint16_t *gA = (uint16_t *)from_dev(ddA, 2 * nx);
    long bad = 0, outside = 0;
    for (int b = 0; b < B; b++)
        for (long i = 0; i < xs; i++) {
            if (i < (long)C * HW) bad += gA[b * xs + i] != dxh[b * xs + i];
            else outside += gA[b * xs + i] != 0xffff;
        }
    check(!bad && !outside && K >= 0 && K <= kmax,
          "conv_dgrad_bn_cuda B=%d Cin=%d %dx%d Cout=%d K=%d S=%d xs %ld: dA the bits of conv_dgrad_cuda's (%ld "
          "differ), %ld values outside the slice written; %ld sums a channel (at most %ld)",
          B, C, d.H, d.W, d.Cout, d.K, d.S, xs, bad, outside, K, kmax);
    if (K > 0) {   // the second pass from the sums, in place, as the step runs it
        bn_silu_backward_apply_h_cuda(dzz, ddA, xs, dm, di, dg, db, ddg, ddb, ddA, part, K, B, C, HW, 1, stream);
        char who[200];
        snprintf(who, sizeof who, "bn_silu_backward_apply_h_cuda after conv_dgrad_bn_cuda B=%d C=%d %dx%d K=%d S=%d "
                 "(%ld tiles)", B, C, d.H, d.W, d.K, d.S, K);
        long untouched = bn_backward_compare(who, zf, dA, xs, B, C, HW, mean, invstd, gamma, beta, dgam, dbet, 1, ddA,
                                             ddg, ddb);
        check(untouched == (long)B * (xs - (long)C * HW), "bn_silu_backward_apply_h_cuda: values outside the slice "
              "untouched");
        twin_compared(conv_dgrad_bn_cuda);
        twin_compared(bn_silu_backward_apply_h_cuda);
    }
    cudaFree(dm); cudaFree(di); cudaFree(dg); cudaFree(db); cudaFree(ddg); cudaFree(ddb); cudaFree(part);
    cudaFree(dzz); cudaFree(ddA);
    free(zf); free(mean); free(invstd); free(gamma); free(beta); free(dgam); free(dbet); free(dA); free(zh); free(gA);
    return K;
}
static long test_dgrad_bn_taken, test_dgrad_bn_calls;   // the calls, and those whose kernel made sums
static int test_conv_no_dgrad, test_conv_x8;
static void test_conv(int B, int Cin, int H, int W, int Cout, int K, int S, int xextra, int zextra, void *stream) {
    const int dg = !test_conv_no_dgrad;
    int p = K / 2, Ho = (H + 2 * p - K) / S + 1, Wo = (W + 2 * p - K) / S + 1, KK = K * K, HW = H * W, HWo = Ho * Wo;
    long xs = (long)(Cin + xextra) * HW, zs = (long)(Cout + zextra) * HWo, nx = B * xs, nz = B * zs,
         nw = (long)Cout * Cin * KK;
    ConvDims d = {B, Cin, H, W, Cout, K, S, xextra ? xs : 0, zextra ? zs : 0, 0, 0};
    float *xf = xmalloc(4 * nx), *wf = xmalloc(4 * nw), *dzf = xmalloc(4 * nz), *bias = rand_host(Cout, -1, 1);
    uint16_t *xh = rand_f16(nx, -1, 1, xf), *wh = rand_f16(nw, -1, 1, wf), *dzh = rand_f16(nz, -1, 1, dzf);
    uint8_t *xu = xmalloc((size_t)nx);
    for (int b = 0; b < B; b++) {   // padding channels: NaN (uint8: 255, which a read outside would add)
        for (long i = 0; i < xs; i++) {
            xu[b * xs + i] = test_conv_x8 && i < (long)Cin * HW ? (uint8_t)rng_range(&rng, 0, 256) : 255;
            if (test_conv_x8 && i < (long)Cin * HW) {
                xh[b * xs + i] = float_to_half(xu[b * xs + i] * (1.f / 255.f));
                xf[b * xs + i] = half_to_float(xh[b * xs + i]);
            }
        }
        for (long i = (long)Cin * HW; i < xs; i++) xh[b * xs + i] = 0x7e00;
        for (long i = (long)Cout * HWo; i < zs; i++) dzh[b * zs + i] = 0x7e00;
    }
    float *col = xmalloc(4 * (size_t)KK * Cin * (HWo > HW ? HWo : HW) + 4 * (size_t)Cout * HW * KK);
    float *zref = xmalloc(4 * nz), *dxref = rand_host(nx, -1, 1), *dx0 = xmalloc(4 * nx), *dwref = rand_host(nw, -1, 1),
          *dw0 = xmalloc(4 * nw);
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
    // the stem's calls: the uint8 batch (test_conv_x8), else the FP16 x as the others
    void *dxu = test_conv_x8 ? to_dev(xu, nx) : NULL;
    ConvDims dS = d;
    dS.x8 = test_conv_x8;
    const void *xS = test_conv_x8 ? dxu : dxh_;
    float *dbias = to_dev(bias, 4 * Cout), *dz32, *ddx = to_dev(dx0, 4 * nx), *ddw = to_dev(dw0, 4 * nw);
    uint16_t *dz16, *ddx16;
    CK(cudaMalloc((void **)&dz32, 4 * nz));
    CK(cudaMalloc((void **)&dz16, 2 * nz));
    // NaN in both z buffers: outside the slices they must stay so (the emulator's cudaMalloc poisons new
    // memory, a GPU's does not, so the test sets it itself)
    CK(cudaMemset(dz32, 0xff, 4 * nz));
    CK(cudaMemset(dz16, 0xff, 2 * nz));
    CK(cudaMalloc((void **)&ddx16, 2 * nx));
    // the weights tap-major (3x3): bit for bit its twin's; the forward's and the input gradient's halo
    // kernel copies its weights from them (the FP16 accumulate below passes none at stride 2, and a
    // forward below none: the gather kernels)
    uint16_t *dwt = NULL;
    if (K == 3) {
        uint16_t *wt = xmalloc(2 * (size_t)nw), *wt_ref = xmalloc(2 * (size_t)nw);
        CK(cudaMalloc((void **)&dwt, 2 * nw));
        ConvWtJob job = {(const uint16_t *)dwh, dwt, Cout, Cin};
        conv_w_tapmajor_cuda(&job, 1, stream);
        CK(cudaMemcpy(wt, dwt, 2 * nw, cudaMemcpyDeviceToHost));
        w_tapmajor_cpu(wh, wt_ref, Cout, Cin);
        check(!memcmp(wt, wt_ref, 2 * (size_t)nw), "conv_w_tapmajor_cuda Cout=%d Cin=%d: the bits of w_tapmajor_cpu",
              Cout, Cin);
        twin_compared(conv_w_tapmajor_cuda);
        free(wt); free(wt_ref);
    }
    conv_forward_cuda(d, dxh_, NULL, dwh, dwt, dbias, dz32, dz16, stream);
    if (dg) {
        conv_dgrad_cuda(d, ddz, dwh, dwt, ddx, NULL, 1, stream);
        conv_dgrad_cuda(d, ddz, dwh, dwt, NULL, ddx16, 0, stream);
    }
    // the split's workspace, NaN-filled: a slice that left part of its share unwritten would show
    long kchunk, nsplit = conv_wgrad_split(d, 0, &kchunk);
    size_t wsb = conv_wgrad_ws_bytes(d, 0);
    float *ws = NULL;
    if (wsb) { CK(cudaMalloc((void **)&ws, wsb)); CK(cudaMemset(ws, 0xff, wsb)); }
    conv_wgrad_cuda(dS, ddz, xS, NULL, ddw, ws, 1, stream);
    float *z = from_dev(dz32, 4 * nz), *dx = from_dev(ddx, 4 * nx), *dw = from_dev(ddw, 4 * nw);
    uint16_t *zh = (uint16_t *)from_dev(dz16, 2 * nz), *dxh = (uint16_t *)from_dev(ddx16, 2 * nx);
    float *zhf = f16_host_to_f32(zh, nz), *dxhf = f16_host_to_f32(dxh, nx);
    // compare the slices only; outside them the outputs must be untouched
    long bad_out = 0;
    for (int b = 0; b < B; b++) {
        for (long i = (long)Cout * HWo; i < zs; i++) {
            bad_out += !isnan(zhf[b * zs + i]) || !isnan(z[b * zs + i]);
            zref[b * zs + i] = z[b * zs + i] = zhf[b * zs + i] = 0;
        }
        for (long i = (long)Cin * HW; i < xs; i++) {
            bad_out += memcmp(&dx[b * xs + i], &dx0[b * xs + i], 4) != 0;
            dxhf[b * xs + i] = dxref[b * xs + i];
        }
    }
    char what[200];
    snprintf(what, sizeof what,
             "conv_forward_cuda B=%d Cin=%d %dx%d Cout=%d K=%d S=%d xs+%d zs+%d, FP32 z + bias vs im2col+gemm_cpu", B,
             Cin, H, W, Cout, K, S, xextra, zextra);
    check_f16tol(what, z, zref, nz);
    snprintf(what, sizeof what, "conv_forward_cuda B=%d Cin=%d %dx%d Cout=%d K=%d S=%d, FP16 z", B, Cin, H, W, Cout, K,
             S);
    check_f16tol(what, zhf, zref, nz);
    if (dg) {
        snprintf(what, sizeof what,
                 "conv_dgrad_cuda B=%d Cin=%d %dx%d Cout=%d K=%d S=%d, FP32 accumulate vs gemm_cpu^T+col2im", B, Cin, H,
                 W, Cout, K, S);
        check_f16tol(what, dx, dxref, nx);
        for (long i = 0; i < nx; i++) dxref[i] -= dx0[i];
        for (int b = 0; b < B; b++) for (long i = (long)Cin * HW; i < xs; i++) dxhf[b * xs + i] = dxref[b * xs + i];
        snprintf(what, sizeof what, "conv_dgrad_cuda B=%d Cin=%d %dx%d Cout=%d K=%d S=%d, FP16 overwrite", B, Cin, H,
                 W, Cout, K, S);
        check_f16tol(what, dxhf, dxref, nx);
    }
    if (dg) {
        test_dgrad_bn_calls++;
        test_dgrad_bn_taken += test_dgrad_bn(d, ddz, dwh, dwt, dxh, stream) > 0;
    }
    {   // the forward with its BN statistics from the epilogue (no bias): the same FP16 z bits as
        // conv_forward_cuda's, and the statistics bn_stats_cpu takes of that z; twice: the same bits
        // (the stem kernel serves both calls: its z is checked against the reference below)
        uint16_t *dzs;
        CK(cudaMalloc((void **)&dzs, 2 * nz));
        CK(cudaMemset(dzs, 0xff, 2 * nz));   // NaN: outside the slices the z must stay untouched
        conv_forward_cuda(dS, xS, NULL, dwh, dwt, NULL, NULL, dz16, stream);
        long np = (long)conv_stats_floats(d);
        float *dpart = poisoned_dev(np), *dst;
        CK(cudaMalloc((void **)&dst, 4 * 4 * Cout));
        float *rm = rand_host(Cout, -1, 1), *rv = rand_host(Cout, 0.5f, 2), *mean = xmalloc(4 * Cout),
              *inv = xmalloc(4 * Cout), *got[2];
        CK(cudaMemcpy(dst + 2 * Cout, rm, 4 * Cout, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dst + 3 * Cout, rv, 4 * Cout, cudaMemcpyHostToDevice));
        int tiles = 0;
        for (int r = 0; r < 2; r++) {
            if (r) {   // the second run from the first's running stats: put the originals back
                CK(cudaMemcpy(dst + 2 * Cout, rm, 4 * Cout, cudaMemcpyHostToDevice));
                CK(cudaMemcpy(dst + 3 * Cout, rv, 4 * Cout, cudaMemcpyHostToDevice));
            }
            tiles = conv_forward_stats_cuda(dS, xS, NULL, dwh, dwt, dzs, dpart, stream);
            bn_stats_finish_cuda(dpart, tiles, Cout, dst, dst + Cout, dst + 2 * Cout, dst + 3 * Cout, BN_EPS,
                                 BN_MOMENTUM, stream);
            got[r] = from_dev(dst, 4 * 4 * Cout);
        }
        uint16_t *z0 = (uint16_t *)from_dev(dz16, 2 * nz), *z1 = (uint16_t *)from_dev(dzs, 2 * nz);
        long zdiff = 0;
        for (int b = 0; b < B; b++)
            for (long i = 0; i < zs; i++)
                zdiff += i < (long)Cout * HWo ? z0[b * zs + i] != z1[b * zs + i] : z1[b * zs + i] != 0xffff;
        float *zsf = f16_host_to_f32(z1, nz), *rm0 = xmalloc(4 * Cout), *rv0 = xmalloc(4 * Cout);
        memcpy(rm0, rm, 4 * Cout); memcpy(rv0, rv, 4 * Cout);
        bn_stats_cpu(zsf, zs, B, Cout, HWo, mean, inv, rm, rv, 1);
        check(!zdiff, "conv_forward_stats_cuda B=%d Cin=%d %dx%d Cout=%d K=%d S=%d zs+%d: z the bits of conv_forward_cuda's, "
              "nothing outside the slices (%ld differ)", B, Cin, H, W, Cout, K, S, zextra, zdiff);
        {   // that z (FP16 alone, no bias: the stem's own kernel takes it) against the reference
            long n1 = (long)Cout * HWo;
            float *zg = xmalloc(4 * B * n1), *zr = xmalloc(4 * B * n1);
            for (int b = 0; b < B; b++)
                for (long i = 0; i < n1; i++)
                    zg[b * n1 + i] = zsf[b * zs + i], zr[b * n1 + i] = zref[b * zs + i] - bias[i / HWo];
            snprintf(what, sizeof what, "conv_forward_cuda B=%d Cin=%d %dx%d Cout=%d K=%d S=%d, FP16 z alone, no bias", B,
                     Cin, H, W, Cout, K, S);
            check_f16tol(what, zg, zr, B * n1);
            uint16_t *dzb;   // and with the bias, nothing written outside the channels
            CK(cudaMalloc((void **)&dzb, 2 * nz));
            CK(cudaMemset(dzb, 0xff, 2 * nz));
            conv_forward_cuda(dS, xS, NULL, dwh, dwt, dbias, NULL, dzb, stream);
            uint16_t *zb = (uint16_t *)from_dev(dzb, 2 * nz);
            float *zbf = f16_host_to_f32(zb, nz);
            long outside = 0;
            for (int b = 0; b < B; b++) {
                for (long i = 0; i < n1; i++) zg[b * n1 + i] = zbf[b * zs + i], zr[b * n1 + i] = zref[b * zs + i];
                for (long i = n1; i < zs; i++) outside += zb[b * zs + i] != 0xffff;
            }
            snprintf(what, sizeof what, "conv_forward_cuda B=%d Cin=%d %dx%d Cout=%d K=%d S=%d, FP16 z alone + bias "
                     "(%ld values written outside the channels)", B, Cin, H, W, Cout, K, S, outside);
            check_f16tol(what, zg, zr, B * n1);
            check(!outside, "%s: nothing outside", what);
            if (dwt) {   // a 3x3 conv without the tap-major copy: the gather kernel, the same results
                CK(cudaMemset(dzb, 0xff, 2 * nz));
                conv_forward_cuda(d, dxh_, NULL, dwh, NULL, dbias, NULL, dzb, stream);
                free(zb); free(zbf);
                zb = (uint16_t *)from_dev(dzb, 2 * nz);
                zbf = f16_host_to_f32(zb, nz);
                outside = 0;
                for (int b = 0; b < B; b++) {
                    for (long i = 0; i < n1; i++) zg[b * n1 + i] = zbf[b * zs + i];
                    for (long i = n1; i < zs; i++) outside += zb[b * zs + i] != 0xffff;
                }
                snprintf(what, sizeof what, "conv_forward_cuda B=%d Cin=%d %dx%d Cout=%d K=%d S=%d, no tap-major "
                         "weights (the gather kernel), FP16 z + bias (%ld values written outside)", B, Cin, H, W, Cout,
                         K, S, outside);
                check_f16tol(what, zg, zr, B * n1);
                check(!outside, "%s: nothing outside", what);
            }
            cudaFree(dzb); free(zb); free(zbf);
            free(zg); free(zr);
        }
        snprintf(what, sizeof what, "conv_forward_stats_cuda + bn_stats_finish_cuda B=%d Cin=%d %dx%d Cout=%d K=%d S=%d "
                 "(%d tiles), of its z", B, Cin, H, W, Cout, K, S, tiles);
        check_bn_stats(what, zsf, zs, B, Cout, HWo, got[0], got[0] + Cout, got[0] + 2 * Cout, got[0] + 3 * Cout, mean,
                       inv, rm, rv, rm0, rv0);
        check(!memcmp(got[0], got[1], 4 * 4 * Cout), "conv_forward_stats_cuda B=%d Cin=%d %dx%d Cout=%d K=%d S=%d: a "
              "second run gives the same bits", B, Cin, H, W, Cout, K, S);
        cudaFree(dzs); cudaFree(dpart); cudaFree(dst);
        free(rm); free(rv); free(mean); free(inv); free(got[0]); free(got[1]); free(z0); free(z1); free(zsf);
        free(rm0); free(rv0);
        twin_compared(conv_forward_stats_cuda);
        twin_compared(bn_stats_finish_cuda);
    }
    if (dg) {   // FP16 accumulate (the AMP step's dA): onto what the overwrite left, the sum rounded once
        conv_dgrad_cuda(d, ddz, dwh, S == 2 ? NULL : dwt, NULL, ddx16, 1, stream);
        uint16_t *acc = (uint16_t *)from_dev(ddx16, 2 * nx);
        float *accf = f16_host_to_f32(acc, nx), *ref2 = xmalloc(4 * nx);
        for (long i = 0; i < nx; i++) ref2[i] = dxhf[i] + dxref[i];
        for (int b = 0; b < B; b++) for (long i = (long)Cin * HW; i < xs; i++) accf[b * xs + i] = ref2[b * xs + i];
        snprintf(what, sizeof what, "conv_dgrad_cuda B=%d Cin=%d %dx%d Cout=%d K=%d S=%d, FP16 accumulate", B, Cin, H,
                 W, Cout, K, S);
        check_f16tol(what, accf, ref2, nx);
        free(acc); free(accf); free(ref2);
    }
    snprintf(
            what, sizeof what,
            "conv_wgrad_cuda B=%d Cin=%d %dx%d Cout=%d K=%d S=%d (%ld slice%s), FP32 accumulate vs gemm_cpu(dz, col^T)",
            B, Cin, H, W, Cout, K, S, nsplit, nsplit > 1 ? "s" : "");
    check_f16tol(what, dw, dwref, nw);
    check(!bad_out,
          "conv B=%d Cin=%d Cout=%d K=%d S=%d: nothing written outside the channel slices (%ld values touched)", B, Cin,
          Cout, K, S, bad_out);
    // wgrad overwrite
    conv_wgrad_cuda(dS, ddz, xS, NULL, ddw, ws, 0, stream);
    free(dw); dw = from_dev(ddw, 4 * nw);
    for (long i = 0; i < nw; i++) dwref[i] -= dw0[i];
    snprintf(what, sizeof what, "conv_wgrad_cuda B=%d Cin=%d Cout=%d K=%d S=%d, overwrite", B, Cin, Cout, K, S);
    check_f16tol(what, dw, dwref, nw);
    conv_wgrad_cuda(dS, ddz, xS, NULL, ddw, ws, 0, stream);   // deterministic: the slices are added in a fixed order
    float *dw2 = from_dev(ddw, 4 * nw);
    check(!memcmp(dw, dw2, 4 * nw),
          "conv_wgrad_cuda B=%d Cin=%d Cout=%d K=%d S=%d (%ld slice%s): a second call gives the same bits", B, Cin,
          Cout, K, S, nsplit, nsplit > 1 ? "s" : "");
    free(dw2);
    cudaFree(ws);
    cudaFree(dxh_);
    if (dxu) cudaFree(dxu);
    free(xu);
    cudaFree(dwh);
    if (dwt) cudaFree(dwt);
    cudaFree(ddz);
    cudaFree(dbias);
    cudaFree(dz32);
    cudaFree(ddx);
    cudaFree(ddw);
    cudaFree(dz16);
    cudaFree(ddx16);
    free(xf);
    free(wf);
    free(dzf);
    free(bias);
    free(xh);
    free(wh);
    free(dzh);
    free(col);
    free(zref);
    free(dxref);
    free(dx0);
    free(dwref);
    free(dw0);
    free(dcol); free(dxi); free(z); free(dx); free(dw); free(zh); free(dxh); free(zhf); free(dxhf);
    twin_compared(conv_forward_cuda);
    twin_compared(conv_dgrad_cuda);
    twin_compared(conv_wgrad_cuda);
}

// test_conv_dgrad_wcols: the input gradient of one concat source, its Cin columns [off, off + Cin) of a
// conv's (Cout, Ct, K, K) weights read in place (wstride Ct*K*K), against the same launcher on those
// columns copied dense (test_conv checks that one against the reference): FP16 (FP32 accumulate and
// FP16 overwrite) and FP32 (conv_dgrad_f32_cuda). Where the rows are 16-byte aligned (off and Ct
// multiples of 8) both take the same kernel: the same bits; else the strided call takes a fallback,
// within the FP16 tolerance. A tap-major copy handed in with strided weights must be ignored (it holds
// all Ct columns): a NaN-filled one is.
static void test_conv_dgrad_wcols(int B, int Ct, int off, int Cin, int H, int W, int Cout, int K, int S, void *stream) {
    int p = K / 2, Ho = (H + 2 * p - K) / S + 1, Wo = (W + 2 * p - K) / S + 1, KK = K * K;
    long nx = (long)B * Cin * H * W, nz = (long)B * Cout * Ho * Wo, nwt = (long)Cout * Ct * KK, nw = (long)Cout * Cin * KK;
    ConvDims dd = {B, Cin, H, W, Cout, K, S, 0, 0, 0, 0}, ds = dd;
    ds.wstride = (long)Ct * KK;
    float *wtf = xmalloc(4 * nwt), *dzf = xmalloc(4 * nz), *x0 = rand_host(nx, -1, 1), *wcf = xmalloc(4 * nw);
    uint16_t *wth = rand_f16(nwt, -1, 1, wtf), *dzh = rand_f16(nz, -1, 1, dzf), *wch = xmalloc(2 * nw);
    for (int co = 0; co < Cout; co++)
        for (long j = 0; j < (long)Cin * KK; j++) {
            wch[(long)co * Cin * KK + j] = wth[(long)co * Ct * KK + (long)off * KK + j];
            wcf[(long)co * Cin * KK + j] = wtf[(long)co * Ct * KK + (long)off * KK + j];
        }
    uint16_t *dwt = (uint16_t *)to_dev(wth, 2 * nwt), *dwc = (uint16_t *)to_dev(wch, 2 * nw),
             *ddz = (uint16_t *)to_dev(dzh, 2 * nz), *nan16 = (uint16_t *)poisoned_dev((nwt + 1) / 2), *h16[2];
    float *f32w[2] = {to_dev(wtf, 4 * nwt), to_dev(wcf, 4 * nw)}, *dzd = to_dev(dzf, 4 * nz), *acc[2], *f32[2];
    for (int r = 0; r < 2; r++) {   // r 0: strided, 1: dense
        acc[r] = to_dev(x0, 4 * nx); f32[r] = to_dev(x0, 4 * nx);
        CK(cudaMalloc((void **)&h16[r], 2 * nx));
        ConvDims d = r ? dd : ds;
        const uint16_t *w = r ? dwc : dwt + (long)off * KK;
        conv_dgrad_cuda(d, ddz, w, r ? NULL : nan16, acc[r], NULL, 1, stream);
        conv_dgrad_cuda(d, ddz, w, r ? NULL : nan16, NULL, h16[r], 0, stream);
        conv_dgrad_f32_cuda(d, dzd, r ? f32w[1] : f32w[0] + (long)off * KK, f32[r], 1, stream);
    }
    const int same = off % 8 == 0 && Ct % 8 == 0;
    const char *name[3] = {"conv_dgrad_cuda FP32 accumulate", "conv_dgrad_cuda FP16 overwrite", "conv_dgrad_f32_cuda"};
    for (int k = 0; k < 3; k++) {
        float *got = k == 1 ? NULL : from_dev(k ? f32[0] : acc[0], 4 * nx), *ref = k == 1 ? NULL : from_dev(k ? f32[1] : acc[1], 4 * nx);
        if (k == 1) {
            uint16_t *a = (uint16_t *)from_dev(h16[0], 2 * nx), *b = (uint16_t *)from_dev(h16[1], 2 * nx);
            got = f16_host_to_f32(a, nx); ref = f16_host_to_f32(b, nx);
            free(a); free(b);
        }
        char what[200];
        snprintf(what, sizeof what, "%s B=%d Cin=%d of %d from %d %dx%d Cout=%d K=%d S=%d: weights in place vs copied", name[k],
                 B, Cin, Ct, off, H, W, Cout, K, S);
        if (same || k == 2) check(!memcmp(got, ref, 4 * nx), "%s: the same bits", what);
        else check_f16tol(what, got, ref, nx);
        free(got); free(ref);
    }
    for (int r = 0; r < 2; r++) { CK(cudaFree(acc[r])); CK(cudaFree(f32[r])); CK(cudaFree(h16[r])); CK(cudaFree(f32w[r])); }
    CK(cudaFree(dwt)); CK(cudaFree(dwc)); CK(cudaFree(ddz)); CK(cudaFree(nan16)); CK(cudaFree(dzd));
    free(wtf); free(dzf); free(x0); free(wcf); free(wth); free(dzh); free(wch);
}

// test_conv_wgrad_wcols: the weight gradient of one concat part of a 1x1 conv, its Cin columns [off, off +
// Cin) of the conv's (Cout, Ct) dW written in place (wstride Ct), against the same launcher into a dense
// (Cout, Cin) dW: the same kernel and split, so the same bits, added to what was there (accumulate 1)
// or over it (0), with the slices' sum (wgrad_reduce: 4 values at a time where off and Ct are multiples
// of 4, else 1) or without a split; the columns outside the part untouched. act: x is a pre-BN z read
// through its BN+SiLU (ConvAct), as a concat's BN parts are.
static void test_conv_wgrad_wcols(int B, int Ct, int off, int Cin, int H, int W, int Cout, int act, void *stream) {
    long HW = (long)H * W, nx = (long)B * Cin * HW, nz = (long)B * Cout * HW, nwt = (long)Cout * Ct, nw = (long)Cout * Cin;
    ConvDims dd = {B, Cin, H, W, Cout, 1, 1, 0, 0, 0, 0}, ds = dd;
    ds.wstride = Ct;
    float *xf = xmalloc(4 * nx), *dzf = xmalloc(4 * nz), *w0 = rand_host(nwt, -1, 1), *bn[4];
    uint16_t *xh = rand_f16(nx, -2, 2, xf), *dzh = rand_f16(nz, -1, 1, dzf);
    void *dx = to_dev(xh, 2 * nx), *ddz = to_dev(dzh, 2 * nz), *dbn[4];
    bn[0] = rand_host(Cin, -1, 1); bn[1] = rand_host(Cin, 0.3f, 2); bn[2] = rand_host(Cin, 0.5f, 2);
    bn[3] = rand_host(Cin, -1, 1);
    for (int k = 0; k < 4; k++) dbn[k] = to_dev(bn[k], 4 * Cin);
    ConvAct a = {dbn[0], dbn[1], dbn[2], dbn[3]};
    size_t wsb = conv_wgrad_ws_bytes(dd, 0);
    float *ws = wsb ? poisoned_dev((long)(wsb / 4)) : NULL, *dense = xmalloc(4 * nw);
    long kc, nsl = conv_wgrad_split(dd, 0, &kc);
    for (int accumulate = 1; accumulate >= 0; accumulate--) {
        for (int co = 0; co < Cout; co++) memcpy(dense + co * Cin, w0 + co * Ct + off, 4 * Cin);
        float *dwt = to_dev(w0, 4 * nwt), *dwd = to_dev(dense, 4 * nw);
        conv_wgrad_cuda(ds, ddz, dx, act ? &a : NULL, dwt + off, ws, accumulate, stream);
        conv_wgrad_cuda(dd, ddz, dx, act ? &a : NULL, dwd, ws, accumulate, stream);
        float *got = from_dev(dwt, 4 * nwt), *ref = from_dev(dwd, 4 * nw);
        long differ = 0, moved = 0;
        for (int co = 0; co < Cout; co++)
            for (int j = 0; j < Ct; j++) {
                float v = got[co * Ct + j];
                if (j >= off && j < off + Cin) differ += memcmp(&v, &ref[co * Cin + j - off], 4) != 0;
                else moved += memcmp(&v, &w0[co * Ct + j], 4) != 0;
            }
        check(!differ && !moved, "conv_wgrad_cuda B=%d Cin=%d at column %d of %d %dx%d Cout=%d%s, %ld slice%s, %s: "
              "dW's columns in place the bits of a dense dW (%ld of %ld differ), the rest untouched (%ld moved)", B, Cin,
              off, Ct, H, W, Cout, act ? " ACT" : "", nsl, nsl > 1 ? "s" : "", accumulate ? "accumulate" : "overwrite",
              differ, nw, moved);
        free(got); free(ref);
        CK(cudaFree(dwt)); CK(cudaFree(dwd));
    }
    for (int k = 0; k < 4; k++) { CK(cudaFree(dbn[k])); free(bn[k]); }
    CK(cudaFree(dx)); CK(cudaFree(ddz));
    if (ws) CK(cudaFree(ws));
    free(xf); free(dzf); free(w0); free(xh); free(dzh); free(dense);
}

// relative/absolute fp32 check: |got - ref| <= rel * scale[i] + 1e-6 (scale: sum |terms| of the value)
static void check_rel(const char *what, const float *got, const float *ref, const float *scale, long n, double rel) {
    double worst = 0; long bad = 0, wi = 0;
    for (long i = 0; i < n; i++) {
        double d = fabs((double)got[i] - ref[i]), tol = rel * scale[i] + 1e-6;
        if (!(d <= tol)) bad++;
        if (!(d / tol <= worst)) { worst = d / tol; wi = i; }
    }
    check(!bad, "%s: worst |diff|/tol %.3g at %ld (got %.9g ref %.9g), %ld of %ld over", what, worst, wi, got[wi],
          ref[wi], bad, n);
}

// check_bn_stats: a launcher's batch statistics (gm mean, gi invstd, grm / grv running mean and var) against
// bn_stats_cpu's (mean, invstd, rm, rv) of z (B, C, HW, image stride zs), rm0 / rv0 the running stats
// before: relative 1e-5 of mean |z| (mean), 4 |invstd| (a variance error of 1e-5 relative is 0.5e-5 in
// invstd), |rm0| + mean |z| and |rv0| + 4 |rv|. what: the launcher and case, the checks' names after it
static void check_bn_stats(const char *what, const float *z, long zs, int B, int C, int HW, const float *gm,
                           const float *gi, const float *grm, const float *grv, const float *mean, const float *invstd,
                           const float *rm, const float *rv, const float *rm0, const float *rv0) {
    float *sc = xmalloc(4 * C), *sc2 = xmalloc(4 * C), *sc3 = xmalloc(4 * C), *sc4 = xmalloc(4 * C);
    for (int c = 0; c < C; c++) {
        double sa = 0;
        for (int b = 0; b < B; b++) for (int i = 0; i < HW; i++) sa += fabs(z[b * zs + (long)c * HW + i]);
        sc[c] = (float)(sa / ((double)B * HW)); sc2[c] = fabsf(invstd[c]) * 4;
        sc3[c] = fabsf(rm0[c]) + sc[c]; sc4[c] = fabsf(rv0[c]) + fabsf(rv[c]) * 4;
    }
    char w[300];
    snprintf(w, sizeof w, "%s: mean vs bn_stats_cpu", what);
    check_rel(w, gm, mean, sc, C, 1e-5);
    snprintf(w, sizeof w, "%s: invstd", what);
    check_rel(w, gi, invstd, sc2, C, 1e-5);
    snprintf(w, sizeof w, "%s: running mean and var", what);
    check_rel(w, grm, rm, sc3, C, 1e-5);
    check_rel(w, grv, rv, sc4, C, 1e-5);
    free(sc); free(sc2); free(sc3); free(sc4);
}

static void test_bn(int B, int C, int HW, int zextra, int yextra, void *stream) {
    long zs = (long)(C + zextra) * HW, ys = (long)(C + yextra) * HW, nz = B * zs, ny = B * ys;
    float *zf = xmalloc(4 * nz), *mean = xmalloc(4 * C), *invstd = xmalloc(4 * C), *rm = rand_host(C, -1, 1),
          *rv = rand_host(C, 0.5f, 2);
    uint16_t *zh = rand_f16(nz, -3, 5, zf);
    float *rm0 = xmalloc(4 * C), *rv0 = xmalloc(4 * C), *gamma = rand_host(C, 0.5f, 2), *beta = rand_host(C, -1, 1);
    memcpy(rm0, rm, 4 * C); memcpy(rv0, rv, 4 * C);
    void *dzh = to_dev(zh, 2 * nz);
    float *dmean, *dinv, *drm = to_dev(rm, 4 * C), *drv = to_dev(rv, 4 * C), *dg = to_dev(gamma, 4 * C),
                         *db = to_dev(beta, 4 * C);
    CK(cudaMalloc((void **)&dmean, 4 * C)); CK(cudaMalloc((void **)&dinv, 4 * C));
    float *dscr = poisoned_dev((long)bn_stats_scratch_floats(B, C, HW));
    char what[200];
    for (int train = 1; train >= 0; train--) {
        bn_stats_cuda(dzh, zextra ? zs : 0, B, C, HW, dmean, dinv, drm, drv, BN_EPS, BN_MOMENTUM, train, dscr, stream);
        bn_stats_cpu(zf, zs, B, C, HW, mean, invstd, rm, rv, train);
        float *gm = from_dev(dmean, 4 * C), *gi = from_dev(dinv, 4 * C), *grm = from_dev(drm, 4 * C),
              *grv = from_dev(drv, 4 * C);
        snprintf(what, sizeof what, "bn_stats_cuda B=%d C=%d HW=%d zs+%d %s (%d chunk%s)", B, C, HW, zextra,
                 train ? "train" : "eval", bn_chunks(B, HW), bn_chunks(B, HW) > 1 ? "s" : "");
        check_bn_stats(what, zf, zs, B, C, HW, gm, gi, grm, grv, mean, invstd, rm, rv, rm0, rv0);
        free(gm); free(gi); free(grm); free(grv);
    }
    // BN+SiLU forward in FP16, with the GPU's statistics uploaded again from the CPU's
    float *dm2 = to_dev(mean, 4 * C), *di2 = to_dev(invstd, 4 * C), *yref = xmalloc(4 * ny),
          *zd = xmalloc(4 * (size_t)B * C * HW);
    uint16_t *dy; CK(cudaMalloc((void **)&dy, 2 * ny));
    CK(cudaMemset(dy, 0xff, 2 * ny));
    bn_silu_forward_f16_cuda(dzh, zextra ? zs : 0, dm2, di2, dg, db, dy, yextra ? ys : 0, B, C, HW, 0, stream);
    uint16_t *yh = (uint16_t *)from_dev(dy, 2 * ny);
    float *yf = f16_host_to_f32(yh, ny);
    for (int b = 0; b < B; b++) memcpy(zd + (size_t)b * C * HW, zf + b * zs, 4 * (size_t)C * HW);
    bn_silu_forward_cpu(zd, mean, invstd, gamma, beta, zd, B, C, HW);
    long untouched = 0;
    for (int b = 0; b < B; b++) {
        for (long i = 0; i < ys; i++) yref[b * ys + i] = i < (long)C * HW ? zd[(size_t)b * C * HW + i] : 0;
        for (long i = (long)C * HW; i < ys; i++) { untouched += yh[b * ys + i] == 0xffff; yf[b * ys + i] = 0; }
    }
    snprintf(what, sizeof what, "bn_silu_forward_f16_cuda B=%d C=%d HW=%d zs+%d ys+%d vs bn_silu_forward_cpu", B, C, HW,
             zextra, yextra);
    check_f16tol(what, yf, yref, ny);
    check(untouched == (long)B * yextra * HW,
          "bn_silu_forward_f16_cuda: the %ld values outside the output slice untouched", (long)B * yextra * HW);
    cudaFree(dzh);
    cudaFree(dmean);
    cudaFree(dinv);
    cudaFree(drm);
    cudaFree(drv);
    cudaFree(dg);
    cudaFree(db);
    cudaFree(dm2);
    cudaFree(di2);
    cudaFree(dy);
    cudaFree(dscr);
    free(zf);
    free(mean);
    free(invstd);
    free(rm);
    free(rv);
    free(zh);
    free(rm0);
    free(rv0);
    free(gamma);
    free(beta);
    free(yref);
    free(zd);
    free(yh);
    free(yf);
    twin_compared(bn_stats_cuda);
    twin_compared(bn_silu_forward_f16_cuda);
}

// slice_diff: of ny values of es bytes (images ys apart, each's first n a slice of y), how many differ
// between got and ref (*differ), and how many past the slices differ from y0, what was there (*moved)
static void slice_diff(const unsigned char *got, const unsigned char *ref, const void *y0, long ny, long ys, long n,
                       size_t es, long *differ, long *moved) {
    *differ = *moved = 0;
    for (long i = 0; i < ny; i++) {
        *differ += memcmp(got + i * es, ref + i * es, es) != 0;
        if (i % ys >= n) *moved += memcmp(got + i * es, (const unsigned char *)y0 + i * es, es) != 0;
    }
}

// bn_silu_forward_*_cuda with acc (a Bottleneck's residual sum made as its second activation is
// written): y (image stride ys, a slice when yextra) += BN+SiLU(z). Bit for bit what the step did
// before, the activation into a dense buffer and add_f16_cuda / add_f32_cuda into y; the values past
// the slice untouched; and near y + bn_silu_forward_cpu (FP16: check_f16tol, FP32: 1e-5 relative).
static void test_bn_silu_add(int B, int C, int HW, int zextra, int yextra, int f32, void *stream) {
    long zs = (long)(C + zextra) * HW, ys = (long)(C + yextra) * HW, nz = B * zs, ny = B * ys, n = (long)C * HW;
    size_t es = f32 ? 4 : 2;
    float *zf = xmalloc(4 * nz), *yf0 = xmalloc(4 * ny), *mean = rand_host(C, -1, 1), *invstd = rand_host(C, 0.3f, 2),
          *gamma = rand_host(C, 0.5f, 2), *beta = rand_host(C, -1, 1);
    uint16_t *zh = rand_f16(nz, -3, 5, zf), *yh0 = rand_f16(ny, -4, 4, yf0);
    void *dz = f32 ? to_dev(zf, 4 * nz) : to_dev(zh, 2 * nz), *y0 = f32 ? (void *)yf0 : (void *)yh0;
    void *dy1 = to_dev(y0, es * ny), *dy2 = to_dev(y0, es * ny), *dt = poisoned_dev((long)(es * B * n + 3) / 4);
    float *dm = to_dev(mean, 4 * C), *di = to_dev(invstd, 4 * C), *dg = to_dev(gamma, 4 * C), *db = to_dev(beta, 4 * C);
    long zarg = zextra ? zs : 0, yarg = yextra ? ys : 0;
    if (f32) {
        bn_silu_forward_f32_cuda(dz, zarg, dm, di, dg, db, dy1, yarg, B, C, HW, 1, stream);
        bn_silu_forward_f32_cuda(dz, zarg, dm, di, dg, db, (float *)dt, 0, B, C, HW, 0, stream);
        add_f32_cuda((const float *)dt, n, dy2, ys, B, n, stream);
    } else {
        bn_silu_forward_f16_cuda(dz, zarg, dm, di, dg, db, dy1, yarg, B, C, HW, 1, stream);
        bn_silu_forward_f16_cuda(dz, zarg, dm, di, dg, db, (uint16_t *)dt, 0, B, C, HW, 0, stream);
        add_f16_cuda((const uint16_t *)dt, n, dy2, ys, B, n, stream);
    }
    unsigned char *g1 = (unsigned char *)from_dev(dy1, es * ny), *g2 = (unsigned char *)from_dev(dy2, es * ny);
    long differ, moved;
    slice_diff(g1, g2, y0, ny, ys, n, es, &differ, &moved);
    const char *name = f32 ? "bn_silu_forward_f32_cuda" : "bn_silu_forward_f16_cuda";
    check(!differ, "%s acc B=%d C=%d HW=%d zs+%d ys+%d: bit-identical to the activation into a buffer + %s "
          "(%ld of %ld differ)", name, B, C, HW, zextra, yextra, f32 ? "add_f32_cuda" : "add_f16_cuda", differ, ny);
    check(!moved, "%s acc: the %ld values past the slice untouched (%ld moved)", name, (long)B * yextra * HW, moved);
    // against the CPU: y + bn_silu_forward_cpu of the same z
    float *zd = xmalloc(4 * (size_t)B * n), *got = xmalloc(4 * (size_t)B * n), *ref = xmalloc(4 * (size_t)B * n),
          *sc = xmalloc(4 * (size_t)B * n);
    for (int b = 0; b < B; b++) memcpy(zd + (size_t)b * n, zf + b * zs, 4 * (size_t)n);
    bn_silu_forward_cpu(zd, mean, invstd, gamma, beta, zd, B, C, HW);
    for (int b = 0; b < B; b++)
        for (long i = 0; i < n; i++) {
            size_t k = (size_t)b * n + i, at = (size_t)(b * ys + i);
            got[k] = f32 ? ((float *)g1)[at] : half_to_float(((uint16_t *)g1)[at]);
            ref[k] = yf0[at] + zd[k];
            sc[k] = fabsf(yf0[at]) + fabsf(zd[k]) + 1;
        }
    char what[200];
    snprintf(what, sizeof what, "%s acc B=%d C=%d HW=%d zs+%d ys+%d vs y + bn_silu_forward_cpu", name, B, C, HW, zextra,
             yextra);
    if (f32) check_rel(what, got, ref, sc, (long)B * n, 1e-5);
    else check_f16tol(what, got, ref, (long)B * n);
    cudaFree(dz); cudaFree(dy1); cudaFree(dy2); cudaFree(dt); cudaFree(dm); cudaFree(di); cudaFree(dg); cudaFree(db);
    free(zf); free(yf0); free(mean); free(invstd); free(gamma); free(beta); free(zh); free(yh0); free(g1); free(g2);
    free(zd); free(got); free(ref); free(sc);
    if (f32) twin_compared(bn_silu_forward_f32_cuda);
    else twin_compared(bn_silu_forward_f16_cuda);
}

// bn_silu_sum_*_cuda: y (image stride ys, a slice when yextra) = BN+SiLU(z1) + BN+SiLU(z2), each z its
// own BN and image stride (slices when z1extra / z2extra). Bit for bit what the step did before, the
// first activation into y and the second added (bn_silu_forward_*_cuda, acc); the values past the
// slice untouched; and near the sum of bn_silu_forward_cpu of each (FP16: check_f16tol, FP32: 1e-5).
static void test_bn_silu_sum(int B, int C, int HW, int z1extra, int z2extra, int yextra, int f32, void *stream) {
    long z1s = (long)(C + z1extra) * HW, z2s = (long)(C + z2extra) * HW, ys = (long)(C + yextra) * HW, ny = B * ys,
         n = (long)C * HW;
    size_t es = f32 ? 4 : 2;
    float *zf[2], *bnp[2][4], *zd[2];
    void *dz[2], *dbn[2][4];
    uint16_t *zh[2];
    ConvAct a[2];
    long zs[2] = {z1s, z2s};
    for (int k = 0; k < 2; k++) {
        zf[k] = xmalloc(4 * B * zs[k]);
        zh[k] = rand_f16(B * zs[k], -3, 5, zf[k]);
        dz[k] = f32 ? to_dev(zf[k], 4 * B * zs[k]) : to_dev(zh[k], 2 * B * zs[k]);
        bnp[k][0] = rand_host(C, -1, 1); bnp[k][1] = rand_host(C, 0.3f, 2);
        bnp[k][2] = rand_host(C, 0.5f, 2); bnp[k][3] = rand_host(C, -1, 1);
        for (int j = 0; j < 4; j++) dbn[k][j] = to_dev(bnp[k][j], 4 * C);
        a[k] = (ConvAct){dbn[k][0], dbn[k][1], dbn[k][2], dbn[k][3]};
        zd[k] = xmalloc(4 * (size_t)B * n);
        for (int b = 0; b < B; b++) memcpy(zd[k] + (size_t)b * n, zf[k] + b * zs[k], 4 * (size_t)n);
        bn_silu_forward_cpu(zd[k], bnp[k][0], bnp[k][1], bnp[k][2], bnp[k][3], zd[k], B, C, HW);
    }
    float *yf0 = xmalloc(4 * ny);
    uint16_t *yh0 = rand_f16(ny, -4, 4, yf0);
    const void *y0 = f32 ? (void *)yf0 : (void *)yh0;
    void *dy1 = to_dev(y0, es * ny), *dy2 = to_dev(y0, es * ny);
    long a1 = z1extra ? z1s : 0, a2 = z2extra ? z2s : 0, yarg = yextra ? ys : 0;
    if (f32) {
        bn_silu_sum_f32_cuda(dz[0], a1, &a[0], dz[1], a2, &a[1], dy1, yarg, B, C, HW, stream);
        for (int k = 0; k < 2; k++)
            bn_silu_forward_f32_cuda(dz[k], k ? a2 : a1, a[k].mean, a[k].invstd, a[k].gamma, a[k].beta, dy2, yarg, B,
                                     C, HW, k, stream);
    } else {
        bn_silu_sum_f16_cuda(dz[0], a1, &a[0], dz[1], a2, &a[1], dy1, yarg, B, C, HW, stream);
        for (int k = 0; k < 2; k++)
            bn_silu_forward_f16_cuda(dz[k], k ? a2 : a1, a[k].mean, a[k].invstd, a[k].gamma, a[k].beta, dy2, yarg, B,
                                     C, HW, k, stream);
    }
    unsigned char *g1 = (unsigned char *)from_dev(dy1, es * ny), *g2 = (unsigned char *)from_dev(dy2, es * ny);
    long differ, moved;
    slice_diff(g1, g2, y0, ny, ys, n, es, &differ, &moved);
    const char *name = f32 ? "bn_silu_sum_f32_cuda" : "bn_silu_sum_f16_cuda";
    check(!differ, "%s B=%d C=%d HW=%d zs+%d,%d ys+%d: bit-identical to the first activation into y and the second "
          "added (%ld of %ld differ)", name, B, C, HW, z1extra, z2extra, yextra, differ, ny);
    check(!moved, "%s: the %ld values past the slice untouched (%ld moved)", name, (long)B * yextra * HW, moved);
    float *got = xmalloc(4 * (size_t)B * n), *ref = xmalloc(4 * (size_t)B * n), *sc = xmalloc(4 * (size_t)B * n);
    for (int b = 0; b < B; b++)
        for (long i = 0; i < n; i++) {
            size_t k = (size_t)b * n + i, at = (size_t)(b * ys + i);
            got[k] = f32 ? ((float *)g1)[at] : half_to_float(((uint16_t *)g1)[at]);
            ref[k] = zd[0][k] + zd[1][k];
            sc[k] = fabsf(zd[0][k]) + fabsf(zd[1][k]) + 1;
        }
    char what[200];
    snprintf(what, sizeof what, "%s B=%d C=%d HW=%d zs+%d,%d ys+%d vs the sum of bn_silu_forward_cpu", name, B, C, HW,
             z1extra, z2extra, yextra);
    if (f32) check_rel(what, got, ref, sc, (long)B * n, 1e-5);
    else check_f16tol(what, got, ref, (long)B * n);
    for (int k = 0; k < 2; k++) {
        cudaFree(dz[k]);
        for (int j = 0; j < 4; j++) { cudaFree(dbn[k][j]); free(bnp[k][j]); }
        free(zf[k]); free(zh[k]); free(zd[k]);
    }
    cudaFree(dy1); cudaFree(dy2);
    free(yf0); free(yh0); free(g1); free(g2); free(got); free(ref); free(sc);
    if (f32) twin_compared(bn_silu_sum_f32_cuda);
    else twin_compared(bn_silu_sum_f16_cuda);
}

// bn_stats_finish_cuda alone, on more tiles than the tests' convs make: K tiles a channel that partition
// its values with 0-64 values each (empty ones too), built on the host (count, mean, squared deviations),
// so that a thread's batches of requested tiles run full, partial and (K > 2048) more than once; against
// bn_stats_cpu of those values (check_bn_stats), and a second run the same bits.
static void test_bn_finish(int C, int K, void *stream) {
    int *cnt = xmalloc(sizeof(int) * K), HW = 0;
    for (int k = 0; k < K; k++) HW += cnt[k] = k % 10 == 3 ? 0 : (int)rng_range(&rng, 1, 65);
    float *z = rand_host((long)C * HW, -3, 5), *part = xcalloc((size_t)4 * C * K, 4);
    for (int c = 0; c < C; c++)
        for (int k = 0, at = 0; k < K; at += cnt[k++]) {
            const float *v = z + (long)c * HW + at;
            double m = 0, q = 0;
            for (int e = 0; e < cnt[k]; e++) m += v[e];
            m = cnt[k] ? m / cnt[k] : 0;
            for (int e = 0; e < cnt[k]; e++) q += (v[e] - m) * (v[e] - m);
            float *t = part + 4 * ((long)c * K + k);
            t[0] = (float)cnt[k], t[1] = (float)m, t[2] = (float)q;
        }
    float *rm = rand_host(C, -1, 1), *rv = rand_host(C, 0.5f, 2), *rm0 = xmalloc(4 * C), *rv0 = xmalloc(4 * C),
          *mean = xmalloc(4 * C), *inv = xmalloc(4 * C), *dpart = to_dev(part, (size_t)16 * C * K), *dst, *got[2];
    memcpy(rm0, rm, 4 * C); memcpy(rv0, rv, 4 * C);
    CK(cudaMalloc((void **)&dst, 16 * (size_t)C));
    for (int r = 0; r < 2; r++) {
        CK(cudaMemcpy(dst + 2 * C, rm0, 4 * C, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dst + 3 * C, rv0, 4 * C, cudaMemcpyHostToDevice));
        bn_stats_finish_cuda(dpart, K, C, dst, dst + C, dst + 2 * C, dst + 3 * C, BN_EPS, BN_MOMENTUM, stream);
        got[r] = from_dev(dst, 16 * (size_t)C);
    }
    bn_stats_cpu(z, (long)C * HW, 1, C, HW, mean, inv, rm, rv, 1);
    char what[160];
    snprintf(what, sizeof what, "bn_stats_finish_cuda C=%d K=%d tiles of 0-64 values (%d a channel)", C, K, HW);
    check_bn_stats(what, z, (long)C * HW, 1, C, HW, got[0], got[0] + C, got[0] + 2 * C, got[0] + 3 * C, mean, inv, rm,
                   rv, rm0, rv0);
    check(!memcmp(got[0], got[1], 16 * (size_t)C), "%s: a second run gives the same bits", what);
    cudaFree(dpart); cudaFree(dst);
    free(cnt); free(z); free(part); free(rm); free(rv); free(rm0); free(rv0); free(mean); free(inv);
    free(got[0]); free(got[1]);
    twin_compared(bn_stats_finish_cuda);
}

// bn_silu_upsample2_*_cuda (the neck's upsampled activations made in one pass): bit for bit
// bn_silu_forward_*_cuda into a buffer, then upsample2_forward_*_cuda; y a slice (image stride ys, yoff
// elements into its buffer: odd, the one-value stores), nothing else written; and near
// upsample2_forward_cpu of bn_silu_forward_cpu (FP16: check_f16tol, FP32: 1e-5 relative).
static void test_bn_silu_up(int B, int C, int H, int W, int zextra, int yextra, int yoff, int f32, void *stream) {
    long HW = (long)H * W, zs = (C + zextra) * HW, ys = 4 * C * HW + yextra, nz = B * zs, ny = B * ys + yoff,
         n = (long)C * HW;
    size_t es = f32 ? 4 : 2;
    float *zf = xmalloc(4 * nz), *mean = rand_host(C, -1, 1), *invstd = rand_host(C, 0.3f, 2),
          *gamma = rand_host(C, 0.5f, 2), *beta = rand_host(C, -1, 1);
    uint16_t *zh = rand_f16(nz, -3, 5, zf);
    void *dz = f32 ? to_dev(zf, 4 * nz) : to_dev(zh, 2 * nz);
    float *dm = to_dev(mean, 4 * C), *di = to_dev(invstd, 4 * C), *dg = to_dev(gamma, 4 * C), *db = to_dev(beta, 4 * C);
    float *dy1 = poisoned_dev((long)(es * ny + 3) / 4), *dy2 = poisoned_dev((long)(es * ny + 3) / 4),
          *dt = poisoned_dev((long)(es * B * n + 3) / 4);
    char *y1 = (char *)dy1 + yoff * es, *y2 = (char *)dy2 + yoff * es;
    long zarg = zextra ? zs : 0;
    if (f32) {
        bn_silu_upsample2_f32_cuda(dz, zarg, dm, di, dg, db, (float *)y1, ys, B, C, H, W, stream);
        bn_silu_forward_f32_cuda(dz, zarg, dm, di, dg, db, dt, 0, B, C, (int)HW, 0, stream);
        upsample2_forward_f32_cuda(dt, (float *)y2, ys, B, C, H, W, stream);
    } else {
        bn_silu_upsample2_f16_cuda(dz, zarg, dm, di, dg, db, (uint16_t *)y1, ys, B, C, H, W, stream);
        bn_silu_forward_f16_cuda(dz, zarg, dm, di, dg, db, (uint16_t *)dt, 0, B, C, (int)HW, 0, stream);
        upsample2_forward_f16_cuda((const uint16_t *)dt, (uint16_t *)y2, ys, B, C, H, W, stream);
    }
    unsigned char *g1 = (unsigned char *)from_dev(dy1, es * ny), *g2 = (unsigned char *)from_dev(dy2, es * ny);
    long differ = 0, written = 0;
    for (long i = 0; i < ny; i++) {
        differ += memcmp(g1 + i * es, g2 + i * es, es) != 0;
        long j = i - yoff;
        int inside = j >= 0 && j % ys < 4 * n;
        for (size_t k = 0; k < es && !inside; k++) written += g1[i * es + k] != 0xff;
    }
    const char *name = f32 ? "bn_silu_upsample2_f32_cuda" : "bn_silu_upsample2_f16_cuda";
    check(!differ, "%s B=%d C=%d %dx%d zs+%d ys+%d at +%d: bit-identical to bn_silu_forward + upsample2_forward "
          "(%ld of %ld differ)", name, B, C, H, W, zextra, yextra, yoff, differ, ny);
    check(!written, "%s: nothing written outside the output slice (%ld bytes)", name, written);
    float *zd = xmalloc(4 * (size_t)B * n), *ref = xmalloc(16 * (size_t)B * n), *got = xmalloc(16 * (size_t)B * n),
          *sc = xmalloc(16 * (size_t)B * n);
    for (int b = 0; b < B; b++) memcpy(zd + (size_t)b * n, zf + b * zs, 4 * (size_t)n);
    bn_silu_forward_cpu(zd, mean, invstd, gamma, beta, zd, B, C, (int)HW);
    upsample2_forward_cpu(zd, ref, B, C, H, W);
    for (int b = 0; b < B; b++)
        for (long i = 0; i < 4 * n; i++) {
            size_t k = (size_t)b * 4 * n + i, at = (size_t)(yoff + b * ys + i);
            got[k] = f32 ? ((float *)g1)[at] : half_to_float(((uint16_t *)g1)[at]);
            sc[k] = fabsf(ref[k]) + 1;
        }
    char what[200];
    snprintf(what, sizeof what, "%s B=%d C=%d %dx%d vs upsample2_forward_cpu(bn_silu_forward_cpu)", name, B, C, H, W);
    if (f32) check_rel(what, got, ref, sc, 4 * B * n, 1e-5);
    else check_f16tol(what, got, ref, 4 * B * n);
    cudaFree(dz); cudaFree(dm); cudaFree(di); cudaFree(dg); cudaFree(db); cudaFree(dy1); cudaFree(dy2); cudaFree(dt);
    free(zf); free(mean); free(invstd); free(gamma); free(beta); free(zh); free(g1); free(g2); free(zd); free(ref);
    free(got); free(sc);
    if (f32) twin_compared(bn_silu_upsample2_f32_cuda);
    else twin_compared(bn_silu_upsample2_f16_cuda);
}

// add_n_*_cuda (a residual sum's gradient into the k convs it adds, read once): each destination (its
// own image stride, slack between images) bit for bit the host's FP32 sum rounded once to the type,
// added in order (the same region twice when alias), nothing else written; odd: strides that rule out
// 16-byte words; set: the destinations written instead (the source's bits: no gradient there yet)
static void test_add_n(int B, long n, int k, int f32, int odd, int alias, unsigned set, void *stream) {
    size_t es = f32 ? 4 : 2;
    long ss = n + (odd ? 3 : 8);
    AddDst d = {{0}, {0}, k, set};
    unsigned char *h[ADD_DST_MAX], *ref[ADD_DST_MAX];
    float *gf = rand_host((long)B * ss, -2, 2);
    uint16_t *gh = rand_f16((long)B * ss, -2, 2, gf);
    void *dg = f32 ? to_dev(gf, 4 * (size_t)B * ss) : to_dev(gh, 2 * (size_t)B * ss);
    for (int j = 0; j < k; j++) {
        d.s[j] = n + 8 * j + (odd ? 1 : 0);
        size_t bytes = es * (size_t)B * d.s[j];
        float *f = rand_host((long)B * d.s[j], -3, 3);
        uint16_t *hh = rand_f16((long)B * d.s[j], -3, 3, NULL);
        h[j] = xmalloc(bytes);
        memcpy(h[j], f32 ? (void *)f : (void *)hh, bytes);
        d.p[j] = to_dev(h[j], bytes);
        free(f); free(hh);
    }
    if (alias && k > 1) {
        cudaFree(d.p[k - 1]);
        d.p[k - 1] = d.p[0];
        d.s[k - 1] = d.s[0];
    }
    for (int j = 0; j < k; j++) {   // the host's sums, destination by destination
        int jj = alias && k > 1 && j == k - 1 ? 0 : j;
        if (jj == j) { ref[j] = xmalloc(es * (size_t)B * d.s[j]); memcpy(ref[j], h[j], es * (size_t)B * d.s[j]); }
        for (int b = 0; b < B; b++)
            for (long i = 0; i < n; i++) {
                size_t at = (size_t)(b * d.s[j] + i), from = (size_t)(b * ss + i);
                if (set >> j & 1) memcpy(ref[jj] + at * es, f32 ? (void *)&gf[from] : (void *)&gh[from], es);
                else if (f32) ((float *)ref[jj])[at] += gf[from];
                else ((uint16_t *)ref[jj])[at] = float_to_half(half_to_float(((uint16_t *)ref[jj])[at]) + gf[from]);
            }
    }
    if (f32) add_n_f32_cuda((const float *)dg, ss, d, B, n, stream);
    else add_n_f16_cuda((const uint16_t *)dg, ss, d, B, n, stream);
    long differ = 0, total = 0;
    for (int j = 0; j < k; j++) {
        if (alias && k > 1 && j == k - 1) break;
        size_t bytes = es * (size_t)B * d.s[j];
        unsigned char *got = (unsigned char *)from_dev(d.p[j], bytes);
        for (size_t i = 0; i < bytes / es; i++) differ += memcmp(got + i * es, ref[j] + i * es, es) != 0;
        total += (long)(bytes / es);
        free(got);
    }
    check(!differ, "%s B=%d n=%ld into %d destination%s%s%s (written: mask %#x): bit-identical to the host's sums in "
          "order, nothing else written (%ld of %ld differ)", f32 ? "add_n_f32_cuda" : "add_n_f16_cuda", B, n, k,
          k > 1 ? "s" : "", odd ? ", odd strides" : "", alias && k > 1 ? ", the last the first again" : "", set, differ,
          total);
    for (int j = 0; j < k; j++) {
        if (!(alias && k > 1 && j == k - 1)) { cudaFree(d.p[j]); free(ref[j]); }
        free(h[j]);
    }
    cudaFree(dg); free(gf); free(gh);
    if (f32) twin_compared(add_n_f32_cuda);
    else twin_compared(add_n_f16_cuda);
}

// h: dA in FP16 (bn_silu_backward_h_cuda, the AMP step's), the reference given the same rounded values
static void test_bn_backward(int B, int C, int HW, int zextra, int bn, int train, int h, void *stream) {
    long zs = (long)(C + zextra) * HW, nz = B * zs;
    float *zf = xmalloc(4 * nz), *dA = rand_host(nz, -1, 1), *mean = rand_host(C, -0.5f, 0.5f),
          *invstd = rand_host(C, 0.5f, 2);
    uint16_t *dAh = h ? rand_f16(nz, -1, 1, dA) : NULL;
    float *gamma = rand_host(C, 0.5f, 2), *beta = rand_host(C, -1, 1), *dgam = rand_host(C, -1, 1),
          *dbet = rand_host(C, -1, 1);
    uint16_t *zh = rand_f16(nz, -3, 3, zf);
    float *dAd = to_dev(dA, 4 * nz), *dm = to_dev(mean, 4 * C), *di = to_dev(invstd, 4 * C), *dg = to_dev(gamma, 4 * C),
          *db = to_dev(beta, 4 * C);
    float *ddg = to_dev(dgam, 4 * C), *ddb = to_dev(dbet, 4 * C), *scratch;
    void *dz16 = to_dev(zh, 2 * nz);
    uint16_t *ddz; CK(cudaMalloc((void **)&ddz, 2 * nz));
    scratch = poisoned_dev((long)bn_scratch_floats(B, C, HW));
    CK(cudaMemset(ddz, 0xff, 2 * nz));
    void *dAhd = h ? to_dev(dAh, 2 * nz) : NULL;
    if (h == 2) {   // in place: dz written over dA (the device step's), what lies outside the slice untouched
        cudaFree(ddz);
        ddz = dAhd;
        dAhd = NULL;
        for (int b = 0; b < B; b++) for (long i = (long)C * HW; i < zs; i++) dAh[b * zs + i] = 0xffff;
        CK(cudaMemcpy(ddz, dAh, 2 * nz, cudaMemcpyHostToDevice));
    }
    if (h)
        bn_silu_backward_h_cuda(bn ? dz16 : NULL, h == 2 ? ddz : dAhd, zextra ? zs : 0, dm, di, bn ? dg : NULL, db,
                                ddg, ddb, ddz, scratch, B, C, HW, train, stream);
    else
        bn_silu_backward_cuda(bn ? dz16 : NULL, dAd, zextra ? zs : 0, dm, di, bn ? dg : NULL, db, ddg, ddb, ddz,
                              scratch, B, C, HW, train, stream);
    const char *fn = h == 2 ? "bn_silu_backward_h_cuda in place" : h ? "bn_silu_backward_h_cuda" : "bn_silu_backward_cuda";
    char who[200];
    snprintf(who, sizeof who, "%s B=%d C=%d HW=%d zs+%d %s %s", fn, B, C, HW, zextra, bn ? "BN" : "bias",
             train ? "train" : "eval");
    long untouched = bn_backward_compare(who, zf, dA, zs, B, C, HW, mean, invstd, bn ? gamma : NULL, beta, dgam, dbet,
                                         train, ddz, ddg, ddb);
    check(untouched == (long)B * zextra * HW, "%s: values outside the dz slice untouched", fn);
    cudaFree(dAhd);
    free(dAh);
    cudaFree(dAd);
    cudaFree(dm);
    cudaFree(di);
    cudaFree(dg);
    cudaFree(db);
    cudaFree(ddg);
    cudaFree(ddb);
    cudaFree(scratch);
    cudaFree(dz16);
    cudaFree(ddz);
    free(zf);
    free(dA);
    free(mean);
    free(invstd);
    free(gamma);
    free(beta);
    free(dgam);
    free(dbet);
    free(zh);
    if (h) twin_compared(bn_silu_backward_h_cuda);
    else twin_compared(bn_silu_backward_cuda);
}

// the pools' x from a channel slice (xs: C + 2 channels an image, the two others +inf / 65504, which would
// win every window they were read into), as SPPF's chain reads its parts
static void test_pool_up_backward(int B, int C, int H, int W, void *stream) {
    long n = (long)B * C * H * W, HW = (long)H * W, xs = (long)(C + 2) * HW;
    float *x = xmalloc(4 * n), *dy = rand_host(n, -1, 1), *dy4 = rand_host(4 * n, -1, 1), *ref = xmalloc(4 * n);
    for (long i = 0; i < n; i++) x[i] = (float)(int)rng_range(&rng, 0, 4);   // few distinct values: many ties
    if (n > 3) x[3] = -INFINITY;
    float *xp = xmalloc(4 * (size_t)B * xs);
    for (long i = 0; i < (long)B * xs; i++) xp[i] = INFINITY;
    for (int b = 0; b < B; b++) memcpy(xp + b * xs + HW, x + b * (n / B), 4 * (size_t)(n / B));
    float *dx_ = to_dev(xp, 4 * (size_t)B * xs), *ddy = to_dev(dy, 4 * n), *ddy4 = to_dev(dy4, 16 * n), *ddx;
    free(xp);
    CK(cudaMalloc((void **)&ddx, 4 * n));
    maxpool5_backward_cuda(dx_ + HW, xs, ddy, 0, ddx, B, C, H, W, stream);
    float *got = from_dev(ddx, 4 * n);
    maxpool5_backward(x, dy, ref, B, C, H, W);
    char what[160];
    snprintf(what, sizeof what, "maxpool5_backward_cuda B=%d C=%d %dx%d (ties, x from a channel slice) vs "
             "maxpool5_backward", B, C, H, W);
    check_bits(what, got, ref, n);
    upsample2_backward_cuda(ddy4, 0, ddx, B, C, H, W, stream);
    free(got); got = from_dev(ddx, 4 * n);
    upsample2_backward(dy4, ref, B, C, H, W);
    snprintf(what, sizeof what, "upsample2_backward_cuda B=%d C=%d %dx%d vs upsample2_backward", B, C, H, W);
    check_bits(what, got, ref, n);
    // FP16 (the AMP step's), the batch in one launch with dy's images gs apart (a channel slice): sums in FP32
    // from the FP16 values, rounded once; x as the FP16 values it holds (small integers: exact)
    {
        // dy: channels [1, 1 + C) of 2 C + 1 per image; dy4 the same at 2H x 2W
        long ng = (long)B * (2 * C + 1) * H * W;
        float *dyf = xmalloc(4 * ng), *dy4f = xmalloc(16 * ng), *reff = xmalloc(4 * n), *gd = xmalloc(4 * n),
              *g4 = xmalloc(16 * n);
        uint16_t *dyh = rand_f16(ng, -1, 1, dyf), *dy4h = rand_f16(4 * ng, -1, 1, dy4f),
                 *xh = xmalloc(2 * (size_t)B * xs);
        for (long i = 0; i < (long)B * xs; i++) xh[i] = 0x7bff;
        for (int b = 0; b < B; b++)
            for (long i = 0; i < n / B; i++) xh[b * xs + HW + i] = float_to_half(x[b * (n / B) + i]);
        long gs = (long)(2 * C + 1) * H * W;
        for (int b = 0; b < B; b++) {   // the slices, dense, for the FP32 references
            memcpy(gd + (long)b * C * H * W, dyf + b * gs + (long)H * W, 4 * (size_t)C * H * W);
            memcpy(g4 + 4L * b * C * H * W, dy4f + 4 * (b * gs + (long)H * W), 16 * (size_t)C * H * W);
        }
        void *dxh = to_dev(xh, 2 * (size_t)B * xs), *ddyh = to_dev(dyh, 2 * ng), *ddy4h = to_dev(dy4h, 8 * ng);
        uint16_t *dout;
        CK(cudaMalloc((void **)&dout, 2 * n));
        maxpool5_backward_f16_cuda((uint16_t *)dxh + HW, xs, (uint16_t *)ddyh + H * W, gs, dout, B, C, H, W, stream);
        uint16_t *gh = (uint16_t *)from_dev(dout, 2 * n);
        maxpool5_backward(x, gd, reff, B, C, H, W);
        long bad = 0;
        for (long i = 0; i < n; i++) bad += gh[i] != float_to_half(reff[i]);
        check(!bad, "maxpool5_backward_f16_cuda B=%d C=%d %dx%d (ties, strided x and dy) vs maxpool5_backward rounded: "
              "%ld differ",
              B, C, H, W, bad);
        free(gh);
        upsample2_backward_f16_cuda((uint16_t *)ddy4h + 4 * H * W, 4 * gs, dout, B, C, H, W, stream);
        gh = (uint16_t *)from_dev(dout, 2 * n);
        upsample2_backward(g4, reff, B, C, H, W);
        bad = 0;
        for (long i = 0; i < n; i++) bad += gh[i] != float_to_half(reff[i]);
        check(!bad, "upsample2_backward_f16_cuda B=%d C=%d %dx%d (strided dy) vs upsample2_backward rounded: %ld differ",
              B, C, H, W, bad);
        free(gh);
        cudaFree(dxh); cudaFree(ddyh); cudaFree(ddy4h); cudaFree(dout);
        free(dyf); free(dy4f); free(reff); free(gd); free(g4); free(dyh); free(dy4h); free(xh);
    }
    cudaFree(dx_); cudaFree(ddy); cudaFree(ddy4); cudaFree(ddx); free(x); free(dy); free(dy4); free(ref); free(got);
    twin_compared(upsample2_backward_cuda);
    twin_compared(maxpool5_backward_cuda);
    twin_compared(upsample2_backward_f16_cuda);
    twin_compared(maxpool5_backward_f16_cuda);
}

static void test_convert_copy(long n, void *stream) {
    uint8_t *u = xmalloc(n + 1);
    float *f = rand_host(n, -70000, 70000);
    for (long i = 0; i < n; i++) {
        u[i] = (uint8_t)(i * 37 + 11);
        if (i % 3) f[i] *= 1e-4f;
        if (i % 7 == 0) f[i] *= 1e-5f;
    }
    if (n > 2) { f[0] = INFINITY; f[1] = -0.0f; }
    void *du = to_dev(u, n), *df = to_dev(f, 4 * n);
    uint16_t *dh, *dh2;
    CK(cudaMalloc((void **)&dh, 2 * n)); CK(cudaMalloc((void **)&dh2, 2 * n));
    u8_to_f16_cuda(du, dh, n, stream);
    f32_to_f16_cuda(df, dh2, n, stream);
    uint16_t *g1 = (uint16_t *)from_dev(dh, 2 * n), *g2 = (uint16_t *)from_dev(dh2, 2 * n);
    long bad1 = 0, bad2 = 0;
    for (long i = 0; i < n; i++) bad1 += g1[i] != float_to_half(u[i] * (1.f / 255.f));
    for (long i = 0; i < n; i++) bad2 += g2[i] != float_to_half(f[i]);
    check(!bad1, "u8_to_f16_cuda n=%ld: bit-exact with the software fp16 of x*(1/255) (input_from_batch), %ld differ",
          n, bad1);
    // from one byte past an aligned address: no 8-byte loads, one byte a thread
    u8_to_f16_cuda((uint8_t *)du + 1, dh, n - 1, stream);
    free(g1);
    g1 = (uint16_t *)from_dev(dh, 2 * n);
    bad1 = 0;
    for (long i = 0; i + 1 < n; i++) bad1 += g1[i] != float_to_half(u[i + 1] * (1.f / 255.f));
    check(!bad1, "u8_to_f16_cuda n=%ld from an odd address: bit-exact as above, %ld differ", n - 1, bad1);
    check(!bad2,
          "f32_to_f16_cuda n=%ld: bit-exact with the software round-to-nearest-even (overflow, subnormals, -0, inf), "
          "%ld differ",
          n, bad2);
    // concat by offset: 3 images of about n/3 values into the middle of a larger per-image block, at
    // strides and an offset that allow no 16-byte words (one value a thread), then at ones that do (8 a
    // thread, and a tail of 5 one by one)
    int B = 3;
    for (int wide = 0; wide < 2; wide++) {
        long ss = wide ? n / 3 / 8 * 8 : n / 3, m = wide ? ss - 3 : ss, off = wide ? 8 : 2;
        long ds = wide ? ss + 8 : m + 5, tot = B * ds + off;
        uint16_t *dst; CK(cudaMalloc((void **)&dst, 2 * (size_t)tot));
        CK(cudaMemset(dst, 0, 2 * (size_t)tot));
        copy_f16_cuda(dh2, ss, dst + off, ds, B, m, stream);
        uint16_t *g3 = (uint16_t *)from_dev(dst, 2 * (size_t)tot);
        float *src3 = xmalloc(4 * (size_t)B * ss), *ref3 = xcalloc((size_t)tot, 4);   // fp16 -> float is exact
        for (long i = 0; i < B * ss; i++) src3[i] = half_to_float(g2[i]);
        copy_strided_cpu(src3, ss, ref3 + off, ds, B, m);
        long bad3 = 0;
        for (long o = 0; o < tot; o++) bad3 += g3[o] != float_to_half(ref3[o]);
        free(src3); free(ref3); free(g3);
        check(!bad3, "copy_f16_cuda B=3, %ld values an image, strides %ld -> %ld at offset %ld: strided block "
              "copy bit-exact with copy_strided_cpu, nothing else written (%ld differ)", m, ss, ds, off, bad3);
        cudaFree(dst);
    }
    twin_compared(u8_to_f16_cuda);
    twin_compared(f32_to_f16_cuda);
    twin_compared(copy_f16_cuda);
    cudaFree(du);
    cudaFree(df);
    cudaFree(dh);
    cudaFree(dh2);
    free(u);
    free(f);
    free(g1);
    free(g2);
}

// the view kernels of the device step (the GPU section of yolo.c): FP16 upsample and max-pool into a channel slice
// (extra channels per image, NaN-poisoned, must stay untouched; the pool reads its input from a channel
// slice too, a channel of 65504s on either side, as SPPF's chain reads the part before it), FP16 and FP32
// strided adds, FP16 -> FP32. All are data movement or one rounding of an exact FP32 sum: bit-exact.
static void test_views_f16(int B, int C, int H, int W, void *stream) {
    long n = (long)B * C * H * W, HW = (long)H * W, extra = 2 * HW;   // two channels of slack per image
    float *xr = xmalloc(4 * n), *ref = xmalloc(16 * n);
    uint16_t *x = rand_f16(n, -3, 3, xr);
    for (long i = 0; i < n; i += 5) { x[i] = x[i / 2]; xr[i] = xr[i / 2]; }   // repeated values: ties
    uint16_t *dx = (uint16_t *)to_dev(x, 2 * n), *dy;
    for (int up = 0; up < 2; up++) {
        long ny = up ? 4 * n : n, img = ny / B, ys = img + (up ? 4 : 1) * extra;
        CK(cudaMalloc((void **)&dy, 2 * (size_t)B * ys));
        CK(cudaMemset(dy, 0xff, 2 * (size_t)B * ys));
        if (up) upsample2_forward_f16_cuda(dx, dy + (up ? 4 : 1) * extra / 2, ys, B, C, H, W, stream);
        else {
            long xs = n / B + 2 * HW;   // (B, 1 + C + 1 channels)
            uint16_t *xp = xmalloc(2 * (size_t)B * xs), *dxp;
            for (long i = 0; i < (long)B * xs; i++) xp[i] = 0x7bff;
            for (int b = 0; b < B; b++) memcpy(xp + b * xs + HW, x + b * (n / B), 2 * (size_t)(n / B));
            dxp = (uint16_t *)to_dev(xp, 2 * (size_t)B * xs);
            maxpool5_forward_f16_cuda(dxp + HW, xs, dy + extra / 2, ys, B, C, H, W, stream);
            cudaFree(dxp);
            free(xp);
        }
        if (up) upsample2_forward_cpu(xr, ref, B, C, H, W);
        else maxpool5_forward_cpu(xr, ref, B, C, H, W);
        uint16_t *got = (uint16_t *)from_dev(dy, 2 * (size_t)B * ys);
        long bad = 0, off = (up ? 4 : 1) * extra / 2;
        for (int b = 0; b < B; b++)
            for (long i = 0; i < ys; i++) {
                uint16_t g = got[b * ys + i];
                if (i >= off && i < off + img) bad += g != float_to_half(ref[b * img + i - off]);
                else bad += g != 0xffff;
            }
        check(!bad,
              "%s B=%d C=%d %dx%d %sinto a channel slice: bit-exact with %s on the fp16 values, nothing else written "
              "(%ld differ)",
              up ? "upsample2_forward_f16_cuda" : "maxpool5_forward_f16_cuda", B, C, H, W,
              up ? "" : "from a channel slice ",
              up ? "upsample2_forward_cpu" : "maxpool5_forward_cpu", bad);
        cudaFree(dy); free(got);
    }
    // adds: src dense (B, n/B), dst with image stride n/B + 3, or + 8 where n/B is a multiple of 8 (the
    // 16-byte add_f16 path)
    long m = n / B, ds = m + (m % 8 ? 3 : 8);
    float *ar = xmalloc(4 * (size_t)B * ds), *f = rand_host(n, -2, 2), *g = rand_host((long)B * ds, -2, 2);
    uint16_t *a = rand_f16((long)B * ds, -2, 2, ar), *da = (uint16_t *)to_dev(a, 2 * (size_t)B * ds);
    add_f16_cuda(dx, m, da, ds, B, m, stream);
    float *df = to_dev(f, 4 * n), *dg = to_dev(g, 4 * (size_t)B * ds);
    add_f32_cuda(df, m, dg, ds, B, m, stream);
    uint16_t *ga = (uint16_t *)from_dev(da, 2 * (size_t)B * ds);
    float *gg = from_dev(dg, 4 * (size_t)B * ds);
    float *war = xmalloc(4 * (size_t)B * ds), *wg = xmalloc(4 * (size_t)B * ds);   // the sums in FP32, as the device
    memcpy(war, ar, 4 * (size_t)B * ds); memcpy(wg, g, 4 * (size_t)B * ds);
    add_strided_cpu(xr, m, war, ds, B, m);
    add_strided_cpu(f, m, wg, ds, B, m);
    long bad1 = 0, bad2 = 0;
    for (int b = 0; b < B; b++)
        for (long i = 0; i < ds; i++) {
            long o = b * ds + i;
            bad1 += ga[o] != (i < m ? float_to_half(war[o]) : a[o]);
            bad2 += memcmp(&gg[o], &wg[o], 4) != 0;
        }
    free(war); free(wg);
    check(!bad1, "add_f16_cuda B=%d n=%ld strided: bit-exact with fp16(a + b) in fp32, padding untouched (%ld differ)",
          B, m, bad1);
    check(!bad2, "add_f32_cuda B=%d n=%ld strided: bit-exact, padding untouched (%ld differ)", B, m, bad2);
    twin_compared(upsample2_forward_f16_cuda);
    twin_compared(maxpool5_forward_f16_cuda);
    twin_compared(add_f16_cuda);
    twin_compared(add_f32_cuda);
    cudaFree(dx); cudaFree(da); cudaFree(df); cudaFree(dg);
    free(x); free(xr); free(ref); free(ar); free(f); free(g); free(a); free(ga); free(gg);
}

// ---- the FP32 twins of the training step's activation-typed launchers (amp=0) ----

// check_slice_f32: B images `stride` values apart, the first `in` of each compared with check_rel (|got -
// ref| <= 1e-5 * scale + 1e-6); the rest of each image must still hold the bits of `outside` (NULL: the
// 0xFF poison the buffer was filled with).
static void check_slice_f32(const char *what, const float *got, const float *ref, const float *scale, int B,
                            long stride, long in, const float *outside) {
    float *g = xmalloc(4 * (size_t)B * in + 4), *r = xmalloc(4 * (size_t)B * in + 4),
          *s = xmalloc(4 * (size_t)B * in + 4);
    long bad_out = 0;
    const uint32_t poison = 0xffffffffu;
    for (int b = 0; b < B; b++) {
        memcpy(g + b * in, got + b * stride, 4 * in);
        memcpy(r + b * in, ref + b * stride, 4 * in);
        memcpy(s + b * in, scale + b * stride, 4 * in);
        for (long i = in; i < stride; i++)
            bad_out += memcmp(&got[b * stride + i], outside ? (const void *)&outside[b * stride + i] : &poison, 4) != 0;
    }
    check_rel(what, g, r, s, (long)B * in, 1e-5);
    if (stride > in)
        check(!bad_out, "%s: the %ld values outside the slices untouched (%ld differ)", what, (long)B * (stride - in),
              bad_out);
    free(g); free(r); free(s);
}
static float *abs_host(const float *p, long n) {
    float *a = xmalloc(4 * (size_t)(n ? n : 1));
    for (long i = 0; i < n; i++) a[i] = fabsf(p[i]);
    return a;
}
static float *poisoned_dev(long n) {   // n floats of 0xFF bytes (NaN): a value never written shows
    float *d; CK(cudaMalloc((void **)&d, 4 * (size_t)(n ? n : 1)));
    CK(cudaMemset(d, 0xff, 4 * (size_t)(n ? n : 1)));
    return d;
}

// conv_{forward,dgrad,wgrad}_f32_cuda against im2col/col2im + gemm_cpu on the same floats. Tolerance per
// value 1e-5 * sum|terms| + 1e-6, the sums of |terms| from the same products of absolute values (plus
// |bias|, plus |initial value| when accumulating). x and dz are channel slices (xextra/zextra channels
// of NaN between images, never to be read); every output outside its slice must stay as it was. The
// wgrad overwrite runs twice: the same bits (deterministic: no atomics, split slices added in a fixed order).
static void test_conv_f32(int B, int Cin, int H, int W, int Cout, int K, int S, int xextra, int zextra, int with_bias,
                          void *stream) {
    int p = K / 2, Ho = (H + 2 * p - K) / S + 1, Wo = (W + 2 * p - K) / S + 1, KK = K * K, HW = H * W, HWo = Ho * Wo,
        Kd = Cin * KK;
    long xs = (long)(Cin + xextra) * HW, zs = (long)(Cout + zextra) * HWo, nx = B * xs, nz = B * zs,
         nw = (long)Cout * Kd;
    ConvDims d = {B, Cin, H, W, Cout, K, S, xextra ? xs : 0, zextra ? zs : 0, 0, 0};
    float *x = rand_host(nx, -1, 1), *w = rand_host(nw, -1, 1), *dz = rand_host(nz, -1, 1),
          *bias = rand_host(Cout, -1, 1);
    float *dx0 = rand_host(nx, -1, 1), *dw0 = rand_host(nw, -1, 1);
    for (int b = 0; b < B; b++) {
        for (long i = (long)Cin * HW; i < xs; i++) x[b * xs + i] = NAN;
        for (long i = (long)Cout * HWo; i < zs; i++) dz[b * zs + i] = NAN;
    }
    float *ax = abs_host(x, nx), *aw = abs_host(w, nw), *adz = abs_host(dz, nz);
    float *col = xmalloc(4 * (size_t)Kd * HWo + 4), *acol = xmalloc(4 * (size_t)Kd * HWo + 4),
          *dcol = xmalloc(4 * (size_t)Kd * HWo + 4);
    float *dxi = xmalloc(4 * (size_t)Cin * HW + 4);
    float *zref = xmalloc(4 * nz), *zsc = xmalloc(4 * nz), *dxref = xmalloc(4 * nx), *dxsc = xmalloc(4 * nx);
    float *dwref = xmalloc(4 * nw), *dwsc = xmalloc(4 * nw);
    memset(zref, 0, 4 * nz); memset(zsc, 0, 4 * nz); memset(dxref, 0, 4 * nx); memset(dxsc, 0, 4 * nx);
    memset(dwref, 0, 4 * nw); memset(dwsc, 0, 4 * nw);
    for (int b = 0; b < B; b++) {
        for (int pass = 0; pass < 2; pass++) {   // 0: values, 1: sums of |terms|
            const float *xx = pass ? ax : x, *ww = pass ? aw : w, *gz = (pass ? adz : dz) + b * zs;
            float *zo = (pass ? zsc : zref) + b * zs, *dxo = (pass ? dxsc : dxref) + b * xs, *c = pass ? acol : col;
            im2col(xx + b * xs, Cin, H, W, K, S, c);
            gemm_cpu(0, 0, Cout, HWo, Kd, ww, Kd, c, HWo, 0.f, zo, HWo);
            if (with_bias)
                for (int o = 0; o < Cout; o++)
                    for (int i = 0; i < HWo; i++) zo[(long)o * HWo + i] += pass ? fabsf(bias[o]) : bias[o];
            gemm_cpu(0, 1, Cout, Kd, HWo, gz, HWo, c, HWo, 1.f, pass ? dwsc : dwref, Kd);
            gemm_cpu(1, 0, Kd, HWo, Cout, ww, Kd, gz, HWo, 0.f, dcol, HWo);
            col2im(dcol, Cin, H, W, K, S, dxi);
            memcpy(dxo, dxi, 4 * (size_t)Cin * HW);
        }
    }
    float *dxd = to_dev(x, 4 * nx), *dwd = to_dev(w, 4 * nw), *ddz = to_dev(dz, 4 * nz),
          *dbias = to_dev(bias, 4 * Cout);
    float *zd = poisoned_dev(nz), *dxacc = to_dev(dx0, 4 * nx), *dxnew = poisoned_dev(nx), *dwacc = to_dev(dw0, 4 * nw),
          *dwnew = poisoned_dev(nw);
    conv_forward_f32_cuda(d, dxd, NULL, dwd, with_bias ? dbias : NULL, zd, stream);
    conv_dgrad_f32_cuda(d, ddz, dwd, dxacc, 1, stream);
    conv_dgrad_f32_cuda(d, ddz, dwd, dxnew, 0, stream);
    long kchunk, nsplit = conv_wgrad_split(d, 1, &kchunk);
    size_t wsb = conv_wgrad_ws_bytes(d, 1);
    float *ws = wsb ? poisoned_dev((long)(wsb / 4)) : NULL;
    conv_wgrad_f32_cuda(d, ddz, dxd, NULL, dwacc, ws, 1, stream);
    conv_wgrad_f32_cuda(d, ddz, dxd, NULL, dwnew, ws, 0, stream);
    float *gz = from_dev(zd, 4 * nz), *gdxa = from_dev(dxacc, 4 * nx), *gdxn = from_dev(dxnew, 4 * nx);
    float *gdwa = from_dev(dwacc, 4 * nw), *gdwn = from_dev(dwnew, 4 * nw);
    conv_wgrad_f32_cuda(d, ddz, dxd, NULL, dwnew, ws, 0, stream);
    float *gdwn2 = from_dev(dwnew, 4 * nw);
    char what[240];
    snprintf(what, sizeof what,
             "conv_forward_f32_cuda B=%d Cin=%d %dx%d Cout=%d K=%d S=%d xs+%d zs+%d %s vs im2col+gemm_cpu (tol "
             "1e-5*sum|terms|+1e-6)",
             B, Cin, H, W, Cout, K, S, xextra, zextra, with_bias ? "bias" : "no bias");
    check_slice_f32(what, gz, zref, zsc, B, zs, (long)Cout * HWo, NULL);
    snprintf(what, sizeof what,
             "conv_dgrad_f32_cuda B=%d Cin=%d %dx%d Cout=%d K=%d S=%d xs+%d overwrite vs gemm_cpu^T+col2im", B, Cin, H,
             W, Cout, K, S, xextra);
    check_slice_f32(what, gdxn, dxref, dxsc, B, xs, (long)Cin * HW, NULL);
    for (long i = 0; i < nx; i++) { dxref[i] += dx0[i]; dxsc[i] += fabsf(dx0[i]); }
    snprintf(what, sizeof what, "conv_dgrad_f32_cuda B=%d Cin=%d %dx%d Cout=%d K=%d S=%d xs+%d accumulate", B, Cin, H,
             W, Cout, K, S, xextra);
    check_slice_f32(what, gdxa, dxref, dxsc, B, xs, (long)Cin * HW, dx0);
    snprintf(what, sizeof what,
             "conv_wgrad_f32_cuda B=%d Cin=%d %dx%d Cout=%d K=%d S=%d zs+%d (%ld slice%s) overwrite vs gemm_cpu(dz, "
             "col^T)",
             B, Cin, H, W, Cout, K, S, zextra, nsplit, nsplit > 1 ? "s" : "");
    check_rel(what, gdwn, dwref, dwsc, nw, 1e-5);
    for (long i = 0; i < nw; i++) { dwref[i] += dw0[i]; dwsc[i] += fabsf(dw0[i]); }
    snprintf(what, sizeof what, "conv_wgrad_f32_cuda B=%d Cin=%d %dx%d Cout=%d K=%d S=%d accumulate", B, Cin, H, W,
             Cout, K, S);
    check_rel(what, gdwa, dwref, dwsc, nw, 1e-5);
    check(!memcmp(gdwn, gdwn2, 4 * nw),
          "conv_wgrad_f32_cuda B=%d Cin=%d Cout=%d K=%d S=%d: a second call gives the same bits", B, Cin, Cout, K, S);
    cudaFree(ws);
    cudaFree(dxd);
    cudaFree(dwd);
    cudaFree(ddz);
    cudaFree(dbias);
    cudaFree(zd);
    cudaFree(dxacc);
    cudaFree(dxnew);
    cudaFree(dwacc);
    cudaFree(dwnew);
    free(x);
    free(w);
    free(dz);
    free(bias);
    free(dx0);
    free(dw0);
    free(ax);
    free(aw);
    free(adz);
    free(col);
    free(acol);
    free(dcol);
    free(dxi);
    free(zref);
    free(zsc);
    free(dxref);
    free(dxsc);
    free(dwref);
    free(dwsc);
    free(gz);
    free(gdxa);
    free(gdxn);
    free(gdwa);
    free(gdwn);
    free(gdwn2);
    twin_compared(conv_forward_f32_cuda);
    twin_compared(conv_dgrad_f32_cuda);
    twin_compared(conv_wgrad_f32_cuda);
}

// bn_stats_f32_cuda (train, then eval) against bn_stats_cpu with test_bn's scales, then
// bn_silu_forward_f32_cuda into a channel slice against bn_silu_forward_cpu: tolerance 1e-5 * (|z*sc| +
// |mean*sc| + |beta| + |y|) + 1e-6 (sc = gamma*invstd; the terms of the affine pre-activation and the
// SiLU's own rounding). z's padding channels are NaN (never read).
static void test_bn_f32(int B, int C, int HW, int zextra, int yextra, void *stream) {
    long zs = (long)(C + zextra) * HW, ys = (long)(C + yextra) * HW, nz = B * zs, ny = B * ys;
    float *z = rand_host(nz, -3, 5), *mean = xmalloc(4 * C), *invstd = xmalloc(4 * C), *rm = rand_host(C, -1, 1),
          *rv = rand_host(C, 0.5f, 2);
    float *rm0 = xmalloc(4 * C), *rv0 = xmalloc(4 * C), *gamma = rand_host(C, 0.5f, 2), *beta = rand_host(C, -1, 1);
    for (int b = 0; b < B; b++) for (long i = (long)C * HW; i < zs; i++) z[b * zs + i] = NAN;
    memcpy(rm0, rm, 4 * C); memcpy(rv0, rv, 4 * C);
    float *dz = to_dev(z, 4 * nz), *dmean = poisoned_dev(C), *dinv = poisoned_dev(C), *drm = to_dev(rm, 4 * C),
          *drv = to_dev(rv, 4 * C);
    float *dg = to_dev(gamma, 4 * C), *db = to_dev(beta, 4 * C),
          *dscr = poisoned_dev((long)bn_stats_scratch_floats(B, C, HW));
    char what[200];
    for (int train = 1; train >= 0; train--) {
        bn_stats_f32_cuda(dz, zextra ? zs : 0, B, C, HW, dmean, dinv, drm, drv, BN_EPS, BN_MOMENTUM, train, dscr,
                          stream);
        bn_stats_cpu(z, zs, B, C, HW, mean, invstd, rm, rv, train);
        float *gm = from_dev(dmean, 4 * C), *gi = from_dev(dinv, 4 * C), *grm = from_dev(drm, 4 * C),
              *grv = from_dev(drv, 4 * C);
        snprintf(what, sizeof what, "bn_stats_f32_cuda B=%d C=%d HW=%d zs+%d %s", B, C, HW, zextra,
                 train ? "train" : "eval");
        check_bn_stats(what, z, zs, B, C, HW, gm, gi, grm, grv, mean, invstd, rm, rv, rm0, rv0);
        memcpy(rm0, rm, 4 * C); memcpy(rv0, rv, 4 * C);
        free(gm); free(gi); free(grm); free(grv);
    }
    float *dm2 = to_dev(mean, 4 * C), *di2 = to_dev(invstd, 4 * C), *dy = poisoned_dev(ny);
    float *zd = xmalloc(4 * (size_t)B * C * HW + 4), *yd = xmalloc(4 * (size_t)B * C * HW + 4), *yref = xmalloc(4 * ny),
          *ysc = xmalloc(4 * ny);
    bn_silu_forward_f32_cuda(dz, zextra ? zs : 0, dm2, di2, dg, db, dy, yextra ? ys : 0, B, C, HW, 0, stream);
    float *gy = from_dev(dy, 4 * ny);
    for (int b = 0; b < B; b++) memcpy(zd + (size_t)b * C * HW, z + b * zs, 4 * (size_t)C * HW);
    bn_silu_forward_cpu(zd, mean, invstd, gamma, beta, yd, B, C, HW);
    for (int b = 0; b < B; b++)
        for (int c = 0; c < C; c++) {
            float s = gamma[c] * invstd[c];
            for (int i = 0; i < HW; i++) {
                long o = b * ys + (long)c * HW + i, q = ((long)b * C + c) * HW + i;
                yref[o] = yd[q];
                ysc[o] = fabsf(zd[q] * s) + fabsf(mean[c] * s) + fabsf(beta[c]) + fabsf(yd[q]);
            }
        }
    snprintf(what, sizeof what, "bn_silu_forward_f32_cuda B=%d C=%d HW=%d zs+%d ys+%d vs bn_silu_forward_cpu", B, C, HW,
             zextra, yextra);
    check_slice_f32(what, gy, yref, ysc, B, ys, (long)C * HW, NULL);
    cudaFree(dz);
    cudaFree(dmean);
    cudaFree(dinv);
    cudaFree(drm);
    cudaFree(drv);
    cudaFree(dg);
    cudaFree(db);
    cudaFree(dm2);
    cudaFree(di2);
    cudaFree(dy);
    cudaFree(dscr);
    free(z);
    free(mean);
    free(invstd);
    free(rm);
    free(rv);
    free(rm0);
    free(rv0);
    free(gamma);
    free(beta);
    free(zd);
    free(yd);
    free(yref);
    free(ysc);
    free(gy);
    twin_compared(bn_stats_f32_cuda);
    twin_compared(bn_silu_forward_f32_cuda);
}

// bn_silu_backward_f32_cuda against bn_silu_backward_cpu (which works in place on a copy of dA). dz is a
// buffer of its own, poisoned outside the slice. Tolerance of dz: 1e-5 * |gamma*invstd| * (|gy terms| +
// |dA*gamma*xhat| (xhat's rounding through silu'') + |mean(gy)| + |xhat*mean(gy*xhat)| + the sums'
// own scales sum|gy|/cnt + |xhat|*sum|gy*xhat|/cnt) + 1e-6; without BN dz = dA. dgamma/dbeta as test_bn_backward.
static void test_bn_backward_f32(int B, int C, int HW, int zextra, int bn, int train, void *stream) {
    long zs = (long)(C + zextra) * HW, nz = B * zs;
    float *z = rand_host(nz, -3, 3), *dA = rand_host(nz, -1, 1), *mean = rand_host(C, -0.5f, 0.5f),
          *invstd = rand_host(C, 0.5f, 2);
    float *gamma = rand_host(C, 0.5f, 2), *beta = rand_host(C, -1, 1), *dgam = rand_host(C, -1, 1),
          *dbet = rand_host(C, -1, 1);
    for (int b = 0; b < B; b++) for (long i = (long)C * HW; i < zs; i++) z[b * zs + i] = dA[b * zs + i] = NAN;
    float *zd = to_dev(z, 4 * nz), *dAd = to_dev(dA, 4 * nz), *dm = to_dev(mean, 4 * C), *di = to_dev(invstd, 4 * C),
          *dg = to_dev(gamma, 4 * C);
    float *db = to_dev(beta, 4 * C), *ddg = to_dev(dgam, 4 * C), *ddb = to_dev(dbet, 4 * C),
          *scratch = poisoned_dev((long)bn_scratch_floats(B, C, HW)), *ddz = poisoned_dev(nz);
    bn_silu_backward_f32_cuda(bn ? zd : NULL, dAd, zextra ? zs : 0, dm, di, bn ? dg : NULL, db, ddg, ddb, ddz,
                              scratch, B, C, HW, train, stream);
    float *sg = xmalloc(4 * C), *sgx = xmalloc(4 * C), *ref = xmalloc(4 * nz), *sc = xmalloc(4 * nz),
          *gyt = xmalloc(4 * nz);
    double cnt = (double)B * HW;
    memcpy(ref, dA, 4 * nz);
    for (int c = 0; c < C; c++) {
        double a = 0, ax = 0, gm = 0, gmx = 0;
        for (int b = 0; b < B; b++) for (int i = 0; i < HW; i++) {
            long o = b * zs + (long)c * HW + i;
            float xh = (z[o] - mean[c]) * invstd[c], y = gamma[c] * xh + beta[c], s1 = 1.f / (1.f + expf(-y));
            float gy = bn ? dA[o] * s1 * (1.f + y * (1.f - s1)) : dA[o];
            gyt[o] = bn ? fabsf(dA[o] * s1) * (1.f + fabsf(y) * (1.f - s1)) + fabsf(dA[o] * gamma[c] * xh)
                        : fabsf(dA[o]);
            a += fabs(gy); ax += fabs(gy * xh); gm += gy; gmx += (double)gy * xh;
        }
        sg[c] = (float)(a + fabs(dbet[c])); sgx[c] = (float)(ax + fabs(dgam[c]));
        for (int b = 0; b < B; b++) for (int i = 0; i < HW; i++) {
            long o = b * zs + (long)c * HW + i;
            double xh = fabs((z[o] - mean[c]) * invstd[c]);
            sc[o] = !bn
                    ? gyt[o]
                    : (float)(fabs(gamma[c] * invstd[c]) *
                              (gyt[o] + (train ? fabs(gm) / cnt + xh * fabs(gmx) / cnt + a / cnt + xh * ax / cnt : 0)));
        }
    }
    bn_silu_backward_cpu(z, ref, zs, mean, invstd, bn ? gamma : NULL, beta, dgam, dbet, B, C, HW, train);
    float *gdg = from_dev(ddg, 4 * C), *gdb = from_dev(ddb, 4 * C), *gz = from_dev(ddz, 4 * nz);
    char what[200];
    snprintf(what, sizeof what, "bn_silu_backward_f32_cuda B=%d C=%d HW=%d zs+%d %s %s: dz vs bn_silu_backward_cpu", B,
             C, HW, zextra, bn ? "BN" : "bias", train ? "train" : "eval");
    check_slice_f32(what, gz, ref, sc, B, zs, (long)C * HW, NULL);
    snprintf(what, sizeof what, "bn_silu_backward_f32_cuda B=%d C=%d HW=%d %s: dbeta (+=)", B, C, HW,
             bn ? "BN" : "bias");
    check_rel(what, gdb, dbet, sg, C, 1e-5);
    if (bn) {
        snprintf(what, sizeof what, "bn_silu_backward_f32_cuda B=%d C=%d HW=%d: dgamma (+=)", B, C, HW);
        check_rel(what, gdg, dgam, sgx, C, 1e-5);
    }
    cudaFree(zd);
    cudaFree(dAd);
    cudaFree(dm);
    cudaFree(di);
    cudaFree(dg);
    cudaFree(db);
    cudaFree(ddg);
    cudaFree(ddb);
    cudaFree(scratch);
    cudaFree(ddz);
    free(z);
    free(dA);
    free(mean);
    free(invstd);
    free(gamma);
    free(beta);
    free(dgam);
    free(dbet);
    free(sg);
    free(sgx);
    free(ref);
    free(sc);
    free(gyt);
    free(gdg); free(gdb); free(gz);
    twin_compared(bn_silu_backward_f32_cuda);
}

// The FP32 views, all data movement: upsample2_forward_f32_cuda and maxpool5_forward_f32_cuda into a channel
// slice (ties, -inf, a NaN that the pool skips as the CPU does; the pool from a channel slice, +inf on
// either side), copy_f32_cuda by offset, u8_to_f32_cuda
// against input_from_batch over all 256 byte values: bit-exact, and nothing written outside.
static void test_views_f32(int B, int C, int H, int W, void *stream) {
    long n = (long)B * C * H * W, extra = 2L * H * W;   // two channels of slack per image
    float *x = rand_host(n, -3, 3), *ref = xmalloc(16 * n);
    for (long i = 0; i < n; i += 5) x[i] = x[i / 2];   // repeated values: ties
    if (n > 9) { x[3] = -INFINITY; x[9] = NAN; }
    float *dx = to_dev(x, 4 * n);
    char what[200];
    for (int up = 0; up < 2; up++) {
        long img = (up ? 4 : 1) * n / B, ys = img + (up ? 4 : 1) * extra, off = (up ? 4 : 1) * extra / 2;
        float *dy = poisoned_dev((long)B * ys), *yref = xmalloc(4 * (size_t)B * ys);
        if (up) {
            upsample2_forward_f32_cuda(dx, dy + off, ys, B, C, H, W, stream);
            upsample2_forward_cpu(x, ref, B, C, H, W);
        } else {
            long HW = (long)H * W, xs = n / B + 2 * HW;   // (B, 1 + C + 1 channels)
            float *xp = xmalloc(4 * (size_t)B * xs), *dxp;
            for (long i = 0; i < (long)B * xs; i++) xp[i] = INFINITY;
            for (int b = 0; b < B; b++) memcpy(xp + b * xs + HW, x + b * (n / B), 4 * (size_t)(n / B));
            dxp = to_dev(xp, 4 * (size_t)B * xs);
            maxpool5_forward_f32_cuda(dxp + HW, xs, dy + off, ys, B, C, H, W, stream);
            cudaFree(dxp);
            free(xp);
            maxpool5_forward_cpu(x, ref, B, C, H, W);
        }
        float *got = from_dev(dy, 4 * (size_t)B * ys);
        memset(yref, 0xff, 4 * (size_t)B * ys);
        for (int b = 0; b < B; b++) memcpy(yref + b * ys + off, ref + b * img, 4 * img);
        snprintf(what, sizeof what, "%s B=%d C=%d %dx%d %sinto a channel slice vs %s (incl. the untouched rest)",
                 up ? "upsample2_forward_f32_cuda" : "maxpool5_forward_f32_cuda", B, C, H, W,
                 up ? "" : "from a channel slice ",
                 up ? "upsample2_forward_cpu" : "maxpool5_forward_cpu");
        check_bits(what, got, yref, (long)B * ys);
        cudaFree(dy); free(yref); free(got);
    }
    // copy: B images of m values into the middle of larger per-image blocks, at strides and an offset that
    // allow no 16-byte words, then at ones that do (4 floats a thread, a tail of 3 one by one)
    for (int wide = 0; wide < 2; wide++) {
        long ss = wide ? n / B / 4 * 4 : n / B, m = wide ? ss - 1 : ss, off = wide ? 4 : 2;
        long ds = wide ? ss + 4 : m + 5, tot = B * ds + off;
        float *dst = poisoned_dev(tot), *cref = xmalloc(4 * (size_t)tot);
        copy_f32_cuda(dx, ss, dst + off, ds, B, m, stream);
        float *gc = from_dev(dst, 4 * (size_t)tot);
        memset(cref, 0xff, 4 * (size_t)tot);
        copy_strided_cpu(x, ss, cref + off, ds, B, m);
        snprintf(what, sizeof what, "copy_f32_cuda B=%d, %ld values an image, strides %ld -> %ld at offset %ld: "
                 "strided block copy (incl. the untouched rest)", B, m, ss, ds, off);
        check_bits(what, gc, cref, tot);
        cudaFree(dst); free(cref); free(gc);
    }
    // u8 -> f32: an image batch of 2 x 3 x 5 x 29 bytes, every byte value
    Batch bt; memset(&bt, 0, sizeof bt);
    bt.B = 2; bt.H = 5; bt.W = 29;
    long nu = 2L * 3 * 5 * 29;
    bt.img = xmalloc(nu);
    for (long i = 0; i < nu; i++) bt.img[i] = (uint8_t)(i * 37 + 11);
    void *du = to_dev(bt.img, nu);
    float *df = poisoned_dev(nu), *uref = xmalloc(4 * nu);
    u8_to_f32_cuda(du, df, nu, stream);
    float *gu = from_dev(df, 4 * nu);
    input_from_batch(uref, &bt);
    snprintf(what, sizeof what, "u8_to_f32_cuda n=%ld vs input_from_batch", nu);
    check_bits(what, gu, uref, nu);
    // from one byte past an aligned address: no 4-byte loads, one value a thread
    u8_to_f32_cuda((uint8_t *)du + 1, df, nu - 1, stream);
    free(gu);
    gu = from_dev(df, 4 * nu);
    snprintf(what, sizeof what, "u8_to_f32_cuda n=%ld from an odd address vs input_from_batch", nu - 1);
    check_bits(what, gu, uref + 1, nu - 1);
    twin_compared(upsample2_forward_f32_cuda);
    twin_compared(maxpool5_forward_f32_cuda);
    twin_compared(copy_f32_cuda);
    twin_compared(u8_to_f32_cuda);
    cudaFree(dx); cudaFree(du); cudaFree(df);
    free(x); free(ref); free(bt.img); free(uref); free(gu);
}

// ---- loss ----

// loss_cuda against loss_forward_backward at grad_scale 1 and 1024, on random heads whose box logits point
// at the boxes (so the overlaps are real), with planted situations that each failed under a mutation of the
// rule it tests: anchors claimed by two gts (overlapping boxes; two equal boxes of two classes tie in
// overlap: the first gt wins); the zero-align fill of the top-k, which counts the positives before a zero
// (class 0 of image 0 has logits -100 but at anchors 0-2) and stops before far anchors; tied aligns across
// the top-10 cut (the lower anchors win), with and without a larger align met after the ties; an image
// with no boxes, an invalid (all zero) box, an image over the cap M. Boxes: pixels x1 y1 x2 y2, image,
// class. The coverage is read from the CPU's scratch and checked too.
// Tolerances (the same float formulas, the sums in double in another order; on a GPU also fused
// multiply-adds and the last-bit differences of expf/logf/atanf/powf): loss components and
// target_scores_sum 1e-5 relative; n_fg exact; each dhead value |got - ref| <= 1e-5 * max(|ref|, u),
// u = grad_scale*B*box_gain/tss, the largest coefficient of a gradient term (each value is a few such
// terms times probability-sized factors), so that values which cancel to near 0 are held to the rounding
// of their terms. Two more calls: the same bits again (deterministic) and, without dhead, the same losses.
typedef struct { float x1, y1, x2, y2; int b, cls; } LossTestBox;
// loss_set_dist: the 64 box logits of anchor r of image b in level map z (C channels, HW anchors) such that
// the decoded distances are d (4, grid units, clamped to [0, 14.9]): two adjacent bins per side whose
// softmax mean is d, the rest -30. An integer d >= 1 decodes exactly (the other bins fall below half an ulp).
static void loss_set_dist(float *z, int C, int HW, int b, int r, const float *d) {
    z += (size_t)b * C * HW + r;
    for (int k = 0; k < 4; k++) {
        double dk = fmin(fmax(d[k], 0.0), 14.9), f = dk - floor(dk);
        for (int i = 0; i < 16; i++) z[(size_t)(16 * k + i) * HW] = -30.f;
        z[(size_t)(16 * k + (int)dk) * HW] = (float)log(1 - f + 1e-12);
        z[(size_t)(16 * k + (int)dk + 1) * HW] = (float)log(f + 1e-12);
    }
}
static void test_loss(int B, int NC, int imgH, int imgW, int M, const LossTestBox *bx, int nbox, int want_over, int tie,
                      int tie_push, void *stream) {
    _Static_assert(sizeof(LossGt) == sizeof(LossGtD), "LossGtD mirrors LossGt");
    LossGrid g = loss_grid_make(imgH, imgW);
    int A = g.A, C = 64 + NC;
    LossConfig cfg = loss_config_default();
    cfg.max_boxes = M;
    // targets as the loader gives them (normalised cx cy w h), gathered per image as the host would
    int *bi = xmalloc(sizeof(int) * (nbox + 1)), *cl = xmalloc(sizeof(int) * (nbox + 1));
    float *nb = xmalloc(sizeof(float) * 4 * (nbox + 1));
    for (int i = 0; i < nbox; i++) {
        bi[i] = bx[i].b; cl[i] = bx[i].cls;
        nb[4 * i] = (bx[i].x1 + bx[i].x2) / 2 / imgW; nb[4 * i + 1] = (bx[i].y1 + bx[i].y2) / 2 / imgH;
        nb[4 * i + 2] = (bx[i].x2 - bx[i].x1) / imgW; nb[4 * i + 3] = (bx[i].y2 - bx[i].y1) / imgH;
    }
    LossTargets tg = {nbox, bi, cl, nb};
    LossGt *gts = xcalloc((size_t)B * M, sizeof(LossGt));
    int *m = xmalloc(sizeof(int) * B), over = 0;
    for (int b = 0; b < B; b++) {
        m[b] = loss_gather_gts(&tg, b, NC, imgH, imgW, M, gts + (size_t)b * M);
        if (m[b] > M) { over += m[b] - M; m[b] = M; }
    }
    // head: box logits N(0, 0.5) plus a bump at the distance (bins) from the anchor to the edges of one of
    // its image's boxes (with noise), or at random distances; class logits N(-1, 2). Image 0, class 0: logits
    // -100 (align 0), except at anchors 0, 1, 2 (level 0, top row): logit 3 and box logits that predict the
    // image's first class-0 box (two bins per side whose mean is the distance), so that box has positives
    // at the lowest anchors and the zero-align fill must count them (a - positives before a < 10 - npos).
    float *head[3], *dref[3], *dgot[3], *dh[3], *dd[3];
    size_t n[3];
    for (int l = 0; l < 3; l++) {
        int W = g.W[l], HW = g.H[l] * W;
        float s = g.stride[l];
        n[l] = (size_t)B * C * HW;
        head[l] = xmalloc(sizeof(float) * n[l]);
        dref[l] = xmalloc(sizeof(float) * n[l]);
        for (int b = 0; b < B; b++)
            for (int r = 0; r < HW; r++) {
                float ax = ((r % W) + 0.5f) * s, ay = ((r / W) + 0.5f) * s, d[4];
                const LossGt *q = m[b] ? &gts[(size_t)b * M + rng_int(&rng, m[b])] : NULL;
                for (int k = 0; k < 4; k++) d[k] = (float)rng_range(&rng, 0, 10);
                if (q && rng_uniform(&rng) < 0.8) {
                    float e[4] = {ax - q->x1, ay - q->y1, q->x2 - ax, q->y2 - ay};
                    for (int k = 0; k < 4; k++)
                        d[k] = fminf(fmaxf(e[k] / s + (float)rng_range(&rng, -0.7, 0.7), 0.f), 15.f);
                }
                float *z = head[l] + (size_t)b * C * HW + r;
                for (int k = 0; k < 4; k++)
                    for (int i = 0; i < 16; i++)
                        z[(size_t)(16 * k + i) * HW] =
                                (float)(0.5 * rng_normal(&rng) + 3.0 * exp(-0.5 * (i - d[k]) * (i - d[k])));
                for (int c = 0; c < NC; c++)
                    z[(size_t)(64 + c) * HW] = b == 0 && c == 0 ? -100.f : (float)(2 * rng_normal(&rng) - 1);
            }
    }
    int HW0 = g.H[0] * g.W[0], W0 = g.W[0], ntie = 0;
    const LossGt *q0 = NULL;
    for (int j = 0; j < m[0] && !q0; j++) q0 = gts[j].cls == 0 ? &gts[j] : NULL;
    for (int a = 0; a < 3 && q0; a++) {
        float ax = a + 0.5f, ay = 0.5f, e[4] = {ax - q0->x1 / 8, ay - q0->y1 / 8, q0->x2 / 8 - ax, q0->y2 / 8 - ay};
        head[0][(size_t)64 * HW0 + a] = 3.f;
        loss_set_dist(head[0], C, HW0, 0, a, e);
    }
    // tie: box bx[tie] is predicted by every level-0 anchor of its image inside the box snapped outwards to
    // 4 + 8k pixels, at integer distances (exact), with class logit 2: equal align at every such anchor, so
    // that box's top-10 is a choice among ties (the lowest anchors win, also when a larger align comes later)
    if (tie >= 0) {
        const LossTestBox *t = &bx[tie];
        float px1 = floorf((t->x1 - 4) / 8), py1 = floorf((t->y1 - 4) / 8), px2 = ceilf((t->x2 - 4) / 8),
              py2 = ceilf((t->y2 - 4) / 8);
        for (int r = 0; r < HW0; r++) {
            float cx = (float)(r % W0), cy = (float)(r / W0), e[4] = {cx - px1, cy - py1, px2 - cx, py2 - cy};
            if (e[0] < 1 || e[1] < 1 || e[2] < 1 || e[3] < 1) continue;
            head[0][((size_t)t->b * C + 64 + t->cls) * HW0 + r] = 2.f;
            loss_set_dist(head[0], C, HW0, t->b, r, e);
            ntie++;
        }
        // tie_push: and one level-1 anchor inside, met after the ties, predicts the box itself with logit 5: a
        // larger align that pushes the last of the kept ties out
        if (tie_push) {
            int W1 = g.W[1], r1 = (int)((t->y1 + t->y2) / 32) * W1 + (int)((t->x1 + t->x2) / 32);
            float cx = (r1 % W1) + 0.5f, cy = (r1 / W1) + 0.5f;
            float e[4] = {cx - t->x1 / 16, cy - t->y1 / 16, t->x2 / 16 - cx, t->y2 / 16 - cy};
            head[1][((size_t)t->b * C + 64 + t->cls) * g.H[1] * W1 + r1] = 5.f;
            loss_set_dist(head[1], C, g.H[1] * W1, t->b, r1, e);
        }
    }
    for (int l = 0; l < 3; l++) {
        dh[l] = to_dev(head[l], sizeof(float) * n[l]);
        CK(cudaMalloc((void **)&dd[l], sizeof(float) * n[l]));
    }
    size_t cbytes = loss_scratch_bytes(B, A, M), gbytes = loss_cuda_scratch_bytes(B, A, M);
    void *cscratch = xmalloc(cbytes), *gscratch;
    CK(cudaMalloc(&gscratch, gbytes));
    LossGtD *dgts = (LossGtD *)to_dev(gts, sizeof(LossGt) * B * M);
    int *dm = (int *)to_dev(m, sizeof(int) * B);
    double *dout;
    CK(cudaMalloc((void **)&dout, 5 * sizeof(double)));
    char what[256];
    for (int gsi = 0; gsi < 2; gsi++) {
        float gs = gsi ? 1024.f : 1.f;
        LossOut ref = loss_forward_backward(&cfg, B, NC, imgH, imgW, (const float *const *)head, dref, &tg, gs,
                                            cscratch, cbytes, 0);
        if (gsi == 0) {   // what the case covers, from the CPU's assignment
            LossWork w = loss_work_carve(cscratch, B, A, M);
            int twice = 0, zero_al = 0;
            for (int b = 0; b < B; b++) {
                size_t o = (size_t)b * M;
                for (int j = 0; j < m[b]; j++)
                    for (int i = 0; i < w.nsel[o + j]; i++) {
                        zero_al += w.cand[(o + j) * LOSS_TOPK + i].align == 0.0f;
                        for (int j2 = 0; j2 < j; j2++)
                            for (int i2 = 0; i2 < w.nsel[o + j2]; i2++)
                                twice += w.cand[(o + j) * LOSS_TOPK + i].a == w.cand[(o + j2) * LOSS_TOPK + i2].a;
                    }
            }
            check(twice > 0 && zero_al > 0 && over == want_over && ref.n_over_cap == want_over &&
                          (tie < 0 || ntie > 10),
                  "loss case B=%d NC=%d %dx%d M=%d covers: %d claims of an anchor by a second gt, %d top-k candidates "
                  "of align 0 (zero-align fill), %d boxes over the cap (want %d), %d anchors of equal align for one "
                  "box",
                  B, NC, imgW, imgH, M, twice, zero_al, over, want_over, ntie);
        }
        for (int l = 0; l < 3; l++) CK(cudaMemset(dd[l], 0xff, sizeof(float) * n[l]));   // NaN: all must be written
        loss_cuda(B, NC, imgH, imgW, (const float *const *)dh, dd, dgts, dm, M, cfg.box, cfg.cls, cfg.dfl, gs, gscratch,
                  dout, stream);
        double *out = (double *)from_dev(dout, 5 * sizeof(double));
        const char *nm[3] = {"box", "cls", "dfl"};
        double rv[3] = {ref.box, ref.cls, ref.dfl};
        for (int k = 0; k < 3; k++) {
            snprintf(what, sizeof what,
                     "loss_cuda B=%d NC=%d %dx%d M=%d grad_scale %g: %s vs loss_forward_backward (tol 1e-5 rel)", B, NC,
                     imgW, imgH, M, gs, nm[k]);
            check_close(what, out[k], rv[k], 1e-5 * fabs(rv[k]));
        }
        snprintf(what, sizeof what, "loss_cuda B=%d NC=%d %dx%d: target_scores_sum (tol 1e-5 rel)", B, NC, imgW, imgH);
        check_close(what, out[3], ref.target_scores_sum, 1e-5 * ref.target_scores_sum);
        check(out[4] == ref.n_fg, "loss_cuda B=%d NC=%d %dx%d: n_fg %g, want %d (exact)", B, NC, imgW, imgH, out[4],
              ref.n_fg);
        double u = gs * B * cfg.box / ref.target_scores_sum, worst = 0, wg = 0, wr = 0;
        long bad = 0, cnt = 0;
        for (int l = 0; l < 3; l++) {
            dgot[l] = from_dev(dd[l], sizeof(float) * n[l]);
            for (size_t i = 0; i < n[l]; i++, cnt++) {
                double d = fabs((double)dgot[l][i] - dref[l][i]), tol = 1e-5 * fmax(fabs(dref[l][i]), u);
                if (!(d <= tol)) bad++;
                if (!(d / tol <= worst)) { worst = d / tol; wg = dgot[l][i]; wr = dref[l][i]; }
            }
        }
        check(!bad, "loss_cuda B=%d NC=%d %dx%d grad_scale %g: dhead vs loss_forward_backward, %ld values: worst "
              "|diff|/tol %.3g (got %.9g ref %.9g), tol 1e-5*max(|ref|, grad_scale*B*box_gain/tss = %.3g), %ld over",
              B, NC, imgW, imgH, gs, cnt, worst, wg, wr, u, bad);
        // again: the same bits; then without a gradient: the same losses
        loss_cuda(B, NC, imgH, imgW, (const float *const *)dh, dd, dgts, dm, M, cfg.box, cfg.cls, cfg.dfl, gs, gscratch,
                  dout, stream);
        double *out2 = (double *)from_dev(dout, 5 * sizeof(double));
        long diff = memcmp(out, out2, 5 * sizeof(double)) != 0;
        for (int l = 0; l < 3; l++) {
            float *again = from_dev(dd[l], sizeof(float) * n[l]);
            diff += memcmp(again, dgot[l], sizeof(float) * n[l]) != 0;
            free(again);
        }
        loss_cuda(B, NC, imgH, imgW, (const float *const *)dh, NULL, dgts, dm, M, cfg.box, cfg.cls, cfg.dfl, gs,
                  gscratch, dout, stream);
        double *out3 = (double *)from_dev(dout, 5 * sizeof(double));
        check(!diff && !memcmp(out, out3, 5 * sizeof(double)),
              "loss_cuda B=%d NC=%d %dx%d grad_scale %g: a second call gives the same bits (losses and dhead), a call "
              "without dhead the same losses", B, NC, imgW, imgH, gs);
        free(out); free(out2); free(out3);
        for (int l = 0; l < 3; l++) free(dgot[l]);
    }
    for (int l = 0; l < 3; l++) { free(head[l]); free(dref[l]); cudaFree(dh[l]); cudaFree(dd[l]); }
    cudaFree(gscratch); cudaFree(dgts); cudaFree(dm); cudaFree(dout);
    free(cscratch); free(gts); free(m); free(bi); free(cl); free(nb);
    twin_compared(loss_cuda);
}

// a small Model whose flat parameter layout has the three groups and the frozen DFL weight at the end
static Model *optim_model(void) {
    Model *m = xmalloc(sizeof *m);
    memset(m, 0, sizeof *m);
    int geo[4][4] = {{3, 8, 3, 1}, {8, 5, 1, 1}, {5, 6, 1, 0}, {5, 20, 3, 1}};   // cin, cout, k, bn
    size_t off = 0;
    m->nconv = 4;
    for (int i = 0; i < 4; i++) {
        Conv *c = &m->conv[i];
        c->cin = geo[i][0]; c->cout = geo[i][1]; c->k = geo[i][2]; c->bn = geo[i][3];
        c->w_off = off; off += (size_t)c->cout * c->cin * c->k * c->k;
        if (c->bn) { c->g_off = off; off += c->cout; }
        c->b_off = off; off += c->cout;
    }
    m->dfl_off = off;
    m->nparams = off + REG_MAX;
    m->params = xmalloc(4 * m->nparams);
    m->grads = xmalloc(4 * m->nparams);
    return m;
}
// optim_norm_cuda + optim_step_cuda (loss scale 1024, gradients given scaled) against grad_clip_norm +
// optim_step on the unscaled gradients, three steps; then a forced overflow skips the step and
// halves the GradScaler. fused: optim_step_cuda also writes the FP16 copy (bit for bit the host's
// rounding of the updated parameters, every value) and the EMA (against the host's d*ema + (1-d)*p);
// a skipped step leaves the copy as it was and updates the EMA only when asked to (ema_skipped).
static void test_optim(int kind, float gmag, float max_norm, int fused, void *stream) {
    Model *m = optim_model();
    long n = (long)m->nparams;
    uint8_t *group = xmalloc(n);
    memset(group, OPT_NO_GROUP, n);
    for (int ci = 0; ci < m->nconv; ci++) {
        size_t off[3], len[3]; int pg[3];
        model_segments(m, ci, off, len, pg);
        for (int s2 = 0; s2 < 3; s2++) for (size_t i = 0; i < len[s2]; i++) group[off[s2] + i] = (uint8_t)pg[s2];
    }
    for (long i = 0; i < n; i++) m->params[i] = (float)rng_range(&rng, -1, 1);
    Optimizer o;
    memset(&o, 0, sizeof o);
    o.kind = kind; o.lr[PG_BIAS] = 0.1; o.lr[PG_WEIGHT] = 0.01; o.lr[PG_BN] = 0.02;
    o.momentum = kind == OPT_SGD ? 0.937 : 0.9; o.beta2 = 0.999; o.eps = 1e-8; o.weight_decay = 5e-4;
    o.m = xmalloc(4 * n); o.v = kind == OPT_ADAMW ? xmalloc(4 * n) : NULL;
    memset(o.m, 0, 4 * n); if (o.v) memset(o.v, 0, 4 * n);
    float *dp = to_dev(m->params, 4 * n), *dm = to_dev(o.m, 4 * n), *dv = to_dev(o.m, 4 * n), *dg, *partials, *dnorm;
    void *dgroup = to_dev(group, n);
    CK(cudaMalloc((void **)&dg, 4 * n));
    CK(cudaMalloc((void **)&partials, 8 * OPT_NORM_BLOCKS));
    CK(cudaMalloc((void **)&dnorm, 4));
    // the EMA and the FP16 copy: poisoned (0x7e01, a NaN no rounding gives) where the step must write
    float *ema = rand_host(n, -1, 1), *dema = fused ? to_dev(ema, 4 * n) : NULL;
    uint16_t *w16h = xmalloc(2 * n), *dw16 = NULL;
    for (long i = 0; i < n; i++) w16h[i] = 0x7e01;
    if (fused) dw16 = (uint16_t *)to_dev(w16h, 2 * n);
    const float S = 1024.f;
    float *gs = xmalloc(4 * n), *p0 = xmalloc(4 * n);
    char what[200];
    const char *name = kind == OPT_SGD ? "SGD" : "AdamW";
    for (int step = 0; step < 3; step++) {
        for (long i = 0; i < n; i++) { m->grads[i] = (float)rng_range(&rng, -gmag, gmag); gs[i] = m->grads[i] * S; }
        memcpy(p0, m->params, 4 * n);
        CK(cudaMemcpy(dg, gs, 4 * n, cudaMemcpyHostToDevice));
        OptimHyper h = gpu_optim_hyper(&o, 1.f / S, max_norm);
        const float ed = 0.3f + 0.25f * (float)step;   // an EMA decay a step
        optim_norm_cuda(dg, dgroup, n, 1.f / S, partials, stream);
        optim_step_cuda(dp, dg, dm, dv, dgroup, n, partials, h, dnorm, dw16, dema, ed, 1, stream);
        double norm = max_norm > 0 ? grad_clip_norm(m, max_norm) : 0;
        if (max_norm <= 0) {
            double ss = 0;
            for (long i = 0; i < n; i++)
                if (group[i] != OPT_NO_GROUP) ss += (double)m->grads[i] * m->grads[i];
            norm = sqrt(ss);
        }
        optim_step(&o, m);
        float *gp = from_dev(dp, 4 * n), *gm = from_dev(dm, 4 * n),
              *gv = kind == OPT_ADAMW ? from_dev(dv, 4 * n) : NULL, *gn = from_dev(dnorm, 4);
        float *sc = xmalloc(4 * n), *scm = xmalloc(4 * n), nref = (float)norm, nsc = nref;
        for (long i = 0; i < n; i++) {
            sc[i] = fabsf(p0[i]) + fabsf(m->params[i]) + 1e-3f * fabsf(m->params[i] - p0[i]);
            scm[i] = fabsf(o.m[i]) * 4;
        }
        snprintf(what, sizeof what, "optim_norm_cuda %s step %d: norm of the unscaled gradients %.6g (clip %g)", name,
                 step + 1, norm, max_norm);
        check_rel(what, gn, &nref, &nsc, 1, 1e-5);
        snprintf(what, sizeof what,
                 "optim_step_cuda %s step %d (loss scale %g, clip %g) vs grad_clip_norm+optim_step: params", name,
                 step + 1, S, max_norm);
        check_rel(what, gp, m->params, sc, n, 1e-5);
        snprintf(what, sizeof what, "optim_step_cuda %s step %d: first moment / momentum buffer", name, step + 1);
        check_rel(what, gm, o.m, scm, n, 1e-5);
        if (gv) {
            for (long i = 0; i < n; i++) scm[i] = fabsf(o.v[i]) * 4;
            snprintf(what, sizeof what, "optim_step_cuda %s step %d: second moment", name, step + 1);
            check_rel(what, gv, o.v, scm, n, 1e-5);
        }
        long dfl_bad = 0;
        for (int k = 0; k < REG_MAX; k++) dfl_bad += memcmp(&gp[m->dfl_off + k], &p0[m->dfl_off + k], 4) != 0;
        check(!dfl_bad, "optim_step_cuda %s: the frozen DFL values (OPT_NO_GROUP) are not updated", name);
        if (fused) {
            uint16_t *gw = (uint16_t *)from_dev(dw16, 2 * n);
            float *ge = from_dev(dema, 4 * n);
            long wbad = 0;
            for (long i = 0; i < n; i++) {
                wbad += gw[i] != float_to_half(gp[i]);
                ema[i] = ed * ema[i] + (1 - ed) * m->params[i];
                sc[i] = fabsf(ema[i]) + fabsf(m->params[i]);
            }
            check(!wbad, "optim_step_cuda %s step %d: the FP16 copy is the updated parameters rounded, every value "
                  "(%ld differ)", name, step + 1, wbad);
            snprintf(what, sizeof what, "optim_step_cuda %s step %d: the EMA (d %g) of the updated parameters", name,
                     step + 1, ed);
            check_rel(what, ge, ema, sc, n, 1e-5);
            CK(cudaMemcpy(dema, ema, 4 * n, cudaMemcpyHostToDevice));
            free(gw);
            free(ge);
        }
        // keep CPU and GPU on the same state for the next step
        CK(cudaMemcpy(dp, m->params, 4 * n, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dm, o.m, 4 * n, cudaMemcpyHostToDevice));
        if (o.v) CK(cudaMemcpy(dv, o.v, 4 * n, cudaMemcpyHostToDevice));
        free(gp); free(gm); free(gv); free(gn); free(sc); free(scm);
    }
    // forced overflow: an inf (then a NaN) gradient skips the step and halves the scale
    GradScaler gsc;
    grad_scaler_init(&gsc);
    for (int t = 0; t < 2; t++) {
        for (long i = 0; i < n; i++) gs[i] = (float)rng_range(&rng, -gmag, gmag) * gsc.scale;
        gs[n / 2] = t == 0 ? INFINITY : NAN;
        CK(cudaMemcpy(dg, gs, 4 * n, cudaMemcpyHostToDevice));
        OptimHyper h = gpu_optim_hyper(&o, 1.f / gsc.scale, max_norm);
        uint16_t *w0 = fused ? (uint16_t *)from_dev(dw16, 2 * n) : NULL;
        optim_norm_cuda(dg, dgroup, n, 1.f / gsc.scale, partials, stream);
        // the inf: AMP's skip (the EMA follows the unchanged parameters); the NaN: amp=0's (no EMA)
        optim_step_cuda(dp, dg, dm, dv, dgroup, n, partials, h, dnorm, dw16, dema, 0.5f, t == 0, stream);
        float *gp = from_dev(dp, 4 * n), *gm = from_dev(dm, 4 * n), *gn = from_dev(dnorm, 4);
        if (fused) {
            uint16_t *gw = (uint16_t *)from_dev(dw16, 2 * n);
            float *ge = from_dev(dema, 4 * n), *sce = xmalloc(4 * n);
            for (long i = 0; i < n; i++) {
                if (t == 0) ema[i] = 0.5f * ema[i] + 0.5f * m->params[i];
                sce[i] = fabsf(ema[i]) + fabsf(m->params[i]);
            }
            check(!memcmp(gw, w0, 2 * n), "optim_step_cuda %s, %s gradient: the FP16 copy left as it was", name,
                  t == 0 ? "inf" : "NaN");
            if (t == 0)
                check_rel("optim_step_cuda, inf gradient: the EMA of the unchanged parameters (ema_skipped)", ge, ema,
                          sce, n, 1e-5);
            else check(!memcmp(ge, ema, 4 * n), "optim_step_cuda %s, NaN gradient: the EMA left as it was", name);
            free(gw);
            free(ge);
            free(sce);
        }
        free(w0);
        int taken = grad_scaler_update(&gsc, !isfinite(gn[0]));
        check(!isfinite(gn[0]) && !taken && !memcmp(gp, m->params, 4 * n) && !memcmp(gm, o.m, 4 * n) &&
                      gsc.scale == (t == 0 ? 32768.f : 16384.f),
              "%s: %s in a gradient: norm %g not finite, step skipped (params and moments bit-identical), GradScaler "
              "scale -> %g",
              name, t == 0 ? "inf" : "NaN", gn[0], gsc.scale);
        free(gp); free(gm); free(gn);
    }
    if (kind == OPT_SGD) {   // growth: x2 after 2000 consecutive good steps, not before
        int ok = 1;
        for (int i = 1; i <= 2000; i++) { grad_scaler_update(&gsc, 0); if (i < 2000 && gsc.scale != 16384.f) ok = 0; }
        ok &= gsc.scale == 32768.f && gsc.good_steps == 0;
        grad_scaler_update(&gsc, 0); grad_scaler_update(&gsc, 1);
        ok &= gsc.scale == 16384.f && gsc.good_steps == 0;
        check(ok, "GradScaler: init 65536, x2 after 2000 good steps, x0.5 and tracker reset on overflow");
    }
    cudaFree(dp); cudaFree(dm); cudaFree(dv); cudaFree(dg); cudaFree(partials); cudaFree(dnorm); cudaFree(dgroup);
    cudaFree(dema); cudaFree(dw16); free(ema); free(w16h);
    free(group); free(o.m); free(o.v); free(gs); free(p0); free(m->params); free(m->grads); free(m);
    twin_compared(optim_norm_cuda);
    twin_compared(optim_step_cuda);
}

static void test_ema(void *stream) {
    Model *m = optim_model();
    m->nbuffers = 37;
    m->buffers = rand_host(m->nbuffers, -1, 1);
    for (size_t i = 0; i < m->nparams; i++) m->params[i] = (float)rng_range(&rng, -1, 1);
    Ema e = {rand_host(m->nparams, -1, 1), rand_host(m->nbuffers, -1, 1), 5};
    float *dep = to_dev(e.params, 4 * m->nparams), *deb = to_dev(e.buffers, 4 * m->nbuffers),
          *dp = to_dev(m->params, 4 * m->nparams), *db = to_dev(m->buffers, 4 * m->nbuffers);
    float *sc = xmalloc(4 * m->nparams);
    for (size_t i = 0; i < m->nparams; i++) sc[i] = fabsf(e.params[i]) + fabsf(m->params[i]);
    ema_update(&e, m);
    float d = (float)(0.9999 * (1 - exp(-(double)e.updates / 2000.0)));
    ema_update_cuda(dep, dp, (long)m->nparams, d, stream);
    ema_update_cuda(deb, db, (long)m->nbuffers, d, stream);
    float *gp = from_dev(dep, 4 * m->nparams), *gb = from_dev(deb, 4 * m->nbuffers);
    check_rel("ema_update_cuda vs ema_update: params", gp, e.params, sc, (long)m->nparams, 1e-5);
    for (size_t i = 0; i < m->nbuffers; i++) sc[i] = 2;
    check_rel("ema_update_cuda vs ema_update: buffers", gb, e.buffers, sc, (long)m->nbuffers, 1e-5);
    cudaFree(dep); cudaFree(deb); cudaFree(dp); cudaFree(db);
    free(gp);
    free(gb);
    free(sc);
    free(e.params);
    free(e.buffers);
    free(m->buffers);
    free(m->params);
    free(m->grads);
    free(m);
    twin_compared(ema_update_cuda);
}

// ConvAct: conv_forward and conv_wgrad (FP16 and FP32) reading the producer's pre-BN z (channels c0..c0+Cin
// of a Cp-channel z) with BN+SiLU applied in the gather, against bn_silu_forward_*_cuda into a buffer and
// the plain conv: the same bits (the gather computes exactly what the materialising kernel writes)
static void test_conv_act(int f32, int B, int Cp, int c0, int Cin, int H, int W, int Cout, int K, int S, void *stream) {
    int HW = H * W, Ho = (H + 2 * (K / 2) - K) / S + 1, Wo = (W + 2 * (K / 2) - K) / S + 1, HWo = Ho * Wo;
    long nzp = (long)B * Cp * HW, nx = (long)B * Cin * HW, nw = (long)Cout * Cin * K * K, nz = (long)B * Cout * HWo;
    int es = f32 ? 4 : 2;
    float *zf = rand_host(nzp, -3, 3), *wf = rand_host(nw, -1, 1), *dzf = rand_host(nz, -1, 1);
    float *mean = rand_host(Cp, -0.5f, 0.5f), *invstd = rand_host(Cp, 0.5f, 2), *gamma = rand_host(Cp, 0.5f, 2),
          *beta = rand_host(Cp, -1, 1);
    void *hz = zf, *hw = wf, *hdz = dzf;
    if (!f32) hz = rand_f16(nzp, -3, 3, zf), hw = rand_f16(nw, -1, 1, wf), hdz = rand_f16(nz, -1, 1, dzf);
    char *dzp = (char *)to_dev(hz, es * nzp), *dwt = (char *)to_dev(hw, es * nw), *ddz = (char *)to_dev(hdz, es * nz);
    float *dm = to_dev(mean, 4 * Cp), *di = to_dev(invstd, 4 * Cp), *dg = to_dev(gamma, 4 * Cp),
          *db = to_dev(beta, 4 * Cp);
    void *dy;
    CK(cudaMalloc(&dy, es * nx));
    ConvDims dense = {B, Cin, H, W, Cout, K, S, 0, 0, 0, 0}, slice = dense;
    slice.xs = (long)Cp * HW;
    const char *xin = dzp + (long)es * c0 * HW;
    ConvAct act = {dm + c0, di + c0, dg + c0, db + c0};
    size_t wsb = conv_wgrad_ws_bytes(dense, f32);
    float *ws = wsb ? poisoned_dev((long)(wsb / 4)) : NULL, *z1 = poisoned_dev(nz), *z2 = poisoned_dev(nz);
    float *w1 = poisoned_dev(nw), *w2 = poisoned_dev(nw);
    uint16_t *tap = NULL;   // (FP16, 3x3) the weights tap-major
    if (f32) {
        bn_silu_forward_f32_cuda((const float *)xin, slice.xs, dm + c0, di + c0, dg + c0, db + c0, (float *)dy, 0, B,
                                 Cin, HW, 0, stream);
        conv_forward_f32_cuda(dense, (const float *)dy, NULL, (const float *)dwt, NULL, z1, stream);
        conv_forward_f32_cuda(slice, (const float *)xin, &act, (const float *)dwt, NULL, z2, stream);
        conv_wgrad_f32_cuda(dense, (const float *)ddz, (const float *)dy, NULL, w1, ws, 0, stream);
        conv_wgrad_f32_cuda(slice, (const float *)ddz, (const float *)xin, &act, w2, ws, 0, stream);
    } else {
        bn_silu_forward_f16_cuda((const uint16_t *)xin, slice.xs, dm + c0, di + c0, dg + c0, db + c0, (uint16_t *)dy, 0,
                                 B, Cin, HW, 0, stream);
        if (K == 3) {   // the weights tap-major, from which the halo kernel copies them
            CK(cudaMalloc((void **)&tap, 2 * nw));
            ConvWtJob job = {(const uint16_t *)dwt, tap, Cout, Cin};
            conv_w_tapmajor_cuda(&job, 1, stream);
        }
        conv_forward_cuda(dense, (const uint16_t *)dy, NULL, (const uint16_t *)dwt, tap, NULL, z1, NULL, stream);
        conv_forward_cuda(slice, (const uint16_t *)xin, &act, (const uint16_t *)dwt, tap, NULL, z2, NULL, stream);
        conv_wgrad_cuda(dense, (const uint16_t *)ddz, (const uint16_t *)dy, NULL, w1, ws, 0, stream);
        conv_wgrad_cuda(slice, (const uint16_t *)ddz, (const uint16_t *)xin, &act, w2, ws, 0, stream);
    }
    float *g1 = from_dev(z1, 4 * nz), *g2 = from_dev(z2, 4 * nz), *v1 = from_dev(w1, 4 * nw),
          *v2 = from_dev(w2, 4 * nw);
    long dz_ = 0, dw_ = 0, nan_ = 0;
    for (long i = 0; i < nz; i++) dz_ += memcmp(&g1[i], &g2[i], 4) != 0, nan_ += isnan(g1[i]);
    for (long i = 0; i < nw; i++) dw_ += memcmp(&v1[i], &v2[i], 4) != 0, nan_ += isnan(v1[i]);
    check(!dz_ && !dw_ && !nan_,
          "conv%s with ConvAct (B=%d, channels %d..%d of %d, %dx%d, Cout=%d K=%d S=%d): forward and wgrad "
          "bit-identical to bn_silu_forward + the plain conv (%ld of %ld outputs, %ld of %ld weight gradients differ)",
          f32 ? " FP32" : "", B, c0, c0 + Cin - 1, Cp, H, W, Cout, K, S, dz_, nz, dw_, nw);
    if (!f32) {   // the forward with its statistics from the epilogue, BN+SiLU gathered: z and the statistics the
                  // bits of the same on the materialised input
        uint16_t *h1, *h2;
        CK(cudaMalloc((void **)&h1, 2 * nz));
        CK(cudaMalloc((void **)&h2, 2 * nz));
        long np = (long)conv_stats_floats(dense);
        float *p1 = poisoned_dev(np), *p2 = poisoned_dev(np), *st1 = poisoned_dev(2 * Cout), *st2 = poisoned_dev(2 * Cout);
        int k1 = conv_forward_stats_cuda(dense, (const uint16_t *)dy, NULL, (const uint16_t *)dwt, tap, h1, p1, stream);
        int k2 = conv_forward_stats_cuda(slice, (const uint16_t *)xin, &act, (const uint16_t *)dwt, tap, h2, p2,
                                         stream);
        bn_stats_finish_cuda(p1, k1, Cout, st1, st1 + Cout, NULL, NULL, BN_EPS, BN_MOMENTUM, stream);
        bn_stats_finish_cuda(p2, k2, Cout, st2, st2 + Cout, NULL, NULL, BN_EPS, BN_MOMENTUM, stream);
        uint16_t *a1 = (uint16_t *)from_dev(h1, 2 * nz), *a2 = (uint16_t *)from_dev(h2, 2 * nz);
        float *s1 = from_dev(st1, 8 * Cout), *s2 = from_dev(st2, 8 * Cout);
        long zd = 0, sd = 0, sn = 0;
        for (long i = 0; i < nz; i++) zd += a1[i] != a2[i];
        for (int i = 0; i < 2 * Cout; i++) sd += memcmp(&s1[i], &s2[i], 4) != 0, sn += !isfinite(s1[i]);
        check(!zd && !sd && !sn && k1 == k2,
              "conv_forward_stats_cuda with ConvAct (B=%d, channels %d..%d of %d, %dx%d, Cout=%d K=%d S=%d): z and "
              "the statistics bit-identical to the plain conv's on bn_silu_forward's output (%ld of %ld z, %ld of %d "
              "statistics differ, %ld not finite; %d / %d tiles)",
              B, c0, c0 + Cin - 1, Cp, H, W, Cout, K, S, zd, nz, sd, 2 * Cout, sn, k1, k2);
        cudaFree(h1); cudaFree(h2); cudaFree(p1); cudaFree(p2); cudaFree(st1); cudaFree(st2);
        free(a1); free(a2); free(s1); free(s2);
    }
    if (tap) cudaFree(tap);
    cudaFree(dzp); cudaFree(dwt); cudaFree(ddz); cudaFree(dm); cudaFree(di); cudaFree(dg); cudaFree(db); cudaFree(dy);
    cudaFree(ws); cudaFree(z1); cudaFree(z2); cudaFree(w1); cudaFree(w2);
    if (!f32) free(hz), free(hw), free(hdz);
    free(zf);
    free(wf);
    free(dzf);
    free(mean);
    free(invstd);
    free(gamma);
    free(beta);
    free(g1);
    free(g2);
    free(v1);
    free(v2);
}

// conv_forward_parts_cuda: a 1x1 conv over a concatenation read in place, part by part (spec: n parts,
// part i C[i] channels, Cp[i] > 0 a BN part, channels c0[i].. of a Cp[i]-channel z with zx[i] extra values
// an image, Cp[i] 0 a part as it is, its own buffer with zx[i] extra), against bn_silu_forward_f16_cuda
// and copies into the concatenation materialised and conv_forward_stats_cuda / conv_forward_cuda on it:
// z, the statistics and the tile count the same bits (the same values and products in the same order)
typedef struct { int n, C[CONV_PARTS_MAX], Cp[CONV_PARTS_MAX], c0[CONV_PARTS_MAX], zx[CONV_PARTS_MAX]; } PartsSpec;
static void test_conv_parts(int B, int H, int W, int Cout, PartsSpec ps, void *stream) {
    int HW = H * W, Cin = 0;
    for (int i = 0; i < ps.n; i++) Cin += ps.C[i];
    long nx = (long)B * Cin * HW, nw = (long)Cout * Cin, nz = (long)B * Cout * HW;
    uint16_t *hw = rand_f16(nw, -1, 1, NULL), *hcat = rand_f16(nx, -3, 3, NULL);   // (its BN parts' channels written below)
    uint16_t *dcat = (uint16_t *)to_dev(hcat, 2 * nx), *dwt = (uint16_t *)to_dev(hw, 2 * nw);
    ConvParts pp = {0};
    void *bufs[4 * CONV_PARTS_MAX];
    int nb = 0;
    char what[200];
    int wn = snprintf(what, sizeof what, "B=%d %dx%d Cout=%d parts", B, H, W, Cout);
    for (int i = 0, off = 0; i < ps.n; off += ps.C[i++]) {
        int Cp = ps.Cp[i] ? ps.Cp[i] : ps.C[i], c0 = ps.Cp[i] ? ps.c0[i] : 0;
        long xs = (long)Cp * HW + ps.zx[i];
        uint16_t *hz = rand_f16(B * xs, -3, 3, NULL);
        if (!ps.Cp[i])   // a part as it is: its values, the same in the concatenation
            for (int b = 0; b < B; b++) memcpy(hcat + ((long)b * Cin + off) * HW, hz + b * xs, 2L * ps.C[i] * HW);
        uint16_t *dz = (uint16_t *)to_dev(hz, 2 * B * xs);
        bufs[nb++] = dz;
        free(hz);
        pp.C[i] = ps.C[i];
        pp.x[i] = dz + (long)c0 * HW;
        pp.xs[i] = xs;
        if (ps.Cp[i]) {
            float *st[4] = {rand_host(Cp, -0.5f, 0.5f), rand_host(Cp, 0.5f, 2), rand_host(Cp, 0.5f, 2), rand_host(Cp, -1, 1)};
            float *d[4];
            for (int k = 0; k < 4; k++) d[k] = to_dev(st[k], 4 * Cp), bufs[nb++] = d[k], free(st[k]);
            pp.act[i] = 1;
            pp.acts[i] = (ConvAct){d[0] + c0, d[1] + c0, d[2] + c0, d[3] + c0};
        }
        wn += snprintf(what + wn, sizeof what - wn, " %s%d", ps.Cp[i] ? "bn" : "", ps.C[i]);
    }
    pp.n = ps.n;
    CK(cudaMemcpy(dcat, hcat, 2 * nx, cudaMemcpyHostToDevice));
    for (int i = 0, off = 0; i < ps.n; off += ps.C[i++])   // the BN parts' values, as the step materialised them
        if (pp.act[i])
            bn_silu_forward_f16_cuda(pp.x[i], pp.xs[i], pp.acts[i].mean, pp.acts[i].invstd, pp.acts[i].gamma,
                                     pp.acts[i].beta, dcat + (long)off * HW, (long)Cin * HW, B, ps.C[i], HW, 0, stream);
    ConvDims d = {B, Cin, H, W, Cout, 1, 1, 0, 0, 0, 0};
    long np = (long)conv_stats_floats(d);
    uint16_t *z[3];
    for (int k = 0; k < 3; k++) {   // (NaN: a value never written shows)
        CK(cudaMalloc((void **)&z[k], 2 * nz));
        CK(cudaMemset(z[k], 0xFF, 2 * nz));
    }
    float *p1 = poisoned_dev(np), *p2 = poisoned_dev(np), *st1 = poisoned_dev(2 * Cout), *st2 = poisoned_dev(2 * Cout);
    int k1 = conv_forward_stats_cuda(d, dcat, NULL, dwt, NULL, z[0], p1, stream);
    int k2 = conv_forward_parts_cuda(d, &pp, dwt, z[1], p2, stream);
    int k3 = conv_forward_parts_cuda(d, &pp, dwt, z[2], NULL, stream);
    bn_stats_finish_cuda(p1, k1, Cout, st1, st1 + Cout, NULL, NULL, BN_EPS, BN_MOMENTUM, stream);
    bn_stats_finish_cuda(p2, k2, Cout, st2, st2 + Cout, NULL, NULL, BN_EPS, BN_MOMENTUM, stream);
    uint16_t *a[3];
    for (int k = 0; k < 3; k++) a[k] = (uint16_t *)from_dev(z[k], 2 * nz);
    float *s1 = from_dev(st1, 8 * Cout), *s2 = from_dev(st2, 8 * Cout);
    long zd = 0, zd3 = 0, sd = 0, sn = 0, zn = 0;
    for (long i = 0; i < nz; i++) zd += a[0][i] != a[1][i], zd3 += a[0][i] != a[2][i], zn += (a[0][i] & 0x7C00) == 0x7C00;
    for (int i = 0; i < 2 * Cout; i++) sd += memcmp(&s1[i], &s2[i], 4) != 0, sn += !isfinite(s1[i]);
    check(!zd && !zd3 && !sd && !sn && !zn && k1 == k2 && k1 == k3,
          "conv_forward_parts_cuda (%s): z (with and without the statistics) and the statistics bit-identical to "
          "conv_forward_stats_cuda's on the concatenation materialised (%ld / %ld of %ld z, %ld of %d statistics "
          "differ, %ld / %ld not finite; %d / %d / %d tiles)",
          what, zd, zd3, nz, sd, 2 * Cout, zn, sn, k1, k2, k3);
    twin_compared(conv_forward_parts_cuda);
    for (int k = 0; k < 3; k++) cudaFree(z[k]), free(a[k]);
    while (nb > 0) cudaFree(bufs[--nb]);
    cudaFree(dcat); cudaFree(dwt); cudaFree(p1); cudaFree(p2); cudaFree(st1); cudaFree(st2);
    free(hw); free(hcat); free(s1); free(s2);
}

// fast_div / fdiv (yolo.h), the conv kernels' index division: every divisor 1..4096 and random ones up
// to 2^30, each against dividends at and around its multiples, random ones and 2^31 - 1
static void test_fast_div(void) {
    long bad = 0, n_checked = 0;
    for (int t = 0; t < 4096 + 2000; t++) {
        int d = t < 4096 ? t + 1 : 1 + (int)(rng_uniform(&rng) * (double)(1 << 30));
        FastDiv f = fast_div(d);
        for (int j = 0; j < 40; j++) {
            long n;
            if (j < 3) n = j;
            else if (j < 6) n = 0x7fffffffL - (j - 3);
            else if (j < 24) n = (long)(rng_uniform(&rng) * (0x7fffffffL / d)) * d + (j % 3) - 1;
            else n = (long)(rng_uniform(&rng) * 0x7fffffffL);
            if (n < 0 || n > 0x7fffffffL) continue;
            n_checked++;
            bad += div_fast((int)n, f) != (int)(n / d);
        }
    }
    check(!bad,
          "div_fast(n, fast_div(d)) == n / d: %ld of %ld dividends wrong (divisors 1..4096 and 2000 random up to 2^30)",
          bad, n_checked);
}

// test_twin_table: YOLO_TWINS (yolo.h) is complete and true: every launcher yolo.h declares is listed,
// each listed twin exists (its address is taken here, so a wrong name does not compile) and each listed
// test compared its launcher in this run (twin_compared).
static void test_twin_table(void) {
#define TWIN_ROW(launcher, twin, test) {#launcher, #twin, #test, (void (*)(void))launcher, (void (*)(void))twin},
    static const struct { const char *launcher, *twin, *test; void (*lf)(void), (*tf)(void); } rows[] = {
        YOLO_TWINS(TWIN_ROW)
    };
#undef TWIN_ROW
    int nrow = (int)(sizeof rows / sizeof rows[0]), missing = 0, unmarked = 0, declared = 0;
    // the launchers yolo.h declares: lines "void NAME_cuda(", "int NAME_cuda(" or "long NAME_cuda(" (yolo.h sits
    // beside this file's folder)
    char path[512];
    const char *slash = strrchr(__FILE__, '/');
    snprintf(path, sizeof path, "%.*s../yolo.h", slash ? (int)(slash - __FILE__ + 1) : 0, __FILE__);
    FILE *f = fopen(path, "r");
    if (!f) snprintf(path, sizeof path, "yolo.h"), f = fopen(path, "r");
    char line[1024], name[128];
    while (f && fgets(line, sizeof line, f)) {
        if (sscanf(line, "void %127[a-z0-9_](", name) != 1 && sscanf(line, "int %127[a-z0-9_](", name) != 1 &&
            sscanf(line, "long %127[a-z0-9_](", name) != 1)
            continue;
        size_t L = strlen(name);
        if (L < 5 || strcmp(name + L - 5, "_cuda")) continue;
        declared++;
        int found = 0;
        for (int i = 0; i < nrow && !found; i++) found = !strcmp(rows[i].launcher, name);
        if (!found) { missing++; printf("  %s is declared in yolo.h and missing from YOLO_TWINS\n", name); }
    }
    if (f) fclose(f);
    for (int i = 0; i < nrow; i++) {
        int seen = 0;
        for (int k = 0; k < twin_nseen && !seen; k++)
            seen = !strcmp(twin_seen[k].launcher, rows[i].launcher) && !strcmp(twin_seen[k].test, rows[i].test);
        if (seen) continue;
        unmarked++;
        printf("  %s: %s did not compare it with %s\n", rows[i].launcher, rows[i].test, rows[i].twin);
    }
    check(f && declared == nrow && !missing && !unmarked,
          "YOLO_TWINS: %d launchers declared in %s, %d listed, %d missing from the list; every twin exists; "
          "%d of the listed tests did not compare their launcher with its twin",
          declared, path, nrow, missing, unmarked);
}

int main(void) {
    rng_seed(&rng, 6);
    test_fast_div();
    // software fp16 conversion against known encodings (the reference must be right on its own)
    check(float_to_half(1.0f) == 0x3c00 && float_to_half(-2.0f) == 0xc000 && float_to_half(65504.0f) == 0x7bff &&
          float_to_half(1e6f) == 0x7c00 && float_to_half(5.9604645e-8f) == 0x0001 &&
          float_to_half(1.0f + 1.0f / 2048) == 0x3c00 && float_to_half(1.0f + 3.0f / 2048) == 0x3c02 &&
          half_to_float(0x3555) == 0.333251953125f && half_to_float(0x0001) == 5.9604645e-8f,
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
    test_conv(2, 4, 20, 20, 8, 1, 1, 0, 1, s);    // wgrad split over 4 slices of B*Ho*Wo
    test_conv(1, 3, 40, 36, 5, 3, 2, 0, 0, NULL); // wgrad split in 2, ragged last slice
    test_conv(2, 16, 4, 6, 24, 1, 1, 0, 0, s);    // forward: 16-byte w rows and x rows (1x1, H*W % 8 == 0)
    test_conv(2, 8, 4, 4, 70, 1, 1, 8, 3, s);     // the same on channel slices, Cout over a tile
    test_conv(2, 72, 8, 10, 70, 1, 1, 0, 0, s);   // the same, 3 K steps (the last partial), 3 pixel tiles
    test_conv(1, 8, 136, 136, 8, 1, 1, 0, 0, s);  // 289 pixel tiles: the BN backward's sums over 256 a channel
    test_conv(1, 8, 6, 5, 9, 3, 2, 0, 0, s);      // forward: 16-byte w rows, gathered 3x3 stride-2 taps
    test_conv(1, 2, 7, 7, 3, 3, 3, 0, 0, s);      // stride 3: dgrad's any-stride test
    // 3x3 stride 1 by halo tiles (conv_halo_kernel): 16-byte rows, 16-column tiles (W 40: the last one
    // half out, H 7: the row of tiles partly out; 3 tiles, as many as 40-column row tiles would take),
    // Cin 24 (the second K step half empty), Cout 70 over a tile, on channel slices; then 8-byte rows
    // (W 36: 16-column tiles, H 8), and the 32-column tiles (4 rows), taken where they pad fewer rows
    // than 16-column ones (8 rows): 8-byte rows (W 28, H 4) and 16-byte ones (W 24, H 4)
    test_conv(2, 24, 7, 40, 70, 3, 1, 8, 3, s);
    test_conv(1, 16, 8, 36, 24, 3, 1, 0, 0, s);
    test_conv(1, 16, 4, 28, 24, 3, 1, 0, 0, s);
    test_conv(2, 24, 4, 24, 16, 3, 1, 0, 0, s);
    // stride 1's row tiles (6 whole rows of a 20-wide map a tile, 8-byte pieces): H 6 (one tile, where
    // 16- and 32-column tiles take 2), H 12 (2 tiles), H 20 (4, the last one 2 rows: two warps idle),
    // Cin 24, Cout 70 on channel slices; H 13 (3 tiles where the column tiles take 4; the last one row:
    // 20 pixels, the last 4 of 8 stored one by one), Cin 72 over a block
    test_conv(1, 16, 6, 20, 24, 3, 1, 0, 0, s);
    test_conv(1, 16, 12, 20, 24, 3, 1, 0, 0, s);
    test_conv(2, 24, 20, 20, 70, 3, 1, 8, 3, s);
    test_conv(1, 72, 13, 20, 16, 3, 1, 0, 0, s);
    // the 40-column row tiles (3 whole rows of a 40-wide map, 16-byte pieces, a pair of them may span two
    // rows): H 12 (4 tiles where 16-column tiles take 6), Cin 24, Cout 70 on channel slices; H 13 (5, the
    // last one row: 40 pixels, two warps idle); H 14 (5, the last 2 rows), Cin 72 over a block
    test_conv(2, 24, 12, 40, 70, 3, 1, 8, 3, s);
    test_conv(1, 16, 13, 40, 24, 3, 1, 0, 0, s);
    test_conv(1, 72, 14, 40, 16, 3, 1, 0, 0, s);
    // stride-2 3x3 input gradient by halo tiles, one parity of the input pixels per block: H odd (the
    // parities' grids differ), dz rows of 16 and 8; Cin 72 over a block, Cout 20 (a 4-channel K step)
    test_conv(2, 16, 15, 32, 24, 3, 2, 8, 3, s);
    test_conv(1, 72, 9, 15, 20, 3, 2, 0, 0, s);
    test_conv(2, 16, 17, 16, 24, 3, 2, 0, 0, s);   // H 17: the odd rows' grid has a row of tiles fewer
    test_conv(2, 64, 8, 8, 80, 3, 2, 0, 0, s);      // stride 2 on an 8x8 map: 4 K steps, Cout over a tile
    test_conv(1, 8, 40, 32, 16, 3, 2, 0, 0, s);     // stride-2 weight gradient by halo tiles in slices
    test_conv(1, 16, 6, 88, 24, 3, 2, 0, 0, s);     // the same with dz rows of 44 (8-byte pieces)
    test_conv(2, 16, 9, 40, 72, 3, 2, 0, 0, s);     // dz rows of 20 (8-byte pieces; the row tiles below)
    // the 32-column tiles of the input gradient (rows of 24 and 28 pixel pairs; the forward, x rows of
    // 48 and 56 and Ho 5, takes 16-column tiles: it has no others), which the shape above took before
    // the row tiles
    test_conv(2, 16, 9, 48, 24, 3, 2, 0, 0, s);
    test_conv(1, 16, 9, 56, 16, 3, 2, 0, 0, s);
    // the input gradient's row tiles (3 rows of 20 pixel pairs a tile; dz rows of 20 in 8-byte pieces):
    // W 40 and 39 (the last pair's second pixel past the row), H 39 (the odd rows' grid one row of pairs
    // shorter), Cin 72 over a block, Cout 24 on slices
    test_conv(2, 72, 39, 40, 24, 3, 2, 8, 3, s);
    test_conv(1, 16, 40, 39, 16, 3, 2, 0, 0, s);
    test_conv(2, 16, 13, 40, 16, 3, 2, 0, 0, s);   // H 13: 3 row tiles for the even rows, 2 for the odd (idle blocks)
    // the stride-2 forward by halo tiles takes the shapes above whose x rows are a multiple of 4 (W 32,
    // 16, 8, 40, 88); then x rows of 20 (8-byte pieces, Wo 10: a row's last 2 pixels of 8 stored one by
    // one), an odd H (the window's last row past the map) and Cout 70 on channel slices
    test_conv(2, 24, 11, 20, 70, 3, 2, 8, 3, s);
    // the stride-2 forward's row tiles (3 whole rows of a 20-wide map a tile; x rows of 40 in 16-byte
    // pieces): Ho 20 (7 tiles, the last 2 rows), Cin 24, Cout 70 on channel slices; Ho 5 above (W 40,
    // H 9) takes them too
    test_conv(2, 24, 40, 40, 70, 3, 2, 8, 3, s);
    // the input gradient of one concat source from its columns of the weights, in place: 1x1 on 16-byte
    // rows (Cin 16 at column 16 of 48: the 16-byte kernel), misaligned (column 3 of 27: the gather
    // kernel); 3x3 stride 1 (halo tiles) and stride 2 (the gather kernel: no tap-major copy)
    test_conv_dgrad_wcols(2, 48, 16, 16, 8, 8, 24, 1, 1, s);
    test_conv_dgrad_wcols(1, 27, 3, 8, 6, 8, 20, 1, 1, s);
    test_conv_dgrad_wcols(1, 40, 24, 16, 6, 16, 24, 3, 1, s);
    test_conv_dgrad_wcols(2, 24, 8, 8, 9, 12, 16, 3, 2, s);
    // the weight gradient of one concat part into its columns of a 1x1 conv's dW: 16-byte rows, split in
    // 4 slices (the 4-value sums), with and without the part's BN+SiLU; an odd column (the 1-value sums);
    // an odd map (the gather kernel); one slice (no sum: the kernel writes dW)
    test_conv_wgrad_wcols(2, 72, 24, 32, 20, 20, 40, 1, s);
    test_conv_wgrad_wcols(2, 72, 24, 32, 20, 20, 40, 0, s);
    test_conv_wgrad_wcols(2, 45, 5, 24, 20, 20, 24, 1, s);
    test_conv_wgrad_wcols(1, 40, 8, 16, 9, 9, 20, 1, s);
    test_conv_wgrad_wcols(1, 48, 16, 16, 12, 12, 64, 1, s);
    // 3 input channels (the stem) on rows of 24 and 64: still the gather kernel (A's rows not 16-byte loads)
    test_conv(2, 3, 16, 24, 20, 3, 2, 0, 0, s);
    test_conv(1, 3, 6, 64, 20, 3, 2, 0, 0, s);
    // the stem's own kernels, forward and weight gradient (Cout 16, 32, 48; output rows a multiple of 16;
    // no input gradient, see test_conv_no_dgrad): rows of 32 (one chunk), 48 (a chunk half past the row)
    // with an odd H and dz's image stride padded, 16 with x's padded (one slice: dW accumulated in place),
    // 32 rows in 4 slices
    test_conv_no_dgrad = test_conv_x8 = 1;
    test_conv(2, 3, 16, 64, 16, 3, 2, 0, 0, s);
    test_conv(1, 3, 15, 96, 32, 3, 2, 0, 2, s);
    test_conv(2, 3, 9, 32, 48, 3, 2, 3, 0, s);
    test_conv(1, 3, 64, 64, 16, 3, 2, 0, 0, NULL);
    test_conv(1, 3, 2, 1024, 16, 3, 2, 0, 0, s);   // one output row in 2 slices: the first one empty
    test_conv(3, 3, 1, 160, 32, 3, 2, 2, 1, s);    // H 1; rows of 80: 3 chunks, the last one half past
    test_conv(2, 3, 40, 96, 48, 3, 2, 0, 0, s);    // Cout 48 over 8 slices; the forward in several blocks
    test_conv_no_dgrad = test_conv_x8 = 0;
    test_stem_u8_bits(s);
    test_bn(2, 3, 45, 0, 0, NULL);
    test_bn(2, 5, 300, 2, 3, s);
    test_bn(2, 3, 20000, 1, 0, s);   // 3 chunks a channel
    // 16-byte words, 2 chunks of 3756 values a channel: most threads take two groups of 8 at once, some
    // one, a chunk's unaligned head and tail; a channel's 939 groups across 4 blocks and 3 images
    test_bn(3, 2, 2504, 1, 2, s);
    test_bn_silu_add(2, 4, 64, 0, 0, 0, s);      // 16-byte words
    test_bn_silu_add(2, 5, 300, 2, 3, 0, NULL);   // one value a thread, z and y slices
    test_bn_silu_add(2, 3, 400, 1, 2, 1, s);      // FP32, 16-byte words, slices
    test_bn_silu_add(1, 2, 45, 0, 1, 1, s);       // FP32, one value a thread
    test_bn_silu_sum(2, 4, 64, 0, 0, 0, 0, s);      // 16-byte words
    test_bn_silu_sum(2, 5, 304, 2, 0, 3, 0, NULL);  // 16-byte words, z1 and y slices
    test_bn_silu_sum(2, 5, 300, 0, 1, 0, 0, s);     // one value a thread, a z2 slice
    test_bn_silu_sum(2, 3, 400, 1, 2, 2, 1, s);     // FP32, 16-byte words, slices
    test_bn_silu_sum(1, 2, 45, 0, 0, 1, 1, s);      // FP32, one value a thread
    test_bn_silu_up(2, 3, 5, 7, 1, 8, 0, 0, s);      // pairs of values a store
    test_bn_silu_up(1, 2, 20, 17, 0, 3, 1, 0, NULL);  // odd offset and stride: one value a store
    test_bn_silu_up(2, 3, 6, 5, 2, 4, 0, 1, s);       // FP32
    test_bn_silu_up(1, 4, 9, 3, 0, 1, 1, 1, s);       // FP32, one value a store
    test_bn_finish(3, 1, s);
    test_bn_finish(2, 700, s);    // a thread's batch of 4 tiles partly past K
    test_bn_finish(3, 5000, s);   // three batches, the last partial
    test_bn_finish(2, 4096, s);   // two whole batches
    test_bn_silu_up(2, 3, 5, 8, 1, 8, 0, 0, s);      // 4 inputs a thread, 16-byte rows
    test_bn_silu_up(2, 3, 6, 12, 2, 8, 0, 1, s);     // FP32, 4 inputs a thread
    test_add_n(2, 64, 3, 0, 0, 0, 0, s);       // 16-byte words
    test_add_n(2, 45, 2, 0, 1, 0, 0, NULL);    // one value a thread
    test_add_n(1, 800, 4, 0, 0, 1, 0, s);      // a destination twice
    test_add_n(3, 40, 1, 1, 0, 0, 0, s);       // FP32
    test_add_n(2, 37, 4, 1, 1, 1, 0, s);       // FP32, odd strides, a destination twice
    test_add_n(2, 64, 3, 0, 0, 0, 5u, s);      // the first and third written (lazy dA), 16-byte words
    test_add_n(2, 45, 2, 0, 1, 0, 2u, NULL);   // the second written, one value a thread
    test_add_n(1, 800, 4, 0, 0, 1, 1u, s);     // the first written, then added to again (the last)
    test_add_n(2, 37, 3, 1, 1, 0, 6u, s);      // FP32, odd strides
    test_bn_backward(2, 3, 45, 0, 1, 1, 0, NULL);
    test_bn_backward(2, 4, 300, 1, 1, 1, 0, s);
    test_bn_backward(1, 3, 50, 0, 1, 0, 0, s);
    test_bn_backward(2, 3, 40, 2, 0, 1, 0, s);
    test_bn_backward(2, 3, 20000, 1, 1, 1, 0, s);   // 40000 values a channel: 3 chunks, the last one short
    test_bn_backward(2, 2, 20000, 0, 0, 1, 0, s);
    test_bn_backward(2, 3, 45, 0, 1, 1, 1, s);       // FP16 dA: scalar, 8 a thread (HW % 8 == 0), bias, eval
    test_bn_backward(2, 4, 304, 8, 1, 1, 1, s);
    test_bn_backward(2, 3, 40, 2, 0, 1, 1, s);
    test_bn_backward(1, 3, 56, 0, 1, 0, 1, s);
    test_bn_backward(2, 4, 304, 8, 1, 1, 2, s);     // FP16 dA, dz in place of it
    test_bn_backward(3, 2, 2504, 1, 1, 1, 1, s);    // two groups of 8 a thread, heads and tails (test_bn's)
    test_bn_backward(3, 2, 2504, 1, 1, 1, 0, s);
    test_bn_backward(3, 2, 2504, 1, 0, 1, 1, s);    // no BN (a Detect conv's bias): no z, as the step passes
    test_bn_backward(2, 3, 45, 1, 1, 1, 2, s);
    // one pass (bn_bwd_fused_kernel) where a channel's groups of 8 fit a block: G 2 (2000 groups), G 4
    // with a short last warp (2625), G 4 full (4096, in place); past it (4097 groups) the two passes
    test_bn_backward(2, 3, 8000, 1, 1, 1, 1, s);
    test_bn_backward(3, 2, 7000, 0, 1, 1, 1, s);
    test_bn_backward(4, 2, 8192, 1, 1, 1, 2, s);
    test_bn_backward(1, 2, 32776, 0, 1, 1, 1, s);
    test_bn_backward(3, 2, 7000, 0, 1, 0, 1, s);    // eval, G 4
    test_bn_backward(2, 2, 8000, 1, 0, 1, 0, s);    // FP32 dA: G 2 (2000 groups), bias; BN, train and eval
    test_bn_backward(2, 3, 8000, 1, 1, 1, 0, s);
    test_bn_backward(2, 3, 8000, 0, 1, 0, 0, s);
    test_bn_backward(3, 2, 7000, 0, 1, 0, 0, s);    // FP32 dA, 2625 groups: the two passes
    test_bn_backward(1, 2, 32776, 0, 1, 1, 2, s);   // the two passes, 8 a thread: in place, and without BN
    test_bn_backward(1, 2, 32776, 0, 0, 1, 1, s);
    test_bn_backward(1, 2, 33001, 1, 0, 1, 0, s);   // FP32 dA, no BN, the two passes one value a thread
    test_pool_up_backward(2, 3, 19, 35, NULL);
    test_pool_up_backward(1, 2, 1, 1, s);
    test_pool_up_backward(1, 2, 16, 17, s);
    test_pool_up_backward(2, 3, 66, 64, s);   // past the plane kernel's 68 x 68: the 16x16 tiles
    test_pool_up_backward(2, 3, 5, 4, s);     // upsample backward: 4 values a thread, a row each
    test_convert_copy(1000, s);
    test_convert_copy(1003, s);   // u8 to FP16: 8 a thread and a tail of 3
    test_views_f16(2, 3, 7, 9, NULL);
    test_views_f16(2, 2, 20, 17, s);
    test_views_f16(2, 2, 66, 66, s);   // past maxpool5_plane's 68 x 68 floats: the per-output kernel
    {   // image 0: overlapping boxes, boxes of class 0 (align 0 but at anchors 0-2); image 1 none; image 2: two over
        // M = 6, an invalid box, and box 8 with tied aligns
        LossTestBox bx[] = {{8, 8, 40, 40, 0, 1}, {10, 12, 44, 42, 0, 2}, {30, 20, 60, 62, 0, 1}, {1, 1, 40, 15, 0, 0},
                            {41, 41, 46, 47, 0, 0}, {20, 36, 52, 60, 0, 0}, {0, 0, 0, 0, 2, 1}, {4, 30, 36, 62, 2, 2},
                            {5, 5, 60, 58, 2, 0}, {20, 2, 30, 22, 2, 1}, {6, 6, 30, 30, 2, 1}, {33, 33, 63, 63, 2, 2},
                            {8, 40, 24, 56, 2, 0}, {40, 8, 56, 24, 2, 1}};
        test_loss(3, 3, 64, 64, 6, bx, (int)(sizeof bx / sizeof bx[0]), 2, 8, 1, s);
    }
    {   // 96 wide, 64 high, 80 classes, no cap; image 0 tiny class-0 boxes at anchor 0 (positive) and 3 (align 0);
        // image 1 two equal boxes of two classes (overlap ties: the first gt wins)
        LossTestBox bx[] = {{2, 3, 9, 8, 0, 0},     {25, 1, 31, 7, 0, 0},   {10, 10, 90, 60, 0, 7},
                            {12, 8, 88, 62, 0, 79}, {50, 5, 95, 40, 0, 3},  {56, 0, 96, 28, 1, 5},
                            {16, 16, 48, 40, 1, 5}, {16, 16, 48, 40, 1, 6}, {60, 30, 70, 52, 1, 0},
                            {33, 1, 40, 9, 1, 0},   {70, 40, 94, 63, 1, 79}};
        test_loss(2, 80, 64, 96, 16, bx, (int)(sizeof bx / sizeof bx[0]), 0, 5, 0, NULL);
    }
    test_optim(OPT_SGD, 1.f, 10.f, 1, s);
    test_optim(OPT_SGD, 0.01f, 10.f, 0, NULL);   // (no FP16 copy, no EMA: NULL)
    test_optim(OPT_ADAMW, 1.f, 10.f, 1, s);
    test_optim(OPT_ADAMW, 0.01f, 0.f, 1, s);
    test_ema(s);
    // the FP32 twins (amp=0), last so that the tests above see the random values they always had
    test_conv_f32(2, 5, 9, 7, 7, 3, 1, 0, 0, 1, NULL);     // K=3 S=1, odd sizes, Kd=45
    test_conv_f32(1, 3, 10, 9, 70, 3, 2, 2, 1, 0, s);     // K=3 S=2, strides, Cout over one tile, no bias
    test_conv_f32(2, 20, 6, 6, 9, 1, 1, 1, 3, 1, s);      // K=1 S=1, strides
    test_conv_f32(1, 6, 7, 5, 4, 1, 2, 0, 0, 1, NULL);    // K=1 S=2
    test_conv_f32(1, 1, 1, 1, 1, 3, 2, 0, 0, 1, s);       // 1x1 image, K=3 S=2
    test_conv_f32(2, 8, 11, 13, 66, 3, 1, 1, 2, 1,
                  s);   // 2x5 tiles, Kd=72 (4.5 k-steps); wgrad 2x2 tiles, Kd=286 in 3 slices
    test_conv_f32(2, 3, 24, 20, 4, 3, 1, 0, 0, 1, s);     // wgrad Kd=960 in 8 slices, the last one ragged
    // a concatenation read in place: BN parts (slices of a wider z, image strides with extra values) and
    // parts as they are, 16-channel parts straddling the 32-channel K steps, pixels past the last tile
    test_conv_parts(2, 8, 8, 32, (PartsSpec){2, {32, 16}, {64, 0}, {16, 0}, {0, 8}}, s);                  // C2f: cv1, a sum
    test_conv_parts(2, 10, 12, 72, (PartsSpec){4, {32, 32, 64, 16}, {32, 96, 0, 32}, {0, 64, 0, 16}, {8, 24, 0, 0}}, s);
    test_conv_parts(3, 4, 4, 20, (PartsSpec){1, {64}, {64}, {0}, {0}}, s);                                // one part
    test_conv_parts(1, 6, 4, 64, (PartsSpec){8, {32, 32, 32, 64, 32, 32, 96, 48}, {32, 0, 64, 64, 0, 128, 96, 0},
                                             {0, 0, 32, 0, 0, 96, 0, 0}, {0, 0, 0, 8, 16, 0, 0, 0}}, s);    // eight
    test_conv_parts(2, 20, 20, 128, (PartsSpec){2, {128, 64}, {128, 0}, {0, 0}, {0, 0}}, s);              // the neck's
    test_conv_parts(2, 4, 6, 40, (PartsSpec){3, {32, 64, 32}, {0, 64, 0}, {0, 0, 0}, {0, 8, 0}}, s);       // raw first, last
    for (int f32 = 0; f32 < 2; f32++) {
        test_conv_act(f32, 2, 8, 0, 8, 9, 7, 5, 3, 1, s);        // the whole z, 3x3
        test_conv_act(f32, 2, 12, 4, 6, 10, 11, 70, 3, 2,
                      s);   // a channel slice (C2f's split), stride 2, Cout over a tile
        test_conv_act(f32, 1, 6, 3, 3, 20, 20, 4, 1, 1, NULL);   // 1x1, wgrad split
        test_conv_act(f32, 2, 24, 8, 16, 4, 6, 20, 1, 1, s);     // 1x1 on 16-byte rows of a slice
        test_conv_act(f32, 2, 88, 8, 72, 8, 10, 20, 1, 1, s);    // the same, 3 K steps, 3 pixel tiles
        test_conv_act(f32, 2, 16, 0, 8, 5, 6, 12, 3, 2, s);      // 3x3 stride 2, Cin*9 % 8 == 0
        test_conv_act(f32, 1, 8, 0, 8, 4, 4, 6, 3, 1, s);        // 3x3, Ho*Wo % 8 == 0 (16-byte dz rows in wgrad)
        test_conv_act(f32, 2, 40, 8, 24, 7, 16, 20, 3, 1, s);    // 3x3 stride 1 by halo tiles, on a slice
        test_conv_act(f32, 2, 80, 16, 64, 8, 8, 72, 3, 2, s);    // 3x3 stride 2 on a slice, 4 K steps
        test_conv_act(f32, 2, 24, 8, 16, 10, 32, 20, 3, 2, s);   // stride 2, 16-byte rows of x and dz: halo wgrad
        test_conv_act(f32, 1, 16, 0, 16, 6, 88, 12, 3, 2, s);    // stride 2, dz rows of 44: 8-byte halo wgrad
        test_conv_act(f32, 2, 24, 8, 16, 7, 40, 20, 3, 2, s);    // stride 2, dz rows of 20: the halo wgrad, on a slice
        test_conv_act(f32, 2, 32, 8, 16, 9, 36, 20, 3, 2, s);    // stride 2, x rows of 36: 8-byte halo forward (16-column tiles)
        test_conv_act(f32, 2, 32, 8, 16, 10, 40, 20, 3, 2, s);   // stride 2, x rows of 40, Ho 5: 16-byte halo forward, row tiles
        test_conv_act(f32, 1, 24, 8, 16, 39, 40, 72, 3, 2, s);   // the same, Ho 20 (7 row tiles), Cout over a tile
        test_conv_act(f32, 2, 32, 8, 16, 10, 48, 20, 3, 2, s);   // stride 2, x rows of 48, Ho 5: 16-byte halo forward (16-column tiles)
        test_conv_act(f32, 1, 24, 8, 16, 4, 28, 20, 3, 1, s);    // 3x3 stride 1, rows of 28, H 4: 8-byte halo, 32-column tiles
        test_conv_act(f32, 1, 24, 8, 16, 12, 20, 20, 3, 1, s);   // rows of 20, H 12: stride 1's row tiles (2)
        test_conv_act(f32, 2, 40, 8, 24, 20, 20, 70, 3, 1, s);   // the same, H 20 (4 tiles), Cout over a tile
        test_conv_act(f32, 1, 24, 8, 16, 13, 40, 70, 3, 1, s);   // rows of 40, H 13: the 40-column row tiles (5)
    }
    test_bn_f32(2, 3, 45, 0, 0, NULL);
    test_bn_f32(2, 5, 300, 2, 3, s);
    test_bn_f32(2, 3, 20000, 1, 0, s);
    test_bn_f32(3, 2, 2504, 1, 2, s);
    test_bn_backward_f32(2, 3, 45, 0, 1, 1, NULL);
    test_bn_backward_f32(2, 4, 300, 1, 1, 1, s);
    test_bn_backward_f32(1, 3, 50, 0, 1, 0, s);
    test_bn_backward_f32(2, 3, 40, 2, 0, 1, s);
    test_bn_backward_f32(2, 3, 20000, 1, 1, 1, s);
    test_bn_backward_f32(3, 2, 2504, 1, 1, 1, s);
    test_bn_backward_f32(3, 2, 2504, 1, 0, 1, s);
    test_bn_backward_f32(2, 2, 8000, 1, 1, 1, s);   // one pass, G 2; then past it (2625 groups): two
    test_bn_backward_f32(3, 2, 7000, 0, 1, 1, s);
    test_bn_backward_f32(3, 2, 7000, 1, 0, 1, s);   // without BN: dz from the first pass
    test_views_f32(2, 3, 7, 9, NULL);
    test_views_f32(2, 2, 20, 17, s);
    test_views_f32(2, 2, 66, 66, s);
    // deep weight-gradient splits (one weight or four: 113 slices in FP16, 254 in FP32), so that each of
    // wgrad_reduce_kernel's 16 lanes adds several slices and its 8-load loop runs, scalar and 16-byte
    test_conv(1, 1, 180, 180, 1, 1, 1, 0, 0, s);
    test_conv(1, 1, 180, 180, 4, 1, 1, 0, 0, s);
    test_conv_f32(1, 1, 180, 180, 4, 1, 1, 0, 0, 1, s);
    {   // 320x320 (2100 anchors an image): boxes of ~2000 candidate anchors, so that each of loss_topk's 64 threads
        // keeps full top-10 and zero lists and the merges join full lists; image 0's class-0 box, from the corner,
        // is align 0 but at anchors 0-2 (the zero fill takes anchors 3-9 from every thread's zeros), image 1's
        // box 3 ties ~1200 level-0 anchors, and its boxes 4 and 5 are one box of two classes (second claims)
        LossTestBox bx[] = {{0, 0, 316, 300, 0, 0},     {40, 40, 200, 220, 0, 1},   {100, 60, 300, 250, 0, 2},
                            {20, 20, 300, 310, 1, 1},   {100, 100, 200, 180, 1, 0}, {100, 100, 200, 180, 1, 2}};
        test_loss(2, 3, 320, 320, 6, bx, (int)(sizeof bx / sizeof bx[0]), 0, 3, 1, s);
    }
    CK(cudaStreamSynchronize(s));
    CK(cudaStreamDestroy(s));
    // (the halo kernels' and the 1x1 16-byte one's: a kernel that stopped making them would lower the count)
    check(test_dgrad_bn_taken == 28, "conv_dgrad_bn_cuda: %ld of the %ld input gradients above came with the BN "
          "backward's sums, as the 28 of them whose kernels make them (the others' have none)", test_dgrad_bn_taken,
          test_dgrad_bn_calls);
    test_twin_table();
    return test_summary();
}
