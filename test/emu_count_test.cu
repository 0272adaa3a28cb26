// emu_count_test.cu: the emulator's counter mode (make emu-count, test/cuda_emu.cpp) on kernels whose
// memory pattern is known, so that the figures the GPU model is built on are shown to be right:
// sectors per request of coalesced, strided, broadcast and 16-byte loads; shared-memory bank
// conflicts of stride 1, 2 and 32 and of a broadcast; WMMA tiles from shared memory with a 32-byte
// and a padded 48-byte row pitch (ldmatrix: 2-way conflicts, none); the mma count; block sampling and
// its compulsory bytes (data shared by the grid, by a line of blocks, a tile's edge); an 8-byte cp.async
// counted as one access of its width.
// Built only in the counting build (test/bin/emu-count); run by test/run_emu.sh when it exists.
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <mma.h>
#include <cuda_pipeline_primitives.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdarg.h>
#include <string.h>
#include <math.h>
#include <vector>
#include <string>
#include <unistd.h>
#include "test.h"
using namespace nvcuda;

#define CK(x)                                                                                                          \
    do {                                                                                                               \
        cudaError_t e_ = (x);                                                                                          \
        if (e_ != cudaSuccess) {                                                                                       \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));                         \
            exit(1);                                                                                                   \
        }                                                                                                              \
    } while (0)
extern "C" void emu_count_dump_now(void);
#ifndef EMU_COUNT_KINDS
#define EMU_COUNT_KINDS 0   // (make emu-count builds it with 1, loads, and 2, stores: test/cuda_emu.cpp)
#endif

// mode 0: x[lane] floats; 1: x[32*lane]; 2: x[0] (every lane); 3: uint4 per lane; each stored once
__global__ void gload(const float *x, float *y, int mode) {
    int l = threadIdx.x;
    float v;
    if (mode == 0) v = x[l];
    else if (mode == 1) v = x[32 * l];
    else if (mode == 2) v = x[0];
    else {
        uint4 q = ((const uint4 *)x)[l];
        v = __uint_as_float(q.x) + __uint_as_float(q.y) + __uint_as_float(q.z) + __uint_as_float(q.w);
    }
    y[blockIdx.x * 32 + l] = v;
}
// a (gx, gy) grid whose blocks along y share their input: block (bx, by) reads x[32 bx + lane] and,
// lane 0, the next block's first float (4 bytes of a sector that is the next block's: a halo's edge),
// and writes its own 32 floats of y
__global__ void gshare(const float *x, float *y) {
    int l = threadIdx.x, bx = blockIdx.x;
    float v = x[32 * bx + l];
    if (l == 0) v += x[32 * bx + 32];
    y[(blockIdx.y * gridDim.x + bx) * 32 + l] = v;
}
// each lane adds 1 to its float of x: read and written back (twice the compulsory bytes of either)
__global__ void grmw(float *x) { x[blockIdx.x * 32 + threadIdx.x] += 1.0f; }
// shared stores at s[stride * lane], then a broadcast read of s[0] (blockIdx.x is 0)
__global__ void sbank(float *y, int stride) {
    __shared__ float s[1024];
    int l = threadIdx.x;
    s[(stride * l) % 1024] = (float)l;
    __syncthreads();
    y[l] = s[blockIdx.x];   // s[0]: g++ leaves a constant in-bounds index into a static array uncounted
}
// one 16x16 A tile from shared memory with a row pitch of ldm halves, one mma, stored to global
__global__ void wtile(const __half *a, float *c, int ldm) {
    __shared__ __align__(32) __half s[16 * 24];
    for (int i = threadIdx.x; i < 16 * 16; i += 32) s[(i / 16) * ldm + i % 16] = a[i];
    __syncthreads();
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> fb;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc;
    wmma::load_matrix_sync(fa, s, ldm);
    wmma::load_matrix_sync(fb, s, ldm);
    wmma::fill_fragment(fc, 0.0f);
    wmma::mma_sync(fc, fa, fb, fc);
    wmma::store_matrix_sync(c, fc, 16, wmma::mem_row_major);
}
// each lane copies 8 bytes of x into shared memory by cp.async (__pipeline_memcpy_async), then stores one float
__global__ void cpasync(const float *x, float *y) {
    __shared__ __align__(16) float s[64];
    int l = threadIdx.x;
    __pipeline_memcpy_async(&s[2 * l], &x[2 * l], 8);
    __pipeline_commit();
    __pipeline_wait_prior(0);
    __syncthreads();
    y[l] = s[2 * l] + s[2 * l + 1];
}

struct Rec { std::string kernel; std::vector<double> v; };
static std::vector<Rec> read_counts(const char *path) {
    std::vector<Rec> r;
    FILE *f = fopen(path, "r");
    if (!f) { printf("FAIL  cannot read %s\n", path); exit(1); }
    char line[4096];
    while (fgets(line, sizeof line, f)) {
        if (line[0] == '#') continue;
        Rec x;
        char *save = nullptr;
        int i = 0;
        for (char *t = strtok_r(line, "\t\n", &save); t; t = strtok_r(nullptr, "\t\n", &save), i++)
            if (i == 1) x.kernel = t;
            else if (i >= 2) x.v.push_back(atof(t));
        r.push_back(x);
    }
    fclose(f);
    return r;
}
// column indices in the dump after tag and kernel (see count_dump in cuda_emu.cpp)
enum { BLOCKS, SAMPLED, THREADS, GLD_REQ, GLD_SECT, GLD_BYTES, GST_REQ, GST_SECT, GST_BYTES, GB1, GB2, GB4, GB8, GB16,
       SLD_REQ, SLD_WAVE, SLD_PHASE, SST_REQ, SST_WAVE, SST_PHASE, MMA_FLOP, COMPULSORY };

int main() {
    char path[] = "/tmp/emu_count_testXXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) return 1;
    setenv("EMU_COUNT", path, 1);
    std::vector<float> hx(4096);
    for (size_t i = 0; i < hx.size(); i++) hx[i] = (float)i;
    float *x, *y, *y2;
    __half *a;
    CK(cudaMalloc((void **)&x, hx.size() * 4));
    CK(cudaMalloc((void **)&y, 100 * 32 * 4));
    CK(cudaMalloc((void **)&a, 256 * 2));
    CK(cudaMalloc((void **)&y2, 200 * 32 * 4));
    CK(cudaMemcpy(x, hx.data(), hx.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemset(a, 0, 512));
    for (int m = 0; m < 4; m++) gload<<<1, 32>>>(x, y, m);
    for (int s : {1, 2, 32}) sbank<<<1, 32>>>(y, s);
    wtile<<<1, 32>>>(a, y, 16);
    wtile<<<1, 32>>>(a, y, 24);
    setenv("EMU_SAMPLE", "4", 1);
    gload<<<100, 32>>>(x, y, 0);
    gshare<<<dim3(50, 4), 32>>>(x, y2);
    unsetenv("EMU_SAMPLE");
    cpasync<<<1, 32>>>(x, y);
    grmw<<<4, 32>>>(y);
    CK(cudaMemsetAsync(y2, 0, 4096, 0));                              // (async ones are on the launch list)
    CK(cudaMemcpyAsync(y2, y, 1024, cudaMemcpyDeviceToDevice, 0));
    CK(cudaDeviceSynchronize());
    emu_count_dump_now();
    std::vector<Rec> r = read_counts(path);
    unlink(path);
    if (r.size() != 15) { printf("FAIL  expected 15 records in the counter dump, got %zu\n", r.size()); return 1; }
    // exact counts: every figure below is a small integer, compared with tolerance 0. This build counts
    // loads (EMU_COUNT_KINDS 1), stores (2) or both (0): the checks of what it does not count are left out,
    // the sums that mix both take only its own part
    const bool LD = EMU_COUNT_KINDS != 2, ST = EMU_COUNT_KINDS != 1;
    printf("counting %s\n", LD && ST ? "loads and stores" : LD ? "loads only" : "stores only");
    const double want_sect[4] = {4, 32, 1, 16};
    const char *what[4] = {"x[lane] float (coalesced)", "x[32*lane] float (strided)", "x[0] in every lane (broadcast)",
                           "uint4 x[lane] (16-byte)"};
    for (int m = 0; m < 4 && LD; m++) check_close(what[m], r[m].v[GLD_SECT] / r[m].v[GLD_REQ], want_sect[m], 0);
    if (LD) check_close("16-byte loads: bytes in 16-byte accesses", r[3].v[GB16], 512, 0);
    check_close("coalesced float loads + stores: bytes in 4-byte accesses (those counted)", r[0].v[GB4],
                (LD ? 128 : 0) + (ST ? 128 : 0), 0);
    if (ST) check_close("coalesced store: sectors per request", r[0].v[GST_SECT] / r[0].v[GST_REQ], 4, 0);
    const double want_wave[3] = {1, 2, 32};
    for (int i = 0; i < 3; i++) {
        char w[80];
        snprintf(w, sizeof w, "shared store s[%d*lane]: wavefronts per request", i == 0 ? 1 : i == 1 ? 2 : 32);
        if (ST) check_close(w, r[4 + i].v[SST_WAVE] / r[4 + i].v[SST_REQ], want_wave[i], 0);
        if (LD)
            check_close("shared broadcast load s[0]: wavefronts per request", r[4 + i].v[SLD_WAVE] / r[4 + i].v[SLD_REQ],
                        1, 0);
    }
    // a 16x16 half tile is 32 chunks of 16 bytes: one request in 4 phases of 8 rows; a 32-byte row
    // pitch puts rows r and r+4 in the same banks (2 wavefronts a phase), a 48-byte pitch none
    if (LD) {
        check_close("wmma tile, ldm 16 halves: requests (2 loads)", r[7].v[SLD_REQ], 2, 0);
        check_close("wmma tile, ldm 16 halves: bank conflicts per request",
                    (r[7].v[SLD_WAVE] - r[7].v[SLD_PHASE]) / r[7].v[SLD_REQ], 4, 0);
        check_close("wmma tile, ldm 24 halves: bank conflicts per request",
                    (r[8].v[SLD_WAVE] - r[8].v[SLD_PHASE]) / r[8].v[SLD_REQ], 0, 0);
    }
    check_close("one 16x16x16 mma_sync: flop (counted with the loads)", r[7].v[MMA_FLOP], LD ? 2.0 * 16 * 16 * 16 : 0, 0);
    if (ST)
        check_close("wmma store of a 16x16 float tile to global: sectors per request",
                    r[7].v[GST_SECT] / r[7].v[GST_REQ], 16, 0);
    check_close("sampling: blocks run of 100 (EMU_SAMPLE=4)", r[9].v[SAMPLED], 4, 0);
    if (LD) check_close("sampling: load requests scaled to 100 blocks", r[9].v[GLD_REQ], 100, 0);
    check_close("sampling: compulsory bytes (x shared by all blocks once, y 128 bytes a block; those counted)",
                r[9].v[COMPULSORY], (LD ? 128 : 0) + (ST ? 100 * 128 : 0), 0);
    // 4 of 200 blocks run, none sharing bx with another: each one's x (4 sectors and 4 bytes of the
    // next) is found shared by its probe along y, its y (128 bytes) its own. The whole grid: x once,
    // 50 x (128 + 4) bytes, and 200 x 128 bytes of y (counting whole sectors a block touched, not
    // shared by a line, it was 200 x (160 + 128))
    check_close("sampling: compulsory bytes of a grid whose y-line of blocks shares its input (those counted)",
                r[10].v[COMPULSORY], (LD ? 50 * 132 : 0) + (ST ? 200 * 128 : 0), 0);
    // a warp's 8-byte cp.async: one load request of 8 sectors (256 bytes, all in 8-byte accesses), one
    // shared store request of 2 wavefronts (it was counted as 8 one-byte copies: 8 requests)
    if (LD) {
        check_close("cp.async 8 bytes a lane: load requests", r[11].v[GLD_REQ], 1, 0);
        check_close("cp.async 8 bytes a lane: sectors", r[11].v[GLD_SECT], 8, 0);
        check_close("cp.async 8 bytes a lane: bytes in 8-byte accesses", r[11].v[GB8], 256, 0);
    }
    if (ST) {
        check_close("cp.async 8 bytes a lane: shared store requests", r[11].v[SST_REQ], 1, 0);
        check_close("cp.async 8 bytes a lane: shared store wavefronts", r[11].v[SST_WAVE], 2, 0);
    }
    // a read-modify-write moves each sector twice (read, written back): 512 bytes each way. Counted in
    // one build (the sanitizer checking x[i] once), the store was missed (the loads-and-stores build
    // gets 512). A memset's bytes are written once, a device-to-device copy's read and written
    if (EMU_COUNT_KINDS)
        check_close("x += 1 (4 blocks of 32 floats): compulsory bytes of this build's kind", r[12].v[COMPULSORY], 512, 0);
    if (LD) check_close("x += 1: bytes loaded", r[12].v[GLD_BYTES], 512, 0);
    if (EMU_COUNT_KINDS == 2) check_close("x += 1: bytes stored", r[12].v[GST_BYTES], 512, 0);
    check(r[13].kernel == "cudaMemsetAsync", "the memset's record is named cudaMemsetAsync (%s)", r[13].kernel.c_str());
    check_close("cudaMemsetAsync of 4096 bytes: compulsory bytes (those counted)", r[13].v[COMPULSORY], ST ? 4096 : 0, 0);
    check_close("cudaMemsetAsync of 4096 bytes: bytes stored in 16-byte pieces", r[13].v[GST_BYTES], ST ? 4096 : 0, 0);
    check_close("cudaMemcpyAsync of 1024 bytes device to device: compulsory bytes (those counted)", r[14].v[COMPULSORY],
                (LD ? 1024 : 0) + (ST ? 1024 : 0), 0);
    return test_summary();
}
