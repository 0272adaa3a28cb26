// cuda_pipeline_primitives.h of the CUDA-on-CPU emulation: the asynchronous global-to-shared copy
// (cp.async on sm_80 and later). __pipeline_memcpy_async reads size_and_align - zfill bytes of the source
// (zfill zero bytes after them) and queues them for the thread; __pipeline_commit closes the thread's
// group of copies; __pipeline_wait_prior(n) writes the copies of all its committed groups but the last n
// into shared memory (test/cuda_emu.cpp: async_push, async_pop). Until then the destination holds what it
// held, as it may on a GPU: a reader that is not ordered after the writer's wait reads stale values.
// The alignment rules of the hardware instruction are checked: size 4, 8 or 16, both addresses
// multiples of it, zfill <= size.
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
    // the source read now, by plain loads of the copy's width (the emulator's access counting sees a global
    // load of that width), the zfill bytes zero
    union { uint4 v; uint2 v2; uint32_t v1; unsigned char b[16]; } u = {};
    if (zfill == 0) {
        if (size_and_align == 16) u.v = *(const uint4 *)src_global;
        else if (size_and_align == 8) u.v2 = *(const uint2 *)src_global;
        else u.v1 = *(const uint32_t *)src_global;
    } else {
        const unsigned char *s = (const unsigned char *)src_global;
        for (size_t i = 0; i < size_and_align - zfill; i++) u.b[i] = s[i];
    }
    emu::async_push(dst_shared, u.b, (int)size_and_align);
}
static inline void __pipeline_commit() { emu::async_commit(); }
// the copies of every committed group but the last prior written to shared memory, each by one store of
// its width (counted as a shared store)
static inline void __pipeline_wait_prior(size_t prior) {
    emu::AsyncCopy c;
    while (emu::async_pop((int)prior, &c)) {
        if (c.n == 16) *(uint4 *)c.dst = *(const uint4 *)c.data;
        else if (c.n == 8) *(uint2 *)c.dst = *(const uint2 *)c.data;
        else *(uint32_t *)c.dst = *(const uint32_t *)c.data;
    }
}
