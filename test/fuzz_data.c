// fuzz_data.c: fuzz targets for the label-line parser and the data.yaml reader (the data section of yolo.c).
//
// Standalone (CI, AddressSanitizer + UBSan), a few thousand deterministic mutations of seeds:
//   gcc -std=c11 -O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer -fopenmp
//       -o test/bin/fuzz_data test/fuzz_data.c -ljpeg -lpng -lyaml -lm && ./test/bin/fuzz_data [iterations]
// libFuzzer (one target per binary, picked with -DFUZZ_YAML or the default label target):
//   clang -std=c11 -O1 -g -fsanitize=fuzzer,address,undefined -DFUZZ_ENGINE [-DFUZZ_YAML]
//       -o test/bin/fuzz_label test/fuzz_data.c -ljpeg -lpng -lyaml -lm && ./test/bin/fuzz_label
// A third target, -DFUZZ_IMAGE, feeds the input to the JPEG and PNG decoders.
// Each input must be handled without a crash, and the parser's outputs must obey the rules
// (abort() otherwise, so the sanitizer/fuzzer reports it).
#ifndef TESTING
#define TESTING
#endif
#include "../yolo.c"
#include "test.h"

// fuzz_label_one: every line of the input through label_line_parse; accepted boxes must be
// finite, class in [0, nc), coordinates within the tolerances.
static int fuzz_label_one(const uint8_t *data, size_t size) {
    char *buf = xmalloc(size + 1);
    memcpy(buf, data, size);
    buf[size] = 0;
    char *save = NULL;
    for (char *line = strtok_r(buf, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        float v[5];
        char err[200];
        int rc = label_line_parse(line, 80, v, err, sizeof err);
        if (rc < -1 || rc > 1) abort();
        if (rc == 1) {
            if (!(v[0] >= 0 && v[0] < 80 && v[0] == floorf(v[0]))) abort();
            for (int i = 1; i < 5; i++)
                if (!isfinite(v[i]) || v[i] < -1.03f || v[i] > 1.03f) abort();
        }
        if (rc == -1 && !err[0]) abort();
    }
    free(buf);
    return 0;
}

// fuzz_yaml_one: the input as a data.yaml; on success every field must be consistent.
static int fuzz_yaml_one(const uint8_t *data, size_t size) {
    FILE *f = fmemopen((void *)data, size ? size : 1, "rb");
    if (!f) return 0;
    if (size == 0) { fclose(f); f = fmemopen((void *)"", 1, "rb"); if (!f) return 0; }
    DataConfig cfg;
    char err[512] = "";
    int rc = data_yaml_read(f, "/fuzz/data.yaml", &cfg, err, sizeof err);
    if (rc == 0) {
        if (cfg.nc < 1 || !cfg.names || !cfg.root || cfg.nsplit[0] < 1 || cfg.nsplit[1] < 1) abort();
        for (int i = 0; i < cfg.nc; i++) if (!cfg.names[i]) abort();
        for (int s = 0; s < 3; s++) for (int i = 0; i < cfg.nsplit[s]; i++) if (!cfg.split[s][i]) abort();
        data_config_free(&cfg);
    } else if (!strstr(err, "/fuzz/data.yaml")) abort();
    return 0;
}

// fuzz_image_one: the input as an image file through the JPEG/PNG decoders (full decode with
// and without DCT scaling, and the probe); a success must give a sane size.
static Image fuzz_img;
static int fuzz_image_one(const uint8_t *data, size_t size) {
    for (int mode = 0; mode < 3; mode++) {
        FILE *f = fmemopen((void *)data, size ? size : 1, "rb");
        if (!f) return 0;
        char err[512];
        int kind = size ? file_magic(f) : -1, rc = -1;
        if (kind == 1) rc = jpeg_decode(f, "/fuzz/x.jpg", mode == 1 ? 16 : 0, &fuzz_img, mode == 2, err, sizeof err);
        if (kind == 2) rc = png_decode(f, "/fuzz/x.png", &fuzz_img, mode == 2, err, sizeof err);
        fclose(f);
        if (rc == 0 && !image_dims_ok(fuzz_img.w, fuzz_img.h)) abort();
        if (rc == 0 && mode < 2 && (size_t)fuzz_img.w * fuzz_img.h * 3 > fuzz_img.cap) abort();
    }
    return 0;
}

#ifdef FUZZ_ENGINE
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
#if defined(FUZZ_YAML)
    return fuzz_yaml_one(data, size);
#elif defined(FUZZ_IMAGE)
    return fuzz_image_one(data, size);
#else
    return fuzz_label_one(data, size);
#endif
}
#else
static const char *const LABEL_SEEDS[] = {
    "0 0.5 0.5 0.2 0.1\n1 0.1 0.2 0.3 0.4\r\n",
    "3 0.1 0.1 0.3 0.1 0.3 0.4 0.1 0.4\n",
    "0 nan inf -0.01 1.01\n79 1e308 -1e-308 0x1p3 .5\n",
    "  \t \n\n0 0.5 0.5 0.2\n0 0.5 0.5 0.2 0.1 0.1\n",
};
static const char *const YAML_SEEDS[] = {
    "# c\npath: ../ds  # root\ntrain: [a, 'b', \"c\"]\nval: v\ntest:\nnames:\n  0: x\n  1: 'y'\nnc: 2\n",
    "train: images/train\nval: images/val\nnames: [\"circle\", 'rectangle', triangle]\n",
    "train: &t a\nval: *t\nnames: {0: a, 1: b}\ndownload: |\n  some script\n",
    "train:\n  - a\n  - b\nval: [c]\nnames: !!seq [x]\nnc: 1\n",
};
static const char *const TOKENS[] = {
        "\n",  "\r\n",        " ",     "\t",    ":",   "- ", "[",      "]",   "{",  "}",
        ",",   "'",           "\"",    "#",     "&a ", "*a", "!!str ", "nan", "-0", "1e999",
        "0.5", "99999999999", "names", "train", "val", "nc", "0:",     "\\",  "\0", "%YAML 1.1\n---\n"};

// mutate: a few random edits of seed into out (byte flips, token inserts, deletions, splices).
static size_t mutate(Rng *r, const char *seed, const char *other, uint8_t *out, size_t cap) {
    size_t n = strlen(seed);
    memcpy(out, seed, n);
    int edits = 1 + rng_int(r, 8);
    for (int e = 0; e < edits; e++) {
        int kind = rng_int(r, 5);
        size_t pos = n ? (size_t)rng_int(r, (int)n + 1) : 0;
        if (kind == 0 && n) out[pos < n ? pos : n - 1] ^= (uint8_t)(1 << rng_int(r, 8));
        else if (kind == 1 || (kind == 0 && !n)) {
            const char *t = TOKENS[rng_int(r, (int)(sizeof TOKENS / sizeof TOKENS[0]))];
            size_t tl = t[0] ? strlen(t) : 1;
            if (n + tl >= cap) continue;
            memmove(out + pos + tl, out + pos, n - pos);
            memcpy(out + pos, t, tl);
            n += tl;
        } else if (kind == 2 && n) {
            size_t len = 1 + (size_t)rng_int(r, 8);
            if (pos + len > n) len = n - pos;
            memmove(out + pos, out + pos + len, n - pos - len);
            n -= len;
        } else if (kind == 3) {
            size_t ol = strlen(other), a = (size_t)rng_int(r, (int)ol + 1), len = (size_t)rng_int(r, 24);
            if (a + len > ol) len = ol - a;
            if (n + len >= cap) continue;
            memmove(out + pos + len, out + pos, n - pos);
            memcpy(out + pos, other + a, len);
            n += len;
        } else if (n) out[pos < n ? pos : n - 1] = (uint8_t)rng_int(r, 256);
    }
    return n;
}

int main(int argc, char **argv) {
    int iters = argc > 1 ? atoi(argv[1]) : 3000;
    Rng r;
    rng_seed(&r, 12345);
    uint8_t buf[4096];
    double t0 = now_sec();
    int nl = (int)(sizeof LABEL_SEEDS / sizeof LABEL_SEEDS[0]), ny = (int)(sizeof YAML_SEEDS / sizeof YAML_SEEDS[0]);
    for (int i = 0; i < nl; i++) fuzz_label_one((const uint8_t *)LABEL_SEEDS[i], strlen(LABEL_SEEDS[i]));
    for (int i = 0; i < ny; i++) fuzz_yaml_one((const uint8_t *)YAML_SEEDS[i], strlen(YAML_SEEDS[i]));
    for (int it = 0; it < iters; it++) {
        size_t n = mutate(&r, LABEL_SEEDS[rng_int(&r, nl)], LABEL_SEEDS[rng_int(&r, nl)], buf, sizeof buf);
        fuzz_label_one(buf, n);
        n = mutate(&r, YAML_SEEDS[rng_int(&r, ny)], YAML_SEEDS[rng_int(&r, ny)], buf, sizeof buf);
        fuzz_yaml_one(buf, n);
    }
    int yaml_ok = 0;
    for (int i = 0; i < ny; i++) {
        DataConfig cfg;
        char err[512];
        FILE *f = fmemopen((void *)YAML_SEEDS[i], strlen(YAML_SEEDS[i]), "rb");
        if (data_yaml_read(f, "/fuzz/data.yaml", &cfg, err, sizeof err) == 0) { yaml_ok++; data_config_free(&cfg); }
        else printf("  seed %d: %s\n", i, err);
    }
    check(yaml_ok == ny, "all %d yaml seeds parse (so mutations start from valid files): %d", ny, yaml_ok);
    // images: byte mutations of a small JPEG (with EXIF) and a PNG, through both decoders
    char dir[64] = "/tmp/fuzz_data_XXXXXX", path[128];
    if (!mkdtemp(dir)) die("mkdtemp failed");
    Image im = image_alloc(24, 17);
    for (size_t i = 0; i < (size_t)24 * 17 * 3; i++) im.px[i] = (uint8_t)(i * 37);
    uint8_t *seeds[2];
    size_t seedn[2];
    for (int k = 0; k < 2; k++) {
        snprintf(path, sizeof path, "%s/seed.%s", dir, k ? "png" : "jpg");
        if ((k ? image_save_png(path, &im) : image_save_jpg(path, &im, 80)) != 0) die("cannot write %s", path);
        FILE *f = xfopen(path, "rb");
        fseek(f, 0, SEEK_END);
        seedn[k] = (size_t)ftell(f);
        rewind(f);
        seeds[k] = xmalloc(seedn[k]);
        if (fread(seeds[k], 1, seedn[k], f) != seedn[k]) die("short read %s", path);
        fclose(f);
        remove(path);
    }
    rmdir(dir);
    int nimg = iters / 4;
    for (int it = 0; it < nimg; it++) {
        int k = it & 1;
        size_t n = seedn[k];
        uint8_t *m = xmalloc(n + 64);
        memcpy(m, seeds[k], n);
        int edits = 1 + rng_int(&r, 4);
        for (int e = 0; e < edits; e++) {
            int kind = rng_int(&r, 4);
            size_t pos = (size_t)rng_int(&r, (int)n);
            if (kind == 0) m[pos] ^= (uint8_t)(1 << rng_int(&r, 8));
            else if (kind == 1) m[pos] = (uint8_t)rng_int(&r, 256);
            else if (kind == 2) n = pos > 8 ? pos : n;              // truncate
            else if (pos + 4 < n) memset(m + pos, 0xFF, 4);          // marker-like bytes
        }
        fuzz_image_one(m, n);
        free(m);
    }
    free(seeds[0]); free(seeds[1]);
    image_free(&im);
    image_free(&fuzz_img);
    check(1, "%d mutated JPEG/PNG files decoded (3 ways each) without a crash", nimg);
    check(1, "%d label and %d yaml mutations ran without a crash or a broken invariant (%.1f s)", iters, iters,
          now_sec() - t0);
    return test_summary();
}
#endif
