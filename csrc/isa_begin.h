// The instruction set of this build of a kernel file. The build wraps each *_kernel.cpp thrice
// (CMakeLists.txt: MLXCEL_ISA_AVX512 or MLXCEL_ISA_AVXVNNI 1, neither for AVX2) and the file
// includes this after its other headers, so only the kernel code that follows gets the target: standard-library templates instantiated in
// it stay baseline code, and a function the linker shares between files never carries AVX-512
// instructions onto a CPU that only has AVX2. Nothing compiled here runs before isa.cpp chose it.
#pragma once

#if MLXCEL_ISA_AVX512
#define MLXCEL_ISA avx512
#if MLXCEL_AMX
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,f16c,fma,amx-tile,amx-int8")
#else
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,f16c,fma")
#endif
#elif MLXCEL_ISA_AVXVNNI
// AVX2 plus vpdpbusd on 256-bit vectors: everything but the matmul's integer dot products is the
// AVX2 build's code (simd.h's 256-bit half). MLXCEL_AVXVNNI_EVEX: the test build (CMakeLists.txt)
#define MLXCEL_ISA avxvnni
#if MLXCEL_AVXVNNI_EVEX
#pragma GCC target("avx2,fma,f16c,avx512vl,avx512vnni")
#else
#pragma GCC target("avx2,fma,f16c,avxvnni")
#endif
#else
#define MLXCEL_ISA avx2
#pragma GCC target("avx2,fma,f16c")
#endif
