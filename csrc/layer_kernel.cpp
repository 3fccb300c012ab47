// The llama-family decoder layer in one call (layer_kernel.h). Built once per ISA (isa_begin.h);
// only called after isa.cpp chose the build, and calls that build's kernels.
//
// Why: through mlx-lm's model code a decode step of the default model is ~1,200 MLX ops (about
// 40 a layer) whose Python graph building and per-op dispatch cost as much as the matmuls. Here a
// layer is one op: the matmuls are the same row-exact kernel calls (each its own parallel
// region, work taken by whichever thread is free: thread_pool.h), and everything between them
// (norms, rope, cache writes, residuals) is a few microseconds of row-wise work on the calling
// thread.
#include <cmath>
#include <cstring>
#include <vector>

#include "attention_kernel.h"
#include "fmm_kernel.h"
#include "layer_kernel.h"
#include "qmm_kernel.h"
#include "rowwise_kernel.h"
// after every other header: the ISA's target applies to this file's own code only
#include "isa_begin.h"
#include "simd.h"

namespace mlxcel {
namespace MLXCEL_ISA {
// (calls say MLXCEL_ISA:: because argument-dependent lookup also finds the dispatchers)

void rms_norm_rows(const float* x, const float* w, float eps, int R, int n, float* out) {
  // MLX's own arithmetic (mx.fast.rms_norm on the CPU falls back to x * rsqrt(mean(x^2) + eps) * w:
  // a sum in order, times 1/n, 1/sqrt), so a fused layer gives the bits mlx-lm's layer gives
  const float inv_n = static_cast<float>(1.0 / n);
  for (int r = 0; r < R; ++r) {
    const float* xr = x + static_cast<int64_t>(r) * n;
    float* o = out + static_cast<int64_t>(r) * n;
    float sum = 0.0f;
    for (int j = 0; j < n; ++j) sum += xr[j] * xr[j];
    const vf inv = set1(1.0f / std::sqrt(sum * inv_n + eps));
    for (int j = 0; j < n; j += 16) store_n(o + j, mul(mul(load_n(xr + j, n - j), inv), load_n(w + j, n - j)), n - j);
  }
}

namespace {

void add_rows(const float* a, const float* b, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    store(out + i, add(load(a + i), load(b + i)));
  for (; i < n; ++i) out[i] = a[i] + b[i];
}

void add_bias(float* y, const float* bias, int T, int N) {
  if (bias == nullptr) return;
  for (int t = 0; t < T; ++t) add_rows(y + static_cast<int64_t>(t) * N, bias, y + static_cast<int64_t>(t) * N, N);
}

constexpr int kMaxShared = 3;  // linears sharing one input: q/k/v

// y_i = x @ W_i^T (+ bias_i) for linears sharing the input x [T, K]: one kernel call when they are
// all float, or all quantized to the same bits (x quantized once), else one call each; the
// outputs are the same either way
void project(const float* x, int T, const LinearView* const* lin, float* const* out, int count, int threads) {
  bool same = true, floats = true;
  for (int i = 0; i < count; ++i) {
    same = same && !lin[i]->floating && lin[i]->bits == lin[0]->bits;
    floats = floats && lin[i]->floating;
  }
  WeightRef refs[kMaxShared];  // on the stack: a layer makes four of these calls a row block
  FloatWeightRef frefs[kMaxShared];
  for (int i = 0; i < count; ++i) {
    refs[i] = {lin[i]->w, lin[i]->scales, lin[i]->biases, out[i], lin[i]->N, lin[i]->half};
    frefs[i] = {lin[i]->w, static_cast<FloatForm>(lin[i]->form), out[i], lin[i]->N};
  }
  if (floats) {
    MLXCEL_ISA::fmm_multi(x, frefs, count, T, lin[0]->K, threads);
  } else if (same) {
    MLXCEL_ISA::qmm_multi(x, refs, count, T, lin[0]->K, lin[0]->bits, threads);
  } else {
    for (int i = 0; i < count; ++i) {
      if (lin[i]->floating) MLXCEL_ISA::fmm_multi(x, &frefs[i], 1, T, lin[i]->K, threads);
      else MLXCEL_ISA::qmm_multi(x, &refs[i], 1, T, lin[i]->K, lin[i]->bits, threads);
    }
  }
  for (int i = 0; i < count; ++i) add_bias(out[i], lin[i]->bias, T, lin[i]->N);
}

struct Scratch {
  std::vector<float> xn, q, k, v, qr, kr, att, h1, dn, g, u;
  void size(int T, int hidden, int qd, int kvd, int inter) {
    const auto at = [](std::vector<float>& b, int64_t n) {
      if (static_cast<int64_t>(b.size()) < n) b.resize(n);
    };
    at(xn, static_cast<int64_t>(T) * hidden);
    at(h1, static_cast<int64_t>(T) * hidden);
    at(dn, static_cast<int64_t>(T) * hidden);
    at(q, static_cast<int64_t>(T) * qd);
    at(qr, static_cast<int64_t>(T) * qd);
    at(att, static_cast<int64_t>(T) * qd);
    at(k, static_cast<int64_t>(T) * kvd);
    at(kr, static_cast<int64_t>(T) * kvd);
    at(v, static_cast<int64_t>(T) * kvd);
    at(g, static_cast<int64_t>(T) * inter);
    at(u, static_cast<int64_t>(T) * inter);
  }
};

}  // namespace

void decoder_layer(const DecoderLayerView& L, const LayerRows& R, int threads) {
  const int T = R.T, hidden = L.o.N, in = L.q.K, D = L.D, Hq = L.Hq, Hkv = L.Hkv, inter = L.gate.N;
  const int qd = Hq * D, kvd = Hkv * D;
  thread_local Scratch s;  // the MLX stream's thread; buffers grow once and are kept
  s.size(T, in, qd, kvd, inter);

  // attention
  if (L.in2_norm == nullptr) {
    MLXCEL_ISA::rms_norm_rows(R.h, L.attn_norm, L.eps, T, hidden, s.xn.data());
  } else {  // EAGLE-3: each row's input is its two normed halves side by side
    for (int t = 0; t < T; ++t) {
      float* x = s.xn.data() + static_cast<int64_t>(t) * in;
      MLXCEL_ISA::rms_norm_rows(R.e + static_cast<int64_t>(t) * hidden, L.attn_norm, L.eps, 1, hidden, x);
      MLXCEL_ISA::rms_norm_rows(R.h + static_cast<int64_t>(t) * hidden, L.in2_norm, L.eps, 1, hidden, x + hidden);
    }
  }
  {
    const LinearView* lin[3] = {&L.q, &L.k, &L.v};
    float* out[3] = {s.q.data(), s.k.data(), s.v.data()};
    project(s.xn.data(), T, lin, out, 3, threads);
  }
  if (L.q_norm != nullptr) MLXCEL_ISA::rms_norm_rows(s.q.data(), L.q_norm, L.qk_eps, T * Hq, D, s.q.data());
  if (L.k_norm != nullptr) MLXCEL_ISA::rms_norm_rows(s.k.data(), L.k_norm, L.qk_eps, T * Hkv, D, s.k.data());
  const int64_t qst[3] = {qd, D, D}, kst[3] = {kvd, D, D};
  MLXCEL_ISA::rope(s.q.data(), qst, s.qr.data(), T, Hq, 1, D, L.rope_dims, L.rope_traditional, R.cos_sin, 1);
  MLXCEL_ISA::rope(s.k.data(), kst, s.kr.data(), T, Hkv, 1, D, L.rope_dims, L.rope_traditional, R.cos_sin, 1);
  // every row's key and value first: a row of a verify block attends the rows before it
  for (int t = 0; t < T; ++t) {
    const int b = R.seq[t];
    for (int h = 0; h < Hkv; ++h) {
      const int64_t at = R.slot ? R.slot[t] : R.pos[t];
      MLXCEL_ISA::store_kv_row(kv_row_at(R.k_bufs[b], R.capacity[b], h, at, D, R.kt), R.kt,
                               s.kr.data() + (static_cast<int64_t>(t) * Hkv + h) * D, D);
      MLXCEL_ISA::store_kv_row(kv_row_at(R.v_bufs[b], R.capacity[b], h, at, D, R.vt), R.vt,
                               s.v.data() + (static_cast<int64_t>(t) * Hkv + h) * D, D);
    }
  }
  {
    std::vector<const void*> kp(T), vp(T);
    std::vector<int64_t> cap(T);
    for (int t = 0; t < T; ++t) {
      kp[t] = R.k_bufs[R.seq[t]];
      vp[t] = R.v_bufs[R.seq[t]];
      cap[t] = R.capacity[R.seq[t]];
    }
    RowsAttentionArgs a{};
    a.q = s.qr.data();
    a.q_strides[0] = qd;
    a.q_strides[1] = D;
    a.q_strides[2] = D;
    a.k = kp.data();
    a.v = vp.data();
    a.kt = R.kt;
    a.vt = R.vt;
    a.capacity = cap.data();
    a.offset = R.pos;
    a.out = s.att.data();
    a.B = T;
    a.Hq = Hq;
    a.Hkv = Hkv;
    a.L = 1;
    a.D = D;
    a.scale = L.attn_scale;
    if (R.slot != nullptr) {
      a.vis_base = R.vis_base;
      a.vis_tail = R.vis_tail;
      a.vis_tail_n = R.vis_tail_n;
    }
    MLXCEL_ISA::attention_rows(a, threads);
  }
  {
    const LinearView* lin[1] = {&L.o};
    float* out[1] = {s.dn.data()};
    project(s.att.data(), T, lin, out, 1, threads);
  }
  add_rows(R.h, s.dn.data(), s.h1.data(), static_cast<int64_t>(T) * hidden);

  // MLP
  MLXCEL_ISA::rms_norm_rows(s.h1.data(), L.mlp_norm, L.eps, T, hidden, s.xn.data());
  {
    const LinearView* lin[2] = {&L.gate, &L.up};
    float* out[2] = {s.g.data(), s.u.data()};
    project(s.xn.data(), T, lin, out, 2, threads);
  }
  MLXCEL_ISA::swiglu(s.g.data(), s.u.data(), s.g.data(), static_cast<int64_t>(T) * inter);
  {
    const LinearView* lin[1] = {&L.down};
    float* out[1] = {s.dn.data()};
    project(s.g.data(), T, lin, out, 1, threads);
  }
  add_rows(s.h1.data(), s.dn.data(), R.out, static_cast<int64_t>(T) * hidden);
}

}  // namespace MLXCEL_ISA
}  // namespace mlxcel
