// cuda_emu.h: force-included (g++ -include) into every .cu file of the emulated build, which compiles
// CUDA as C++17 with g++ and runs it on the CPU, so that every kernel of yolo_kernels.cu is checked
// against its plain-C twin on a machine without a GPU or a CUDA toolkit. The types and the runtime API
// come from the emulator's own headers in test/emu_include (NVIDIA's are never read); this header
// turns the device-side language into host C++:
//   qualifiers -> nothing, __shared__ -> static thread_local (one block runs on one OS thread),
//   threadIdx/blockIdx/blockDim/gridDim -> fields the fiber scheduler updates on every switch,
//   __syncthreads and warp collectives -> rendezvous between fibers (test/cuda_emu.cpp),
//   K<<<g, b, smem, stream>>>(args) -> emu::Launch(...)(args) (rewritten by test/emu_rewrite.sh),
//   nvcuda::wmma -> fragments where every lane holds the whole tile.
// What a kernel must respect for the emulation to be faithful (yolo_kernels.cu follows it):
//   - no inline PTX; tensor cores only through nvcuda::wmma, whose fragments are opaque (loop over
//     num_elements) and whose stored tiles are read only after __syncwarp(), or through ldmatrix and
//     mma.sync m16n8k16 as emu::ldmatrix_x4 / emu::mma_16816 below (the PTX register layouts);
//   - every exchange between threads goes through a *_sync intrinsic or shared memory plus a barrier;
//     __syncthreads only in block-uniform control flow (guard the work, never return before one);
//     named barriers (bar.sync / bar.arrive id, n: emu::named_barrier) in warp-uniform flow, n a
//     multiple of 32 and the same at every use of an id while it counts;
//   - a cp.async (__pipeline_memcpy_async) destination read only after its thread's
//     __pipeline_wait_prior and then a barrier (the emulator writes it at the wait);
//   - no behaviour that depends on __CUDA_ARCH__ (launch bounds may: they change no result), fast-math
//     or the order blocks run in; no spinning on another block; launches only as
//     K<<<grid, block[, smem[, stream]]>>>(args) naming the kernel;
//   - at most one `extern __shared__` per kernel, declared inside it; kernel arguments are device
//     pointers or plain structs passed by value;
//   - only the intrinsics defined here: a new one gets its emulation and a test in emu_selftest.cu.
// The thread orders (EMU_ORDER), the async streams and the host traps (test/cuda_emu.cpp) exist to
// make a missing barrier, a missing synchronisation or a host read of device memory fail visibly.
#pragma once
#include <cuda_runtime.h>   // test/emu_include: the emulator's own, not NVIDIA's
#include <cuda_fp16.h>
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <float.h>
#include <tuple>
#include <type_traits>
#include <utility>
#include <functional>
#include <algorithm>

// ---- qualifiers: the code runs on the host ----
#define __global__
#define __device__
#define __host__
#define __constant__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __shared__ static thread_local
#define __launch_bounds__(...)
#define __restrict__ __restrict
#define __align__(n) __attribute__((aligned(n)))

constexpr int warpSize = 32;

namespace emu {

// ---- scheduler state (defined in cuda_emu.cpp) ----
struct Fiber;
inline thread_local uint3 cur_tid;     // threadIdx of the running fiber
inline thread_local uint3 cur_bid;     // blockIdx of the running block
inline thread_local uint3 cur_bdim, cur_gdim;   // blockDim, gridDim (uint3: no TLS init wrapper)

void syncthreads(const char *file, int line);
int syncthreads_reduce(int op, int pred, const char *file, int line); // op 0 count, 1 and, 2 or
void named_barrier(int id, int n, int arrive, const char *file, int line);   // bar.sync / bar.arrive id, n
// warp collective: every lane of mask deposits val/arg; returns this lane's result.
enum { W_SYNC, W_SHFL, W_SHFL_UP, W_SHFL_DOWN, W_SHFL_XOR, W_BALLOT, W_ADD, W_MINU, W_MAXU, W_MINI,
       W_MAXI, W_AND, W_OR, W_XOR, W_UNIFORM, W_GATHER };
uint64_t warp_op(int op, unsigned mask, uint64_t val, int arg, int width, const char *file, int line);
unsigned active_mask();
void *dyn_smem();
void shared_fresh(void *p, size_t n);
[[noreturn]] void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
// cp.async (cuda_pipeline_primitives.h): a copy's bytes, read when issued, written to dst when waited for
struct AsyncCopy { void *dst; int n, group; alignas(16) unsigned char data[16]; };
void async_push(void *dst, const void *data, int n);
void async_commit();
int async_pop(int prior, AsyncCopy *out);   // the next copy of a group waited for by wait_prior(prior), 0: none
// counter mode (make emu-count; no-ops otherwise): a WMMA tile access and an mma, once per warp;
// count_quiet brackets the emulation's own reads of a tile, which the hardware does not make
void count_tile(const void *p, int rows, int cols, int esz, size_t ld, int rowmajor, int store);
void count_mma(int m, int n, int k);
void count_quiet(int d);

// ---- launches ----
struct LaunchCfg {
    const void *fn;
    const char *name, *file;
    int line;
    dim3 grid, block;
    size_t smem;
    cudaStream_t stream;
};
// run_kernel: checks the configuration as the driver does, then runs (or queues, in async mode)
// body once per CUDA thread of every block. ptrs are the kernel's pointer arguments, checked to
// be device memory. Returns the launch error (also recorded for cudaGetLastError).
cudaError_t run_kernel(const LaunchCfg &cfg, std::function<void()> body, const void *const *ptrs, const int *pidx,
                       int nptr);

template <class T> struct is_ptr : std::is_pointer<typename std::decay<T>::type> {};

template <class F> struct Launch;
template <class... P> struct Launch<void (*)(P...)> {
    void (*fn)(P...);
    LaunchCfg cfg;
    Launch(void (*f)(P...), const char *name, const char *file, int line, dim3 g, dim3 b, size_t smem = 0,
           cudaStream_t s = 0) : fn(f), cfg{(const void *)f, name, file, line, g, b, smem, s} {}
    template <class... A> void operator()(A &&...a) {
        static_assert(sizeof...(A) == sizeof...(P), "kernel launched with the wrong number of arguments");
        std::tuple<typename std::decay<P>::type...> args(std::forward<A>(a)...);
        const void *ptrs[sizeof...(P) + 1] = {nullptr};
        int pidx[sizeof...(P) + 1] = {0};
        int n = 0, i = 0;
        std::apply([&](auto &...x) { ((collect(x, ptrs, pidx, n, i++)), ...); }, args);
        auto f = fn;
        run_kernel(cfg, [f, args]() { std::apply(f, args); }, ptrs, pidx, n);
    }
    template <class T> static void collect(const T &x, const void **ptrs, int *pidx, int &n, int i) {
        if constexpr (std::is_pointer<T>::value) { ptrs[n] = (const void *)x; pidx[n++] = i; }
        else { (void)x; (void)ptrs; (void)pidx; (void)n; (void)i; }
    }
};
template <class... P>
Launch(void (*)(P...), const char *, const char *, int, dim3, dim3, size_t, cudaStream_t) -> Launch<void (*)(P...)>;
template <class... P>
Launch(void (*)(P...), const char *, const char *, int, dim3, dim3, size_t) -> Launch<void (*)(P...)>;
template <class... P> Launch(void (*)(P...), const char *, const char *, int, dim3, dim3) -> Launch<void (*)(P...)>;

template <class T> static inline uint64_t to_bits(T v) {
    static_assert(sizeof(T) <= 8, "warp collective on a value wider than 8 bytes");
    uint64_t u = 0; memcpy(&u, &v, sizeof(T)); return u;
}
template <class T> static inline T from_bits(uint64_t u) { T v; memcpy((void *)&v, &u, sizeof(T)); return v; }
} // namespace emu

#define threadIdx (emu::cur_tid)
#define blockIdx (emu::cur_bid)
#define blockDim (emu::cur_bdim)
#define gridDim (emu::cur_gdim)

// ---- barriers and warp collectives ----
#define __syncthreads() emu::syncthreads(__FILE__, __LINE__)
#define __syncthreads_count(p) emu::syncthreads_reduce(0, (p), __FILE__, __LINE__)
#define __syncthreads_and(p) emu::syncthreads_reduce(1, (p), __FILE__, __LINE__)
#define __syncthreads_or(p) emu::syncthreads_reduce(2, (p), __FILE__, __LINE__)
#define __syncwarp(...) emu::warp_op(emu::W_SYNC, emu_mask_or_all(__VA_ARGS__), 0, 0, 32, __FILE__, __LINE__)
static inline unsigned emu_mask_or_all(unsigned m = 0xffffffffu) { return m; }
#define __activemask() emu::active_mask()
#define __shfl_sync(m, v, l, ...) emu_shfl(emu::W_SHFL, (m), (v), (l), __FILE__, __LINE__, ##__VA_ARGS__)
#define __shfl_up_sync(m, v, d, ...) emu_shfl(emu::W_SHFL_UP, (m), (v), (d), __FILE__, __LINE__, ##__VA_ARGS__)
#define __shfl_down_sync(m, v, d, ...) emu_shfl(emu::W_SHFL_DOWN, (m), (v), (d), __FILE__, __LINE__, ##__VA_ARGS__)
#define __shfl_xor_sync(m, v, d, ...) emu_shfl(emu::W_SHFL_XOR, (m), (v), (d), __FILE__, __LINE__, ##__VA_ARGS__)
template <class T>
static inline T emu_shfl(int op, unsigned mask, T v, int arg, const char *file, int line, int width = 32) {
    return emu::from_bits<T>(emu::warp_op(op, mask, emu::to_bits(v), arg, width, file, line));
}
#define __ballot_sync(m, p) ((unsigned)emu::warp_op(emu::W_BALLOT, (m), (p) ? 1 : 0, 0, 32, __FILE__, __LINE__))
#define __any_sync(m, p) (emu::warp_op(emu::W_BALLOT, (m), (p) ? 1 : 0, 0, 32, __FILE__, __LINE__) != 0)
#define __all_sync(m, p)                                                                                               \
    ((unsigned)emu::warp_op(emu::W_BALLOT, (m), (p) ? 1 : 0, 0, 32, __FILE__, __LINE__) == (unsigned)(m))
#define __uni_sync(m, p) (emu::warp_op(emu::W_UNIFORM, (m), (p) ? 1 : 0, 0, 32, __FILE__, __LINE__) != 0)
static inline unsigned emu_reduce_u(int op, unsigned m, unsigned v, const char *f, int l) {
    return (unsigned)emu::warp_op(op, m, v, 0, 32, f, l);
}
static inline int emu_reduce_i(int op, unsigned m, int v, const char *f, int l) {
    return (int)(int64_t)emu::warp_op(op, m, (uint64_t)(int64_t)v, 0, 32, f, l);
}
static inline unsigned emu_reduce_add(unsigned m, unsigned v, const char *f, int l) {
    return emu_reduce_u(emu::W_ADD, m, v, f, l);
}
static inline int emu_reduce_add(unsigned m, int v, const char *f, int l) {
    return (int)emu_reduce_u(emu::W_ADD, m, (unsigned)v, f, l);
}
static inline unsigned emu_reduce_min(unsigned m, unsigned v, const char *f, int l) {
    return emu_reduce_u(emu::W_MINU, m, v, f, l);
}
static inline int emu_reduce_min(unsigned m, int v, const char *f, int l) {
    return emu_reduce_i(emu::W_MINI, m, v, f, l);
}
static inline unsigned emu_reduce_max(unsigned m, unsigned v, const char *f, int l) {
    return emu_reduce_u(emu::W_MAXU, m, v, f, l);
}
static inline int emu_reduce_max(unsigned m, int v, const char *f, int l) {
    return emu_reduce_i(emu::W_MAXI, m, v, f, l);
}
#define __reduce_add_sync(m, v) emu_reduce_add((m), (v), __FILE__, __LINE__)
#define __reduce_min_sync(m, v) emu_reduce_min((m), (v), __FILE__, __LINE__)
#define __reduce_max_sync(m, v) emu_reduce_max((m), (v), __FILE__, __LINE__)
#define __reduce_and_sync(m, v) emu_reduce_u(emu::W_AND, (m), (v), __FILE__, __LINE__)
#define __reduce_or_sync(m, v) emu_reduce_u(emu::W_OR, (m), (v), __FILE__, __LINE__)
#define __reduce_xor_sync(m, v) emu_reduce_u(emu::W_XOR, (m), (v), __FILE__, __LINE__)
#define __threadfence() __atomic_thread_fence(__ATOMIC_SEQ_CST)
#define __threadfence_block() __atomic_thread_fence(__ATOMIC_SEQ_CST)

// ---- atomics (return the old value, as CUDA's do) ----
static inline int atomicAdd(int *p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
static inline unsigned atomicAdd(unsigned *p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
static inline unsigned long long atomicAdd(unsigned long long *p, unsigned long long v) {
    return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}
template <class T, class Op> static inline T emu_atomic_cas_loop(T *p, Op op) {
    static_assert(sizeof(T) == 2 || sizeof(T) == 4 || sizeof(T) == 8, "atomic size");
    typedef typename std::conditional<sizeof(T) == 2, uint16_t,
                                      typename std::conditional<sizeof(T) == 4, uint32_t, uint64_t>::type>::type U;
    U *q = (U *)(void *)p, old = __atomic_load_n(q, __ATOMIC_RELAXED), nw;
    T o;
    do { memcpy((void *)&o, &old, sizeof(T)); T n = op(o); memcpy(&nw, (void *)&n, sizeof(T)); }
    while (!__atomic_compare_exchange_n(q, &old, nw, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
    return o;
}
static inline float atomicAdd(float *p, float v) { return emu_atomic_cas_loop(p, [v](float o) { return o + v; }); }
static inline double atomicAdd(double *p, double v) { return emu_atomic_cas_loop(p, [v](double o) { return o + v; }); }
static inline __half atomicAdd(__half *p, __half v) {
    return emu_atomic_cas_loop(p, [v](__half o) { return __float2half(__half2float(o) + __half2float(v)); });
}
static inline __half2 atomicAdd(__half2 *p, __half2 v) {
    return emu_atomic_cas_loop(p, [v](__half2 o) { return __hadd2(o, v); });
}
static inline int atomicSub(int *p, int v) { return __atomic_fetch_sub(p, v, __ATOMIC_RELAXED); }
static inline unsigned atomicSub(unsigned *p, unsigned v) { return __atomic_fetch_sub(p, v, __ATOMIC_RELAXED); }
static inline int atomicMax(int *p, int v) { return emu_atomic_cas_loop(p, [v](int o) { return o > v ? o : v; }); }
static inline unsigned atomicMax(unsigned *p, unsigned v) {
    return emu_atomic_cas_loop(p, [v](unsigned o) { return o > v ? o : v; });
}
static inline int atomicMin(int *p, int v) { return emu_atomic_cas_loop(p, [v](int o) { return o < v ? o : v; }); }
static inline unsigned atomicMin(unsigned *p, unsigned v) {
    return emu_atomic_cas_loop(p, [v](unsigned o) { return o < v ? o : v; });
}
static inline int atomicExch(int *p, int v) { return __atomic_exchange_n(p, v, __ATOMIC_RELAXED); }
static inline unsigned atomicExch(unsigned *p, unsigned v) { return __atomic_exchange_n(p, v, __ATOMIC_RELAXED); }
static inline float atomicExch(float *p, float v) { return emu_atomic_cas_loop(p, [v](float) { return v; }); }
static inline int atomicCAS(int *p, int c, int v) {
    __atomic_compare_exchange_n(p, &c, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
    return c;
}
static inline unsigned atomicCAS(unsigned *p, unsigned c, unsigned v) {
    __atomic_compare_exchange_n(p, &c, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
    return c;
}
static inline unsigned long long atomicCAS(unsigned long long *p, unsigned long long c, unsigned long long v) {
    __atomic_compare_exchange_n(p, &c, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
    return c;
}
static inline int atomicAnd(int *p, int v) { return __atomic_fetch_and(p, v, __ATOMIC_RELAXED); }
static inline int atomicOr(int *p, int v) { return __atomic_fetch_or(p, v, __ATOMIC_RELAXED); }
static inline unsigned atomicAnd(unsigned *p, unsigned v) { return __atomic_fetch_and(p, v, __ATOMIC_RELAXED); }
static inline unsigned atomicOr(unsigned *p, unsigned v) { return __atomic_fetch_or(p, v, __ATOMIC_RELAXED); }

// ---- device math: computed in float (or double) and rounded once; __expf and __fdividef in the
// hardware's two steps (each rounded; the special-function unit's own error of 1-2 ulp is not modelled) ----
// __expf: x times log2(e) rounded to float, then 2^that (ex2.approx.ftz: results under FLT_MIN are 0)
inline float __expf(float x) {
    float r = exp2f(x * 1.44269504088896341f);
    return r < FLT_MIN ? 0.0f : r;
}
inline float __logf(float x) { return logf(x); }
inline float __log2f(float x) { return log2f(x); }
inline float __powf(float x, float y) { return powf(x, y); }
inline float __sinf(float x) { return sinf(x); }
inline float __cosf(float x) { return cosf(x); }
inline float __tanf(float x) { return tanf(x); }
inline float exp10f(float x) { return (float)pow(10.0, (double)x); }
// __fdividef: a times the reciprocal of b, each rounded; 0 where 2^126 < |b| < 2^128 (CUDA's documented range)
inline float __fdividef(float a, float b) {
    if (fabsf(b) > 8.507059173e37f && fabsf(b) < INFINITY) return 0.0f;
    return a * (1.0f / b);
}
inline float rsqrtf(float x) { return (float)(1.0 / sqrt((double)x)); }
inline double rsqrt(double x) { return 1.0 / sqrt(x); }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fsqrt_rn(float x) { return sqrtf(x); }
inline float __saturatef(float x) { return x != x ? 0.0f : x < 0.0f ? 0.0f : x > 1.0f ? 1.0f : x; }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline int __float_as_int(float x) { int i; memcpy(&i, &x, 4); return i; }
inline float __int_as_float(int i) { float x; memcpy(&x, &i, 4); return x; }
inline unsigned __float_as_uint(float x) { unsigned i; memcpy(&i, &x, 4); return i; }
inline float __uint_as_float(unsigned i) { float x; memcpy(&x, &i, 4); return x; }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x ? __builtin_clz((unsigned)x) : 32; }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline unsigned __brev(unsigned x) {
    unsigned r = 0;
    for (int i = 0; i < 32; i++) r |= ((x >> i) & 1u) << (31 - i);
    return r;
}
// __byte_perm(x, y, s): byte i of the result is byte (s >> 4i) & 7 of the 8 bytes y:x (PTX prmt, default mode)
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
    const uint64_t v = ((uint64_t)y << 32) | x;
    unsigned r = 0;
    for (int i = 0; i < 4; i++) r |= (unsigned)((v >> (8 * ((s >> (4 * i)) & 7))) & 0xff) << (8 * i);
    return r;
}
inline int __mul24(int a, int b) { return a * b; }
inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((uint64_t)a * b) >> 32); }
inline float __ldg(const float *p) { return *p; }
template <class T> inline T __ldg(const T *p) { return *p; }
#ifndef min
using std::min;
using std::max;
#endif

// ---- WMMA (nvcuda::wmma): every lane holds the whole tile ----
namespace nvcuda { namespace wmma {
struct matrix_a {}; struct matrix_b {}; struct accumulator {};
struct row_major {}; struct col_major {};
enum layout_t { mem_row_major, mem_col_major };
template <class Use, int M, int N, int K, class T, class Layout = void> struct fragment {
    static constexpr int rows = std::is_same<Use, matrix_b>::value ? K : M;
    static constexpr int cols = std::is_same<Use, matrix_a>::value ? K : N;
    enum { num_elements = rows * cols };
    typedef T element_type;
    T x[rows * cols];   // logical row-major (rows, cols), the same in every lane
};
void warp_check(const void *p, unsigned ldm, unsigned align, const char *what, const char *file, int line);
// the emulation's own work on fragments is not a memory access of the kernel: in the counting
// build (EMU_COUNTING, make emu-count) it is left uninstrumented, which also keeps it fast
#ifdef EMU_COUNTING
#define EMU_UNCOUNTED __attribute__((no_sanitize_address))
#else
#define EMU_UNCOUNTED
#endif
template <class U, int M, int N, int K, class T, class L, class V>
EMU_UNCOUNTED static inline void fill_fragment(fragment<U, M, N, K, T, L> &f, const V &v) {
    for (int i = 0; i < f.num_elements; i++) f.x[i] = (T)v;
}
template <class U, int M, int N, int K, class T, class L, class S>
EMU_UNCOUNTED static inline void emu_load(fragment<U, M, N, K, T, L> &f, const S *p, unsigned ldm, bool rowmaj,
                                          const char *file, int line) {
    warp_check(p, ldm * sizeof(S), 32, "load_matrix_sync", file, line);
    typedef fragment<U, M, N, K, T, L> Fr;
    emu::count_tile(p, Fr::rows, Fr::cols, (int)sizeof(S), ldm, rowmaj, 0);
    emu::count_quiet(1);
    for (int r = 0; r < Fr::rows; r++)
        for (int c = 0; c < Fr::cols; c++)
            f.x[r * Fr::cols + c] = (T)(rowmaj ? p[(size_t)r * ldm + c] : p[(size_t)c * ldm + r]);
    emu::count_quiet(-1);
}
template <class U, int M, int N, int K, class T, class S>
static inline void emu_load_l(fragment<U, M, N, K, T, row_major> &f, const S *p, unsigned ldm, const char *fl, int ln) {
    emu_load(f, p, ldm, true, fl, ln);
}
template <class U, int M, int N, int K, class T, class S>
static inline void emu_load_l(fragment<U, M, N, K, T, col_major> &f, const S *p, unsigned ldm, const char *fl, int ln) {
    emu_load(f, p, ldm, false, fl, ln);
}
template <int M, int N, int K, class T, class S>
static inline void emu_load_l(fragment<accumulator, M, N, K, T, void> &f, const S *p, unsigned ldm, layout_t l,
                              const char *fl, int ln) {
    emu_load(f, p, ldm, l == mem_row_major, fl, ln);
}
#define load_matrix_sync(f, ...) emu_load_l(f, __VA_ARGS__, __FILE__, __LINE__)
unsigned lane_id();
template <int M, int N, int K, class T, class S>
EMU_UNCOUNTED static inline void emu_store(S *p, const fragment<accumulator, M, N, K, T, void> &f, unsigned ldm,
                                           layout_t l, const char *file, int line) {
    warp_check(p, ldm * sizeof(S), 32, "store_matrix_sync", file, line);
    bool rm = l == mem_row_major;
    // only this lane's share: a tile read back before __syncwarp() is incomplete, as on hardware
    // lane L owns elements [L*E, L*E+E), E = M*N/32 (like hardware, a few neighbours per lane);
    // a lane reading e = lane + 32k or a whole row back needs other lanes' stores
    const int E = M * N / 32;
    emu::count_tile(p, M, N, (int)sizeof(S), ldm, rm, 1);
    emu::count_quiet(1);
    for (int i = (int)lane_id() * E; i < ((int)lane_id() + 1) * E; i++) {
        int r = i / N, c = i % N;
        p[rm ? (size_t)r * ldm + c : (size_t)c * ldm + r] = (S)f.x[i];
    }
    emu::count_quiet(-1);
}
#define store_matrix_sync(p, ...) emu_store(p, __VA_ARGS__, __FILE__, __LINE__)
uint64_t fragments_hash(const void *a, size_t na, const void *b, size_t nb, const void *c, size_t nc);
const unsigned char (*mma_share(const float *mine, int n, uint64_t hash, const char *file, int line))[64];
// mma_sync: d = a b + c, each element summed in k order from c. Every lane holds the whole tiles, the same
// in every lane of a converged warp, so the lanes share the work: lane L sums elements [L*E, L*E+E), E =
// M*N/32, and one rendezvous of the warp hands every lane all of them (with a hash of each lane's a, b, c:
// fragments that differ between the lanes are a kernel error the emulation reports, as its whole-tile
// fragments could not otherwise hold it)
template <int M, int N, int K, class TA, class LA, class LB, class TC, class TD>
EMU_UNCOUNTED static inline void
mma_sync(fragment<accumulator, M, N, K, TD, void> &d, const fragment<matrix_a, M, N, K, TA, LA> &a,
         const fragment<matrix_b, M, N, K, TA, LB> &b, const fragment<accumulator, M, N, K, TC, void> &c) {
    static_assert(M * N == 256, "the emulated WMMA shapes have 256-element accumulators");
    constexpr int E = M * N / 32;
    emu::count_mma(M, N, K);
    const int l = (int)lane_id();
    static_assert(N % E == 0, "a lane's elements lie in one row");
    const int i = l * E / N, j0 = l * E % N;
    float mine[E], ar[K];
    for (int k = 0; k < K; k++) ar[k] = (float)a.x[i * K + k];   // the FP16 inputs widened exactly
    for (int e = 0; e < E; e++) {
        float s = (float)c.x[i * N + j0 + e];
        for (int k = 0; k < K; k++) s += ar[k] * (float)b.x[k * N + j0 + e];
        mine[e] = s;
    }
    const unsigned char(*all)[64] =
            mma_share(mine, E, fragments_hash(a.x, sizeof a.x, b.x, sizeof b.x, c.x, sizeof c.x), __FILE__, __LINE__);
    for (int m = 0; m < 32; m++)
        for (int e = 0; e < E; e++) {
            float v;
            memcpy(&v, all[m] + 4 * e, 4);
            d.x[m * E + e] = (TD)v;
        }
}
} } // namespace nvcuda::wmma

// ---- ldmatrix and mma.sync on the PTX ISA's register layouts, as warp collectives ----
// yolo_kernels.cu reaches them through its ldsm_x4 / ldsm_x4_t / mma_16816 (inline PTX under nvcc,
// these under the emulation: CUDA_EMU_MMA). Each is one rendezvous of the whole warp (warp_gather).
#define CUDA_EMU_MMA 1
namespace emu {
typedef const unsigned char (*Gathered)[64];
// warp_gather: every lane of the warp deposits n (<= 64) bytes at p; returns all 32 lanes' bytes as
// they were when the last lane arrived (valid until the warp's next gather)
static inline Gathered warp_gather(const void *p, int n, const char *file, int line) {
    return (Gathered)(uintptr_t)warp_op(W_GATHER, 0xffffffffu, (uint64_t)(uintptr_t)p, n, 32, file, line);
}
static inline float half_bits(uint16_t b) { __half h; memcpy((void *)&h, &b, 2); return (float)h; }
// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16: lanes 8i .. 8i+7 give the 8 row addresses (16
// bytes each) of matrix i; lane l receives r[i] = matrix i's elements (l/4, 2(l%4)) and (l/4, 2(l%4)+1),
// with trans (2(l%4), l/4) and (2(l%4)+1, l/4). The lane's own 16-byte read is its memory access.
static inline void ldmatrix_x4(uint32_t (&r)[4], const void *row, bool trans, const char *file, int line) {
    if ((uintptr_t)row & 15) fail("ldmatrix (%s:%d): row address %p is not 16-byte aligned", file, line, row);
    const uint4 v = *(const uint4 *)row;
    Gathered all = warp_gather(&v, 16, file, line);
    const int l = (int)nvcuda::wmma::lane_id(), g = l >> 2, t = l & 3;
    for (int i = 0; i < 4; i++) {
        uint16_t lo, hi;
        if (!trans) { memcpy(&lo, all[8 * i + g] + 4 * t, 2); memcpy(&hi, all[8 * i + g] + 4 * t + 2, 2); }
        else { memcpy(&lo, all[8 * i + 2 * t] + 2 * g, 2); memcpy(&hi, all[8 * i + 2 * t + 1] + 2 * g, 2); }
        r[i] = lo | (uint32_t)hi << 16;
    }
}
// mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32, d = A B + d: A 16 x 16 (a[0], a[1]: rows g, g+8 of
// columns 2t, 2t+1; a[2], a[3]: the same at columns 2t+8, 2t+9), B 16 x 8 (b[0]: rows 2t, 2t+1 of
// column g; b[1]: rows 2t+8, 2t+9), d: rows g, g+8 of columns 2t, 2t+1 (g = lane/4, t = lane%4). Each
// output is summed in k order from d, as the WMMA emulation sums.
static inline void mma_16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], const char *file,
                             int line) {
    const uint32_t mine[6] = {a[0], a[1], a[2], a[3], b[0], b[1]};
    Gathered all = warp_gather(mine, 24, file, line);
    count_mma(16, 8, 16);
    // only what this lane's outputs read: A's rows g, g+8 (lanes 4g .. 4g+3) and B's columns 2t, 2t+1
    const int l = (int)nvcuda::wmma::lane_id(), g = l >> 2, t = l & 3;
    float A[2][16], Bm[2][16];   // A[r][k]: row g + 8r; Bm[c][k]: column 2t + c
    for (int u = 0; u < 4; u++) {
        uint32_t w[6];
        memcpy(w, all[4 * g + u], 16);
        for (int h = 0; h < 2; h++) {
            A[0][2 * u + h] = half_bits((uint16_t)(w[0] >> 16 * h));
            A[1][2 * u + h] = half_bits((uint16_t)(w[1] >> 16 * h));
            A[0][2 * u + 8 + h] = half_bits((uint16_t)(w[2] >> 16 * h));
            A[1][2 * u + 8 + h] = half_bits((uint16_t)(w[3] >> 16 * h));
        }
        for (int c = 0; c < 2; c++) {
            memcpy(w + 4, all[4 * (2 * t + c) + u] + 16, 8);
            for (int h = 0; h < 2; h++) {
                Bm[c][2 * u + h] = half_bits((uint16_t)(w[4] >> 16 * h));
                Bm[c][2 * u + 8 + h] = half_bits((uint16_t)(w[5] >> 16 * h));
            }
        }
    }
    for (int e = 0; e < 4; e++) {
        float s = d[e];
        for (int k = 0; k < 16; k++) s += A[e >> 1][k] * Bm[e & 1][k];
        d[e] = s;
    }
}
} // namespace emu
