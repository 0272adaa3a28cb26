/*
 * yolo.c: YOLOv8 object detection training in plain C, with a CPU reference of every op.
 *
 * Build:  make   (the CPU binary; when nvcc is found, the same binary with the CUDA backend of
 *                 yolo_kernels.cu, which trains on a GPU with device=0; CUDA=0 forces CPU-only)
 * Run:    ./yolo info model=yolov8n nc=80 imgsz=640
 *         ./yolo plan model=yolov8n nc=80 batch=16 imgsz=640 gpu_mem=8G
 *         ./yolo shapes out=data/shapes         (synthetic dataset)
 *         ./yolo train data=data/shapes/data.yaml model=yolov8n epochs=40 imgsz=160
 *         ./yolo val / predict / check-ref / memtable / augment  (`./yolo` lists them)
 *         ./yolo export model=best.safetensors format=onnx [imgsz=640 dynamic=1 half=1]
 * Tests:  make test   (each test/test_X.c defines TESTING, includes this file and calls into it; the
 *                     kernels run against their CPU twins on a CPU emulation of CUDA, test/emu.mk)
 *
 * The network is the Ultralytics YOLOv8 detection model (ultralytics/cfg/models/v8/yolov8.yaml):
 * same layer graph, parameter names and numbers. Memory is planned before the first step:
 * every buffer a step uses comes out of one arena whose size is computed by running the same
 * schedule in "dry" mode (no memory touched), see the arena section.
 *
 * Sections, in data-flow order: checks and utilities · arguments · arena · CPU ops · model ·
 * the graph walk (forward/backward, once, over a CPU or a device backend) and the CPU backend ·
 * planning · loss · the step (walk_step) · optimizer and EMA · safetensors weights · PyTorch .pt
 * checkpoints (zip + safe unpickler) · evaluation · state_dict and check-ref · data · run pictures ·
 * the device step (GPU backend) · training, val, predict, plan · ONNX export · main.
 *
 * DEVIATIONS from Ultralytics (known, deliberate; each section lists its own in detail):
 *  - BN batch statistics are computed in double precision (PyTorch: float); ~1e-7 relative.
 *  - On the CPU, stride-1 3x3 convs run by Winograd F(2x2, 3x3) (CPU ops): other rounding than a
 *    direct sum (~1e-7 of the sum of |products|), within the PyTorch-parity tolerances.
 *  - Weight init and augmentation draw from our own RNG: a seed does not reproduce PyTorch's.
 *  - Loss: boxes beyond max_boxes per image (default 400) are counted and reported, not assigned;
 *    torch.topk's order among zero-alignment ties follows CUDA torch (loss section).
 *  - Sorts in NMS and mAP are stable (numpy/torch quicksort is not): only exact ties can differ.
 *  - Resizes use float bilinear weights (OpenCV: fixed point): pixels may differ by 1.
 *  - No labels/SPLIT.cache file; cutmix, copy_paste, Albumentations and multi_scale are not implemented.
 *  - On the CPU training is FP32 (amp= applies to the GPU step: FP16 activations, FP32 master
 *    weights, GradScaler; see the device section).
 *  - Several GPUs (DDP, "data parallel" section): each sample's augmentation is seeded by its
 *    position in the epoch (Ultralytics: a seed per rank); rank 0's BN running stats reach the other
 *    ranks after each step (DDP: before each forward; the same values at every forward); the
 *    gradient all-reduce starts after backward, not overlapped with it; the NCCL id goes over TCP
 *    (MASTER_ADDR:MASTER_PORT), also under mpirun (torch: a TCPStore, likewise).
 *  - ONNX export: same inputs, outputs and numbers as Ultralytics' graph, not the same nodes (DFL as
 *    Transpose + Softmax + MatMul instead of a 1x1 Conv; dynamic anchors from Shape/Range); half=1
 *    works on a CPU (Ultralytics needs a GPU for it); no onnxslim pass, no nms=True.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <stdarg.h>
#include <string.h>
#include <math.h>
#include <float.h>
#include <time.h>
#include <errno.h>
#include <limits.h>
#ifdef _OPENMP
#include <omp.h>
#endif
// omp_threads: the OpenMP team size of a parallel loop (1 in a build without OpenMP)
static int omp_threads(void) {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}
#include <inttypes.h>
#include <fcntl.h>
#include <unistd.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <setjmp.h>
#include <pthread.h>
#include <dirent.h>
#include <jpeglib.h>
#include <png.h>
#include <yaml.h>
#include <signal.h>
#include "yolo.h"   // the launchers of yolo_kernels.cu and the math both sides share
#ifdef TESTING   // a test includes the whole program and calls only its part of it
#pragma GCC diagnostic ignored "-Wunused-function"
#endif

// ------------------------------------------------------------------------------------------
// checks and small utilities
// ------------------------------------------------------------------------------------------

#define OMP_MIN_WORK 65536   // loops over fewer elements run on one thread: a team costs more than it saves

// die: print file:line, what failed and a hint, then exit(1). Used for impossible settings and
// programmer errors; bad user data gets a message and is skipped instead (see the data section).
#define die(...) die_at(__FILE__, __LINE__, __VA_ARGS__)
static _Noreturn void die_at(const char *file, int line, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "error (%s:%d): ", file, line);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(1);
}

static void *xmalloc_at(size_t n, const char *file, int line) {
    void *p = malloc(n ? n : 1);
    if (!p) die_at(file, line, "out of host memory allocating %zu bytes (hint: lower batch, imgsz or cache)", n);
    return p;
}
static void *xcalloc_at(size_t n, size_t s, const char *file, int line) {
    void *p = calloc(n ? n : 1, s ? s : 1);
    if (!p) die_at(file, line, "out of host memory allocating %zu x %zu bytes", n, s);
    return p;
}
static void *xrealloc_at(void *q, size_t n, const char *file, int line) {
    void *p = realloc(q, n ? n : 1);
    if (!p) die_at(file, line, "out of host memory allocating %zu bytes", n);
    return p;
}
static FILE *xfopen_at(const char *path, const char *mode, const char *file, int line) {
    FILE *f = fopen(path, mode);
    if (!f) die_at(file, line, "cannot open '%s' (%s): %s", path, mode, strerror(errno));
    return f;
}
#define xmalloc(n) xmalloc_at((n), __FILE__, __LINE__)
#define xcalloc(n, s) xcalloc_at((n), (s), __FILE__, __LINE__)
#define xrealloc(p, n) xrealloc_at((p), (n), __FILE__, __LINE__)
#define xfopen(p, m) xfopen_at((p), (m), __FILE__, __LINE__)

static double now_sec(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// Rng: a small, fast, seedable generator (splitmix64 seeding, xoshiro256** stepping).
// Every random decision in the project draws from an Rng that is part of saved state.
typedef struct { uint64_t s[4]; } Rng;

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}
static void rng_seed(Rng *r, uint64_t seed) {
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&seed);
}
static inline uint64_t rotl64(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
static uint64_t rng_u64(Rng *r) {
    uint64_t *s = r->s, out = rotl64(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0]; s[3] ^= s[1]; s[1] ^= s[2]; s[0] ^= s[3]; s[2] ^= t; s[3] = rotl64(s[3], 45);
    return out;
}
// uniform double in [0, 1)
static double rng_uniform(Rng *r) { return (rng_u64(r) >> 11) * (1.0 / 9007199254740992.0); }
// uniform double in [a, b)
static double rng_range(Rng *r, double a, double b) { return a + (b - a) * rng_uniform(r); }
// uniform integer in [0, n)
static int rng_int(Rng *r, int n) { return n <= 0 ? 0 : (int)(rng_uniform(r) * n); }
static double rng_normal(Rng *r) {
    double u1 = rng_uniform(r), u2 = rng_uniform(r);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

// ------------------------------------------------------------------------------------------
// command-line arguments: Ultralytics style key=value
// ------------------------------------------------------------------------------------------

// arg_get: the value of key=value in argv, or def when absent; a repeated key takes its last
// value, as Ultralytics' command line does.
static const char *arg_get(int argc, char **argv, const char *key, const char *def) {
    size_t n = strlen(key);
    const char *v = def;
    for (int i = 1; i < argc; i++)
        if (strncmp(argv[i], key, n) == 0 && argv[i][n] == '=') v = argv[i] + n + 1;
    return v;
}
// arg_check: every argument must be key=value with a key from the list; names the offender.
static void arg_check(int argc, char **argv, const char *const *keys) {
    for (int i = 2; i < argc; i++) {
        const char *eq = strchr(argv[i], '=');
        if (!eq) die("argument '%s' is not key=value (e.g. imgsz=640)", argv[i]);
        int ok = 0;
        for (int k = 0; keys[k]; k++)
            if ((size_t)(eq - argv[i]) == strlen(keys[k]) && strncmp(argv[i], keys[k], eq - argv[i]) == 0) ok = 1;
        if (!ok) die("unknown key '%.*s' in '%s' for '%s'", (int)(eq - argv[i]), argv[i], argv[i], argv[1]);
    }
}
static double arg_num(int argc, char **argv, const char *key, double def) {
    const char *v = arg_get(argc, argv, key, NULL);
    if (!v) return def;
    char *end;
    double x = strtod(v, &end);
    if (end == v || *end) die("%s=%s: expected a number", key, v);
    return x;
}
static long arg_int(int argc, char **argv, const char *key, long def) {
    double x = arg_num(argc, argv, key, (double)def);
    if (x != floor(x) || fabs(x) > 1e15) die("%s=%g: expected an integer", key, x);
    return (long)x;
}

// ------------------------------------------------------------------------------------------
// arena: every byte of a step, planned by a dry run of the same schedule
// ------------------------------------------------------------------------------------------
/*
 * The arena is one block of memory. Its size is computed by running the training schedule
 * (forward, loss, backward) with dry = 1: every arena_alloc/arena_free happens exactly as in a
 * real step, but no memory is touched, so the high-water mark of the dry run is the exact size
 * a real step needs. The allocator is first-fit over a fixed table of live blocks, so it is
 * deterministic and never calls malloc. Each allocation carries a group tag so `yolo plan` can
 * say where the bytes go.
 *
 * First-fit leaves holes: a block freed between two that stay live can only be reused by smaller
 * ones, and at the device step's peak (the start of backward) 28 MiB of yolov8n's 640 batch-16
 * arena were such holes. So the device arena is laid out offline: the dry run records each step's
 * allocations with their lifetimes (arena_record; a step is a segment, from arena_step_begin to
 * arena_step_end, that frees everything it allocates), arena_layout places every segment's blocks
 * largest first, each at the lowest offset free of the blocks it is live beside (greedy by size;
 * the persistent blocks are fixed obstacles), and the real run replays those offsets allocation by
 * allocation. A replayed block is checked against the live ones before it is used: a step that
 * allocates other sizes than its plan, or in another order, falls back to first-fit for the rest
 * of the step (counted in replay_miss; the tests require none), never onto a live block.
 */
// clang-format off
enum { G_PARAMS, G_GRADS, G_OPTIM, G_EMA, G_BUFFERS, G_ACTS, G_BACKWARD, G_SCRATCH, G_LOSS, G_INPUT, G_WORKSPACE,
       G_NGROUPS };
// clang-format on
static const char *const group_names[G_NGROUPS] = {
    "weights", "gradients", "optimizer state", "EMA", "BN running stats", "activations kept",
    "backward buffers", "scratch", "loss and assigner", "input staging", "GEMM workspace"};
#define GPU_CONTEXT_BYTES ((size_t)512 << 20)     // CUDA context estimate (driver, kernels); not in the arena

#define ARENA_MAX_BLOCKS 1024
#define ARENA_ALIGN 64
typedef struct { size_t off, size; int group, rec; } ArenaBlock;   // rec: its ArenaRec, -1 if none
typedef struct { size_t size, off; int group, seg, t0, t1; } ArenaRec;   // a recorded allocation: lifetime [t0, t1)
// ArenaLayout: the placed offsets of each segment's allocations, in allocation order
typedef struct {
    int nseg;
    int *first, *count;             // per segment: its first allocation in off/size, and how many
    size_t *off, *size;
    int npersist;                   // blocks live outside the segments (allocated before the first)
    size_t total;                   // the arena's size under this layout
} ArenaLayout;
typedef struct {
    char *base;                     // NULL in a dry run
    size_t cap;                     // bytes available (SIZE_MAX in a dry run)
    size_t high;                    // high-water mark: end of the furthest block ever live
    size_t live[G_NGROUPS];         // bytes live per group now
    size_t at_high[G_NGROUPS];      // bytes live per group when `high` was last raised
    size_t peak[G_NGROUPS];         // each group's own peak
    size_t live_max;                // the most bytes live at once (a layout without holes)
    size_t at_live_max[G_NGROUPS];  // bytes live per group then
    // layout (the device arena): recording in the dry run, replay in the real one
    ArenaRec *rec;                  // recorded allocations (NULL: not recording)
    int nrec, caprec, t;            // records, capacity, events (allocations and frees) so far
    int seg;                        // segment being allocated (arena_step_begin), -1 outside one
    int *seg_end;                   // recording: each segment's end event (nseg_rec of them)
    int nseg_rec;
    const ArenaLayout *lay;         // replay: the layout; cursor: next allocation, seg_stop: segment's last + 1
    int cursor, seg_stop;
    long replayed, replay_miss;     // allocations placed by the layout / steps that left it
    int n;                          // live blocks, sorted by offset
    ArenaBlock blk[ARENA_MAX_BLOCKS];
} Arena;

static int arena_dry(const Arena *a) { return a->base == NULL; }

// arena_lower: the first live block (sorted by offset) whose offset is >= off, or a->n
static int arena_lower(const Arena *a, size_t off) {
    int lo = 0, hi = a->n;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (a->blk[mid].off < off) lo = mid + 1; else hi = mid;
    }
    return lo;
}
// arena_slot: where a block of size bytes at off goes in the live table, or -1 if it overlaps a live block
static int arena_slot(const Arena *a, size_t off, size_t size) {
    int lo = arena_lower(a, off);
    if (lo > 0 && a->blk[lo - 1].off + a->blk[lo - 1].size > off) return -1;
    if (lo < a->n && off + size > a->blk[lo].off) return -1;
    return lo;
}
// arena_alloc: 64-byte aligned; at the layout's offset when replaying one (arena_step_begin), else
// first-fit. Returns a pointer (a fake, never-dereferenced one in a dry run: base address 0 plus
// the offset, kept in a uintptr_t until the cast).
static void *arena_alloc(Arena *a, size_t bytes, int group) {
    size_t size = (bytes + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN;
    if (size == 0) size = ARENA_ALIGN;
    size_t off = 0;
    int at = -1;
    if (a->lay && a->cursor < a->seg_stop) {   // replay: the layout's offset, if it is this allocation's
        int k = a->cursor++;
        if (a->lay->size[k] == size && (at = arena_slot(a, a->lay->off[k], size)) >= 0) {
            off = a->lay->off[k];
            a->replayed++;
        } else {
            a->replay_miss++;
            a->cursor = a->seg_stop;   // the rest of this step first-fit
        }
    }
    if (at < 0) {   // first-fit
        at = 0;
        for (; at < a->n; at++) {
            if (a->blk[at].off - off >= size) break;
            off = a->blk[at].off + a->blk[at].size;
        }
    }
    if (a->n == ARENA_MAX_BLOCKS) die("arena: more than %d live blocks (raise ARENA_MAX_BLOCKS)", ARENA_MAX_BLOCKS);
    if (off + size > a->cap)
        die("arena: plan exceeded (%zu + %zu > %zu bytes): a step allocated more than its dry run did", off, size,
            a->cap);
    int rec = -1;
    if (a->rec) {   // recording (dry run)
        if (a->nrec == a->caprec) {
            a->caprec = a->caprec ? 2 * a->caprec : 1024;
            a->rec = xrealloc(a->rec, (size_t)a->caprec * sizeof(ArenaRec));
        }
        rec = a->nrec++;
        a->rec[rec] = (ArenaRec){size, off, group, a->seg, a->t, INT_MAX};
    }
    a->t++;
    memmove(&a->blk[at + 1], &a->blk[at], (a->n - at) * sizeof(ArenaBlock));
    a->blk[at] = (ArenaBlock){off, size, group, rec};
    a->n++;
    a->live[group] += size;
    if (a->live[group] > a->peak[group]) a->peak[group] = a->live[group];
    if (off + size > a->high) { a->high = off + size; memcpy(a->at_high, a->live, sizeof a->live); }
    size_t sum = 0;
    for (int g = 0; g < G_NGROUPS; g++) sum += a->live[g];
    if (sum > a->live_max) { a->live_max = sum; memcpy(a->at_live_max, a->live, sizeof a->live); }
    return (void *)((uintptr_t)a->base + off + (a->base ? 0 : ARENA_ALIGN));
}
static void arena_free(Arena *a, void *p) {
    if (!p) return;
    size_t off = (uintptr_t)p - (uintptr_t)a->base - (a->base ? 0 : ARENA_ALIGN);
    int lo = arena_lower(a, off);
    if (lo == a->n || a->blk[lo].off != off) die("arena_free: %p is not a live block", p);
    a->live[a->blk[lo].group] -= a->blk[lo].size;
    if (a->blk[lo].rec >= 0) a->rec[a->blk[lo].rec].t1 = a->t;
    a->t++;
    memmove(&a->blk[lo], &a->blk[lo + 1], (a->n - lo - 1) * sizeof(ArenaBlock));
    a->n--;
}

// arena_record: the dry run from here on records its allocations for arena_layout
static void arena_record(Arena *a) {
    a->caprec = 1024;
    a->rec = xmalloc((size_t)a->caprec * sizeof(ArenaRec));
    a->nrec = 0;
    a->seg = -1;
}
// arena_step_begin / arena_step_end: one step of planned segment seg (-1: a shape without one);
// recording, the dry run's segments are numbered 0, 1, ... in order
static void arena_step_begin(Arena *a, int seg) {
    a->seg = seg;
    a->cursor = a->seg_stop = 0;
    if (a->lay && seg >= 0 && seg < a->lay->nseg && a->n == a->lay->npersist)
        a->cursor = a->lay->first[seg], a->seg_stop = a->cursor + a->lay->count[seg];
}
static void arena_step_end(Arena *a) {
    if (a->rec && a->seg >= 0) {
        if (a->seg != a->nseg_rec) die("arena: segment %d recorded out of order", a->seg);
        a->seg_end = xrealloc(a->seg_end, (size_t)(a->nseg_rec + 1) * sizeof(int));
        a->seg_end[a->nseg_rec++] = a->t;
    }
    a->seg = -1;
    a->cursor = a->seg_stop = 0;
}

typedef struct { size_t off, end; } Span;
static int span_cmp(const void *x, const void *y) {
    const Span *p = x, *q = y;
    return p->off < q->off ? -1 : p->off > q->off;
}
static const ArenaRec *layout_recs;   // for rec_cmp
static int rec_cmp(const void *x, const void *y) {   // size descending, then allocation order
    int i = *(const int *)x, j = *(const int *)y;
    size_t si = layout_recs[i].size, sj = layout_recs[j].size;
    return si != sj ? (si > sj ? -1 : 1) : (i > j) - (i < j);
}
// arena_layout: the recorded dry run laid out (see the arena's comment); NULL, and the first-fit
// plan kept, if the recording is not a sequence of self-contained segments after the persistent
// blocks. Frees the recording.
static ArenaLayout *arena_layout(Arena *a) {
    ArenaRec *r = a->rec;
    int n = a->nrec, npersist = 0, ok = a->nseg_rec > 0;
    for (int i = 0; i < n && ok; i++) {
        if (r[i].seg < 0) {   // persistent: before the first segment and never freed
            ok = r[i].t1 == INT_MAX && (i == 0 || r[i - 1].seg < 0);
            npersist++;
        } else {
            ok = r[i].seg < a->nseg_rec && r[i].t1 <= a->seg_end[r[i].seg];
        }
    }
    ArenaLayout *L = NULL;
    if (ok) {
        L = xcalloc(1, sizeof(ArenaLayout));
        L->nseg = a->nseg_rec;
        L->npersist = npersist;
        L->first = xcalloc((size_t)L->nseg, sizeof(int));
        L->count = xcalloc((size_t)L->nseg, sizeof(int));
        L->off = xmalloc((size_t)(n - npersist + 1) * sizeof(size_t));
        L->size = xmalloc((size_t)(n - npersist + 1) * sizeof(size_t));
        for (int i = 0; i < npersist; i++)
            if (r[i].off + r[i].size > L->total) L->total = r[i].off + r[i].size;
        int *order = xmalloc((size_t)n * sizeof(int));
        Span *sp = xmalloc((size_t)(n + 1) * sizeof(Span));
        for (int i = npersist, s = 0; s < L->nseg; s++) {
            int f = i;
            while (i < n && r[i].seg == s) i++;
            L->first[s] = f - npersist, L->count[s] = i - f;
            for (int k = f; k < i; k++) order[k - f] = k;
            layout_recs = r;
            qsort(order, (size_t)(i - f), sizeof(int), rec_cmp);
            for (int k = 0; k < i - f; k++) {   // place order[k] among the persistent and already placed blocks
                const ArenaRec *b = &r[order[k]];
                int ns = 0;
                for (int j = 0; j < npersist; j++) sp[ns++] = (Span){r[j].off, r[j].off + r[j].size};
                for (int j = 0; j < k; j++) {
                    const ArenaRec *o = &r[order[j]];
                    if (o->t0 < b->t1 && b->t0 < o->t1) sp[ns++] = (Span){o->off, o->off + o->size};
                }
                qsort(sp, (size_t)ns, sizeof(Span), span_cmp);
                size_t off = 0;
                for (int j = 0; j < ns && sp[j].off < off + b->size; j++)
                    if (sp[j].end > off) off = sp[j].end;
                r[order[k]].off = off;
                if (off + b->size > L->total) L->total = off + b->size;
            }
            for (int k = f; k < i; k++) L->off[k - npersist] = r[k].off, L->size[k - npersist] = r[k].size;
        }
        free(order);
        free(sp);
    }
    free(r);
    free(a->seg_end);
    a->rec = NULL, a->seg_end = NULL, a->nrec = a->caprec = a->nseg_rec = 0;
    return L;
}
static void arena_layout_free(ArenaLayout *L) {
    if (!L) return;
    free(L->first), free(L->count), free(L->off), free(L->size), free(L);
}
// arena_zalloc: arena_alloc plus zero fill (skipped in a dry run)
static void *arena_zalloc(Arena *a, size_t bytes, int group) {
    void *p = arena_alloc(a, bytes, group);
    if (!arena_dry(a)) memset(p, 0, bytes);
    return p;
}
#define afloat(a, n, g) ((float *)arena_alloc((a), (size_t)(n) * sizeof(float), (g)))
#define azfloat(a, n, g) ((float *)arena_zalloc((a), (size_t)(n) * sizeof(float), (g)))

// ------------------------------------------------------------------------------------------
// CPU ops: GEMM, im2col, BN + SiLU, upsample, max-pool
// ------------------------------------------------------------------------------------------

// The GEMM packs panels of A (MR rows) and B (NR columns) into per-thread buffers, then runs an
// MR x NR register-blocked micro-kernel written with GCC vector extensions (AVX-512 / AVX2 /
// SSE / NEON, whatever -march gives). Pack buffers are allocated once (gemm_init), never per call.
// The block is GEMM_NV vectors gemm_vec wide, sized per ISA so that the accumulators stay in
// registers: AVX-512 (32 zmm): 8 x 32, 16 accumulators; AVX / AVX2 (16 ymm): 6 x 16, 12
// accumulators, 2 vectors of B and a broadcast; SSE only (16 xmm): 4 x 12; aarch64 (32 q
// registers, 16-byte NEON vectors): 8 x 12 (24 accumulators, 3 vectors of B, A's 8 values). A
// vector type wider than the ISA's registers is split by GCC into several, and the block then no
// longer fits: 64-byte vectors on AVX2 (the 6 x 16 block as 6 x 1 of them) spilled every
// accumulator to the stack in the inner loop, 8x slower. The blocking does not change the order in
// which a C element's products are summed, so results are the same on every ISA.
#if defined(__aarch64__)
typedef float gemm_vec __attribute__((vector_size(16), aligned(4)));
#define GEMM_MR 8
#define GEMM_NV 3
#define GEMM_MC 128
#define GEMM_NC 504   // a multiple of GEMM_NR: B's last panel is padded to a whole NR
#elif defined(__AVX512F__)
typedef float gemm_vec __attribute__((vector_size(64), aligned(4)));
#define GEMM_MR 8
#define GEMM_NV 2
#define GEMM_MC 128
#define GEMM_NC 512
#elif defined(__AVX__)
typedef float gemm_vec __attribute__((vector_size(32), aligned(4)));
#define GEMM_MR 6
#define GEMM_NV 2
#define GEMM_MC 120   // a multiple of GEMM_MR: A's last panel is padded to a whole MR
#define GEMM_NC 512
#else
typedef float gemm_vec __attribute__((vector_size(16), aligned(4)));
#define GEMM_MR 4
#define GEMM_NV 3
#define GEMM_MC 128
#define GEMM_NC 504
#endif
#define GEMM_VL ((int)(sizeof(gemm_vec) / sizeof(float)))
#define GEMM_NR (GEMM_NV * GEMM_VL)
// gemm_wide's block: B's rows are read in place there, never packed, so its width is free of the
// weight gradient's N (Cout, a multiple of 16): 8 x 48 on AVX-512 (24 accumulators, 3 vectors of
// B: 11 loads per 24 FMAs, against 10 per 16 at 8 x 32); elsewhere the GEMM's block
#if defined(__AVX512F__) && !defined(__aarch64__)
#define GEMM_WNV 3
#else
#define GEMM_WNV GEMM_NV
#endif
#define GEMM_WNR (GEMM_WNV * GEMM_VL)
#define GEMM_KC 256
_Static_assert(GEMM_MC % GEMM_MR == 0 && GEMM_NC % GEMM_NR == 0,
               "the pack buffers hold whole MR x KC and KC x NR panels");
#define GEMM_MAX_THREADS 64
// A GEMM with a small C and a long K (the weight gradient of the high-resolution layers: C is
// Cout x Cin*K*K, K is every output pixel) has one or two tiles, so one or two threads busy. Such a
// GEMM is cut into GEMM_KSPLIT fixed slices of K, each into its own partial C, summed in slice
// order; the cut does not depend on the thread count, so neither do the bits.
#define GEMM_KSPLIT 8
#define GEMM_SPLIT_MN (GEMM_MC * GEMM_NC)   // the largest C that is split
#define GEMM_MIN_TILES 8                      // C tiles a GEMM is cut into at least, where its shape allows
static float *gemm_pack[GEMM_MAX_THREADS];    // per thread: A block (MC x KC) then B block (KC x NC)
static float *gemm_part;                      // (KSPLIT, SPLIT_MN) partial Cs of a split GEMM
static int gemm_nthreads;

static size_t gemm_workspace_bytes(int nthreads) {
    return (size_t)nthreads * (GEMM_MC * GEMM_KC + GEMM_KC * GEMM_NC) * sizeof(float) + 64 * (size_t)nthreads +
           (size_t)GEMM_KSPLIT * GEMM_SPLIT_MN * sizeof(float) + 64;
}
// gemm_init: the pack buffers of every thread (more when the thread count has grown since; called
// outside parallel regions before a GEMM runs in one)
static void gemm_init(void) {
    int want = omp_threads() < GEMM_MAX_THREADS ? omp_threads() : GEMM_MAX_THREADS;
    if (gemm_nthreads >= want) return;
    for (int t = gemm_nthreads; t < want; t++) {
        gemm_pack[t] = aligned_alloc(64, (GEMM_MC * GEMM_KC + GEMM_KC * GEMM_NC) * sizeof(float));
        if (!gemm_pack[t]) die("out of host memory for GEMM pack buffers");
    }
    if (!gemm_part) gemm_part = aligned_alloc(64, (size_t)GEMM_KSPLIT * GEMM_SPLIT_MN * sizeof(float));
    if (!gemm_part) die("out of host memory for GEMM partial sums");
    gemm_nthreads = want;
}

// element (i, k) of op(A) and (k, j) of op(B), row-major storage
#define OPA(i, k) (tA ? A[(size_t)(k) * lda + (i)] : A[(size_t)(i) * lda + (k)])
#define OPB(k, j) (tB ? B[(size_t)(j) * ldb + (k)] : B[(size_t)(k) * ldb + (j)])

// gemm_kernel: c (MR x NR, row stride ldc) (+)= a (MR x KC) * b_panel (KC x NR). A's element (i, k)
// is a[i * si + k * sk]: a packed panel (si 1, sk MR) or A itself, read in place (its rows:
// si = lda, sk = 1; its columns: si = 1, sk = lda): the kernel takes A one broadcast value at a
// time, so A needs no packing, only B's NR-wide vectors do. The two in-place forms are separate
// instantiations (GEMM_KERNEL below), so that each one's strides are constants inside its loop.
// Each product is added with a fused multiply-add (one rounding, as the GPU's FP32 GEMMs and
// oneDNN do): ISO C (-std=c11) forbids GCC to contract a * b + c by itself, so it is asked for here.
// GEMM_KERNEL(name, BPARAMS, BROW, SI, SK): BPARAMS are B's parameters (parenthesised), BROW the
// address of B's row k within them: a packed panel, or (gemm_kernel_bt*, below) a row read in place.
#define GEMM_UNPAREN(...) __VA_ARGS__
#define GEMM_KERNEL(name, BPARAMS, BROW, SI, SK)                                                               \
    __attribute__((optimize("fp-contract=fast"))) static inline void name(                                    \
        int kc, const float *restrict a, int lda, GEMM_UNPAREN BPARAMS, float *restrict c, int ldc, int mr,   \
        int nr, int add) {                                                                                     \
        (void)lda;                                                                                             \
        gemm_vec acc[GEMM_MR][GEMM_NV];                                                                        \
        for (int i = 0; i < GEMM_MR; i++)                                                                      \
            for (int v = 0; v < GEMM_NV; v++) acc[i][v] = (gemm_vec){0};                                       \
        for (int k = 0; k < kc; k++) {                                                                         \
            gemm_vec b[GEMM_NV];                                                                               \
            for (int v = 0; v < GEMM_NV; v++) b[v] = *(const gemm_vec *)((BROW) + v * GEMM_VL);                \
            for (int i = 0; i < GEMM_MR; i++)                                                                  \
                for (int v = 0; v < GEMM_NV; v++) acc[i][v] += a[(size_t)i * (SI) + (size_t)k * (SK)] * b[v];  \
        }                                                                                                      \
        gemm_store(acc, c, ldc, mr, nr, add);                                                                  \
    }
static inline void gemm_store(gemm_vec acc[GEMM_MR][GEMM_NV], float *restrict c, int ldc, int mr, int nr, int add) {
    if (mr == GEMM_MR && nr == GEMM_NR) {
        for (int i = 0; i < GEMM_MR; i++)
            for (int v = 0; v < GEMM_NV; v++) {
                gemm_vec *cv = (gemm_vec *)(c + (size_t)i * ldc + v * GEMM_VL);
                if (add) *cv += acc[i][v];
                else *cv = acc[i][v];
            }
    } else {
        float tmp[GEMM_MR][GEMM_NR];
        memcpy(tmp, acc, sizeof tmp);
        for (int i = 0; i < mr; i++)
            for (int j = 0; j < nr; j++) c[(size_t)i * ldc + j] = (add ? c[(size_t)i * ldc + j] : 0) + tmp[i][j];
    }
}
// B a packed panel; A a packed panel, its rows in place (A not transposed), its columns (transposed)
GEMM_KERNEL(gemm_kernel, (const float *restrict bp), bp + k * GEMM_NR, 1, GEMM_MR)
GEMM_KERNEL(gemm_kernel_rows, (const float *restrict bp), bp + k * GEMM_NR, lda, 1)
GEMM_KERNEL(gemm_kernel_cols, (const float *restrict bp), bp + k * GEMM_NR, 1, lda)

// The same products with one operand's rows found through pointers (PadRows below: the rows of an
// im2col matrix are shifted rows of the zero-padded input, so nothing is copied):
// gemm_kernel_at: A's row i read in place at arow[i] (B a packed panel); gemm_wide_rows (below):
// B's row k read in place at brow[k] + j, A's rows in place.
__attribute__((optimize("fp-contract=fast"))) static inline void gemm_kernel_at(
        int kc, const float *const *arow, size_t k0, const float *restrict bp, float *restrict c, int ldc, int mr,
        int nr, int add) {
    const float *a[GEMM_MR];
    for (int i = 0; i < GEMM_MR; i++) a[i] = arow[i] + k0;
    gemm_vec acc[GEMM_MR][GEMM_NV];
    for (int i = 0; i < GEMM_MR; i++)
        for (int v = 0; v < GEMM_NV; v++) acc[i][v] = (gemm_vec){0};
    for (int k = 0; k < kc; k++) {
        gemm_vec b[GEMM_NV];
        for (int v = 0; v < GEMM_NV; v++) b[v] = *(const gemm_vec *)(bp + k * GEMM_NR + v * GEMM_VL);
        for (int i = 0; i < GEMM_MR; i++)
            for (int v = 0; v < GEMM_NV; v++) acc[i][v] += a[i][k] * b[v];
    }
    gemm_store(acc, c, ldc, mr, nr, add);
}

// gemm_wide_rows: mr rows of C (row stride ldc; nr <= GEMM_WNR columns) (+)= mr rows of A (in place,
// row stride lda) x B's rows brow[k] + j, the block GEMM_WNV vectors wide. Whole MR-row panels, then
// the rows below the last one (M not a multiple of MR: 16, 32, 64 or 80 channels with AVX2's MR
// of 6) in groups of 4, 2 and 1, where a whole MR-row kernel would compute padding rows (up to 12 %
// of a 32-row conv) from a packed copy of A. A last panel of columns narrower than the block takes
// a block of as many vectors as it needs (a 10 x 10 map's 110 wide-grid columns: 48 + 48 + 16 on
// AVX-512, not 3 x 48). The same sums in the same order either way.
#define GEMM_WIDE_KERNEL(name, MRV, NVV)                                                                      \
    __attribute__((optimize("fp-contract=fast"))) static inline void name(                                    \
        int kc, const float *restrict a, int lda, const float *const *brow, size_t j, float *restrict c,      \
        int ldc, int nr, int add) {                                                                            \
        gemm_vec acc[MRV][NVV];                                                                                \
        for (int i = 0; i < MRV; i++)                                                                          \
            for (int v = 0; v < NVV; v++) acc[i][v] = (gemm_vec){0};                                           \
        for (int k = 0; k < kc; k++) {                                                                         \
            gemm_vec b[NVV];                                                                                   \
            for (int v = 0; v < NVV; v++) b[v] = *(const gemm_vec *)(brow[k] + j + v * GEMM_VL);              \
            for (int i = 0; i < MRV; i++)                                                                      \
                for (int v = 0; v < NVV; v++) acc[i][v] += a[(size_t)i * lda + k] * b[v];                      \
        }                                                                                                      \
        if (nr == NVV * GEMM_VL)                                                                               \
            for (int i = 0; i < MRV; i++)                                                                      \
                for (int v = 0; v < NVV; v++) {                                                                \
                    gemm_vec *cv = (gemm_vec *)(c + (size_t)i * ldc + v * GEMM_VL);                            \
                    *cv = add ? *cv + acc[i][v] : acc[i][v];                                                   \
                }                                                                                              \
        else {                                                                                                 \
            float tmp[MRV][NVV * GEMM_VL];                                                                     \
            memcpy(tmp, acc, sizeof tmp);                                                                      \
            for (int i = 0; i < MRV; i++)                                                                      \
                for (int t = 0; t < nr; t++) c[(size_t)i * ldc + t] = (add ? c[(size_t)i * ldc + t] : 0) + tmp[i][t]; \
        }                                                                                                      \
    }
// GEMM_WIDE_ROWS(NVV, sfx): the kernels of MR, 4, 2 and 1 rows NVV vectors wide, and their
// dispatcher gemm_wide_rows##sfx over mr rows
#define GEMM_WIDE_ROWS(NVV, sfx)                                                                               \
    GEMM_WIDE_KERNEL(gemm_wide_mr##sfx, GEMM_MR, NVV)                                                          \
    GEMM_WIDE_KERNEL(gemm_wide_4##sfx, 4, NVV)                                                                 \
    GEMM_WIDE_KERNEL(gemm_wide_2##sfx, 2, NVV)                                                                 \
    GEMM_WIDE_KERNEL(gemm_wide_1##sfx, 1, NVV)                                                                 \
    static void gemm_wide_rows##sfx(int kc, const float *a, int lda, const float *const *brow, size_t j,      \
                                    float *c, int ldc, int mr, int nr, int add) {                              \
        int i = 0;                                                                                             \
        for (; mr - i >= GEMM_MR; i += GEMM_MR)                                                                \
            gemm_wide_mr##sfx(kc, a + (size_t)i * lda, lda, brow, j, c + (size_t)i * ldc, ldc, nr, add);       \
        for (; mr - i >= 4; i += 4)                                                                            \
            gemm_wide_4##sfx(kc, a + (size_t)i * lda, lda, brow, j, c + (size_t)i * ldc, ldc, nr, add);        \
        if (mr - i >= 2)                                                                                       \
            gemm_wide_2##sfx(kc, a + (size_t)i * lda, lda, brow, j, c + (size_t)i * ldc, ldc, nr, add), i += 2; \
        if (mr - i >= 1) gemm_wide_1##sfx(kc, a + (size_t)i * lda, lda, brow, j, c + (size_t)i * ldc, ldc, nr, add); \
    }
GEMM_WIDE_ROWS(GEMM_WNV, _w)
#if GEMM_WNV >= 2
GEMM_WIDE_ROWS(1, _n1)
#endif
#if GEMM_WNV >= 3
GEMM_WIDE_ROWS(2, _n2)
#endif
static void gemm_wide_rows(int kc, const float *a, int lda, const float *const *brow, size_t j, float *c, int ldc,
                           int mr, int nr, int add) {
    int nv = (nr + GEMM_VL - 1) / GEMM_VL;   // vectors the columns need
#if GEMM_WNV >= 2
    if (nv == 1) {
        gemm_wide_rows_n1(kc, a, lda, brow, j, c, ldc, mr, nr, add);
        return;
    }
#endif
#if GEMM_WNV >= 3
    if (nv == 2) {
        gemm_wide_rows_n2(kc, a, lda, brow, j, c, ldc, mr, nr, add);
        return;
    }
#endif
    (void)nv;
    gemm_wide_rows_w(kc, a, lda, brow, j, c, ldc, mr, nr, add);
}

// gemm_pack_panel: n (<= w) lines of an operand, kc deep, into dst (kc, w), zero padded to w.
// Element (line i, depth k) is src[i * ld + k] when along_k (read along the rows, contiguous),
// else src[k * ld + i].
typedef float gemm_v8 __attribute__((vector_size(32), aligned(4)));
typedef int gemm_v8i __attribute__((vector_size(32)));
// gemm_transpose8: the 8 x 8 block src (row stride ld) transposed into dst (row stride w), in
// registers: three rounds of pairwise shuffles, then 8 contiguous stores
static inline void gemm_transpose8(const float *src, int ld, float *restrict dst, int w) {
    gemm_v8 r[8], t[8], s[8];
    for (int i = 0; i < 8; i++) r[i] = *(const gemm_v8 *)(src + (size_t)i * ld);   // (gemm_v8: 4-byte aligned)
    for (int i = 0; i < 8; i += 2) {   // pairs of rows interleaved by element
        t[i] = __builtin_shuffle(r[i], r[i + 1], (gemm_v8i){0, 8, 1, 9, 4, 12, 5, 13});
        t[i + 1] = __builtin_shuffle(r[i], r[i + 1], (gemm_v8i){2, 10, 3, 11, 6, 14, 7, 15});
    }
    for (int i = 0; i < 8; i += 4)     // then by pairs of elements
        for (int j = 0; j < 2; j++) {
            s[i + 2 * j] = __builtin_shuffle(t[i + j], t[i + j + 2], (gemm_v8i){0, 1, 8, 9, 4, 5, 12, 13});
            s[i + 2 * j + 1] = __builtin_shuffle(t[i + j], t[i + j + 2], (gemm_v8i){2, 3, 10, 11, 6, 7, 14, 15});
        }
    for (int j = 0; j < 4; j++) {      // then by halves
        gemm_v8 lo = __builtin_shuffle(s[j], s[j + 4], (gemm_v8i){0, 1, 2, 3, 8, 9, 10, 11});
        gemm_v8 hi = __builtin_shuffle(s[j], s[j + 4], (gemm_v8i){4, 5, 6, 7, 12, 13, 14, 15});
        *(gemm_v8 *)(dst + (size_t)j * w) = lo;
        *(gemm_v8 *)(dst + (size_t)(j + 4) * w) = hi;
    }
}

static void gemm_pack_panel(const float *src, int ld, int along_k, int n, int kc, int w, float *restrict dst) {
    if (along_k) {   // a transpose: 8 x 8 blocks in registers, the edges one value at a time
        int i = 0;
        for (; i + 8 <= n; i += 8) {
            int k = 0;
            for (; k + 8 <= kc; k += 8) gemm_transpose8(src + (size_t)i * ld + k, ld, dst + (size_t)k * w + i, w);
            for (; k < kc; k++)
                for (int l = i; l < i + 8; l++) dst[k * w + l] = src[(size_t)l * ld + k];
        }
        for (; i < n; i++)
            for (int k = 0; k < kc; k++) dst[k * w + i] = src[(size_t)i * ld + k];
    } else if (n == w && w % 8 == 0) {   // whole rows of 8-float vectors (a memcpy call per row costs more)
        for (int k = 0; k < kc; k++)
            for (int i = 0; i < w; i += 8)
                *(gemm_v8 *)(dst + (size_t)k * w + i) = *(const gemm_v8 *)(src + (size_t)k * ld + i);
        return;
    } else {
        for (int k = 0; k < kc; k++)
            for (int i = 0; i < n; i++) dst[k * w + i] = src[(size_t)k * ld + i];
    }
    for (int k = 0; k < kc; k++)
        for (int i = n; i < w; i++) dst[k * w + i] = 0;
}

// Im2col: a KxK convolution's input x (C, H, W), stride S, padding K/2, read as the im2col matrix
// (C*K*K rows, Ho*Wo columns) without writing it: gemm_run packs B's panels straight from x.
// rows: instead, the matrix's rows (a 1x1 conv's input channels) wherever they lie, B's row k at
// rows[k] (a concatenation read in place: cpu_input_rows).
typedef struct { const float *x; int C, H, W, K, S, Ho, Wo; const float *const *rows; } Im2col;
static void im2col_span(int W, int Wo, int S, int off, int *lo, int *hi);

// gemm_pack_im2col: rows [k0, k0+kc) and columns [j0, j0+n) of g's im2col matrix into dst (kc, w),
// zero padded to w: the values im2col would have written, so the products are the same. The
// panel's columns are cut once into runs within one output row; each row of the matrix (input
// channel ci, tap ky, kx, stepped by counters) is then a copy per run, padding as zeros.
#define IM2COL_KMAX 7
// (no-tree-loop-distribute-patterns: the short copies and zero fills stay inline vector loops, not
// memmove and memset calls of a few dozen bytes each)
__attribute__((optimize("no-tree-loop-distribute-patterns")))
static void gemm_pack_im2col(const Im2col *g, int k0, int kc, int j0, int n, int w, float *restrict dst) {
    int K = g->K, KK = K * K, p = K / 2, S = g->S, H = g->H, W = g->W, Wo = g->Wo;
    int nrun = 0, run_j[GEMM_NR + 1], run_oy[GEMM_NR + 1], run_ox[GEMM_NR + 1], run_len[GEMM_NR + 1];
    for (int j = 0; j < n;) {   // (n <= w <= GEMM_NR columns: at most n runs)
        int q = j0 + j, ox0 = q % Wo, len = Wo - ox0 < n - j ? Wo - ox0 : n - j;
        run_j[nrun] = j, run_oy[nrun] = q / Wo, run_ox[nrun] = ox0, run_len[nrun++] = len;
        j += len;
    }
    int lo[IM2COL_KMAX], hi[IM2COL_KMAX];
    for (int kx = 0; kx < K; kx++) im2col_span(W, Wo, S, kx - p, &lo[kx], &hi[kx]);
    int ci = k0 / KK, ky = k0 % KK / K, kx = k0 % K;
    for (int k = 0; k < kc; k++) {
        float *d = dst + (size_t)k * w;
        const float *src = g->x + (size_t)ci * H * W;
        for (int r = 0; r < nrun; r++) {
            float *dj = d + run_j[r];
            int len = run_len[r], ox0 = run_ox[r], iy = run_oy[r] * S - p + ky;
            int a = lo[kx] > ox0 ? lo[kx] - ox0 : 0, e = hi[kx] - ox0 < len ? hi[kx] - ox0 : len;   // [a, e) inside
            if (iy < 0 || iy >= H || e < a) a = e = 0;
            for (int t = 0; t < a; t++) dj[t] = 0.f;
            long base = (long)iy * W + (long)ox0 * S + kx - p;   // input index of column t = 0 (when inside)
            if (S == 1 && a == 0 && e == GEMM_NR) {   // a whole panel row inside the image: one fixed-size copy
                memcpy(dj, src + base, GEMM_NR * sizeof(float));
                continue;
            }
            if (S == 1) for (int t = a; t < e; t++) dj[t] = src[base + t];
            else if (S == 2) for (int t = a; t < e; t++) dj[t] = src[base + 2 * (long)t];
            else for (int t = a; t < e; t++) dj[t] = src[base + (long)t * S];
            for (int t = e; t < len; t++) dj[t] = 0.f;
        }
        for (int j = n; j < w; j++) d[j] = 0.f;
        if (++kx == K) kx = 0, ky = ky + 1 == K ? (ci++, 0) : ky + 1;
    }
}

// gemm_pack_rows: columns [j, j + n) of rows[0..kc) into dst (kc, NR), zero padded to NR
static void gemm_pack_rows(const float *const *rows, size_t j, int n, int kc, float *restrict dst) {
    for (int k = 0; k < kc; k++) {
        const float *src = rows[k] + j;
        float *d = dst + (size_t)k * GEMM_NR;
        if (n == GEMM_NR && GEMM_NR % 8 == 0) {   // (SSE's and NEON's 12 take the loop below)
            for (int i = 0; i < GEMM_NR; i += 8) *(gemm_v8 *)(d + i) = *(const gemm_v8 *)(src + i);
            continue;
        }
        for (int i = 0; i < n; i++) d[i] = src[i];
        for (int i = n; i < GEMM_NR; i++) d[i] = 0.f;
    }
}

// gemm_block: C block (mc x nc at C) (+)= op(A) rows i0.. times op(B) columns j0.., over k in
// [k0, k1), KC at a time; add: whether the first KC block adds to C. pa: this thread's pack buffer.
// A transposed operand is packed reading along its rows (contiguous), not across them.
static void gemm_block(int tA, int tB, int i0, int j0, int mc, int nc, int k0, int k1, const float *A, int lda,
                       const float *B, int ldb, const Im2col *bim, int add, float *C, int ldc, float *pa) {
    float *pb = pa + GEMM_MC * GEMM_KC;
    for (int p0 = k0; p0 < k1; p0 += GEMM_KC) {
        int kc = k1 - p0 < GEMM_KC ? k1 - p0 : GEMM_KC;
        for (int jp = 0; jp < nc; jp += GEMM_NR) {   // B (kc x nc) into NR-wide panels
            int nr = nc - jp < GEMM_NR ? nc - jp : GEMM_NR;
            if (bim && bim->rows) {
                gemm_pack_rows(bim->rows + p0, j0 + jp, nr, kc, pb + (size_t)jp * kc);
                continue;
            }
            if (bim) {
                gemm_pack_im2col(bim, p0, kc, j0 + jp, nr, GEMM_NR, pb + (size_t)jp * kc);
                continue;
            }
            const float *src = tB ? B + (size_t)(j0 + jp) * ldb + p0 : B + (size_t)p0 * ldb + j0 + jp;
            gemm_pack_panel(src, ldb, tB, nr, kc, GEMM_NR, pb + (size_t)jp * kc);
        }
        for (int ip = mc / GEMM_MR * GEMM_MR; ip < mc; ip += GEMM_MR) {   // only A's last, partial panel is packed
            int mr = mc - ip;
            const float *src = tA ? A + (size_t)p0 * lda + i0 + ip : A + (size_t)(i0 + ip) * lda + p0;
            gemm_pack_panel(src, lda, !tA, mr, kc, GEMM_MR, pa + (size_t)ip * kc);
        }
        int addk = p0 > k0 || add;
        for (int jp = 0; jp < nc; jp += GEMM_NR)
            for (int ip = 0; ip < mc; ip += GEMM_MR) {
                int mr = mc - ip < GEMM_MR ? mc - ip : GEMM_MR, nr = nc - jp < GEMM_NR ? nc - jp : GEMM_NR;
                const float *bp = pb + (size_t)jp * kc;
                float *cp = C + (size_t)ip * ldc + jp;
                if (mr < GEMM_MR) gemm_kernel(kc, pa + (size_t)ip * kc, GEMM_MR, bp, cp, ldc, mr, nr, addk);
                else if (tA) gemm_kernel_cols(kc, A + (size_t)p0 * lda + i0 + ip, lda, bp, cp, ldc, mr, nr, addk);
                else gemm_kernel_rows(kc, A + (size_t)(i0 + ip) * lda + p0, lda, bp, cp, ldc, mr, nr, addk);
            }
    }
}

// gemm_thread_pack: the calling thread's pack buffers: its number in the innermost team of more
// than one thread (inside cpu_conv's image loop a GEMM's own team has one thread; inside a loop
// of one thread, the GEMM's team is the one that counts)
static int gemm_thread_index(void) {
#ifdef _OPENMP
    for (int l = omp_get_level(); l > 0; l--)
        if (omp_get_team_size(l) > 1) return omp_get_ancestor_thread_num(l);
#endif
    return 0;
}
static float *gemm_thread_pack(void) { return gemm_pack[gemm_thread_index()]; }

// gemm_tiles: C's tiles (mcb x ncb, mt x nt of them; returns their number). A C of few MC x NC
// tiles (the low-resolution layers: 128 x 400 at 20 x 20 is one) is cut into smaller tiles, whole
// MR x NR panels, so that every thread gets work: at least GEMM_MIN_TILES of them, N split first
// (A, the weights, is the smaller operand to read again), unless the GEMM runs on one thread. The
// cut depends on the shape and on that; tiling never changes the order of a C element's sums, so
// the bits depend on neither.
static int gemm_tiles_nr(int M, int N, int nr, int *mcb, int *ncb, int *mt, int *nt) {
    int mc = GEMM_MC, nc = GEMM_NC / nr * nr, m = (M + mc - 1) / mc, n = (N + nc - 1) / nc;
    int want = GEMM_MIN_TILES;
#ifdef _OPENMP
    // a GEMM that runs on one thread (inside the image loop, or one thread in all) keeps whole tiles:
    // cut smaller it re-reads A and sets up B's rows once per piece (10x10 maps: 10 % slower)
    if (omp_get_active_level() >= omp_get_max_active_levels() || omp_get_max_threads() == 1) want = 1;
#else
    want = 1;
#endif
    while (m * n < want && (nc > nr || mc > GEMM_MR)) {
        if (nc > nr && (N + nc - 1) / nc * 2 <= (N + nr - 1) / nr)
            nc = ((N + 2 * n - 1) / (2 * n) + nr - 1) / nr * nr;
        else if (mc > GEMM_MR && (M + mc - 1) / mc * 2 <= (M + GEMM_MR - 1) / GEMM_MR)
            mc = ((M + 2 * m - 1) / (2 * m) + GEMM_MR - 1) / GEMM_MR * GEMM_MR;
        else break;
        m = (M + mc - 1) / mc, n = (N + nc - 1) / nc;
    }
    *mcb = mc, *ncb = nc, *mt = m, *nt = n;
    return m * n;
}
// (tiles of whole GEMM_NR-wide panels; gemm_wide's of whole GEMM_WNR-wide ones)
static int gemm_tiles(int M, int N, int *mcb, int *ncb, int *mt, int *nt) {
    return gemm_tiles_nr(M, N, GEMM_NR, mcb, ncb, mt, nt);
}

// gemm_cpu: row-major C (M x N) = op(A) (M x K) * op(B) (K x N) + beta * C, op = transpose if
// tX. beta is 0 or 1 in this project (0 never reads C). The CPU twin of the GPU GEMMs.
// gemm_run: the same, where B may instead be an im2col matrix read in place (bim, tB 0), and
// split 0 never cuts K (the convolutions: their bits must not depend on whether the GEMM runs on
// one thread of an image-parallel loop or over all of them; the K split uses shared buffers).
static void gemm_run(int tA, int tB, int M, int N, int K, const float *A, int lda, const float *B, int ldb,
                     const Im2col *bim, int split, float beta, float *C, int ldc);
__attribute__((unused))   // (the tests' plain GEMM: yolo.c's convolutions call gemm_run, gemm_wide, gemm_nt_rows)
static void gemm_cpu(int tA, int tB, int M, int N, int K, const float *A, int lda, const float *B, int ldb,
                     float beta, float *C, int ldc) {
    gemm_run(tA, tB, M, N, K, A, lda, B, ldb, NULL, 1, beta, C, ldc);
}
static void gemm_run(int tA, int tB, int M, int N, int K, const float *A, int lda, const float *B, int ldb,
                     const Im2col *bim, int split, float beta, float *C, int ldc) {
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {
        if (beta == 0) for (int i = 0; i < M; i++) memset(C + (size_t)i * ldc, 0, N * sizeof(float));
        return;
    }
    gemm_init();
    int mt = (M + GEMM_MC - 1) / GEMM_MC, nt = (N + GEMM_NC - 1) / GEMM_NC;
    int ntile = mt * nt;
    // (the cut depends on the shape only, whatever the thread count)
    if (split && ntile < 4 && (size_t)M * N <= GEMM_SPLIT_MN && K >= GEMM_KSPLIT * GEMM_KC) {
        // slice s covers [s * ks, (s + 1) * ks) of K, a multiple of KC: partial C (M x N, row stride N)
        int ks = (K / GEMM_KSPLIT + GEMM_KC - 1) / GEMM_KC * GEMM_KC;
        int ns = (K + ks - 1) / ks;
#pragma omp parallel for schedule(dynamic, 1)
        for (int w = 0; w < ns * ntile; w++) {
            int sl = w / ntile, tile = w % ntile;
            int i0 = (tile / nt) * GEMM_MC, j0 = (tile % nt) * GEMM_NC;
            int mc = M - i0 < GEMM_MC ? M - i0 : GEMM_MC, nc = N - j0 < GEMM_NC ? N - j0 : GEMM_NC;
            int k0 = sl * ks, k1 = K - k0 < ks ? K : k0 + ks;
            gemm_block(tA, tB, i0, j0, mc, nc, k0, k1, A, lda, B, ldb, bim, 0,
                       gemm_part + (size_t)sl * M * N + (size_t)i0 * N + j0, N, gemm_thread_pack());
        }
#pragma omp parallel for if ((size_t)M * N * ns > OMP_MIN_WORK)
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) {
                float v = beta != 0 ? C[(size_t)i * ldc + j] : 0.f;
                for (int sl = 0; sl < ns; sl++) v += gemm_part[(size_t)sl * M * N + (size_t)i * N + j];
                C[(size_t)i * ldc + j] = v;
            }
        return;
    }
    int mcb, ncb;
    ntile = gemm_tiles(M, N, &mcb, &ncb, &mt, &nt);
#pragma omp parallel for schedule(dynamic, 1) if (ntile > 1 && (double)M * N * K > 1e5)
    for (int tile = 0; tile < ntile; tile++) {
        int i0 = (tile / nt) * mcb, j0 = (tile % nt) * ncb;
        int mc = M - i0 < mcb ? M - i0 : mcb, nc = N - j0 < ncb ? N - j0 : ncb;
        gemm_block(tA, tB, i0, j0, mc, nc, 0, K, A, lda, B, ldb, bim, beta != 0, C + (size_t)i0 * ldc + j0, ldc,
                   gemm_thread_pack());
    }
}

// PadRows: the im2col matrix of a stride-1 KxK convolution (padding p = K/2) as rows of the
// zero-padded input xp (C planes of (H + 2p) x Wp, Wp = W + p: a row's p zero columns on the left
// are also the right-hand padding of the row above, as a tap reaching past a row's end lands
// there). Computed on the "wide" pixel grid q = y Wp + x (x < Wp; the p columns x >= W are junk,
// dropped by wide_store), row (ci, ky, kx) of that matrix is xp + ci plane + ky Wp + kx, read
// straight along q: nothing is copied, and the borders read the padding's zeros. pad_floats leaves
// a zero tail for the last NR-wide panel.
// Stride 2 (S 2): the padded input split into its four phases (phase_fill: the even and odd rows
// and columns of xp, each C planes), output pixel (oy, ox) reads xp[2 oy + ky][2 ox + kx] =
// phase (ky & 1, kx & 1) at (oy + ky / 2, ox + kx / 2): row (ci, ky, kx) is again a shifted row
// of one plane, on a wide grid of Wp = Wo + 2 (K / 2) columns. rows: instead, an explicit table
// (the input gradient of a stride-2 conv, whose rows are a subset of the taps).
typedef struct { const float *base; size_t plane; int Wp, K, S, C; const float *const *rows; } PadRows;
static inline const float *pad_row(const PadRows *g, int r) {
    if (g->rows) return g->rows[r];
    int k2 = g->K * g->K, t = r % k2, ky = t / g->K, kx = t % g->K;
    if (g->S == 1) return g->base + (size_t)(r / k2) * g->plane + (size_t)ky * g->Wp + kx;
    return g->base + ((size_t)((ky & 1) * 2 + (kx & 1)) * g->C + r / k2) * g->plane + (size_t)(ky >> 1) * g->Wp +
           (kx >> 1);
}
// (the zero tail: the last panel's reach, and a row and 32 floats for wino_input's groups of blocks)
static size_t pad_tail(int K, int Wp) { return 2 * (size_t)(K / 2) + GEMM_WNR + Wp + 32; }
static size_t pad_floats(int C, int H, int K, int Wp) {
    int p = K / 2;
    return (size_t)C * (H + 2 * p) * Wp + pad_tail(K, Wp);
}
// pad_fill: xp (C, H + 2p, Wp) = x (C, H, W) inside zeros: p rows above and below, row y of x at
// columns [p, p + W) of row y + p, zeros left of it and right of it up to Wp (W + p: none; a
// stride-2 conv's dz on its phases' grid: p more), and the zero tail (rows copied by inline
// loops: a memcpy call per row of 10 to 80 floats costs more than the copy)
__attribute__((optimize("no-tree-loop-distribute-patterns")))
static void pad_fill(float *xp, const float *x, int C, int H, int W, int K, int Wp) {
    int p = K / 2;
    size_t plane = (size_t)(H + 2 * p) * Wp;
#pragma omp parallel for if ((size_t)C * plane > OMP_MIN_WORK)
    for (int c = 0; c < C; c++) {
        float *d = xp + c * plane;
        memset(d, 0, (size_t)p * Wp * sizeof(float));
        for (int y = 0; y < H; y++) {
            float *r = d + (size_t)(y + p) * Wp;
            const float *src = x + ((size_t)c * H + y) * W;
            for (int i = 0; i < p; i++) r[i] = 0.f;
            for (int i = p + W; i < Wp; i++) r[i] = 0.f;
            for (int i = 0; i < W; i++) r[p + i] = src[i];
        }
        memset(d + (size_t)(H + p) * Wp, 0, (size_t)p * Wp * sizeof(float));
    }
    memset(xp + C * plane, 0, pad_tail(K, Wp) * sizeof(float));
}
// phase_floats / phase_fill: the four phases of x (C, H, W) zero-padded by p = K/2 (K odd, as
// conv_new requires) for a stride-2 conv with output Ho x Wo: plane (py, px, c) is (Ho + p) x
// (Wo + 2p), its (i, j) = xp[2i + py][2j + px] (zero outside x), then a zero tail past the last
// panel and the taps' reach
static size_t phase_floats(int C, int Ho, int Wo, int K) {
    int p = K / 2, G = Wo + 2 * p;
    return 4 * (size_t)C * (Ho + p) * G + G + 2 * p + GEMM_WNR;
}
__attribute__((optimize("no-tree-loop-distribute-patterns")))
static void phase_fill(float *xq, const float *x, int C, int H, int W, int K, int Ho, int Wo) {
    int p = K / 2, G = Wo + 2 * p, Hq = Ho + p;
    size_t plane = (size_t)Hq * G;
    // each input row is read once, into the rows of its two column phases
    int j0[2], j1[2];   // phase px's columns [j0, j1) read x[2j + px - p]; the rest are zeros
    for (int px = 0; px < 2; px++) {
        j0[px] = (p - px + 1) / 2 > 0 ? (p - px + 1) / 2 : 0;
        int last = W - 1 + p - px;   // 2j <= last (none when negative)
        j1[px] = last < 0 ? 0 : last / 2 + 1 < G ? last / 2 + 1 : G;
    }
#pragma omp parallel for collapse(2) if (4 * (size_t)C * plane > OMP_MIN_WORK)
    for (int c = 0; c < C; c++)
        for (int py = 0; py < 2; py++)
            for (int i = 0; i < Hq; i++) {
                int y = 2 * i + py - p;
                for (int px = 0; px < 2; px++) {
                    float *r = xq + ((size_t)(2 * py + px) * C + c) * plane + (size_t)i * G;
                    if (y < 0 || y >= H) {
                        for (int j = 0; j < G; j++) r[j] = 0.f;
                        continue;
                    }
                    const float *sr = x + ((size_t)c * H + y) * W + px - p;
                    for (int j = 0; j < j0[px]; j++) r[j] = 0.f;
                    for (int j = j0[px]; j < j1[px]; j++) r[j] = sr[2 * j];
                    for (int j = j1[px] > j0[px] ? j1[px] : j0[px]; j < G; j++) r[j] = 0.f;
                }
            }
    memset(xq + 4 * (size_t)C * plane, 0, (G + 2 * p + GEMM_WNR) * sizeof(float));
}
// WideOut: where gemm_wide's rows go: row m, grid pixel (i, j) (q = i Wp + j) to out + m H W +
// y W + x, y = S i + oy, x = S j + ox, when inside H x W; the rest (the junk columns) is dropped.
// S 1: a stride-1 conv's output (oy = ox = 0); S 2: one phase of a stride-2 conv's input gradient.
// add: out += instead of = (an input gradient added into the dA it belongs to).
typedef struct { float *out; int H, W, Wp, S, oy, ox, add; } WideOut;
// wide_store: a finished C tile (mc x nc at T, row stride ldt; rows m0.., grid pixels q0..) to o
__attribute__((optimize("no-tree-loop-distribute-patterns")))
static void wide_store(const WideOut *o, int m0, int mc, int q0, int nc, const float *T, int ldt) {
    size_t plane = (size_t)o->H * o->W;
    for (int r = 0; r < mc; r++) {
        float *dst = o->out + (size_t)(m0 + r) * plane;
        const float *src = T + (size_t)r * ldt - q0;
        for (int q = q0; q < q0 + nc;) {
            int i = q / o->Wp, j = q % o->Wp, len = o->Wp - j < q0 + nc - q ? o->Wp - j : q0 + nc - q;
            int y = o->S * i + o->oy;
            if (y >= 0 && y < o->H) {
                float *d = dst + (size_t)y * o->W;
                int n = o->W - j < len ? o->W - j : len;
                if (o->S == 1 && o->add)
                    for (int t = 0; t < n; t++) d[j + t] += src[q + t];
                else if (o->S == 1)
                    for (int t = 0; t < n; t++) d[j + t] = src[q + t];
                else {   // stride 2: columns x = 2 (j + t) + ox, t in [t0, t1) inside the row
                    int ox = o->ox, t0 = 2 * j + ox < 0 ? (1 - 2 * j - ox) / 2 : 0, t1 = (o->W - ox + 1) / 2 - j;
                    float *dd = d + 2 * j + ox;
                    const float *sq = src + q;
                    if (t1 > len) t1 = len;
                    if (o->add)
                        for (int t = t0; t < t1; t++) dd[2 * t] += sq[t];
                    else
                        for (int t = t0; t < t1; t++) dd[2 * t] = sq[t];
                }
            }
            q += len;
        }
    }
}

// gemm_wide: C = A (M x K, rows in place) * B, B's row k at pad_row(g, k): a stride-1 KxK
// convolution on the wide grid (N = H Wp), with no im2col and no packing of B. Tiles as
// gemm_run's, in parallel; each C element is summed in K order. A tile is computed in the thread's
// pack buffer (B's part, unused here) and then stored narrowed (WideOut) while it is still in
// cache: no wide C is written.
static void gemm_wide(int M, int N, int K, const float *A, int lda, const PadRows *g, const WideOut *o) {
    gemm_init();
    int mt, nt, mcb, ncb, ntile = gemm_tiles_nr(M, N, GEMM_WNR, &mcb, &ncb, &mt, &nt);
#pragma omp parallel for schedule(dynamic, 1) if (ntile > 1 && (double)M * N * K > 1e5)
    for (int tile = 0; tile < ntile; tile++) {
        int i0 = (tile / nt) * mcb, j0 = (tile % nt) * ncb;
        int mc = M - i0 < mcb ? M - i0 : mcb, nc = N - j0 < ncb ? N - j0 : ncb;
        float *T = gemm_thread_pack() + GEMM_MC * GEMM_KC;   // the tile (mc x nc, row stride nc), in B's pack buffer
        const float *brow[GEMM_KC];
        for (int p0 = 0; p0 < K; p0 += GEMM_KC) {
            int kc = K - p0 < GEMM_KC ? K - p0 : GEMM_KC, add = p0 > 0;
            for (int k = 0; k < kc; k++) brow[k] = pad_row(g, p0 + k);
            for (int jp = 0; jp < nc; jp += GEMM_WNR)
                for (int ip = 0; ip < mc; ip += GEMM_MR) {
                    int mr = mc - ip < GEMM_MR ? mc - ip : GEMM_MR, nr = nc - jp < GEMM_WNR ? nc - jp : GEMM_WNR;
                    float *cp = T + (size_t)ip * nc + jp;
                    gemm_wide_rows(kc, A + (size_t)(i0 + ip) * lda + p0, lda, brow, (size_t)(j0 + jp), cp, nc, mr, nr,
                                   add);
                }
        }
        wide_store(o, i0, mc, j0, nc, T, nc);
    }
}
_Static_assert((size_t)GEMM_MC * GEMM_NC <= (size_t)GEMM_KC * GEMM_NC, "gemm_wide's tile fits B's pack buffer");

// gemm_nt_rows: C (M x N, row stride ldc) += A (M x K) * B^T, B (N x K): both read along their
// rows, as the weight gradient's operands lie (K: the pixels). Each thread takes a contiguous run
// of A's MR-row panels, reads them in place, and packs B^T's KC x N blocks once for all of them (B
// is the smaller operand: dz, Cout rows, against the Cin*K*K rows of the im2col matrix). A C
// element is summed in K order, by one thread: the bits do not depend on the thread count.
// With ag, A's row i is pad_row(ag, i) instead (the weight gradient of a stride-1 KxK conv on the
// wide grid: B is then dz with zero columns, see cpu_conv_grads). nimg pairs (A[g] or ag[g], B[g])
// are summed one after the other, as one K of nimg * K: a batch's images.
static void gemm_nt_rows(int M, int N, int K, int nimg, const float *const *As, int lda, const PadRows *ags,
                         const float *const *Bs, int ldb, float *C, int ldc) {
    if (M <= 0 || N <= 0 || K <= 0) return;
    gemm_init();
    int npan = (M + GEMM_MR - 1) / GEMM_MR;
#pragma omp parallel if ((double)M * N * K * nimg > 1e5)
    {
        int t = 0, nth = 1;
#ifdef _OPENMP
        t = omp_get_thread_num(), nth = omp_get_num_threads();
#endif
        int q0 = (int)((long)npan * t / nth), q1 = (int)((long)npan * (t + 1) / nth);
        float *pa = gemm_thread_pack(), *pb = pa + GEMM_MC * GEMM_KC;
        for (int n0 = 0; n0 < N && q0 < q1; n0 += GEMM_NC) {
            int nc = N - n0 < GEMM_NC ? N - n0 : GEMM_NC;
            for (int g = 0; g < nimg; g++) {
                const float *A = As ? As[g] : NULL, *B = Bs[g];
                const PadRows *ag = ags ? &ags[g] : NULL;
                for (int k0 = 0; k0 < K; k0 += GEMM_KC) {
                    int kc = K - k0 < GEMM_KC ? K - k0 : GEMM_KC;
                    for (int jp = 0; jp < nc; jp += GEMM_NR)   // B^T (kc x nc) into NR-wide panels
                        gemm_pack_panel(B + (size_t)(n0 + jp) * ldb + k0, ldb, 1, nc - jp < GEMM_NR ? nc - jp : GEMM_NR,
                                        kc, GEMM_NR, pb + (size_t)jp * kc);
                    for (int q = q0; q < q1; q++) {
                        int i0 = q * GEMM_MR, mr = M - i0 < GEMM_MR ? M - i0 : GEMM_MR;
                        const float *a = A ? A + (size_t)i0 * lda + k0 : NULL, *arow[GEMM_MR];
                        if (ag)   // (a partial panel repeats its first row: only mr rows are stored)
                            for (int i = 0; i < GEMM_MR; i++) arow[i] = pad_row(ag, i0 + (i < mr ? i : 0));
                        else if (mr < GEMM_MR) gemm_pack_panel(a, lda, 1, mr, kc, GEMM_MR, pa), a = pa;
                        for (int jp = 0; jp < nc; jp += GEMM_NR) {
                            int nr = nc - jp < GEMM_NR ? nc - jp : GEMM_NR;
                            const float *bp = pb + (size_t)jp * kc;
                            float *cp = C + (size_t)i0 * ldc + n0 + jp;
                            if (ag) gemm_kernel_at(kc, arow, (size_t)k0, bp, cp, ldc, mr, nr, 1);
                            else if (mr < GEMM_MR) gemm_kernel(kc, a, GEMM_MR, bp, cp, ldc, mr, nr, 1);
                            else gemm_kernel_rows(kc, a, lda, bp, cp, ldc, mr, nr, 1);
                        }
                    }
                }
            }
        }
    }
}

// im2col_span: the output columns ox in [lo, hi) whose input column ox*S + off lies in [0, W);
// the others read padding. Lets im2col and col2im run their inner loops without a test per pixel.
static void im2col_span(int W, int Wo, int S, int off, int *lo, int *hi) {
    int l = off >= 0 ? 0 : (-off + S - 1) / S, h = W - 1 - off < 0 ? 0 : (W - 1 - off) / S + 1;
    if (h > Wo) h = Wo;
    if (l > h) l = h;
    *lo = l, *hi = h;
}

// im2col: x (C, H, W) -> col (C*K*K, Ho*Wo) for a KxK conv with stride S and padding K/2.
// Matches PyTorch's Conv2d(padding=k//2) geometry: Ho = (H + 2p - K)/S + 1.
static void im2col(const float *x, int C, int H, int W, int K, int S, float *col) {
    int p = K / 2, Ho = (H + 2 * p - K) / S + 1, Wo = (W + 2 * p - K) / S + 1;
#pragma omp parallel for collapse(2) if ((size_t)C * K * K * Ho * Wo > OMP_MIN_WORK)
    for (int c = 0; c < C; c++)
        for (int kk = 0; kk < K * K; kk++) {
            int ky = kk / K, kx = kk % K;
            float *dst = col + ((size_t)c * K * K + kk) * Ho * Wo;
            const float *src = x + (size_t)c * H * W;
            // the columns ox in [lo, hi) read inside the row (ix = ox S - p + kx in [0, W)); the rest is padding
            int lo, hi, off = kx - p;
            im2col_span(W, Wo, S, off, &lo, &hi);
            for (int oy = 0; oy < Ho; oy++) {
                int iy = oy * S - p + ky;
                float *d = dst + oy * Wo;
                if (iy < 0 || iy >= H) { memset(d, 0, Wo * sizeof(float)); continue; }
                const float *r = src + (size_t)iy * W;
                for (int ox = 0; ox < lo; ox++) d[ox] = 0.f;
                if (S == 1) memcpy(d + lo, r + lo + off, (size_t)(hi - lo) * sizeof(float));
                else for (int ox = lo; ox < hi; ox++) d[ox] = r[ox * S + off];
                for (int ox = hi; ox < Wo; ox++) d[ox] = 0.f;
            }
        }
}

// col2im: the adjoint of im2col: dx (C, H, W) = sum of col entries into the pixels they read.
static void col2im(const float *col, int C, int H, int W, int K, int S, float *dx) {
    int p = K / 2, Ho = (H + 2 * p - K) / S + 1, Wo = (W + 2 * p - K) / S + 1;
#pragma omp parallel for if ((size_t)C * K * K * Ho * Wo > OMP_MIN_WORK)
    for (int c = 0; c < C; c++) {
        float *d = dx + (size_t)c * H * W;
        memset(d, 0, (size_t)H * W * sizeof(float));
        for (int kk = 0; kk < K * K; kk++) {
            int ky = kk / K, kx = kk % K;
            const float *src = col + ((size_t)c * K * K + kk) * Ho * Wo;
            int lo, hi, off = kx - p;
            im2col_span(W, Wo, S, off, &lo, &hi);
            for (int oy = 0; oy < Ho; oy++) {
                int iy = oy * S - p + ky;
                if (iy < 0 || iy >= H) continue;
                float *r = d + (size_t)iy * W;
                const float *s = src + oy * Wo;
                if (S == 1)
                    for (int ox = lo; ox < hi; ox++) r[ox + off] += s[ox];
                else
                    for (int ox = lo; ox < hi; ox++) r[ox * S + off] += s[ox];
            }
        }
    }
}

// exp_poly8: e^x on 8 floats, within 2 ulp of expf over the whole range, written with vector types
// (libm's expf is a call per element, and GCC vectorises a scalar version of this only with
// AVX-512's masks: for AVX2, SSE and NEON the clamps would stay branches under the default
// -ftrapping-math): x = n ln2 + r with |r| <= ln2/2, a degree-7 polynomial for e^r (Cephes' expf
// coefficients), 2^n put into the exponent bits. x is clamped to [-87, 88] (no subnormals, no
// overflow of 2^n) by selects on the compare masks; a NaN stays NaN. silu8: SiLU on 8 floats.
// In place, through pointers (a 32-byte vector passed by value changes the ABI on SSE-only
// builds); v8_load / v8_store move n <= 8 floats (a row's last, partial group, zero padded).
#define V8_SELECT(m, a, b) ((gemm_v8)(((m) & (gemm_v8i)(a)) | (~(m) & (gemm_v8i)(b))))   // m ? a : b
static inline void exp_poly8(gemm_v8 *v) {
    const gemm_v8 lo = {-87.f, -87.f, -87.f, -87.f, -87.f, -87.f, -87.f, -87.f},
                  hi = {88.f, 88.f, 88.f, 88.f, 88.f, 88.f, 88.f, 88.f};
    gemm_v8 x = *v;
    x = V8_SELECT(x < lo, lo, x);
    x = V8_SELECT(x > hi, hi, x);
    const float shift = 12582912.f;
    gemm_v8 t = x * 1.44269504088896341f + shift, n = t - shift;
    gemm_v8i ni = (gemm_v8i)t - 0x4B400000;
    gemm_v8 r = x - n * 0.693359375f + n * 2.12194440e-4f;
    gemm_v8 p = r * 1.9875691500e-4f + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.f;
    typedef unsigned int v8u __attribute__((vector_size(32)));
    v8u eb = ((v8u)ni + 127u) << 23;
    *v = p * (gemm_v8)eb;
}
static inline void silu8(gemm_v8 *v) {   // *v = SiLU(*v)
    gemm_v8 e = -*v;
    exp_poly8(&e);
    *v = *v / (1.f + e);
}
static inline void v8_load(gemm_v8 *v, const float *p, int n) {
    if (n == 8) {
        *v = *(const gemm_v8 *)p;   // (gemm_v8: 4-byte aligned)
        return;
    }
    float t[8] = {0};
    memcpy(t, p, (size_t)n * sizeof(float));
    memcpy(v, t, sizeof t);
}
static inline void v8_store(float *p, const gemm_v8 *v, int n) {
    if (n == 8) *(gemm_v8 *)p = *v;
    else memcpy(p, v, (size_t)n * sizeof(float));
}

// Winograd F(2x2, 3x3): a stride-1 3x3 convolution's input gradient in 4 products per output
// pixel and channel pair instead of 9. It is a 3x3 correlation of the padded dz with the flipped
// weights g (see cpu_conv_grads), and each 2x2 block of outputs, from its 4x4 input patch d, is
// Y = A^T [(G g G^T) . (B^T d B)] A, with
//   B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1], G = [1 0 0; 1/2 1/2 1/2; 1/2 -1/2 1/2; 0 0 1],
//   A^T = [1 1 1 0; 0 1 -1 -1]
// (an element-wise product of 4x4 transforms). Summed over Cout, the 16 element positions e are
// 16 GEMMs: M_e (Cin x blocks) = U_e (Cin x Cout, the transformed weights, wino_weights) x V_e
// (Cout x blocks, the transformed patches, wino_input), then Y = A^T M A (wino_output). The GEMMs
// are gemm_wide_rows on GEMM_KC-deep blocks of Cout (V_e's rows read in place), so every sum has a
// fixed order (per e: Cout in order; then Y's fixed sums of the 16), whatever the threads. Output
// (0, 0) of a block reads patch rows and columns 0..2 only (A^T's first row leaves out M's last row
// and column exactly), so a patch reaching past the padding (odd H or W), or a group of 8 blocks
// reaching past its row, changes only outputs that are dropped. Blocks are taken in bands of
// WINO_NC: a band's V (16 x Cout x WINO_NC) is made, used by every Cin block, and dropped while it
// is still in cache; each Cin block's 16 M_e tiles fill B's pack buffer. Rounding differs from the
// direct sum (G's halves, the sums of four in A and B), within the gradient tolerances of the
// finite-difference and PyTorch-parity tests.
#define WINO_NC (GEMM_WNR * (GEMM_WNR >= 48 ? 2 : GEMM_WNR >= 16 ? 6 : 8))   // band width, in 2x2 blocks
#define WINO_MC ((GEMM_KC * GEMM_NC / 16 / WINO_NC - 1) / GEMM_MR * GEMM_MR)   // Cin rows per block
// V_e and the M_e tiles lie 16 floats more than their size apart: 16 streams a multiple of 4 KiB
// apart would share their L1 sets (32 -> 32 channels at 40 x 40: 40 % slower)
#define WINO_SKEW 16
static size_t wino_es(int C) { return (size_t)C * WINO_NC + WINO_SKEW; }
static size_t wino_ues(int M, int K) { return (size_t)M * K + WINO_SKEW; }   // (U_e to U_e+1, the same way)
_Static_assert(WINO_MC >= GEMM_MR && WINO_NC % 8 == 0 && 16 * (WINO_MC * WINO_NC + WINO_SKEW) <= GEMM_KC * GEMM_NC,
               "wino_conv's 16 tiles fit B's pack buffer");
// wino_weights: the weights w (Cout, Cin, 3, 3) transformed for wino_conv: flip 0 (a forward conv): U
// (16, Cout, Cin), U_e[co][ci] = (G g G^T)[e / 4][e % 4], g = w[co][ci]; flip 1 (its input
// gradient): U (16, Cin, Cout), U_e[ci][co] the same of g[ky][kx] = w[co][ci][2 - ky][2 - kx].
// U_e starts at U + e wino_ues(rows, cols); U holds 16 wino_ues floats.
static void wino_weights(const float *w, int cout, int cin, int flip, float *U) {
    int rows = flip ? cin : cout, cols = flip ? cout : cin;   // each U_e: rows x cols
    size_t es = wino_ues(rows, cols);
#pragma omp parallel for if ((long)cout * cin * 16 > OMP_MIN_WORK)
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) {
            const float *k = w + ((size_t)(flip ? c : r) * cin + (flip ? r : c)) * 9;
            float g[9], t[4][3];
            for (int i = 0; i < 9; i++) g[i] = k[flip ? 8 - i : i];
            for (int x = 0; x < 3; x++) {   // t = G g
                t[0][x] = g[x];
                t[1][x] = 0.5f * (g[x] + g[3 + x] + g[6 + x]);
                t[2][x] = 0.5f * (g[x] - g[3 + x] + g[6 + x]);
                t[3][x] = g[6 + x];
            }
            float *u = U + (size_t)r * cols + c;
            for (int a = 0; a < 4; a++) {   // U = t G^T
                u[(4 * a) * es] = t[a][0];
                u[(4 * a + 1) * es] = 0.5f * (t[a][0] + t[a][1] + t[a][2]);
                u[(4 * a + 2) * es] = 0.5f * (t[a][0] - t[a][1] + t[a][2]);
                u[(4 * a + 3) * es] = t[a][2];
            }
        }
}
// wino_input: V (16, C, ldv) for blocks t0 .. t0 + nc - 1 (block t: output rows 2 (t / W2) + 0..1,
// columns 2 (t % W2) + 0..1) from the padded planes dp (C planes of `plane` floats, rows Wp wide:
// patch element (a, b) of block (i, j) is dp[(2i + a) Wp + 2j + b]): V_e = (B^T d B)[e / 4][e % 4].
// 8 blocks at a time, from the even and odd columns of 18 floats per patch row; a row of blocks
// that is not a whole number of groups ends with a group that overlaps the one before (the same
// values stored again), one shorter than 8 with a group that reads on into the next rows (inside
// the plane and pad_tail) and stores only its blocks.
// wino_row: block t's place (row i, column j of blocks) and how many of the band's blocks from it
// lie in the same row (the transforms and the output walk a band in such runs)
static inline int wino_row(int t, int t0, int nc, int W2, int *i, int *j) {
    *i = t / W2, *j = t % W2;
    return W2 - *j < t0 + nc - t ? W2 - *j : t0 + nc - t;
}
// wino_cols: the even (columns 0, 2, .. 14) and odd columns of the 16 floats at r
static inline void wino_cols(const float *r, gemm_v8 *even, gemm_v8 *odd) {
    gemm_v8 l0 = *(const gemm_v8 *)r, l1 = *(const gemm_v8 *)(r + 8);
    *even = __builtin_shuffle(l0, l1, (gemm_v8i){0, 2, 4, 6, 8, 10, 12, 14});
    *odd = __builtin_shuffle(l0, l1, (gemm_v8i){1, 3, 5, 7, 9, 11, 13, 15});
}
// wino_put: the 16 transformed values y (element e of 8 blocks) to T_e + q (T_e e es apart), all 8
// blocks or the first m
static inline void wino_put(float *T, size_t es, int q, int m, const gemm_v8 y[16]) {
    for (int e = 0; e < 16; e++) {
        float *d = T + e * es + q;
        if (m == 8) *(gemm_v8 *)d = y[e];
        else for (int k = 0; k < m; k++) d[k] = y[e][k];
    }
}
static void wino_input(const float *dp, size_t plane, int Wp, int C, int W2, int t0, int nc, float *V, int ldv) {
    size_t es = wino_es(C);   // V_e to V_e+1
    for (int c = 0; c < C; c++)
        for (int t = t0, i, j, n; t < t0 + nc; t += n) {
            n = wino_row(t, t0, nc, W2, &i, &j);
            const float *r0 = dp + c * plane + (size_t)(2 * i) * Wp + 2 * j;
            for (int q0 = 0; q0 < n; q0 += 8) {
                int q = n >= 8 && q0 + 8 > n ? n - 8 : q0;
                gemm_v8 R[4][4], y[16];
                for (int a = 0; a < 4; a++) {
                    gemm_v8 x0, x1, x2, x3;
                    wino_cols(r0 + (size_t)a * Wp + 2 * q, &x0, &x1);
                    wino_cols(r0 + (size_t)a * Wp + 2 * q + 2, &x2, &x3);
                    R[a][0] = x0 - x2, R[a][1] = x1 + x2, R[a][2] = x2 - x1, R[a][3] = x1 - x3;
                }
                for (int b = 0; b < 4; b++)
                    y[b] = R[0][b] - R[2][b], y[4 + b] = R[1][b] + R[2][b], y[8 + b] = R[2][b] - R[1][b],
                    y[12 + b] = R[1][b] - R[3][b];
                wino_put(V + (size_t)c * ldv + (t - t0), es, q, n - q < 8 ? n - q : 8, y);
            }
        }
}
// wino_output: out (+)= Y = A^T M A for the Cin rows i0 .. i0 + mc - 1 and blocks t0 .. t0 + nc - 1
// (M: 16 tiles, tile e's row i at Mt + e wino_es(WINO_MC) + i WINO_NC): per column b of M, the rows'
// sums s_b = M0b + M1b + M2b and d_b = M1b - M2b - M3b, then Y = (s0 + s1 + s2, s1 - s2 - s3;
// d0 + d1 + d2, d1 - d2 - d3), each row's two outputs interleaved into a row of out
static void wino_output(const float *Mt, int i0, int mc, int t0, int nc, int H, int W, int W2, float *out, int add) {
    const gemm_v8i lo = {0, 8, 1, 9, 2, 10, 3, 11}, hi = {4, 12, 5, 13, 6, 14, 7, 15};
    size_t HW = (size_t)H * W, es = wino_es(WINO_MC);
    for (int i = 0; i < mc; i++)
        for (int t = t0, bi, bj, n; t < t0 + nc; t += n) {
            n = wino_row(t, t0, nc, W2, &bi, &bj);
            const float *m = Mt + (size_t)i * WINO_NC + (t - t0);
            float *o = out + (size_t)(i0 + i) * HW + (size_t)(2 * bi) * W + 2 * bj;
            int w = W - 2 * bj < 2 * n ? W - 2 * bj : 2 * n, rows = H - 2 * bi < 2 ? 1 : 2;   // outputs inside
            for (int q = 0; q < n; q += 8) {
                gemm_v8 s[4], d[4], y[4];
                for (int b = 0; b < 4; b++) {
                    gemm_v8 m0 = *(const gemm_v8 *)(m + b * es + q), m1 = *(const gemm_v8 *)(m + (4 + b) * es + q);
                    gemm_v8 m2 = *(const gemm_v8 *)(m + (8 + b) * es + q), m3 = *(const gemm_v8 *)(m + (12 + b) * es + q);
                    s[b] = m0 + m1 + m2, d[b] = m1 - m2 - m3;
                }
                y[0] = s[0] + s[1] + s[2], y[1] = s[1] - s[2] - s[3], y[2] = d[0] + d[1] + d[2], y[3] = d[1] - d[2] - d[3];
                int wq = w - 2 * q < 16 ? w - 2 * q : 16;   // outputs of this group inside the row
                for (int r = 0; r < rows; r++) {
                    gemm_v8 p[2] = {__builtin_shuffle(y[2 * r], y[2 * r + 1], lo), __builtin_shuffle(y[2 * r], y[2 * r + 1], hi)};
                    float *d0 = o + (size_t)r * W + 2 * q;
                    if (wq == 16 && add)
                        for (int h = 0; h < 2; h++) *(gemm_v8 *)(d0 + 8 * h) += p[h];
                    else if (wq == 16)
                        for (int h = 0; h < 2; h++) *(gemm_v8 *)(d0 + 8 * h) = p[h];
                    else {   // (the row's last, partial group)
                        float f[16];
                        memcpy(f, p, sizeof f);
                        for (int k = 0; k < wq; k++) d0[k] = (add ? d0[k] : 0.f) + f[k];
                    }
                }
            }
        }
}
// wino_floats: floats of the V buffers wino_conv needs (one band per thread)
static size_t wino_floats(int K, int nthreads) { return (size_t)nthreads * (16 * wino_es(K) + GEMM_WNR); }
// wino_conv: out (M, H, W) (+)= the 3x3 correlation of the padded planes dp (K of them, `plane`
// floats, rows Wp wide, Wp >= W + 1, zero outside the input; pad_tail past the last) with the
// weights transformed into U (wino_weights: 16 x M x K). V: wino_floats(K, omp_threads()) floats.
// add: out += instead of =.
static void wino_conv(int M, int K, int H, int W, const float *U, const float *dp, size_t plane, int Wp, float *V,
                      float *out, int add) {
    gemm_init();
    int W2 = (W + 1) / 2, nt = (H + 1) / 2 * W2, nb = (nt + WINO_NC - 1) / WINO_NC;
#pragma omp parallel for schedule(dynamic, 1) if (nb > 1 && (double)M * K * nt > 1e5)
    for (int band = 0; band < nb; band++) {
        int t0 = band * WINO_NC, nc = nt - t0 < WINO_NC ? nt - t0 : WINO_NC;
        float *v = V + (size_t)gemm_thread_index() * (16 * wino_es(K) + GEMM_WNR);
        wino_input(dp, plane, Wp, K, W2, t0, nc, v, WINO_NC);
        float *Mt = gemm_thread_pack() + GEMM_MC * GEMM_KC;   // 16 tiles of WINO_MC x WINO_NC
        const float *brow[GEMM_KC];
        for (int i0 = 0; i0 < M; i0 += WINO_MC) {
            int mc = M - i0 < WINO_MC ? M - i0 : WINO_MC;
            for (int e = 0; e < 16; e++)
                for (int p0 = 0; p0 < K; p0 += GEMM_KC) {
                    int kc = K - p0 < GEMM_KC ? K - p0 : GEMM_KC;
                    for (int k = 0; k < kc; k++) brow[k] = v + e * wino_es(K) + (size_t)(p0 + k) * WINO_NC;
                    for (int jp = 0; jp < nc; jp += GEMM_WNR)
                        for (int ip = 0; ip < mc; ip += GEMM_MR) {
                            int mr = mc - ip < GEMM_MR ? mc - ip : GEMM_MR, nr = nc - jp < GEMM_WNR ? nc - jp : GEMM_WNR;
                            gemm_wide_rows(kc, U + e * wino_ues(M, K) + (size_t)(i0 + ip) * K + p0, K, brow, (size_t)jp,
                                           Mt + e * wino_es(WINO_MC) + (size_t)ip * WINO_NC + jp, WINO_NC, mr, nr,
                                           p0 > 0);
                        }
                }
            wino_output(Mt, i0, mc, t0, nc, H, W, W2, out, add);
        }
    }
}

// The weight gradient the same way: dL/dg = G^T [sum over blocks of (A dY A^T) . (B^T d B)] G for
// each channel pair (dY: the 2x2 block of dz, d: its 4x4 input patch), so per image 16 GEMMs S_e
// (Cin x Cout) += V_e (Cin x blocks) x Z_e^T (Cout x blocks), Z_e = (A dY A^T)[e / 4][e % 4], then
// once for the batch gw += G^T S G (wino_wgrad_finish). Here every product counts: a block's dz
// outside the image is read as the padding's zeros, its patch past the image as the next rows'
// values (finite), which meet only those zeros.
// wino_dz: Z (16, C, ldv) for blocks t0 .. t0 + nc - 1 from the padded dz planes dp (as pad_fill
// with K 3: dz[y][x] at dp[(1 + y) Wp + 1 + x]); A dY A^T, A = [1 0; 1 1; 1 -1; 0 -1]
static void wino_dz(const float *dp, size_t plane, int Wp, int C, int W2, int t0, int nc, float *Z, int ldv) {
    size_t es = wino_es(C);
    for (int c = 0; c < C; c++)
        for (int t = t0, i, j, n; t < t0 + nc; t += n) {
            n = wino_row(t, t0, nc, W2, &i, &j);
            const float *r0 = dp + c * plane + (size_t)(1 + 2 * i) * Wp + 1 + 2 * j;
            for (int q0 = 0; q0 < n; q0 += 8) {
                int q = n >= 8 && q0 + 8 > n ? n - 8 : q0;
                gemm_v8 R[2][4], y[16];   // (R: A along each of the block's two rows)
                for (int a = 0; a < 2; a++) {
                    gemm_v8 y0, y1;
                    wino_cols(r0 + (size_t)a * Wp + 2 * q, &y0, &y1);
                    R[a][0] = y0, R[a][1] = y0 + y1, R[a][2] = y0 - y1, R[a][3] = -y1;
                }
                for (int b = 0; b < 4; b++)
                    y[b] = R[0][b], y[4 + b] = R[0][b] + R[1][b], y[8 + b] = R[0][b] - R[1][b], y[12 + b] = -R[1][b];
                wino_put(Z + (size_t)c * ldv + (t - t0), es, q, n - q < 8 ? n - q : 8, y);
            }
        }
}
// wino_wgrad_floats: the V and Z buffers of wino_wgrad, one band per thread
static size_t wino_wgrad_floats(int Cin, int Cout, int nthreads) {
    return (size_t)nthreads * (16 * (wino_es(Cin) + wino_es(Cout)) + 2 * GEMM_WNR);
}
// wino_wgrad: S (16 x wino_ues(Cin, Cout) floats, S_e: Cin x Cout) += one image's sums, from its
// padded input xp and padded dz dzp (both rows Wp wide, as pad_fill with K 3)
static void wino_wgrad(int Cin, int Cout, int H, int W, const float *xp, size_t xplane, const float *dzp, size_t zplane,
                       int Wp, float *VZ, float *S) {
    int W2 = (W + 1) / 2, nt = (H + 1) / 2 * W2, nb = (nt + WINO_NC - 1) / WINO_NC;
    size_t ues = wino_ues(Cin, Cout);
    float *v = VZ + (size_t)gemm_thread_index() * (16 * (wino_es(Cin) + wino_es(Cout)) + 2 * GEMM_WNR);
    float *z = v + 16 * wino_es(Cin) + GEMM_WNR;
    for (int band = 0; band < nb; band++) {   // (in order: each S element sums its blocks in order)
        int t0 = band * WINO_NC, nc = nt - t0 < WINO_NC ? nt - t0 : WINO_NC;
        wino_input(xp, xplane, Wp, Cin, W2, t0, nc, v, WINO_NC);
        wino_dz(dzp, zplane, Wp, Cout, W2, t0, nc, z, WINO_NC);
        for (int e = 0; e < 16; e++) {
            const float *ve = v + e * wino_es(Cin), *ze = z + e * wino_es(Cout);
            gemm_nt_rows(Cin, Cout, nc, 1, &ve, WINO_NC, NULL, &ze, WINO_NC, S + e * ues, Cout);
        }
    }
}
// wino_wgrad_finish: gw (Cout, Cin, 3, 3) += G^T S G, S the sum of the nimg images' partials (added
// into the first, in image order), S[a][b] = S_{4a+b}[ci][co]; G^T = [1 1/2 1/2 0; 0 1/2 -1/2 0; 0 1/2 1/2 1]
static void wino_wgrad_finish(float *S, int nimg, int Cin, int Cout, float *gw) {
    size_t ues = wino_ues(Cin, Cout), img = 16 * ues;
#pragma omp parallel for if (img * nimg > OMP_MIN_WORK)
    for (size_t i = 0; i < img; i++)
        for (int b = 1; b < nimg; b++) S[i] += S[b * img + i];
#pragma omp parallel for if ((long)Cin * Cout * 16 > OMP_MIN_WORK)
    for (int ci = 0; ci < Cin; ci++)
        for (int co = 0; co < Cout; co++) {
            float s[4][4], t[3][4];
            for (int e = 0; e < 16; e++) s[e >> 2][e & 3] = S[e * ues + (size_t)ci * Cout + co];
            for (int b = 0; b < 4; b++) {   // t = G^T s
                t[0][b] = s[0][b] + 0.5f * (s[1][b] + s[2][b]);
                t[1][b] = 0.5f * (s[1][b] - s[2][b]);
                t[2][b] = 0.5f * (s[1][b] + s[2][b]) + s[3][b];
            }
            float *g = gw + ((size_t)co * Cin + ci) * 9;
            for (int y = 0; y < 3; y++) {   // then t G
                g[3 * y] += t[y][0] + 0.5f * (t[y][1] + t[y][2]);
                g[3 * y + 1] += 0.5f * (t[y][1] - t[y][2]);
                g[3 * y + 2] += 0.5f * (t[y][1] + t[y][2]) + t[y][3];
            }
        }
}

// bn_silu_run: n values of one channel, BN folded to y = silu(z * sc + sh) (sc = gamma * invstd,
// sh = beta - mean * sc): in groups of 8, then the partial last one
static inline void bn_silu_run(const float *zi, float sc, float sh, float *yo, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        gemm_v8 v = *(const gemm_v8 *)(zi + i) * sc + sh;
        silu8(&v);
        *(gemm_v8 *)(yo + i) = v;
    }
    if (i < n) {
        gemm_v8 v;
        v8_load(&v, zi + i, n - i);
        v = v * sc + sh;
        silu8(&v);
        v8_store(yo + i, &v, n - i);
    }
}
// bn_silu_forward_cpu: y = SiLU(gamma * (z - mean) * invstd + beta), per channel.
// z, y: (B, C, HW); mean, invstd, gamma, beta: (C). Recomputes a Conv's output from its kept
// pre-BN values: only z is kept between forward and backward, the activation is made again when needed.
static void bn_silu_forward_cpu(const float *z, const float *mean, const float *invstd, const float *gamma,
                                const float *beta, float *y, int B, int C, int HW) {
#pragma omp parallel for collapse(2) if ((size_t)B * C * HW > OMP_MIN_WORK)
    for (int b = 0; b < B; b++)
        for (int c = 0; c < C; c++) {
            float sc = gamma[c] * invstd[c], sh = beta[c] - mean[c] * sc;
            bn_silu_run(z + ((size_t)b * C + c) * HW, sc, sh, y + ((size_t)b * C + c) * HW, HW);
        }
}

// upsample2_forward_cpu: nearest-neighbour x2 (nn.Upsample(scale_factor=2)). x (B,C,H,W) -> y (B,C,2H,2W)
static void upsample2_forward_cpu(const float *x, float *y, int B, int C, int H, int W) {
#pragma omp parallel for if ((size_t)B * C * H * W * 4 > OMP_MIN_WORK)
    for (long bc = 0; bc < (long)B * C; bc++)
        for (int oy = 0; oy < 2 * H; oy++)
            for (int ox = 0; ox < 2 * W; ox++)
                y[(bc * 2 * H + oy) * 2 * W + ox] = x[(bc * H + oy / 2) * W + ox / 2];
}

// upsample2_backward: dx (B,C,H,W) = sum of the 2x2 gradients each input pixel was copied to.
static void upsample2_backward(const float *dy, float *dx, int B, int C, int H, int W) {
#pragma omp parallel for if ((size_t)B * C * H * W * 4 > OMP_MIN_WORK)
    for (long bc = 0; bc < (long)B * C; bc++)
        for (int y = 0; y < H; y++)
            for (int x = 0; x < W; x++) {
                const float *g = dy + (bc * 2 * H + 2 * y) * 2 * W + 2 * x;
                dx[(bc * H + y) * W + x] = g[0] + g[1] + g[2 * W] + g[2 * W + 1];
            }
}

// maxpool5_forward_cpu: MaxPool2d(5, stride 1, padding 2) with -inf padding (as PyTorch).
// x, y: (B, C, H, W). Separable: the max over 5 columns into y, then over 5 rows of that.
static void maxpool5_forward_cpu(const float *x, float *y, int B, int C, int H, int W) {
#pragma omp parallel for if ((size_t)B * C * H * W * 10 > OMP_MIN_WORK)
    for (long bc = 0; bc < (long)B * C; bc++) {
        const float *xp = x + (size_t)bc * H * W;
        float *yp = y + (size_t)bc * H * W, col[H];
        for (int iy = 0; iy < H; iy++)
            for (int ox = 0; ox < W; ox++) {
                float m = -INFINITY;
                for (int ix = ox - 2 < 0 ? 0 : ox - 2; ix <= ox + 2 && ix < W; ix++)
                    if (xp[iy * W + ix] > m) m = xp[iy * W + ix];
                yp[iy * W + ox] = m;
            }
        for (int ox = 0; ox < W; ox++) {
            for (int iy = 0; iy < H; iy++) col[iy] = yp[iy * W + ox];
            for (int oy = 0; oy < H; oy++) {
                float m = -INFINITY;
                for (int iy = oy - 2 < 0 ? 0 : oy - 2; iy <= oy + 2 && iy < H; iy++)
                    if (col[iy] > m) m = col[iy];
                yp[oy * W + ox] = m;
            }
        }
    }
}

// maxpool5_backward: routes each output gradient to the argmax of its window, found again from
// x (no stored indices). Ties go to the first maximum in row-major window order, as PyTorch's
// CPU kernel does. dx (B,C,H,W) is overwritten.
static void maxpool5_backward(const float *x, const float *dy, float *dx, int B, int C, int H, int W) {
    memset(dx, 0, (size_t)B * C * H * W * sizeof(float));
#pragma omp parallel for if ((size_t)B * C * H * W * 25 > OMP_MIN_WORK)
    for (long bc = 0; bc < (long)B * C; bc++) {
        const float *xp = x + bc * H * W, *gp = dy + bc * H * W;
        float *dp = dx + bc * H * W;
        // the window's rows, row iy in slot iy % 5, at offset 2, with -inf around (never a maximum)
        // so that 8 outputs are taken at a time as vectors, any W
        float row[5][W + 12];
        for (int k = 0; k < 5; k++)
            for (int i = 0; i < W + 12; i++) row[k][i] = -INFINITY;
        for (int iy = 0; iy < 2 && iy < H; iy++) memcpy(row[iy] + 2, xp + (size_t)iy * W, (size_t)W * sizeof(float));
        for (int oy = 0; oy < H; oy++) {
            int y0 = oy - 2 < 0 ? 0 : oy - 2, y1 = oy + 2 < H ? oy + 2 : H - 1;
            if (oy + 2 < H) memcpy(row[(oy + 2) % 5] + 2, xp + (size_t)(oy + 2) * W, (size_t)W * sizeof(float));
            for (int ox = 0; ox < W; ox += 8) {
                gemm_v8 m = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
                gemm_v8i arg = {-1, -1, -1, -1, -1, -1, -1, -1}, lane = {0, 1, 2, 3, 4, 5, 6, 7};
                for (int iy = y0; iy <= y1; iy++)   // (window order: rows, then columns)
                    for (int d = -2; d <= 2; d++) {
                        gemm_v8 v = *(const gemm_v8 *)(row[iy % 5] + 2 + ox + d);
                        gemm_v8i gt = v > m;   // (strictly: the first maximum wins)
                        m = V8_SELECT(gt, v, m);
                        arg = (gt & (lane + (iy * W + ox + d))) | (~gt & arg);
                    }
                for (int l = 0; l < 8 && ox + l < W; l++)   // (in output order)
                    if (arg[l] >= 0) dp[arg[l]] += gp[oy * W + ox + l];
            }
        }
    }
}

// ------------------------------------------------------------------------------------------
// model: the YOLOv8 graph as convs and "values"
// ------------------------------------------------------------------------------------------
/*
 * Every tensor of the network is a Value. Only Conv outputs own memory, and what they keep is
 * the pre-BN convolution output z plus the batch mean and 1/std of each channel; the activated
 * output SiLU(BN(z)) is recomputed whenever a consumer needs it (CPU training keeps it as well,
 * Conv.y, unless recompute=1: see exec_cpu). Everything else is a view that is materialised on
 * demand, one image at a time, into scratch:
 *   V_CONV   SiLU(BN(z)) of a Conv (or the raw output of a Detect 1x1 conv)
 *   V_SLICE  channels [c0, c0+C) of a Conv (the C2f split)
 *   V_ADD    a + b (the Bottleneck shortcut)
 *   V_CAT    channel concat of up to 8 values (C2f, SPPF, neck)
 *   V_UP     nearest x2 upsample
 *   V_POOL   5x5 max-pool (SPPF; backward finds the argmax again)
 *   V_INPUT  the image batch
 * Gradients flow the same way: a Conv's gradient buffer dA (B, C, H, W) exists only from the
 * first consumer's backward to the Conv's own backward.
 */
enum { V_INPUT, V_CONV, V_SLICE, V_ADD, V_CAT, V_UP, V_POOL };
#define MAX_CONVS 160
#define MAX_VALUES 320
#define MAX_CAT 8
#define YOLO_LAYERS 23                   // rows of yolov8.yaml: backbone 0-9, head 10-21, Detect 22
#define DETECT_LAYER (YOLO_LAYERS - 1)   // its module path prefix is "model.22."
#define REG_MAX 16
#define BN_EPS 1e-3f
#define BN_MOMENTUM 0.03f

typedef struct {
    int kind, C, H, W;      // output channels and size for the current input size
    int conv;               // V_CONV, V_SLICE: the conv index
    int c0;                 // V_SLICE: first channel
    int n, src[MAX_CAT];    // V_ADD (2), V_CAT (n), V_UP/V_POOL (1): source values
} Value;

typedef struct {
    char name[48];          // Ultralytics module path, e.g. "model.2.m.0.cv1" (Detect: "model.22.cv2.0.2")
    int cin, cout, k, s;    // Conv2d geometry; padding k/2
    int bn;                 // 1: Conv = Conv2d(no bias) + BN + SiLU; 0: plain Conv2d with bias (Detect output)
    int level, branch;      // Detect output convs: level 0..2 and branch 0 box, 1 cls; else level -1
    int last_use;           // exec index of the last conv that reads this conv's output (eval frees it then)
    int block, block_out;   // recompute blocks (C2f, Detect branch): block id (-1 none), 1 for the
                            // block's output conv, whose z is always kept
    int in;                 // input value
    int H, W, Ho, Wo;       // input and output size for the current input size
    size_t w_off, b_off, g_off;   // offsets into the flat parameter array: weight, bias/beta, gamma
    size_t rs_off;          // offset into the BN buffer array: running mean, then running var
    // the step's state, on whichever backend runs the walk (pointers into its arena)
    float *z;               // (B, Cout, Ho, Wo) pre-BN output, image stride zstride (Detect: into head); FP32,
                            // or FP16 on the device with AMP (then only the address is a float *)
    size_t zstride;         // elements between images in z and dA
    float *mean, *invstd;   // (Cout) statistics used by the last forward
    float *y;               // (B, Cout, Ho, Wo) SiLU(BN(z)) kept from the forward to the conv's backward
                            // (Exec.keep_act: CPU training without recompute), else NULL
    float *dA;              // (B, Cout, Ho, Wo) gradient of the output, live during backward only: FP32, or
                            // FP16 on the device with AMP (Exec.gsz; the Detect outputs' stay FP32, inside
                            // the loss's maps)
    unsigned char *dA_held; // (B / Exec.nb) with Backend.lazy_dA: per image (the device: per batch, its ops
                            // take every image at once), which halves of dA's channels hold a gradient yet
                            // (bit 0: [0, Cout/2), bit 1: [Cout/2, Cout)); else NULL: all of it
    unsigned char dA_held_batch;   // the device's dA_held (its dA lies in device memory)
    float *bsum;            // the device: the BN backward's sums of dA and z (gpu_bn_sums), from the kernel
    long bsum_k;            // that wrote dA, bsum_k per channel (0: none made; bsum NULL: none planned)
} Conv;

// a row of the `yolo info` table, one per yaml layer
typedef struct { char from[16], module[16]; long params; int value, nrep; } LayerRow;

typedef struct {
    char scale;             // 'n', 's', 'm', 'l', 'x'
    int nc;
    int nconv, nvalue, nexec, nlayer;
    Conv conv[MAX_CONVS];   // in Ultralytics state_dict order
    int exec[MAX_CONVS];    // in execution order
    Value val[MAX_VALUES];
    LayerRow layer[YOLO_LAYERS];
    int input;              // value id of the image
    int head_conv[3][2];    // Detect output convs: [level][0 box, 1 cls]
    int has_head;           // 0 for the small graphs the gradient checks build
    int nblock;             // recompute blocks
    int recompute;          // 1: convs inside a block keep no z between forward and backward
    size_t nparams, nbuffers;
    size_t dfl_off;         // the frozen DFL weight (16 values 0..15) inside params
    // memory, set by model_alloc
    int B, H, W;            // batch and input size the arena was planned for
    float *params, *grads;  // (nparams) flat, state_dict order
    float *buffers;         // (nbuffers) BN running mean/var
    float *head[3];         // (B, 64+NC, H_i, W_i) raw Detect maps (in the arena of the backend that ran)
    float *dhead[3];        // same shapes: gradient of the loss w.r.t. the maps
    const float *x;         // (B, 3, H, W) current input of the CPU walk (not owned)
    int train;              // 1: BN uses batch statistics and updates running stats
    int infer;              // 1: no backward will follow: free each z after its last reader
} Model;

typedef struct { char name; double depth, width; int max_ch; } Scale;
static const Scale scales[] = {
        {'n', 0.33, 0.25, 1024}, {'s', 0.33, 0.50, 1024}, {'m', 0.67, 0.75, 768},
        {'l', 1.00, 1.00, 512},  {'x', 1.00, 1.25, 512},
};

// scale_find: "yolov8n", "n", "yolov8n.yaml" -> the scale row, or NULL
static const Scale *scale_find(const char *s) {
    if (strncmp(s, "yolov8", 6) == 0) s += 6;
    if (!s[0] || (s[1] && strcmp(s + 1, ".yaml") != 0)) return NULL;
    for (size_t i = 0; i < sizeof scales / sizeof scales[0]; i++)
        if (scales[i].name == s[0]) return &scales[i];
    return NULL;
}

static int value_new(Model *m, int kind, int C) {
    if (m->nvalue == MAX_VALUES) die("model: too many values");
    Value *v = &m->val[m->nvalue];
    memset(v, 0, sizeof *v);
    v->kind = kind;
    v->C = C;
    return m->nvalue++;
}

// conv_new: declares a conv (in state_dict order) without an input yet; returns its index.
static int conv_new(Model *m, const char *name, int cin, int cout, int k, int s, int bn) {
    if (m->nconv == MAX_CONVS) die("model: too many convs");
    if (k < 1 || k > IM2COL_KMAX || k % 2 == 0)
        die("model: conv '%s': kernel %d (odd, 1..%d supported)", name, k, IM2COL_KMAX);
    Conv *c = &m->conv[m->nconv];
    memset(c, 0, sizeof *c);
    snprintf(c->name, sizeof c->name, "%s", name);
    c->cin = cin; c->cout = cout; c->k = k; c->s = s; c->bn = bn; c->in = -1; c->level = -1; c->block = -1;
    c->w_off = m->nparams;
    m->nparams += (size_t)cout * cin * k * k;
    if (bn) { c->g_off = m->nparams; m->nparams += cout; }
    c->b_off = m->nparams;
    m->nparams += cout;
    if (bn) { c->rs_off = m->nbuffers; m->nbuffers += 2 * (size_t)cout; }
    return m->nconv++;
}

// conv_connect: gives conv ci its input and schedules it; returns its output value.
static int conv_connect(Model *m, int ci, int in) {
    Conv *c = &m->conv[ci];
    if (m->val[in].C != c->cin) die("model: %s expects %d channels, got %d", c->name, c->cin, m->val[in].C);
    c->in = in;
    m->exec[m->nexec++] = ci;
    int v = value_new(m, V_CONV, c->cout);
    m->val[v].conv = ci;
    return v;
}
static int conv_add(Model *m, const char *name, int in, int cout, int k, int s, int bn) {
    return conv_connect(m, conv_new(m, name, m->val[in].C, cout, k, s, bn), in);
}
static int value_cat(Model *m, int n, const int *src) {
    int C = 0;
    for (int i = 0; i < n; i++) C += m->val[src[i]].C;
    int v = value_new(m, V_CAT, C);
    m->val[v].n = n;
    memcpy(m->val[v].src, src, n * sizeof(int));
    return v;
}
static int value_unary(Model *m, int kind, int src) {
    int v = value_new(m, kind, m->val[src].C);
    m->val[v].n = 1;
    m->val[v].src[0] = src;
    return v;
}

// block_mark: convs `in1` and [k0, k1) are the inside of a recompute block whose output is `out`
static void block_mark(Model *m, int in1, int out, int k0, int k1) {
    int id = m->nblock++;
    if (in1 >= 0) m->conv[in1].block = id;
    for (int k = k0; k < k1; k++) m->conv[k].block = id;
    m->conv[out].block = id;
    m->conv[out].block_out = 1;
}

// c2f_add: C2f(c1, c2, n, shortcut) (ultralytics.nn.modules.block.C2f). cv1 1x1 -> split in
// halves y0, y1 -> n Bottlenecks on the last piece -> concat [y0, y1, m0 .. m(n-1)] -> cv2 1x1.
static int c2f_add(Model *m, const char *p, int in, int c2, int n, int shortcut) {
    char nm[48];
    int c = c2 / 2;
    snprintf(nm, sizeof nm, "%s.cv1", p);
    int cv1 = conv_new(m, nm, m->val[in].C, 2 * c, 1, 1, 1);
    snprintf(nm, sizeof nm, "%s.cv2", p);
    int cv2 = conv_new(m, nm, (2 + n) * c, c2, 1, 1, 1);
    int a = conv_connect(m, cv1, in);
    int parts[MAX_CAT];
    if (2 + n > MAX_CAT) die("model: C2f with %d bottlenecks exceeds MAX_CAT", n);
    for (int h = 0; h < 2; h++) {
        parts[h] = value_new(m, V_SLICE, c);
        m->val[parts[h]].conv = m->val[a].conv;
        m->val[parts[h]].c0 = h * c;
    }
    int last = parts[1];
    int first_conv = m->nconv;
    for (int i = 0; i < n; i++) {
        snprintf(nm, sizeof nm, "%s.m.%d.cv1", p, i);
        int t = conv_add(m, nm, last, c, 3, 1, 1);
        snprintf(nm, sizeof nm, "%s.m.%d.cv2", p, i);
        t = conv_add(m, nm, t, c, 3, 1, 1);
        if (shortcut) {
            int s = value_new(m, V_ADD, c);
            m->val[s].n = 2;
            m->val[s].src[0] = last;
            m->val[s].src[1] = t;
            t = s;
        }
        parts[2 + i] = last = t;
    }
    int out = conv_connect(m, cv2, value_cat(m, 2 + n, parts));
    block_mark(m, cv1, cv2, first_conv, m->nconv);
    return out;
}

// sppf_add: SPPF(c1, c2, 5): cv1 1x1 to c1/2, three chained 5x5 max-pools, concat, cv2 1x1.
static int sppf_add(Model *m, const char *p, int in, int c2) {
    char nm[48];
    int c = m->val[in].C / 2;
    snprintf(nm, sizeof nm, "%s.cv1", p);
    int cv1 = conv_new(m, nm, m->val[in].C, c, 1, 1, 1);
    snprintf(nm, sizeof nm, "%s.cv2", p);
    int cv2 = conv_new(m, nm, 4 * c, c2, 1, 1, 1);
    int parts[4];
    parts[0] = conv_connect(m, cv1, in);
    for (int i = 1; i < 4; i++) parts[i] = value_unary(m, V_POOL, parts[i - 1]);
    return conv_connect(m, cv2, value_cat(m, 4, parts));
}

static int ceil8(double x) { return (int)ceil(x / 8.0) * 8; }

// model_build: the YOLOv8 detection graph for a scale and class count (Ultralytics yolov8.yaml, DetectionModel).
// Shapes are set later by model_shape; memory by model_alloc.
static void model_build(Model *m, char scale, int nc) {
    const Scale *sc = NULL;
    for (size_t i = 0; i < sizeof scales / sizeof scales[0]; i++)
        if (scales[i].name == scale) sc = &scales[i];
    if (!sc) die("unknown model scale '%c' (use yolov8n, yolov8s, yolov8m, yolov8l or yolov8x)", scale);
    if (nc < 1 || nc > 10000) die("nc=%d: the number of classes must be 1..10000", nc);
    memset(m, 0, sizeof *m);
    m->scale = scale;
    m->nc = nc;
#define CH(c) ceil8((c < sc->max_ch ? c : sc->max_ch) * sc->width)
#define REP(r) ((r) > 1 ? ((int)lround((r) * sc->depth) > 1 ? (int)lround((r) * sc->depth) : 1) : (r))
    int L[YOLO_LAYERS];
    long pstart = 0;
    m->input = value_new(m, V_INPUT, 3);
    int prev = m->input;
    // one yaml row: records the table row after the layer is built
#define ROW(i, fromstr, mod, rep, expr) do { \
        L[i] = prev = (expr); LayerRow *r_ = &m->layer[i]; \
        snprintf(r_->from, sizeof r_->from, "%s", fromstr); snprintf(r_->module, sizeof r_->module, "%s", mod); \
        r_->params = (long)m->nparams - pstart; pstart = (long)m->nparams; r_->value = prev; r_->nrep = rep; } while (0)
    ROW(0, "-1", "Conv", 1, conv_add(m, "model.0", prev, CH(64), 3, 2, 1));
    ROW(1, "-1", "Conv", 1, conv_add(m, "model.1", prev, CH(128), 3, 2, 1));
    ROW(2, "-1", "C2f", REP(3), c2f_add(m, "model.2", prev, CH(128), REP(3), 1));
    ROW(3, "-1", "Conv", 1, conv_add(m, "model.3", prev, CH(256), 3, 2, 1));
    ROW(4, "-1", "C2f", REP(6), c2f_add(m, "model.4", prev, CH(256), REP(6), 1));
    ROW(5, "-1", "Conv", 1, conv_add(m, "model.5", prev, CH(512), 3, 2, 1));
    ROW(6, "-1", "C2f", REP(6), c2f_add(m, "model.6", prev, CH(512), REP(6), 1));
    ROW(7, "-1", "Conv", 1, conv_add(m, "model.7", prev, CH(1024), 3, 2, 1));
    ROW(8, "-1", "C2f", REP(3), c2f_add(m, "model.8", prev, CH(1024), REP(3), 1));
    ROW(9, "-1", "SPPF", 1, sppf_add(m, "model.9", prev, CH(1024)));
    ROW(10, "-1", "Upsample", 1, value_unary(m, V_UP, prev));
    ROW(11, "[-1, 6]", "Concat", 1, value_cat(m, 2, (int[]){prev, L[6]}));
    ROW(12, "-1", "C2f", REP(3), c2f_add(m, "model.12", prev, CH(512), REP(3), 0));
    ROW(13, "-1", "Upsample", 1, value_unary(m, V_UP, prev));
    ROW(14, "[-1, 4]", "Concat", 1, value_cat(m, 2, (int[]){prev, L[4]}));
    ROW(15, "-1", "C2f", REP(3), c2f_add(m, "model.15", prev, CH(256), REP(3), 0));
    ROW(16, "-1", "Conv", 1, conv_add(m, "model.16", prev, CH(256), 3, 2, 1));
    ROW(17, "[-1, 12]", "Concat", 1, value_cat(m, 2, (int[]){prev, L[12]}));
    ROW(18, "-1", "C2f", REP(3), c2f_add(m, "model.18", prev, CH(512), REP(3), 0));
    ROW(19, "-1", "Conv", 1, conv_add(m, "model.19", prev, CH(512), 3, 2, 1));
    ROW(20, "[-1, 9]", "Concat", 1, value_cat(m, 2, (int[]){prev, L[9]}));
    ROW(21, "-1", "C2f", REP(3), c2f_add(m, "model.21", prev, CH(1024), REP(3), 0));
    // Detect (legacy v8 head): per level a box branch cv2[i] and a class branch cv3[i]
    {
        int ch[3] = {m->val[L[15]].C, m->val[L[18]].C, m->val[L[21]].C}, lv[3] = {L[15], L[18], L[21]};
        int c2 = 16 > ch[0] / 4 ? 16 : ch[0] / 4;
        if (c2 < 4 * REG_MAX) c2 = 4 * REG_MAX;
        int c3 = ch[0] > (nc < 100 ? nc : 100) ? ch[0] : (nc < 100 ? nc : 100);
        char nm[48];
        for (int br = 0; br < 2; br++)
            for (int i = 0; i < 3; i++) {
                int w = br ? c3 : c2, out = br ? nc : 4 * REG_MAX;
                snprintf(nm, sizeof nm, "model.22.cv%d.%d.0", 2 + br, i);
                int t = conv_add(m, nm, lv[i], w, 3, 1, 1);
                snprintf(nm, sizeof nm, "model.22.cv%d.%d.1", 2 + br, i);
                t = conv_add(m, nm, t, w, 3, 1, 1);
                snprintf(nm, sizeof nm, "model.22.cv%d.%d.2", 2 + br, i);
                conv_add(m, nm, t, out, 1, 1, 0);
                m->head_conv[i][br] = m->nconv - 1;
                m->conv[m->nconv - 1].level = i;
                m->conv[m->nconv - 1].branch = br;
                block_mark(m, -1, m->nconv - 1, m->nconv - 3, m->nconv - 1);
            }
        m->dfl_off = m->nparams;
        m->nparams += REG_MAX;
        m->has_head = 1;
        LayerRow *r = &m->layer[DETECT_LAYER];
        snprintf(r->from, sizeof r->from, "[15, 18, 21]");
        snprintf(r->module, sizeof r->module, "Detect");
        r->params = (long)m->nparams - pstart;
        r->value = -1;
        r->nrep = 1;
    }
    m->nlayer = YOLO_LAYERS;
#undef ROW
#undef CH
#undef REP
}

// value_mark_use: records exec index e as a reader of every conv that value vi is made of
static void value_mark_use(Model *m, int vi, int e) {
    const Value *v = &m->val[vi];
    if (v->kind == V_CONV || v->kind == V_SLICE) m->conv[v->conv].last_use = e;
    else if (v->kind != V_INPUT)
        for (int i = 0; i < v->n; i++) value_mark_use(m, v->src[i], e);
}

// model_liveness: last_use of every conv (eval-mode forward frees a z after its last reader)
static void model_liveness(Model *m) {
    for (int i = 0; i < m->nconv; i++) m->conv[i].last_use = m->nexec;   // unread: kept to the end
    for (int e = 0; e < m->nexec; e++) value_mark_use(m, m->conv[m->exec[e]].in, e);
}

// model_shape: sets every value's and conv's spatial size for input H x W (multiples of 32).
static void model_shape(Model *m, int H, int W) {
    if (m->has_head && (H % 32 || W % 32 || H <= 0 || W <= 0))
        die("input size %dx%d must be a positive multiple of 32", H, W);
    m->val[m->input].H = H;
    m->val[m->input].W = W;
    // values are created in topological order, so one pass suffices
    for (int i = 0; i < m->nvalue; i++) {
        Value *v = &m->val[i];
        if (v->kind == V_CONV || v->kind == V_SLICE) {
            Conv *c = &m->conv[v->conv];
            const Value *in = &m->val[c->in];
            c->H = in->H; c->W = in->W;
            c->Ho = (c->H + 2 * (c->k / 2) - c->k) / c->s + 1;
            c->Wo = (c->W + 2 * (c->k / 2) - c->k) / c->s + 1;
            v->H = c->Ho; v->W = c->Wo;
        } else if (v->kind != V_INPUT) {
            const Value *s = &m->val[v->src[0]];
            v->H = s->H * (v->kind == V_UP ? 2 : 1);
            v->W = s->W * (v->kind == V_UP ? 2 : 1);
            for (int j = 1; j < v->n; j++)
                if (m->val[v->src[j]].H != v->H || m->val[v->src[j]].W != v->W)
                    die("model: concat/add of mismatched sizes");
        }
    }
}

// model_init_params: PyTorch default init (kaiming-uniform a=sqrt(5): U(+-1/sqrt(fan_in)) for
// weights and biases), BN gamma 1 beta 0, running mean 0 var 1, then Detect.bias_init
// (box bias 1.0, class bias ln(5 / nc / (640/s)^2)) and the frozen DFL weights 0..15.
static void model_init_params(Model *m, uint64_t seed) {
    Rng r;
    rng_seed(&r, seed);
    for (int i = 0; i < m->nconv; i++) {
        Conv *c = &m->conv[i];
        float bound = 1.f / sqrtf((float)c->cin * c->k * c->k);
        float *w = m->params + c->w_off;
        for (size_t j = 0; j < (size_t)c->cout * c->cin * c->k * c->k; j++) w[j] = (float)rng_range(&r, -bound, bound);
        float *b = m->params + c->b_off;
        for (int j = 0; j < c->cout; j++) b[j] = c->bn ? 0.f : (float)rng_range(&r, -bound, bound);
        if (c->bn) {
            for (int j = 0; j < c->cout; j++) m->params[c->g_off + j] = 1.f;
            for (int j = 0; j < c->cout; j++)
                m->buffers[c->rs_off + j] = 0.f, m->buffers[c->rs_off + c->cout + j] = 1.f;
        }
    }
    static const int strides[3] = {8, 16, 32};
    for (int i = 0; i < 3; i++) {
        Conv *box = &m->conv[m->head_conv[i][0]], *cls = &m->conv[m->head_conv[i][1]];
        for (int j = 0; j < box->cout; j++) m->params[box->b_off + j] = 1.f;
        float cb = logf(5.f / m->nc / ((640.f / strides[i]) * (640.f / strides[i])));
        for (int j = 0; j < cls->cout; j++) m->params[cls->b_off + j] = cb;
    }
    for (int k = 0; k < REG_MAX; k++) m->params[m->dfl_off + k] = (float)k;
}

// model_flops: Ultralytics' GFLOPs figure (thop on a 32x32 input, x2, x(imgsz/32)^2): conv MACs
// plus 4 per BN output element (thop's count for BatchNorm2d). fused=1 leaves out the BN term.
static double model_flops(Model *m, int imgsz, int fused) {
    model_shape(m, 32, 32);
    double macs = 0;
    for (int i = 0; i < m->nconv; i++) {
        Conv *c = &m->conv[i];
        double out = (double)c->cout * c->Ho * c->Wo;
        macs += out * c->cin * c->k * c->k;
        if (c->bn && !fused) macs += 4 * out;
    }
    macs += 4.0 * REG_MAX * (16 + 4 + 1);   // the DFL 1x1 conv over the 21 anchors of a 32x32 input
    return 2 * macs * (imgsz / 32.0) * (imgsz / 32.0) / 1e9;
}

// ------------------------------------------------------------------------------------------
// model: the graph walk (forward, backward, views, recompute), once for the CPU and the device
// ------------------------------------------------------------------------------------------
/*
 * The walk below is the only code that visits the network: forward, backward, materialising a
 * value (a view) into a buffer, back-propagating into a value's convs, dropping and recomputing
 * a block. Every computation in it is a call into a Backend: the CPU's (cpu_backend, further
 * down: FP32, views one image at a time, convolutions as GEMMs over the batch) or the device's
 * (gpu_backend, in the GPU section: the whole batch per launch, FP16 or FP32 activations). The
 * state of a step lives in the Model whichever backend runs it: each Conv's z, mean, invstd and
 * dA, and the head maps.
 * Both backends allocate from their arena in the same order, so one dry run of this walk plans
 * either side's memory (model_plan on the CPU, gpu_plan_run on the device).
 *
 * Flags: m->train selects BN's batch statistics (and running-stat updates); m->infer says no
 * backward follows, so each z is freed after its last reader and recompute blocks keep nothing.
 */
typedef struct Backend Backend;
struct LossOut;
struct LossTargets;
struct LossConfig;

// Exec: one walk and what it runs on (built per call: exec_cpu, exec_gpu)
typedef struct {
    const Backend *be;
    Model *m;                 // the graph, its shapes and the step's state
    Arena *a;                 // the backend's arena; base NULL in a dry run
    float *params, *grads;    // (nparams) the backend's weights and gradients (FP32)
    float *buffers;           // (nbuffers) its BN running mean/var
    const void *x;            // (B, 3, H, W) the input in the backend's memory and activation type
    int nb;                   // images per op call: 1 (CPU, called for b = 0..B-1) or B (device, b = 0)
    int esz;                  // bytes of an activation value: 4 (FP32) or 2 (device FP16)
    void *ctx;                // the backend's own state (the device's Gpu)
    int keep_act;             // keep each BN conv's activation (Conv.y) instead of recomputing it per reader
    int gsz;                  // bytes of a gradient value (dA, the views' gradients): 4, or 2 (device AMP)
} Exec;

// Backend: the computations the walk asks for. Tensors are nb images from image b; an image
// stride (os, ts, gs, ds, ys) is the distance in elements between two images of a buffer.
// Activations are of the backend's activation type (esz bytes); gradients of values (dA and what
// value_backprop carries) of its gradient type (gsz bytes: FP32, FP16 on the device with AMP; only
// the address is a float * then); weight gradients are FP32.
struct Backend {
    // called only when the arena is real
    void (*zero)(Exec *e, void *p, size_t bytes);                               // p = 0
    void (*input)(Exec *e, int b, void *out, long os, long n);                  // the input image, n values
    // SiLU(BN(z)) of conv c's channels c0..c0+C into out, or added to it (acc: a residual sum, V_ADD)
    void (*act)(Exec *e, const Conv *c, int c0, int C, int b, void *out, long os, int acc);
    // the sum of two such activations (of c1's channels from c10, of c2's from c20) into out, in one
    // pass: a residual sum of two BN convs, the bits of act (c1) then act (c2, acc) (NULL: those two)
    void (*act_sum)(Exec *e, const Conv *c1, int c10, const Conv *c2, int c20, int C, int b, void *out, long os);
    void (*add)(Exec *e, const void *t, long ts, void *out, long os, long n);    // out += t (residual)
    void (*upsample)(Exec *e, const void *x, void *y, long ys, int C, int H, int W);     // nearest x2
    // the activation of BN conv c's channels c0..c0+C upsampled x2 into out, in one pass (NULL: act
    // into a temporary, then upsample)
    void (*act_upsample)(Exec *e, const Conv *c, int c0, int C, void *out, long os);
    // 5x5, stride 1: x (image stride xs: a part of a concatenation, SPPF's) into y
    void (*maxpool)(Exec *e, const void *x, long xs, void *y, long ys, int C, int H, int W);
    void (*grad_add)(Exec *e, const float *g, long gs, float *d, long ds, long n);       // d += g
    void (*grad_copy)(Exec *e, const float *g, long gs, float *d, long ds, long n);      // d = g (lazy_dA)
    // d.p[j] += g (= where bit j of d.set) for j < d.k, g read once: a residual sum's gradient into
    // the convs it adds (NULL: grad_add or grad_copy each)
    void (*grad_add_n)(Exec *e, const float *g, long gs, AddDst d, long n);
    void (*upsample_back)(Exec *e, const float *g, long gs, float *gx, int C, int H, int W);   // gx (C, H, W) dense
    // called in dry runs too (their temporaries come from e->a): they compute only when it is real
    void (*maxpool_back)(Exec *e, const void *x, long xs, const float *g, long gs, float *gx, int C, int H, int W);
    void (*conv)(Exec *e, Conv *c);            // c->z = conv(input); Detect outputs: + bias, into the head map
    void (*bn_stats)(Exec *e, Conv *c);        // c->mean, c->invstd: batch (m->train, running stats updated) or running
    void (*conv_stats)(Exec *e, Conv *c);      // conv, then bn_stats, in one (NULL: the two hooks above)
    void *(*bn_backward)(Exec *e, Conv *c);    // dz from c->dA through BN and SiLU, dgamma/dbeta (or bias) +=
    void (*conv_grads)(Exec *e, Conv *c, void *dz);   // weight gradient += and the input value's gradient
    struct LossOut (*loss)(Exec *e, const struct LossTargets *tg, const struct LossConfig *lcfg);   // + m->dhead
    // lazy_dA: a conv's dA is not zeroed when it is made: its first gradient is written into it,
    // later ones added (dA_held), and what nothing wrote is zeroed before its backward (dA_complete).
    // For a backend whose conv_grads asks dA_held (both: on the device this saves each dA's zeroing
    // and its first writer's read of the zeros, 4 bytes a value in FP16)
    int lazy_dA;
};

static void value_materialize(Exec *e, int vi, int b, void *out, long os);
static void value_backprop(Exec *e, int vi, int b, const float *g, long gs);
static void par_copy(void *dst, const void *src, size_t bytes);

// walk_act / walk_f32: a buffer of n activation-typed / FP32 values from the walk's arena
static void *walk_act(Exec *e, long n, int group) { return arena_alloc(e->a, (size_t)n * e->esz, group); }
static float *walk_f32(Exec *e, long n, int group) {
    return (float *)arena_alloc(e->a, (size_t)n * sizeof(float), group);
}
// walk_grad: a buffer of n gradient values (gsz bytes each); grad_at: gradient buffer p + off values
static float *walk_grad(Exec *e, long n, int group) {
    return (float *)arena_alloc(e->a, (size_t)n * e->gsz, group);
}
static float *grad_at(const Exec *e, const float *p, long off) { return (float *)((char *)p + off * e->gsz); }
// walk_dA: conv c's gradient buffer dA (B, Cout, Ho, Wo) of the walk's gradient type, created on
// first use: zeroed, or with Backend.lazy_dA its dA_held flags all clear (then every writer asks
// dA_held): on the CPU B of them after dA (host memory, one an image), where ops take the whole batch
// (the device, whose dA is device memory; a batch of 1 anywhere) one, in the Conv
static float *walk_dA(Exec *e, Conv *c) {
    if (!c->dA) {
        size_t bytes = (size_t)e->m->B * c->zstride * e->gsz;
        int lazy = e->be->lazy_dA, host = lazy && e->nb < e->m->B;
        c->dA = arena_alloc(e->a, bytes + (host ? (size_t)e->m->B : 0), G_BACKWARD);
        c->dA_held = !lazy ? NULL : host ? (unsigned char *)c->dA + bytes : &c->dA_held_batch;
        if (!arena_dry(e->a) && c->dA_held) memset(c->dA_held, 0, (size_t)e->m->B / e->nb);
        else if (!arena_dry(e->a)) e->be->zero(e, c->dA, bytes);
    }
    return c->dA;
}
// dA_fill: zero the channel halves of c's dA that are in mask and not held yet for images b ..
// b + nb - 1 (flag b / nb), and hold them
static void dA_fill(Exec *e, Conv *c, int b, unsigned mask) {
    int h = c->cout / 2;
    size_t HW = (size_t)c->Ho * c->Wo;
    unsigned char *held = &c->dA_held[b / e->nb];
    for (int k = 0; k < 2; k++)
        if ((mask & ~*held) >> k & 1)
            for (int i = b; i < b + e->nb; i++)
                e->be->zero(e, grad_at(e, c->dA, (long)i * c->zstride + (long)(k ? h : 0) * HW),
                            (k ? c->cout - h : h) * HW * e->gsz);
    *held |= mask;
}
// dA_held: whether image b's channels [c0, c0 + C) of c's dA (made by walk_dA) already hold a
// gradient, to be added to; 0: they do not, the caller writes its gradient there (all of that
// range). Either way they hold one after the call. Ranges other than a half or the whole are added
// into, after zeroing the halves they overlap. Without lazy_dA (or a head conv's dA, the loss's
// maps), and in a dry run, always 1. Not thread safe for one image: ask before a parallel region.
static int dA_held(Exec *e, Conv *c, int b, int c0, int C) {
    if (!c->dA_held || arena_dry(e->a)) return 1;
    int h = c->cout / 2;
    unsigned want = c0 == 0 && C == c->cout ? 3u : c0 == 0 && C == h ? 1u : c0 == h && C == c->cout - h ? 2u : 0u;
    if (want && !(c->dA_held[b / e->nb] & want)) {
        c->dA_held[b / e->nb] |= want;
        return 0;
    }
    dA_fill(e, c, b, want ? want : (c0 < h ? 1u : 0u) | (c0 + C > h ? 2u : 0u));
    return 1;
}
// dA_complete: before c's backward, zero what no reader wrote (an output nobody read)
static void dA_complete(Exec *e, Conv *c) {
    for (int b = 0; c->dA_held && !arena_dry(e->a) && b < e->m->B; b += e->nb) dA_fill(e, c, b, 3u);
}
// walk_head_bytes: bytes of head map i, (B, 64+NC, H_i, W_i) FP32
static size_t walk_head_bytes(const Model *m, int i) {
    const Conv *box = &m->conv[m->head_conv[i][0]];
    return (size_t)m->B * (REG_MAX * 4 + m->nc) * box->Ho * box->Wo * sizeof(float);
}

// cat_pool_chain: whether part i of concatenation v is the max-pool of part i - 1 (SPPF's cat of
// x, m(x), m(m(x)), m(m(m(x)))) and is made from it. Then the cat materialises in one pool per
// part, each reading the part before it where it was just written (recursing into each part's
// sources took 6 pools and 4 activations of x for SPPF's 3 pools), and its backward runs down the
// chain once: dx = g0 + back1(g1 + back2(g2 + back3(g3))), 3 pool backwards instead of 6. (The
// pools take their input with an image stride: the device's ops take the whole batch, whose parts
// lie strided in the concatenation.)
static int cat_pool_chain(const Exec *e, const Value *v, int i) {
    const Value *s = &e->m->val[v->src[i]];
    return i > 0 && s->kind == V_POOL && s->src[0] == v->src[i - 1];
}
// cat_chain_start: the part k of concatenation v that begins its chain of pools (parts k+1..n-1 each
// the pool of the one before), or v->n where its last part is not such a pool
static int cat_chain_start(const Exec *e, const Value *v) {
    int k = v->n;
    while (k > 1 && cat_pool_chain(e, v, k - 1)) k--;
    return k < v->n ? k - 1 : k;
}

static void value_materialize(Exec *e, int vi, int b, void *out, long os);
// slice_run_end: the end j of the run of parts [i, j) < i1 of concatenation v that continue part i's
// conv with slices of its channels that follow on (a C2f's two halves of cv1); *C their channels
static int slice_run_end(const Model *m, const Value *v, int i, int i1, int *C) {
    const Value *s = &m->val[v->src[i]];
    int j = i + 1, c0 = s->kind == V_SLICE ? s->c0 : 0;
    *C = s->C;
    for (; j < i1; j++) {
        const Value *t = &m->val[v->src[j]];
        if (t->kind != V_SLICE || t->conv != s->conv || t->c0 != c0 + *C) break;
        *C += t->C;
    }
    return j;
}
// cat_materialize: parts [i0, i1) of concatenation v (nb images from image b) into out, part i0 first
// (image stride os); a part that is the pool of the one just written here is pooled from it, and
// slices of one conv whose channels follow on (a C2f's two halves of cv1) are activated in one call
static void cat_materialize(Exec *e, const Value *v, int b, int i0, int i1, void *out, long os) {
    const Model *m = e->m;
    long off = 0, prev = 0;
    for (int i = i0; i < i1; i++) {
        const Value *s = &m->val[v->src[i]];
        void *o = (char *)out + off * e->esz;
        int C = s->C, j = s->kind == V_SLICE ? slice_run_end(m, v, i, i1, &C) : i + 1;
        if (i > i0 && cat_pool_chain(e, v, i)) {   // (SPPF)
            if (!arena_dry(e->a)) e->be->maxpool(e, (char *)out + prev * e->esz, os, o, os, s->C, s->H, s->W);
        } else if (j > i + 1) {
            if (!arena_dry(e->a)) e->be->act(e, &m->conv[s->conv], s->c0, C, b, o, os, 0);
            i = j - 1;   // (prev: the run's last part, which a pool after it would read)
            off += (long)(C - m->val[v->src[i]].C) * v->H * v->W;
            C = m->val[v->src[i]].C;
        } else value_materialize(e, v->src[i], b, o, os);
        prev = off;
        off += (long)C * v->H * v->W;
    }
}

// value_materialize: value vi of nb images from image b, (C, H, W) each, into out (image stride os).
// Views recurse into their sources; temporaries come from the arena (planned like everything).
static void value_materialize(Exec *e, int vi, int b, void *out, long os) {
    const Model *m = e->m;
    const Value *v = &m->val[vi];
    int dry = arena_dry(e->a);
    long n = (long)v->C * v->H * v->W;
    switch (v->kind) {
    case V_INPUT:
        if (!dry) e->be->input(e, b, out, os, n);
        break;
    case V_CONV:
    case V_SLICE:
        if (!dry) e->be->act(e, &m->conv[v->conv], v->kind == V_SLICE ? v->c0 : 0, v->C, b, out, os, 0);
        break;
    case V_ADD: {
        const Value *s0 = &m->val[v->src[0]], *s1 = &m->val[v->src[1]];
        if (e->be->act_sum && (s0->kind == V_CONV || s0->kind == V_SLICE) &&
            (s1->kind == V_CONV || s1->kind == V_SLICE)) {   // (both activations in one pass)
            if (!dry)
                e->be->act_sum(e, &m->conv[s0->conv], s0->kind == V_SLICE ? s0->c0 : 0, &m->conv[s1->conv],
                               s1->kind == V_SLICE ? s1->c0 : 0, v->C, b, out, os);
            break;
        }
        value_materialize(e, v->src[0], b, out, os);
        if (s1->kind == V_CONV || s1->kind == V_SLICE) {   // (a Bottleneck: the sum made as cv2's output is)
            if (!dry) e->be->act(e, &m->conv[s1->conv], s1->kind == V_SLICE ? s1->c0 : 0, s1->C, b, out, os, 1);
            break;
        }
        void *t = walk_act(e, e->nb * n, G_SCRATCH);         // (nb, C, H, W)
        value_materialize(e, v->src[1], b, t, n);
        if (!dry) e->be->add(e, t, n, out, os, n);
        arena_free(e->a, t);
        break;
    }
    case V_CAT:
        cat_materialize(e, v, b, 0, v->n, out, os);
        break;
    case V_UP:
    case V_POOL: {
        const Value *s = &m->val[v->src[0]];
        long ns = (long)s->C * s->H * s->W;
        if (v->kind == V_UP && e->be->act_upsample && (s->kind == V_CONV || s->kind == V_SLICE) &&
            m->conv[s->conv].bn) {
            if (!dry) e->be->act_upsample(e, &m->conv[s->conv], s->kind == V_SLICE ? s->c0 : 0, s->C, out, os);
            break;
        }
        void *t = walk_act(e, e->nb * ns, G_SCRATCH);         // (nb, C, Hs, Ws)
        value_materialize(e, v->src[0], b, t, ns);
        if (!dry) {
            if (v->kind == V_UP) e->be->upsample(e, t, out, os, s->C, s->H, s->W);
            else e->be->maxpool(e, t, ns, out, os, s->C, s->H, s->W);
        }
        arena_free(e->a, t);
        break;
    }
    }
}

// add_leaves: the number of values residual sum vi adds (nested sums followed; value_backprop's
// order), k of them counted before; -1 where one is not a conv output or a slice of one, or where
// they are more than ADD_DST_MAX
static int add_leaves(const Model *m, int vi, int k) {
    const Value *v = &m->val[vi];
    if (v->kind == V_ADD) {
        k = add_leaves(m, v->src[0], k);
        return k < 0 ? k : add_leaves(m, v->src[1], k);
    }
    return (v->kind == V_CONV || v->kind == V_SLICE) && k < ADD_DST_MAX ? k + 1 : -1;
}
// add_dsts: the dA slices (image b on) of the values add_leaves counts, into d in that order; with
// lazy_dA those no gradient reached yet are written (d->set)
static void add_dsts(Exec *e, int vi, int b, AddDst *d) {
    const Value *v = &e->m->val[vi];
    if (v->kind == V_ADD) {
        add_dsts(e, v->src[0], b, d);
        add_dsts(e, v->src[1], b, d);
        return;
    }
    Conv *c = &e->m->conv[v->conv];
    long c0 = v->kind == V_SLICE ? v->c0 : 0;
    d->p[d->k] = grad_at(e, walk_dA(e, c), (long)b * c->zstride + c0 * v->H * v->W);
    if (!arena_dry(e->a) && !dA_held(e, c, b, (int)c0, v->C)) d->set |= 1u << d->k;
    d->s[d->k++] = (long)c->zstride;
}

static void value_backprop(Exec *e, int vi, int b, const float *g, long gs);
// cat_chain_backprop: the gradient of a chain of pools in concatenation v (cat_pool_chain: x = part k,
// its pools parts k+1..n-1; SPPF's) into x's sources. g1: the gradients of parts k+1..n-1 (part
// k+1's first, each x's size, images gs apart); g0: x's own part's (same stride), or NULL where x
// has had it already. The pools' inputs (parts k..n-2) are made once, then the gradient carried
// down: acc = g[n-1]; for each pool from the last, acc = g[i-1] + back_i(acc); x gets acc. (nb
// images: the inputs image by image, np parts each; acc dense.)
static void cat_chain_backprop(Exec *e, const Value *v, int b, int k, const float *g1, long gs, const float *g0) {
    const Model *m = e->m;
    const Value *x = &m->val[v->src[k]];
    int dry = arena_dry(e->a), np = v->n - 1 - k;              // pools
    long ns = (long)x->C * x->H * x->W;
    char *xin = walk_act(e, e->nb * np * ns, G_SCRATCH);       // parts k..n-2, (nb, np * ns)
    float *acc[2] = {walk_grad(e, e->nb * ns, G_SCRATCH), walk_grad(e, e->nb * ns, G_SCRATCH)};
    cat_materialize(e, v, b, k, v->n - 1, xin, np * ns);
    const float *gi = grad_at(e, g1, (long)(np - 1) * ns);    // the last part's gradient
    long gis = gs;
    for (int i = np; i > 0; i--) {                               // pool i: input part k+i-1, output part k+i
        float *d = acc[i & 1];
        const float *gp = i > 1 ? grad_at(e, g1, (long)(i - 2) * ns) : g0;   // part k+i-1's gradient
        e->be->maxpool_back(e, xin + (i - 1) * ns * e->esz, np * ns, gi, gis, d, x->C, x->H, x->W);
        if (!dry && gp) e->be->grad_add(e, gp, gs, d, ns, ns);
        gi = d, gis = ns;
    }
    value_backprop(e, v->src[k], b, gi, gis);
    arena_free(e->a, acc[1]);
    arena_free(e->a, acc[0]);
    arena_free(e->a, xin);
}

// value_backprop: adds g, the gradient w.r.t. value vi of nb images from image b ((C, H, W) each,
// of the walk's gradient type, image stride gs), into the dA of the convs the value is made of.
static void value_backprop(Exec *e, int vi, int b, const float *g, long gs) {
    Model *m = e->m;
    const Value *v = &m->val[vi];
    int dry = arena_dry(e->a), HW = v->H * v->W;
    switch (v->kind) {
    case V_INPUT:
        break;
    case V_CONV:
    case V_SLICE: {
        Conv *c = &m->conv[v->conv];
        int c0 = v->kind == V_SLICE ? v->c0 : 0;
        float *d = grad_at(e, walk_dA(e, c), (long)b * c->zstride + (long)c0 * HW);
        if (!dry && dA_held(e, c, b, c0, v->C)) e->be->grad_add(e, g, gs, d, (long)c->zstride, (long)v->C * HW);
        else if (!dry) e->be->grad_copy(e, g, gs, d, (long)c->zstride, (long)v->C * HW);   // (lazy_dA: the first)
        break;
    }
    case V_ADD: {
        AddDst d = {{0}, {0}, 0, 0};
        if (e->be->grad_add_n && add_leaves(m, vi, 0) > 0) {
            add_dsts(e, vi, b, &d);
            if (!dry) e->be->grad_add_n(e, g, gs, d, (long)v->C * HW);
            break;
        }
        value_backprop(e, v->src[0], b, g, gs);
        value_backprop(e, v->src[1], b, g, gs);
        break;
    }
    case V_CAT: {
        int k = cat_chain_start(e, v);   // parts k+1..n-1: a chain of pools from part k, else k = n
        long off = 0;
        for (int i = 0; i < k; i++) {
            value_backprop(e, v->src[i], b, grad_at(e, g, off), gs);
            off += (long)m->val[v->src[i]].C * HW;
        }
        if (k == v->n) break;
        long ns = (long)m->val[v->src[k]].C * HW;
        cat_chain_backprop(e, v, b, k, grad_at(e, g, off + ns), gs, grad_at(e, g, off));
        break;
    }
    case V_UP:
    case V_POOL: {
        const Value *s = &m->val[v->src[0]];
        long ns = (long)s->C * s->H * s->W;
        float *gx = walk_grad(e, e->nb * ns, G_SCRATCH);      // (nb, C, Hs, Ws)
        if (v->kind == V_UP) {
            if (!dry) e->be->upsample_back(e, g, gs, gx, s->C, s->H, s->W);
        } else {   // the window argmax, found again from the input as the forward saw it
            void *x = walk_act(e, e->nb * ns, G_SCRATCH);
            value_materialize(e, v->src[0], b, x, ns);
            e->be->maxpool_back(e, x, ns, g, gs, gx, s->C, s->H, s->W);
            arena_free(e->a, x);
        }
        value_backprop(e, v->src[0], b, gx, ns);
        arena_free(e->a, gx);
        break;
    }
    }
}

// conv_forward: z = conv(input) for the whole batch, then the BN statistics, except when
// recomputing (the statistics of the forward stand).
static void conv_forward(Exec *e, Conv *c, int recomputing) {
    if (c->bn && !recomputing && e->be->conv_stats) {
        e->be->conv_stats(e, c);
        return;
    }
    e->be->conv(e, c);
    if (c->bn && !recomputing) e->be->bn_stats(e, c);
}

// conv_backward: from dA (gradient of the activated output) through BN and SiLU (recomputed from
// z) to dz, then the weight gradient and the input value's gradient.
static void conv_backward(Exec *e, Conv *c) {
    walk_dA(e, c);   // an output nobody read: zero
    dA_complete(e, c);
    void *dz = e->be->bn_backward(e, c);
    e->be->conv_grads(e, c, dz);
    if (dz != (void *)c->dA) arena_free(e->a, dz);
}

// block_drop / block_recompute: recompute=1. After a block's forward its inner convs give their
// z back; before the block's backward they are computed again from the block input with the
// batch statistics of the forward, so the result is bit-identical to keeping them.
static void block_drop(Exec *e, int block) {
    Model *m = e->m;
    for (int k = 0; k < m->nexec; k++) {
        Conv *c = &m->conv[m->exec[k]];
        if (c->block == block && !c->block_out) arena_free(e->a, c->z), c->z = NULL;
    }
}
static void block_recompute(Exec *e, int block) {
    Model *m = e->m;
    for (int k = 0; k < m->nexec; k++) {
        Conv *c = &m->conv[m->exec[k]];
        if (c->block != block || c->block_out) continue;
        c->z = walk_act(e, (long)m->B * c->zstride, G_ACTS);
        conv_forward(e, c, 1);
    }
}

// walk_forward: the whole network on e->x at the model's shape (m->B, model_shape); leaves the
// three raw Detect maps in m->head. Allocates what backward needs (freed by walk_backward, or by
// walk_release after a forward with m->infer).
static void walk_forward(Exec *e) {
    Model *m = e->m;
    for (int i = 0; i < 3 && m->has_head; i++) {
        m->head[i] = (float *)arena_alloc(e->a, walk_head_bytes(m, i), G_ACTS);
        m->dhead[i] = NULL;
    }
    for (int k = 0; k < m->nexec; k++) {
        Conv *c = &m->conv[m->exec[k]];
        int HWo = c->Ho * c->Wo;
        c->dA = c->y = NULL;
        c->mean = c->invstd = NULL;
        if (c->level >= 0) {   // a Detect output conv writes its channels of the level's map
            c->zstride = (size_t)(REG_MAX * 4 + m->nc) * HWo;
            c->z = m->head[c->level] + (c->branch ? (size_t)REG_MAX * 4 * HWo : 0);
        } else {
            c->zstride = (size_t)c->cout * HWo;
            c->z = walk_act(e, (long)m->B * c->zstride, G_ACTS);
        }
        if (c->bn) {
            c->mean = walk_f32(e, 2 * (long)c->cout, G_ACTS);
            c->invstd = c->mean + c->cout;
        }
        conv_forward(e, c, 0);
        if (e->keep_act && c->bn) {   // the activation, made once for every reader and the backward
            void *y = walk_act(e, (long)m->B * c->zstride, G_ACTS);
            if (!arena_dry(e->a))
                for (int b = 0; b < m->B; b += e->nb)
                    e->be->act(e, c, 0, c->cout, b, (char *)y + (size_t)b * c->zstride * e->esz, (long)c->zstride, 0);
            c->y = y;
        }
        if (m->recompute && !m->infer && c->block_out) block_drop(e, c->block);
        if (m->infer)   // no backward follows: free each z after its last reader
            for (int j = 0; j < m->nconv; j++) {
                Conv *d = &m->conv[j];
                if (d->last_use == k && d->level < 0 && d->z) {
                    arena_free(e->a, d->z);
                    arena_free(e->a, d->mean);
                    d->z = d->mean = d->invstd = NULL;
                }
            }
    }
}

// walk_head_grad: the gradient buffers of the three head maps and the Detect output convs' dA inside
// them; the loss writes them, walk_backward consumes and frees them. The loss (loss_forward_backward,
// loss_cuda) writes every value of them, background anchors' box logits included, so they are zeroed
// only where no loss will run (zero: a step without targets; on the device that memset was 77 MB at
// 640 batch 16).
static void walk_head_grad(Exec *e, int zero) {
    Model *m = e->m;
    for (int i = 0; i < 3; i++) {
        const Conv *box = &m->conv[m->head_conv[i][0]];
        size_t bytes = walk_head_bytes(m, i);
        m->dhead[i] = (float *)arena_alloc(e->a, bytes, G_BACKWARD);
        if (zero && !arena_dry(e->a)) e->be->zero(e, m->dhead[i], bytes);
        for (int j = 0; j < 2; j++)
            m->conv[m->head_conv[i][j]].dA = m->dhead[i] + (j ? (size_t)REG_MAX * 4 * box->Ho * box->Wo : 0);
    }
}

// walk_backward: gradients of all parameters (accumulated into e->grads) from m->dhead; frees
// every buffer walk_forward and walk_head_grad allocated, in reverse order.
static void walk_backward(Exec *e) {
    Model *m = e->m;
    for (int k = m->nexec - 1; k >= 0; k--) {
        Conv *c = &m->conv[m->exec[k]];
        if (m->recompute && c->block_out) block_recompute(e, c->block);
        conv_backward(e, c);
        arena_free(e->a, c->y);   // its readers' backwards came first
        if (c->level < 0) {
            arena_free(e->a, c->dA);
            arena_free(e->a, c->mean);
            arena_free(e->a, c->z);
        }
        c->dA = c->z = c->mean = c->invstd = c->y = NULL;
        c->dA_held = NULL;
    }
    for (int i = 2; i >= 0 && m->has_head; i--) {
        arena_free(e->a, m->dhead[i]);
        arena_free(e->a, m->head[i]);
        m->dhead[i] = m->head[i] = NULL;
    }
}

// walk_release: frees what a forward allocated when no backward follows, in reverse order
static void walk_release(Exec *e) {
    Model *m = e->m;
    for (int k = m->nexec - 1; k >= 0; k--) {
        Conv *c = &m->conv[m->exec[k]];
        arena_free(e->a, c->y);
        if (c->level < 0) {
            arena_free(e->a, c->mean);
            arena_free(e->a, c->z);
        }
        c->z = c->mean = c->invstd = c->y = NULL;
    }
    for (int i = 2; i >= 0 && m->has_head; i--) {
        arena_free(e->a, m->head[i]);
        m->head[i] = NULL;
    }
}

// ------------------------------------------------------------------------------------------
// model: the CPU backend (FP32) and the CPU entry points
// ------------------------------------------------------------------------------------------

// par_copy / par_zero: memcpy / memset of large buffers split over the threads (a single thread
// does not reach the memory bandwidth of the machine, and the others would only wait)
#define PAR_CHUNK (1 << 16)   // bytes per piece
static void par_copy(void *dst, const void *src, size_t bytes) {
    long n = (long)((bytes + PAR_CHUNK - 1) / PAR_CHUNK);
#pragma omp parallel for if (n > 4)
    for (long i = 0; i < n; i++) {
        size_t o = (size_t)i * PAR_CHUNK;
        memcpy((char *)dst + o, (const char *)src + o, bytes - o < PAR_CHUNK ? bytes - o : PAR_CHUNK);
    }
}
static void par_zero(void *dst, size_t bytes) {
    long n = (long)((bytes + PAR_CHUNK - 1) / PAR_CHUNK);
#pragma omp parallel for if (n > 4)
    for (long i = 0; i < n; i++) {
        size_t o = (size_t)i * PAR_CHUNK;
        memset((char *)dst + o, 0, bytes - o < PAR_CHUNK ? bytes - o : PAR_CHUNK);
    }
}

// The CPU's views: one image (nb = 1), so the image strides are not needed.
static void cpu_input(Exec *e, int b, void *out, long os, long n) {
    (void)os;
    par_copy(out, (const float *)e->x + (size_t)b * n, (size_t)n * sizeof(float));
}
// cpu_act: channels [c0, c0+C) of conv c's activated output for image b, (C, Ho, Wo); acc: added
// to out, the activation made in runs of 256 values of a channel (bn_silu_run's groups of 8 fall
// where they would in the whole channel: the same bits as making it into a buffer, then cpu_add)
static void cpu_act(Exec *e, const Conv *c, int c0, int C, int b, void *out, long os, int acc) {
    (void)os;
    int HW = c->Ho * c->Wo;
    const float *y = c->y ? c->y + (size_t)b * c->zstride + (size_t)c0 * HW : NULL;   // kept by the forward
    const float *z = c->z ? c->z + (size_t)b * c->zstride + (size_t)c0 * HW : NULL;
    if (acc) {
        float *o = out;
        long runs = (HW + 255) / 256;
#pragma omp parallel for if ((long)C * HW > OMP_MIN_WORK)
        for (long r = 0; r < C * runs; r++) {
            int ch = (int)(r / runs), i0 = (int)(r % runs) * 256, len = HW - i0 < 256 ? HW - i0 : 256;
            size_t at = (size_t)ch * HW + i0;
            float t[256];
            const float *a = y ? y + at : z + at;   // (without BN the output is z itself)
            if (!y && c->bn) {   // (bn_silu_forward_cpu's fold and loop, without its parallel region)
                float sc = e->params[c->g_off + c0 + ch] * c->invstd[c0 + ch];
                bn_silu_run(z + at, sc, e->params[c->b_off + c0 + ch] - c->mean[c0 + ch] * sc, t, len);
                a = t;
            }
            for (int i = 0; i < len; i++) o[at + i] += a[i];
        }
        return;
    }
    if (y) {
        par_copy(out, y, (size_t)C * HW * sizeof(float));
        return;
    }
    if (c->bn)
        bn_silu_forward_cpu(z, c->mean + c0, c->invstd + c0, e->params + c->g_off + c0, e->params + c->b_off + c0,
                            out, 1, C, HW);
    else
        par_copy(out, z, (size_t)C * HW * sizeof(float));
}
static void cpu_add(Exec *e, const void *t, long ts, void *out, long os, long n) {
    (void)e, (void)ts, (void)os;
    const float *tf = t;
    float *o = out;
#pragma omp parallel for if (n > OMP_MIN_WORK)
    for (long i = 0; i < n; i++) o[i] += tf[i];
}
static void cpu_upsample(Exec *e, const void *x, void *y, long ys, int C, int H, int W) {
    (void)e, (void)ys;
    upsample2_forward_cpu(x, y, 1, C, H, W);
}
static void cpu_maxpool(Exec *e, const void *x, long xs, void *y, long ys, int C, int H, int W) {
    (void)e, (void)xs, (void)ys;
    maxpool5_forward_cpu(x, y, 1, C, H, W);
}
static void cpu_zero(Exec *e, void *p, size_t bytes) { (void)e, par_zero(p, bytes); }
static void cpu_grad_copy(Exec *e, const float *g, long gs, float *d, long ds, long n) {
    (void)gs, (void)ds;
    par_copy(d, g, (size_t)n * e->gsz);   // (one image)
}
static void cpu_grad_add(Exec *e, const float *g, long gs, float *d, long ds, long n) {
    (void)e, (void)gs, (void)ds;
#pragma omp parallel for if (n > OMP_MIN_WORK)
    for (long i = 0; i < n; i++) d[i] += g[i];
}
static void cpu_upsample_back(Exec *e, const float *g, long gs, float *gx, int C, int H, int W) {
    (void)e, (void)gs;
    upsample2_backward(g, gx, 1, C, H, W);
}
static void cpu_maxpool_back(Exec *e, const void *x, long xs, const float *g, long gs, float *gx, int C, int H,
                             int W) {
    (void)xs, (void)gs;
    if (!arena_dry(e->a)) maxpool5_backward(x, g, gx, 1, C, H, W);
}

// bn_stats_cpu: per-channel batch statistics of a conv output (train: mean, 1/sqrt(biased var +
// eps), running stats updated with the unbiased variance, momentum 0.03; eval: from the running
// stats). z (B, C, HW) with image stride zs; mean, invstd, rm, rv (C). Twin of bn_stats_cuda.
// The per-channel sums of the BN kernels are taken in double over 8 lanes (element i of a row goes
// to lane i % 8; the lanes are added in order at the end): the loops vectorise, and the order of
// the sums depends on the shape only, not on the thread count.
#define LANES 8   // (= the 8 lanes of gemm_v8)
typedef double lanes_vd __attribute__((vector_size(LANES * sizeof(double))));
static double lanes_total(const double l[LANES]) {
    double t = 0;
    for (int j = 0; j < LANES; j++) t += l[j];
    return t;
}
// lanes_sum: l += x[0..n); with mu: += (x - mu)^2
static inline void lanes_sum(double l[LANES], const float *x, int n) {
    int i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int j = 0; j < LANES; j++) l[j] += x[i + j];
    for (; i < n; i++) l[i % LANES] += x[i];
}
static inline void lanes_sqdev(double l[LANES], const float *x, int n, double mu) {
    int i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int j = 0; j < LANES; j++) l[j] += (x[i + j] - mu) * (x[i + j] - mu);
    for (; i < n; i++) l[i % LANES] += (x[i] - mu) * (x[i] - mu);
}

static void bn_stats_cpu(const float *z, long zs, int B, int C, int HW, float *mean, float *invstd, float *rm,
                         float *rv, int train) {
    double cnt = (double)B * HW;
#pragma omp parallel for if (C * cnt > OMP_MIN_WORK)
    for (int o = 0; o < C; o++) {
        if (!train) {
            mean[o] = rm[o];
            invstd[o] = 1.f / sqrtf(rv[o] + BN_EPS);
            continue;
        }
        double ls[LANES] = {0}, lss[LANES] = {0};
        for (int b = 0; b < B; b++) lanes_sum(ls, z + b * zs + (long)o * HW, HW);
        double mu = lanes_total(ls) / cnt;
        for (int b = 0; b < B; b++) lanes_sqdev(lss, z + b * zs + (long)o * HW, HW, mu);
        double var = lanes_total(lss) / cnt;
        mean[o] = (float)mu;
        invstd[o] = (float)(1.0 / sqrt(var + BN_EPS));
        rm[o] = (1 - BN_MOMENTUM) * rm[o] + BN_MOMENTUM * (float)mu;
        rv[o] = (1 - BN_MOMENTUM) * rv[o] + BN_MOMENTUM * (float)(cnt > 1 ? var * cnt / (cnt - 1) : var);
    }
}
#if defined(__AVX__)
#define V8_EARLY(v) __asm__("" : "+x"(v))   // v is in a register here (loaded, not folded into a later use)
#else
#define V8_EARLY(v) ((void)0)
#endif
// bn_silu_grad8: for 8 values z of one channel and the gradient dv of SiLU(BN(z)): xh = (z - mean) /
// std and gy, the gradient w.r.t. BN(z)
static inline void bn_silu_grad8(const gemm_v8 *zv, const gemm_v8 *dv, float mu, float istd, float ga, float be,
                                 gemm_v8 *gy, gemm_v8 *xh) {
    *xh = (*zv - mu) * istd;
    gemm_v8 y = ga * *xh + be, e = -y;
    exp_poly8(&e);
    gemm_v8 sg1 = 1.f / (1.f + e);
    *gy = *dv * sg1 * (1.f + y * (1.f - sg1));
}
// bn_silu_backward_cpu: from dA, the gradient of SiLU(BN(z)), to dz in place, recomputing BN and
// SiLU from z, and dgamma/dbeta += their gradients (train mode includes the batch-statistics
// terms). gamma NULL: a plain conv with bias (dbeta += sum dA, dz = dA). Twin of bn_silu_backward_cuda.
static void bn_silu_backward_cpu(const float *z, float *dA, long zs, const float *mean, const float *invstd,
                                 const float *gamma, const float *beta, float *dgamma, float *dbeta, int B, int C,
                                 int HW, int train) {
    double cnt = (double)B * HW;
#pragma omp parallel for if (C * cnt > OMP_MIN_WORK)
    for (int o = 0; o < C; o++) {
        if (!gamma) {
            double l[LANES] = {0};
            for (int b = 0; b < B; b++) lanes_sum(l, dA + b * zs + (long)o * HW, HW);
            dbeta[o] += (float)lanes_total(l);
            continue;
        }
        float ga = gamma[o], be = beta[o], mu = mean[o], istd = invstd[o];
        lanes_vd vg = {0}, vgx = {0};
        for (int b = 0; b < B; b++) {
            const float *zz = z + b * zs + (long)o * HW;
            float *d = dA + b * zs + (long)o * HW;
            // one vectorised pass: the gradient through SiLU, and its two sums (element i to lane i % 8;
            // a partial last group adds its n lanes only), each lane summed in FP32 over up to 8 groups,
            // then into FP64 (converting every group cost a third of the pass). dA is loaded first:
            // V8_EARLY keeps GCC from folding the load into the multiply at the end of the chain, where
            // its cache misses no longer overlap (35 % slower on rows longer than the cache with AVX-512).
            int i = 0;
            while (i + LANES <= HW) {
                gemm_v8 fg = {0}, fgx = {0};
                for (int k = 0; k < 8 && i + LANES <= HW; k++, i += LANES) {
                    gemm_v8 zv = *(const gemm_v8 *)(zz + i), dv = *(const gemm_v8 *)(d + i), gy, xh;
                    V8_EARLY(dv);
                    bn_silu_grad8(&zv, &dv, mu, istd, ga, be, &gy, &xh);
                    *(gemm_v8 *)(d + i) = gy;
                    fg += gy;
                    fgx += gy * xh;
                }
                vg += __builtin_convertvector(fg, lanes_vd);
                vgx += __builtin_convertvector(fgx, lanes_vd);
            }
            if (i < HW) {
                int n = HW - i;
                gemm_v8 zv, dv, gy, xh;
                v8_load(&zv, zz + i, n), v8_load(&dv, d + i, n);
                bn_silu_grad8(&zv, &dv, mu, istd, ga, be, &gy, &xh);
                v8_store(d + i, &gy, n);
                lanes_vd gd = __builtin_convertvector(gy, lanes_vd), gx = gd * __builtin_convertvector(xh, lanes_vd);
                for (int j = n; j < LANES; j++) gd[j] = gx[j] = -0.0;   // (x + -0 is x, for every x)
                vg += gd;
                vgx += gx;
            }
        }
        double lg[LANES], lgx[LANES];
        memcpy(lg, &vg, sizeof vg), memcpy(lgx, &vgx, sizeof vgx);
        double sg = lanes_total(lg), sgx = lanes_total(lgx);
        dgamma[o] += (float)sgx;
        dbeta[o] += (float)sg;
        float k1 = ga * istd, mg = train ? (float)(sg / cnt) : 0.f, mgx = train ? (float)(sgx / cnt) : 0.f;
        for (int b = 0; b < B; b++) {
            const float *zz = z + b * zs + (long)o * HW;
            float *d = dA + b * zs + (long)o * HW;
            for (int i = 0; i < HW; i++) d[i] = k1 * (d[i] - mg - (zz[i] - mu) * istd * mgx);
        }
    }
}

// cpu_value_view: image b of value vi where it already lies whole in memory: the input batch, or
// a conv's kept activation (Conv.y) or a channel slice of it; NULL otherwise (and in a dry run,
// where value_materialize plans the same temporaries either way), for value_materialize to make
// cpu_value_in_place: whether it does (decided from the graph alone, the same in a dry run)
static int cpu_value_in_place(const Exec *e, int vi) {
    const Value *v = &e->m->val[vi];
    if (v->kind == V_INPUT) return e->be->input == cpu_input;   // (a test's twin backend may convert the input)
    return (v->kind == V_CONV || v->kind == V_SLICE) && e->m->conv[v->conv].y;
}
static const float *cpu_value_view(Exec *e, int vi, int b) {
    const Model *m = e->m;
    const Value *v = &m->val[vi];
    if (arena_dry(e->a) || !cpu_value_in_place(e, vi)) return NULL;
    if (v->kind == V_INPUT) return (const float *)e->x + (size_t)b * v->C * v->H * v->W;
    const Conv *p = &m->conv[v->conv];
    return p->y + (size_t)b * p->zstride + (size_t)(v->kind == V_SLICE ? v->c0 : 0) * v->H * v->W;
}

// cpu_rows_input: whether 1x1 conv c reads its input as rows (cpu_input_rows): a concatenation
// with a part that lies in memory (C2f's cv2 and the neck's: the kept activations, and their
// slices, are read in place; only the other parts are copied). SPPF's chain of pools is made
// whole (cat_pool_chain). Decided from the graph alone, the same in a dry run.
static int cpu_rows_input(const Exec *e, const Conv *c) {
    const Value *v = &e->m->val[c->in];
    if (c->k != 1 || c->s != 1 || v->kind != V_CAT) return 0;
    int in_place = 0;
    for (int i = 0; i < v->n; i++) {
        if (cat_pool_chain(e, v, i)) return 0;
        in_place += cpu_value_in_place(e, v->src[i]);
    }
    return in_place > 0;
}
// cpu_input_rows: conv c's input channels, image b's in rows + b * Cin (each a pointer to H*W
// floats): in place where a part lies in memory, the other parts materialised into the buffer
// returned (NULL if none). rows is written only when the arena is real.
static float *cpu_input_rows(Exec *e, const Conv *c, const float **rows) {
    const Model *m = e->m;
    const Value *v = &m->val[c->in];
    long HW = (long)v->H * v->W, nmat = 0;   // floats per image of the parts made here
    for (int i = 0; i < v->n; i++)
        if (!cpu_value_in_place(e, v->src[i])) nmat += m->val[v->src[i]].C * HW;
    float *buf = nmat ? walk_f32(e, m->B * nmat, G_SCRATCH) : NULL;
    for (int b = 0; b < m->B; b++) {
        long off = 0;
        int r = 0;
        for (int i = 0; i < v->n; i++) {
            const Value *s = &m->val[v->src[i]];
            const float *base = cpu_value_view(e, v->src[i], b);   // (NULL in a dry run)
            if (!cpu_value_in_place(e, v->src[i])) {
                float *d = buf + (size_t)b * nmat + off;
                value_materialize(e, v->src[i], b, d, s->C * HW);
                base = d, off += s->C * HW;
            }
            for (int ch = 0; ch < s->C && !arena_dry(e->a); ch++) rows[(size_t)b * c->cin + r + ch] = base + ch * HW;
            r += s->C;
        }
    }
    return buf;
}
// cpu_inputs: conv c's input for every image of the batch, in xs[b]: in place where it lies in
// memory, else materialised into xall (B x nx floats, allocated here and returned; NULL if none)
static float *cpu_inputs(Exec *e, const Conv *c, const float **xs) {
    const Model *m = e->m;
    long nx = (long)c->cin * c->H * c->W;
    if (cpu_value_in_place(e, c->in)) {
        for (int b = 0; b < m->B; b++) xs[b] = cpu_value_view(e, c->in, b);
        return NULL;
    }
    float *xall = walk_f32(e, (long)m->B * nx, G_SCRATCH);
    for (int b = 0; b < m->B; b++) {
        value_materialize(e, c->in, b, xall + (size_t)b * nx, nx);
        xs[b] = xall + (size_t)b * nx;
    }
    return xall;
}
// cpu_conv_input: conv c's input, one of the two ways above: through rows (cpu_rows_input: *rows, B x
// Cin pointers from the arena, xs NULL) or whole images (xs; *rows NULL). Returns the buffer of what
// was materialised (NULL if none); the caller frees it, then *rows.
static float *cpu_conv_input(Exec *e, const Conv *c, const float **xs, const float ***rows) {
    int B = e->m->B;
    if (!cpu_rows_input(e, c)) {
        *rows = NULL;
        return cpu_inputs(e, c, xs);
    }
    *rows = arena_alloc(e->a, (size_t)B * c->cin * sizeof(float *), G_SCRATCH);
    for (int b = 0; b < B; b++) xs[b] = NULL;
    return cpu_input_rows(e, c, *rows);
}

// CPU convolutions run the batch's images in parallel, one per thread, each GEMM on that thread
// alone, when there are at least as many images as threads (training batches); otherwise one
// image after the other, each GEMM over all threads (prediction, small batches). A GEMM gives the
// same bits either way (its tiles never change a sum's order, and conv GEMMs never cut K), so the
// results do not depend on the thread count. Each thread gets its own scratch (slot): the plan
// counts one slot per thread.
static int cpu_conv_slots(const Model *m) {
    int T = omp_threads();
    return T > 1 && m->B >= T ? T : 1;
}
static int cpu_slot(void) {
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

// cpu_conv: z = conv(input) (the images as above). A 1x1 conv multiplies the input itself; a
// stride-1 KxK conv reads its im2col matrix as rows of the zero-padded input (PadRows: computed
// on the wide grid, then narrowed into z); a strided conv packs the im2col matrix's panels
// straight from the input, or writes it first where it is small enough to stay in L2. Detect
// output convs add their bias and keep the result as the head map.
#define GEMM_IMPLICIT_MIN (1L << 18)   // floats: a larger im2col matrix is read in place
// conv_grid: a stride-1 KxK or stride-2 conv's wide grid: its width (Wp) and the floats of its
// input operand (padded input or phases) and of one plane of it
static int conv_grid(const Conv *c, size_t *nin, size_t *plane) {
    int p = c->k / 2;
    if (c->s == 1) {
        *nin = pad_floats(c->cin, c->H, c->k, c->W + p), *plane = (size_t)(c->H + 2 * p) * (c->W + p);
        return c->W + p;
    }
    *nin = phase_floats(c->cin, c->Ho, c->Wo, c->k), *plane = (size_t)(c->Ho + p) * (c->Wo + 2 * p);
    return c->Wo + 2 * p;
}
static int conv_wide(const Conv *c) { return (c->k > 1 && c->s == 1) || c->s == 2; }
static void cpu_conv(Exec *e, Conv *c) {
    Model *m = e->m;
    int dry = arena_dry(e->a), HWo = c->Ho * c->Wo, KK = c->cin * c->k * c->k, H = c->H, W = c->W, Ho = c->Ho;
    // (stride 2 on the phases gives the same bits, but was slower than packing B's panels from x:
    // 24 against 13.5 ms per step for YOLOv8n's second conv at 640, batch 8, 2 threads)
    int direct = c->k == 1 && c->s == 1, wide = c->k > 1 && c->s == 1;
    int implicit = !direct && !wide && (long)KK * HWo > GEMM_IMPLICIT_MIN, nslot = cpu_conv_slots(m);
    size_t nin = 0, plane = 0;
    int Wp = wide ? conv_grid(c, &nin, &plane) : 0;
    // a slot: the padded input, or the im2col matrix (Cin*K*K, Ho*Wo)
    long nscr = wide ? (long)nin : direct || implicit ? 0 : (long)KK * HWo;
    int wino = wide && c->k == 3;   // by Winograd F(2x2, 3x3) (wino_conv)
    const float *xs[m->B], **rows;   // (rows: a 1x1 conv of a concatenation, B's rows in place)
    float *xall = cpu_conv_input(e, c, xs, &rows);
    float *scr = nscr ? walk_f32(e, nslot * nscr, G_SCRATCH) : NULL;
    const float *w = e->params + c->w_off;                                   // (Cout, Cin*K*K)
    float *wu = wino ? walk_f32(e, 16 * (long)wino_ues(c->cout, c->cin), G_SCRATCH) : NULL;   // the weights transformed
    float *wv = wino ? walk_f32(e, (long)wino_floats(c->cin, omp_threads()), G_SCRATCH) : NULL;   // V buffers
    if (!dry) {
        gemm_init();
        if (wino) wino_weights(w, c->cout, c->cin, 0, wu);
#pragma omp parallel for schedule(static, 1) if (nslot > 1)
        for (int b = 0; b < m->B; b++) {
            const float *xb = xs[b];
            float *z = c->z + (size_t)b * c->zstride, *sc = scr ? scr + (size_t)cpu_slot() * nscr : NULL;
            if (wide) {
                pad_fill(sc, xb, c->cin, H, W, c->k, Wp);
                if (wino) wino_conv(c->cout, c->cin, H, W, wu, sc, plane, Wp, wv, z, 0);
                else {
                    PadRows g = {sc, plane, Wp, c->k, 1, c->cin, NULL};
                    WideOut o = {z, Ho, c->Wo, Wp, 1, 0, 0, 0};
                    gemm_wide(c->cout, Ho * Wp, KK, w, KK, &g, &o);
                }
            } else if (rows) {
                Im2col g = {.rows = rows + (size_t)b * c->cin};
                gemm_run(0, 0, c->cout, HWo, KK, w, KK, NULL, HWo, &g, 0, 0.f, z, HWo);
            } else {
                Im2col g = {xb, c->cin, H, W, c->k, c->s, c->Ho, c->Wo, NULL};
                if (sc) im2col(xb, c->cin, H, W, c->k, c->s, sc);
                gemm_run(0, 0, c->cout, HWo, KK, w, KK, sc ? sc : xb, HWo, implicit ? &g : NULL, 0, 0.f, z, HWo);
            }
            if (!c->bn)
                for (int o = 0; o < c->cout; o++)
                    for (int i = 0; i < HWo; i++) z[(size_t)o * HWo + i] += e->params[c->b_off + o];
        }
    }
    arena_free(e->a, wv);
    arena_free(e->a, wu);
    arena_free(e->a, scr);
    arena_free(e->a, xall);
    arena_free(e->a, rows);
}
static void cpu_bn_stats(Exec *e, Conv *c) {
    if (arena_dry(e->a)) return;
    float *rm = e->buffers + c->rs_off;
    bn_stats_cpu(c->z, (long)c->zstride, e->m->B, c->cout, c->Ho * c->Wo, c->mean, c->invstd, rm, rm + c->cout,
                 e->m->train);
}
// cpu_bn_backward: dz in place of dA
static void *cpu_bn_backward(Exec *e, Conv *c) {
    if (!arena_dry(e->a))
        bn_silu_backward_cpu(c->z, c->dA, (long)c->zstride, c->mean, c->invstd, c->bn ? e->params + c->g_off : NULL,
                             e->params + c->b_off, c->bn ? e->grads + c->g_off : NULL, e->grads + c->b_off, e->m->B,
                             c->cout, c->Ho * c->Wo, e->m->train);
    return c->dA;
}
// cpu_conv_grads: the weight gradient and the input's gradient (the images as above), handed to
// value_backprop. The weight gradient is a GEMM over the pixels of every image, computed
// transposed (gemm_nt_rows: Cin*K*K x Cout, then added to the gradient), in one of two ways, chosen
// by the shape alone so that the sums' order never depends on the threads, whichever needs less
// memory: the whole batch as one K, the images in order, after the image loop has laid out every
// image's operand (a 1x1 conv needs none: its input and dz are read in place); or each image into
// its own partial sum inside the loop, the partials added in image order.
// - 1x1: the input itself (a concatenation: its parts through a table of rows, cpu_input_rows), and
//   one GEMM for dx.
// - stride-1 KxK: on the wide grid of cpu_conv. The weight gradient reads the padded input's rows
//   (PadRows) against dz padded the same way (its wide rows start inside the border, so their
//   junk columns read zeros and add nothing). The input gradient is itself a KxK convolution, of dz
//   with the weights flipped in space and Cin, Cout swapped (dx[ci][y][x] = sum over co, ky, kx of
//   w[co][ci][ky][kx] dz[co][y+p-ky][x+p-kx]): gemm_wide of those weights (wf, made once per
//   step) over the padded dz, narrowed into dx.
// - stride 2: the same with the input's four phases (phase_fill) against dz padded by
//   p = K/2 on the phases' grid (Wo + 2p wide). The input gradient, phase by phase: pixel
//   (2i + py, 2j + px) takes the taps ky = py + 2ty, kx = px + 2tx only, from dz[i - ty][j - tx],
//   so each phase is a small stride-1 conv of the padded dz (its taps' rows in a table, its weights
//   in wf: per phase Cin x Cout*taps), scattered back into dx.
// - other strides: the im2col matrix for the weight gradient; the GEMM into an im2col matrix and
//   col2im for dx.
static void cpu_conv_grads(Exec *e, Conv *c, void *dzv) {
    Model *m = e->m;
    int B = m->B, dry = arena_dry(e->a), HWo = c->Ho * c->Wo, KK = c->cin * c->k * c->k, k2 = c->k * c->k;
    int direct = c->k == 1 && c->s == 1, wide = conv_wide(c), nslot = cpu_conv_slots(m), S = c->s;
    int need_dx = m->val[c->in].kind != V_INPUT;
    int H = c->H, W = c->W, Ho = c->Ho, Wo = c->Wo, p = c->k / 2, KKo = c->cout * k2;
    size_t npx = 0, xplane = 0;
    int Wp = wide ? conv_grid(c, &npx, &xplane) : 0, Hq = Ho + p;   // (stride 2: phase rows Hq)
    size_t npz = wide ? pad_floats(c->cout, Ho, c->k, Wp) : 0, zplane = (size_t)(Ho + 2 * p) * Wp;
    long nx = (long)c->cin * H * W, ngw = (long)KK * c->cout;
    int wino = S == 1 && c->k == 3 && need_dx;   // the input gradient by Winograd F(2x2, 3x3) (wino_conv)
    long nop = direct ? 0 : wide ? (long)(npx + npz) : (long)KK * HWo;   // an image's operands: padded x, dz / im2col
    // the weight gradient by Winograd too (wino_wgrad: per image partials) where its GEMMs are large
    // enough to win: both channel counts >= 64, maps >= 20 x 20 (yolov8n at 320, 2 threads: 32 -> 32 at
    // 40 x 40 and 128 -> 128 at 10 x 10 were 15 and 40 % slower, 80 -> 80 at 40 x 40 12 % faster)
    int wwino = S == 1 && c->k == 3 && c->cin >= 64 && c->cout >= 64 && H >= 20 && W >= 20;
    int batch = !wwino && nop <= ngw;                                     // the batch as one K
    long ndx = !need_dx || direct || wide ? 0 : (long)KK * HWo;   // dx's im2col matrix (other strides)
    long nscr = (batch ? 0 : nop) + ndx;                                  // a slot
    const float *xs[B], *as[B], *bs[B];
    PadRows ag[B];
    const float **rows;   // (as in cpu_conv: the weight gradient's A read through rows)
    float *xall = cpu_conv_input(e, c, xs, &rows);
    // a 1x1, stride-1 KxK or stride-2 conv of a conv's output or of a slice of it puts dx straight into
    // that conv's dA: written there if it is the first gradient to reach those channels (dA_held),
    // else added (the 1x1 GEMM with beta 1, wide_store adding: the same sums as a dx buffer added
    // after); else dx is made whole and handed on
    const Value *iv = &m->val[c->in];
    int dx_into = (direct || wide) && need_dx && (iv->kind == V_CONV || iv->kind == V_SLICE);
    Conv *pc = dx_into ? &m->conv[iv->conv] : NULL;
    int pc0 = iv->kind == V_SLICE ? iv->c0 : 0, dx_add[B];   // dx_add[b]: image b's dx added, else written
    float *dx_dA = dx_into ? walk_dA(e, pc) + (size_t)pc0 * H * W : NULL;
    size_t dx_ds = dx_into ? pc->zstride : 0;                                         // its image stride
    for (int b = 0; b < B; b++) dx_add[b] = dx_into && dA_held(e, pc, b, pc0, c->cin);
    float *dxall = need_dx && !dx_into ? walk_f32(e, (long)B * nx, G_SCRATCH) : NULL;   // (B, Cin, H, W)
    // (Cin*K*K, Cout) [per image]; Winograd's: B x 16 planes of (Cin, Cout)
    long ngwt = wwino ? 16 * (long)wino_ues(c->cin, c->cout) : ngw;
    float *gwt = walk_f32(e, (batch ? 1 : B) * ngwt, G_SCRATCH);
    float *ops = batch && nop ? walk_f32(e, (long)B * nop, G_SCRATCH) : NULL;      // every image's operands
    float *scr = nscr ? walk_f32(e, nslot * nscr, G_SCRATCH) : NULL;
    // the input gradient's weights: wino_conv's U (16, Cin, Cout), else flipped (Cin, Cout*K*K)
    float *wf = wide && need_dx ? walk_f32(e, wino ? 16 * (long)wino_ues(c->cin, c->cout) : (long)c->cin * KKo, G_SCRATCH)
                                : NULL;
    float *wv = wino ? walk_f32(e, (long)wino_floats(c->cout, omp_threads()), G_SCRATCH) : NULL;   // its V buffers
    float *wvz = wwino ? walk_f32(e, (long)wino_wgrad_floats(c->cin, c->cout, omp_threads()), G_SCRATCH) : NULL;
    const float *w = e->params + c->w_off;
    float *gw = e->grads + c->w_off;
    // stride 2: phase ph = 2 py + px's taps (nty x ntx), their weights at wf + wo[ph] (Cin x kph[ph])
    int nt1[2] = {(c->k + 1) / 2, c->k / 2}, kph[4] = {0}, wo[4] = {0};
    for (int ph = 0; ph < 4 && S == 2; ph++)
        kph[ph] = c->cout * nt1[ph >> 1] * nt1[ph & 1], wo[ph] = ph ? wo[ph - 1] + c->cin * kph[ph - 1] : 0;
    if (!dry) {
        gemm_init();
        if (!wwino) par_zero(gwt, (size_t)(batch ? 1 : B) * ngwt * sizeof(float));   // (Winograd's: per image, below)
        if (wino) wino_weights(w, c->cout, c->cin, 1, wf);
        else if (wf && S == 1)
#pragma omp parallel for if ((long)c->cout * KK > OMP_MIN_WORK)
            for (int co = 0; co < c->cout; co++)
                for (int ci = 0; ci < c->cin; ci++)
                    for (int t = 0; t < k2; t++)
                        wf[(size_t)ci * KKo + (size_t)co * k2 + t] = w[(size_t)co * KK + ci * k2 + k2 - 1 - t];
        if (wf && S == 2)
            for (int ph = 0; ph < 4; ph++) {
                int py = ph >> 1, px = ph & 1, ny = nt1[py], nx1 = nt1[px];
                for (int ci = 0; ci < c->cin; ci++)
                    for (int co = 0; co < c->cout; co++)
                        for (int ty = 0; ty < ny; ty++)
                            for (int tx = 0; tx < nx1; tx++)
                                wf[wo[ph] + (size_t)ci * kph[ph] + (size_t)(co * ny + ty) * nx1 + tx] =
                                    w[(size_t)co * KK + ci * k2 + (py + 2 * ty) * c->k + px + 2 * tx];
            }
#pragma omp parallel for schedule(static, 1) if (nslot > 1)
        for (int b = 0; b < B; b++) {
            const float *dz = (const float *)dzv + (size_t)b * c->zstride, *xb = xs[b];   // dz (Cout, Ho*Wo)
            float *dx = dx_into ? dx_dA + b * dx_ds : need_dx ? dxall + (size_t)b * nx : NULL;
            float *sc = scr ? scr + (size_t)cpu_slot() * nscr : NULL;
            float *op = batch ? (ops ? ops + (size_t)b * nop : NULL) : sc, *dsc = batch ? sc : sc + nop;
            if (wide) {
                float *xp = op, *dzp = op + npx;
                if (S == 1) pad_fill(xp, xb, c->cin, H, W, c->k, Wp);
                else phase_fill(xp, xb, c->cin, H, W, c->k, Ho, Wo);
                pad_fill(dzp, dz, c->cout, Ho, Wo, c->k, Wp);
                ag[b] = (PadRows){xp, xplane, Wp, c->k, S, c->cin, NULL}, as[b] = NULL;
                bs[b] = dzp + (size_t)p * Wp + p;
                if (dx && wino) wino_conv(c->cin, c->cout, H, W, wf, dzp, zplane, Wp, wv, dx, dx_add[b]);
                else if (dx && S == 1) {
                    PadRows gz = {dzp, zplane, Wp, c->k, 1, c->cout, NULL};
                    WideOut o = {dx, H, W, Wp, 1, 0, 0, dx_add[b]};
                    gemm_wide(c->cin, H * Wp, KKo, wf, KKo, &gz, &o);
                }
                for (int ph = 0; dx && S == 2 && ph < 4; ph++) {
                    int py = ph >> 1, px = ph & 1, ny = nt1[py], nx1 = nt1[px];
                    const float *taps[kph[ph] ? kph[ph] : 1];   // row (co, ty, tx): dz[i - ty][j - tx], padded
                    for (int co = 0; co < c->cout; co++)
                        for (int ty = 0; ty < ny; ty++)
                            for (int tx = 0; tx < nx1; tx++)
                                taps[(co * ny + ty) * nx1 + tx] = dzp + co * zplane + (size_t)(p - ty) * Wp + p - tx;
                    PadRows gz = {NULL, 0, Wp, c->k, 2, c->cout, taps};
                    // dx[ci][y][x] for y + p = 2i + py, x + p = 2j + px (every pixel in one phase)
                    WideOut o = {dx, H, W, Wp, 2, py - p, px - p, dx_add[b]};
                    if (kph[ph]) gemm_wide(c->cin, Hq * Wp, kph[ph], wf + wo[ph], kph[ph], &gz, &o);
                    else if (!dx_add[b])   // (a phase with no taps: a 1x1 stride-2 conv)
                        for (int ci = 0; ci < c->cin; ci++)
                            for (int y = py - p; y < H; y += 2)
                                for (int x = px - p; x < W && y >= 0; x += 2)
                                    if (x >= 0) dx[((size_t)ci * H + y) * W + x] = 0.f;
                }
            } else {
                if (!direct) im2col(xb, c->cin, H, W, c->k, c->s, op);
                as[b] = rows ? NULL : direct ? xb : op, bs[b] = dz;
                if (rows) ag[b] = (PadRows){.rows = rows + (size_t)b * c->cin};
                if (dx) {
                    gemm_run(1, 0, KK, HWo, c->cout, w, KK, dz, HWo, NULL, 0, dx_add[b] ? 1.f : 0.f, direct ? dx : dsc,
                             HWo);
                    if (!direct) col2im(dsc, c->cin, H, W, c->k, c->s, dx);
                }
            }
            if (wwino) {
                memset(gwt + (size_t)b * ngwt, 0, ngwt * sizeof(float));
                wino_wgrad(c->cin, c->cout, H, W, op, xplane, op + npx, zplane, Wp, wvz, gwt + (size_t)b * ngwt);
            } else if (!batch)   // this image's partial weight gradient
                gemm_nt_rows(KK, c->cout, wide ? Ho * Wp : HWo, 1, rows ? NULL : &as[b], HWo,
                             wide || rows ? &ag[b] : NULL, &bs[b], wide ? (int)zplane : HWo, gwt + (size_t)b * ngw,
                             c->cout);
        }
        if (batch)
            gemm_nt_rows(KK, c->cout, wide ? Ho * Wp : HWo, B, rows ? NULL : as, HWo, wide || rows ? ag : NULL, bs,
                         wide ? (int)zplane : HWo, gwt, c->cout);
        // gw (Cout, Cin*K*K) += the partials, transposed: 16 x 16 blocks, so that both sides stay in cache
        if (wwino) wino_wgrad_finish(gwt, B, c->cin, c->cout, gw);
        else
#pragma omp parallel for collapse(2) if (ngw * (batch ? 1 : B) > OMP_MIN_WORK)
        for (int o0 = 0; o0 < c->cout; o0 += 16)
            for (int i0 = 0; i0 < KK; i0 += 16)
                for (int o = o0; o < o0 + 16 && o < c->cout; o++)
                    for (int i = i0; i < i0 + 16 && i < KK; i++) {
                        float v = gw[(size_t)o * KK + i];
                        for (int b = 0; b < (batch ? 1 : B); b++) v += gwt[(size_t)b * ngw + (size_t)i * c->cout + o];
                        gw[(size_t)o * KK + i] = v;
                    }
    }
    for (int b = 0; b < B && dxall; b++) value_backprop(e, c->in, b, dxall + (size_t)b * nx, nx);
    arena_free(e->a, wvz);
    arena_free(e->a, wv);
    arena_free(e->a, wf);
    arena_free(e->a, scr);
    arena_free(e->a, ops);
    arena_free(e->a, gwt);
    arena_free(e->a, dxall);
    arena_free(e->a, xall);
    arena_free(e->a, rows);
}
static struct LossOut cpu_loss(Exec *e, const struct LossTargets *tg, const struct LossConfig *lcfg);

// cpu_backend: the table; the FP16 twin of the device step in test/gpu_step_test.c wraps it
static const Backend cpu_backend = {
    .zero = cpu_zero, .input = cpu_input, .act = cpu_act, .add = cpu_add, .upsample = cpu_upsample,
    .maxpool = cpu_maxpool, .grad_add = cpu_grad_add, .grad_copy = cpu_grad_copy, .upsample_back = cpu_upsample_back,
    .maxpool_back = cpu_maxpool_back,
    .conv = cpu_conv, .bn_stats = cpu_bn_stats, .bn_backward = cpu_bn_backward, .conv_grads = cpu_conv_grads,
    .loss = cpu_loss, .lazy_dA = 1,
};
// model_cpu_backend: the backend the CPU entry points below run on (tests put a twin in its place)
static const Backend *model_cpu_backend = &cpu_backend;

// exec_cpu: a walk of model m on the CPU, in arena a, with the model's own weights and input m->x
static Exec exec_cpu(Model *m, Arena *a) {
    // training without recompute keeps the activations: host memory is plentiful, and recomputing
    // SiLU(BN(z)) for every reader and again in the backward cost a tenth of the CPU step
    return (Exec){model_cpu_backend, m, a, m->params, m->grads, m->buffers, m->x, 1, sizeof(float), NULL,
                  !m->recompute && !m->infer, sizeof(float)};
}

// model_alloc_params: the persistent groups: weights and gradients (flat, state_dict order)
// and the BN running statistics.
static void model_alloc_params(Model *m, Arena *a) {
    m->params = azfloat(a, m->nparams, G_PARAMS);
    m->grads = azfloat(a, m->nparams, G_GRADS);
    m->buffers = azfloat(a, m->nbuffers, G_BUFFERS);
}

// model_input: the input x (B, 3, H, W) in [0,1] of the next CPU walk, and the shapes for it
static void model_input(Model *m, const float *x, int B, int H, int W) {
    m->x = x;
    m->B = B;
    m->H = H;
    m->W = W;
    model_shape(m, H, W);
    model_liveness(m);
}

// model_forward: the whole network on x on the CPU (walk_forward); leaves the three raw Detect
// maps in m->head.
static void model_forward(Model *m, Arena *a, const float *x, int B, int H, int W) {
    model_input(m, x, B, H, W);
    Exec e = exec_cpu(m, a);
    walk_forward(&e);
}
static void model_head_grad(Model *m, Arena *a) { Exec e = exec_cpu(m, a); walk_head_grad(&e, 1); }
static void model_backward(Model *m, Arena *a) { Exec e = exec_cpu(m, a); walk_backward(&e); }
static void model_release(Model *m, Arena *a) { Exec e = exec_cpu(m, a); walk_release(&e); }

// ------------------------------------------------------------------------------------------
// planning: the exact bytes of a training step, and `yolo info` / `yolo plan`
// ------------------------------------------------------------------------------------------

// Plan: what a dry run measured, for one layout.
typedef struct {
    size_t total;                   // the arena size: high-water mark of the dry run (of its layout, lay)
    size_t at_peak[G_NGROUPS];      // bytes of each group live at that peak
    size_t peak[G_NGROUPS];         // each group's own maximum
    ArenaLayout *lay;               // the device arena's layout (gpu_plan_run), NULL for first-fit
} Plan;

// model_step_schedule: the allocation sequence of one training step (forward, head gradient,
// backward) on an arena that already holds the persistent groups. Real and dry runs share it.
static void model_step_schedule(Model *m, Arena *a, const float *x, int B, int H, int W) {
    model_forward(m, a, x, B, H, W);
    model_head_grad(m, a);
    model_backward(m, a);
}

// model_plan: dry-runs a step for (B, H, W) and reports the arena size and its composition.
static Plan model_plan(Model *m, int B, int H, int W) {
    Arena *a = xcalloc(1, sizeof(Arena));
    a->cap = SIZE_MAX;
    float *keep[3] = {m->params, m->grads, m->buffers};   // a dry run must not lose the real ones
    model_alloc_params(m, a);
    model_step_schedule(m, a, NULL, B, H, W);
    m->params = keep[0], m->grads = keep[1], m->buffers = keep[2];
    Plan p = {.total = a->high};
    memcpy(p.at_peak, a->at_high, sizeof p.at_peak);
    memcpy(p.peak, a->peak, sizeof p.peak);
    free(a);
    return p;
}

static void model_zero_grad(Model *m) { memset(m->grads, 0, m->nparams * sizeof(float)); }

static int weights_describe(const char *path, int *nc, char *scale, char *err, size_t errlen);   // .pt or .safetensors
static const char *model_args_keys[] = {"model", "nc", "imgsz", "batch", NULL};

// model_arg: the scale and class count that model= names: yolov8n .. yolov8x (nc=, 80 by default), or a
// weights file, whose tensors give both
static void model_arg(int argc, char **argv, char *scale, int *nc) {
    const char *name = arg_get(argc, argv, "model", "yolov8n");
    const Scale *sc = scale_find(name);
    char err[1024];
    if (sc) {
        *scale = sc->name;
        *nc = (int)arg_int(argc, argv, "nc", 80);
    } else if (weights_describe(name, nc, scale, err, sizeof err))
        die("model=%s: %s%s", name,
            access(name, F_OK) ? "expected yolov8n, yolov8s, yolov8m, yolov8l, yolov8x or a weights file: " : "", err);
}
// model_from_args: model=yolov8n nc=80 from the command line.
static void model_from_args(Model *m, int argc, char **argv) {
    char scale;
    int nc;
    model_arg(argc, argv, &scale, &nc);
    model_build(m, scale, nc);
}

// cmd_info: `yolo info model=yolov8n nc=80 imgsz=640`: the layer table and totals, counted as
// Ultralytics counts them (parameters incl. the frozen DFL weight; GFLOPs as model_flops).
static int cmd_info(int argc, char **argv) {
    arg_check(argc, argv, model_args_keys);
    Model *m = xmalloc(sizeof(Model));
    model_from_args(m, argc, argv);
    int imgsz = (int)arg_int(argc, argv, "imgsz", 640);
    if (imgsz < 32 || imgsz % 32) die("imgsz=%d: must be a positive multiple of 32", imgsz);
    model_shape(m, imgsz, imgsz);
    printf("%4s %14s %3s %10s  %-10s %s\n", "", "from", "n", "params", "module", "output (C, H, W)");
    for (int i = 0; i < m->nlayer; i++) {
        LayerRow *r = &m->layer[i];
        printf("%4d %14s %3d %10ld  %-10s", i, r->from, r->nrep, r->params, r->module);
        if (r->value >= 0) {
            Value *v = &m->val[r->value];
            printf(" (%d, %d, %d)\n", v->C, v->H, v->W);
        } else {
            printf(" 3 x (%d, H/s, W/s), s = 8, 16, 32\n", REG_MAX * 4 + m->nc);
        }
    }
    double gf = model_flops(m, imgsz, 0), gff = model_flops(m, imgsz, 1);
    printf("YOLOv8%c summary: %zu parameters, %zu gradients, %.1f GFLOPs (fused %.1f) at %d\n", m->scale,
           m->nparams, m->nparams - REG_MAX, gf, gff, imgsz);
    free(m);
    return 0;
}


// ------------------------------------------------------------------------------------------
// loss: task-aligned assigner, BCE, CIoU, DFL
// ------------------------------------------------------------------------------------------
/*
 * loss: the YOLOv8 detection loss, forward and backward, on the CPU in FP32 (double accumulators).
 * Matches Ultralytics v8DetectionLoss (utils/loss.py) with TaskAlignedAssigner (utils/tal.py), BboxLoss and
 * DFLoss.
 *
 * Public API
 *   LossConfig loss_config_default(void)      gains box 7.5, cls 0.5, dfl 1.5; max_boxes 1024
 *   int    loss_num_anchors(int imgH, int imgW)                  A = sum over strides 8,16,32 of (H/s)(W/s)
 *   size_t loss_scratch_bytes(int B, int A, int max_boxes)       exact scratch bytes of one call
 *   LossOut loss_forward_backward(const LossConfig *cfg, int B, int NC, int imgH, int imgW,
 *                                 const float *const head[3], float *const dhead[3],
 *                                 const LossTargets *tg, float grad_scale, void *scratch,
 *                                 size_t scratch_bytes, int flags)
 *
 * Shapes and units
 *   head[i]  (B, 64+NC, H_i, W_i) raw head maps of level i (strides 8, 16, 32; H_i = imgH/stride_i).
 *            Channels 0..63: sides l,t,r,b x 16 DFL bins (consecutive per side); 64..63+NC: class logits.
 *            Anchor index: level offset + y*W_i + x; anchor point (x+0.5, y+0.5) grid units.
 *   dhead[i] same shape; OVERWRITTEN (not accumulated) with grad_scale * d(total)/d(head), where
 *            total = B*(box+cls+dfl) is the scalar Ultralytics back-propagates. dhead == NULL (or any
 *            dhead[i] == NULL) means forward only (validation loss).
 *   tg       n boxes: batch_idx[n] in [0,B), cls[n] in [0,NC), box[n*4] normalised (cx, cy, w, h) of the
 *            final image; converted to pixels xyxy with (W, H, W, H) exactly as Ultralytics preprocess.
 *   scratch  caller-provided, scratch_bytes >= loss_scratch_bytes(B, A, cfg->max_boxes) (checked; dies
 *            otherwise), any alignment; no allocation happens inside the call. It also keeps the last
 *            assignment (see LOSS_REUSE_ASSIGNMENT).
 *   flags    0, or LOSS_REUSE_ASSIGNMENT: skip the assigner and reuse the foreground list and
 *            target_scores_sum left in scratch by the previous call with the same B, imgH, imgW, NC and
 *            targets (for finite-difference tests: the assigner is no-grad in Ultralytics).
 *   LossOut  box/cls/dfl after gains, before xB (what Ultralytics logs); total = B*(box+cls+dfl);
 *            n_fg foreground anchors; target_scores_sum = max(sum of target scores, 1) over the batch;
 *            n_over_cap boxes ignored because their image had more than max_boxes (the first max_boxes of
 *            an image, in input order, are kept), n_images_over_cap such images. The first time boxes are
 *            dropped a one-line warning goes to stderr; the counts come back on every call.
 *   errors   batch_idx outside [0,B) or cls outside [0,NC) die (the data loader validates labels first).
 *   loss_ciou_alpha_grad  test-only switch (0 in training): 1 also differentiates CIoU's alpha.
 *
 * Memory: no [B, M, A] tensor. Each gt visits only the anchors whose centres fall inside its box (the
 * anchor rectangle of each level) and keeps its top-10; overlaps between gts are then resolved one image
 * at a time with O(A) arrays. Scratch: predicted boxes (B, A, 4) f32, per-gt candidates (B, M, 10) and the
 * batch's foreground list B*min(A, 10*M) x 32 B: 9.0 MB for B=16, A=8400, M=1024; 5.3 MB with M=400.
 *
 * DEVIATIONS from Ultralytics
 *  - torch.topk tie order: when a gt has fewer than 10 anchors with align > 0, topk also returns anchors
 *    with align exactly 0, and which ones is implementation-defined. We follow CUDA torch.topk (ties at the
 *    k-th value taken in increasing anchor index over ALL A anchors, outside anchors included), so an
 *    inside anchor with align 0 is a candidate only if fewer than 10 - npos zero-align anchors (inside or
 *    outside) precede it. CPU torch may pick different zeros; positive-align choices agree.
 *  - Boxes beyond max_boxes per image are ignored (counted and reported); Ultralytics has no cap.
 *  - Sums (target_scores_sum, BCE, box, DFL) are accumulated in double; PyTorch sums in float.
 *  - BCE is evaluated as BCE(x,0) - x*t (exact identity); the gradient sigmoid(x) - t.
 */

// ------------------------------------------------------------------------------------------
// settings, results, geometry
// ------------------------------------------------------------------------------------------

enum { LOSS_R = DFL_BINS, LOSS_TOPK = 10, LOSS_REUSE_ASSIGNMENT = 1 };

typedef struct LossConfig {
    float box, cls, dfl;   // loss gains (hyp box, cls, dfl)
    int max_boxes;         // per-image box cap M; a mosaic holds ~4x the boxes of one source image
} LossConfig;

typedef struct LossTargets {
    int n;                 // number of boxes in the batch
    const int *batch_idx;  // (n) image of each box
    const int *cls;        // (n) class of each box
    const float *box;      // (n, 4) normalised cx, cy, w, h
} LossTargets;

typedef struct LossOut {
    double box, cls, dfl;       // components after gains, before xB
    double total;               // B*(box+cls+dfl), the back-propagated scalar
    int n_fg;                   // foreground anchors in the batch
    double target_scores_sum;   // max(sum of target scores, 1)
    int n_over_cap;             // boxes ignored by the max_boxes cap
    int n_images_over_cap;      // images that had more than max_boxes boxes
} LossOut;

typedef struct {
    int H[3], W[3];        // grid size of each level
    int off[3];            // first global anchor index of each level
    float stride[3];       // 8, 16, 32
    int A;                 // anchors in all levels
} LossGrid;

typedef struct { float x1, y1, x2, y2; int cls, valid; } LossGt;   // pixels xyxy; valid = mask_gt
typedef struct { int a; float align, o; } LossCand;                 // one top-k candidate of a gt
typedef struct { int b, a, cls; float score, x1, y1, x2, y2; } LossFg; // foreground anchor, target (pixels)

// what the scratch keeps between calls (for LOSS_REUSE_ASSIGNMENT)
typedef struct { int B, A, max_boxes, n_fg; double tss; } LossKeep;

static LossConfig loss_config_default(void) {
    LossConfig c = {7.5f, 0.5f, 1.5f, 1024};
    return c;
}

// loss_grid_make: level sizes and anchor offsets of an imgH x imgW input (multiples of 32).
static LossGrid loss_grid_make(int imgH, int imgW) {
    if (imgH <= 0 || imgW <= 0 || imgH % 32 || imgW % 32)
        die("loss: image size %dx%d must be positive multiples of 32", imgW, imgH);
    LossGrid g;
    g.A = 0;
    for (int l = 0; l < 3; l++) {
        int s = 8 << l;
        g.stride[l] = (float)s;
        g.H[l] = imgH / s;
        g.W[l] = imgW / s;
        g.off[l] = g.A;
        g.A += g.H[l] * g.W[l];
    }
    return g;
}

static int loss_num_anchors(int imgH, int imgW) { return loss_grid_make(imgH, imgW).A; }

static int loss_fg_cap(int A, int max_boxes) {
    long c = (long)LOSS_TOPK * max_boxes;
    return c < A ? (int)c : A;
}

#define LOSS_ALIGN_UP(x) (((x) + 63) & ~(size_t)63)

// loss_scratch_bytes: exact bytes loss_forward_backward needs for B images of A anchors and at most
// max_boxes (M) boxes per image. Layout (each part 64-byte aligned): keep | pbox (B,A,4) f32 |
// owner (A) i32 | align, o (A) f32 | m (B) i32 | gts (B,M) | cand (B,M,10) | nsel (B,M) i32 |
// max_align, max_iou (M) f32 | fg (B*min(A,10M)). 9.0 MB for B=16, A=8400, M=1024.
static size_t loss_scratch_bytes(int B, int A, int max_boxes) {
    size_t M = (size_t)(max_boxes > 0 ? max_boxes : 1), BM = (size_t)B * M;
    size_t n = 64;   // alignment slack for an unaligned scratch pointer
    n += LOSS_ALIGN_UP(sizeof(LossKeep));
    n += LOSS_ALIGN_UP((size_t)B * A * 4 * sizeof(float));
    n += LOSS_ALIGN_UP((size_t)A * sizeof(int));
    n += 2 * LOSS_ALIGN_UP((size_t)A * sizeof(float));
    n += LOSS_ALIGN_UP((size_t)B * sizeof(int));
    n += LOSS_ALIGN_UP(BM * sizeof(LossGt));
    n += LOSS_ALIGN_UP(BM * LOSS_TOPK * sizeof(LossCand));
    n += LOSS_ALIGN_UP(BM * sizeof(int));
    n += 2 * LOSS_ALIGN_UP(M * sizeof(float));
    n += LOSS_ALIGN_UP((size_t)B * loss_fg_cap(A, (int)M) * sizeof(LossFg));
    return n;
}

typedef struct {
    int B, A, M;
    LossKeep *keep;
    float *pbox;        // (B, A, 4) predicted boxes, pixels xyxy
    int *owner;         // (A) of the image being resolved: -1 background, -2 several gts, else the gt
    float *align, *o;   // (A) metrics of the single claiming gt
    int *m;             // (B) boxes kept per image
    LossGt *gts;        // (B, M)
    LossCand *cand;     // (B, M, 10) selected candidates per gt
    int *nsel;          // (B, M)
    float *max_align, *max_iou;   // (M) per gt of the image being resolved, over its final positives
    LossFg *fg;         // (B*min(A, 10M)) foreground list of the batch
} LossWork;

static void *loss_take(char **p, size_t bytes) {
    void *r = *p;
    *p += LOSS_ALIGN_UP(bytes);
    return r;
}

// loss_work_carve: split the caller's scratch into the LossWork arrays (same layout as loss_scratch_bytes).
static LossWork loss_work_carve(void *scratch, int B, int A, int max_boxes) {
    size_t M = (size_t)max_boxes;
    char *p = (char *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
    LossWork w;
    w.B = B; w.A = A; w.M = max_boxes;
    w.keep = loss_take(&p, sizeof(LossKeep));
    w.pbox = loss_take(&p, (size_t)B * A * 4 * sizeof(float));
    w.owner = loss_take(&p, (size_t)A * sizeof(int));
    w.align = loss_take(&p, (size_t)A * sizeof(float));
    w.o = loss_take(&p, (size_t)A * sizeof(float));
    w.m = loss_take(&p, (size_t)B * sizeof(int));
    w.gts = loss_take(&p, (size_t)B * M * sizeof(LossGt));
    w.cand = loss_take(&p, (size_t)B * M * LOSS_TOPK * sizeof(LossCand));
    w.nsel = loss_take(&p, (size_t)B * M * sizeof(int));
    w.max_align = loss_take(&p, M * sizeof(float));
    w.max_iou = loss_take(&p, M * sizeof(float));
    w.fg = loss_take(&p, (size_t)B * loss_fg_cap(A, max_boxes) * sizeof(LossFg));
    return w;
}

// ------------------------------------------------------------------------------------------
// CIoU and DFL decode (bbox_iou(..., CIoU=True) and bbox_decode of Ultralytics)
// ------------------------------------------------------------------------------------------

// bbox_ciou, bbox_ciou_backward and dfl_side_decode are in yolo.h: the device loss runs the same text.

// loss_ciou_alpha_grad: 0 (always, in training) treats CIoU's alpha as a constant like Ultralytics, whose
// gradient is then not the derivative of the forward value; tests set 1 to get the true derivative and
// check the whole chain against finite differences of the forward.
static int loss_ciou_alpha_grad = 0;

// loss_decode_box: predicted box (4) of anchor r (row-major index in level l) of image b, xyxy in grid
// units (anchor -/+ ltrb). p (4, 16) and lse (4) get the softmax and log-sum-exp of every side.
static void loss_decode_box(const LossGrid *g, int NC, const float *const head[3], int b, int l, int r,
                            float *box, float *p, float *lse) {
    size_t HW = (size_t)g->H[l] * g->W[l];
    const float *z = head[l] + (size_t)b * (64 + NC) * HW + r;   // (64+NC, H, W) of image b, at anchor r
    float ax = (float)(r % g->W[l]) + 0.5f, ay = (float)(r / g->W[l]) + 0.5f;
    float d[4];
    for (int s = 0; s < 4; s++) d[s] = dfl_side_decode(z + (size_t)s * LOSS_R * HW, HW, p + s * LOSS_R, lse + s);
    box[0] = ax - d[0]; box[1] = ay - d[1]; box[2] = ax + d[2]; box[3] = ay + d[3];
}

static inline int loss_anchor_level(const LossGrid *g, int a) { return a >= g->off[2] ? 2 : a >= g->off[1] ? 1 : 0; }

// ------------------------------------------------------------------------------------------
// task-aligned assigner, one image at a time (TaskAlignedAssigner, topk 10, alpha 0.5, beta 6)
// ------------------------------------------------------------------------------------------

// tal_metric: the assigner's metrics of gt against predicted box pb (pixels) at anchor centre (ax, ay)
// (pixels) with class logit `logit`. Returns 1 with o = max(CIoU(gt, pb), 0) and align = s^0.5 * o^6
// (s = sigmoid(logit)) when the centre is strictly inside the gt (select_candidates_in_gts, eps 1e-9)
// and mask_gt holds; returns 0 (metrics 0) otherwise. Matches get_box_metrics.
static inline int tal_metric(const LossGt *gt, float ax, float ay, const float *pb, float logit,
                             float *o, float *align) {
    float dmin = fminf(fminf(ax - gt->x1, ay - gt->y1), fminf(gt->x2 - ax, gt->y2 - ay));
    *o = 0.0f;
    *align = 0.0f;
    if (!gt->valid || !(dmin > 1e-9f)) return 0;
    float gb[4] = {gt->x1, gt->y1, gt->x2, gt->y2};
    float ov = fmaxf(bbox_ciou(gb, pb), 0.0f);
    float s = 1.0f / (1.0f + expf(-logit));
    *o = ov;
    *align = sqrtf(s) * powf(ov, 6.0f);
    return 1;
}

// tal_topk_gt: the candidates (mask_pos row) of one gt: top-10 align over all A anchors (CUDA torch.topk
// tie order, see DEVIATIONS), ANDed with the in-box mask. Visits only the anchor rectangle of the box on
// each level. cls_plane[l] points at the (H_l, W_l) logit plane of this gt's class in this image, pbox
// (A, 4) pixels. Writes up to 10 candidates to out, returns their count. Matches select_topk_candidates.
static int tal_topk_gt(const LossGrid *g, const LossGt *gt, const float *pbox, const float *const cls_plane[3],
                       LossCand *out) {
    if (!gt->valid) return 0;
    LossCand pos[LOSS_TOPK], zero[LOSS_TOPK];
    int npos = 0, nzero = 0;
    long npos_total = 0;
    for (int l = 0; l < 3; l++) {
        float s = g->stride[l];
        int x0 = (int)floorf(gt->x1 / s - 0.5f) - 1, x1 = (int)ceilf(gt->x2 / s - 0.5f) + 1;
        int y0 = (int)floorf(gt->y1 / s - 0.5f) - 1, y1 = (int)ceilf(gt->y2 / s - 0.5f) + 1;
        if (x0 < 0) x0 = 0;
        if (y0 < 0) y0 = 0;
        if (x1 > g->W[l] - 1) x1 = g->W[l] - 1;
        if (y1 > g->H[l] - 1) y1 = g->H[l] - 1;
        for (int y = y0; y <= y1; y++)
            for (int x = x0; x <= x1; x++) {
                int r = y * g->W[l] + x, a = g->off[l] + r;
                float o, al;
                if (!tal_metric(gt, ((float)x + 0.5f) * s, ((float)y + 0.5f) * s, pbox + (size_t)a * 4,
                                cls_plane[l][r], &o, &al))
                    continue;
                LossCand c = {a, al, o};
                if (al > 0.0f) {
                    npos_total++;
                    // sorted by align descending; equal align keeps the lower (earlier) anchor first
                    if (npos == LOSS_TOPK && !(al > pos[LOSS_TOPK - 1].align)) continue;
                    int i = npos < LOSS_TOPK ? npos++ : LOSS_TOPK - 1;
                    while (i > 0 && al > pos[i - 1].align) { pos[i] = pos[i - 1]; i--; }
                    pos[i] = c;
                } else if (nzero < LOSS_TOPK) {
                    zero[nzero++] = c;   // anchors come in increasing index: the first zeros are the lowest
                }
            }
    }
    int n = 0;
    for (int i = 0; i < npos; i++) out[n++] = pos[i];
    if (npos_total < LOSS_TOPK) {
        // topk fills the remaining slots with the lowest-index anchors of align 0 over all A anchors;
        // an inside zero at index a is preceded by a - (positives before a) zero-align anchors.
        int need = LOSS_TOPK - (int)npos_total;
        for (int i = 0; i < nzero; i++) {
            int before = 0;
            for (int j = 0; j < npos; j++) before += pos[j].a < zero[i].a;
            if (zero[i].a - before >= need) break;
            out[n++] = zero[i];
        }
    }
    return n;
}

// tal_decode_batch: predicted boxes (B, A, 4) in pixels of every anchor of every image that has boxes
// (pred_bboxes.detach() * stride_tensor).
static void tal_decode_batch(const LossGrid *g, int NC, const float *const head[3], int B, const int *m, float *pbox) {
    long n = (long)B * g->A;
    #pragma omp parallel for schedule(static)
    for (long i = 0; i < n; i++) {
        int b = (int)(i / g->A), a = (int)(i % g->A);
        if (m[b] == 0) continue;
        int l = loss_anchor_level(g, a);
        float p[4 * LOSS_R], lse[4], box[4];
        loss_decode_box(g, NC, head, b, l, a - g->off[l], box, p, lse);
        for (int k = 0; k < 4; k++) pbox[i * 4 + k] = box[k] * g->stride[l];
    }
}

// tal_topk_batch: tal_topk_gt for every gt of every image, in parallel over all gts of the batch.
// gts (B, M) with m (B) used per image; writes cand (B, M, 10) and nsel (B, M).
static void tal_topk_batch(const LossGrid *g, int NC, const float *const head[3], int B, int M, const int *m,
                           const LossGt *gts, const float *pbox, LossCand *cand, int *nsel) {
    long n = (long)B * M;
    #pragma omp parallel for schedule(dynamic, 1)
    for (long i = 0; i < n; i++) {
        int b = (int)(i / M), j = (int)(i % M);
        if (j >= m[b]) continue;
        const float *planes[3];
        for (int l = 0; l < 3; l++) {
            size_t HW = (size_t)g->H[l] * g->W[l];
            planes[l] = head[l] + ((size_t)b * (64 + NC) + 64 + gts[i].cls) * HW;
        }
        nsel[i] = tal_topk_gt(g, &gts[i], pbox + (size_t)b * g->A * 4, planes, cand + i * LOSS_TOPK);
    }
}

// tal_resolve_image: the rest of the assignment of image b once its gts (m, pixels) have their top-k
// candidates (cand (m, 10), nsel (m)) and pbox (A, 4) is decoded: one gt per anchor by the largest overlap
// over all gts (select_highest_overlaps; first max on ties), normalised soft targets
// (align * max_iou_j / (max_align_j + 1e-9)). Appends the foreground anchors, in anchor order, to fg and
// returns their count. Matches TaskAlignedAssigner._forward after get_pos_mask, and get_targets.
static int tal_resolve_image(const LossGrid *g, int NC, const float *const head[3], int b, const LossGt *gts,
                             int m, const LossCand *cand, const int *nsel, const float *pbox, LossWork *w,
                             LossFg *fg) {
    int A = g->A;
    if (m == 0) return 0;
    for (int a = 0; a < A; a++) w->owner[a] = -1;
    // claims; an anchor claimed twice is resolved below
    for (int j = 0; j < m; j++)
        for (int i = 0; i < nsel[j]; i++) {
            const LossCand *c = &cand[(size_t)j * LOSS_TOPK + i];
            if (w->owner[c->a] == -1) {
                w->owner[c->a] = j;
                w->align[c->a] = c->align;
                w->o[c->a] = c->o;
            } else {
                w->owner[c->a] = -2;
            }
        }
    for (int j = 0; j < m; j++) w->max_align[j] = w->max_iou[j] = 0.0f;
    for (int a = 0; a < A; a++) {
        if (w->owner[a] == -1) continue;
        if (w->owner[a] == -2) {
            // argmax over all gts of the overlap column (0 where the anchor is outside the gt)
            int l = loss_anchor_level(g, a), r = a - g->off[l];
            float s = g->stride[l], ax = ((float)(r % g->W[l]) + 0.5f) * s, ay = ((float)(r / g->W[l]) + 0.5f) * s;
            size_t HW = (size_t)g->H[l] * g->W[l];
            const float *zc = head[l] + ((size_t)b * (64 + NC) + 64) * HW + r;   // class logits at anchor, stride HW
            int best = 0;
            float best_o = -1.0f, best_al = 0.0f;
            for (int j = 0; j < m; j++) {
                float o, al;
                tal_metric(&gts[j], ax, ay, pbox + (size_t)a * 4, zc[(size_t)gts[j].cls * HW], &o, &al);
                if (o > best_o) { best_o = o; best = j; best_al = al; }
            }
            w->owner[a] = best;
            w->align[a] = best_al;
            w->o[a] = best_o;
        }
        int j = w->owner[a];
        if (w->align[a] > w->max_align[j]) w->max_align[j] = w->align[a];
        if (w->o[a] > w->max_iou[j]) w->max_iou[j] = w->o[a];
    }
    int n = 0;
    for (int a = 0; a < A; a++) {
        int j = w->owner[a];
        if (j < 0) continue;
        LossFg f = {b, a, gts[j].cls, w->align[a] * w->max_iou[j] / (w->max_align[j] + 1e-9f),
                    gts[j].x1, gts[j].y1, gts[j].x2, gts[j].y2};
        fg[n++] = f;
    }
    return n;
}

// loss_gather_gts: the boxes of image b in input order, pixels xyxy (preprocess + xywh2xyxy of Ultralytics:
// scale by (W, H, W, H), then centre -/+ half size), at most max_boxes; returns how many the image has.
static int loss_gather_gts(const LossTargets *tg, int b, int NC, int imgH, int imgW, int max_boxes, LossGt *gts) {
    int m = 0;
    for (int i = 0; i < tg->n; i++) {
        if (tg->batch_idx[i] != b) continue;
        if (tg->cls[i] < 0 || tg->cls[i] >= NC) die("loss: box %d has class %d, outside [0, %d)", i, tg->cls[i], NC);
        if (m < max_boxes) {
            const float *bx = tg->box + (size_t)i * 4;
            float cx = bx[0] * (float)imgW, cy = bx[1] * (float)imgH;
            float hw = bx[2] * (float)imgW / 2.0f, hh = bx[3] * (float)imgH / 2.0f;
            LossGt *q = &gts[m];
            q->x1 = cx - hw; q->y1 = cy - hh; q->x2 = cx + hw; q->y2 = cy + hh;
            q->cls = tg->cls[i];
            q->valid = ((q->x1 + q->y1) + q->x2) + q->y2 > 0.0f;
        }
        m++;
    }
    return m;
}

// ------------------------------------------------------------------------------------------
// loss forward + backward (v8DetectionLoss.__call__, BboxLoss, DFLoss)
// ------------------------------------------------------------------------------------------

// loss_fg_term: box (1 - CIoU) and DFL terms of one foreground anchor, unweighted; when dhead is not NULL
// also writes into dhead the gradient gb * d(1-CIoU) + gd * d(DFL) w.r.t. the anchor's 64 box logits.
static void loss_fg_term(const LossGrid *g, int NC, const float *const head[3], float *const dhead[3],
                         const LossFg *f, double gb, double gd, double *box_term, double *dfl_term) {
    int l = loss_anchor_level(g, f->a), r = f->a - g->off[l];
    size_t HW = (size_t)g->H[l] * g->W[l];
    float s = g->stride[l];
    float p[4 * LOSS_R], lse[4], pb[4];
    loss_decode_box(g, NC, head, f->b, l, r, pb, p, lse);
    float tb[4] = {f->x1 / s, f->y1 / s, f->x2 / s, f->y2 / s};   // target_bboxes /= stride_tensor
    *box_term = 1.0 - (double)bbox_ciou(pb, tb);
    // DFL: bbox2dist then DFLoss, targets clamped to [0, 14.99]
    float ax = (float)(r % g->W[l]) + 0.5f, ay = (float)(r / g->W[l]) + 0.5f;
    float t[4] = {ax - tb[0], ay - tb[1], tb[2] - ax, tb[3] - ay};
    const float *z = head[l] + (size_t)f->b * (64 + NC) * HW + r;
    double dfl = 0.0;
    int tl[4];
    float wl[4], wr[4];
    for (int k = 0; k < 4; k++) {
        float tk = fminf(fmaxf(t[k], 0.0f), (float)(LOSS_R - 1 - 0.01));
        tl[k] = (int)tk;
        wl[k] = (float)(tl[k] + 1) - tk;
        wr[k] = 1.0f - wl[k];
        const float *zk = z + (size_t)k * LOSS_R * HW;
        float ce_l = lse[k] - zk[(size_t)tl[k] * HW], ce_r = lse[k] - zk[(size_t)(tl[k] + 1) * HW];
        dfl += (double)(ce_l * wl[k] + ce_r * wr[k]);
    }
    *dfl_term = dfl / 4.0;
    if (!dhead) return;
    double db[4], dd[4];
    bbox_ciou_backward(pb, tb, -gb, loss_ciou_alpha_grad, db);
    dd[0] = -db[0]; dd[1] = -db[1]; dd[2] = db[2]; dd[3] = db[3];   // x1 = ax - l, x2 = ax + r
    float *dz = dhead[l] + (size_t)f->b * (64 + NC) * HW + r;
    for (int k = 0; k < 4; k++) {
        const float *pk = p + k * LOSS_R;
        double dist = 0.0;
        for (int i = 0; i < LOSS_R; i++) dist += (double)i * pk[i];
        for (int i = 0; i < LOSS_R; i++) {
            double gz = dd[k] * pk[i] * (i - dist);                    // through the expectation
            double tgt = (i == tl[k] ? wl[k] : 0.0) + (i == tl[k] + 1 ? wr[k] : 0.0);
            gz += gd / 4.0 * ((double)pk[i] * ((double)wl[k] + wr[k]) - tgt);   // through the CE
            dz[(size_t)(k * LOSS_R + i) * HW] = (float)gz;
        }
    }
}

static int loss_cap_warned;

// loss_forward_backward: the YOLOv8 detection loss of a batch and (dhead != NULL) its gradient, see the
// comment at the top of this section for shapes and semantics. Matches v8DetectionLoss.__call__.
static LossOut loss_forward_backward(const LossConfig *cfg, int B, int NC, int imgH, int imgW,
                                     const float *const head[3], float *const dhead[3], const LossTargets *tg,
                                     float grad_scale, void *scratch, size_t scratch_bytes, int flags) {
    LossGrid g = loss_grid_make(imgH, imgW);
    int A = g.A, M = cfg->max_boxes;
    if (M <= 0) die("loss: max_boxes=%d must be positive", M);
    if (scratch_bytes < loss_scratch_bytes(B, A, M))
        die("loss: scratch of %zu bytes, need loss_scratch_bytes(B=%d, A=%d, max_boxes=%d) = %zu", scratch_bytes, B,
            A, M, loss_scratch_bytes(B, A, M));
    LossWork w = loss_work_carve(scratch, B, A, M);
    int want_grad = dhead && dhead[0] && dhead[1] && dhead[2];
    LossOut out;
    memset(&out, 0, sizeof out);

    // 1. assignment (decode and per-gt top-k for the whole batch, then overlaps resolved image by image);
    //    target_scores_sum over the whole batch
    if (flags & LOSS_REUSE_ASSIGNMENT) {
        if (w.keep->B != B || w.keep->A != A || w.keep->max_boxes != M)
            die("loss: LOSS_REUSE_ASSIGNMENT with a scratch from a different batch shape");
    } else {
        for (int i = 0; i < tg->n; i++)
            if (tg->batch_idx[i] < 0 || tg->batch_idx[i] >= B)
                die("loss: box %d has batch_idx %d, outside [0, %d)", i, tg->batch_idx[i], B);
        int n_fg = 0, cap = loss_fg_cap(A, M);
        double tss = 0.0;
        for (int b = 0; b < B; b++) {
            int m = loss_gather_gts(tg, b, NC, imgH, imgW, M, w.gts + (size_t)b * M);
            if (m > M) { out.n_over_cap += m - M; out.n_images_over_cap++; m = M; }
            w.m[b] = m;
        }
        tal_decode_batch(&g, NC, head, B, w.m, w.pbox);
        tal_topk_batch(&g, NC, head, B, M, w.m, w.gts, w.pbox, w.cand, w.nsel);
        for (int b = 0; b < B; b++) {
            size_t o = (size_t)b * M;
            int nf = tal_resolve_image(&g, NC, head, b, w.gts + o, w.m[b], w.cand + o * LOSS_TOPK, w.nsel + o,
                                       w.pbox + (size_t)b * A * 4, &w, w.fg + n_fg);
            if (nf > cap) die("loss: internal error, %d foreground anchors in one image (cap %d)", nf, cap);
            for (int i = 0; i < nf; i++) tss += w.fg[n_fg + i].score;
            n_fg += nf;
        }
        w.keep->B = B; w.keep->A = A; w.keep->max_boxes = M;
        w.keep->n_fg = n_fg;
        w.keep->tss = tss > 1.0 ? tss : 1.0;
        if (out.n_over_cap && !loss_cap_warned) {
            loss_cap_warned = 1;
            fprintf(stderr, "warning: %d boxes in %d images were over the max_boxes=%d cap and are ignored by the "
                    "loss (reported once; raise max_boxes to keep them)\n", out.n_over_cap, out.n_images_over_cap, M);
        }
    }
    int n_fg = w.keep->n_fg;
    double tss = w.keep->tss;
    const LossFg *fg = w.fg;

    // 2. classification: BCE over all B*A*NC logits with target 0, then the foreground corrections
    double g_cls = (double)B * cfg->cls * grad_scale / tss;
    float g_clsf = (float)g_cls;
    double bce = 0.0;
    // one pass over every (level, image, channel) plane: BCE on class planes, zero box-logit gradients
    // (background anchors have none; the foreground ones are written in step 3)
    int C = 64 + NC, nplane = 3 * B * C;
    #pragma omp parallel for reduction(+:bce) schedule(dynamic, 4)
    for (int pl = 0; pl < nplane; pl++) {
        int l = pl / (B * C), bc = pl % (B * C), c = bc % C;
        size_t HW = (size_t)g.H[l] * g.W[l];
        float *dx = want_grad ? dhead[l] + (size_t)bc * HW : NULL;   // (H, W)
        if (c < 64) {
            if (dx) memset(dx, 0, HW * sizeof(float));
            continue;
        }
        const float *x = head[l] + (size_t)bc * HW;   // (H, W)
        double acc = 0.0;   // glibc expf/log1pf; a branch-free polynomial version measured slower here
        for (size_t i = 0; i < HW; i++) {
            float e = expf(-fabsf(x[i]));
            acc += (double)(fmaxf(x[i], 0.0f) + log1pf(e));
            if (dx) dx[i] = g_clsf * ((x[i] >= 0.0f ? 1.0f : e) / (1.0f + e));   // sigmoid(x)
        }
        bce += acc;
    }
    for (int i = 0; i < n_fg; i++) {
        const LossFg *f = &fg[i];
        int l = loss_anchor_level(&g, f->a), r = f->a - g.off[l];
        size_t HW = (size_t)g.H[l] * g.W[l], at = ((size_t)f->b * (64 + NC) + 64 + f->cls) * HW + r;
        float x = head[l][at];
        bce -= (double)x * f->score;
        if (want_grad) dhead[l][at] = (float)(g_cls * (1.0 / (1.0 + exp(-(double)x)) - f->score));
    }

    // 3. box and DFL over the foreground anchors
    double box_sum = 0.0, dfl_sum = 0.0;
    double kb = (double)B * cfg->box * grad_scale / tss, kd = (double)B * cfg->dfl * grad_scale / tss;
    #pragma omp parallel for reduction(+:box_sum, dfl_sum) schedule(dynamic, 16)
    for (int i = 0; i < n_fg; i++) {
        double bt, dt, wa = fg[i].score;
        loss_fg_term(&g, NC, head, want_grad ? dhead : NULL, &fg[i], kb * wa, kd * wa, &bt, &dt);
        box_sum += bt * wa;
        dfl_sum += dt * wa;
    }

    out.box = cfg->box * box_sum / tss;
    out.cls = cfg->cls * bce / tss;
    out.dfl = cfg->dfl * dfl_sum / tss;
    out.total = B * (out.box + out.cls + out.dfl);
    out.n_fg = n_fg;
    out.target_scores_sum = tss;
    return out;
}

// ------------------------------------------------------------------------------------------
// the step: forward, loss, backward, on any backend
// ------------------------------------------------------------------------------------------

// cpu_loss: the CPU backend's loss (loss_forward_backward, FP32), its scratch from the arena; in
// training the gradient goes to m->dhead (walk_head_grad)
static LossOut cpu_loss(Exec *e, const LossTargets *tg, const LossConfig *lcfg) {
    Model *m = e->m;
    LossOut lo = {0};
    size_t lb = loss_scratch_bytes(m->B, loss_num_anchors(m->H, m->W), lcfg->max_boxes);
    void *scratch = arena_alloc(e->a, lb, G_LOSS);
    if (tg && !arena_dry(e->a))
        lo = loss_forward_backward(lcfg, m->B, m->nc, m->H, m->W, (const float *const *)m->head,
                                   m->infer ? NULL : m->dhead, tg, 1.f, scratch, lb, 0);
    arena_free(e->a, scratch);
    return lo;
}

// walk_step: one step, the same schedule on every backend and in its dry run (tg NULL), which is
// what the plans measure: the forward; unless m->infer, the head gradient buffers; the loss; then
// the backward, except after a non-finite loss (no NaN reaches the gradients: the step's buffers
// are freed instead). With m->infer the caller reads m->head, then walk_release.
static LossOut walk_step(Exec *e, const LossTargets *tg, const LossConfig *lcfg) {
    Model *m = e->m;
    walk_forward(e);
    if (!m->infer) walk_head_grad(e, !tg);
    LossOut lo = e->be->loss(e, tg, lcfg);
    if (m->infer) return lo;
    if (tg && !isfinite(lo.total)) {
        for (int i = 0; i < 3; i++) arena_free(e->a, m->dhead[i]), m->dhead[i] = NULL;
        walk_release(e);
        return lo;
    }
    walk_backward(e);
    return lo;
}

// ------------------------------------------------------------------------------------------
// optimizer, gradient clipping, EMA
// ------------------------------------------------------------------------------------------
/*
 * Ultralytics' three parameter groups (BaseTrainer.build_optimizer): pg0 every "bias" (BN beta
 * and the Detect output biases, no decay), pg1 conv weights (decay), pg2 BN gamma (no decay). The
 * frozen DFL weight is in no group. Parameters live in one flat array, so a group is a list of
 * segments.
 */
enum { PG_BIAS, PG_WEIGHT, PG_BN, PG_N };
enum { OPT_SGD, OPT_ADAMW };

typedef struct {
    int kind;                  // OPT_SGD (Nesterov) or OPT_ADAMW (decoupled decay)
    double lr[PG_N];           // per-group learning rate (set every iteration by the schedule)
    double momentum;           // SGD momentum / Adam beta1
    double beta2, eps;         // AdamW
    double weight_decay;       // applied to PG_WEIGHT only
    long step;                 // optimizer steps taken (Adam bias correction)
    float *m, *v;              // (nparams) momentum buffer / Adam moments; v NULL for SGD
} Optimizer;

// param_group_of: the group of each conv tensor: 0 weight, 1 bias/beta, 2 gamma
static void model_segments(const Model *m, int conv, size_t off[3], size_t len[3], int pg[3]) {
    const Conv *c = &m->conv[conv];
    off[0] = c->w_off; len[0] = (size_t)c->cout * c->cin * c->k * c->k; pg[0] = PG_WEIGHT;
    off[1] = c->b_off; len[1] = c->cout; pg[1] = PG_BIAS;
    off[2] = c->g_off; len[2] = c->bn ? (size_t)c->cout : 0; pg[2] = PG_BN;
}

#define GRAD_CLIP_NORM 10.0   // max_norm of the clip_grad_norm_ in Ultralytics' BaseTrainer.optimizer_step

// grad_clip_norm: torch.nn.utils.clip_grad_norm_(params, max_norm): total L2 norm over all
// trainable gradients (DFL excluded); scales them by min(1, max_norm / (norm + 1e-6)).
// Returns the norm before clipping (inf/NaN propagate, so the caller can skip the step).
static double grad_clip_norm(Model *m, double max_norm) {
    // fixed chunks summed in a fixed order: the same bits for any number of threads
    enum { NCHUNK = 64 };
    double part[NCHUNK], ss = 0;
    size_t chunk = (m->nparams + NCHUNK - 1) / NCHUNK;
#pragma omp parallel for
    for (int c = 0; c < NCHUNK; c++) {
        double s = 0;
        size_t hi = (c + 1) * chunk < m->nparams ? (c + 1) * chunk : m->nparams;
        for (size_t i = c * chunk; i < hi; i++)
            if (i < m->dfl_off || i >= m->dfl_off + REG_MAX) s += (double)m->grads[i] * m->grads[i];
        part[c] = s;
    }
    for (int c = 0; c < NCHUNK; c++) ss += part[c];
    double norm = sqrt(ss), coef = max_norm / (norm + 1e-6);
    if (coef < 1 && isfinite(norm)) {
        float c = (float)coef;
#pragma omp parallel for
        for (size_t i = 0; i < m->nparams; i++) m->grads[i] *= c;
    }
    return norm;
}

// optim_step: one SGD (torch.optim.SGD, nesterov, decay added to the gradient) or AdamW
// (torch.optim.AdamW: decoupled decay p *= 1 - lr*wd, bias-corrected moments, eps 1e-8) update of
// every trainable parameter, with the group's lr and decay.
static void optim_step(Optimizer *o, Model *m) {
    o->step++;
    double bc1 = 1 - pow(o->momentum, (double)o->step), bc2 = 1 - pow(o->beta2, (double)o->step);
    for (int ci = 0; ci < m->nconv; ci++) {
        size_t off[3], len[3];
        int pg[3];
        model_segments(m, ci, off, len, pg);
        for (int s = 0; s < 3; s++) {
            float lr = (float)o->lr[pg[s]], wd = pg[s] == PG_WEIGHT ? (float)o->weight_decay : 0.f,
                  mom = (float)o->momentum;
            float *p = m->params + off[s], *g = m->grads + off[s], *mb = o->m + off[s];
            if (o->kind == OPT_SGD) {
                int first = o->step == 1;
                for (size_t i = 0; i < len[s]; i++) {
                    float gi = g[i] + wd * p[i];
                    mb[i] = first ? gi : mom * mb[i] + gi;
                    p[i] -= lr * (gi + mom * mb[i]);
                }
            } else {
                float *vb = o->v + off[s], b1 = mom, b2 = (float)o->beta2;
                float step = (float)(o->lr[pg[s]] / bc1), sq = (float)sqrt(bc2), eps = (float)o->eps;
                for (size_t i = 0; i < len[s]; i++) {
                    p[i] *= 1 - lr * wd;
                    mb[i] = b1 * mb[i] + (1 - b1) * g[i];
                    vb[i] = b2 * vb[i] + (1 - b2) * g[i] * g[i];
                    p[i] -= step * mb[i] / (sqrtf(vb[i]) / sq + eps);
                }
            }
        }
    }
}

// Ema: ModelEMA (utils/torch_utils.py): a copy of the weights and BN running stats,
// ema = d*ema + (1-d)*model after every optimizer step, d = 0.9999 * (1 - exp(-updates / 2000)).
typedef struct {
    float *params, *buffers;   // (nparams), (nbuffers)
    long updates;
} Ema;

// ema_decay: d of the given update count (ModelEMA decay 0.9999, tau 2000); the CPU and the device EMA use it
static float ema_decay(long updates) { return (float)(0.9999 * (1 - exp(-(double)updates / 2000.0))); }

static void ema_update(Ema *e, const Model *m) {
    e->updates++;
    float d = ema_decay(e->updates);
#pragma omp parallel for
    for (size_t i = 0; i < m->nparams; i++) e->params[i] = d * e->params[i] + (1 - d) * m->params[i];
    for (size_t i = 0; i < m->nbuffers; i++) e->buffers[i] = d * e->buffers[i] + (1 - d) * m->buffers[i];
}

// ------------------------------------------------------------------------------------------
// weights: safetensors with Ultralytics state_dict names
// ------------------------------------------------------------------------------------------
/*
 * weights: safetensors reading and writing, with Ultralytics state_dict names.
 *
 * File format (https://github.com/huggingface/safetensors): u64 little-endian N, then N bytes of
 * JSON {name: {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
 * "__metadata__": {str: str}}, padded with spaces to a multiple of 8, then the data section
 * (offsets are relative to its first byte; little-endian, row-major).
 *
 * Public API
 *   ParamRef                      one state_dict entry of the model: name, shape, float data and
 *                                 kind (PARAM_TRAIN, PARAM_BUFFER, PARAM_COUNT; a PARAM_COUNT such
 *                                 as bn.num_batches_tracked has data NULL and its value in .count)
 *   weights_save(path, refs, n, meta_kv, dtype, err, errlen) -> 0 / -1
 *                                 writes refs in order, floats as ST_F32, ST_F16 or ST_BF16, counters
 *                                 as I64 scalars (shape []); meta_kv is NULL or a NULL-terminated
 *                                 list of key, value strings. Atomic: path.tmp, fsync, rename, fsync
 *                                 of the directory; a failure leaves an old file at path untouched.
 *   weights_load(path, refs, n, err, errlen) -> 0 / -1
 *                                 every ref must be in the file with the same shape, and every
 *                                 float tensor of the file must be a ref (integer *.num_batches_tracked
 *                                 tensors without a ref are skipped); NaN/Inf is an error. Nothing
 *                                 in refs changes unless the whole file validates.
 *   weights_load_st(st, refs, n, prefix, allow_extra, err, errlen)
 *                                 the same on an open file, with names prefix+ref.name (e.g. "ema.")
 *                                 and, when allow_extra, other tensors in the file allowed (checkpoints).
 *   weights_infer(path, &nc, &scale, err, errlen) -> 0 / -1
 *                                 nc from model.22.cv3.0.2.weight dim 0, scale 'n'..'x' from
 *                                 model.0.conv.weight dim 0 (16, 32, 48, 64, 80).
 *   Generic layer (checkpoints: model + "optim.*" tensors + metadata in one file):
 *   st_write(path, StTensor *t, n, meta_kv, err, errlen) -> 0 / -1   atomic, as weights_save
 *   st_open(path, &st, err, errlen) -> 0 / -1   parses and validates the whole header (sizes,
 *                                 bounds, overlaps, duplicates) before any data is read
 *   st_open_stream(FILE *f, label, &st, err, errlen)   the same on an open stream (takes f)
 *   st_find(&st, name) -> const StEntry * or NULL
 *   st_meta(&st, key) -> const char * or NULL
 *   st_read_f32(&st, e, float *dst, err, errlen)     F32/F16/BF16/F64 -> float, numel values
 *   st_read_i64(&st, e, int64_t *dst, err, errlen)   any integer or BOOL dtype -> int64
 *   st_close(&st)
 *   half_to_float, float_to_half (round to nearest even), bf16_to_float, float_to_bf16.
 * Every error string starts with the file name and names the offending tensor or key.
 */

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "safetensors data is little-endian and is read with memcpy: needs a little-endian host");

// ------------------------------------------------------------------------------------------
// half and bfloat16 conversions
// ------------------------------------------------------------------------------------------

static uint32_t f32_bits(float x) { uint32_t u; memcpy(&u, &x, 4); return u; }
static float bits_f32(uint32_t u) { float x; memcpy(&x, &u, 4); return x; }

// half_to_float: IEEE binary16 -> binary32, exact (subnormals normalised, inf and NaN payload kept).
static float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (exp == 0) {
        if (man == 0) return bits_f32(sign);
        int e = -1;                          // subnormal: shift the leading 1 up to bit 10
        do { e++; man <<= 1; } while (!(man & 0x400u));
        return bits_f32(sign | (uint32_t)(127 - 15 - e) << 23 | (man & 0x3ffu) << 13);
    }
    if (exp == 31) return bits_f32(sign | 0x7f800000u | man << 13);
    return bits_f32(sign | (exp + 112) << 23 | man << 13);
}

// float_to_half: binary32 -> binary16 with round-to-nearest-even; overflow gives inf, NaN stays
// NaN (quiet, top payload bits kept), tiny values become subnormals or signed zero.
static uint16_t float_to_half(float x) {
    uint32_t f = f32_bits(x), sign = (f >> 16) & 0x8000u, a = f & 0x7fffffffu;
    if (a >= 0x7f800000u) return (uint16_t)(sign | 0x7c00u | (a > 0x7f800000u ? 0x200u | ((a >> 13) & 0x3ffu) : 0));
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);        // >= 65520 rounds to inf
    if (a < 0x38800000u) {                                           // below 2^-14: subnormal half
        if (a < 0x33000000u) return (uint16_t)sign;                  // < 2^-25 (2^-25 itself ties to 0)
        uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u, s = 126 - e;   // s in [14, 24]
        uint32_t h = m >> s, rem = m & ((1u << s) - 1), half = 1u << (s - 1);
        if (rem > half || (rem == half && (h & 1))) h++;
        return (uint16_t)(sign | h);
    }
    uint32_t h = (a >> 13) - (112u << 10), rem = a & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) h++;         // a carry rolls into the exponent
    return (uint16_t)(sign | h);
}

// bf16_to_float: bfloat16 is the top half of a binary32, so this is exact.
static float bf16_to_float(uint16_t b) { return bits_f32((uint32_t)b << 16); }

// float_to_bf16: round to nearest even on the dropped 16 bits; NaN stays a quiet NaN.
static uint16_t float_to_bf16(float x) {
    uint32_t f = f32_bits(x);
    if ((f & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((f >> 16) | 0x40u);
    return (uint16_t)((f + 0x7fffu + ((f >> 16) & 1)) >> 16);
}

// ------------------------------------------------------------------------------------------
// dtypes, tables and errors
// ------------------------------------------------------------------------------------------

enum { ST_BOOL, ST_U8, ST_I8, ST_U16, ST_I16, ST_F16, ST_BF16, ST_U32, ST_I32, ST_F32, ST_U64, ST_I64, ST_F64,
       ST_NDTYPE };
static const char *const st_dtype_name[ST_NDTYPE] = {"BOOL", "U8", "I8", "U16", "I16", "F16", "BF16",
                                                     "U32", "I32", "F32", "U64", "I64", "F64"};
static const int st_dtype_size[ST_NDTYPE] = {1, 1, 1, 2, 2, 2, 2, 4, 4, 4, 8, 8, 8};
static int st_dtype_is_float(int d) { return d == ST_F16 || d == ST_BF16 || d == ST_F32 || d == ST_F64; }

#define ST_MAXDIM 8
#define ST_MAX_HEADER 100000000ull        // the reference implementation's header cap

typedef struct {
    char *name;
    int dtype;                   // ST_F32, ST_F16, ...
    int ndim;                    // 0 (scalar) .. ST_MAXDIM
    int64_t shape[ST_MAXDIM];
    int64_t numel;
    uint64_t begin, end;         // byte range inside the data section
} StEntry;

typedef struct {
    char *path;                  // label used in error messages
    FILE *f;
    uint64_t data_start;         // file offset of the data section (8 + header length)
    uint64_t data_size;          // bytes from data_start to the end of the file
    StEntry *t;                  // (n) tensors in header order
    int n, cap;
    StEntry **by_name;           // (n) sorted by name, for st_find
    char **meta;                 // (2 * nmeta) key, value, key, value ...
    int nmeta, metacap;
    void *mem;                   // a .pt file's tensors, held in memory behind f (freed by st_close)
} SafeTensors;

// one tensor to write: floats (dtype F32/F16/BF16, data = const float *) or I64 (data = const int64_t *)
typedef struct {
    const char *name;
    int dtype;
    int ndim;
    int64_t shape[ST_MAXDIM];
    const void *data;
} StTensor;

// st_fail: format an error into err (if any) and return -1.
static int st_fail(char *err, size_t errlen, const char *fmt, ...) {
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return -1;
}

// st_shape_str: "(16, 3, 3, 3)" into buf; "()" for a scalar.
static const char *st_shape_str(char *buf, size_t len, int ndim, const int64_t *shape) {
    size_t k = (size_t)snprintf(buf, len, "(");
    for (int i = 0; i < ndim && k < len; i++)
        k += (size_t)snprintf(buf + k, len - k, "%s%" PRId64, i ? ", " : "", shape[i]);
    if (k < len) snprintf(buf + k, len - k, ")");
    return buf;
}

// ------------------------------------------------------------------------------------------
// strict JSON parser for the header (only what safetensors uses: objects, strings, integers)
// ------------------------------------------------------------------------------------------

typedef struct {
    const unsigned char *s;
    size_t n, i;
    const char *path;
    char *err;
    size_t errlen;
} StJson;

static void json_ws(StJson *j) {
    while (j->i < j->n && (j->s[j->i] == ' ' || j->s[j->i] == '\t' || j->s[j->i] == '\n' || j->s[j->i] == '\r')) j->i++;
}

// json_found: describe the byte at the cursor for an error message.
static const char *json_found(StJson *j, char *buf, size_t len) {
    if (j->i >= j->n) snprintf(buf, len, "end of header");
    else if (j->s[j->i] >= 0x20 && j->s[j->i] < 0x7f) snprintf(buf, len, "'%c'", j->s[j->i]);
    else snprintf(buf, len, "byte 0x%02x", j->s[j->i]);
    return buf;
}

// json_expect: skip whitespace and consume the character c; ctx says where we are.
static int json_expect(StJson *j, int c, const char *ctx) {
    json_ws(j);
    if (j->i < j->n && j->s[j->i] == c) { j->i++; return 0; }
    char b[32];
    return st_fail(j->err, j->errlen, "'%s': header JSON: expected '%c' %s at byte %zu, found %s",
                   j->path, c, ctx, j->i, json_found(j, b, sizeof b));
}

// utf8_seq: length of the valid UTF-8 sequence at s (n bytes left), 0 if invalid (overlong,
// surrogate, above U+10FFFF or truncated).
static int utf8_seq(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    if (c < 0x80) return 1;
    int len; unsigned cp, min;
    if (c >= 0xc2 && c <= 0xdf) { len = 2; cp = c & 0x1f; min = 0x80; }
    else if (c >= 0xe0 && c <= 0xef) { len = 3; cp = c & 0x0f; min = 0x800; }
    else if (c >= 0xf0 && c <= 0xf4) { len = 4; cp = c & 0x07; min = 0x10000; }
    else return 0;
    if ((size_t)len > n) return 0;
    for (int k = 1; k < len; k++) {
        if ((s[k] & 0xc0) != 0x80) return 0;
        cp = cp << 6 | (s[k] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
    return len;
}

// json_hex4: four hex digits at s -> value, or -1.
static int json_hex4(const unsigned char *s) {
    int v = 0;
    for (int k = 0; k < 4; k++) {
        int c = s[k],
            d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

// json_string: parse a string into a new NUL-terminated UTF-8 buffer (*out, caller frees).
// Escapes \" \\ \/ \b \f \n \r \t \uXXXX (surrogate pairs combined); raw control bytes, invalid
// UTF-8 and \u0000 (names are C strings) are errors.
static int json_string(StJson *j, char **out, const char *ctx) {
    *out = NULL;
    json_ws(j);
    if (j->i >= j->n || j->s[j->i] != '"') {
        char b[32];
        return st_fail(j->err, j->errlen, "'%s': header JSON: expected a string %s at byte %zu, found %s",
                       j->path, ctx, j->i, json_found(j, b, sizeof b));
    }
    size_t start = ++j->i, k = start;
    while (k < j->n && j->s[k] != '"') k += j->s[k] == '\\' ? 2 : 1;
    if (k >= j->n)
        return st_fail(j->err, j->errlen, "'%s': header JSON: unterminated string %s starting at byte %zu",
                       j->path, ctx, start - 1);
    char *o = xmalloc(k - start + 1);   // decoded text is never longer than its source
    size_t w = 0;
    while (j->i < k) {
        unsigned c = j->s[j->i];
        if (c < 0x20) goto bad_ctrl;
        if (c != '\\') {
            int len = utf8_seq(j->s + j->i, k - j->i);
            if (!len) goto bad_utf8;
            memcpy(o + w, j->s + j->i, (size_t)len);
            w += (size_t)len; j->i += (size_t)len;
            continue;
        }
        unsigned e = j->s[j->i + 1];     // j->i + 1 < k + 1 <= n: the scan above guarantees it
        j->i += 2;
        switch (e) {
        case '"': o[w++] = '"'; break;
        case '\\': o[w++] = '\\'; break;
        case '/': o[w++] = '/'; break;
        case 'b': o[w++] = '\b'; break;
        case 'f': o[w++] = '\f'; break;
        case 'n': o[w++] = '\n'; break;
        case 'r': o[w++] = '\r'; break;
        case 't': o[w++] = '\t'; break;
        case 'u': {
            int cp = j->i + 4 <= k ? json_hex4(j->s + j->i) : -1;
            if (cp < 0) goto bad_escape;
            j->i += 4;
            if (cp >= 0xd800 && cp <= 0xdbff) {   // high surrogate: a low one must follow
                int lo = j->i + 6 <= k && j->s[j->i] == '\\' && j->s[j->i + 1] == 'u' ? json_hex4(j->s + j->i + 2) : -1;
                if (lo < 0xdc00 || lo > 0xdfff) goto bad_escape;
                j->i += 6;
                cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
            } else if (cp >= 0xdc00 && cp <= 0xdfff) goto bad_escape;
            if (cp == 0) goto bad_escape;
            if (cp < 0x80) o[w++] = (char)cp;
            else if (cp < 0x800) { o[w++] = (char)(0xc0 | cp >> 6); o[w++] = (char)(0x80 | (cp & 0x3f)); }
            else if (cp < 0x10000) {
                o[w++] = (char)(0xe0 | cp >> 12);
                o[w++] = (char)(0x80 | ((cp >> 6) & 0x3f));
                o[w++] = (char)(0x80 | (cp & 0x3f));
            } else {
                o[w++] = (char)(0xf0 | cp >> 18); o[w++] = (char)(0x80 | ((cp >> 12) & 0x3f));
                o[w++] = (char)(0x80 | ((cp >> 6) & 0x3f)); o[w++] = (char)(0x80 | (cp & 0x3f));
            }
            break;
        }
        default: goto bad_escape;
        }
    }
    o[w] = 0;
    j->i = k + 1;
    *out = o;
    return 0;
bad_ctrl:
    free(o);
    return st_fail(j->err, j->errlen, "'%s': header JSON: raw control byte 0x%02x in string %s at byte %zu",
                   j->path, j->s[j->i], ctx, j->i);
bad_utf8:
    free(o);
    return st_fail(j->err, j->errlen, "'%s': header JSON: invalid UTF-8 in string %s at byte %zu", j->path, ctx, j->i);
bad_escape:
    free(o);
    return st_fail(j->err, j->errlen, "'%s': header JSON: bad escape sequence in string %s near byte %zu",
                   j->path, ctx, j->i);
}

// json_uint: a non-negative integer without sign, fraction, exponent or leading zeros, <= INT64_MAX.
static int json_uint(StJson *j, uint64_t *out, const char *ctx) {
    json_ws(j);
    size_t start = j->i;
    uint64_t v = 0;
    while (j->i < j->n && j->s[j->i] >= '0' && j->s[j->i] <= '9') {
        unsigned d = j->s[j->i] - '0';
        if (v > ((uint64_t)INT64_MAX - d) / 10)
            return st_fail(j->err, j->errlen, "'%s': header JSON: integer too large %s at byte %zu", j->path, ctx,
                           start);
        v = v * 10 + d;
        j->i++;
    }
    char b[32];
    if (j->i == start)
        return st_fail(j->err, j->errlen, "'%s': header JSON: expected a non-negative integer %s at byte %zu, found %s",
                       j->path, ctx, start, json_found(j, b, sizeof b));
    if (j->i - start > 1 && j->s[start] == '0')
        return st_fail(j->err, j->errlen, "'%s': header JSON: integer with a leading zero %s at byte %zu", j->path, ctx,
                       start);
    if (j->i < j->n && (j->s[j->i] == '.' || j->s[j->i] == 'e' || j->s[j->i] == 'E'))
        return st_fail(j->err, j->errlen,
                       "'%s': header JSON: expected an integer %s at byte %zu, found a fraction or exponent", j->path,
                       ctx, start);
    *out = v;
    return 0;
}

// json_uint_array: [a, b, ...] with at most max elements into v; *count gets the length.
static int json_uint_array(StJson *j, uint64_t *v, int max, int *count, const char *ctx) {
    *count = 0;
    if (json_expect(j, '[', ctx)) return -1;
    json_ws(j);
    if (j->i < j->n && j->s[j->i] == ']') { j->i++; return 0; }
    for (;;) {
        if (*count == max)
            return st_fail(j->err, j->errlen, "'%s': header JSON: more than %d values %s at byte %zu", j->path, max,
                           ctx, j->i);
        if (json_uint(j, &v[*count], ctx)) return -1;
        (*count)++;
        json_ws(j);
        if (j->i < j->n && j->s[j->i] == ',') { j->i++; continue; }
        return json_expect(j, ']', ctx);
    }
}

// ------------------------------------------------------------------------------------------
// header parse and validation
// ------------------------------------------------------------------------------------------

// st_parse_meta: "__metadata__": {"key": "value", ...}; values must be strings.
static int st_parse_meta(StJson *j, SafeTensors *st) {
    if (json_expect(j, '{', "to open __metadata__")) return -1;
    json_ws(j);
    if (j->i < j->n && j->s[j->i] == '}') { j->i++; return 0; }
    for (;;) {
        if (st->nmeta == st->metacap) {
            st->metacap = st->metacap ? 2 * st->metacap : 8;
            st->meta = realloc(st->meta, sizeof(char *) * 2 * (size_t)st->metacap);
            if (!st->meta) die("out of memory reading the header of '%s'", st->path);
        }
        char **kv = st->meta + 2 * st->nmeta;
        if (json_string(j, &kv[0], "as a __metadata__ key")) return -1;
        kv[1] = NULL;
        st->nmeta++;
        if (json_expect(j, ':', "after a __metadata__ key")) return -1;
        json_ws(j);
        if (j->i >= j->n || j->s[j->i] != '"')
            return st_fail(j->err, j->errlen,
                           "'%s': header: __metadata__ value of key '%.100s' is not a string (byte %zu)", j->path,
                           kv[0], j->i);
        if (json_string(j, &kv[1], "as a __metadata__ value")) return -1;
        json_ws(j);
        if (j->i < j->n && j->s[j->i] == ',') { j->i++; continue; }
        return json_expect(j, '}', "to close __metadata__");
    }
}

// st_parse_tensor: {"dtype": .., "shape": [..], "data_offsets": [b, e]} into e, then check that
// the dtype is known, the byte range lies in the data section and matches dtype size x numel.
static int st_parse_tensor(StJson *j, StEntry *e, uint64_t data_size) {
    const char *nm = e->name;
    int have_dtype = 0, have_shape = 0, have_off = 0;
    uint64_t off[2] = {0, 0}, shp[ST_MAXDIM];
    if (json_expect(j, '{', "to open a tensor entry")) return -1;
    json_ws(j);
    if (!(j->i < j->n && j->s[j->i] == '}'))
        for (;;) {
            char *key;
            if (json_string(j, &key, "as a tensor field name")) return -1;
            int rc = json_expect(j, ':', "after a tensor field name");
            if (!rc && strcmp(key, "dtype") == 0) {
                char *v = NULL;
                if (have_dtype)
                    rc = st_fail(j->err, j->errlen, "'%s': header: tensor '%.200s': duplicate field 'dtype'", j->path,
                                 nm);
                else if (!(rc = json_string(j, &v, "as dtype"))) {
                    e->dtype = -1;
                    for (int d = 0; d < ST_NDTYPE; d++) if (strcmp(v, st_dtype_name[d]) == 0) e->dtype = d;
                    if (e->dtype < 0)
                        rc = st_fail(j->err, j->errlen, "'%s': header: tensor '%.200s': unsupported dtype '%.40s' "
                                     "(known: F64 F32 F16 BF16 I64 I32 I16 I8 U64 U32 U16 U8 BOOL)", j->path, nm, v);
                }
                free(v);
                have_dtype = 1;
            } else if (!rc && strcmp(key, "shape") == 0) {
                if (have_shape)
                    rc = st_fail(j->err, j->errlen, "'%s': header: tensor '%.200s': duplicate field 'shape'", j->path,
                                 nm);
                else rc = json_uint_array(j, shp, ST_MAXDIM, &e->ndim, "in shape");
                have_shape = 1;
            } else if (!rc && strcmp(key, "data_offsets") == 0) {
                int cnt = 0;
                if (have_off)
                    rc = st_fail(j->err, j->errlen, "'%s': header: tensor '%.200s': duplicate field 'data_offsets'",
                                 j->path, nm);
                else if (!(rc = json_uint_array(j, off, 2, &cnt, "in data_offsets")) && cnt != 2)
                    rc = st_fail(j->err, j->errlen,
                                 "'%s': header: tensor '%.200s': data_offsets has %d values, expected 2 [begin, end]",
                                 j->path, nm, cnt);
                have_off = 1;
            } else if (!rc)
                rc = st_fail(
                        j->err, j->errlen,
                        "'%s': header: tensor '%.200s': unknown field '%.60s' (expected dtype, shape, data_offsets)",
                        j->path, nm, key);
            free(key);
            if (rc) return -1;
            json_ws(j);
            if (j->i < j->n && j->s[j->i] == ',') { j->i++; continue; }
            break;
        }
    if (json_expect(j, '}', "to close a tensor entry")) return -1;
    if (!have_dtype || !have_shape || !have_off)
        return st_fail(j->err, j->errlen, "'%s': header: tensor '%.200s': missing field '%s'", j->path, nm,
                       !have_dtype ? "dtype" : !have_shape ? "shape" : "data_offsets");
    // numel with overflow guard; any product beyond the file size is caught by the size check below
    uint64_t numel = 1;
    for (int d = 0; d < e->ndim; d++) {
        e->shape[d] = (int64_t)shp[d];
        if (__builtin_mul_overflow(numel, shp[d], &numel))
            return st_fail(j->err, j->errlen, "'%s': header: tensor '%.200s': shape product overflows", j->path, nm);
    }
    uint64_t bytes;
    if (__builtin_mul_overflow(numel, (uint64_t)st_dtype_size[e->dtype], &bytes))
        return st_fail(j->err, j->errlen, "'%s': header: tensor '%.200s': shape product overflows", j->path, nm);
    e->numel = (int64_t)numel;
    e->begin = off[0];
    e->end = off[1];
    if (off[0] > off[1])
        return st_fail(j->err, j->errlen,
                       "'%s': header: tensor '%.200s': data_offsets [%" PRIu64 ", %" PRIu64 "] has begin > end",
                       j->path, nm, off[0], off[1]);
    if (off[1] > data_size)
        return st_fail(j->err, j->errlen,
                       "'%s': header: tensor '%.200s': data_offsets [%" PRIu64 ", %" PRIu64 "] out of bounds: "
                       "the data section has %" PRIu64 " bytes (file truncated?)",
                       j->path, nm, off[0], off[1], data_size);
    if (off[1] - off[0] != bytes) {
        char sb[160];
        return st_fail(j->err, j->errlen,
                       "'%s': header: tensor '%.200s': size mismatch: dtype %s x shape %s needs %" PRIu64
                       " bytes but data_offsets [%" PRIu64 ", %" PRIu64 "] span %" PRIu64 " bytes",
                       j->path, nm, st_dtype_name[e->dtype], st_shape_str(sb, sizeof sb, e->ndim, e->shape), bytes,
                       off[0], off[1], off[1] - off[0]);
    }
    return 0;
}

static int st_cmp_name(const void *a, const void *b) {
    return strcmp((*(StEntry *const *)a)->name, (*(StEntry *const *)b)->name);
}
static int st_cmp_begin(const void *a, const void *b) {
    const StEntry *x = *(StEntry *const *)a, *y = *(StEntry *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}
static int st_cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

// st_parse_header: parse the n header bytes hdr into st (st->path and st->data_size set by the
// caller), then check duplicates and overlaps across tensors. On error st holds what was parsed
// so far; the caller frees it with st_close.
static int st_parse_header(SafeTensors *st, const unsigned char *hdr, size_t n, char *err, size_t errlen) {
    StJson j = {hdr, n, 0, st->path, err, errlen};
    int have_meta = 0;
    json_ws(&j);
    if (json_expect(&j, '{', "at the start of the header (not a safetensors file?)")) return -1;
    json_ws(&j);
    if (!(j.i < j.n && j.s[j.i] == '}'))
        for (;;) {
            char *key;
            if (json_string(&j, &key, "as a tensor name")) return -1;
            if (json_expect(&j, ':', "after a tensor name")) { free(key); return -1; }
            if (strcmp(key, "__metadata__") == 0) {
                free(key);
                if (have_meta) return st_fail(err, errlen, "'%s': header: duplicate key '__metadata__'", st->path);
                have_meta = 1;
                if (st_parse_meta(&j, st)) return -1;
            } else {
                if (st->n == st->cap) {
                    st->cap = st->cap ? 2 * st->cap : 64;
                    st->t = realloc(st->t, sizeof(StEntry) * (size_t)st->cap);
                    if (!st->t) die("out of memory reading the header of '%s'", st->path);
                }
                StEntry *e = &st->t[st->n++];
                memset(e, 0, sizeof *e);
                e->name = key;
                if (st_parse_tensor(&j, e, st->data_size)) return -1;
            }
            json_ws(&j);
            if (j.i < j.n && j.s[j.i] == ',') { j.i++; continue; }
            break;
        }
    if (json_expect(&j, '}', "to close the header object")) return -1;
    json_ws(&j);
    if (j.i != j.n)
        return st_fail(err, errlen, "'%s': header JSON: unexpected bytes after the closing '}' at byte %zu of %zu",
                       st->path, j.i, j.n);

    st->by_name = xmalloc(sizeof(StEntry *) * (size_t)st->n);
    for (int i = 0; i < st->n; i++) st->by_name[i] = &st->t[i];
    qsort(st->by_name, (size_t)st->n, sizeof(StEntry *), st_cmp_name);
    for (int i = 1; i < st->n; i++)
        if (strcmp(st->by_name[i - 1]->name, st->by_name[i]->name) == 0)
            return st_fail(err, errlen, "'%s': header: duplicate tensor name '%.200s'", st->path, st->by_name[i]->name);
    if (st->nmeta > 1) {
        char **keys = xmalloc(sizeof(char *) * (size_t)st->nmeta);
        for (int i = 0; i < st->nmeta; i++) keys[i] = st->meta[2 * i];
        qsort(keys, (size_t)st->nmeta, sizeof(char *), st_cmp_str);
        int dup = -1;
        for (int i = 1; i < st->nmeta && dup < 0; i++) if (strcmp(keys[i - 1], keys[i]) == 0) dup = i;
        int rc = dup < 0
                ? 0
                : st_fail(err, errlen, "'%s': header: duplicate __metadata__ key '%.200s'", st->path, keys[dup]);
        free(keys);
        if (rc) return rc;
    }
    StEntry **by_begin = xmalloc(sizeof(StEntry *) * (size_t)st->n);
    for (int i = 0; i < st->n; i++) by_begin[i] = &st->t[i];
    qsort(by_begin, (size_t)st->n, sizeof(StEntry *), st_cmp_begin);
    int rc = 0;
    for (int i = 1; i < st->n && !rc; i++) {
        const StEntry *a = by_begin[i - 1], *b = by_begin[i];
        if (b->begin < a->end)
            rc = st_fail(err, errlen,
                         "'%s': header: tensors '%.200s' [%" PRIu64 ", %" PRIu64 ") and '%.200s' [%" PRIu64 ", %" PRIu64
                         ") overlap in the data section",
                         st->path, a->name, a->begin, a->end, b->name, b->begin, b->end);
    }
    free(by_begin);
    return rc;
}

// ------------------------------------------------------------------------------------------
// reading
// ------------------------------------------------------------------------------------------

// st_close: free everything st_open allocated and close the file; safe on a zeroed or failed st.
static void st_close(SafeTensors *st) {
    if (st->f) fclose(st->f);
    for (int i = 0; i < st->n; i++) free(st->t[i].name);
    for (int i = 0; i < 2 * st->nmeta; i++) free(st->meta[i]);
    free(st->t); free(st->by_name); free(st->meta); free(st->path); free(st->mem);
    memset(st, 0, sizeof *st);
}

// st_open_stream: read and validate the header of the safetensors stream f (owned from here on:
// closed by st_close, or here on error). label names the file in messages. Sizes from the file
// are checked against the real file size before anything is allocated from them.
static int st_open_stream(FILE *f, const char *label, SafeTensors *st, char *err, size_t errlen) {
    memset(st, 0, sizeof *st);
    st->path = strdup(label ? label : "(stream)");
    if (!st->path) die("out of memory");
    st->f = f;
    int fd = fileno(f);
    struct stat sb;
    if (fd >= 0 && fstat(fd, &sb) == 0 && !S_ISREG(sb.st_mode)) {
        st_fail(err, errlen, "'%s': not a regular file", st->path);
        goto fail;
    }
    off_t size;
    if (fseeko(f, 0, SEEK_END) != 0 || (size = ftello(f)) < 0 || fseeko(f, 0, SEEK_SET) != 0) {
        st_fail(err, errlen, "'%s': cannot determine the file size: %s", st->path, strerror(errno));
        goto fail;
    }
    if (size == 0) { st_fail(err, errlen, "'%s': empty file (0 bytes), not a safetensors file", st->path); goto fail; }
    unsigned char len8[8];
    if (size < 8 || fread(len8, 1, 8, f) != 8) {
        st_fail(err, errlen,
                "'%s': file is %lld bytes, too short for the 8-byte safetensors header length (truncated?)", st->path,
                (long long)size);
        goto fail;
    }
    uint64_t hlen = 0;
    for (int k = 7; k >= 0; k--) hlen = hlen << 8 | len8[k];
    if (hlen > (uint64_t)size - 8) {
        st_fail(err, errlen,
                "'%s': header length %" PRIu64 " exceeds the %lld bytes left in the file (truncated, or not a "
                "safetensors file)",
                st->path, hlen, (long long)size - 8);
        goto fail;
    }
    if (hlen > ST_MAX_HEADER) {
        st_fail(err, errlen, "'%s': header length %" PRIu64 " exceeds the %llu byte limit", st->path, hlen,
                ST_MAX_HEADER);
        goto fail;
    }
    if (hlen < 2) {
        st_fail(err, errlen, "'%s': header length %" PRIu64 " is too short for a JSON object", st->path, hlen);
        goto fail;
    }
    st->data_start = 8 + hlen;
    st->data_size = (uint64_t)size - 8 - hlen;
    unsigned char *hdr = xmalloc((size_t)hlen);
    if (fread(hdr, 1, (size_t)hlen, f) != (size_t)hlen) {
        free(hdr);
        st_fail(err, errlen, "'%s': short read of the %" PRIu64 "-byte header: %s", st->path, hlen,
                ferror(f) ? strerror(errno) : "unexpected end of file");
        goto fail;
    }
    int rc = st_parse_header(st, hdr, (size_t)hlen, err, errlen);
    free(hdr);
    if (rc) goto fail;
    return 0;
fail:
    st_close(st);
    return -1;
}

// st_open: open path and validate its whole header; 0 on success, -1 with err set.
static int st_open(const char *path, SafeTensors *st, char *err, size_t errlen) {
    memset(st, 0, sizeof *st);
    FILE *f = fopen(path, "rb");
    if (!f) return st_fail(err, errlen, "'%s': cannot open: %s", path, strerror(errno));
    return st_open_stream(f, path, st, err, errlen);
}

// st_find: the tensor called name, or NULL.
static const StEntry *st_find(const SafeTensors *st, const char *name) {
    StEntry key = {0}, *kp = &key, **hit;
    key.name = (char *)name;
    if (!st->n) return NULL;
    hit = bsearch(&kp, st->by_name, (size_t)st->n, sizeof(StEntry *), st_cmp_name);
    return hit ? *hit : NULL;
}

// st_meta: the __metadata__ value for key, or NULL.
static const char *st_meta(const SafeTensors *st, const char *key) {
    for (int i = 0; i < st->nmeta; i++) if (strcmp(st->meta[2 * i], key) == 0) return st->meta[2 * i + 1];
    return NULL;
}

// st_read_chunks: read the numel elements of e and convert them to float (to_float) or int64 into dst.
static int st_read_chunks(SafeTensors *st, const StEntry *e, void *dst, int to_float, char *err, size_t errlen) {
    if (fseeko(st->f, (off_t)(st->data_start + e->begin), SEEK_SET) != 0)
        return st_fail(err, errlen, "'%s': tensor '%s': seek failed: %s", st->path, e->name, strerror(errno));
    int ds = st_dtype_size[e->dtype];
    if ((e->dtype == ST_F32 && to_float) || (e->dtype == ST_I64 && !to_float)) {   // same layout: read in place
        if (fread(dst, (size_t)ds, (size_t)e->numel, st->f) != (size_t)e->numel) goto short_read;
        return 0;
    }
    unsigned char buf[1 << 16];
    int64_t per = (int64_t)sizeof buf / ds;
    float *df = dst;
    int64_t *di = dst;
    for (int64_t i = 0; i < e->numel;) {
        int64_t k = e->numel - i < per ? e->numel - i : per;
        if (fread(buf, (size_t)ds, (size_t)k, st->f) != (size_t)k) goto short_read;
        for (int64_t q = 0; q < k; q++) {
            const unsigned char *p = buf + q * ds;
            uint16_t u16; uint32_t u32; uint64_t u64; double f64; float f32;
            switch (e->dtype) {
            case ST_F16: memcpy(&u16, p, 2); df[i + q] = half_to_float(u16); break;
            case ST_BF16: memcpy(&u16, p, 2); df[i + q] = bf16_to_float(u16); break;
            case ST_F32: memcpy(&f32, p, 4); df[i + q] = f32; break;
            case ST_F64: memcpy(&f64, p, 8); df[i + q] = (float)f64; break;
            case ST_BOOL: case ST_U8: di[i + q] = p[0]; break;
            case ST_I8: di[i + q] = (int8_t)p[0]; break;
            case ST_U16: memcpy(&u16, p, 2); di[i + q] = u16; break;
            case ST_I16: memcpy(&u16, p, 2); di[i + q] = (int16_t)u16; break;
            case ST_U32: memcpy(&u32, p, 4); di[i + q] = u32; break;
            case ST_I32: memcpy(&u32, p, 4); di[i + q] = (int32_t)u32; break;
            default: memcpy(&u64, p, 8); di[i + q] = (int64_t)u64; break;   // I64, U64 (wraps above 2^63)
            }
        }
        i += k;
    }
    return 0;
short_read:
    return st_fail(err, errlen, "'%s': tensor '%s': short read of %" PRIu64 " bytes at offset %" PRIu64 " (%s)",
                   st->path, e->name, e->end - e->begin, st->data_start + e->begin,
                   ferror(st->f) ? strerror(errno) : "file shrank after opening?");
}

// st_read_f32: the e->numel values of a float tensor (F32, F16, BF16, F64) as float into dst.
static int st_read_f32(SafeTensors *st, const StEntry *e, float *dst, char *err, size_t errlen) {
    if (!st_dtype_is_float(e->dtype))
        return st_fail(err, errlen, "'%s': tensor '%s' has dtype %s, expected a float dtype", st->path, e->name,
                       st_dtype_name[e->dtype]);
    return st_read_chunks(st, e, dst, 1, err, errlen);
}

// st_read_i64: the e->numel values of an integer or BOOL tensor as int64 into dst.
static int st_read_i64(SafeTensors *st, const StEntry *e, int64_t *dst, char *err, size_t errlen) {
    if (st_dtype_is_float(e->dtype))
        return st_fail(err, errlen, "'%s': tensor '%s' has dtype %s, expected an integer dtype", st->path, e->name,
                       st_dtype_name[e->dtype]);
    return st_read_chunks(st, e, dst, 0, err, errlen);
}

// ------------------------------------------------------------------------------------------
// writing (atomic: tmp file, fsync, rename, fsync of the directory)
// ------------------------------------------------------------------------------------------

#ifdef TESTING
static int64_t st_test_fail_after = -1;   // test hook: st_write fails once this many bytes are written
#endif

typedef struct { char *p; size_t n, cap; } StBuf;

static void stbuf_put(StBuf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        while (b->n + n + 1 > b->cap) b->cap = b->cap ? 2 * b->cap : 4096;
        b->p = realloc(b->p, b->cap);
        if (!b->p) die("out of memory building a safetensors header");
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}
static void stbuf_printf(StBuf *b, const char *fmt, ...) {
    char tmp[128];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    stbuf_put(b, tmp, (size_t)k < sizeof tmp ? (size_t)k : sizeof tmp - 1);
}

// stbuf_json_string: s as a JSON string literal; 0, or -1 if s is not valid UTF-8.
static int stbuf_json_string(StBuf *b, const char *s) {
    const unsigned char *u = (const unsigned char *)s;
    size_t n = strlen(s);
    stbuf_put(b, "\"", 1);
    for (size_t i = 0; i < n;) {
        if (u[i] == '"' || u[i] == '\\') { char e[2] = {'\\', (char)u[i]}; stbuf_put(b, e, 2); i++; }
        else if (u[i] < 0x20) { stbuf_printf(b, "\\u%04x", u[i]); i++; }
        else {
            int len = utf8_seq(u + i, n - i);
            if (!len) return -1;
            stbuf_put(b, s + i, (size_t)len);
            i += (size_t)len;
        }
    }
    stbuf_put(b, "\"", 1);
    return 0;
}

// st_fwrite: fwrite that honours the test failure hook; 0 or -1.
static int st_fwrite(const void *p, size_t n, FILE *f, uint64_t *written) {
#ifdef TESTING
    if (st_test_fail_after >= 0 && *written + n > (uint64_t)st_test_fail_after) { errno = EIO; return -1; }
#endif
    if (n && fwrite(p, 1, n, f) != n) return -1;
    *written += n;
    return 0;
}

// st_fsync_dir: fsync the directory holding path so the rename itself is durable.
static int st_fsync_dir(const char *path) {
    char *dir = strdup(path);
    if (!dir) return -1;
    char *slash = strrchr(dir, '/');
    if (!slash) strcpy(dir, ".");
    else if (slash == dir) dir[1] = 0;
    else *slash = 0;
    int fd = open(dir, O_RDONLY | O_DIRECTORY), rc = -1;
    if (fd >= 0) { rc = fsync(fd); close(fd); }
    free(dir);
    return rc;
}

// st_write: write n tensors (in the given order, data back to back) and the key/value metadata
// meta_kv (NULL-terminated pairs, or NULL) to path atomically. Float sources are converted to
// t[i].dtype (F32, F16, BF16); a finite value that overflows F16 is an error naming the tensor.
static int st_write(const char *path, const StTensor *t, int n, const char *const *meta_kv, char *err, size_t errlen) {
    StBuf h = {0};
    char sb[160];
    int rc = -1;
    FILE *f = NULL;
    size_t plen = strlen(path);
    char *tmp = xmalloc(plen + 5);
    memcpy(tmp, path, plen);
    memcpy(tmp + plen, ".tmp", 5);
    uint64_t off = 0, written = 0;
    int64_t *numel = xmalloc(sizeof(int64_t) * (size_t)(n > 0 ? n : 1));

    stbuf_put(&h, "{", 1);
    int first = 1;
    if (meta_kv && meta_kv[0]) {
        stbuf_put(&h, "\"__metadata__\":{", 16);
        for (int i = 0; meta_kv[i]; i += 2) {
            if (!meta_kv[i + 1]) {
                st_fail(err, errlen, "'%s': metadata key '%s' has no value", path, meta_kv[i]);
                goto done;
            }
            if (i) stbuf_put(&h, ",", 1);
            if (stbuf_json_string(&h, meta_kv[i]) || (stbuf_put(&h, ":", 1), stbuf_json_string(&h, meta_kv[i + 1]))) {
                st_fail(err, errlen, "'%s': metadata key '%.100s' or its value is not valid UTF-8", path, meta_kv[i]);
                goto done;
            }
        }
        stbuf_put(&h, "}", 1);
        first = 0;
    }
    for (int i = 0; i < n; i++) {
        const StTensor *x = &t[i];
        if (!x->name || !x->name[0] || strcmp(x->name, "__metadata__") == 0) {
            st_fail(err, errlen, "'%s': tensor %d has an empty or reserved name", path, i); goto done;
        }
        if (x->dtype != ST_F32 && x->dtype != ST_F16 && x->dtype != ST_BF16 && x->dtype != ST_I64) {
            st_fail(err, errlen, "'%s': tensor '%s': can only write F32, F16, BF16 or I64 (dtype %d)", path, x->name,
                    x->dtype);
            goto done;
        }
        if (x->ndim < 0 || x->ndim > ST_MAXDIM) {
            st_fail(err, errlen, "'%s': tensor '%s': ndim %d outside [0, %d]", path, x->name, x->ndim, ST_MAXDIM);
            goto done;
        }
        int64_t ne = 1;
        for (int d = 0; d < x->ndim; d++) {
            if (x->shape[d] < 0 || __builtin_mul_overflow(ne, x->shape[d], &ne)) {
                st_fail(err, errlen, "'%s': tensor '%s': bad shape %s", path, x->name,
                        st_shape_str(sb, sizeof sb, x->ndim, x->shape));
                goto done;
            }
        }
        if (ne > 0 && !x->data) { st_fail(err, errlen, "'%s': tensor '%s': data is NULL", path, x->name); goto done; }
        numel[i] = ne;
        for (int q = 0; q < i; q++)
            if (strcmp(t[q].name, x->name) == 0) {
                st_fail(err, errlen, "'%s': duplicate tensor name '%s'", path, x->name);
                goto done;
            }
        uint64_t bytes = (uint64_t)ne * (uint64_t)st_dtype_size[x->dtype];
        if (!first) stbuf_put(&h, ",", 1);
        first = 0;
        if (stbuf_json_string(&h, x->name)) {
            st_fail(err, errlen, "'%s': tensor name '%.100s' is not valid UTF-8", path, x->name);
            goto done;
        }
        stbuf_printf(&h, ":{\"dtype\":\"%s\",\"shape\":[", st_dtype_name[x->dtype]);
        for (int d = 0; d < x->ndim; d++) stbuf_printf(&h, "%s%" PRId64, d ? "," : "", x->shape[d]);
        stbuf_printf(&h, "],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}", off, off + bytes);
        off += bytes;
    }
    stbuf_put(&h, "}", 1);
    while (h.n % 8) stbuf_put(&h, " ", 1);        // data section starts 8-byte aligned

    f = fopen(tmp, "wb");
    if (!f) { st_fail(err, errlen, "'%s': cannot create '%s': %s", path, tmp, strerror(errno)); goto done; }
    unsigned char len8[8];
    for (int k = 0; k < 8; k++) len8[k] = (unsigned char)((uint64_t)h.n >> (8 * k));
    if (st_fwrite(len8, 8, f, &written) || st_fwrite(h.p, h.n, f, &written)) goto write_fail;
    for (int i = 0; i < n; i++) {
        const StTensor *x = &t[i];
        if (x->dtype == ST_I64 || x->dtype == ST_F32) {   // same layout in memory and on disk
            if (st_fwrite(x->data, (size_t)numel[i] * (size_t)st_dtype_size[x->dtype], f, &written)) goto write_fail;
            continue;
        }
        uint16_t buf[8192];
        const float *src = x->data;
        for (int64_t j = 0; j < numel[i];) {
            int64_t k = numel[i] - j < 8192 ? numel[i] - j : 8192;
            for (int64_t q = 0; q < k; q++) {
                float v = src[j + q];
                buf[q] = x->dtype == ST_F16 ? float_to_half(v) : float_to_bf16(v);
                if (isfinite(v) && (buf[q] & 0x7fffu) == (x->dtype == ST_F16 ? 0x7c00u : 0x7f80u)) {
                    st_fail(err, errlen, "'%s': tensor '%s': value %g at index %" PRId64 " overflows %s", path, x->name,
                            (double)v, j + q, st_dtype_name[x->dtype]);
                    goto cleanup;
                }
            }
            if (st_fwrite(buf, (size_t)k * 2, f, &written)) goto write_fail;
            j += k;
        }
    }
    if (fflush(f) != 0 || fsync(fileno(f)) != 0) goto write_fail;
    if (fclose(f) != 0) { f = NULL; goto write_fail; }
    f = NULL;
    if (rename(tmp, path) != 0) {
        st_fail(err, errlen, "'%s': cannot rename '%s' over it: %s", path, tmp, strerror(errno));
        goto cleanup;
    }
    st_fsync_dir(path);     // best effort: the data itself is already durable
    rc = 0;
    goto done;
write_fail:
    st_fail(err, errlen, "'%s': writing '%s' failed after %" PRIu64 " bytes: %s (old file left as it was)",
            path, tmp, written, strerror(errno ? errno : EIO));
cleanup:
    if (f) fclose(f);
    unlink(tmp);
done:
    free(h.p); free(tmp); free(numel);
    return rc;
}

// ------------------------------------------------------------------------------------------
// model weights: ParamRef arrays in Ultralytics state_dict order
// ------------------------------------------------------------------------------------------

enum { PARAM_TRAIN = 0, PARAM_BUFFER = 1, PARAM_COUNT = 2 };

typedef struct {
    const char *name;            // Ultralytics state_dict key, e.g. "model.0.conv.weight"
    int ndim;                    // 0..4 (PARAM_COUNT: 0)
    int64_t shape[4];
    float *data;                 // (numel) for PARAM_TRAIN / PARAM_BUFFER; NULL for PARAM_COUNT
    int kind;                    // PARAM_TRAIN, PARAM_BUFFER (BN running stats), PARAM_COUNT
    int64_t count;               // PARAM_COUNT: the value (num_batches_tracked)
} ParamRef;

static int64_t param_numel(const ParamRef *r) {
    int64_t n = 1;
    for (int d = 0; d < r->ndim; d++) n *= r->shape[d];
    return n;
}

// weights_save: refs (in order) to path as safetensors; floats in dtype (ST_F32, ST_F16, ST_BF16),
// PARAM_COUNT entries as I64 scalars. meta_kv: NULL or NULL-terminated key, value pairs. Atomic.
static int weights_save(const char *path, const ParamRef *refs, int n, const char *const *meta_kv, int dtype,
                        char *err, size_t errlen) {
    if (dtype != ST_F32 && dtype != ST_F16 && dtype != ST_BF16)
        return st_fail(err, errlen, "'%s': weights can be saved as F32, F16 or BF16 only (dtype %d)", path, dtype);
    StTensor *t = xcalloc((size_t)(n > 0 ? n : 1), sizeof(StTensor));
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) {
        const ParamRef *r = &refs[i];
        t[i].name = r->name;
        if (r->ndim < 0 || r->ndim > 4)
            rc = st_fail(err, errlen, "'%s': param '%s': ndim %d outside [0, 4]", path, r->name, r->ndim);
        if (r->kind == PARAM_COUNT) {
            t[i].dtype = ST_I64; t[i].ndim = 0; t[i].data = &r->count;
        } else {
            t[i].dtype = dtype; t[i].ndim = r->ndim; t[i].data = r->data;
            for (int d = 0; d < r->ndim && d < 4; d++) t[i].shape[d] = r->shape[d];
        }
    }
    if (!rc) rc = st_write(path, t, n, meta_kv, err, errlen);
    free(t);
    return rc;
}

// weights_load_st: load refs from the open file st, tensor names being prefix + ref name (prefix
// may be NULL). Checks first, for all refs: present (PARAM_COUNT may be absent), same shape,
// float dtype (PARAM_COUNT: integer, one element); unless allow_extra, every file tensor must be
// a ref, except integer *num_batches_tracked tensors. Lists the first few mismatches. Then reads
// everything into a temporary, rejects NaN/Inf naming the tensor, and only then copies into refs.
static int weights_load_st(SafeTensors *st, ParamRef *refs, int n, const char *prefix, int allow_extra,
                           char *err, size_t errlen) {
    enum { SHOW = 5 };
    const StEntry **hit = xcalloc((size_t)(n > 0 ? n : 1), sizeof(StEntry *));
    char *used = xcalloc((size_t)(st->n > 0 ? st->n : 1), 1);
    size_t plen = prefix ? strlen(prefix) : 0;
    char *name = NULL, msg[1536], sa[160], sb[160];
    size_t mlen = 0, namecap = 0;
    int bad = 0, rc = -1;
    float *tmp = NULL;
    int64_t *cnt = xcalloc((size_t)(n > 0 ? n : 1), sizeof(int64_t));
    msg[0] = 0;
#define WL_NOTE(...)                                                                                                   \
    do {                                                                                                               \
        if (bad++ < SHOW && mlen < sizeof msg) mlen += (size_t)snprintf(msg + mlen, sizeof msg - mlen, __VA_ARGS__);   \
    } while (0)
    int64_t total = 0;
    for (int i = 0; i < n; i++) {
        ParamRef *r = &refs[i];
        size_t need = plen + strlen(r->name) + 1;
        if (need > namecap) { namecap = need * 2; free(name); name = xmalloc(namecap); }
        snprintf(name, need, "%s%s", prefix ? prefix : "", r->name);
        const StEntry *e = st_find(st, name);
        if (e) used[e - st->t] = 1;
        if (r->kind == PARAM_COUNT) {
            if (e && (st_dtype_is_float(e->dtype) || e->numel != 1))
                WL_NOTE("; '%s' should be one integer, file has %s %s", name, st_dtype_name[e->dtype],
                        st_shape_str(sb, sizeof sb, e->ndim, e->shape));
            hit[i] = e;
            continue;
        }
        if (r->ndim < 0 || r->ndim > 4 || (!r->data && param_numel(r) > 0)) {
            WL_NOTE("; model param '%s' has ndim %d or no data (a bug in the caller)", name, r->ndim);
            continue;
        }
        if (!e) { WL_NOTE("; missing tensor '%s'", name); continue; }
        if (!st_dtype_is_float(e->dtype)) {
            WL_NOTE("; '%s' has dtype %s, expected a float dtype", name, st_dtype_name[e->dtype]);
            continue;
        }
        int same = e->ndim == r->ndim;
        for (int d = 0; same && d < r->ndim; d++) same = e->shape[d] == r->shape[d];
        if (!same) {
            WL_NOTE("; '%s' shape %s in file, model expects %s", name, st_shape_str(sa, sizeof sa, e->ndim, e->shape),
                    st_shape_str(sb, sizeof sb, r->ndim, r->shape));
            continue;
        }
        hit[i] = e;
        total += e->numel;
    }
    if (!allow_extra)
        for (int k = 0; k < st->n; k++) {
            const StEntry *e = &st->t[k];
            size_t nl = strlen(e->name), sl = strlen("num_batches_tracked");
            int counter =
                    !st_dtype_is_float(e->dtype) && nl >= sl && strcmp(e->name + nl - sl, "num_batches_tracked") == 0;
            if (!used[k] && !counter)
                WL_NOTE("; unexpected tensor '%s' %s", e->name, st_shape_str(sb, sizeof sb, e->ndim, e->shape));
        }
#undef WL_NOTE
    if (bad) {
        st_fail(err, errlen, "'%s': does not match the model: %d mismatch%s%s%s", st->path, bad, bad == 1 ? "" : "es",
                msg, bad > SHOW ? "; ..." : "");
        goto done;
    }
    tmp = xmalloc(sizeof(float) * (size_t)(total > 0 ? total : 1));
    int64_t o = 0;
    for (int i = 0; i < n; i++) {
        if (!hit[i]) continue;
        if (refs[i].kind == PARAM_COUNT) {
            if (st_read_i64(st, hit[i], &cnt[i], err, errlen)) goto done;
            continue;
        }
        const StEntry *e = hit[i];
        if (st_read_f32(st, e, tmp + o, err, errlen)) goto done;
        for (int64_t q = 0; q < e->numel; q++)
            if (!isfinite(tmp[o + q])) {
                st_fail(err, errlen, "'%s': tensor '%s' has a non-finite value (%s) at index %" PRId64, st->path,
                        e->name, isnan(tmp[o + q]) ? "NaN" : "Inf", q);
                goto done;
            }
        o += e->numel;
    }
    o = 0;
    for (int i = 0; i < n; i++) {
        if (!hit[i]) continue;
        if (refs[i].kind == PARAM_COUNT) { refs[i].count = cnt[i]; continue; }
        memcpy(refs[i].data, tmp + o, sizeof(float) * (size_t)hit[i]->numel);
        o += hit[i]->numel;
    }
    rc = 0;
done:
    free(hit); free(used); free(name); free(tmp); free(cnt);
    return rc;
}

// weights_load: load every ref from the weights file path (.safetensors or .pt, see
// weights_load_st and weights_open); refs are untouched unless the whole file validates.
static int weights_open(const char *path, SafeTensors *st, char *err, size_t errlen);   // .pt or .safetensors
static int weights_load(const char *path, ParamRef *refs, int n, char *err, size_t errlen) {
    SafeTensors st;
    if (weights_open(path, &st, err, errlen)) return -1;
    int rc = weights_load_st(&st, refs, n, NULL, 0, err, errlen);
    st_close(&st);
    return rc;
}

// weights_infer: nc and scale of a YOLOv8 detection file: nc = dim 0 of model.22.cv3.0.2.weight
// (nc, c3, 1, 1), scale from the stem model.0.conv.weight (16/32/48/64/80, 3, 3, 3).
static int weights_infer(const char *path, int *nc, char *scale, char *err, size_t errlen) {
    SafeTensors st;
    if (weights_open(path, &st, err, errlen)) return -1;
    static const char scales[] = "nsmlx";   // stem width 16, 32, 48, 64, 80
    const StEntry *stem = st_find(&st, "model.0.conv.weight"), *cls = st_find(&st, "model.22.cv3.0.2.weight");
    const StEntry *box = st_find(&st, "model.22.cv2.0.2.weight");
    int rc = -1;
    char sb[160];
    if (!stem || !cls || !box)
        st_fail(err, errlen, "'%s': not a YOLOv8 detection model: no tensor '%s'", path,
                !stem ? "model.0.conv.weight" : !cls ? "model.22.cv3.0.2.weight" : "model.22.cv2.0.2.weight");
    else if (stem->ndim != 4 || stem->shape[1] != 3 || stem->shape[2] != 3 || stem->shape[3] != 3 ||
             stem->shape[0] % 16 || stem->shape[0] < 16 || stem->shape[0] > 80)
        st_fail(err, errlen,
                "'%s': not a YOLOv8 detection model: model.0.conv.weight has shape %s, expected (16|32|48|64|80, 3, 3, "
                "3)",
                path, st_shape_str(sb, sizeof sb, stem->ndim, stem->shape));
    else if (cls->ndim != 4 || cls->shape[0] < 1 || cls->shape[0] > 100000 || cls->shape[2] != 1 || cls->shape[3] != 1)
        st_fail(err, errlen,
                "'%s': not a YOLOv8 detection model: model.22.cv3.0.2.weight has shape %s, expected (nc, c3, 1, 1)",
                path, st_shape_str(sb, sizeof sb, cls->ndim, cls->shape));
    else if (box->ndim != 4 || box->shape[0] != 64)
        st_fail(err, errlen,
                "'%s': not a YOLOv8 detection model: model.22.cv2.0.2.weight has shape %s, expected (64, c2, 1, 1)",
                path, st_shape_str(sb, sizeof sb, box->ndim, box->shape));
    else {
        *nc = (int)cls->shape[0];
        *scale = scales[stem->shape[0] / 16 - 1];
        rc = 0;
    }
    st_close(&st);
    return rc;
}

// ------------------------------------------------------------------------------------------
// PyTorch checkpoints (.pt): zip container, a safe unpickler, the Ultralytics module tree
// ------------------------------------------------------------------------------------------
/*
 * pt: reads the files torch.save writes (Ultralytics yolov8n.pt, last.pt, best.pt, or a plain
 * state_dict) without Python and without running anything from the file.
 *
 * Container. torch.save writes a zip archive of stored (uncompressed) entries under one folder
 * of any name: FOLDER/data.pkl (the pickle), FOLDER/data/KEY (one entry per storage, raw
 * little-endian elements), FOLDER/version, and since torch 2.1 FOLDER/byteorder ("little").
 * pt_zip_open reads the end-of-central-directory record (and its zip64 forms), then every
 * central entry, and checks before reading any data: no encryption, method 0 (stored), equal
 * compressed and uncompressed sizes, each entry's local header and data inside the file and
 * before the central directory, no two entries overlapping (a zip bomb's sizes do not add up).
 * Data descriptors (flag bit 3) need nothing: the central directory has the sizes.
 *
 * Pickle. Protocols 2 to 5, the opcodes pickle.dumps and torch.save emit (no protocol-0 INST/OBJ,
 * no extension registry, no out-of-band buffers). The unpickler only builds a tree of PkNodes;
 * a GLOBAL is looked up in an allow-list and never imported or called:
 *   torch._utils._rebuild_tensor(_v2), _rebuild_parameter(_with_state)   -> a tensor node
 *   torch.{Half,BFloat16,Float,Double,Long,Int,Short,Char,Byte,Bool}Storage -> storage dtypes
 *   collections.OrderedDict, builtins set/frozenset                      -> dict / set nodes
 *   torch.nn.modules.* and the Ultralytics classes of a YOLOv8 detection model -> opaque objects
 *     (class name, constructor arguments and BUILD state kept as data)
 *   numpy scalars/arrays/dtypes, _codecs.encode (protocol 2's bytes), pathlib paths, namespaces,
 *     torch dtypes and sizes, getattr: values some checkpoints carry in their metadata -> opaque
 *     objects, never used for weights
 * Any other global is refused with its name (e.g. posix.system: a file that would run a command
 * under torch.load is reported, not run). Globals that identify another model are refused with
 * what the file is: YOLOv5 (models.yolo / models.common), YOLO11 (C3k2, C2PSA), segment, pose,
 * classify, OBB and other Ultralytics models. Limits: 64 MiB pickle, 2M objects, 4M memo slots, 1M marks.
 *
 * Checkpoint. A dict with "model" and/or "ema" (Ultralytics): ema when it is not None, else model,
 * as Ultralytics' attempt_load_weights does; the module object is walked through its
 * _parameters, _buffers (less _non_persistent_buffers_set) and _modules in order, which gives
 * exactly the names and order of module.state_dict(). Read alongside: names, yaml (nc, scale),
 * train_args, epoch, date, version. A dict of tensors is a plain state_dict. A whole pickled
 * module (torch.save(model)) is walked the same way.
 *
 * Tensors. A tensor is (storage, storage_offset, size, stride); views (transposed, sliced,
 * offset) are gathered element by element after checking the largest index against the storage.
 * Every tensor is copied into one buffer in the order found and exposed as a SafeTensors whose
 * FILE reads that buffer, so the rest of the program (weights_load_st, weights_infer, st_read_*)
 * treats .pt and .safetensors alike.
 *
 * Public API
 *   weights_open(path, &st, err, errlen) -> 0 / -1   a .safetensors or .pt file as a SafeTensors
 *                                 (.pt metadata in st_meta: pt_source, pt_class, names, yaml_nc,
 *                                 yaml_scale, epoch, date, version, train_args); a Git LFS pointer
 *                                 or the legacy (pre-1.6) torch format gets its own message
 *   pt_open_stream(FILE *f, label, &st, err, errlen)   the .pt reader on an open stream (takes f)
 *   weights_transfer(path, refs, n, &loaded, err, errlen)   fine-tuning: every ref whose name and
 *                                 shape match a tensor of the file; prints nothing
 *   weights_describe(path, &nc, &scale, err, errlen)   weights_infer, and prints what the file is
 *                                 (`yolo info`, `yolo plan`, `yolo export`)
 *   weights_names(path, nc)       the checkpoint's class names (predict without data=), or NULL
 * Every error is one line that starts with the file name and says what is wrong.
 */

#define PT_MAX_PICKLE (64ull << 20)     // yolov8x's data.pkl is about 0.1 MB
#define PT_MAX_NODES (2u << 20)
#define PT_MAX_MEMO (1u << 22)
#define PT_MAX_MARKS 1000000
#define PT_MAX_DEPTH 64             // module nesting (a YOLOv8 model is 5 deep)

static uint16_t pt_rd16(const unsigned char *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t pt_rd32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t pt_rd64(const unsigned char *p) { return (uint64_t)pt_rd32(p) | (uint64_t)pt_rd32(p + 4) << 32; }

// pt_name_ok: a name from the file that can go into a one-line message (no control characters)
static int pt_name_ok(const char *s) {
    for (; *s; s++) if ((unsigned char)*s < 0x20 || *s == 0x7f) return 0;
    return 1;
}

// pt_read_at: n bytes at file offset off; 0 or -1
static int pt_read_at(FILE *f, uint64_t off, void *buf, size_t n) {
    if (fseeko(f, (off_t)off, SEEK_SET) != 0) return -1;
    return n && fread(buf, 1, n, f) != n ? -1 : 0;
}

// ---- zip ----

typedef struct {
    char *name;
    uint64_t hdr;                // local header offset
    uint64_t off, size;          // data offset and size (stored: compressed == uncompressed)
} PtZipEntry;

typedef struct {
    const char *path;
    FILE *f;
    uint64_t fsize;
    PtZipEntry *e;               // (n) sorted by name
    int n;
    char prefix[256];            // "FOLDER/" of FOLDER/data.pkl
} PtZip;

static int pt_cmp_entry(const void *a, const void *b) {
    return strcmp(((const PtZipEntry *)a)->name, ((const PtZipEntry *)b)->name);
}
static int pt_cmp_hdr(const void *a, const void *b) {
    const PtZipEntry *x = *(PtZipEntry *const *)a, *y = *(PtZipEntry *const *)b;
    return x->hdr < y->hdr ? -1 : x->hdr > y->hdr;
}

static void pt_zip_close(PtZip *z) {
    for (int i = 0; i < z->n; i++) free(z->e[i].name);
    free(z->e);
    z->e = NULL;
    z->n = 0;
}

static const PtZipEntry *pt_zip_find(const PtZip *z, const char *name) {
    PtZipEntry key = {.name = (char *)name};
    return z->n ? bsearch(&key, z->e, (size_t)z->n, sizeof key, pt_cmp_entry) : NULL;
}

// pt_zip_open: the central directory of the zip in f (fsize bytes), validated as described above.
static int pt_zip_open(PtZip *z, char *err, size_t errlen) {
    const char *P = z->path;
    unsigned char tail[65557], *eo = NULL;
    size_t nt = z->fsize < sizeof tail ? (size_t)z->fsize : sizeof tail;
    if (pt_read_at(z->f, z->fsize - nt, tail, nt))
        return st_fail(err, errlen, "'%s': read failed: %s", P, strerror(errno));
    for (size_t i = nt >= 22 ? nt - 22 + 1 : 0; i-- > 0;)
        if (pt_rd32(tail + i) == 0x06054b50u && i + 22 + pt_rd16(tail + i + 20) == nt) { eo = tail + i; break; }
    if (!eo)
        return st_fail(err, errlen,
                       "'%s': the file is cut off: its %" PRIu64 " bytes start like a zip archive but the end-of-"
                       "central-directory record is missing (an interrupted download? fetch the file again)",
                       P, z->fsize);
    uint64_t eocd = z->fsize - nt + (uint64_t)(eo - tail);
    uint64_t count = pt_rd16(eo + 10), cd_size = pt_rd32(eo + 12), cd_off = pt_rd32(eo + 16), cd_end_limit = eocd;
    if (count == 0xffff || cd_size == 0xffffffffu || cd_off == 0xffffffffu) {   // zip64: locator, then the zip64 record
        unsigned char loc[20], r[56];
        if (eocd < 20 || pt_read_at(z->f, eocd - 20, loc, 20) || pt_rd32(loc) != 0x07064b50u)
            return st_fail(err, errlen, "'%s': zip64 sizes but no zip64 end-of-central-directory locator", P);
        uint64_t r64 = pt_rd64(loc + 8);
        if (r64 > eocd - 20 || eocd - 20 - r64 < 56 || pt_read_at(z->f, r64, r, 56) || pt_rd32(r) != 0x06064b50u)
            return st_fail(err, errlen,
                           "'%s': the zip64 end-of-central-directory record at offset %" PRIu64 " is missing or past "
                           "the end of the %" PRIu64 "-byte file (cut off?)",
                           P, r64, z->fsize);
        count = pt_rd64(r + 32), cd_size = pt_rd64(r + 40), cd_off = pt_rd64(r + 48), cd_end_limit = r64;
    }
    if (cd_off > cd_end_limit || cd_size > cd_end_limit - cd_off)
        return st_fail(err, errlen,
                       "'%s': the central directory (%" PRIu64 " bytes at offset %" PRIu64 ") lies past its end "
                       "record at %" PRIu64 ": the file (%" PRIu64 " bytes) is cut off or not a valid zip",
                       P, cd_size, cd_off, cd_end_limit, z->fsize);
    if (count == 0 || count > 1000000 || count * 46 > cd_size)
        return st_fail(err, errlen, "'%s': the zip directory claims %" PRIu64 " entries in %" PRIu64 " bytes", P, count,
                       cd_size);
    unsigned char *cd = xmalloc((size_t)cd_size);
    if (pt_read_at(z->f, cd_off, cd, (size_t)cd_size)) {
        free(cd);
        return st_fail(err, errlen, "'%s': read failed", P);
    }
    z->e = xcalloc((size_t)count, sizeof(PtZipEntry));
    int rc = -1;
    uint64_t p = 0;
    for (uint64_t k = 0; k < count; k++) {
        if (cd_size - p < 46 || pt_rd32(cd + p) != 0x02014b50u) {
            st_fail(err, errlen, "'%s': zip central directory entry %" PRIu64 " is malformed", P, k);
            goto done;
        }
        const unsigned char *c = cd + p;
        unsigned flags = pt_rd16(c + 8), method = pt_rd16(c + 10), nl = pt_rd16(c + 28), xl = pt_rd16(c + 30),
                 cl = pt_rd16(c + 32);
        uint64_t csize = pt_rd32(c + 20), usize = pt_rd32(c + 24), hdr = pt_rd32(c + 42);
        if (cd_size - p - 46 < (uint64_t)nl + xl + cl) {
            st_fail(err, errlen, "'%s': zip central directory entry %" PRIu64 " runs past the directory", P, k);
            goto done;
        }
        PtZipEntry *e = &z->e[z->n++];
        e->name = xmalloc((size_t)nl + 1);
        memcpy(e->name, c + 46, nl);
        e->name[nl] = 0;
        if (memchr(c + 46, 0, nl) || !pt_name_ok(e->name)) {
            st_fail(err, errlen, "'%s': zip entry %" PRIu64 " has a name with control characters", P, k);
            goto done;
        }
        for (const unsigned char *x = c + 46 + nl, *xe = x + xl; xe - x >= 4;) {   // zip64 extra: the 0xffffffff fields
            unsigned id = pt_rd16(x), len = pt_rd16(x + 2);
            if ((size_t)(xe - x - 4) < len) break;
            if (id == 1) {
                const unsigned char *v = x + 4, *ve = v + len;
                if (usize == 0xffffffffu && ve - v >= 8) usize = pt_rd64(v), v += 8;
                if (csize == 0xffffffffu && ve - v >= 8) csize = pt_rd64(v), v += 8;
                if (hdr == 0xffffffffu && ve - v >= 8) hdr = pt_rd64(v), v += 8;
            }
            x += 4 + len;
        }
        p += 46 + (uint64_t)nl + xl + cl;
        if (flags & 1) { st_fail(err, errlen, "'%s': zip entry '%.200s' is encrypted", P, e->name); goto done; }
        if (method != 0) {
            st_fail(err, errlen,
                    "'%s': zip entry '%.200s' is compressed (method %u%s); torch.save writes stored entries: re-save "
                    "it with torch.save, or unzip and zip it again with `zip -0`",
                    P, e->name, method, method == 8 ? ", deflate" : "");
            goto done;
        }
        if (csize != usize) {
            st_fail(err, errlen, "'%s': zip entry '%.200s' is stored but claims %" PRIu64 " bytes on disk and %" PRIu64
                    " unpacked: the sizes do not add up", P, e->name, csize, usize);
            goto done;
        }
        unsigned char lh[30];
        if (hdr > cd_off || cd_off - hdr < 30 || pt_read_at(z->f, hdr, lh, 30) || pt_rd32(lh) != 0x04034b50u) {
            st_fail(err, errlen,
                    "'%s': zip entry '%.200s': no local header at offset %" PRIu64 " (file of %" PRIu64 " bytes)", P,
                    e->name, hdr, z->fsize);
            goto done;
        }
        e->hdr = hdr;
        e->off = hdr + 30 + pt_rd16(lh + 26) + pt_rd16(lh + 28);
        e->size = usize;
        if (e->off > cd_off || e->size > cd_off - e->off) {
            st_fail(err, errlen,
                    "'%s': zip entry '%.200s' claims %" PRIu64 " bytes at offset %" PRIu64 ", past the %" PRIu64
                    " bytes before the central directory: the sizes do not add up (a damaged or malicious archive)",
                    P, e->name, e->size, e->off, cd_off);
            goto done;
        }
    }
    {   // no two entries may share bytes (a zip bomb's entries overlap to claim more data than the file has)
        PtZipEntry **by = xmalloc(sizeof *by * (size_t)z->n);
        for (int i = 0; i < z->n; i++) by[i] = &z->e[i];
        qsort(by, (size_t)z->n, sizeof *by, pt_cmp_hdr);
        int bad = -1;
        for (int i = 1; i < z->n && bad < 0; i++)
            if (by[i]->hdr < by[i - 1]->off + by[i - 1]->size) bad = i;
        if (bad >= 0)
            st_fail(err, errlen,
                    "'%s': zip entries '%.200s' and '%.200s' overlap: the sizes do not add up (a damaged or malicious "
                    "archive)",
                    P, by[bad - 1]->name, by[bad]->name);
        free(by);
        if (bad >= 0) goto done;
    }
    qsort(z->e, (size_t)z->n, sizeof(PtZipEntry), pt_cmp_entry);
    for (int i = 1; i < z->n; i++)
        if (!strcmp(z->e[i].name, z->e[i - 1].name)) {
            st_fail(err, errlen, "'%s': zip entry '%.200s' appears twice", P, z->e[i].name);
            goto done;
        }
    const PtZipEntry *pk = NULL;
    for (int i = 0; i < z->n; i++) {
        const char *s = strrchr(z->e[i].name, '/');
        if (!strcmp(s ? s + 1 : z->e[i].name, "data.pkl") && (!pk || strlen(z->e[i].name) < strlen(pk->name)))
            pk = &z->e[i];
    }
    if (!pk || strlen(pk->name) - 8 >= sizeof z->prefix) {
        st_fail(err, errlen, "'%s': a zip archive without a data.pkl record: not a PyTorch checkpoint", P);
        goto done;
    }
    memcpy(z->prefix, pk->name, strlen(pk->name) - 8);
    z->prefix[strlen(pk->name) - 8] = 0;
    rc = 0;
done:
    free(cd);
    if (rc) pt_zip_close(z);
    return rc;
}

// ---- unpickler ----

enum { PK_NONE, PK_BOOL, PK_INT, PK_FLOAT, PK_STR, PK_BYTES, PK_TUPLE, PK_LIST, PK_DICT, PK_SET, PK_GLOBAL, PK_OBJ,
       PK_STORAGE, PK_TENSOR, PK_MARK };
static const char *const pk_type_name[] = {"None", "bool", "int",    "float",  "str",     "bytes",  "tuple", "list",
                                           "dict", "set",  "global", "object", "storage", "tensor", "mark"};
// what an allow-listed global is
enum {
    PKG_CLASS,
    PKG_ODICT,
    PKG_SET,
    PKG_REBUILD_TENSOR,
    PKG_REBUILD_TENSOR_V2,
    PKG_REBUILD_PARAM,
    PKG_REBUILD_PARAM_STATE,
    PKG_RECONSTRUCTOR,
    PKG_OBJECT,
    PKG_DATA,
    PKG_STORAGE
};

typedef struct PkNode PkNode;
struct PkNode {
    int type;
    int64_t i;                   // INT, BOOL; GLOBAL: PKG_ kind; STORAGE: ST_ dtype
    double f;                    // FLOAT
    char *s;                     // STR, BYTES (NUL-terminated copy, len bytes); GLOBAL "module.name"; STORAGE key
    size_t len;
    PkNode **a;                  // TUPLE, LIST, SET items; DICT key, value, key, value ...; OBJ constructor args
    int n, cap;
    PkNode *cls, *state;         // OBJ: its class (a GLOBAL) and BUILD state
    // TENSOR
    PkNode *storage;
    int64_t offset, numel_storage;   // STORAGE: numel_storage elements
    int ndim;
    int64_t shape[ST_MAXDIM], stride[ST_MAXDIM];
};

typedef struct {
    const char *path;
    const unsigned char *p;
    size_t n, i;
    PkNode **all;                // every node, for freeing
    size_t nall, capall;
    PkNode **stack;
    size_t sp, scap;
    size_t *marks;
    size_t nmarks, mcap;
    PkNode **memo;
    size_t nmemo, memocap, memo_used;
    char *err;
    size_t errlen;
} Pk;

static PkNode *pk_new(Pk *k, int type) {
    if (k->nall >= PT_MAX_NODES)
        die("'%s': the pickle builds more than %u objects: not a model checkpoint", k->path, PT_MAX_NODES);
    if (k->nall == k->capall) {
        k->capall = k->capall ? 2 * k->capall : 1024;
        k->all = realloc(k->all, sizeof(PkNode *) * k->capall);
        if (!k->all) die("out of memory reading '%s'", k->path);
    }
    PkNode *x = xcalloc(1, sizeof(PkNode));
    x->type = type;
    return k->all[k->nall++] = x;
}
static void pk_push_item(PkNode *x, PkNode *v) {
    if (x->n == x->cap) {
        x->cap = x->cap ? 2 * x->cap : 4;
        x->a = realloc(x->a, sizeof(PkNode *) * (size_t)x->cap);
        if (!x->a) die("out of memory");
    }
    x->a[x->n++] = v;
}
static void pk_free(Pk *k) {
    for (size_t i = 0; i < k->nall; i++) { free(k->all[i]->s); free(k->all[i]->a); free(k->all[i]); }
    free(k->all); free(k->stack); free(k->marks); free(k->memo);
    memset(k, 0, sizeof *k);
}
static int pk_push(Pk *k, PkNode *x) {
    if (k->sp == k->scap) {
        k->scap = k->scap ? 2 * k->scap : 256;
        k->stack = realloc(k->stack, sizeof(PkNode *) * k->scap);
        if (!k->stack) die("out of memory");
    }
    k->stack[k->sp++] = x;
    return 0;
}
#define PK_FAIL(...) st_fail(k->err, k->errlen, __VA_ARGS__)
static PkNode *pk_pop(Pk *k) {
    size_t floor = k->nmarks ? k->marks[k->nmarks - 1] : 0;
    if (k->sp <= floor) { PK_FAIL("'%s': pickle: stack underflow at byte %zu", k->path, k->i); return NULL; }
    return k->stack[--k->sp];
}
static PkNode *pk_top(Pk *k) {
    size_t floor = k->nmarks ? k->marks[k->nmarks - 1] : 0;
    if (k->sp <= floor) { PK_FAIL("'%s': pickle: stack underflow at byte %zu", k->path, k->i); return NULL; }
    return k->stack[k->sp - 1];
}
// pk_pop_mark: the items above the last MARK (start index into the stack), removing the mark
static int pk_pop_mark(Pk *k, size_t *start) {
    if (!k->nmarks) return PK_FAIL("'%s': pickle: MARK expected at byte %zu", k->path, k->i);
    *start = k->marks[--k->nmarks];
    return 0;
}
static const unsigned char *pk_take(Pk *k, size_t n) {
    if (k->n - k->i < n) {
        PK_FAIL("'%s': pickle: data ends inside an opcode at byte %zu (data.pkl cut off)", k->path, k->i);
        return NULL;
    }
    const unsigned char *p = k->p + k->i;
    k->i += n;
    return p;
}
static PkNode *pk_str(Pk *k, int type, const unsigned char *s, size_t n) {
    PkNode *x = pk_new(k, type);
    x->s = xmalloc(n + 1);
    memcpy(x->s, s, n);
    x->s[n] = 0;
    x->len = n;
    return x;
}
static int pk_memo_put(Pk *k, uint64_t idx) {
    if (idx >= PT_MAX_MEMO)
        return PK_FAIL("'%s': pickle: memo index %" PRIu64 " exceeds the limit of %u (memo abuse)", k->path, idx,
                       PT_MAX_MEMO);
    if (k->sp == 0) return PK_FAIL("'%s': pickle: PUT on an empty stack at byte %zu", k->path, k->i);
    if (idx >= k->memocap) {
        size_t nc = k->memocap ? k->memocap : 256;
        while (nc <= idx) nc *= 2;
        k->memo = realloc(k->memo, sizeof(PkNode *) * nc);
        if (!k->memo) die("out of memory");
        memset(k->memo + k->memocap, 0, sizeof(PkNode *) * (nc - k->memocap));
        k->memocap = nc;
    }
    if (!k->memo[idx]) k->memo_used++;
    k->memo[idx] = k->stack[k->sp - 1];
    if (idx >= k->nmemo) k->nmemo = idx + 1;
    return 0;
}
static int pk_memo_get(Pk *k, uint64_t idx) {
    if (idx >= k->nmemo || !k->memo[idx])
        return PK_FAIL("'%s': pickle: memo index %" PRIu64 " read before it was written", k->path, idx);
    return pk_push(k, k->memo[idx]);
}
static PkNode *pk_dict_get(const PkNode *d, const char *key) {
    if (!d || d->type != PK_DICT) return NULL;
    for (int i = 0; i + 1 < d->n; i += 2)
        if (d->a[i]->type == PK_STR && !strcmp(d->a[i]->s, key)) return d->a[i + 1];
    return NULL;
}

// pt_global: classifies module.name; 0 with *kind set, or -1 with a message saying why it is refused
static int pt_global(Pk *k, const char *mod, const char *name, int64_t *kind) {
    static const struct { const char *name; int dtype; } storages[] = {
        {"HalfStorage", ST_F16}, {"BFloat16Storage", ST_BF16}, {"FloatStorage", ST_F32}, {"DoubleStorage", ST_F64},
        {"LongStorage", ST_I64}, {"IntStorage", ST_I32}, {"ShortStorage", ST_I16}, {"CharStorage", ST_I8},
        {"ByteStorage", ST_U8}, {"BoolStorage", ST_BOOL}};
    static const char *const v8[] = {"DetectionModel", "Conv", "Concat", "C2f", "Bottleneck", "SPPF", "DFL", "Detect",
                                     "IterableSimpleNamespace", NULL};
    static const struct { const char *name, *what; } other[] = {
        {"SegmentationModel", "a segmentation model"}, {"Segment", "a segmentation model"},
        {"PoseModel", "a pose model"}, {"Pose", "a pose model"},
        {"ClassificationModel", "a classification model"}, {"Classify", "a classification model"},
        {"OBBModel", "an oriented-box (OBB) model"}, {"OBB", "an oriented-box (OBB) model"},
        {"C3k2", "a YOLO11 model"}, {"C2PSA", "a YOLO11 model"}, {"C3k", "a YOLO11 model"},
        {"RTDETRDetectionModel", "an RT-DETR model"}, {"WorldModel", "a YOLO-World model"},
        {"v10Detect", "a YOLOv10 model"}, {"SCDown", "a YOLOv10 model"}, {"RepNCSPELAN4", "a YOLOv9 model"},
        {"C3", "a YOLOv5u/YOLOv3u model (C3 blocks)"}};
    if (!strcmp(mod, "torch._utils")) {
        if (!strcmp(name, "_rebuild_tensor_v2")) { *kind = PKG_REBUILD_TENSOR_V2; return 0; }
        if (!strcmp(name, "_rebuild_tensor")) { *kind = PKG_REBUILD_TENSOR; return 0; }
        if (!strcmp(name, "_rebuild_parameter")) { *kind = PKG_REBUILD_PARAM; return 0; }
        if (!strcmp(name, "_rebuild_parameter_with_state")) { *kind = PKG_REBUILD_PARAM_STATE; return 0; }
    }
    if (!strcmp(mod, "torch"))
        for (size_t i = 0; i < sizeof storages / sizeof storages[0]; i++)
            if (!strcmp(name, storages[i].name)) { *kind = PKG_STORAGE + storages[i].dtype; return 0; }
    if (!strcmp(mod, "collections") && !strcmp(name, "OrderedDict")) { *kind = PKG_ODICT; return 0; }
    if ((!strcmp(mod, "builtins") || !strcmp(mod, "__builtin__")) &&
        (!strcmp(name, "set") || !strcmp(name, "frozenset"))) {
        *kind = PKG_SET; return 0;
    }
    if ((!strcmp(mod, "builtins") || !strcmp(mod, "__builtin__")) && !strcmp(name, "object")) {
        *kind = PKG_OBJECT;
        return 0;
    }
    if (!strcmp(mod, "copyreg") && !strcmp(name, "_reconstructor")) { *kind = PKG_RECONSTRUCTOR; return 0; }
    // plain values that checkpoint metadata (train_metrics, train_args, model.args) may hold; kept as
    // opaque objects, never built: numpy scalars and arrays, paths, namespaces, torch dtypes and sizes
    static const char *const data[][2] = {{"numpy.core.multiarray", "scalar"},
                                          {"numpy._core.multiarray", "scalar"},
                                          {"numpy.core.multiarray", "_reconstruct"},
                                          {"numpy._core.multiarray", "_reconstruct"},
                                          {"numpy", "dtype"},
                                          {"numpy", "ndarray"},
                                          {"_codecs", "encode"},
                                          {"builtins", "getattr"},
                                          {"__builtin__", "getattr"},
                                          {"pathlib", "PosixPath"},
                                          {"pathlib", "WindowsPath"},
                                          {"pathlib", "Path"},
                                          {"types", "SimpleNamespace"},
                                          {"argparse", "Namespace"},
                                          {"torch", "Size"},
                                          {"torch", "device"},
                                          {"torch", "float16"},
                                          {"torch", "float32"},
                                          {"torch", "bfloat16"},
                                          {"torch", "float64"},
                                          {"torch", "int64"},
                                          {"torch", "int32"},
                                          {"torch", "uint8"},
                                          {"torch", "bool"}};
    for (size_t i = 0; i < sizeof data / sizeof data[0]; i++)
        if (!strcmp(mod, data[i][0]) && !strcmp(name, data[i][1])) { *kind = PKG_DATA; return 0; }
    if (!strncmp(mod, "torch.nn.modules.", 17)) { *kind = PKG_CLASS; return 0; }
    if (!strcmp(mod, "models.yolo") || !strcmp(mod, "models.common") || !strncmp(mod, "models.", 7) ||
        !strncmp(mod, "utils.", 6))
        return PK_FAIL("'%s': a YOLOv5 checkpoint (it contains %s.%s from the yolov5 repository): only YOLOv8 "
                       "detection models "
                       "are supported",
                       k->path, mod, name);
    if (!strncmp(mod, "ultralytics.", 12)) {
        for (size_t i = 0; i < sizeof other / sizeof other[0]; i++)
            if (!strcmp(name, other[i].name))
                return PK_FAIL("'%s': %s (it contains %s.%s): only YOLOv8 detection models are supported", k->path,
                               other[i].what, mod, name);
        for (int i = 0; v8[i]; i++)
            if (!strcmp(name, v8[i])) { *kind = PKG_CLASS; return 0; }
        return PK_FAIL(
                "'%s': contains %s.%s, which is not part of a YOLOv8 detection model: only YOLOv8 detection models are "
                "supported",
                k->path, mod, name);
    }
    return PK_FAIL("'%s': the pickle refers to %s.%s, which is not on the list of what a model checkpoint may contain; "
                   "the file "
                   "was not loaded and nothing in it was run (torch.load would have called it)",
                   k->path, mod, name);
}

static int pk_global(Pk *k, const char *mod, size_t ml, const char *name, size_t nl) {
    char m[256], n[256];
    if (ml >= sizeof m || nl >= sizeof n || memchr(mod, 0, ml) || memchr(name, 0, nl))
        return PK_FAIL("'%s': pickle: a global name longer than 255 bytes at byte %zu", k->path, k->i);
    memcpy(m, mod, ml); m[ml] = 0;
    memcpy(n, name, nl); n[nl] = 0;
    if (!pt_name_ok(m) || !pt_name_ok(n))
        return PK_FAIL("'%s': pickle: a global name with control characters at byte %zu", k->path, k->i);
    int64_t kind = 0;
    if (pt_global(k, m, n, &kind)) return -1;
    PkNode *g = pk_new(k, PK_GLOBAL);
    g->i = kind;
    g->len = ml + 1 + nl;
    g->s = xmalloc(g->len + 1);
    snprintf(g->s, g->len + 1, "%s.%s", m, n);
    return pk_push(k, g);
}

// pk_int_of: an INT node's value into *v; -1 otherwise
static int pk_int_of(const PkNode *x, int64_t *v) {
    if (!x || (x->type != PK_INT && x->type != PK_BOOL)) return -1;
    *v = x->i;
    return 0;
}

// pk_rebuild_tensor: (storage, storage_offset, size, stride, ...) -> a TENSOR node
static PkNode *pk_rebuild_tensor(Pk *k, PkNode *args) {
    if (args->type != PK_TUPLE || args->n < 4 || args->a[0]->type != PK_STORAGE || args->a[2]->type != PK_TUPLE ||
        args->a[3]->type != PK_TUPLE || args->a[2]->n != args->a[3]->n) {
        PK_FAIL("'%s': pickle: a tensor rebuild with unexpected arguments at byte %zu", k->path, k->i);
        return NULL;
    }
    PkNode *t = pk_new(k, PK_TENSOR);
    t->storage = args->a[0];
    t->ndim = args->a[2]->n;
    if (t->ndim > ST_MAXDIM || pk_int_of(args->a[1], &t->offset) || t->offset < 0) {
        PK_FAIL("'%s': pickle: a tensor with %d dimensions or a bad storage offset at byte %zu", k->path, t->ndim,
                k->i);
        return NULL;
    }
    for (int d = 0; d < t->ndim; d++)
        if (pk_int_of(args->a[2]->a[d], &t->shape[d]) || pk_int_of(args->a[3]->a[d], &t->stride[d]) ||
            t->shape[d] < 0 || t->stride[d] < 0) {
            PK_FAIL("'%s': pickle: a tensor with a bad size or stride at byte %zu", k->path, k->i);
            return NULL;
        }
    return t;
}

// pk_reduce: callable(args) for the allow-listed callables; the result or NULL
static PkNode *pk_reduce(Pk *k, PkNode *fn, PkNode *args) {
    if (fn->type != PK_GLOBAL || args->type != PK_TUPLE) {
        PK_FAIL("'%s': pickle: REDUCE of a %s with %s arguments at byte %zu", k->path, pk_type_name[fn->type],
                pk_type_name[args->type], k->i);
        return NULL;
    }
    PkNode *x;
    switch (fn->i) {
    case PKG_ODICT:
        x = pk_new(k, PK_DICT);
        if (args->n) {   // OrderedDict([(k, v), ...])
            PkNode *l = args->a[0];
            if ((l->type != PK_LIST && l->type != PK_TUPLE) || args->n > 1) goto bad;
            for (int i = 0; i < l->n; i++) {
                if (l->a[i]->type != PK_TUPLE || l->a[i]->n != 2) goto bad;
                pk_push_item(x, l->a[i]->a[0]);
                pk_push_item(x, l->a[i]->a[1]);
            }
        }
        return x;
    case PKG_SET:
        x = pk_new(k, PK_SET);
        if (args->n) {
            PkNode *l = args->a[0];
            if ((l->type != PK_LIST && l->type != PK_TUPLE && l->type != PK_SET) || args->n > 1) goto bad;
            for (int i = 0; i < l->n; i++) pk_push_item(x, l->a[i]);
        }
        return x;
    case PKG_REBUILD_TENSOR: case PKG_REBUILD_TENSOR_V2:
        return pk_rebuild_tensor(k, args);
    case PKG_REBUILD_PARAM: case PKG_REBUILD_PARAM_STATE:
        if (args->n < 1 || args->a[0]->type != PK_TENSOR) goto bad;
        return args->a[0];
    case PKG_RECONSTRUCTOR:   // copyreg._reconstructor(cls, object, None): an instance of cls
        if (args->n < 1 || args->a[0]->type != PK_GLOBAL || args->a[0]->i != PKG_CLASS) goto bad;
        x = pk_new(k, PK_OBJ);
        x->cls = args->a[0];
        return x;
    case PKG_CLASS: case PKG_DATA:
        x = pk_new(k, PK_OBJ);
        x->cls = fn;
        for (int i = 0; i < args->n; i++) pk_push_item(x, args->a[i]);
        return x;
    }
bad:
    PK_FAIL("'%s': pickle: %s called with unexpected arguments at byte %zu", k->path, fn->s, k->i);
    return NULL;
}

// pk_run: unpickle k->p[0..n) into *root. Never calls or imports anything; see the section header.
static int pk_run(Pk *k, PkNode **root) {
    const unsigned char *q;
    PkNode *x, *y, *z;
    size_t start = 0;
    if (k->n < 2 || k->p[0] != 0x80) return PK_FAIL("'%s': data.pkl is not a pickle of protocol 2 or later", k->path);
    for (;;) {
        if (k->i >= k->n) return PK_FAIL("'%s': pickle: data ends without STOP (data.pkl cut off)", k->path);
        if (k->nall + 4 > PT_MAX_NODES)   // an opcode makes at most 2 objects, so pk_new never reaches its limit
            return PK_FAIL("'%s': the pickle builds more than %u objects: not a model checkpoint", k->path,
                           PT_MAX_NODES);
        size_t at = k->i;
        unsigned op = k->p[k->i++];
        switch (op) {
        case 0x80:   // PROTO
            if (!(q = pk_take(k, 1))) return -1;
            if (q[0] < 2 || q[0] > 5)
                return PK_FAIL("'%s': pickle protocol %u is not supported (2 to 5 are)", k->path, q[0]);
            break;
        case 0x95:   // FRAME: a length prefix only
            if (!pk_take(k, 8)) return -1;
            break;
        case '.':    // STOP
            if (k->sp != 1 || k->nmarks)
                return PK_FAIL("'%s': pickle: STOP with %zu values and %zu marks left", k->path, k->sp, k->nmarks);
            *root = k->stack[0];
            return 0;
        case '(':    // MARK
            if (k->nmarks == PT_MAX_MARKS)
                return PK_FAIL("'%s': pickle: more than %d nested marks (recursion abuse)", k->path, PT_MAX_MARKS);
            if (k->nmarks == k->mcap) {
                k->mcap = k->mcap ? 2 * k->mcap : 64;
                k->marks = realloc(k->marks, sizeof(size_t) * k->mcap);
                if (!k->marks) die("out of memory");
            }
            k->marks[k->nmarks++] = k->sp;
            break;
        case '0':    // POP
            if (k->nmarks && k->marks[k->nmarks - 1] == k->sp) { k->nmarks--; break; }   // pops the mark itself
            if (!pk_pop(k)) return -1;
            break;
        case '1':    // POP_MARK
            if (pk_pop_mark(k, &start)) return -1;
            k->sp = start;
            break;
        case '2':    // DUP
            if (!(x = pk_top(k))) return -1;
            pk_push(k, x);
            break;
        case 'N': pk_push(k, pk_new(k, PK_NONE)); break;
        case 0x88: case 0x89:   // NEWTRUE, NEWFALSE
            x = pk_new(k, PK_BOOL); x->i = op == 0x88; pk_push(k, x);
            break;
        case 'J': case 'K': case 'M':   // BININT, BININT1, BININT2
            if (!(q = pk_take(k, op == 'J' ? 4 : op == 'K' ? 1 : 2))) return -1;
            x = pk_new(k, PK_INT);
            x->i = op == 'J' ? (int32_t)pt_rd32(q) : op == 'K' ? q[0] : pt_rd16(q);
            pk_push(k, x);
            break;
        case 0x8a: case 0x8b: {   // LONG1, LONG4: little-endian two's complement
            if (!(q = pk_take(k, op == 0x8a ? 1 : 4))) return -1;
            uint32_t nb = op == 0x8a ? q[0] : pt_rd32(q);
            if (nb > 8)
                return PK_FAIL("'%s': pickle: a %u-byte integer at byte %zu does not fit 64 bits", k->path, nb, at);
            if (!(q = pk_take(k, nb))) return -1;
            uint64_t v = 0;
            for (uint32_t b = 0; b < nb; b++) v |= (uint64_t)q[b] << (8 * b);
            if (nb && nb < 8 && (q[nb - 1] & 0x80)) v |= ~0ull << (8 * nb);
            x = pk_new(k, PK_INT); x->i = (int64_t)v; pk_push(k, x);
            break;
        }
        case 'G': {   // BINFLOAT: big-endian double
            if (!(q = pk_take(k, 8))) return -1;
            uint64_t v = 0;
            for (int b = 0; b < 8; b++) v = v << 8 | q[b];
            x = pk_new(k, PK_FLOAT); memcpy(&x->f, &v, 8); pk_push(k, x);
            break;
        }
        case 'X': case 0x8c: case 0x8d: case 'T': case 'U': case 'B': case 'C': case 0x8e: case 0x96: {
            // BINUNICODE, SHORT_BINUNICODE, BINUNICODE8, BINSTRING, SHORT_BINSTRING, BINBYTES, SHORT_BINBYTES,
            // BINBYTES8, BYTEARRAY8
            int w = (op == 0x8c || op == 'U' || op == 'C') ? 1 : (op == 0x8d || op == 0x8e || op == 0x96) ? 8 : 4;
            if (!(q = pk_take(k, (size_t)w))) return -1;
            uint64_t len = w == 1 ? q[0] : w == 4 ? pt_rd32(q) : pt_rd64(q);
            if (len > k->n - k->i)
                return PK_FAIL("'%s': pickle: a %" PRIu64 "-byte string at byte %zu runs past the end", k->path, len,
                               at);
            q = pk_take(k, (size_t)len);
            int isstr = op == 'X' || op == 0x8c || op == 0x8d || op == 'T' || op == 'U';
            pk_push(k, pk_str(k, isstr ? PK_STR : PK_BYTES, q, (size_t)len));
            break;
        }
        case ']': pk_push(k, pk_new(k, PK_LIST)); break;          // EMPTY_LIST
        case ')': pk_push(k, pk_new(k, PK_TUPLE)); break;         // EMPTY_TUPLE
        case '}': pk_push(k, pk_new(k, PK_DICT)); break;          // EMPTY_DICT
        case 0x8f: pk_push(k, pk_new(k, PK_SET)); break;          // EMPTY_SET
        case 0x85: case 0x86: case 0x87: {                         // TUPLE1, TUPLE2, TUPLE3
            int m = op - 0x84;
            size_t floor = k->nmarks ? k->marks[k->nmarks - 1] : 0;
            if (k->sp - floor < (size_t)m) return PK_FAIL("'%s': pickle: stack underflow at byte %zu", k->path, at);
            x = pk_new(k, PK_TUPLE);
            for (int i = 0; i < m; i++) pk_push_item(x, k->stack[k->sp - m + i]);
            k->sp -= m;
            pk_push(k, x);
            break;
        }
        case 't': case 'l': case 0x91: case 'd':   // TUPLE, LIST, FROZENSET, DICT from the items above MARK
            if (pk_pop_mark(k, &start)) return -1;
            if (op == 'd' && (k->sp - start) % 2)
                return PK_FAIL("'%s': pickle: DICT with an odd number of items at byte %zu", k->path, at);
            x = pk_new(k, op == 't' ? PK_TUPLE : op == 'l' ? PK_LIST : op == 'd' ? PK_DICT : PK_SET);
            for (size_t i = start; i < k->sp; i++) pk_push_item(x, k->stack[i]);
            k->sp = start;
            pk_push(k, x);
            break;
        case 'a':   // APPEND
            if (!(y = pk_pop(k)) || !(x = pk_top(k))) return -1;
            if (x->type != PK_LIST)
                return PK_FAIL("'%s': pickle: APPEND to a %s at byte %zu", k->path, pk_type_name[x->type], at);
            pk_push_item(x, y);
            break;
        case 'e': case 0x90:   // APPENDS, ADDITEMS
            if (pk_pop_mark(k, &start)) return -1;
            if (start == 0) return PK_FAIL("'%s': pickle: stack underflow at byte %zu", k->path, at);
            x = k->stack[start - 1];
            if (x->type != (op == 'e' ? PK_LIST : PK_SET))
                return PK_FAIL("'%s': pickle: %s to a %s at byte %zu", k->path, op == 'e' ? "APPENDS" : "ADDITEMS",
                               pk_type_name[x->type], at);
            for (size_t i = start; i < k->sp; i++) pk_push_item(x, k->stack[i]);
            k->sp = start;
            break;
        case 's':   // SETITEM
            if (!(z = pk_pop(k)) || !(y = pk_pop(k)) || !(x = pk_top(k))) return -1;
            if (x->type != PK_DICT)
                return PK_FAIL("'%s': pickle: SETITEM on a %s at byte %zu", k->path, pk_type_name[x->type], at);
            pk_push_item(x, y);
            pk_push_item(x, z);
            break;
        case 'u':   // SETITEMS
            if (pk_pop_mark(k, &start)) return -1;
            if (start == 0 || (k->sp - start) % 2)
                return PK_FAIL("'%s': pickle: malformed SETITEMS at byte %zu", k->path, at);
            x = k->stack[start - 1];
            if (x->type != PK_DICT)
                return PK_FAIL("'%s': pickle: SETITEMS on a %s at byte %zu", k->path, pk_type_name[x->type], at);
            for (size_t i = start; i < k->sp; i++) pk_push_item(x, k->stack[i]);
            k->sp = start;
            break;
        case 'c': {   // GLOBAL "module\nname\n"
            const unsigned char *m = k->p + k->i, *e1 = memchr(m, '\n', k->n - k->i), *e2;
            if (!e1 || !(e2 = memchr(e1 + 1, '\n', (size_t)(k->p + k->n - e1 - 1))))
                return PK_FAIL("'%s': pickle: unterminated GLOBAL at byte %zu", k->path, at);
            k->i = (size_t)(e2 + 1 - k->p);
            if (pk_global(k, (const char *)m, (size_t)(e1 - m), (const char *)e1 + 1, (size_t)(e2 - e1 - 1))) return -1;
            break;
        }
        case 0x93:   // STACK_GLOBAL
            if (!(y = pk_pop(k)) || !(x = pk_pop(k))) return -1;
            if (x->type != PK_STR || y->type != PK_STR)
                return PK_FAIL("'%s': pickle: STACK_GLOBAL of non-strings at byte %zu", k->path, at);
            if (pk_global(k, x->s, x->len, y->s, y->len)) return -1;
            break;
        case 'R':    // REDUCE
            if (!(y = pk_pop(k)) || !(x = pk_pop(k))) return -1;
            if (!(z = pk_reduce(k, x, y))) return -1;
            pk_push(k, z);
            break;
        case 0x81: case 0x92:   // NEWOBJ (cls, args), NEWOBJ_EX (cls, args, kwargs)
            if (op == 0x92 && !pk_pop(k)) return -1;
            if (!(y = pk_pop(k)) || !(x = pk_pop(k))) return -1;
            if (x->type != PK_GLOBAL || (x->i != PKG_CLASS && x->i != PKG_DATA && x->i != PKG_ODICT && x->i != PKG_SET))
                return PK_FAIL("'%s': pickle: NEWOBJ of %s at byte %zu", k->path,
                               x->type == PK_GLOBAL ? x->s : pk_type_name[x->type], at);
            if (!(z = pk_reduce(k, x, y))) return -1;
            pk_push(k, z);
            break;
        case 'b':    // BUILD: obj.__setstate__(state)
            if (!(y = pk_pop(k)) || !(x = pk_top(k))) return -1;
            if (x->type == PK_OBJ) x->state = y;
            else if (x->type != PK_DICT && x->type != PK_TENSOR)   // OrderedDict _metadata, Parameter state: not needed
                return PK_FAIL("'%s': pickle: BUILD on a %s at byte %zu", k->path, pk_type_name[x->type], at);
            break;
        case 'Q': {  // BINPERSID: ('storage', storage type, key, location, numel)
            if (!(x = pk_pop(k))) return -1;
            int64_t numel;
            if (x->type != PK_TUPLE || x->n < 5 || x->a[0]->type != PK_STR || strcmp(x->a[0]->s, "storage") ||
                x->a[1]->type != PK_GLOBAL || x->a[1]->i < PKG_STORAGE || x->a[2]->type != PK_STR ||
                pk_int_of(x->a[4], &numel) || numel < 0)
                return PK_FAIL("'%s': pickle: a persistent id that is not a torch storage record at byte %zu", k->path,
                               at);
            if (!pt_name_ok(x->a[2]->s) || x->a[2]->len != strlen(x->a[2]->s) || x->a[2]->len > 200)
                return PK_FAIL("'%s': pickle: a storage key with control characters or over 200 bytes at byte %zu",
                               k->path, at);
            y = pk_new(k, PK_STORAGE);
            y->i = x->a[1]->i - PKG_STORAGE;
            y->s = strdup(x->a[2]->s);
            y->numel_storage = numel;
            pk_push(k, y);
            break;
        }
        case 'q': case 'r': case 0x94: {   // BINPUT, LONG_BINPUT, MEMOIZE
            uint64_t idx = k->memo_used;
            if (op != 0x94) {
                if (!(q = pk_take(k, op == 'q' ? 1 : 4))) return -1;
                idx = op == 'q' ? q[0] : pt_rd32(q);
            }
            if (pk_memo_put(k, idx)) return -1;
            break;
        }
        case 'h': case 'j':   // BINGET, LONG_BINGET
            if (!(q = pk_take(k, op == 'h' ? 1 : 4))) return -1;
            if (pk_memo_get(k, op == 'h' ? q[0] : pt_rd32(q))) return -1;
            break;
        default:
            return PK_FAIL("'%s': pickle opcode 0x%02x ('%c') at byte %zu is not supported (a model checkpoint written "
                           "by torch.save "
                           "does not use it)",
                           k->path, op, op >= 32 && op < 127 ? op : '?', at);
        }
    }
}

// ---- checkpoint: module tree -> named tensors ----

typedef struct { char *name; PkNode *t; } PtNamed;
typedef struct { PtNamed *v; int n, cap; } PtList;

static void pt_list_add(PtList *l, const char *name, PkNode *t) {
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 256;
        l->v = realloc(l->v, sizeof(PtNamed) * (size_t)l->cap);
        if (!l->v) die("out of memory");
    }
    l->v[l->n].name = strdup(name);
    l->v[l->n++].t = t;
}

// pt_walk_module: the state_dict entries of module object m under prefix (Module.state_dict order:
// own parameters, own persistent buffers, then each child)
static int pt_walk_module(const char *path, PkNode *m, const char *prefix, int depth, PtList *out, char *err,
                          size_t errlen) {
    if (depth > PT_MAX_DEPTH)
        return st_fail(err, errlen, "'%s': modules nested deeper than %d (recursion abuse)", path, PT_MAX_DEPTH);
    PkNode *st = m->state;
    if (!st || st->type != PK_DICT)
        return st_fail(err, errlen, "'%s': module '%s' (%s) has no attribute dict", path, prefix[0] ? prefix : "(root)",
                       m->cls->s);
    PkNode *params = pk_dict_get(st, "_parameters"), *bufs = pk_dict_get(st, "_buffers"),
           *mods = pk_dict_get(st, "_modules");
    PkNode *np = pk_dict_get(st, "_non_persistent_buffers_set");
    char name[512];
    for (int pass = 0; pass < 2; pass++) {
        PkNode *d = pass ? bufs : params;
        if (!d) continue;
        if (d->type != PK_DICT)
            return st_fail(err, errlen, "'%s': module '%s': %s is not a dict", path, prefix,
                           pass ? "_buffers" : "_parameters");
        for (int i = 0; i + 1 < d->n; i += 2) {
            PkNode *key = d->a[i], *v = d->a[i + 1];
            if (key->type != PK_STR || !pt_name_ok(key->s) || key->len != strlen(key->s))
                return st_fail(err, errlen, "'%s': module '%s': a tensor key that is not a printable string", path,
                               prefix);
            if (v->type == PK_NONE) continue;
            int skip = 0;
            for (int j = 0; pass && np && np->type == PK_SET && j < np->n; j++)
                skip |= np->a[j]->type == PK_STR && !strcmp(np->a[j]->s, key->s);
            if (skip) continue;
            if (v->type != PK_TENSOR)
                return st_fail(err, errlen, "'%s': module '%s': '%s' is a %s, not a tensor", path, prefix, key->s,
                               pk_type_name[v->type]);
            if ((size_t)snprintf(name, sizeof name, "%s%s", prefix, key->s) >= sizeof name)
                return st_fail(err, errlen, "'%s': a tensor name longer than %zu bytes", path, sizeof name - 1);
            pt_list_add(out, name, v);
        }
    }
    if (mods && mods->type == PK_DICT)
        for (int i = 0; i + 1 < mods->n; i += 2) {
            PkNode *key = mods->a[i], *v = mods->a[i + 1];
            if (v->type == PK_NONE) continue;
            if (key->type != PK_STR || v->type != PK_OBJ || !pt_name_ok(key->s) || key->len != strlen(key->s))
                return st_fail(err, errlen, "'%s': module '%s': a child that is not a module", path, prefix);
            if ((size_t)snprintf(name, sizeof name, "%s%s.", prefix, key->s) >= sizeof name)
                return st_fail(err, errlen, "'%s': a module name longer than %zu bytes", path, sizeof name - 1);
            if (pt_walk_module(path, v, name, depth + 1, out, err, errlen)) return -1;
        }
    return 0;
}

// pt_meta_add: one key/value of st's metadata
static void pt_meta_add(SafeTensors *st, const char *key, const char *val) {
    if (st->nmeta == st->metacap) {
        st->metacap = st->metacap ? 2 * st->metacap : 16;
        st->meta = realloc(st->meta, sizeof(char *) * 2 * (size_t)st->metacap);
        if (!st->meta) die("out of memory");
    }
    st->meta[2 * st->nmeta] = strdup(key);
    st->meta[2 * st->nmeta + 1] = strdup(val);
    st->nmeta++;
}

// pt_scalar_str: a short printable form of a scalar node (str, int, float, bool, None), or NULL
static const char *pt_scalar_str(const PkNode *v, char *buf, size_t n) {
    switch (v->type) {
    case PK_STR: return pt_name_ok(v->s) ? v->s : NULL;
    case PK_INT: snprintf(buf, n, "%" PRId64, v->i); return buf;
    case PK_FLOAT: snprintf(buf, n, "%g", v->f); return buf;
    case PK_BOOL: return v->i ? "True" : "False";
    case PK_NONE: return "None";
    }
    return NULL;
}

// pt_read_meta: names, yaml nc/scale of the model object m, and epoch, date, version, train_args of root
static void pt_read_meta(SafeTensors *st, PkNode *root, PkNode *m) {
    char buf[64];
    PkNode *ms = m && m->state ? m->state : NULL;
    PkNode *names = pk_dict_get(ms, "names"), *yaml = pk_dict_get(ms, "yaml");
    if (names && (names->type == PK_DICT || names->type == PK_LIST)) {   // {0: 'person', ...} or ['person', ...]
        StBuf b = {0};
        int step = names->type == PK_DICT ? 2 : 1, ok = 1;
        for (int i = 0; i + step - 1 < names->n && ok; i += step) {
            PkNode *v = names->a[i + step - 1];
            ok = v->type == PK_STR && pt_name_ok(v->s) &&
                    (step == 1 || (names->a[i]->type == PK_INT && names->a[i]->i == i / 2));
            if (ok) { if (i) stbuf_put(&b, "\n", 1); stbuf_put(&b, v->s, strlen(v->s)); }
        }
        if (ok && b.p) pt_meta_add(st, "names", b.p);
        free(b.p);
    }
    PkNode *v;
    if ((v = pk_dict_get(yaml, "nc")) && v->type == PK_INT) {
        snprintf(buf, sizeof buf, "%" PRId64, v->i);
        pt_meta_add(st, "yaml_nc", buf);
    }
    if ((v = pk_dict_get(yaml, "scale")) && v->type == PK_STR && pt_name_ok(v->s)) pt_meta_add(st, "yaml_scale", v->s);
    static const char *const keys[] = {"epoch", "date", "version"};
    for (int i = 0; i < 3; i++) {
        const char *s;
        if ((v = pk_dict_get(root, keys[i])) && (s = pt_scalar_str(v, buf, sizeof buf))) pt_meta_add(st, keys[i], s);
    }
    PkNode *ta = pk_dict_get(root, "train_args");
    if (ta && ta->type == PK_DICT) {
        StBuf b = {0};
        for (int i = 0; i + 1 < ta->n; i += 2) {
            const char *s = pt_scalar_str(ta->a[i + 1], buf, sizeof buf);
            if (ta->a[i]->type != PK_STR || !s) continue;
            if (b.n) stbuf_put(&b, " ", 1);
            stbuf_printf(&b, "%.40s=%.60s", ta->a[i]->s, s);
        }
        if (b.p) pt_meta_add(st, "train_args", b.p);
        free(b.p);
    }
}

static int pt_cmp_named(const void *a, const void *b) {
    return strcmp(((const PtNamed *)a)->name, ((const PtNamed *)b)->name);
}

// pt_tensors: copies every named tensor's elements (gathering views) into one buffer and fills
// st's entries over it
static int pt_tensors(PtZip *z, PtList *l, SafeTensors *st, char *err, size_t errlen) {
    const char *P = z->path;
    uint64_t total = 0;
    char sb[160];
    {   // duplicate names (a state_dict key given twice)
        PtNamed *c = xmalloc(sizeof(PtNamed) * (size_t)(l->n ? l->n : 1));
        memcpy(c, l->v, sizeof(PtNamed) * (size_t)l->n);
        qsort(c, (size_t)l->n, sizeof(PtNamed), pt_cmp_named);
        int dup = -1;
        for (int i = 1; i < l->n && dup < 0; i++) if (!strcmp(c[i].name, c[i - 1].name)) dup = i;
        if (dup >= 0) st_fail(err, errlen, "'%s': tensor name '%.200s' appears twice", P, c[dup].name);
        free(c);
        if (dup >= 0) return -1;
    }
    st->t = xcalloc((size_t)(l->n ? l->n : 1), sizeof(StEntry));
    st->cap = l->n;
    for (int i = 0; i < l->n; i++) {   // shapes, sizes and bounds first: nothing is read until all are valid
        PkNode *t = l->v[i].t, *s = t->storage;
        StEntry *e = &st->t[st->n++];
        e->name = strdup(l->v[i].name);
        e->dtype = (int)s->i;
        e->ndim = t->ndim;
        e->numel = 1;
        int64_t last = t->offset;   // largest element index the view touches
        for (int d = 0; d < t->ndim; d++) {
            e->shape[d] = t->shape[d];
            if (__builtin_mul_overflow(e->numel, t->shape[d], &e->numel) || e->numel > (int64_t)1 << 40)
                return st_fail(err, errlen, "'%s': tensor '%s' has an impossible shape %s", P, e->name,
                               st_shape_str(sb, sizeof sb, t->ndim, t->shape));
        }
        for (int d = 0; d < t->ndim && e->numel; d++) {
            int64_t span;
            if (__builtin_mul_overflow(t->shape[d] - 1, t->stride[d], &span) ||
                __builtin_add_overflow(last, span, &last))
                return st_fail(err, errlen, "'%s': tensor '%s': strides overflow", P, e->name);
        }
        char key[300];
        snprintf(key, sizeof key, "%sdata/%s", z->prefix, s->s);
        const PtZipEntry *ze = pt_zip_find(z, key);
        int es = st_dtype_size[e->dtype];
        if (!ze)
            return st_fail(err, errlen, "'%s': tensor '%s': its storage record '%s' is missing from the archive", P,
                           e->name, key);
        if ((uint64_t)s->numel_storage > ze->size / (uint64_t)es)
            return st_fail(err, errlen,
                           "'%s': tensor '%s': storage '%s' should hold %" PRId64
                           " %s elements but the record has %" PRIu64 " bytes",
                           P, e->name, key, s->numel_storage, st_dtype_name[e->dtype], ze->size);
        if (e->numel && last >= s->numel_storage)
            return st_fail(err, errlen,
                           "'%s': tensor '%s' (shape %s, offset %" PRId64 ") reaches element %" PRId64 " of a %" PRId64
                           "-element storage",
                           P, e->name, st_shape_str(sb, sizeof sb, t->ndim, t->shape), t->offset, last,
                           s->numel_storage);
        e->begin = total;
        e->end = total + (uint64_t)e->numel * (uint64_t)es;
        total = e->end;
    }
    st->mem = xmalloc((size_t)(total ? total : 1));
    st->data_size = total;
    unsigned char *mem = st->mem;
    for (int i = 0; i < l->n; i++) {
        PkNode *t = l->v[i].t;
        StEntry *e = &st->t[i];
        int es = st_dtype_size[e->dtype];
        char key[300];
        snprintf(key, sizeof key, "%sdata/%s", z->prefix, t->storage->s);
        const PtZipEntry *ze = pt_zip_find(z, key);
        int contiguous = 1;
        int64_t want = 1;
        for (int d = t->ndim - 1; d >= 0; d--) {
            if (t->shape[d] != 1 && t->stride[d] != want) contiguous = 0;
            want *= t->shape[d];
        }
        if (!e->numel) continue;
        if (contiguous) {
            if (pt_read_at(z->f, ze->off + (uint64_t)t->offset * es, mem + e->begin, (size_t)(e->end - e->begin)))
                return st_fail(err, errlen, "'%s': tensor '%s': read failed (file shrank?)", P, e->name);
            continue;
        }
        unsigned char *src = xmalloc((size_t)t->storage->numel_storage * es);   // a view: read the storage, gather
        if (pt_read_at(z->f, ze->off, src, (size_t)t->storage->numel_storage * es)) {
            free(src);
            return st_fail(err, errlen, "'%s': tensor '%s': read failed (file shrank?)", P, e->name);
        }
        int64_t idx[ST_MAXDIM] = {0};
        for (int64_t q = 0; q < e->numel; q++) {
            int64_t o = t->offset;
            for (int d = 0; d < t->ndim; d++) o += idx[d] * t->stride[d];
            memcpy(mem + e->begin + (uint64_t)q * es, src + (uint64_t)o * es, (size_t)es);
            for (int d = t->ndim - 1; d >= 0 && ++idx[d] == t->shape[d]; d--) idx[d] = 0;
        }
        free(src);
    }
    st->by_name = xmalloc(sizeof(StEntry *) * (size_t)(st->n ? st->n : 1));
    for (int i = 0; i < st->n; i++) st->by_name[i] = &st->t[i];
    qsort(st->by_name, (size_t)st->n, sizeof(StEntry *), st_cmp_name);
    return 0;
}

// pt_open_stream: a torch.save zip on stream f (owned from here on) as a SafeTensors st
static int pt_open_stream(FILE *f, const char *label, SafeTensors *st, char *err, size_t errlen) {
    memset(st, 0, sizeof *st);
    st->path = strdup(label ? label : "(stream)");
    if (!st->path) die("out of memory");
    const char *P = st->path;
    PtZip z = {.path = P, .f = f};
    Pk k = {.path = P, .err = err, .errlen = errlen};
    PtList l = {0};
    unsigned char *pkl = NULL;
    int rc = -1;
    off_t size;
    if (fseeko(f, 0, SEEK_END) != 0 || (size = ftello(f)) < 0) {
        st_fail(err, errlen, "'%s': cannot determine the file size", P);
        goto out;
    }
    z.fsize = (uint64_t)size;
    if (pt_zip_open(&z, err, errlen)) goto out;
    char key[300];
    snprintf(key, sizeof key, "%sbyteorder", z.prefix);
    const PtZipEntry *bo = pt_zip_find(&z, key), *pe;
    if (bo) {
        char b[16] = "";
        if (bo->size >= sizeof b || pt_read_at(f, bo->off, b, (size_t)bo->size) || strcmp(b, "little")) {
            st_fail(err, errlen,
                    "'%s': the byteorder record says '%.15s': only little-endian checkpoints are supported", P, b);
            goto out;
        }
    }
    snprintf(key, sizeof key, "%sdata.pkl", z.prefix);
    pe = pt_zip_find(&z, key);
    if (pe->size > PT_MAX_PICKLE) {
        st_fail(err, errlen, "'%s': data.pkl is %" PRIu64 " bytes, over the 64 MiB limit", P, pe->size);
        goto out;
    }
    pkl = xmalloc((size_t)pe->size + 1);
    if (pt_read_at(f, pe->off, pkl, (size_t)pe->size)) {
        st_fail(err, errlen, "'%s': read of data.pkl failed", P);
        goto out;
    }
    k.p = pkl;
    k.n = (size_t)pe->size;
    PkNode *root = NULL, *m = NULL;
    if (pk_run(&k, &root)) goto out;
    const char *src = "state_dict";
    if (root->type == PK_DICT && (pk_dict_get(root, "model") || pk_dict_get(root, "ema"))) {   // Ultralytics checkpoint
        PkNode *ema = pk_dict_get(root, "ema"), *model = pk_dict_get(root, "model");
        m = ema && ema->type != PK_NONE ? ema : model;
        src = m == ema ? "ema" : "model";
        if (!m || m->type == PK_NONE) {
            st_fail(err, errlen, "'%s': a checkpoint whose 'model' and 'ema' are both None", P);
            goto out;
        }
        if (m->type == PK_DICT) root = m, m = NULL;   // a state_dict stored under 'model'
        else if (m->type != PK_OBJ) {
            st_fail(err, errlen, "'%s': checkpoint '%s' is a %s, not a model", P, src, pk_type_name[m->type]);
            goto out;
        }
    } else if (root->type == PK_OBJ) {   // torch.save(model)
        m = root;
        src = "module";
    }
    if (m) {
        if (strcmp(m->cls->s, "ultralytics.nn.tasks.DetectionModel")) {
            st_fail(err, errlen,
                    "'%s': holds a %s, not an ultralytics DetectionModel: only YOLOv8 detection models are supported",
                    P, m->cls->s);
            goto out;
        }
        if (pt_walk_module(P, m, "", 0, &l, err, errlen)) goto out;
    } else if (root->type == PK_DICT) {
        for (int i = 0; i + 1 < root->n; i += 2) {
            PkNode *kk = root->a[i], *v = root->a[i + 1];
            if (kk->type != PK_STR || v->type != PK_TENSOR || !pt_name_ok(kk->s) || kk->len != strlen(kk->s)) {
                st_fail(err, errlen,
                        "'%s': a dict whose entry %d is %s -> %s: neither a state_dict (printable names -> tensors) "
                        "nor an Ultralytics checkpoint ('model'/'ema')",
                        P, i / 2, pk_type_name[kk->type], pk_type_name[v->type]);
                goto out;
            }
            pt_list_add(&l, kk->s, v);
        }
    } else {
        st_fail(err, errlen, "'%s': the pickle holds a %s, not a checkpoint dict, state_dict or model", P,
                pk_type_name[root->type]);
        goto out;
    }
    if (!l.n) { st_fail(err, errlen, "'%s': no tensors found", P); goto out; }
    if (pt_tensors(&z, &l, st, err, errlen)) goto out;
    pt_meta_add(st, "pt_source", src);
    if (m) pt_meta_add(st, "pt_class", m->cls->s);
    pt_read_meta(st, root, m);
    st->f = fmemopen(st->mem, (size_t)(st->data_size ? st->data_size : 1), "rb");
    if (!st->f) { st_fail(err, errlen, "'%s': fmemopen failed: %s", P, strerror(errno)); goto out; }
    rc = 0;
out:
    for (int i = 0; i < l.n; i++) free(l.v[i].name);
    free(l.v);
    free(pkl);
    pk_free(&k);
    pt_zip_close(&z);
    fclose(f);
    if (rc) st_close(st);
    return rc;
}

// weights_open: path as a SafeTensors, whatever its format: a torch.save zip (.pt), or safetensors.
// Recognises and explains the files people end up with instead of weights.
static int weights_open(const char *path, SafeTensors *st, char *err, size_t errlen) {
    memset(st, 0, sizeof *st);
    FILE *f = fopen(path, "rb");
    if (!f) return st_fail(err, errlen, "'%s': cannot open: %s", path, strerror(errno));
    unsigned char head[200] = {0};
    size_t n = fread(head, 1, sizeof head - 1, f);
    struct stat sb;
    long long size = fstat(fileno(f), &sb) == 0 ? (long long)sb.st_size : -1;
    if (n >= 40 && !memcmp(head, "version https://git-lfs.github.com/spec/", 40)) {
        fclose(f);
        const char *sz = strstr((const char *)head, "\nsize ");
        return st_fail(err, errlen,
                       "'%s' is a Git LFS pointer (%lld bytes), not the weights%s%.*s%s: fetch the real file with "
                       "`git lfs pull` (git lfs install first if needed) or download it again",
                       path, size, sz ? " (the real file has " : "", sz ? (int)strcspn(sz + 6, "\n") : 0,
                       sz ? sz + 6 : "", sz ? " bytes)" : "");
    }
    const char *ext = strrchr(path, '.');
    int pt_ext = ext && (!strcmp(ext, ".pt") || !strcmp(ext, ".pth"));
    // torch < 1.6 wrote a bare pickle stream starting with a pickled magic number (LONG1 0x1950a86a20f9469cfc6c)
    static const unsigned char legacy[] = {0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19};
    if (n >= 14 && head[0] == 0x80 && head[1] >= 2 && head[1] <= 5 &&
        (pt_ext || !memcmp(head + 2, legacy, sizeof legacy)))
        return fclose(f),
               st_fail(err, errlen,
                       "'%s': the legacy (non-zip) PyTorch format of torch < 1.6: re-save it with a "
                       "current torch (torch.save(torch.load(f), f2)) and use the new file",
                       path);
    int is_zip = n >= 4 && !memcmp(head, "PK\x03\x04", 4);
    if (is_zip || pt_ext) {
        if (!is_zip) {
            fclose(f);
            return st_fail(err, errlen,
                           "'%s': not a PyTorch checkpoint: a .pt file is a zip archive, this one starts with "
                           "%02x %02x %02x %02x (%lld bytes)",
                           path, head[0], head[1], head[2], head[3], size);
        }
        return pt_open_stream(f, path, st, err, errlen);
    }
    rewind(f);
    return st_open_stream(f, path, st, err, errlen);
}

// weights_describe: prints what the weights file path is (format, scale, nc, class names, the
// checkpoint's epoch/date/version/train_args, the parameter count Ultralytics reports: float
// tensors less BN running statistics) and returns its scale and nc as weights_infer does.
static int weights_describe(const char *path, int *nc, char *scale, char *err, size_t errlen) {
    if (weights_infer(path, nc, scale, err, errlen)) return -1;
    SafeTensors st;
    if (weights_open(path, &st, err, errlen)) return -1;
    const char *src = st_meta(&st, "pt_source"), *v;
    long long nparam = 0;
    for (int i = 0; i < st.n; i++) {
        const char *nm = st.t[i].name;
        size_t l = strlen(nm);
        if (st_dtype_is_float(st.t[i].dtype) && !(l > 13 && !strcmp(nm + l - 13, ".running_mean")) &&
            !(l > 12 && !strcmp(nm + l - 12, ".running_var")))
            nparam += st.t[i].numel;
    }
    printf("model=%s: %s, YOLOv8%c, nc=%d, %d tensors, %lld parameters\n", path,
           !src                                 ? "safetensors weights"
                   : !strcmp(src, "state_dict") ? "PyTorch state_dict"
                   : !strcmp(src, "ema")        ? "Ultralytics checkpoint (EMA weights)"
                   : !strcmp(src, "model")      ? "Ultralytics checkpoint (model weights)"
                                                : "pickled PyTorch model",
           *scale, *nc, st.n, nparam);
    if ((v = st_meta(&st, "pt_class"))) printf("  class: %s\n", v);
    if ((v = st_meta(&st, "yaml_scale")) || st_meta(&st, "yaml_nc"))
        printf("  yaml: scale %s, nc %s\n", v ? v : "-", st_meta(&st, "yaml_nc") ? st_meta(&st, "yaml_nc") : "-");
    if ((v = st_meta(&st, "names"))) {
        printf("  names:");
        for (int i = 0; *v; i++) {
            int l = (int)strcspn(v, "\n");
            printf("%s %d: %.*s", i ? "," : "", i, l, v);
            v += l + (v[l] != 0);
        }
        printf("\n");
    }
    static const char *const keys[] = {"epoch", "date", "version", "train_args"};
    for (int i = 0; i < 4; i++)
        if ((v = st_meta(&st, keys[i]))) printf("  %s: %s\n", keys[i], v);
    st_close(&st);
    return 0;
}

// weights_names: the nc class names a checkpoint carries (Ultralytics model.names), as a malloc'd
// array of strings, or NULL when the file has none or not exactly nc of them
static char **weights_names(const char *path, int nc) {
    SafeTensors st;
    char err[512];
    if (weights_open(path, &st, err, sizeof err)) return NULL;
    const char *v = st_meta(&st, "names");
    char **names = NULL;
    int n = 0;
    for (const char *s = v; s && *s; n++) s += strcspn(s, "\n") + (s[strcspn(s, "\n")] != 0);
    if (v && n == nc) {
        names = xcalloc((size_t)nc, sizeof(char *));
        for (int i = 0; i < nc; i++) {
            size_t l = strcspn(v, "\n");
            names[i] = strndup(v, l);
            v += l + (v[l] != 0);
        }
    }
    st_close(&st);
    return names;
}

// weights_transfer: Ultralytics' intersect_dicts: every ref whose name is in the file with the same
// shape is loaded (all or nothing, NaN/Inf refused); *loaded counts them (PARAM_COUNT included).
static int weights_transfer(const char *path, ParamRef *refs, int n, int *loaded, char *err, size_t errlen) {
    SafeTensors st;
    if (weights_open(path, &st, err, errlen)) return -1;
    ParamRef *sel = xmalloc(sizeof(ParamRef) * (size_t)(n ? n : 1));
    int *from = xmalloc(sizeof(int) * (size_t)(n ? n : 1)), k = 0;
    for (int i = 0; i < n; i++) {
        const StEntry *e = st_find(&st, refs[i].name);
        if (!e) continue;
        int same = refs[i].kind == PARAM_COUNT ? e->numel == 1 && !st_dtype_is_float(e->dtype)
                                               : e->ndim == refs[i].ndim && st_dtype_is_float(e->dtype);
        for (int d = 0; same && refs[i].kind != PARAM_COUNT && d < e->ndim; d++) same = e->shape[d] == refs[i].shape[d];
        if (same) { from[k] = i; sel[k++] = refs[i]; }
    }
    int rc = weights_load_st(&st, sel, k, NULL, 1, err, errlen);
    for (int j = 0; j < k && !rc; j++) refs[from[j]].count = sel[j].count;
    *loaded = rc ? 0 : k;
    free(sel); free(from);
    st_close(&st);
    return rc;
}

// ------------------------------------------------------------------------------------------
// evaluation: head decode, NMS, matching, mAP (Ultralytics Detect inference, non_max_suppression, DetMetrics)
// ------------------------------------------------------------------------------------------
//
// Public API (all static; shapes use B, NC, A, R = 16 DFL bins):
//
//   Det                     one detection: x1, y1, x2, y2 (input pixels), score, cls
//   head_anchor_count(imgH, imgW)                     -> A = sum over strides 8/16/32 of H_i*W_i
//   head_decode(maps, B, NC, imgH, imgW, out)         raw maps[3] (B, 64+NC, H_i, W_i) ->
//                                                     out (B, 4+NC, A): [cx, cy, w, h]*stride and
//                                                     sigmoid scores, exactly Ultralytics' eval output
//   NmsConfig nms_config_val() / nms_config_predict() conf 0.001 / 0.25, iou 0.7, max_det 300,
//                                                     max_nms 30000, multi_label 1 / 0, agnostic 0
//   nms_init(&nms, cfg, NC, A) / nms_free(&nms)       one allocation of every work buffer
//   nms_run_maps(&nms, maps, b, imgH, imgW, out)      NMS of image b straight from the raw maps
//                                                     (only candidate anchors are decoded);
//                                                     out must hold cfg.max_det Dets; returns count
//   evaluator_init(&ev, NC) / evaluator_reset / evaluator_free
//   evaluator_add_image(&ev, dets, n, gt_box, gt_cls, M)   match one image (gt_box (M, 4) xyxy, same
//                                                     pixel space as the dets) and store per-detection
//                                                     (conf, cls, tp[10]) and per-label class
//   evaluator_compute(&ev, &metrics)                  ap_per_class: P, R, mAP50, mAP50-95, per-class AP;
//                                                     fitness = mAP50-95; metrics_free(&metrics)
//                                                     releases its per-class arrays
//
// Matching follows match_predictions literally, which is not a pure greedy-by-IoU matching
// (what a summary of it suggests): each detection takes its best-IoU label, then each label goes to the
// lowest-index (highest-confidence) detection that chose it; other detections are FP at that
// threshold even when a second-best label was free. Perfect detections score AP 0.995, not 1
// (the (1, 0) sentinel of compute_ap is hit by the last of the 101 points).
//
// Output order of both NMS paths: descending score; equal scores keep candidate order, which
// is anchor-major then class (torch.where order), as a stable sort gives. The max_nms cut keeps
// the max_nms first candidates in that same order (quickselect, then a sort of those only).
// An Nms is scratch for one image at a time: use one per thread.
//
// DEVIATIONS from Ultralytics in this section:
//  - All sorts are stable. Ultralytics sorts with np.argsort (quicksort, unstable) in
//    ap_per_class and match_predictions and with torch argsort for max_nms; results differ only
//    when two confidences (or two IoUs of one detection) are exactly equal.
//    Tie rules we implement: ap_per_class keeps image order then NMS order for equal
//    confidences; in matching a detection with two labels at exactly the same IoU takes the
//    label with the larger index (what a stable argsort followed by [::-1] gives).
//  - NMS stops as soon as max_det boxes are kept. Greedy NMS decides box k only from boxes
//    kept before it, so the first max_det kept boxes are the same as Ultralytics' full NMS
//    followed by [:max_det].
//  - No NMS time limit (Ultralytics only warns and stops early on slow hardware).
//  - Softmax/DFL sums and sigmoid are plain float loops; PyTorch's vectorised kernels may
//    differ in the last bit.
//

#define EVAL_NIOU 10          // IoU thresholds 0.50:0.05:0.95
#define EVAL_NGRID 1000       // confidence grid of the P/R/F1 curves
#define NMS_MAX_WH 7680.0f    // class offset of class-aware NMS (Ultralytics max_wh)

// IoU thresholds: torch.linspace(0.5, 0.95, 10) in float32 equals the nearest floats below.
static const float eval_iouv[EVAL_NIOU] = {0.50f, 0.55f, 0.60f, 0.65f, 0.70f,
                                          0.75f, 0.80f, 0.85f, 0.90f, 0.95f};
static const int head_strides[3] = {8, 16, 32};

typedef struct {
    float x1, y1, x2, y2;     // box corners in network-input pixels
    float score;              // class probability (sigmoid)
    int cls;                  // class index in [0, NC)
} Det;

// ------------------------------------------------------------------------------------------
// stable sorting and numpy-compatible helpers
// ------------------------------------------------------------------------------------------

// idx_before: the total order every sort here uses: higher key first, equal keys by lower
// index. For an identity start this is what a stable descending sort gives.
static inline int idx_before(const float *key, int32_t a, int32_t b) {
    return key[a] > key[b] || (key[a] == key[b] && a < b);
}

// sort_desc_stable: reorder idx[0..n) by idx_before (bottom-up merge sort, tmp holds n ints).
// With idx = 0..n-1 on entry this is np.argsort(-key, kind="stable"); it stands in for
// np.argsort(-x) and torch sort(descending=True), see DEVIATIONS.
static void sort_desc_stable(int32_t *idx, int32_t *tmp, int64_t n, const float *key) {
    int32_t *src = idx, *dst = tmp;
    for (int64_t width = 1; width < n; width *= 2) {
        for (int64_t lo = 0; lo < n; lo += 2 * width) {
            int64_t mid = lo + width < n ? lo + width : n;
            int64_t hi = lo + 2 * width < n ? lo + 2 * width : n;
            int64_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi) dst[k++] = idx_before(key, src[j], src[i]) ? src[j++] : src[i++];
            while (i < mid) dst[k++] = src[i++];
            while (j < hi) dst[k++] = src[j++];
        }
        int32_t *t = src; src = dst; dst = t;
    }
    if (src != idx) memcpy(idx, src, (size_t)n * sizeof *idx);
}

// select_top: quickselect so that idx[0..k) holds the first k of idx[0..n) under idx_before
// (in no particular order). O(n); lets NMS sort only max_nms of up to A*NC candidates.
static void select_top(int32_t *idx, int64_t n, int64_t k, const float *key) {
    int64_t lo = 0, hi = n - 1;
    while (lo < hi) {
        int32_t a = idx[lo], b = idx[lo + (hi - lo) / 2], c = idx[hi], pivot;   // median of three
        if (idx_before(key, a, b)) pivot = idx_before(key, b, c) ? b : idx_before(key, a, c) ? c : a;
        else pivot = idx_before(key, a, c) ? a : idx_before(key, b, c) ? c : b;
        int64_t i = lo, j = hi;
        while (i <= j) {
            while (idx_before(key, idx[i], pivot)) i++;
            while (idx_before(key, pivot, idx[j])) j--;
            if (i <= j) { int32_t t = idx[i]; idx[i] = idx[j]; idx[j] = t; i++; j--; }
        }
        if (k - 1 <= j) hi = j;
        else if (k - 1 >= i) lo = i;
        else break;
    }
}

// np_interp: numpy.interp(x, xp, fp, left, right) for one query, xp non-decreasing (n >= 1).
// Picks j = last index with xp[j] <= x and interpolates to j+1 exactly as numpy's C loop does
// (including x == xp[n-1] -> fp[n-1], which gives the (1, 0) end of compute_ap its weight).
static double np_interp(double x, const double *xp, const double *fp, int64_t n, double left, double right) {
    if (x > xp[n - 1]) return right;
    if (x < xp[0]) return left;
    if (x == xp[n - 1]) return fp[n - 1];
    int64_t lo = 0, hi = n - 1;               // invariant: xp[lo] <= x < xp[hi]
    while (hi - lo > 1) {
        int64_t mid = (lo + hi) / 2;
        if (xp[mid] <= x) lo = mid; else hi = mid;
    }
    int64_t j = lo;
    if (xp[j] == x) return fp[j];
    double slope = (fp[j + 1] - fp[j]) / (xp[j + 1] - xp[j]);
    double y = slope * (x - xp[j]) + fp[j];
    if (isnan(y)) {
        y = slope * (x - xp[j + 1]) + fp[j + 1];
        if (isnan(y) && fp[j] == fp[j + 1]) y = fp[j];
    }
    return y;
}

// sigmoid_f: torch.sigmoid in float32.
static inline float sigmoid_f(float x) { return 1.0f / (1.0f + expf(-x)); }

// ------------------------------------------------------------------------------------------
// head decode (Detect inference path: DFL, dist2bbox, strides, sigmoid)
// ------------------------------------------------------------------------------------------

// head_anchor_count: A for an input of imgH x imgW (both multiples of 32), levels P3, P4, P5.
static int head_anchor_count(int imgH, int imgW) {
    if (imgH <= 0 || imgW <= 0 || imgH % 32 || imgW % 32)
        die("head decode: image size %dx%d must be positive multiples of 32", imgH, imgW);
    int A = 0;
    for (int l = 0; l < 3; l++) A += (imgH / head_strides[l]) * (imgW / head_strides[l]);
    return A;
}

// anchor_decode_xywh: DFL expectation of the 4 sides at one pixel of one level, then
// Ultralytics dist2bbox(xywh=True) times the stride. map points at this image's
// (64+NC, H, W) block, HW = H*W, pix = y*W + x. Matches DFL.forward + Detect._inference.
static void anchor_decode_xywh(const float *map, int HW, int pix, int x, int y, float stride, float xywh[4]) {
    float dist[4];                            // l, t, r, b in grid units
    for (int side = 0; side < 4; side++) {
        const float *lg = map + (size_t)side * 16 * HW + pix;   // 16 bins, channel stride HW
        float mx = lg[0];
        for (int k = 1; k < 16; k++) mx = lg[(size_t)k * HW] > mx ? lg[(size_t)k * HW] : mx;
        float e[16], sum = 0.0f;
        for (int k = 0; k < 16; k++) { e[k] = expf(lg[(size_t)k * HW] - mx); sum += e[k]; }
        float d = 0.0f;
        for (int k = 0; k < 16; k++) d += (e[k] / sum) * (float)k;
        dist[side] = d;
    }
    float ax = (float)x + 0.5f, ay = (float)y + 0.5f;
    float x1 = ax - dist[0], y1 = ay - dist[1], x2 = ax + dist[2], y2 = ay + dist[3];
    xywh[0] = (x1 + x2) / 2.0f * stride;
    xywh[1] = (y1 + y2) / 2.0f * stride;
    xywh[2] = (x2 - x1) * stride;
    xywh[3] = (y2 - y1) * stride;
}

// head_decode: the tensor Ultralytics' Detect returns in eval mode.
// maps[l]: (B, 64+NC, H_l, W_l) raw head outputs for strides 8, 16, 32 (H_l = imgH/stride).
// out: (B, 4+NC, A), rows cx, cy, w, h (input pixels) then NC sigmoid scores; anchors in level
// order, row-major within a level.
static void head_decode(const float *const maps[3], int B, int NC, int imgH, int imgW, float *out) {
    int A = head_anchor_count(imgH, imgW), C = 64 + NC;
    #pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++)
        for (int l = 0; l < 3; l++) {
            int H = imgH / head_strides[l], W = imgW / head_strides[l], HW = H * W, a0 = 0;
            for (int q = 0; q < l; q++) a0 += (imgH / head_strides[q]) * (imgW / head_strides[q]);
            const float *map = maps[l] + (size_t)b * C * HW;              // (64+NC, H, W)
            float *o = out + (size_t)b * (4 + NC) * A;                     // (4+NC, A)
            for (int pix = 0; pix < HW; pix++) {
                float xywh[4];
                anchor_decode_xywh(map, HW, pix, pix % W, pix / W, (float)head_strides[l], xywh);
                for (int k = 0; k < 4; k++) o[(size_t)k * A + a0 + pix] = xywh[k];
                for (int c = 0; c < NC; c++)
                    o[(size_t)(4 + c) * A + a0 + pix] = sigmoid_f(map[(size_t)(64 + c) * HW + pix]);
            }
        }
}

// ------------------------------------------------------------------------------------------
// NMS (utils/nms.py non_max_suppression + torchvision.ops.nms), one image at a time
// ------------------------------------------------------------------------------------------

typedef struct {
    float conf;               // candidate threshold on class score: score > conf (0.001 val, 0.25 predict)
    float iou;                // NMS IoU threshold: suppress when IoU > iou (0.7)
    int max_det;              // detections kept per image (300)
    int max_nms;              // candidates entering NMS at most (30000)
    int multi_label;          // 1: every (anchor, class) with score > conf; ignored (0) when NC == 1
    int agnostic;             // 1: one NMS over all classes (single_cls / agnostic_nms)
} NmsConfig;

enum { NMS_MAX_DET = 300, NMS_MAX_NMS = 30000 };   // non_max_suppression's max_det and max_nms defaults
static NmsConfig nms_config_val(void) { return (NmsConfig){0.001f, 0.7f, NMS_MAX_DET, NMS_MAX_NMS, 1, 0}; }
static NmsConfig nms_config_predict(void) { return (NmsConfig){0.25f, 0.7f, NMS_MAX_DET, NMS_MAX_NMS, 0, 0}; }

// Nms: every buffer one image needs, allocated once by nms_init for (NC, A).
typedef struct {
    NmsConfig cfg;
    int NC, A;
    int64_t cap;              // candidate capacity: A*NC with multi_label, else A
    int32_t *cand;            // (cap) candidate = anchor*NC + cls
    float *score;             // (cap) candidate score
    int32_t *order, *tmp;     // (cap) sort permutation and merge buffer
    float *box;               // (A, 4) xyxy of candidate anchors (others stale)
    float *kept;              // (max_det, 5) offset box x1, y1, x2, y2 and its area
    float *s;                 // (NC) scores of one anchor (nms_run_maps)
} Nms;

// nms_init: size and allocate the work buffers. Memory = 16*cap + 16*A + 20*max_det bytes
// (A=8400, NC=80: about 11 MB).
static void nms_init(Nms *n, NmsConfig cfg, int NC, int A) {
    if (NC < 1 || A < 1 || cfg.max_det < 1 || cfg.max_nms < 1)
        die("nms_init: bad NC=%d A=%d max_det=%d max_nms=%d", NC, A, cfg.max_det, cfg.max_nms);
    if (NC == 1) cfg.multi_label = 0;         // Ultralytics: multi_label &= nc > 1
    n->cfg = cfg; n->NC = NC; n->A = A;
    n->cap = cfg.multi_label ? (int64_t)A * NC : A;
    if (n->cap > INT32_MAX) die("nms_init: A*NC = %lld candidates is too many", (long long)n->cap);
    n->cand = xmalloc((size_t)n->cap * sizeof(int32_t));
    n->score = xmalloc((size_t)n->cap * sizeof(float));
    n->order = xmalloc((size_t)n->cap * sizeof(int32_t));
    n->tmp = xmalloc((size_t)n->cap * sizeof(int32_t));
    n->box = xmalloc((size_t)A * 4 * sizeof(float));
    n->kept = xmalloc((size_t)cfg.max_det * 5 * sizeof(float));
    n->s = xmalloc((size_t)NC * sizeof(float));
}

static void nms_free(Nms *n) {
    free(n->cand); free(n->score); free(n->order); free(n->tmp); free(n->box); free(n->kept); free(n->s);
    memset(n, 0, sizeof *n);
}

// nms_store_box: xywh -> xyxy (Ultralytics xywh2xyxy, float32) into the anchor's box slot.
static inline void nms_store_box(Nms *n, int a, const float xywh[4]) {
    float hw = xywh[2] / 2.0f, hh = xywh[3] / 2.0f, *bx = n->box + (size_t)a * 4;
    bx[0] = xywh[0] - hw; bx[1] = xywh[1] - hh; bx[2] = xywh[0] + hw; bx[3] = xywh[1] + hh;
}

// nms_add_anchor: append the candidates of one anchor given its NC scores (stride sstep).
// multi_label: every class with score > conf, in class order; otherwise the first maximal
// class if it beats conf. Returns 1 when the anchor produced a candidate.
static int nms_add_anchor(Nms *n, int64_t *count, int a, const float *s, size_t sstep) {
    int NC = n->NC, any = 0;
    float conf = n->cfg.conf;
    if (n->cfg.multi_label) {
        for (int c = 0; c < NC; c++) {
            float v = s[(size_t)c * sstep];
            if (v > conf) { n->cand[*count] = a * NC + c; n->score[*count] = v; (*count)++; any = 1; }
        }
    } else {
        int best = 0;
        for (int c = 1; c < NC; c++) if (s[(size_t)c * sstep] > s[(size_t)best * sstep]) best = c;
        float v = s[(size_t)best * sstep];
        if (v > conf) { n->cand[*count] = a * NC + best; n->score[*count] = v; (*count)++; any = 1; }
    }
    return any;
}

// nms_finish: sort candidates by score (stable, descending), keep the top max_nms, then greedy
// class-offset NMS with torchvision semantics (IoU in float32 on boxes + cls*7680, suppress
// when IoU > iou), stopping at max_det kept. Writes out (max_det) and returns the count.
static int nms_finish(Nms *n, int64_t count, Det *out) {
    for (int64_t i = 0; i < count; i++) n->order[i] = (int32_t)i;
    if (count > n->cfg.max_nms) {
        select_top(n->order, count, n->cfg.max_nms, n->score);
        count = n->cfg.max_nms;
    }
    sort_desc_stable(n->order, n->tmp, count, n->score);
    int nk = 0, NC = n->NC;
    double thr = n->cfg.iou;                  // torchvision compares float IoU with a double
    for (int64_t r = 0; r < count && nk < n->cfg.max_det; r++) {
        int32_t ci = n->order[r];
        int a = n->cand[ci] / NC, cls = n->cand[ci] % NC;
        const float *bx = n->box + (size_t)a * 4;
        float off = n->cfg.agnostic ? 0.0f : (float)cls * NMS_MAX_WH;
        float x1 = bx[0] + off, y1 = bx[1] + off, x2 = bx[2] + off, y2 = bx[3] + off;
        float area = (x2 - x1) * (y2 - y1);
        int suppressed = 0;
        for (int k = 0; k < nk && !suppressed; k++) {
            const float *kb = n->kept + (size_t)k * 5;
            float xx1 = fmaxf(kb[0], x1), yy1 = fmaxf(kb[1], y1);
            float xx2 = fminf(kb[2], x2), yy2 = fminf(kb[3], y2);
            float w = fmaxf(0.0f, xx2 - xx1), h = fmaxf(0.0f, yy2 - yy1);
            float inter = w * h;
            float ovr = inter / (kb[4] + area - inter);
            if ((double)ovr > thr) suppressed = 1;
        }
        if (suppressed) continue;
        float *kb = n->kept + (size_t)nk * 5;
        kb[0] = x1; kb[1] = y1; kb[2] = x2; kb[3] = y2; kb[4] = area;
        out[nk] = (Det){bx[0], bx[1], bx[2], bx[3], n->score[ci], cls};
        nk++;
    }
    return nk;
}

// nms_run_maps: the same result as head_decode + non_max_suppression for image b, computed from the
// raw maps (B, 64+NC, H_l, W_l). Scores are sigmoid'ed only for logits near or above
// logit(conf), and DFL boxes are decoded only for candidate anchors.
static int nms_run_maps(Nms *n, const float *const maps[3], int b, int imgH, int imgW, Det *out) {
    int NC = n->NC, C = 64 + NC;
    if (head_anchor_count(imgH, imgW) > n->A)
        die("nms_run_maps: %dx%d gives %d anchors, more than the %d the Nms was sized for", imgH, imgW,
            head_anchor_count(imgH, imgW), n->A);
    float conf = n->cfg.conf;
    // sigmoid(x) > conf  <=>  x > log(conf/(1-conf)); the margin covers float rounding.
    float lthr = conf > 0.0f && conf < 1.0f ? logf(conf / (1.0f - conf)) - 1e-3f : -INFINITY;
    float *s = n->s;                          // (NC) one anchor's scores
    int64_t count = 0;
    for (int l = 0, a0 = 0; l < 3; l++) {
        int H = imgH / head_strides[l], W = imgW / head_strides[l], HW = H * W;
        const float *map = maps[l] + (size_t)b * C * HW;                 // (64+NC, H, W)
        for (int pix = 0; pix < HW; pix++) {
            const float *lg = map + (size_t)64 * HW + pix;
            int near = 0;
            for (int c = 0; c < NC; c++) {
                float x = lg[(size_t)c * HW];
                s[c] = x > lthr ? sigmoid_f(x) : 0.0f;
                near |= x > lthr;
            }
            if (!near) continue;
            if (nms_add_anchor(n, &count, a0 + pix, s, 1)) {
                float xywh[4];
                anchor_decode_xywh(map, HW, pix, pix % W, pix / W, (float)head_strides[l], xywh);
                nms_store_box(n, a0 + pix, xywh);
            }
        }
        a0 += HW;
    }
    return nms_finish(n, count, out);
}

// ------------------------------------------------------------------------------------------
// matching and AP (engine/validator.py match_predictions, utils/metrics.py ap_per_class)
// ------------------------------------------------------------------------------------------

// Evaluator: per-detection and per-label records of a whole validation pass.
typedef struct {
    int NC;
    int64_t n, cap;           // detections stored / capacity
    float *conf;              // (cap) detection score
    int32_t *cls;             // (cap) detection class
    uint16_t *tp;             // (cap) bit t set = TP at IoU threshold eval_iouv[t]
    int64_t *n_gt;            // (NC) labels per class
    float *iou;               // (iou_cap) scratch M x N IoU matrix of one image
    int64_t iou_cap;
    int *best, *taken;        // (N) / (M) scratch, grown with the image
    int64_t best_cap, taken_cap;
    int64_t *cm;              // (NC+1, NC+1) confusion matrix: row = predicted, column = true class; NC = background
    float *pairs;             // (pairs_cap, 3) scratch of confusion_add: label, detection, IoU
    int64_t pairs_cap;
} Evaluator;

typedef struct {
    double P, R;              // mean over classes with GT, at the max-F1 confidence
    double map50, map;        // mAP at IoU 0.5 and mean over 0.50:0.95
    double fitness;           // = map (Ultralytics 8.3 fitness for best.pt)
    int n_cls;                // classes with >= 1 label (the ones averaged)
    double *ap50, *ap;        // (NC) per-class AP50 and AP50-95; -1 for classes without labels
    double *p, *r;            // (NC) per-class P and R at the max-F1 confidence; -1 without labels
    double conf_best;         // confidence grid value where the smoothed mean F1 peaks
    int *curve_cls;           // (n_cls) class of each curve row: the classes with labels, in order
    double *curve_p, *curve_r;   // (n_cls, EVAL_NGRID) precision and recall at IoU 0.5 against confidence
    double *curve_pr;         // (n_cls, EVAL_NGRID) precision against recall (compute_ap's envelope at IoU 0.5)
} Metrics;

static void evaluator_init(Evaluator *ev, int NC) {
    memset(ev, 0, sizeof *ev);
    if (NC < 1) die("evaluator_init: NC=%d", NC);
    ev->NC = NC;
    ev->n_gt = xcalloc((size_t)NC, sizeof(int64_t));
    ev->cm = xcalloc((size_t)(NC + 1) * (NC + 1), sizeof(int64_t));
}

// evaluator_reset: forget all images (keeps the buffers).
static void evaluator_reset(Evaluator *ev) {
    ev->n = 0;
    memset(ev->n_gt, 0, (size_t)ev->NC * sizeof(int64_t));
    memset(ev->cm, 0, (size_t)(ev->NC + 1) * (ev->NC + 1) * sizeof(int64_t));
}

static void evaluator_free(Evaluator *ev) {
    free(ev->conf); free(ev->cls); free(ev->tp); free(ev->n_gt); free(ev->iou); free(ev->best); free(ev->taken);
    free(ev->cm); free(ev->pairs);
    memset(ev, 0, sizeof *ev);
}

// grow_buffer: realloc p to hold need elements of size sz when *cap is short (amortised doubling).
static void *grow_buffer(void *p, int64_t *cap, int64_t need, size_t sz) {
    if (need <= *cap) return p;
    int64_t nc = *cap ? *cap : 256;
    while (nc < need) nc *= 2;
    void *q = realloc(p, (size_t)nc * sz);
    if (!q) die("evaluator: out of host memory growing to %lld elements", (long long)nc);
    *cap = nc;
    return q;
}

// box_iou_f: utils/metrics.py box_iou for one pair, float32 with eps = 1e-7 added last.
static inline float box_iou_f(const float *a, const float *b) {
    float w = fminf(a[2], b[2]) - fmaxf(a[0], b[0]);
    float h = fminf(a[3], b[3]) - fmaxf(a[1], b[1]);
    float inter = fmaxf(w, 0.0f) * fmaxf(h, 0.0f);
    float a1 = (a[2] - a[0]) * (a[3] - a[1]), a2 = (b[2] - b[0]) * (b[3] - b[1]);
    return inter / (a1 + a2 - inter + 1e-7f);
}

// Confusion matrix thresholds: Ultralytics' ConfusionMatrix for detection keeps detections with
// score > 0.25 (the validation NMS keeps 0.001) and pairs a label and a detection at IoU > 0.45.
#define CM_CONF 0.25f
#define CM_IOU 0.45f

static int pair_iou_desc(const void *a, const void *b) {
    const float *p = a, *q = b;
    if (p[2] != q[2]) return p[2] < q[2] ? 1 : -1;
    if (p[0] != q[0]) return p[0] < q[0] ? -1 : 1;
    return p[1] < q[1] ? -1 : p[1] > q[1];
}

// confusion_add: one image into ev->cm (ConfusionMatrix.process_batch for detection). Class-
// agnostic pairs (label, detection) with IoU > CM_IOU, by IoU descending: each detection keeps its
// best pair, then each label its best of those. A matched label counts at (detection class, label
// class), an unmatched label at (background, class), an unmatched detection at (class, background).
// So the matrix sums to labels + unmatched detections, and column c sums to the labels of class c.
// (Ultralytics before its December 2024 fix skipped the unmatched detections of an image where no
// pair passed the IoU; current Ultralytics counts them, as here.)
// dets: (N) in NMS order; gt_box: (M, 4) x1 y1 x2 y2 in the same pixels; gt_cls: (M).
static void confusion_add(Evaluator *ev, const Det *dets, int N, const float *gt_box, const int *gt_cls, int M) {
    int NC = ev->NC, np_ = 0;
    ev->pairs = grow_buffer(ev->pairs, &ev->pairs_cap, 3 * ((int64_t)M * N + 1), sizeof(float));
    ev->best = grow_buffer(ev->best, &ev->best_cap, N + 1, sizeof(int));
    ev->taken = grow_buffer(ev->taken, &ev->taken_cap, M + 1, sizeof(int));
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            const float db[4] = {dets[j].x1, dets[j].y1, dets[j].x2, dets[j].y2};
            float v = dets[j].score > CM_CONF ? box_iou_f(gt_box + (size_t)i * 4, db) : 0.0f;
            if (v > CM_IOU) {
                float *p = ev->pairs + 3 * (size_t)np_++;
                p[0] = (float)i; p[1] = (float)j; p[2] = v;
            }
        }
    qsort(ev->pairs, (size_t)np_, 3 * sizeof(float), pair_iou_desc);
    for (int j = 0; j < N; j++) ev->best[j] = -1;     // detection j -> its label, then -2 once kept
    for (int i = 0; i < M; i++) ev->taken[i] = -1;    // label i -> its detection
    for (int k = 0; k < np_; k++) {
        const float *p = ev->pairs + 3 * (size_t)k;
        int i = (int)p[0], j = (int)p[1];
        if (ev->best[j] != -1) continue;              // not this detection's best pair
        ev->best[j] = i;
        if (ev->taken[i] == -1) ev->taken[i] = j;
    }
    for (int i = 0; i < M; i++) {
        int j = ev->taken[i];
        ev->cm[(size_t)(j >= 0 ? dets[j].cls : NC) * (NC + 1) + gt_cls[i]]++;
        if (j >= 0) ev->best[j] = -2;
    }
    for (int j = 0; j < N; j++)
        if (dets[j].score > CM_CONF && ev->best[j] != -2) ev->cm[(size_t)dets[j].cls * (NC + 1) + NC]++;
}

// evaluator_add_image: match one image's detections (in NMS order) against its labels.
// dets: (N); gt_box: (M, 4) x1 y1 x2 y2 in the same pixels; gt_cls: (M).
// Per threshold t this reproduces match_predictions exactly: the pairs with IoU >= t sorted by
// IoU descending, np.unique on the detection column (first occurrence = each detection's best
// label; equal IoUs -> larger label index), then np.unique on the label column of that result,
// which np.unique has reordered by detection index: each label goes to the lowest-index
// detection that chose it. Those detections are TP.
static void evaluator_add_image(Evaluator *ev, const Det *dets, int N, const float *gt_box, const int *gt_cls, int M) {
    for (int i = 0; i < M; i++) {
        if (gt_cls[i] < 0 || gt_cls[i] >= ev->NC) die("evaluator: label class %d outside [0, %d)", gt_cls[i], ev->NC);
        ev->n_gt[gt_cls[i]]++;
    }
    for (int j = 0; j < N; j++)
        if (dets[j].cls < 0 || dets[j].cls >= ev->NC)
            die("evaluator: detection class %d outside [0, %d)", dets[j].cls, ev->NC);
    confusion_add(ev, dets, N, gt_box, gt_cls, M);
    if (N == 0) return;
    int64_t cap = ev->cap;                    // the three per-detection arrays grow together
    ev->conf = grow_buffer(ev->conf, &cap, ev->n + N, sizeof(float));
    cap = ev->cap;
    ev->cls = grow_buffer(ev->cls, &cap, ev->n + N, sizeof(int32_t));
    ev->tp = grow_buffer(ev->tp, &ev->cap, ev->n + N, sizeof(uint16_t));
    ev->iou = grow_buffer(ev->iou, &ev->iou_cap, (int64_t)M * N, sizeof(float));  // (M, N)
    ev->best = grow_buffer(ev->best, &ev->best_cap, N, sizeof(int));
    ev->taken = grow_buffer(ev->taken, &ev->taken_cap, M > 0 ? M : 1, sizeof(int));
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            const float db[4] = {dets[j].x1, dets[j].y1, dets[j].x2, dets[j].y2};
            float v = box_iou_f(gt_box + (size_t)i * 4, db);
            ev->iou[(size_t)i * N + j] = gt_cls[i] == dets[j].cls ? v : 0.0f;   // iou * correct_class
        }
    uint16_t *tp = ev->tp + ev->n;
    for (int j = 0; j < N; j++) tp[j] = 0;
    for (int t = 0; t < EVAL_NIOU && M > 0; t++) {
        float thr = eval_iouv[t];
        for (int j = 0; j < N; j++) {
            int bi = -1;
            float bv = 0.0f;
            for (int i = 0; i < M; i++) {
                float v = ev->iou[(size_t)i * N + j];
                if (v >= thr && (bi < 0 || v >= bv)) { bi = i; bv = v; }
            }
            ev->best[j] = bi;
        }
        for (int i = 0; i < M; i++) ev->taken[i] = 0;
        for (int j = 0; j < N; j++) {
            int bi = ev->best[j];
            if (bi >= 0 && !ev->taken[bi]) { ev->taken[bi] = 1; tp[j] |= (uint16_t)(1u << t); }
        }
    }
    for (int j = 0; j < N; j++) {
        ev->conf[ev->n + j] = dets[j].score;
        ev->cls[ev->n + j] = dets[j].cls;
    }
    ev->n += N;
}

// compute_ap: utils/metrics.py compute_ap ("interp" method) for one PR curve of n points.
// mrec, mpre: scratch of n+2 doubles. Sentinels (0, 1) in front and (1, 0) at the end, the
// precision envelope from the right, then the trapezoid of np.interp at linspace(0, 1, 101).
// A perfect curve gives 0.995, not 1: np.interp(1.0) lands on the (1, 0) sentinel.
static double compute_ap(const double *recall, const double *precision, int64_t n, double *mrec, double *mpre) {
    mrec[0] = 0.0; mpre[0] = 1.0;
    for (int64_t i = 0; i < n; i++) { mrec[i + 1] = recall[i]; mpre[i + 1] = precision[i]; }
    mrec[n + 1] = 1.0; mpre[n + 1] = 0.0;
    for (int64_t i = n; i >= 0; i--) mpre[i] = fmax(mpre[i], mpre[i + 1]);
    double ap = 0.0, xprev = 0.0, yprev = 0.0;
    for (int k = 0; k <= 100; k++) {
        double x = k == 100 ? 1.0 : k * (1.0 / 100.0);       // np.linspace(0, 1, 101)
        double y = np_interp(x, mrec, mpre, n + 2, mpre[0], mpre[n + 1]);
        if (k) ap += (x - xprev) * (y + yprev) / 2.0;          // np.trapezoid
        xprev = x; yprev = y;
    }
    return ap;
}

// smooth_box: Ultralytics' smooth(y, f): a box filter of nf = round(n * f * 2) // 2 + 1 points
// over y padded with nf // 2 copies of its end values. y, out: (n), not the same array.
static void smooth_box(const double *y, int n, double f, double *out) {
    int nf = (int)lround(n * f * 2) / 2 + 1, half = nf / 2;
    for (int k = 0; k < n; k++) {
        double s = 0.0;
        for (int q = k - half; q <= k + half; q++) s += y[q < 0 ? 0 : q >= n ? n - 1 : q] * (1.0 / nf);
        out[k] = s;
    }
}

// evaluator_compute: ap_per_class over everything added, plus the Metric means.
// m->ap50, ap, p, r and the curves are allocated here; free them with metrics_free.
static void evaluator_compute(Evaluator *ev, Metrics *m) {
    int NC = ev->NC;
    int64_t n = ev->n;
    memset(m, 0, sizeof *m);
    m->ap50 = xmalloc((size_t)NC * sizeof(double)); m->ap = xmalloc((size_t)NC * sizeof(double));
    m->p = xmalloc((size_t)NC * sizeof(double)); m->r = xmalloc((size_t)NC * sizeof(double));
    for (int c = 0; c < NC; c++) m->ap50[c] = m->ap[c] = m->p[c] = m->r[c] = -1.0;
    int ncls = 0;
    for (int c = 0; c < NC; c++) ncls += ev->n_gt[c] > 0;
    m->n_cls = ncls;
    if (ncls == 0) return;                                   // Ultralytics reports zeros

    int32_t *order = xmalloc((size_t)(n ? n : 1) * sizeof(int32_t));     // (n) sorted detections
    int32_t *tmp = xmalloc((size_t)(n ? n : 1) * sizeof(int32_t));
    for (int64_t i = 0; i < n; i++) order[i] = (int32_t)i;
    sort_desc_stable(order, tmp, n, ev->conf);
    double *rec = xmalloc((size_t)(n + 1) * EVAL_NIOU * sizeof(double));  // (n, 10)
    double *pre = xmalloc((size_t)(n + 1) * EVAL_NIOU * sizeof(double));  // (n, 10)
    double *negc = xmalloc((size_t)(n + 1) * sizeof(double));             // (n) -conf, ascending
    double *col_r = xmalloc((size_t)(n + 1) * sizeof(double)), *col_p = xmalloc((size_t)(n + 1) * sizeof(double));
    double *mrec = xmalloc((size_t)(n + 2) * sizeof(double)), *mpre = xmalloc((size_t)(n + 2) * sizeof(double));
    double *pc = xcalloc((size_t)ncls * EVAL_NGRID, sizeof(double));     // (ncls, 1000) precision curve
    double *rc = xcalloc((size_t)ncls * EVAL_NGRID, sizeof(double));     // (ncls, 1000) recall curve
    double *prc = xcalloc((size_t)ncls * EVAL_NGRID, sizeof(double));    // (ncls, 1000) precision at recall
    m->curve_cls = xmalloc((size_t)ncls * sizeof(int));
    double grid[EVAL_NGRID];
    for (int k = 0; k < EVAL_NGRID; k++) grid[k] = k == EVAL_NGRID - 1 ? 1.0 : k * (1.0 / (EVAL_NGRID - 1));

    double sum_ap50 = 0.0, sum_ap = 0.0;
    for (int c = 0, ci = 0; c < NC; c++) {
        if (ev->n_gt[c] == 0) continue;
        int64_t np_ = 0, tpc[EVAL_NIOU] = {0};
        double nl = (double)ev->n_gt[c] + 1e-16;
        for (int64_t q = 0; q < n; q++) {
            int32_t d = order[q];
            if (ev->cls[d] != c) continue;
            for (int t = 0; t < EVAL_NIOU; t++) {
                tpc[t] += (ev->tp[d] >> t) & 1;
                double fpc = (double)(np_ + 1 - tpc[t]);
                rec[np_ * EVAL_NIOU + t] = (double)tpc[t] / nl;
                pre[np_ * EVAL_NIOU + t] = (double)tpc[t] / ((double)tpc[t] + fpc);
            }
            negc[np_] = -(double)ev->conf[d];
            np_++;
        }
        double apc[EVAL_NIOU] = {0};
        if (np_ > 0) {
            for (int t = 0; t < EVAL_NIOU; t++) {
                for (int64_t i = 0; i < np_; i++) {
                    col_r[i] = rec[i * EVAL_NIOU + t];
                    col_p[i] = pre[i * EVAL_NIOU + t];
                }
                apc[t] = compute_ap(col_r, col_p, np_, mrec, mpre);
                if (t == 0)
                    for (int k = 0; k < EVAL_NGRID; k++) {
                        rc[(size_t)ci * EVAL_NGRID + k] = np_interp(-grid[k], negc, col_r, np_, 0.0, col_r[np_ - 1]);
                        pc[(size_t)ci * EVAL_NGRID + k] = np_interp(-grid[k], negc, col_p, np_, 1.0, col_p[np_ - 1]);
                        prc[(size_t)ci * EVAL_NGRID + k] =
                            np_interp(grid[k], mrec, mpre, np_ + 2, mpre[0], mpre[np_ + 1]);
                    }
            }
        }
        double s = 0.0;
        for (int t = 0; t < EVAL_NIOU; t++) s += apc[t];
        m->ap50[c] = apc[0]; m->ap[c] = s / EVAL_NIOU;
        sum_ap50 += apc[0]; sum_ap += s / EVAL_NIOU;
        m->curve_cls[ci++] = c;
    }
    // mean F1 over classes, smoothed (Ultralytics smooth(y, 0.1): box filter of 101 with edge
    // padding of 50 on each side), argmax = first maximum
    double f1m[EVAL_NGRID];
    for (int k = 0; k < EVAL_NGRID; k++) {
        double s = 0.0;
        for (int ci = 0; ci < ncls; ci++) {
            double p = pc[(size_t)ci * EVAL_NGRID + k], r = rc[(size_t)ci * EVAL_NGRID + k];
            s += 2.0 * p * r / (p + r + 1e-16);
        }
        f1m[k] = s / ncls;
    }
    double f1s[EVAL_NGRID], bestv = -1.0;
    smooth_box(f1m, EVAL_NGRID, 0.1, f1s);
    int best = 0;
    for (int k = 0; k < EVAL_NGRID; k++)
        if (f1s[k] > bestv) { bestv = f1s[k]; best = k; }
    double sp = 0.0, sr = 0.0;
    for (int c = 0, ci = 0; c < NC; c++) {
        if (ev->n_gt[c] == 0) continue;
        m->p[c] = pc[(size_t)ci * EVAL_NGRID + best]; m->r[c] = rc[(size_t)ci * EVAL_NGRID + best];
        sp += m->p[c]; sr += m->r[c];
        ci++;
    }
    m->P = sp / ncls; m->R = sr / ncls;
    m->map50 = sum_ap50 / ncls; m->map = sum_ap / ncls; m->fitness = m->map;
    m->conf_best = grid[best];
    m->curve_p = pc; m->curve_r = rc; m->curve_pr = prc;
    free(order); free(tmp); free(rec); free(pre); free(negc); free(col_r); free(col_p);
    free(mrec); free(mpre);
}

static void metrics_free(Metrics *m) {
    free(m->ap50); free(m->ap); free(m->p); free(m->r);
    free(m->curve_cls); free(m->curve_p); free(m->curve_r); free(m->curve_pr);
    m->ap50 = m->ap = m->p = m->r = m->curve_p = m->curve_r = m->curve_pr = NULL;
    m->curve_cls = NULL;
}

// ------------------------------------------------------------------------------------------
// state_dict: the model's tensors under Ultralytics names; `yolo check-ref`
// ------------------------------------------------------------------------------------------

// StateDict: the ParamRefs of a model (Ultralytics order and names) over given storage, so the
// same code serves the model, the EMA and checkpoints.
typedef struct {
    int n;
    ParamRef ref[MAX_CONVS * 6 + 1];
    char names[MAX_CONVS * 6 + 1][64];
    int64_t nbt;               // num_batches_tracked (one value for every BN)
} StateDict;

// state_dict_build: entries for params (nparams) and buffers (nbuffers) in module order:
// Conv: conv.weight, bn.weight, bn.bias, bn.running_mean, bn.running_var, bn.num_batches_tracked;
// Detect output conv: weight, bias; then model.22.dfl.conv.weight.
static void state_dict_build(StateDict *sd, const Model *m, float *params, float *buffers) {
    sd->n = 0;
#define SD_ADD(fmt, nm, knd, ptr, nd, s0, s1, s2, s3) do { \
        ParamRef *r_ = &sd->ref[sd->n]; snprintf(sd->names[sd->n], 64, fmt, nm); \
        *r_ = (ParamRef){.name = sd->names[sd->n], .ndim = nd, .shape = {s0, s1, s2, s3}, .data = ptr, .kind = knd}; \
        sd->n++; } while (0)
    for (int i = 0; i < m->nconv; i++) {
        const Conv *c = &m->conv[i];
        if (c->bn) {
            SD_ADD("%s.conv.weight", c->name, PARAM_TRAIN, params + c->w_off, 4, c->cout, c->cin, c->k, c->k);
            SD_ADD("%s.bn.weight", c->name, PARAM_TRAIN, params + c->g_off, 1, c->cout, 0, 0, 0);
            SD_ADD("%s.bn.bias", c->name, PARAM_TRAIN, params + c->b_off, 1, c->cout, 0, 0, 0);
            SD_ADD("%s.bn.running_mean", c->name, PARAM_BUFFER, buffers + c->rs_off, 1, c->cout, 0, 0, 0);
            SD_ADD("%s.bn.running_var", c->name, PARAM_BUFFER, buffers + c->rs_off + c->cout, 1, c->cout, 0, 0, 0);
            SD_ADD("%s.bn.num_batches_tracked", c->name, PARAM_COUNT, NULL, 0, 0, 0, 0, 0);
            sd->ref[sd->n - 1].count = sd->nbt;
        } else {
            SD_ADD("%s.weight", c->name, PARAM_TRAIN, params + c->w_off, 4, c->cout, c->cin, c->k, c->k);
            SD_ADD("%s.bias", c->name, PARAM_TRAIN, params + c->b_off, 1, c->cout, 0, 0, 0);
        }
    }
    SD_ADD("%s", "model.22.dfl.conv.weight", PARAM_TRAIN, params + m->dfl_off, 4, 1, REG_MAX, 1, 1);
#undef SD_ADD
}

// rel_diff: max |a - b| over max |b| (the per-tensor relative error used by check-ref)
static double rel_diff(const float *a, const float *b, size_t n) {
    double d = 0, mx = 0;
    for (size_t i = 0; i < n; i++) {
        d = fmax(d, fabs((double)a[i] - b[i]));
        mx = fmax(mx, fabs((double)b[i]));
    }
    return d / (mx > 0 ? mx : 1);
}

// st_tensor: a named float tensor of a fixture, read whole (dies with the file and name if absent)
static float *st_tensor(SafeTensors *st, const char *name, size_t *numel) {
    char err[512];
    const StEntry *e = st_find(st, name);
    if (!e) die("%s: no tensor '%s'", st->path, name);
    float *x = xmalloc((size_t)e->numel * sizeof(float) + 4);
    if (st_read_f32(st, e, x, err, sizeof err)) die("%s", err);
    if (numel) *numel = (size_t)e->numel;
    return x;
}

// check_report: prints one PASS/FAIL line of a comparison and counts it; `yolo check-ref` and
// every test (test/test.h) report through it, so all end with the same "N passed, N failed".
static int checks_passed, checks_failed;
static void check_vreport(int ok, const char *fmt, va_list ap) {
    printf("%s  ", ok ? "PASS" : "FAIL");
    vprintf(fmt, ap);
    printf("\n");
    fflush(stdout);
    if (ok) checks_passed++; else checks_failed++;
}
static void check_report(int ok, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    check_vreport(ok, fmt, ap);
    va_end(ap);
}

// check_ref: compares this implementation with a reference fixture written by
// test/reference.py (or any implementation with the same tensor names): eval and train head
// outputs, BN running stats, loss components and assignment, every parameter gradient, and the
// parameters after one SGD step (clip-norm 10, Nesterov, three groups). FP32 CPU. Returns the
// number of failed comparisons.
static int check_ref(const char *path) {
    char err[512];
    SafeTensors st;
    if (st_open(path, &st, err, sizeof err)) die("%s", err);
    const char *ms = st_meta(&st, "scale"), *mnc = st_meta(&st, "nc"), *mimg = st_meta(&st, "imgsz"),
               *mb = st_meta(&st, "batch");
    if (!ms || !mnc || !mimg || !mb) die("%s: metadata needs scale, nc, imgsz and batch", path);
    int nc = atoi(mnc), S = atoi(mimg), B = atoi(mb);
    double lr = st_meta(&st, "lr") ? atof(st_meta(&st, "lr")) : 0.01;
    double mom = st_meta(&st, "momentum") ? atof(st_meta(&st, "momentum")) : 0.937;
    double wd = st_meta(&st, "weight_decay") ? atof(st_meta(&st, "weight_decay")) : 0.0005;
    double clip = st_meta(&st, "clip") ? atof(st_meta(&st, "clip")) : GRAD_CLIP_NORM;
    printf("fixture %s: yolov8%s nc=%d imgsz=%d batch=%d\n", path, ms, nc, S, B);

    Model *m = xmalloc(sizeof(Model));
    model_build(m, ms[0], nc);
    int A = loss_num_anchors(S, S);
    LossConfig lcfg = loss_config_default();
    size_t loss_bytes = loss_scratch_bytes(B, A, lcfg.max_boxes);
    Plan p = model_plan(m, B, S, S);
    Arena *a = xcalloc(1, sizeof(Arena));
    a->cap = p.total + loss_bytes + (size_t)3 * m->nparams * sizeof(float) + 4096;
    a->base = aligned_alloc(ARENA_ALIGN, (a->cap + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN);
    model_alloc_params(m, a);
    StateDict *sd = xcalloc(1, sizeof(StateDict));
    state_dict_build(sd, m, m->params, m->buffers);
    if (weights_load_st(&st, sd->ref, sd->n, "", 1, err, sizeof err)) die("%s", err);
    float *x = st_tensor(&st, "input.images", NULL);

    // 1. eval forward on the initial weights: raw maps and decoded output
    m->train = 0;
    m->infer = 1;
    model_forward(m, a, x, B, S, S);
    char nm[64];
    for (int l = 0; l < 3; l++) {
        snprintf(nm, sizeof nm, "out.eval_raw.%d", l);
        size_t n;
        float *ref = st_tensor(&st, nm, &n);
        double d = rel_diff(m->head[l], ref, n);
        check_report(d <= 1e-4, "eval raw map P%d: max|diff|/max|ref| %.2e (tol 1e-4)", l + 3, d);
        free(ref);
    }
    {
        size_t n;
        float *ref = st_tensor(&st, "out.eval", &n), *dec = xmalloc(n * sizeof(float));
        head_decode((const float *const *)m->head, B, nc, S, S, dec);
        double d = rel_diff(dec, ref, n);
        check_report(d <= 1e-4, "eval decoded (B, 4+nc, A): max|diff|/max|ref| %.2e (tol 1e-4)", d);
        free(ref);
        free(dec);
    }
    model_release(m, a);

    // 2. train forward: raw maps and the BN running stats it updates
    m->train = 1;
    m->infer = 0;
    model_forward(m, a, x, B, S, S);
    for (int l = 0; l < 3; l++) {
        snprintf(nm, sizeof nm, "out.train.%d", l);
        size_t n;
        float *ref = st_tensor(&st, nm, &n);
        double d = rel_diff(m->head[l], ref, n);
        check_report(d <= 1e-4, "train raw map P%d: max|diff|/max|ref| %.2e (tol 1e-4)", l + 3, d);
        free(ref);
    }
    double worst_bn = 0;
    for (int i = 0; i < sd->n; i++)
        if (sd->ref[i].kind == PARAM_BUFFER) {
            snprintf(nm, sizeof nm, "bn_after.%s", sd->ref[i].name);
            size_t n;
            float *ref = st_tensor(&st, nm, &n);
            worst_bn = fmax(worst_bn, rel_diff(sd->ref[i].data, ref, n));
            free(ref);
        }
    check_report(worst_bn <= 1e-4, "BN running stats after the train forward: worst max|diff|/max|ref| %.2e (tol 1e-4)",
                 worst_bn);

    // 3. loss and assignment
    size_t nt;
    float *tb = st_tensor(&st, "targets.batch_idx", &nt), *tc = st_tensor(&st, "targets.cls", NULL);
    float *tbox = st_tensor(&st, "targets.bboxes", NULL);
    int *bi = xmalloc((nt + 1) * sizeof(int)), *ci = xmalloc((nt + 1) * sizeof(int));
    for (size_t i = 0; i < nt; i++) bi[i] = (int)tb[i], ci[i] = (int)tc[i];
    LossTargets tg = {(int)nt, bi, ci, tbox};
    model_head_grad(m, a);
    void *scratch = arena_alloc(a, loss_bytes, G_LOSS);
    LossOut lo = loss_forward_backward(&lcfg, B, nc, S, S, (const float *const *)m->head, m->dhead, &tg, 1.f, scratch,
                                       loss_bytes, 0);
    arena_free(a, scratch);
    static const char *const lnames[3] = {"loss.box", "loss.cls", "loss.dfl"};
    double lgot[3] = {lo.box, lo.cls, lo.dfl};
    for (int k = 0; k < 3; k++) {
        float *ref = st_tensor(&st, lnames[k], NULL);
        double d = fabs(lgot[k] - ref[0]) / fmax(fabs(ref[0]), 1e-12);
        check_report(d <= 1e-5, "%s: got %.7g want %.7g, rel diff %.2e (tol 1e-5)", lnames[k], lgot[k], ref[0], d);
        free(ref);
    }
    {
        const StEntry *e = st_find(&st, "assign.fg_count");
        int64_t fg = -1;
        if (!e || st_read_i64(&st, e, &fg, err, sizeof err)) die("%s: assign.fg_count: %s", path, e ? err : "missing");
        check_report(fg == lo.n_fg, "assigner foreground anchors: got %d want %lld (identical)", lo.n_fg,
                     (long long)fg);
        float *ref = st_tensor(&st, "assign.target_scores_sum", NULL);
        double d = fabs(lo.target_scores_sum - ref[0]) / ref[0];
        check_report(d <= 1e-5, "target_scores_sum: got %.7g want %.7g (tol 1e-5 rel)", lo.target_scores_sum, ref[0]);
        free(ref);
    }

    // 4. backward: every parameter gradient relative to that tensor's norm
    model_zero_grad(m);
    model_backward(m, a);
    double worst_g = 0;
    const char *worst_name = "";
    int ngrad = 0;
    for (int i = 0; i < sd->n; i++) {
        if (sd->ref[i].kind != PARAM_TRAIN || strstr(sd->ref[i].name, ".dfl")) continue;
        snprintf(nm, sizeof nm, "grad.%s", sd->ref[i].name);
        size_t n;
        float *ref = st_tensor(&st, nm, &n);
        const float *g = m->grads + (sd->ref[i].data - m->params);
        double dn = 0, rn = 0;
        for (size_t j = 0; j < n; j++)
            dn += ((double)g[j] - ref[j]) * ((double)g[j] - ref[j]), rn += (double)ref[j] * ref[j];
        double d = sqrt(dn) / fmax(sqrt(rn), 1e-20);
        if (d > worst_g) worst_g = d, worst_name = sd->ref[i].name;
        ngrad++;
        free(ref);
    }
    check_report(worst_g <= 1e-3, "gradients of %d tensors: worst |g - ref| / |ref| %.2e (%s) (tol 1e-3)", ngrad,
                 worst_g, worst_name);

    // 5. one optimizer step: clip-norm, SGD Nesterov, three groups
    Optimizer opt = {.kind = OPT_SGD, .lr = {lr, lr, lr}, .momentum = mom, .weight_decay = wd};
    opt.m = azfloat(a, m->nparams, G_OPTIM);
    double norm = grad_clip_norm(m, clip);
    if (st_meta(&st, "grad_norm")) {
        double rn = atof(st_meta(&st, "grad_norm"));
        check_report(fabs(norm - rn) / rn <= 1e-4, "total gradient norm: got %.6g want %.6g (tol 1e-4 rel)", norm, rn);
    }
    optim_step(&opt, m);
    double worst_p = 0;
    worst_name = "";
    for (int i = 0; i < sd->n; i++) {
        if (sd->ref[i].kind != PARAM_TRAIN) continue;
        snprintf(nm, sizeof nm, "step.%s", sd->ref[i].name);
        size_t n;
        float *ref = st_tensor(&st, nm, &n);
        double d = 0;
        for (size_t j = 0; j < n; j++) d = fmax(d, fabs((double)sd->ref[i].data[j] - ref[j]));
        if (d > worst_p) worst_p = d, worst_name = sd->ref[i].name;
        free(ref);
    }
    check_report(worst_p <= 1e-5, "parameters after one SGD step: worst max|diff| %.2e (%s) (tol 1e-5)", worst_p,
                 worst_name);
    printf("%d passed, %d failed\n", checks_passed, checks_failed);
    st_close(&st);
    free(x); free(tb); free(tc); free(tbox); free(bi); free(ci); free(sd); free(a->base); free(a); free(m);
    return checks_failed;
}

static int cmd_check_ref(int argc, char **argv) {
    if (argc < 3) die("usage: yolo check-ref FIXTURE.safetensors");
    return check_ref(argv[2]) ? 1 : 0;
}

// ------------------------------------------------------------------------------------------
// data: yaml, labels, decoding, letterbox, augmentation, loader, synthetic shapes
// ------------------------------------------------------------------------------------------
/*
 * data: images, drawing, data.yaml, labels, letterbox, augmentation, the batch loader and the
 * synthetic shapes dataset. Follows Ultralytics' YOLODataset and data/augment.py. Tests: test/test_data.c,
 * fuzz targets: test/fuzz_data.c, throughput: test/bench_loader.c.
 *
 * PUBLIC API (all static; pixels are uint8 RGB; sizes in pixels unless "normalised")
 *
 * Images and drawing
 *   Image { int w, h; uint8_t *px (h, w, 3); size_t cap (bytes at px) }
 *   Image image_alloc(w, h)                  zeroed;  image_free(&img)
 *   void image_reserve(&img, w, h)           resize in place, reallocating only to grow
 *   int  image_load(path, target, &img, err, errlen)   0 ok / -1 (err names the file).
 *        JPEG (libjpeg-turbo) or PNG (libpng), chosen by content. Gray, palette, alpha, 16-bit
 *        and CMYK become 8-bit RGB; JPEG EXIF orientation is applied. target > 0: a JPEG whose
 *        long side is >= 2*target is decoded at 1/2, 1/4 or 1/8 scale (long side stays
 *        >= target). Sizes over IMAGE_MAX_SIDE per side or IMAGE_MAX_PIXELS are refused before
 *        any pixel buffer is allocated. Corrupt files return -1, never exit.
 *   int  image_probe(path, &w, &h, err, errlen)   0 ok, 1 ok with a warning in err, -1 corrupt
 *   int  image_save_jpg(path, &img, quality), image_save_png(path, &img)   0 / -1 (printed)
 *   void image_resize(src, sw, sh, dst, dw, dh)      bilinear, cv2.INTER_LINEAR pixel centres
 *   void image_fill_rect(&img, x1, y1, x2, y2, r, g, b)        [x1, x2) x [y1, y2), clipped
 *   void image_draw_box(&img, x1, y1, x2, y2, r, g, b, thickness)   outline, clipped
 *   void image_draw_text(&img, x, y, text, r, g, b, scale)   built-in 5x7 font, 6*scale px
 *        per character, top-left at (x, y); lowercase drawn as uppercase
 *   void image_draw_label(&img, x, y, text, r, g, b)   text on a filled 9 px high box
 *
 * Dataset
 *   DataConfig { char *root; char *split[3][16] (train, val, test sources, resolved);
 *                int nsplit[3]; int nc; char **names (nc) }
 *   int  data_yaml_load(path, &cfg, err, errlen)   0 / -1 with "file:line: what" in err
 *   int  data_yaml_read(FILE *f, name, &cfg, err, errlen)   same from a stream (closes f)
 *   void data_config_free(&cfg)
 *   Dataset { int n; char **paths (n); int *w0, *h0 (n) original size; int *lab_off (n+1);
 *             float *lab (lab_off[n], 5) class cx cy w h normalised; int nc; DatasetStats stats }
 *   DatasetStats { found, kept, backgrounds, missing, corrupt, skipped, duplicates, boxes }
 *   int  dataset_load(&cfg, split (0 train, 1 val, 2 test), &ds)   0 / -1 (no usable image).
 *        Prints "Scanning SPLIT 'SRC'... N images, M backgrounds, K corrupt, S skipped" and one
 *        line per bad file (with the line number for labels). dataset_free(&ds)
 *   int  label_line_parse(line, nc, out[5], err, errlen)   1 box, 0 blank, -1 bad (err why)
 *   void label_path_from_image(img_path, out, outlen)   last /images/ -> /labels/, ext -> .txt
 *
 * Geometry (load_image resize, LetterBox, rect batch shapes)
 *   Letterbox { double r; int nw, nh, left, top }
 *   void letterbox_params(w, h, new_w, new_h, scaleup, &lb)     Ultralytics LetterBox numbers
 *   void letterbox_apply(src, w, h, dst (new_h, new_w, 3), new_w, new_h, &lb)   114 padding
 *   void rect_batch_shapes(ar (n) sorted h/w, n, batch, imgsz, hw (nbatch, 2))   (h, w) each
 *   void resized_size(w0, h0, S, &w, &h)          load_image size: long side S
 *
 * Augmentation and loader (v8_transforms: Mosaic, RandomPerspective, MixUp, RandomHSV, RandomFlip)
 *   AugConfig { hsv_h, hsv_s, hsv_v, degrees, translate, scale, shear, perspective, flipud,
 *               fliplr, mosaic, mixup }     aug_defaults(); aug_from_args(&a, argc, argv)
 *   LoaderConfig { int batch, imgsz (multiple of 32), workers (0 = caller's thread),
 *                  max_boxes (per image), train, cache_ram; uint64_t seed; AugConfig aug }
 *   Loader *loader_open(&ds, &lcfg)   allocates every buffer once (prints the host memory:
 *        batches, scratch, cache) and starts the workers; ds must outlive it
 *   void loader_start_epoch(L, epoch, close_mosaic)   call before each epoch; close_mosaic=1
 *        turns mosaic and mixup off (the last close_mosaic epochs)
 *   const Batch *loader_next(L)   next batch (valid until the next call), NULL after the last
 *   int  loader_batches(L); void loader_close(L)
 *   Batch { int B, H, W; uint8_t *img (B, 3, H, W) RGB; int n, cap (= max_boxes * batch),
 *           overflow (labels beyond max_boxes per image, counted not kept);
 *           int *batch_idx (n), *cls (n); float *box (n, 4) cx cy w h normalised to (W, H);
 *           int *index (B) dataset index; int *orig_w, *orig_h (B);
 *           float *ratio (B, 2) batch pixels per original pixel (x, y);
 *           float *pad (B, 2) letterbox (left, top) in batch pixels; int epoch, number }
 *     train=1: shuffled, S x S, mosaic / random perspective / mixup / HSV / flips.
 *     train=0: sorted by aspect ratio, rect batch shapes, letterbox scaleup=False, no
 *     augmentation (the caller picks the val batch size, 2x train in Ultralytics).
 *     Every random draw of a sample comes from (seed, epoch, position in the epoch), so the
 *     batches do not depend on the number of workers or on thread timing.
 *
 * Commands
 *   int cmd_shapes(argc, argv)    yolo shapes out=DIR [ntrain=128 nval=32 imgsz=160 seed=0]
 *   int cmd_augment(argc, argv)   yolo augment data=FILE out=FILE.jpg [imgsz= n= seed= ...]
 *
 * DEVIATIONS (data):
 *  - cv2.resize(INTER_LINEAR), warpAffine, warpPerspective and the RandomHSV colour math are
 *    reproduced in integer/float steps like OpenCV 4.6 and match it bit for bit on the cases
 *    in test/fixtures/data_cv2.bin; warpPerspective's 3x3 inverse is not OpenCV's LU, so it
 *    may differ by 1 in rare pixels. Downscales use INTER_LINEAR also for validation.
 *  - JPEGs at least twice the target size are decoded with DCT scaling before the resize.
 *  - The mosaic/mixup "recent image buffer" is the previous min(N, 8*batch, 1000) images in
 *    the epoch's order, so it does not depend on worker timing.
 *  - A relative `path:` in data.yaml is resolved against the yaml file's folder (Ultralytics:
 *    its DATASETS_DIR setting). Duplicate label rows are removed keeping the first occurrence.
 *    A 5-column line in a file of polygons stays a box (Ultralytics would read it as a polygon).
 *  - No labels/SPLIT.cache file: labels are scanned at each start (JPEG: header and end marker
 *    only; PNG: fully decoded). "N images" in the summary counts images kept.
 *  - Random numbers come from our Rng, so a seed does not reproduce Ultralytics' draws.
 *  - Not implemented (all off by default in Ultralytics): cutmix, copy_paste (needs polygons),
 *    the optional Albumentations step, bgr=1, multi_scale, the .cache file.
 *  - EXIF-rotated JPEGs take one temporary image-sized allocation per decode.
 */

// ==========================================================================================
// images: the Image type, decoding, encoding
// ==========================================================================================

#define IMAGE_MAX_SIDE 32768
#define IMAGE_MAX_PIXELS (1LL << 28)

typedef struct {
    int w, h;
    uint8_t *px; // (h, w, 3) RGB
    size_t cap;  // bytes allocated at px
} Image;

// image_reserve: make img w x h, reallocating only when it needs more bytes than it holds.
static void image_reserve(Image *img, int w, int h) {
    size_t need = (size_t)w * h * 3;
    if (need > img->cap) {
        free(img->px);
        img->px = xmalloc(need);
        img->cap = need;
    }
    img->w = w;
    img->h = h;
}
// image_alloc / image_free: a zeroed w x h image; release one (safe on an empty Image).
static Image image_alloc(int w, int h) {
    Image img = {0};
    image_reserve(&img, w, h);
    memset(img.px, 0, (size_t)w * h * 3);
    return img;
}
static void image_free(Image *img) {
    free(img->px);
    memset(img, 0, sizeof *img);
}

// image_dims_ok: a declared size we are willing to allocate (checked before any pixel buffer).
static int image_dims_ok(long long w, long long h) {
    return w > 0 && h > 0 && w <= IMAGE_MAX_SIDE && h <= IMAGE_MAX_SIDE && w * h <= IMAGE_MAX_PIXELS;
}

// libjpeg error manager that longjmps back instead of exit()ing the process.
typedef struct {
    struct jpeg_error_mgr pub;
    jmp_buf jb;
    char msg[JMSG_LENGTH_MAX];
    int warnings;
    uint8_t *buf;     // scratch freed on the error path too
} JpegErr;
// jpeg_err_exit / jpeg_err_emit: fatal libjpeg errors jump back to the decoder's setjmp;
// warnings (e.g. premature end of data) are counted and the first one kept.
static void jpeg_err_exit(j_common_ptr c) {
    JpegErr *e = (JpegErr *)c->err;
    c->err->format_message(c, e->msg);
    longjmp(e->jb, 1);
}
static void jpeg_err_emit(j_common_ptr c, int level) {
    JpegErr *e = (JpegErr *)c->err;
    if (level < 0 && e->warnings++ == 0) c->err->format_message(c, e->msg);
}

// file_magic: 1 JPEG, 2 PNG, 0 other/unreadable, -1 empty file.
static int file_magic(FILE *f) {
    uint8_t m[8];
    size_t n = fread(m, 1, 8, f);
    rewind(f);
    if (n == 0) return -1;
    if (n >= 3 && m[0] == 0xFF && m[1] == 0xD8 && m[2] == 0xFF) return 1;
    if (n == 8 && memcmp(m, "\x89PNG\r\n\x1a\n", 8) == 0) return 2;
    return 0;
}

// exif_orientation: the EXIF Orientation tag (1..8) from a JPEG's APP1 markers, 1 if absent.
static int exif_orientation(j_decompress_ptr cinfo) {
    for (jpeg_saved_marker_ptr m = cinfo->marker_list; m; m = m->next) {
        const uint8_t *d = m->data;
        unsigned n = m->data_length;
        if (m->marker != JPEG_APP0 + 1 || n < 14 || memcmp(d, "Exif\0\0", 6) != 0) continue;
        d += 6;
        n -= 6;
        int le = d[0] == 'I';
        if (!(le ? d[1] == 'I' : (d[0] == 'M' && d[1] == 'M'))) return 1;
#define EXIF16(p) (le ? (unsigned)((p)[0] | (p)[1] << 8) : (unsigned)((p)[0] << 8 | (p)[1]))
#define EXIF32(p) (le ? ((uint32_t)(p)[0] | (uint32_t)(p)[1] << 8 | (uint32_t)(p)[2] << 16 | (uint32_t)(p)[3] << 24) \
                      : ((uint32_t)(p)[0] << 24 | (uint32_t)(p)[1] << 16 | (uint32_t)(p)[2] << 8 | (uint32_t)(p)[3]))
        uint32_t ifd = EXIF32(d + 4);
        if (ifd > n - 2 || ifd < 8) return 1;
        unsigned count = EXIF16(d + ifd);
        for (unsigned i = 0; i < count; i++) {
            uint32_t e = ifd + 2 + 12 * i;
            if (e + 12 > n) break;
            if (EXIF16(d + e) == 0x0112) {
                unsigned v = EXIF16(d + e + 8);
                return v >= 1 && v <= 8 ? (int)v : 1;
            }
        }
#undef EXIF16
#undef EXIF32
        return 1;
    }
    return 1;
}

// image_orient: apply EXIF orientation o (2..8) to img, as cv2.imread and PIL's exif_transpose
// do; orientations 5..8 swap width and height. tmp is scratch of at least w*h*3 bytes.
static void image_orient(Image *img, int o, uint8_t *tmp) {
    int w = img->w, h = img->h, swap = o >= 5;
    int W = swap ? h : w, H = swap ? w : h;
    memcpy(tmp, img->px, (size_t)w * h * 3);
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++) {
            int sx, sy;
            switch (o) {
                case 2: sx = w - 1 - x; sy = y; break;
                case 3: sx = w - 1 - x; sy = h - 1 - y; break;
                case 4: sx = x; sy = h - 1 - y; break;
                case 5: sx = y; sy = x; break;
                case 6: sx = y; sy = h - 1 - x; break;
                case 7: sx = w - 1 - y; sy = h - 1 - x; break;
                case 8: sx = w - 1 - y; sy = x; break;
                default: sx = x; sy = y; break;
            }
            memcpy(img->px + ((size_t)y * W + x) * 3, tmp + ((size_t)sy * w + sx) * 3, 3);
        }
    img->w = W;
    img->h = H;
}

// jpeg_decode: JPEG -> RGB, with DCT-domain downscaling toward target (0 = full size).
static int jpeg_decode(FILE *f, const char *path, int target, Image *img, int probe_only, char *err, size_t errlen) {
    struct jpeg_decompress_struct cinfo;
    JpegErr jerr;
    memset(&jerr, 0, sizeof jerr);
    cinfo.err = jpeg_std_error(&jerr.pub);
    jerr.pub.error_exit = jpeg_err_exit;
    jerr.pub.emit_message = jpeg_err_emit;
    if (setjmp(jerr.jb)) {
        snprintf(err, errlen, "%s: corrupt JPEG (%s)", path, jerr.msg);
        free(jerr.buf);
        jpeg_destroy_decompress(&cinfo);
        return -1;
    }
    jpeg_create_decompress(&cinfo);
    jpeg_stdio_src(&cinfo, f);
    jpeg_save_markers(&cinfo, JPEG_APP0 + 1, 0xFFFF);
    jpeg_read_header(&cinfo, TRUE);
    int orient = exif_orientation(&cinfo);
    if (!image_dims_ok(cinfo.image_width, cinfo.image_height)) {
        snprintf(err, errlen, "%s: declared size %ux%u exceeds the limit (%d per side, %lld pixels)", path,
                 cinfo.image_width, cinfo.image_height, IMAGE_MAX_SIDE, IMAGE_MAX_PIXELS);
        jpeg_destroy_decompress(&cinfo);
        return -1;
    }
    if (probe_only) {
        img->w = (int)(orient >= 5 ? cinfo.image_height : cinfo.image_width);
        img->h = (int)(orient >= 5 ? cinfo.image_width : cinfo.image_height);
        jpeg_destroy_decompress(&cinfo);
        return 0;
    }
    int cmyk = cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK;
    cinfo.out_color_space = cmyk ? JCS_CMYK : JCS_RGB;
    cinfo.scale_num = 8;
    cinfo.scale_denom = 8;
    int longside = cinfo.image_width > cinfo.image_height ? (int)cinfo.image_width : (int)cinfo.image_height;
    if (target > 0 && longside >= 2 * target) {
        int num = 8; // shrink by halves while the long side stays >= target
        while (num > 1 && (long long)longside * (num / 2) / 8 >= target) num /= 2;
        cinfo.scale_num = (unsigned)num;
    }
    jpeg_start_decompress(&cinfo);
    int w = (int)cinfo.output_width, h = (int)cinfo.output_height, nc = cinfo.output_components;
    image_reserve(img, w, h);
    if (nc == 3) {
        while (cinfo.output_scanline < cinfo.output_height) {
            JSAMPROW row = img->px + (size_t)cinfo.output_scanline * w * 3;
            jpeg_read_scanlines(&cinfo, &row, 1);
        }
    } else { // CMYK (Adobe inverted): decode each row in place from the right end
        uint8_t *tmp = jerr.buf = xmalloc((size_t)w * 4);
        while (cinfo.output_scanline < cinfo.output_height) {
            uint8_t *dst = img->px + (size_t)cinfo.output_scanline * w * 3;
            JSAMPROW row = tmp;
            jpeg_read_scanlines(&cinfo, &row, 1);
            for (int x = 0; x < w; x++) {
                int k = tmp[4 * x + 3];
                for (int c = 0; c < 3; c++) dst[3 * x + c] = (uint8_t)((tmp[4 * x + c] * k + 127) / 255);
            }
        }
        free(tmp);
        jerr.buf = NULL;
    }
    jpeg_finish_decompress(&cinfo);
    jpeg_destroy_decompress(&cinfo);
    if (orient > 1) {
        uint8_t *tmp = xmalloc((size_t)w * h * 3);
        image_orient(img, orient, tmp);
        free(tmp);
    }
    err[0] = 0;
    if (jerr.warnings) snprintf(err, errlen, "%s: JPEG warning (%s)", path, jerr.msg);
    return 0;
}

typedef struct { jmp_buf jb; char msg[200]; uint8_t *rowbuf; } PngErr;
// png_err_fn / png_warn_fn: libpng errors jump back to the decoder's setjmp; warnings are ignored.
static void png_err_fn(png_structp png, png_const_charp msg) {
    PngErr *e = (PngErr *)png_get_error_ptr(png);
    snprintf(e->msg, sizeof e->msg, "%s", msg);
    longjmp(e->jb, 1);
}
static void png_warn_fn(png_structp png, png_const_charp msg) { (void)png; (void)msg; }

// png_decode: PNG -> 8-bit RGB (palette, gray, alpha, 16-bit are converted; alpha dropped as
// cv2.imread(IMREAD_COLOR) does).
static int png_decode(FILE *f, const char *path, Image *img, int probe_only, char *err, size_t errlen) {
    PngErr perr;
    memset(&perr, 0, sizeof perr);
    png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &perr, png_err_fn, png_warn_fn);
    if (!png) { snprintf(err, errlen, "%s: libpng init failed", path); return -1; }
    png_infop info = png_create_info_struct(png);
    if (!info) {
        png_destroy_read_struct(&png, NULL, NULL);
        snprintf(err, errlen, "%s: libpng init failed", path);
        return -1;
    }
    if (setjmp(perr.jb)) {
        snprintf(err, errlen, "%s: corrupt PNG (%s)", path, perr.msg);
        free(perr.rowbuf);
        png_destroy_read_struct(&png, &info, NULL);
        return -1;
    }
    png_set_user_limits(png, 0x7fffffff, 0x7fffffff);
    png_init_io(png, f);
    png_read_info(png, info);
    png_uint_32 w = png_get_image_width(png, info), h = png_get_image_height(png, info);
    if (!image_dims_ok(w, h)) {
        snprintf(err, errlen, "%s: declared size %ux%u exceeds the limit (%d per side, %lld pixels)", path,
                 (unsigned)w, (unsigned)h, IMAGE_MAX_SIDE, IMAGE_MAX_PIXELS);
        png_destroy_read_struct(&png, &info, NULL);
        return -1;
    }
    png_set_expand(png);
    png_set_strip_16(png);
    png_set_strip_alpha(png);
    png_set_gray_to_rgb(png);
    int passes = png_set_interlace_handling(png);
    png_read_update_info(png, info);
    if (png_get_rowbytes(png, info) != (size_t)w * 3) {
        snprintf(err, errlen, "%s: unsupported PNG pixel layout", path);
        png_destroy_read_struct(&png, &info, NULL);
        return -1;
    }
    if (probe_only) { // decode every row (this verifies the data) into one row buffer
        perr.rowbuf = xmalloc((size_t)w * 3);
        for (int p = 0; p < passes; p++)
            for (png_uint_32 y = 0; y < h; y++) png_read_row(png, perr.rowbuf, NULL);
        img->w = (int)w;
        img->h = (int)h;
    } else {
        image_reserve(img, (int)w, (int)h);
        for (int p = 0; p < passes; p++)
            for (png_uint_32 y = 0; y < h; y++) png_read_row(png, img->px + (size_t)y * w * 3, NULL);
    }
    png_read_end(png, NULL);
    free(perr.rowbuf);
    png_destroy_read_struct(&png, &info, NULL);
    err[0] = 0;
    return 0;
}

// image_decode_file: shared body of image_load and image_probe.
static int image_decode_file(const char *path, int target, Image *img, int probe, char *err, size_t errlen) {
    FILE *f = fopen(path, "rb");
    if (!f) { snprintf(err, errlen, "%s: cannot open (%s)", path, strerror(errno)); return -1; }
    int kind = file_magic(f), rc;
    if (kind == 1) {
        rc = jpeg_decode(f, path, target, img, probe, err, errlen);
        if (rc == 0 && probe) { // Ultralytics' check: a JPEG must end with the EOI marker
            uint8_t tail[2] = {0, 0};
            if (fseek(f, -2, SEEK_END) != 0 || fread(tail, 1, 2, f) != 2 || tail[0] != 0xFF || tail[1] != 0xD9) {
                snprintf(err, errlen, "%s: corrupt JPEG (no end marker; decoded with gray fill)", path);
                rc = 1;
            }
        } else if (rc == 0 && err[0]) rc = 1;
    } else if (kind == 2) {
        rc = png_decode(f, path, img, probe, err, errlen);
    } else {
        snprintf(err, errlen, kind < 0 ? "%s: empty file" : "%s: not a JPEG or PNG image", path);
        rc = -1;
    }
    fclose(f);
    return rc;
}

// image_load: decode path into img (RGB), see the API comment. Returns 0 or -1 (err set).
static int image_load(const char *path, int target, Image *img, char *err, size_t errlen) {
    return image_decode_file(path, target, img, 0, err, errlen) < 0 ? -1 : 0;
}
// image_probe: size of an image, verifying its structure (PNG: fully decoded; JPEG: header
// and end marker, like Ultralytics' verify_image_label). 0 ok, 1 ok with warning, -1 corrupt.
static int image_probe(const char *path, int *w, int *h, char *err, size_t errlen) {
    Image img = {0};
    int rc = image_decode_file(path, 0, &img, 1, err, errlen);
    *w = img.w;
    *h = img.h;
    return rc;
}

// image_save_jpg: write img as a baseline JPEG. 0 ok, -1 error (printed).
static int image_save_jpg(const char *path, const Image *img, int quality) {
    FILE *f = fopen(path, "wb");
    if (!f) { fprintf(stderr, "cannot write '%s': %s\n", path, strerror(errno)); return -1; }
    struct jpeg_compress_struct c;
    JpegErr jerr;
    memset(&jerr, 0, sizeof jerr);
    c.err = jpeg_std_error(&jerr.pub);
    jerr.pub.error_exit = jpeg_err_exit;
    if (setjmp(jerr.jb)) {
        fprintf(stderr, "cannot write '%s': %s\n", path, jerr.msg);
        jpeg_destroy_compress(&c);
        fclose(f);
        return -1;
    }
    jpeg_create_compress(&c);
    jpeg_stdio_dest(&c, f);
    c.image_width = (JDIMENSION)img->w;
    c.image_height = (JDIMENSION)img->h;
    c.input_components = 3;
    c.in_color_space = JCS_RGB;
    jpeg_set_defaults(&c);
    jpeg_set_quality(&c, quality, TRUE);
    jpeg_start_compress(&c, TRUE);
    while (c.next_scanline < c.image_height) {
        JSAMPROW row = img->px + (size_t)c.next_scanline * img->w * 3;
        jpeg_write_scanlines(&c, &row, 1);
    }
    jpeg_finish_compress(&c);
    jpeg_destroy_compress(&c);
    if (fclose(f) != 0) { fprintf(stderr, "cannot write '%s': %s\n", path, strerror(errno)); return -1; }
    return 0;
}

// image_save_png: write img as an 8-bit RGB PNG. 0 ok, -1 error (printed).
static int image_save_png(const char *path, const Image *img) {
    FILE *f = fopen(path, "wb");
    if (!f) { fprintf(stderr, "cannot write '%s': %s\n", path, strerror(errno)); return -1; }
    PngErr perr;
    memset(&perr, 0, sizeof perr);
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, &perr, png_err_fn, png_warn_fn);
    png_infop info = png ? png_create_info_struct(png) : NULL;
    if (!png || !info || setjmp(perr.jb)) {
        fprintf(stderr, "cannot write '%s': %s\n", path, perr.msg[0] ? perr.msg : "libpng init failed");
        png_destroy_write_struct(&png, &info);
        fclose(f);
        return -1;
    }
    png_init_io(png, f);
    png_set_IHDR(png, info, (png_uint_32)img->w, (png_uint_32)img->h, 8, PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE,
                 PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    png_set_compression_level(png, 3);
    png_write_info(png, info);
    for (int y = 0; y < img->h; y++) png_write_row(png, img->px + (size_t)y * img->w * 3);
    png_write_end(png, NULL);
    png_destroy_write_struct(&png, &info);
    if (fclose(f) != 0) { fprintf(stderr, "cannot write '%s': %s\n", path, strerror(errno)); return -1; }
    return 0;
}

// ==========================================================================================
// pixels: bilinear resize and warp, drawing, the bitmap font
// ==========================================================================================

// image_resize_strided: bilinear resize of an HWC RGB image (sw, sh) -> (dw, dh), written with
// a row stride of dstride pixels (so it can land inside a larger canvas). Reproduces OpenCV's
// cv2.resize(INTER_LINEAR) for 8-bit images: source position (d + 0.5) * s / d - 0.5 in float,
// 11-bit weights rounded one by one, 32-bit row sums, and the vertical pass as OpenCV's SIMD
// code does it: ((b0 * (S0 >> 4)) >> 16) + ((b1 * (S1 >> 4)) >> 16), then (+2) >> 2. Checked
// bit-exact against cv2 4.6 (test_data, fixtures written by test/ref_data.py).
static void image_resize_strided(const uint8_t *src, int sw, int sh, uint8_t *dst, int dw, int dh, int dstride) {
    if (sw == dw && sh == dh) {
        for (int y = 0; y < sh; y++) memcpy(dst + (size_t)y * dstride * 3, src + (size_t)y * sw * 3, (size_t)sw * 3);
        return;
    }
    int rowlen = dw * 3;
    int *xo = xmalloc(sizeof(int) * dw * 2);           // (dw, 2) byte offsets of the two taps
    int16_t *al = xmalloc(sizeof(int16_t) * dw * 2);   // (dw, 2) weights, sum ~2048
    int32_t *r0 = xmalloc(sizeof(int32_t) * rowlen * 2), *r1 = r0 + rowlen; // two source rows, 2048x
    double scx = 1.0 / ((double)dw / sw), scy = 1.0 / ((double)dh / sh);
    for (int x = 0; x < dw; x++) {
        float f = (float)((x + 0.5) * scx - 0.5);
        int i = (int)floorf(f);
        f -= i;
        if (i < 0) { f = 0; i = 0; }
        if (i >= sw - 1) { f = 0; i = sw - 1; }
        xo[2 * x] = i * 3;
        xo[2 * x + 1] = (i + 1 < sw ? i + 1 : i) * 3;
        al[2 * x] = (int16_t)lrintf((1.f - f) * 2048);
        al[2 * x + 1] = (int16_t)lrintf(f * 2048);
    }
    int have0 = -2, have1 = -2;
    for (int y = 0; y < dh; y++) {
        float f = (float)((y + 0.5) * scy - 0.5);
        int j = (int)floorf(f);
        f -= j;
        int b0 = (int)lrintf((1.f - f) * 2048), b1 = (int)lrintf(f * 2048);
        int j0 = j < 0 ? 0 : j >= sh ? sh - 1 : j, j1 = j + 1 < 0 ? 0 : j + 1 >= sh ? sh - 1 : j + 1;
        int need[2] = {j0, j1};
        int32_t *rows[2] = {r0, r1};
        if (have0 == j1 && have1 != j1) {
            int32_t *t = r0;
            r0 = r1;
            r1 = t;
            have1 = have0;
            have0 = -2;
            rows[0] = r0;
            rows[1] = r1;
        }
        for (int k = 0; k < 2; k++) { // horizontal pass into the row buffers, reusing rows already made
            int have = k ? have1 : have0;
            if (have == need[k]) continue;
            const uint8_t *s = src + (size_t)need[k] * sw * 3;
            int32_t *d = rows[k];
            for (int x = 0; x < dw; x++) {
                const uint8_t *p = s + xo[2 * x], *q = s + xo[2 * x + 1];
                int a0 = al[2 * x], a1 = al[2 * x + 1];
                for (int c = 0; c < 3; c++) d[3 * x + c] = p[c] * a0 + q[c] * a1;
            }
            if (k) have1 = need[k]; else have0 = need[k];
        }
        uint8_t *o = dst + (size_t)y * dstride * 3;
        for (int i = 0; i < rowlen; i++) {
            int s0 = r0[i] >> 4, s1 = r1[i] >> 4;
            s0 = s0 > 32767 ? 32767 : s0 < -32768 ? -32768 : s0;
            s1 = s1 > 32767 ? 32767 : s1 < -32768 ? -32768 : s1;
            int v = (((b0 * s0) >> 16) + ((b1 * s1) >> 16) + 2) >> 2;
            o[i] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
        }
    }
    free(xo);
    free(al);
    free(r0 < r1 ? r0 : r1);
}
// image_resize: as image_resize_strided with a packed destination (dw, dh, 3).
static void image_resize(const uint8_t *src, int sw, int sh, uint8_t *dst, int dw, int dh) {
    image_resize_strided(src, sw, sh, dst, dw, dh, dw);
}

// WARP_WTAB: OpenCV's bilinear weight table: for fractions (fy, fx) in 1/32 steps the four
// weights (1-fx)(1-fy), fx(1-fy), (1-fx)fy, fx*fy scaled by 2^15 (exact: they sum to 2^15).
static int32_t WARP_WTAB[32 * 32][4];
static pthread_once_t warp_wtab_once = PTHREAD_ONCE_INIT;
static void warp_wtab_init(void) {
    for (int fy = 0; fy < 32; fy++)
        for (int fx = 0; fx < 32; fx++) {
            float ax = fx / 32.0f, ay = fy / 32.0f;
            int32_t *w = WARP_WTAB[fy * 32 + fx];
            w[0] = (int32_t)lrintf((1 - ax) * (1 - ay) * 32768);
            w[1] = (int32_t)lrintf(ax * (1 - ay) * 32768);
            w[2] = (int32_t)lrintf((1 - ax) * ay * 32768);
            w[3] = (int32_t)lrintf(ax * ay * 32768);
        }
}

// image_warp: dst (dw, dh) = src sampled at Minv * (x, y, 1) (3x3; perspective when row 2 is
// not (0, 0, 1)), bilinear, constant border 114. Follows cv2.warpAffine / warpPerspective with
// borderValue 114 given M = inverse(Minv): source coordinates quantised to 1/32 pixel
// (INTER_BITS 5, affine via 10-bit AB_SCALE steps), 15-bit integer weights, the same border rule.
static void image_warp(const uint8_t *src, int sw, int sh, uint8_t *dst, int dw, int dh, const double Minv[9]) {
    pthread_once(&warp_wtab_once, warp_wtab_init);
    const int32_t (*wtab)[4] = (const int32_t (*)[4])WARP_WTAB;
    int persp = Minv[6] != 0 || Minv[7] != 0 || Minv[8] != 1;
    for (int y = 0; y < dh; y++) {
        uint8_t *d = dst + (size_t)y * dw * 3;
        long X0 = lrint((Minv[1] * y + Minv[2]) * 1024), Y0 = lrint((Minv[4] * y + Minv[5]) * 1024);
        for (int x = 0; x < dw; x++) {
            long X, Y;
            if (!persp) {
                X = (X0 + lrint(Minv[0] * x * 1024) + 16) >> 5;
                Y = (Y0 + lrint(Minv[3] * x * 1024) + 16) >> 5;
            } else {
                double W = Minv[6] * x + Minv[7] * y + Minv[8];
                W = W != 0 ? 32.0 / W : 0;
                double fX = fmax(fmin((Minv[0] * x + Minv[1] * y + Minv[2]) * W, (double)INT_MAX), (double)INT_MIN);
                double fY = fmax(fmin((Minv[3] * x + Minv[4] * y + Minv[5]) * W, (double)INT_MAX), (double)INT_MIN);
                X = lrint(fX);
                Y = lrint(fY);
            }
            long ix = X >> 5, iy = Y >> 5;
            const int32_t *w = wtab[(Y & 31) * 32 + (X & 31)];
            uint8_t *o = d + 3 * x;
            if ((unsigned long)ix < (unsigned long)(sw - 1) && (unsigned long)iy < (unsigned long)(sh - 1)) {
                const uint8_t *p0 = src + ((size_t)iy * sw + ix) * 3, *p1 = p0 + (size_t)sw * 3;
                for (int c = 0; c < 3; c++)
                    o[c] = (uint8_t)((p0[c] * w[0] + p0[c + 3] * w[1] + p1[c] * w[2] + p1[c + 3] * w[3] + (1 << 14)) >>
                                     15);
            } else if (ix >= sw || ix + 1 < 0 || iy >= sh || iy + 1 < 0) {
                o[0] = o[1] = o[2] = 114;
            } else {
                for (int c = 0; c < 3; c++) {
                    int v[4];
                    for (int k = 0; k < 4; k++) {
                        long xx = ix + (k & 1), yy = iy + (k >> 1);
                        v[k] = (xx >= 0 && xx < sw && yy >= 0 && yy < sh) ? src[((size_t)yy * sw + xx) * 3 + c] : 114;
                    }
                    int acc = (v[0] * w[0] + v[1] * w[1] + v[2] * w[2] + v[3] * w[3] + (1 << 14)) >> 15;
                    o[c] = (uint8_t)(acc < 0 ? 0 : acc > 255 ? 255 : acc);
                }
            }
        }
    }
}
// image_fill_rect: fill [x1, x2) x [y1, y2) with (r, g, b), clipped to the image.
static void image_fill_rect(Image *img, int x1, int y1, int x2, int y2, int r, int g, int b) {
    if (x1 < 0) x1 = 0;
    if (y1 < 0) y1 = 0;
    if (x2 > img->w) x2 = img->w;
    if (y2 > img->h) y2 = img->h;
    for (int y = y1; y < y2; y++)
        for (int x = x1; x < x2; x++) {
            uint8_t *p = img->px + ((size_t)y * img->w + x) * 3;
            p[0] = (uint8_t)r; p[1] = (uint8_t)g; p[2] = (uint8_t)b;
        }
}

// image_draw_box: rectangle outline with corners (x1, y1), (x2, y2) in pixels, drawn inward
// `thickness` pixels, clipped.
static void image_draw_box(Image *img, int x1, int y1, int x2, int y2, int r, int g, int b, int thickness) {
    if (thickness < 1) thickness = 1;
    if (x2 < x1) { int t = x1; x1 = x2; x2 = t; }
    if (y2 < y1) { int t = y1; y1 = y2; y2 = t; }
    image_fill_rect(img, x1, y1, x2 + 1, y1 + thickness, r, g, b);
    image_fill_rect(img, x1, y2 - thickness + 1, x2 + 1, y2 + 1, r, g, b);
    image_fill_rect(img, x1, y1, x1 + thickness, y2 + 1, r, g, b);
    image_fill_rect(img, x2 - thickness + 1, y1, x2 + 1, y2 + 1, r, g, b);
}

// A 5x7 font of our own: digits, A-Z (lowercase is drawn as uppercase) and some punctuation.
// Each glyph is 7 rows, bit 4 = leftmost column.
static const char FONT_CHARS[] = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ .,:-_%/()=+?#@";
static const uint8_t FONT_ROWS[][7] = {
    {0x0E,0x11,0x13,0x15,0x19,0x11,0x0E}, {0x04,0x0C,0x04,0x04,0x04,0x04,0x0E}, {0x0E,0x11,0x01,0x02,0x04,0x08,0x1F},
    {0x1F,0x02,0x04,0x02,0x01,0x11,0x0E}, {0x02,0x06,0x0A,0x12,0x1F,0x02,0x02}, {0x1F,0x10,0x1E,0x01,0x01,0x11,0x0E},
    {0x06,0x08,0x10,0x1E,0x11,0x11,0x0E}, {0x1F,0x01,0x02,0x04,0x08,0x08,0x08}, {0x0E,0x11,0x11,0x0E,0x11,0x11,0x0E},
    {0x0E,0x11,0x11,0x0F,0x01,0x02,0x0C},
    {0x0E,0x11,0x11,0x1F,0x11,0x11,0x11}, {0x1E,0x11,0x11,0x1E,0x11,0x11,0x1E}, {0x0E,0x11,0x10,0x10,0x10,0x11,0x0E},
    {0x1C,0x12,0x11,0x11,0x11,0x12,0x1C}, {0x1F,0x10,0x10,0x1E,0x10,0x10,0x1F}, {0x1F,0x10,0x10,0x1E,0x10,0x10,0x10},
    {0x0E,0x11,0x10,0x17,0x11,0x11,0x0F}, {0x11,0x11,0x11,0x1F,0x11,0x11,0x11}, {0x0E,0x04,0x04,0x04,0x04,0x04,0x0E},
    {0x07,0x02,0x02,0x02,0x02,0x12,0x0C}, {0x11,0x12,0x14,0x18,0x14,0x12,0x11}, {0x10,0x10,0x10,0x10,0x10,0x10,0x1F},
    {0x11,0x1B,0x15,0x15,0x11,0x11,0x11}, {0x11,0x11,0x19,0x15,0x13,0x11,0x11}, {0x0E,0x11,0x11,0x11,0x11,0x11,0x0E},
    {0x1E,0x11,0x11,0x1E,0x10,0x10,0x10}, {0x0E,0x11,0x11,0x11,0x15,0x12,0x0D}, {0x1E,0x11,0x11,0x1E,0x14,0x12,0x11},
    {0x0F,0x10,0x10,0x0E,0x01,0x01,0x1E}, {0x1F,0x04,0x04,0x04,0x04,0x04,0x04}, {0x11,0x11,0x11,0x11,0x11,0x11,0x0E},
    {0x11,0x11,0x11,0x11,0x11,0x0A,0x04}, {0x11,0x11,0x11,0x15,0x15,0x15,0x0A}, {0x11,0x11,0x0A,0x04,0x0A,0x11,0x11},
    {0x11,0x11,0x11,0x0A,0x04,0x04,0x04}, {0x1F,0x01,0x02,0x04,0x08,0x10,0x1F},
    {0x00,0x00,0x00,0x00,0x00,0x00,0x00}, {0x00,0x00,0x00,0x00,0x00,0x0C,0x0C}, {0x00,0x00,0x00,0x00,0x0C,0x04,0x08},
    {0x00,0x0C,0x0C,0x00,0x0C,0x0C,0x00}, {0x00,0x00,0x00,0x1F,0x00,0x00,0x00}, {0x00,0x00,0x00,0x00,0x00,0x00,0x1F},
    {0x18,0x19,0x02,0x04,0x08,0x13,0x03}, {0x00,0x01,0x02,0x04,0x08,0x10,0x00}, {0x02,0x04,0x08,0x08,0x08,0x04,0x02},
    {0x08,0x04,0x02,0x02,0x02,0x04,0x08}, {0x00,0x00,0x1F,0x00,0x1F,0x00,0x00}, {0x00,0x04,0x04,0x1F,0x04,0x04,0x00},
    {0x0E,0x11,0x01,0x02,0x04,0x00,0x04}, {0x0A,0x0A,0x1F,0x0A,0x1F,0x0A,0x0A}, {0x0E,0x11,0x17,0x15,0x17,0x10,0x0E},
};

// font_index: the FONT_ROWS glyph of character ch (lowercase as uppercase, unknown as '?').
static int font_index(int ch) {
    if (ch >= 'a' && ch <= 'z') ch -= 32;
    const char *pos = ch ? strchr(FONT_CHARS, ch) : NULL;
    return pos ? (int)(pos - FONT_CHARS) : (int)(strchr(FONT_CHARS, '?') - FONT_CHARS);
}

// image_draw_text: draw text with its top-left at (x, y); each glyph is 6*scale wide (with a
// column of spacing) and 7*scale tall. Characters outside the font draw as '?'.
static void image_draw_text(Image *img, int x, int y, const char *text, int r, int g, int b, int scale) {
    if (scale < 1) scale = 1;
    for (const char *t = text; *t; t++, x += 6 * scale) {
        int gi = font_index(*t);
        for (int row = 0; row < 7; row++)
            for (int col = 0; col < 5; col++)
                if (FONT_ROWS[gi][row] & (0x10 >> col))
                    image_fill_rect(img, x + col * scale, y + row * scale, x + (col + 1) * scale, y + (row + 1) * scale,
                                    r, g, b);
    }
}

// image_draw_label: text on a filled background of colour (r, g, b), in black or white
// whichever contrasts; the box is 9 px tall and starts at (x, y).
static void image_draw_label(Image *img, int x, int y, const char *text, int r, int g, int b) {
    int w = 6 * (int)strlen(text) + 1;
    image_fill_rect(img, x, y, x + w, y + 9, r, g, b);
    int light = 299 * r + 587 * g + 114 * b > 128000;
    image_draw_text(img, x + 1, y + 1, text, light ? 0 : 255, light ? 0 : 255, light ? 0 : 255, 1);
}
// ==========================================================================================
// data.yaml (Ultralytics check_det_dataset), read with libyaml
// ==========================================================================================

#define DATA_MAX_SOURCES 16
typedef struct {
    char *root;                          // dataset root, absolute or relative to cwd
    char *split[3][DATA_MAX_SOURCES];    // train, val, test: directories or .txt lists
    int nsplit[3];
    int nc;
    char **names;                        // (nc)
} DataConfig;

static const char *const SPLIT_NAMES[3] = {"train", "val", "test"};

// data_config_free: release everything data_yaml_load allocated.
static void data_config_free(DataConfig *c) {
    free(c->root);
    for (int s = 0; s < 3; s++)
        for (int i = 0; i < c->nsplit[s]; i++) free(c->split[s][i]);
    for (int i = 0; i < c->nc; i++) free(c->names ? c->names[i] : NULL);
    free(c->names);
    memset(c, 0, sizeof *c);
}

// path_join: dir/rel unless rel is absolute. Returns a new string.
static char *path_join(const char *dir, const char *rel) {
    if (rel[0] == '/' || !dir || !dir[0]) return strdup(rel);
    size_t n = strlen(dir) + strlen(rel) + 2;
    char *p = xmalloc(n);
    snprintf(p, n, "%s%s%s", dir, dir[strlen(dir) - 1] == '/' ? "" : "/", rel);
    return p;
}
// path_dirname: the folder part of path ("." when there is none). Returns a new string.
static char *path_dirname(const char *path) {
    const char *s = strrchr(path, '/');
    if (!s) return strdup(".");
    if (s == path) return strdup("/");
    return strndup(path, (size_t)(s - path));
}

// yaml_fail: "file:line: what" into err for node n (line 0 when unknown); returns -1.
static int yaml_fail(char *err, size_t errlen, const char *path, const yaml_node_t *n, const char *what) {
    snprintf(err, errlen, "%s:%zu: %s", path, n ? n->start_mark.line + 1 : (size_t)0, what);
    return -1;
}

// data_yaml_read: parse an Ultralytics data.yaml from stream f (closed here): path, train,
// val, test (a string or a list of strings), names (list or {id: name} mapping), nc (optional,
// must equal len(names)). `path` names the file in messages and anchors relative paths.
// Matches ultralytics.data.utils.check_det_dataset for these keys; others are ignored.
static int data_yaml_read(FILE *f, const char *path, DataConfig *cfg, char *err, size_t errlen) {
    memset(cfg, 0, sizeof *cfg);
    yaml_parser_t parser;
    yaml_document_t doc;
    yaml_parser_initialize(&parser);
    yaml_parser_set_input_file(&parser, f);
    if (!yaml_parser_load(&parser, &doc)) {
        snprintf(err, errlen, "%s:%zu: yaml error: %s%s%s", path, parser.problem_mark.line + 1,
                 parser.problem ? parser.problem : "malformed", parser.context ? " " : "",
                 parser.context ? parser.context : "");
        yaml_parser_delete(&parser);
        fclose(f);
        return -1;
    }
    yaml_parser_delete(&parser);
    fclose(f);
    int rc = 0, nc_given = -1;
    char *root = NULL;
    yaml_node_t *top = yaml_document_get_root_node(&doc);
    if (!top || top->type != YAML_MAPPING_NODE) {
        rc = yaml_fail(err, errlen, path, top, "expected a mapping of keys (path, train, val, names)");
        goto done;
    }
    for (yaml_node_pair_t *p = top->data.mapping.pairs.start; p < top->data.mapping.pairs.top && rc == 0; p++) {
        yaml_node_t *k = yaml_document_get_node(&doc, p->key), *v = yaml_document_get_node(&doc, p->value);
        if (!k || k->type != YAML_SCALAR_NODE) {
            rc = yaml_fail(err, errlen, path, k, "keys must be plain strings");
            break;
        }
        const char *key = (const char *)k->data.scalar.value;
        int split = -1;
        for (int s = 0; s < 3; s++) if (strcmp(key, SPLIT_NAMES[s]) == 0) split = s;
        if (strcmp(key, "path") == 0) {
            if (v->type != YAML_SCALAR_NODE) { rc = yaml_fail(err, errlen, path, v, "'path' must be a string"); break; }
            free(root);
            root = strdup((const char *)v->data.scalar.value);
        } else if (split >= 0) {
            if (v->type == YAML_SCALAR_NODE) {
                if (v->data.scalar.length == 0 || strcmp((char *)v->data.scalar.value, "null") == 0 ||
                    strcmp((char *)v->data.scalar.value, "~") == 0)
                    continue;
                if (cfg->nsplit[split] == DATA_MAX_SOURCES) {
                    rc = yaml_fail(err, errlen, path, v, "too many sources in one split (max 16)");
                    break;
                }
                cfg->split[split][cfg->nsplit[split]++] = strdup((const char *)v->data.scalar.value);
            } else if (v->type == YAML_SEQUENCE_NODE) {
                for (yaml_node_item_t *it = v->data.sequence.items.start; it < v->data.sequence.items.top; it++) {
                    yaml_node_t *e = yaml_document_get_node(&doc, *it);
                    if (e->type != YAML_SCALAR_NODE) {
                        rc = yaml_fail(err, errlen, path, e, "list entries of a split must be strings");
                        break;
                    }
                    if (cfg->nsplit[split] == DATA_MAX_SOURCES) {
                        rc = yaml_fail(err, errlen, path, e, "too many sources in one split (max 16)");
                        break;
                    }
                    cfg->split[split][cfg->nsplit[split]++] = strdup((const char *)e->data.scalar.value);
                }
            } else rc = yaml_fail(err, errlen, path, v, "a split must be a path or a list of paths");
        } else if (strcmp(key, "nc") == 0) {
            char *end;
            long x = v->type == YAML_SCALAR_NODE ? strtol((char *)v->data.scalar.value, &end, 10) : -1;
            if (v->type != YAML_SCALAR_NODE || *end || x <= 0 || x > 100000) {
                rc = yaml_fail(err, errlen, path, v, "'nc' must be a positive integer");
                break;
            }
            nc_given = (int)x;
        } else if (strcmp(key, "names") == 0) {
            if (cfg->names) { rc = yaml_fail(err, errlen, path, v, "'names' given twice"); break; }
            if (v->type == YAML_SEQUENCE_NODE) {
                int n = (int)(v->data.sequence.items.top - v->data.sequence.items.start);
                cfg->names = xcalloc(n ? n : 1, sizeof(char *));
                for (int i = 0; i < n && rc == 0; i++) {
                    yaml_node_t *e = yaml_document_get_node(&doc, v->data.sequence.items.start[i]);
                    if (e->type != YAML_SCALAR_NODE)
                        rc = yaml_fail(err, errlen, path, e, "class names must be strings");
                    else { cfg->names[i] = strdup((char *)e->data.scalar.value); cfg->nc = i + 1; }
                }
            } else if (v->type == YAML_MAPPING_NODE) {
                int n = (int)(v->data.mapping.pairs.top - v->data.mapping.pairs.start);
                cfg->names = xcalloc(n ? n : 1, sizeof(char *));
                cfg->nc = n;
                for (int i = 0; i < n && rc == 0; i++) {
                    yaml_node_pair_t *q = v->data.mapping.pairs.start + i;
                    yaml_node_t *kk = yaml_document_get_node(&doc, q->key),
                                *vv = yaml_document_get_node(&doc, q->value);
                    char *end;
                    long id = kk->type == YAML_SCALAR_NODE ? strtol((char *)kk->data.scalar.value, &end, 10) : -1;
                    if (kk->type != YAML_SCALAR_NODE || *end || id < 0 || id >= n)
                        rc = yaml_fail(err, errlen, path, kk, "names mapping keys must be the integers 0..n-1");
                    else if (vv->type != YAML_SCALAR_NODE)
                        rc = yaml_fail(err, errlen, path, vv, "class names must be strings");
                    else if (cfg->names[id]) rc = yaml_fail(err, errlen, path, kk, "class id repeated in names");
                    else cfg->names[id] = strdup((char *)vv->data.scalar.value);
                }
            } else rc = yaml_fail(err, errlen, path, v, "'names' must be a list or an {id: name} mapping");
        }
    }
    if (rc) goto done;
    if (!cfg->names && nc_given > 0) { // nc without names: Ultralytics names them class0, class1, ...
        cfg->names = xcalloc(nc_given, sizeof(char *));
        for (int i = 0; i < nc_given; i++) {
            char b[32];
            snprintf(b, sizeof b, "class%d", i);
            cfg->names[i] = strdup(b);
        }
        cfg->nc = nc_given;
    }
    if (!cfg->names || cfg->nc == 0) {
        rc = yaml_fail(err, errlen, path, top, "missing 'names' (list of class names)");
        goto done;
    }
    if (nc_given > 0 && nc_given != cfg->nc) {
        snprintf(err, errlen, "%s: nc=%d but names has %d entries", path, nc_given, cfg->nc);
        rc = -1;
        goto done;
    }
    if (cfg->nsplit[0] == 0 || cfg->nsplit[1] == 0) {
        rc = yaml_fail(err, errlen, path, top, "'train' and 'val' are required");
        goto done;
    }
    char *ydir = path_dirname(path);
    cfg->root = root ? path_join(ydir, root) : strdup(ydir);
    free(ydir);
    for (int s = 0; s < 3; s++)
        for (int i = 0; i < cfg->nsplit[s]; i++) {
            char *full = path_join(cfg->root, cfg->split[s][i]);
            free(cfg->split[s][i]);
            cfg->split[s][i] = full;
        }
done:
    free(root);
    yaml_document_delete(&doc);
    if (rc) data_config_free(cfg);
    return rc;
}
// data_yaml_load: data_yaml_read on the file at path. 0 ok, -1 with err naming file:line.
static int data_yaml_load(const char *path, DataConfig *cfg, char *err, size_t errlen) {
    memset(cfg, 0, sizeof *cfg);
    FILE *f = fopen(path, "rb");
    if (!f) { snprintf(err, errlen, "%s: cannot open (%s)", path, strerror(errno)); return -1; }
    return data_yaml_read(f, path, cfg, err, errlen);
}

// ==========================================================================================
// labels and dataset scan (Ultralytics verify_image_label, img2label_paths)
// ==========================================================================================

// label_path_from_image: replace the last "/images/" with "/labels/" and the extension with .txt.
static void label_path_from_image(const char *img, char *out, size_t outlen) {
    const char *last = NULL;
    for (const char *p = strstr(img, "/images/"); p; p = strstr(p + 1, "/images/")) last = p;
    if (last) snprintf(out, outlen, "%.*s/labels/%s", (int)(last - img), img, last + 8);
    else snprintf(out, outlen, "%s", img);
    char *dot = strrchr(out, '.'), *slash = strrchr(out, '/');
    if (dot && (!slash || dot > slash)) *dot = 0;
    size_t n = strlen(out);
    snprintf(out + n, outlen > n ? outlen - n : 0, ".txt");
}

// label_line_parse: one line "class cx cy w h" (or "class x1 y1 x2 y2 ..." polygon, > 6
// columns, reduced to its box). out = class cx cy w h. 1 = box, 0 = blank line, -1 = bad line
// (err says why). The value checks are Ultralytics': all >= -0.01, coords <= 1.01, class < nc.
static int label_line_parse(const char *line, int nc, float out[5], char *err, size_t errlen) {
    double v[4096];
    int n = 0;
    const char *p = line;
    for (;;) {
        while (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n' || *p == '\f' || *p == '\v') p++;
        if (!*p) break;
        if (n == (int)(sizeof v / sizeof v[0])) { snprintf(err, errlen, "too many columns"); return -1; }
        char *end;
        errno = 0;
        v[n] = strtod(p, &end);
        if (end == p ||
            (*end && *end != ' ' && *end != '\t' && *end != '\r' && *end != '\n' && *end != '\f' && *end != '\v')) {
            snprintf(err, errlen, "not a number: '%.20s'", p);
            return -1;
        }
        n++;
        p = end;
    }
    if (n == 0) return 0;
    if (n != 5 && !(n > 6 && (n - 1) % 2 == 0)) {
        snprintf(err, errlen, "labels require 5 columns (or a polygon of > 6), %d found", n);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        if (!isfinite(v[i])) { snprintf(err, errlen, "non-finite value in column %d", i + 1); return -1; }
        if (v[i] < -0.01) { snprintf(err, errlen, "negative label value %g", v[i]); return -1; }
        if (i > 0 && v[i] > 1.01) {
            snprintf(err, errlen, "non-normalized or out of bounds coordinate %g", v[i]);
            return -1;
        }
    }
    if (v[0] >= nc) { snprintf(err, errlen, "label class %g exceeds dataset class count %d", v[0], nc); return -1; }
    out[0] = (float)(int)v[0];
    if (n == 5) {
        for (int i = 1; i < 5; i++) out[i] = (float)v[i];
    } else {
        double x1 = v[1], y1 = v[2], x2 = v[1], y2 = v[2];
        for (int i = 1; i + 1 < n; i += 2) {
            x1 = fmin(x1, v[i]); x2 = fmax(x2, v[i]);
            y1 = fmin(y1, v[i + 1]); y2 = fmax(y2, v[i + 1]);
        }
        out[1] = (float)((x1 + x2) / 2); out[2] = (float)((y1 + y2) / 2);
        out[3] = (float)(x2 - x1); out[4] = (float)(y2 - y1);
    }
    return 1;
}

typedef struct {
    int found;       // image files listed
    int kept;        // images used (with or without boxes)
    int backgrounds; // kept images with no boxes (missing or empty label file)
    int missing;     // of which the label file is missing
    int corrupt;     // images dropped: unreadable, < 10 px, or a bad label line
    int skipped;     // listed files without an image extension (listed missing files are corrupt)
    int duplicates;  // duplicate label rows removed
    int boxes;       // boxes kept
} DatasetStats;

typedef struct {
    int n;           // images kept
    char **paths;    // (n)
    int *w0, *h0;    // (n) original size in pixels
    int *lab_off;    // (n + 1) image i owns lab rows [lab_off[i], lab_off[i+1])
    float *lab;      // (nlab, 5) class cx cy w h, normalised to the original image
    int nc;
    DatasetStats stats;
} Dataset;

// dataset_free: release a Dataset (its stats are zeroed too).
static void dataset_free(Dataset *ds) {
    for (int i = 0; i < ds->n; i++) free(ds->paths[i]);
    free(ds->paths); free(ds->w0); free(ds->h0); free(ds->lab_off); free(ds->lab);
    memset(ds, 0, sizeof *ds);
}

// StrList: a growable list of owned strings (file listings).
typedef struct { char **v; int n, cap; } StrList;
static void strlist_push(StrList *l, char *s) {
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 64;
        char **nv = realloc(l->v, sizeof(char *) * l->cap);
        if (!nv) die("out of host memory listing images");
        l->v = nv;
    }
    l->v[l->n++] = s;
}
// cmp_str: qsort order of image paths (byte order, as Python's sorted()).
static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

// path_has_image_ext: Ultralytics' IMG_FORMATS test on the extension (case-insensitive).
static int path_has_image_ext(const char *p) {
    static const char *const exts[] = {"bmp", "dng",  "jpeg", "jpg", "mpo",  "png",
                                       "tif", "tiff", "webp", "pfm", "heic", NULL};
    const char *dot = strrchr(p, '.'), *slash = strrchr(p, '/');
    if (!dot || (slash && dot < slash)) return 0;
    for (int i = 0; exts[i]; i++)
        if (strcasecmp(dot + 1, exts[i]) == 0) return 1;
    return 0;
}

// dir_list: every regular file under dir, recursively (Ultralytics: glob **/*.*).
static void dir_list(const char *dir, StrList *out, int depth) {
    DIR *d = opendir(dir);
    if (!d || depth > 32) { if (d) closedir(d); return; }
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.' && (!e->d_name[1] || (e->d_name[1] == '.' && !e->d_name[2]))) continue;
        char *full = path_join(dir, e->d_name);
        struct stat st;
        if (stat(full, &st) != 0) { free(full); continue; }
        if (S_ISDIR(st.st_mode)) { dir_list(full, out, depth + 1); free(full); }
        else if (S_ISREG(st.st_mode)) strlist_push(out, full);
        else free(full);
    }
    closedir(d);
}

// dataset_list_files: the files of one split's sources (directories or .txt lists), sorted.
// Returns -1 when a source does not exist.
static int dataset_list_files(const DataConfig *cfg, int split, StrList *out) {
    for (int i = 0; i < cfg->nsplit[split]; i++) {
        const char *src = cfg->split[split][i];
        struct stat st;
        if (stat(src, &st) != 0) {
            fprintf(stderr, "%s: %s source '%s' does not exist\n", SPLIT_NAMES[split], SPLIT_NAMES[split], src);
            return -1;
        }
        if (S_ISDIR(st.st_mode)) { dir_list(src, out, 0); continue; }
        FILE *f = fopen(src, "r");
        if (!f) { fprintf(stderr, "%s: cannot open (%s)\n", src, strerror(errno)); return -1; }
        char *parent = path_dirname(src), line[4096];
        while (fgets(line, sizeof line, f)) {
            size_t n = strlen(line);
            while (n && (line[n - 1] == '\n' || line[n - 1] == '\r' || line[n - 1] == ' ')) line[--n] = 0;
            if (!n) continue;
            strlist_push(out, strncmp(line, "./", 2) == 0 ? path_join(parent, line + 2) : strdup(line));
        }
        free(parent);
        fclose(f);
    }
    if (out->n > 1) qsort(out->v, out->n, sizeof(char *), cmp_str);   // an empty list has v == NULL: qsort(NULL) is UB
    return 0;
}

// label_file_read: parse one label file into rows (appended to *lab). Returns the number of
// boxes (0 for background), or -1 when the image must be dropped (message printed).
static int label_file_read(const char *path, int nc, float **lab, int *nlab, int *cap, int *dups, int *missing) {
    FILE *f = fopen(path, "rb");
    if (!f) { *missing = 1; return 0; }
    char *line = NULL;
    size_t lcap = 0;
    ssize_t len;
    int lineno = 0, start = *nlab, bad = 0;
    while ((len = getline(&line, &lcap, f)) >= 0) {
        lineno++;
        if ((size_t)len != strlen(line)) {
            fprintf(stderr, "%s:%d: NUL byte in label line, image dropped\n", path, lineno);
            bad = 1;
            break;
        }
        float row[5];
        char err[160];
        int r = label_line_parse(line, nc, row, err, sizeof err);
        if (r < 0) { fprintf(stderr, "%s:%d: %s, image dropped\n", path, lineno, err); bad = 1; break; }
        if (r == 0) continue;
        int dup = 0;
        for (int j = start; j < *nlab && !dup; j++) dup = memcmp(*lab + 5 * j, row, sizeof row) == 0;
        if (dup) { (*dups)++; continue; }
        if (*nlab == *cap) {
            *cap = *cap ? 2 * *cap : 1024;
            float *nl = realloc(*lab, sizeof(float) * 5 * *cap);
            if (!nl) die("out of host memory reading labels");
            *lab = nl;
        }
        memcpy(*lab + 5 * (*nlab)++, row, sizeof row);
    }
    free(line);
    fclose(f);
    if (bad) { *nlab = start; return -1; }
    return *nlab - start;
}

// dataset_load: list, verify and label one split; prints a summary and one message per bad file.
// Returns 0, or -1 when the split lists no usable image. Matches Ultralytics' YOLODataset
// get_labels / verify_image_label checks.
static int dataset_load(const DataConfig *cfg, int split, Dataset *ds) {
    memset(ds, 0, sizeof *ds);
    ds->nc = cfg->nc;
    StrList files = {0};
    if (dataset_list_files(cfg, split, &files) < 0) {
        for (int i = 0; i < files.n; i++) free(files.v[i]);
        free(files.v);
        return -1;
    }
    DatasetStats *st = &ds->stats;
    ds->paths = xmalloc(sizeof(char *) * (files.n + 1));
    ds->w0 = xmalloc(sizeof(int) * (files.n + 1));
    ds->h0 = xmalloc(sizeof(int) * (files.n + 1));
    ds->lab_off = xmalloc(sizeof(int) * (files.n + 1));
    int nlab = 0, cap = 0;
    for (int i = 0; i < files.n; i++) {
        char *p = files.v[i];
        if (!path_has_image_ext(p)) { st->skipped++; free(p); continue; }
        st->found++;
        int w, h;
        char err[512], lpath[4096];
        int rc = image_probe(p, &w, &h, err, sizeof err);
        if (rc < 0) { fprintf(stderr, "%s, image dropped\n", err); st->corrupt++; free(p); continue; }
        if (rc > 0) fprintf(stderr, "warning: %s\n", err);
        if (w < 10 || h < 10) {
            fprintf(stderr, "%s: image size %dx%d < 10 pixels, image dropped\n", p, w, h);
            st->corrupt++;
            free(p);
            continue;
        }
        label_path_from_image(p, lpath, sizeof lpath);
        int missing = 0, nb = label_file_read(lpath, cfg->nc, &ds->lab, &nlab, &cap, &st->duplicates, &missing);
        if (nb < 0) { st->corrupt++; free(p); continue; }
        if (nb == 0) { st->backgrounds++; st->missing += missing; }
        st->boxes += nb;
        ds->paths[ds->n] = p;
        ds->w0[ds->n] = w;
        ds->h0[ds->n] = h;
        ds->lab_off[ds->n + 1] = nlab;
        ds->n++;
    }
    ds->lab_off[0] = 0;
    st->kept = ds->n;
    free(files.v);
    printf("Scanning %s '%s'... %d images, %d backgrounds, %d corrupt, %d skipped (%d boxes%s)\n", SPLIT_NAMES[split],
           cfg->nsplit[split] ? cfg->split[split][0] : "", st->kept, st->backgrounds, st->corrupt, st->skipped,
           st->boxes, st->duplicates ? ", duplicate rows removed" : "");
    if (st->duplicates) printf("  %d duplicate label rows removed\n", st->duplicates);
    if (ds->n == 0) {
        fprintf(stderr, "%s: no usable images in %s\n", SPLIT_NAMES[split],
                cfg->nsplit[split] ? cfg->split[split][0] : "(none)");
        DatasetStats keep = *st;
        dataset_free(ds);
        ds->stats = keep;
        return -1;
    }
    return 0;
}

// ==========================================================================================
// letterbox and rectangular batches (LetterBox, YOLODataset.set_rectangle)
// ==========================================================================================

typedef struct {
    double r;        // scale applied to the input image
    int nw, nh;      // unpadded resized size
    int left, top;   // padding before the image
} Letterbox;

// letterbox_params: Ultralytics LetterBox(center=True, auto=False): r = min(new/old), capped at 1
// unless scaleup; new size round(w*r), round(h*r); padding dw/2 split as round(dw/2 -+ 0.1).
// Python's round is half-to-even, as is nearbyint in the default rounding mode.
static void letterbox_params(int w, int h, int new_w, int new_h, int scaleup, Letterbox *lb) {
    double r = fmin((double)new_h / h, (double)new_w / w);
    if (!scaleup) r = fmin(r, 1.0);
    lb->r = r;
    lb->nw = (int)nearbyint(w * r);
    lb->nh = (int)nearbyint(h * r);
    double dw = (new_w - lb->nw) / 2.0, dh = (new_h - lb->nh) / 2.0;
    lb->left = (int)nearbyint(dw - 0.1);
    lb->top = (int)nearbyint(dh - 0.1);
}

// letterbox_apply: resize src (w, h) to (lb->nw, lb->nh) inside a 114-filled (new_w, new_h) canvas.
static void letterbox_apply(const uint8_t *src, int w, int h, uint8_t *dst, int new_w, int new_h, const Letterbox *lb) {
    memset(dst, 114, (size_t)new_w * new_h * 3);
    image_resize_strided(src, w, h, dst + ((size_t)lb->top * new_w + lb->left) * 3, lb->nw, lb->nh, new_w);
}

// rect_batch_shapes: per-batch (h, w) for validation. ar (n) = h/w sorted ascending; batch b
// covers ar[b*batch ...]; shape = ceil(ratio * imgsz / 32 + 0.5) * 32 with ratio (maxi, 1) if
// all are wide, (1, 1/mini) if all are tall, else (1, 1). Ultralytics BaseDataset.set_rectangle.
static void rect_batch_shapes(const double *ar, int n, int batch, int imgsz, int (*hw)[2]) {
    int nb = (n + batch - 1) / batch;
    for (int b = 0; b < nb; b++) {
        int lo = b * batch, hi = lo + batch < n ? lo + batch : n;
        double mini = ar[lo], maxi = ar[hi - 1], sh = 1, sw = 1;
        if (maxi < 1) sh = maxi;
        else if (mini > 1) sw = 1 / mini;
        hw[b][0] = (int)ceil(sh * imgsz / 32.0 + 0.5) * 32;
        hw[b][1] = (int)ceil(sw * imgsz / 32.0 + 0.5) * 32;
    }
}

// resized_size: the size load_image gives an image of (w0, h0) for long side S (BaseDataset.load_image).
static void resized_size(int w0, int h0, int S, int *w, int *h) {
    double r = (double)S / (w0 > h0 ? w0 : h0);
    *w = w0; *h = h0;
    if (r != 1) {
        *w = (int)fmin(ceil(w0 * r), S);
        *h = (int)fmin(ceil(h0 * r), S);
        if (*w < 1) *w = 1;
        if (*h < 1) *h = 1;
    }
}

// ==========================================================================================
// augmentation (Ultralytics v8_transforms): mosaic, random perspective, mixup, HSV, flips
// ==========================================================================================

typedef struct {
    float hsv_h, hsv_s, hsv_v;   // HSV gains (fractions)
    float degrees, translate, scale, shear, perspective;
    float flipud, fliplr;        // probabilities
    float mosaic, mixup;         // probabilities
} AugConfig;

// aug_defaults: Ultralytics cfg/default.yaml values.
static AugConfig aug_defaults(void) {
    AugConfig a = {0.015f, 0.7f, 0.4f, 0.0f, 0.1f, 0.5f, 0.0f, 0.0f, 0.0f, 0.5f, 1.0f, 0.0f};
    return a;
}
static const char *const AUG_KEYS[] = {"hsv_h", "hsv_s", "hsv_v", "degrees", "translate", "scale", "shear",
                                       "perspective", "flipud", "fliplr", "mosaic", "mixup", NULL};
// aug_from_args: override the defaults with key=value arguments of the same names.
static void aug_from_args(AugConfig *a, int argc, char **argv) {
    float *f[] = {&a->hsv_h, &a->hsv_s, &a->hsv_v, &a->degrees, &a->translate, &a->scale, &a->shear,
                  &a->perspective, &a->flipud, &a->fliplr, &a->mosaic, &a->mixup};
    for (int i = 0; AUG_KEYS[i]; i++) *f[i] = (float)arg_num(argc, argv, AUG_KEYS[i], *f[i]);
}

typedef struct { float x1, y1, x2, y2; int cls; } Box; // pixels of the current image

// box_candidates: keep a transformed box? Ultralytics box_candidates(wh_thr=2, ar_thr=100,
// area_thr=0.1): w, h > 2 px, area / (area before * scale^2) > 0.1, aspect < 100.
static int box_candidate(float bw0, float bh0, float bw, float bh, float s) {
    const double eps = 1e-16;
    double ar = fmax(bw / (bh + eps), bh / (bw + eps));
    return bw > 2 && bh > 2 && bw * bh / (bw0 * s * bh0 * s + eps) > 0.1 && ar < 100;
}

// mat3_inv: the inverse of a 3x3 row-major matrix by the adjugate (zeros when singular).
static void mat3_inv(const double m[9], double out[9]) {
    double a = m[0], b = m[1], c = m[2], d = m[3], e = m[4], f = m[5], g = m[6], h = m[7], k = m[8];
    double A = e * k - f * h, B = -(d * k - f * g), C = d * h - e * g;
    double det = a * A + b * B + c * C, id = det != 0 ? 1 / det : 0;
    out[0] = A * id; out[1] = -(b * k - c * h) * id; out[2] = (b * f - c * e) * id;
    out[3] = B * id; out[4] = (a * k - c * g) * id;  out[5] = -(a * f - c * d) * id;
    out[6] = C * id; out[7] = -(a * h - b * g) * id; out[8] = (a * e - b * d) * id;
}

// perspective_matrix: Ultralytics RandomPerspective.affine_transform's M = T @ S @ R @ P @ C for
// given draws, in float32 and multiplied left to right as numpy does. C centres the (sw, sh)
// source, P perspective (px, py), R rotation deg (counter-clockwise, cv2.getRotationMatrix2D)
// with scale, S shear (degrees), T moves to (tx * dw, ty * dh).
static void perspective_matrix(int sw, int sh, int dw, int dh, double px, double py, double deg, double scale,
                               double shx, double shy, double tx, double ty, double M[9]) {
    float C[9] = {1, 0, -(float)(sw / 2.0), 0, 1, -(float)(sh / 2.0), 0, 0, 1};
    float P[9] = {1, 0, 0, 0, 1, 0, (float)px, (float)py, 1};
    double al = cos(deg * M_PI / 180) * scale, be = sin(deg * M_PI / 180) * scale;
    float R[9] = {(float)al, (float)be, 0, (float)-be, (float)al, 0, 0, 0, 1};
    float S[9] = {1, (float)tan(shx * M_PI / 180), 0, (float)tan(shy * M_PI / 180), 1, 0, 0, 0, 1};
    float T[9] = {1, 0, (float)(tx * dw), 0, 1, (float)(ty * dh), 0, 0, 1};
    const float *chain[4] = {S, R, P, C};
    float acc[9], t[9];
    memcpy(acc, T, sizeof acc);
    for (int m = 0; m < 4; m++) {
        const float *b = chain[m];
        for (int i = 0; i < 3; i++)
            for (int j = 0; j < 3; j++)
                t[3 * i + j] = acc[3 * i] * b[j] + acc[3 * i + 1] * b[3 + j] + acc[3 * i + 2] * b[6 + j];
        memcpy(acc, t, sizeof acc);
    }
    for (int i = 0; i < 9; i++) M[i] = acc[i];
}

// warp_inverse: the matrix image_warp samples with, inverted as OpenCV does it:
// invertAffineTransform's formulas for an affine M, a general 3x3 inverse otherwise.
static void warp_inverse(const double M[9], double Mi[9]) {
    if (M[6] == 0 && M[7] == 0 && M[8] == 1) {
        double D = M[0] * M[4] - M[1] * M[3];
        D = D != 0 ? 1.0 / D : 0;
        double A11 = M[4] * D, A22 = M[0] * D, A12 = -M[1] * D, A21 = -M[3] * D;
        Mi[0] = A11; Mi[1] = A12; Mi[2] = -A11 * M[2] - A12 * M[5];
        Mi[3] = A21; Mi[4] = A22; Mi[5] = -A21 * M[2] - A22 * M[5];
        Mi[6] = 0; Mi[7] = 0; Mi[8] = 1;
    } else {
        mat3_inv(M, Mi);
    }
}

// random_perspective: warp src (sw, sh) to dst (dw, dh) with M = T*S*R*P*C and filter boxes;
// Ultralytics RandomPerspective.__call__/affine_transform/apply_bboxes. Returns the new count.
// Random draws in order: perspective x, y; angle, scale; shear x, y; translate x, y.
static int random_perspective(const AugConfig *a, Rng *rng, const uint8_t *src, int sw, int sh, uint8_t *dst, int dw,
                              int dh, Box *bx, int n) {
    double px = rng_range(rng, -a->perspective, a->perspective), py = rng_range(rng, -a->perspective, a->perspective);
    double deg = rng_range(rng, -a->degrees, a->degrees), s = rng_range(rng, 1 - a->scale, 1 + a->scale);
    double shx = rng_range(rng, -a->shear, a->shear), shy = rng_range(rng, -a->shear, a->shear);
    double tx = rng_range(rng, 0.5 - a->translate, 0.5 + a->translate),
           ty = rng_range(rng, 0.5 - a->translate, 0.5 + a->translate);
    double M[9], Mi[9];
    perspective_matrix(sw, sh, dw, dh, px, py, deg, s, shx, shy, tx, ty, M);
    if (a->perspective == 0) M[6] = M[7] = 0, M[8] = 1;
    warp_inverse(M, Mi);
    image_warp(src, sw, sh, dst, dw, dh, Mi);
    int k = 0;
    for (int i = 0; i < n; i++) {
        Box b = bx[i];
        double xs[4] = {b.x1, b.x2, b.x2, b.x1}, ys[4] = {b.y1, b.y1, b.y2, b.y2};
        double x1 = 1e30, y1 = 1e30, x2 = -1e30, y2 = -1e30;
        for (int c = 0; c < 4; c++) {
            double x = M[0] * xs[c] + M[1] * ys[c] + M[2], y = M[3] * xs[c] + M[4] * ys[c] + M[5];
            if (a->perspective != 0) { double z = M[6] * xs[c] + M[7] * ys[c] + M[8]; x /= z; y /= z; }
            x1 = fmin(x1, x); x2 = fmax(x2, x); y1 = fmin(y1, y); y2 = fmax(y2, y);
        }
        Box o = {(float)fmin(fmax(x1, 0), dw), (float)fmin(fmax(y1, 0), dh), (float)fmin(fmax(x2, 0), dw),
                 (float)fmin(fmax(y2, 0), dh), b.cls};
        if (box_candidate(b.x2 - b.x1, b.y2 - b.y1, o.x2 - o.x1, o.y2 - o.y1, (float)s)) bx[k++] = o;
    }
    return k;
}

// HSV_SDIV / HSV_HDIV: OpenCV's 12-bit fixed-point division tables for 8-bit RGB -> HSV.
static int HSV_SDIV[256], HSV_HDIV[256];
static pthread_once_t hsv_tables_once = PTHREAD_ONCE_INIT;
static void hsv_tables_init(void) {
    for (int i = 1; i < 256; i++) {
        HSV_SDIV[i] = (int)nearbyint((255 << 12) / (double)i);
        HSV_HDIV[i] = (int)nearbyint((180 << 12) / (6.0 * i));
    }
}

// hsv_apply: Ultralytics RandomHSV with gains (gh, gs, gv) on an RGB image (npix pixels) in
// place: OpenCV 8-bit RGB2HSV (integer tables, H in [0,180)), LUTs hue (x + gh*180) mod 180,
// sat and val clip(x * (1 + g)) truncated, sat 0 kept, then OpenCV's float HSV2RGB rounded.
// Checked bit-exact against cv2 4.6 (test_data, fixtures by test/ref_data.py).
static void hsv_apply(uint8_t *px, int npix, double gh, double gs, double gv) {
    uint8_t lh[256], ls[256], lv[256];
    for (int x = 0; x < 256; x++) {
        double hh = fmod(x + gh * 180, 180);
        if (hh < 0) hh += 180;
        lh[x] = (uint8_t)(int)hh;
        ls[x] = (uint8_t)(int)fmin(fmax(x * (gs + 1), 0), 255);
        lv[x] = (uint8_t)(int)fmin(fmax(x * (gv + 1), 0), 255);
    }
    ls[0] = 0;
    pthread_once(&hsv_tables_once, hsv_tables_init);
    const int *sdiv = HSV_SDIV, *hdiv = HSV_HDIV;
    static const int sector_tab[6][3] = {{0, 3, 1}, {2, 0, 1}, {1, 0, 3}, {1, 2, 0}, {3, 1, 0}, {0, 1, 2}}; // r, g, b
    for (int i = 0; i < npix; i++) {
        uint8_t *p = px + 3 * i;
        int r = p[0], g = p[1], b = p[2];
        int v = r > g ? r : g; v = v > b ? v : b;
        int mn = r < g ? r : g; mn = mn < b ? mn : b;
        int diff = v - mn;
        int s = (diff * sdiv[v] + (1 << 11)) >> 12;
        int h = 0;
        if (diff) {
            h = v == r ? g - b : v == g ? b - r + 2 * diff : r - g + 4 * diff;
            h = (h * hdiv[diff] + (1 << 11)) >> 12;
            if (h < 0) h += 180;
        }
        float hf = lh[h], sf = ls[s] * (1.f / 255.f), vf = lv[v] * (1.f / 255.f), out[3];
        if (sf == 0) {
            out[0] = out[1] = out[2] = vf;
        } else {
            hf *= 6.f / 180.f;
            hf = fmodf(hf, 6.f);
            if (hf < 0) hf += 6;
            int sec = (int)floorf(hf);
            hf -= sec;
            if ((unsigned)sec >= 6u) { sec = 0; hf = 0; }
            float tab[4] = {vf, vf * (1.f - sf), vf * (1.f - sf * hf), vf * (1.f - sf * (1.f - hf))};
            for (int c = 0; c < 3; c++) out[c] = tab[sector_tab[sec][c]];
        }
        for (int c = 0; c < 3; c++) {
            int q = (int)lrintf(out[c] * 255.f);
            p[c] = (uint8_t)(q < 0 ? 0 : q > 255 ? 255 : q);
        }
    }
}

// hsv_augment: RandomHSV: gains U(-1, 1) * (hsv_h, hsv_s, hsv_v), then hsv_apply.
static void hsv_augment(Rng *rng, const AugConfig *a, uint8_t *px, int npix) {
    if (!(a->hsv_h || a->hsv_s || a->hsv_v)) return;
    double gh = rng_range(rng, -1, 1) * a->hsv_h, gs = rng_range(rng, -1, 1) * a->hsv_s,
           gv = rng_range(rng, -1, 1) * a->hsv_v;
    hsv_apply(px, npix, gh, gs, gv);
}

// image_flip: mirror an (h, w, 3) image left-right (horizontal=1) or up-down, with its boxes.
static void image_flip(uint8_t *px, int w, int h, int horizontal, Box *bx, int n) {
    if (horizontal) {
        for (int y = 0; y < h; y++) {
            uint8_t *row = px + (size_t)y * w * 3;
            for (int x = 0; x < w / 2; x++)
                for (int c = 0; c < 3; c++) {
                    uint8_t t = row[3 * x + c];
                    row[3 * x + c] = row[3 * (w - 1 - x) + c];
                    row[3 * (w - 1 - x) + c] = t;
                }
        }
        for (int i = 0; i < n; i++) { float x1 = w - bx[i].x2; bx[i].x2 = w - bx[i].x1; bx[i].x1 = x1; }
    } else {
        size_t rb = (size_t)w * 3;
        for (int y = 0; y < h / 2; y++) {
            uint8_t *a = px + y * rb, *b = px + (size_t)(h - 1 - y) * rb;
            for (size_t i = 0; i < rb; i++) { uint8_t t = a[i]; a[i] = b[i]; b[i] = t; }
        }
        for (int i = 0; i < n; i++) { float y1 = h - bx[i].y2; bx[i].y2 = h - bx[i].y1; bx[i].y1 = y1; }
    }
}

// rng_gamma: Gamma(k, 1) for k >= 1 (Marsaglia-Tsang); used for Beta(32, 32) in mixup.
static double rng_gamma(Rng *r, double k) {
    double d = k - 1.0 / 3, c = 1 / sqrt(9 * d);
    for (;;) {
        double x = rng_normal(r), v = 1 + c * x;
        if (v <= 0) continue;
        v = v * v * v;
        double u = rng_uniform(r);
        if (u < 1 - 0.0331 * x * x * x * x || log(u) < 0.5 * x * x + d * (1 - v + log(v))) return d * v;
    }
}

// ==========================================================================================
// loader: worker threads filling two fixed batch buffers
// ==========================================================================================

typedef struct {
    int B, H, W;          // images in this batch (the last batch may be short) and their size
    uint8_t *img;         // (B, 3, H, W) RGB
    int n;                // labels in this batch
    int cap;              // label capacity = max_boxes * batch
    int overflow;         // labels dropped because an image had more than max_boxes
    int *batch_idx;       // (n) image of each label within the batch
    int *cls;             // (n)
    float *box;           // (n, 4) cx cy w h normalised to (W, H)
    int *index;           // (B) dataset index of each image
    int *orig_w, *orig_h; // (B) original image size
    float *ratio;         // (B, 2) batch pixels per original pixel (x, y)
    float *pad;           // (B, 2) letterbox padding (left, top) in batch pixels
    int epoch, number;    // which batch this is
} Batch;

typedef struct {
    int batch;        // images per batch
    int imgsz;        // S (multiple of 32)
    int workers;      // threads (0 = fill in the caller's thread)
    int max_boxes;    // label cap per image; the batch cap is max_boxes * batch
    int train;        // 1: shuffle + augment at S x S; 0: rect batches, no augmentation
    int cache_ram;    // keep decoded, resized images in host memory
    uint64_t seed;
    AugConfig aug;
    int rank, world;  // data parallel (train): this process reads shard rank of world (0, 1: all)
} LoaderConfig;

typedef struct {      // per-worker scratch, allocated at loader_open
    Image dec, tile, canvas, out1, out2;
    Box *bx, *bx2;    // (bcap)
    int bcap;
} LoaderScratch;

enum { SLOT_FREE, SLOT_FILLING, SLOT_READY, SLOT_INUSE };

typedef struct {
    const Dataset *ds;
    LoaderConfig cfg;
    int S, n, nbatch, nbuf;   // nbuf: the recent-image window for mosaic/mixup partners
    int npos;                 // positions this process reads per epoch: n, or its shard (loader_global)
    int *order;               // (n) dataset index at each position of the epoch
    int (*shape)[2];          // (nbatch, 2) rect batch (h, w); train: S, S
    uint8_t **cache;          // (n) resized images when cache_ram, else NULL
    int *rw, *rh;             // (n) resized size (long side S)
    Batch slot[2];
    float *stage[2];          // (batch, max_boxes, 5) per-image labels before compaction
    int *stage_n[2], *stage_over[2]; // (batch)
    int state[2], bno[2], claimed[2], done[2];
    int epoch, close_mosaic, next_fill, next_get, inuse, quit, nworkers;
    size_t img_bytes;         // each slot's img buffer (B * 3 * the largest batch shape)
    int pinned;               // the img buffers are page-locked for a device's uploads (gpu_pin_loader)
    long long load_errors;
    LoaderScratch *ws;        // (max(workers, 1))
    pthread_t *th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
} Loader;

// sample_seed: the seed of one sample's Rng from (run seed, epoch, position); b = -1 gives the
// epoch's shuffle. Only these three inputs, so results do not depend on threads.
static uint64_t sample_seed(uint64_t seed, long long a, long long b) {
    uint64_t x = seed;
    uint64_t h = splitmix64(&x);
    x = h ^ (uint64_t)a;
    h = splitmix64(&x);
    x = h ^ (uint64_t)b * 0xD1B54A32D192ED03ULL;
    return splitmix64(&x);
}

// loader_image: dataset image idx resized to long side S into out (from the cache or decoded).
// A file that fails to decode now (it passed the scan) becomes a gray image; returns 0 then.
static int loader_image(Loader *L, LoaderScratch *ws, int idx, Image *out) {
    int w = L->rw[idx], h = L->rh[idx];
    image_reserve(out, w, h);
    if (L->cache && L->cache[idx]) { memcpy(out->px, L->cache[idx], (size_t)w * h * 3); return 1; }
    char err[512];
    if (image_load(L->ds->paths[idx], L->S, &ws->dec, err, sizeof err) < 0) {
        fprintf(stderr, "loader: %s (using a gray image without labels)\n", err);
        __atomic_add_fetch(&L->load_errors, 1, __ATOMIC_RELAXED);
        memset(out->px, 114, (size_t)w * h * 3);
        return 0;
    }
    image_resize(ws->dec.px, ws->dec.w, ws->dec.h, out->px, w, h);
    return 1;
}

// labels_pixels: the dataset boxes of image idx in pixels of a (w, h) image offset by (dx, dy).
static int labels_pixels(const Loader *L, int idx, float w, float h, float dx, float dy, Box *bx, int cap) {
    const Dataset *ds = L->ds;
    int k = 0;
    for (int j = ds->lab_off[idx]; j < ds->lab_off[idx + 1] && k < cap; j++) {
        const float *l = ds->lab + 5 * j;
        Box b = {(l[1] - l[3] / 2) * w + dx, (l[2] - l[4] / 2) * h + dy, (l[1] + l[3] / 2) * w + dx,
                 (l[2] + l[4] / 2) * h + dy, (int)l[0]};
        bx[k++] = b;
    }
    return k;
}

// partner_index: a random image from the recent window before position pos (as Mosaic picks its
// partners from BaseDataset's buffer of recently loaded images).
static int partner_index(const Loader *L, Rng *rng, int pos) {
    int back = 1 + rng_int(rng, L->nbuf);
    return L->order[((pos - back) % L->n + L->n) % L->n];
}

// mosaic4: Ultralytics Mosaic._mosaic4 into ws->canvas (2S, 2S); returns the box count (boxes
// clipped to the canvas, zero-area ones dropped).
static int mosaic4(Loader *L, LoaderScratch *ws, Rng *rng, int idx, int pos, Box *bx) {
    int S = L->S, S2 = 2 * S, n = 0;
    image_reserve(&ws->canvas, S2, S2);
    memset(ws->canvas.px, 114, (size_t)S2 * S2 * 3);
    int xc = (int)rng_range(rng, S / 2.0, S2 - S / 2.0), yc = (int)rng_range(rng, S / 2.0, S2 - S / 2.0);
    int ids[4] = {idx, partner_index(L, rng, pos), partner_index(L, rng, pos), partner_index(L, rng, pos)};
    for (int t = 0; t < 4; t++) {
        int ok = loader_image(L, ws, ids[t], &ws->tile), w = ws->tile.w, h = ws->tile.h;
        int x1a, y1a, x2a, y2a, x1b, y1b, x2b; // the source rows follow from the canvas rows
        if (t == 0) { x1a = xc - w > 0 ? xc - w : 0; y1a = yc - h > 0 ? yc - h : 0; x2a = xc; y2a = yc;
                      x1b = w - (x2a - x1a); y1b = h - (y2a - y1a); x2b = w; }
        else if (t == 1) { x1a = xc; y1a = yc - h > 0 ? yc - h : 0; x2a = xc + w < S2 ? xc + w : S2; y2a = yc;
                           x1b = 0; y1b = h - (y2a - y1a); x2b = w < x2a - x1a ? w : x2a - x1a; }
        else if (t == 2) { x1a = xc - w > 0 ? xc - w : 0; y1a = yc; x2a = xc; y2a = yc + h < S2 ? yc + h : S2;
                           x1b = w - (x2a - x1a); y1b = 0; x2b = w; }
        else { x1a = xc; y1a = yc; x2a = xc + w < S2 ? xc + w : S2; y2a = yc + h < S2 ? yc + h : S2;
               x1b = 0; y1b = 0; x2b = w < x2a - x1a ? w : x2a - x1a; }
        for (int y = 0; y < y2a - y1a; y++)
            memcpy(ws->canvas.px + ((size_t)(y1a + y) * S2 + x1a) * 3, ws->tile.px + ((size_t)(y1b + y) * w + x1b) * 3,
                   (size_t)(x2b - x1b) * 3);
        if (!ok) continue;
        int k = labels_pixels(L, ids[t], (float)w, (float)h, (float)(x1a - x1b), (float)(y1a - y1b), bx + n,
                              ws->bcap / 2 - n);
        for (int i = 0; i < k; i++) {
            Box *b = bx + n + i;
            b->x1 = fminf(fmaxf(b->x1, 0), (float)S2); b->x2 = fminf(fmaxf(b->x2, 0), (float)S2);
            b->y1 = fminf(fmaxf(b->y1, 0), (float)S2); b->y2 = fminf(fmaxf(b->y2, 0), (float)S2);
        }
        int m = 0;
        for (int i = 0; i < k; i++)
            if (bx[n + i].x2 > bx[n + i].x1 && bx[n + i].y2 > bx[n + i].y1) bx[n + m++] = bx[n + i];
        n += m;
    }
    return n;
}

// sample_pre: Ultralytics' pre_transform: mosaic (p) or letterbox, then random perspective,
// into out (S, S). Returns the box count in bx.
static int sample_pre(Loader *L, LoaderScratch *ws, Rng *rng, int idx, int pos, Image *out, Box *bx) {
    int S = L->S, n;
    AugConfig a = L->cfg.aug;
    image_reserve(out, S, S);
    if (!L->close_mosaic && a.mosaic > 0 && rng_uniform(rng) < a.mosaic) {
        n = mosaic4(L, ws, rng, idx, pos, bx);
        return random_perspective(&a, rng, ws->canvas.px, 2 * S, 2 * S, out->px, S, S, bx, n);
    }
    int ok = loader_image(L, ws, idx, &ws->tile);
    Letterbox lb;
    letterbox_params(ws->tile.w, ws->tile.h, S, S, 1, &lb);
    image_reserve(&ws->canvas, S, S);
    letterbox_apply(ws->tile.px, ws->tile.w, ws->tile.h, ws->canvas.px, S, S, &lb);
    n = ok ? labels_pixels(L, idx, (float)lb.nw, (float)lb.nh, (float)lb.left, (float)lb.top, bx, ws->bcap / 2) : 0;
    return random_perspective(&a, rng, ws->canvas.px, S, S, out->px, S, S, bx, n);
}

// loader_global: the epoch position (in the shuffled order of the whole dataset) of this process's
// position pos. Sharded (world > 1), as torch's DistributedSampler: the order padded to a multiple of
// world by repeating its start, rank r reads positions r, r + world, r + 2 world, ... A position past
// n is a padded repeat (its image is order[pos % n], its augmentation seeded by the position itself, so
// every rank's samples are seeded differently and a run's samples do not depend on the world size).
static int loader_global(const Loader *L, int pos) { return L->cfg.world > 1 ? L->cfg.rank + pos * L->cfg.world : pos; }

// sample_make: one finished sample at position pos of the epoch into batch slot s, image b:
// pixels CHW and up to max_boxes labels in the stage. Randomness only from (seed, epoch, pos).
static void sample_make(Loader *L, LoaderScratch *ws, int s, int b, int pos) {
    Batch *bt = &L->slot[s];
    pos = loader_global(L, pos);
    int idx = L->order[pos % L->n], H = bt->H, W = bt->W, n;
    Rng rng;
    rng_seed(&rng, sample_seed(L->cfg.seed, L->epoch, pos));
    Image *im = &ws->out1;
    Box *bx = ws->bx;
    bt->index[b] = idx;
    bt->orig_w[b] = L->ds->w0[idx];
    bt->orig_h[b] = L->ds->h0[idx];
    if (L->cfg.train) {
        const AugConfig *a = &L->cfg.aug;
        n = sample_pre(L, ws, &rng, idx, pos, im, bx);
        if (!L->close_mosaic && a->mixup > 0 && rng_uniform(&rng) < a->mixup) {
            int n2 = sample_pre(L, ws, &rng, partner_index(L, &rng, pos), pos, &ws->out2, ws->bx2);
            double r = rng_gamma(&rng, 32.0), q = rng_gamma(&rng, 32.0);
            double lam = r / (r + q); // Beta(32, 32); blended in double and truncated, as numpy does
            size_t np = (size_t)H * W * 3;
            for (size_t i = 0; i < np; i++) im->px[i] = (uint8_t)(im->px[i] * lam + ws->out2.px[i] * (1 - lam));
            for (int i = 0; i < n2 && n < ws->bcap; i++) bx[n++] = ws->bx2[i];
        }
        hsv_augment(&rng, a, im->px, H * W);
        if (rng_uniform(&rng) < a->flipud) image_flip(im->px, W, H, 0, bx, n);
        if (rng_uniform(&rng) < a->fliplr) image_flip(im->px, W, H, 1, bx, n);
        bt->ratio[2 * b] = (float)L->rw[idx] / L->ds->w0[idx];
        bt->ratio[2 * b + 1] = (float)L->rh[idx] / L->ds->h0[idx];
        bt->pad[2 * b] = bt->pad[2 * b + 1] = 0;
    } else {
        int ok = loader_image(L, ws, idx, &ws->tile);
        Letterbox lb;
        letterbox_params(ws->tile.w, ws->tile.h, W, H, 0, &lb);
        image_reserve(im, W, H);
        letterbox_apply(ws->tile.px, ws->tile.w, ws->tile.h, im->px, W, H, &lb);
        n = ok ? labels_pixels(L, idx, (float)lb.nw, (float)lb.nh, (float)lb.left, (float)lb.top, bx, ws->bcap) : 0;
        bt->ratio[2 * b] = (float)lb.nw / L->ds->w0[idx];
        bt->ratio[2 * b + 1] = (float)lb.nh / L->ds->h0[idx];
        bt->pad[2 * b] = (float)lb.left;
        bt->pad[2 * b + 1] = (float)lb.top;
    }
    size_t plane = (size_t)H * W;
    uint8_t *dst = bt->img + (size_t)b * 3 * plane;
    for (size_t i = 0; i < plane; i++) {
        dst[i] = im->px[3 * i];
        dst[plane + i] = im->px[3 * i + 1];
        dst[2 * plane + i] = im->px[3 * i + 2];
    }
    int mb = L->cfg.max_boxes, k = n < mb ? n : mb;
    float *st = L->stage[s] + (size_t)b * mb * 5;
    for (int i = 0; i < k; i++) {
        st[5 * i] = (float)bx[i].cls;
        st[5 * i + 1] = (bx[i].x1 + bx[i].x2) / 2 / W;
        st[5 * i + 2] = (bx[i].y1 + bx[i].y2) / 2 / H;
        st[5 * i + 3] = (bx[i].x2 - bx[i].x1) / W;
        st[5 * i + 4] = (bx[i].y2 - bx[i].y1) / H;
    }
    L->stage_n[s][b] = k;
    L->stage_over[s][b] = n - k;
}

// slot_begin / slot_finish: set a slot up for batch number bn; compact its staged labels into
// the batch arrays (in image order) and mark it ready.
static void slot_begin(Loader *L, int s, int bn) {
    Batch *bt = &L->slot[s];
    bt->B = bn < L->nbatch - 1 ? L->cfg.batch : L->npos - bn * L->cfg.batch;
    bt->H = L->shape[bn][0];
    bt->W = L->shape[bn][1];
    bt->epoch = L->epoch;
    bt->number = bn;
    L->bno[s] = bn;
    L->claimed[s] = L->done[s] = 0;
    L->state[s] = SLOT_FILLING;
}
static void slot_finish(Loader *L, int s) {
    Batch *bt = &L->slot[s];
    int mb = L->cfg.max_boxes, n = 0, over = 0;
    for (int b = 0; b < bt->B; b++) {
        const float *st = L->stage[s] + (size_t)b * mb * 5;
        for (int i = 0; i < L->stage_n[s][b]; i++, n++) {
            bt->batch_idx[n] = b;
            bt->cls[n] = (int)st[5 * i];
            memcpy(bt->box + 4 * n, st + 5 * i + 1, 4 * sizeof(float));
        }
        over += L->stage_over[s][b];
    }
    bt->n = n;
    bt->overflow = over;
    L->state[s] = SLOT_READY;
}

// loader_worker: claim a sample of a filling slot, make it; start the next batch in a free slot.
static void *loader_worker(void *arg) {
    Loader *L = ((void **)arg)[0];
    LoaderScratch *ws = ((void **)arg)[1];
    free(arg);
    pthread_mutex_lock(&L->mu);
    while (!L->quit) {
        int did = 0;
        for (int k = 0; k < 2 && !did; k++) {
            int s = (L->next_get + k) % 2; // oldest batch first
            if (L->state[s] == SLOT_FILLING && L->claimed[s] < L->slot[s].B) {
                int b = L->claimed[s]++, pos = L->bno[s] * L->cfg.batch + b;
                pthread_mutex_unlock(&L->mu);
                sample_make(L, ws, s, b, pos);
                pthread_mutex_lock(&L->mu);
                if (++L->done[s] == L->slot[s].B) { slot_finish(L, s); pthread_cond_broadcast(&L->cv); }
                did = 1;
            }
        }
        if (did) continue;
        int s = L->next_fill % 2;
        if (L->next_fill < L->nbatch && L->state[s] == SLOT_FREE) {
            slot_begin(L, s, L->next_fill++);
            pthread_cond_broadcast(&L->cv);
            continue;
        }
        pthread_cond_wait(&L->cv, &L->mu);
    }
    pthread_mutex_unlock(&L->mu);
    return NULL;
}

// cmp_ar_idx: sort (aspect ratio, index) pairs; the index breaks ties so the order is stable.
static int cmp_ar_idx(const void *a, const void *b) {
    const double *x = a, *y = b;
    return x[0] < y[0] ? -1 : x[0] > y[0] ? 1 : (x[1] < y[1] ? -1 : x[1] > y[1]);
}

// cache_worker: decode and resize images into L->cache, taking indices from a shared counter.
static void *cache_worker(void *arg) {
    Loader *L = ((void **)arg)[0];
    int *next = ((void **)arg)[1];
    LoaderScratch sc;
    memset(&sc, 0, sizeof sc);
    Image tmp = {0};
    for (int i; (i = __atomic_fetch_add(next, 1, __ATOMIC_RELAXED)) < L->n;) {
        uint8_t *keep = L->cache[i];
        L->cache[i] = NULL; // make loader_image decode rather than copy
        loader_image(L, &sc, i, &tmp);
        memcpy(keep, tmp.px, (size_t)L->rw[i] * L->rh[i] * 3);
        L->cache[i] = keep;
    }
    image_free(&sc.dec);
    image_free(&tmp);
    return NULL;
}

// scratch_init: one worker's buffers at their working sizes (decode 2S x 2S grows if needed).
static void scratch_init(LoaderScratch *ws, int S, int bcap) {
    memset(ws, 0, sizeof *ws);
    image_reserve(&ws->dec, 2 * S, 2 * S);
    image_reserve(&ws->tile, S, S);
    image_reserve(&ws->canvas, 2 * S, 2 * S);
    int Smax = (int)ceil(S / 32.0 + 0.5) * 32;
    image_reserve(&ws->out1, Smax, Smax);
    image_reserve(&ws->out2, S, S);
    ws->bcap = bcap;
    ws->bx = xmalloc(sizeof(Box) * bcap);
    ws->bx2 = xmalloc(sizeof(Box) * bcap);
}

// loader_open: allocate the batch buffers, scratch and (cache_ram) the image cache, start the
// workers. Prints the host memory it holds. ds must outlive the loader.
static Loader *loader_open(const Dataset *ds, const LoaderConfig *cfg) {
    if (cfg->batch < 1 || cfg->imgsz < 32 || cfg->imgsz % 32 || cfg->max_boxes < 1 || cfg->workers < 0)
        die("loader: bad settings batch=%d imgsz=%d (multiple of 32) max_boxes=%d workers=%d", cfg->batch, cfg->imgsz,
            cfg->max_boxes, cfg->workers);
    if (ds->n < 1) die("loader: the dataset has no images");
    Loader *L = xcalloc(1, sizeof *L);
    L->ds = ds;
    L->cfg = *cfg;
    int S = L->S = cfg->imgsz, n = L->n = ds->n, B = cfg->batch;
    if (cfg->world > 1 && (!cfg->train || cfg->rank < 0 || cfg->rank >= cfg->world))
        die("loader: rank %d of %d: only a training loader is sharded", cfg->rank, cfg->world);
    L->npos = cfg->world > 1 ? (n + cfg->world - 1) / cfg->world : n;
    L->nbatch = (L->npos + B - 1) / B;
    L->nbuf = n < 8 * B ? n : 8 * B;
    if (L->nbuf > 1000) L->nbuf = 1000;
    L->order = xmalloc(sizeof(int) * n);
    L->shape = xmalloc(sizeof(int[2]) * L->nbatch);
    L->rw = xmalloc(sizeof(int) * n);
    L->rh = xmalloc(sizeof(int) * n);
    size_t cache_bytes = 0;
    int maxlab = 0;
    for (int i = 0; i < n; i++) {
        resized_size(ds->w0[i], ds->h0[i], S, &L->rw[i], &L->rh[i]);
        cache_bytes += (size_t)L->rw[i] * L->rh[i] * 3;
        int k = ds->lab_off[i + 1] - ds->lab_off[i];
        if (k > maxlab) maxlab = k;
    }
    int Hm = S, Wm = S;
    if (cfg->train) {
        for (int b = 0; b < L->nbatch; b++) L->shape[b][0] = L->shape[b][1] = S;
    } else {
        double *ar = xmalloc(sizeof(double) * 2 * n);
        for (int i = 0; i < n; i++) { ar[2 * i] = (double)ds->h0[i] / ds->w0[i]; ar[2 * i + 1] = i; }
        qsort(ar, n, 2 * sizeof(double), cmp_ar_idx);
        double *ars = xmalloc(sizeof(double) * n);
        for (int i = 0; i < n; i++) { L->order[i] = (int)ar[2 * i + 1]; ars[i] = ar[2 * i]; }
        rect_batch_shapes(ars, n, B, S, L->shape);
        Hm = Wm = 0;
        for (int b = 0; b < L->nbatch; b++) {
            if (L->shape[b][0] > Hm) Hm = L->shape[b][0];
            if (L->shape[b][1] > Wm) Wm = L->shape[b][1];
        }
        free(ar);
        free(ars);
    }
    size_t batch_bytes = 0;
    L->img_bytes = (size_t)B * 3 * Hm * Wm;
    for (int s = 0; s < 2; s++) {
        Batch *bt = &L->slot[s];
        bt->cap = cfg->max_boxes * B;
        bt->img = xmalloc(L->img_bytes);
        bt->batch_idx = xmalloc(sizeof(int) * bt->cap);
        bt->cls = xmalloc(sizeof(int) * bt->cap);
        bt->box = xmalloc(sizeof(float) * 4 * bt->cap);
        bt->index = xmalloc(sizeof(int) * B);
        bt->orig_w = xmalloc(sizeof(int) * B);
        bt->orig_h = xmalloc(sizeof(int) * B);
        bt->ratio = xmalloc(sizeof(float) * 2 * B);
        bt->pad = xmalloc(sizeof(float) * 2 * B);
        L->stage[s] = xmalloc(sizeof(float) * 5 * (size_t)B * cfg->max_boxes);
        L->stage_n[s] = xcalloc(B, sizeof(int));
        L->stage_over[s] = xcalloc(B, sizeof(int));
        batch_bytes += (size_t)B * 3 * Hm * Wm + (size_t)bt->cap * 24 + (size_t)B * cfg->max_boxes * 20;
    }
    L->nworkers = cfg->workers;
    int nws = cfg->workers > 0 ? cfg->workers : 1, bcap = 8 * maxlab + 8;
    L->ws = xmalloc(sizeof(LoaderScratch) * nws);
    for (int i = 0; i < nws; i++) scratch_init(&L->ws[i], S, bcap);
    size_t scratch_bytes = (size_t)nws * (27 * (size_t)S * S + 2 * sizeof(Box) * bcap);
    printf("loader: %d images, %d batches of %d, %s, %d workers; host memory: batches %.1f MB, scratch %.1f MB, cache "
           "%.1f MB%s\n",
           n, L->nbatch, B, cfg->train ? "train (augment)" : "val (rect)", cfg->workers, batch_bytes / 1e6,
           scratch_bytes / 1e6, cfg->cache_ram ? cache_bytes / 1e6 : 0.0, cfg->cache_ram ? "" : " (cache off)");
    if (cfg->cache_ram) {
        L->cache = xcalloc(n, sizeof(uint8_t *));
        for (int i = 0; i < n; i++) L->cache[i] = xmalloc((size_t)L->rw[i] * L->rh[i] * 3);
        double t0 = now_sec();
        pthread_t *th = xmalloc(sizeof(pthread_t) * nws);
        int next = 0;
        void *arg[2] = {L, &next};
        for (int i = 0; i < nws; i++)
            if (pthread_create(&th[i], NULL, cache_worker, arg) != 0) die("loader: cannot start cache thread %d", i);
        for (int i = 0; i < nws; i++) pthread_join(th[i], NULL);
        free(th);
        printf("loader: cached %d images in %.1f s\n", n, now_sec() - t0);
    }
    pthread_mutex_init(&L->mu, NULL);
    pthread_cond_init(&L->cv, NULL);
    L->next_fill = L->next_get = L->nbatch; // nothing to do until loader_start_epoch
    L->inuse = -1;
    if (cfg->workers > 0) {
        L->th = xmalloc(sizeof(pthread_t) * cfg->workers);
        for (int i = 0; i < cfg->workers; i++) {
            void **arg = xmalloc(2 * sizeof(void *));
            arg[0] = L;
            arg[1] = &L->ws[i];
            if (pthread_create(&L->th[i], NULL, loader_worker, arg) != 0)
                die("loader: cannot start worker thread %d", i);
        }
    }
    return L;
}

// loader_batches: batches per epoch (the last one may be short).
static int loader_batches(const Loader *L) { return L->nbatch; }

// loader_start_epoch: begin epoch (0-based): a new shuffle (train) and prefetch of two batches.
// close_mosaic = 1 turns mosaic and mixup off (Ultralytics close_mosaic epochs).
static void loader_start_epoch(Loader *L, int epoch, int close_mosaic) {
    pthread_mutex_lock(&L->mu);
    L->next_fill = L->nbatch;
    while (L->state[0] == SLOT_FILLING || L->state[1] == SLOT_FILLING) pthread_cond_wait(&L->cv, &L->mu);
    L->epoch = epoch;
    L->close_mosaic = close_mosaic;
    if (L->cfg.train) {
        Rng r;
        rng_seed(&r, sample_seed(L->cfg.seed, epoch, -1));
        for (int i = 0; i < L->n; i++) L->order[i] = i;
        for (int i = L->n - 1; i > 0; i--) {
            int j = rng_int(&r, i + 1), t = L->order[i];
            L->order[i] = L->order[j];
            L->order[j] = t;
        }
    }
    L->state[0] = L->state[1] = SLOT_FREE;
    L->inuse = -1;
    L->next_fill = L->next_get = 0;
    pthread_cond_broadcast(&L->cv);
    pthread_mutex_unlock(&L->mu);
}

// loader_next: the next batch of the epoch (valid until the next call), or NULL at its end.
static const Batch *loader_next(Loader *L) {
    pthread_mutex_lock(&L->mu);
    if (L->inuse >= 0) { L->state[L->inuse] = SLOT_FREE; L->inuse = -1; pthread_cond_broadcast(&L->cv); }
    if (L->next_get >= L->nbatch) { pthread_mutex_unlock(&L->mu); return NULL; }
    int s = L->next_get % 2;
    if (L->nworkers == 0) {
        slot_begin(L, s, L->next_get);
        L->next_fill = L->next_get + 1;
        for (int b = 0; b < L->slot[s].B; b++) sample_make(L, &L->ws[0], s, b, L->next_get * L->cfg.batch + b);
        slot_finish(L, s);
    }
    while (!(L->state[s] == SLOT_READY && L->bno[s] == L->next_get)) pthread_cond_wait(&L->cv, &L->mu);
    L->state[s] = SLOT_INUSE;
    L->inuse = s;
    L->next_get++;
    pthread_mutex_unlock(&L->mu);
    return &L->slot[s];
}

// loader_close: stop and join the workers, free every buffer.
static void loader_close(Loader *L) {
    if (!L) return;
    pthread_mutex_lock(&L->mu);
    L->quit = 1;
    pthread_cond_broadcast(&L->cv);
    pthread_mutex_unlock(&L->mu);
    for (int i = 0; i < L->nworkers; i++) pthread_join(L->th[i], NULL);
    int nws = L->nworkers > 0 ? L->nworkers : 1;
    for (int i = 0; i < nws; i++) {
        LoaderScratch *w = &L->ws[i];
        image_free(&w->dec); image_free(&w->tile); image_free(&w->canvas); image_free(&w->out1); image_free(&w->out2);
        free(w->bx); free(w->bx2);
    }
    for (int s = 0; s < 2; s++) {
        Batch *b = &L->slot[s];
        free(b->img); free(b->batch_idx); free(b->cls); free(b->box); free(b->index);
        free(b->orig_w); free(b->orig_h); free(b->ratio); free(b->pad);
        free(L->stage[s]); free(L->stage_n[s]); free(L->stage_over[s]);
    }
    if (L->cache) for (int i = 0; i < L->n; i++) free(L->cache[i]);
    free(L->cache); free(L->ws); free(L->th); free(L->order); free(L->shape); free(L->rw); free(L->rh);
    pthread_mutex_destroy(&L->mu);
    pthread_cond_destroy(&L->cv);
    free(L);
}

// ==========================================================================================
// commands: `yolo shapes` (synthetic dataset) and `yolo augment` (preview grid)
// ==========================================================================================

static const uint8_t SHAPE_COLORS[4][3] = {{225, 40, 40}, {40, 190, 60}, {45, 85, 235}, {245, 205, 30}};
// Ultralytics' 20 class colours (utils/plotting.py Colors), class c -> PALETTE[c % 20]
#define PALETTE_N 20
static const uint8_t PALETTE[PALETTE_N][3] = {
    {0x04, 0x2A, 0xFF}, {0x0B, 0xDB, 0xEB}, {0xF3, 0xF3, 0xF3}, {0x00, 0xDF, 0xB7}, {0x11, 0x1F, 0x68},
    {0xFF, 0x6F, 0xDD}, {0xFF, 0x44, 0x4F}, {0xCC, 0xED, 0x00}, {0x00, 0xF3, 0x44}, {0xBD, 0x00, 0xFF},
    {0x00, 0xB4, 0xFF}, {0xDD, 0x00, 0xBA}, {0x00, 0xFF, 0xFF}, {0x26, 0xC0, 0x00}, {0x01, 0xFF, 0xB3},
    {0x7D, 0x24, 0xFF}, {0x7B, 0x00, 0x68}, {0xFF, 0x1B, 0x6C}, {0xFC, 0x6D, 0x2F}, {0xA2, 0xFF, 0x0B}};

// image_draw_detection: a box in class cls's palette colour with its text on a label above it
// (inside the box when there is no room above); labels, predictions and validation pictures.
static void image_draw_detection(Image *img, int x1, int y1, int x2, int y2, int cls, const char *text, int thickness) {
    const uint8_t *col = PALETTE[cls % PALETTE_N];
    image_draw_box(img, x1, y1, x2, y2, col[0], col[1], col[2], thickness);
    image_draw_label(img, x1, y1 - 9 >= 0 ? y1 - 9 : y1, text, col[0], col[1], col[2]);
}

// shape_inside: is (u, v) in [-1, 1]^2 (box-normalised) inside shape class cls? Every shape
// touches all four sides of its box, so the box label is exact.
static int shape_inside(int cls, double u, double v) {
    switch (cls) {
        case 0: return u * u + v * v <= 1;
        case 1: return 1;
        case 2: return fabs(u) <= (v + 1) / 2;
        default: return fabs(u) + fabs(v) <= 1;
    }
}

// shapes_render: one image of the synthetic set: a textured background and up to 5 shapes.
// Writes the labels as "class cx cy w h" lines into lab (nlab rows).
static void shapes_render(Rng *r, int W, int H, Image *img, float lab[][5], int *nlab, int want) {
    image_reserve(img, W, H);
    double base[3], tint = rng_range(r, 70, 170);
    for (int c = 0; c < 3; c++) base[c] = tint + rng_range(r, -18, 18);
    double fx = rng_range(r, 0.02, 0.15), fy = rng_range(r, 0.02, 0.15), ph = rng_range(r, 0, 6.28),
           amp = rng_range(r, 5, 25);
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++) {
            double t = amp * sin(fx * x + fy * y + ph) + rng_range(r, -10, 10);
            for (int c = 0; c < 3; c++) img->px[((size_t)y * W + x) * 3 + c] = (uint8_t)fmin(fmax(base[c] + t, 0), 255);
        }
    int n = 0, smin = W < H ? W : H;
    for (int tries = 0; n < want && tries < 50; tries++) {
        int cls = rng_int(r, 4);
        double bw = rng_range(r, 0.12, 0.45) * smin, bh = bw * rng_range(r, 0.6, 1.6);
        if (bh > 0.9 * H) bh = 0.9 * H;
        double x1 = rng_range(r, 0, W - bw), y1 = rng_range(r, 0, H - bh);
        int clash = 0;
        for (int j = 0; j < n && !clash; j++) { // keep overlaps small (IoU < 0.2)
            double ax1 = (lab[j][1] - lab[j][3] / 2) * W, ay1 = (lab[j][2] - lab[j][4] / 2) * H;
            double ax2 = ax1 + lab[j][3] * W, ay2 = ay1 + lab[j][4] * H;
            double iw = fmin(ax2, x1 + bw) - fmax(ax1, x1), ih = fmin(ay2, y1 + bh) - fmax(ay1, y1);
            double inter = iw > 0 && ih > 0 ? iw * ih : 0;
            clash = inter / ((ax2 - ax1) * (ay2 - ay1) + bw * bh - inter) > 0.2;
        }
        if (clash) continue;
        double col[3];
        for (int c = 0; c < 3; c++) col[c] = fmin(fmax(SHAPE_COLORS[cls][c] + rng_range(r, -20, 20), 0), 255);
        for (int y = (int)y1; y < (int)ceil(y1 + bh) && y < H; y++)
            for (int x = (int)x1; x < (int)ceil(x1 + bw) && x < W; x++) {
                int cover = 0; // 4x4 supersampling for smooth edges
                for (int sy = 0; sy < 4; sy++)
                    for (int sx = 0; sx < 4; sx++) {
                        double px = x + (sx + 0.5) / 4, py = y + (sy + 0.5) / 4;
                        if (px < x1 || px > x1 + bw || py < y1 || py > y1 + bh) continue;
                        cover += shape_inside(cls, 2 * (px - x1) / bw - 1, 2 * (py - y1) / bh - 1);
                    }
                uint8_t *p = img->px + ((size_t)y * W + x) * 3;
                for (int c = 0; c < 3; c++) p[c] = (uint8_t)(p[c] + (col[c] - p[c]) * cover / 16.0 + 0.5);
            }
        lab[n][0] = (float)cls;
        lab[n][1] = (float)((x1 + bw / 2) / W); lab[n][2] = (float)((y1 + bh / 2) / H);
        lab[n][3] = (float)(bw / W); lab[n][4] = (float)(bh / H);
        n++;
    }
    *nlab = n;
}

// mkdir_or_die: create a folder unless it exists; exit with a message otherwise.
static void mkdir_or_die(const char *path) {
    if (mkdir(path, 0755) != 0 && errno != EEXIST) die("cannot create directory '%s': %s", path, strerror(errno));
}

// cmd_shapes: `yolo shapes out=DIR [ntrain=128 nval=32 imgsz=160 seed=0]`: the synthetic
// dataset (JPEG and PNG images, YOLO labels, data.yaml). Deterministic for a seed.
static int cmd_shapes(int argc, char **argv) {
    static const char *const keys[] = {"out", "ntrain", "nval", "imgsz", "seed", NULL};
    arg_check(argc, argv, keys);
    const char *out = arg_get(argc, argv, "out", "data/shapes");
    int ntr = (int)arg_int(argc, argv, "ntrain", 128), nva = (int)arg_int(argc, argv, "nval", 32);
    int S = (int)arg_int(argc, argv, "imgsz", 160);
    uint64_t seed = (uint64_t)arg_int(argc, argv, "seed", 0);
    if (ntr < 1 || nva < 1 || S < 32 || S > 4096) die("shapes: need ntrain>=1, nval>=1, 32<=imgsz<=4096");
    char p[4096];
    mkdir_or_die(out);
    snprintf(p, sizeof p, "%s/images", out); mkdir_or_die(p);
    snprintf(p, sizeof p, "%s/labels", out); mkdir_or_die(p);
    Image img = {0};
    float lab[8][5];
    for (int split = 0; split < 2; split++) {
        const char *sn = SPLIT_NAMES[split];
        snprintf(p, sizeof p, "%s/images/%s", out, sn); mkdir_or_die(p);
        snprintf(p, sizeof p, "%s/labels/%s", out, sn); mkdir_or_die(p);
        int count = split ? nva : ntr;
        for (int i = 0; i < count; i++) {
            Rng r;
            rng_seed(&r, sample_seed(seed, split, i));
            int W = S, H = (int)(S * rng_range(&r, 0.6, 1.0)) & ~1;
            if (rng_uniform(&r) < 0.3) { int t = W; W = H; H = t; }
            int nl, want = i % 20 == 19 ? 0 : 1 + rng_int(&r, 5); // every 20th image is a background
            shapes_render(&r, W, H, &img, lab, &nl, want);
            int png = i % 3 == 2;
            snprintf(p, sizeof p, "%s/images/%s/%06d.%s", out, sn, i, png ? "png" : "jpg");
            if ((png ? image_save_png(p, &img) : image_save_jpg(p, &img, 92)) != 0) die("shapes: cannot write '%s'", p);
            snprintf(p, sizeof p, "%s/labels/%s/%06d.txt", out, sn, i);
            FILE *f = xfopen(p, "w");
            for (int j = 0; j < nl; j++)
                fprintf(f, "%d %.6f %.6f %.6f %.6f\n", (int)lab[j][0], lab[j][1], lab[j][2], lab[j][3], lab[j][4]);
            if (fclose(f) != 0) die("shapes: cannot write '%s'", p);
        }
    }
    image_free(&img);
    snprintf(p, sizeof p, "%s/data.yaml", out);
    FILE *f = xfopen(p, "w");
    fprintf(f, "# Synthetic shapes dataset written by `./yolo shapes` (seed=%llu, imgsz=%d).\n"
               "# Four classes of coloured shapes on textured backgrounds; YOLO txt labels.\n"
               "path: .                 # relative to this file\n"
               "train: \"images/train\"   # %d images\n"
               "val: 'images/val'       # %d images\n"
               "nc: 4\n"
               "names: [\"circle\", 'rectangle', triangle, \"diamond\"]  # flow list\n",
            (unsigned long long)seed, S, ntr, nva);
    if (fclose(f) != 0) die("shapes: cannot write '%s'", p);
    printf("shapes: wrote %d train + %d val images (%d px) and %s\n", ntr, nva, S, p);
    return 0;
}

// batch_draw: image b of a batch as an HWC image with its boxes and class names drawn.
static void batch_draw(const Batch *bt, int b, const DataConfig *cfg, Image *out) {
    int H = bt->H, W = bt->W;
    image_reserve(out, W, H);
    size_t plane = (size_t)H * W;
    const uint8_t *src = bt->img + (size_t)b * 3 * plane;
    for (size_t i = 0; i < plane; i++) for (int c = 0; c < 3; c++) out->px[3 * i + c] = src[c * plane + i];
    for (int i = 0; cfg && i < bt->n; i++) {   // cfg NULL: the image only
        if (bt->batch_idx[i] != b) continue;
        const float *bx = bt->box + 4 * i;
        int x1 = (int)((bx[0] - bx[2] / 2) * W), y1 = (int)((bx[1] - bx[3] / 2) * H);
        int x2 = (int)((bx[0] + bx[2] / 2) * W), y2 = (int)((bx[1] + bx[3] / 2) * H);
        image_draw_detection(out, x1, y1, x2, y2, bt->cls[i], bt->cls[i] < cfg->nc ? cfg->names[bt->cls[i]] : "?", 2);
    }
}

// cmd_augment: `yolo augment data=FILE out=FILE.jpg [imgsz=320 n=16 seed=0 workers=2 epoch=0
// close_mosaic=0 + hsv_h ... mixup]`: a grid of augmented training samples with their labels.
static int cmd_augment(int argc, char **argv) {
    const char *keys[32] = {"data", "out", "imgsz", "n", "seed", "workers", "epoch", "close_mosaic", "max_boxes"};
    int nk = 9;
    for (int i = 0; AUG_KEYS[i]; i++) keys[nk++] = AUG_KEYS[i];
    keys[nk] = NULL;
    arg_check(argc, argv, keys);
    const char *data = arg_get(argc, argv, "data", NULL), *out = arg_get(argc, argv, "out", "augment.jpg");
    if (!data) die("augment: data=FILE (a data.yaml) is required");
    LoaderConfig lc = {0};
    lc.batch = (int)arg_int(argc, argv, "n", 16);
    lc.imgsz = (int)arg_int(argc, argv, "imgsz", 320);
    lc.workers = (int)arg_int(argc, argv, "workers", 2);
    lc.max_boxes = (int)arg_int(argc, argv, "max_boxes", 100);
    lc.seed = (uint64_t)arg_int(argc, argv, "seed", 0);
    lc.train = 1;
    lc.aug = aug_defaults();
    aug_from_args(&lc.aug, argc, argv);
    if (lc.batch < 1 || lc.batch > 256) die("augment: n=%d must be in 1..256", lc.batch);
    DataConfig cfg;
    Dataset ds;
    char err[1024];
    if (data_yaml_load(data, &cfg, err, sizeof err) != 0) die("augment: %s", err);
    if (dataset_load(&cfg, 0, &ds) != 0) die("augment: no usable training images in %s", data);
    Loader *L = loader_open(&ds, &lc);
    loader_start_epoch(L, (int)arg_int(argc, argv, "epoch", 0), (int)arg_int(argc, argv, "close_mosaic", 0));
    const Batch *bt = loader_next(L);
    int cols = (int)ceil(sqrt((double)bt->B)), rows = (bt->B + cols - 1) / cols, S = bt->W;
    Image grid = image_alloc(cols * S, rows * bt->H), tile = {0};
    for (int b = 0; b < bt->B; b++) {
        batch_draw(bt, b, &cfg, &tile);
        int gx = (b % cols) * S, gy = (b / cols) * bt->H;
        for (int y = 0; y < tile.h; y++)
            memcpy(grid.px + ((size_t)(gy + y) * grid.w + gx) * 3, tile.px + (size_t)y * tile.w * 3,
                   (size_t)tile.w * 3);
        image_draw_box(&grid, gx, gy, gx + S - 1, gy + bt->H - 1, 255, 255, 255, 1);
    }
    size_t ol = strlen(out);
    int rc = (ol > 4 && strcasecmp(out + ol - 4, ".png") == 0) ? image_save_png(out, &grid)
                                                               : image_save_jpg(out, &grid, 90);
    if (rc == 0)
        printf("augment: wrote %s (%d samples, %d labels, %d over the cap)\n", out, bt->B, bt->n, bt->overflow);
    image_free(&grid);
    image_free(&tile);
    loader_close(L);
    dataset_free(&ds);
    data_config_free(&cfg);
    return rc ? 1 : 0;
}

// ------------------------------------------------------------------------------------------
// run pictures: confusion matrix, P/R/F1 curves, batch mosaics, label distribution
// ------------------------------------------------------------------------------------------
//
// The pictures Ultralytics writes into a run's folder, under its file names:
//   labels.jpg                    training labels: instances per class, box shapes, x/y and w/h
//                                 histograms (plot_labels), at the start of training
//   train_batch0.jpg .. 2         the first three augmented training batches with their labels
//   val_batchI_labels.jpg, val_batchI_pred.jpg   the first three validation batches: labels, and
//                                 the predictions with score > 0.25 (plot_images)
//   confusion_matrix.png, confusion_matrix_normalized.png   the Evaluator's cm (confusion_add);
//                                 normalized divides each column (true class) by its sum
//   PR_curve.png, F1_curve.png, P_curve.png, R_curve.png   the curves evaluator_compute already
//                                 builds for mAP (ap_per_class), per class and for all classes
// The validation pictures come from the last validation of a training run and from `yolo val`.
// DEVIATIONS from Ultralytics here:
//  - Drawn with our 5x7 bitmap font (upper case only) and our own layout, not matplotlib/seaborn;
//    sizes differ (mosaics follow plot_images: a grid of up to 16 tiles, long side <= 1920).
//  - The end-of-training pictures show the last epoch's validation of the EMA, not a second
//    validation of best.safetensors (yolo.c runs no final_eval).
//  - A class with labels but no predictions has a PR curve of zeros in the all-classes mean
//    (Ultralytics leaves it out of that mean but not out of mAP).

// matplotlib's default colour cycle (tab10), for the per-class curves
static const uint8_t TAB10[10][3] = {{31, 119, 180}, {255, 127, 14}, {44, 160, 44}, {214, 39, 40}, {148, 103, 189},
                                     {140, 86, 75}, {227, 119, 194}, {127, 127, 127}, {188, 189, 34}, {23, 190, 207}};
// matplotlib's "Blues" colour map, 9 stops from 0 to 1, for the confusion matrix
static const uint8_t BLUES[9][3] = {{247, 251, 255}, {222, 235, 247}, {198, 219, 239}, {158, 202, 225}, {107, 174, 214},
                                    {66, 146, 198}, {33, 113, 181}, {8, 81, 156}, {8, 48, 107}};

// image_draw_line: a straight line of a square pen t pixels wide from (xa, ya) to (xb, yb).
static void image_draw_line(Image *img, double xa, double ya, double xb, double yb, int t, int r, int g, int b) {
    int steps = (int)fmax(fabs(xb - xa), fabs(yb - ya)) + 1;
    for (int s = 0; s <= steps; s++) {
        int px = (int)lround(xa + (xb - xa) * s / steps) - t / 2, py = (int)lround(ya + (yb - ya) * s / steps) - t / 2;
        image_fill_rect(img, px, py, px + t, py + t, r, g, b);
    }
}

// image_draw_text_up: text turned 90 degrees counter-clockwise (read from bottom to top) starting
// at (x, y), the bottom-left corner of the first glyph; the glyphs' tops face left.
static void image_draw_text_up(Image *img, int x, int y, const char *text, int r, int g, int b, int s) {
    for (const char *t = text; *t; t++, y -= 6 * s) {
        int gi = font_index(*t);
        for (int row = 0; row < 7; row++)
            for (int col = 0; col < 5; col++)
                if (FONT_ROWS[gi][row] & (0x10 >> col))
                    image_fill_rect(img, x + row * s, y - (col + 1) * s, x + (row + 1) * s, y - col * s, r, g, b);
    }
}

static int text_w(const char *t, int s) { return 6 * s * (int)strlen(t) - s; }

// Frame: the axes of a plot in pixels; data coordinates x in [xmin, xmax], y in [ymin, ymax].
typedef struct { int x0, y0, x1, y1; double xmin, xmax, ymin, ymax; } Frame;
static double frame_x(const Frame *f, double v) {
    return f->x0 + (v - f->xmin) / (f->xmax - f->xmin) * (f->x1 - f->x0);
}
static double frame_y(const Frame *f, double v) {
    return f->y1 - (v - f->ymin) / (f->ymax - f->ymin) * (f->y1 - f->y0);
}

// frame_draw: the axes box, five ticks with values on each axis, the axis labels (y turned) and
// a title centred above, in text scale s.
static void frame_draw(Image *img, const Frame *f, const char *title, const char *xl, const char *yl, int s) {
    image_draw_box(img, f->x0, f->y0, f->x1, f->y1, 0, 0, 0, 1);
    char lab[32];
    for (int k = 0; k <= 5; k++) {
        double vx = f->xmin + (f->xmax - f->xmin) * k / 5, vy = f->ymin + (f->ymax - f->ymin) * k / 5;
        int px = (int)lround(frame_x(f, vx)), py = (int)lround(frame_y(f, vy));
        image_fill_rect(img, px, f->y1, px + 1, f->y1 + 5, 0, 0, 0);
        snprintf(lab, sizeof lab, "%.1f", vx);
        image_draw_text(img, px - text_w(lab, s) / 2, f->y1 + 8, lab, 0, 0, 0, s);
        image_fill_rect(img, f->x0 - 5, py, f->x0, py + 1, 0, 0, 0);
        snprintf(lab, sizeof lab, "%.1f", vy);
        image_draw_text(img, f->x0 - 8 - text_w(lab, s), py - 7 * s / 2, lab, 0, 0, 0, s);
    }
    image_draw_text(img, (f->x0 + f->x1 - text_w(xl, s)) / 2, f->y1 + 14 + 7 * s, xl, 0, 0, 0, s);
    image_draw_text_up(img, f->x0 - 18 - 6 * s * 3 - 7 * s, (f->y0 + f->y1 + text_w(yl, s)) / 2, yl, 0, 0, 0, s);
    image_draw_text(img, (f->x0 + f->x1 - text_w(title, s)) / 2, f->y0 - 10 - 7 * s, title, 0, 0, 0, s);
}

// plot_curves: one of PR_curve.png and the F1/P/R-confidence curves (plot_pr_curve,
// plot_mc_curve): y (n, EVAL_NGRID) over px (EVAL_NGRID), a thin line per class with its legend
// entry from labels (with 21 classes or more the lines are grey and unlabelled), then `all`
// thick and blue with all_label. Axes 0..1 both ways, legend right of the axes.
static void plot_curves(const char *path, const char *title, const char *xl, const char *yl, const double *px,
                        const double *y, int n, char **labels, const double *all, const char *all_label) {
    const int s = 2;
    Image img = image_alloc(1400, 860);
    memset(img.px, 255, (size_t)img.w * img.h * 3);
    Frame f = {130, 60, 930, 760, 0, 1, 0, 1};
    int legend = n > 0 && n < 21, ly = f.y0 + 10;
    for (int i = 0; i <= n; i++) {
        const double *v = i < n ? y + (size_t)i * EVAL_NGRID : all;
        const uint8_t grey[3] = {128, 128, 128}, blue[3] = {0, 0, 255};
        const uint8_t *c = i == n ? blue : legend ? TAB10[i % 10] : grey;
        int t = i == n ? 5 : 2;
        for (int k = 1; k < EVAL_NGRID; k++)
            image_draw_line(&img, frame_x(&f, px[k - 1]), frame_y(&f, fmin(fmax(v[k - 1], 0), 1)), frame_x(&f, px[k]),
                            frame_y(&f, fmin(fmax(v[k], 0), 1)), t, c[0], c[1], c[2]);
        if (i < n && !legend) continue;
        image_fill_rect(&img, f.x1 + 30, ly + 6 - t / 2, f.x1 + 70, ly + 6 - t / 2 + t, c[0], c[1], c[2]);
        image_draw_text(&img, f.x1 + 80, ly, i < n ? labels[i] : all_label, 0, 0, 0, s);
        ly += 12 + 7 * s;
    }
    frame_draw(&img, &f, title, xl, yl, s);
    image_save_png(path, &img);
    image_free(&img);
}

// blues: the colour of v in [0, 1] on the Blues map (linear between its stops).
static void blues(double v, uint8_t out[3]) {
    double x = fmin(fmax(v, 0), 1) * 8;
    int k = x >= 8 ? 7 : (int)x;
    for (int c = 0; c < 3; c++) out[c] = (uint8_t)lround(BLUES[k][c] + (x - k) * (BLUES[k + 1][c] - BLUES[k][c]));
}

// plot_confusion: confusion_matrix.png or confusion_matrix_normalized.png (ConfusionMatrix.plot):
// cm (NC+1, NC+1) as a heat map, rows predicted and columns true, class names then "background"
// on both axes, values written in the cells (below 30 classes; values < 0.005 left blank), a
// colour bar from 0 to the largest value. normalize: each column divided by its sum.
static void plot_confusion(const char *path, const int64_t *cm, int NC, char **names, int normalize) {
    int N = NC + 1, cell = N <= 6 ? 120 : N <= 12 ? 64 : N <= 31 ? 28 : N <= 100 ? 9 : 4, s = 2;
    double *a = xmalloc(sizeof(double) * (size_t)N * N), vmax = 0;
    for (int j = 0; j < N; j++) {
        double col = 0;
        for (int i = 0; i < N; i++) col += (double)cm[(size_t)i * N + j];
        for (int i = 0; i < N; i++) {
            double v = (double)cm[(size_t)i * N + j] / (normalize ? col + 1e-9 : 1);
            a[(size_t)i * N + j] = v < 0.005 ? NAN : v;   // not drawn, as Ultralytics
            if (v >= 0.005) vmax = fmax(vmax, v);
        }
    }
    char lab[160], (*tick)[64] = xmalloc(sizeof *tick * (size_t)N);
    int tw = 0, ts = cell >= 28 ? s : 1;
    for (int i = 0; i < N; i++) {
        if (i == NC) snprintf(tick[i], sizeof tick[i], "background");
        else if (N < 100) snprintf(tick[i], sizeof tick[i], "%.40s", names[i]);
        else snprintf(tick[i], sizeof tick[i], "%d", i);
        tw = (int)fmax(tw, text_w(tick[i], ts));
    }
    int x0 = 60 + tw + 20, y0 = 80, side = N * cell;
    Image img = image_alloc(x0 + side + 160, y0 + side + tw + 90);
    memset(img.px, 255, (size_t)img.w * img.h * 3);
    for (int i = 0; i < N; i++)
        for (int j = 0; j < N; j++) {
            double v = a[(size_t)i * N + j];
            if (isnan(v)) continue;
            uint8_t c[3];
            blues(vmax > 0 ? v / vmax : 0, c);
            int cx = x0 + j * cell, cy = y0 + i * cell;
            image_fill_rect(&img, cx, cy, cx + cell, cy + cell, c[0], c[1], c[2]);
            if (NC >= 30) continue;
            snprintf(lab, sizeof lab, normalize ? "%.2f" : "%.0f", v);
            int dark = 299 * c[0] + 587 * c[1] + 114 * c[2] < 408 * 255, ls = text_w(lab, s) <= cell - 4 ? s : 1;
            image_draw_text(&img, cx + (cell - text_w(lab, ls)) / 2, cy + (cell - 7 * ls) / 2, lab, dark ? 255 : 0,
                            dark ? 255 : 0, dark ? 255 : 0, ls);
        }
    for (int i = 0; i < N && (cell >= 8 || i % (8 / cell + 1) == 0); i++) {
        int mid = i * cell + cell / 2;
        image_draw_text(&img, x0 - 8 - text_w(tick[i], ts), y0 + mid - 7 * ts / 2, tick[i], 0, 0, 0, ts);
        image_draw_text_up(&img, x0 + mid - 7 * ts / 2, y0 + side + 8 + text_w(tick[i], ts), tick[i], 0, 0, 0, ts);
    }
    const char *title = normalize ? "Confusion Matrix Normalized" : "Confusion Matrix";
    image_draw_text(&img, x0 + (side - text_w(title, s)) / 2, 30, title, 0, 0, 0, s);
    image_draw_text(&img, x0 + (side - text_w("True", s)) / 2, y0 + side + tw + 30, "True", 0, 0, 0, s);
    image_draw_text_up(&img, 20, y0 + (side + text_w("Predicted", s)) / 2, "Predicted", 0, 0, 0, s);
    int bx = x0 + side + 30;   // colour bar, 0 at the bottom
    for (int y = 0; y < side; y++) {
        uint8_t c[3];
        blues(1.0 - (double)y / (side - 1 > 0 ? side - 1 : 1), c);
        image_fill_rect(&img, bx, y0 + y, bx + 24, y0 + y + 1, c[0], c[1], c[2]);
    }
    for (int k = 0; k <= 4; k++) {
        snprintf(lab, sizeof lab, normalize || vmax < 10 ? "%.2f" : "%.0f", vmax * k / 4);
        int py = y0 + side - 1 - (int)lround((side - 1) * k / 4.0);
        image_fill_rect(&img, bx + 24, py, bx + 30, py + 1, 0, 0, 0);
        image_draw_text(&img, bx + 34, py - 7 * s / 2, lab, 0, 0, 0, s);
    }
    image_save_png(path, &img);
    image_free(&img);
    free(a);
    free(tick);
}

// eval_plots_save: the confusion matrices and the four curves of what ev holds (a validation
// pass) into dir. names: (NC). Nothing when ev saw no images.
static void eval_plots_save(Evaluator *ev, const char *dir, char **names) {
    int64_t seen = ev->n;
    for (int c = 0; c < ev->NC; c++) seen += ev->n_gt[c];
    if (!seen) return;
    char path[1024];
    for (int normalize = 1; normalize >= 0; normalize--) {
        snprintf(path, sizeof path, "%s/confusion_matrix%s.png", dir, normalize ? "_normalized" : "");
        plot_confusion(path, ev->cm, ev->NC, names, normalize);
    }
    Metrics mt;
    evaluator_compute(ev, &mt);
    int n = mt.n_cls;
    double px[EVAL_NGRID], all[EVAL_NGRID], mean[EVAL_NGRID];
    for (int k = 0; k < EVAL_NGRID; k++) px[k] = k == EVAL_NGRID - 1 ? 1.0 : k * (1.0 / (EVAL_NGRID - 1));
    double *f1 = xmalloc(sizeof(double) * ((size_t)n * EVAL_NGRID + 1));
    char **labels = xmalloc(sizeof(char *) * (size_t)(n + 1)), all_label[96];
    for (int i = 0; i < n; i++) labels[i] = xmalloc(96);
    for (int i = 0; i < n; i++) snprintf(labels[i], 96, "%.40s %.3f", names[mt.curve_cls[i]], mt.ap50[mt.curve_cls[i]]);
    for (int k = 0; k < EVAL_NGRID; k++) {
        all[k] = 0;
        for (int i = 0; i < n; i++) all[k] += mt.curve_pr[(size_t)i * EVAL_NGRID + k] / n;
    }
    snprintf(all_label, sizeof all_label, "all classes %.3f mAP@0.5", mt.map50);
    snprintf(path, sizeof path, "%s/PR_curve.png", dir);
    plot_curves(path, "Precision-Recall Curve", "Recall", "Precision", px, mt.curve_pr, n, labels, all, all_label);
    for (int i = 0; i < n; i++) snprintf(labels[i], 96, "%.40s", names[mt.curve_cls[i]]);
    for (size_t q = 0; q < (size_t)n * EVAL_NGRID; q++) {
        double p = mt.curve_p[q], r = mt.curve_r[q];
        f1[q] = 2 * p * r / (p + r + 1e-16);
    }
    static const char *const file[3] = {"F1", "P", "R"}, *const ylab[3] = {"F1", "Precision", "Recall"};
    for (int m = 0; m < 3; m++) {   // plot_mc_curve: the class mean smoothed (0.05), its peak in the legend
        const double *y = m == 0 ? f1 : m == 1 ? mt.curve_p : mt.curve_r;
        for (int k = 0; k < EVAL_NGRID; k++) {
            mean[k] = 0;
            for (int i = 0; i < n; i++) mean[k] += y[(size_t)i * EVAL_NGRID + k] / n;
        }
        smooth_box(mean, EVAL_NGRID, 0.05, all);
        int best = 0;
        for (int k = 1; k < EVAL_NGRID; k++)
            if (all[k] > all[best]) best = k;
        snprintf(all_label, sizeof all_label, "all classes %.2f at %.3f", all[best], px[best]);
        char title[64];
        snprintf(title, sizeof title, "%s-Confidence Curve", ylab[m]);
        snprintf(path, sizeof path, "%s/%s_curve.png", dir, file[m]);
        plot_curves(path, title, "Confidence", ylab[m], px, y, n, labels, all, all_label);
    }
    for (int i = 0; i < n; i++) free(labels[i]);
    free(labels);
    free(f1);
    metrics_free(&mt);
}

// PlotBox: one box of a batch picture, x1 y1 x2 y2 in the batch's pixels; conf < 0 for a label.
typedef struct { int img, cls; float x1, y1, x2, y2, conf; } PlotBox;

// plot_images: a batch as Ultralytics' plot_images draws it: the first 16 images in a grid of
// ceil(sqrt(16)) columns filled top to bottom, then left to right, scaled so the long side is at
// most 1920, each tile with a white border and its file name; with bx NULL the batch's labels
// (class names), else the boxes bx (n) with score > 0.25 ("name 0.9").
static void plot_images(const char *path, const Batch *bt, const PlotBox *bx, int n, const DataConfig *dc,
                        const Dataset *ds) {
    int bs = bt->B < 16 ? bt->B : 16, ns = (int)ceil(sqrt((double)bs)), H = bt->H, W = bt->W;
    Image mos = image_alloc(ns * W, ns * H), tile = {0};
    memset(mos.px, 255, (size_t)mos.w * mos.h * 3);
    for (int b = 0; b < bs; b++) {
        batch_draw(bt, b, bx ? NULL : dc, &tile);
        for (int k = 0; k < n; k++) {
            if (bx[k].img != b || (bx[k].conf >= 0 && bx[k].conf <= 0.25f)) continue;
            char lab[96];
            snprintf(lab, sizeof lab, "%.40s %.1f", dc->names[bx[k].cls], bx[k].conf);
            image_draw_detection(&tile, (int)bx[k].x1, (int)bx[k].y1, (int)bx[k].x2, (int)bx[k].y2, bx[k].cls, lab, 2);
        }
        uint8_t *dst = mos.px + ((size_t)H * (b % ns) * mos.w + (size_t)W * (b / ns)) * 3;
        for (int y = 0; y < H; y++) memcpy(dst + (size_t)y * mos.w * 3, tile.px + (size_t)y * W * 3, (size_t)W * 3);
    }
    double scale = 1920.0 / ns / fmax(H, W);
    if (scale < 1) {
        H = (int)ceil(scale * H), W = (int)ceil(scale * W);
        Image small = image_alloc(ns * W, ns * H);
        image_resize(mos.px, mos.w, mos.h, small.px, small.w, small.h);
        image_free(&mos);
        mos = small;
    }
    for (int b = 0; b < bs; b++) {
        int x = W * (b / ns), y = H * (b % ns);
        image_draw_box(&mos, x, y, x + W - 1, y + H - 1, 255, 255, 255, 2);
        if (ds && bt->index[b] >= 0 && bt->index[b] < ds->n) {
            const char *p = ds->paths[bt->index[b]], *base = strrchr(p, '/') ? strrchr(p, '/') + 1 : p;
            char nm[48];
            snprintf(nm, sizeof nm, "%.40s", base);
            image_draw_text(&mos, x + 5, y + 5, nm, 220, 220, 220, 1);
        }
    }
    image_save_jpg(path, &mos, 90);
    image_free(&mos);
    image_free(&tile);
}

// plot_train_batch: train_batch0.jpg .. train_batch2.jpg from the first three batches (ni: the
// run's batch count, so a resumed run does not redraw them), labels as the loss sees them.
static void plot_train_batch(const char *dir, long ni, const Batch *bt, const DataConfig *dc, const Dataset *ds) {
    if (ni < 0 || ni >= 3) return;
    char path[1024];
    snprintf(path, sizeof path, "%s/train_batch%ld.jpg", dir, ni);
    plot_images(path, bt, NULL, 0, dc, ds);
}

// ValPics: the predictions of the current validation batch, kept for val_batchI_pred.jpg.
typedef struct { PlotBox *box; int n, cap; } ValPics;

// val_pics_add: image b of validation batch bi (0-based) and its detections (n, score order);
// after the last image of each of the first three batches it writes val_batchI_labels.jpg and
// val_batchI_pred.jpg into dir. Free vp->box when done.
static void val_pics_add(ValPics *vp, const char *dir, int bi, const Batch *bt, int b, const Det *dets, int n,
                         const DataConfig *dc, const Dataset *ds) {
    if (bi >= 3) return;
    if (b == 0) vp->n = 0;
    for (int i = 0; i < n && b < 16; i++) {
        if (dets[i].score <= 0.25f) continue;
        if (vp->n == vp->cap) vp->box = realloc(vp->box, sizeof(PlotBox) * (size_t)(vp->cap = 2 * vp->cap + 64));
        if (!vp->box) die("val pictures: out of host memory");
        vp->box[vp->n++] = (PlotBox){b, dets[i].cls, dets[i].x1, dets[i].y1, dets[i].x2, dets[i].y2, dets[i].score};
    }
    if (b != bt->B - 1) return;
    char path[1024];
    snprintf(path, sizeof path, "%s/val_batch%d_labels.jpg", dir, bi);
    plot_images(path, bt, NULL, 0, dc, ds);
    snprintf(path, sizeof path, "%s/val_batch%d_pred.jpg", dir, bi);
    plot_images(path, bt, vp->box, vp->n, dc, ds);
}

// hist_color: a cell of a 2-D histogram, light to matplotlib's first colour as count -> vmax
// (seaborn's histplot colour map); white for an empty cell.
static void hist_color(double count, double vmax, uint8_t out[3]) {
    double v = count <= 0 ? 0 : fmin(count / vmax, 1) * 0.85 + 0.15;
    const uint8_t lo[3] = {255, 255, 255};
    for (int c = 0; c < 3; c++) out[c] = (uint8_t)lround(lo[c] + v * (TAB10[0][c] - lo[c]));
}

// plot_hist2d: a 50 x 50 histogram of (u, v) pairs in [0, 1]^2 in frame f, the colour saturating
// at the count below which 90% of the boxes lie (histplot's pmax=0.9).
static void plot_hist2d(Image *img, const Frame *f, const float *lab, int n, int iu, int iv) {
    enum { NB = 50 };
    int cnt[NB * NB] = {0}, sorted[NB * NB];
    for (int k = 0; k < n; k++) {
        int a = (int)(lab[5 * k + iu] * NB), b = (int)(lab[5 * k + iv] * NB);
        cnt[(b < 0 ? 0 : b >= NB ? NB - 1 : b) * NB + (a < 0 ? 0 : a >= NB ? NB - 1 : a)]++;
    }
    memcpy(sorted, cnt, sizeof cnt);
    for (int i = 1; i < NB * NB; i++)   // insertion sort, ascending
        for (int j = i; j > 0 && sorted[j - 1] > sorted[j]; j--) {
            int t = sorted[j];
            sorted[j] = sorted[j - 1], sorted[j - 1] = t;
        }
    double acc = 0, vmax = 1;
    for (int i = 0; i < NB * NB; i++)
        if ((acc += sorted[i]) >= 0.9 * n) { vmax = fmax(sorted[i], 1); break; }
    for (int b = 0; b < NB; b++)
        for (int a = 0; a < NB; a++) {
            uint8_t c[3];
            hist_color(cnt[b * NB + a], vmax, c);
            int xa = (int)lround(frame_x(f, (double)a / NB)), xb = (int)lround(frame_x(f, (a + 1.0) / NB));
            int ya = (int)lround(frame_y(f, (b + 1.0) / NB)), yb = (int)lround(frame_y(f, (double)b / NB));
            if (cnt[b * NB + a]) image_fill_rect(img, xa, ya, xb, yb, c[0], c[1], c[2]);
        }
}

// plot_labels: labels.jpg (plot_labels) of a dataset's boxes: instances per class in the class
// colours; the first 500 boxes' shapes drawn about one centre; histograms of box centres (x, y)
// and sizes (width, height), all normalised to the image.
static void plot_labels(const char *dir, const Dataset *ds, const DataConfig *dc) {
    int n = ds->lab_off[ds->n], nc = dc->nc, s = 2, P = 600;
    const float *lab = ds->lab;
    Image img = image_alloc(2 * P, 2 * P);
    memset(img.px, 255, (size_t)img.w * img.h * 3);
    int64_t *cnt = xcalloc((size_t)nc, sizeof(int64_t)), cmax = 1;
    for (int k = 0; k < n; k++)
        if ((int)lab[5 * k] >= 0 && (int)lab[5 * k] < nc) cmax = (int64_t)fmax(cmax, ++cnt[(int)lab[5 * k]]);
    int tw = 0, ns = nc <= 10 ? 2 : 1;   // class names along x, turned, in text scale ns
    for (int c = 0; c < nc && nc < 30; c++) tw = (int)fmax(tw, text_w(dc->names[c], ns));
    Frame f = {110, 30, P - 20, P - 30 - (nc < 30 ? tw + 10 : 30), -0.5, nc - 0.5, 0, cmax * 1.05};
    image_draw_box(&img, f.x0, f.y0, f.x1, f.y1, 0, 0, 0, 1);
    char t[48];
    double mag = pow(10, floor(log10(cmax / 4.0))), step = mag;   // ticks at 1, 2 or 5 x 10^k
    while (step * 4 < cmax) step += step == mag ? mag : step == 2 * mag ? 3 * mag : 5 * mag;
    step = fmax(step, 1);   // whole instances
    for (double v = 0; v <= f.ymax; v += step) {
        int py = (int)lround(frame_y(&f, v));
        snprintf(t, sizeof t, "%.0f", v);
        image_fill_rect(&img, f.x0 - 5, py, f.x0, py + 1, 0, 0, 0);
        image_draw_text(&img, f.x0 - 8 - text_w(t, s), py - 7, t, 0, 0, 0, s);
    }
    image_draw_text_up(&img, 10, (f.y0 + f.y1 + text_w("instances", s)) / 2, "instances", 0, 0, 0, s);
    for (int c = 0; c < nc; c++) {   // bars 0.8 wide, as hist(rwidth=0.8)
        const uint8_t *col = PALETTE[c % PALETTE_N];
        int xa = (int)lround(frame_x(&f, c - 0.4)), xb = (int)lround(frame_x(&f, c + 0.4));
        image_fill_rect(&img, xa, (int)lround(frame_y(&f, (double)cnt[c])), xb, f.y1, col[0], col[1], col[2]);
        int mid = (int)lround(frame_x(&f, c));
        if (nc < 30)
            image_draw_text_up(&img, mid - 7 * ns / 2, f.y1 + 8 + text_w(dc->names[c], ns), dc->names[c], 0, 0, 0, ns);
    }
    if (nc >= 30) image_draw_text(&img, (f.x0 + f.x1 - text_w("classes", s)) / 2, f.y1 + 8, "classes", 0, 0, 0, s);
    for (int k = 0; k < n && k < 500; k++) {   // box shapes, centred, in a square of the panel
        const float *l = lab + 5 * k;
        const uint8_t *col = PALETTE[((int)l[0] % PALETTE_N + PALETTE_N) % PALETTE_N];
        int side = P - 60, ox = P + 30, oy = 30, hw = (int)lround(l[3] / 2 * side), hh = (int)lround(l[4] / 2 * side);
        int cx = ox + side / 2, cy = oy + side / 2;
        image_draw_box(&img, cx - hw, cy - hh, cx + hw, cy + hh, col[0], col[1], col[2], 1);
    }
    for (int q = 0; q < 2; q++) {
        Frame h = {q * P + 110, P + 30, q * P + P - 20, 2 * P - 90, 0, 1, 0, 1};
        plot_hist2d(&img, &h, lab, n, q ? 3 : 1, q ? 4 : 2);
        frame_draw(&img, &h, "", q ? "width" : "x", q ? "height" : "y", s);
    }
    char path[1024];
    snprintf(path, sizeof path, "%s/labels.jpg", dir);
    image_save_jpg(path, &img, 90);
    image_free(&img);
    free(cnt);
}

// ------------------------------------------------------------------------------------------
// GPU training step (compiled with YOLO_CUDA; the kernels are in yolo_kernels.cu)
// ------------------------------------------------------------------------------------------
/*
 * One training step on the device: the graph walk of the model section (walk_step: forward, loss,
 * backward) over the device backend below (gpu_backend), then the optimizer (grad_clip_norm,
 * optim_step, ema_update on the device), and the evaluation forward of validation:
 *   - memory: ONE cudaMalloc, a device Arena laid out offline (arena_layout), sized by a dry
 *     run of the same walk for every shape of the run (gpu_plan_run: the arena's base NULL,
 *     nothing launched; compiled in every build, it is also what `yolo plan` reports);
 *   - numbers: FP32 master weights, gradients, optimizer state, EMA and BN statistics; an FP16
 *     copy of the weights for the convs; FP16 pre-BN outputs z and FP16 materialised inputs; FP16
 *     gradients of activations (each conv's dA, the views' gradients: Exec.gsz; FP32 with amp=0),
 *     FP32 sums rounded once per store; FP32 Detect head maps (B, 64+NC, H_i, W_i) with the bias
 *     added, and their gradients;
 *   - a conv whose input is one conv's output or a channel slice of it (V_CONV, V_SLICE: most convs)
 *     reads that conv's pre-BN z and applies its BN+SiLU in the gather (ConvAct, yolo.h); the other
 *     views (V_ADD, V_CAT, V_UP, V_POOL) are materialised for the whole batch by kernels writing
 *     into channel slices of the conv's input buffer (value_materialize with nb = B);
 *   - loss scaling: torch.cuda.amp.GradScaler (yolo.h); the loss gradient is computed scaled, the
 *     optimizer unscales, checks for inf/NaN (skip + halve) and clips the norm to 10.
 *   - the loss and its assigner run on the device (loss_cuda); the host only gathers each image's
 *     boxes (a few KB) and reads back five sums.
 * DEVIATIONS (GPU step):
 *   - activations, their gradients and the FP16 weight copy carry FP16 rounding (Ultralytics AMP
 *     does too);
 *   - a step the GradScaler skips (inf/NaN gradient) keeps the BN running statistics of its
 *     forward and still updates the EMA (both as Ultralytics); a batch whose loss is not finite has
 *     its running-stat update undone and its accumulation window dropped;
 *   - validation batches are evaluated on the device (EMA weights), their loss and NMS on the host.
 */
#ifdef YOLO_CUDA
#include <cuda_runtime_api.h>

#define GPU_CHECK(x)                                                                                                   \
    do {                                                                                                               \
        cudaError_t e_ = (x);                                                                                          \
        if (e_ != cudaSuccess)                                                                                         \
            die("%s: %s (CUDA_LAUNCH_BLOCKING=1 makes the failing kernel's launch report it; make test-emu runs "      \
                "every kernel on the CPU)",                                                                            \
                #x, cudaGetErrorString(e_));                                                                           \
    } while (0)
#else
// Without CUDA the device schedule below still runs dry: it is how `yolo plan` sizes the device
// arena. Its launches sit behind `if (!dry)` and are never reached; these names keep it linkable.
static void gpu_unreachable(int unused, ...) {
    (void)unused;
    die("internal error: a device launch in a build without CUDA");
}
#define conv_forward_cuda(...) gpu_unreachable(0, __VA_ARGS__)
#define conv_dgrad_cuda(...) gpu_unreachable(0, __VA_ARGS__)
#define conv_dgrad_bn_cuda(...) (gpu_unreachable(0, __VA_ARGS__), 0L)
#define bn_silu_backward_apply_h_cuda(...) gpu_unreachable(0, __VA_ARGS__)
#define conv_w_tapmajor_cuda(...) gpu_unreachable(0, __VA_ARGS__)
#define conv_wgrad_cuda(...) gpu_unreachable(0, __VA_ARGS__)
#define bn_stats_cuda(...) gpu_unreachable(0, __VA_ARGS__)
#define conv_forward_stats_cuda(...) (gpu_unreachable(0, __VA_ARGS__), 0)
#define conv_forward_parts_cuda(...) (gpu_unreachable(0, __VA_ARGS__), 0)
#define bn_stats_finish_cuda(...) gpu_unreachable(0, __VA_ARGS__)
#define bn_silu_forward_f16_cuda(...) gpu_unreachable(0, __VA_ARGS__)
#define bn_silu_sum_f16_cuda(...) gpu_unreachable(0, __VA_ARGS__)
#define bn_silu_sum_f32_cuda(...) gpu_unreachable(0, __VA_ARGS__)
#define bn_silu_backward_cuda(...) gpu_unreachable(0, __VA_ARGS__)
#define bn_silu_backward_h_cuda(...) gpu_unreachable(0, __VA_ARGS__)
#define copy_f16_cuda(...) gpu_unreachable(0, __VA_ARGS__)
#define add_f16_cuda(...) gpu_unreachable(0, __VA_ARGS__)
#define add_f32_cuda(...) gpu_unreachable(0, __VA_ARGS__)
#define add_n_f16_cuda(...) gpu_unreachable(0, __VA_ARGS__)
#define add_n_f32_cuda(...) gpu_unreachable(0, __VA_ARGS__)
#define upsample2_forward_f16_cuda(...) gpu_unreachable(0, __VA_ARGS__)
#define upsample2_backward_cuda(...) gpu_unreachable(0, __VA_ARGS__)
#define upsample2_backward_f16_cuda(...) gpu_unreachable(0, __VA_ARGS__)
#define maxpool5_forward_f16_cuda(...) gpu_unreachable(0, __VA_ARGS__)
#define maxpool5_backward_cuda(...) gpu_unreachable(0, __VA_ARGS__)
#define maxpool5_backward_f16_cuda(...) gpu_unreachable(0, __VA_ARGS__)
#define conv_forward_f32_cuda(...) gpu_unreachable(0, __VA_ARGS__)
#define conv_dgrad_f32_cuda(...) gpu_unreachable(0, __VA_ARGS__)
#define conv_wgrad_f32_cuda(...) gpu_unreachable(0, __VA_ARGS__)
#define bn_stats_f32_cuda(...) gpu_unreachable(0, __VA_ARGS__)
#define bn_silu_forward_f32_cuda(...) gpu_unreachable(0, __VA_ARGS__)
#define bn_silu_backward_f32_cuda(...) gpu_unreachable(0, __VA_ARGS__)
#define copy_f32_cuda(...) gpu_unreachable(0, __VA_ARGS__)
#define upsample2_forward_f32_cuda(...) gpu_unreachable(0, __VA_ARGS__)
#define bn_silu_upsample2_f16_cuda(...) gpu_unreachable(0, __VA_ARGS__)
#define bn_silu_upsample2_f32_cuda(...) gpu_unreachable(0, __VA_ARGS__)
#define maxpool5_forward_f32_cuda(...) gpu_unreachable(0, __VA_ARGS__)
#define cudaMemsetAsync(...) (gpu_unreachable(0, __VA_ARGS__), 0)
#define gpu_put_input(...) gpu_unreachable(0, __VA_ARGS__)
#define u8_to_f16_cuda(...) gpu_unreachable(0, __VA_ARGS__)
#define gpu_loss_run(...) (gpu_unreachable(0, __VA_ARGS__), (LossOut){0})
#define GPU_CHECK(x) (void)(x)
#endif

// Ddp: this process's place in a data-parallel run (one process per GPU, see "data parallel" below).
// world 1: a single process. Set by ddp_launch before training; read by gpu_select, the loader's
// sharding, the optimizer's batch and the data-parallel trainer backend (ddp_trainer_ops).
#ifdef YOLO_NCCL
#include <nccl.h>
#endif
#define DDP_MAX_BUCKETS 256
typedef struct {
    int rank, world, local_rank;   // as torch.distributed's RANK, WORLD_SIZE, LOCAL_RANK
    int dev;                       // this rank's CUDA device
    int ndev, devs[64];            // device= as a list (0,1,2,3)
    double timeout;                // seconds a collective may wait for its peers (YOLO_DDP_TIMEOUT)
    double comm_s;                 // this epoch's time waiting on gradient all-reduces
    size_t comm_bytes;             // device memory the communicator took (cudaMemGetInfo before/after)
#ifdef YOLO_NCCL
    ncclComm_t comm;
    int *ctl;                      // (16) device scratch: flags agreed over the communicator
    // the gradient's buckets (ddp_buckets_open): bucket i is parameters [lo[i], hi[i]), bucket 0 the
    // last ones (the head's, whose backward ends first); left[i]: its convs still in the backward
    cudaStream_t cstream;          // the all-reduces' stream, beside the compute stream
    cudaEvent_t ev, ev_bwd, ev_comm;
    size_t lo[DDP_MAX_BUCKETS], hi[DDP_MAX_BUCKETS];
    int nbucket, nconv[DDP_MAX_BUCKETS], left[DDP_MAX_BUCKETS];
    int next;                      // the next bucket to all-reduce (always in bucket order: the same on every rank)
    int sync;                      // this backward ends an accumulation window: its buckets are all-reduced
    int reduced;                   // the gradients are summed over the ranks (since the last optimizer step)
    int early;                     // buckets of the last all-reducing backward started before its end
#endif
} Ddp;
static Ddp ddp = {.world = 1, .dev = -1, .timeout = 600};

// device_list: device=0,1,2 (or cuda:0,1) into devs; the count. Repeats and bad entries are errors.
static int device_list(const char *device, int *devs, int max) {
    const char *d = strncmp(device, "cuda:", 5) ? device : device + 5;
    int n = 0;
    while (*d) {
        char *end;
        long k = strtol(d, &end, 10);
        if (end == d || k < 0 || (*end && *end != ','))
            die("device=%s: expected cpu, a device index (0), cuda:0 or a list (0,1,2,3)", device);
        for (int i = 0; i < n; i++)
            if (devs[i] == k)
                die("device=%s: device %ld is listed twice (one process per GPU: each device once)", device, k);
        if (n == max) die("device=%s: at most %d devices", device, max);
        devs[n++] = (int)k;
        d = *end ? end + 1 : end;
    }
    return n;
}

// GpuShape: one step the arena must hold: a training step (forward, loss, backward) or an
// evaluation forward, for a batch of B images of H x W
typedef struct { int B, H, W, train; } GpuShape;

typedef struct Gpu {
    Model *m;                 // the host model: graph, shapes, parameter offsets (its arrays are not used here)
    Arena *a;                 // device arena; base NULL in the dry run
    void *stream;             // cudaStream_t, NULL = default stream
    int B, H, W;              // the step's batch and input size (planned)
    size_t plan;              // bytes of the arena: high-water mark of the dry run's layout
    // persistent (G_PARAMS .. G_INPUT)
    float *params, *grads;    // (nparams) FP32 master weights / gradients (scaled by the loss scale)
    int f32;                  // amp=0: activations, dz and the convs' weights in FP32 (no w16)
    int esz;                  // bytes of an activation value: 2 (FP16, AMP) or 4 (amp=0)
    uint16_t *w16;            // (nparams) FP16 copy of params, refreshed after every optimizer step (AMP)
    uint16_t *wt16;           // training with AMP: the weights of the stride-2 3x3 convs again, tap-major
                              // (gpu_wt: for their input gradient), refreshed with w16; NULL if none
    size_t wt_off[MAX_CONVS]; // conv i's weights in wt16, or SIZE_MAX: none
    float *buffers;           // (nbuffers) BN running mean/var
    float *bn_keep;           // (nbuffers) the running stats before the last training forward (gpu_bn_restore)
    float *opt_m, *opt_v;     // (nparams) momentum / Adam moments (opt_v NULL for SGD)
    float *ema_p, *ema_b;     // (nparams), (nbuffers) ModelEMA
    uint8_t *group;           // (nparams) PG_* of each parameter, OPT_NO_GROUP for the frozen DFL weight
    float *partials;          // (2*OPT_NORM_BLOCKS) optim_norm_cuda partial sums
    float *norm;              // (1) the unscaled gradient norm of the last step (inf: skipped)
    void *x;                  // (B, 3, H, W) input: the uint8 batch as uploaded (x8), or in [0, 1] in FP32 (amp=0)
    int x8;                   // x is the uint8 batch (AMP: the stem's kernels read it, ConvDims.x8)
    // the step's state (z, statistics, dA, head maps) is the walk's, in m's Convs and head
    // host side
    float *head_h[3];         // host copies of the head maps (validation's NMS; tests with copy_heads)
    LossGt *gts_h;            // (B, max_boxes) the boxes of each image, gathered for upload
    int *nbox_h;              // (B) boxes per image
    int copy_heads;           // tests: gpu_loss also copies the head maps of a training step to head_h
    long bn_sums_taken;       // BN backwards that ran their second pass alone (gpu_bn_sums), since gpu_open
    // data parallel (ddp_grads_done): called by the backward when conv c's gradients are final, and
    // with c NULL when the step's backward is enqueued (or skipped for a non-finite loss)
    void (*grads_done)(struct Gpu *g, const Conv *c);
    Optimizer opt;            // host: kind, lr, momentum, decay, step count (its m, v unused)
    GradScaler scaler;
    long ema_updates;
    int ema_on;               // gpu_use_ema: params/buffers are swapped with the EMA's
    int eval_only;            // evaluation only (yolo val): no gradients, optimizer state or EMA
    size_t plan_at[G_NGROUPS];// bytes per group live at the plan's high-water mark
    ArenaLayout *lay;         // the arena's layout (replayed step by step), NULL for first-fit
    GpuShape *shapes;         // the planned step shapes (the layout's segments, in order)
    int nshape, seg;          // their count; the current shape's index (-1: not planned)
    size_t mem_total, mem_before, mem_after;   // cudaMemGetInfo: device total; in use before / after the cudaMalloc
} Gpu;


#ifdef YOLO_CUDA   // defined with the runtime calls below
static void gpu_put_input(Gpu *g, uint8_t *x8, const uint8_t *img, long n);
static LossOut gpu_loss_run(Gpu *g, const LossTargets *tg, const LossConfig *lcfg, LossGtD *gts, int *nbox, double *out,
                            void *scratch);
#endif

// gpu_zalloc: arena_alloc plus an async memset to 0 on the device (nothing in a dry run)
static void *gpu_zalloc(Gpu *g, size_t bytes, int group) {
    void *p = arena_alloc(g->a, bytes, group);
    if (!arena_dry(g->a)) GPU_CHECK(cudaMemsetAsync(p, 0, bytes, g->stream));
    return p;
}
#define gf32(g, n, grp) ((float *)arena_alloc((g)->a, (size_t)(n) * 4, (grp)))
#define gzf32(g, n, grp) ((float *)gpu_zalloc((g), (size_t)(n) * 4, (grp)))
#define gf16(g, n, grp) ((uint16_t *)arena_alloc((g)->a, (size_t)(n) * 2, (grp)))
#define gact(g, n, grp) arena_alloc((g)->a, (size_t)(n) * (g)->esz, (grp))   // activation-typed
#define GOFF(g, p, off) ((void *)((char *)(p) + (long)(off) * (g)->esz))    // activation p + off elements

// ---- YOLO_PROFILE=1: where the device's time goes ----
// With YOLO_PROFILE=1 in the environment, each launch of the step is timed between two CUDA events
// (the host waits for each, so the run gets slower, but the shares stay meaningful) and summed by
// kind; gpu_close prints the table, with the convolutions' achieved TFLOP/s. For a first look at
// a GPU (test/gpu_check.sh) and for choosing which kernel to work on next.
#ifdef YOLO_CUDA
typedef struct { char name[32]; double ms, flop; long n; } ProfRow;
static struct { int on; int nrow; ProfRow row[40]; void *ev[2]; } gprof = {.on = -1};
static int prof_on(void) {
    if (gprof.on < 0) {
        const char *e = getenv("YOLO_PROFILE");
        gprof.on = e && *e && strcmp(e, "0") != 0;
        for (int i = 0; i < 2 && gprof.on; i++) GPU_CHECK(cudaEventCreate((cudaEvent_t *)&gprof.ev[i]));
    }
    return gprof.on;
}
static void prof_begin(const Gpu *g);
static void prof_end(const Gpu *g, const char *name, double flop);
// the CPU emulation's counter mode (test/cuda_emu.cpp, make emu-count) names the launches of each
// timed group after its row; absent (NULL) in every real build
extern void emu_count_tag(const char *name, double flop) __attribute__((weak));
extern void emu_count_dims(int cin, int cout) __attribute__((weak));   // the conv's channels, for the group's tag
// prof_end_conv: prof_end for a conv launch: the row "conv fwd 3x3 s2", its multiply-adds x 2
static void prof_end_conv(const Gpu *g, ConvDims d, const char *op) {
    if (gprof.on <= 0) return;   // off, or not yet asked (prof_begin asks)
    int Ho = conv_out(d.H, d.K, d.S), Wo = conv_out(d.W, d.K, d.S);
    char name[32];
    snprintf(name, sizeof name, "conv %s %dx%d s%d", op, d.K, d.K, d.S);
    if (emu_count_dims) emu_count_dims(d.Cin, d.Cout);
    prof_end(g, name, 2.0 * d.B * d.Cout * Ho * Wo * (double)d.Cin * d.K * d.K);
}
// prof_report: the table, most time first (nothing unless YOLO_PROFILE=1 timed something)
static void prof_report(void) {
    if (gprof.on <= 0 || !gprof.nrow) return;
    ProfRow r[40];
    int n = gprof.nrow;
    double tot = 0;
    memcpy(r, gprof.row, n * sizeof(ProfRow));
    for (int i = 0; i < n; i++) tot += r[i].ms;
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && r[j].ms > r[j - 1].ms; j--) { ProfRow t = r[j]; r[j] = r[j - 1]; r[j - 1] = t; }
    fprintf(stderr, "device time by kind of launch (YOLO_PROFILE=1; each launch waited for):\n"
                    "  %-24s %8s %10s %6s %9s %8s\n", "kind", "launches", "total ms", "share", "ms each", "TFLOP/s");
    for (int i = 0; i < n; i++) {
        fprintf(stderr, "  %-24s %8ld %10.1f %5.1f%% %9.3f", r[i].name, r[i].n, r[i].ms, 100 * r[i].ms / tot,
                r[i].ms / r[i].n);
        if (r[i].flop > 0) fprintf(stderr, " %8.3g", r[i].flop / (r[i].ms * 1e-3) / 1e12);
        fputc('\n', stderr);
    }
    fprintf(stderr, "  %-24s %8s %10.1f\n", "total", "", tot);
    gprof.nrow = 0;
}
#else
#define prof_begin(g) ((void)0)
#define prof_end(g, name, flop) ((void)0)
#define prof_end_conv(g, d, op) ((void)0)
#endif

// Launches of the activation-typed ops in the step's precision: FP16 (AMP; the weights' FP16 copy)
// or FP32 (amp=0; the master weights themselves).
static const void *gpu_w(const Gpu *g, const Conv *c) {
    return g->f32 ? (const void *)(g->params + c->w_off) : (const void *)(g->w16 + c->w_off);
}
// gpu_wt_wanted: whether conv c keeps a tap-major FP16 copy of its weights (conv_w_tapmajor_cuda): every
// 3x3 conv whose input channels fill the halo kernel's 8-channel rows (its forward and input gradient
// copy their weights from it; a 3-channel stem takes the stem's kernels or the gather kernel)
static int gpu_wt_wanted(const Conv *c) { return c->k == 3 && c->cin % 8 == 0; }
static const uint16_t *gpu_wt(const Gpu *g, const Conv *c) {
    size_t o = g->wt_off[c - g->m->conv];
    return g->wt16 && o != SIZE_MAX ? g->wt16 + o : NULL;
}
#ifdef YOLO_CUDA   // (its callers, the device setup, EMA swap and optimizer step below, are device-only)
// gpu_wt_refresh: the tap-major FP16 copies (wt16) from w16
static void gpu_wt_refresh(Gpu *g) {
    if (g->f32 || !g->wt16) return;
    Model *m = g->m;
    ConvWtJob jobs[MAX_CONVS];
    int n = 0;
    for (int i = 0; i < m->nconv; i++)
        if (g->wt_off[i] != SIZE_MAX)
            jobs[n++] = (ConvWtJob){g->w16 + m->conv[i].w_off, g->wt16 + g->wt_off[i], m->conv[i].cout, m->conv[i].cin};
    conv_w_tapmajor_cuda(jobs, n, g->stream);
}
// gpu_w16_refresh: the FP16 copies of the weights (w16, wt16) from params (AMP; after a step,
// optim_step_cuda writes w16 itself)
static void gpu_w16_refresh(Gpu *g) {
    if (g->f32) return;
    f32_to_f16_cuda(g->params, g->w16, (long)g->m->nparams, g->stream);
    gpu_wt_refresh(g);
}
#endif
static void k_conv_forward(Gpu *g, ConvDims d, const void *x, const ConvAct *act, const void *w, const uint16_t *wt,
                           const float *bias, float *z32, void *z) {
    prof_begin(g);
    if (g->f32) conv_forward_f32_cuda(d, x, act, w, bias, z32 ? z32 : z, g->stream);
    else conv_forward_cuda(d, x, act, w, wt, bias, z32, z32 ? NULL : z, g->stream);
    prof_end_conv(g, d, "fwd");
}
// k_conv_dgrad: dx (the step's gradient type: FP16 with AMP) = or += the input gradient
static void k_conv_dgrad(Gpu *g, ConvDims d, const void *dz, const void *w, const uint16_t *wt, void *dx, int acc) {
    prof_begin(g);
    if (g->f32) conv_dgrad_f32_cuda(d, dz, w, dx, acc, g->stream);
    else conv_dgrad_cuda(d, dz, w, wt, NULL, dx, acc, g->stream);
    prof_end_conv(g, d, "dgrad");
}
// k_conv_wgrad: dw += the weight gradient, with the workspace of its split (a temporary, < 8 MiB)
static void k_conv_wgrad(Gpu *g, ConvDims d, const void *dz, const void *x, const ConvAct *act, float *dw) {
    size_t wsb = conv_wgrad_ws_bytes(d, g->f32);
    float *ws = wsb ? gf32(g, (long)(wsb / sizeof(float)), G_SCRATCH) : NULL;
    if (!arena_dry(g->a)) {
        prof_begin(g);
        if (g->f32) conv_wgrad_f32_cuda(d, dz, x, act, dw, ws, 1, g->stream);
        else conv_wgrad_cuda(d, dz, x, act, dw, ws, 1, g->stream);
        prof_end_conv(g, d, "wgrad");
    }
    arena_free(g->a, ws);
}
// k_bn_stats: the batch statistics (train) with their chunks' scratch (a temporary), or the running ones
static void k_bn_stats(Gpu *g, const void *z, long zs, int C, int HW, float *mean, float *invstd, float *rm,
                       float *rv) {
    float *scratch = g->m->train ? gf32(g, (long)bn_stats_scratch_floats(g->B, C, HW), G_SCRATCH) : NULL;
    if (!arena_dry(g->a)) {
        prof_begin(g);
        if (g->f32)
            bn_stats_f32_cuda(z, zs, g->B, C, HW, mean, invstd, rm, rv, BN_EPS, BN_MOMENTUM, g->m->train, scratch,
                              g->stream);
        else
            bn_stats_cuda(z, zs, g->B, C, HW, mean, invstd, rm, rv, BN_EPS, BN_MOMENTUM, g->m->train, scratch,
                          g->stream);
        prof_end(g, "bn stats", 0);
    }
    arena_free(g->a, scratch);
}
// k_bn_silu: y = the activation, or y += it (acc: a residual sum, the add kernel's work folded in)
static void k_bn_silu(Gpu *g, const void *z, long zs, const float *mean, const float *invstd, const float *gamma,
                      const float *beta, void *y, long ys, int C, int HW, int acc) {
    prof_begin(g);
    if (g->f32) bn_silu_forward_f32_cuda(z, zs, mean, invstd, gamma, beta, y, ys, g->B, C, HW, acc, g->stream);
    else bn_silu_forward_f16_cuda(z, zs, mean, invstd, gamma, beta, y, ys, g->B, C, HW, acc, g->stream);
    prof_end(g, acc ? "bn+silu forward + add" : "bn+silu forward", 0);
}
// k_bn_silu_backward: dA FP32 (dA16 0: amp=0, or a Detect output's) or FP16 (AMP)
static void k_bn_silu_backward(Gpu *g, const void *z, const void *dA, int dA16, long zs, const float *mean,
                               const float *invstd, const float *gamma, const float *beta, float *dgamma, float *dbeta,
                               void *dz, float *scratch, int C, int HW) {
    prof_begin(g);
    if (g->f32)
        bn_silu_backward_f32_cuda(z, dA, zs, mean, invstd, gamma, beta, dgamma, dbeta, dz, scratch, g->B, C, HW,
                                  g->m->train, g->stream);
    else if (dA16)
        bn_silu_backward_h_cuda(z, dA, zs, mean, invstd, gamma, beta, dgamma, dbeta, dz, scratch, g->B, C, HW,
                                g->m->train, g->stream);
    else
        bn_silu_backward_cuda(z, dA, zs, mean, invstd, gamma, beta, dgamma, dbeta, dz, scratch, g->B, C, HW,
                              g->m->train, g->stream);
    prof_end(g, "bn+silu backward", 0);
}
// k_copy: B blocks of n values of the step's type (activations; gradients, the same type), timed as kind
static void k_copy(Gpu *g, const void *src, long ss, void *dst, long ds, long n, const char *kind) {
    (void)kind;   // (prof_end: nothing without CUDA)
    prof_begin(g);
    if (g->f32) copy_f32_cuda(src, ss, dst, ds, g->B, n, g->stream);
    else copy_f16_cuda(src, ss, dst, ds, g->B, n, g->stream);
    prof_end(g, kind, 0);
}
static void k_add(Gpu *g, const void *src, long ss, void *dst, long ds, long n) {
    prof_begin(g);
    if (g->f32) add_f32_cuda(src, ss, dst, ds, g->B, n, g->stream);
    else add_f16_cuda(src, ss, dst, ds, g->B, n, g->stream);
    prof_end(g, "residual add", 0);
}
static void k_upsample(Gpu *g, const void *x, void *y, long ys, int C, int H, int W) {
    prof_begin(g);
    if (g->f32) upsample2_forward_f32_cuda(x, y, ys, g->B, C, H, W, g->stream);
    else upsample2_forward_f16_cuda(x, y, ys, g->B, C, H, W, g->stream);
    prof_end(g, "upsample", 0);
}
static void k_maxpool(Gpu *g, const void *x, long xs, void *y, long ys, int C, int H, int W) {
    prof_begin(g);
    if (g->f32) maxpool5_forward_f32_cuda(x, xs, y, ys, g->B, C, H, W, g->stream);
    else maxpool5_forward_f16_cuda(x, xs, y, ys, g->B, C, H, W, g->stream);
    prof_end(g, "maxpool", 0);
}

// gpu_conv_dims: the ConvDims of conv c for the whole batch (dense x and z unless strides are set)
static ConvDims gpu_conv_dims(const Gpu *g, const Conv *c, long xs, long zs) {
    return (ConvDims){g->B, c->cin, c->H, c->W, c->cout, c->k, c->s, xs, zs, 0, 0};
}
// gpu_takes_u8: whether conv c reads the uint8 batch itself (ConvDims.x8): the stem's kernels, FP16 z.
// gpu_stem_u8_off (tests): as if they took no conv, so that the batch reaches the stem as it reaches the
// l and x stems (Cout 64, 80): through gpu_input's FP16 copy, into the gather kernel.
static int gpu_stem_u8_off;
static int gpu_takes_u8(const Gpu *g, const Conv *c) {
    return g->x8 && !gpu_stem_u8_off && c->bn && conv_stem_takes_u8(gpu_conv_dims(g, c, 0, (long)c->zstride));
}

// ---- the device backend of the graph walk (gpu_backend): the whole batch per launch ----

// The views: all B images at once (b = 0), in the step's precision.
static void gpu_zero(Exec *e, void *p, size_t bytes) {
    Gpu *g = e->ctx;
    GPU_CHECK(cudaMemsetAsync(p, 0, bytes, g->stream));
}
static void gpu_input(Exec *e, int b, void *out, long os, long n) {
    (void)b;
    Gpu *g = e->ctx;
    if (!g->x8) {
        k_copy(g, e->x, n, out, os, n, "copy");
        return;
    }
    // the uint8 batch as FP16 (u8_to_f16_cuda: the bits the stem's kernels read), image by image where
    // out is strided
    prof_begin(g);
    for (int i = 0; i < (os == n ? 1 : g->B); i++)
        u8_to_f16_cuda((const uint8_t *)e->x + (size_t)i * n, (uint16_t *)out + (size_t)i * os, os == n ? g->B * n : n,
                       g->stream);
    prof_end(g, "input convert", 0);
}
// gpu_act: channels [c0, c0+C) of conv c's activated output, (B, C, Ho, Wo) with image stride os
static void gpu_act(Exec *e, const Conv *c, int c0, int C, int b, void *out, long os, int acc) {
    (void)b;
    Gpu *g = e->ctx;
    int HW = c->Ho * c->Wo;
    if (!c->bn) die("gpu: the output of %s (no BN) is read by a conv", c->name);
    k_bn_silu(g, GOFF(g, c->z, (long)c0 * HW), (long)c->zstride, c->mean + c0, c->invstd + c0,
              e->params + c->g_off + c0, e->params + c->b_off + c0, out, os, C, HW, acc);
}
// conv_act: the ConvAct of BN conv p's channels from c0 (its statistics, NULL where not made yet, and
// its BN parameters), for a kernel that applies p's BN+SiLU as it reads p's z
static ConvAct conv_act(const Exec *e, const Conv *p, int c0) {
    return (ConvAct){p->mean ? p->mean + c0 : NULL, p->invstd ? p->invstd + c0 : NULL, e->params + p->g_off + c0,
                     e->params + p->b_off + c0};
}
// gpu_act_sum: a residual sum of two BN convs' activations, made in one launch
static void gpu_act_sum(Exec *e, const Conv *c1, int c10, const Conv *c2, int c20, int C, int b, void *out,
                        long os) {
    (void)b;
    Gpu *g = e->ctx;
    const Conv *c[2] = {c1, c2};
    int c0[2] = {c10, c20};
    ConvAct a[2];
    const void *z[2];
    for (int i = 0; i < 2; i++) {
        if (!c[i]->bn) die("gpu: the output of %s (no BN) is read by a conv", c[i]->name);
        int k = c0[i];
        z[i] = GOFF(g, c[i]->z, (long)k * c[i]->Ho * c[i]->Wo);
        a[i] = conv_act(e, c[i], k);
    }
    prof_begin(g);
    if (g->f32)
        bn_silu_sum_f32_cuda(z[0], (long)c1->zstride, &a[0], z[1], (long)c2->zstride, &a[1], out, os, g->B, C,
                             c1->Ho * c1->Wo, g->stream);
    else
        bn_silu_sum_f16_cuda(z[0], (long)c1->zstride, &a[0], z[1], (long)c2->zstride, &a[1], out, os, g->B, C,
                             c1->Ho * c1->Wo, g->stream);
    prof_end(g, "bn+silu forward + add", 0);
}
static void gpu_add(Exec *e, const void *t, long ts, void *out, long os, long n) { k_add(e->ctx, t, ts, out, os, n); }
// gpu_act_upsample: the activation upsampled as it is made (no temporary, no separate BN+SiLU launch)
static void gpu_act_upsample(Exec *e, const Conv *c, int c0, int C, void *out, long os) {
    Gpu *g = e->ctx;
    int H = c->Ho, W = c->Wo;
    const void *z = GOFF(g, c->z, (long)c0 * H * W);
    const float *mean = c->mean + c0, *invstd = c->invstd + c0, *gamma = e->params + c->g_off + c0,
                *beta = e->params + c->b_off + c0;
    prof_begin(g);
    if (g->f32)
        bn_silu_upsample2_f32_cuda(z, (long)c->zstride, mean, invstd, gamma, beta, out, os, g->B, C, H, W, g->stream);
    else
        bn_silu_upsample2_f16_cuda(z, (long)c->zstride, mean, invstd, gamma, beta, out, os, g->B, C, H, W, g->stream);
    prof_end(g, "bn+silu + upsample", 0);
}
static void gpu_upsample(Exec *e, const void *x, void *y, long ys, int C, int H, int W) {
    k_upsample(e->ctx, x, y, ys, C, H, W);
}
static void gpu_maxpool(Exec *e, const void *x, long xs, void *y, long ys, int C, int H, int W) {
    k_maxpool(e->ctx, x, xs, y, ys, C, H, W);
}
// the gradients of the views, in the step's gradient type (FP16 with AMP: sums in FP32, rounded once)
static void gpu_grad_add(Exec *e, const float *g, long gs, float *d, long ds, long n) {
    Gpu *gp = e->ctx;
    prof_begin(gp);
    if (gp->f32) add_f32_cuda(g, gs, d, ds, gp->B, n, gp->stream);
    else add_f16_cuda((const uint16_t *)g, gs, (uint16_t *)d, ds, gp->B, n, gp->stream);
    prof_end(gp, "gradient add", 0);
}
// gpu_grad_copy: a value's gradient into channels of a conv's dA that hold none yet (lazy_dA)
static void gpu_grad_copy(Exec *e, const float *g, long gs, float *d, long ds, long n) {
    k_copy(e->ctx, g, gs, d, ds, n, "gradient copy");
}
static void gpu_grad_add_n(Exec *e, const float *g, long gs, AddDst d, long n) {
    Gpu *gp = e->ctx;
    prof_begin(gp);
    if (gp->f32) add_n_f32_cuda(g, gs, d, gp->B, n, gp->stream);
    else add_n_f16_cuda((const uint16_t *)g, gs, d, gp->B, n, gp->stream);
    prof_end(gp, "gradient add", 0);
}
static void gpu_upsample_back(Exec *e, const float *g, long gs, float *gx, int C, int H, int W) {
    Gpu *gp = e->ctx;
    prof_begin(gp);
    if (gp->f32) upsample2_backward_cuda(g, gs, gx, gp->B, C, H, W, gp->stream);
    else upsample2_backward_f16_cuda((const uint16_t *)g, gs, (uint16_t *)gx, gp->B, C, H, W, gp->stream);
    prof_end(gp, "upsample backward", 0);
}
static void gpu_maxpool_back(Exec *e, const void *x, long xs, const float *g, long gs, float *gx, int C, int H,
                             int W) {
    Gpu *gp = e->ctx;
    if (arena_dry(gp->a)) return;
    prof_begin(gp);
    if (gp->f32) maxpool5_backward_cuda(x, xs, g, gs, gx, gp->B, C, H, W, gp->stream);
    else maxpool5_backward_f16_cuda(x, xs, (const uint16_t *)g, gs, (uint16_t *)gx, gp->B, C, H, W, gp->stream);
    prof_end(gp, "maxpool backward", 0);
}

// GpuIn: the input of a conv as its kernels read it: x with image stride xs (0: dense), and act set
// when the kernels apply the producer's BN+SiLU in their gather (ConvAct, yolo.h)
typedef struct { void *x; long xs; ConvAct act; int fused, owned, x8; } GpuIn;

// gpu_conv_input: the input of conv c, (B, Cin, H, W): the input image itself; the pre-BN output
// (or channel slice) of the one conv it comes from, activated in the conv's gather (nothing
// allocated); or a scratch buffer materialised from the conv's input value (an add, a concat, an
// upsample or max-pool: gpu_input_free frees it).
static GpuIn gpu_conv_input(Exec *e, const Conv *c) {
    Gpu *g = e->ctx;
    const Model *m = e->m;
    const Value *v = &m->val[c->in];
    GpuIn in = {(void *)e->x, 0, {0}, 0, 0, 0};
    // the batch itself: as uploaded (uint8) where the conv takes that, else FP16 (AMP) or FP32 as made
    // by gpu_input below
    if (v->kind == V_INPUT && (!g->x8 || gpu_takes_u8(g, c))) {
        in.x8 = g->x8;
        return in;
    }
    if ((v->kind == V_CONV || v->kind == V_SLICE) && m->conv[v->conv].bn) {
        const Conv *p = &m->conv[v->conv];
        int c0 = v->kind == V_SLICE ? v->c0 : 0;
        in.x = p->z ? GOFF(g, p->z, (long)c0 * v->H * v->W) : NULL;
        in.xs = (long)p->zstride;
        in.act = conv_act(e, p, c0);
        in.fused = 1;
        return in;
    }
    long n = (long)c->cin * c->H * c->W;
    in.x = gact(g, g->B * n, G_SCRATCH);
    in.owned = 1;
    value_materialize(e, c->in, 0, in.x, n);
    return in;
}
static void gpu_input_free(Gpu *g, GpuIn *in) { if (in->owned) arena_free(g->a, in->x); }
// GpuParts: a 1x1 conv's input, a concatenation, as conv_forward_parts_cuda reads it in place (ConvParts),
// and the scratch buffers it owns (the runs of parts other than a BN conv's output, materialised)
typedef struct {
    ConvParts p;
    void *own[CONV_PARTS_MAX];
    int nown;
} GpuParts;
// gpu_fwd_parts: whether BN conv c's forward reads its input, a concatenation, part by part (into *gp:
// conv_forward_parts_cuda), not from the concatenation materialised into a scratch buffer: AMP, a 1x1
// stride-1 conv, maps of a multiple of 8 pixels, runs of multiples of 32 channels (the last of 16), at most
// CONV_PARTS_MAX of them, no max-pool among the parts. Each run of one BN conv's channels (cat_act_run: a C2f's two
// halves of cv1, a Bottleneck's cv2) is then read as that conv's z, its BN+SiLU applied in the gather: the
// pass that read z and wrote the values, and the conv's read of those, are saved (4 bytes a value for 2).
// Each run of other parts (residual sums, upsamples) is materialised as before, into a buffer of its own
// channels. (SPPF's max-pools are taken from the activation they follow, written into the concatenation:
// read in place, that activation would be made twice.) The same answer in the dry run and the step.
static int cat_act_run(const Model *m, const Value *v, int i, const Conv **p, int *c0, int *C);
static int cat_other_run(const Model *m, const Value *v, int i, int *C);
static int gpu_fwd_parts(Exec *e, const Conv *c, GpuParts *gp) {
    Gpu *g = e->ctx;
    const Model *m = e->m;
    const Value *in = &m->val[c->in];
    long HW = (long)c->H * c->W;
    if (g->f32 || !c->bn || c->k != 1 || c->s != 1 || in->kind != V_CAT || HW % 8 || c->cin > CONV_PARTS_MAX_CIN ||
        c->w_off % 8)   // (the weights' rows copied 16 bytes at a time)
        return 0;
    const Conv *p;
    int c0, C, n = 0, bn_runs = 0;
    for (int i = 0; i < in->n; n++) {   // the runs: none a pool; BN ones 16-byte aligned (the same offsets in
        int j = cat_act_run(m, in, i, &p, &c0, &C);   // the dry run); 32 channels a multiple, 16 the last
        if (j > i) {
            if (p->zstride % 8 || (uintptr_t)GOFF(g, p->z, (long)c0 * HW) % 16) return 0;
            bn_runs++;
        } else {
            j = cat_other_run(m, in, i, &C);
            for (int k = i; k < j; k++)
                if (m->val[in->src[k]].kind == V_POOL) return 0;
        }
        if (C % (j < in->n ? 32 : 16)) return 0;
        i = j;
    }
    if (n > CONV_PARTS_MAX || !bn_runs) return 0;   // (no BN run: nothing saved)
    memset(gp, 0, sizeof *gp);
    for (int i = 0; i < in->n;) {
        int j = cat_act_run(m, in, i, &p, &c0, &C), k = gp->p.n++;
        if (j > i) {
            gp->p.x[k] = p->z ? (const uint16_t *)GOFF(g, p->z, (long)c0 * HW) : NULL;
            gp->p.xs[k] = (long)p->zstride;
            gp->p.act[k] = 1;
            gp->p.acts[k] = conv_act(e, p, c0);
        } else {
            j = cat_other_run(m, in, i, &C);
            void *t = gact(g, g->B * C * HW, G_SCRATCH);   // (B, C, H, W): these parts
            cat_materialize(e, in, 0, i, j, t, C * HW);
            gp->own[gp->nown++] = t;
            gp->p.x[k] = (const uint16_t *)t;
            gp->p.xs[k] = C * HW;
        }
        gp->p.C[k] = C;
        i = j;
    }
    return 1;
}
static void gpu_parts_free(Gpu *g, GpuParts *gp) {
    while (gp->nown > 0) arena_free(g->a, gp->own[--gp->nown]);
}

// gpu_conv: z = conv(input) on tensor cores. Detect output convs write FP32 with their bias into
// their channels of the head map (c->z points there).
static void gpu_conv(Exec *e, Conv *c) {
    Gpu *g = e->ctx;
    GpuParts parts;
    if (gpu_fwd_parts(e, c, &parts)) {   // (a BN conv: no bias, z FP16)
        if (!arena_dry(g->a)) {
            ConvDims d = gpu_conv_dims(g, c, 0, (long)c->zstride);
            prof_begin(g);
            (void)conv_forward_parts_cuda(d, &parts.p, gpu_w(g, c), (uint16_t *)c->z, NULL, g->stream);
            prof_end_conv(g, d, "fwd");
        }
        gpu_parts_free(g, &parts);
        return;
    }
    GpuIn in = gpu_conv_input(e, c);
    if (!arena_dry(g->a)) {
        const void *w = gpu_w(g, c);                                    // (Cout, Cin, K, K)
        ConvDims d = gpu_conv_dims(g, c, in.xs, (long)c->zstride);
        d.x8 = in.x8;
        const ConvAct *act = in.fused ? &in.act : NULL;
        if (c->bn) k_conv_forward(g, d, in.x, act, w, gpu_wt(g, c), NULL, NULL, c->z);
        else k_conv_forward(g, d, in.x, act, w, gpu_wt(g, c), e->params + c->b_off, c->z, NULL);
    }
    gpu_input_free(g, &in);
}
static void gpu_bn_stats(Exec *e, Conv *c) {
    float *rm = e->buffers + c->rs_off;
    k_bn_stats(e->ctx, c->z, (long)c->zstride, c->cout, c->Ho * c->Wo, c->mean, c->invstd, rm, rm + c->cout);
}
// gpu_conv_stats: a BN conv's z and its batch statistics. Training with AMP: from the conv's epilogue
// (its tiles' partial statistics, a temporary), so z is not read again; else gpu_conv, then gpu_bn_stats.
static void gpu_conv_stats(Exec *e, Conv *c) {
    Gpu *g = e->ctx;
    if (g->f32 || !e->m->train) {
        gpu_conv(e, c);
        gpu_bn_stats(e, c);
        return;
    }
    GpuParts parts;
    const int by_parts = gpu_fwd_parts(e, c, &parts);
    GpuIn in = {0};
    if (!by_parts) in = gpu_conv_input(e, c);
    ConvDims d = gpu_conv_dims(g, c, in.xs, (long)c->zstride);
    d.x8 = in.x8;
    float *part = gf32(g, (long)conv_stats_floats(d), G_SCRATCH);
    if (!arena_dry(g->a)) {
        float *rm = e->buffers + c->rs_off;
        prof_begin(g);
        int K = by_parts ? conv_forward_parts_cuda(d, &parts.p, gpu_w(g, c), (uint16_t *)c->z, part, g->stream)
                         : conv_forward_stats_cuda(d, in.x, in.fused ? &in.act : NULL, gpu_w(g, c), gpu_wt(g, c),
                                                   (uint16_t *)c->z, part, g->stream);
        prof_end_conv(g, d, "fwd");
        prof_begin(g);
        bn_stats_finish_cuda(part, K, c->cout, c->mean, c->invstd, rm, rm + c->cout, BN_EPS, BN_MOMENTUM, g->stream);
        prof_end(g, "bn stats", 0);
    }
    arena_free(g->a, part);
    if (by_parts) gpu_parts_free(g, &parts);
    else gpu_input_free(g, &in);
}
// gpu_bn_backward: BN+SiLU backward (dgamma, dbeta or the Detect bias) into dz, in the step's
// precision: in place of dA, which is of that type and stride and read by no one after (each value
// read by the thread that writes its dz), but for the Detect outputs, whose dA is FP32 in the loss maps
static void *gpu_bn_backward(Exec *e, Conv *c) {
    Gpu *g = e->ctx;
    int HWo = c->Ho * c->Wo;
    long zs = (long)c->zstride;
    void *dz = c->level < 0 ? (void *)c->dA : gact(g, g->B * zs, G_BACKWARD);   // (B, Cout, Ho, Wo), stride zs
    float *scratch = gf32(g, (long)bn_scratch_floats(g->B, c->cout, HWo), G_SCRATCH);
    if (!arena_dry(g->a) && c->bsum_k > 0) {   // the first pass's sums came with dA (gpu_bn_sums)
        g->bn_sums_taken++;
        prof_begin(g);
        bn_silu_backward_apply_h_cuda((const uint16_t *)c->z, (const uint16_t *)c->dA, zs, c->mean, c->invstd,
                                      e->params + c->g_off, e->params + c->b_off, e->grads + c->g_off,
                                      e->grads + c->b_off, dz, c->bsum, c->bsum_k, g->B, c->cout, HWo, g->m->train,
                                      g->stream);
        prof_end(g, "bn+silu backward", 0);
    } else if (!arena_dry(g->a))
        k_bn_silu_backward(g, c->bn ? c->z : NULL, c->dA, c->level < 0, zs, c->mean, c->bn ? c->invstd : NULL,
                           c->bn ? e->params + c->g_off : NULL, e->params + c->b_off,
                           c->bn ? e->grads + c->g_off : NULL, e->grads + c->b_off, dz, scratch, c->cout, HWo);
    arena_free(g->a, scratch);
    arena_free(g->a, c->bsum);
    c->bsum = NULL;
    c->bsum_k = 0;
    return dz;
}
// cat_act_run: the parts [i, j) of concatenation v that are one run of a BN conv's output channels (a
// conv output, or slices of one whose channels follow on), the longest from part i: j, and in *p, *c0
// and *C the conv, its first channel and the run's channels; i itself when part i is not such a value
static int cat_act_run(const Model *m, const Value *v, int i, const Conv **p, int *c0, int *C) {
    const Value *s = &m->val[v->src[i]];
    if ((s->kind != V_CONV && s->kind != V_SLICE) || !m->conv[s->conv].bn) return i;
    *p = &m->conv[s->conv];
    *c0 = s->kind == V_SLICE ? s->c0 : 0;
    return slice_run_end(m, v, i, v->n, C);
}
// cat_other_run: the end of the run of parts from part i of concatenation v that are not a BN conv's
// channels (those cat_act_run leaves where they are: residual sums, pools, upsamples), and in *C their
// channels; i itself when part i is a BN conv's
static int cat_other_run(const Model *m, const Value *v, int i, int *C) {
    const Conv *q;
    int q0, qC, j = i;
    for (*C = 0; j < v->n && cat_act_run(m, v, j, &q, &q0, &qC) == j; j++) *C += m->val[v->src[j]].C;
    return j;
}
// gpu_wgrad_cat: the weight gradient of a 1x1 FP16 conv whose input is a concatenation, part by part
// (0: not such a conv, nothing done). The 1x1 conv's weight columns of a part are the product of dz
// and that part alone, so each run of one BN conv's channels (cat_act_run: a C2f's two halves of cv1,
// a Bottleneck's output) is read as the conv's pre-BN z with its BN+SiLU applied in the gather
// (ConvAct), and each run of other parts (residual sums, max-pools, upsamples) is materialised into a
// scratch buffer of its own channels; every product writes its columns of dW (wstride). The whole
// concatenation was materialised for the wgrad alone (it is not kept from the forward): its BN parts
// were read, written and read again where now they are read once, 4 bytes a value fewer in FP16, but
// each product reads all of dz, 2 bytes a value of dz for each product past the first. So it is done
// where the first is more: twice the BN runs' channels more than the products past the first times
// the conv's output channels (a C2f's cv2 and the neck's cv1s; SPPF's cv2, one BN run of 128
// channels and three max-pools, 256 output channels at yolov8n, would read as many bytes as it saves).
static int gpu_wgrad_cat(Exec *e, Conv *c, void *dz) {
    Gpu *g = e->ctx;
    const Model *m = e->m;
    const Value *in = &m->val[c->in];
    if (g->f32 || c->k != 1 || c->s != 1 || in->kind != V_CAT) return 0;
    const Conv *p;
    int c0, C, act_ch = 0, runs = 0;
    for (int i = 0; i < in->n; runs++) {   // the BN runs' channels, and the runs of either kind
        int j = cat_act_run(m, in, i, &p, &c0, &C);
        if (j > i) {
            act_ch += C;
            i = j;
        } else
            i = cat_other_run(m, in, i, &C);
    }
    if (2L * act_ch <= (long)(runs - 1) * c->cout) return 0;
    long HW = (long)c->H * c->W, zs = (long)c->zstride;
    for (int i = 0, off = 0; i < in->n;) {
        int j = cat_act_run(m, in, i, &p, &c0, &C);
        ConvDims d;
        if (j > i) {
            ConvAct act = conv_act(e, p, c0);
            d = gpu_conv_dims(g, c, (long)p->zstride, zs);
            d.Cin = C;
            d.wstride = c->cin;
            k_conv_wgrad(g, d, dz, p->z ? GOFF(g, p->z, (long)c0 * HW) : NULL, &act, e->grads + c->w_off + off);
        } else {
            j = cat_other_run(m, in, i, &C);
            void *t = gact(g, g->B * C * HW, G_SCRATCH);   // (B, C, H, W): these parts
            cat_materialize(e, in, 0, i, j, t, C * HW);
            d = gpu_conv_dims(g, c, 0, zs);
            d.Cin = C;
            d.wstride = c->cin;
            k_conv_wgrad(g, d, dz, t, NULL, e->grads + c->w_off + off);
            arena_free(g->a, t);
        }
        off += C;
        i = j;
    }
    return 1;
}
// gpu_bn_sums: whether conv c's input gradient, into BN conv p's dA, comes with the sums of p's BN
// backward (conv_dgrad_bn_cuda; gpu_bn_backward then runs only its second pass): training with AMP, c
// reads p's whole output and no other value reads it (so c's is the only gradient that reaches p's dA,
// written in one launch), p's z is there (recompute=1: p in c's recompute block, or its output), and
// p's BN backward would otherwise read dA and z twice: a channel of more than gpu_bn_sums_min values
// (bn_silu_backward_h_cuda does one in a single pass up to 32768; below that the sums would cost a read
// of z where they save none). The same answer in the dry run and the step, so both allocate the sums.
static long gpu_bn_sums_min = 32768;   // (tests lower it to take the sums on small maps)
static int gpu_bn_sums(const Exec *e, const Conv *c, const Conv *p) {
    const Gpu *g = e->ctx;
    const Model *m = e->m;
    const Value *in = &m->val[c->in];
    if (g->f32 || !m->train || !p->bn || p->level >= 0 || !p->z || in->kind != V_CONV || c->cin != p->cout ||
        (long)g->B * p->Ho * p->Wo <= gpu_bn_sums_min)
        return 0;
    int readers = 0;
    for (int j = 0; j < m->nconv; j++) readers += m->conv[j].in == c->in;
    for (int v = 0; v < m->nvalue; v++) {
        const Value *u = &m->val[v];
        if (u->kind == V_SLICE && u->conv == in->conv) return 0;
        if (u->kind >= V_ADD)
            for (int i = 0; i < u->n; i++) readers += u->src[i] == c->in;
    }
    return readers == 1;
}
// gpu_conv_grads: the weight gradient (accumulated) and the input gradient: straight into the
// producer's dA when the input is a conv output or a slice of one (written if it is the first
// gradient to reach those channels, dA_held, else added), else through a scratch buffer and
// value_backprop.
static void gpu_conv_grads(Exec *e, Conv *c, void *dz) {
    Gpu *g = e->ctx;
    Model *m = e->m;
    int dry = arena_dry(g->a);
    long zs = (long)c->zstride;
    if (!gpu_wgrad_cat(e, c, dz)) {
        GpuIn xin = gpu_conv_input(e, c);
        ConvDims dw = gpu_conv_dims(g, c, xin.xs, zs);
        dw.x8 = xin.x8;
        k_conv_wgrad(g, dw, dz, xin.x, xin.fused ? &xin.act : NULL, e->grads + c->w_off);
        gpu_input_free(g, &xin);
    }
    if (g->grads_done && !dry) g->grads_done(g, c);   // its all-reduce may start while dgrad runs
    const Value *in = &m->val[c->in];
    const void *w = gpu_w(g, c);
    if (in->kind == V_CONV || in->kind == V_SLICE) {
        Conv *p = &m->conv[in->conv];
        int c0 = in->kind == V_SLICE ? in->c0 : 0;
        float *d = grad_at(e, walk_dA(e, p), (long)c0 * c->H * c->W);
        ConvDims dd = gpu_conv_dims(g, c, (long)p->zstride, zs);
        if (gpu_bn_sums(e, c, p)) {   // the only gradient p's dA gets: its BN backward's sums beside it
            long kmax = conv_dgrad_bn_tiles(dd);
            p->bsum = gf32(g, 2 * (long)p->cout * (kmax + 1), G_BACKWARD);   // (+ 1: the channels' sums)
            p->bsum_k = 0;
            if (!dry && !dA_held(e, p, 0, 0, p->cout)) {
                ConvAct bn = conv_act(e, p, 0);
                prof_begin(g);
                p->bsum_k = conv_dgrad_bn_cuda(dd, dz, w, gpu_wt(g, c), (uint16_t *)d, (const uint16_t *)p->z, &bn,
                                               p->bsum, kmax, g->stream);
                prof_end_conv(g, dd, "dgrad");
            } else if (!dry)   // (a gradient there already: not the only one after all; the two passes)
                k_conv_dgrad(g, dd, dz, w, gpu_wt(g, c), d, 1);
        } else if (!dry)   // written where no gradient reached those channels yet (lazy_dA), else added
            k_conv_dgrad(g, dd, dz, w, gpu_wt(g, c), d, dA_held(e, p, 0, c0, c->cin));
    } else if (in->kind == V_CAT) {
        // per source of the concat: its input gradient from its columns of the weights, read in place
        // (the rows of the conv's Cin*K*K: wstride), straight into the producer's dA when it is a
        // conv output or a slice of one, else through a scratch buffer of its own channels only. A
        // chain of pools (SPPF's, cat_pool_chain: x = part kc, its pools the parts after it): the pools'
        // gradients in one launch into one buffer, carried down the chain once (cat_chain_backprop)
        // into x, whose own part's gradient reaches it as any part's
        long KK = (long)c->k * c->k, off = 0;
        int kc = cat_chain_start(e, in);
        for (int i = 0; i < in->n; i++) {
            const Value *v = &m->val[in->src[i]];
            const void *ws = NULL;   // (Cout, C_i of Cin, K, K): w from column off
            if (!dry && g->f32) ws = (const float *)w + off * KK;
            else if (!dry) ws = (const uint16_t *)w + off * KK;
            ConvDims d = gpu_conv_dims(g, c, 0, zs);
            d.Cin = v->C;
            d.wstride = (long)c->cin * KK;
            if (i == kc + 1) {   // the pools of the chain, parts i..n-1, (B, their channels, H, W)
                d.Cin = c->cin - (int)off;
                long n = (long)d.Cin * c->H * c->W;
                float *gx = walk_grad(e, g->B * n, G_SCRATCH);
                if (!dry) k_conv_dgrad(g, d, dz, ws, NULL, gx, 0);
                cat_chain_backprop(e, in, 0, kc, gx, n, NULL);
                arena_free(g->a, gx);
                break;
            }
            if (v->kind == V_CONV || v->kind == V_SLICE) {
                Conv *p = &m->conv[v->conv];
                int c0 = v->kind == V_SLICE ? v->c0 : 0;
                float *dst = grad_at(e, walk_dA(e, p), (long)c0 * c->H * c->W);
                d.xs = (long)p->zstride;
                if (!dry) k_conv_dgrad(g, d, dz, ws, NULL, dst, dA_held(e, p, 0, c0, v->C));
            } else {
                long n = (long)v->C * c->H * c->W;
                float *gx = walk_grad(e, g->B * n, G_SCRATCH);         // (B, C_i, H, W)
                if (!dry) k_conv_dgrad(g, d, dz, ws, NULL, gx, 0);
                value_backprop(e, in->src[i], 0, gx, n);
                arena_free(g->a, gx);
            }
            off += v->C;
        }
    } else if (in->kind != V_INPUT) {
        long n = (long)c->cin * c->H * c->W;
        float *gx = walk_grad(e, g->B * n, G_SCRATCH);          // (B, Cin, H, W)
        if (!dry) k_conv_dgrad(g, gpu_conv_dims(g, c, 0, zs), dz, w, gpu_wt(g, c), gx, 0);
        value_backprop(e, c->in, 0, gx, n);
        arena_free(g->a, gx);
    }
}

// gpu_loss: the loss of the head maps on the device (loss_cuda, the twin of loss_forward_backward)
// and, in training, its gradient times the loss scale into m->dhead (walk_head_grad). The boxes are
// gathered per image on the host (loss_gather_gts, max_boxes cap) and uploaded; the assigner's
// scratch is a temporary of the arena.
_Static_assert(sizeof(LossGtD) == sizeof(LossGt), "yolo.h's LossGtD is yolo.c's LossGt");
static LossOut gpu_loss(Exec *e, const LossTargets *tg, const LossConfig *lcfg) {
    Gpu *g = e->ctx;
    LossOut lo = {0};
    int B = g->B, M = lcfg->max_boxes, A = loss_num_anchors(g->H, g->W);
    LossGtD *gts = (LossGtD *)arena_alloc(g->a, (size_t)B * M * sizeof(LossGtD), G_LOSS);   // (B, M)
    int *nbox = (int *)arena_alloc(g->a, (size_t)B * sizeof(int), G_LOSS);                 // (B)
    double *out = (double *)arena_alloc(g->a, 5 * sizeof(double), G_LOSS);
    void *scratch = arena_alloc(g->a, loss_cuda_scratch_bytes(B, A, M), G_LOSS);
    if (!arena_dry(g->a) && tg) lo = gpu_loss_run(g, tg, lcfg, gts, nbox, out, scratch);
    arena_free(g->a, scratch);
    arena_free(g->a, out);
    arena_free(g->a, nbox);
    arena_free(g->a, gts);
    return lo;
}

// gpu_backend: the device's implementation of the walk's computations (the CPU's: cpu_backend)
static const Backend gpu_backend = {
    .zero = gpu_zero, .input = gpu_input, .act = gpu_act, .act_sum = gpu_act_sum, .add = gpu_add,
    .upsample = gpu_upsample,
    .act_upsample = gpu_act_upsample,
    .maxpool = gpu_maxpool, .grad_add = gpu_grad_add, .grad_copy = gpu_grad_copy, .grad_add_n = gpu_grad_add_n,
    .upsample_back = gpu_upsample_back,
    .maxpool_back = gpu_maxpool_back,
    .conv = gpu_conv, .bn_stats = gpu_bn_stats, .conv_stats = gpu_conv_stats, .bn_backward = gpu_bn_backward,
    .conv_grads = gpu_conv_grads,
    .loss = gpu_loss, .lazy_dA = 1,
};

// exec_gpu: a walk on the device, with the weights in use now (the EMA's during validation)
static Exec exec_gpu(Gpu *g) {
    return (Exec){&gpu_backend, g->m, g->a, g->params, g->grads, g->buffers, g->x, g->B, g->esz, g, 0, g->esz};
}

// gpu_shape: makes s the current step shape (the model's spatial sizes included)
static void gpu_shape(Gpu *g, const GpuShape *s) {
    g->B = s->B, g->H = s->H, g->W = s->W;
    g->seg = -1;
    for (int i = 0; i < g->nshape && g->seg < 0; i++)
        if (!memcmp(&g->shapes[i], s, sizeof *s)) g->seg = i;
    g->m->B = s->B;
    g->m->train = s->train;
    g->m->infer = !s->train;
    model_shape(g->m, s->H, s->W);
    model_liveness(g->m);
}

#ifdef YOLO_CUDA
// gpu_pin_loader: the loader's two batch buffers page-locked (cudaHostRegister) while a device trains or
// validates from them (on = 1; on = 0 undoes it), so that a step's upload is one DMA at the bus's speed.
// From pageable memory the driver copies through staging buffers of its own while the host waits: on an
// H200 machine a yolov8n 640 batch-16 step took 14.40 ms with the batch pageable and 13.66 ms
// page-locked (test/bin/gpu/gpu_bench). Where the system refuses to lock the memory (a ulimit), the
// uploads stay pageable: slower, the same bits. The loader refills a slot only after the step that read
// it has synchronised (the loss's read-back follows the upload on the stream), so the DMA never races a
// refill. Unpinning unregisters both slots whatever fails, so that loader_close never frees memory that
// is still registered.
static void gpu_pin_loader(Loader *L, int on) {
    if (!L || L->pinned == on) return;
    if (!on) {
        for (int s = 0; s < 2; s++)
            if (cudaHostUnregister(L->slot[s].img) != cudaSuccess) (void)cudaGetLastError();
        L->pinned = 0;
        return;
    }
    for (int s = 0; s < 2; s++) {
        cudaError_t e = cudaHostRegister(L->slot[s].img, L->img_bytes, cudaHostRegisterDefault);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();   // not sticky: clear it
            fprintf(stderr, "note: the batch buffers could not be page-locked (%s); uploads stay pageable\n",
                    cudaGetErrorString(e));
            if (s) (void)cudaHostUnregister(L->slot[0].img), (void)cudaGetLastError();
            return;
        }
    }
    L->pinned = 1;
}
#endif

// gpu_input_begin / gpu_input_end: the input of one step, (B, 3, H, W) at the current shape, which
// lives until gpu_input_end after the step. With AMP it is the uint8 batch img as uploaded (g->x8: the
// stem's kernels read it, and whatever else reads the batch gets an FP16 copy from gpu_input), 1 byte a
// value where an FP16 copy took 2 for the whole step; with amp=0 the batch is uploaded into a temporary
// and converted into g->x (FP32 in [0, 1]). The dry run (img NULL) makes the same allocations.
static void gpu_input_begin(Gpu *g, const uint8_t *img) {
    long n = (long)g->B * 3 * g->H * g->W;
    arena_step_begin(g->a, g->seg);
    g->x8 = !g->f32;
    if (g->x8) {
        g->x = arena_alloc(g->a, n, G_INPUT);
        if (!arena_dry(g->a)) gpu_put_input(g, g->x, img, n);
        return;
    }
    uint8_t *x8 = (uint8_t *)arena_alloc(g->a, n, G_INPUT);
    g->x = gact(g, n, G_INPUT);
    if (!arena_dry(g->a)) gpu_put_input(g, x8, img, n);
    arena_free(g->a, x8);   // the conversion has it first: what is allocated next comes after it on the stream
}
static void gpu_input_end(Gpu *g) {
    arena_free(g->a, g->x);
    g->x = NULL;
    arena_step_end(g->a);
}

// gpu_alloc: the persistent groups, in a fixed order (the same in the plan and the run)
static void gpu_alloc(Gpu *g) {
    Model *m = g->m;
    long n = (long)m->nparams;
    g->params = gf32(g, n, G_PARAMS);
    g->w16 = g->f32 ? NULL : gf16(g, n, G_PARAMS);
    size_t nt = 0;
    for (int i = 0; i < m->nconv; i++) {
        const Conv *c = &m->conv[i];
        g->wt_off[i] = !g->f32 && gpu_wt_wanted(c) ? nt : SIZE_MAX;
        if (g->wt_off[i] != SIZE_MAX) nt += ((size_t)c->cout * c->cin * 9 + 7) & ~(size_t)7;   // 16-byte aligned
    }
    g->wt16 = nt ? gf16(g, (long)nt, G_PARAMS) : NULL;
    if (g->eval_only) {
        g->buffers = gf32(g, m->nbuffers, G_BUFFERS);
        return;
    }
    g->grads = gzf32(g, n, G_GRADS);
    g->buffers = gf32(g, m->nbuffers, G_BUFFERS);
    g->bn_keep = gf32(g, m->nbuffers, G_BUFFERS);
    g->opt_m = gzf32(g, n, G_OPTIM);
    g->opt_v = g->opt.kind == OPT_ADAMW ? gzf32(g, n, G_OPTIM) : NULL;
    g->ema_p = gf32(g, n, G_EMA);
    g->ema_b = gf32(g, m->nbuffers, G_EMA);
    g->group = (uint8_t *)arena_alloc(g->a, n, G_OPTIM);
    g->partials = gf32(g, 2 * OPT_NORM_BLOCKS + 1, G_OPTIM);
    g->norm = g->partials + 2 * OPT_NORM_BLOCKS;
}

// gpu_plan_run: the device arena for the given step shapes (train and/or eval), by a dry run of the
// persistent groups (eval_only: the weights and running stats only) and of each shape's schedule in
// turn (its input included), laid out by arena_layout: the total (the layout's size), each group's
// bytes when the most were live, and the layout (p.lay, the caller's to free). The plan gpu_open
// allocates, and `yolo plan`'s.
static Plan gpu_plan_run(Model *m, int opt_kind, int amp, int eval_only, int nshape, const GpuShape *shape,
                         const LossConfig *lcfg) {
    Gpu *g = xcalloc(1, sizeof(Gpu));
    g->m = m;
    g->opt.kind = opt_kind;
    g->f32 = !amp;
    g->esz = amp ? 2 : 4;
    g->eval_only = eval_only;
    g->a = xcalloc(1, sizeof(Arena));
    g->a->cap = SIZE_MAX;
    g->shapes = (GpuShape *)shape, g->nshape = nshape;
    arena_record(g->a);
    gpu_alloc(g);
    for (int i = 0; i < nshape; i++) {
        gpu_shape(g, &shape[i]);
        gpu_input_begin(g, NULL);
        Exec e = exec_gpu(g);
        walk_step(&e, NULL, lcfg);
        if (!shape[i].train) walk_release(&e);
        gpu_input_end(g);
    }
    Plan p = {.total = g->a->high};
    memcpy(p.at_peak, g->a->at_high, sizeof p.at_peak);
    memcpy(p.peak, g->a->peak, sizeof p.peak);
    p.lay = arena_layout(g->a);
    // the layout where it is no larger than first-fit (on a tie too: the step then runs the one path
    // every model large enough to gain from it runs); else first-fit
    if (p.lay && p.lay->total <= p.total) {
        p.total = p.lay->total;
        memcpy(p.at_peak, g->a->at_live_max, sizeof p.at_peak);
    } else {
        arena_layout_free(p.lay);
        p.lay = NULL;
    }
    free(g->a);
    free(g);
    return p;
}

#ifdef YOLO_CUDA
// gpu_in_use: bytes of device memory in use now (all processes), from cudaMemGetInfo
static size_t gpu_in_use(Gpu *g) {
    size_t fr = 0, total = 0;
    GPU_CHECK(cudaMemGetInfo(&fr, &total));
    g->mem_total = total;
    return total - fr;
}

// gpu_mem_info: free and total memory of device dev (cudaMemGetInfo)
static void gpu_mem_info(int dev, size_t *fr, size_t *total) {
    GPU_CHECK(cudaSetDevice(dev));
    GPU_CHECK(cudaMemGetInfo(fr, total));
}

// gpu_select: the device= setting: -1 for the CPU, else the CUDA device index. "" (the default)
// picks device 0 when a GPU is present, else the CPU with a one-line notice.
static int gpu_select(const char *device) {
    // load every kernel at start-up, so that no module or its local memory is allocated by the
    // driver after the arena (CUDA 12 loads them lazily at first launch by default)
    setenv("CUDA_MODULE_LOADING", "EAGER", 0);
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) n = 0, (void)cudaGetLastError();
    if (!strcmp(device, "cpu")) return -1;
    if (!device[0]) {
        if (n > 0) return 0;
        fprintf(stderr, "no CUDA device found (%s): running on the CPU\n",
                e == cudaSuccess ? "0 devices" : cudaGetErrorString(e));
        return -1;
    }
    if (strchr(device, ',')) {   // a data-parallel worker: its own device of the list (ddp_launch checked them)
        if (ddp.world > 1) return ddp.dev;
        die("device=%s: several devices train together (yolo train, one process each); val, predict and plan take one",
            device);
    }
    const char *d = strncmp(device, "cuda:", 5) ? device : device + 5;
    char *end;
    long k = strtol(d, &end, 10);
    if (*end || end == d || k < 0) die("device=%s: expected cpu, a device index (0) or cuda:0", device);
    if (k >= n)
        die("device=%s: %d CUDA device(s) present%s%s%s", device, n, e == cudaSuccess ? "" : " (",
            e == cudaSuccess ? "" : cudaGetErrorString(e), e == cudaSuccess ? "" : ")");
    return (int)k;
}

// gpu_open: plans (dry runs of every shape) and allocates the device arena with one cudaMalloc on
// device dev, then uploads the host model's weights and running stats. ema_p, ema_b: the EMA's
// starting point (NULL: the model's own). opt: the optimizer hyper-parameters and step count.
static Gpu *gpu_open(Model *m, int dev, int amp, int nshape, const GpuShape *shape, const Optimizer *opt,
                     const float *ema_p, const float *ema_b, const LossConfig *lcfg) {
    Gpu *g = xcalloc(1, sizeof(Gpu));
    g->m = m;
    g->opt = *opt;
    g->opt.m = g->opt.v = NULL;
    g->eval_only = 1;
    for (int i = 0; i < nshape; i++) g->eval_only &= !shape[i].train;
    grad_scaler_init(&g->scaler);
    size_t head_max[3] = {0, 0, 0};
    int bmax = 0;
    for (int i = 0; i < nshape; i++) {
        if ((long)shape[i].B * shape[i].H * shape[i].W >= (1L << 31) / 4)   // the kernels' 32-bit index math (yolo.h)
            die("device: batch %d at %dx%d is beyond the kernels' 32-bit indexing; lower batch or imgsz", shape[i].B,
                shape[i].W, shape[i].H);
        bmax = shape[i].B > bmax ? shape[i].B : bmax;
        for (int l = 0; l < 3; l++) {
            int st = 8 << l;
            head_max[l] = (size_t)fmax(
                    head_max[l], (double)shape[i].B * (REG_MAX * 4 + m->nc) * (shape[i].H / st) * (shape[i].W / st));
        }
    }
    // the plan: the same schedules with no memory
    g->f32 = !amp;
    g->esz = amp ? 2 : 4;
    if (!amp) g->scaler.scale = 1.f;   // amp=0: no loss scaling (GradScaler disabled, as Ultralytics)
    Plan pl = gpu_plan_run(m, opt->kind, amp, g->eval_only, nshape, shape, lcfg);
    g->plan = pl.total;
    memcpy(g->plan_at, pl.at_peak, sizeof g->plan_at);
    g->lay = pl.lay;
    g->nshape = nshape;
    g->shapes = xmalloc(sizeof(GpuShape) * (size_t)nshape);
    memcpy(g->shapes, shape, sizeof(GpuShape) * (size_t)nshape);
    g->a = xcalloc(1, sizeof(Arena));
    // the device, and the memory in use before and after the one allocation
    GPU_CHECK(cudaSetDevice(dev));
    GPU_CHECK(cudaFree(NULL));   // creates the context
    g->mem_before = gpu_in_use(g);
    void *base;
    cudaError_t e = cudaMalloc(&base, g->plan);
    if (e != cudaSuccess)
        die("device %d: cannot allocate the planned %.1f MiB (%s; %.1f MiB of %.1f MiB were in use already): see "
            "`yolo plan gpu_mem=...` for what fits",
            dev, g->plan / 1048576.0, cudaGetErrorString(e), g->mem_before / 1048576.0, g->mem_total / 1048576.0);
    g->mem_after = gpu_in_use(g);
    *g->a = (Arena){.base = base, .cap = g->plan, .lay = g->lay};
    gpu_alloc(g);
    gpu_shape(g, &shape[0]);
    // weights, running stats, EMA copies, parameter groups
    long n = (long)m->nparams;
    cudaStream_t s = (cudaStream_t)g->stream;
    GPU_CHECK(cudaMemcpy(g->params, m->params, n * 4, cudaMemcpyHostToDevice));
    GPU_CHECK(cudaMemcpy(g->buffers, m->buffers, m->nbuffers * 4, cudaMemcpyHostToDevice));
    gpu_w16_refresh(g);
    if (!g->eval_only) {   // training: the EMA, the optimizer state and the parameter groups
        GPU_CHECK(cudaMemcpy(g->ema_p, ema_p ? ema_p : m->params, n * 4, cudaMemcpyHostToDevice));
        GPU_CHECK(cudaMemcpy(g->ema_b, ema_b ? ema_b : m->buffers, m->nbuffers * 4, cudaMemcpyHostToDevice));
        if (opt->m) GPU_CHECK(cudaMemcpy(g->opt_m, opt->m, n * 4, cudaMemcpyHostToDevice));
        if (opt->v && g->opt_v) GPU_CHECK(cudaMemcpy(g->opt_v, opt->v, n * 4, cudaMemcpyHostToDevice));
        uint8_t *grp = xmalloc(n);
        memset(grp, OPT_NO_GROUP, n);
        for (int ci = 0; ci < m->nconv; ci++) {
            size_t off[3], len[3];
            int pg[3];
            model_segments(m, ci, off, len, pg);
            for (int k = 0; k < 3; k++) memset(grp + off[k], pg[k], len[k]);
        }
        GPU_CHECK(cudaMemcpy(g->group, grp, n, cudaMemcpyHostToDevice));
        free(grp);
    }
    // host side of the loss
    for (int i = 0; i < 3; i++) {
        g->head_h[i] = xmalloc(head_max[i] * sizeof(float));
    }
    g->gts_h = xmalloc((size_t)bmax * lcfg->max_boxes * sizeof(LossGt));
    g->nbox_h = xmalloc((size_t)bmax * sizeof(int));
    GPU_CHECK(cudaStreamSynchronize(s));
    return g;
}

// gpu_report: the plan by group and the device memory actually in use, as the trainer prints it
static void gpu_report(const Gpu *g, int dev) {
    struct cudaDeviceProp pr;
    GPU_CHECK(cudaGetDeviceProperties(&pr, dev));
    const size_t *p = g->plan_at;
    size_t got = g->mem_after - g->mem_before;
    printf("device %d: %s (sm_%d%d, %.0f MiB)\n", dev, pr.name, pr.major, pr.minor, g->mem_total / 1048576.0);
    printf("memory plan: %.1f MiB in one cudaMalloc (weights %.1f, gradients %.1f, optimizer %.1f, EMA %.1f, "
           "activations %.1f, "
           "backward %.1f, input %.1f MiB); nothing is allocated after this\n",
           g->plan / 1048576.0, (p[G_PARAMS] + p[G_BUFFERS]) / 1048576.0, p[G_GRADS] / 1048576.0,
           p[G_OPTIM] / 1048576.0, p[G_EMA] / 1048576.0, p[G_ACTS] / 1048576.0, p[G_BACKWARD] / 1048576.0,
           p[G_INPUT] / 1048576.0);
    printf("device memory in use: %.1f MiB before (CUDA context and other processes), %.1f MiB after: the arena took "
           "%.1f MiB "
           "= plan %.1f MiB rounded up to the driver's 2 MiB pages%s\n",
           g->mem_before / 1048576.0, g->mem_after / 1048576.0, got / 1048576.0, g->plan / 1048576.0,
           got == (g->plan + (2u << 20) - 1) / (2u << 20) * (2u << 20)
                   ? ""
                   : " (NOT equal: another process allocated meanwhile?)");
}

static void gpu_close(Gpu *g) {
    prof_report();
    GPU_CHECK(cudaFree(g->a->base));
    arena_layout_free(g->lay);
    free(g->shapes);
    for (int i = 0; i < 3; i++) free(g->head_h[i]);
    free(g->gts_h);
    free(g->nbox_h);
    free(g->a);
    free(g);
}

// gpu_loss_run: gpu_loss's launches: the boxes of each image gathered on the host (as
// loss_forward_backward does, the max_boxes cap counted) and uploaded to gts/nbox, loss_cuda, and the
// five sums back (the one synchronisation of a training step, for the loss the trainer prints).
static LossOut gpu_loss_run(Gpu *g, const LossTargets *tg, const LossConfig *lcfg, LossGtD *gts, int *nbox, double *out,
                            void *scratch) {
    cudaStream_t s = (cudaStream_t)g->stream;
    int B = g->B, M = lcfg->max_boxes, NC = g->m->nc;
    LossOut lo = {0};
    for (int i = 0; i < tg->n; i++)
        if (tg->batch_idx[i] < 0 || tg->batch_idx[i] >= B)
            die("loss: box %d has batch_idx %d, outside [0, %d)", i, tg->batch_idx[i], B);
    for (int b = 0; b < B; b++) {
        int n = loss_gather_gts(tg, b, NC, g->H, g->W, M, g->gts_h + (size_t)b * M);
        if (n > M) lo.n_over_cap += n - M, lo.n_images_over_cap++, n = M;
        g->nbox_h[b] = n;
    }
    if (lo.n_over_cap && !loss_cap_warned) {
        loss_cap_warned = 1;
        fprintf(stderr,
                "warning: %d boxes in %d images were over the max_boxes=%d cap and are ignored by the loss (reported "
                "once; raise max_boxes to keep them)\n",
                lo.n_over_cap, lo.n_images_over_cap, M);
    }
    prof_begin(g);
    GPU_CHECK(cudaMemcpyAsync(gts, g->gts_h, (size_t)B * M * sizeof(LossGtD), cudaMemcpyHostToDevice, s));
    GPU_CHECK(cudaMemcpyAsync(nbox, g->nbox_h, (size_t)B * sizeof(int), cudaMemcpyHostToDevice, s));
    const Model *m = g->m;
    loss_cuda(B, NC, g->H, g->W, (const float *const *)m->head, m->infer ? NULL : m->dhead, gts, nbox, M, lcfg->box,
              lcfg->cls, lcfg->dfl, m->infer ? 1.f : g->scaler.scale, scratch, out, s);
    double o[5];
    GPU_CHECK(cudaMemcpyAsync(o, out, sizeof o, cudaMemcpyDeviceToHost, s));
    if (g->copy_heads || m->infer)   // evaluation (NMS on the host) and tests: the head maps, as the loss saw them
        for (int i = 0; i < 3; i++) {
            int sd = 8 << i;
            GPU_CHECK(cudaMemcpyAsync(g->head_h[i], m->head[i],
                                      (size_t)B * (REG_MAX * 4 + NC) * (g->H / sd) * (g->W / sd) * sizeof(float),
                                      cudaMemcpyDeviceToHost, s));
        }
    GPU_CHECK(cudaStreamSynchronize(s));   // o and head_h are read now, gts_h / nbox_h reused by the next step
    prof_end(g, g->copy_heads || m->infer ? "loss + head maps to host" : "loss", 0);
    lo.box = o[0], lo.cls = o[1], lo.dfl = o[2];
    lo.target_scores_sum = o[3];
    lo.n_fg = (int)o[4];
    lo.total = B * (lo.box + lo.cls + lo.dfl);
    return lo;
}

// gpu_put_input: n uint8 values img (host) -> x8 (device); with amp=0 -> g->x, FP32 in [0, 1]
// (gpu_input_begin)
static void gpu_put_input(Gpu *g, uint8_t *x8, const uint8_t *img, long n) {
    cudaStream_t s = (cudaStream_t)g->stream;
    prof_begin(g);
    GPU_CHECK(cudaMemcpyAsync(x8, img, n, cudaMemcpyHostToDevice, s));
    if (!g->x8) u8_to_f32_cuda(x8, g->x, n, s);
    prof_end(g, g->x8 ? "input upload" : "input upload + convert", 0);
}

// prof_begin / prof_end: a launch (or a few) between two events, its time added to the row name
static void prof_begin(const Gpu *g) {
    if (prof_on()) GPU_CHECK(cudaEventRecord((cudaEvent_t)gprof.ev[0], (cudaStream_t)g->stream));
    if (prof_on() && emu_count_tag) emu_count_tag(NULL, 0);   // launches before this one were not timed
}
static void prof_end(const Gpu *g, const char *name, double flop) {
    if (gprof.on <= 0) return;   // off, or not yet asked (prof_begin asks)
    float ms = 0;
    GPU_CHECK(cudaEventRecord((cudaEvent_t)gprof.ev[1], (cudaStream_t)g->stream));
    GPU_CHECK(cudaEventSynchronize((cudaEvent_t)gprof.ev[1]));
    GPU_CHECK(cudaEventElapsedTime(&ms, (cudaEvent_t)gprof.ev[0], (cudaEvent_t)gprof.ev[1]));
    if (emu_count_tag) emu_count_tag(name, flop);
    int i = 0;
    while (i < gprof.nrow && strcmp(gprof.row[i].name, name)) i++;
    if (i == gprof.nrow) {
        if (i == (int)(sizeof gprof.row / sizeof gprof.row[0])) return;   // more kinds than rows: not timed
        snprintf(gprof.row[i].name, sizeof gprof.row[i].name, "%s", name);
        gprof.row[i].ms = gprof.row[i].flop = 0;
        gprof.row[i].n = 0;
        gprof.nrow++;
    }
    gprof.row[i].ms += ms;
    gprof.row[i].flop += flop;
    gprof.row[i].n++;
}

// gpu_zero_grad: the gradients to 0 (after an optimizer step; micro-batches accumulate in between)
static void gpu_zero_grad(Gpu *g) {
    GPU_CHECK(cudaMemsetAsync(g->grads, 0, g->m->nparams * sizeof(float), (cudaStream_t)g->stream));
}

// gpu_train_step: forward, loss and backward of the uint8 batch img at shape s (one planned by
// gpu_open); the gradients, times the loss scale, are added to g->grads.
static LossOut gpu_train_step(Gpu *g, const GpuShape *s, const uint8_t *img, const LossTargets *tg,
                              const LossConfig *lcfg) {
    gpu_shape(g, s);
    GPU_CHECK(cudaMemcpyAsync(g->bn_keep, g->buffers, g->m->nbuffers * sizeof(float), cudaMemcpyDeviceToDevice,
                              (cudaStream_t)g->stream));
    gpu_input_begin(g, img);
    Exec e = exec_gpu(g);
    LossOut lo = walk_step(&e, tg, lcfg);   // a non-finite loss skips the backward: the caller drops the window
    if (g->grads_done && !arena_dry(g->a)) g->grads_done(g, NULL);
    gpu_input_end(g);
    return lo;
}

// gpu_bn_restore: undoes the running-stat update of the last gpu_train_step (its loss was not finite)
static void gpu_bn_restore(Gpu *g) {
    GPU_CHECK(cudaMemcpyAsync(g->buffers, g->bn_keep, g->m->nbuffers * sizeof(float), cudaMemcpyDeviceToDevice,
                              (cudaStream_t)g->stream));
}

// gpu_upload_grads: accumulated (unscaled) gradients from the host, times the loss scale (resume)
static void gpu_upload_grads(Gpu *g, const float *grads) {
    size_t n = g->m->nparams;
    float *t = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) t[i] = grads[i] * g->scaler.scale;
    GPU_CHECK(cudaMemcpy(g->grads, t, n * sizeof(float), cudaMemcpyHostToDevice));
    free(t);
}

// gpu_eval: an evaluation forward of the uint8 batch img at shape s (train == 0) and its loss
// against tg (*lo); the three head maps come back in g->head_h (host, for NMS) and nothing stays
// allocated on the device.
static float *const *gpu_eval(Gpu *g, const GpuShape *s, const uint8_t *img, const LossTargets *tg,
                              const LossConfig *lcfg, LossOut *lo) {
    gpu_shape(g, s);
    gpu_input_begin(g, img);
    Exec e = exec_gpu(g);
    *lo = walk_step(&e, tg, lcfg);   // in evaluation the loss also brings the head maps to head_h
    walk_release(&e);
    gpu_input_end(g);
    return g->head_h;
}

// gpu_predict_open: an evaluation-only device arena for every input shape `yolo predict` makes at
// imgsz S (one side S, the other a multiple of 32 up to S)
static Gpu *gpu_predict_open(Model *m, int dev, int S) {
    LossConfig plc = loss_config_default();   // the device forward computes a loss too; no boxes here
    plc.max_boxes = 1;
    GpuShape *sh = xmalloc(sizeof(GpuShape) * (size_t)(2 * (S / 32)));
    int ns = 0;
    for (int side = 32; side <= S; side += 32) {
        sh[ns++] = (GpuShape){1, S, side, 0};
        if (side != S) sh[ns++] = (GpuShape){1, side, S, 0};
    }
    Optimizer no = {.kind = OPT_SGD};
    Gpu *g = gpu_open(m, dev, 1, ns, sh, &no, NULL, NULL, &plc);
    gpu_report(g, dev);
    free(sh);
    return g;
}
// gpu_predict: the head maps (host copies) of one image hwc (H, W, 3) uint8
static const float *const *gpu_predict(Gpu *g, const uint8_t *hwc, int H, int W) {
    LossConfig plc = loss_config_default();
    plc.max_boxes = 1;
    LossTargets none = {0, NULL, NULL, NULL};
    uint8_t *chw = xmalloc((size_t)3 * H * W);
    for (int ch = 0; ch < 3; ch++)
        for (size_t i = 0; i < (size_t)W * H; i++) chw[(size_t)ch * W * H + i] = hwc[i * 3 + ch];
    GpuShape sh = {1, H, W, 0};
    LossOut lo;
    float *const *heads = gpu_eval(g, &sh, chw, &none, &plc, &lo);
    free(chw);
    return (const float *const *)heads;
}

// gpu_use_ema: on: the EMA's weights and running stats take the model's place (validation), the
// FP16 weight copy made from them; off: back to the model's.
static void gpu_use_ema(Gpu *g, int on) {
    if (on == g->ema_on || g->eval_only) return;   // evaluation only: the weights are the ones to evaluate
    float *t = g->params; g->params = g->ema_p; g->ema_p = t;
    t = g->buffers; g->buffers = g->ema_b; g->ema_b = t;
    g->ema_on = on;
    gpu_w16_refresh(g);
}

// gpu_download: the training state to the host (checkpoints): weights, running stats, the
// gradients accumulated so far (unscaled), the EMA and the optimizer's moments; any may be NULL.
static void gpu_download(Gpu *g, float *params, float *buffers, float *grads, float *ema_p, float *ema_b, float *opt_m,
                         float *opt_v) {
    size_t n = g->m->nparams, nb = g->m->nbuffers;
    if (g->ema_on) die("gpu_download: inside gpu_use_ema");
    GPU_CHECK(cudaStreamSynchronize((cudaStream_t)g->stream));
    if (params) GPU_CHECK(cudaMemcpy(params, g->params, n * 4, cudaMemcpyDeviceToHost));
    if (buffers) GPU_CHECK(cudaMemcpy(buffers, g->buffers, nb * 4, cudaMemcpyDeviceToHost));
    if (ema_p) GPU_CHECK(cudaMemcpy(ema_p, g->ema_p, n * 4, cudaMemcpyDeviceToHost));
    if (ema_b) GPU_CHECK(cudaMemcpy(ema_b, g->ema_b, nb * 4, cudaMemcpyDeviceToHost));
    if (opt_m) GPU_CHECK(cudaMemcpy(opt_m, g->opt_m, n * 4, cudaMemcpyDeviceToHost));
    if (opt_v && g->opt_v) GPU_CHECK(cudaMemcpy(opt_v, g->opt_v, n * 4, cudaMemcpyDeviceToHost));
    if (grads) {
        GPU_CHECK(cudaMemcpy(grads, g->grads, n * 4, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < n; i++) grads[i] /= g->scaler.scale;
    }
}

// gpu_optim_hyper: the OptimHyper of the next step (step count o->step + 1), as optim_step computes it
static OptimHyper gpu_optim_hyper(const Optimizer *o, float inv_scale, float max_norm) {
    OptimHyper h;
    memset(&h, 0, sizeof h);
    long step = o->step + 1;
    double bc1 = 1 - pow(o->momentum, (double)step), bc2 = 1 - pow(o->beta2, (double)step);
    for (int k = 0; k < 3; k++) {
        h.lr[k] = (float)o->lr[k];
        h.wd[k] = k == PG_WEIGHT ? (float)o->weight_decay : 0.f;
        h.adam_step[k] = (float)(o->lr[k] / bc1);
    }
    h.momentum = (float)o->momentum;
    h.beta2 = (float)o->beta2;
    h.eps = (float)o->eps;
    h.bc2_sqrt = (float)sqrt(bc2);
    h.inv_scale = inv_scale;
    h.max_norm = max_norm;
    h.adamw = o->kind == OPT_ADAMW;
    h.first = step == 1;
    return h;
}

// gpu_optimize: unscale, finite check, clip to norm 10, SGD/AdamW, the parameters' EMA and (a step
// taken) their FP16 copy, all in the update's kernels (the EMA with the decay of the next update count,
// counted here once the host knows the step's fate: the same rule as the kernel's); then the GradScaler
// update, the running statistics' EMA and the tap-major FP16 copies. Returns 1 when the step was
// taken; *norm_out (optional) gets the unscaled norm (inf when skipped). Not with the EMA's weights in
// place (gpu_use_ema): the update would be made to them.
static int gpu_optimize(Gpu *g, double *norm_out) {
    Model *m = g->m;
    cudaStream_t s = (cudaStream_t)g->stream;
    long n = (long)m->nparams;
    float inv = 1.0f / g->scaler.scale, norm;
    OptimHyper h = gpu_optim_hyper(&g->opt, inv, (float)GRAD_CLIP_NORM);
    // the EMA follows every optimizer_step call, also one the GradScaler skipped (Ultralytics:
    // scaler.step, scaler.update, zero_grad, then ema.update); amp=0 skips a non-finite step whole
    float d = ema_decay(g->ema_updates + 1);
    prof_begin(g);
    optim_norm_cuda(g->grads, g->group, n, inv, g->partials, s);
    optim_step_cuda(g->params, g->grads, g->opt_m, g->opt_v, g->group, n, g->partials, h, g->norm,
                    g->f32 ? NULL : g->w16, g->ema_p, d, !g->f32, s);
    GPU_CHECK(cudaMemcpyAsync(&norm, g->norm, sizeof norm, cudaMemcpyDeviceToHost, s));
    GPU_CHECK(cudaStreamSynchronize(s));
    if (norm_out) *norm_out = norm;
    int taken = g->f32 ? isfinite(norm) : grad_scaler_update(&g->scaler, !isfinite(norm));   // amp=0: no scaling
    if (taken) g->opt.step++;
    if (!taken && g->f32) {
        prof_end(g, "optimizer + EMA", 0);
        return 0;
    }
    g->ema_updates++;
    ema_update_cuda(g->ema_b, g->buffers, (long)m->nbuffers, d, s);
    if (taken) gpu_wt_refresh(g);
    prof_end(g, "optimizer + EMA", 0);
    return taken;
}

#else

// gpu_mem_info without CUDA: no device memory (never asked: gpu_select returns the CPU)
static void gpu_mem_info(int dev, size_t *fr, size_t *total) { (void)dev, *fr = *total = 0; }
// without CUDA no Gpu is ever opened (gpu_select returns the CPU): what predict names for it
static Gpu *gpu_predict_open(Model *m, int dev, int S) { (void)m, (void)dev, (void)S; return NULL; }
static const float *const *gpu_predict(Gpu *g, const uint8_t *hwc, int H, int W) {
    (void)g, (void)hwc, (void)H, (void)W;
    die("internal error: a device forward in a build without CUDA");
    return NULL;
}
static void gpu_close(Gpu *g) { (void)g; }

// gpu_select without CUDA: the CPU, or a clear error for a GPU device
static int gpu_select(const char *device) {
    if (!device[0] || !strcmp(device, "cpu")) return -1;
    if (strchr(device, ','))
        die("device=%s: this yolo was built without CUDA (make found no nvcc), so it cannot train on several GPUs",
            device);
    die("device=%s: this yolo was built without CUDA (make found no nvcc); use device=cpu or rebuild with the CUDA "
        "Toolkit",
        device);
}
#endif // YOLO_CUDA

// ------------------------------------------------------------------------------------------
// training: the Ultralytics recipe, validation, checkpoints, predict
// ------------------------------------------------------------------------------------------

#define AUTOBATCH_FRACTION 0.60   // batch=-1: the share of free device memory (Ultralytics' AutoBatch default)

// Config: every setting of `yolo train/val/predict`, with Ultralytics' keys and defaults.
typedef struct {
    char data[512], model[512], project[256], name[128], optimizer[16], device[32], cache[16], source[512];
    double batch_auto;         // AutoBatch as given: -1 (AUTOBATCH_FRACTION) or a share of free device memory; 0 off
    int epochs, imgsz, batch, workers, nbs, close_mosaic, patience, cos_lr, amp, resume, accumulate, max_boxes,
            exist_ok, recompute;
    double lr0, lrf, momentum, weight_decay, warmup_epochs, warmup_momentum, warmup_bias_lr, box, cls, dfl, conf, iou;
    uint64_t seed;
    AugConfig aug;
} Config;

static const char *const train_keys[] = {
    "data", "model", "epochs", "imgsz", "batch", "device", "workers", "optimizer", "lr0", "lrf", "momentum",
    "weight_decay", "warmup_epochs", "warmup_momentum", "warmup_bias_lr", "box", "cls", "dfl", "nbs", "cos_lr",
    "close_mosaic", "patience", "seed", "amp", "cache", "project", "name", "resume", "accumulate", "max_boxes",
    "exist_ok", "hsv_h", "hsv_s", "hsv_v", "degrees", "translate", "scale", "shear", "perspective", "flipud",
    "fliplr", "mosaic", "mixup", "conf", "iou", "source", "recompute", NULL};

static void cfg_str(char *dst, size_t n, int argc, char **argv, const char *key, const char *def) {
    const char *v = arg_get(argc, argv, key, def);
    if (strlen(v) >= n) die("%s=%s: value too long", key, v);
    snprintf(dst, n, "%s", v);
}

// config_from_args: defaults of cfg/default.yaml, then key=value overrides, then checks that
// name the offending key.
static Config config_from_args(int argc, char **argv) {
    arg_check(argc, argv, train_keys);
    Config c;
    memset(&c, 0, sizeof c);
    cfg_str(c.data, sizeof c.data, argc, argv, "data", "");
    cfg_str(c.model, sizeof c.model, argc, argv, "model", "yolov8n");
    cfg_str(c.project, sizeof c.project, argc, argv, "project", "runs/detect");
    cfg_str(c.name, sizeof c.name, argc, argv, "name", "");
    cfg_str(c.optimizer, sizeof c.optimizer, argc, argv, "optimizer", "auto");
    cfg_str(c.device, sizeof c.device, argc, argv, "device", "");
    cfg_str(c.cache, sizeof c.cache, argc, argv, "cache", "0");
    cfg_str(c.source, sizeof c.source, argc, argv, "source", "");
    c.epochs = (int)arg_int(argc, argv, "epochs", 100);
    c.imgsz = (int)arg_int(argc, argv, "imgsz", 640);
    double bf = arg_num(argc, argv, "batch", 16);
    if (bf == -1 ||
        (bf > 0 && bf < 1)) {   // AutoBatch: resolved by train_run on the device (Ultralytics: CUDA only, CPU uses 16)
        c.batch_auto = bf;
        bf = 16;
    }
    if (bf != floor(bf)) die("batch=%g: expected a whole number, -1 or a fraction below 1", bf);
    c.batch = (int)bf;
    c.recompute = (int)arg_int(argc, argv, "recompute", 0);
    c.workers = (int)arg_int(argc, argv, "workers", 2);
    c.nbs = (int)arg_int(argc, argv, "nbs", 64);
    c.close_mosaic = (int)arg_int(argc, argv, "close_mosaic", 10);
    c.patience = (int)arg_int(argc, argv, "patience", 100);
    c.cos_lr = (int)arg_int(argc, argv, "cos_lr", 0);
    c.amp = (int)arg_int(argc, argv, "amp", 1);
    c.resume = (int)arg_int(argc, argv, "resume", 0);
    c.accumulate = (int)arg_int(argc, argv, "accumulate", 0);
    c.max_boxes = (int)arg_int(argc, argv, "max_boxes", 400);
    c.exist_ok = (int)arg_int(argc, argv, "exist_ok", 0);
    c.lr0 = arg_num(argc, argv, "lr0", 0.01);
    c.lrf = arg_num(argc, argv, "lrf", 0.01);
    c.momentum = arg_num(argc, argv, "momentum", 0.937);
    c.weight_decay = arg_num(argc, argv, "weight_decay", 0.0005);
    c.warmup_epochs = arg_num(argc, argv, "warmup_epochs", 3.0);
    c.warmup_momentum = arg_num(argc, argv, "warmup_momentum", 0.8);
    c.warmup_bias_lr = arg_num(argc, argv, "warmup_bias_lr", 0.1);
    c.box = arg_num(argc, argv, "box", 7.5);
    c.cls = arg_num(argc, argv, "cls", 0.5);
    c.dfl = arg_num(argc, argv, "dfl", 1.5);
    c.conf = arg_num(argc, argv, "conf", -1);
    c.iou = arg_num(argc, argv, "iou", 0.7);
    c.seed = (uint64_t)arg_int(argc, argv, "seed", 0);
    c.aug = aug_defaults();
    aug_from_args(&c.aug, argc, argv);
    if (c.imgsz < 32) die("imgsz=%d: must be at least 32", c.imgsz);
    if (c.imgsz % 32) {
        int r = (c.imgsz + 31) / 32 * 32;
        fprintf(stderr, "imgsz=%d is not a multiple of 32 (the largest stride); using %d\n", c.imgsz, r);
        c.imgsz = r;
    }
    if (c.batch < 1)
        die("batch=%d: must be >= 1 (batch=-1 / AutoBatch needs a GPU memory size; see yolo plan)", c.batch);
    if (c.epochs < 1) die("epochs=%d: must be >= 1", c.epochs);
    if (c.workers < 0 || c.workers > 64) die("workers=%d: must be 0..64", c.workers);
    if (c.max_boxes < 1) die("max_boxes=%d: must be >= 1", c.max_boxes);
    if (c.nbs < 1) die("nbs=%d: must be >= 1", c.nbs);
    if (c.accumulate < 0) die("accumulate=%d: must be >= 1 (0 = nbs/batch)", c.accumulate);
    if (strcmp(c.optimizer, "auto") && strcmp(c.optimizer, "SGD") && strcmp(c.optimizer, "AdamW"))
        die("optimizer=%s: expected auto, SGD or AdamW", c.optimizer);
    if (strcmp(c.cache, "0") && strcmp(c.cache, "ram") && strcmp(c.cache, "False") && strcmp(c.cache, "false"))
        die("cache=%s: expected ram or 0 (disk caching is not supported)", c.cache);
    return c;
}

// Trainer: everything a run holds. All numeric state of the model, optimizer and EMA lives in the arena.
typedef struct TrainerOps TrainerOps;
typedef struct {
    const TrainerOps *ops;     // where the steps run: the CPU or the device (trainer_ops)
    Config cfg;
    Model m;
    Arena *arena;
    Optimizer opt;
    Ema ema;
    StateDict sd, sd_ema;
    LossConfig lcfg;
    DataConfig data;
    Dataset train_ds, val_ds;
    Loader *train_ld, *val_ld;
    Gpu *gpu;                  // the device step (NULL: training on the CPU)
    int dev;                   // CUDA device index, -1 for the CPU
    float *x;                  // (B, 3, H, W) input staging, sized for the largest batch
    float *bn_keep;            // (nbuffers) running stats before the current step, restored if it fails
    int B, S, nb, accumulate;
    int vB;                    // validation batch: 2 x B when training (as Ultralytics), batch= for yolo val
    int B_last, vB_last;       // sizes of the short last batches (0: none), planned as well
    double wd, initial_lr;
    Nms nms;
    Det *dets;                 // (max_det)
    Evaluator ev;
    char dir[768];
    // progress (saved in checkpoints)
    int epoch;                 // next epoch to run
    long last_opt_step;
    int will_optimize;         // the step now running ends an accumulation window (set by train_epoch)
    double best_fitness;
    int best_epoch, nan_skips;
    double load_wait, loop_time;   // seconds the training steps waited for batches, of their loops' time
    int consecutive_nan;       // non-finite losses in a row (10 stop the run)
    int amp_skips;             // GPU: optimizer steps the GradScaler skipped (inf/NaN gradients)
    double amp_scale;          // GPU: the GradScaler's scale and good-step count, saved in checkpoints
    int amp_good;
} Trainer;

// TrainerOps: what the training loop, validation and `yolo val` ask of the CPU (the host arena) or
// the device (the Gpu); the loop itself has no device code. Implementations: cpu_trainer_ops,
// gpu_trainer_ops (above train_run).
struct TrainerOps {
    const char *where;                          // "host" or "device"
    void (*open)(Trainer *t, int train);        // the device's arena (one cudaMalloc), the state uploaded
    LossOut (*step)(Trainer *t, const Batch *bt, int *bad);   // forward, loss, backward; *bad: not finite, undone
    int (*optimize)(Trainer *t);                // clip, step, EMA, gradients zeroed; 1: stop the run
    const float *const *(*eval)(Trainer *t, const Batch *bt, LossOut *lo);   // validation forward + loss: the maps
    void (*eval_done)(Trainer *t);              // frees what eval left
    void (*use_ema)(Trainer *t, int on);        // validation on the EMA's weights (the host swaps its own)
    void (*sync)(Trainer *t);                   // the state to the host for a checkpoint
    double (*mem_mib)(Trainer *t);              // the progress line's memory: device in use (as GPU_mem) or the arena
    const Arena *(*arena)(Trainer *t);          // the arena the steps run in
    void (*close)(Trainer *t, int train);
};

// lr_lambda: the per-epoch LR factor (LambdaLR of trainer._setup_scheduler).
static double lr_lambda(const Config *c, int epoch) {
    if (c->cos_lr) return ((1 - cos(epoch * M_PI / c->epochs)) / 2) * (c->lrf - 1) + 1;
    return fmax(1 - (double)epoch / c->epochs, 0) * (1 - c->lrf) + c->lrf;
}

static double interp(double x, double x0, double x1, double y0, double y1) {
    if (x <= x0) return y0;
    if (x >= x1) return y1;
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0);
}

// all_finite: no NaN or infinity in x (n)
static int all_finite(const float *x, size_t n) {
    int ok = 1;
#pragma omp parallel for reduction(&& : ok)
    for (size_t i = 0; i < n; i++) ok = ok && isfinite(x[i]);
    return ok;
}

// input_from_batch: uint8 RGB (B, 3, H, W) -> float [0, 1] into the staging buffer
static void input_from_batch(float *x, const Batch *bt) {
    size_t n = (size_t)bt->B * 3 * bt->H * bt->W;
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) x[i] = bt->img[i] * (1.f / 255.f);
}

// trainer_step: one forward (+ loss, + backward when train) on the arena (walk_step). In a dry
// run (no batch) it makes exactly the allocations of a real one, which is how the plan is computed.
static LossOut trainer_step(Trainer *t, const Batch *bt, int B, int H, int W, int train) {
    Model *m = &t->m;
    m->train = train;
    m->infer = !train;
    model_input(m, t->x, B, H, W);
    Exec e = exec_cpu(m, t->arena);
    LossTargets tg = bt ? (LossTargets){bt->n, bt->batch_idx, bt->cls, bt->box} : (LossTargets){0};
    return walk_step(&e, bt ? &tg : NULL, &t->lcfg);   // eval: the caller reads m->head, then model_release
}

// trainer_alloc: the persistent groups, in a fixed order (the same in the plan and the run).
static void trainer_alloc(Trainer *t, Arena *a, size_t xfloats, int train) {
    Model *m = &t->m;
    model_alloc_params(m, a);
    if (!train) {   // val / predict: the weights themselves play the EMA's part
        t->ema.params = m->params;
        t->ema.buffers = m->buffers;
    } else {
        t->opt.m = azfloat(a, m->nparams, G_OPTIM);
        t->opt.v = t->opt.kind == OPT_ADAMW ? azfloat(a, m->nparams, G_OPTIM) : NULL;
        t->ema.params = afloat(a, m->nparams, G_EMA);
        t->ema.buffers = afloat(a, m->nbuffers, G_EMA);
        t->bn_keep = afloat(a, m->nbuffers, G_BUFFERS);
    }
    t->x = afloat(a, xfloats, G_INPUT);
}

// trainer_plan: dry-runs the persistent allocations, a training step at (B, S, S) and a
// validation step at every validation batch shape; the arena is the largest high-water mark.
static Plan trainer_plan_layout(Trainer *t, int nshape, const int (*shape)[2], size_t xfloats, int train, int step) {
    Arena *a = xcalloc(1, sizeof(Arena));
    a->cap = SIZE_MAX;
    Arena *keep = t->arena;
    t->arena = a;
    trainer_alloc(t, a, xfloats, train);
    if (step) trainer_step(t, NULL, t->B, t->S, t->S, 1);
    if (step && t->B_last) trainer_step(t, NULL, t->B_last, t->S, t->S, 1);   // the short last batch too
    for (int i = 0; i < nshape; i++) {
        int vb = i == nshape - 1 && t->vB_last ? t->vB_last : t->vB;
        trainer_step(t, NULL, vb, shape[i][0], shape[i][1], 0);
        model_release(&t->m, a);
    }
    Plan p = {.total = a->high};
    memcpy(p.at_peak, a->at_high, sizeof p.at_peak);
    memcpy(p.peak, a->peak, sizeof p.peak);
    t->arena = keep;
    free(a);
    return p;
}

static Plan trainer_plan(Trainer *t, int nshape, const int (*shape)[2], size_t xfloats, int train) {
    return trainer_plan_layout(t, nshape, shape, xfloats, train, train);
}

static void mkdir_p(const char *path) {
    char tmp[1024];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++)
        if (*p == '/') { *p = 0; mkdir(tmp, 0755); *p = '/'; }
    if (mkdir(tmp, 0755) && errno != EEXIST) die("cannot create directory '%s': %s", tmp, strerror(errno));
}

// run_dir: a run's folder as Ultralytics names it (get_save_dir, increment_path): PROJECT/NAME,
// project runs/detect and name train, val or predict (the mode) by default; when it exists and
// exist_ok=0, the first free of NAME2, NAME3, ... (resume=1 keeps NAME). Creates it.
static void run_dir(char *dir, size_t n, const Config *c, const char *mode) {
    char base[400];
    snprintf(base, sizeof base, "%s/%s", c->project, c->name[0] ? c->name : mode);
    snprintf(dir, n, "%s", base);
    struct stat sb;
    for (int i = 2; !c->resume && !c->exist_ok && stat(dir, &sb) == 0; i++) snprintf(dir, n, "%s%d", base, i);
    mkdir_p(dir);
}

// model_load_weights: model= a scale name (random init) or a weights file (.safetensors or .pt).
// For another nc (fine-tuning) every tensor whose name and shape match is transferred, as
// Ultralytics does, and the rest keeps its initialisation.
static void model_load_weights(Model *m, const char *spec, int nc, uint64_t seed, int build_only) {
    const Scale *sc = scale_find(spec);
    char err[1024];
    if (sc) {
        if (!build_only) model_init_params(m, seed);
        return;
    }
    int fnc;
    char fscale;
    if (weights_infer(spec, &fnc, &fscale, err, sizeof err)) die("model=%s: %s", spec, err);
    if (build_only) return;
    model_init_params(m, seed);
    StateDict *sd = xcalloc(1, sizeof(StateDict));
    state_dict_build(sd, m, m->params, m->buffers);
    if (fnc == nc) {
        if (weights_load(spec, sd->ref, sd->n, err, sizeof err)) die("%s", err);
    } else {   // another nc: Ultralytics' transfer of every tensor whose name and shape match
        int loaded;
        if (weights_transfer(spec, sd->ref, sd->n, &loaded, err, sizeof err)) die("%s", err);
        printf("Transferred %d/%d items from pretrained weights\n", loaded, sd->n);
        printf("model=%s has nc=%d, the data has nc=%d: the class outputs (model.22.cv3.*) that do not match are "
               "re-initialised; class names come from the data\n", spec, fnc, nc);
    }
    free(sd);
}

// model_spec_scale: the scale of model= (name or file)
static char model_spec_scale(const char *spec, int *file_nc) {
    const Scale *sc = scale_find(spec);
    *file_nc = -1;
    if (sc) return sc->name;
    char err[1024], s;
    if (weights_infer(spec, file_nc, &s, err, sizeof err)) die("model=%s: %s", spec, err);
    return s;
}

// ckpt_save: the resume checkpoint, model + EMA + optimizer + progress, written atomically (a kill
// at any moment leaves the previous file intact), and the EMA weights as last/best.safetensors.
// trainer_weights_ok: the model and the EMA hold no NaN or infinity (checked before anything is
// saved, so a run that diverged never overwrites its last good files)
static int trainer_weights_ok(Trainer *t) {
    Model *m = &t->m;
    if (all_finite(m->params, m->nparams) && all_finite(m->buffers, m->nbuffers) &&
        all_finite(t->ema.params, m->nparams) && all_finite(t->ema.buffers, m->nbuffers))
        return 1;
    fprintf(stderr,
            "stopping: the weights hold non-finite values after epoch %d; nothing was saved, so %s/weights/last.ckpt "
            "still holds the last good state (hint: lower lr0)\n",
            t->epoch, t->dir);
    return 0;
}

// trainer_signature: the settings a resume must share with the run it continues
static void trainer_signature(const Trainer *t, char *out, size_t n) {
    const Config *c = &t->cfg;
    snprintf(out, n,
             "data=%s batch=%d imgsz=%d epochs=%d optimizer=%d lr0=%.9g lrf=%.9g momentum=%.9g weight_decay=%.9g "
             "warmup_epochs=%.9g nbs=%d accumulate=%d cos_lr=%d close_mosaic=%d seed=%llu images=%d max_boxes=%d",
             c->data, t->B * ddp.world, t->S, c->epochs, t->opt.kind, c->lr0, c->lrf, c->momentum, c->weight_decay,
             c->warmup_epochs, c->nbs, t->accumulate, c->cos_lr, c->close_mosaic, (unsigned long long)c->seed,
             t->train_ds.n, c->max_boxes);
}

// trainer_save: the EMA weights as last.safetensors (and best.safetensors), then the resume
// checkpoint last.ckpt: model, EMA, optimizer state, gradients still accumulating, counters and
// the run's settings. Each file is written to a temporary file, flushed and renamed, so a kill at
// any moment leaves the previous one intact; last.ckpt is written last, as the commit point.
static void trainer_save(Trainer *t, int best) {
    char path[1024], err[1024], meta[10][64], sig[1400];
    Model *m = &t->m;
    snprintf(meta[0], 64, "%d", t->epoch);
    t->sd_ema.nbt = t->sd.nbt;
    state_dict_build(&t->sd_ema, m, t->ema.params, t->ema.buffers);
    char scale[2] = {m->scale, 0}, ncs[16];
    snprintf(ncs, sizeof ncs, "%d", m->nc);
    const char *wkv[] = {"format", "yolo.c", "scale", scale, "nc", ncs, "epoch", meta[0], NULL};
    snprintf(path, sizeof path, "%s/weights/last.safetensors", t->dir);
    if (weights_save(path, t->sd_ema.ref, t->sd_ema.n, wkv, ST_F32, err, sizeof err))
        fprintf(stderr, "warning: %s\n", err);
    if (best) {
        snprintf(path, sizeof path, "%s/weights/best.safetensors", t->dir);
        if (weights_save(path, t->sd_ema.ref, t->sd_ema.n, wkv, ST_F32, err, sizeof err))
            fprintf(stderr, "warning: %s\n", err);
    }
    int n = 0;
    StTensor *ts = xcalloc((size_t)t->sd.n * 2 + 8, sizeof(StTensor));
    char (*names)[80] = xcalloc((size_t)t->sd.n * 2 + 8, 80);
    const char *pre[2] = {"model.", "ema."};
    for (int k = 0; k < 2; k++) {
        StateDict *sd = k ? &t->sd_ema : &t->sd;
        for (int i = 0; i < sd->n; i++) {
            if (sd->ref[i].kind == PARAM_COUNT) continue;
            snprintf(names[n], 80, "%s%s", pre[k], sd->ref[i].name + 6);
            ts[n] = (StTensor){.name = names[n], .dtype = ST_F32, .ndim = sd->ref[i].ndim, .data = sd->ref[i].data};
            memcpy(ts[n].shape, sd->ref[i].shape, sizeof sd->ref[i].shape);
            n++;
        }
    }
    ts[n++] =
            (StTensor){.name = "optim.m", .dtype = ST_F32, .ndim = 1, .shape = {(int64_t)m->nparams}, .data = t->opt.m};
    if (t->opt.v)
        ts[n++] = (StTensor){
                .name = "optim.v", .dtype = ST_F32, .ndim = 1, .shape = {(int64_t)m->nparams}, .data = t->opt.v};
    ts[n++] = (StTensor){
            .name = "optim.grad", .dtype = ST_F32, .ndim = 1, .shape = {(int64_t)m->nparams}, .data = m->grads};
    snprintf(meta[1], 64, "%ld", t->opt.step);
    snprintf(meta[2], 64, "%ld", t->ema.updates);
    snprintf(meta[3], 64, "%ld", t->last_opt_step);
    snprintf(meta[4], 64, "%.17g", t->best_fitness);
    snprintf(meta[5], 64, "%d", t->best_epoch);
    snprintf(meta[6], 64, "%lld", (long long)t->sd.nbt);
    snprintf(meta[7], 64, "%.17g", t->opt.momentum);
    snprintf(meta[8], 64, "%.17g", t->amp_scale);
    snprintf(meta[9], 64, "%d", t->amp_good);
    trainer_signature(t, sig, sizeof sig);
    const char *kv[] = {"epoch",
                        meta[0],
                        "opt_step",
                        meta[1],
                        "ema_updates",
                        meta[2],
                        "last_opt_step",
                        meta[3],
                        "best_fitness",
                        meta[4],
                        "best_epoch",
                        meta[5],
                        "num_batches_tracked",
                        meta[6],
                        "momentum",
                        meta[7],
                        "amp_scale",
                        meta[8],
                        "amp_good_steps",
                        meta[9],
                        "settings",
                        sig,
                        NULL};
    snprintf(path, sizeof path, "%s/weights/last.ckpt", t->dir);
    if (st_write(path, ts, n, kv, err, sizeof err)) fprintf(stderr, "warning: checkpoint not saved: %s\n", err);
    free(ts);
    free(names);
}

// trainer_resume: restores everything trainer_save wrote.
static void trainer_resume(Trainer *t) {
    char path[1024], err[1024];
    snprintf(path, sizeof path, "%s/weights/last.ckpt", t->dir);
    SafeTensors st;
    if (st_open(path, &st, err, sizeof err)) die("resume: %s", err);
    StateDict *sd = xcalloc(1, sizeof(StateDict));
    const char *pre[2] = {"model.", "ema."};
    for (int k = 0; k < 2; k++) {
        state_dict_build(sd, &t->m, k ? t->ema.params : t->m.params, k ? t->ema.buffers : t->m.buffers);
        for (int i = 0; i < sd->n; i++) {
            if (sd->ref[i].kind == PARAM_COUNT) continue;
            char nm[96];
            snprintf(nm, sizeof nm, "%s%s", pre[k], sd->ref[i].name + 6);
            const StEntry *e = st_find(&st, nm);
            if (!e || e->numel != param_numel(&sd->ref[i]))
                die("resume: %s: tensor '%s' missing or of the wrong size", path, nm);
            if (st_read_f32(&st, e, sd->ref[i].data, err, sizeof err)) die("resume: %s", err);
        }
    }
    const StEntry *e = st_find(&st, "optim.m");
    if (!e || (size_t)e->numel != t->m.nparams || st_read_f32(&st, e, t->opt.m, err, sizeof err))
        die("resume: %s: optim.m", path);
    if (t->opt.v) {
        e = st_find(&st, "optim.v");
        if (!e || (size_t)e->numel != t->m.nparams || st_read_f32(&st, e, t->opt.v, err, sizeof err))
            die("resume: %s: optim.v missing (was the run started with another optimizer?)", path);
    }
    const char *k[] = {"epoch",        "opt_step",   "ema_updates",         "last_opt_step",
                       "best_fitness", "best_epoch", "num_batches_tracked", "momentum",
                       "settings"};
    for (int i = 0; i < 9; i++)
        if (!st_meta(&st, k[i])) die("resume: %s: metadata '%s' missing", path, k[i]);
    char sig[1400];
    trainer_signature(t, sig, sizeof sig);
    if (strcmp(sig, st_meta(&st, "settings")))
        die("resume: %s was written by a run with other settings; resume with the same ones.\n  checkpoint: %s\n  now: "
            "       %s",
            path, st_meta(&st, "settings"), sig);
    e = st_find(&st, "optim.grad");
    if (!e || (size_t)e->numel != t->m.nparams || st_read_f32(&st, e, t->m.grads, err, sizeof err))
        die("resume: %s: optim.grad", path);
    t->opt.momentum = atof(st_meta(&st, "momentum"));
    t->epoch = atoi(st_meta(&st, "epoch"));
    t->opt.step = atol(st_meta(&st, "opt_step"));
    t->ema.updates = atol(st_meta(&st, "ema_updates"));
    t->last_opt_step = atol(st_meta(&st, "last_opt_step"));
    t->best_fitness = atof(st_meta(&st, "best_fitness"));
    t->best_epoch = atoi(st_meta(&st, "best_epoch"));
    t->sd.nbt = atoll(st_meta(&st, "num_batches_tracked"));
    if (st_meta(&st, "amp_scale") &&
        st_meta(&st, "amp_good_steps")) {   // absent in older checkpoints: a fresh GradScaler
        t->amp_scale = atof(st_meta(&st, "amp_scale"));
        t->amp_good = atoi(st_meta(&st, "amp_good_steps"));
        if (!(t->amp_scale > 0) || !isfinite(t->amp_scale))
            die("resume: %s: metadata amp_scale=%s is not a positive number", path, st_meta(&st, "amp_scale"));
    }
    st_close(&st);
    free(sd);
    printf("resuming %s from epoch %d\n", path, t->epoch + 1);
}

// trainer_validate: the EMA in eval mode over the validation set: loss, NMS (conf 0.001, IoU
// 0.7, multi-label, max_det 300), matching and mAP (DetectionValidator). Runs inside the training arena.
// draw: val_batch0-2_labels.jpg and _pred.jpg into t->dir (val_pics_add).
static Metrics trainer_validate(Trainer *t, double vloss[3], int draw) {
    Model *m = &t->m;
    float *keep_p = m->params, *keep_b = m->buffers;
    m->params = t->ema.params;
    m->buffers = t->ema.buffers;
    evaluator_reset(&t->ev);
    vloss[0] = vloss[1] = vloss[2] = 0;
    int nbv = 0;
    loader_start_epoch(t->val_ld, 0, 0);
    const Batch *bt;
    float *gt = xmalloc((size_t)(t->vB * t->cfg.max_boxes + 1) * 4 * sizeof(float));
    int *gc = xmalloc((size_t)(t->vB * t->cfg.max_boxes + 1) * sizeof(int));
    ValPics vp = {0};
    t->ops->use_ema(t, 1);
    while ((bt = loader_next(t->val_ld))) {
        LossOut lo;
        const float *const *heads = t->ops->eval(t, bt, &lo);   // the forward and the loss; NMS below, on the host
        vloss[0] += lo.box, vloss[1] += lo.cls, vloss[2] += lo.dfl;
        nbv++;
        for (int b = 0; b < bt->B; b++) {
            int n = nms_run_maps(&t->nms, heads, b, bt->H, bt->W, t->dets);
            int M = 0;
            for (int i = 0; i < bt->n; i++)
                if (bt->batch_idx[i] == b) {
                    const float *bx = bt->box + 4 * i;
                    gt[4 * M + 0] = (bx[0] - bx[2] / 2) * bt->W;
                    gt[4 * M + 1] = (bx[1] - bx[3] / 2) * bt->H;
                    gt[4 * M + 2] = (bx[0] + bx[2] / 2) * bt->W;
                    gt[4 * M + 3] = (bx[1] + bx[3] / 2) * bt->H;
                    gc[M++] = bt->cls[i];
                }
            evaluator_add_image(&t->ev, t->dets, n, gt, gc, M);
            if (draw) val_pics_add(&vp, t->dir, nbv - 1, bt, b, t->dets, n, &t->data, &t->val_ds);
        }
        t->ops->eval_done(t);
    }
    t->ops->use_ema(t, 0);
    free(vp.box);
    free(gt);
    free(gc);
    for (int k = 0; k < 3; k++) vloss[k] /= nbv > 0 ? nbv : 1;
    m->params = keep_p;
    m->buffers = keep_b;
    Metrics mt;
    evaluator_compute(&t->ev, &mt);
    return mt;
}

// plot_results: results.png, one small panel per curve (losses and metrics over epochs).
static void plot_results(const char *dir, double (*rows)[11], int n) {
    static const char *titles[10] = {"train/box_loss", "train/cls_loss", "train/dfl_loss", "metrics/precision(B)",
                                     "metrics/recall(B)", "val/box_loss", "val/cls_loss", "val/dfl_loss",
                                     "metrics/mAP50(B)", "metrics/mAP50-95(B)"};
    static const int col[10] = {1, 2, 3, 4, 5, 8, 9, 10, 6, 7};
    int pw = 240, ph = 180;
    Image img = image_alloc(5 * pw, 2 * ph);
    memset(img.px, 255, (size_t)img.w * img.h * 3);
    for (int k = 0; k < 10; k++) {
        int ox = (k % 5) * pw, oy = (k / 5) * ph, x0 = ox + 30, x1 = ox + pw - 10, y0 = oy + 20, y1 = oy + ph - 20;
        image_draw_text(&img, ox + 8, oy + 5, titles[k], 0, 0, 0, 1);
        image_draw_box(&img, x0, y0, x1, y1, 160, 160, 160, 1);
        double lo = 1e30, hi = -1e30;
        for (int i = 0; i < n; i++) lo = fmin(lo, rows[i][col[k]]), hi = fmax(hi, rows[i][col[k]]);
        if (!(hi > lo)) hi = lo + 1;
        char lab[32];
        snprintf(lab, sizeof lab, "%.3g", hi);
        image_draw_text(&img, ox + 2, y0 + 2, lab, 90, 90, 90, 1);
        snprintf(lab, sizeof lab, "%.3g", lo);
        image_draw_text(&img, ox + 2, y1 - 8, lab, 90, 90, 90, 1);
        for (int i = 1; i < n; i++) {
            double xa = x0 + (double)(i - 1) / (n - 1) * (x1 - x0), xb = x0 + (double)i / (n - 1) * (x1 - x0);
            double ya = y1 - (rows[i - 1][col[k]] - lo) / (hi - lo) * (y1 - y0),
                   yb = y1 - (rows[i][col[k]] - lo) / (hi - lo) * (y1 - y0);
            image_draw_line(&img, xa, ya, xb, yb, 2, 31, 119, 180);
        }
    }
    char path[1024];
    snprintf(path, sizeof path, "%s/results.png", dir);
    image_save_png(path, &img);
    image_free(&img);
}

static int tty_out;

static int strcmp_ptr(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

// results_reload: on resume, keeps the results.csv rows of the epochs the checkpoint covers
// (a kill can land between a row and the next checkpoint) and reads them back for results.png.
// The file is rewritten atomically. Returns the rows kept.
static int results_reload(const char *csv, int upto, double (*rows)[11], int maxrows) {
    FILE *f = fopen(csv, "r");
    if (!f) return 0;
    char tmp[1100], line[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", csv);
    FILE *o = xfopen(tmp, "w");
    int n = 0, first = 1;
    while (fgets(line, sizeof line, f)) {
        if (first) { fputs(line, o); first = 0; continue; }
        double v[15];
        int k = sscanf(line, "%lf,%lf,%lf,%lf,%lf,%lf,%lf,%lf,%lf,%lf,%lf,%lf,%lf,%lf,%lf", &v[0], &v[1], &v[2], &v[3],
                       &v[4], &v[5], &v[6], &v[7], &v[8], &v[9], &v[10], &v[11], &v[12], &v[13], &v[14]);
        if (k != 15 || v[0] > upto || n >= maxrows) continue;
        fputs(line, o);
        double r[11] = {v[0], v[2], v[3], v[4], v[5], v[6], v[7], v[8], v[9], v[10], v[11]};
        memcpy(rows[n++], r, sizeof r);
    }
    fclose(f);
    if (fflush(o) || fsync(fileno(o)) || fclose(o) || rename(tmp, csv))
        die("cannot rewrite %s: %s", csv, strerror(errno));
    return n;
}

// PlanOpts: the settings that decide training memory (yolo plan, AutoBatch); half: the device
// step's plan; fp32: its amp=0 form
typedef struct { char scale; int nc, B, S, max_boxes, adamw, recompute, half, fp32; } PlanOpts;
static int plan_max_batch(PlanOpts o, size_t budget);

// trainer_auto_batch: batch=-1 / batch=0.7: the largest batch whose device plan fits that share of
// the device's free memory (Ultralytics' AutoBatch, computed from the plan instead of probed; the
// optimizer's moments planned as AdamW's, the larger). On the CPU: 16, as Ultralytics.
static int trainer_auto_batch(const Config *c, int dev, char scale, int nc) {
    double frac = c->batch_auto == -1 ? AUTOBATCH_FRACTION : c->batch_auto;
    if (dev < 0) {
        fprintf(stderr,
                "batch=%g: AutoBatch sizes the batch from GPU memory, and this run is on the CPU; using batch=16\n",
                c->batch_auto);
        return 16;
    }
    size_t fr = 0, total = 0;
    gpu_mem_info(dev, &fr, &total);
    PlanOpts o = {.scale = scale,
                  .nc = nc,
                  .S = c->imgsz,
                  .max_boxes = c->max_boxes,
                  .adamw = 1,
                  .recompute = c->recompute,
                  .half = 1,
                  .fp32 = !c->amp};
    // plan_max_batch adds the CUDA context estimate, which `fr` has already paid
    int b = plan_max_batch(o, (size_t)(fr * frac) + GPU_CONTEXT_BYTES);
    if (b < 1) die("batch=%g: not even batch 1 fits %.0f%% of the %.0f MiB free on device %d (see yolo plan)",
                   c->batch_auto, frac * 100, fr / 1048576.0, dev);
    printf("AutoBatch: batch %d is the largest whose plan fits %.0f%% of the %.0f MiB free on device %d (of %.0f "
           "MiB)\n",
           b, frac * 100, fr / 1048576.0, dev, total / 1048576.0);
    return b;
}

// ---- the trainer's backends: where the steps run, chosen once (trainer_ops) ----

// CPU: the host arena holds the whole step (trainer_step on the CPU walk)
static void cpu_trainer_open(Trainer *t, int train) { (void)t, (void)train; }
// cpu_trainer_step: forward, loss, backward of one batch; a non-finite loss or running stat undoes
// the BN update (and a backward that ran on broken statistics); the accumulation window goes on
static LossOut cpu_trainer_step(Trainer *t, const Batch *bt, int *bad) {
    input_from_batch(t->x, bt);
    memcpy(t->bn_keep, t->m.buffers, t->m.nbuffers * sizeof(float));
    LossOut lo = trainer_step(t, bt, bt->B, bt->H, bt->W, 1);
    *bad = !isfinite(lo.total) || !all_finite(t->m.buffers, t->m.nbuffers);
    if (*bad) {
        memcpy(t->m.buffers, t->bn_keep, t->m.nbuffers * sizeof(float));   // the BN update is undone too
        if (isfinite(lo.total)) model_zero_grad(&t->m);   // a backward ran on a batch with broken BN statistics
    }
    return lo;
}
// cpu_trainer_optimize: clip to norm 10, the optimizer and the EMA (a non-finite norm skips both)
static int cpu_trainer_optimize(Trainer *t) {
    double norm = grad_clip_norm(&t->m, GRAD_CLIP_NORM);
    if (isfinite(norm)) {
        optim_step(&t->opt, &t->m);
        ema_update(&t->ema, &t->m);
    } else {
        t->nan_skips++;
        fprintf(stderr, "warning: non-finite gradient norm: step skipped\n");
    }
    model_zero_grad(&t->m);
    return 0;
}
static const float *const *cpu_trainer_eval(Trainer *t, const Batch *bt, LossOut *lo) {
    input_from_batch(t->x, bt);
    *lo = trainer_step(t, bt, bt->B, bt->H, bt->W, 0);
    return (const float *const *)t->m.head;
}
static void cpu_trainer_eval_done(Trainer *t) { model_release(&t->m, t->arena); }
static void cpu_trainer_use_ema(Trainer *t, int on) { (void)t, (void)on; }   // trainer_validate swaps the host's
static void cpu_trainer_sync(Trainer *t) { (void)t; }
static double cpu_trainer_mem_mib(Trainer *t) { return t->arena->cap / 1048576.0; }
static const Arena *cpu_trainer_arena(Trainer *t) { return t->arena; }
static void cpu_trainer_close(Trainer *t, int train) { (void)t, (void)train; }
static const TrainerOps cpu_trainer_ops = {
    "host", cpu_trainer_open, cpu_trainer_step, cpu_trainer_optimize, cpu_trainer_eval, cpu_trainer_eval_done,
    cpu_trainer_use_ema, cpu_trainer_sync, cpu_trainer_mem_mib, cpu_trainer_arena, cpu_trainer_close,
};

#ifdef YOLO_CUDA
// trainer_gpu_shapes: the steps a run's device arena must hold, into sh (2 + validation batches):
// with train, the training step at (B, S, S) and the short last batch; then every distinct
// validation batch shape (the last batch short too). Returns how many.
static int trainer_gpu_shapes(const Trainer *t, int train, GpuShape *sh) {
    const Loader *vl = t->val_ld;
    int ns = 0;
    if (train) sh[ns++] = (GpuShape){t->B, t->S, t->S, 1};
    if (train && t->B_last) sh[ns++] = (GpuShape){t->B_last, t->S, t->S, 1};
    for (int i = 0; i < vl->nbatch; i++) {
        GpuShape v = {i == vl->nbatch - 1 && t->vB_last ? t->vB_last : t->vB, vl->shape[i][0], vl->shape[i][1], 0};
        int seen = 0;
        for (int k = 0; k < ns && !seen; k++) seen = !memcmp(&sh[k], &v, sizeof v);
        if (!seen) sh[ns++] = v;
    }
    return ns;
}

// gpu_trainer_open: the device arena for the run's steps (training: full and short last batch; and
// every validation shape), one cudaMalloc, the host's state uploaded
static void gpu_trainer_open(Trainer *t, int train) {
    GpuShape *sh = xmalloc(sizeof(GpuShape) * (size_t)(2 + t->val_ld->nbatch));
    int ns = trainer_gpu_shapes(t, train, sh);
    if (train) {
        t->gpu = gpu_open(&t->m, t->dev, t->cfg.amp, ns, sh, &t->opt, t->ema.params, t->ema.buffers, &t->lcfg);
        t->gpu->ema_updates = t->ema.updates;
        if (t->cfg.amp) t->gpu->scaler.scale = (float)t->amp_scale, t->gpu->scaler.good_steps = t->amp_good;
        // at the restored scale; in a data-parallel run rank 0's (the others start the window at 0,
        // so the all-reduce that ends it does not count the checkpoint's gradient once per rank)
        if (t->cfg.resume && ddp.rank == 0) gpu_upload_grads(t->gpu, t->m.grads);
    } else {   // evaluation shapes only: weights, running stats and the forward
        Optimizer none = {.kind = OPT_SGD};
        t->gpu = gpu_open(&t->m, t->dev, 1, ns, sh, &none, NULL, NULL, &t->lcfg);
    }
    gpu_report(t->gpu, t->dev);
    gpu_pin_loader(t->train_ld, 1);
    gpu_pin_loader(t->val_ld, 1);
    free(sh);
}
// gpu_trainer_step: a non-finite loss skips the backward; its BN update is undone and the
// accumulation window dropped
static LossOut gpu_trainer_step(Trainer *t, const Batch *bt, int *bad) {
    GpuShape sh = {bt->B, bt->H, bt->W, 1};
    LossTargets tg = {bt->n, bt->batch_idx, bt->cls, bt->box};
    LossOut lo = gpu_train_step(t->gpu, &sh, bt->img, &tg, &t->lcfg);
    *bad = !isfinite(lo.total);
    if (*bad) {
        gpu_bn_restore(t->gpu);
        gpu_zero_grad(t->gpu);
    }
    return lo;
}
// gpu_trainer_optimize: the host's lr, momentum and decay, then gpu_optimize (GradScaler: an inf/NaN
// gradient skips and halves the scale); 1 when the scale fell below 1 (NaN gradients whatever the scale)
static int gpu_trainer_optimize(Trainer *t) {
    Gpu *g = t->gpu;
    int stop = 0;
    memcpy(g->opt.lr, t->opt.lr, sizeof g->opt.lr);
    g->opt.momentum = t->opt.momentum;
    g->opt.weight_decay = t->opt.weight_decay;
    double norm;
    if (!gpu_optimize(g, &norm)) {
        if (g->f32) {   // amp=0: no GradScaler, so a skip is as unusual as on the CPU
            t->nan_skips++;
            fprintf(stderr, "warning: non-finite gradient norm: step skipped\n");
        } else if (++t->amp_skips > 20 || g->scaler.scale < 1) {
            fprintf(stderr, "warning: GradScaler skipped a step for inf/NaN gradients (%d so far), loss scale now %g\n",
                    t->amp_skips, g->scaler.scale);
        }
        if (!g->f32 && g->scaler.scale < 1) {
            fprintf(stderr, "stopping: the loss scale fell below 1, so the gradients are NaN whatever the scale; "
                            "the last checkpoint %s/weights/last.ckpt is intact (hint: lower lr0, check the labels, "
                            "try amp=0)\n", t->dir);
            stop = 1;
        }
    }
    gpu_zero_grad(g);
    return stop;
}
// gpu_trainer_eval: the forward and the loss on the device, the head maps back for NMS on the host
static const float *const *gpu_trainer_eval(Trainer *t, const Batch *bt, LossOut *lo) {
    GpuShape sh = {bt->B, bt->H, bt->W, 0};
    LossTargets tg = {bt->n, bt->batch_idx, bt->cls, bt->box};
    return (const float *const *)gpu_eval(t->gpu, &sh, bt->img, &tg, &t->lcfg, lo);
}
static void gpu_trainer_eval_done(Trainer *t) { (void)t; }
static void gpu_trainer_use_ema(Trainer *t, int on) { gpu_use_ema(t->gpu, on); }
// gpu_trainer_sync: the device's state to the host for the checkpoint
static void gpu_trainer_sync(Trainer *t) {
    Gpu *g = t->gpu;
    gpu_download(g, t->m.params, t->m.buffers, t->m.grads, t->ema.params, t->ema.buffers, t->opt.m, t->opt.v);
    t->opt.step = g->opt.step;
    t->ema.updates = g->ema_updates;
    if (!g->f32) t->amp_scale = g->scaler.scale, t->amp_good = g->scaler.good_steps;
}
static double gpu_trainer_mem_mib(Trainer *t) { return gpu_in_use(t->gpu) / 1048576.0; }
static const Arena *gpu_trainer_arena(Trainer *t) { return t->gpu->a; }
static void gpu_trainer_close(Trainer *t, int train) {
    if (train && !t->gpu->f32)
        printf("GradScaler: %d optimizer steps skipped for inf/NaN gradients, loss scale now %g\n", t->amp_skips,
               t->gpu->scaler.scale);
    gpu_pin_loader(t->train_ld, 0);
    gpu_pin_loader(t->val_ld, 0);
    gpu_close(t->gpu);
}
static const TrainerOps gpu_trainer_ops = {
    "device", gpu_trainer_open, gpu_trainer_step, gpu_trainer_optimize, gpu_trainer_eval, gpu_trainer_eval_done,
    gpu_trainer_use_ema, gpu_trainer_sync, gpu_trainer_mem_mib, gpu_trainer_arena, gpu_trainer_close,
};
#endif

// ------------------------------------------------------------------------------------------
// data parallel: one process per GPU over NCCL (Ultralytics' DDP)
// ------------------------------------------------------------------------------------------
/*
 * `yolo train device=0,1,2,3` is a launcher: it picks the run folder and an NCCL unique id, starts
 * one worker process per device (this binary again, with RANK, WORLD_SIZE, LOCAL_RANK in its
 * environment, as torchrun sets them) and waits for them. A worker is a normal device run with:
 *   - batch= the global batch, split evenly (a batch the ranks do not divide is refused); accumulate
 *     and weight decay from the global batch, so the nominal batch stays nbs=64;
 *   - its shard of every epoch's shuffled order (loader_global: DistributedSampler's, the shuffle
 *     the same on every rank), each sample's augmentation seeded by its position in the epoch;
 *   - every rank's gradient summed over the ranks (ncclAllReduce), bucket by bucket while the
 *     backward runs (see "the gradient all-reduce" below). Each rank's
 *     gradient is that of its batch's loss x its batch size (as Ultralytics' loss returns it);
 *     DDP multiplies by world_size and averages, which is the same sum. So the update is the one a
 *     single process makes accumulating the same sub-batches;
 *   - BN batch statistics per rank (no SyncBN); after each step the running statistics are rank 0's
 *     (ncclBroadcast, as DDP's broadcast_buffers), so the running stats and the EMA built from them
 *     are identical on every rank; a non-finite loss on any rank skips the step on all of them;
 *   - validation, plots, results.csv and checkpoints on rank 0 only; the others wait for its verdict
 *     (stop or go on) at the end of each epoch.
 * Faults: every collective is waited for with a watchdog (ddp_wait: ncclCommGetAsyncError, and a
 * timeout of YOLO_DDP_TIMEOUT seconds, default 600); on an error the rank aborts its communicator
 * (ncclCommAbort), says so naming itself, and exits 1. The launcher names the rank that died first
 * and stops the rest if they have not stopped within the timeout. last.ckpt is only ever replaced
 * by a rename, so it is intact; the checkpoint does not depend on the number of ranks (resume=1 on
 * any number of GPUs with the same global batch).
 * Several machines: start the same command on every machine with torchrun-style variables (RANK,
 * WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT; Slurm's SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID
 * and OpenMPI's OMPI_COMM_WORLD_* are read too); rank 0 serves the unique id on MASTER_ADDR:MASTER_PORT
 * (ddp_rendezvous, TCP), or with MPI_Bcast when mpirun started the ranks and MPI was linked.
 */
// ddp_rank_batch: the per-rank batch of global batch B (Ultralytics splits batch= over the ranks)
static int ddp_rank_batch(int B) {
    if (B % ddp.world)
        die("batch=%d does not split evenly over %d GPUs: give a multiple of %d (batch= is the global batch, as in "
            "Ultralytics)",
            B, ddp.world, ddp.world);
    return B / ddp.world;
}

// ddp_comm_note: the end of the epoch line in a data-parallel run: the epoch's gradient
// communication not hidden by compute (the all-reduces' time past the end of each backward)
static const char *ddp_comm_note(char *buf, size_t n) {
    if (ddp.world > 1) snprintf(buf, n, "  all-reduce %.2f s not hidden", ddp.comm_s);
    else buf[0] = 0;
    return buf;
}

// ddp_env: a launcher's variable: torchrun's name, else Slurm's, else OpenMPI's; -1 when none is set
static int ddp_env(const char *torch, const char *slurm, const char *ompi) {
    const char *v = getenv(torch);
    if (!v || !*v) v = getenv(slurm);
    if (!v || !*v) v = getenv(ompi);
    return v && *v ? atoi(v) : -1;
}

#ifdef YOLO_NCCL
#include <sys/socket.h>
#include <sys/wait.h>
#include <netdb.h>
#include <poll.h>

#define NCCL_CHECK(x) do { ncclResult_t r_ = (x); if (r_ != ncclSuccess) \
    die("rank %d: %s: %s (NCCL_DEBUG=WARN says more)", ddp.rank, #x, ncclGetErrorString(r_)); } while (0)
#define DDP_BUCKET_FLOATS ((size_t)25 << 18)   // 25 MiB of FP32 gradients per all-reduce (DDP's bucket_cap_mb)

// ddp_fatal: a collective failed or timed out: abort the communicator, say so, stop this rank
static void ddp_fatal(const char *what, const char *why) {
    fprintf(stderr, "rank %d of %d: %s: %s; another rank died or hung. Stopping this rank; the last checkpoint "
                    "(weights/last.ckpt) is intact: resume=1 continues from it\n", ddp.rank, ddp.world, what, why);
    if (ddp.comm) ncclCommAbort(ddp.comm);
    ddp.comm = NULL;
    exit(1);
}

// ddp_wait: the watchdog: until the stream's work (the collectives on it) is done, checking
// NCCL's asynchronous error; past ddp.timeout seconds the communicator is aborted
static void ddp_wait(void *stream, const char *what) {
    double t0 = now_sec();
    for (;;) {
        ncclResult_t ae;
        NCCL_CHECK(ncclCommGetAsyncError(ddp.comm, &ae));
        if (ae != ncclSuccess) ddp_fatal(what, ncclGetErrorString(ae));
        cudaError_t e = cudaStreamQuery((cudaStream_t)stream);
        if (e == cudaSuccess) break;
        if (e != cudaErrorNotReady) GPU_CHECK(e);
        if (now_sec() - t0 > ddp.timeout) {
            char why[96];
            snprintf(why, sizeof why, "not done after %.0f s (YOLO_DDP_TIMEOUT)", ddp.timeout);
            ddp_fatal(what, why);
        }
        usleep(200);
    }
    ncclResult_t ae;   // the emulation (and a collective that failed fast) reports on completion
    NCCL_CHECK(ncclCommGetAsyncError(ddp.comm, &ae));
    if (ae != ncclSuccess) ddp_fatal(what, ncclGetErrorString(ae));
}

// ddp_agree: v of every rank combined (op ncclMax or ncclSum; root >= 0: rank root's value instead)
static int ddp_agree(int v, int op, int root, void *stream) {
    GPU_CHECK(cudaMemcpy(ddp.ctl, &v, sizeof v, cudaMemcpyHostToDevice));
    if (root >= 0) NCCL_CHECK(ncclBroadcast(ddp.ctl, ddp.ctl, 1, ncclInt32, root, ddp.comm, (cudaStream_t)stream));
    else NCCL_CHECK(ncclAllReduce(ddp.ctl, ddp.ctl, 1, ncclInt32, (ncclRedOp_t)op, ddp.comm, (cudaStream_t)stream));
    ddp_wait(stream, root >= 0 ? "ncclBroadcast (rank 0's decision)" : "ncclAllReduce (a flag)");
    GPU_CHECK(cudaMemcpy(&v, ddp.ctl, sizeof v, cudaMemcpyDeviceToHost));
    return v;
}

// ddp_comm_open: the communicator on this rank's device, before the arena: its memory (and that of
// a warm-up all-reduce, with NCCL connecting at init) is measured with cudaMemGetInfo, so the plan's
// one cudaMalloc comes after everything NCCL takes
static void ddp_comm_open(ncclUniqueId id) {
    setenv("NCCL_RUNTIME_CONNECT", "0", 0);
    GPU_CHECK(cudaSetDevice(ddp.dev));
    size_t fr0, fr1, total;
    GPU_CHECK(cudaMemGetInfo(&fr0, &total));
    NCCL_CHECK(ncclCommInitRank(&ddp.comm, ddp.world, id, ddp.rank));
    GPU_CHECK(cudaMalloc((void **)&ddp.ctl, 16 * sizeof(int)));
    GPU_CHECK(cudaStreamCreateWithFlags(&ddp.cstream, cudaStreamNonBlocking));
    GPU_CHECK(cudaEventCreateWithFlags(&ddp.ev, cudaEventDisableTiming));
    GPU_CHECK(cudaEventCreate(&ddp.ev_bwd));
    GPU_CHECK(cudaEventCreate(&ddp.ev_comm));
    if (ddp_agree(1, ncclSum, -1, NULL) != ddp.world)
        die("rank %d: the warm-up all-reduce did not count %d ranks", ddp.rank, ddp.world);
    GPU_CHECK(cudaMemGetInfo(&fr1, &total));
    ddp.comm_bytes = fr0 > fr1 ? fr0 - fr1 : 0;
    printf("NCCL: rank %d of %d on device %d; the communicator took %.1f MiB of device memory (measured before the "
           "arena)\n",
           ddp.rank, ddp.world, ddp.dev, ddp.comm_bytes / 1048576.0);
}

// ---- the data-parallel trainer backend: the device's, plus the collectives ----
static void ddp_buckets_open(const Model *m);
static void ddp_grads_done(Gpu *g, const Conv *c);
static void ddp_trainer_open(Trainer *t, int train) {
    gpu_trainer_open(t, train);
    if (!train) return;
    ddp_buckets_open(&t->m);
    t->gpu->grads_done = ddp_grads_done;
}
// ddp_trainer_step: the device step, its gradient buckets armed (all-reduced during its backward when
// it ends an accumulation window); a non-finite loss on any rank skips the step on every rank; then
// rank 0's BN running statistics to every rank
static LossOut ddp_trainer_step(Trainer *t, const Batch *bt, int *bad) {
    ddp.sync = t->will_optimize, ddp.next = 0;
    memcpy(ddp.left, ddp.nconv, sizeof ddp.left);
    LossOut lo = gpu_trainer_step(t, bt, bad);
    if (ddp_agree(*bad, ncclMax, -1, t->gpu->stream) && !*bad) {
        gpu_bn_restore(t->gpu);
        gpu_zero_grad(t->gpu);
        *bad = 1;
    }
    if (*bad) ddp.reduced = 0;   // the window starts again from zero gradients
    Gpu *g = t->gpu;
    NCCL_CHECK(ncclBroadcast(g->buffers, g->buffers, t->m.nbuffers, ncclFloat32, 0, ddp.comm, (cudaStream_t)g->stream));
    ddp_wait(g->stream, "ncclBroadcast (BN running statistics)");
    return lo;
}
// ---- the gradient all-reduce, overlapped with the backward (DDP's Reducer) ----
// The gradient is cut into buckets from its end: the first of 1 MiB, the others of 25 MiB (DDP's
// first_bucket_bytes and bucket_cap_mb; YOLO_DDP_BUCKET_MB sets the 25). The backward runs from the
// head to the stem, so the parameters at the end of the array are the first whose gradients are
// final. When the last conv of a bucket has its weight gradient (ddp_grads_done, called by
// gpu_conv_grads), the bucket is all-reduced on a stream of its own while the backward goes on;
// buckets start in bucket order only, so every rank issues the same collectives in the same order.
// Only the backward that ends an accumulation window all-reduces (the gradient accumulated so far
// is summed once); the others accumulate locally, as DDP under no_sync.
// ddp_in_bucket: whether conv c has parameters in bucket i (a conv's parameters are contiguous)
static int ddp_in_bucket(const Conv *c, int i) { return c->w_off < ddp.hi[i] && c->b_off + c->cout > ddp.lo[i]; }
static void ddp_buckets_open(const Model *m) {
    const char *v = getenv("YOLO_DDP_BUCKET_MB");
    double mb = v && *v ? atof(v) : 25;
    if (!(mb > 0 && mb <= 1024)) die("YOLO_DDP_BUCKET_MB=%s: expected a size in MiB in (0, 1024]", v);
    size_t cap = (size_t)(mb * 262144) ? (size_t)(mb * 262144) : 1, first = cap < 262144 ? cap : 262144;
    size_t hi = m->nparams;
    ddp.nbucket = 0;
    while (hi > 0) {
        if (ddp.nbucket == DDP_MAX_BUCKETS)
            die("YOLO_DDP_BUCKET_MB=%s: more than %d buckets for %zu parameters: give a larger size", v,
                DDP_MAX_BUCKETS, m->nparams);
        size_t n = ddp.nbucket ? cap : first, lo = hi > n ? hi - n : 0;
        ddp.lo[ddp.nbucket] = lo, ddp.hi[ddp.nbucket] = hi, ddp.nconv[ddp.nbucket] = 0;
        ddp.nbucket++;
        hi = lo;
    }
    for (int k = 0; k < m->nexec; k++)   // the convs whose backward runs
        for (int i = 0; i < ddp.nbucket; i++) ddp.nconv[i] += ddp_in_bucket(&m->conv[m->exec[k]], i);
}
// ddp_bucket_launch: the buckets ready, in order, each after the compute stream's work so far
static void ddp_bucket_launch(Gpu *g, int all) {
    while (ddp.next < ddp.nbucket && (all || ddp.left[ddp.next] == 0)) {
        int i = ddp.next++;
        GPU_CHECK(cudaEventRecord(ddp.ev, (cudaStream_t)g->stream));
        GPU_CHECK(cudaStreamWaitEvent(ddp.cstream, ddp.ev, 0));
        NCCL_CHECK(ncclAllReduce(g->grads + ddp.lo[i], g->grads + ddp.lo[i], ddp.hi[i] - ddp.lo[i], ncclFloat32,
                                 ncclSum, ddp.comm, ddp.cstream));
    }
}
// ddp_bucket_join: after the last bucket's launch: the compute stream waits for the all-reduces,
// and the host for them too (the watchdog's wait); the gradients are then summed over the ranks
static void ddp_bucket_join(Gpu *g) {
    GPU_CHECK(cudaEventRecord(ddp.ev_comm, ddp.cstream));
    GPU_CHECK(cudaStreamWaitEvent((cudaStream_t)g->stream, ddp.ev_comm, 0));
    ddp_wait(ddp.cstream, "ncclAllReduce (gradients)");
    ddp.reduced = 1;
}
// ddp_grads_done (Gpu.grads_done): conv c's gradients are final in this backward (c NULL: the
// backward is enqueued). At the end: the rest of the buckets, then the watchdog's wait; the compute
// stream waits for the all-reduces, and the time they ran past the backward (events) is the epoch's
// communication not hidden by compute.
static void ddp_grads_done(Gpu *g, const Conv *c) {
    if (!ddp.sync) return;
    if (c) {
        for (int i = ddp.next; i < ddp.nbucket; i++) ddp.left[i] -= ddp_in_bucket(c, i);
        ddp_bucket_launch(g, 0);
        return;
    }
    GPU_CHECK(cudaEventRecord(ddp.ev_bwd, (cudaStream_t)g->stream));
    ddp.early = ddp.next;
    ddp_bucket_launch(g, 1);
    ddp_bucket_join(g);
    ddp_wait(g->stream, "the backward");
    float ms = 0;
    GPU_CHECK(cudaEventElapsedTime(&ms, ddp.ev_bwd, ddp.ev_comm));
    ddp.comm_s += ms > 0 ? ms / 1000 : 0;
}
// ddp_allreduce_grads: the whole gradient summed over the ranks at once (an optimizer step whose
// window ended in no all-reducing backward: the tests, a resumed window); the wait counts as exposed
static void ddp_allreduce_grads(Gpu *g) {
    double t0 = now_sec();
    NCCL_CHECK(ncclGroupStart());
    ddp.next = 0;
    ddp_bucket_launch(g, 1);
    NCCL_CHECK(ncclGroupEnd());
    ddp_bucket_join(g);
    ddp.comm_s += now_sec() - t0;
}
// ddp_trainer_optimize: the summed gradients, then the device's optimizer step, identical on every rank
static int ddp_trainer_optimize(Trainer *t) {
    if (!ddp.reduced) ddp_allreduce_grads(t->gpu);
    ddp.reduced = 0;
    return gpu_trainer_optimize(t);
}
static void ddp_trainer_close(Trainer *t, int train) {
    gpu_trainer_close(t, train);
    if (ddp.comm) {
        GPU_CHECK(cudaFree(ddp.ctl));
        GPU_CHECK(cudaEventDestroy(ddp.ev));
        GPU_CHECK(cudaEventDestroy(ddp.ev_bwd));
        GPU_CHECK(cudaEventDestroy(ddp.ev_comm));
        GPU_CHECK(cudaStreamDestroy(ddp.cstream));
        ncclCommDestroy(ddp.comm);
        ddp.comm = NULL;
    }
}
static const TrainerOps ddp_trainer_ops = {
    "device", ddp_trainer_open, ddp_trainer_step, ddp_trainer_optimize, gpu_trainer_eval, gpu_trainer_eval_done,
    gpu_trainer_use_ema, gpu_trainer_sync, gpu_trainer_mem_mib, gpu_trainer_arena, ddp_trainer_close,
};

// ddp_min: the smallest of every rank's v
static int ddp_min(int v) { return -ddp_agree(-v, ncclMax, -1, NULL); }

// ddp_agree_stop: rank 0's verdict at the end of an epoch (after its validation and checkpoint)
static int ddp_agree_stop(Trainer *t, int epoch, int stop) {
    stop = ddp_agree(stop, 0, 0, t->gpu->stream);
    t->epoch = epoch + 1;
    return stop;
}

// DdpHello: what rank 0 tells the others at start: the NCCL unique id and the run folder (rank 0's
// run_dir, so every rank writes to the same one; it goes to YOLO_RUN_DIR)
typedef struct { ncclUniqueId id; char dir[768]; } DdpHello;
#ifdef YOLO_MPI
#include <mpi.h>
// ddp_mpi_launched: started by mpirun (OpenMPI's variables, or a PMI/PMIx launcher such as MPICH's
// hydra or Slurm's srun --mpi=pmix)
static int ddp_mpi_launched(void) {
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK");
}
// ddp_mpi_hello: the hello over MPI (MPI_Bcast from rank 0); MPI is used for nothing else, so it
// is finalized at once and a rank that dies later does not leave MPI waiting for it
static void ddp_mpi_hello(DdpHello *msg, const Config *c) {
    int r = -1, n = 0;
    if (MPI_Init(NULL, NULL) != MPI_SUCCESS) die("rank %d: MPI_Init failed (started by mpirun?)", ddp.rank);
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    if (r != ddp.rank || n != ddp.world)
        die("MPI says rank %d of %d, the environment rank %d of %d: start one process per GPU with mpirun -np N", r, n,
            ddp.rank, ddp.world);
    if (r == 0) {
        NCCL_CHECK(ncclGetUniqueId(&msg->id));
        run_dir(msg->dir, sizeof msg->dir, c, "train");
    }
    if (MPI_Bcast(msg, (int)sizeof *msg, MPI_BYTE, 0, MPI_COMM_WORLD) != MPI_SUCCESS)
        die("rank %d: MPI_Bcast of the NCCL id failed", ddp.rank);
    MPI_Finalize();
}
#endif

// ddp_rendezvous: the unique id and the run folder from rank 0 to every rank: over MPI when mpirun
// started the ranks (and this yolo was built with MPI), else over TCP (ddp_tcp_hello)
static void ddp_tcp_hello(DdpHello *msg, const Config *c);
static ncclUniqueId ddp_rendezvous(const Config *c) {
    DdpHello msg;
    memset(&msg, 0, sizeof msg);
#ifdef YOLO_MPI
    if (ddp_mpi_launched()) {
        ddp_mpi_hello(&msg, c);
        printf("rank %d of %d: the NCCL id came over MPI\n", ddp.rank, ddp.world);
    } else
#endif
        ddp_tcp_hello(&msg, c);
    msg.dir[sizeof msg.dir - 1] = 0;
    setenv("YOLO_RUN_DIR", msg.dir, 1);
    return msg.id;
}
// ddp_tcp_hello: rank 0 listens on MASTER_PORT and hands the hello to each rank that connects; the
// others connect to MASTER_ADDR:MASTER_PORT, retrying until ddp.timeout
static void ddp_tcp_hello(DdpHello *out, const Config *c) {
    DdpHello msg = *out;
    const char *host = getenv("MASTER_ADDR"), *port = getenv("MASTER_PORT");
    if (!host || !*host || !port || !*port)
        die("rank %d of %d: MASTER_ADDR and MASTER_PORT must be set: rank 0 hands the NCCL id to the others there "
            "(torchrun sets them; with srun export them, e.g. MASTER_ADDR=<first node> MASTER_PORT=29500; mpirun needs "
            "neither when this yolo was built with MPI: make links it when mpicc is found)",
            ddp.rank, ddp.world);
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = ddp.rank == 0 ? AI_PASSIVE : 0},
                    *ai;
    int e = getaddrinfo(ddp.rank == 0 ? NULL : host, port, &hints, &ai);
    if (e) die("rank %d: MASTER_ADDR=%s MASTER_PORT=%s: %s", ddp.rank, host, port, gai_strerror(e));
    double t0 = now_sec();
    if (ddp.rank == 0) {
        NCCL_CHECK(ncclGetUniqueId(&msg.id));
        run_dir(msg.dir, sizeof msg.dir, c, "train");
        int s = socket(ai->ai_family, SOCK_STREAM, 0), one = 1;
        setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (s < 0 || bind(s, ai->ai_addr, ai->ai_addrlen) || listen(s, ddp.world))
            die("rank 0: cannot listen on port %s for the other ranks: %s", port, strerror(errno));
        for (int served = 1; served < ddp.world;) {
            struct pollfd pf = {.fd = s, .events = POLLIN};
            if (now_sec() - t0 > ddp.timeout)
                die("rank 0: only %d of %d ranks came to port %s in %.0f s", served, ddp.world, port, ddp.timeout);
            if (poll(&pf, 1, 1000) <= 0) continue;
            int k = accept(s, NULL, NULL);
            if (k < 0) continue;
            if (write(k, &msg, sizeof msg) == (ssize_t)sizeof msg) served++;
            close(k);
        }
        close(s);
    } else {
        for (;;) {
            int s = socket(ai->ai_family, SOCK_STREAM, 0);
            size_t got = 0;
            if (s >= 0 && !connect(s, ai->ai_addr, ai->ai_addrlen))
                for (ssize_t k; got < sizeof msg && (k = read(s, (char *)&msg + got, sizeof msg - got)) > 0;)
                    got += (size_t)k;
            if (s >= 0) close(s);
            if (got == sizeof msg) break;
            if (now_sec() - t0 > ddp.timeout)
                die("rank %d: no NCCL id from rank 0 at %s:%s in %.0f s", ddp.rank, host, port, ddp.timeout);
            usleep(200000);
        }
    }
    freeaddrinfo(ai);
    *out = msg;
}

// ddp_spawn: the launcher of device=0,1,...: the run folder and the unique id, one worker per
// device, then waits; the first rank that fails is named, and the rest get ddp.timeout + 30 s to
// stop on their own (they see the failure in their next collective) before they are killed
static int ddp_spawn(Config *c, int argc, char **argv) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) n = 0, (void)cudaGetLastError();
    for (int i = 0; i < ddp.ndev; i++)
        if (ddp.devs[i] >= n)
            die("device=%s: there is no device %d (%d CUDA device(s) present%s%s)", c->device, ddp.devs[i], n,
                e == cudaSuccess ? "" : ": ", e == cudaSuccess ? "" : cudaGetErrorString(e));
    ddp.world = ddp.ndev;
    if (!c->batch_auto) ddp_rank_batch(c->batch);   // refuse an uneven split here, once
    char dir[768], hex[2 * NCCL_UNIQUE_ID_BYTES + 1], num[3][16];
    run_dir(dir, sizeof dir, c, "train");
    ncclUniqueId id;
    NCCL_CHECK(ncclGetUniqueId(&id));
    for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; i++) sprintf(hex + 2 * i, "%02x", (unsigned char)id.internal[i]);
    if (c->batch_auto)
        printf("DDP: %d processes, one per device (%s), AutoBatch on each card, the smallest card's batch on every "
               "one; run folder %s\n",
               ddp.ndev, c->device, dir);
    else printf("DDP: %d processes, one per device (%s), batch %d per device; run folder %s\n", ddp.ndev, c->device,
                c->batch / ddp.ndev, dir);
    fflush(stdout);
    pid_t pid[64];
    (void)argc;
    for (int r = 0; r < ddp.ndev; r++) {
        pid[r] = fork();
        if (pid[r] < 0) die("DDP: cannot start rank %d: %s", r, strerror(errno));
        if (pid[r] == 0) {
            snprintf(num[0], 16, "%d", r), snprintf(num[1], 16, "%d", ddp.ndev);
            setenv("RANK", num[0], 1), setenv("LOCAL_RANK", num[0], 1), setenv("WORLD_SIZE", num[1], 1);
            setenv("YOLO_NCCL_ID", hex, 1), setenv("YOLO_RUN_DIR", dir, 1);
            if (r > 0 && !freopen("/dev/null", "w", stdout))
                _exit(127);   // rank 0 speaks for the run; errors still reach stderr
            execv("/proc/self/exe", argv);   // the same command line: `yolo train ... device=0,1`
            fprintf(stderr, "DDP: cannot start rank %d (/proc/self/exe): %s\n", r, strerror(errno));
            _exit(127);
        }
    }
    int left = ddp.ndev, rc = 0;
    double deadline = 0;
    while (left > 0) {
        int st;
        pid_t w = waitpid(-1, &st, deadline > 0 ? WNOHANG : 0);
        if (w == 0) {
            if (now_sec() > deadline) {
                for (int r = 0; r < ddp.ndev; r++)
                    if (pid[r] > 0)
                        fprintf(stderr, "DDP: rank %d has not stopped; killing it\n", r), kill(pid[r], SIGKILL);
                deadline = now_sec() + 1e9;
            }
            usleep(100000);
            continue;
        }
        if (w < 0) { if (errno == EINTR) continue; break; }
        int r = 0;
        while (r < ddp.ndev && pid[r] != w) r++;
        if (r == ddp.ndev) continue;
        pid[r] = -1;
        left--;
        if (WIFEXITED(st) && WEXITSTATUS(st) == 0) continue;
        if (!rc) {
            if (WIFSIGNALED(st))
                fprintf(stderr, "DDP: rank %d (device %d) was killed by signal %d (%s)", r, ddp.devs[r], WTERMSIG(st),
                        strsignal(WTERMSIG(st)));
            else fprintf(stderr, "DDP: rank %d (device %d) exited with status %d", r, ddp.devs[r], WEXITSTATUS(st));
            fprintf(stderr,
                    "; the other ranks stop at their next collective (at most %.0f s, YOLO_DDP_TIMEOUT). "
                    "The last checkpoint %s/weights/last.ckpt is intact; resume=1 name=... continues it\n",
                    ddp.timeout, dir);
            deadline = now_sec() + ddp.timeout + 30;
        }
        rc = 1;
    }
    return rc;
}
#else
static int ddp_agree_stop(Trainer *t, int epoch, int stop) { (void)t, (void)epoch; return stop; }
static int ddp_min(int v) { return v; }
#endif // YOLO_NCCL

// ddp_launch: decides this process's part. Returns -1 to train here (a single process, or a
// worker of a data-parallel run, ddp set and the communicator open), else the launcher's exit code.
static int ddp_launch(Config *c, int argc, char **argv) {
    const char *to = getenv("YOLO_DDP_TIMEOUT");
    if (to && *to && (ddp.timeout = atof(to)) <= 0) die("YOLO_DDP_TIMEOUT=%s: expected seconds > 0", to);
    if (strchr(c->device, ',')) ddp.ndev = device_list(c->device, ddp.devs, 64);
    int world = ddp_env("WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE");
    if (ddp.ndev <= 1 && world <= 1) return -1;
#if !defined(YOLO_CUDA)
    (void)argc, (void)argv;
    die("device=%s: this yolo was built without CUDA (make found no nvcc), so it cannot train on several GPUs",
        c->device);
#elif !defined(YOLO_NCCL)
    (void)argc, (void)argv;
    die("device=%s: this yolo was built without NCCL, so it cannot train on several GPUs (make links libnccl when it "
        "finds "
        "nccl.h and libnccl: the CUDA toolkit's, or Debian's libnccl-dev)",
        c->device);
#else
    if (world <= 1) return ddp_spawn(c, argc, argv);
    ddp.world = world;
    ddp.rank = ddp_env("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK");
    ddp.local_rank = ddp_env("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK");
    if (ddp.rank < 0 || ddp.rank >= world)
        die("WORLD_SIZE=%d but RANK is %d: every worker needs its RANK (0..%d)", world, ddp.rank, world - 1);
    if (ddp.local_rank < 0) ddp.local_rank = ddp.rank;
    if (ddp.ndev > 0 && ddp.local_rank >= ddp.ndev)
        die("rank %d: LOCAL_RANK=%d but device=%s lists %d devices", ddp.rank, ddp.local_rank, c->device, ddp.ndev);
    ddp.dev = ddp.ndev > 0 ? ddp.devs[ddp.local_rank] : ddp.local_rank;
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || ddp.dev >= n)
        die("rank %d: device %d does not exist (%d CUDA device(s) on this machine)", ddp.rank, ddp.dev, n);
    if (!strchr(c->device, ','))
        snprintf(c->device, sizeof c->device, "%d,", ddp.dev);   // gpu_select: this worker's device
    ncclUniqueId id;
    const char *hex = getenv("YOLO_NCCL_ID");
    if (hex && strlen(hex) == 2 * NCCL_UNIQUE_ID_BYTES) {   // started by ddp_spawn
        for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; i++) {
            unsigned v;
            sscanf(hex + 2 * i, "%2x", &v);
            id.internal[i] = (char)v;
        }
    } else id = ddp_rendezvous(c);
    ddp_comm_open(id);
    return -1;
#endif
}

// trainer_ops: the backend of device dev (-1: the CPU); the one place the trainer dispatches on it
static const TrainerOps *trainer_ops(int dev) {
#ifdef YOLO_NCCL
    if (dev >= 0 && ddp.world > 1) return &ddp_trainer_ops;
#endif
#ifdef YOLO_CUDA
    if (dev >= 0) return &gpu_trainer_ops;
#endif
    (void)dev;
    return &cpu_trainer_ops;
}

// ---- train_run and its parts ----

// trainer_open_data: the dataset, the run folder (run_dir: runs/detect/train, train2, ... unless
// resume/exist_ok) and the two loaders (validation batches 2 x B)
static void trainer_open_data(Trainer *t) {
    const Config *cfg = &t->cfg;
    const char *given = getenv("YOLO_RUN_DIR");   // data parallel: the folder the launcher chose for every rank
    if (ddp.world > 1 && given && *given) snprintf(t->dir, sizeof t->dir, "%s", given);
    else run_dir(t->dir, sizeof t->dir, cfg, "train");
    char wdir[800];
    snprintf(wdir, sizeof wdir, "%s/weights", t->dir);
    mkdir_p(wdir);

    if (dataset_load(&t->data, 0, &t->train_ds)) die("train: no usable training images in %s", cfg->data);
    if (dataset_load(&t->data, 1, &t->val_ds)) die("train: no usable validation images in %s", cfg->data);
    if (ddp.rank == 0) plot_labels(t->dir, &t->train_ds, &t->data);
    int cache = !strcmp(cfg->cache, "ram");
    LoaderConfig lc = {.batch = t->B, .imgsz = t->S, .workers = cfg->workers, .max_boxes = cfg->max_boxes, .train = 1,
                       .cache_ram = cache, .seed = cfg->seed, .aug = cfg->aug, .rank = ddp.rank, .world = ddp.world};
    t->train_ld = loader_open(&t->train_ds, &lc);
    LoaderConfig vc = lc;
    vc.train = 0;
    vc.rank = 0, vc.world = 1;   // validation: rank 0 alone
    vc.batch = t->vB = 2 * t->B;
    t->val_ld = loader_open(&t->val_ds, &vc);
    t->nb = loader_batches(t->train_ld);
}

// trainer_open_optim: the optimizer (trainer.build_optimizer), decay scaling, accumulation, loss gains
static void trainer_open_optim(Trainer *t) {
    const Config *cfg = &t->cfg;
    int nc = t->data.nc, B = t->B * ddp.world;   // the global batch (data parallel: every rank's)
    // rint: Python's round
    t->accumulate = cfg->accumulate ? cfg->accumulate : (int)fmax(rint((double)cfg->nbs / B), 1);
    t->wd = cfg->weight_decay * B * t->accumulate / cfg->nbs;
    double lr = cfg->lr0, mom = cfg->momentum, wbias = cfg->warmup_bias_lr;
    int kind = OPT_SGD;
    if (!strcmp(cfg->optimizer, "auto")) {
        long iters = (long)ceil((double)t->train_ds.n / fmax(B, cfg->nbs)) * cfg->epochs;
        if (iters > 10000) lr = 0.01, mom = 0.9, kind = OPT_SGD;
        else lr = round(0.002 * 5 / (4 + nc) * 1e6) / 1e6, mom = 0.9, kind = OPT_ADAMW;
        wbias = 0;
        printf("optimizer: 'optimizer=auto' found, choosing %s(lr=%g, momentum=%g) from %ld iterations\n",
               kind == OPT_SGD ? "SGD" : "AdamW", lr, mom, iters);
    } else if (!strcmp(cfg->optimizer, "AdamW")) {
        kind = OPT_ADAMW;
    }
    t->opt = (Optimizer){.kind = kind, .momentum = mom, .beta2 = 0.999, .eps = 1e-8, .weight_decay = t->wd};
    t->initial_lr = lr;
    t->cfg.warmup_bias_lr = wbias;
    t->lcfg = loss_config_default();
    t->lcfg.box = (float)cfg->box, t->lcfg.cls = (float)cfg->cls, t->lcfg.dfl = (float)cfg->dfl;
    t->lcfg.max_boxes = cfg->max_boxes;
}

// trainer_open_memory: the memory plan (training step and every validation shape, one arena; with a
// device, the host keeps only the master copies for checkpoints), the weights, a resume, then the
// backend's own memory (the device arena), the state dicts and the NMS/evaluation buffers
static void trainer_open_memory(Trainer *t) {
    const Config *cfg = &t->cfg;
    int nc = t->data.nc;
    const Loader *vl = t->val_ld;
    size_t xfloats = (size_t)t->B * 3 * t->S * t->S;
    for (int i = 0; i < vl->nbatch; i++)
        xfloats = (size_t)fmax(xfloats, (double)t->vB * 3 * vl->shape[i][0] * vl->shape[i][1]);
    t->B_last = t->train_ld->npos % t->B;   // this rank's share of the epoch
    t->vB_last = t->val_ds.n % t->vB;
    if (t->dev >= 0) xfloats = 1;   // the host keeps the master copies for checkpoints; no activations
    Plan p = t->dev >= 0 ? trainer_plan_layout(t, 0, NULL, xfloats, 1, 0)
                         : trainer_plan(t, vl->nbatch, (const int (*)[2])vl->shape, xfloats, 1);
    t->arena = xcalloc(1, sizeof(Arena));
    t->arena->cap = p.total;
    t->arena->base = aligned_alloc(ARENA_ALIGN, (p.total + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN);
    if (!t->arena->base)
        die("cannot allocate the %.1f MiB arena (see `yolo plan`; lower batch or imgsz)", p.total / 1048576.0);
    trainer_alloc(t, t->arena, xfloats, 1);
    if (t->dev >= 0)
        printf("host memory: %.1f MiB (weights, gradients, optimizer state and EMA for checkpoints)\n",
               p.total / 1048576.0);
    else
        printf("memory plan: %.1f MiB in one arena (weights %.1f, gradients %.1f, optimizer %.1f, EMA %.1f, "
               "activations %.1f, "
               "backward %.1f, loss %.1f, input %.1f MiB); nothing is allocated after this\n",
               p.total / 1048576.0, p.at_peak[G_PARAMS] / 1048576.0, p.at_peak[G_GRADS] / 1048576.0,
               p.at_peak[G_OPTIM] / 1048576.0, p.at_peak[G_EMA] / 1048576.0, p.at_peak[G_ACTS] / 1048576.0,
               p.at_peak[G_BACKWARD] / 1048576.0, p.peak[G_LOSS] / 1048576.0, p.at_peak[G_INPUT] / 1048576.0);
    model_load_weights(&t->m, cfg->model, nc, cfg->seed, 0);
    memcpy(t->ema.params, t->m.params, t->m.nparams * sizeof(float));
    memcpy(t->ema.buffers, t->m.buffers, t->m.nbuffers * sizeof(float));
    t->best_fitness = -1;
    t->last_opt_step = -1;
    t->amp_scale = 65536;
    if (cfg->resume) trainer_resume(t);
    t->ops->open(t, 1);
    state_dict_build(&t->sd, &t->m, t->m.params, t->m.buffers);
    state_dict_build(&t->sd_ema, &t->m, t->ema.params, t->ema.buffers);
    {   // the NMS buffers must hold the largest validation shape
        int Amax = head_anchor_count(t->S, t->S);
        for (int i = 0; i < vl->nbatch; i++)
            Amax = (int)fmax(Amax, head_anchor_count(vl->shape[i][0], vl->shape[i][1]));
        NmsConfig ncfg = nms_config_val();
        if (cfg->conf >= 0) ncfg.conf = (float)cfg->conf;
        ncfg.iou = (float)cfg->iou;
        nms_init(&t->nms, ncfg, nc, Amax);
    }
    t->dets = xmalloc(sizeof(Det) * t->nms.cfg.max_det);
    evaluator_init(&t->ev, nc);
}

// trainer_write_args: args.yaml, the run's settings c as Ultralytics writes them
static void trainer_write_args(const Trainer *t, const Config *c) {
    char path[1024];
    snprintf(path, sizeof path, "%s/args.yaml", t->dir);
    FILE *f = xfopen(path, "w");
    fprintf(f, "task: detect\nmode: train\nmodel: %s\ndata: %s\nepochs: %d\npatience: %d\nbatch: %d\nimgsz: %d\n"
               "workers: %d\nproject: %s\nname: %s\noptimizer: %s\nseed: %llu\ncos_lr: %s\nclose_mosaic: %d\n"
               "resume: %s\n"
               "amp: false\nlr0: %g\nlrf: %g\nmomentum: %g\nweight_decay: %g\nwarmup_epochs: %g\nwarmup_momentum: %g\n"
               "warmup_bias_lr: %g\nbox: %g\ncls: %g\ndfl: %g\nnbs: %d\nhsv_h: %g\nhsv_s: %g\nhsv_v: %g\ndegrees: %g\n"
               "translate: %g\nscale: %g\nshear: %g\nperspective: %g\nflipud: %g\nfliplr: %g\nmosaic: %g\nmixup: %g\n"
               "cache: %s\nmax_boxes: %d\naccumulate: %d\n",
            c->model, c->data, c->epochs, c->patience, c->batch, c->imgsz, c->workers, c->project, t->dir,
            c->optimizer, (unsigned long long)c->seed, c->cos_lr ? "true" : "false", c->close_mosaic,
            c->resume ? "true" : "false", c->lr0, c->lrf, c->momentum, c->weight_decay, c->warmup_epochs,
            c->warmup_momentum, c->warmup_bias_lr, c->box, c->cls, c->dfl, c->nbs, c->aug.hsv_h, c->aug.hsv_s,
            c->aug.hsv_v, c->aug.degrees, c->aug.translate, c->aug.scale, c->aug.shear, c->aug.perspective,
            c->aug.flipud, c->aug.fliplr, c->aug.mosaic, c->aug.mixup, !strcmp(c->cache, "ram") ? "ram" : "false",
            c->max_boxes, t->accumulate);
    fclose(f);
}

// trainer_lr: the learning rates, momentum and accumulation of iteration ni (warmup ramps them up,
// trainer._do_train); returns the accumulation
static int trainer_lr(Trainer *t, long ni, int nw, double lf) {
    const Config *cfg = &t->cfg;
    if (ni > nw) {
        for (int g = 0; g < PG_N; g++) t->opt.lr[g] = t->initial_lr * lf;
        return t->accumulate;
    }
    for (int g = 0; g < PG_N; g++)
        t->opt.lr[g] = interp((double)ni, 0, nw, g == PG_BIAS ? t->cfg.warmup_bias_lr : 0.0, t->initial_lr * lf);
    if (t->opt.kind == OPT_SGD) t->opt.momentum = interp((double)ni, 0, nw, cfg->warmup_momentum, cfg->momentum);
    return (int)fmax(1, rint(interp((double)ni, 0, nw, 1, (double)cfg->nbs / (t->B * ddp.world))));
}

// train_epoch: one pass over the training set: a step per batch, an optimizer step every
// `accumulate` batches, the progress line; tl gets the summed losses, *ngood the good batches.
// Returns 2 to stop the run (10 non-finite losses in a row, or the device's loss scale gave up).
static int train_epoch(Trainer *t, int epoch, int nw, double tl[3], int *ngood) {
    const Config *cfg = &t->cfg;
    double lf = lr_lambda(cfg, epoch), t0 = now_sec();
    int close_at = cfg->epochs - cfg->close_mosaic;   // never, when close_mosaic > epochs (as Ultralytics)
    int closing = close_at >= 0 && epoch >= close_at;
    if (closing && epoch == close_at) printf("closing dataloader mosaic\n");
    loader_start_epoch(t->train_ld, epoch, closing);
    ddp.comm_s = 0;
    int nbatch = 0;
    *ngood = 0;
    const Batch *bt;
    int rc = 0;
    double tw = now_sec(), tloop = tw;   // tw: since the last step ended (loader_next's wait)
    while ((bt = loader_next(t->train_ld))) {
        t->load_wait += now_sec() - tw;
        long ni = (long)nbatch + (long)t->nb * epoch;
        if (ddp.rank == 0) plot_train_batch(t->dir, ni, bt, &t->data, &t->train_ds);
        int accumulate = trainer_lr(t, ni, nw, lf), bad;
        t->will_optimize = ni - t->last_opt_step >= accumulate;   // data parallel: this backward all-reduces
        LossOut lo = t->ops->step(t, bt, &bad);
        if (bad) {
            t->nan_skips++;
            t->consecutive_nan++;
            fprintf(stderr, "warning: non-finite loss at epoch %d batch %d: step skipped (%d so far)\n", epoch + 1,
                    nbatch, t->nan_skips);
            if (t->consecutive_nan >= 10) {
                fprintf(stderr, "stopping: 10 consecutive non-finite losses; the last checkpoint "
                                "%s/weights/last.ckpt is intact (hint: lower lr0, check the labels)\n", t->dir);
                rc = 2;
                break;
            }
            nbatch++;
            tw = now_sec();
            continue;
        }
        t->consecutive_nan = 0;
        t->sd.nbt++;
        (*ngood)++;
        tl[0] += lo.box, tl[1] += lo.cls, tl[2] += lo.dfl;
        if (t->will_optimize) {
            int stop = t->ops->optimize(t);
            t->last_opt_step = ni;
            if (stop) {
                rc = 2;
                break;
            }
        }
        nbatch++;
        double el = now_sec() - t0;
        char note[64];
        if (tty_out || nbatch == t->nb)
            printf("%s%6d/%-4d %6.1f MiB %9.4f %9.4f %9.4f %6d %5d: %3d/%d %5.2f it/s%s%s", tty_out ? "\r" : "",
                   epoch + 1, cfg->epochs, t->ops->mem_mib(t), tl[0] / *ngood, tl[1] / *ngood, tl[2] / *ngood, bt->n,
                   bt->W, nbatch, t->nb, nbatch / el, ddp_comm_note(note, sizeof note),
                   tty_out && nbatch < t->nb ? "" : "\n");
        fflush(stdout);
        tw = now_sec();
    }
    if (!rc) t->load_wait += now_sec() - tw;   // the last loader_next, which ended the epoch
    t->loop_time += now_sec() - tloop;
    return rc;
}

// train_epoch_end: validate the EMA, log, checkpoint (results row and weights first, last.ckpt last:
// it is the commit point, and a resume drops any row beyond it, results_reload). Returns 1 to stop
// early (patience), 2 to stop on non-finite weights.
static int train_epoch_end(Trainer *t, int epoch, const double tl[3], int ngood, double (*rows)[11], int *nrows,
                           const char *csv, double t_start) {
    const Config *cfg = &t->cfg;
    double vl3[3];
    Metrics mt = trainer_validate(t, vl3, 1);
    t->ops->sync(t);
    double fit = mt.map;
    int best = fit >= t->best_fitness || t->best_fitness <= 0;   // Ultralytics: best.pt also on a tie
    if (fit > t->best_fitness || t->best_fitness <= 0) t->best_epoch = epoch;   // EarlyStopping's reset rule
    t->best_fitness = fmax(t->best_fitness, fit);
    printf("%22s %9s %9s %9s %9s\n", "", "P", "R", "mAP50", "mAP50-95");
    printf("%22s %9.3f %9.3f %9.3f %9.3f\n", "all", mt.P, mt.R, mt.map50, mt.map);
    double *row = rows[*nrows < cfg->epochs ? *nrows : cfg->epochs - 1];
    int ng = ngood ? ngood : 1;
    double row11[11] = {epoch + 1, tl[0] / ng, tl[1] / ng, tl[2] / ng, mt.P, mt.R, mt.map50, mt.map,
                        vl3[0], vl3[1], vl3[2]};
    memcpy(row, row11, sizeof row11);
    metrics_free(&mt);
    (*nrows)++;
    t->epoch = epoch + 1;
    if (!trainer_weights_ok(t)) return 2;
    FILE *f = fopen(csv, "a");
    if (f) {
        fprintf(f, "%d,%.3f,%.5g,%.5g,%.5g,%.5g,%.5g,%.5g,%.5g,%.5g,%.5g,%.5g,%.5g,%.5g,%.5g\n", epoch + 1,
                now_sec() - t_start, row[1], row[2], row[3], row[4], row[5], row[6], row[7], row[8], row[9], row[10],
                t->opt.lr[0], t->opt.lr[1], t->opt.lr[2]);
        if (fflush(f) || fsync(fileno(f))) fprintf(stderr, "warning: %s: %s\n", csv, strerror(errno));
        fclose(f);
    }
    trainer_save(t, best);
    if (*nrows > 1) plot_results(t->dir, rows, *nrows);
    if (cfg->patience > 0 && epoch - t->best_epoch >= cfg->patience) {
        printf("stopping early: no improvement in %d epochs (best epoch %d)\n", cfg->patience, t->best_epoch + 1);
        return 1;
    }
    return 0;
}

// train_run: `yolo train`: set up (data, optimizer, memory, backend), then epochs of training,
// validation and checkpoints (trainer.BaseTrainer._do_train)
static int train_run(Config cfg) {
    Trainer *t = xcalloc(1, sizeof(Trainer));
    t->cfg = cfg;
    char err[1024];
    if (!cfg.data[0]) die("train: data= is required (a data.yaml; `yolo shapes out=DIR` makes one)");
    if (data_yaml_load(cfg.data, &t->data, err, sizeof err)) die("%s", err);
    int nc = t->data.nc, file_nc;
    char scale = model_spec_scale(cfg.model, &file_nc);
    model_build(&t->m, scale, nc);
    t->m.recompute = cfg.recompute;
    t->B = cfg.batch;
    t->S = cfg.imgsz;
    t->dev = gpu_select(cfg.device);
    t->ops = trainer_ops(t->dev);
    if (cfg.batch_auto &&
        ddp.world > 1)   // AutoBatch per card (NCCL's memory already taken); the smallest card's, on every rank
        t->cfg.batch = cfg.batch = ddp.world * ddp_min(trainer_auto_batch(&cfg, t->dev, scale, nc));
    else if (cfg.batch_auto) t->B = t->cfg.batch = cfg.batch = trainer_auto_batch(&cfg, t->dev, scale, nc);
    if (ddp.world > 1) t->B = ddp_rank_batch(cfg.batch);
    // from here rank 0 speaks for the run (Ultralytics logs on rank 0 only); the others' errors
    // and warnings still reach stderr
    if (ddp.rank > 0 && !freopen("/dev/null", "w", stdout)) die("rank %d: cannot silence stdout", ddp.rank);
    trainer_open_data(t);
    trainer_open_optim(t);
    trainer_open_memory(t);
    if (ddp.rank == 0) trainer_write_args(t, &cfg);   // the settings as given (warmup_bias_lr before optimizer=auto)
    char csv[1024];
    snprintf(csv, sizeof csv, "%s/results.csv", t->dir);
    if (!cfg.resume && ddp.rank == 0) {
        FILE *f = xfopen(csv, "w");
        fprintf(f,
                "epoch,time,train/box_loss,train/cls_loss,train/dfl_loss,metrics/precision(B),metrics/recall(B),"
                "metrics/mAP50(B),metrics/mAP50-95(B),val/box_loss,val/cls_loss,val/dfl_loss,lr/pg0,lr/pg1,lr/pg2\n");
        fclose(f);
    }
    printf("training yolov8%c nc=%d on %d images (%d val), batch %d, imgsz %d, accumulate %d, weight_decay %g, %d "
           "epochs -> %s\n",
           scale, nc, t->train_ds.n, t->val_ds.n, t->B * ddp.world, t->S, t->accumulate, t->wd, cfg.epochs, t->dir);
    if (ddp.world > 1)
        printf("data parallel: %d ranks, batch %d per rank, %d images per rank per epoch (%d batches)\n", ddp.world,
               t->B, t->train_ld->npos, t->nb);
    const char *wait = getenv("YOLO_OMP_WAIT");   // omp_wait_policy_auto's choice
    if (wait && t->dev < 0)
        printf("OpenMP: %d threads; between loops they wait with %s; OMP_WAIT_POLICY=PASSIVE|ACTIVE decides instead\n",
               omp_threads(), wait);
    tty_out = isatty(1);
    int nw = cfg.warmup_epochs > 0 ? (int)fmax(rint(cfg.warmup_epochs * t->nb), 100) : -1;
    double t_start = now_sec();
    double (*rows)[11] = xcalloc((size_t)cfg.epochs, sizeof *rows);
    int nrows = cfg.resume && ddp.rank == 0 ? results_reload(csv, t->epoch, rows, cfg.epochs) : 0, stop = 0;
    if (!cfg.resume) model_zero_grad(&t->m);   // once: batches after an epoch's last step carry into the next epoch's
    for (int epoch = t->epoch; epoch < cfg.epochs && !stop; epoch++) {
        double tl[3] = {0, 0, 0};
        int ngood;
        stop = train_epoch(t, epoch, nw, tl, &ngood);
        if (!stop && ddp.rank == 0) stop = train_epoch_end(t, epoch, tl, ngood, rows, &nrows, csv, t_start);
        if (ddp.world > 1) stop = ddp_agree_stop(t, epoch, stop);   // the others wait here for rank 0's validation
    }
    if (ddp.rank == 0)
        eval_plots_save(&t->ev, t->dir, t->data.names);   // the last validation's confusion matrix and curves
    double total = now_sec() - t_start;
    const Arena *ar = t->ops->arena(t);
    printf("%d epochs completed in %.1f s (%.3f hours); best fitness (mAP50-95) %.4f at epoch %d; %d steps skipped for "
           "non-finite values\nmemory: the %s arena's high-water mark was %.1f of %.1f MiB planned\nresults saved to "
           "%s\n",
           t->epoch, total, total / 3600, t->best_fitness, t->best_epoch + 1, t->nan_skips, t->ops->where,
           ar->high / 1048576.0, ar->cap / 1048576.0, t->dir);
    if (t->loop_time > 0) {   // whether the loader keeps up: its share of the epochs' step loops (validation not counted)
        double share = t->load_wait / t->loop_time;
        printf("loader: the training steps waited %.1f s for batches, %.0f%% of the %.1f s of their epochs (workers=%d)%s\n",
               t->load_wait, 100 * share, t->loop_time, t->train_ld->nworkers,
               share > 0.2 ? ": the loader is the bottleneck; more workers=, cache=ram or smaller images shorten it" : "");
    }
    if (ar->lay)
        printf("memory: %ld step allocations placed by the arena's layout, %ld steps left it (first-fit)\n",
               ar->replayed, ar->replay_miss);
    t->ops->close(t, 1);
    loader_close(t->train_ld);
    loader_close(t->val_ld);
    nms_free(&t->nms);
    evaluator_free(&t->ev);
    int rc = stop == 2 ? 1 : 0;
    free(rows);
    free(t->dets);
    free(t->arena->base);
    free(t->arena);
    free(t);
    return rc;
}

// cmd_val: `yolo val model=FILE data=FILE [imgsz= batch=]`: the metrics of a weights file on the
// validation split, in one planned arena, as the trainer computes them; the validation pictures
// (eval_plots_save, val_pics_add) into the run folder, runs/detect/val by default.
static int cmd_val(int argc, char **argv) {
    Config c = config_from_args(argc, argv);
    Trainer *t = xcalloc(1, sizeof(Trainer));
    t->cfg = c;
    t->dev = gpu_select(c.device);
    t->ops = trainer_ops(t->dev);
    char err[1024];
    if (!c.data[0]) die("val: data= is required");
    if (data_yaml_load(c.data, &t->data, err, sizeof err)) die("%s", err);
    int fnc;
    char scale = model_spec_scale(c.model, &fnc);
    if (fnc < 0) die("val: model= must be a weights file (.safetensors or .pt), not a scale name");
    if (fnc != t->data.nc) die("val: model=%s has nc=%d but %s has nc=%d", c.model, fnc, c.data, t->data.nc);
    model_build(&t->m, scale, fnc);
    t->B = t->vB = c.batch;
    t->S = c.imgsz;
    if (dataset_load(&t->data, 1, &t->val_ds)) die("val: no usable validation images in %s", c.data);
    LoaderConfig vc = {
            .batch = t->B, .imgsz = t->S, .workers = c.workers, .max_boxes = c.max_boxes, .train = 0, .seed = c.seed};
    t->val_ld = loader_open(&t->val_ds, &vc);
    t->lcfg = loss_config_default();
    t->lcfg.max_boxes = c.max_boxes;
    const Loader *vl = t->val_ld;
    size_t xfloats = 0;
    int Amax = 0;
    for (int i = 0; i < vl->nbatch; i++) {
        xfloats = (size_t)fmax(xfloats, (double)t->vB * 3 * vl->shape[i][0] * vl->shape[i][1]);
        Amax = (int)fmax(Amax, head_anchor_count(vl->shape[i][0], vl->shape[i][1]));
    }
    t->vB_last = t->val_ds.n % t->vB;
    if (t->dev >= 0) xfloats = 1;   // on the device: the host holds the weights only
    Plan p = t->dev >= 0 ? trainer_plan_layout(t, 0, NULL, xfloats, 0, 0)
                         : trainer_plan(t, vl->nbatch, (const int (*)[2])vl->shape, xfloats, 0);
    t->arena = xcalloc(1, sizeof(Arena));
    t->arena->cap = p.total;
    t->arena->base = aligned_alloc(ARENA_ALIGN, (p.total + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN);
    if (!t->arena->base) die("cannot allocate the %.1f MiB arena", p.total / 1048576.0);
    trainer_alloc(t, t->arena, xfloats, 0);
    model_load_weights(&t->m, c.model, fnc, 0, 0);
    t->ops->open(t, 0);
    size_t plan_bytes = t->gpu ? t->gpu->plan : p.total;
    NmsConfig nc = nms_config_val();
    if (c.conf >= 0) nc.conf = (float)c.conf;
    nc.iou = (float)c.iou;
    nms_init(&t->nms, nc, fnc, Amax);
    t->dets = xmalloc(sizeof(Det) * t->nms.cfg.max_det);
    evaluator_init(&t->ev, fnc);
    printf("val: %s on %d images, batch %d, imgsz %d, memory plan %.1f MiB (%s)\n", c.model, t->val_ds.n, t->B, t->S,
           plan_bytes / 1048576.0, t->dev >= 0 ? "device" : "host");
    double vloss[3], t0 = now_sec();
    run_dir(t->dir, sizeof t->dir, &c, "val");
    Metrics mt = trainer_validate(t, vloss, 1);
    eval_plots_save(&t->ev, t->dir, t->data.names);
    printf("%22s %9s %9s %9s %9s\n", "class", "P", "R", "mAP50", "mAP50-95");
    printf("%22s %9.3f %9.3f %9.3f %9.3f\n", "all", mt.P, mt.R, mt.map50, mt.map);
    for (int k = 0; k < fnc; k++)
        if (mt.ap[k] >= 0)
            printf("%22s %9.3f %9.3f %9.3f %9.3f\n", t->data.names[k], mt.p[k], mt.r[k], mt.ap50[k], mt.ap[k]);
    printf("val losses box %.4f cls %.4f dfl %.4f; %.2f s; pictures in %s\n", vloss[0], vloss[1],
           vloss[2], now_sec() - t0, t->dir);
    metrics_free(&mt);
    t->ops->close(t, 0);
    loader_close(t->val_ld);
    nms_free(&t->nms);
    evaluator_free(&t->ev);
    free(t->dets);
    free(t->arena->base);
    free(t->arena);
    free(t);
    return 0;
}

static int has_image_ext(const char *p) {
    const char *e = strrchr(p, '.');
    if (!e) return 0;
    static const char *const ext[] = {".jpg", ".jpeg", ".png", ".JPG", ".JPEG", ".PNG", NULL};
    for (int i = 0; ext[i]; i++)
        if (!strcmp(e, ext[i])) return 1;
    return 0;
}

// predict_files: source= as a sorted list of image files (a directory's images, or the file itself)
static char **predict_files(const char *source, int *nfiles) {
    int n = 0, cap = 16;
    char **files = xmalloc(cap * sizeof(char *));
    struct stat sb;
    if (stat(source, &sb)) die("predict: source=%s: %s", source, strerror(errno));
    if (S_ISDIR(sb.st_mode)) {
        DIR *d = opendir(source);
        if (!d) die("predict: cannot list %s", source);
        struct dirent *e;
        while ((e = readdir(d)))
            if (has_image_ext(e->d_name)) {
                if (n == cap) files = realloc(files, (cap *= 2) * sizeof(char *));
                files[n] = xmalloc(strlen(source) + strlen(e->d_name) + 2);
                sprintf(files[n++], "%s/%s", source, e->d_name);
            }
        closedir(d);
        qsort(files, n, sizeof(char *), (int (*)(const void *, const void *))strcmp_ptr);
    } else {
        files[n++] = strdup(source);
    }
    *nfiles = n;
    return files;
}

// Predictor: the model, its host arena (planned for every input shape predict makes at imgsz S:
// one side S, the other a multiple of 32 up to S) and, on a device, the Gpu (gpu_predict_open)
typedef struct { Model *m; Arena *a; float *x; Gpu *g; int S; } Predictor;

static void predict_open(Predictor *p, const char *model, char scale, int fnc, int dev, int S) {
    Model *m = p->m = xcalloc(1, sizeof(Model));
    model_build(m, scale, fnc);
    m->infer = 1;   // set before the dry run, so the plan is the inference plan
    p->S = S;
    Arena *a = xcalloc(1, sizeof(Arena));
    a->cap = SIZE_MAX;
    model_alloc_params(m, a);
    afloat(a, (size_t)3 * S * S, G_INPUT);
    for (int side = 32; side <= S && dev < 0; side += 32)   // every input shape predict can make: one side S
        for (int o = 0; o < 2; o++) {
            model_forward(m, a, NULL, 1, o ? S : side, o ? side : S);
            model_release(m, a);
        }
    size_t total = a->high;
    free(a);
    a = p->a = xcalloc(1, sizeof(Arena));
    a->cap = total;
    a->base = aligned_alloc(ARENA_ALIGN, (total + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN);
    model_alloc_params(m, a);
    p->x = afloat(a, (size_t)3 * S * S, G_INPUT);
    model_load_weights(m, model, fnc, 0, 0);
    m->train = 0;
    m->infer = 1;
    p->g = dev >= 0 ? gpu_predict_open(m, dev, S) : NULL;
}

// predict_heads: the forward of one letterboxed image hwc (PH, PW, 3) uint8: the head maps (host)
static const float *const *predict_heads(Predictor *p, const uint8_t *hwc, int PH, int PW) {
    if (p->g) return gpu_predict(p->g, hwc, PH, PW);   // the forward on the device, NMS on the host
    for (int ch = 0; ch < 3; ch++)
        for (size_t i = 0; i < (size_t)PW * PH; i++) p->x[(size_t)ch * PW * PH + i] = hwc[i * 3 + ch] * (1.f / 255.f);
    model_forward(p->m, p->a, p->x, 1, PH, PW);
    return (const float *const *)p->m->head;
}
static void predict_heads_done(Predictor *p) { if (!p->g) model_release(p->m, p->a); }

static void predict_close(Predictor *p) {
    if (p->g) gpu_close(p->g);
    free(p->a->base);
    free(p->a);
    free(p->m);
}

// predict_write: the detections of one image, back in its pixels (scale_boxes + clip_boxes), as a
// YOLO-format labels/STEM.txt and drawn into STEM.jpg
static void predict_write(const char *file, Image *img, const Letterbox *lb, const Det *dets, int n,
                          const DataConfig *dc, const char *dir, const char *ldir) {
    const char *base = strrchr(file, '/') ? strrchr(file, '/') + 1 : file;
    char stem[512], path[2048];
    snprintf(stem, sizeof stem, "%s", base);
    if (strrchr(stem, '.')) *strrchr(stem, '.') = 0;
    snprintf(path, sizeof path, "%s/%s.txt", ldir, stem);
    FILE *tf = xfopen(path, "w");
    for (int i = 0; i < n; i++) {
        const Det *d = &dets[i];
        float x1 = fminf(fmaxf((d->x1 - lb->left) / (float)lb->r, 0), img->w);
        float y1 = fminf(fmaxf((d->y1 - lb->top) / (float)lb->r, 0), img->h);
        float x2 = fminf(fmaxf((d->x2 - lb->left) / (float)lb->r, 0), img->w);
        float y2 = fminf(fmaxf((d->y2 - lb->top) / (float)lb->r, 0), img->h);
        fprintf(tf, "%d %.6f %.6f %.6f %.6f %.5f\n", d->cls, (x1 + x2) / 2 / img->w, (y1 + y2) / 2 / img->h,
                (x2 - x1) / img->w, (y2 - y1) / img->h, d->score);
        char lab[128];
        if (dc->names) snprintf(lab, sizeof lab, "%s %.2f", dc->names[d->cls], d->score);
        else snprintf(lab, sizeof lab, "%d %.2f", d->cls, d->score);
        image_draw_detection(img, (int)x1, (int)y1, (int)x2, (int)y2, d->cls, lab, 2);
    }
    fclose(tf);
    snprintf(path, sizeof path, "%s/%s.jpg", dir, stem);
    image_save_jpg(path, img, 90);
}

// cmd_predict: `yolo predict model=FILE source=IMAGE|DIR [conf=0.25 iou=0.7 imgsz=640]`: each
// image letterboxed to imgsz, detections drawn with class names and scores into the run folder
// (runs/detect/predict by default, see run_dir), and YOLO-format results (class cx cy w h conf,
// normalised) in its labels/.
static int cmd_predict(int argc, char **argv) {
    Config c = config_from_args(argc, argv);
    int dev = gpu_select(c.device);
    if (!c.source[0]) die("predict: source= is required (an image or a directory of images)");
    int fnc;
    char scale = model_spec_scale(c.model, &fnc), err[1024];
    if (fnc < 0) die("predict: model= must be a weights file (.safetensors or .pt)");
    const char *names_file = c.data[0] ? c.data : NULL;
    DataConfig dc = {0};
    if (names_file && data_yaml_load(names_file, &dc, err, sizeof err)) die("%s", err);
    if (names_file && dc.nc != fnc)
        die("predict: %s names %d classes but model=%s has nc=%d", names_file, dc.nc, c.model, fnc);
    if (!names_file) dc.names = weights_names(c.model, fnc);   // a checkpoint's own class names, if it has them
    int nfiles, S = c.imgsz;
    char **files = predict_files(c.source, &nfiles);
    Predictor p;
    predict_open(&p, c.model, scale, fnc, dev, S);
    NmsConfig ncfg = nms_config_predict();
    if (c.conf >= 0) ncfg.conf = (float)c.conf;
    ncfg.iou = (float)c.iou;
    Nms nms;
    nms_init(&nms, ncfg, fnc, head_anchor_count(S, S));
    Det *dets = xmalloc(sizeof(Det) * ncfg.max_det);
    char dir[800], ldir[900];
    run_dir(dir, sizeof dir, &c, "predict");
    snprintf(ldir, sizeof ldir, "%s/labels", dir);
    mkdir_p(ldir);
    uint8_t *lb_img = xmalloc((size_t)S * S * 3);
    int ndone = 0, nbad = 0;
    for (int f = 0; f < nfiles; f++) {
        Image img = {0};
        if (image_load(files[f], 0, &img, err, sizeof err)) {
            fprintf(stderr, "skipping %s\n", err);
            nbad++;
            continue;
        }
        // LetterBox(auto=True) as Ultralytics predicts: scale the long side to S, then pad only up
        // to the next multiple of 32 (the largest stride), not to a square
        Letterbox lb;
        letterbox_params(img.w, img.h, S, S, 1, &lb);
        int PW = lb.nw + (S - lb.nw) % 32, PH = lb.nh + (S - lb.nh) % 32;
        lb.left = (int)nearbyint((PW - lb.nw) / 2.0 - 0.1);
        lb.top = (int)nearbyint((PH - lb.nh) / 2.0 - 0.1);
        letterbox_apply(img.px, img.w, img.h, lb_img, PW, PH, &lb);
        double t0 = now_sec();
        int n = nms_run_maps(&nms, predict_heads(&p, lb_img, PH, PW), 0, PH, PW, dets);
        predict_heads_done(&p);
        printf("%s: %dx%d at %dx%d, %d detections, %.1f ms\n", files[f], img.w, img.h, PW, PH, n,
               (now_sec() - t0) * 1e3);
        predict_write(files[f], &img, &lb, dets, n, &dc, dir, ldir);
        image_free(&img);
        ndone++;
    }
    printf("predict: %d images -> %s (labels in %s), %d unreadable\n", ndone, dir, ldir, nbad);
    predict_close(&p);
    for (int f = 0; f < nfiles; f++) free(files[f]);
    free(files); free(lb_img); free(dets); nms_free(&nms);
    return nbad && !ndone ? 1 : 0;
}

// ------------------------------------------------------------------------------------------
// `yolo plan`: what fits, before a GPU is touched
// ------------------------------------------------------------------------------------------

// PlanOpts (declared above train_run): the settings that decide training memory.

// plan_train: the exact arena of a training run (persistent groups, a training step at (B, S, S)
// and validation at (S+32, S+32), the largest rect shape of square images: ceil(S/32 + 0.5)*32 in
// set_rectangle), by the same dry run the trainer does, validation batches of 2 x B as in training.
// half: the device step's own schedule (gpu_plan_run); else the CPU trainer's.
// tr/va: the composition at the peak of each phase.
static size_t plan_train(const PlanOpts *o, Plan *tr, Plan *va) {
    if (o->half) {
        Model *m = xcalloc(1, sizeof(Model));
        model_build(m, o->scale, o->nc);
        m->recompute = o->recompute;
        LossConfig lc = loss_config_default();
        lc.max_boxes = o->max_boxes;
        int V = o->S + 32;
        GpuShape st = {o->B, o->S, o->S, 1}, sv = {2 * o->B, V, V, 0};
        Plan p1 = gpu_plan_run(m, o->adamw ? OPT_ADAMW : OPT_SGD, !o->fp32, 0, 1, &st, &lc);
        Plan p2 =
                gpu_plan_run(m, o->adamw ? OPT_ADAMW : OPT_SGD, !o->fp32, 0, 1, &sv, &lc);   // with the training state
        arena_layout_free(p1.lay), arena_layout_free(p2.lay);
        p1.lay = p2.lay = NULL;
        if (tr) *tr = p1;
        if (va) *va = p2;
        free(m);
        return p1.total > p2.total ? p1.total : p2.total;
    }
    Trainer *t = xcalloc(1, sizeof(Trainer));
    model_build(&t->m, o->scale, o->nc);
    t->m.recompute = o->recompute;
    t->B = o->B;
    t->vB = 2 * o->B;
    t->S = o->S;
    t->lcfg = loss_config_default();
    t->lcfg.max_boxes = o->max_boxes;
    t->opt.kind = o->adamw ? OPT_ADAMW : OPT_SGD;
    int V = o->S + 32, shape[1][2] = {{V, V}};
    size_t xfloats = (size_t)t->vB * 3 * V * V;
    Plan p1 = trainer_plan_layout(t, 0, NULL, xfloats, 1, 1);
    Plan p2 = trainer_plan_layout(t, 1, (const int (*)[2])shape, xfloats, 1, 0);
    if (tr) *tr = p1;
    if (va) *va = p2;
    free(t);
    return p1.total > p2.total ? p1.total : p2.total;
}

// plan_device_bytes: what the device needs in all: the arena plus the CUDA context estimate
static size_t plan_device_bytes(const PlanOpts *o) {
    return plan_train(o, NULL, NULL) + (o->half ? GPU_CONTEXT_BYTES : 0);
}

// plan_max_batch: the largest batch whose plan fits `budget` bytes (0 if none); the plan grows
// with the batch, so a binary search finds it, and the test checks batch+1 does not fit.
static int plan_max_batch(PlanOpts o, size_t budget) {
    int lo = 0, hi = 1;
    while (hi <= 4096) {
        o.B = hi;
        if (plan_device_bytes(&o) > budget) break;
        lo = hi;
        hi *= 2;
    }
    if (hi > 4096) return lo;
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        o.B = mid;
        if (plan_device_bytes(&o) <= budget) lo = mid; else hi = mid;
    }
    return lo;
}

// parse_bytes: "8G", "8GB", "6.5g", "8192M", "123456" -> bytes (GiB/MiB units), dies naming key on junk
static size_t parse_bytes(const char *key, const char *v) {
    char *end;
    double x = strtod(v, &end);
    double mult = 1;
    if (*end == 'G' || *end == 'g') mult = 1073741824.0, end++;
    else if (*end == 'M' || *end == 'm') mult = 1048576.0, end++;
    else if (*end == 'K' || *end == 'k') mult = 1024.0, end++;
    if (*end == 'B' || *end == 'b') end++;
    if (end == v || *end || !(x > 0)) die("%s=%s: expected a size such as 8G, 6.5GB or 8192M", key, v);
    return (size_t)(x * mult);
}

static void plan_table(const char *title, const Plan *tr, const Plan *va) {
    printf("%s\n  %-22s %12s %12s\n", title, "", "training", "validation");
    size_t sum[2] = {0, 0};
    for (int g = 0; g < G_NGROUPS; g++) {
        sum[0] += tr->at_peak[g], sum[1] += va->at_peak[g];
        if (tr->at_peak[g] || va->at_peak[g])
            printf("  %-22s %8.1f MiB %8.1f MiB\n", group_names[g], tr->at_peak[g] / 1048576.0,
                   va->at_peak[g] / 1048576.0);
    }
    if (tr->total > sum[0] + 65536 || va->total > sum[1] + 65536)   // holes between live blocks at the peak
        printf("  %-22s %8.1f MiB %8.1f MiB\n", "gaps between blocks",
               (tr->total > sum[0] ? tr->total - sum[0] : 0) / 1048576.0,
               (va->total > sum[1] ? va->total - sum[1] : 0) / 1048576.0);
    printf("  %-22s %8.1f MiB %8.1f MiB   (one arena of %.1f MiB serves both)\n", "total", tr->total / 1048576.0,
           va->total / 1048576.0, (tr->total > va->total ? tr->total : va->total) / 1048576.0);
}

// cmd_plan: `yolo plan model= nc= batch= imgsz= [max_boxes= optimizer= recompute= amp= gpu_mem=]`
// plan_ddp_batch: yolo plan device=0,1,...: *B (the global batch; with per_gpu, already the one
// GPU's, from gpu_mem= of the smallest card) becomes the per-GPU batch the plan below is for
static void plan_ddp_batch(const char *device, int *B, int per_gpu) {
    int devs[64], n = strchr(device, ',') ? device_list(device, devs, 64) : 1;
    if (n < 2) return;
    if (per_gpu) {
        printf("data parallel over %d GPUs: batch %d per GPU (gpu_mem= of the smallest card), global batch=%d\n", n, *B,
               *B * n);
    } else {
        if (*B % n)
            die("batch=%d does not split evenly over %d GPUs: give a multiple of %d (batch= is the global batch)", *B,
                n, n);
        printf("data parallel over %d GPUs: global batch %d = %d per GPU; the plan below is each GPU's\n", n, *B,
               *B / n);
        *B /= n;
    }
    printf("each GPU also holds NCCL's communicator and buffers: yolo train measures them at start (cudaMemGetInfo "
           "around the communicator's setup) and prints them before the arena's one cudaMalloc\n");
}

static int cmd_plan(int argc, char **argv) {
    static const char *keys[] = {"model",     "nc",  "imgsz",   "batch",  "max_boxes", "optimizer",
                                 "recompute", "amp", "gpu_mem", "device", NULL};
    arg_check(argc, argv, keys);
    char scale;
    int nc;
    model_arg(argc, argv, &scale, &nc);
    PlanOpts o = {.scale = scale,
                  .nc = nc,
                  .S = (int)arg_int(argc, argv, "imgsz", 640),
                  .max_boxes = (int)arg_int(argc, argv, "max_boxes", 400),
                  .recompute = (int)arg_int(argc, argv, "recompute", 0)};
    const char *opt = arg_get(argc, argv, "optimizer", "SGD");
    if (strcmp(opt, "SGD") && strcmp(opt, "AdamW")) die("optimizer=%s: expected SGD or AdamW", opt);
    o.adamw = !strcmp(opt, "AdamW");
    int amp = (int)arg_int(argc, argv, "amp", 1);
    if (o.S < 32 || o.S % 32) die("imgsz=%d: must be a positive multiple of 32", o.S);
    if (o.nc < 1) die("nc=%d: must be >= 1", o.nc);
    if (o.max_boxes < 1) die("max_boxes=%d: must be >= 1", o.max_boxes);
    const char *gm = arg_get(argc, argv, "gpu_mem", NULL);
    size_t budget = gm ? parse_bytes("gpu_mem", gm) : 0;
    double bf = arg_num(argc, argv, "batch", 16);
    if (!(bf == -1 || (bf > 0 && bf < 1) || (bf >= 1 && bf == floor(bf))))
        die("batch=%g: expected >= 1, -1 (60%% of gpu_mem) or a fraction", bf);
    if (bf == -1 || bf < 1) {
        if (!gm) die("batch=%g picks the batch from the GPU memory: give gpu_mem= (e.g. gpu_mem=8G)", bf);
        double frac = bf == -1 ? AUTOBATCH_FRACTION : bf;
        PlanOpts q = o;
        q.half = 1;
        q.fp32 = !amp;
        o.B = plan_max_batch(q, (size_t)(budget * frac));
        if (o.B < 1)
            die("batch=%g: not even batch 1 fits %.0f%% of gpu_mem=%s; see the suggestions with batch=1", bf,
                frac * 100, gm);
        printf("batch=%g: the largest batch whose plan fits %.0f%% of %s is %d\n", bf, frac * 100, gm, o.B);
    } else {
        o.B = (int)bf;
        if (o.B != bf) die("batch=%g: expected a whole number, -1 or a fraction below 1", bf);
    }
    plan_ddp_batch(arg_get(argc, argv, "device", ""), &o.B, bf < 1);
    Model *m = xmalloc(sizeof(Model));
    model_build(m, o.scale, o.nc);
    printf("YOLOv8%c nc=%d batch=%d imgsz=%d max_boxes=%d %s recompute=%d: %zu parameters\n", o.scale, o.nc, o.B, o.S,
           o.max_boxes, opt, o.recompute, m->nparams);
    free(m);
    Plan tr, va;
    o.half = 0;
    plan_train(&o, &tr, &va);
    plan_table("CPU layout (FP32; host memory):", &tr, &va);
    printf("  %-22s %8.1f MiB   (GEMM packing, allocated once at start)\n", "+ workspace",
           gemm_workspace_bytes(omp_threads()) / 1048576.0);
    PlanOpts g = o;
    g.half = 1;
    g.fp32 = !amp;
    size_t gtotal = plan_train(&g, &tr, &va);
    plan_table(
            amp ? "GPU layout (the device step's dry run: FP16 activations and their gradients; FP32 master weights, "
                  "weight gradients, optimizer state, EMA):"
                : "GPU layout (the device step's dry run, amp=0: everything FP32):",
            &tr, &va);
    printf("  %-22s %8.1f MiB   (estimate; not part of the plan)\n", "+ CUDA context", GPU_CONTEXT_BYTES / 1048576.0);
    printf("  %-22s %8.1f MiB\n", "device total", (gtotal + GPU_CONTEXT_BYTES) / 1048576.0);
    PlanOpts one = g;
    one.B = 1;
    PlanOpts two = g;
    two.B = 2;
    printf("  activations and buffers per image: %.1f MiB\n",
           ((double)plan_train(&two, NULL, NULL) - plan_train(&one, NULL, NULL)) / 1048576.0);
    if (!gm) {
        printf("give gpu_mem=SIZE (e.g. gpu_mem=8G) to see whether this fits and what to change\n");
        return 0;
    }
    size_t need = gtotal + GPU_CONTEXT_BYTES;
    int bmax = plan_max_batch(g, budget);
    printf("gpu_mem=%s (%.0f MiB): %s; the largest batch that fits is %d\n", gm, budget / 1048576.0,
           need <= budget ? "FITS" : "DOES NOT FIT", bmax);
    if (need <= budget) return 0;
    printf("changes that make it fit, least costly first:\n");
    int k = 1;
    if (bmax >= 1) {
        int acc = (int)fmax(lround(64.0 / bmax), 1);
        printf("  %d. batch=%d accumulate=%d: same nominal batch of 64, same accuracy, more steps per update%s\n", k++,
               bmax, acc, bmax < 8 ? " (BN statistics from fewer than 8 images are noisier)" : "");
    }
    if (!g.recompute) {
        PlanOpts r = g;
        r.recompute = 1;
        if (plan_device_bytes(&r) <= budget)
            printf("  %d. recompute=1: same results, about a third more compute\n", k++);
        else {
            int br = plan_max_batch(r, budget);
            if (br > bmax)
                printf("  %d. recompute=1 batch=%d accumulate=%d: same results, about a third more compute\n", k++, br,
                       (int)fmax(lround(64.0 / br), 1));
        }
    }
    for (int s = g.S - 32; s >= 32; s -= 32) {
        PlanOpts r = g;
        r.S = s;
        if (plan_device_bytes(&r) <= budget) {
            printf("  %d. imgsz=%d: smaller objects are harder to detect\n", k++, s);
            break;
        }
    }
    static const char order[] = "nsmlx";
    for (int i = (int)(strchr(order, g.scale) - order) - 1; i >= 0; i--) {
        PlanOpts r = g;
        r.scale = order[i];
        if (plan_device_bytes(&r) <= budget) {
            printf("  %d. model=yolov8%c: a smaller model, lower accuracy\n", k++, order[i]);
            break;
        }
    }
    if (k == 1) printf("  none: even batch 1 at imgsz 32 with recompute does not fit in %s\n", gm);
    return 1;
}

// cmd_memtable: `yolo memtable [imgsz=640 batch=16]`: the README's table of planned training
// memory for every scale, with and without recompute, beside what Ultralytics users see
// (MMYOLO's YOLOv8 table at 640, batch 16, AMP).
static int cmd_memtable(int argc, char **argv) {
    static const char *keys[] = {"imgsz", "batch", "nc", NULL};
    arg_check(argc, argv, keys);
    int S = (int)arg_int(argc, argv, "imgsz", 640), B = (int)arg_int(argc, argv, "batch", 16),
        nc = (int)arg_int(argc, argv, "nc", 80);
    if (S < 32 || S % 32 || B < 1 || nc < 1) die("memtable: imgsz must be a multiple of 32, batch and nc >= 1");
    static const double others[5] = {2.8, 4.0, 7.2, 9.8, 12.2};
    printf("| model | yolo.c GPU plan, AMP (GB) | with recompute=1 (GB) | yolo.c CPU FP32 (GB) | reported for PyTorch "
           "trainers, AMP (GB) |\n");
    printf("|---|---|---|---|---|\n");
    for (int i = 0; i < 5; i++) {
        PlanOpts o = {.scale = "nsmlx"[i], .nc = nc, .B = B, .S = S, .max_boxes = 400, .half = 1};
        double a = plan_train(&o, NULL, NULL) / 1e9;
        o.recompute = 1;
        double r = plan_train(&o, NULL, NULL) / 1e9;
        o.recompute = 0, o.half = 0;
        double c = plan_train(&o, NULL, NULL) / 1e9;
        char rep[16] = "n/a";
        if (S == 640 && B == 16 && nc == 80) snprintf(rep, sizeof rep, "%.1f", others[i]);
        printf("| yolov8%c | %.2f | %.2f | %.2f | %s |\n", "nsmlx"[i], a, r, c, rep);
    }
    printf("\nimgsz %d, batch %d, nc %d, max_boxes 400, SGD. The yolo.c figures are the whole arena (weights, "
           "gradients, "
           "optimizer state, EMA, activations, backward buffers, loss, input staging); the CUDA context (~0.5 GB) "
           "comes on "
           "top of the GPU figures.\n",
           S, B, nc);
    return 0;
}

// export_safetensors: the weights of model (a .pt or .safetensors file) as F32 safetensors with
// Ultralytics state_dict names at out (default: model's path with the extension .safetensors).
static int export_safetensors(const char *model, const char *out) {
    char err[1024], scale, path[1024], ncs[16], sc[2] = {0};
    int nc;
    if (weights_describe(model, &nc, &scale, err, sizeof err)) die("export: %s", err);
    if (!out) {
        const char *dot = strrchr(model, '.'), *slash = strrchr(model, '/');
        int stem = dot && (!slash || dot > slash) ? (int)(dot - model) : (int)strlen(model);
        snprintf(path, sizeof path, "%.*s.safetensors", stem, model);
        out = path;
    }
    if (!strcmp(out, model)) die("export: out=%s would overwrite the model file", out);
    Model *m = xcalloc(1, sizeof(Model));
    model_build(m, scale, nc);
    m->params = xcalloc(m->nparams, sizeof(float));
    m->buffers = xcalloc(m->nbuffers, sizeof(float));
    StateDict *sd = xcalloc(1, sizeof(StateDict));
    state_dict_build(sd, m, m->params, m->buffers);
    if (weights_load(model, sd->ref, sd->n, err, sizeof err)) die("export: %s", err);
    sc[0] = scale;
    snprintf(ncs, sizeof ncs, "%d", nc);
    const char *kv[] = {"format", "yolo.c", "scale", sc, "nc", ncs, "source", model, NULL};
    if (weights_save(out, sd->ref, sd->n, kv, ST_F32, err, sizeof err)) die("export: %s", err);
    printf("export: %d tensors of %s written to %s (F32, Ultralytics names)\n", sd->n, model, out);
    free(m->params); free(m->buffers); free(m); free(sd);
    return 0;
}

static int cmd_train(int argc, char **argv) {
    Config c = config_from_args(argc, argv);
    if (c.resume && !c.name[0]) die("resume=1 needs name= (the run to resume, in %s/)", c.project);
    int rc = ddp_launch(&c, argc, argv);   // device=0,1,...: this process starts the workers and waits
    return rc >= 0 ? rc : train_run(c);
}


// ------------------------------------------------------------------------------------------
// `yolo export format=onnx`: the detection model as an ONNX graph, protobuf written by hand
// ------------------------------------------------------------------------------------------
/*
 * An .onnx file is one protobuf ModelProto (onnx/onnx.proto). Writing it needs only the wire
 * format: every field is a key varint (field_number << 3 | wire_type) then a varint (wire type 0),
 * 4 little-endian bytes (type 5, float) or a varint length and that many bytes (type 2: strings,
 * bytes, embedded messages). Repeated fields are the same key again. The messages and fields used:
 *   ModelProto       1 ir_version, 2 producer_name, 3 producer_version, 7 graph, 8 opset_import,
 *                    14 metadata_props
 *   OperatorSetId    1 domain (absent: the default ai.onnx), 2 version
 *   StringStringEntry 1 key, 2 value
 *   GraphProto       1 node, 2 name, 5 initializer, 11 input, 12 output
 *   NodeProto        1 input, 2 output, 3 name, 4 op_type, 5 attribute
 *   AttributeProto   1 name, 2 f, 3 i, 4 s, 8 ints, 20 type (1 FLOAT, 2 INT, 3 STRING, 7 INTS)
 *   TensorProto      1 dims, 2 data_type (1 FLOAT, 7 INT64, 10 FLOAT16), 8 name, 9 raw_data
 *   ValueInfoProto   1 name, 2 type; TypeProto 1 tensor_type; TypeProto.Tensor 1 elem_type,
 *                    2 shape; TensorShapeProto 1 dim; Dimension 1 dim_value, 2 dim_param
 * The graph is the one Ultralytics exports for detection (Exporter.export_onnx on a fused model):
 *   images (B, 3, H, W) RGB 0-1 -> backbone and neck with BN folded into each Conv and SiLU as
 *   Sigmoid * Mul -> per level box (B, 64, H_l, W_l) and class (B, NC, H_l, W_l) maps flattened and
 *   concatenated over levels -> DFL: softmax over the 16 bins of each side, expectation with the
 *   frozen DFL weights 0..15 -> dist2bbox (xywh) + anchor points, times the level stride ->
 *   output0 (B, 4+NC, A): cx, cy, w, h in input pixels, then NC sigmoid scores.
 * dynamic=1 names the batch, height and width dimensions (batch, height, width; output0's
 * anchors) and builds the anchor points inside the graph from the maps' shapes (Shape, Range);
 * otherwise they are constants. half=1 stores weights and runs the whole graph in FP16 with an
 * FP16 input and output, as Ultralytics' half=True ONNX export does (model.half(), im.half()).
 */

#define ONNX_OPSET_MIN 11       // Resize with scales, Range, Split with a `split` list
#define ONNX_OPSET_MAX 22
#define ONNX_OPSET_DEFAULT 17   // TensorRT 8.6+, onnxruntime 1.13+, OpenVINO 2022.3+
enum { ONNX_FLOAT = 1, ONNX_INT64 = 7, ONNX_FLOAT16 = 10 };

// ---- protobuf wire format, into a growable byte buffer ----

static void pb_varint(StBuf *b, uint64_t v) {
    char t[10];
    int n = 0;
    do { t[n++] = (char)((v & 0x7f) | (v > 0x7f ? 0x80 : 0)); v >>= 7; } while (v);
    stbuf_put(b, t, (size_t)n);
}
static void pb_key(StBuf *b, int field, int wire) { pb_varint(b, (uint64_t)field << 3 | (uint64_t)wire); }
static void pb_int(StBuf *b, int field, int64_t v) { pb_key(b, field, 0); pb_varint(b, (uint64_t)v); }
static void pb_bytes(StBuf *b, int field, const void *p, size_t n) {
    pb_key(b, field, 2);
    pb_varint(b, n);
    if (n) stbuf_put(b, p, n);
}
static void pb_str(StBuf *b, int field, const char *s) { pb_bytes(b, field, s, strlen(s)); }
// pb_msg: sub as an embedded message field of b; sub is emptied
static void pb_msg(StBuf *b, int field, StBuf *sub) {
    pb_bytes(b, field, sub->p, sub->n);
    free(sub->p);
    memset(sub, 0, sizeof *sub);
}

// ---- graph builder ----

typedef struct {
    StBuf nodes;            // encoded GraphProto.node fields
    StBuf inits;            // encoded GraphProto.initializer fields
    int opset, half, dynamic, B, H, W;
    int elem;               // element type of activations and float weights: ONNX_FLOAT or ONNX_FLOAT16
    int nnode, ninit;
    char err[256];          // the first error (an FP16 overflow), or empty
} OnnxGraph;

// onnx_attr_*: one AttributeProto appended to an attribute list a (the NodeProto field 5)
static void onnx_attr_int(StBuf *a, const char *name, int64_t v) {
    StBuf t = {0};
    pb_str(&t, 1, name); pb_int(&t, 3, v); pb_int(&t, 20, 2);
    pb_msg(a, 5, &t);
}
static void onnx_attr_ints(StBuf *a, const char *name, int n, const int64_t *v) {
    StBuf t = {0};
    pb_str(&t, 1, name);
    for (int i = 0; i < n; i++) pb_int(&t, 8, v[i]);
    pb_int(&t, 20, 7);
    pb_msg(a, 5, &t);
}
static void onnx_attr_str(StBuf *a, const char *name, const char *s) {
    StBuf t = {0};
    pb_str(&t, 1, name); pb_str(&t, 4, s); pb_int(&t, 20, 3);
    pb_msg(a, 5, &t);
}

// onnx_node: appends a node of type op with NULL-terminated input and output name lists and an
// attribute list (consumed; NULL for none). Named after its first output.
static void onnx_node(OnnxGraph *g, const char *op, const char *const *in, const char *const *out, StBuf *attrs) {
    StBuf t = {0};
    for (int i = 0; in[i]; i++) pb_str(&t, 1, in[i]);
    for (int i = 0; out[i]; i++) pb_str(&t, 2, out[i]);
    pb_str(&t, 3, out[0]);
    pb_str(&t, 4, op);
    if (attrs && attrs->n) { stbuf_put(&t, attrs->p, attrs->n); free(attrs->p); memset(attrs, 0, sizeof *attrs); }
    pb_msg(&g->nodes, 1, &t);
    g->nnode++;
}
#define ONNX_IN(...) ((const char *const[]){__VA_ARGS__, NULL})

// onnx_init_raw: an initializer of data type dtype and shape dims (ndim may be 0: a scalar)
// whose little-endian bytes are raw. The bytes are copied once, straight into the graph.
static void onnx_init_raw(OnnxGraph *g, const char *name, int dtype, int ndim, const int64_t *dims, const void *raw,
                          size_t nbytes) {
    StBuf t = {0};
    for (int d = 0; d < ndim; d++) pb_int(&t, 1, dims[d]);
    pb_int(&t, 2, dtype);
    pb_str(&t, 8, name);
    pb_key(&t, 9, 2);
    pb_varint(&t, nbytes);
    pb_key(&g->inits, 5, 2);
    pb_varint(&g->inits, t.n + nbytes);
    stbuf_put(&g->inits, t.p, t.n);
    if (nbytes) stbuf_put(&g->inits, raw, nbytes);
    free(t.p);
    g->ninit++;
}
// onnx_init_f: float values as the graph's element type (FP16 when half; a finite value that
// overflows FP16 is recorded as the graph's error)
static void onnx_init_f(OnnxGraph *g, const char *name, int ndim, const int64_t *dims, const float *v) {
    size_t n = 1;
    for (int d = 0; d < ndim; d++) n *= (size_t)dims[d];
    if (!g->half) { onnx_init_raw(g, name, ONNX_FLOAT, ndim, dims, v, n * sizeof(float)); return; }
    uint16_t *h = xmalloc(n * sizeof(uint16_t));
    for (size_t i = 0; i < n; i++) {
        h[i] = float_to_half(v[i]);
        if (isfinite(v[i]) && (h[i] & 0x7fffu) == 0x7c00u && !g->err[0])
            snprintf(g->err, sizeof g->err,
                     "tensor %s: value %g at index %zu overflows FP16 (half=1); export with half=0", name, (double)v[i],
                     i);
    }
    onnx_init_raw(g, name, ONNX_FLOAT16, ndim, dims, h, n * sizeof(uint16_t));
    free(h);
}
static void onnx_init_i64(OnnxGraph *g, const char *name, int ndim, const int64_t *dims, const int64_t *v) {
    size_t n = 1;
    for (int d = 0; d < ndim; d++) n *= (size_t)dims[d];
    onnx_init_raw(g, name, ONNX_INT64, ndim, dims, v, n * sizeof(int64_t));
}
// onnx_scalar: a named 0-d float constant (element type of the graph)
static void onnx_scalar(OnnxGraph *g, const char *name, float v) { onnx_init_f(g, name, 0, NULL, &v); }

// onnx_split: Split of x along axis into n parts of size[i] with outputs out[i]. The sizes are an
// attribute before opset 13 and an input from 13 on.
static void onnx_split(OnnxGraph *g, const char *x, int axis, int n, const int64_t *size, const char *const *out) {
    StBuf a = {0};
    onnx_attr_int(&a, "axis", axis);
    if (g->opset < 13) {
        onnx_attr_ints(&a, "split", n, size);
        onnx_node(g, "Split", ONNX_IN(x), out, &a);
        return;
    }
    char sn[96];
    snprintf(sn, sizeof sn, "%s.split", out[0]);
    onnx_init_i64(g, sn, 1, (int64_t[]){n}, size);
    onnx_node(g, "Split", ONNX_IN(x, sn), out, &a);
}

// onnx_reshape: y = Reshape(x, shape) with a constant shape (0 copies the input's dimension)
static void onnx_reshape(OnnxGraph *g, const char *x, const char *y, int n, const int64_t *shape) {
    char sn[208];   // a value name (up to 191 bytes) and ".shape"
    snprintf(sn, sizeof sn, "%s.shape", y);
    onnx_init_i64(g, sn, 1, (int64_t[]){n}, shape);
    onnx_node(g, "Reshape", ONNX_IN(x, sn), ONNX_IN(y), NULL);
}

// onnx_conv: the Conv of c with BN folded in (Ultralytics fuse_conv_and_bn: w' = w * g/sqrt(var+eps),
// b' = beta - mean * g/sqrt(var+eps), computed here in double), then SiLU as Sigmoid * Mul when
// the conv has BN. Writes the output tensor's name to out (the conv's module name).
static void onnx_conv(OnnxGraph *g, const Model *m, const Conv *c, const char *in, char out[64]) {
    size_t per = (size_t)c->cin * c->k * c->k;
    float *w = xmalloc((size_t)c->cout * per * sizeof(float)), *b = xmalloc((size_t)c->cout * sizeof(float));
    const float *w0 = m->params + c->w_off, *b0 = m->params + c->b_off;
    for (int o = 0; o < c->cout; o++) {
        double s = 1.0, shift = b0[o];
        if (c->bn) {
            const float *rm = m->buffers + c->rs_off, *rv = rm + c->cout;
            s = m->params[c->g_off + o] / sqrt((double)rv[o] + BN_EPS);
            shift = b0[o] - rm[o] * s;
        }
        for (size_t j = 0; j < per; j++) w[o * per + j] = (float)(w0[o * per + j] * s);
        b[o] = (float)shift;
    }
    char wn[80], bn[80], zn[80], sn[80];
    const char *sep = c->bn ? ".conv" : "";   // Ultralytics' fused Conv keeps its .conv submodule
    snprintf(wn, sizeof wn, "%s%s.weight", c->name, sep);
    snprintf(bn, sizeof bn, "%s%s.bias", c->name, sep);
    onnx_init_f(g, wn, 4, (int64_t[]){c->cout, c->cin, c->k, c->k}, w);
    onnx_init_f(g, bn, 1, (int64_t[]){c->cout}, b);
    free(w); free(b);
    int64_t p = c->k / 2;
    StBuf a = {0};
    onnx_attr_ints(&a, "dilations", 2, (int64_t[]){1, 1});
    onnx_attr_int(&a, "group", 1);
    onnx_attr_ints(&a, "kernel_shape", 2, (int64_t[]){c->k, c->k});
    onnx_attr_ints(&a, "pads", 4, (int64_t[]){p, p, p, p});
    onnx_attr_ints(&a, "strides", 2, (int64_t[]){c->s, c->s});
    snprintf(out, 64, "%s", c->name);
    if (!c->bn) { onnx_node(g, "Conv", ONNX_IN(in, wn, bn), ONNX_IN(out), &a); return; }
    snprintf(zn, sizeof zn, "%s.conv", c->name);
    snprintf(sn, sizeof sn, "%s.sigmoid", c->name);
    onnx_node(g, "Conv", ONNX_IN(in, wn, bn), ONNX_IN(zn), &a);
    onnx_node(g, "Sigmoid", ONNX_IN(zn), ONNX_IN(sn), NULL);
    onnx_node(g, "Mul", ONNX_IN(zn, sn), ONNX_IN(out), NULL);
}

// onnx_anchors_dynamic: anchor points (2, H_l*W_l) and their stride (1, H_l*W_l) of one level,
// computed in the graph from the shape of that level's map f (make_anchors with offset 0.5):
// x + 0.5 and y + 0.5 over the row-major grid. Names written to anc and str.
static void onnx_anchors_dynamic(OnnxGraph *g, int l, const char *f, int stride, char anc[64], char str[64]) {
    char n[16][64];
    for (int i = 0; i < 16; i++) snprintf(n[i], 64, "anchors.%d.%d", l, i);
    char stn[64];
    snprintf(stn, sizeof stn, "anchors.%d.stride", l);
    onnx_scalar(g, stn, (float)stride);
    onnx_node(g, "Shape", ONNX_IN(f), ONNX_IN(n[0]), NULL);
    StBuf a = {0};
    onnx_attr_int(&a, "axis", 0);
    onnx_node(g, "Gather", ONNX_IN(n[0], "anchors.i2"), ONNX_IN(n[1]), &a);   // H (scalar)
    onnx_attr_int(&a, "axis", 0);
    onnx_node(g, "Gather", ONNX_IN(n[0], "anchors.i3"), ONNX_IN(n[2]), &a);   // W
    onnx_node(g, "Range", ONNX_IN("anchors.i0", n[1], "anchors.i1"), ONNX_IN(n[3]), NULL);   // 0..H-1
    onnx_node(g, "Range", ONNX_IN("anchors.i0", n[2], "anchors.i1"), ONNX_IN(n[4]), NULL);   // 0..W-1
    onnx_attr_int(&a, "to", g->elem);
    onnx_node(g, "Cast", ONNX_IN(n[3]), ONNX_IN(n[5]), &a);
    onnx_attr_int(&a, "to", g->elem);
    onnx_node(g, "Cast", ONNX_IN(n[4]), ONNX_IN(n[6]), &a);
    onnx_reshape(g, n[5], n[7], 2, (int64_t[]){-1, 1});                     // y (H, 1)
    onnx_reshape(g, n[6], n[8], 2, (int64_t[]){1, -1});                     // x (1, W)
    onnx_node(g, "Mul", ONNX_IN(n[7], "anchors.zero"), ONNX_IN(n[9]), NULL);    // zeros (H, 1)
    onnx_node(g, "Mul", ONNX_IN(n[8], "anchors.zero"), ONNX_IN(n[10]), NULL);   // zeros (1, W)
    onnx_node(g, "Add", ONNX_IN(n[8], n[9]), ONNX_IN(n[11]), NULL);         // x over (H, W)
    onnx_node(g, "Add", ONNX_IN(n[7], n[10]), ONNX_IN(n[12]), NULL);        // y over (H, W)
    onnx_node(g, "Add", ONNX_IN(n[9], n[10]), ONNX_IN(n[13]), NULL);        // zeros (H, W)
    char ax[64], ay[64], sx[64], fx[64], fy[64];
    snprintf(ax, 64, "anchors.%d.x", l); snprintf(ay, 64, "anchors.%d.y", l); snprintf(sx, 64, "anchors.%d.s", l);
    snprintf(fx, 64, "anchors.%d.fx", l); snprintf(fy, 64, "anchors.%d.fy", l);
    onnx_node(g, "Add", ONNX_IN(n[11], "anchors.half"), ONNX_IN(ax), NULL);
    onnx_node(g, "Add", ONNX_IN(n[12], "anchors.half"), ONNX_IN(ay), NULL);
    onnx_node(g, "Add", ONNX_IN(n[13], stn), ONNX_IN(sx), NULL);
    onnx_reshape(g, ax, fx, 2, (int64_t[]){1, -1});
    onnx_reshape(g, ay, fy, 2, (int64_t[]){1, -1});
    snprintf(anc, 64, "anchors.%d", l);
    snprintf(str, 64, "strides.%d", l);
    onnx_attr_int(&a, "axis", 0);
    onnx_node(g, "Concat", ONNX_IN(fx, fy), ONNX_IN(anc), &a);
    onnx_reshape(g, sx, str, 2, (int64_t[]){1, -1});
}

// onnx_graph_build: every node and initializer of the detection graph (see the section comment).
static void onnx_graph_build(OnnxGraph *g, const Model *m) {
    char (*vn)[64] = xcalloc((size_t)m->nvalue, 64);       // tensor name of each value
    int *conv_val = xmalloc(sizeof(int) * (size_t)m->nconv); // value id of each conv's output
    int *split_done = xcalloc((size_t)m->nconv, sizeof(int));
    StBuf a = {0};
    int have_up = 0;
    for (int i = 0; i < m->nvalue; i++) {
        const Value *v = &m->val[i];
        switch (v->kind) {
        case V_INPUT: snprintf(vn[i], 64, "images"); break;
        case V_CONV: {
            const Conv *c = &m->conv[v->conv];
            onnx_conv(g, m, c, vn[c->in], vn[i]);
            conv_val[v->conv] = i;
            break;
        }
        case V_SLICE: {   // the C2f chunk(2, 1): one Split per conv into equal parts
            const Conv *c = &m->conv[v->conv];
            int parts = c->cout / v->C;
            if (parts < 1 || parts > 8 || parts * v->C != c->cout || v->c0 % v->C)
                die("onnx export: %s: unsupported channel slice", c->name);
            if (!split_done[v->conv]) {
                char names[8][64];
                const char *outs[9];
                int64_t size[8];
                for (int k = 0; k < parts; k++) {
                    snprintf(names[k], 64, "%s.chunk%d", c->name, k);
                    outs[k] = names[k];
                    size[k] = v->C;
                }
                outs[parts] = NULL;
                onnx_split(g, vn[conv_val[v->conv]], 1, parts, size, outs);
                split_done[v->conv] = 1;
            }
            snprintf(vn[i], 64, "%s.chunk%d", c->name, v->c0 / v->C);
            break;
        }
        case V_ADD:
            snprintf(vn[i], 64, "add.%d", i);
            onnx_node(g, "Add", ONNX_IN(vn[v->src[0]], vn[v->src[1]]), ONNX_IN(vn[i]), NULL);
            break;
        case V_CAT: {
            const char *ins[MAX_CAT + 1];
            for (int k = 0; k < v->n; k++) ins[k] = vn[v->src[k]];
            ins[v->n] = NULL;
            snprintf(vn[i], 64, "concat.%d", i);
            onnx_attr_int(&a, "axis", 1);
            onnx_node(g, "Concat", ins, ONNX_IN(vn[i]), &a);
            break;
        }
        case V_UP:   // nn.Upsample(scale_factor=2, mode='nearest') as torch exports it
            if (!have_up) {
                // scales are always float32; roi is a required input before opset 13
                onnx_init_raw(g, "upsample.scales", ONNX_FLOAT, 1, (int64_t[]){4}, (float[]){1, 1, 2, 2}, 16);
                if (g->opset < 13) onnx_init_raw(g, "upsample.roi", ONNX_FLOAT, 1, (int64_t[]){0}, NULL, 0);
                have_up = 1;
            }
            snprintf(vn[i], 64, "upsample.%d", i);
            onnx_attr_str(&a, "coordinate_transformation_mode", "asymmetric");
            onnx_attr_str(&a, "mode", "nearest");
            onnx_attr_str(&a, "nearest_mode", "floor");
            onnx_node(g, "Resize", ONNX_IN(vn[v->src[0]], g->opset < 13 ? "upsample.roi" : "", "upsample.scales"),
                      ONNX_IN(vn[i]), &a);
            break;
        case V_POOL:   // MaxPool2d(5, 1, 2)
            snprintf(vn[i], 64, "maxpool.%d", i);
            onnx_attr_ints(&a, "kernel_shape", 2, (int64_t[]){5, 5});
            onnx_attr_ints(&a, "pads", 4, (int64_t[]){2, 2, 2, 2});
            onnx_attr_ints(&a, "strides", 2, (int64_t[]){1, 1});
            onnx_node(g, "MaxPool", ONNX_IN(vn[v->src[0]]), ONNX_IN(vn[i]), &a);
            break;
        default: die("onnx export: value %d has an unknown kind %d", i, v->kind);
        }
    }
    // Detect: flatten each level's box and class maps, concatenate the levels
    char box_l[3][64], cls_l[3][64], anc_l[3][64], str_l[3][64];
    for (int l = 0; l < 3; l++) {
        snprintf(box_l[l], 64, "head.box.%d", l);
        snprintf(cls_l[l], 64, "head.cls.%d", l);
        onnx_reshape(g, vn[conv_val[m->head_conv[l][0]]], box_l[l], 3, (int64_t[]){0, 4 * REG_MAX, -1});
        onnx_reshape(g, vn[conv_val[m->head_conv[l][1]]], cls_l[l], 3, (int64_t[]){0, m->nc, -1});
    }
    onnx_attr_int(&a, "axis", 2);
    onnx_node(g, "Concat", ONNX_IN(box_l[0], box_l[1], box_l[2]), ONNX_IN("head.box"), &a);   // (B, 64, A)
    onnx_attr_int(&a, "axis", 2);
    onnx_node(g, "Concat", ONNX_IN(cls_l[0], cls_l[1], cls_l[2]), ONNX_IN("head.cls"), &a);   // (B, NC, A)
    // DFL: (B, 4, 16, A) -> (B, 4, A, 16), softmax over the bins, times the DFL weights 0..15
    onnx_reshape(g, "head.box", "dfl.bins", 4, (int64_t[]){0, 4, REG_MAX, -1});
    onnx_attr_ints(&a, "perm", 4, (int64_t[]){0, 1, 3, 2});
    onnx_node(g, "Transpose", ONNX_IN("dfl.bins"), ONNX_IN("dfl.transpose"), &a);
    onnx_attr_int(&a, "axis", 3);
    onnx_node(g, "Softmax", ONNX_IN("dfl.transpose"), ONNX_IN("dfl.softmax"), &a);
    onnx_init_f(g, "model.22.dfl.conv.weight", 2, (int64_t[]){REG_MAX, 1}, m->params + m->dfl_off);
    onnx_node(g, "MatMul", ONNX_IN("dfl.softmax", "model.22.dfl.conv.weight"), ONNX_IN("dfl.expect"), NULL);
    onnx_reshape(g, "dfl.expect", "dfl", 3, (int64_t[]){0, 4, -1});                              // (B, 4, A) l t r b
    // anchor points (2, A) and strides (1, A)
    if (g->dynamic) {
        onnx_init_i64(g, "anchors.i0", 0, NULL, (int64_t[]){0});
        onnx_init_i64(g, "anchors.i1", 0, NULL, (int64_t[]){1});
        onnx_init_i64(g, "anchors.i2", 0, NULL, (int64_t[]){2});
        onnx_init_i64(g, "anchors.i3", 0, NULL, (int64_t[]){3});
        onnx_scalar(g, "anchors.zero", 0.0f);
        onnx_scalar(g, "anchors.half", 0.5f);
        for (int l = 0; l < 3; l++)
            onnx_anchors_dynamic(g, l, vn[conv_val[m->head_conv[l][0]]], head_strides[l], anc_l[l], str_l[l]);
        onnx_attr_int(&a, "axis", 1);
        onnx_node(g, "Concat", ONNX_IN(anc_l[0], anc_l[1], anc_l[2]), ONNX_IN("anchors"), &a);
        onnx_attr_int(&a, "axis", 1);
        onnx_node(g, "Concat", ONNX_IN(str_l[0], str_l[1], str_l[2]), ONNX_IN("strides"), &a);
    } else {
        int A = head_anchor_count(g->H, g->W);
        float *anc = xmalloc(sizeof(float) * 3 * (size_t)A), *str = anc + 2 * (size_t)A;
        for (int l = 0, a0 = 0; l < 3; l++) {
            int Hl = g->H / head_strides[l], Wl = g->W / head_strides[l];
            for (int p = 0; p < Hl * Wl; p++) {
                anc[a0 + p] = (float)(p % Wl) + 0.5f;
                anc[(size_t)A + a0 + p] = (float)(p / Wl) + 0.5f;
                str[a0 + p] = (float)head_strides[l];
            }
            a0 += Hl * Wl;
        }
        onnx_init_f(g, "anchors", 2, (int64_t[]){2, A}, anc);
        onnx_init_f(g, "strides", 2, (int64_t[]){1, A}, str);
        free(anc);
    }
    // dist2bbox(xywh=True): x1y1 = anchor - lt, x2y2 = anchor + rb, centre and size, times stride
    onnx_scalar(g, "decode.two", 2.0f);
    onnx_split(g, "dfl", 1, 2, (int64_t[]){2, 2}, ONNX_IN("decode.lt", "decode.rb"));
    onnx_node(g, "Sub", ONNX_IN("anchors", "decode.lt"), ONNX_IN("decode.x1y1"), NULL);
    onnx_node(g, "Add", ONNX_IN("anchors", "decode.rb"), ONNX_IN("decode.x2y2"), NULL);
    onnx_node(g, "Add", ONNX_IN("decode.x1y1", "decode.x2y2"), ONNX_IN("decode.sum"), NULL);
    onnx_node(g, "Div", ONNX_IN("decode.sum", "decode.two"), ONNX_IN("decode.cxcy"), NULL);
    onnx_node(g, "Sub", ONNX_IN("decode.x2y2", "decode.x1y1"), ONNX_IN("decode.wh"), NULL);
    onnx_attr_int(&a, "axis", 1);
    onnx_node(g, "Concat", ONNX_IN("decode.cxcy", "decode.wh"), ONNX_IN("decode.xywh"), &a);
    onnx_node(g, "Mul", ONNX_IN("decode.xywh", "strides"), ONNX_IN("decode.box"), NULL);      // (B, 4, A) pixels
    onnx_node(g, "Sigmoid", ONNX_IN("head.cls"), ONNX_IN("decode.scores"), NULL);             // (B, NC, A)
    onnx_attr_int(&a, "axis", 1);
    onnx_node(g, "Concat", ONNX_IN("decode.box", "decode.scores"), ONNX_IN("output0"), &a);
    free(vn); free(conv_val); free(split_done);
}

// onnx_value_info: a graph input or output: name, element type and 3 or 4 dims, each a number or,
// when param[d] is set, a symbolic name
static void onnx_value_info(StBuf *graph, int field, const char *name, int elem, int ndim, const int64_t *dims,
                            const char *const *param) {
    StBuf shape = {0}, tensor = {0}, type = {0}, vi = {0};
    for (int d = 0; d < ndim; d++) {
        StBuf dim = {0};
        if (param && param[d]) pb_str(&dim, 2, param[d]);
        else pb_int(&dim, 1, dims[d]);
        pb_msg(&shape, 1, &dim);
    }
    pb_int(&tensor, 1, elem);
    pb_msg(&tensor, 2, &shape);
    pb_msg(&type, 1, &tensor);
    pb_str(&vi, 1, name);
    pb_msg(&vi, 2, &type);
    pb_msg(graph, field, &vi);
}

// onnx_ir_version: the IR version that goes with an opset (onnx/helper.py VERSION_TABLE)
static int onnx_ir_version(int opset) {
    return opset <= 11 ? 6 : opset <= 14 ? 7 : opset <= 18 ? 8 : opset <= 20 ? 9 : 10;
}

// py_repr_str: s as Python's repr() writes a str (single quotes unless s has ' and no "), so
// that Ultralytics' AutoBackend can eval() the names dictionary
static void py_repr_str(StBuf *b, const char *s) {
    char q = strchr(s, '\'') && !strchr(s, '"') ? '"' : '\'';
    stbuf_put(b, &q, 1);
    for (const unsigned char *u = (const unsigned char *)s; *u; u++) {
        if (*u == '\\' || *u == (unsigned char)q) { char e[2] = {'\\', (char)*u}; stbuf_put(b, e, 2); }
        else if (*u == '\n') stbuf_put(b, "\\n", 2);
        else if (*u == '\t') stbuf_put(b, "\\t", 2);
        else if (*u == '\r') stbuf_put(b, "\\r", 2);
        else if (*u < 0x20 || *u == 0x7f) stbuf_printf(b, "\\x%02x", *u);
        else stbuf_put(b, (const char *)u, 1);
    }
    stbuf_put(b, &q, 1);
}

typedef struct {
    int imgsz, batch, dynamic, half, opset;
    const char *const *names;   // (nc) class names, or NULL for class0, class1, ...
    const char *source;         // the weights file, for the description
} OnnxOptions;

// onnx_check_options: the settings export accepts; 0, or -1 with a message in err
static int onnx_check_options(const OnnxOptions *o, char *err, size_t errlen) {
    if (o->imgsz < 32 || o->imgsz > 8192 || o->imgsz % 32)
        snprintf(err, errlen, "imgsz=%d must be a multiple of 32 (the largest stride) between 32 and 8192", o->imgsz);
    else if (o->batch < 1 || o->batch > 1024)
        snprintf(err, errlen, "batch=%d must be between 1 and 1024", o->batch);
    else if (o->opset < ONNX_OPSET_MIN || o->opset > ONNX_OPSET_MAX)
        snprintf(err, errlen, "opset=%d is not supported: use %d..%d (default %d)", o->opset, ONNX_OPSET_MIN,
                 ONNX_OPSET_MAX, ONNX_OPSET_DEFAULT);
    else if ((o->dynamic != 0 && o->dynamic != 1) || (o->half != 0 && o->half != 1))
        snprintf(err, errlen, "dynamic=%d half=%d: each must be 0 or 1", o->dynamic, o->half);
    else return 0;
    return -1;
}

// file_write_atomic: the n bytes of parts[0..np) back to back into path through path.tmp
// (written, flushed, fsync'ed, renamed over path); on failure path is untouched and path.tmp
// removed. 0, or -1 with a message in err.
static int file_write_atomic(const char *path, int np, const StBuf *parts, char *err, size_t errlen) {
    size_t plen = strlen(path);
    char *tmp = xmalloc(plen + 5);
    memcpy(tmp, path, plen);
    memcpy(tmp + plen, ".tmp", 5);
    FILE *f = fopen(tmp, "wb");
    int rc = -1;
    if (!f) {
        snprintf(err, errlen, "cannot create '%s': %s (hint: does the directory exist and is it writable?)", tmp,
                 strerror(errno));
        free(tmp);
        return -1;
    }
    int ok = 1;
    for (int i = 0; i < np && ok; i++) ok = !parts[i].n || fwrite(parts[i].p, 1, parts[i].n, f) == parts[i].n;
    ok = ok && fflush(f) == 0 && fsync(fileno(f)) == 0;
    ok = (fclose(f) == 0) && ok;
    if (!ok) snprintf(err, errlen, "writing '%s' failed: %s", tmp, strerror(errno ? errno : EIO));
    else if (rename(tmp, path) != 0)
        snprintf(err, errlen, "cannot rename '%.200s' to '%.200s': %s", tmp, path, strerror(errno));
    else { st_fsync_dir(path); rc = 0; }
    if (rc) unlink(tmp);
    free(tmp);
    return rc;
}

// onnx_export: writes model m (parameters and BN statistics loaded) as an ONNX file at path
// (atomically). Returns 0, or -1 with a message in err and nothing written.
static int onnx_export(const Model *m, const OnnxOptions *o, const char *path, char *err, size_t errlen) {
    if (onnx_check_options(o, err, errlen)) return -1;
    OnnxGraph g = {
            .opset = o->opset, .half = o->half, .dynamic = o->dynamic, .B = o->batch, .H = o->imgsz, .W = o->imgsz};
    g.elem = o->half ? ONNX_FLOAT16 : ONNX_FLOAT;
    onnx_graph_build(&g, m);
    if (g.err[0]) {
        snprintf(err, errlen, "%s", g.err);
        free(g.nodes.p); free(g.inits.p);
        return -1;
    }
    // GraphProto: nodes, name, initializers, input, output
    StBuf graph = g.nodes;
    pb_str(&graph, 2, "main_graph");
    stbuf_put(&graph, g.inits.p, g.inits.n);
    free(g.inits.p);
    int A = head_anchor_count(o->imgsz, o->imgsz);
    const char *in_param[4] = {"batch", NULL, "height", "width"}, *out_param[3] = {"batch", NULL, "anchors"};
    onnx_value_info(&graph, 11, "images", g.elem, 4, (int64_t[]){o->batch, 3, o->imgsz, o->imgsz},
                    o->dynamic ? in_param : NULL);
    onnx_value_info(&graph, 12, "output0", g.elem, 3, (int64_t[]){o->batch, 4 + m->nc, A},
                    o->dynamic ? out_param : NULL);
    // ModelProto fields other than the graph, then the graph's key and length
    StBuf head = {0}, sub = {0};
    pb_int(&head, 1, onnx_ir_version(o->opset));
    pb_str(&head, 2, "yolo.c");
    pb_int(&sub, 2, o->opset);
    pb_msg(&head, 8, &sub);
    // metadata_props: Ultralytics' keys, each value as Python's str() of theirs
    char date[32], desc[600], num[3][32];
    time_t now = time(NULL);
    strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%S", localtime(&now));
    snprintf(desc, sizeof desc, "yolo.c YOLOv8%c model from %s", m->scale, o->source ? o->source : "memory");
    snprintf(num[0], 32, "%d", o->batch);
    snprintf(num[1], 32, "[%d, %d]", o->imgsz, o->imgsz);
    StBuf names = {0}, args = {0};
    stbuf_put(&names, "{", 1);
    for (int c = 0; c < m->nc; c++) {
        stbuf_printf(&names, "%s%d: ", c ? ", " : "", c);
        char dflt[32];
        snprintf(dflt, sizeof dflt, "class%d", c);
        py_repr_str(&names, o->names ? o->names[c] : dflt);
    }
    stbuf_put(&names, "}", 1);
    stbuf_printf(&args, "{'batch': %d, 'half': %s, 'dynamic': %s, 'simplify': False, 'opset': %d, 'nms': False}",
                 o->batch, o->half ? "True" : "False", o->dynamic ? "True" : "False", o->opset);
    const char *kv[][2] = {
        {"description", desc}, {"author", "yolo.c"}, {"date", date}, {"version", "yolo.c"},
        {"license", "not stated (weights trained or converted with yolo.c)"}, {"docs", "README.md of yolo.c"},
        {"stride", "32"}, {"task", "detect"}, {"batch", num[0]}, {"imgsz", num[1]}, {"names", names.p},
        {"args", args.p}, {"channels", "3"},
    };
    for (size_t i = 0; i < sizeof kv / sizeof kv[0]; i++) {
        pb_str(&sub, 1, kv[i][0]);
        pb_str(&sub, 2, kv[i][1]);
        pb_msg(&head, 14, &sub);
    }
    free(names.p); free(args.p);
    pb_key(&head, 7, 2);
    pb_varint(&head, graph.n);
    StBuf parts[2] = {head, graph};
    int rc = file_write_atomic(path, 2, parts, err, errlen);
    free(head.p); free(graph.p);
    return rc;
}

// onnx_path_for: the weights path with its extension replaced by .onnx (X.safetensors -> X.onnx)
static void onnx_path_for(const char *weights, char *out, size_t n) {
    snprintf(out, n, "%s", weights);
    char *dot = strrchr(out, '.'), *slash = strrchr(out, '/');
    if (dot && (!slash || dot > slash)) *dot = 0;
    size_t len = strlen(out);
    snprintf(out + len, n - len, ".onnx");
}

static const char *const export_keys[] = {"model", "format", "imgsz", "batch", "dynamic",
                                          "half",  "opset",  "data",  NULL};

// cmd_export_onnx: `yolo export model=X.safetensors|X.pt format=onnx [imgsz=640 batch=1 dynamic=0
// half=0 opset=17 data=FILE]` writes X.onnx next to the weights (class names from data=).
static int cmd_export_onnx(int argc, char **argv) {
    arg_check(argc, argv, export_keys);
    const char *model = arg_get(argc, argv, "model", "");
    if (!model[0]) die("export: model= is required (a .safetensors or .pt weights file)");
    OnnxOptions o = {
        .imgsz = (int)arg_int(argc, argv, "imgsz", 640), .batch = (int)arg_int(argc, argv, "batch", 1),
        .dynamic = (int)arg_int(argc, argv, "dynamic", 0), .half = (int)arg_int(argc, argv, "half", 0),
        .opset = (int)arg_int(argc, argv, "opset", ONNX_OPSET_DEFAULT), .source = model,
    };
    char err[1024], path[2048];
    if (onnx_check_options(&o, err, sizeof err)) die("export: %s", err);
    int fnc;
    char scale;
    if (weights_infer(model, &fnc, &scale, err, sizeof err)) die("export: model=%s: %s", model, err);
    DataConfig dc = {0};
    const char *data = arg_get(argc, argv, "data", "");
    if (data[0]) {
        if (data_yaml_load(data, &dc, err, sizeof err)) die("export: %s", err);
        if (dc.nc != fnc) die("export: %s names %d classes but model=%s has nc=%d", data, dc.nc, model, fnc);
        o.names = (const char *const *)dc.names;
    } else if ((dc.names = weights_names(model, fnc))) {   // a checkpoint's own class names
        o.names = (const char *const *)dc.names;
    }
    Model *m = xcalloc(1, sizeof(Model));
    model_build(m, scale, fnc);
    m->params = xmalloc(m->nparams * sizeof(float));
    m->buffers = xmalloc(m->nbuffers * sizeof(float));
    model_load_weights(m, model, fnc, 0, 0);
    onnx_path_for(model, path, sizeof path);
    double t0 = now_sec();
    if (onnx_export(m, &o, path, err, sizeof err)) die("export: %s", err);
    struct stat sb;
    if (stat(path, &sb)) die("export: %s vanished after writing: %s", path, strerror(errno));
    const char *ty = o.half ? "float16" : "float32";
    int A = head_anchor_count(o.imgsz, o.imgsz);
    printf("export: %s (%.1f MB, opset %d, %s, %.1f s)\n", path, sb.st_size / 1e6, o.opset, ty, now_sec() - t0);
    if (o.dynamic) {
        printf("  input   images  %s [batch, 3, height, width] (exported for %d x 3 x %d x %d; RGB 0-1, letterboxed; "
               "height and width multiples of 32)\n", ty, o.batch, o.imgsz, o.imgsz);
        printf("  output  output0 %s [batch, %d, anchors] (cx, cy, w, h in input pixels, then %d class scores)\n", ty,
               4 + fnc, fnc);
    } else {
        printf("  input   images  %s [%d, 3, %d, %d] (RGB 0-1, letterboxed)\n", ty, o.batch, o.imgsz, o.imgsz);
        printf("  output  output0 %s [%d, %d, %d] (cx, cy, w, h in input pixels, then %d class scores)\n", ty, o.batch,
               4 + fnc, A, fnc);
    }
    printf("check:  python3 -c \"import onnx; onnx.checker.check_model('%s', full_check=True)\"\n", path);
    printf("run:    node test/onnx_run.js %s   (after: npm install --prefix test/onnx onnxruntime-node "
           "--ignore-scripts)\n",
           path);
    printf("engine: trtexec --onnx=%s --saveEngine=%.*s.engine%s", path, (int)(strlen(path) - 5), path,
           o.half ? " --fp16" : "");
    if (o.dynamic)   // TensorRT needs the range of the symbolic dimensions
        printf(" --minShapes=images:1x3x32x32 --optShapes=images:%dx3x%dx%d --maxShapes=images:%dx3x%dx%d", o.batch,
               o.imgsz, o.imgsz, o.batch, o.imgsz, o.imgsz);
    printf("\n");
    free(m->params); free(m->buffers); free(m);
    if (data[0]) data_config_free(&dc);
    return 0;
}

// cmd_export: `yolo export model=FILE format=FORMAT ...`, one writer per format: onnx (the
// deployable graph, cmd_export_onnx checks its own keys) or safetensors (a .pt's weights as F32
// with Ultralytics names)
static int cmd_export(int argc, char **argv) {
    const char *model = arg_get(argc, argv, "model", NULL), *format = arg_get(argc, argv, "format", NULL);
    if (!model || !format)
        die("export: model= and format= are required, e.g. yolo export model=best.safetensors format=onnx");
    if (!strcmp(format, "onnx")) return cmd_export_onnx(argc, argv);
    if (!strcmp(format, "safetensors")) {
        static const char *keys[] = {"model", "format", "out", NULL};
        arg_check(argc, argv, keys);
        return export_safetensors(model, arg_get(argc, argv, "out", NULL));
    }
    die("export: format=%s is not supported; supported formats: onnx, safetensors", format);
    return 1;
}

// ------------------------------------------------------------------------------------------
// main
// ------------------------------------------------------------------------------------------

// omp_wait_policy_auto: how the OpenMP threads wait between parallel loops, chosen from what
// else the machine runs at start. A step has thousands of short parallel loops; a thread that
// sleeps at the end of each (OMP_WAIT_POLICY=PASSIVE) must be woken for the next, and on an idle
// 2-core machine that cost 3 epochs of the demo 15.0 s against 10.6 s with a short spin before
// sleeping (GOMP_SPINCOUNT=30000). With one other busy process on those 2 cores the order turns
// over: 16.1 s passive, 44.5 s spinning (a spinning thread holds the core its descheduled peer
// needs). So the runnable tasks of the machine are counted (/proc/loadavg, three looks 10 ms
// apart): when another task was runnable at every look, the threads wait passively, else they
// spin briefly. The choice is printed by train and bench. libgomp reads its settings before
// main, so they are set and the program starts again once; a user's OMP_WAIT_POLICY or
// GOMP_SPINCOUNT is left alone.
static void omp_wait_policy_auto(char **argv) {
    if (getenv("OMP_WAIT_POLICY") || getenv("GOMP_SPINCOUNT")) return;
    int others = 1 << 30;   // the fewest other runnable tasks seen
    for (int look = 0; look < 3; look++) {
        if (look) usleep(10000);
        FILE *f = fopen("/proc/loadavg", "r");
        int running = 0;
        if (f) {
            if (fscanf(f, "%*f %*f %*f %d/", &running) != 1) running = 0;
            fclose(f);
        }
        if (running >= 1 && running - 1 < others) others = running - 1;   // this process is one of them
    }
    int busy = others >= 1 && others < (1 << 30);
    if (busy) setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
    else setenv("GOMP_SPINCOUNT", "30000", 1);
    char note[96];
    if (busy) snprintf(note, sizeof note, "passive sleep (%d other task(s) runnable at start)", others);
    else snprintf(note, sizeof note, "a short spin, then sleep (the machine was idle at start)");
    setenv("YOLO_OMP_WAIT", note, 1);
    execv("/proc/self/exe", argv);   // returns only on failure: then run as we are
}

#ifndef TESTING
typedef struct { const char *name; int (*fn)(int, char **); const char *help; } Command;

int main(int argc, char **argv) {
    omp_wait_policy_auto(argv);
    static const Command cmds[] = {
            {"info", cmd_info, "layer table and totals: model=yolov8n|FILE.pt|FILE.safetensors nc=80 imgsz=640"},
            {"plan", cmd_plan, "memory plan of a training step: model=yolov8n|FILE nc= batch= imgsz="},
            {"check-ref", cmd_check_ref, "compare with a reference fixture: yolo check-ref FILE.safetensors"},
            {"memtable", cmd_memtable, "planned memory of every scale: [imgsz=640 batch=16]"},
            {"train", cmd_train,
             "train: data=FILE model=yolov8n|FILE.safetensors|FILE.pt epochs= imgsz= batch= ... (Ultralytics keys)"},
            {"val", cmd_val, "validate weights: model=FILE.safetensors|FILE.pt data=FILE [imgsz= batch= conf= iou=]"},
            {"predict", cmd_predict,
             "detect objects: model=FILE.safetensors|FILE.pt source=IMAGE|DIR [conf=0.25 imgsz= data=FILE for names]"},
            {"export", cmd_export,
             "model=FILE format=onnx [imgsz=640 batch=1 dynamic=0 half=0 opset=17] | format=safetensors [out=]"},
            {"shapes", cmd_shapes, "write the synthetic shapes dataset: out=DIR [ntrain= nval= imgsz= seed=]"},
            {"augment", cmd_augment, "write a grid of augmented training samples: data=FILE out=FILE.jpg"},
    };
    int n = (int)(sizeof cmds / sizeof cmds[0]);
    if (argc >= 2)
        for (int i = 0; i < n; i++)
            if (strcmp(argv[1], cmds[i].name) == 0) return cmds[i].fn(argc, argv);
    fprintf(stderr, "usage: yolo COMMAND key=value ...\n");
    for (int i = 0; i < n; i++) fprintf(stderr, "  %-8s %s\n", cmds[i].name, cmds[i].help);
    return argc >= 2 ? 1 : 0;
}
#endif
