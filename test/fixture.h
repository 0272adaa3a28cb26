// fixture.h: file helpers shared by the tests and fuzz targets that include yolo.c (after it):
// whole files as Blobs, and the promise every successfully opened SafeTensors must keep.
#pragma once

typedef struct { uint8_t *p; size_t n; } Blob;

// blob_file: the whole file path in memory (dies naming the file if it cannot be read)
static Blob blob_file(const char *path) {
    FILE *f = xfopen(path, "rb");
    fseek(f, 0, SEEK_END);
    Blob b = {NULL, (size_t)ftell(f)};
    fseek(f, 0, SEEK_SET);
    b.p = xmalloc(b.n + 1);
    if (fread(b.p, 1, b.n, f) != b.n) die("short read of %s", path);
    fclose(f);
    return b;
}

// st_entries_readable: every entry of an opened st lies inside the data, has dtype x numel bytes,
// is found by name, and reads back; 1, or 0 after printing the first broken promise
static int st_entries_readable(SafeTensors *st) {
    char err[1024];
    for (int i = 0; i < st->n; i++) {
        const StEntry *e = &st->t[i];
        uint64_t bytes = (uint64_t)e->numel * (uint64_t)st_dtype_size[e->dtype];
        if (e->dtype < 0 || e->dtype >= ST_NDTYPE || e->ndim < 0 || e->ndim > ST_MAXDIM || e->begin > e->end ||
            e->end > st->data_size || e->end - e->begin != bytes || st_find(st, e->name) != e) {
            fprintf(stderr, "validator let through a bad entry '%s'\n", e->name);
            return 0;
        }
        void *buf = xmalloc(bytes ? (size_t)e->numel * 8 : 8);
        int rc = st_dtype_is_float(e->dtype) ? st_read_f32(st, e, buf, err, sizeof err)
                                             : st_read_i64(st, e, buf, err, sizeof err);
        free(buf);
        if (rc) { fprintf(stderr, "read of validated tensor '%s' failed: %s\n", e->name, err); return 0; }
    }
    return 1;
}
