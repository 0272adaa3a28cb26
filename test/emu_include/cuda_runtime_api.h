// cuda_runtime_api.h of the CUDA-on-CPU emulation: the runtime API subset that yolo.c (YOLO_CUDA),
// yolo_kernels.cu and the tests use, declared here and implemented by test/cuda_emu.cpp. The emulated
// build (test/emu.mk) puts test/emu_include first on the include path, so `#include <cuda_runtime_api.h>`
// finds this file and NVIDIA's headers are never read, installed or not: `make test` needs no toolkit.
// Plain C and C++. Enum values are NVIDIA's, so an error code printed by the emulation means what it
// means on a GPU. A name the code starts using and this file lacks is a compile error of the emulated
// build: declare it here, implement it in cuda_emu.cpp and test it in test/emu_selftest.cu.
#pragma once
#include <stddef.h>
#define CUDA_EMU_HEADERS 1
#ifdef __cplusplus
extern "C" {
#endif

typedef enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidDevice = 101,
    cudaErrorHostMemoryAlreadyRegistered = 712,
    cudaErrorHostMemoryNotRegistered = 713,
    cudaErrorNotReady = 600,
    cudaErrorUnknown = 999
} cudaError_t;

enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0, cudaMemcpyHostToDevice = 1, cudaMemcpyDeviceToHost = 2, cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4
};
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
enum cudaDeviceAttr {
    cudaDevAttrMaxThreadsPerBlock = 1, cudaDevAttrMaxSharedMemoryPerBlock = 8, cudaDevAttrWarpSize = 10,
    cudaDevAttrMultiProcessorCount = 16, cudaDevAttrComputeCapabilityMajor = 75, cudaDevAttrComputeCapabilityMinor = 76,
    cudaDevAttrMaxSharedMemoryPerMultiprocessor = 81, cudaDevAttrMaxSharedMemoryPerBlockOptin = 97
};
#ifndef __cplusplus
typedef enum cudaMemcpyKind cudaMemcpyKind;
typedef enum cudaFuncAttribute cudaFuncAttribute;
typedef enum cudaDeviceAttr cudaDeviceAttr;
#endif

typedef struct CUstream_st *cudaStream_t;   // opaque handles; NULL is the default stream
typedef struct CUevent_st *cudaEvent_t;
#define cudaStreamNonBlocking 0x01    // flags of cudaStreamCreateWithFlags / cudaEventCreateWithFlags (the
#define cudaEventDisableTiming 0x02   // emulation has one queue in program order, so both are accepted and ignored)

// the fields of NVIDIA's cudaDeviceProp that the code reads (the emulation reports an sm_80 with 4 SMs)
struct cudaDeviceProp {
    char name[256];
    size_t totalGlobalMem, sharedMemPerBlock, sharedMemPerBlockOptin;
    int warpSize, maxThreadsPerBlock, maxThreadsDim[3], maxGridSize[3], major, minor, multiProcessorCount;
};
typedef struct cudaDeviceProp cudaDeviceProp;

cudaError_t cudaMalloc(void **p, size_t size);
cudaError_t cudaFree(void *p);
cudaError_t cudaMallocHost(void **p, size_t size);
cudaError_t cudaHostAlloc(void **p, size_t size, unsigned int flags);
cudaError_t cudaFreeHost(void *p);
#define cudaHostRegisterDefault 0x00
cudaError_t cudaHostRegister(void *p, size_t size, unsigned int flags);
cudaError_t cudaHostUnregister(void *p);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind, cudaStream_t s);
cudaError_t cudaMemset(void *p, int v, size_t n);
cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s);
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaDeviceReset(void);
cudaError_t cudaStreamCreate(cudaStream_t *s);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamQuery(cudaStream_t s);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags);
cudaError_t cudaEventCreate(cudaEvent_t *e);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int flags);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end);
cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);
const char *cudaGetErrorString(cudaError_t e);
const char *cudaGetErrorName(cudaError_t e);
cudaError_t cudaSetDevice(int d);
cudaError_t cudaGetDevice(int *d);
cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int d);
cudaError_t cudaDeviceGetAttribute(int *v, enum cudaDeviceAttr attr, int d);
cudaError_t cudaFuncSetAttribute(const void *fn, enum cudaFuncAttribute attr, int v);

#ifdef __cplusplus
}
#endif
