/*
 * data: images, drawing, data.yaml, labels, letterbox, augmentation, the batch loader and the
 * synthetic shapes dataset. Follows ../shared/spec/yolov8.md section 4. Tests: test/test_data.c,
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
 * Geometry (spec 4.2, 4.4, 4.5)
 *   Letterbox { double r; int nw, nh, left, top }
 *   void letterbox_params(w, h, new_w, new_h, scaleup, &lb)     Ultralytics LetterBox numbers
 *   void letterbox_apply(src, w, h, dst (new_h, new_w, 3), new_w, new_h, &lb)   114 padding
 *   void rect_batch_shapes(ar (n) sorted h/w, n, batch, imgsz, hw (nbatch, 2))   (h, w) each
 *   void resized_size(w0, h0, S, &w, &h)          load_image size: long side S
 *
 * Augmentation and loader (spec 4.3)
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
    if (!info) { png_destroy_read_struct(&png, NULL, NULL); snprintf(err, errlen, "%s: libpng init failed", path); return -1; }
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
        if (have0 == j1 && have1 != j1) { int32_t *t = r0; r0 = r1; r1 = t; have1 = have0; have0 = -2; rows[0] = r0; rows[1] = r1; }
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
                    o[c] = (uint8_t)((p0[c] * w[0] + p0[c + 3] * w[1] + p1[c] * w[2] + p1[c + 3] * w[3] + (1 << 14)) >> 15);
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
// ==========================================================================================
// data.yaml (spec 4.1), read with libyaml
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
                 parser.problem ? parser.problem : "malformed", parser.context ? " " : "", parser.context ? parser.context : "");
        yaml_parser_delete(&parser);
        fclose(f);
        return -1;
    }
    yaml_parser_delete(&parser);
    fclose(f);
    int rc = 0, nc_given = -1;
    char *root = NULL;
    yaml_node_t *top = yaml_document_get_root_node(&doc);
    if (!top || top->type != YAML_MAPPING_NODE) { rc = yaml_fail(err, errlen, path, top, "expected a mapping of keys (path, train, val, names)"); goto done; }
    for (yaml_node_pair_t *p = top->data.mapping.pairs.start; p < top->data.mapping.pairs.top && rc == 0; p++) {
        yaml_node_t *k = yaml_document_get_node(&doc, p->key), *v = yaml_document_get_node(&doc, p->value);
        if (!k || k->type != YAML_SCALAR_NODE) { rc = yaml_fail(err, errlen, path, k, "keys must be plain strings"); break; }
        const char *key = (const char *)k->data.scalar.value;
        int split = -1;
        for (int s = 0; s < 3; s++) if (strcmp(key, SPLIT_NAMES[s]) == 0) split = s;
        if (strcmp(key, "path") == 0) {
            if (v->type != YAML_SCALAR_NODE) { rc = yaml_fail(err, errlen, path, v, "'path' must be a string"); break; }
            free(root);
            root = strdup((const char *)v->data.scalar.value);
        } else if (split >= 0) {
            if (v->type == YAML_SCALAR_NODE) {
                if (v->data.scalar.length == 0 || strcmp((char *)v->data.scalar.value, "null") == 0 || strcmp((char *)v->data.scalar.value, "~") == 0) continue;
                if (cfg->nsplit[split] == DATA_MAX_SOURCES) { rc = yaml_fail(err, errlen, path, v, "too many sources in one split (max 16)"); break; }
                cfg->split[split][cfg->nsplit[split]++] = strdup((const char *)v->data.scalar.value);
            } else if (v->type == YAML_SEQUENCE_NODE) {
                for (yaml_node_item_t *it = v->data.sequence.items.start; it < v->data.sequence.items.top; it++) {
                    yaml_node_t *e = yaml_document_get_node(&doc, *it);
                    if (e->type != YAML_SCALAR_NODE) { rc = yaml_fail(err, errlen, path, e, "list entries of a split must be strings"); break; }
                    if (cfg->nsplit[split] == DATA_MAX_SOURCES) { rc = yaml_fail(err, errlen, path, e, "too many sources in one split (max 16)"); break; }
                    cfg->split[split][cfg->nsplit[split]++] = strdup((const char *)e->data.scalar.value);
                }
            } else rc = yaml_fail(err, errlen, path, v, "a split must be a path or a list of paths");
        } else if (strcmp(key, "nc") == 0) {
            char *end;
            long x = v->type == YAML_SCALAR_NODE ? strtol((char *)v->data.scalar.value, &end, 10) : -1;
            if (v->type != YAML_SCALAR_NODE || *end || x <= 0 || x > 100000) { rc = yaml_fail(err, errlen, path, v, "'nc' must be a positive integer"); break; }
            nc_given = (int)x;
        } else if (strcmp(key, "names") == 0) {
            if (cfg->names) { rc = yaml_fail(err, errlen, path, v, "'names' given twice"); break; }
            if (v->type == YAML_SEQUENCE_NODE) {
                int n = (int)(v->data.sequence.items.top - v->data.sequence.items.start);
                cfg->names = xcalloc(n ? n : 1, sizeof(char *));
                for (int i = 0; i < n && rc == 0; i++) {
                    yaml_node_t *e = yaml_document_get_node(&doc, v->data.sequence.items.start[i]);
                    if (e->type != YAML_SCALAR_NODE) rc = yaml_fail(err, errlen, path, e, "class names must be strings");
                    else { cfg->names[i] = strdup((char *)e->data.scalar.value); cfg->nc = i + 1; }
                }
            } else if (v->type == YAML_MAPPING_NODE) {
                int n = (int)(v->data.mapping.pairs.top - v->data.mapping.pairs.start);
                cfg->names = xcalloc(n ? n : 1, sizeof(char *));
                cfg->nc = n;
                for (int i = 0; i < n && rc == 0; i++) {
                    yaml_node_pair_t *q = v->data.mapping.pairs.start + i;
                    yaml_node_t *kk = yaml_document_get_node(&doc, q->key), *vv = yaml_document_get_node(&doc, q->value);
                    char *end;
                    long id = kk->type == YAML_SCALAR_NODE ? strtol((char *)kk->data.scalar.value, &end, 10) : -1;
                    if (kk->type != YAML_SCALAR_NODE || *end || id < 0 || id >= n) rc = yaml_fail(err, errlen, path, kk, "names mapping keys must be the integers 0..n-1");
                    else if (vv->type != YAML_SCALAR_NODE) rc = yaml_fail(err, errlen, path, vv, "class names must be strings");
                    else if (cfg->names[id]) rc = yaml_fail(err, errlen, path, kk, "class id repeated in names");
                    else cfg->names[id] = strdup((char *)vv->data.scalar.value);
                }
            } else rc = yaml_fail(err, errlen, path, v, "'names' must be a list or an {id: name} mapping");
        }
    }
    if (rc) goto done;
    if (!cfg->names && nc_given > 0) { // nc without names: Ultralytics names them class0, class1, ...
        cfg->names = xcalloc(nc_given, sizeof(char *));
        for (int i = 0; i < nc_given; i++) { char b[32]; snprintf(b, sizeof b, "class%d", i); cfg->names[i] = strdup(b); }
        cfg->nc = nc_given;
    }
    if (!cfg->names || cfg->nc == 0) { rc = yaml_fail(err, errlen, path, top, "missing 'names' (list of class names)"); goto done; }
    if (nc_given > 0 && nc_given != cfg->nc) {
        snprintf(err, errlen, "%s: nc=%d but names has %d entries", path, nc_given, cfg->nc);
        rc = -1;
        goto done;
    }
    if (cfg->nsplit[0] == 0 || cfg->nsplit[1] == 0) { rc = yaml_fail(err, errlen, path, top, "'train' and 'val' are required"); goto done; }
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
// labels and dataset scan (spec 4.1; Ultralytics verify_image_label, img2label_paths)
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
        if (end == p || (*end && *end != ' ' && *end != '\t' && *end != '\r' && *end != '\n' && *end != '\f' && *end != '\v')) {
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
        if (i > 0 && v[i] > 1.01) { snprintf(err, errlen, "non-normalized or out of bounds coordinate %g", v[i]); return -1; }
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
    static const char *const exts[] = {"bmp", "dng", "jpeg", "jpg", "mpo", "png", "tif", "tiff", "webp", "pfm", "heic", NULL};
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
        if (stat(src, &st) != 0) { fprintf(stderr, "%s: %s source '%s' does not exist\n", SPLIT_NAMES[split], SPLIT_NAMES[split], src); return -1; }
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
    qsort(out->v, out->n, sizeof(char *), cmp_str);
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
        if ((size_t)len != strlen(line)) { fprintf(stderr, "%s:%d: NUL byte in label line, image dropped\n", path, lineno); bad = 1; break; }
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
// get_labels / verify_image_label checks (spec 4.1).
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
        if (w < 10 || h < 10) { fprintf(stderr, "%s: image size %dx%d < 10 pixels, image dropped\n", p, w, h); st->corrupt++; free(p); continue; }
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
           cfg->nsplit[split] ? cfg->split[split][0] : "", st->kept, st->backgrounds, st->corrupt, st->skipped, st->boxes,
           st->duplicates ? ", duplicate rows removed" : "");
    if (st->duplicates) printf("  %d duplicate label rows removed\n", st->duplicates);
    if (ds->n == 0) {
        fprintf(stderr, "%s: no usable images in %s\n", SPLIT_NAMES[split], cfg->nsplit[split] ? cfg->split[split][0] : "(none)");
        DatasetStats keep = *st;
        dataset_free(ds);
        ds->stats = keep;
        return -1;
    }
    return 0;
}

// ==========================================================================================
// letterbox and rectangular batches (spec 4.4, 4.5)
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

// resized_size: the size load_image gives an image of (w0, h0) for long side S (spec 4.2).
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
// augmentation (spec 4.3): mosaic, random perspective, mixup, HSV, flips
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

// mat3_mul / mat3_inv: 3x3 row-major product (out may alias) and inverse by the adjugate.
static void mat3_mul(const double a[9], const double b[9], double out[9]) {
    double t[9];
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 3; j++) t[3 * i + j] = a[3 * i] * b[j] + a[3 * i + 1] * b[3 + j] + a[3 * i + 2] * b[6 + j];
    memcpy(out, t, sizeof t);
}
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
            for (int j = 0; j < 3; j++) t[3 * i + j] = acc[3 * i] * b[j] + acc[3 * i + 1] * b[3 + j] + acc[3 * i + 2] * b[6 + j];
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
static int random_perspective(const AugConfig *a, Rng *rng, const uint8_t *src, int sw, int sh, uint8_t *dst, int dw, int dh,
                              Box *bx, int n) {
    double px = rng_range(rng, -a->perspective, a->perspective), py = rng_range(rng, -a->perspective, a->perspective);
    double deg = rng_range(rng, -a->degrees, a->degrees), s = rng_range(rng, 1 - a->scale, 1 + a->scale);
    double shx = rng_range(rng, -a->shear, a->shear), shy = rng_range(rng, -a->shear, a->shear);
    double tx = rng_range(rng, 0.5 - a->translate, 0.5 + a->translate), ty = rng_range(rng, 0.5 - a->translate, 0.5 + a->translate);
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
        Box o = {(float)fmin(fmax(x1, 0), dw), (float)fmin(fmax(y1, 0), dh), (float)fmin(fmax(x2, 0), dw), (float)fmin(fmax(y2, 0), dh), b.cls};
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
    double gh = rng_range(rng, -1, 1) * a->hsv_h, gs = rng_range(rng, -1, 1) * a->hsv_s, gv = rng_range(rng, -1, 1) * a->hsv_v;
    hsv_apply(px, npix, gh, gs, gv);
}

// image_flip: mirror an (h, w, 3) image left-right (horizontal=1) or up-down, with its boxes.
static void image_flip(uint8_t *px, int w, int h, int horizontal, Box *bx, int n) {
    if (horizontal) {
        for (int y = 0; y < h; y++) {
            uint8_t *row = px + (size_t)y * w * 3;
            for (int x = 0; x < w / 2; x++)
                for (int c = 0; c < 3; c++) { uint8_t t = row[3 * x + c]; row[3 * x + c] = row[3 * (w - 1 - x) + c]; row[3 * (w - 1 - x) + c] = t; }
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
    int *order;               // (n) dataset index at each position of the epoch
    int (*shape)[2];          // (nbatch, 2) rect batch (h, w); train: S, S
    uint8_t **cache;          // (n) resized images when cache_ram, else NULL
    int *rw, *rh;             // (n) resized size (long side S)
    Batch slot[2];
    float *stage[2];          // (batch, max_boxes, 5) per-image labels before compaction
    int *stage_n[2], *stage_over[2]; // (batch)
    int state[2], bno[2], claimed[2], done[2];
    int epoch, close_mosaic, next_fill, next_get, inuse, quit, nworkers;
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
        Box b = {(l[1] - l[3] / 2) * w + dx, (l[2] - l[4] / 2) * h + dy, (l[1] + l[3] / 2) * w + dx, (l[2] + l[4] / 2) * h + dy, (int)l[0]};
        bx[k++] = b;
    }
    return k;
}

// partner_index: a random image from the recent window before position pos (spec 4.2 buffer).
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
            memcpy(ws->canvas.px + ((size_t)(y1a + y) * S2 + x1a) * 3, ws->tile.px + ((size_t)(y1b + y) * w + x1b) * 3, (size_t)(x2b - x1b) * 3);
        if (!ok) continue;
        int k = labels_pixels(L, ids[t], (float)w, (float)h, (float)(x1a - x1b), (float)(y1a - y1b), bx + n, ws->bcap / 2 - n);
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

// sample_make: one finished sample at position pos of the epoch into batch slot s, image b:
// pixels CHW and up to max_boxes labels in the stage. Randomness only from (seed, epoch, pos).
static void sample_make(Loader *L, LoaderScratch *ws, int s, int b, int pos) {
    Batch *bt = &L->slot[s];
    int idx = L->order[pos], H = bt->H, W = bt->W, n;
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
    bt->B = bn < L->nbatch - 1 ? L->cfg.batch : L->n - bn * L->cfg.batch;
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
        if (L->next_fill < L->nbatch && L->state[s] == SLOT_FREE) { slot_begin(L, s, L->next_fill++); pthread_cond_broadcast(&L->cv); continue; }
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
        die("loader: bad settings batch=%d imgsz=%d (multiple of 32) max_boxes=%d workers=%d", cfg->batch, cfg->imgsz, cfg->max_boxes, cfg->workers);
    if (ds->n < 1) die("loader: the dataset has no images");
    Loader *L = xcalloc(1, sizeof *L);
    L->ds = ds;
    L->cfg = *cfg;
    int S = L->S = cfg->imgsz, n = L->n = ds->n, B = cfg->batch;
    L->nbatch = (n + B - 1) / B;
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
    for (int s = 0; s < 2; s++) {
        Batch *bt = &L->slot[s];
        bt->cap = cfg->max_boxes * B;
        bt->img = xmalloc((size_t)B * 3 * Hm * Wm);
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
    printf("loader: %d images, %d batches of %d, %s, %d workers; host memory: batches %.1f MB, scratch %.1f MB, cache %.1f MB%s\n",
           n, L->nbatch, B, cfg->train ? "train (augment)" : "val (rect)", cfg->workers, batch_bytes / 1e6, scratch_bytes / 1e6,
           cfg->cache_ram ? cache_bytes / 1e6 : 0.0, cfg->cache_ram ? "" : " (cache off)");
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
            if (pthread_create(&L->th[i], NULL, loader_worker, arg) != 0) die("loader: cannot start worker thread %d", i);
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
        for (int i = L->n - 1; i > 0; i--) { int j = rng_int(&r, i + 1), t = L->order[i]; L->order[i] = L->order[j]; L->order[j] = t; }
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

static const char *const SHAPE_NAMES[4] = {"circle", "rectangle", "triangle", "diamond"};
static const uint8_t SHAPE_COLORS[4][3] = {{225, 40, 40}, {40, 190, 60}, {45, 85, 235}, {245, 205, 30}};
static const uint8_t PALETTE[10][3] = {{255, 56, 56}, {72, 249, 10}, {0, 194, 255}, {255, 178, 29}, {207, 210, 49},
                                       {146, 204, 23}, {61, 219, 134}, {26, 147, 52}, {0, 212, 187}, {255, 112, 31}};

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
    double fx = rng_range(r, 0.02, 0.15), fy = rng_range(r, 0.02, 0.15), ph = rng_range(r, 0, 6.28), amp = rng_range(r, 5, 25);
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
            for (int j = 0; j < nl; j++) fprintf(f, "%d %.6f %.6f %.6f %.6f\n", (int)lab[j][0], lab[j][1], lab[j][2], lab[j][3], lab[j][4]);
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
    for (int i = 0; i < bt->n; i++) {
        if (bt->batch_idx[i] != b) continue;
        const float *bx = bt->box + 4 * i;
        const uint8_t *col = PALETTE[bt->cls[i] % 10];
        int x1 = (int)((bx[0] - bx[2] / 2) * W), y1 = (int)((bx[1] - bx[3] / 2) * H);
        int x2 = (int)((bx[0] + bx[2] / 2) * W), y2 = (int)((bx[1] + bx[3] / 2) * H);
        image_draw_box(out, x1, y1, x2, y2, col[0], col[1], col[2], 2);
        const char *name = bt->cls[i] < cfg->nc ? cfg->names[bt->cls[i]] : "?";
        image_draw_label(out, x1, y1 - 9 >= 0 ? y1 - 9 : y1, name, col[0], col[1], col[2]);
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
        for (int y = 0; y < tile.h; y++) memcpy(grid.px + ((size_t)(gy + y) * grid.w + gx) * 3, tile.px + (size_t)y * tile.w * 3, (size_t)tile.w * 3);
        image_draw_box(&grid, gx, gy, gx + S - 1, gy + bt->H - 1, 255, 255, 255, 1);
    }
    size_t ol = strlen(out);
    int rc = (ol > 4 && strcasecmp(out + ol - 4, ".png") == 0) ? image_save_png(out, &grid) : image_save_jpg(out, &grid, 90);
    if (rc == 0) printf("augment: wrote %s (%d samples, %d labels, %d over the cap)\n", out, bt->B, bt->n, bt->overflow);
    image_free(&grid);
    image_free(&tile);
    loader_close(L);
    dataset_free(&ds);
    data_config_free(&cfg);
    return rc ? 1 : 0;
}
