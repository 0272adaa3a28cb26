// cuda_runtime.h of the CUDA-on-CPU emulation (see cuda_runtime_api.h here): the runtime API plus
// the C++ pieces a .cu file sees: uint3, dim3, the 8/16-byte vector types and the templated cudaFuncSetAttribute. C++
// only.
#pragma once
#include "cuda_runtime_api.h"

struct uint3 { unsigned x, y, z; };   // trivial, as NVIDIA's: thread_local copies need no initialiser
static inline uint3 make_uint3(unsigned x, unsigned y, unsigned z) { uint3 u = {x, y, z}; return u; }
// the vector types a kernel uses for 8- and 16-byte accesses, aligned as NVIDIA's (vector_types.h)
#define EMU_VEC2(T, N, A) struct __attribute__((aligned(A))) N { T x, y; }; \
    static inline N make_##N(T x, T y) { N v = {x, y}; return v; }
#define EMU_VEC4(T, N, A) struct __attribute__((aligned(A))) N { T x, y, z, w; }; \
    static inline N make_##N(T x, T y, T z, T w) { N v = {x, y, z, w}; return v; }
EMU_VEC2(float, float2, 8) EMU_VEC2(int, int2, 8) EMU_VEC2(unsigned, uint2, 8)
EMU_VEC4(float, float4, 16) EMU_VEC4(int, int4, 16) EMU_VEC4(unsigned, uint4, 16)
#undef EMU_VEC2
#undef EMU_VEC4
struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
    constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
    constexpr operator uint3() const { return uint3{x, y, z}; }
};
// nvcc accepts a kernel itself where the C API takes const void *
template <class T> static inline cudaError_t cudaFuncSetAttribute(T *f, cudaFuncAttribute a, int v) {
    return ::cudaFuncSetAttribute((const void *)f, a, v);
}
