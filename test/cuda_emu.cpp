// cuda_emu.cpp: the runtime behind test/cuda_emu.h. CUDA threads are fibers (a hand-written
// x86-64 or aarch64 switch of the callee-saved registers, 64 KB stacks with a guard page); the threads of
// one block run on one OS thread and blocks run one after another. Also here: device memory with
// guard pages and poisoning, the runtime API subset, and deferred (async) streams.
// Environment: EMU_ORDER=forward|reverse|random (thread order between rendezvous, and block order), EMU_SEED,
// EMU_STRICT=1 (a thread returning while others wait at a barrier aborts), EMU_ASYNC=1 (queue work
// until a synchronisation point), EMU_HOSTTRAP=1 (device memory is PROT_NONE while host code runs).
#include "cuda_emu.h"
#include <stdio.h>
#include <stdlib.h>
#include <stdarg.h>
#include <signal.h>
#include <unistd.h>
#include <sys/mman.h>
#include <time.h>
#include <map>
#include <unordered_map>
#include <unordered_set>
#include <set>
#include <utility>
#include <deque>
#include <vector>
#include <string>
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define EMU_ASAN 1
#endif
#if !defined(__x86_64__) && !defined(__aarch64__)
#error "cuda_emu: the fiber switch is written for x86-64 and aarch64"
#endif

// ------------------------------------------------------------------------------------------
// settings
// ------------------------------------------------------------------------------------------
static int g_order = -1;       // 0 forward, 1 reverse, 2 random
static int g_strict = -1, g_async = -1, g_hosttrap = -1;
static uint64_t g_rng = 0x9e3779b97f4a7c15ULL;
static int env_int(const char *k, int def) { const char *v = getenv(k); return v && *v ? atoi(v) : def; }
static void settings_init() {
    if (g_order >= 0) return;
    const char *o = getenv("EMU_ORDER");
    g_order = !o || !strcmp(o, "forward") ? 0 : !strcmp(o, "reverse") ? 1 : !strcmp(o, "random") ? 2 : -2;
    if (g_order == -2) { fprintf(stderr, "EMU_ORDER=%s: expected forward, reverse or random\n", o); exit(2); }
    if (g_strict < 0) g_strict = env_int("EMU_STRICT", 0);
    if (g_async < 0) g_async = env_int("EMU_ASYNC", 0);
    if (g_hosttrap < 0) g_hosttrap = env_int("EMU_HOSTTRAP", 0);
    g_rng ^= (uint64_t)env_int("EMU_SEED", 1) * 0xbf58476d1ce4e5b9ULL;
}
static uint64_t rng_next() { g_rng ^= g_rng << 13; g_rng ^= g_rng >> 7; g_rng ^= g_rng << 17; return g_rng; }
extern "C" void emu_set_order(int o) { settings_init(); g_order = o; }
extern "C" void emu_set_strict(int s) { settings_init(); g_strict = s; }
extern "C" void emu_set_async(int a) { settings_init(); g_async = a; }
extern "C" void emu_set_hosttrap(int h);

// ------------------------------------------------------------------------------------------
// fibers and the block scheduler
// ------------------------------------------------------------------------------------------
#if defined(__x86_64__)
asm(R"(
.text
.globl emu_ctx_switch
.type emu_ctx_switch,@function
emu_ctx_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
.size emu_ctx_switch,.-emu_ctx_switch
.section .note.GNU-stack,"",@progbits
.text
)");
#else
// aarch64 (AAPCS64): x19-x28, the frame pointer x29, the link register x30 and the low halves of
// v8-v15 (d8-d15) are callee-saved; they go in a 160-byte frame on the old stack, whose sp is
// stored, and come back from the new one. ret jumps to the restored x30.
asm(R"(
.text
.globl emu_ctx_switch
.type emu_ctx_switch,%function
emu_ctx_switch:
    sub sp, sp, #160
    stp x19, x20, [sp, #0]
    stp x21, x22, [sp, #16]
    stp x23, x24, [sp, #32]
    stp x25, x26, [sp, #48]
    stp x27, x28, [sp, #64]
    stp x29, x30, [sp, #80]
    stp d8, d9, [sp, #96]
    stp d10, d11, [sp, #112]
    stp d12, d13, [sp, #128]
    stp d14, d15, [sp, #144]
    mov x2, sp
    str x2, [x0]
    mov sp, x1
    ldp x19, x20, [sp, #0]
    ldp x21, x22, [sp, #16]
    ldp x23, x24, [sp, #32]
    ldp x25, x26, [sp, #48]
    ldp x27, x28, [sp, #64]
    ldp x29, x30, [sp, #80]
    ldp d8, d9, [sp, #96]
    ldp d10, d11, [sp, #112]
    ldp d12, d13, [sp, #128]
    ldp d14, d15, [sp, #144]
    add sp, sp, #160
    ret
.size emu_ctx_switch,.-emu_ctx_switch
.section .note.GNU-stack,"",@progbits
.text
)");
#endif
extern "C" void emu_ctx_switch(void **save_sp, void *to_sp);

namespace emu {

enum { F_RUN, F_BAR, F_WARP, F_DONE, F_NBAR, F_PARK };
struct Fiber { void *sp; uint3 tid; int lin, state, nbar; const char *file; int line; char *stack; void *fake; };
struct Warp {
    unsigned arrived, mask;
    int op, width;
    const char *file;
    int line;
    uint64_t val[32], res[32];
    int arg[32];
    unsigned char snap[32][64];   // warp_gather: the lanes' bytes, copied when the last lane arrives
};
// NBar: a named barrier (bar.sync / bar.arrive id, count; ids 1-15, 0 is __syncthreads'): the count it
// completes at, the threads that have arrived since it last completed, where the first of them was
struct NBar { int n, count; const char *file; int line; };
struct Block {
    int n, alive, bar_count, bar_red, bar_op, bar_result; const char *bar_file; int bar_line;
    NBar nb[16];
    Fiber *f; Warp *w; std::function<void()> *body; void *sched_sp;
};
static thread_local Block *B;
static thread_local Fiber *F;
// counter mode (defined at the end of the file; empty unless built with -DEMU_COUNTERS)
static void count_flush();
static void count_block_begin(int n, unsigned long block);
static void count_probe_begin(int n);
static void count_probe_end(unsigned g);
static void count_launch_begin(const LaunchCfg &c, unsigned long blocks, unsigned long sampled);
static void count_launch_end();
static void count_fill(const char *what, size_t n, int copy);
int count_sample();
int count_full(const char *name);
void count_shared_range(void *p, size_t n);
static thread_local const LaunchCfg *K;       // kernel now running (for messages), null on the host
static thread_local std::vector<char *> stacks;
static size_t stack_bytes() {
#ifdef EMU_ASAN
    return 512 << 10;
#else
    return (size_t)env_int("EMU_STACK_KB", 64) << 10;
#endif
}
static const size_t PAGE = (size_t)sysconf(_SC_PAGESIZE);   // guard pages: 4 KB on x86-64, 4, 16 or 64 KB on aarch64
static char *smem_map; static size_t smem_cap = 232448; static char *smem_ptr; static size_t smem_size;
#ifdef EMU_ASAN
static thread_local const void *sched_bottom; static thread_local size_t sched_size;
#endif

static std::string where() {
    char s[256] = "on the host";
    if (K && F)
        snprintf(s, sizeof s, "in kernel %s (launched at %s:%d) block (%u,%u,%u) thread (%u,%u,%u)", K->name, K->file,
                 K->line, cur_bid.x, cur_bid.y, cur_bid.z, F->tid.x, F->tid.y, F->tid.z);
    else if (K) snprintf(s, sizeof s, "in kernel %s (launched at %s:%d)", K->name, K->file, K->line);
    return s;
}
void fail(const char *fmt, ...) {
    va_list ap; va_start(ap, fmt);
    fprintf(stderr, "EMU ERROR: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n  %s\n", where().c_str());
    va_end(ap);
    fflush(stderr); fflush(stdout);
    abort();
}

static void to_sched() {
#ifdef EMU_ASAN
    __sanitizer_start_switch_fiber(F->state == F_DONE ? nullptr : &F->fake, sched_bottom, sched_size);
#endif
    emu_ctx_switch(&F->sp, B->sched_sp);
#ifdef EMU_ASAN
    __sanitizer_finish_switch_fiber(F->fake, nullptr, nullptr);
#endif
}
static void fiber_exit();
extern "C" void emu_fiber_start() {
#ifdef EMU_ASAN
    __sanitizer_finish_switch_fiber(nullptr, &sched_bottom, &sched_size);
#endif
    (*B->body)();
    fiber_exit();
}
static const char *op_name(int op) {
    static const char *n[] = {"__syncwarp", "__shfl_sync", "__shfl_up_sync", "__shfl_down_sync", "__shfl_xor_sync",
                              "__ballot/any/all_sync", "__reduce_add_sync", "__reduce_min_sync", "__reduce_max_sync",
                              "__reduce_min_sync", "__reduce_max_sync", "__reduce_and_sync", "__reduce_or_sync",
                              "__reduce_xor_sync", "warp-uniform check", "ldmatrix/mma.sync (warp gather)"};
    return op >= 0 && op <= W_GATHER ? n[op] : "?";
}
static void release_barrier() {
    count_flush();
    for (int i = 0; i < B->n; i++) if (B->f[i].state == F_BAR) B->f[i].state = F_RUN;
    B->bar_count = 0;
}
// cp.async (cuda_pipeline_primitives.h): per thread of the running block, the copies issued and not yet
// waited for, in issue order, each with its group (the commits its thread had made when it was issued);
// __pipeline_wait_prior(n) writes those of every group but the last n committed ones, so a thread that
// reads a stage before its producer's wait (or after a barrier the producer reached before waiting)
// reads what was there before, as it may on a GPU. A thread that ends with copies pending has them
// written then.
struct AsyncQ { std::deque<AsyncCopy> q; int commits = 0; };
static thread_local std::vector<AsyncQ> asyncq;
static AsyncQ &async_q() {
    if (!F) fail("__pipeline_* used outside a kernel");
    if ((int)asyncq.size() < B->n) asyncq.resize(B->n);
    return asyncq[F->lin];
}
void async_push(void *dst, const void *data, int n) {
    AsyncQ &a = async_q();
    AsyncCopy c;
    c.dst = dst; c.n = n; c.group = a.commits;
    memcpy(c.data, data, n);
    a.q.push_back(c);
}
void async_commit() { async_q().commits++; }
int async_pop(int prior, AsyncCopy *out) {
    AsyncQ &a = async_q();
    if (a.q.empty() || a.q.front().group >= a.commits - prior) return 0;
    *out = a.q.front();
    a.q.pop_front();
    return 1;
}
static void async_reset(int n) {
    if ((int)asyncq.size() < n) asyncq.resize(n);
    for (int i = 0; i < n; i++) asyncq[i].q.clear(), asyncq[i].commits = 0;
}
static void fiber_exit() {
    if (F->lin < (int)asyncq.size()) {
        for (AsyncCopy &c : asyncq[F->lin].q) memcpy(c.dst, c.data, c.n);
        asyncq[F->lin].q.clear();
    }
    F->state = F_DONE;
    B->alive--;
    if (B->bar_count > 0) {
        if (g_strict)
            fail("thread returned while %d threads wait at __syncthreads (%s:%d): barriers must be reached by every "
                 "thread (strict mode)",
                 B->bar_count, B->bar_file, B->bar_line);
        static int warned;
        if (!warned++)
            fprintf(stderr, "EMU WARNING: a thread returned while others wait at __syncthreads (%s:%d) %s\n",
                    B->bar_file, B->bar_line, where().c_str());
        if (B->bar_count == B->alive) release_barrier();
    }
    Warp &w = B->w[F->lin >> 5];
    if (w.arrived && (w.mask >> (F->lin & 31) & 1))
        fail("lane %d returned while lanes 0x%08x wait for it in %s (%s:%d)", F->lin & 31, w.arrived, op_name(w.op),
             w.file, w.line);
    to_sched();
    abort();  // a finished fiber is never resumed
}
static void yield_run() { F->state = F_RUN; to_sched(); }

void syncthreads(const char *file, int line) { syncthreads_reduce(-1, 0, file, line); }
int syncthreads_reduce(int op, int pred, const char *file, int line) {
    if (!B) fail("__syncthreads called outside a kernel");
    if (B->bar_count == 0) { B->bar_file = file; B->bar_line = line; B->bar_red = op == 1 ? 1 : 0; B->bar_op = op; }
    else if (g_strict && (B->bar_line != line || strcmp(B->bar_file, file)))
        fail("threads wait at different __syncthreads: %s:%d and %s:%d (strict mode)", file, line, B->bar_file,
             B->bar_line);
    if (op == 0) B->bar_red += pred != 0;
    else if (op == 1) B->bar_red &= pred != 0;
    else if (op == 2) B->bar_red |= pred != 0;
    F->file = file; F->line = line;
    if (++B->bar_count == B->alive) {
        B->bar_result = B->bar_red;
        release_barrier();
        yield_run();
        return B->bar_result;
    }
    F->state = F_BAR;
    to_sched();
    return B->bar_result;   // valid until every thread reaches the next barrier, this one included
}
// named_barrier: bar.arrive (arrive: counts this thread and goes on) or bar.sync (counts it and waits)
// on barrier id until n threads have arrived since it last completed; then every thread waiting on it
// runs again. Warp-granular as on the GPU: n a multiple of 32, at most the block's threads.
// Memory written before the arrival is read after the wait (the fibers run one at a time). An arriving
// thread goes on without giving up its turn (in random order: a third of the time), so that a producer
// may run steps ahead of its consumers, as on the GPU, and a missing wait shows; in random order it may
// also give up its turn, or be parked (a third of the time each): it runs again only once no other
// thread can, as a warp the GPU's scheduler leaves behind, so that what it does after arriving (a
// cp.async wait placed after the arrive) comes after what its consumers do next.
void named_barrier(int id, int n, int arrive, const char *file, int line) {
    if (!B) fail("bar.sync/bar.arrive called outside a kernel");
    if (id < 1 || id > 15) fail("named barrier id %d (%s:%d): 1-15 (0 is __syncthreads')", id, file, line);
    if (n <= 0 || n % 32 || n > (B->n + 31) / 32 * 32)
        fail("named barrier %d (%s:%d): count %d is not a positive multiple of 32 within the block's %d threads", id, file,
             line, n, B->n);
    NBar &b = B->nb[id];
    if (b.count == 0) { b.n = n; b.file = file; b.line = line; }
    else if (b.n != n)
        fail("named barrier %d: %s:%d counts %d threads while %s:%d counted %d", id, file, line, n, b.file, b.line, b.n);
    F->file = file; F->line = line;
    const int how = !arrive ? 1 : g_order != 2 ? 0 : (int)(rng_next() % 3);   // 0 go on, 1 yield, 2 park
    auto leave = [&]() {
        if (how == 1) yield_run();
        else if (how == 2) { F->state = F_PARK; to_sched(); }
    };
    if (++b.count == n) {
        b.count = 0;
        for (int i = 0; i < B->n; i++)
            if (B->f[i].state == F_NBAR && B->f[i].nbar == id) B->f[i].state = F_RUN;
        leave();
        return;
    }
    if (arrive) { leave(); return; }
    F->state = F_NBAR; F->nbar = id;
    to_sched();
}
} // namespace emu

namespace emu {
// ---- warp collectives: each lane of mask deposits; the last arrival computes every result ----
unsigned lane_exist_mask(int warp) {
    int n = B->n - warp * 32;
    return n >= 32 ? 0xffffffffu : (1u << n) - 1;
}
uint64_t warp_op(int op, unsigned mask, uint64_t val, int arg, int width, const char *file, int line) {
    if (!B) fail("%s called outside a kernel", op_name(op));
    int lane = F->lin & 31, wi = F->lin >> 5;
    Warp &w = B->w[wi];
    Fiber *base = B->f + wi * 32;
    if (!(mask >> lane & 1))
        fail("lane %d calls %s (%s:%d) with mask 0x%08x that excludes itself", lane, op_name(op), file, line, mask);
    if (mask & ~lane_exist_mask(wi))
        fail("%s (%s:%d) mask 0x%08x names lanes that do not exist (warp %d of a %d-thread block)", op_name(op), file,
             line, mask, wi, B->n);
    if (width < 1 || width > 32 || (width & (width - 1)))
        fail("%s (%s:%d): width %d is not a power of two <= 32", op_name(op), file, line, width);
    for (int l = 0; l < 32; l++)
        if ((mask >> l & 1) && base[l].state == F_DONE)
            fail("%s (%s:%d) waits for lane %d, which has already returned (a GPU would hang or read garbage)",
                 op_name(op), file, line, l);
    if (w.arrived == 0) { w.mask = mask; w.op = op; w.width = width; w.file = file; w.line = line; }
    else if (w.mask != mask || w.op != op || w.width != width)
        fail("divergent warp collectives: lane %d calls %s (%s:%d) mask 0x%08x while lanes 0x%08x wait in %s (%s:%d) "
             "mask 0x%08x",
             lane, op_name(op), file, line, mask, w.arrived, op_name(w.op), w.file, w.line, w.mask);
    w.val[lane] = val; w.arg[lane] = arg;
    w.arrived |= 1u << lane;
    F->file = file; F->line = line;
    if (w.arrived != mask) { F->state = F_WARP; to_sched(); return w.res[lane]; }
    unsigned bits = 0;
    for (int l = 0; l < 32; l++) if ((mask >> l & 1) && w.val[l]) bits |= 1u << l;
    if (op == W_GATHER)   // every lane is parked here, its bytes as they are now; read until the next gather
        for (int l = 0; l < 32; l++) {
            if (w.arg[l] != w.arg[lane] || w.arg[l] > 64)
                fail("%s (%s:%d): lanes deposit %d and %d bytes (at most 64, the same)", op_name(op), file, line,
                     w.arg[l], w.arg[lane]);
            memcpy(w.snap[l], (const void *)(uintptr_t)w.val[l], (size_t)w.arg[l]);
        }
    for (int l = 0; l < 32; l++) {
        if (!(mask >> l & 1)) continue;
        int seg = l & ~(width - 1), src = l, a = w.arg[l];
        uint64_t r = 0;
        switch (op) {
        case W_SYNC: break;
        case W_SHFL: src = seg + (a & (width - 1)); break;
        case W_SHFL_UP: src = (l - seg) >= a ? l - a : l; break;
        case W_SHFL_DOWN: src = (l - seg) + a < width ? l + a : l; break;
        case W_SHFL_XOR: src = l ^ a; if ((src & ~(width - 1)) > seg) src = l; break;
        case W_BALLOT: r = bits; break;
        case W_UNIFORM: r = 1; for (int m = 0; m < 32; m++) if ((mask >> m & 1) && w.val[m] != w.val[l]) r = 0; break;
        case W_GATHER: r = (uint64_t)(uintptr_t)&w.snap[0][0]; break;
        default: {
            uint64_t acc = w.val[l];
            for (int m = 0; m < 32; m++) {
                if (!(mask >> m & 1)) continue;
                uint32_t u = (uint32_t)w.val[m], au = (uint32_t)acc;
                int32_t si = (int32_t)u, ai = (int32_t)au;
                if (m == l) continue;
                switch (op) {
                case W_ADD: acc = (uint32_t)(au + u); break;
                case W_MINU: acc = u < au ? u : au; break;
                case W_MAXU: acc = u > au ? u : au; break;
                case W_MINI: acc = (uint64_t)(int64_t)(si < ai ? si : ai); break;
                case W_MAXI: acc = (uint64_t)(int64_t)(si > ai ? si : ai); break;
                case W_AND: acc = au & u; break;
                case W_OR: acc = au | u; break;
                case W_XOR: acc = au ^ u; break;
                }
            }
            r = acc;
        } }
        if (op >= W_SHFL && op <= W_SHFL_XOR) {
            if (!(mask >> src & 1))
                fail("%s (%s:%d): lane %d reads lane %d, which is not in mask 0x%08x", op_name(op), file, line, l, src,
                     mask);
            r = w.val[src];
        }
        w.res[l] = r;
    }
    for (int l = 0; l < 32; l++) if ((mask >> l & 1) && l != lane) base[l].state = F_RUN;
    w.arrived = 0;
    uint64_t mine = w.res[lane];
    yield_run();
    return mine;
}
unsigned active_mask() {
    if (!B) fail("__activemask called outside a kernel");
    int wi = F->lin >> 5; unsigned m = 0;
    for (int l = 0; l < 32 && wi * 32 + l < B->n; l++) if (B->f[wi * 32 + l].state != F_DONE) m |= 1u << l;
    return m;
}
// shared_fresh: the first thread of a block to reach a static __shared__ declaration fills it with
// 0xFF (NaN), so a value a missing barrier lets through is never the previous block's.
static thread_local uint64_t block_serial;
void shared_fresh(void *p, size_t n) {
    static thread_local std::map<void *, uint64_t> seen;
    if (!B) return;
    uint64_t &s = seen[p];
    count_shared_range(p, n);
    if (s != block_serial) { s = block_serial; memset(p, 0xFF, n); }
}
void *dyn_smem() { if (!B) fail("extern __shared__ used outside a kernel"); return smem_ptr; }
} // namespace emu

namespace nvcuda { namespace wmma {
unsigned lane_id() { return emu::F ? (unsigned)(emu::F->lin & 31) : 0; }
// the lanes' fragments as one 64-bit hash: FNV-1a over 64-bit words in 4 interleaved chains (a
// quarter of one chain's dependent multiplies), the tails' bytes in the first
uint64_t fragments_hash(const void *a, size_t na, const void *b, size_t nb, const void *c, size_t nc) {
    uint64_t h[4] = {1469598103934665603ull, 1ull, 2ull, 3ull};
    const void *p[3] = {a, b, c};
    size_t n[3] = {na, nb, nc};
    for (int t = 0; t < 3; t++) {
        const unsigned char *q = (const unsigned char *)p[t];
        size_t i = 0;
        for (; i + 32 <= n[t]; i += 32)
            for (int r = 0; r < 4; r++) {
                uint64_t w;
                memcpy(&w, q + i + 8 * r, 8);
                h[r] = (h[r] ^ w) * 1099511628211ull;
            }
        for (; i < n[t]; i++) h[0] = (h[0] ^ q[i]) * 1099511628211ull;
    }
    return ((h[0] * 31 + h[1]) * 31 + h[2]) * 31 + h[3];
}
// mma_share: the warp's rendezvous of an emulated mma_sync (a full-warp collective, as warp_check): every
// lane deposits its n (<= 8) sums and its fragments' hash; fails when the hashes differ; returns every
// lane's deposit (its sums first), valid until the warp's next gather
const unsigned char (*mma_share(const float *mine, int n, uint64_t hash, const char *file, int line))[64] {
    unsigned char dep[64];
    memcpy(dep, mine, 4 * (size_t)n);
    memcpy(dep + 56, &hash, 8);
    const unsigned char(*all)[64] = emu::warp_gather(dep, 64, file, line);
    for (int m = 0; m < 32; m++)
        if (memcmp(all[m] + 56, dep + 56, 8))
            emu::fail("mma_sync (%s:%d): lanes %d and %u hold different fragments (a kernel must treat a WMMA "
                      "fragment's elements alike in every lane)", file, line, m, lane_id());
    return all;
}
// every WMMA call is a full-warp rendezvous with a warp-uniform pointer and ldm (kernel rule 8)
void warp_check(const void *p, unsigned ldm_bytes, unsigned align, const char *what, const char *file, int line) {
    if (align && ((uintptr_t)p % align))
        emu::fail("%s (%s:%d): pointer %p is not %u-byte aligned", what, file, line, p, align);
    if (align && ldm_bytes % 16)
        emu::fail("%s (%s:%d): ldm of %u bytes is not a multiple of 16 bytes", what, file, line, ldm_bytes);
    uint64_t key = (uint64_t)(uintptr_t)p * 1000003u + ldm_bytes;
    if (!emu::warp_op(emu::W_UNIFORM, 0xffffffffu, key, 0, 32, file, line))
        emu::fail("%s (%s:%d): pointer or ldm differs between the lanes of a warp", what, file, line);
}
} }

namespace emu {
static void init_fiber_stack(Fiber &f) {
    size_t sz = stack_bytes();
    char *top = f.stack + PAGE + sz;
#ifdef EMU_ASAN
    ASAN_UNPOISON_MEMORY_REGION(f.stack + PAGE, sz);
#endif
    void **sp = (void **)top;
#if defined(__x86_64__)
    *--sp = nullptr;                       // fake return address of emu_fiber_start
    *--sp = (void *)&emu_fiber_start;      // where emu_ctx_switch's ret goes
    for (int i = 0; i < 6; i++) *--sp = nullptr;
#else
    sp -= 20;                              // emu_ctx_switch's 160-byte frame, sp stays 16-byte aligned
    for (int i = 0; i < 20; i++) sp[i] = nullptr;
    sp[11] = (void *)&emu_fiber_start;     // the saved x30: where emu_ctx_switch's ret goes
#endif
    f.sp = sp;
}
static void deadlock() {
    std::string s;
    std::map<std::string, int> sites;
    int done = 0;
    for (int i = 0; i < B->n; i++) {
        Fiber &f = B->f[i];
        if (f.state == F_DONE) { done++; continue; }
        char k[256];
        char nb[32];
        snprintf(nb, sizeof nb, "bar.sync %d", f.nbar);
        snprintf(k, sizeof k, "%s at %s:%d", f.state == F_BAR ? "__syncthreads" : f.state == F_NBAR ? nb : op_name(B->w[i >> 5].op),
                 f.file, f.line);
        sites[k]++;
    }
    for (auto &kv : sites) {
        char t[300];
        snprintf(t, sizeof t, "\n    %d threads wait in %s", kv.second, kv.first.c_str());
        s += t;
    }
    F = nullptr;
    fail("deadlock: no thread can run (a GPU would hang); %d threads returned%s", done, s.c_str());
}
static void run_block(std::function<void()> &body, int n) {
    static thread_local std::vector<Fiber> fibers;
    static thread_local std::vector<Warp> warps;
    static thread_local std::vector<int> order;
    size_t sz = stack_bytes();
    fibers.resize(n); warps.assign((n + 31) / 32, Warp{}); order.resize(n);
    while ((int)stacks.size() < n) {
        char *m = (char *)mmap(nullptr, sz + PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                               -1, 0);
        if (m == MAP_FAILED) fail("out of memory for fiber stacks");
        mprotect(m, PAGE, PROT_NONE);
        stacks.push_back(m);
    }
    block_serial++;
    async_reset(n);
    Block blk = {};
    blk.n = n; blk.alive = n; blk.f = fibers.data(); blk.w = warps.data(); blk.body = &body;
    B = &blk;
    unsigned bx = cur_bdim.x, by = cur_bdim.y;
    for (int i = 0; i < n; i++) {
        Fiber &f = fibers[i];
        f = Fiber{};
        f.lin = i; f.tid = make_uint3(i % bx, (i / bx) % by, i / (bx * by)); f.state = F_RUN; f.stack = stacks[i];
        init_fiber_stack(f);
        order[i] = g_order == 1 ? n - 1 - i : i;
    }
    while (blk.alive > 0) {
        if (g_order == 2)
            for (int i = n - 1; i > 0; i--) {
                int j = (int)(rng_next() % (uint64_t)(i + 1));
                std::swap(order[i], order[j]);
            }
        int progress = 0;
        for (int k = 0; k < n; k++) {
            Fiber &f = fibers[order[k]];
            if (f.state != F_RUN) continue;
            F = &f; cur_tid = f.tid; progress = 1;
#ifdef EMU_ASAN
            void *fake = nullptr;
            __sanitizer_start_switch_fiber(&fake, f.stack + PAGE, sz);
            emu_ctx_switch(&blk.sched_sp, f.sp);
            __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#else
            emu_ctx_switch(&blk.sched_sp, f.sp);
#endif
        }
        if (!progress) {   // no thread can run: the parked ones may (named_barrier)
            for (int i = 0; i < n; i++)
                if (fibers[i].state == F_PARK) fibers[i].state = F_RUN, progress = 1;
            if (!progress) deadlock();
        }
    }
    F = nullptr; B = nullptr;
}

// ------------------------------------------------------------------------------------------
// device memory: [guard page][data pages, the allocation flush with their end][guard page]
// ------------------------------------------------------------------------------------------
struct Alloc { char *map; size_t maplen; char *ptr; size_t size; bool freed; };
static std::map<uintptr_t, Alloc> allocs;     // by ptr
static std::set<const void *> pinned;         // cudaMallocHost: host memory the device may use
static std::map<const void *, size_t> registered;   // cudaHostRegister: host memory page-locked in place
static const unsigned char CANARY = 0xA5;
static int dev_depth;                        // >0 while device memory may be touched
static void protect(Alloc &a, int prot) { mprotect(a.map + PAGE, a.maplen - 2 * PAGE, prot); }
struct Dev {   // the device may touch its memory inside this scope (host-trap mode)
    Dev() {
        if (dev_depth++ == 0 && g_hosttrap)
            for (auto &kv : allocs)
                if (!kv.second.freed) protect(kv.second, PROT_READ | PROT_WRITE);
    }
    ~Dev() {
        if (--dev_depth == 0 && g_hosttrap)
            for (auto &kv : allocs)
                if (!kv.second.freed) protect(kv.second, PROT_NONE);
    }
};
static Alloc *find_alloc(const void *p, bool include_freed = false) {
    auto it = allocs.upper_bound((uintptr_t)p);
    if (it == allocs.begin()) return nullptr;
    --it;
    Alloc &a = it->second;
    if ((const char *)p >= a.map && (const char *)p < a.map + a.maplen && (include_freed || !a.freed)) return &a;
    return nullptr;
}
// the allocation holding [p, p+n) or a failure naming the overrun
static Alloc *check_range(const void *p, size_t n, const char *what) {
    Alloc *a = find_alloc(p, true);
    if (!a || (const char *)p < a->ptr) fail("%s: %p is not device memory from cudaMalloc", what, p);
    if (a->freed) fail("%s: %p points into device memory that was already freed", what, p);
    size_t off = (const char *)p - a->ptr;
    if (off + n > a->size)
        fail("%s: %zu bytes at offset %zu overrun the allocation of %zu bytes by %zu bytes", what, n, off, a->size,
             off + n - a->size);
    return a;
}
static bool is_device(const void *p) {
    Alloc *a = find_alloc(p, true);
    return a && (const char *)p >= a->ptr && (const char *)p <= a->ptr + a->size;
}
static void check_canaries(Alloc &a, const char *when) {
    for (char *q = a.map + PAGE; q < a.ptr; q++)
        if ((unsigned char)*q != CANARY)
            fail("%s: write %zu bytes before the start of a %zu-byte allocation at %p", when, (size_t)(a.ptr - q),
                 a.size, (void *)a.ptr);
    for (char *q = a.ptr + a.size; q < a.map + a.maplen - PAGE; q++)
        if ((unsigned char)*q != CANARY)
            fail("%s: write %zu bytes past the end of a %zu-byte allocation at %p", when, (size_t)(q - a.ptr - a.size),
                 a.size, (void *)a.ptr);
}
static void check_all_canaries(const char *when) {
    for (auto &kv : allocs)
        if (!kv.second.freed) check_canaries(kv.second, when);
}

static void segv_handler(int, siginfo_t *si, void *) {
    const char *a = (const char *)si->si_addr;
    char msg[512];
    snprintf(msg, sizeof msg, "invalid memory access at %p", (const void *)a);
    for (auto &kv : allocs) {
        Alloc &m = kv.second;
        if (a < m.map || a >= m.map + m.maplen) continue;
        if (m.freed)
            snprintf(msg, sizeof msg, "access at %p to a %zu-byte device allocation that was freed by cudaFree",
                     (const void *)a, m.size);
        else if (a >= m.ptr && a < m.ptr + m.size)
            snprintf(msg, sizeof msg,
                     "host code dereferenced device pointer %p (offset %zu of a %zu-byte allocation); copy with "
                     "cudaMemcpy first",
                     (const void *)a, (size_t)(a - m.ptr), m.size);
        else if (a < m.ptr)
            snprintf(msg, sizeof msg,
                     "out-of-bounds access %zu bytes before the start of a %zu-byte device allocation at %p",
                     (size_t)(m.ptr - a), m.size, (void *)m.ptr);
        else
            snprintf(msg, sizeof msg,
                     "out-of-bounds access %zu bytes past the end of a %zu-byte device allocation at %p",
                     (size_t)(a - m.ptr - m.size), m.size, (void *)m.ptr);
    }
    for (char *s : stacks)
        if (a >= s && a < s + PAGE)
            snprintf(msg, sizeof msg, "CUDA thread stack overflow (%zu KB fiber stack; set EMU_STACK_KB)",
                     stack_bytes() >> 10);
    if (smem_map && a >= smem_map && a < smem_map + smem_cap + 2 * PAGE)
        snprintf(msg, sizeof msg, "dynamic shared memory access at byte %td of %zu bytes given at launch", a - smem_ptr,
                 smem_size);
    signal(SIGSEGV, SIG_DFL);
    signal(SIGBUS, SIG_DFL);
    fail("%s", msg);
}
static void install_handler() {
    static int done;
    if (done++) return;
    settings_init();
    static char altstack[1 << 16];
    stack_t ss = {}; ss.ss_sp = altstack; ss.ss_size = sizeof altstack;
    sigaltstack(&ss, nullptr);
    struct sigaction sa = {};
    sa.sa_sigaction = segv_handler; sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigaction(SIGSEGV, &sa, nullptr);
    sigaction(SIGBUS, &sa, nullptr);
    smem_map = (char *)mmap(nullptr, smem_cap + 2 * PAGE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    smem_cap = (smem_cap + PAGE - 1) / PAGE * PAGE;
    mprotect(smem_map + PAGE, smem_cap, PROT_READ | PROT_WRITE);
}

// ------------------------------------------------------------------------------------------
// streams: work runs at enqueue, or (async mode) waits in one queue for a synchronisation point
// ------------------------------------------------------------------------------------------
static std::deque<std::function<void()>> queue;
static thread_local cudaError_t last_err = cudaSuccess;
static void drain() { Dev d; while (!queue.empty()) { auto fn = std::move(queue.front()); queue.pop_front(); fn(); } }
static void enqueue(std::function<void()> fn) {
    install_handler();
    if (g_async) queue.push_back(std::move(fn));
    else { Dev d; fn(); }
}

static std::map<const void *, int> max_dyn_smem;   // cudaFuncAttributeMaxDynamicSharedMemorySize
cudaError_t run_kernel(const LaunchCfg &cfg, std::function<void()> body, const void *const *ptrs, const int *pidx,
                       int nptr) {
    install_handler();
    dim3 g = cfg.grid, b = cfg.block;
    unsigned long long nt = (unsigned long long)b.x * b.y * b.z;
    cudaError_t e = cudaSuccess;
    if (!b.x || !b.y || !b.z || b.x > 1024 || b.y > 1024 || b.z > 64 || nt > 1024 || !g.x || !g.y || !g.z ||
        g.x > 2147483647u || g.y > 65535 || g.z > 65535)
        e = cudaErrorInvalidConfiguration;
    size_t lim = 48 << 10;
    if (max_dyn_smem.count(cfg.fn)) lim = max_dyn_smem[cfg.fn];
    if (e == cudaSuccess && cfg.smem > lim) e = cudaErrorInvalidValue;
    if (e != cudaSuccess) {
        fprintf(stderr, "EMU: launch of %s at %s:%d rejected (grid %u,%u,%u block %u,%u,%u smem %zu): %s\n", cfg.name,
                cfg.file, cfg.line, g.x, g.y, g.z, b.x, b.y, b.z, cfg.smem, cudaGetErrorString(e));
        last_err = e;
        return e;
    }
    for (int i = 0; i < nptr; i++) {
        Alloc *a = ptrs[i] ? find_alloc(ptrs[i], true) : nullptr;
        if (a && a->freed)
            fail("argument %d of kernel %s (launched at %s:%d) points into device memory freed by cudaFree",
                 pidx[i] + 1, cfg.name, cfg.file, cfg.line);
        if (ptrs[i] && !is_device(ptrs[i]) && !pinned.count(ptrs[i]))
            fail("argument %d of kernel %s (launched at %s:%d) is %p, which is not device memory (a host pointer?)",
                 pidx[i] + 1, cfg.name, cfg.file, cfg.line, ptrs[i]);
    }
    if (const char *log = getenv("EMU_LAUNCH_LOG")) {   // which kernels a test launched (test/run_emu.sh)
        static std::set<std::string> logged;
        if (logged.insert(cfg.name).second) {
            FILE *f = fopen(log, "a");
            if (f) {
                fprintf(f, "%s\n", cfg.name);
                fclose(f);
            }
        }
    }
    LaunchCfg c = cfg;
    enqueue([c, body]() mutable {
        K = &c;
        cur_gdim = make_uint3(c.grid.x, c.grid.y, c.grid.z); cur_bdim = make_uint3(c.block.x, c.block.y, c.block.z);
        smem_size = c.smem;
        smem_ptr = smem_map + PAGE + smem_cap - (c.smem + 15) / 16 * 16;
        int n = (int)(c.block.x * c.block.y * c.block.z);
        // blocks one after another, in the order EMU_ORDER gives threads too: forward, reverse or a
        // random permutation, so a result that depends on which block runs first (float atomics
        // across blocks, a block reading another's output) differs between the orders
        unsigned long nb = (unsigned long)c.grid.x * c.grid.y * c.grid.z;
        std::vector<unsigned long> order(nb);
        for (unsigned long i = 0; i < nb; i++) order[i] = g_order == 1 ? nb - 1 - i : i;
        if (g_order == 2)
            for (unsigned long i = nb; i > 1; i--) std::swap(order[i - 1], order[rng_next() % i]);
        // counter mode with EMU_SAMPLE=N: only N blocks of a larger grid, one from each of N equal
        // strata of the block index at a position hashed from the stratum and the grid (the same
        // blocks on every run). Evenly spaced blocks aliased with a grid's per-image tile pattern: at
        // 2 per launch they were every image's first (full) tile, so the launches whose last tiles
        // are partly past the map were counted as if every tile were full.
        unsigned long ns = nb, sample = (unsigned long)count_sample();
        if (sample > 0 && nb > sample && !count_full(c.name)) {
            ns = sample;
            for (unsigned long i = 0; i < ns; i++) {
                unsigned long lo = i * nb / ns, hi = (i + 1) * nb / ns;
                uint64_t h = (uint64_t)(i + 1) * 0x9E3779B97F4A7C15ull ^ (uint64_t)nb * 0xBF58476D1CE4E5B9ull ^
                             (uint64_t)c.grid.x * 0x94D049BB133111EBull;
                h ^= h >> 31; h *= 0xD6E8FEB86659FD93ull; h ^= h >> 32;
                order[i] = lo + (unsigned long)(h % (hi - lo));
            }
        }
        count_launch_begin(c, nb, ns);
        auto run_at = [&](uint3 b) {
            cur_bid = b;
            memset(smem_ptr, 0xFF, c.smem);   // uninitialised shared memory reads as NaN
            run_block(body, n);
        };
        for (unsigned long i = 0; i < ns; i++) {
            unsigned long bi = order[i];
            count_block_begin(n, bi);
            const uint3 bid = make_uint3((unsigned)(bi % c.grid.x), (unsigned)(bi / c.grid.x % c.grid.y),
                                         (unsigned)(bi / ((unsigned long)c.grid.x * c.grid.y)));
            run_at(bid);
            // a sampled launch's probes (counter mode): along each grid dimension of 2 or more blocks
            // (pixel tiles, channel tiles, K slices, parities), the block half the dimension away, run
            // only to see which of the sampled block's sectors it touches too: those the whole line of
            // blocks shares (the input that every output-channel tile reads, the weights that every
            // pixel tile reads), for the compulsory bytes
            const unsigned gd[3] = {c.grid.x, c.grid.y, c.grid.z};
            for (int d = 0; d < 3 && ns < nb; d++) {
                if (gd[d] < 2) continue;
                uint3 pb = bid;
                unsigned *co = d == 0 ? &pb.x : d == 1 ? &pb.y : &pb.z;
                *co = (*co + gd[d] / 2) % gd[d];
                count_probe_begin(n);
                run_at(pb);
                count_probe_end(gd[d]);
            }
        }
        count_launch_end();
        check_all_canaries(c.name);
        K = nullptr;
    });
    return cudaSuccess;
}
} // namespace emu
using namespace emu;

extern "C" void emu_set_hosttrap(int h) {
    settings_init();
    if (h == g_hosttrap) return;
    g_hosttrap = h;
    if (dev_depth == 0)
        for (auto &kv : allocs)
            if (!kv.second.freed) protect(kv.second, h ? PROT_NONE : PROT_READ | PROT_WRITE);
}

// ------------------------------------------------------------------------------------------
// runtime API subset (NVIDIA's prototypes, so a signature mismatch is a compile error)
// ------------------------------------------------------------------------------------------
static cudaError_t ret(cudaError_t e) { if (e != cudaSuccess) last_err = e; return e; }
// cudaMemGetInfo's picture of a 16 GiB device: a CUDA context of 300 MiB, then every live cudaMalloc
// rounded up to 2 MiB (the driver's granularity for large allocations)
static const size_t EMU_TOTAL = (size_t)16 << 30, EMU_CONTEXT = (size_t)300 << 20, EMU_GRAIN = (size_t)2 << 20;
static size_t emu_in_use;
static size_t emu_rounded(size_t n) { return (n + EMU_GRAIN - 1) / EMU_GRAIN * EMU_GRAIN; }
extern "C" {
cudaError_t cudaMalloc(void **p, size_t size) {
    install_handler();
    if (!p) return ret(cudaErrorInvalidValue);
    size_t data = (size + PAGE - 1) / PAGE * PAGE; if (!data) data = PAGE;
    size_t len = data + 2 * PAGE;
    char *m = (char *)mmap(nullptr, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) return ret(cudaErrorMemoryAllocation);
    mprotect(m + PAGE, data, PROT_READ | PROT_WRITE);
    Alloc a = {m, len, m + PAGE + data - (size + 15) / 16 * 16, size, false};
    memset(m + PAGE, CANARY, data);
    // fresh device memory reads as NaN; in counter mode zero, so that the outputs of the blocks a
    // sampled launch skips stay finite and the step runs its whole launch list (backward included)
    memset(a.ptr, count_sample() > 0 ? 0 : 0xFF, size);
    allocs[(uintptr_t)a.ptr] = a;
    if (g_hosttrap && dev_depth == 0) protect(allocs[(uintptr_t)a.ptr], PROT_NONE);
    *p = a.ptr;
    emu_in_use += emu_rounded(size);
    return cudaSuccess;
}
cudaError_t cudaFree(void *p) {
    if (!p) return cudaSuccess;
    drain();
    auto it = allocs.find((uintptr_t)p);
    if (it == allocs.end()) fail("cudaFree(%p): not a pointer returned by cudaMalloc", p);
    if (it->second.freed) fail("cudaFree(%p): double free", p);
    { Dev d; check_canaries(it->second, "cudaFree"); }
    it->second.freed = true;
    emu_in_use -= emu_rounded(it->second.size);
    mprotect(it->second.map, it->second.maplen, PROT_NONE);   // later use faults as use-after-free
    return cudaSuccess;
}
cudaError_t cudaMallocHost(void **p, size_t size) {
    *p = malloc(size ? size : 1);
    pinned.insert(*p);
    return *p ? cudaSuccess : ret(cudaErrorMemoryAllocation);
}
cudaError_t cudaHostAlloc(void **p, size_t size, unsigned int) { return cudaMallocHost(p, size); }
// cudaHostRegister / cudaHostUnregister: the emulation's host memory is the device's, so locking
// changes nothing but is recorded: registering a range twice, or unregistering one that was not, fails
// as the runtime's does (cudaErrorHostMemoryAlreadyRegistered / cudaErrorHostMemoryNotRegistered)
cudaError_t cudaHostRegister(void *p, size_t size, unsigned int) {
    if (!p || !size) return ret(cudaErrorInvalidValue);
    if (registered.count(p)) return ret(cudaErrorHostMemoryAlreadyRegistered);
    registered[p] = size;
    return cudaSuccess;
}
cudaError_t cudaHostUnregister(void *p) {
    drain();   // copies from it still queued run first
    if (!registered.erase(p)) return ret(cudaErrorHostMemoryNotRegistered);
    return cudaSuccess;
}
cudaError_t cudaFreeHost(void *p) {
    if (!p) return cudaSuccess;
    drain();
    if (!pinned.erase(p)) fail("cudaFreeHost(%p): not a pointer returned by cudaMallocHost", p);
    free(p);
    return cudaSuccess;
}
static void check_copy(void *dst, const void *src, size_t n, cudaMemcpyKind kind, const char *what) {
    bool dd = is_device(dst), sd = is_device(src);
    if (kind == cudaMemcpyDefault)
        kind = dd ? (sd ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
                  : (sd ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost);
    bool wd = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice,
         ws = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    if (wd && !dd) fail("%s: destination %p is not device memory but the kind says it is", what, dst);
    if (!wd && dd) fail("%s: destination %p is device memory but the kind says host", what, dst);
    if (ws && !sd) fail("%s: source %p is not device memory but the kind says it is", what, src);
    if (!ws && sd) fail("%s: source %p is device memory but the kind says host", what, src);
    if (dd) check_range(dst, n, what);
    if (sd) check_range(src, n, what);
}
cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind kind) {
    install_handler();
    drain();
    Dev d;
    check_copy(dst, src, n, kind, "cudaMemcpy");
    if (n) memmove(dst, src, n);
    return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind kind, cudaStream_t) {
    install_handler();
    { Dev d; check_copy(dst, src, n, kind, "cudaMemcpyAsync"); }
    const bool dtod = is_device(dst) && is_device(src);
    enqueue([=]() {
        if (dtod) count_fill("cudaMemcpyAsync (device to device)", n, 1);
        if (n) memmove(dst, src, n);
    });
    return cudaSuccess;
}
cudaError_t cudaMemset(void *p, int v, size_t n) {
    install_handler();
    drain();
    Dev d;
    check_range(p, n, "cudaMemset");
    memset(p, v, n);
    return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t) {
    install_handler();
    { Dev d; check_range(p, n, "cudaMemsetAsync"); }
    enqueue([=]() {
        count_fill("cudaMemsetAsync", n, 0);
        memset(p, v, n);
    });
    return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize(void) { drain(); return cudaSuccess; }
cudaError_t cudaStreamSynchronize(cudaStream_t) { drain(); return cudaSuccess; }
// cudaStreamQuery: the queue runs to its end here (the emulation has no work in flight to report)
cudaError_t cudaStreamQuery(cudaStream_t) { drain(); return cudaSuccess; }
cudaError_t cudaStreamCreate(cudaStream_t *s) { *s = (cudaStream_t)malloc(16); return cudaSuccess; }
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int) { return cudaStreamCreate(s); }
cudaError_t cudaStreamDestroy(cudaStream_t s) { drain(); free(s); return cudaSuccess; }
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned int) { return cudaSuccess; }
cudaError_t cudaEventCreate(cudaEvent_t *e) { *e = (cudaEvent_t)calloc(1, sizeof(double)); return cudaSuccess; }
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int) { return cudaEventCreate(e); }
cudaError_t cudaEventDestroy(cudaEvent_t e) { free(e); return cudaSuccess; }
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t) {
    enqueue([e]() {
        struct timespec t;
        clock_gettime(CLOCK_MONOTONIC, &t);
        *(double *)e = t.tv_sec + t.tv_nsec * 1e-9;
    });
    return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t) { drain(); return cudaSuccess; }
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) {
    *ms = (float)((*(double *)b - *(double *)a) * 1e3);
    return cudaSuccess;
}
cudaError_t cudaGetLastError(void) { cudaError_t e = last_err; last_err = cudaSuccess; return e; }
cudaError_t cudaPeekAtLastError(void) { return last_err; }
// EMU_DEVICES=N (default 1): how many devices the process sees. Each process emulates the one it set;
// memory is per process, as each GPU's is (a data-parallel run has one process per device).
static int emu_devices() { int n = env_int("EMU_DEVICES", 1); return n < 1 ? 1 : n; }
static int emu_device;
cudaError_t cudaSetDevice(int d) {
    if (d < 0 || d >= emu_devices()) return ret(cudaErrorInvalidDevice);
    emu_device = d;
    return cudaSuccess;
}
cudaError_t cudaGetDevice(int *d) { *d = emu_device; return cudaSuccess; }
cudaError_t cudaGetDeviceCount(int *n) { *n = emu_devices(); return cudaSuccess; }
cudaError_t cudaDeviceReset(void) { drain(); return cudaSuccess; }
// EMU_DEVICE_MIB=a,b,...: the devices' sizes in MiB (default 16 GiB each), so that a test sees cards
// of different sizes (AutoBatch over several GPUs takes the smallest card's batch)
static size_t emu_total() {
    const char *v = getenv("EMU_DEVICE_MIB");
    for (int d = 0; v && *v; d++) {
        char *end;
        long mib = strtol(v, &end, 10);
        if (d == emu_device) return mib > 0 ? (size_t)mib << 20 : EMU_TOTAL;
        v = *end == ',' ? end + 1 : "";
    }
    return EMU_TOTAL;
}
cudaError_t cudaMemGetInfo(size_t *fr, size_t *total) {
    size_t t = emu_total(), used = EMU_CONTEXT + emu_in_use;
    *fr = t > used ? t - used : 0;
    *total = t;
    return cudaSuccess;
}
cudaError_t cudaFuncSetAttribute(const void *fn, cudaFuncAttribute attr, int v) {
    if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
        if (v < 0 || v > 232448) return ret(cudaErrorInvalidValue);
        max_dyn_smem[fn] = (size_t)v;
    }
    return cudaSuccess;
}
// emu_sms: the SM count the emulator reports: EMU_SMS, else 108 (an A100's, the GPU make gpu-model details: launch
// shapes a launcher derives from it, such as the halo weight gradient's slices, are those of that GPU)
static int emu_sms() {
    const char *e = getenv("EMU_SMS");
    int n = e ? atoi(e) : 0;
    return n >= 1 && n <= 1024 ? n : 108;
}
cudaError_t cudaDeviceGetAttribute(int *v, cudaDeviceAttr attr, int) {
    switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock: *v = 1024; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *v = 48 << 10; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *v = 232448; break;
    case cudaDevAttrMaxSharedMemoryPerMultiprocessor: *v = 167936; break;   // (an A100's 164 KB)
    case cudaDevAttrMultiProcessorCount: *v = emu_sms(); break;
    case cudaDevAttrComputeCapabilityMajor: *v = 8; break;
    case cudaDevAttrComputeCapabilityMinor: *v = 0; break;
    case cudaDevAttrWarpSize: *v = 32; break;
    default: return ret(cudaErrorInvalidValue);
    }
    return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int) {
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "CUDA emulation on the CPU");
    p->totalGlobalMem = (size_t)16 << 30; p->sharedMemPerBlock = 48 << 10; p->sharedMemPerBlockOptin = 232448;
    p->warpSize = 32; p->maxThreadsPerBlock = 1024; p->major = 8; p->minor = 0; p->multiProcessorCount = emu_sms();
    p->maxThreadsDim[0] = 1024; p->maxThreadsDim[1] = 1024; p->maxThreadsDim[2] = 64;
    p->maxGridSize[0] = 2147483647; p->maxGridSize[1] = 65535; p->maxGridSize[2] = 65535;
    return cudaSuccess;
}
const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorHostMemoryAlreadyRegistered: return "part or all of the requested memory range is already mapped";
    case cudaErrorHostMemoryNotRegistered: return "pointer does not correspond to a registered memory region";
    default: return "unknown error (emulation)";
    }
}
const char *cudaGetErrorName(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    default: return "cudaErrorUnknown";
    }
}
} // extern "C"

// ------------------------------------------------------------------------------------------
// NCCL across processes (test/emu_include/nccl.h): one process per rank, a POSIX shared-memory
// segment per communicator (named by the unique id), a process-shared generation barrier on C++
// atomics, and reductions in rank order. The segment: a header, then one staging slot per rank.
// A collective moves its data through the slots in pieces of EMU_NCCL_SLOT bytes: every rank copies
// its piece into its slot, all meet, every rank reduces slot 0 + slot 1 + ... + slot n-1 into its
// output, all meet again (so no slot is overwritten while another rank still reads it).
// ------------------------------------------------------------------------------------------
#include <atomic>
#include <fcntl.h>
#include <sys/stat.h>
#include "nccl.h"

enum { EMU_NCCL_MAXRANKS = 64 };
static const size_t EMU_NCCL_SLOT = (size_t)4 << 20;   // staging bytes per rank (a multiple of 8)
struct NcclShm {
    std::atomic<int> joined;             // ranks that have mapped the segment
    std::atomic<int> count;              // arrivals at the current barrier
    std::atomic<unsigned> gen;           // barrier generation
    std::atomic<int> aborted;            // 1 + the rank that aborted (or found a dead peer); 0: none
    std::atomic<int> pid[EMU_NCCL_MAXRANKS];
};
static_assert(std::atomic<int>::is_always_lock_free, "process-shared atomics must be lock-free");
struct ncclComm {
    NcclShm *h;
    char *slots;                         // (nranks, EMU_NCCL_SLOT)
    size_t maplen;
    int nranks, rank;
    ncclResult_t async;                  // the asynchronous error (ncclCommGetAsyncError)
};
static const size_t EMU_NCCL_HDR = 4096;

static double nccl_now() { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
// pid_alive: the process exists and is not a zombie (a killed child its parent has not reaped yet)
static bool pid_alive(int pid) {
    if (pid <= 0 || kill(pid, 0) != 0) return pid <= 0 ? true : false;
    char path[64], buf[256];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f) return false;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *p = strrchr(buf, ')');
    return !(p && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X'));
}
// nccl_fail: the communicator cannot go on: record the asynchronous error, tell the other ranks
static void nccl_fail(ncclComm *c, const char *why) {
    if (c->async == ncclSuccess)
        fprintf(stderr, "emulated NCCL rank %d of %d: %s; the communicator is in error (ncclRemoteError)\n", c->rank,
                c->nranks, why);
    c->async = ncclRemoteError;
    int zero = 0;
    c->h->aborted.compare_exchange_strong(zero, c->rank + 1);
}
// nccl_wait: until pred() holds; false (and the communicator in error) when a peer aborted or died,
// or EMU_NCCL_TIMEOUT seconds passed
template <class P> static bool nccl_wait(ncclComm *c, P pred) {
    double t0 = nccl_now(), last = t0, timeout = env_int("EMU_NCCL_TIMEOUT", 600);
    long sleep_ns = 20000;
    while (!pred()) {
        int ab = c->h->aborted.load();
        if (ab) {
            char why[96];
            snprintf(why, sizeof why, "rank %d aborted the communicator", ab - 1);
            nccl_fail(c, why);
            return false;
        }
        double now = nccl_now();
        if (now - last > 0.1) {
            last = now;
            for (int r = 0; r < c->nranks; r++)
                if (r != c->rank && !pid_alive(c->h->pid[r].load())) {
                    char why[96];
                    snprintf(why, sizeof why, "peer rank %d (pid %d) is gone", r, c->h->pid[r].load());
                    nccl_fail(c, why);
                    return false;
                }
        }
        if (now - t0 > timeout) {
            char why[96];
            snprintf(why, sizeof why, "a collective waited %.0f s for its peers (EMU_NCCL_TIMEOUT)", timeout);
            nccl_fail(c, why);
            return false;
        }
        struct timespec ts = {0, sleep_ns};
        nanosleep(&ts, nullptr);
        if (sleep_ns < 2000000) sleep_ns *= 2;
    }
    return true;
}
// nccl_barrier: every rank of c arrives before any leaves (generation counter)
static bool nccl_barrier(ncclComm *c) {
    if (c->async != ncclSuccess) return false;
    NcclShm *h = c->h;
    unsigned g = h->gen.load(std::memory_order_acquire);
    if (h->count.fetch_add(1, std::memory_order_acq_rel) + 1 == c->nranks) {
        h->count.store(0, std::memory_order_relaxed);
        h->gen.fetch_add(1, std::memory_order_acq_rel);
        return true;
    }
    return nccl_wait(c, [&]() { return h->gen.load(std::memory_order_acquire) != g; });
}
static size_t nccl_esize(ncclDataType_t t) { return t == ncclFloat32 || t == ncclInt32 ? 4 : 0; }
// nccl_reduce: out (n elements) = slot 0 op slot 1 op ... op slot nranks-1, in that order
static void nccl_reduce(ncclComm *c, void *out, size_t n, ncclDataType_t t, ncclRedOp_t op) {
    for (size_t i = 0; i < n; i++) {
        if (t == ncclFloat32) {
            float a = ((const float *)c->slots)[i];
            for (int r = 1; r < c->nranks; r++) {
                float b = ((const float *)(c->slots + r * EMU_NCCL_SLOT))[i];
                a = op == ncclSum ? a + b : (b > a ? b : a);
            }
            ((float *)out)[i] = a;
        } else {
            int a = ((const int *)c->slots)[i];
            for (int r = 1; r < c->nranks; r++) {
                int b = ((const int *)(c->slots + r * EMU_NCCL_SLOT))[i];
                a = op == ncclSum ? a + b : (b > a ? b : a);
            }
            ((int *)out)[i] = a;
        }
    }
}

extern "C" {
ncclResult_t ncclGetVersion(int *v) { *v = NCCL_VERSION_CODE; return ncclSuccess; }
ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    static int serial;
    memset(id, 0, sizeof *id);
    snprintf(id->internal, sizeof id->internal, "/emu-nccl-%d-%d-%llx", (int)getpid(), serial++,
             (unsigned long long)(nccl_now() * 1e9));
    return ncclSuccess;
}
ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
    if (nranks < 1 || nranks > EMU_NCCL_MAXRANKS || rank < 0 || rank >= nranks ||
        strncmp(id.internal, "/emu-nccl-", 10))
        return ncclInvalidArgument;
    size_t len = EMU_NCCL_HDR + (size_t)nranks * EMU_NCCL_SLOT;
    int fd = shm_open(id.internal, O_CREAT | O_RDWR, 0600);
    if (fd < 0) return ncclSystemError;
    struct stat sb;
    if (fstat(fd, &sb) || ((size_t)sb.st_size < len && ftruncate(fd, (off_t)len))) {
        close(fd);
        return ncclSystemError;
    }
    void *p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) return ncclSystemError;
    ncclComm *c = new ncclComm{(NcclShm *)p, (char *)p + EMU_NCCL_HDR, len, nranks, rank, ncclSuccess};
    c->h->pid[rank].store((int)getpid());
    c->h->joined.fetch_add(1);
    // every rank joins (a rank that never comes times the others out), then the name goes: the
    // segment lives as long as a rank maps it
    bool ok = nccl_wait(c, [&]() { return c->h->joined.load() >= nranks; }) && nccl_barrier(c);
    if (rank == 0) shm_unlink(id.internal);
    if (!ok) { munmap(p, len); delete c; return ncclRemoteError; }
    *comm = c;
    return ncclSuccess;
}
ncclResult_t ncclCommDestroy(ncclComm_t c) {
    if (!c) return ncclInvalidArgument;
    drain();
    munmap(c->h, c->maplen);
    delete c;
    return ncclSuccess;
}
// ncclCommAbort: the peers' collectives fail (their asynchronous error), this rank's communicator goes
ncclResult_t ncclCommAbort(ncclComm_t c) {
    if (!c) return ncclInvalidArgument;
    int zero = 0;
    c->h->aborted.compare_exchange_strong(zero, c->rank + 1);
    munmap(c->h, c->maplen);
    delete c;
    return ncclSuccess;
}
ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t *e) { drain(); *e = c->async; return ncclSuccess; }
ncclResult_t ncclCommCount(const ncclComm_t c, int *n) { *n = c->nranks; return ncclSuccess; }
ncclResult_t ncclCommUserRank(const ncclComm_t c, int *r) { *r = c->rank; return ncclSuccess; }
const char *ncclGetErrorString(ncclResult_t r) {
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclSystemError: return "unhandled system error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    default: return "unknown result code (emulation)";
    }
}
ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t t, ncclRedOp_t op, ncclComm_t c,
                           cudaStream_t) {
    size_t es = nccl_esize(t);
    if (!c || !es || (op != ncclSum && op != ncclMax)) return ncclInvalidArgument;
    { Dev d; check_range(send, count * es, "ncclAllReduce send"); check_range(recv, count * es, "ncclAllReduce recv"); }
    enqueue([=]() {
        for (size_t off = 0; off < count * es && c->async == ncclSuccess; off += EMU_NCCL_SLOT) {
            size_t n = count * es - off < EMU_NCCL_SLOT ? count * es - off : EMU_NCCL_SLOT;
            memcpy(c->slots + c->rank * EMU_NCCL_SLOT, (const char *)send + off, n);
            if (!nccl_barrier(c)) return;
            nccl_reduce(c, (char *)recv + off, n / es, t, op);
            if (!nccl_barrier(c)) return;
        }
    });
    return ncclSuccess;
}
ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, ncclDataType_t t, int root, ncclComm_t c,
                           cudaStream_t) {
    size_t es = nccl_esize(t);
    if (!c || !es || root < 0 || root >= c->nranks) return ncclInvalidArgument;
    {
        Dev d;
        if (c->rank == root) check_range(send, count * es, "ncclBroadcast send");
        check_range(recv, count * es, "ncclBroadcast recv");
    }
    enqueue([=]() {
        for (size_t off = 0; off < count * es && c->async == ncclSuccess; off += EMU_NCCL_SLOT) {
            size_t n = count * es - off < EMU_NCCL_SLOT ? count * es - off : EMU_NCCL_SLOT;
            if (c->rank == root) memcpy(c->slots, (const char *)send + off, n);
            if (!nccl_barrier(c)) return;
            memcpy((char *)recv + off, c->slots, n);
            if (!nccl_barrier(c)) return;
        }
    });
    return ncclSuccess;
}
// group calls: the emulation runs each collective at enqueue, in program order, so a group is a no-op
ncclResult_t ncclGroupStart(void) { return ncclSuccess; }
ncclResult_t ncclGroupEnd(void) { return ncclSuccess; }
} // extern "C"

// ------------------------------------------------------------------------------------------
// counter mode (issue 14): memory-access statistics of every kernel, for test/gpu_model.sh.
// The counting build (make emu-count) compiles the kernel file with g++ -fsanitize=kernel-address
// in call mode, so every load and store of kernel code calls one of the __asan_* hooks below with
// its address and width; this file itself is not instrumented. A hook keeps an access only when
// a CUDA thread (a fiber) makes it, to device memory (global) or to __shared__ memory (the
// dynamic buffer, or a static __shared__ array registered by shared_fresh); fiber stacks (locals)
// and host memory are ignored. Accesses are grouped into warp instructions the way SIMT hardware
// issues them: key (warp, call site, how many times this lane has executed that site since the
// last barrier), so the k-th execution of an instruction by each lane of a warp forms one request.
// Requests are closed at every __syncthreads and at the end of the block, then measured:
//   global: one request, its distinct 32-byte sectors, bytes requested, bytes by access width;
//   shared: wavefronts = for each phase (32 lanes for <= 4-byte accesses, 16 for 8-byte, 8 for
//           16-byte, as the hardware splits wide accesses), the most distinct 4-byte words that
//           fall into one of the 32 banks; conflicts = wavefronts - phases.
// WMMA tiles (load/store_matrix_sync, counted once per warp by cuda_emu.h) are measured as
// requests of 16-byte chunks, 32 per request, in ldmatrix's order (a phase is 8 rows of one
// 16-byte column of the tile).
// EMU_COUNT=FILE turns the mode on and writes one line per launch to FILE at exit; EMU_SAMPLE=N
// runs only N blocks of a larger grid, one per N equal strata of the block index at a hashed
// position, and scales the counts by blocks/N (the other
// blocks' outputs stay as they were, zero from cudaMalloc in this mode: a counting run measures, it
// checks nothing); EMU_SAMPLE_FULL=prefix,... exempts kernels from sampling; EMU_COUNT_STEP=TEXT adds a
// line "# step: TEXT" after the header (test/gpu_count.c: what was counted, read by test/gpu_model.sh).
// ------------------------------------------------------------------------------------------
#ifdef EMU_COUNTERS
namespace emu {
struct CountRec {                     // one launch; every figure scaled to the whole grid at dump
    std::string kernel, tag;
    unsigned long blocks, sampled; int threads;
    double gld_req, gld_sect, gld_bytes, gst_req, gst_sect, gst_bytes;
    double gbytes_w[5];               // global bytes by access width 1, 2, 4, 8, 16
    double sld_req, sld_wave, sld_phase, sst_req, sst_wave, sst_phase;
    double mma_flop;                  // 2*M*N*K per warp-level mma_sync (padding of partial tiles included)
    double useful_flop;               // the YOLO_PROFILE group's own FLOP figure (not scaled)
    int cin, cout;                    // a conv group's input and output channels (emu_count_dims), else 0
    double comp_own, comp_shared;     // compulsory bytes: the sampled blocks' own (to scale), the grid's shared
};
struct Acc { uint32_t mask; uint8_t width, kind; uintptr_t addr[32]; };   // kind: 0 gld 1 gst 2 sld 3 sst
static std::vector<CountRec> crecs;
static CountRec *crec;                          // the launch being counted
static std::vector<std::pair<uintptr_t, size_t>> sranges;   // static __shared__ arrays seen
struct AccKey {
    int warp; uintptr_t site; uint32_t k;
    bool operator==(const AccKey &o) const { return warp == o.warp && site == o.site && k == o.k; }
};
struct AccHash {
    size_t operator()(const AccKey &x) const {
        return (x.site * 0x9e3779b97f4a7c15ULL) ^ ((uint64_t)x.warp << 40) ^ x.k;
    }
};
static std::unordered_map<AccKey, Acc, AccHash> pending;
static std::vector<std::unordered_map<uintptr_t, uint32_t>> occ;      // per lane: executions of each site
// the sectors the sampled blocks touch: which bytes, the last block, whether several did, and for a
// sector of one block the blocks of the grid estimated to share it (its probes' dimensions multiplied)
struct Sect { uint32_t mask; unsigned long block; bool multi; double share; };
static std::unordered_map<uintptr_t, Sect> sectors;
static std::vector<uintptr_t> blk_sects;           // the sectors the current sampled block touched first
static std::unordered_set<uintptr_t> probe_sects;  // the sectors the current probe touched
static bool probing;
static unsigned long cblock;
static int quiet;                               // >0 inside a WMMA emulation (counted as a tile)
static int count_on() { static int on = -1; if (on < 0) on = getenv("EMU_COUNT") && *getenv("EMU_COUNT"); return on; }
int count_sample() { return count_on() ? env_int("EMU_SAMPLE", 0) : 0; }
// EMU_SAMPLE_FULL=prefix,prefix: kernels whose names start so run every block (their results steer
// the host: the loss must be finite for the step to run its backward)
int count_full(const char *name) {
    const char *e = getenv("EMU_SAMPLE_FULL");
    for (const char *p = e; p && *p;) {
        const char *q = strchr(p, ',');
        size_t n = q ? (size_t)(q - p) : strlen(p);
        if (n && !strncmp(name, p, n)) return 1;
        p = q ? q + 1 : nullptr;
    }
    return 0;
}

// EMU_COUNT_KINDS: which accesses this build counts: 0 loads and stores, 1 loads only, 2 stores only.
// g++'s address sanitizer checks a load and a later store of the same reference in one basic block
// once (x[i] += v reaches only the load hook), so one build under-counts the stores of every
// read-modify-write; make emu-count builds the kernels twice (asan-instrument-writes=0, then reads=0),
// each counting only what its build checks in full, and adds the two lists (gpu_model.sh --merge)
#ifndef EMU_COUNT_KINDS
#define EMU_COUNT_KINDS 0
#endif
static void measure(const Acc &a) {
    if (EMU_COUNT_KINDS && (a.kind & 1) == (EMU_COUNT_KINDS == 1)) return;   // (kind: 0 gld 1 gst 2 sld 3 sst)
    CountRec &r = *crec;
    if (probing) {   // a probe block: only which global sectors it touches
        if (a.kind < 2)
            for (int l = 0; l < 32; l++) if (a.mask >> l & 1)
                for (uintptr_t x = a.addr[l] / 32; x <= (a.addr[l] + a.width - 1) / 32; x++) probe_sects.insert(x << 1 | a.kind);
        return;
    }
    if (a.kind < 2) {
        uintptr_t sv[128];
        int ns = 0;
        double bytes = 0;
        for (int l = 0; l < 32; l++) if (a.mask >> l & 1) {
            for (uintptr_t x = a.addr[l] / 32; x <= (a.addr[l] + a.width - 1) / 32 && ns < 128; x++) {
                sv[ns++] = x;
                const uintptr_t key = x << 1 | a.kind;   // (read and written: two transfers, each compulsory)
                auto it = sectors.find(key);
                if (it == sectors.end()) {
                    it = sectors.emplace(key, Sect{0, cblock, false, 1.0}).first;
                    blk_sects.push_back(key);
                } else if (it->second.block != cblock) it->second.multi = true, it->second.block = cblock;
                uintptr_t lo = std::max(a.addr[l], x * 32) - x * 32, hi = std::min(a.addr[l] + a.width, x * 32 + 32) - x * 32;
                it->second.mask |= (hi - lo == 32 ? 0xFFFFFFFFu : ((1u << (hi - lo)) - 1) << lo);
            }
            bytes += a.width;
        }
        std::sort(sv, sv + ns);
        std::vector<uintptr_t> s(sv, std::unique(sv, sv + ns));
        int wi = a.width == 1 ? 0 : a.width == 2 ? 1 : a.width == 4 ? 2 : a.width == 8 ? 3 : 4;
        r.gbytes_w[wi] += bytes;
        if (a.kind == 0) r.gld_req++, r.gld_sect += s.size(), r.gld_bytes += bytes;
        else r.gst_req++, r.gst_sect += s.size(), r.gst_bytes += bytes;
        return;
    }
    int per = a.width <= 4 ? 32 : a.width == 8 ? 16 : 8;
    double wave = 0, phases = 0;
    for (int p0 = 0; p0 < 32; p0 += per) {
        uintptr_t wv[160];   // the 4-byte words this phase touches (at most 32 lanes x 5 words)
        int nw = 0;
        for (int l = p0; l < p0 + per; l++) if (a.mask >> l & 1)
            for (uintptr_t w = a.addr[l] / 4; w <= (a.addr[l] + a.width - 1) / 4 && nw < 160; w++) wv[nw++] = w;
        if (!nw) continue;
        std::sort(wv, wv + nw);
        int ne = (int)(std::unique(wv, wv + nw) - wv), bank[32] = {0}, m = 0;
        for (int j = 0; j < ne; j++) m = std::max(m, ++bank[wv[j] % 32]);   // distinct words per bank
        wave += m; phases++;
    }
    if (a.kind == 2) r.sld_req++, r.sld_wave += wave, r.sld_phase += phases;
    else r.sst_req++, r.sst_wave += wave, r.sst_phase += phases;
}
static void count_flush(bool keep_occ) {
    if (!crec) return;
    for (auto &kv : pending) measure(kv.second);
    pending.clear();
    if (!keep_occ) for (auto &o : occ) o.clear();
}
static void count_flush() { count_flush(false); }
static void count_block_begin(int n, unsigned long bi) { count_flush(); occ.resize(n); cblock = bi; blk_sects.clear(); }
static void count_probe_begin(int n) { count_flush(); occ.resize(n); probing = true; probe_sects.clear(); }
static void count_probe_end(unsigned g) {
    count_flush();
    probing = false;
    for (uintptr_t x : blk_sects)
        if (probe_sects.count(x)) sectors[x].share *= g;
    probe_sects.clear();
}
void count_shared_range(void *p, size_t n) {
    for (auto &r : sranges) if (r.first == (uintptr_t)p) return;
    sranges.push_back({(uintptr_t)p, n});
}
static void record(uintptr_t a, unsigned width, int store, uintptr_t site) {
    if (!crec || !F || quiet) return;
    static const size_t sb = PAGE + stack_bytes();
    if (a >= (uintptr_t)F->stack && a < (uintptr_t)F->stack + sb) return;   // a local
    static uintptr_t dev_lo = 1, dev_hi = 0;   // the last device allocation hit (usually the one arena)
    int kind;
    if (a >= dev_lo && a < dev_hi) kind = store;
    else if (is_device((const void *)a)) {
        Alloc *al = find_alloc((const void *)a, true);
        dev_lo = (uintptr_t)al->ptr; dev_hi = dev_lo + al->size;
        kind = store;
    }
    else if (a >= (uintptr_t)smem_ptr && a < (uintptr_t)smem_ptr + smem_size) kind = 2 + store;
    else {
        kind = -1;
        for (auto &r : sranges) if (a >= r.first && a < r.first + r.second) { kind = 2 + store; break; }
        if (kind < 0) return;
    }
    int lane = F->lin & 31;
    uint32_t k = occ[F->lin][site]++;
    Acc &e = pending[AccKey{F->lin >> 5, site, k}];
    if (!e.mask) e.width = (uint8_t)width, e.kind = (uint8_t)kind;
    e.mask |= 1u << lane; e.addr[lane] = a;
    if (pending.size() > (1u << 20)) count_flush(true);   // a long barrier-free loop: measure what is complete
}
// a WMMA tile, once per warp: rows x cols elements of esz bytes, ld elements between rows (row
// major) or columns; chunks of 16 contiguous bytes, 32 chunks per request
void count_tile(const void *p, int rows, int cols, int esz, size_t ld, int rowmajor, int store) {
    if (!crec || !F || (F->lin & 31)) return;
    int outer = rowmajor ? rows : cols, inner = (rowmajor ? cols : rows) * esz;
    Acc a = {};
    int n = 0;
    int kind = is_device(p) ? store : 2 + store;
    for (int c = 0; c < inner; c += 16)      // ldmatrix order: 8 rows of one 16-byte column per phase
        for (int o = 0; o < outer; o++) {
            a.addr[n] = (uintptr_t)p + (size_t)o * ld * esz + c; a.mask |= 1u << n;
            if (++n == 32) { a.width = 16; a.kind = (uint8_t)kind; measure(a); a = Acc{}; n = 0; }
        }
    if (n) { a.width = 16; a.kind = (uint8_t)kind; measure(a); }
}
void count_mma(int m, int n, int k) {
    if (EMU_COUNT_KINDS != 2 && crec && F && !(F->lin & 31) && !probing) crec->mma_flop += 2.0 * m * n * k;
}
void count_quiet(int d) { quiet += d; }
static void count_dump();
static void count_dump_at_exit() {
    static int once;
    if (!once++) atexit(count_dump);
}
// count_fill: a device memset (copy 0) or device-to-device copy of n bytes on the stream, as one record
// of the launch list: n bytes stored (and for a copy loaded) in 16-byte pieces, 512 bytes a warp request,
// every byte compulsory (the model times it as DRAM traffic like a kernel's)
static void count_fill(const char *what, size_t n, int copy) {
    if (!count_on()) return;
    count_dump_at_exit();
    CountRec r{};
    r.kernel = what; r.blocks = r.sampled = 1; r.threads = 0;
    const double b = (double)n, req = (double)((n + 511) / 512), sect = (double)((n + 31) / 32);
    const bool ld = copy && EMU_COUNT_KINDS != 2, st = EMU_COUNT_KINDS != 1;
    if (st) r.gst_req = req, r.gst_sect = sect, r.gst_bytes = b;
    if (ld) r.gld_req = req, r.gld_sect = sect, r.gld_bytes = b;
    r.gbytes_w[4] = r.comp_shared = (ld ? b : 0) + (st ? b : 0);
    crecs.push_back(r);
    crec = nullptr;
}
static void count_launch_begin(const LaunchCfg &c, unsigned long nb, unsigned long ns) {
    if (!count_on()) return;
    count_dump_at_exit();
    crecs.push_back(CountRec{});
    crec = &crecs.back();
    crec->kernel = c.name; crec->blocks = nb; crec->sampled = ns;
    crec->threads = (int)(c.block.x * c.block.y * c.block.z);
    sectors.clear();
}
// compulsory bytes (each byte the launch reads, once, and each it writes, once: a sector read and written
// back counts twice, as DRAM moves it twice): every block run, 32 per sector touched;
// sampled, a sector several sampled blocks touched counts 32 once (shared by the grid: weights), one
// that a single block touched its bytes (a halo's edge sector is mostly the next tile's) divided by
// the blocks estimated to share it (its probes), scaled with the grid
static void count_launch_end() {
    count_flush();
    for (auto &kv : sectors) {
        const Sect &e = kv.second;
        if (crec->sampled == crec->blocks || e.multi) crec->comp_shared += 32;
        else crec->comp_own += __builtin_popcount(e.mask) / e.share;
    }
    sectors.clear();
    blk_sects.clear();
    crec = nullptr;
}
static void count_dump() {
    FILE *f = fopen(getenv("EMU_COUNT"), "w");
    if (!f) { fprintf(stderr, "EMU_COUNT=%s: cannot write\n", getenv("EMU_COUNT")); return; }
    fprintf(f,
            "# emulator counter mode: one line per launch, figures scaled from the sampled blocks to the grid\n"
            "# tag\tkernel\tblocks\tsampled\tthreads\tgld_req\tgld_sect\tgld_bytes\tgst_req\tgst_sect\tgst_bytes\t"
            "gb1\tgb2\tgb4\tgb8\tgb16\tsld_req\tsld_wave\tsld_phase\tsst_req\tsst_wave\tsst_phase\tmma_"
            "flop\tcompulsory_bytes\tuseful_flop\tcin\tcout\n");
    if (const char *step = getenv("EMU_COUNT_STEP")) fprintf(f, "# step: %s\n", step);
    for (auto &r : crecs) {
        double s = (double)r.blocks / r.sampled;
        double comp = r.comp_own * s + r.comp_shared;   // count_launch_end
        fprintf(f, "%s\t%s\t%lu\t%lu\t%d", r.tag.empty() ? "-" : r.tag.c_str(), r.kernel.c_str(), r.blocks, r.sampled,
                r.threads);
        double v[] = {r.gld_req,     r.gld_sect,    r.gld_bytes,   r.gst_req,     r.gst_sect,    r.gst_bytes,
                      r.gbytes_w[0], r.gbytes_w[1], r.gbytes_w[2], r.gbytes_w[3], r.gbytes_w[4], r.sld_req,
                      r.sld_wave,    r.sld_phase,   r.sst_req,     r.sst_wave,    r.sst_phase,   r.mma_flop};
        for (double x : v) fprintf(f, "\t%.6g", x * s);
        fprintf(f, "\t%.6g\t%.6g\t%d\t%d\n", comp, r.useful_flop, r.cin, r.cout);
    }
    fclose(f);
}
} // namespace emu
// the hooks g++ -fsanitize=kernel-address calls (call mode: asan-instrumentation-with-call-threshold=0)
#define EMU_HOOK(n)                                                                                                    \
    extern "C" void __asan_load##n##_noabort(uintptr_t a) {                                                            \
        emu::record(a, n, 0, (uintptr_t)__builtin_return_address(0));                                                  \
    }                                                                                                                  \
    extern "C" void __asan_store##n##_noabort(uintptr_t a) {                                                           \
        emu::record(a, n, 1, (uintptr_t)__builtin_return_address(0));                                                  \
    }
EMU_HOOK(1)
EMU_HOOK(2) EMU_HOOK(4) EMU_HOOK(8) EMU_HOOK(16) extern "C" void __asan_loadN_noabort(uintptr_t a, size_t n) {
    emu::record(a, (unsigned)n, 0, (uintptr_t)__builtin_return_address(0));
}
extern "C" void __asan_storeN_noabort(uintptr_t a, size_t n) {
    emu::record(a, (unsigned)n, 1, (uintptr_t)__builtin_return_address(0));
}
extern "C" void __asan_handle_no_return(void) {}
// emu_count_tag: yolo.c's YOLO_PROFILE names each group of launches after it ran ("conv fwd 3x3
// s1"): the launches since the last tag get that name; NULL (at the start of a timed group) names
// the launches before it "untimed"; flop: the group's useful FLOP (a conv's 2 x multiply-adds), kept
// on the group's last launch
static int emu_dims[2];   // emu_count_dims' channels, for the next tag
extern "C" void emu_count_tag(const char *name, double flop) {
    emu::drain();
    bool last = true;
    for (auto it = emu::crecs.rbegin(); it != emu::crecs.rend() && it->tag.empty(); ++it) {
        it->tag = name ? name : "untimed";
        if (last) it->useful_flop = flop, it->cin = emu_dims[0], it->cout = emu_dims[1], last = false;
    }
    emu_dims[0] = emu_dims[1] = 0;
}
// emu_count_dims: a conv group's channels (yolo.c's prof_end_conv), kept with its tag on the last launch
extern "C" void emu_count_dims(int cin, int cout) { emu_dims[0] = cin, emu_dims[1] = cout; }
#else
namespace emu {
int count_sample() { return 0; }
int count_full(const char *) { return 0; }
void count_shared_range(void *, size_t) {}
void count_tile(const void *, int, int, int, size_t, int, int) {}
void count_mma(int, int, int) {}
void count_quiet(int) {}
static void count_fill(const char *, size_t, int) {}
static void count_flush() {}
static void count_block_begin(int, unsigned long) {}
static void count_probe_begin(int) {}
static void count_probe_end(unsigned) {}
static void count_launch_begin(const LaunchCfg &, unsigned long, unsigned long) {}
static void count_launch_end() {}
}
#endif
#ifdef EMU_COUNTERS
extern "C" void emu_count_dump_now(void) { emu::drain(); emu::count_dump(); }
// emu_count_clear: the launches counted so far dropped, once they have run (test/gpu_count.c: the
// setup's, which are not the step's)
extern "C" void emu_count_clear(void) { emu::drain(); emu::crecs.clear(); }
#endif
