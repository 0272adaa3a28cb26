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
#include <inttypes.h>
#include <fcntl.h>
#include <unistd.h>
#include <sys/stat.h>
#include <sys/types.h>

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
        int c = s[k], d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
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
                o[w++] = (char)(0xe0 | cp >> 12); o[w++] = (char)(0x80 | ((cp >> 6) & 0x3f)); o[w++] = (char)(0x80 | (cp & 0x3f));
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
            return st_fail(j->err, j->errlen, "'%s': header JSON: integer too large %s at byte %zu", j->path, ctx, start);
        v = v * 10 + d;
        j->i++;
    }
    char b[32];
    if (j->i == start)
        return st_fail(j->err, j->errlen, "'%s': header JSON: expected a non-negative integer %s at byte %zu, found %s",
                       j->path, ctx, start, json_found(j, b, sizeof b));
    if (j->i - start > 1 && j->s[start] == '0')
        return st_fail(j->err, j->errlen, "'%s': header JSON: integer with a leading zero %s at byte %zu", j->path, ctx, start);
    if (j->i < j->n && (j->s[j->i] == '.' || j->s[j->i] == 'e' || j->s[j->i] == 'E'))
        return st_fail(j->err, j->errlen, "'%s': header JSON: expected an integer %s at byte %zu, found a fraction or exponent",
                       j->path, ctx, start);
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
            return st_fail(j->err, j->errlen, "'%s': header JSON: more than %d values %s at byte %zu", j->path, max, ctx, j->i);
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
            return st_fail(j->err, j->errlen, "'%s': header: __metadata__ value of key '%.100s' is not a string (byte %zu)",
                           j->path, kv[0], j->i);
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
                if (have_dtype) rc = st_fail(j->err, j->errlen, "'%s': header: tensor '%.200s': duplicate field 'dtype'", j->path, nm);
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
                if (have_shape) rc = st_fail(j->err, j->errlen, "'%s': header: tensor '%.200s': duplicate field 'shape'", j->path, nm);
                else rc = json_uint_array(j, shp, ST_MAXDIM, &e->ndim, "in shape");
                have_shape = 1;
            } else if (!rc && strcmp(key, "data_offsets") == 0) {
                int cnt = 0;
                if (have_off) rc = st_fail(j->err, j->errlen, "'%s': header: tensor '%.200s': duplicate field 'data_offsets'", j->path, nm);
                else if (!(rc = json_uint_array(j, off, 2, &cnt, "in data_offsets")) && cnt != 2)
                    rc = st_fail(j->err, j->errlen, "'%s': header: tensor '%.200s': data_offsets has %d values, expected 2 [begin, end]",
                                 j->path, nm, cnt);
                have_off = 1;
            } else if (!rc)
                rc = st_fail(j->err, j->errlen, "'%s': header: tensor '%.200s': unknown field '%.60s' (expected dtype, shape, data_offsets)",
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
        return st_fail(j->err, j->errlen, "'%s': header: tensor '%.200s': data_offsets [%" PRIu64 ", %" PRIu64 "] has begin > end",
                       j->path, nm, off[0], off[1]);
    if (off[1] > data_size)
        return st_fail(j->err, j->errlen, "'%s': header: tensor '%.200s': data_offsets [%" PRIu64 ", %" PRIu64 "] out of bounds: "
                       "the data section has %" PRIu64 " bytes (file truncated?)", j->path, nm, off[0], off[1], data_size);
    if (off[1] - off[0] != bytes) {
        char sb[160];
        return st_fail(j->err, j->errlen, "'%s': header: tensor '%.200s': size mismatch: dtype %s x shape %s needs %" PRIu64
                       " bytes but data_offsets [%" PRIu64 ", %" PRIu64 "] span %" PRIu64 " bytes", j->path, nm,
                       st_dtype_name[e->dtype], st_shape_str(sb, sizeof sb, e->ndim, e->shape), bytes, off[0], off[1], off[1] - off[0]);
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
        int rc = dup < 0 ? 0 : st_fail(err, errlen, "'%s': header: duplicate __metadata__ key '%.200s'", st->path, keys[dup]);
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
            rc = st_fail(err, errlen, "'%s': header: tensors '%.200s' [%" PRIu64 ", %" PRIu64 ") and '%.200s' [%" PRIu64 ", %" PRIu64
                         ") overlap in the data section", st->path, a->name, a->begin, a->end, b->name, b->begin, b->end);
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
    free(st->t); free(st->by_name); free(st->meta); free(st->path);
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
        st_fail(err, errlen, "'%s': file is %lld bytes, too short for the 8-byte safetensors header length (truncated?)",
                st->path, (long long)size);
        goto fail;
    }
    uint64_t hlen = 0;
    for (int k = 7; k >= 0; k--) hlen = hlen << 8 | len8[k];
    if (hlen > (uint64_t)size - 8) {
        st_fail(err, errlen, "'%s': header length %" PRIu64 " exceeds the %lld bytes left in the file (truncated, or not a "
                "safetensors file)", st->path, hlen, (long long)size - 8);
        goto fail;
    }
    if (hlen > ST_MAX_HEADER) {
        st_fail(err, errlen, "'%s': header length %" PRIu64 " exceeds the %llu byte limit", st->path, hlen, ST_MAX_HEADER);
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
    return st_fail(err, errlen, "'%s': tensor '%s': short read of %" PRIu64 " bytes at offset %" PRIu64 " (%s)", st->path,
                   e->name, e->end - e->begin, st->data_start + e->begin,
                   ferror(st->f) ? strerror(errno) : "file shrank after opening?");
}

// st_read_f32: the e->numel values of a float tensor (F32, F16, BF16, F64) as float into dst.
static int st_read_f32(SafeTensors *st, const StEntry *e, float *dst, char *err, size_t errlen) {
    if (!st_dtype_is_float(e->dtype))
        return st_fail(err, errlen, "'%s': tensor '%s' has dtype %s, expected a float dtype", st->path, e->name, st_dtype_name[e->dtype]);
    return st_read_chunks(st, e, dst, 1, err, errlen);
}

// st_read_i64: the e->numel values of an integer or BOOL tensor as int64 into dst.
static int st_read_i64(SafeTensors *st, const StEntry *e, int64_t *dst, char *err, size_t errlen) {
    if (st_dtype_is_float(e->dtype))
        return st_fail(err, errlen, "'%s': tensor '%s' has dtype %s, expected an integer dtype", st->path, e->name, st_dtype_name[e->dtype]);
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
            if (!meta_kv[i + 1]) { st_fail(err, errlen, "'%s': metadata key '%s' has no value", path, meta_kv[i]); goto done; }
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
            st_fail(err, errlen, "'%s': tensor '%s': can only write F32, F16, BF16 or I64 (dtype %d)", path, x->name, x->dtype); goto done;
        }
        if (x->ndim < 0 || x->ndim > ST_MAXDIM) {
            st_fail(err, errlen, "'%s': tensor '%s': ndim %d outside [0, %d]", path, x->name, x->ndim, ST_MAXDIM); goto done;
        }
        int64_t ne = 1;
        for (int d = 0; d < x->ndim; d++) {
            if (x->shape[d] < 0 || __builtin_mul_overflow(ne, x->shape[d], &ne)) {
                st_fail(err, errlen, "'%s': tensor '%s': bad shape %s", path, x->name, st_shape_str(sb, sizeof sb, x->ndim, x->shape));
                goto done;
            }
        }
        if (ne > 0 && !x->data) { st_fail(err, errlen, "'%s': tensor '%s': data is NULL", path, x->name); goto done; }
        numel[i] = ne;
        for (int q = 0; q < i; q++)
            if (strcmp(t[q].name, x->name) == 0) { st_fail(err, errlen, "'%s': duplicate tensor name '%s'", path, x->name); goto done; }
        uint64_t bytes = (uint64_t)ne * (uint64_t)st_dtype_size[x->dtype];
        if (!first) stbuf_put(&h, ",", 1);
        first = 0;
        if (stbuf_json_string(&h, x->name)) { st_fail(err, errlen, "'%s': tensor name '%.100s' is not valid UTF-8", path, x->name); goto done; }
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
        if (r->ndim < 0 || r->ndim > 4) rc = st_fail(err, errlen, "'%s': param '%s': ndim %d outside [0, 4]", path, r->name, r->ndim);
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
#define WL_NOTE(...) do { if (bad++ < SHOW && mlen < sizeof msg) mlen += (size_t)snprintf(msg + mlen, sizeof msg - mlen, __VA_ARGS__); } while (0)
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
        if (!st_dtype_is_float(e->dtype)) { WL_NOTE("; '%s' has dtype %s, expected a float dtype", name, st_dtype_name[e->dtype]); continue; }
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
            int counter = !st_dtype_is_float(e->dtype) && nl >= sl && strcmp(e->name + nl - sl, "num_batches_tracked") == 0;
            if (!used[k] && !counter) WL_NOTE("; unexpected tensor '%s' %s", e->name, st_shape_str(sb, sizeof sb, e->ndim, e->shape));
        }
#undef WL_NOTE
    if (bad) {
        st_fail(err, errlen, "'%s': does not match the model: %d mismatch%s%s%s", st->path, bad, bad == 1 ? "" : "es", msg,
                bad > SHOW ? "; ..." : "");
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
                st_fail(err, errlen, "'%s': tensor '%s' has a non-finite value (%s) at index %" PRId64, st->path, e->name,
                        isnan(tmp[o + q]) ? "NaN" : "Inf", q);
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

// weights_load: load every ref from the safetensors file path (see weights_load_st); refs are
// untouched unless the whole file validates.
static int weights_load(const char *path, ParamRef *refs, int n, char *err, size_t errlen) {
    SafeTensors st;
    if (st_open(path, &st, err, errlen)) return -1;
    int rc = weights_load_st(&st, refs, n, NULL, 0, err, errlen);
    st_close(&st);
    return rc;
}

// weights_infer: nc and scale of a YOLOv8 detection file: nc = dim 0 of model.22.cv3.0.2.weight
// (nc, c3, 1, 1), scale from the stem model.0.conv.weight (16/32/48/64/80, 3, 3, 3).
static int weights_infer(const char *path, int *nc, char *scale, char *err, size_t errlen) {
    SafeTensors st;
    if (st_open(path, &st, err, errlen)) return -1;
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
        st_fail(err, errlen, "'%s': not a YOLOv8 detection model: model.0.conv.weight has shape %s, expected (16|32|48|64|80, 3, 3, 3)",
                path, st_shape_str(sb, sizeof sb, stem->ndim, stem->shape));
    else if (cls->ndim != 4 || cls->shape[0] < 1 || cls->shape[0] > 100000 || cls->shape[2] != 1 || cls->shape[3] != 1)
        st_fail(err, errlen, "'%s': not a YOLOv8 detection model: model.22.cv3.0.2.weight has shape %s, expected (nc, c3, 1, 1)",
                path, st_shape_str(sb, sizeof sb, cls->ndim, cls->shape));
    else if (box->ndim != 4 || box->shape[0] != 64)
        st_fail(err, errlen, "'%s': not a YOLOv8 detection model: model.22.cv2.0.2.weight has shape %s, expected (64, c2, 1, 1)",
                path, st_shape_str(sb, sizeof sb, box->ndim, box->shape));
    else {
        *nc = (int)cls->shape[0];
        *scale = scales[stem->shape[0] / 16 - 1];
        rc = 0;
    }
    st_close(&st);
    return rc;
}
