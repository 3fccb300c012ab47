// Row-exact attention: see attention_kernel.h. Compiled with -mavx512f (CMakeLists.txt); only
// called after cpu_supported().
//
// Per query row: scores s_j = (q . k_j) * scale for its visible keys (the dot product is 16-lane
// FMAs over D in order, then one fixed 16-lane sum), m = max s_j, p_j = exp(s_j - m) with a
// vectorised Cephes polynomial (16 keys at a time, the last group masked), l = the 16-lane sum
// of p, out = (sum_j p_j v_j, keys in order) / l. Nothing depends on L, on the row's place in
// the block or on the threads, which split the (batch, head) pairs.
#include "attention_kernel.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include "thread_pool.h"

namespace mlxcel {

namespace {

// exp(x) for x <= 0 (scores minus their max): 2^n * P(f), x*log2(e) = n + f, |f| <= 1/2;
// MLX's CPU coefficients; below -88 the result is 0, as MLX's is
inline __m512 exp_le0(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-88.0f));
  const __m512 y = _mm512_mul_ps(x, _mm512_set1_ps(1.442695f));
  const __m512 n = _mm512_roundscale_ps(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(y, n);
  __m512 p = _mm512_set1_ps(1.535336188319500e-4f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.339887440266574e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.618437357674640e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.550332471162809e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.402264791363012e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931472028550421e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  const __m512 r = _mm512_mul_ps(p, _mm512_castsi512_ps(e));
  // n = -127 would be a denormal exponent field of 0: flush those to exactly 0
  return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.33f), _CMP_GE_OQ), r);
}

inline float dot(const float* a, const float* b, int D) {
  __m512 acc = _mm512_setzero_ps();
  int d = 0;
  for (; d + 16 <= D; d += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + d), _mm512_loadu_ps(b + d), acc);
  if (d < D) {
    const __mmask16 m = static_cast<__mmask16>((1u << (D - d)) - 1);
    acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + d), _mm512_maskz_loadu_ps(m, b + d), acc);
  }
  return _mm512_reduce_add_ps(acc);
}

// p_j = exp(s_j - m) in place, 16 at a time (the last group masked); returns the fixed 16-lane sum
inline float softmax_in_place(float* s, int visible, float m) {
  const __m512 mv = _mm512_set1_ps(m);
  __m512 lsum = _mm512_setzero_ps();
  int j = 0;
  for (; j + 16 <= visible; j += 16) {
    const __m512 p = exp_le0(_mm512_sub_ps(_mm512_loadu_ps(s + j), mv));
    _mm512_storeu_ps(s + j, p);
    lsum = _mm512_add_ps(lsum, p);
  }
  if (j < visible) {
    const __mmask16 mk = static_cast<__mmask16>((1u << (visible - j)) - 1);
    const __m512 p = _mm512_maskz_mov_ps(mk, exp_le0(_mm512_sub_ps(_mm512_maskz_loadu_ps(mk, s + j), mv)));
    _mm512_mask_storeu_ps(s + j, mk, p);
    lsum = _mm512_add_ps(lsum, p);
  }
  return _mm512_reduce_add_ps(lsum);
}

void one_row(const AttentionArgs& a, const float* q, const float* k, const float* v, float* out, int visible,
             std::vector<float>& s) {
  const int D = a.D;
  if (visible == 0) {  // no key to attend to (never in a causal block; kept well-defined)
    std::fill(out, out + D, 0.0f);
    return;
  }
  s.resize(visible);
  float m = -INFINITY;
  for (int j = 0; j < visible; ++j) {
    s[j] = dot(q, k + j * a.k_strides[2], D) * a.scale;
    m = std::max(m, s[j]);
  }
  const float inv = 1.0f / softmax_in_place(s.data(), visible, m);
  for (int d0 = 0; d0 < D; d0 += 64) {  // up to 4 accumulators of 16 dims, keys in order
    const int width = std::min(64, D - d0);
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    __mmask16 masks[4];
    for (int c = 0; c < 4; ++c) {
      const int left = width - 16 * c;
      masks[c] = left >= 16 ? 0xFFFF : left > 0 ? static_cast<__mmask16>((1u << left) - 1) : 0;
    }
    for (int jj = 0; jj < visible; ++jj) {
      const __m512 p = _mm512_set1_ps(s[jj]);
      const float* vr = v + jj * a.v_strides[2] + d0;
      for (int c = 0; c < 4; ++c)
        if (masks[c]) acc[c] = _mm512_fmadd_ps(p, _mm512_maskz_loadu_ps(masks[c], vr + 16 * c), acc[c]);
    }
    for (int c = 0; c < 4; ++c)
      if (masks[c]) _mm512_mask_storeu_ps(out + d0 + 16 * c, masks[c], _mm512_mul_ps(acc[c], _mm512_set1_ps(inv)));
  }
}

// D = 16 * NC: every loop has a compile-time trip count, so the accumulators stay in registers
template <int NC>
void one_row_fixed(const AttentionArgs& a, const float* q, const float* k, const float* v, float* out, int visible,
                   std::vector<float>& s) {
  __m512 qv[NC];
  for (int c = 0; c < NC; ++c) qv[c] = _mm512_loadu_ps(q + 16 * c);
  s.resize(visible);
  float m = -INFINITY;
  for (int j = 0; j < visible; ++j) {
    const float* kr = k + j * a.k_strides[2];
    __m512 acc = _mm512_mul_ps(qv[0], _mm512_loadu_ps(kr));
    for (int c = 1; c < NC; ++c) acc = _mm512_fmadd_ps(qv[c], _mm512_loadu_ps(kr + 16 * c), acc);
    s[j] = _mm512_reduce_add_ps(acc) * a.scale;
    m = std::max(m, s[j]);
  }
  const float inv = 1.0f / softmax_in_place(s.data(), visible, m);
  __m512 acc[NC];
  for (int c = 0; c < NC; ++c) acc[c] = _mm512_setzero_ps();
  for (int j = 0; j < visible; ++j) {
    const __m512 p = _mm512_set1_ps(s[j]);
    const float* vr = v + j * a.v_strides[2];
    for (int c = 0; c < NC; ++c) acc[c] = _mm512_fmadd_ps(p, _mm512_loadu_ps(vr + 16 * c), acc[c]);
  }
  const __m512 iv = _mm512_set1_ps(inv);
  for (int c = 0; c < NC; ++c) _mm512_storeu_ps(out + 16 * c, _mm512_mul_ps(acc[c], iv));
}

// one query row over its `vis` visible keys, by head dimension
inline void row(const AttentionArgs& a, const float* q, const float* k, const float* v, float* out, int vis,
                std::vector<float>& s) {
  if (vis == 0) std::fill(out, out + a.D, 0.0f);  // no key to attend to (never in a causal block)
  else if (a.D == 64) one_row_fixed<4>(a, q, k, v, out, vis, s);
  else if (a.D == 128) one_row_fixed<8>(a, q, k, v, out, vis, s);
  else if (a.D == 32) one_row_fixed<2>(a, q, k, v, out, vis, s);
  else one_row(a, q, k, v, out, vis, s);
}

// the pairs [0, pairs) split over the threads when the work pays for the hand-off
void split(int pairs, double work, int threads, const std::function<void(int, int)>& run) {
  threads = std::max(1, std::min({threads, pairs, static_cast<int>(work / 1.0e5)}));
  if (threads == 1) {
    run(0, pairs);
    return;
  }
  ThreadPool::instance().run(threads, [&](int t) {
    const int chunk = (pairs + threads - 1) / threads;
    run(std::min(pairs, t * chunk), std::min(pairs, (t + 1) * chunk));
  });
}

}  // namespace

void attention(const AttentionArgs& a, int threads) {
  const int group = a.Hq / a.Hkv;
  const int pairs = a.B * a.Hq;
  auto run = [&](int p0, int p1) {
    std::vector<float> s;
    for (int p = p0; p < p1; ++p) {
      const int b = p / a.Hq, h = p % a.Hq, kvh = h / group;
      const float* k = a.k + b * a.k_strides[0] + kvh * a.k_strides[1];
      const float* v = a.v + b * a.v_strides[0] + kvh * a.v_strides[1];
      for (int i = 0; i < a.L; ++i) {
        const float* q = a.q + b * a.q_strides[0] + h * a.q_strides[1] + i * a.q_strides[2];
        float* out = a.out + ((static_cast<int64_t>(b) * a.Hq + h) * a.L + i) * a.D;
        const int visible = a.causal ? a.S - a.L + i + 1 : a.S;
        row(a, q, k, v, out, std::max(visible, 0), s);
      }
    }
  };
  split(pairs, static_cast<double>(pairs) * a.L * a.S * a.D, threads, run);
}

void attention_rows(const RowsAttentionArgs& r, int threads) {
  const int group = r.Hq / r.Hkv;
  const int pairs = r.B * r.Hq;
  double work = 0;
  for (int b = 0; b < r.B; ++b) work += static_cast<double>(r.Hq) * r.L * (r.offset[b] + r.L) * r.D;
  auto run = [&](int p0, int p1) {
    std::vector<float> s;
    AttentionArgs a{};  // what the one-row code reads: D, scale and the key/value row strides
    a.D = r.D;
    a.scale = r.scale;
    a.k_strides[2] = a.v_strides[2] = r.D;
    for (int p = p0; p < p1; ++p) {
      const int b = p / r.Hq, h = p % r.Hq, kvh = h / group;
      const float* k = r.k[b] + kvh * r.head_stride[b];
      const float* v = r.v[b] + kvh * r.head_stride[b];
      for (int i = 0; i < r.L; ++i) {
        const float* q = r.q + b * r.q_strides[0] + h * r.q_strides[1] + i * r.q_strides[2];
        float* out = r.out + ((static_cast<int64_t>(b) * r.Hq + h) * r.L + i) * r.D;
        row(a, q, k, v, out, r.offset[b] + i + 1, s);
      }
    }
  };
  split(pairs, work, threads, run);
}

}  // namespace mlxcel
