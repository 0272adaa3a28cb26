// test_data.c: the data pipeline (the data section of yolo.c): letterbox and rect numbers (LetterBox, set_rectangle),
// label/yaml parsing, decoding of odd PNG/JPEG inputs, a corpus of bad inputs with exact
// per-split counts, label/pixel alignment through every transform, the box filter rules,
// worker-count independence and the label cap.
#define TESTING
#include "../yolo.c"
#include "test.h"
#include <unistd.h>
#include <fcntl.h>

static char tmpdir[256];

static void write_text(const char *path, const char *text) {
    FILE *f = xfopen(path, "wb");
    fputs(text, f);
    fclose(f);
}
static void mkdirs(const char *rel) {
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", tmpdir, rel);
    for (char *s = p + strlen(tmpdir) + 1; *s; s++)
        if (*s == '/') { *s = 0; mkdir(p, 0755); *s = '/'; }
    mkdir(p, 0755);
}
static char *tp(const char *rel) { // path under tmpdir (rotating static buffers)
    static char buf[8][1024];
    static int k;
    k = (k + 1) % 8;
    snprintf(buf[k], sizeof buf[k], "%s/%s", tmpdir, rel);
    return buf[k];
}
static uint8_t *read_all(const char *path, size_t *n) {
    FILE *f = xfopen(path, "rb");
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    rewind(f);
    uint8_t *d = xmalloc(*n);
    if (fread(d, 1, *n, f) != *n) die("short read %s", path);
    fclose(f);
    return d;
}
static void write_bytes(const char *path, const uint8_t *d, size_t n) {
    FILE *f = xfopen(path, "wb");
    fwrite(d, 1, n, f);
    fclose(f);
}
static uint32_t crc32_png(const uint8_t *d, size_t n) {
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        c ^= d[i];
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1)));
    }
    return c ^ 0xFFFFFFFFu;
}
static void be32(uint8_t *p, uint32_t v) { p[0] = v >> 24; p[1] = v >> 16; p[2] = v >> 8; p[3] = v; }

// write_png_raw: a PNG of any libpng colour type/bit depth from packed rows.
static void write_png_raw(const char *path, int w, int h, int depth, int ctype, const uint8_t *data, size_t rowbytes,
                          const png_color *pal, int npal, const uint8_t *trns, int ntrns) {
    FILE *f = xfopen(path, "wb");
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
    png_infop info = png_create_info_struct(png);
    if (setjmp(png_jmpbuf(png))) die("png write failed");
    png_init_io(png, f);
    png_set_IHDR(png, info, w, h, depth, ctype, PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
                 PNG_FILTER_TYPE_DEFAULT);
    if (pal) png_set_PLTE(png, info, pal, npal);
    if (trns) png_set_tRNS(png, info, trns, ntrns, NULL);
    png_write_info(png, info);
    for (int y = 0; y < h; y++) png_write_row(png, (png_bytep)(data + y * rowbytes));
    png_write_end(png, NULL);
    png_destroy_write_struct(&png, &info);
    fclose(f);
}

// stderr capture, to check that messages name each bad file
static int cap_saved;
static char cap_path[300];
static void capture_begin(void) {
    fflush(stderr);
    snprintf(cap_path, sizeof cap_path, "%s/stderr.txt", tmpdir);
    int fd = open(cap_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    cap_saved = dup(2);
    dup2(fd, 2);
    close(fd);
}
static char *capture_end(void) {
    fflush(stderr);
    dup2(cap_saved, 2);
    close(cap_saved);
    size_t n;
    uint8_t *d = read_all(cap_path, &n);
    char *s = xmalloc(n + 1);
    memcpy(s, d, n);
    s[n] = 0;
    free(d);
    return s;
}

// ---------------------------------------------------------------------------------------
static void test_letterbox_rect(void) {
    struct { int w, h, S, up, nw, nh, left, top; } c[] = {
        {640, 480, 640, 1, 640, 480, 0, 80},   // dh = 160: top round(79.9) = 80
        {500, 375, 640, 1, 640, 480, 0, 80},   // enlarged by 1.28
        {100, 33, 160, 1, 160, 53, 0, 53},     // nh = round(52.8) = 53, dh/2 = 53.5 -> top 53 (bottom 54)
        {100, 33, 160, 0, 100, 33, 30, 63},    // scaleup=False: r = 1; dh/2 = 63.5 -> top 63
        {641, 480, 640, 1, 640, 479, 0, 80},   // nh = round(479.25); dh/2 = 80.5 -> 80 (bottom 81)
        {33, 100, 160, 0, 33, 100, 63, 30},
        {1280, 720, 640, 0, 640, 360, 0, 140},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        Letterbox lb;
        letterbox_params(c[i].w, c[i].h, c[i].S, c[i].S, c[i].up, &lb);
        int bottom = c[i].S - lb.nh - lb.top, right = c[i].S - lb.nw - lb.left;
        check(lb.nw == c[i].nw && lb.nh == c[i].nh && lb.left == c[i].left && lb.top == c[i].top,
              "letterbox %dx%d -> %d scaleup=%d: new %dx%d pad left %d top %d (right %d bottom %d); want %dx%d left %d "
              "top %d (exact)",
              c[i].w, c[i].h, c[i].S, c[i].up, lb.nw, lb.nh, lb.left, lb.top, right, bottom, c[i].nw, c[i].nh,
              c[i].left, c[i].top);
    }
    double sq[1] = {1.0};
    int hw[1][2];
    rect_batch_shapes(sq, 1, 1, 640, hw);
    check(hw[0][0] == 672 && hw[0][1] == 672, "rect shape of a square image at 640: %dx%d want 672x672", hw[0][0],
          hw[0][1]);
    rect_batch_shapes(sq, 1, 1, 160, hw);
    check(hw[0][0] == 192 && hw[0][1] == 192, "rect shape of a square image at 160: %dx%d want 192x192", hw[0][0],
          hw[0][1]);
    double ar[4] = {0.5, 0.75, 1.5, 2.0};
    int hw2[2][2];
    rect_batch_shapes(
            ar, 4, 2, 640,
            hw2);   // batch 0 wide (maxi .75): h ceil(15.5)=16*32; batch 1 tall (mini 1.5): w ceil(13.83)=14*32
    check(hw2[0][0] == 512 && hw2[0][1] == 672 && hw2[1][0] == 672 && hw2[1][1] == 448,
          "rect shapes (h,w) for ar {.5,.75 | 1.5,2} at 640: (%d,%d) (%d,%d) want (512,672) (672,448)", hw2[0][0],
          hw2[0][1], hw2[1][0], hw2[1][1]);
    int w, h;
    resized_size(1000, 333, 160, &w, &h);
    check(w == 160 && h == 54, "load size of 1000x333 at 160: %dx%d want 160x54 (ceil(53.28))", w, h);
    resized_size(50, 20, 160, &w, &h);
    check(w == 160 && h == 64, "load size of 50x20 at 160 (enlarged): %dx%d want 160x64", w, h);
}

static void test_label_parse(void) {
    struct { const char *line; int nc, rc; float v[5]; } c[] = {
        {"0 0.5 0.5 0.2 0.1\n", 3, 1, {0, .5f, .5f, .2f, .1f}},
        {"2 0.5 0.5 0.2 0.1\r\n", 3, 1, {2, .5f, .5f, .2f, .1f}},
        {"  \t\r\n", 3, 0, {0}},
        {"1 0.1 0.2 0.5 0.2 0.3 0.6\n", 3, 1, {1, .3f, .4f, .4f, .4f}}, // polygon: x 0.1..0.5, y 0.2..0.6
        {"0 1.01 0.5 -0.01 0.1", 3, 1, {0, 1.01f, .5f, -.01f, .1f}},    // edges of the tolerance
        {"0 0.5 0.5 0.2", 3, -1, {0}},
        {"0 0.5 0.5 0.2 0.1 0.3", 3, -1, {0}},
        {"0 nan 0.5 0.2 0.1", 3, -1, {0}},
        {"0 0.5 inf 0.2 0.1", 3, -1, {0}},
        {"0 -0.5 0.5 0.2 0.1", 3, -1, {0}},
        {"0 0.5 1.2 0.2 0.1", 3, -1, {0}},
        {"3 0.5 0.5 0.2 0.1", 3, -1, {0}},
        {"a 0.5 0.5 0.2 0.1", 3, -1, {0}},
        {"0 0.5x 0.5 0.2 0.1", 3, -1, {0}},
        {"1 0.1 0.2 0.5 0.2 0.3", 3, -1, {0}}, // 6 columns
        {"1 0.1 0.2 0.5 0.2 0.3 0.6 0.7", 3, -1, {0}}, // odd polygon coordinate count
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        float out[5] = {0};
        char err[200] = "";
        int rc = label_line_parse(c[i].line, c[i].nc, out, err, sizeof err);
        double worst = 0;
        if (rc == 1) for (int k = 0; k < 5; k++) worst = fmax(worst, fabs(out[k] - c[i].v[k]));
        char shown[64];
        snprintf(shown, sizeof shown, "%s", c[i].line);
        for (char *s = shown; *s; s++) if (*s == '\n' || *s == '\r' || *s == '\t') *s = '~';
        check(rc == c[i].rc && worst <= 1e-6, "label line '%s' -> rc %d want %d, max |value diff| %.2g tol 1e-6 %s%s",
              shown, rc, c[i].rc, worst, err[0] ? "msg: " : "", err);
    }
    char lp[256];
    label_path_from_image("/d/images/x/images/a.b.jpg", lp, sizeof lp);
    check(strcmp(lp, "/d/images/x/labels/a.b.txt") == 0, "label path of /d/images/x/images/a.b.jpg: %s", lp);
    label_path_from_image("/d/pics/a.png", lp, sizeof lp);
    check(strcmp(lp, "/d/pics/a.txt") == 0, "label path without /images/: %s", lp);
}

static void test_yaml(void) {
    DataConfig cfg;
    char err[512];
    write_text(tp("a.yaml"),
               "# comment\npath: ds   # root\ntrain: [images/t1, \"images/t2\"]\nval: 'images/v'\nnames:\n  0: cat\n  "
               "2: 'dog'\n  1: \"bird #1\"\n");
    int rc = data_yaml_load(tp("a.yaml"), &cfg, err, sizeof err);
    check(rc == 0 && cfg.nc == 3 && strcmp(cfg.names[1], "bird #1") == 0 && strcmp(cfg.names[2], "dog") == 0 &&
                  cfg.nsplit[0] == 2 && strcmp(cfg.split[0][1], tp("ds/images/t2")) == 0 && cfg.nsplit[2] == 0,
          "yaml with mapping names, flow list, quotes, comments: rc %d nc %d (%s)", rc, cfg.nc,
          rc ? err : cfg.split[0][1]);
    if (rc == 0) data_config_free(&cfg);
    struct { const char *text, *want; } bad[] = {
        {"train: a\nval: b\nnames: [x, y\nnc: 2\n", ".yaml:4"},         // unclosed flow list: error at line 4
        {"train: a\nval: b\nnames: [x, y]\nnc: 3\n", "nc=3 but names has 2"},
        {"train: a\nnames: [x]\n", "'train' and 'val' are required"},
        {"train: a\nval: b\nnames: {0: x, 5: y}\n", ".yaml:3"},
        {"train: {a: 1}\nval: b\nnames: [x]\n", ".yaml:1"},
        {"- just\n- a list\n", "expected a mapping"},
        {"", "expected a mapping"},
        {"train: a\nval: b\nnames: x\n", "'names' must be a list"},
        {"\ttrain: a\n", "yaml error"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_text(tp("bad.yaml"), bad[i].text);
        err[0] = 0;
        rc = data_yaml_load(tp("bad.yaml"), &cfg, err, sizeof err);
        check(rc == -1 && strstr(err, "bad.yaml") && strstr(err, bad[i].want),
              "malformed yaml %zu rejected naming file/line: '%s' (want '%s')", i, err, bad[i].want);
    }
    rc = data_yaml_load(tp("missing.yaml"), &cfg, err, sizeof err);
    check(rc == -1 && strstr(err, "missing.yaml"), "missing yaml: '%s'", err);
}

// solid test image: gray background with rectangles of colour per class
static const uint8_t TCOL[3][3] = {{230, 30, 30}, {30, 210, 30}, {30, 30, 230}};
// pix_has: does pixel p show colour c (alone, or blended by mixup/HSV)? Channel c stands out
// from the weakest channel by more than 30 (gray background: 0; HSV's worst case S*0.3, V*0.6: 36).
static int pix_has(const uint8_t *p, int c) {
    int mn = p[0] < p[1] ? p[0] : p[1];
    mn = mn < p[2] ? mn : p[2];
    return p[c] - mn > 30;
}

// write_jpg_exif: a JPEG with an EXIF APP1 marker carrying Orientation = orient (big-endian TIFF).
static void write_jpg_exif(const char *path, const Image *img, int orient) {
    FILE *f = xfopen(path, "wb");
    struct jpeg_compress_struct c;
    struct jpeg_error_mgr jerr;
    c.err = jpeg_std_error(&jerr);
    jpeg_create_compress(&c);
    jpeg_stdio_dest(&c, f);
    c.image_width = img->w; c.image_height = img->h; c.input_components = 3; c.in_color_space = JCS_RGB;
    jpeg_set_defaults(&c);
    jpeg_set_quality(&c, 95, TRUE);
    jpeg_start_compress(&c, TRUE);
    uint8_t ex[6 + 8 + 2 + 12 + 4] = {'E', 'x', 'i', 'f', 0, 0, 'M', 'M', 0, 42, 0, 0, 0, 8, 0, 1,
                                      0x01, 0x12, 0, 3, 0, 0, 0, 1, 0, (uint8_t)orient, 0, 0, 0, 0, 0, 0};
    jpeg_write_marker(&c, JPEG_APP0 + 1, ex, sizeof ex);
    while (c.next_scanline < c.image_height) {
        JSAMPROW row = img->px + (size_t)c.next_scanline * img->w * 3;
        jpeg_write_scanlines(&c, &row, 1);
    }
    jpeg_finish_compress(&c);
    jpeg_destroy_compress(&c);
    fclose(f);
}

static void test_decode(void) {
    // 16-bit gray, palette with transparency, gray+alpha: all become 8-bit RGB
    uint8_t g16[12 * 12 * 2];
    for (int i = 0; i < 144; i++) { g16[2 * i] = (uint8_t)(i + 50); g16[2 * i + 1] = 0x80; }
    write_png_raw(tp("g16.png"), 12, 12, 16, PNG_COLOR_TYPE_GRAY, g16, 24, NULL, 0, NULL, 0);
    Image im = {0};
    char err[512];
    int rc = image_load(tp("g16.png"), 0, &im, err, sizeof err), worst = 0;
    for (int i = 0; rc == 0 && i < 144; i++)
        for (int c = 0; c < 3; c++) worst = fmax(worst, abs(im.px[3 * i + c] - (i + 50)));
    check(rc == 0 && im.w == 12 && worst == 0, "16-bit gray PNG -> RGB high byte: rc %d, worst diff %d (tol 0)", rc,
          worst);
    png_color pal[2] = {{10, 20, 30}, {200, 100, 50}};
    uint8_t trns[2] = {0, 255}, pix[12 * 12];
    for (int i = 0; i < 144; i++) pix[i] = (uint8_t)(i & 1);
    write_png_raw(tp("pal.png"), 12, 12, 8, PNG_COLOR_TYPE_PALETTE, pix, 12, pal, 2, trns, 2);
    rc = image_load(tp("pal.png"), 0, &im, err, sizeof err);
    worst = 0;
    for (int i = 0; rc == 0 && i < 144; i++) {
        const png_color *p = &pal[i & 1];
        worst = fmax(worst,
                     abs(im.px[3 * i] - p->red) + abs(im.px[3 * i + 1] - p->green) + abs(im.px[3 * i + 2] - p->blue));
    }
    check(rc == 0 && worst == 0, "palette PNG with tRNS -> RGB (alpha dropped): rc %d worst diff %d (tol 0)", rc,
          worst);
    uint8_t ga[12 * 12 * 2];
    for (int i = 0; i < 144; i++) { ga[2 * i] = 77; ga[2 * i + 1] = (uint8_t)i; }
    write_png_raw(tp("ga.png"), 12, 12, 8, PNG_COLOR_TYPE_GRAY_ALPHA, ga, 24, NULL, 0, NULL, 0);
    rc = image_load(tp("ga.png"), 0, &im, err, sizeof err);
    check(rc == 0 && im.px[0] == 77 && im.px[3 * 143 + 2] == 77, "gray+alpha PNG -> RGB 77: rc %d got %d", rc,
          im.px[0]);
    // JPEG: save/load round trip, DCT scaling sizes, and scaled decode close to a full decode
    Image big = image_alloc(1280, 640);
    for (int y = 0; y < 640; y++)
        for (int x = 0; x < 1280; x++) {
            uint8_t *p = big.px + ((size_t)y * 1280 + x) * 3;
            p[0] = (uint8_t)(x / 5); p[1] = (uint8_t)(y / 3); p[2] = (uint8_t)(((x / 64) + (y / 64)) % 2 ? 200 : 40);
        }
    image_save_jpg(tp("big.jpg"), &big, 95);
    rc = image_load(tp("big.jpg"), 0, &im, err, sizeof err);
    double mad = 0;
    for (size_t i = 0; rc == 0 && i < (size_t)1280 * 640 * 3; i++) mad += abs(im.px[i] - big.px[i]);
    mad /= 1280.0 * 640 * 3;
    check(rc == 0 && im.w == 1280 && mad < 2.0, "JPEG q95 round trip 1280x640: mean |diff| %.3f tol 2", mad);
    int targets[3] = {320, 500, 700}, wantw[3] = {320, 640, 1280};
    for (int t = 0; t < 3; t++) {
        rc = image_load(tp("big.jpg"), targets[t], &im, err, sizeof err);
        check(rc == 0 && im.w == wantw[t] && im.h == wantw[t] / 2,
              "JPEG DCT-scaled decode for target %d: %dx%d want %dx%d", targets[t], im.w, im.h, wantw[t], wantw[t] / 2);
    }
    rc = image_load(tp("big.jpg"), 320, &im, err, sizeof err);
    uint8_t *a = xmalloc(320 * 160 * 3), *b = xmalloc(320 * 160 * 3);
    image_resize(im.px, im.w, im.h, a, 320, 160);
    image_resize(big.px, 1280, 640, b, 320, 160);
    mad = 0;
    for (int i = 0; i < 320 * 160 * 3; i++) mad += abs(a[i] - b[i]);
    mad /= 320 * 160 * 3;
    check(mad < 4.0,
          "DCT 1/4 decode + resize vs full-size source resized to 320x160: mean |diff| %.3f tol 4 (different filters)",
          mad);
    free(a); free(b);
    // EXIF orientation 6 (rotate 90 clockwise): a 40x20 image red on its left half decodes as
    // 20x40 red on its top half, and the probe reports 20x40
    Image ex = image_alloc(40, 20);
    memset(ex.px, 200, 40 * 20 * 3);
    image_fill_rect(&ex, 0, 0, 20, 20, 230, 20, 20);
    write_jpg_exif(tp("exif6.jpg"), &ex, 6);
    int pw = 0, ph = 0, prc = image_probe(tp("exif6.jpg"), &pw, &ph, err, sizeof err);
    rc = image_load(tp("exif6.jpg"), 0, &im, err, sizeof err);
    int top_red =
            rc == 0 && im.w == 20 && im.h == 40 && im.px[(5 * 20 + 10) * 3] > 180 && im.px[(5 * 20 + 10) * 3 + 1] < 80;
    int bottom_gray = rc == 0 && im.w == 20 && im.px[(35 * 20 + 10) * 3 + 1] > 150;
    check(prc == 0 && pw == 20 && ph == 40 && top_red && bottom_gray,
          "EXIF orientation 6: probe %dx%d, decoded %dx%d, top red %d, bottom gray %d (want 20x40)", pw, ph, im.w, im.h,
          top_red, bottom_gray);
    write_jpg_exif(tp("exif3.jpg"), &ex, 3); // rotate 180: red moves to the right half
    rc = image_load(tp("exif3.jpg"), 0, &im, err, sizeof err);
    check(rc == 0 && im.w == 40 && im.px[(10 * 40 + 35) * 3] > 180 && im.px[(10 * 40 + 5) * 3 + 1] > 150,
          "EXIF orientation 3: red on the right half");
    image_free(&ex);
    // drawing helpers
    Image d = image_alloc(40, 30);
    image_draw_box(&d, 5, 6, 20, 16, 255, 0, 0, 2);
    int on = d.px[(6 * 40 + 10) * 3] == 255 && d.px[(7 * 40 + 10) * 3] == 255 && d.px[(16 * 40 + 20) * 3] == 255 &&
            d.px[(15 * 40 + 19) * 3] == 255;
    int off = d.px[(8 * 40 + 10) * 3] == 0 && d.px[(5 * 40 + 10) * 3] == 0 && d.px[(16 * 40 + 21) * 3] == 0;
    check(on && !!off, "image_draw_box: outline pixels set (%d), interior/outside untouched (%d)", on, off);
    image_draw_box(&d, -10, -10, 100, 100, 0, 255, 0, 3); // clipped, no crash
    Image t = image_alloc(60, 10);
    image_draw_text(&t, 1, 1, "Ab1", 255, 255, 255, 1);
    int lit = 0, outside = 0;
    for (int y = 0; y < 10; y++) for (int x = 0; x < 60; x++) {
        int v = t.px[(y * 60 + x) * 3];
        if (v) { lit++; if (x >= 1 + 18 || y >= 8) outside++; }
    }
    check(lit > 20 && outside == 0, "image_draw_text 'Ab1': %d lit pixels, %d outside its 18x7 cell", lit, outside);
    image_draw_text(&t, 55, 5, "clip~", 255, 0, 0, 3);
    image_free(&d); image_free(&t); image_free(&big); image_free(&im);
}

// make_jpg / make_png: a w x h test image with one coloured rectangle.
static void make_img(const char *path, int w, int h, int png) {
    Image im = image_alloc(w, h);
    memset(im.px, 120, (size_t)w * h * 3);
    image_fill_rect(&im, w / 4, h / 4, w / 2, h / 2, 230, 30, 30);
    if (png) image_save_png(path, &im); else image_save_jpg(path, &im, 90);
    image_free(&im);
}

static void test_bad_corpus(void) {
    mkdirs("bad/images/train");
    mkdirs("bad/labels/train");
    mkdirs("bad/extra/pics");   // a second source with no labels directory at all
    mkdirs("bad/images/val");
    const char *good = "0 0.375 0.375 0.25 0.25\n";
    // kept, with boxes
    make_img(tp("bad/images/train/ok1.jpg"), 40, 30, 0); write_text(tp("bad/labels/train/ok1.txt"), good);
    make_img(tp("bad/images/train/ok2.png"), 30, 40, 1);
    write_text(tp("bad/labels/train/ok2.txt"), "0 0.375 0.375 0.25 0.25\r\n1 0.5 0.5 0.2 0.2\r\n");
    make_img(tp("bad/images/train/poly.jpg"), 40, 40, 0);
    write_text(tp("bad/labels/train/poly.txt"), "2 0.1 0.1 0.3 0.1 0.3 0.4 0.1 0.4\n");
    make_img(tp("bad/images/train/dup.jpg"), 40, 40, 0);
    write_text(tp("bad/labels/train/dup.txt"), "0 0.5 0.5 0.2 0.2\n0 0.5 0.5 0.2 0.2\n\n1 0.5 0.5 0.1 0.1\n");
    make_img(tp("bad/images/train/pngdata.jpg"), 40, 40, 1);
    write_text(tp("bad/labels/train/pngdata.txt"), good);   // wrong extension, PNG content
    // backgrounds: empty label, missing label, no labels dir
    make_img(tp("bad/images/train/bg_empty.jpg"), 40, 40, 0); write_text(tp("bad/labels/train/bg_empty.txt"), "");
    make_img(tp("bad/images/train/bg_missing.jpg"), 40, 40, 0);
    make_img(tp("bad/extra/pics/nolabels.png"), 40, 40, 1);
    // truncated in the scan data (header complete): kept with a warning, like Ultralytics' restore
    size_t n;
    uint8_t *j = read_all(tp("bad/images/train/ok1.jpg"), &n);
    write_bytes(tp("bad/images/train/trunc_tail.jpg"), j, n - 40);
    write_text(tp("bad/labels/train/trunc_tail.txt"), good);
    // corrupt images
    write_bytes(tp("bad/images/train/trunc_head.jpg"), j, 60); write_text(tp("bad/labels/train/trunc_head.txt"), good);
    write_text(tp("bad/images/train/zero.jpg"), "");
    write_text(tp("bad/images/train/zero.png"), "");
    write_text(tp("bad/images/train/text.jpg"), "this is not an image\n");
    uint8_t *p = read_all(tp("bad/images/train/ok2.png"), &n);
    write_bytes(tp("bad/images/train/trunc.png"), p, n / 2);
    make_img(tp("bad/images/train/tiny.png"), 9, 30, 1);
    uint8_t hp[8 + 25 + 12 + 12];
    memcpy(hp, "\x89PNG\r\n\x1a\n", 8);
    be32(hp + 8, 13); memcpy(hp + 12, "IHDR", 4); be32(hp + 16, 100000); be32(hp + 20, 100000);
    hp[24] = 8; hp[25] = 2; hp[26] = hp[27] = hp[28] = 0;
    be32(hp + 29, crc32_png(hp + 12, 17));
    be32(hp + 33, 0); memcpy(hp + 37, "IDAT", 4); be32(hp + 41, crc32_png(hp + 37, 4));
    be32(hp + 45, 0); memcpy(hp + 49, "IEND", 4); be32(hp + 53, crc32_png(hp + 49, 4));
    write_bytes(tp("bad/images/train/huge.png"), hp, sizeof hp);
    size_t sof = 0;
    for (size_t i = 0; i + 9 < n && !sof; i++) if (j[i] == 0xFF && j[i + 1] == 0xC0) sof = i;
    j = realloc(j, 4096);
    size_t nj;
    free(j);
    j = read_all(tp("bad/images/train/ok1.jpg"), &nj);
    sof = 0;
    for (size_t i = 2; i + 9 < nj && !sof; i++) if (j[i] == 0xFF && j[i + 1] == 0xC0) sof = i;
    j[sof + 5] = 0xFD; j[sof + 6] = 0xE8; j[sof + 7] = 0xFD; j[sof + 8] = 0xE8; // 65000 x 65000
    write_bytes(tp("bad/images/train/huge.jpg"), j, nj);
    free(j); free(p);
    // corrupt labels (good images)
    const char *badlab[][2] = {{"nan", "0 nan 0.5 0.1 0.1\n"},     {"neg", "0 -0.5 0.5 0.1 0.1\n"},
                               {"over", "0 0.5 1.5 0.1 0.1\n"},    {"cls", "0 0.5 0.5 0.1 0.1\n3 0.5 0.5 0.1 0.1\n"},
                               {"cols4", "0 0.5 0.5 0.1\n"},       {"cols6", "0 0.5 0.5 0.1 0.1 0.1\n"},
                               {"words", "zero 0.5 0.5 0.1 0.1\n"}};
    for (int i = 0; i < 7; i++) {
        char a[128], b[128];
        snprintf(a, sizeof a, "bad/images/train/lab_%s.jpg", badlab[i][0]);
        snprintf(b, sizeof b, "bad/labels/train/lab_%s.txt", badlab[i][0]);
        make_img(tp(a), 40, 40, 0);
        write_text(tp(b), badlab[i][1]);
    }
    // not images: skipped by extension
    write_text(tp("bad/images/train/notes.txt"), "hello");
    write_text(tp("bad/images/train/anim.gif"), "GIF89a");
    write_text(tp("bad/data.yaml"), "path: .\ntrain: [images/train, extra/pics]\nval: images/val\nnames: [a, b, c]\n");
    DataConfig cfg;
    char err[512];
    int rc = data_yaml_load(tp("bad/data.yaml"), &cfg, err, sizeof err);
    check(rc == 0, "bad-corpus yaml loads: %s", rc ? err : "ok");
    if (rc) return;
    Dataset ds;
    capture_begin();
    rc = dataset_load(&cfg, 0, &ds);
    char *msg = capture_end();
    fputs(msg, stdout);
    // found 25 image-named files: ok1 ok2 poly dup pngdata bg_empty bg_missing nolabels trunc_tail (9 kept)
    // + trunc_head zero.jpg zero.png text trunc.png tiny huge.png huge.jpg + 7 bad labels (15 corrupt)
    DatasetStats *st = &ds.stats;
    check(rc == 0 && st->found == 24 && st->kept == 9 && st->backgrounds == 3 && st->missing == 2 &&
                  st->corrupt == 15 && st->skipped == 2 && st->duplicates == 1 && st->boxes == 8,
          "bad corpus counts: found %d kept %d backgrounds %d (missing %d) corrupt %d skipped %d duplicates %d boxes "
          "%d; "
          "want 24 9 3 (2) 15 2 1 8",
          st->found, st->kept, st->backgrounds, st->missing, st->corrupt, st->skipped, st->duplicates, st->boxes);
    const char *named[] = {"trunc_head.jpg", "zero.jpg",        "zero.png",        "text.jpg",
                           "trunc.png",      "tiny.png",        "huge.png",        "huge.jpg",
                           "trunc_tail.jpg", "lab_nan.txt:1",   "lab_neg.txt:1",   "lab_over.txt:1",
                           "lab_cls.txt:2",  "lab_cols4.txt:1", "lab_cols6.txt:1", "lab_words.txt:1"};
    int missing_msgs = 0;
    for (size_t i = 0; i < sizeof named / sizeof named[0]; i++)
        if (!strstr(msg, named[i])) { missing_msgs++; printf("  no message names %s\n", named[i]); }
    check(missing_msgs == 0, "a message names each of the %zu bad files (with line for labels): %d missing",
          sizeof named / sizeof named[0], missing_msgs);
    check(strstr(msg, "100000x100000") && strstr(msg, "65000x65000"), "huge declared sizes reported before allocating");
    // poly box: x 0.1..0.3, y 0.1..0.4
    int pi = -1;
    for (int i = 0; i < ds.n; i++) if (strstr(ds.paths[i], "poly.jpg")) pi = i;
    const float *pl = pi >= 0 ? ds.lab + 5 * ds.lab_off[pi] : NULL;
    check(pl && fabsf(pl[1] - 0.2f) < 1e-6 && fabsf(pl[2] - 0.25f) < 1e-6 && fabsf(pl[3] - 0.2f) < 1e-6 &&
                  fabsf(pl[4] - 0.3f) < 1e-6,
          "polygon label reduced to its box (0.2 0.25 0.2 0.3), tol 1e-6");
    free(msg);
    // loading every kept image through the loader (val) works, including the truncated JPEG
    LoaderConfig lc = {
            .batch = 4, .imgsz = 64, .workers = 2, .max_boxes = 8, .train = 0, .seed = 1, .aug = aug_defaults()};
    Loader *L = loader_open(&ds, &lc);
    loader_start_epoch(L, 0, 0);
    int nb = 0, nimg = 0, nlab = 0;
    for (const Batch *bt; (bt = loader_next(L)); nb++) { nimg += bt->B; nlab += bt->n; }
    check(nb == 3 && nimg == 9 && nlab == 8 && L->load_errors == 0,
          "val loader over the kept images: %d batches %d images %d labels %lld load errors; want 3 9 8 0", nb, nimg,
          nlab, L->load_errors);
    loader_close(L);
    // an image deleted after the scan: a message and a gray image without labels, no crash
    remove(tp("bad/images/train/ok1.jpg"));
    L = loader_open(&ds, &lc);
    capture_begin(); // before the epoch starts: workers prefetch at once
    loader_start_epoch(L, 0, 0);
    nimg = nlab = 0;
    for (const Batch *bt; (bt = loader_next(L));) { nimg += bt->B; nlab += bt->n; }
    msg = capture_end();
    check(nimg == 9 && nlab == 7 && L->load_errors == 1 && strstr(msg, "ok1.jpg"),
          "image deleted after the scan: %d images %d labels (want 9, 7), %lld load errors (want 1), message names it",
          nimg, nlab, L->load_errors);
    free(msg);
    loader_close(L);
    dataset_free(&ds);
    // empty split
    capture_begin();
    rc = dataset_load(&cfg, 1, &ds);
    msg = capture_end();
    check(rc == -1 && strstr(msg, "no usable images"), "empty val split reported: rc %d", rc);
    free(msg);
    data_config_free(&cfg);
}

// ------------------------------------------------------------------------------------------
// alignment dataset: gray images with solid rectangles of 3 colours (PNG, lossless)
static void make_align_dataset(void) {
    mkdirs("al/images/train");
    mkdirs("al/labels/train");
    Rng r;
    rng_seed(&r, 7);
    for (int i = 0; i < 24; i++) {
        int W = 96 + 8 * rng_int(&r, 12), H = 96 + 8 * rng_int(&r, 12);
        Image im = image_alloc(W, H);
        memset(im.px, 120, (size_t)W * H * 3);
        char lab[1024] = "";
        int nb = 1 + rng_int(&r, 3);
        for (int k = 0; k < nb; k++) { // non-overlapping: one per horizontal third
            int c = rng_int(&r, 3), bw = 12 + rng_int(&r, W / 3 - 14), bh = 12 + rng_int(&r, H / 2);
            int x1 = k * W / 3 + rng_int(&r, W / 3 - bw), y1 = rng_int(&r, H - bh);
            image_fill_rect(&im, x1, y1, x1 + bw, y1 + bh, TCOL[c][0], TCOL[c][1], TCOL[c][2]);
            char line[128];
            snprintf(line, sizeof line, "%d %.6f %.6f %.6f %.6f\n", c, (x1 + bw / 2.0) / W, (y1 + bh / 2.0) / H,
                     (double)bw / W, (double)bh / H);
            strcat(lab, line);
        }
        char a[64], b[64];
        snprintf(a, sizeof a, "al/images/train/%03d.png", i);
        snprintf(b, sizeof b, "al/labels/train/%03d.txt", i);
        image_save_png(tp(a), &im);
        write_text(tp(b), lab);
        image_free(&im);
    }
    write_text(tp("al/data.yaml"), "train: images/train\nval: images/train\nnames: [red, green, blue]\n");
    // a .txt list: "./" entries are relative to the list's folder, others are kept as written
    char list[2048];
    snprintf(list, sizeof list,
             "./images/train/001.png\r\n\n%s\n./images/train/missing.png\n./images/train/000.png\n./notes.md\n",
             tp("al/images/train/002.png"));
    write_text(tp("al/list.txt"), list);
    write_text(tp("al/list.yaml"), "train: list.txt\nval: [list.txt]\nnames: [red, green, blue]\n");
}

// alignment_stats: over a batch, fraction of each box's pixels with its class colour (mean and
// min over boxes of >= 64 px), and the fraction of coloured pixels outside all boxes of that colour.
static void alignment_stats(const Batch *bt, double *mean_in, double *min_in, double *out_frac, int *nbox) {
    int H = bt->H, W = bt->W;
    double sum_in = 0;
    long colored = 0, outside = 0;
    *min_in = 1;
    *nbox = 0;
    uint8_t *hwc = xmalloc((size_t)H * W * 3);
    for (int b = 0; b < bt->B; b++) {
        size_t plane = (size_t)H * W;
        for (size_t i = 0; i < plane; i++)
            for (int c = 0; c < 3; c++) hwc[3 * i + c] = bt->img[(size_t)b * 3 * plane + c * plane + i];
        for (int i = 0; i < bt->n; i++) {
            if (bt->batch_idx[i] != b) continue;
            const float *x = bt->box + 4 * i;
            int x1 = (int)ceil((x[0] - x[2] / 2) * W), x2 = (int)floor((x[0] + x[2] / 2) * W);
            int y1 = (int)ceil((x[1] - x[3] / 2) * H), y2 = (int)floor((x[1] + x[3] / 2) * H);
            long in = 0, tot = 0;
            for (int y = y1; y < y2; y++)
                for (int xx = x1; xx < x2; xx++) {
                    tot++;
                    in += pix_has(hwc + 3 * ((size_t)y * W + xx), bt->cls[i]);
                }
            if (tot == 0) continue;
            double f = (double)in / tot;
            sum_in += f;
            (*nbox)++;
            if (tot >= 64 && f < *min_in) *min_in = f;
        }
        for (int y = 0; y < H; y++)
            for (int xx = 0; xx < W; xx++) {
                for (int c = 0; c < 3; c++) {
                    if (!pix_has(hwc + 3 * ((size_t)y * W + xx), c)) continue;
                    colored++;
                    int inside = 0;
                    for (int i = 0; i < bt->n && !inside; i++) {
                        if (bt->batch_idx[i] != b || bt->cls[i] != c) continue;
                        const float *x = bt->box + 4 * i;
                        double px = (xx + 0.5) / W, py = (y + 0.5) / H;
                        inside = fabs(px - x[0]) <= x[2] / 2 + 1.0 / W && fabs(py - x[1]) <= x[3] / 2 + 1.0 / H;
                    }
                    outside += !inside;
                }
            }
    }
    free(hwc);
    *mean_in = *nbox ? sum_in / *nbox : 0;
    *out_frac = colored ? (double)outside / colored : 1;
}

static void test_alignment(void) {
    make_align_dataset();
    DataConfig cfg;
    char err[512];
    if (data_yaml_load(tp("al/data.yaml"), &cfg, err, sizeof err) != 0) { check(0, "align yaml: %s", err); return; }
    Dataset ds;
    DataConfig lcfg;
    int rc = data_yaml_load(tp("al/list.yaml"), &lcfg, err, sizeof err);
    capture_begin();
    rc = rc ? rc : dataset_load(&lcfg, 0, &ds);
    char *msg = capture_end();
    check(rc == 0 && ds.n == 3 && ds.stats.corrupt == 1 && ds.stats.skipped == 1 && strstr(ds.paths[0], "000.png") &&
                  strstr(msg, "missing.png"),
          "image list file: %d kept (want 3, sorted, CRLF ok), %d corrupt (the missing file, named), %d skipped (.md)",
          ds.n, ds.stats.corrupt, ds.stats.skipped);
    free(msg);
    if (rc == 0) { dataset_free(&ds); data_config_free(&lcfg); }
    dataset_load(&cfg, 0, &ds);
    struct { const char *name; AugConfig a; int train; double min_mean, min_min, max_out; } cases[] = {
        {"letterbox only (val, rect)", aug_defaults(), 0, 0.99, 0.97, 0.01},
        {"affine no rotation + flips", {0, 0, 0, 0, 0.1f, 0.5f, 0, 0, 0.5f, 0.5f, 0, 0}, 1, 0.97, 0.85, 0.03},
        {"mosaic + scale + flips", {0, 0, 0, 0, 0.1f, 0.5f, 0, 0, 0.5f, 0.5f, 1, 0}, 1, 0.95, 0.8, 0.05},
        {"mosaic + rotation 15 + shear 5", {0, 0, 0, 15, 0.1f, 0.5f, 5, 0, 0.5f, 0.5f, 1, 0}, 1, 0.7, 0.3, 0.06},
        {"mosaic + perspective 0.0005", {0, 0, 0, 5, 0.1f, 0.3f, 0, 0.0005f, 0, 0.5f, 1, 0}, 1, 0.7, 0.45, 0.06},
        {"mosaic + mixup", {0, 0, 0, 0, 0.1f, 0.5f, 0, 0, 0.5f, 0.5f, 1, 1}, 1, 0.97, 0.9, 0.06},
        {"defaults incl. HSV", aug_defaults(), 1, 0.97, 0.9, 0.06},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        LoaderConfig lc = {.batch = 8,
                           .imgsz = 128,
                           .workers = 2,
                           .max_boxes = 32,
                           .train = cases[k].train,
                           .seed = 3 + k,
                           .aug = cases[k].a};
        Loader *L = loader_open(&ds, &lc);
        double mean_all = 0, min_all = 1, out_all = 0;
        int nb = 0, boxes = 0;
        for (int e = 0; e < 2; e++) {
            loader_start_epoch(L, e, 0);
            for (const Batch *bt; (bt = loader_next(L));) {
                double m, mn, of;
                int nbx;
                alignment_stats(bt, &m, &mn, &of, &nbx);
                mean_all += m * nbx; boxes += nbx;
                if (mn < min_all) min_all = mn;
                out_all = fmax(out_all, of);
                nb++;
            }
        }
        mean_all /= boxes ? boxes : 1;
        if (k == 0) { // negative control: the metric notices labels shifted by 3 px
            loader_start_epoch(L, 0, 0);
            Batch *bt = (Batch *)loader_next(L);
            for (int i = 0; i < bt->n; i++) bt->box[4 * i] += 3.0f / bt->W;
            double m, mn, of;
            int nbx;
            alignment_stats(bt, &m, &mn, &of, &nbx);
            check(m < 0.95 || mn < 0.9 || of > 0.05,
                  "negative control: labels shifted 3 px right fail the alignment thresholds (mean %.3f min %.3f "
                  "outside %.3f)",
                  m, mn, of);
        }
        check(boxes > 20 && mean_all >= cases[k].min_mean && min_all >= cases[k].min_min && out_all <= cases[k].max_out,
              "alignment '%s': %d boxes, box pixels of its colour mean %.3f (>= %.2f) min %.3f (>= %.2f); colour "
              "outside its boxes worst batch %.3f (<= %.2f)",
              cases[k].name, boxes, mean_all, cases[k].min_mean, min_all, cases[k].min_min, out_all, cases[k].max_out);
        loader_close(L);
    }
    // close_mosaic: mosaic/mixup off -> every image is one letterboxed source (one 114 border layout)
    LoaderConfig lc = {
            .batch = 8, .imgsz = 128, .workers = 1, .max_boxes = 32, .train = 1, .seed = 1, .aug = aug_defaults()};
    lc.aug.scale = 0; lc.aug.translate = 0; lc.aug.hsv_h = lc.aug.hsv_s = lc.aug.hsv_v = 0; lc.aug.fliplr = 0;
    Loader *L = loader_open(&ds, &lc);
    loader_start_epoch(L, 0, 1);
    const Batch *bt = loader_next(L);
    int worst = 0;
    for (int b = 0; b < bt->B; b++) { // with scale=translate=0 the sample equals the letterboxed image
        int idx = bt->index[b];
        Image src = {0};
        image_load(ds.paths[idx], 0, &src, err, sizeof err);
        Letterbox lb;
        letterbox_params(src.w, src.h, 128, 128, 1, &lb);
        uint8_t *rs = xmalloc(128 * 128 * 3), *ref = xmalloc(128 * 128 * 3);
        int rw, rh;
        resized_size(src.w, src.h, 128, &rw, &rh);
        image_resize(src.px, src.w, src.h, rs, rw, rh);
        letterbox_params(rw, rh, 128, 128, 1, &lb);
        letterbox_apply(rs, rw, rh, ref, 128, 128, &lb);
        for (int i = 0; i < 128 * 128; i++)
            for (int c = 0; c < 3; c++)
                worst = fmax(worst, abs(ref[3 * i + c] - bt->img[(size_t)b * 3 * 128 * 128 + c * 128 * 128 + i]));
        free(rs); free(ref); image_free(&src);
    }
    check(worst <= 1,
          "close_mosaic with scale=translate=0: samples equal load+letterbox, worst |diff| %d tol 1 (warp rounding)",
          worst);
    loader_close(L);
    dataset_free(&ds);
    data_config_free(&cfg);
}

// HSV: gray keeps S = 0 and gets V * (1 + g_v) truncated; primaries and orange survive a round
// trip with identity tables; warp: rotation vs a float bilinear reference.
static void test_hsv_warp(void) {
    AugConfig a = {0};
    a.hsv_v = 0.4f;
    Rng r, r2;
    rng_seed(&r, 99);
    rng_seed(&r2, 99);
    uint8_t px[6 * 3] = {100, 100, 100, 255, 0, 0, 0, 255, 0, 0, 0, 255, 255, 128, 0, 7, 7, 7};
    hsv_augment(&r, &a, px, 6);
    rng_range(&r2, -1, 1); rng_range(&r2, -1, 1);
    double gv = rng_range(&r2, -1, 1) * 0.4;
    int want = (int)fmin(100 * (1 + gv), 255), want7 = (int)fmin(7 * (1 + gv), 255);
    check(px[0] == want && px[1] == want && px[2] == want && px[15] == want7,
          "HSV value gain %.4f on gray 100 -> %d (want %d), gray 7 -> %d (want %d)", gv, px[0], want, px[15], want7);
    int wantred = (int)fmin(255 * (1 + gv), 255);
    check(px[3] == wantred && px[4] == 0 && px[5] == 0, "HSV value gain on red: (%d,%d,%d) want (%d,0,0)", px[3], px[4],
          px[5], wantred);
    a.hsv_v = 0; a.hsv_h = 1e-12f; // tables ~identity for a positive draw
    uint8_t q[4 * 3] = {255, 0, 0, 0, 255, 0, 0, 0, 255, 255, 128, 0}, q0[12];
    memcpy(q0, q, 12);
    Rng r3;
    uint64_t sd = 0;
    for (;; sd++) { rng_seed(&r3, sd); if (rng_range(&r3, -1, 1) > 0) break; }
    rng_seed(&r3, sd);
    hsv_augment(&r3, &a, q, 4);
    int worst = 0;
    for (int i = 0; i < 12; i++) worst = fmax(worst, abs(q[i] - q0[i]));
    check(worst == 0, "HSV round trip (OpenCV 8-bit H in [0,180)) of red, green, blue, orange: worst |diff| %d tol 0",
          worst);
    // warp: 20 degree rotation about the centre of a smooth image vs float bilinear
    int n = 64;
    uint8_t *src = xmalloc(n * n * 3), *dst = xmalloc(n * n * 3);
    for (int y = 0; y < n; y++) for (int x = 0; x < n; x++) for (int c = 0; c < 3; c++)
        src[(y * n + x) * 3 + c] = (uint8_t)(128 + 100 * sin(0.1 * x + 0.07 * y + c));
    double ang = 20 * M_PI / 180, ca = cos(ang), sa = sin(ang);
    double Mi[9] = {ca, -sa, 32 - 32 * ca + 32 * sa, sa, ca, 32 - 32 * sa - 32 * ca, 0, 0, 1};
    image_warp(src, n, n, dst, n, n, Mi);
    double worstw = 0;
    int border_ok = 1;
    for (int y = 0; y < n; y++) for (int x = 0; x < n; x++) {
        double sx = Mi[0] * x + Mi[1] * y + Mi[2], sy = Mi[3] * x + Mi[4] * y + Mi[5];
        if (sx < -1.5 || sy < -1.5 || sx > n + 0.5 || sy > n + 0.5) {
            border_ok &= dst[(y * n + x) * 3] == 114;
            continue;
        }
        if (sx < 0 || sy < 0 || sx > n - 1 || sy > n - 1) continue;
        int i = (int)sx, j = (int)sy, i1 = i + 1 < n ? i + 1 : i, j1 = j + 1 < n ? j + 1 : j;
        double fx = sx - i, fy = sy - j;
        for (int c = 0; c < 3; c++) {
            double v = (1 - fx) * (1 - fy) * src[(j * n + i) * 3 + c] + fx * (1 - fy) * src[(j * n + i1) * 3 + c] +
                       (1 - fx) * fy * src[(j1 * n + i) * 3 + c] + fx * fy * src[(j1 * n + i1) * 3 + c];
            worstw = fmax(worstw, fabs(v - dst[(y * n + x) * 3 + c]));
        }
    }
    check(worstw <= 1.5 && border_ok,
          "warp 20 deg rotation vs float bilinear: worst |diff| %.2f tol 1.5 (1/32 px quantisation, gradient <= "
          "10/px); border 114: %d",
          worstw, border_ok);
    free(src); free(dst);
}

// test_cv2_reference: resize, warp and HSV against OpenCV 4.6 outputs written by
// test/ref_data.py into test/fixtures/data_cv2.bin (same cases, same order).
static void cv2_src(uint8_t *p, int w, int h) {
    for (int y = 0; y < h; y++) for (int x = 0; x < w; x++) for (int c = 0; c < 3; c++)
        p[(y * w + x) * 3 + c] = (uint8_t)((x * 37 + y * 91 + c * 53 + ((x * y) % 29) * 7) & 255);
}
static void cv2_grid(uint8_t *p) {
    for (int y = 0; y < 16; y++) for (int x = 0; x < 16; x++) {
            p[(y * 16 + x) * 3] = (uint8_t)(x * 17);
            p[(y * 16 + x) * 3 + 1] = (uint8_t)(y * 17);
            p[(y * 16 + x) * 3 + 2] = (uint8_t)(((x + y) * 8) % 256);
    }
}
static void cmp_bytes(const char *what, const uint8_t *got, const uint8_t *want, size_t n) {
    int worst = 0, differ = 0;
    for (size_t i = 0; i < n; i++) { int d = abs(got[i] - want[i]); worst = d > worst ? d : worst; differ += d != 0; }
    check(worst == 0, "%s vs cv2 4.6: %d of %zu bytes differ, worst |diff| %d (tol 0)", what, differ, n, worst);
}
static void test_cv2_reference(void) {
    FILE *f = fopen("test/fixtures/data_cv2.bin", "rb");
    if (!f) {
        check(0,
              "test/fixtures/data_cv2.bin missing (run from the repo root; regenerate with /usr/bin/python3 "
              "test/ref_data.py)");
        return;
    }
    static uint8_t buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf, f), off = 8;
    fclose(f);
    check(n > 8 && memcmp(buf, "CV2REF1", 8) == 0, "cv2 fixture header (%zu bytes)", n);
    static uint8_t src[97 * 61 * 3], out[64 * 64 * 3];
    int rs[4][4] = {{23, 17, 40, 29}, {23, 17, 11, 8}, {23, 17, 7, 16}, {97, 61, 40, 25}};
    for (int k = 0; k < 4; k++) {
        cv2_src(src, rs[k][0], rs[k][1]);
        image_resize(src, rs[k][0], rs[k][1], out, rs[k][2], rs[k][3]);
        char what[96];
        snprintf(what, sizeof what, "resize INTER_LINEAR %dx%d -> %dx%d", rs[k][0], rs[k][1], rs[k][2], rs[k][3]);
        size_t bytes = (size_t)rs[k][2] * rs[k][3] * 3;
        if (off + bytes > n) { check(0, "cv2 fixture too short"); return; }
        cmp_bytes(what, out, buf + off, bytes);
        off += bytes;
    }
    double wp[3][12] = {{48, 48, 24, 24, 0, 0, 7.5, 0.8, 2.0, -3.0, 0.45, 0.58},
                        {40, 30, 40, 30, 0, 0, 30.0, 1.3, 0.0, 0.0, 0.5, 0.5},
                        {40, 30, 40, 30, 0.001, -0.0007, -12.0, 1.1, 1.0, 0.0, 0.52, 0.47}};
    for (int k = 0; k < 3; k++) {
        double Mref[9], M[9], Mi[9];
        memcpy(Mref, buf + off, sizeof Mref);
        off += sizeof Mref;
        int sw = (int)wp[k][0], sh = (int)wp[k][1], dw = (int)wp[k][2], dh = (int)wp[k][3];
        perspective_matrix(sw, sh, dw, dh, wp[k][4], wp[k][5], wp[k][6], wp[k][7], wp[k][8], wp[k][9], wp[k][10],
                           wp[k][11], M);
        double worst = 0;
        for (int i = 0; i < 9; i++) worst = fmax(worst, fabs(M[i] - Mref[i]) / fmax(fabs(Mref[i]), 1e-3));
        check(worst <= 1e-6,
              "RandomPerspective matrix %d (float32 T@S@R@P@C) vs numpy: worst relative diff %.2g tol 1e-6", k, worst);
        cv2_src(src, sw, sh);
        warp_inverse(Mref, Mi);
        image_warp(src, sw, sh, out, dw, dh, Mi);
        char what[96];
        snprintf(what, sizeof what, "%s %dx%d -> %dx%d (border 114)", wp[k][4] != 0 ? "warpPerspective" : "warpAffine",
                 sw, sh, dw, dh);
        size_t bytes = (size_t)dw * dh * 3;
        if (off + bytes > n) { check(0, "cv2 fixture too short"); return; }
        if (wp[k][4] != 0) { // general inverse is not OpenCV's LU: allow 1
            int w1 = 0, nd = 0;
            for (size_t i = 0; i < bytes; i++) {
                int d = abs(out[i] - buf[off + i]);
                w1 = d > w1 ? d : w1;
                nd += d != 0;
            }
            check(w1 <= 1,
                  "%s vs cv2 4.6: %d of %zu bytes differ, worst |diff| %d (tol 1: 3x3 inverse differs from OpenCV's LU "
                  "in the last bits)",
                  what, nd, bytes, w1);
        } else cmp_bytes(what, out, buf + off, bytes);
        off += bytes;
    }
    double gains[3][3] = {{0.01, -0.5, 0.3}, {-0.013, 0.6, -0.35}, {0.0149, 0.699, 0.399}};
    for (int k = 0; k < 3; k++) {
        char what[96];
        cv2_src(src, 23, 17);
        hsv_apply(src, 23 * 17, gains[k][0], gains[k][1], gains[k][2]);
        snprintf(what, sizeof what, "RandomHSV gains (%g, %g, %g) on the pattern", gains[k][0], gains[k][1],
                 gains[k][2]);
        cmp_bytes(what, src, buf + off, 23 * 17 * 3);
        off += 23 * 17 * 3;
        cv2_grid(src);
        hsv_apply(src, 256, gains[k][0], gains[k][1], gains[k][2]);
        snprintf(what, sizeof what, "RandomHSV gains (%g, %g, %g) on a colour grid", gains[k][0], gains[k][1],
                 gains[k][2]);
        cmp_bytes(what, src, buf + off, 256 * 3);
        off += 256 * 3;
    }
    check(off == n, "cv2 fixture fully consumed: %zu of %zu bytes", off, n);
}

// box filter rules through random_perspective with an identity transform at S=320
static void test_box_rules(void) {
    AugConfig a = {0};
    Rng r;
    rng_seed(&r, 1);
    uint8_t *src = xcalloc(320 * 320 * 3, 1), *dst = xmalloc(320 * 320 * 3);
    Box bx[] = {
        {10, 10, 12, 50, 0},     // w = 2: dropped (w > 2 needed)
        {20, 10, 23, 50, 1},     // w = 3: kept
        {-190, 10, 10, 20, 0},   // 200x10, 10 px visible: area ratio 0.05 dropped
        {-170, 30, 30, 40, 2},   // 200x10, 30 px visible: 0.15 kept
        {5, 100, 315, 103, 0},   // 310x3 aspect 103: dropped
        {5, 110, 295, 113, 1},   // 290x3 aspect 96.7: kept
        {100, 200, 100.5f, 250, 0}, // degenerate: dropped
    };
    int keep_want[] = {0, 1, 0, 1, 0, 1, 0}, n = 7;
    Box orig[7];
    memcpy(orig, bx, sizeof bx);
    int k = random_perspective(&a, &r, src, 320, 320, dst, 320, 320, bx, n);
    int ok = 1, j = 0;
    for (int i = 0; i < n; i++) {
        if (!keep_want[i]) continue;
        if (j >= k || bx[j].cls != orig[i].cls || fabsf(bx[j].x2 - orig[i].x2) > 1e-3f) ok = 0;
        j++;
    }
    check(ok && k == 3,
          "box rules (w>2, h>2, area ratio>0.1 after clipping, aspect<100): kept %d want 3 (the expected ones: %d)", k,
          ok);
    check(box_candidate(10, 10, 4.5f, 4.5f, 1.5f) == 0 && box_candidate(10, 10, 4.5f, 4.5f, 1.0f) == 1,
          "area ratio uses the scale: 20.25/(100*1.5^2) = 0.09 dropped (got keep=%d), with scale 1 0.2 kept (got %d)",
          box_candidate(10, 10, 4.5f, 4.5f, 1.5f), box_candidate(10, 10, 4.5f, 4.5f, 1.0f));
    free(src); free(dst);
}

static int batches_equal(const Batch *a, const Batch *b) {
    if (a->B != b->B || a->H != b->H || a->W != b->W || a->n != b->n || a->overflow != b->overflow) return 0;
    if (memcmp(a->img, b->img, (size_t)a->B * 3 * a->H * a->W)) return 0;
    if (memcmp(a->batch_idx, b->batch_idx, sizeof(int) * a->n) || memcmp(a->cls, b->cls, sizeof(int) * a->n)) return 0;
    if (memcmp(a->box, b->box, sizeof(float) * 4 * a->n) || memcmp(a->index, b->index, sizeof(int) * a->B)) return 0;
    return 1;
}

static void test_determinism(void) {
    char out[600];
    snprintf(out, sizeof out, "out=%s/shapes", tmpdir);
    char *argv[] = {"yolo", "shapes", out, "ntrain=36", "nval=8", "imgsz=128", "seed=5", NULL};
    cmd_shapes(7, argv);
    char out2[600];
    snprintf(out2, sizeof out2, "out=%s/shapes2", tmpdir);
    argv[2] = out2;
    cmd_shapes(7, argv);
    int same_files = 1;
    const char *names[] = {"images/train/000000.jpg", "images/train/000002.png", "labels/train/000007.txt",
                           "images/val/000005.png", "data.yaml"};
    for (int i = 0; i < 5; i++) {
        char a[700], b[700];
        snprintf(a, sizeof a, "shapes/%s", names[i]);
        snprintf(b, sizeof b, "shapes2/%s", names[i]);
        size_t na, nb;
        uint8_t *da = read_all(tp(a), &na), *db = read_all(tp(b), &nb);
        same_files &= na == nb && memcmp(da, db, na) == 0;
        free(da); free(db);
    }
    check(same_files, "yolo shapes is deterministic: 5 files byte-identical across two runs with seed=5");
    DataConfig cfg;
    char err[512];
    if (data_yaml_load(tp("shapes/data.yaml"), &cfg, err, sizeof err) != 0) {
        check(0, "shapes yaml: %s", err);
        return;
    }
    check(cfg.nc == 4 && strcmp(cfg.names[1], "rectangle") == 0 && strcmp(cfg.names[2], "triangle") == 0,
          "shapes data.yaml read back: nc %d", cfg.nc);
    Dataset ds;
    dataset_load(&cfg, 0, &ds);
    check(ds.n == 36 && ds.stats.corrupt == 0 && ds.stats.backgrounds == 1 && ds.stats.boxes > 36,
          "shapes train split: %d images %d backgrounds %d boxes", ds.n, ds.stats.backgrounds, ds.stats.boxes);
    int wk[4] = {1, 4, 0, 2}, cache[4] = {0, 0, 0, 1};
    Loader *L[4];
    for (int i = 0; i < 4; i++) {
        LoaderConfig lc = {.batch = 8,
                           .imgsz = 128,
                           .workers = wk[i],
                           .max_boxes = 20,
                           .train = 1,
                           .cache_ram = cache[i],
                           .seed = 11,
                           .aug = aug_defaults()};
        lc.aug.mixup = 0.5f; lc.aug.degrees = 5;
        L[i] = loader_open(&ds, &lc);
    }
    int same = 1, nb = 0, differs_across_epochs = 0;
    uint8_t *first = NULL;
    for (int e = 0; e < 3; e++) {
        for (int i = 0; i < 4; i++) loader_start_epoch(L[i], e, e == 2);
        for (;;) {
            const Batch *b[4];
            for (int i = 0; i < 4; i++) b[i] = loader_next(L[i]);
            if (!b[0] || !b[1] || !b[2] || !b[3]) { if (b[0] || b[1] || b[2] || b[3]) same = 0; break; }
            for (int i = 1; i < 4; i++) same &= batches_equal(b[0], b[i]);
            if (nb == 0) {
                first = xmalloc((size_t)8 * 3 * 128 * 128);
                memcpy(first, b[0]->img, (size_t)8 * 3 * 128 * 128);
            }
            if (e == 1 && b[0]->number == 0)
                differs_across_epochs = memcmp(first, b[0]->img, (size_t)8 * 3 * 128 * 128) != 0;
            nb++;
        }
    }
    check(same && nb == 15,
          "same seed, workers 1 / 4 / 0 / 2+cache=ram: identical batches (pixels and labels) over 3 epochs (%d "
          "batches, last one close_mosaic)",
          nb);
    check(differs_across_epochs, "epoch 1 batch 0 differs from epoch 0 batch 0 (fresh randomness per epoch)");
    free(first);
    for (int i = 0; i < 4; i++) loader_close(L[i]);
    // label cap: max_boxes = 1 keeps one label per image and counts the rest
    LoaderConfig lc = {
            .batch = 36, .imgsz = 128, .workers = 2, .max_boxes = 1, .train = 0, .seed = 1, .aug = aug_defaults()};
    Loader *Lc = loader_open(&ds, &lc);
    loader_start_epoch(Lc, 0, 0);
    const Batch *bt = loader_next(Lc);
    check(bt->n == 35 && bt->n + bt->overflow == ds.stats.boxes,
          "label cap 1/image: %d kept + %d overflow = %d boxes (want 35 + %d)", bt->n, bt->overflow, ds.stats.boxes,
          ds.stats.boxes - 35);
    loader_close(Lc);
    // val rect batches: shapes from aspect ratios, images sorted by aspect ratio
    dataset_free(&ds);
    dataset_load(&cfg, 1, &ds);
    LoaderConfig lv = {
            .batch = 4, .imgsz = 128, .workers = 2, .max_boxes = 20, .train = 0, .seed = 1, .aug = aug_defaults()};
    Loader *Lv = loader_open(&ds, &lv);
    loader_start_epoch(Lv, 0, 0);
    int ok = 1, nbv = 0;
    double prev = 0;
    for (const Batch *b; (b = loader_next(Lv)); nbv++) {
        double ar0 = 1e9, ar1 = 0;
        for (int i = 0; i < b->B; i++) {
            double ar = (double)b->orig_h[i] / b->orig_w[i];
            ok &= ar >= prev; prev = ar;
            ar0 = fmin(ar0, ar); ar1 = fmax(ar1, ar);
            int rw, rh;
            resized_size(b->orig_w[i], b->orig_h[i], 128, &rw, &rh);
            Letterbox lb;
            letterbox_params(rw, rh, b->W, b->H, 0, &lb);
            ok &= (int)b->pad[2 * i] == lb.left && (int)b->pad[2 * i + 1] == lb.top;
        }
        double sh = ar1 < 1 ? ar1 : 1, sw = ar0 > 1 ? 1 / ar0 : 1;
        ok &= b->H == (int)ceil(sh * 4 + 0.5) * 32 && b->W == (int)ceil(sw * 4 + 0.5) * 32;
        printf("  val batch %d: %d images %dx%d (h x w), aspect %.2f..%.2f\n", nbv, b->B, b->H, b->W, ar0, ar1);
    }
    check(ok && nbv == 2,
          "val rect batches: sorted by aspect, shape ceil(ratio*S/32+0.5)*32, padding as letterbox(scaleup=False)");
    loader_close(Lv);
    dataset_free(&ds);
    data_config_free(&cfg);
}

// ------------------------------------------------------------------------------------------
// the loader's threads (make tsan runs this under ThreadSanitizer)
// ------------------------------------------------------------------------------------------

// batch_hash: FNV-1a over a batch's pixels, labels and image indices.
static uint64_t batch_hash(const Batch *b) {
    uint64_t h = 1469598103934665603ULL;
    const uint8_t *parts[5] = {b->img, (const uint8_t *)b->cls, (const uint8_t *)b->box, (const uint8_t *)b->batch_idx,
                               (const uint8_t *)b->index};
    size_t lens[5] = {(size_t)b->B * 3 * b->H * b->W, sizeof(int) * b->n, sizeof(float) * 4 * b->n, sizeof(int) * b->n,
                      sizeof(int) * b->B};
    for (int k = 0; k < 5; k++)
        for (size_t i = 0; i < lens[k]; i++) h = (h ^ parts[k][i]) * 1099511628211ULL;
    return h ^ (uint64_t)b->n << 32 ^ (uint64_t)b->number;
}

// test_loader_threads: what training does to the loader's threads, for workers 1, 2 and 4, with
// and without cache=ram, each batch compared with workers=0 (no threads): an epoch abandoned after
// one batch (loader_start_epoch while the workers fill the next two), a full epoch, the
// close_mosaic switch, then loader_close while the workers are filling (an early stop). Then an
// image deleted after loader_open: it fails to decode in the workers mid-epoch (a gray image,
// counted) unless cache=ram already holds it.
static void test_loader_threads(void) {
    DataConfig cfg;
    char err[512];
    if (data_yaml_load(tp("shapes2/data.yaml"), &cfg, err, sizeof err) != 0) {
        check(0, "shapes2 yaml: %s", err);
        return;
    }
    Dataset ds;
    dataset_load(&cfg, 0, &ds);
    enum { NCFG = 7, MAXB = 16 };
    const int wk[NCFG] = {0, 1, 2, 4, 1, 2, 4}, cache[NCFG] = {0, 0, 0, 0, 1, 1, 1};
    uint64_t seq[NCFG][MAXB];
    int nseq[NCFG], same = 1;
    for (int c = 0; c < NCFG; c++) {
        LoaderConfig lc = {.batch = 8,
                           .imgsz = 64,
                           .workers = wk[c],
                           .max_boxes = 20,
                           .train = 1,
                           .cache_ram = cache[c],
                           .seed = 21,
                           .aug = aug_defaults()};
        lc.aug.mixup = 0.5f;
        Loader *L = loader_open(&ds, &lc);
        int n = 0;
        loader_start_epoch(L, 0, 0);
        seq[c][n++] = batch_hash(loader_next(L));   // then abandoned, with two batches in flight
        for (int e = 1; e <= 2; e++) {
            loader_start_epoch(L, e, e == 2);         // epoch 2: close_mosaic
            for (const Batch *b; (b = loader_next(L)) && n < MAXB;) seq[c][n++] = batch_hash(b);
        }
        loader_start_epoch(L, 3, 1);
        seq[c][n++] = batch_hash(loader_next(L));
        loader_close(L);                               // early stop: the workers are filling
        nseq[c] = n;
        same &= n == nseq[0] && memcmp(seq[c], seq[0], sizeof(uint64_t) * n) == 0;
    }
    check(same && nseq[0] == 12,
          "loader threads: workers 1/2/4 with and without cache=ram give the batches of workers=0 "
          "through an abandoned epoch, the close_mosaic switch and a close mid-epoch (%d batches each, want 12)",
          nseq[0]);
    // an image deleted after the scan and after loader_open: errors raised inside the workers
    const char *gone = NULL;
    for (int i = 0; i < ds.n; i++) if (strstr(ds.paths[i], "000003.")) gone = ds.paths[i];
    Loader *Ls[NCFG];
    for (int c = 0; c < NCFG; c++) {
        LoaderConfig lc = {.batch = 8,
                           .imgsz = 64,
                           .workers = wk[c],
                           .max_boxes = 20,
                           .train = 1,
                           .cache_ram = cache[c],
                           .seed = 22,
                           .aug = aug_defaults()};
        Ls[c] = loader_open(&ds, &lc);
    }
    int removed = gone && remove(gone) == 0;
    long long errs[NCFG];
    int n2[NCFG];
    capture_begin();   // one message per failed decode
    for (int c = 0; c < NCFG; c++) {
        n2[c] = 0;
        loader_start_epoch(Ls[c], 0, 0);
        for (const Batch *b; (b = loader_next(Ls[c])) && n2[c] < MAXB;) seq[c][n2[c]++] = batch_hash(b);
        errs[c] = Ls[c]->load_errors;
        loader_close(Ls[c]);
    }
    free(capture_end());
    int errs_ok = errs[0] > 0;
    for (int c = 1; c < NCFG; c++) errs_ok &= errs[c] == (cache[c] ? 0 : errs[0]);
    check(removed && errs_ok,
          "image deleted mid-run: %lld load errors with workers 0/1/2/4 (%lld %lld %lld), 0 with cache=ram (%lld %lld "
          "%lld)",
          errs[0], errs[1], errs[2], errs[3], errs[4], errs[5], errs[6]);
    same = 1;   // the threaded loaders against workers=0, and the cached ones against each other
    for (int c = 1; c < NCFG; c++) {
        int ref = cache[c] ? 4 : 0;
        same &= n2[c] == 5 && n2[ref] == 5 && memcmp(seq[c], seq[ref], sizeof(uint64_t) * 5) == 0;
    }
    check(same, "with the image deleted, every epoch has 5 batches and workers 1/2/4 give the batches of workers=0 "
          "(cache=ram: of each other)");
    dataset_free(&ds);
    data_config_free(&cfg);
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/test_data_XXXXXX");
    if (!mkdtemp(tmpdir)) die("mkdtemp failed");
    double t0 = now_sec();
    test_letterbox_rect();
    test_label_parse();
    test_yaml();
    test_decode();
    test_bad_corpus();
    test_box_rules();
    test_hsv_warp();
    test_cv2_reference();
    test_alignment();
    test_determinism();
    test_loader_threads();
    printf("(%.1f s, temp files in %s)\n", now_sec() - t0, tmpdir);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (t_failed == 0 && system(cmd) != 0) printf("could not remove %s\n", tmpdir);
    return test_summary();
}
