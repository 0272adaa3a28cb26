// cuda_fp16.h of the CUDA-on-CPU emulation: __half and the few __half2 operations the code and the
// emulator's selftest use, with the semantics of NVIDIA's type on a GPU: a conversion from float rounds
// to nearest even (overflow gives inf, NaN becomes 0x7fff as the hardware's cvt instruction gives), a
// conversion to float is exact, and arithmetic is done in float and rounded once per operation. C++ only.
#pragma once
#include <string.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

// emu_f2h_bits: binary32 -> binary16 bits, round to nearest even
static inline unsigned short emu_f2h_bits(float f) {
    unsigned u, h, rem, halfway;
    memcpy(&u, &f, 4);
    unsigned sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return 0x7fffu;
    if (a >= 0x477ff000u) return (unsigned short)(sign | 0x7c00u);   // from 65520 up (and inf): inf
    if (a >= 0x38800000u) {            // a normal half: drop 13 mantissa bits, rebias the exponent 127 -> 15
        h = (a >> 13) - (112u << 10);
        rem = a & 0x1fffu;
        halfway = 0x1000u;
    } else {                           // a subnormal half: the value in units of 2^-24
        unsigned shift = 126u - (a >> 23), m = (a & 0x7fffffu) | 0x800000u;
        if (shift > 24) return (unsigned short)sign;
        h = m >> shift;
        rem = m & ((1u << shift) - 1);
        halfway = 1u << (shift - 1);
    }
    if (rem > halfway || (rem == halfway && (h & 1u))) h++;          // a carry may roll into the exponent
    return (unsigned short)(sign | h);
}
// emu_h2f: binary16 bits -> binary32, exact
static inline float emu_h2f(unsigned short h) {
    unsigned e = (h >> 10) & 0x1fu, m = h & 0x3ffu, u;
    float f;
    if (e == 0) {                      // zero or subnormal: m * 2^-24, exact in float
        f = (float)m * (1.0f / 16777216.0f);
        return (h & 0x8000u) ? -f : f;
    }
    u = ((unsigned)(h & 0x8000u) << 16) | (e == 31 ? 0x7f800000u : (e + 112u) << 23) | (m << 13);
    memcpy(&f, &u, 4);
    return f;
}

struct __half {
    unsigned short bits;               // IEEE binary16, as NVIDIA's (2 bytes, 2-byte aligned)
    __half() = default;
    __half(float f) : bits(emu_f2h_bits(f)) {}
    operator float() const { return emu_h2f(bits); }
};
struct alignas(4) __half2 { __half x, y; };
typedef __half half;
typedef __half2 half2;

static inline __half __float2half(float f) { return __half(f); }
static inline __half __float2half_rn(float f) { return __half(f); }
static inline float __half2float(__half h) { return (float)h; }
static inline __half operator+(__half a, __half b) { return __half((float)a + (float)b); }
static inline __half operator-(__half a, __half b) { return __half((float)a - (float)b); }
static inline __half operator*(__half a, __half b) { return __half((float)a * (float)b); }
static inline __half operator/(__half a, __half b) { return __half((float)a / (float)b); }
static inline __half __hadd(__half a, __half b) { return a + b; }
static inline __half __hmul(__half a, __half b) { return a * b; }
static inline __half hexp(__half h) { return __half(expf((float)h)); }
static inline __half2 __halves2half2(__half lo, __half hi) { __half2 r; r.x = lo; r.y = hi; return r; }
static inline __half2 __floats2half2_rn(float lo, float hi) { return __halves2half2(__half(lo), __half(hi)); }
static inline __half __low2half(__half2 v) { return v.x; }
static inline __half __high2half(__half2 v) { return v.y; }
static inline float __low2float(__half2 v) { return (float)v.x; }
static inline float __high2float(__half2 v) { return (float)v.y; }
static inline float2 __half22float2(__half2 v) { return make_float2((float)v.x, (float)v.y); }
static inline __half2 __hadd2(__half2 a, __half2 b) { return __halves2half2(a.x + b.x, a.y + b.y); }
static inline __half2 __hmul2(__half2 a, __half2 b) { return __halves2half2(a.x * b.x, a.y * b.y); }
static inline __half2 __hsub2(__half2 a, __half2 b) { return __halves2half2(a.x - b.x, a.y - b.y); }
// emu_hfma: a * b + c rounded once to a half, as fma.rn.f16 does. The product of two halves is exact in
// float; the sum is taken in double and must come out exact there and in float (the products the
// kernels form: conv_stem's u8_pair_unit), else the emulator stops rather than round it twice
static inline __half emu_hfma(__half a, __half b, __half c) {
    const double p = (double)((float)a * (float)b), q = (float)c, s = p + q, bb = s - p;
    const double err = (p - (s - bb)) + (q - bb);   // (TwoSum: the sum's rounding error)
    const float f = (float)s;
    if (err != 0.0 || (double)f != s) {
        fprintf(stderr, "emulated __hfma2: %a * %a + %a is not exact in float (not emulated)\n", (double)(float)a,
                (double)(float)b, q);
        abort();
    }
    return __half(f);
}
static inline __half2 __hfma2(__half2 a, __half2 b, __half2 c) {
    return __halves2half2(emu_hfma(a.x, b.x, c.x), emu_hfma(a.y, b.y, c.y));
}
