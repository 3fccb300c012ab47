// The kernels' dispatch (isa.h): each public kernel entry (qmm_kernel.h, attention_kernel.h,
// rowwise_kernel.h, layer_kernel.h) calls the chosen build. Built for the baseline ISA. A decode
// step makes ~100 of these calls; one relaxed load and a branch each.
#include "isa.h"

#include <atomic>
#include <climits>

#include "attention_kernel.h"
#include "cpu_features.h"
#include "fmm_kernel.h"
#include "layer_kernel.h"
#include "qmm_kernel.h"
#include "rowwise_kernel.h"

namespace mlxcel {

std::atomic<int> amx_rows{INT_MAX};

namespace {
Isa best() {
  if (isa_supported(Isa::avx512)) return Isa::avx512;
  return isa_supported(Isa::avxvnni) ? Isa::avxvnni : Isa::avx2;
}
std::atomic<int>& active() {
  static std::atomic<int> isa{static_cast<int>(best())};
  return isa;
}
inline Isa now() { return static_cast<Isa>(active().load(std::memory_order_relaxed)); }
}  // namespace

bool isa_supported(Isa isa) {
  switch (isa) {
    case Isa::avx512: return cpu_supported();
    case Isa::avxvnni: return avxvnni_supported();
    default: return avx2_supported();
  }
}

Isa active_isa() { return static_cast<Isa>(active().load()); }

bool set_isa(Isa isa) {
  if (!isa_supported(isa)) return false;
  active().store(static_cast<int>(isa));
  return true;
}

#define MLXCEL_DISPATCH(name, ...)                  \
  switch (now()) {                                  \
    case Isa::avx512: avx512::name(__VA_ARGS__); break;   \
    case Isa::avxvnni: avxvnni::name(__VA_ARGS__); break; \
    default: avx2::name(__VA_ARGS__); break;              \
  }

void dequantize_rows(const uint8_t* w, const void* scales, const void* biases, bool half, const uint32_t* ids, int R,
                     int N, int K, int bits, float* out) {
  MLXCEL_DISPATCH(dequantize_rows, w, scales, biases, half, ids, R, N, K, bits, out);
}
void qmm_multi(const float* x, const WeightRef* weights, int count, int M, int K, int bits, int threads) {
  MLXCEL_DISPATCH(qmm_multi, x, weights, count, M, K, bits, threads);
}
void fmm_multi(const float* x, const FloatWeightRef* weights, int count, int M, int K, int threads) {
  MLXCEL_DISPATCH(fmm_multi, x, weights, count, M, K, threads);
}
void attention(const AttentionArgs& a, int threads) { MLXCEL_DISPATCH(attention, a, threads); }
void attention_rows(const RowsAttentionArgs& a, int threads) { MLXCEL_DISPATCH(attention_rows, a, threads); }
void store_kv_row(void* dst, KvType t, const float* src, int n) { MLXCEL_DISPATCH(store_kv_row, dst, t, src, n); }
void swiglu(const float* gate, const float* up, float* out, int64_t n) { MLXCEL_DISPATCH(swiglu, gate, up, out, n); }
void rope(const float* x, const int64_t* strides, float* out, int B, int H, int L, int D, int dims, bool traditional,
          const float* cos_sin, int threads) {
  MLXCEL_DISPATCH(rope, x, strides, out, B, H, L, D, dims, traditional, cos_sin, threads);
}
void decoder_layer(const DecoderLayerView& layer, const LayerRows& rows, int threads) {
  MLXCEL_DISPATCH(decoder_layer, layer, rows, threads);
}
void rms_norm_rows(const float* x, const float* w, float eps, int R, int n, float* out) {
  MLXCEL_DISPATCH(rms_norm_rows, x, w, eps, R, n, out);
}

}  // namespace mlxcel
