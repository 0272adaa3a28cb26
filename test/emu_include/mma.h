// mma.h of the CUDA-on-CPU emulation: nvcuda::wmma is defined in test/cuda_emu.h (force-included
// into every emulated .cu file), where every lane of a warp holds the whole tile.
#pragma once
