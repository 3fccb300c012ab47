// What this CPU and OS let the extension run, checked at run time (the extension is built for
// the baseline ISA; the AVX-512 files run only after these said yes).
#pragma once

namespace mlxcel {

// Whether this CPU runs the AVX-512 build of the kernels (AVX-512 F/BW/VL + VNNI, F16C, FMA).
bool cpu_supported();

// Whether this CPU runs the AVX2 build (AVX2, FMA, F16C: Intel since Haswell, AMD since Zen).
bool avx2_supported();

// Whether this CPU runs the AVX-VNNI build (the AVX2 build's needs plus AVX-VNNI: Intel since
// Alder Lake, AMD since Zen 5). In the test build (MLXCEL_AVXVNNI_EVEX) that build's vpdpbusd is
// the EVEX one, so it asks for AVX-512 VL and VNNI instead.
bool avxvnni_supported();

// Whether this CPU has AMX tiles for int8, the extension was built with them, and the OS granted
// this process their state (asked once).
bool amx_supported();

}  // namespace mlxcel
