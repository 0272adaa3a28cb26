// cuda_pipeline_primitives.h of the CUDA-on-CPU emulation: the asynchronous global-to-shared copy
// (cp.async on sm_80 and later) as a synchronous one. __pipeline_memcpy_async copies
// size_and_align - zfill bytes and writes zfill zero bytes after them at once, so a later
// __pipeline_wait_prior has nothing left to wait for. The alignment rules of the hardware
// instruction are checked: size 4, 8 or 16, both addresses multiples of it, zfill <= size.
// (uint4 comes from cuda_runtime.h, included before this header by every .cu file.)
#pragma once
#include <stddef.h>
#include <stdint.h>

static inline void __pipeline_memcpy_async(void *dst_shared, const void *src_global, size_t size_and_align,
                                           size_t zfill = 0) {
    if ((size_and_align != 4 && size_and_align != 8 && size_and_align != 16) || zfill > size_and_align ||
        ((uintptr_t)dst_shared | (uintptr_t)src_global) % size_and_align)
        emu::fail("__pipeline_memcpy_async: size %zu, zfill %zu, dst %p, src %p (size 4, 8 or 16, both aligned to it)",
                  size_and_align, zfill, dst_shared, src_global);
    // plain element copies (no memcpy), so that the emulator's access counting sees a global load and
    // a shared store of the copy's width
    if (zfill == 0) {   // one access of the copy's width (4, 8 or 16 bytes), as cp.async makes
        if (size_and_align == 16) *(uint4 *)dst_shared = *(const uint4 *)src_global;
        else if (size_and_align == 8) *(uint2 *)dst_shared = *(const uint2 *)src_global;
        else *(uint32_t *)dst_shared = *(const uint32_t *)src_global;
        return;
    }
    const unsigned char *s = (const unsigned char *)src_global;
    unsigned char *d = (unsigned char *)dst_shared;
    for (size_t i = 0; i < size_and_align; i++) d[i] = i < size_and_align - zfill ? s[i] : 0;
}
static inline void __pipeline_commit() {}
static inline void __pipeline_wait_prior(size_t prior) { (void)prior; }
