// test_weights.c: safetensors reading/writing (the weights section of yolo.c): round trips in F32/F16/BF16,
// exhaustive half conversion, hand-made BF16 file, bad files with clear errors and untouched
// refs, atomic save under an injected write failure, weights_infer.
#ifndef TESTING
#define TESTING
#endif
#include "../yolo.c"
#include "test.h"
#include <sys/stat.h>

static char g_dir[64];

// a small YOLOv8-like state_dict: conv + bn blocks and the detect head's final convs (nc = 3)
typedef struct { const char *name; int ndim; int64_t shape[4]; int kind; } Spec;
static const Spec SPEC[] = {
    {"model.0.conv.weight", 4, {16, 3, 3, 3}, 0},
    {"model.0.bn.weight", 1, {16}, 0}, {"model.0.bn.bias", 1, {16}, 0},
    {"model.0.bn.running_mean", 1, {16}, 1}, {"model.0.bn.running_var", 1, {16}, 1},
    {"model.0.bn.num_batches_tracked", 0, {0}, 2},
    {"model.1.conv.weight", 4, {32, 16, 3, 3}, 0},
    {"model.1.bn.weight", 1, {32}, 0}, {"model.1.bn.bias", 1, {32}, 0},
    {"model.1.bn.running_mean", 1, {32}, 1}, {"model.1.bn.running_var", 1, {32}, 1},
    {"model.1.bn.num_batches_tracked", 0, {0}, 2},
    {"model.2.cv1.conv.weight", 4, {32, 32, 1, 1}, 0},
    {"model.2.cv1.bn.weight", 1, {32}, 0}, {"model.2.cv1.bn.bias", 1, {32}, 0},
    {"model.2.cv1.bn.running_mean", 1, {32}, 1}, {"model.2.cv1.bn.running_var", 1, {32}, 1},
    {"model.2.cv1.bn.num_batches_tracked", 0, {0}, 2},
    {"model.2.m.0.cv1.conv.weight", 4, {16, 16, 3, 3}, 0},
    {"model.2.m.0.cv1.bn.weight", 1, {16}, 0}, {"model.2.m.0.cv1.bn.bias", 1, {16}, 0},
    {"model.22.cv2.0.2.weight", 4, {64, 64, 1, 1}, 0}, {"model.22.cv2.0.2.bias", 1, {64}, 0},
    {"model.22.cv3.0.0.conv.weight", 4, {64, 64, 3, 3}, 0},
    {"model.22.cv3.0.2.weight", 4, {3, 64, 1, 1}, 0}, {"model.22.cv3.0.2.bias", 1, {3}, 0},
    {"model.22.dfl.conv.weight", 4, {1, 16, 1, 1}, 0},
};
#define NSPEC ((int)(sizeof SPEC / sizeof SPEC[0]))

// refs_make: refs for SPEC with random data (seeded) or zeros (seed 0).
static ParamRef *refs_make(uint64_t seed) {
    ParamRef *r = xcalloc(NSPEC, sizeof(ParamRef));
    Rng g; rng_seed(&g, seed);
    for (int i = 0; i < NSPEC; i++) {
        r[i].name = SPEC[i].name; r[i].ndim = SPEC[i].ndim; r[i].kind = SPEC[i].kind;
        memcpy(r[i].shape, SPEC[i].shape, sizeof r[i].shape);
        if (r[i].kind == PARAM_COUNT) { r[i].count = seed ? (int64_t)(1000 + i) : 0; continue; }
        int64_t n = param_numel(&r[i]);
        r[i].data = xcalloc((size_t)n, sizeof(float));
        for (int64_t k = 0; seed && k < n; k++) r[i].data[k] = (float)(rng_normal(&g) * (i % 3 ? 0.1 : 3.0));
    }
    return r;
}
static void refs_free(ParamRef *r) { for (int i = 0; i < NSPEC; i++) free(r[i].data); free(r); }

// refs_same: bitwise equal data and counts
static int refs_same(const ParamRef *a, const ParamRef *b) {
    for (int i = 0; i < NSPEC; i++) {
        if (a[i].kind == PARAM_COUNT) { if (a[i].count != b[i].count) return 0; continue; }
        if (memcmp(a[i].data, b[i].data, sizeof(float) * (size_t)param_numel(&a[i]))) return 0;
    }
    return 1;
}

static char *path_in(const char *name) {
    static char buf[8][256];
    static int k;
    char *p = buf[k++ % 8];
    snprintf(p, 256, "%s/%s", g_dir, name);
    return p;
}

static unsigned char *file_read(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) { *n = 0; return NULL; }
    fseek(f, 0, SEEK_END); long sz = ftell(f); fseek(f, 0, SEEK_SET);
    unsigned char *b = xmalloc((size_t)sz + 1);
    *n = fread(b, 1, (size_t)sz, f);
    fclose(f);
    return b;
}
static void file_write(const char *path, const void *p, size_t n) {
    FILE *f = xfopen(path, "wb");
    if (n && fwrite(p, 1, n, f) != n) die("write %s", path);
    fclose(f);
}
// file_craft: a safetensors file from a header JSON string (padded) and raw data bytes
static void file_craft(const char *path, const char *json, const void *data, size_t nd) {
    size_t hl = strlen(json), pad = (8 - hl % 8) % 8;
    unsigned char *b = xcalloc(8 + hl + pad + nd + 1, 1);
    uint64_t h = hl + pad;
    for (int k = 0; k < 8; k++) b[k] = (unsigned char)(h >> (8 * k));
    memcpy(b + 8, json, hl);
    memset(b + 8 + hl, ' ', pad);
    if (nd) memcpy(b + 8 + hl + pad, data, nd);
    file_write(path, b, 8 + hl + pad + nd);
    free(b);
}

// expect_load_fail: loading path into fresh random refs fails, the error contains want, the
// refs are unchanged.
static void expect_load_fail(const char *what, const char *path, const char *want) {
    ParamRef *r = refs_make(7), *snap = refs_make(7);
    char err[2048] = "";
    int rc = weights_load(path, r, NSPEC, err, sizeof err);
    int named = strstr(err, want) != NULL && strstr(err, path) != NULL;
    check(rc != 0 && named && refs_same(r, snap),
          "bad file (%s): load fails, error names '%s' and the file, refs untouched [%s]", what, want, err);
    refs_free(r); refs_free(snap);
}

// ref_half: independent binary16 decode by formula
static double ref_half(uint16_t h) {
    int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(1024 + m, e - 25);
    return s ? -v : v;
}

static void test_half(void) {
    int bad = 0, badrt = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float got = half_to_float((uint16_t)h);
        double want = ref_half((uint16_t)h);
        int ok = isnan(want)
                ? isnan(got) && (signbit(got) != 0) == (h >> 15) && ((f32_bits(got) >> 13) & 0x3ff) == (h & 0x3ff)
                : (double)got == want && (signbit(got) != 0) == (h >> 15);
        if (!ok) { if (bad < 3) printf("  half 0x%04x: got %g want %g\n", h, got, want); bad++; }
        if (float_to_half(got) != (uint16_t)(isnan(want) ? (h | 0x200) : h)) badrt++;
    }
    check(bad == 0,
          "half_to_float: all 65536 bit patterns equal ldexp reference (incl. subnormals, inf, NaN payload): %d wrong",
          bad);
    check(badrt == 0, "float_to_half(half_to_float(h)) == h for all 65536 h (NaN quieted): %d wrong", badrt);
    // ties and near-ties between every pair of adjacent finite non-negative halves (incl. subnormals)
    int badtie = 0, badnear = 0;
    for (uint32_t h = 0; h < 0x7bff; h++) {
        double a = ref_half((uint16_t)h), b = ref_half((uint16_t)(h + 1));
        float mid = (float)((a + b) / 2);     // exact: 12 significant bits
        uint16_t even = (h & 1) ? (uint16_t)(h + 1) : (uint16_t)h;
        if (float_to_half(mid) != even || float_to_half(-mid) != (even | 0x8000)) badtie++;
        if (float_to_half(nextafterf(mid, 0)) != h || float_to_half(nextafterf(mid, INFINITY)) != h + 1) badnear++;
    }
    check(badtie == 0, "float_to_half ties round to even at all 31743 midpoints (both signs): %d wrong", badtie);
    check(badnear == 0, "float_to_half one ulp below/above each midpoint rounds down/up: %d wrong", badnear);
    check(float_to_half(65519.99f) == 0x7bff && float_to_half(65520.0f) == 0x7c00 && float_to_half(1e10f) == 0x7c00 &&
                  float_to_half(-INFINITY) == 0xfc00 && (float_to_half(NAN) & 0x7e00) == 0x7e00 &&
                  float_to_half(ldexpf(1, -25)) == 0 && float_to_half(nextafterf(ldexpf(1, -25), 1)) == 1 &&
                  float_to_half(-0.0f) == 0x8000 && float_to_half(ldexpf(3, -25)) == 2 &&
                  float_to_half(ldexpf(5, -25)) == 2,
          "float_to_half edge cases: 65519.99->0x7bff, 65520->inf, 2^-25->0, just above->1, ties 3*2^-25->2 and "
          "5*2^-25->2, -0, NaN");
    // gcc's own _Float16 as a second reference on random floats
#ifdef __FLT16_MAX__
    Rng g; rng_seed(&g, 5);
    int badr = 0;
    for (int i = 0; i < 2000000; i++) {
        uint32_t u = (uint32_t)rng_u64(&g);
        if (i & 1) u = (u & 0x87ffffffu) | 0x30000000u;   // half the draws in the half range
        float x = bits_f32(u);
        if (isnan(x)) continue;
        _Float16 r = (_Float16)x;
        uint16_t rb; memcpy(&rb, &r, 2);
        if (float_to_half(x) != rb) badr++;
    }
    check(badr == 0, "float_to_half equals (_Float16) conversion on 2e6 random floats: %d wrong", badr);
#endif
    // bfloat16
    check(float_to_bf16(bits_f32(0x3f808000u)) == 0x3f80 && float_to_bf16(bits_f32(0x3f818000u)) == 0x3f82 &&
                  float_to_bf16(bits_f32(0x3f808001u)) == 0x3f81 && float_to_bf16(bits_f32(0x7f7fffffu)) == 0x7f80 &&
                  (float_to_bf16(NAN) & 0x7fc0) == 0x7fc0 && bf16_to_float(0x0001) == ldexpf(1, -133),
          "bf16: ties to even (0x3f808000->0x3f80, 0x3f818000->0x3f82), above tie up, max->inf, NaN, subnormal "
          "0x0001=2^-133");
}

static void test_roundtrip(void) {
    ParamRef *a = refs_make(1), *b = refs_make(0);
    char err[2048] = "";
    const char *meta[] = {"format", "pt", "nc", "3", "note", "quote\" backslash\\ tab\t \xc3\xa9", NULL};
    const char *p1 = path_in("a.safetensors"), *p2 = path_in("b.safetensors");
    int rc = weights_save(p1, a, NSPEC, meta, ST_F32, err, sizeof err);
    check(rc == 0, "save F32 [%s]", err);
    rc = weights_load(p1, b, NSPEC, err, sizeof err);
    check(rc == 0 && refs_same(a, b), "load F32: every tensor and counter bitwise identical [%s]", err);
    rc = weights_save(p2, b, NSPEC, meta, ST_F32, err, sizeof err);
    size_t n1, n2;
    unsigned char *f1 = file_read(p1, &n1), *f2 = file_read(p2, &n2);
    check(rc == 0 && n1 == n2 && memcmp(f1, f2, n1) == 0, "save, load, save: identical file bytes (%zu bytes)", n1);
    uint64_t hl = 0;
    for (int k = 7; k >= 0; k--) hl = hl << 8 | f1[k];
    check(hl % 8 == 0 && f1[8] == '{', "header length %llu is a multiple of 8 and starts with '{'",
          (unsigned long long)hl);
    free(f1); free(f2);
    SafeTensors st;
    rc = st_open(p1, &st, err, sizeof err);
    const char *note = rc ? NULL : st_meta(&st, "note");
    check(rc == 0 && st.nmeta == 3 && note && strcmp(note, meta[5]) == 0 && strcmp(st_meta(&st, "nc"), "3") == 0,
          "metadata round trip incl. escaped quote, backslash, tab and UTF-8 [%s]", note ? note : err);
    const StEntry *e = rc ? NULL : st_find(&st, "model.1.bn.num_batches_tracked");
    check(e && e->dtype == ST_I64 && e->ndim == 0 && e->numel == 1,
          "num_batches_tracked stored as I64 scalar with shape []");
    check(!rc && st_find(&st, "model.99.x") == NULL, "st_find of a missing name gives NULL");
    st_close(&st);

    // F16: values equal the fp16-rounded originals
    const char *p3 = path_in("h.safetensors");
    rc = weights_save(p3, a, NSPEC, NULL, ST_F16, err, sizeof err);
    rc = rc ? rc : weights_load(p3, b, NSPEC, err, sizeof err);
    int64_t bad = 0, tot = 0;
    for (int i = 0; i < NSPEC && !rc; i++) {
        if (a[i].kind == PARAM_COUNT) { bad += a[i].count != b[i].count; continue; }
        for (int64_t k = 0; k < param_numel(&a[i]); k++, tot++)
            bad += f32_bits(b[i].data[k]) != f32_bits(half_to_float(float_to_half(a[i].data[k])));
    }
    check(rc == 0 && bad == 0, "F16 save -> load: %lld values equal fp16-rounded originals, %lld differ [%s]",
          (long long)tot, (long long)bad, err);
    // BF16 likewise
    rc = weights_save(p3, a, NSPEC, NULL, ST_BF16, err, sizeof err);
    rc = rc ? rc : weights_load(p3, b, NSPEC, err, sizeof err);
    bad = 0;
    for (int i = 0; i < NSPEC && !rc; i++)
        for (int64_t k = 0; a[i].kind != PARAM_COUNT && k < param_numel(&a[i]); k++)
            bad += f32_bits(b[i].data[k]) != f32_bits(bf16_to_float(float_to_bf16(a[i].data[k])));
    check(rc == 0 && bad == 0, "BF16 save -> load equals bf16-rounded originals (%lld differ) [%s]", (long long)bad,
          err);
    // F16 overflow is refused, not silently turned into inf
    float keep = a[0].data[5];
    a[0].data[5] = 70000.0f;
    rc = weights_save(p3, a, NSPEC, NULL, ST_F16, err, sizeof err);
    check(rc != 0 && strstr(err, "model.0.conv.weight") && strstr(err, "overflows F16"),
          "F16 save of 70000 fails naming the tensor [%s]", err);
    a[0].data[5] = keep;
    refs_free(a); refs_free(b);
}

// a hand-made file with BF16 data checked against hand-computed values
static void test_bf16_file(void) {
    const uint16_t v[] = {0x3f80, 0x4049, 0xbf00, 0x0001, 0x7f7f, 0x8000, 0xc2f7, 0x3e80, 0x7f80, 0xff80, 0x7fc1};
    const double want[] = {1.0, 3.140625, -0.5, ldexp(1, -133), ldexp(255, 120), -0.0, -123.5, 0.25};
    const char *p = path_in("bf16.safetensors");
    file_craft(
            p,
            "{\"__metadata__\":{\"format\":\"pt\"},\"w\":{\"dtype\":\"BF16\",\"shape\":[2,4],\"data_offsets\":[0,16]},"
            "\"special\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[16,22]}}",
            v, sizeof v);
    float w[8] = {0}, sp[3];
    ParamRef r = {"w", 2, {2, 4}, w, PARAM_TRAIN, 0};
    SafeTensors st;
    char err[1024] = "";
    int rc = st_open(p, &st, err, sizeof err);
    const StEntry *e = rc ? NULL : st_find(&st, "special");
    rc = rc ? rc : !e ? -1 : st_read_f32(&st, e, sp, err, sizeof err);
    check(rc == 0 && isinf(sp[0]) && sp[0] > 0 && isinf(sp[1]) && sp[1] < 0 && isnan(sp[2]),
          "BF16 0x7f80, 0xff80, 0x7fc1 read as +inf, -inf, NaN [%s]", err);
    rc = rc ? rc : weights_load_st(&st, &r, 1, NULL, 1, err, sizeof err);
    st_close(&st);
    int bad = 0;
    for (int k = 0; k < 8; k++) bad += !((double)w[k] == want[k] && !!signbit(w[k]) == !!signbit(want[k]));
    check(rc == 0 && bad == 0,
          "BF16 file values equal hand-computed 1, 3.140625, -0.5, 2^-133, 3.3895314e38, -0, -123.5, 0.25 (%d wrong) "
          "[%s]",
          bad, err);
    // with allow_extra = 0 the extra tensor is reported and w is left alone
    float w2[8] = {0};
    r.data = w2;
    rc = weights_load(p, &r, 1, err, sizeof err);
    check(rc != 0 && strstr(err, "unexpected tensor 'special' (3)") && w2[0] == 0,
          "strict load of the BF16 file reports 'special' [%s]", err);
}

static void test_bad_files(void) {
    ParamRef *a = refs_make(1);
    char err[2048];
    const char *good = path_in("good.safetensors"), *bad = path_in("bad.safetensors");
    weights_save(good, a, NSPEC, NULL, ST_F32, err, sizeof err);
    size_t n;
    unsigned char *g = file_read(good, &n);
    uint64_t hl = 0;
    for (int k = 7; k >= 0; k--) hl = hl << 8 | g[k];
    size_t cuts[] = {1,     7,    8, 9, 8 + (size_t)hl / 2, 8 + (size_t)hl - 1, 8 + (size_t)hl, 8 + (size_t)hl + 100,
                     n / 2, n - 1};
    const char *wants[] = {"too short", "too short", "exceeds", "exceeds", "exceeds", "exceeds", "out of bounds",
                           "out of bounds", "out of bounds", "out of bounds"};
    for (int c = 0; c < (int)(sizeof cuts / sizeof cuts[0]); c++) {
        file_write(bad, g, cuts[c]);
        char what[64]; snprintf(what, sizeof what, "truncated to %zu of %zu bytes", cuts[c], n);
        expect_load_fail(what, bad, wants[c]);
    }
    file_write(bad, g, 0);
    expect_load_fail("zero-byte file", bad, "empty file");
    unsigned char big[16] = {0xff, 0xff, 0, 0, 0, 0, 0, 0, '{', '}'};
    file_write(bad, big, sizeof big);
    expect_load_fail("header length larger than the file", bad, "header length 65535 exceeds");
    free(g);

    float d[64] = {0};
    file_craft(bad, "this is not json", d, 0);
    expect_load_fail("header not JSON", bad, "header JSON: expected '{'");
    file_craft(bad, "{\"model.0.bn.weight\":{\"dtype\":\"F32\",\"shape\":[16],\"data_offsets\":[0,64]},}", d, 64);
    expect_load_fail("trailing comma", bad, "expected a string as a tensor name");
    file_craft(bad, "{\"model.0.bn.weight\":{\"dtype\":\"F33\",\"shape\":[16],\"data_offsets\":[0,64]}}", d, 64);
    expect_load_fail("wrong dtype string", bad, "unsupported dtype 'F33'");
    file_craft(bad, "{\"model.0.bn.weight\":{\"dtype\":\"F32\",\"shape\":[16],\"data_offsets\":[0,64]}}", d, 60);
    expect_load_fail("offsets out of bounds", bad, "tensor 'model.0.bn.weight': data_offsets [0, 64] out of bounds");
    file_craft(bad, "{\"model.0.bn.weight\":{\"dtype\":\"F32\",\"shape\":[16],\"data_offsets\":[0,64]},"
                    "\"model.0.bn.bias\":{\"dtype\":\"F32\",\"shape\":[16],\"data_offsets\":[60,124]}}", d, 124);
    expect_load_fail("overlapping offsets", bad, "overlap");
    file_craft(bad, "{\"model.0.bn.weight\":{\"dtype\":\"F32\",\"shape\":[15],\"data_offsets\":[0,64]}}", d, 64);
    expect_load_fail("shape/size mismatch", bad, "tensor 'model.0.bn.weight': size mismatch");
    file_craft(bad, "{\"model.0.bn.weight\":{\"dtype\":\"F32\",\"shape\":[16],\"data_offsets\":[0,64]},"
                    "\"model.0.bn.weight\":{\"dtype\":\"F32\",\"shape\":[16],\"data_offsets\":[64,128]}}", d, 128);
    expect_load_fail("duplicate names", bad, "duplicate tensor name 'model.0.bn.weight'");
    file_craft(bad, "{\"model.0.bn.weight\":{\"dtype\":\"F32\",\"shape\":[16],\"data_offsets\":[0,64],\"extra\":1}}", d,
               64);
    expect_load_fail("unknown field", bad, "unknown field 'extra'");
    file_craft(bad, "{\"model.0.bn.weight\":{\"dtype\":\"F32\",\"shape\":[-16],\"data_offsets\":[0,64]}}", d, 64);
    expect_load_fail("negative dim", bad, "non-negative integer");
    file_craft(bad, "{\"model.0.bn.weight\":{\"dtype\":\"F32\",\"shape\":[16],\"data_offsets\":[0,64]}} x", d, 64);
    expect_load_fail("trailing garbage", bad, "unexpected bytes after");

    // name/shape mismatches: files saved from modified ref lists
    ParamRef *m = refs_make(1);
    m[6].shape[0] = 8;    // model.1.conv.weight (8, 16, 3, 3)
    weights_save(bad, m, NSPEC, NULL, ST_F32, err, sizeof err);
    expect_load_fail("wrong shape", bad,
                     "'model.1.conv.weight' shape (8, 16, 3, 3) in file, model expects (32, 16, 3, 3)");
    m[6].shape[0] = 32;
    weights_save(bad, m, NSPEC - 1, NULL, ST_F32, err, sizeof err);
    expect_load_fail("missing tensor", bad, "missing tensor 'model.22.dfl.conv.weight'");
    ParamRef *x = xcalloc(NSPEC + 1, sizeof(ParamRef));
    memcpy(x, m, sizeof(ParamRef) * NSPEC);
    float extra[4] = {1, 2, 3, 4};
    x[NSPEC] = (ParamRef){"model.23.foo", 1, {4}, extra, PARAM_TRAIN, 0};
    weights_save(bad, x, NSPEC + 1, NULL, ST_F32, err, sizeof err);
    expect_load_fail("unexpected tensor", bad, "unexpected tensor 'model.23.foo' (4)");
    // many mismatches: first few listed and a count
    for (int i = 0; i < NSPEC; i++) if (m[i].kind != PARAM_COUNT) m[i].shape[0] += 1;
    for (int i = 0; i < NSPEC; i++)
        if (m[i].kind != PARAM_COUNT) {
            free(m[i].data);
            m[i].data = xcalloc((size_t)param_numel(&m[i]), 4);
        }
    weights_save(bad, m, NSPEC, NULL, ST_F32, err, sizeof err);
    expect_load_fail("all shapes wrong", bad, "24 mismatches");
    expect_load_fail("all shapes wrong (list cut)", bad, "; ...");
    // num_batches_tracked may be absent; with a float dtype it is an error
    weights_save(bad, a, NSPEC, NULL, ST_F32, err, sizeof err);
    ParamRef *nb = refs_make(0);
    SafeTensors st;
    int rc = st_open(bad, &st, err, sizeof err);
    ParamRef *nb2 = xcalloc(NSPEC, sizeof(ParamRef));
    int k2 = 0;
    for (int i = 0; i < NSPEC; i++) if (nb[i].kind != PARAM_COUNT) nb2[k2++] = nb[i];
    rc = rc ? rc : weights_load_st(&st, nb2, k2, NULL, 0, err, sizeof err);
    st_close(&st);
    check(rc == 0, "a file's I64 num_batches_tracked tensors are accepted (skipped) by refs without counters [%s]",
          err);
    free(nb2); refs_free(nb);
    // NaN / Inf values
    float keep = a[12].data[7];
    a[12].data[7] = NAN;
    weights_save(bad, a, NSPEC, NULL, ST_F32, err, sizeof err);
    expect_load_fail("NaN value", bad, "tensor 'model.2.cv1.conv.weight' has a non-finite value (NaN) at index 7");
    a[12].data[7] = -INFINITY;
    weights_save(bad, a, NSPEC, NULL, ST_F32, err, sizeof err);
    expect_load_fail("Inf value", bad, "(Inf) at index 7");
    a[12].data[7] = keep;
    expect_load_fail("nonexistent file", path_in("nope.safetensors"), "cannot open");
    file_craft(
            bad,
            "{\"model.0.bn.weight\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,16],\"data_offsets\":[0,64]}}",
            d, 64);
    expect_load_fail("shape product overflow", bad, "tensor 'model.0.bn.weight': shape product overflows");
    file_craft(bad, "{\"model.0.bn.num_batches_tracked\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]}}", d,
               4);
    {
        ParamRef cr = {"model.0.bn.num_batches_tracked", 0, {0}, NULL, PARAM_COUNT, 77};
        int r2 = weights_load(bad, &cr, 1, err, sizeof err);
        check(r2 != 0 && cr.count == 77 &&
                      strstr(err, "'model.0.bn.num_batches_tracked' should be one integer, file has F32 ()"),
              "counter stored as F32 is refused, count untouched [%s]", err);
    }
    {   // header length over the 100 MB cap, in a sparse 150 MB file (no real disk use)
        unsigned char h8[8] = {0};
        uint64_t hl8 = 120000000;
        for (int k = 0; k < 8; k++) h8[k] = (unsigned char)(hl8 >> (8 * k));
        file_write(bad, h8, 8);
        if (truncate(bad, 150000000) != 0) die("truncate %s", bad);
        expect_load_fail("header length over the 100 MB cap", bad,
                         "header length 120000000 exceeds the 100000000 byte limit");
        file_write(bad, h8, 8);
    }
    free(x); refs_free(m); refs_free(a);
}

static void test_atomic(void) {
    ParamRef *a = refs_make(1), *b = refs_make(2);
    char err[2048] = "";
    const char *p = path_in("atomic.safetensors");
    weights_save(p, a, NSPEC, NULL, ST_F32, err, sizeof err);
    size_t n0, n1;
    unsigned char *f0 = file_read(p, &n0);
    int64_t fails[] = {0, 5, 100, 20000, (int64_t)n0 - 1};
    for (int c = 0; c < 5; c++) {
        st_test_fail_after = fails[c];
        int rc = weights_save(p, b, NSPEC, NULL, ST_F32, err, sizeof err);
        st_test_fail_after = -1;
        unsigned char *f1 = file_read(p, &n1);
        char tmp[300]; snprintf(tmp, sizeof tmp, "%s.tmp", p);
        struct stat sb;
        check(rc != 0 && strstr(err, "writing") && n1 == n0 && memcmp(f0, f1, n0) == 0 && stat(tmp, &sb) != 0,
              "save failing after %lld bytes: error reported, old file intact, no .tmp left [%s]", (long long)fails[c],
              err);
        free(f1);
    }
    int rc = weights_save(path_in("no/such/dir/x.safetensors"), a, NSPEC, NULL, ST_F32, err, sizeof err);
    check(rc != 0 && strstr(err, "no/such/dir/x.safetensors") && strstr(err, "cannot create"),
          "save into a missing directory fails [%s]", err);
    rc = weights_save(p, b, NSPEC, NULL, ST_F32, err, sizeof err);
    ParamRef *c = refs_make(0);
    rc = rc ? rc : weights_load(p, c, NSPEC, err, sizeof err);
    check(rc == 0 && refs_same(b, c), "a later successful save replaces the file [%s]", err);
    free(f0); refs_free(a); refs_free(b); refs_free(c);
}

// checkpoint-style file: model tensors plus optim.* and metadata via the generic writer/reader
static void test_generic(void) {
    ParamRef *a = refs_make(3), *b = refs_make(0);
    char err[2048] = "";
    StTensor *t = xcalloc(2 * NSPEC + 1, sizeof(StTensor));
    char names[NSPEC][96];
    int nt = 0;
    for (int i = 0; i < NSPEC; i++) {
        if (a[i].kind == PARAM_COUNT) { t[nt++] = (StTensor){a[i].name, ST_I64, 0, {0}, &a[i].count}; continue; }
        t[nt] = (StTensor){a[i].name, ST_F32, a[i].ndim, {0}, a[i].data};
        memcpy(t[nt].shape, a[i].shape, sizeof a[i].shape);
        nt++;
        if (a[i].kind == PARAM_TRAIN) {
            snprintf(names[i], sizeof names[i], "optim.%s", a[i].name);
            t[nt] = t[nt - 1];
            t[nt].name = names[i];
            nt++;
        }
    }
    int64_t step[2] = {12345, -7};
    t[nt++] = (StTensor){"train.step", ST_I64, 1, {2}, step};
    const char *meta[] = {"epoch", "4", NULL};
    const char *p = path_in("ckpt.safetensors");
    int rc = st_write(p, t, nt, meta, err, sizeof err);
    SafeTensors st;
    rc = rc ? rc : st_open(p, &st, err, sizeof err);
    if (rc == 0) {
        int rc2 = weights_load_st(&st, b, NSPEC, NULL, 0, err, sizeof err);
        check(rc2 != 0 && strstr(err, "unexpected tensor 'optim."),
              "checkpoint: strict load reports optim.* as unexpected [%s]", err);
        rc2 = weights_load_st(&st, b, NSPEC, NULL, 1, err, sizeof err);
        check(rc2 == 0 && refs_same(a, b), "checkpoint: load with allow_extra gets the model exactly [%s]", err);
        const StEntry *e = st_find(&st, "optim.model.22.cv3.0.2.weight");
        float buf[3 * 64];
        rc2 = e ? st_read_f32(&st, e, buf, err, sizeof err) : -1;
        check(rc2 == 0 && e->numel == 192 && memcmp(buf, a[24].data, sizeof buf) == 0,
              "checkpoint: st_find + st_read_f32 of an optim tensor");
        int64_t got[2];
        e = st_find(&st, "train.step");
        rc2 = e ? st_read_i64(&st, e, got, err, sizeof err) : -1;
        check(rc2 == 0 && got[0] == 12345 && got[1] == -7 && strcmp(st_meta(&st, "epoch"), "4") == 0,
              "checkpoint: I64 tensor and metadata");
        rc2 = e ? st_read_f32(&st, e, buf, err, sizeof err) : 0;
        check(rc2 != 0 && strstr(err, "train.step") && strstr(err, "I64"),
              "st_read_f32 of an I64 tensor is an error [%s]", err);
        st_close(&st);
    } else check(0, "checkpoint write/open [%s]", err);
    // every readable dtype from a hand-made file
    {
        unsigned char raw[64] = {0};
        double f64[2] = {-2.5, 1e-3};
        int8_t i8[2] = {-128, 127};
        uint16_t u16[2] = {65535, 1};
        int16_t i16[2] = {-32768, 5};
        uint32_t u32[2] = {4294967295u, 0};
        int32_t i32[2] = {-2147483647 - 1, 9};
        memcpy(raw, f64, 16); memcpy(raw + 16, i8, 2); memcpy(raw + 18, u16, 4); memcpy(raw + 22, i16, 4);
        memcpy(raw + 26, u32, 8); memcpy(raw + 34, i32, 8); raw[42] = 1; raw[43] = 0; raw[44] = 200;
        file_craft(p, "{\"f64\":{\"dtype\":\"F64\",\"shape\":[2],\"data_offsets\":[0,16]},"
                      "\"i8\":{\"dtype\":\"I8\",\"shape\":[2],\"data_offsets\":[16,18]},"
                      "\"u16\":{\"dtype\":\"U16\",\"shape\":[2],\"data_offsets\":[18,22]},"
                      "\"i16\":{\"dtype\":\"I16\",\"shape\":[2],\"data_offsets\":[22,26]},"
                      "\"u32\":{\"dtype\":\"U32\",\"shape\":[2],\"data_offsets\":[26,34]},"
                      "\"i32\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[34,42]},"
                      "\"bool\":{\"dtype\":\"BOOL\",\"shape\":[2],\"data_offsets\":[42,44]},"
                      "\"u8\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[44,45]}}", raw, 48);
        SafeTensors s2;
        int r2 = st_open(p, &s2, err, sizeof err);
        float fv[2] = {0};
        int64_t iv[8][2];
        const char *nm[] = {"i8", "u16", "i16", "u32", "i32", "bool", "u8"};
        r2 = r2 ? r2 : st_read_f32(&s2, st_find(&s2, "f64"), fv, err, sizeof err);
        for (int k = 0; k < 7 && !r2; k++) r2 = st_read_i64(&s2, st_find(&s2, nm[k]), iv[k], err, sizeof err);
        check(r2 == 0 && fv[0] == -2.5f && fv[1] == (float)1e-3 && iv[0][0] == -128 && iv[0][1] == 127 &&
                      iv[1][0] == 65535 && iv[1][1] == 1 && iv[2][0] == -32768 && iv[2][1] == 5 &&
                      iv[3][0] == 4294967295ll && iv[4][0] == INT32_MIN && iv[4][1] == 9 && iv[5][0] == 1 &&
                      iv[5][1] == 0 && iv[6][0] == 200,
              "F64, I8, U16, I16, U32, I32, BOOL, U8 read with sign/zero extension [%s]", err);
        r2 = r2 ? r2 : st_read_i64(&s2, st_find(&s2, "f64"), iv[0], err, sizeof err);
        check(r2 != 0 && strstr(err, "'f64' has dtype F64, expected an integer dtype"),
              "st_read_i64 of a float tensor is an error [%s]", err);
        st_close(&s2);
    }
    {   // writer argument errors
        ParamRef *a2 = refs_make(1);
        int r2 = weights_save(p, a2, NSPEC, NULL, ST_I64, err, sizeof err);
        check(r2 != 0 && strstr(err, "F32, F16 or BF16 only"), "weights_save with dtype I64 refused [%s]", err);
        const char *badmeta[] = {"k", "\xff\xfe", NULL};
        r2 = weights_save(p, a2, NSPEC, badmeta, ST_F32, err, sizeof err);
        check(r2 != 0 && strstr(err, "not valid UTF-8"), "metadata with invalid UTF-8 refused [%s]", err);
        const char *oddmeta[] = {"k", NULL};
        r2 = weights_save(p, a2, NSPEC, oddmeta, ST_F32, err, sizeof err);
        check(r2 != 0 && strstr(err, "metadata key 'k' has no value"), "metadata key without value refused [%s]", err);
        refs_free(a2);
    }
    t[1].name = t[0].name;
    rc = st_write(p, t, nt, NULL, err, sizeof err);
    check(rc != 0 && strstr(err, "duplicate tensor name 'model.0.conv.weight'"),
          "st_write refuses duplicate names [%s]", err);
    free(t); refs_free(a); refs_free(b);
}

static void test_infer(void) {
    ParamRef *a = refs_make(1);
    char err[2048] = "", scale = 0;
    int nc = 0;
    const char *p = path_in("infer.safetensors");
    weights_save(p, a, NSPEC, NULL, ST_F16, err, sizeof err);
    int rc = weights_infer(p, &nc, &scale, err, sizeof err);
    check(rc == 0 && nc == 3 && scale == 'n', "weights_infer: nc 3 scale n (got %d %c) [%s]", nc, scale ? scale : '?',
          err);
    ParamRef *m = refs_make(0);
    m[0].shape[0] = 48; free(m[0].data); m[0].data = xcalloc(48 * 27, 4);
    m[24].shape[0] = 80; free(m[24].data); m[24].data = xcalloc(80 * 64, 4);
    weights_save(p, m, NSPEC, NULL, ST_F32, err, sizeof err);
    rc = weights_infer(p, &nc, &scale, err, sizeof err);
    check(rc == 0 && nc == 80 && scale == 'm', "weights_infer: nc 80 scale m (got %d %c) [%s]", nc, scale, err);
    m[0].shape[0] = 40; free(m[0].data); m[0].data = xcalloc(40 * 27, 4);
    weights_save(p, m, NSPEC, NULL, ST_F32, err, sizeof err);
    rc = weights_infer(p, &nc, &scale, err, sizeof err);
    check(rc != 0 && strstr(err, "model.0.conv.weight has shape (40, 3, 3, 3)"),
          "weights_infer: stem width 40 rejected [%s]", err);
    weights_save(p, m + 1, 20, NULL, ST_F32, err, sizeof err);
    rc = weights_infer(p, &nc, &scale, err, sizeof err);
    check(rc != 0 && strstr(err, "not a YOLOv8 detection model: no tensor 'model.0.conv.weight'"),
          "weights_infer: no stem [%s]", err);
    refs_free(a); refs_free(m);
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/test_weights_XXXXXX");
    if (!mkdtemp(g_dir)) die("mkdtemp failed: %s", strerror(errno));
    double t0 = now_sec();
    test_half();
    test_roundtrip();
    test_bf16_file();
    test_bad_files();
    test_atomic();
    test_generic();
    test_infer();
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) printf("note: could not remove %s\n", g_dir);
    printf("(%.2f s)\n", now_sec() - t0);
    return test_summary();
}
