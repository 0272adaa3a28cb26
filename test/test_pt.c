// test_pt.c: PyTorch .pt checkpoints (the pt section of yolo.c).
//   1. the torch.save fixtures of test/ref_pt.py load to exactly what torch.load gives: per tensor
//      dtype, shape and an FNV-1a hash of the float32 (or int64) values, from test/fixtures/pt_expected.txt
//      (an Ultralytics release-style yolov8n checkpoint in FP16, a training checkpoint with model and
//      ema, a plain state_dict with views, BF16 and F64, with and without a byteorder record)
//   2. the same archive rewritten here with every container variant: folder names, aligned or not,
//      data descriptors, zip64 records, byteorder or not; a hand-written pickle with an offset view
//   3. every bad input gives one line naming the file and the cause (Git LFS pointer, cut-off
//      download, records past the end, legacy format, compressed entry, overlapping and oversized
//      entries, unsupported opcode, memo and recursion abuse, os.system, YOLOv5, YOLO11, segment,
//      pose, classify, OBB, a non-detection module, out-of-bounds view, big-endian)
//   4. ./yolo: info reports scale, nc, names and the parameter count; export to safetensors; val of
//      the .pt and of the export print the same metrics and losses; fine-tuning to nc=6 reports the
//      transfer count (checked against the shapes of both models) and the validation losses fall.
#ifndef TESTING
#define TESTING
#endif
#include "../yolo.c"
#include "test.h"
#include "fixture.h"
#include <sys/wait.h>

static char g_dir[64];

static void blob_write(const char *path, const void *p, size_t n) {
    FILE *f = xfopen(path, "wb");
    if (n && fwrite(p, 1, n, f) != n) die("write of %s failed", path);
    fclose(f);
}

static uint64_t fnv64(const void *p, size_t n) {
    const uint8_t *b = p;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

// ---- part 1: the fixtures against torch.load ----

// check_expected: every tensor torch.load gave for key (lines of pt_expected.txt) is in st with the
// same dtype and shape and bit-identical values, and st holds nothing else
static void check_expected(SafeTensors *st, const char *key) {
    FILE *f = xfopen("test/fixtures/pt_expected.txt", "r");
    char line[1024], name[512], dt[32], shape[128], first[64];
    unsigned long long want;
    int n = 0, bad = 0, firstbad = 1;
    char why[2048] = "";
    while (fgets(line, sizeof line, f)) {
        char k[64];
        if (line[0] == '#' || sscanf(line, "%63s %511s %31s %127s %llx %63s", k, name, dt, shape, &want, first) != 6 ||
            strcmp(k, key))
            continue;
        n++;
        const StEntry *e = st_find(st, name);
        static const struct {
            const char *t;
            int d;
        } dts[] = {{"float16", ST_F16},
                   {"float32", ST_F32},
                   {"bfloat16", ST_BF16},
                   {"float64", ST_F64},
                   {"int64", ST_I64}};
        int d = -1;
        for (int i = 0; i < 5; i++) if (!strcmp(dt, dts[i].t)) d = dts[i].d;
        char got[128] = "scalar", sb[160];
        if (e && e->ndim) {
            got[0] = 0;
            for (int i = 0; i < e->ndim; i++)
                snprintf(got + strlen(got), sizeof got - strlen(got), "%s%" PRId64, i ? "x" : "", e->shape[i]);
        }
        uint64_t h = 0;
        char gfirst[64] = "-";
        if (e && e->dtype == d && !strcmp(got, shape)) {
            char err[512];
            if (st_dtype_is_float(d)) {
                float *v = xmalloc(sizeof(float) * (size_t)(e->numel + 1));
                if (st_read_f32(st, e, v, err, sizeof err) == 0) {
                    h = fnv64(v, sizeof(float) * (size_t)e->numel);
                    if (e->numel) snprintf(gfirst, sizeof gfirst, "%.9g", v[0]);
                }
                free(v);
            } else {
                int64_t *v = xmalloc(sizeof(int64_t) * (size_t)(e->numel + 1));
                if (st_read_i64(st, e, v, err, sizeof err) == 0) {
                    h = fnv64(v, sizeof(int64_t) * (size_t)e->numel);
                    if (e->numel) snprintf(gfirst, sizeof gfirst, "%" PRId64, v[0]);
                }
                free(v);
            }
        }
        if (!e || e->dtype != d || strcmp(got, shape) || h != want) {
            if (firstbad)
                snprintf(why, sizeof why, "; first: %s: %s %s %s (torch: %s %s, first %s, got %s)", name,
                         e ? st_dtype_name[e->dtype] : "missing",
                         e ? st_shape_str(sb, sizeof sb, e->ndim, e->shape) : "",
                         h == want ? "same values" : "values differ", dt, shape, first, gfirst);
            firstbad = 0;
            bad++;
        }
    }
    fclose(f);
    check(n > 0 && bad == 0 && st->n == n,
          "%s: %d tensors of torch.load (file has %d) equal bit for bit (dtype, shape, "
          "FNV-1a of the values): %d differ (tolerance 0)%s",
          key, n, st->n, bad, why);
}

static void part_fixtures(void) {
    static const char *const keys[] = {"pt_v8n_nc4", "pt_tiny_ckpt", "pt_tiny_sd", "pt_tiny_sd_bo"};
    static const char *const src[] = {"model", "ema", "state_dict", "state_dict"};
    for (int i = 0; i < 4; i++) {
        char path[256], err[1024] = "";
        snprintf(path, sizeof path, "test/fixtures/%s.pt", keys[i]);
        SafeTensors st;
        if (weights_open(path, &st, err, sizeof err)) { check(0, "%s opens [%s]", path, err); continue; }
        const char *s = st_meta(&st, "pt_source");
        check(s && !strcmp(s, src[i]), "%s: weights taken from '%s' (want '%s': ema when present, else model)", path,
              s ? s : "?", src[i]);
        check_expected(&st, keys[i]);
        st_close(&st);
    }
    SafeTensors st;
    char err[1024] = "";
    if (weights_open("test/fixtures/pt_v8n_nc4.pt", &st, err, sizeof err) == 0) {
        const char *names = st_meta(&st, "names"), *v = st_meta(&st, "version"), *sc = st_meta(&st, "yaml_scale"),
                   *nc = st_meta(&st, "yaml_nc");
        check(names && !strcmp(names, "circle\nrectangle\ntriangle\ndiamond") && v && !strcmp(v, "8.0.200") && sc &&
                      !strcmp(sc, "n") && nc && !strcmp(nc, "4"),
              "pt_v8n_nc4.pt metadata: names, version 8.0.200, yaml scale n, nc 4");
        const char *ta = st_meta(&st, "train_args");
        check(ta && strstr(ta, "imgsz=160") && strstr(ta, "task=detect"), "train_args read: [%.80s]",
              ta ? ta : "(none)");
        st_close(&st);
    }
}

// ---- part 2: container variants ----

typedef struct { char name[128]; const uint8_t *p; size_t n; } ZEnt;
enum { ZW_ALIGN = 1, ZW_DESC = 2, ZW_ZIP64 = 4, ZW_DEFLATE = 8 };

typedef struct { uint8_t *p; size_t n, cap; } Buf;
static void bput(Buf *b, const void *p, size_t n) {
    if (b->n + n > b->cap) { b->cap = (b->n + n) * 2 + 256; b->p = realloc(b->p, b->cap); }
    if (n) memcpy(b->p + b->n, p, n);
    b->n += n;
}
static void b16(Buf *b, unsigned v) { uint8_t x[2] = {(uint8_t)v, (uint8_t)(v >> 8)}; bput(b, x, 2); }
static void b32(Buf *b, uint32_t v) { b16(b, v & 0xffff); b16(b, v >> 16); }
static void b64(Buf *b, uint64_t v) { b32(b, (uint32_t)v); b32(b, (uint32_t)(v >> 32)); }

// zip_build: a stored zip of the entries with the given layout options
static Blob zip_build(const ZEnt *e, int n, int flags) {
    Buf b = {0}, c = {0};
    int z64 = flags & ZW_ZIP64;
    for (int i = 0; i < n; i++) {
        uint64_t lho = b.n;
        size_t nl = strlen(e[i].name);
        unsigned method = (flags & ZW_DEFLATE) && strstr(e[i].name, "data.pkl") ? 8 : 0;
        size_t xl = z64 ? 20 : 0;
        size_t pad = 0;
        if (flags & ZW_ALIGN) { size_t off = lho + 30 + nl + xl + 4; pad = (64 - off % 64) % 64; xl += 4 + pad; }
        b32(&b, 0x04034b50u);
        b16(&b, z64 ? 45 : 20);
        b16(&b, flags & ZW_DESC ? 8 : 0);
        b16(&b, method);
        b32(&b, 0);
        b32(&b, 0);
        uint32_t s32 = z64 ? 0xffffffffu : flags & ZW_DESC ? 0 : (uint32_t)e[i].n;
        b32(&b, s32); b32(&b, s32); b16(&b, (unsigned)nl); b16(&b, (unsigned)xl);
        bput(&b, e[i].name, nl);
        if (z64) { b16(&b, 1); b16(&b, 16); b64(&b, e[i].n); b64(&b, e[i].n); }
        if (flags & ZW_ALIGN) {
            b16(&b, 0x4246);
            b16(&b, (unsigned)pad);
            for (size_t k = 0; k < pad; k++) bput(&b, "Z", 1);
        }
        bput(&b, e[i].p, e[i].n);
        if (flags & ZW_DESC) {
            b32(&b, 0x08074b50u); b32(&b, 0);
            if (z64) {
                b64(&b, e[i].n);
                b64(&b, e[i].n);
            } else {
                b32(&b, (uint32_t)e[i].n);
                b32(&b, (uint32_t)e[i].n);
            }
        }
        b32(&c, 0x02014b50u);
        b16(&c, z64 ? 45 : 20);
        b16(&c, z64 ? 45 : 20);
        b16(&c, flags & ZW_DESC ? 8 : 0);
        b16(&c, method);
        b32(&c, 0); b32(&c, 0);
        b32(&c, z64 ? 0xffffffffu : (uint32_t)e[i].n); b32(&c, z64 ? 0xffffffffu : (uint32_t)e[i].n);
        b16(&c, (unsigned)nl); b16(&c, z64 ? 28 : 0); b16(&c, 0); b16(&c, 0); b16(&c, 0); b32(&c, 0);
        b32(&c, z64 ? 0xffffffffu : (uint32_t)lho);
        bput(&c, e[i].name, nl);
        if (z64) { b16(&c, 1); b16(&c, 24); b64(&c, e[i].n); b64(&c, e[i].n); b64(&c, lho); }
    }
    uint64_t cd_off = b.n;
    bput(&b, c.p, c.n);
    if (z64) {
        uint64_t r64 = b.n;
        b32(&b, 0x06064b50u); b64(&b, 44); b16(&b, 45); b16(&b, 45); b32(&b, 0); b32(&b, 0);
        b64(&b, (uint64_t)n); b64(&b, (uint64_t)n); b64(&b, c.n); b64(&b, cd_off);
        b32(&b, 0x07064b50u); b32(&b, 0); b64(&b, r64); b32(&b, 1);
    }
    b32(&b, 0x06054b50u); b16(&b, 0); b16(&b, 0);
    b16(&b, z64 ? 0xffff : (unsigned)n); b16(&b, z64 ? 0xffff : (unsigned)n);
    b32(&b, z64 ? 0xffffffffu : (uint32_t)c.n); b32(&b, z64 ? 0xffffffffu : (uint32_t)cd_off); b16(&b, 0);
    free(c.p);
    return (Blob){b.p, b.n};
}

// the entries of a fixture (read with the zip reader), renamed under folder, byteorder optional
static int g_nsd;
static ZEnt g_sd[64];
static Blob g_sdfile;

static void load_sd_entries(void) {
    g_sdfile = blob_file("test/fixtures/pt_tiny_sd.pt");
    FILE *f = fmemopen(g_sdfile.p, g_sdfile.n, "rb");
    PtZip z = {.path = "pt_tiny_sd.pt", .f = f, .fsize = g_sdfile.n};
    char err[512];
    if (pt_zip_open(&z, err, sizeof err)) die("%s", err);
    for (int i = 0; i < z.n && g_nsd < 64; i++) {
        snprintf(g_sd[g_nsd].name, sizeof g_sd[g_nsd].name, "%s", z.e[i].name + strlen(z.prefix));
        g_sd[g_nsd].p = g_sdfile.p + z.e[i].off;
        g_sd[g_nsd++].n = (size_t)z.e[i].size;
    }
    pt_zip_close(&z);
    fclose(f);
}

static Blob sd_variant(const char *folder, int byteorder, const char *bo_value, int flags) {
    ZEnt e[66];
    int n = 0;
    for (int i = 0; i < g_nsd; i++) {   // data.pkl first, as torch writes it
        int pk = !strcmp(g_sd[i].name, "data.pkl");
        ZEnt x = g_sd[i];
        snprintf(x.name, sizeof x.name, "%.60s/%.60s", folder, g_sd[i].name);
        if (pk) { memmove(e + 1, e, sizeof(ZEnt) * (size_t)n); e[0] = x; } else e[n] = x;
        n++;
    }
    if (byteorder) {
        snprintf(e[n].name, sizeof e[n].name, "%s/byteorder", folder);
        e[n].p = (const uint8_t *)bo_value;
        e[n++].n = strlen(bo_value);
    }
    return zip_build(e, n, flags);
}

static int open_blob(const char *name, Blob b, SafeTensors *st, char *err, size_t errlen) {
    char path[256];
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    blob_write(path, b.p, b.n);
    return weights_open(path, st, err, errlen);
}

static void part_variants(void) {
    load_sd_entries();
    static const struct { const char *folder; int bo, flags; } v[] = {
        {"archive", 0, ZW_ALIGN}, {"archive", 1, ZW_ALIGN}, {"my model v2", 1, 0}, {"x", 0, ZW_DESC},
        {"archive", 1, ZW_ZIP64}, {"archive", 1, ZW_ZIP64 | ZW_DESC | ZW_ALIGN}, {"a/b", 0, ZW_DESC | ZW_ALIGN}};
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        SafeTensors st;
        char err[1024] = "", name[64];
        snprintf(name, sizeof name, "variant%zu.pt", i);
        Blob b = sd_variant(v[i].folder, v[i].bo, "little", v[i].flags);
        int rc = open_blob(name, b, &st, err, sizeof err);
        check(rc == 0, "container variant: folder '%s', byteorder %s, %s%s%s opens [%s]", v[i].folder,
              v[i].bo ? "yes" : "no", v[i].flags & ZW_ALIGN ? "64-byte aligned" : "unaligned",
              v[i].flags & ZW_DESC ? ", data descriptors" : "", v[i].flags & ZW_ZIP64 ? ", zip64" : "", err);
        if (!rc) { check_expected(&st, "pt_tiny_sd"); st_close(&st); }
        free(b.p);
    }
    {   // a hand-written pickle: a view at storage offset 1 of a 4-element FloatStorage
        static const char pk[] = "\x80\x02}q\x00X\x01\x00\x00\x00"
                                 "actorch._utils\n_rebuild_tensor_v2\n((X\x07\x00\x00\x00storage"
                                 "ctorch\nFloatStorage\nX\x01\x00\x00\x00"
                                 "0X\x03\x00\x00\x00"
                                 "cpuK\x04tQK\x01K\x03\x85K\x01\x85\x89"
                                 "ccollections\nOrderedDict\n)RtRs.";
        float data[4] = {10, 11, 12, 13}, got[3] = {0};
        ZEnt e[2] = {{"archive/data.pkl", (const uint8_t *)pk, sizeof pk - 1},
                     {"archive/data/0", (const uint8_t *)data, 16}};
        Blob b = zip_build(e, 2, 0);
        SafeTensors st;
        char err[1024] = "";
        int rc = open_blob("hand.pt", b, &st, err, sizeof err);
        const StEntry *t = rc ? NULL : st_find(&st, "a");
        if (t && t->numel == 3) st_read_f32(&st, t, got, err, sizeof err);
        check(t && t->numel == 3 && got[0] == 11 && got[1] == 12 && got[2] == 13,
              "hand pickle: offset view reads 11 12 13 "
              "(got %g %g %g) [%s]",
              got[0], got[1], got[2], err);
        if (!rc) st_close(&st);
        free(b.p);
    }
}

// ---- part 3: bad input ----

// expect_error: the file gives an error that starts with its quoted name and contains every phrase
static void expect_error(const char *what, const char *name, Blob b, const char *p1, const char *p2) {
    char path[256], err[1024] = "", q[300];
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    blob_write(path, b.p, b.n);
    SafeTensors st;
    int rc = weights_open(path, &st, err, sizeof err);
    if (!rc) st_close(&st);
    snprintf(q, sizeof q, "'%s'", path);
    check(rc != 0 && !strncmp(err, q, strlen(q)) && strstr(err, p1) && (!p2 || strstr(err, p2)) && !strchr(err, '\n'),
          "%s: one-line error naming the file, '%s'%s%s%s: [%s]", what, p1, p2 ? " and '" : "", p2 ? p2 : "",
          p2 ? "'" : "", err);
}
static void expect_error_file(const char *what, const char *path, const char *p1, const char *p2) {
    Blob b = blob_file(path);
    const char *slash = strrchr(path, '/');
    expect_error(what, slash + 1, b, p1, p2);
    free(b.p);
}
static Blob pickle_pt(const char *pk, size_t n) {
    ZEnt e[1] = {{"archive/data.pkl", (const uint8_t *)pk, n}};
    return zip_build(e, 1, 0);
}
#define PICKLE_PT(lit) pickle_pt(lit, sizeof lit - 1)

static void part_bad(void) {
    static const char lfs[] = "version https://git-lfs.github.com/spec/v1\noid sha256:4f1e0a0c0e3c1e2d\nsize 6534387\n";
    expect_error("Git LFS pointer", "lfs.pt", (Blob){(uint8_t *)lfs, sizeof lfs - 1}, "Git LFS pointer",
                 "git lfs pull");
    {   // a download cut at 70%: no end-of-central-directory record
        Blob b = blob_file("test/fixtures/pt_tiny_ckpt.pt");
        char want[64];
        snprintf(want, sizeof want, "%zu bytes", b.n * 7 / 10);
        expect_error("truncated download", "cut.pt", (Blob){b.p, b.n * 7 / 10}, "cut off", want);
        free(b.p);
    }
    Blob good = sd_variant("archive", 1, "little", ZW_ALIGN);
    {   // the end record points past itself: directory beyond the data the file holds
        Blob b = {xmalloc(good.n), good.n};
        memcpy(b.p, good.p, good.n);
        uint32_t off = pt_rd32(b.p + b.n - 6) + 5000;
        memcpy(b.p + b.n - 6, &off, 4);
        expect_error("central directory past the end", "past.pt", b, "lies past", "cut off");
        free(b.p);
    }
    static const char legacy[] = "\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19.";
    expect_error("legacy torch format", "legacy.pt", (Blob){(uint8_t *)legacy, sizeof legacy - 1},
                 "legacy (non-zip) PyTorch format", NULL);
    Blob b = sd_variant("archive", 0, "", ZW_DEFLATE);
    expect_error("compressed entry", "deflate.pt", b, "is compressed (method 8", NULL);
    free(b.p);
    {   // zip bomb: two directory entries sharing the same bytes; and one claiming more than the file
        Blob z = {xmalloc(good.n), good.n};
        memcpy(z.p, good.p, good.n);
        uint32_t cd = pt_rd32(z.p + z.n - 6);
        uint8_t *c0 = z.p + cd, *c1 = c0 + 46 + pt_rd16(c0 + 28) + pt_rd16(c0 + 30);
        memcpy(c1 + 42, c0 + 42, 4);   // entry 1's local header offset := entry 0's
        expect_error("zip bomb (overlapping entries)", "bomb1.pt", z, "overlap", "do not add up");
        memcpy(z.p, good.p, good.n);
        uint32_t big = 1u << 30;
        memcpy(c0 + 20, &big, 4); memcpy(c0 + 24, &big, 4);
        expect_error("zip bomb (entry larger than the file)", "bomb2.pt", z, "claims 1073741824 bytes",
                     "do not add up");
        free(z.p);
    }
    b = sd_variant("archive", 1, "big", ZW_ALIGN);
    expect_error("big-endian byteorder record", "big.pt", b, "only little-endian", NULL);
    free(b.p);
    free(good.p);

    b = PICKLE_PT("\x80\x02(i__main__\nX\n.");
    expect_error("unsupported opcode (INST)", "inst.pt", b, "opcode 0x69", "not supported"); free(b.p);
    b = PICKLE_PT("\x80\x02\x82\x01.");
    expect_error("unsupported opcode (EXT1)", "ext.pt", b, "opcode 0x82", NULL); free(b.p);
    b = PICKLE_PT("\x80\x02Nr\xff\xff\xff\x7f.");
    expect_error("memo abuse (huge index)", "memo1.pt", b, "memo index 2147483647 exceeds", NULL); free(b.p);
    b = PICKLE_PT("\x80\x02h\x07.");
    expect_error("memo abuse (read before write)", "memo2.pt", b, "memo index 7 read before", NULL); free(b.p);
    {
        size_t n = PT_MAX_MARKS + 10;
        char *pk = xmalloc(n + 3);
        memcpy(pk, "\x80\x02", 2);
        memset(pk + 2, '(', n);
        pk[n + 2] = '.';
        b = pickle_pt(pk, n + 3);
        expect_error("recursion abuse (nested marks)", "marks.pt", b, "nested marks", NULL);
        free(b.p); free(pk);
    }
    {   // modules nested 100 deep: Sequential._modules['0'] = Sequential ...
        Buf p = {0};
        static const char head1[] = "\x80\x02}X\x05\x00\x00\x00model";
        bput(&p, head1, sizeof head1 - 1);
        static const char open[] =
                "ctorch.nn.modules.container\nSequential\n)\x81}X\x08\x00\x00\x00_modules}X\x01\x00\x00\x00"
                "0";
        for (int i = 0; i < 100; i++) bput(&p, open, sizeof open - 1);
        bput(&p, "N", 1);
        for (int i = 0; i < 100; i++) bput(&p, "ssb", 3);
        bput(&p, "s.", 2);
        b = pickle_pt((char *)p.p, p.n);
        expect_error("a module that is not a DetectionModel", "deep.pt", b,
                     "holds a torch.nn.modules.container.Sequential", NULL);
        free(b.p);
        // the same tree under a DetectionModel: the walk stops at the depth limit
        Buf q = {0};
        static const char head2[] = "\x80\x02}X\x05\x00\x00\x00modelcultralytics.nn.tasks\nDetectionModel\n)\x81}"
                                    "X\x08\x00\x00\x00_modules}X\x01\x00\x00\x00""0";
        bput(&q, head2, sizeof head2 - 1);
        bput(&q, p.p + sizeof head1 - 1, p.n - (sizeof head1 - 1) - 2);
        bput(&q, "ssbs.", 5);
        b = pickle_pt((char *)q.p, q.n);
        expect_error("recursion abuse (module walk)", "deep2.pt", b, "nested deeper than 64", NULL);
        free(b.p); free(p.p); free(q.p);
    }
    expect_error_file("a pickle that runs os.system", "test/fixtures/pt_evil.pt", "system, which is not on the list",
                      "nothing in it was run");
    if (access("/tmp/yolo_pt_pwned", F_OK) == 0) check(0, "pt_evil.pt ran its command");
    b = PICKLE_PT("\x80\x02}X\x05\x00\x00\x00modelcmodels.yolo\nDetectionModel\n)\x81}bs.");
    expect_error("YOLOv5 checkpoint", "v5.pt", b, "YOLOv5 checkpoint", "only YOLOv8 detection"); free(b.p);
    expect_error_file("YOLO11 checkpoint", "test/fixtures/pt_v11.pt", "a YOLO11 model", "only YOLOv8 detection");
    expect_error_file("segmentation checkpoint", "test/fixtures/pt_seg.pt", "a segmentation model",
                      "only YOLOv8 detection");
    b = PICKLE_PT("\x80\x02}X\x05\x00\x00\x00modelcultralytics.nn.tasks\nPoseModel\n)\x81}bs.");
    expect_error("pose checkpoint", "pose.pt", b, "a pose model", "only YOLOv8 detection"); free(b.p);
    b = PICKLE_PT("\x80\x02}X\x05\x00\x00\x00modelcultralytics.nn.tasks\nClassificationModel\n)\x81}bs.");
    expect_error("classify checkpoint", "cls.pt", b, "a classification model", "only YOLOv8 detection"); free(b.p);
    b = PICKLE_PT("\x80\x02}X\x05\x00\x00\x00modelcultralytics.nn.modules.head\nOBB\n)\x81}bs.");
    expect_error("OBB checkpoint", "obb.pt", b, "oriented-box (OBB) model", "only YOLOv8 detection"); free(b.p);
    {   // a view reaching past its storage
        static const char pk[] = "\x80\x02}q\x00X\x01\x00\x00\x00"
                                 "actorch._utils\n_rebuild_tensor_v2\n((X\x07\x00\x00\x00storage"
                                 "ctorch\nFloatStorage\nX\x01\x00\x00\x00"
                                 "0X\x03\x00\x00\x00"
                                 "cpuK\x04tQK\x02K\x03\x85K\x01\x85\x89"
                                 "ccollections\nOrderedDict\n)RtRs.";
        float data[4] = {0};
        ZEnt e[2] = {{"archive/data.pkl", (const uint8_t *)pk, sizeof pk - 1},
                     {"archive/data/0", (const uint8_t *)data, 16}};
        b = zip_build(e, 2, 0);
        expect_error("tensor view past its storage", "oob.pt", b, "reaches element 4 of a 4-element storage", NULL);
        free(b.p);
    }
    {   // a safetensors file whose header length starts with the bytes 0x80 0x02 is still safetensors
        static const char js[] = "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}";
        uint8_t st8[8 + 640 + 4] = {0x80, 0x02};
        memset(st8 + 8, ' ', 640);
        memcpy(st8 + 8, js, sizeof js - 1);
        float one = 1.5f, got = 0;
        memcpy(st8 + 648, &one, 4);
        SafeTensors st;
        char err[512] = "";
        int rc = open_blob("hdr640.safetensors", (Blob){st8, sizeof st8}, &st, err, sizeof err);
        if (!rc) { st_read_f32(&st, &st.t[0], &got, err, sizeof err); st_close(&st); }
        check(rc == 0 && got == 1.5f,
              "safetensors with header length 640 (bytes 80 02 like a pickle) reads as safetensors "
              "(got %g) [%s]",
              got, err);
    }
    static const char junk[] = "this is not a checkpoint at all";
    expect_error(".pt that is not a zip", "junk.pt", (Blob){(uint8_t *)junk, sizeof junk - 1},
                 "not a PyTorch checkpoint", NULL);
    // the yolo command line: one line, the file and the cause, exit status 1
    char cmd[1024];
    FILE *p = popen(yolo_cmd("./yolo info model=test/fixtures/pt_v11.pt 2>&1", cmd, sizeof cmd), "r");
    char line[2048] = "", rest[256];
    int nl = 0;
    if (p) { if (fgets(line, sizeof line, p)) nl++; while (fgets(rest, sizeof rest, p)) nl++; }
    int st = p ? pclose(p) : -1;
    check(nl == 1 && WIFEXITED(st) && WEXITSTATUS(st) == 1 && strstr(line, "pt_v11.pt") && strstr(line, "YOLO11"),
          "./yolo info model=pt_v11.pt: one line, exit 1 (got %d lines, status %d): %s", nl, st, line);
}

// ---- part 4: ./yolo with a .pt ----

// run: the output of a ./yolo command line (stdout and stderr; yolo_bin() runs it); exit status in *rc
static char *run(const char *cmd, int *rc) {
    char full[4096];
    FILE *p = popen(yolo_cmd(cmd, full, sizeof full), "r");
    Buf b = {0};
    char tmp[4096];
    size_t k;
    while (p && (k = fread(tmp, 1, sizeof tmp, p)) > 0) bput(&b, tmp, k);
    bput(&b, "", 1);
    int st = p ? pclose(p) : -1;
    *rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    return (char *)b.p;
}

// metric_lines: the lines of a val output that carry results (the class table, the losses up to
// the timing)
static void metric_lines(const char *out, char *dst, size_t n) {
    dst[0] = 0;
    for (const char *l = out; *l;) {
        size_t len = strcspn(l, "\n");
        if (l[0] == ' ' || !strncmp(l, "val losses", 10)) {
            const char *semi = memchr(l, ';', len);
            snprintf(dst + strlen(dst), n - strlen(dst), "%.*s\n", (int)(semi ? (size_t)(semi - l) : len), l);
        }
        l += len + (l[len] != 0);
    }
}

static void part_cli(void) {
    char cmd[2048], *out;
    int rc;
    out = run("./yolo info model=test/fixtures/pt_v8n_nc4.pt 2>&1", &rc);
    Model *m = xcalloc(1, sizeof(Model));
    model_build(m, 'n', 4);
    char want[128];
    snprintf(want, sizeof want, "%zu parameters", m->nparams);
    const char *first = strstr(out, want), *second = first ? strstr(first + 1, want) : NULL;
    check(rc == 0 && strstr(out, "YOLOv8n, nc=4") &&
                  strstr(out, "names: 0: circle, 1: rectangle, 2: triangle, 3: diamond") &&
                  strstr(out, "yaml: scale n, nc 4") && strstr(out, "version: 8.0.200") && first && second,
          "yolo info model=pt_v8n_nc4.pt: scale n, nc 4, names, and '%s' both counted from the file and by the built "
          "model",
          want);
    free(out);

    out = run("./yolo plan model=test/fixtures/pt_v8n_nc4.pt batch=8 imgsz=320 2>&1", &rc);
    check(rc == 0 && strstr(out, "YOLOv8n nc=4 batch=8 imgsz=320") && strstr(out, want),
          "yolo plan model=pt_v8n_nc4.pt: "
          "the plan of YOLOv8n nc=4 with %s",
          want);
    free(out);

    snprintf(cmd, sizeof cmd, "./yolo shapes out=%s/shapes ntrain=16 nval=8 imgsz=64 seed=3 2>&1", g_dir);
    free(run(cmd, &rc));
    snprintf(cmd, sizeof cmd,
             "./yolo export model=test/fixtures/pt_v8n_nc4.pt format=safetensors out=%s/v8n.safetensors 2>&1", g_dir);
    out = run(cmd, &rc);
    check(rc == 0 && strstr(out, "355 tensors"), "yolo export format=safetensors: %.*s", (int)strcspn(out, "\n"), out);
    free(out);
    {   // the export holds F32 tensors with Ultralytics names equal to the .pt's values
        SafeTensors a, b;
        char err[1024] = "", p[256];
        snprintf(p, sizeof p, "%s/v8n.safetensors", g_dir);
        int ok = weights_open(p, &a, err, sizeof err) == 0;
        if (ok && weights_open("test/fixtures/pt_v8n_nc4.pt", &b, err, sizeof err) == 0) {
            int same = a.n == b.n, f32 = 1;
            for (int i = 0; i < b.n && same; i++) {
                const StEntry *x = st_find(&a, b.t[i].name);
                if (!x || x->numel != b.t[i].numel) { same = 0; break; }
                if (!st_dtype_is_float(x->dtype)) continue;
                f32 &= x->dtype == ST_F32;
                float *u = xmalloc(sizeof(float) * (size_t)x->numel + 4),
                      *v = xmalloc(sizeof(float) * (size_t)x->numel + 4);
                same = !st_read_f32(&a, x, u, err, sizeof err) && !st_read_f32(&b, &b.t[i], v, err, sizeof err) &&
                       !memcmp(u, v, sizeof(float) * (size_t)x->numel);
                free(u); free(v);
            }
            check(same && f32, "export: %d tensors, F32, same names and values as the .pt (tolerance 0)", a.n);
            st_close(&b);
        } else check(0, "export readable [%s]", err);
        if (ok) st_close(&a);
    }
    char m1[4096], m2[4096];
    snprintf(cmd, sizeof cmd,
             "./yolo val model=test/fixtures/pt_v8n_nc4.pt data=%s/shapes/data.yaml imgsz=64 batch=8 workers=1 "
             "project=%s name=a exist_ok=1 2>&1",
             g_dir, g_dir);
    out = run(cmd, &rc);
    metric_lines(out, m1, sizeof m1);
    free(out);
    snprintf(cmd, sizeof cmd, "./yolo val model=%s/v8n.safetensors data=%s/shapes/data.yaml imgsz=64 batch=8 workers=1 "
             "project=%s name=b exist_ok=1 2>&1", g_dir, g_dir, g_dir);
    out = run(cmd, &rc);
    metric_lines(out, m2, sizeof m2);
    free(out);
    check(rc == 0 && strstr(m1, "val losses box") && !strcmp(m1, m2),
          "yolo val: .pt and its safetensors export print identical "
          "metrics and losses:\n%s",
          m1);

    // fine-tuning to a dataset with nc=6: transfer count against the shapes of both models
    snprintf(cmd, sizeof cmd, "%s/shapes/data6.yaml", g_dir);
    FILE *f = xfopen(cmd, "w");
    fprintf(f,
            "path: %s/shapes\ntrain: images/train\nval: images/val\nnames: [circle, rectangle, triangle, diamond, "
            "star, hexagon]\n",
            g_dir);
    fclose(f);
    Model *m6 = xcalloc(1, sizeof(Model));
    model_build(m6, 'n', 6);
    StateDict *s4 = xcalloc(1, sizeof(StateDict)), *s6 = xcalloc(1, sizeof(StateDict));
    float *w4 = xcalloc(m->nparams + m->nbuffers, sizeof(float)),
          *w6 = xcalloc(m6->nparams + m6->nbuffers, sizeof(float));
    state_dict_build(s4, m, w4, w4 + m->nparams);
    state_dict_build(s6, m6, w6, w6 + m6->nparams);
    int same = 0;
    for (int i = 0; i < s6->n; i++)
        for (int j = 0; j < s4->n; j++)
            if (!strcmp(s6->ref[i].name, s4->ref[j].name) && s6->ref[i].ndim == s4->ref[j].ndim &&
                !memcmp(s6->ref[i].shape, s4->ref[j].shape, sizeof(int64_t) * (size_t)s4->ref[j].ndim))
                same++;
    snprintf(want, sizeof want, "Transferred %d/%d items from pretrained weights", same, s6->n);
    snprintf(cmd, sizeof cmd,
             "./yolo train data=%s/shapes/data6.yaml model=test/fixtures/pt_v8n_nc4.pt epochs=4 imgsz=64 batch=4 "
             "workers=1 optimizer=SGD lr0=0.01 warmup_epochs=0 nbs=4 mosaic=0 fliplr=0 translate=0 scale=0 hsv_h=0 "
             "hsv_s=0 hsv_v=0 "
             "seed=1 project=%s name=ft exist_ok=1 2>&1",
             g_dir, g_dir);
    out = run(cmd, &rc);
    check(rc == 0 && strstr(out, want) && strstr(out, "re-initialised"),
          "fine-tune .pt (nc 4) -> nc 6: '%s' (%d of %d names "
          "have the same shape in both models) and the re-initialisation is reported",
          want, same, s6->n);
    free(out);
    snprintf(cmd, sizeof cmd, "%s/ft/results.csv", g_dir);
    f = fopen(cmd, "r");
    double v[8][3];
    int ne = 0;
    char line[1024];
    while (f && fgets(line, sizeof line, f) && ne < 8) {
        double x[12];
        if (sscanf(line, "%lf,%lf,%lf,%lf,%lf,%lf,%lf,%lf,%lf,%lf,%lf,%lf", &x[0], &x[1], &x[2], &x[3], &x[4], &x[5],
                   &x[6], &x[7], &x[8], &x[9], &x[10], &x[11]) == 12) {
            v[ne][0] = x[9];
            v[ne][1] = x[10];
            v[ne][2] = x[11];
            ne++;
        }
    }
    if (f) fclose(f);
    int falls = ne == 4;
    for (int k = 0; k < 3 && falls; k++) falls = v[3][k] < v[0][k];
    check(falls,
          "fine-tuning learns: validation box/cls/dfl losses after epoch 4 below epoch 1: %.4f %.4f %.4f -> %.4f %.4f "
          "%.4f",
          ne ? v[0][0] : 0, ne ? v[0][1] : 0, ne ? v[0][2] : 0, ne == 4 ? v[3][0] : 0, ne == 4 ? v[3][1] : 0,
          ne == 4 ? v[3][2] : 0);
    free(m); free(m6); free(s4); free(s6); free(w4); free(w6);
}

int main(void) {
    strcpy(g_dir, "/tmp/test_pt_XXXXXX");
    if (!mkdtemp(g_dir)) die("mkdtemp: %s", strerror(errno));
    part_fixtures();
    part_variants();
    part_bad();
    if (access(yolo_bin(), X_OK) == 0) part_cli();   // make test builds ./yolo first; make fuzz-asan may not have
    else printf("SKIP  part 4 (./yolo info/export/val/train with a .pt): ./yolo is not built\n");
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (t_failed == 0 && system(cmd) != 0) printf("note: could not remove %s\n", g_dir);
    return test_summary();
}
