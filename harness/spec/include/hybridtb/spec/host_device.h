// HYBRIDTB_HOST_DEVICE marks a small function that both host C++ and device code call: under nvcc
// it is __host__ __device__ and always inlined, elsewhere a plain inline function. Shared by the
// visibility rule (visibility.h) and the CUDA backend's kernel capabilities table, so that one
// definition of the macro exists in any translation unit that includes both.
#pragma once

#if defined(__CUDACC__)
#define HYBRIDTB_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define HYBRIDTB_HOST_DEVICE inline
#endif
