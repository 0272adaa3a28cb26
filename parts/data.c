/*
 * data: images, drawing, data.yaml, labels, letterbox, augmentation, the batch loader and
 * the synthetic shapes dataset. Follows ../shared/spec/yolov8.md section 4.
 *
 * PUBLIC API (everything is static; shapes in brackets, pixels are uint8 RGB)
 *
 *   Image { int w, h; uint8_t *px (h, w, 3) RGB; size_t cap; }
 *     image_alloc(w, h)               new image, px zeroed; image_free(&img)
 *     image_reserve(&img, w, h)       (re)size in place, growing px only when needed
 *     image_load(path, target, &img, err, errlen) -> 0 ok, -1 error (message in err).
 *         Decodes JPEG (libjpeg-turbo) or PNG (libpng), picked by magic bytes, to 8-bit RGB.
 *         target > 0: JPEGs at least 2x larger than target on their long side are decoded at
 *         1/2, 1/4 or 1/8 scale in the DCT domain (never below target). Rejects sides above
 *         IMAGE_MAX_SIDE or more than IMAGE_MAX_PIXELS pixels before allocating.
 *     image_probe(path, &w, &h, err, errlen) -> 0 ok, 1 ok with a warning in err, -1 corrupt
 *     image_save_jpg(path, &img, quality), image_save_png(path, &img) -> 0 ok, -1 error (stderr)
 *     image_resize(src, sw, sh, dst, dw, dh)  bilinear, cv2.INTER_LINEAR pixel centres, HWC
 *     image_fill_rect(&img, x1, y1, x2, y2, r, g, b)        inclusive-exclusive, clipped
 *     image_draw_box(&img, x1, y1, x2, y2, r, g, b, thickness)   outline, clipped
 *     image_draw_text(&img, x, y, text, r, g, b, scale)     5x7 built-in font, top-left at x,y
 *     image_draw_label(&img, x, y, text, r, g, b)          text on a filled box of colour rgb
 *
 *   DataConfig data_yaml_load(path, &cfg, err, errlen) -> 0 ok / -1 (err names file:line)
 *     { char *root; char *split[3][DATA_MAX_SOURCES] (train, val, test); int nsplit[3];
 *       int nc; char **names; }      data_config_free(&cfg)
 *   Dataset dataset_load(&cfg, split (0 train, 1 val, 2 test), nc, &ds) -> 0 ok / -1 no images
 *     { int n; char **paths; int *w0, *h0 (n); int *lab_off (n+1); float *lab (nlab, 5):
 *       class cx cy w h normalised to the original image; DatasetStats stats }
 *     prints "Scanning NAME... N images, M backgrounds, K corrupt, S skipped" and one message
 *     per bad file (file and line).        dataset_free(&ds)
 *   label_line_parse(line, nc, out[5], err, errlen) -> 1 box, 0 blank, -1 bad line
 *   label_path_from_image(img_path, out, outlen)   last /images/ -> /labels/, ext -> .txt
 *
 *   letterbox_params(w, h, new_w, new_h, scaleup, &lb)  Letterbox {r, nw, nh, left, top}
 *   rect_batch_shapes(ar (n), n, batch, imgsz, out_hw (nbatch, 2))   spec 4.5
 *
 *   AugConfig { hsv_h, hsv_s, hsv_v, degrees, translate, scale, shear, perspective, flipud,
 *               fliplr, mosaic, mixup }  aug_defaults(), aug_from_args(&a, argc, argv)
 *   LoaderConfig { batch, imgsz, workers, max_boxes, train, cache_ram, seed, aug }
 *   Loader *loader_open(&ds, &lcfg)     allocates everything once, prints the cache size
 *   loader_start_epoch(L, epoch, close_mosaic)   close_mosaic=1 turns mosaic and mixup off
 *   const Batch *loader_next(L)         next batch of the epoch, NULL at its end
 *   loader_close(L), loader_batches(L)
 *   Batch { int B, H, W; uint8_t *img (B, 3, H, W) RGB; int n, cap, overflow;
 *           int *batch_idx (n), *cls (n); float *box (n, 4) normalised cx cy w h;
 *           int *index (B) dataset index; int *orig_w, *orig_h (B);
 *           float *ratio (B, 2) pixels-per-original-pixel (x, y); float *pad (B, 2) (left, top) }
 *     train=1: shuffled, mosaic/affine/mixup/HSV/flips, S x S. train=0: rect batches sorted by
 *     aspect ratio, letterbox with scaleup=False, no augmentation.
 *     A sample's randomness comes from (seed, epoch, position) only, so batches do not depend
 *     on the number of workers.
 *
 *   cmd_shapes(argc, argv), cmd_augment(argc, argv)   the `shapes` and `augment` commands
 *
 * DEVIATIONS (data):
 *  - Resizes and warps use float bilinear weights (OpenCV: 11-bit / 5-bit fixed point), so
 *    pixels can differ by 1; downscales use INTER_LINEAR also for validation.
 *  - JPEGs much larger than S are decoded with DCT scaling before the bilinear resize.
 *  - The mosaic/mixup "recent image buffer" is the previous min(N, 8*batch, 1000) images in
 *    the epoch's order, so it does not depend on worker timing.
 *  - A relative `path:` in data.yaml is resolved against the yaml file's folder (Ultralytics:
 *    its DATASETS_DIR setting). Duplicate label rows are removed keeping the first occurrence.
 *  - No label cache file; labels are scanned at each start (headers only for JPEG).
 */
#include <setjmp.h>
#include <pthread.h>
#include <dirent.h>
#include <sys/stat.h>
#include <jpeglib.h>
#include <png.h>
#include <yaml.h>

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

static int image_dims_ok(long long w, long long h) {
    return w > 0 && h > 0 && w <= IMAGE_MAX_SIDE && h <= IMAGE_MAX_SIDE && w * h <= IMAGE_MAX_PIXELS;
}

// libjpeg error manager that longjmps back instead of exit()ing the process.
typedef struct {
    struct jpeg_error_mgr pub;
    jmp_buf jb;
    char msg[JMSG_LENGTH_MAX];
    int warnings;
} JpegErr;
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
        jpeg_destroy_decompress(&cinfo);
        return -1;
    }
    jpeg_create_decompress(&cinfo);
    jpeg_stdio_src(&cinfo, f);
    jpeg_read_header(&cinfo, TRUE);
    if (!image_dims_ok(cinfo.image_width, cinfo.image_height)) {
        snprintf(err, errlen, "%s: declared size %ux%u exceeds the limit (%d per side, %lld pixels)", path,
                 cinfo.image_width, cinfo.image_height, IMAGE_MAX_SIDE, IMAGE_MAX_PIXELS);
        jpeg_destroy_decompress(&cinfo);
        return -1;
    }
    if (probe_only) {
        img->w = (int)cinfo.image_width;
        img->h = (int)cinfo.image_height;
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
        uint8_t *tmp = xmalloc((size_t)w * 4);
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
    }
    jpeg_finish_decompress(&cinfo);
    jpeg_destroy_decompress(&cinfo);
    err[0] = 0;
    if (jerr.warnings) snprintf(err, errlen, "%s: JPEG warning (%s)", path, jerr.msg);
    return 0;
}

typedef struct { jmp_buf jb; char msg[200]; } PngErr;
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
    if (!info) { png_destroy_read_struct(&png, NULL, NULL); snprintf(err, errlen, "%s: libpng init failed", path); return -1; }
    if (setjmp(perr.jb)) {
        snprintf(err, errlen, "%s: corrupt PNG (%s)", path, perr.msg);
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
    Image tmp = {0};
    Image *dst = probe_only ? &tmp : img;
    image_reserve(dst, (int)w, (int)h);
    for (int p = 0; p < passes; p++)
        for (png_uint_32 y = 0; y < h; y++) png_read_row(png, dst->px + (size_t)y * w * 3, NULL);
    png_read_end(png, NULL);
    png_destroy_read_struct(&png, &info, NULL);
    if (probe_only) { img->w = tmp.w; img->h = tmp.h; image_free(&tmp); }
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

// image_resize: bilinear resize of an HWC RGB image (sw, sh) -> (dw, dh), with cv2.INTER_LINEAR's
// pixel-centre mapping sx = (dx + 0.5) * sw / dw - 0.5, clamped at the borders.
static void image_resize(const uint8_t *src, int sw, int sh, uint8_t *dst, int dw, int dh) {
    if (sw == dw && sh == dh) { memcpy(dst, src, (size_t)sw * sh * 3); return; }
    int *x0 = xmalloc(sizeof(int) * dw * 2);
    float *fx = xmalloc(sizeof(float) * dw);
    double scx = (double)sw / dw, scy = (double)sh / dh;
    for (int x = 0; x < dw; x++) {
        double s = (x + 0.5) * scx - 0.5;
        int i = (int)floor(s);
        float f = (float)(s - i);
        if (i < 0) { i = 0; f = 0; }
        if (i >= sw - 1) { i = sw - 1; f = 0; }
        x0[2 * x] = i * 3;
        x0[2 * x + 1] = (i + 1 < sw ? i + 1 : i) * 3;
        fx[x] = f;
    }
    for (int y = 0; y < dh; y++) {
        double s = (y + 0.5) * scy - 0.5;
        int j = (int)floor(s);
        float fy = (float)(s - j);
        if (j < 0) { j = 0; fy = 0; }
        if (j >= sh - 1) { j = sh - 1; fy = 0; }
        const uint8_t *r0 = src + (size_t)j * sw * 3, *r1 = src + (size_t)(j + 1 < sh ? j + 1 : j) * sw * 3;
        uint8_t *d = dst + (size_t)y * dw * 3;
        for (int x = 0; x < dw; x++) {
            int a = x0[2 * x], b = x0[2 * x + 1];
            float f = fx[x];
            for (int c = 0; c < 3; c++) {
                float top = r0[a + c] + f * (r0[b + c] - r0[a + c]);
                float bot = r1[a + c] + f * (r1[b + c] - r1[a + c]);
                d[3 * x + c] = (uint8_t)(top + fy * (bot - top) + 0.5f);
            }
        }
    }
    free(x0);
    free(fx);
}

// image_warp: dst (dw, dh) = src sampled at Minv * (x, y, 1) (3x3, perspective when row 2 is not
// (0,0,1)), bilinear, constant border 114. Matches cv2.warpAffine/warpPerspective(M) with
// borderValue=(114,114,114) where Minv = inverse(M).
static void image_warp(const uint8_t *src, int sw, int sh, uint8_t *dst, int dw, int dh, const double Minv[9]) {
    int persp = Minv[6] != 0 || Minv[7] != 0 || Minv[8] != 1;
    for (int y = 0; y < dh; y++) {
        uint8_t *d = dst + (size_t)y * dw * 3;
        for (int x = 0; x < dw; x++) {
            double sx = Minv[0] * x + Minv[1] * y + Minv[2], sy = Minv[3] * x + Minv[4] * y + Minv[5];
            if (persp) {
                double z = Minv[6] * x + Minv[7] * y + Minv[8];
                z = z != 0 ? 1.0 / z : 0;
                sx *= z;
                sy *= z;
            }
            if (!(sx > -1 && sy > -1 && sx < sw && sy < sh)) { d[3 * x] = d[3 * x + 1] = d[3 * x + 2] = 114; continue; }
            int i = (int)floor(sx), j = (int)floor(sy);
            float fx = (float)(sx - i), fy = (float)(sy - j);
            float w00 = (1 - fx) * (1 - fy), w01 = fx * (1 - fy), w10 = (1 - fx) * fy, w11 = fx * fy;
            for (int c = 0; c < 3; c++) {
                float p00 = (i >= 0 && j >= 0) ? src[((size_t)j * sw + i) * 3 + c] : 114;
                float p01 = (i + 1 < sw && j >= 0) ? src[((size_t)j * sw + i + 1) * 3 + c] : 114;
                float p10 = (i >= 0 && j + 1 < sh) ? src[((size_t)(j + 1) * sw + i) * 3 + c] : 114;
                float p11 = (i + 1 < sw && j + 1 < sh) ? src[((size_t)(j + 1) * sw + i + 1) * 3 + c] : 114;
                d[3 * x + c] = (uint8_t)(w00 * p00 + w01 * p01 + w10 * p10 + w11 * p11 + 0.5f);
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
static const char FONT_CHARS[] = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ .,:-_%/()=+?#";
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
    {0x0E,0x11,0x01,0x02,0x04,0x00,0x04}, {0x0A,0x0A,0x1F,0x0A,0x1F,0x0A,0x0A},
};

// image_draw_text: draw text with its top-left at (x, y); each glyph is 6*scale wide (with a
// column of spacing) and 7*scale tall. Characters outside the font draw as '?'.
static void image_draw_text(Image *img, int x, int y, const char *text, int r, int g, int b, int scale) {
    if (scale < 1) scale = 1;
    for (const char *t = text; *t; t++, x += 6 * scale) {
        int ch = (*t >= 'a' && *t <= 'z') ? *t - 32 : *t;
        const char *pos = ch ? strchr(FONT_CHARS, ch) : NULL;
        int gi = pos ? (int)(pos - FONT_CHARS) : (int)(strchr(FONT_CHARS, '?') - FONT_CHARS);
        for (int row = 0; row < 7; row++)
            for (int col = 0; col < 5; col++)
                if (FONT_ROWS[gi][row] & (0x10 >> col))
                    image_fill_rect(img, x + col * scale, y + row * scale, x + (col + 1) * scale, y + (row + 1) * scale, r, g, b);
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
static int cmd_shapes(int argc, char **argv) { (void)argc; (void)argv; die("shapes: not built yet"); return 1; }
static int cmd_augment(int argc, char **argv) { (void)argc; (void)argv; die("augment: not built yet"); return 1; }
