// cuda_runtime.h of the CUDA-on-CPU emulation (see cuda_runtime_api.h here): the runtime API plus
// the C++ pieces a .cu file sees: uint3, dim3 and the templated cudaFuncSetAttribute. C++ only.
#pragma once
#include "cuda_runtime_api.h"

struct uint3 { unsigned x, y, z; };   // trivial, as NVIDIA's: thread_local copies need no initialiser
static inline uint3 make_uint3(unsigned x, unsigned y, unsigned z) { uint3 u = {x, y, z}; return u; }
// the 16-byte vector types of wide loads and stores, aligned as NVIDIA's (a misaligned one faults on a GPU)
struct __attribute__((aligned(16))) uint4 { unsigned x, y, z, w; };
struct __attribute__((aligned(16))) float4 { float x, y, z, w; };
static inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { uint4 u = {x, y, z, w}; return u; }
struct __attribute__((aligned(8))) float2 { float x, y; };
static inline float2 make_float2(float x, float y) { float2 f = {x, y}; return f; }
static inline float4 make_float4(float x, float y, float z, float w) { float4 f = {x, y, z, w}; return f; }
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
