// Which build of the kernels runs (isa_begin.h): AVX-512 (F/BW/VL + VNNI), AVX2 (+FMA, F16C) or
// AVX2 with AVX-VNNI. All give the same bits (simd.h), so the choice is speed alone. Default: the
// best this CPU has (AVX-512, then AVX-VNNI, then AVX2);
// set_isa() (MLXCEL_KERNEL_ISA from Python) picks another one this CPU can run.
#pragma once

namespace mlxcel {

enum class Isa { avx512 = 0, avx2 = 1, avxvnni = 2 };

bool isa_supported(Isa isa);  // this CPU runs that build
Isa active_isa();
bool set_isa(Isa isa);  // false (and no change) where this CPU cannot run it

}  // namespace mlxcel
