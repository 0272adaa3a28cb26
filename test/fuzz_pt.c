// fuzz_pt.c: fuzz the .pt reader (zip container, unpickler, module walk, tensor views; the pt
// section of yolo.c).
//
// Standalone (deterministic mutations of the small test/fixtures/pt_*.pt files, 20000 runs by default):
//   gcc -std=c11 -O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer -DTESTING test/fuzz_pt.c -o
//   test/bin/fuzz_pt -ljpeg -lpng -lyaml -lm -fopenmp
//   ./test/bin/fuzz_pt [iterations] [seed]
// libFuzzer (clang):
//   clang -std=c11 -O1 -g -fsanitize=fuzzer,address,undefined -DTESTING -DLIBFUZZER test/fuzz_pt.c -o fuzz_pt -ljpeg
//   -lpng -lyaml -lm -fopenmp
//
// Two kinds of edits: anywhere in the file (mostly hitting the zip records), and inside the pickle
// record data.pkl without changing its length (so the archive stays valid and the unpickler, the
// module walk and the tensor gather see the damage). Every input must give either a success whose
// tensors all lie inside the data and read back, or a clean error: -1 with a message that starts
// with the file name. Anything else (or a sanitizer report) is a failure.
#ifndef TESTING
#define TESTING
#endif
#include "../yolo.c"
#include "test.h"
#include "fixture.h"

static long fz_ok, fz_clean_err, fz_unclean;

// fuzz_one: one input through pt_open_stream and a read of every tensor; 1 if the outcome was clean
static int fuzz_one(const uint8_t *data, size_t size) {
    static const uint8_t dummy[1];
    FILE *f = fmemopen((void *)(size ? data : dummy), size ? size : 1, "rb");
    if (!f) return 1;
    SafeTensors st;
    char err[1024] = "";
    if (pt_open_stream(f, "fuzz.pt", &st, err, sizeof err)) {
        int clean = strncmp(err, "'fuzz.pt'", 9) == 0 && strlen(err) > 12 && !strchr(err, '\n');
        if (clean) fz_clean_err++;
        else { fz_unclean++; fprintf(stderr, "unclean error: [%s]\n", err); }
        return clean;
    }
    int good = st_entries_readable(&st);
    st_close(&st);
    if (good) fz_ok++;
    else fz_unclean++;
    return good;
}

#ifdef LIBFUZZER
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!fuzz_one(data, size)) abort();
    return 0;
}
#else

typedef struct { uint8_t *p; size_t n; uint64_t pkl_off, pkl_n; } Seed;

static Seed seed_file(const char *path) {
    FILE *f = xfopen(path, "rb");
    fseek(f, 0, SEEK_END);
    Seed s = {NULL, (size_t)ftell(f), 0, 0};
    fseek(f, 0, SEEK_SET);
    s.p = xmalloc(s.n);
    if (fread(s.p, 1, s.n, f) != s.n) die("short read of %s", path);
    rewind(f);
    PtZip z = {.path = path, .f = f, .fsize = s.n};
    char err[512];
    if (pt_zip_open(&z, err, sizeof err)) die("%s", err);
    char key[300];
    snprintf(key, sizeof key, "%sdata.pkl", z.prefix);
    const PtZipEntry *e = pt_zip_find(&z, key);
    s.pkl_off = e->off;
    s.pkl_n = e->size;
    pt_zip_close(&z);
    fclose(f);
    return s;
}

// pickle opcodes and fragments worth splicing in
static const char *const TOKENS[] = {
        "(",
        ")",
        "}",
        "]",
        "t",
        "R",
        "b",
        "s",
        "u",
        "e",
        "a",
        "0",
        "1",
        "2",
        "N",
        "Q",
        "\x81",
        "\x85",
        "\x86",
        "\x87",
        "\x88",
        "\x89",
        "q\xff",
        "h\x00",
        "h\xff",
        "r\xff\xff\xff\xff",
        "j\x00\x00\x00\x00",
        "\x94",
        "\x93",
        "\x8a\x08",
        "\x8a\xff",
        "K\xff",
        "J\xff\xff\xff\xff",
        "ccollections\nOrderedDict\n",
        "ctorch._utils\n_rebuild_tensor_v2\n",
        "ctorch\nHalfStorage\n",
        "cposix\nsystem\n",
        "X\x07\x00\x00\x00storage",
        "X\xff\xff\xff\x7f",
        ".",
        "i",
        "\x95",
        "\x80\x05",
};
#define NTOK ((int)(sizeof TOKENS / sizeof TOKENS[0]))

// mutate: one edit; in_pickle keeps the length and stays inside data.pkl, else anywhere in the file
static size_t mutate(Rng *g, uint8_t *p, size_t n, size_t cap, const Seed *s, int in_pickle) {
    size_t lo = in_pickle ? (size_t)s->pkl_off : 0, len = in_pickle ? (size_t)s->pkl_n : n;
    if (!len) return n;
    size_t pos = lo + (size_t)rng_int(g, (int)len);
    switch (rng_int(g, in_pickle ? 4 : 6)) {
    case 0:
        p[pos] ^= (uint8_t)(1u << rng_int(g, 8));
        return n;
    case 1: {
        static const uint8_t vals[] = {0, 0xff, 0x7f, 0x80, 1, 2, 8, 64, '(', 't', 'R', 'b', 'q', 'h', 'N', '.'};
        p[pos] = vals[rng_int(g, (int)sizeof vals)];
        return n;
    }
    case 2: {   // overwrite with a token
        const char *t = TOKENS[rng_int(g, NTOK)];
        size_t k = strlen(t) + (t[0] == 0);
        if (pos + k > lo + len) k = lo + len - pos;
        memcpy(p + pos, t, k);
        return n;
    }
    case 3: {   // copy a range of the pickle over another place in it
        size_t from = lo + (size_t)rng_int(g, (int)len), k = 1 + (size_t)rng_int(g, 64);
        if (from + k > lo + len) k = lo + len - from;
        if (pos + k > lo + len) k = lo + len - pos;
        memmove(p + pos, p + from, k);
        return n;
    }
    case 4:     // truncation
        return (size_t)rng_int(g, (int)n + 1);
    default: {  // a 32-bit field anywhere (zip sizes and offsets) set to a nearby or extreme value
        static const int64_t d[] = {-64, -1, 1, 30, 1 << 20};
        if (pos + 4 > n || cap < n) return n;
        uint32_t v = pt_rd32(p + pos);
        v = rng_int(g, 2) ? v + (uint32_t)d[rng_int(g, 5)]
                          : (rng_int(g, 2) ? 0xffffffffu : (uint32_t)rng_int(g, (int)n));
        memcpy(p + pos, &v, 4);
        return n;
    }
    }
}

int main(int argc, char **argv) {
    long iters = argc > 1 ? atol(argv[1]) : 20000;
    uint64_t seed = argc > 2 ? (uint64_t)atoll(argv[2]) : 1;
    static const char *const files[] = {"test/fixtures/pt_tiny_ckpt.pt", "test/fixtures/pt_tiny_sd.pt",
                                        "test/fixtures/pt_tiny_sd_bo.pt", "test/fixtures/pt_v11.pt"};
    Seed seeds[4];
    int ns = 4;
    for (int i = 0; i < ns; i++) {
        seeds[i] = seed_file(files[i]);
        long ok0 = fz_ok, e0 = fz_clean_err;
        int clean = fuzz_one(seeds[i].p, seeds[i].n);
        check(clean && (i < 3 ? fz_ok == ok0 + 1 : fz_clean_err == e0 + 1), "seed %s (%zu bytes) %s", files[i],
              seeds[i].n, i < 3 ? "loads" : "is refused cleanly");
    }
    Rng g;
    rng_seed(&g, seed);
    size_t cap = 0;
    for (int i = 0; i < ns; i++) cap = seeds[i].n > cap ? seeds[i].n : cap;
    uint8_t *buf = xmalloc(cap);
    double t0 = now_sec();
    long bad = 0;
    for (long it = 0; it < iters; it++) {
        const Seed *s = &seeds[rng_int(&g, ns)];
        memcpy(buf, s->p, s->n);
        size_t n = s->n;
        int in_pickle = rng_uniform(&g) < 0.75, edits = 1 + rng_int(&g, 4);
        for (int k = 0; k < edits; k++) n = mutate(&g, buf, n, cap, s, in_pickle && n == s->n);
        if (!fuzz_one(buf, n)) {
            bad++;
            if (bad <= 3) fprintf(stderr, "iteration %ld: unclean outcome (seed %d)\n", it, (int)(s - seeds));
        }
    }
    check(bad == 0, "%ld mutated inputs: %ld loaded, %ld clean errors, %ld unclean (want 0), %.1f s", iters, fz_ok - 3,
          fz_clean_err - 1, bad, now_sec() - t0);
    free(buf);
    for (int i = 0; i < ns; i++) free(seeds[i].p);
    return test_summary();
}
#endif
