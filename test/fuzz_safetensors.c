// fuzz_safetensors.c: fuzz the safetensors header parser/validator and reader (the weights section of yolo.c).
//
// Standalone (deterministic mutations of a few valid seed files, 20000 runs by default):
//   gcc -std=c11 -O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer -DTESTING test/fuzz_safetensors.c -o
//   test/bin/fuzz_safetensors -ljpeg -lpng -lyaml -lm -fopenmp
//   ./test/bin/fuzz_safetensors [iterations] [seed]
// libFuzzer (clang):
//   clang -std=c11 -O1 -g -fsanitize=fuzzer,address,undefined -DTESTING -DLIBFUZZER test/fuzz_safetensors.c -o fuzz_st
//   -ljpeg -lpng -lyaml -lm -fopenmp
//
// Every input must give either a success whose tables satisfy the validator's promises (every
// tensor in bounds, sized dtype x numel, readable) or a clean error: -1 with a message that names
// the file. A load that fails must leave the refs untouched. Anything else (or a sanitizer report)
// is a failure.
#ifndef TESTING
#define TESTING
#endif
#include "../yolo.c"
#include "test.h"
#include "fixture.h"

// refs the load step tries to fill; the seeds contain matching tensors so mutations reach both
// the success and the mismatch paths of weights_load_st
static float fz_a[4], fz_b[3], fz_snap[7];
static ParamRef fz_refs[] = {
    {"model.0.conv.weight", 2, {2, 2}, fz_a, PARAM_TRAIN, 0},
    {"model.0.bn.running_var", 1, {3}, fz_b, PARAM_BUFFER, 0},
    {"model.0.bn.num_batches_tracked", 0, {0}, NULL, PARAM_COUNT, 0},
};
#define FZ_NREFS 3

static long fz_ok, fz_clean_err, fz_unclean, fz_load_ok;

// fuzz_one: run one input through open, validation, reading every tensor and loading the refs.
// Returns 1 if every outcome was a success or a clean error, 0 otherwise.
static int fuzz_one(const uint8_t *data, size_t size) {
    static const uint8_t dummy[1];
    FILE *f = fmemopen((void *)(size ? data : dummy), size, "rb");
    if (!f) return 1;   // fmemopen itself refused (not the code under test)
    SafeTensors st;
    char err[1024] = "";
    if (st_open_stream(f, "fuzz.safetensors", &st, err, sizeof err)) {
        int clean = strncmp(err, "'fuzz.safetensors'", 18) == 0 && strlen(err) > 20;
        if (clean) fz_clean_err++;
        else { fz_unclean++; fprintf(stderr, "unclean error: [%s]\n", err); }
        return clean;
    }
    int good = st_entries_readable(&st);
    for (int strict = 0; strict < 2 && good; strict++) {
        memcpy(fz_snap, fz_a, sizeof fz_a);
        memcpy(fz_snap + 4, fz_b, sizeof fz_b);
        int64_t cnt = fz_refs[2].count;
        err[0] = 0;
        if (weights_load_st(&st, fz_refs, FZ_NREFS, NULL, !strict, err, sizeof err) == 0) fz_load_ok++;
        else if (strncmp(err, "'fuzz.safetensors'", 18) != 0 || memcmp(fz_snap, fz_a, sizeof fz_a) ||
                 memcmp(fz_snap + 4, fz_b, sizeof fz_b) || cnt != fz_refs[2].count) {
            fprintf(stderr, "failed load was unclean or touched the refs: [%s]\n", err);
            good = 0;
        }
    }
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

// blob_craft: a seed from a header JSON string and data bytes (header padded to 8)
static Blob blob_craft(const char *json, const void *data, size_t nd) {
    size_t hl = strlen(json), pad = (8 - hl % 8) % 8;
    Blob b = {xcalloc(8 + hl + pad + nd, 1), 8 + hl + pad + nd};
    for (int k = 0; k < 8; k++) b.p[k] = (uint8_t)((uint64_t)(hl + pad) >> (8 * k));
    memcpy(b.p + 8, json, hl);
    memset(b.p + 8 + hl, ' ', pad);
    if (nd) memcpy(b.p + 8 + hl + pad, data, nd);
    return b;
}

static const char *const TOKENS[] = {
        "{",
        "}",
        "[",
        "]",
        ",",
        ":",
        "\"",
        "\\",
        "\"dtype\"",
        "\"shape\"",
        "\"data_offsets\"",
        "\"__metadata__\"",
        "\"F32\"",
        "\"F16\"",
        "\"BF16\"",
        "\"I64\"",
        "\"U8\"",
        "\"F8_E4M3\"",
        "0",
        "1",
        "4",
        "16",
        "-1",
        "1.5",
        "1e3",
        "007",
        "9223372036854775807",
        "9223372036854775808",
        "18446744073709551616",
        "\\u0000",
        "\\ud800",
        "\\udc00",
        "\\ud83d\\ude00",
        "\\u00e9",
        "\xc3\xa9",
        "\xff",
        "\xc0\x80",
        "\xed\xa0\x80",
        "null",
        "true",
        " ",
        "\n",
        "\t",
        "\"model.0.conv.weight\"",
        "[0,16]",
        "[2,2]",
        "[]",
        "{}",
        "\"x\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]}",
};
#define NTOK ((int)(sizeof TOKENS / sizeof TOKENS[0]))

// hlen_of / hlen_set: the 8-byte header length field of a buffer (0 if too short)
static uint64_t hlen_of(const uint8_t *p, size_t n) {
    uint64_t h = 0;
    if (n < 8) return 0;
    for (int k = 7; k >= 0; k--) h = h << 8 | p[k];
    return h;
}
static void hlen_set(uint8_t *p, size_t n, uint64_t h) {
    if (n < 8) return;
    for (int k = 0; k < 8; k++) p[k] = (uint8_t)(h >> (8 * k));
}

// mutate: apply one random edit to the buffer (cap bytes allocated), return the new length.
// Edits land mostly inside the header; insertions/deletions there keep the length field right
// half of the time so the parser gets past the size check.
static size_t mutate(Rng *g, uint8_t *p, size_t n, size_t cap, const Blob *seeds, int nseeds) {
    uint64_t hl = hlen_of(p, n);
    size_t hend = n >= 8 && hl <= n - 8 ? 8 + (size_t)hl : n;
    size_t pos = n
            ? (rng_uniform(g) < 0.85 && hend > 8 ? 8 + (size_t)rng_int(g, (int)(hend - 8)) : (size_t)rng_int(g, (int)n))
            : 0;
    int fix = rng_int(g, 2);
    switch (rng_int(g, 8)) {
    case 0:   // bit flip
        if (n) p[pos] ^= (uint8_t)(1u << rng_int(g, 8));
        return n;
    case 1: { // interesting byte
        static const uint8_t vals[] = {0,   0xff, '"', '{', '}', '[',  ']',  ',',
                                       ':', '\\', '0', '9', ' ', 0x80, 0x7f, '-'};
        if (n) p[pos] = vals[rng_int(g, (int)sizeof vals)];
        return n;
    }
    case 2:   // truncation
        return n ? (size_t)rng_int(g, (int)n + 1) : 0;
    case 3:
    case 4: { // token insertion
        const char *t = TOKENS[rng_int(g, NTOK)];
        size_t k = strlen(t);
        if (n + k > cap) return n;
        memmove(p + pos + k, p + pos, n - pos);
        memcpy(p + pos, t, k);
        if (fix && pos >= 8 && pos <= hend) hlen_set(p, n + k, hl + k);
        return n + k;
    }
    case 5: { // range deletion
        if (!n) return 0;
        size_t k = 1 + (size_t)rng_int(g, 16);
        if (pos + k > n) k = n - pos;
        memmove(p + pos, p + pos + k, n - pos - k);
        if (fix && pos >= 8 && pos + k <= hend) hlen_set(p, n - k, hl - k);
        return n - k;
    }
    case 6: { // splice a range from another seed over this position
        const Blob *s = &seeds[rng_int(g, nseeds)];
        if (!s->n || !n) return n;
        size_t from = (size_t)rng_int(g, (int)s->n), k = 1 + (size_t)rng_int(g, 40);
        if (from + k > s->n) k = s->n - from;
        if (pos + k > n) k = n - pos;
        memcpy(p + pos, s->p + from, k);
        return n;
    }
    default: { // header length field: random, off by a little, or huge
        static const int64_t d[] = {-9, -8, -1, 1, 7, 8, 1000};
        int c = rng_int(g, 3);
        uint64_t h = c == 0 ? hl + (uint64_t)d[rng_int(g, 7)]
                : c == 1    ? rng_u64(g) >> rng_int(g, 64)
                            : (uint64_t)rng_int(g, (int)n + 9);
        hlen_set(p, n, h);
        return n;
    }
    }
}

int main(int argc, char **argv) {
    long iters = argc > 1 ? atol(argv[1]) : 20000;
    uint64_t seed = argc > 2 ? (uint64_t)atoll(argv[2]) : 1;
    char dir[] = "/tmp/fuzz_st_XXXXXX", path[64], err[1024];
    if (!mkdtemp(dir)) die("mkdtemp failed: %s", strerror(errno));
    snprintf(path, sizeof path, "%s/seed.safetensors", dir);

    Blob seeds[6];
    int ns = 0;
    for (int i = 0; i < 4; i++) fz_a[i] = 0.5f * (float)i - 1;
    for (int i = 0; i < 3; i++) fz_b[i] = 1.0f + (float)i;
    fz_refs[2].count = 42;
    const char *meta[] = {"format", "pt", "nc", "3", NULL};
    if (weights_save(path, fz_refs, FZ_NREFS, meta, ST_F32, err, sizeof err)) die("%s", err);
    seeds[ns++] = blob_file(path);
    if (weights_save(path, fz_refs, FZ_NREFS, NULL, ST_F16, err, sizeof err)) die("%s", err);
    seeds[ns++] = blob_file(path);
    uint8_t d[64];
    for (int i = 0; i < 64; i++) d[i] = (uint8_t)(i * 37 + 11);
    d[1] = 0x3f; d[3] = 0x40;   // BF16 1.0 and 2.0 at the start
    seeds[ns++] =
            blob_craft("{\"__metadata__\":{\"k\\u00e9y\":\"v\\\"al\\\\ue\\ud83d\\ude00\"},"
                       "\"model.0.conv.weight\":{\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[0,8]},"
                       "\"model.0.bn.running_var\":{\"shape\":[3],\"dtype\":\"F16\",\"data_offsets\":[8,14]},"
                       "\"model.0.bn.num_batches_tracked\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[16,24]},"
                       "\"u\":{\"dtype\":\"U8\",\"shape\":[3,1,1,1,1,1,1,1],\"data_offsets\":[24,27]},"
                       "\"z\":{\"dtype\":\"F64\",\"shape\":[0,5],\"data_offsets\":[27,27]},"
                       "\"i\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[28,36]},"
                       "\"b\":{\"dtype\":\"BOOL\",\"shape\":[4],\"data_offsets\":[40,44]}}",
                       d, 64);
    seeds[ns++] = blob_craft("{}", NULL, 0);
    seeds[ns++] = blob_craft(
            " \t\n{ \"a\" : { \"dtype\" : \"F32\" , \"shape\" : [ 1 ] , \"data_offsets\" : [ 0 , 4 ] } } ", d, 4);
    snprintf(path, sizeof path, "rm -rf '%s'", dir);
    if (system(path) != 0) printf("note: could not remove %s\n", dir);

    for (int i = 0; i < ns; i++) {
        long before = fz_ok;
        int clean = fuzz_one(seeds[i].p, seeds[i].n);
        check(clean && fz_ok == before + 1, "seed %d (%zu bytes) parses and loads cleanly", i, seeds[i].n);
    }
    Rng g;
    rng_seed(&g, seed);
    size_t cap = 8192;
    uint8_t *buf = xmalloc(cap);
    double t0 = now_sec();
    long bad = 0;
    for (long it = 0; it < iters; it++) {
        const Blob *s = &seeds[rng_int(&g, ns)];
        size_t n = s->n < cap ? s->n : cap;
        memcpy(buf, s->p, n);
        int m = 1 + rng_int(&g, 4);
        for (int k = 0; k < m; k++) n = mutate(&g, buf, n, cap, seeds, ns);
        uint8_t *exact = xmalloc(n ? n : 1);   // exact-size copy so ASan sees any overread
        memcpy(exact, buf, n);
        if (!fuzz_one(exact, n)) {
            if (bad++ < 5) fprintf(stderr, "  (iteration %ld, %zu bytes)\n", it, n);
        }
        free(exact);
    }
    check(bad == 0, "%ld mutated inputs: %ld valid (%ld loads succeeded), %ld clean errors, %ld unclean (%.1f s)",
          iters, fz_ok - ns, fz_load_ok, fz_clean_err, fz_unclean, now_sec() - t0);
    check(fz_ok - ns > iters / 50 && fz_clean_err > iters / 2,
          "mutations reach both outcomes: %ld valid and %ld rejected (want > 2%% and > 50%%)", fz_ok - ns,
          fz_clean_err);
    free(buf);
    for (int i = 0; i < ns; i++) free(seeds[i].p);
    return test_summary();
}
#endif
