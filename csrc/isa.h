// Which build of the kernels runs (isa_begin.h): AVX-512 (F/BW/VL + VNNI) or AVX2 (+FMA, F16C).
// Both give the same bits (simd.h), so the choice is speed alone. Default: the best this CPU has;
// set_isa() (MLXCEL_KERNEL_ISA from Python) picks another one this CPU can run.
#pragma once

namespace mlxcel {

enum class Isa { avx512 = 0, avx2 = 1 };

bool isa_supported(Isa isa);  // this CPU runs that build
Isa active_isa();
bool set_isa(Isa isa);  // false (and no change) where this CPU cannot run it

}  // namespace mlxcel
