// Run-time CPU checks (see cpu_features.h). Built without AVX-512 flags, so it runs anywhere.
#include "cpu_features.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace mlxcel {

bool cpu_supported() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni") && avx2_supported();
}

bool avx2_supported() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}

bool avxvnni_supported() {
  if (!avx2_supported()) return false;
#if MLXCEL_AVXVNNI_EVEX
  return __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
#else
  return __builtin_cpu_supports("avxvnni");
#endif
}

bool amx_supported() {
  static const bool ok = [] {
#if MLXCEL_AMX && defined(__linux__)
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!cpu_supported() || !__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    if (!((d >> 24) & 1u) || !((d >> 25) & 1u)) return false;  // AMX-TILE, AMX-INT8
    // Linux hands out the tile state only on request (ARCH_REQ_XCOMP_PERM, XTILEDATA)
    return syscall(SYS_arch_prctl, 0x1023, 18) == 0;
#else
    return false;
#endif
  }();
  return ok;
}

}  // namespace mlxcel
