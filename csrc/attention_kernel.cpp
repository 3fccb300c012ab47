// Row-exact attention: see attention_kernel.h. Built once per ISA (isa_begin.h, simd.h: the same
// bits on each); only called after isa.cpp chose the build.
//
// Per query row: scores s_j = (q . k_j) * scale for its visible keys (the dot product is 16-lane
// FMAs over D in order, then one fixed 16-lane sum, 16 keys' sums at a time), m = max s_j,
// p_j = exp(s_j - m) with a vectorised Cephes polynomial (16 keys at a time, the last group
// masked), l = the 16-lane sum of p, out = (sum_j p_j v_j, key j into accumulator set j % SETS,
// the sets added in a fixed order) / l. A row with more than KEY_CHUNK visible keys does that per
// chunk of KEY_CHUNK keys and merges the chunks in order (merge()). Nothing depends on L, on the
// row's place in the block, on which queries go through together or on the threads, which split
// the queries by their keys and long queries by their key chunks. Keys and values are float32,
// float16, bfloat16, q8_0 or q4_0 (KvType: widened exactly as they are loaded, row16()).
#include <algorithm>
#include <cmath>
#include <functional>
#include <type_traits>
#include <vector>

#include "attention_kernel.h"
#include "thread_pool.h"
// after every other header: the ISA's target applies to this file's own code only
#include "isa_begin.h"
#include "simd.h"

namespace mlxcel {
namespace MLXCEL_ISA {

namespace {
// Queries of one KV head taken together (kv_unit): their value accumulators and scores stay in L1
// while the keys pass. A prompt chunk of 64 rows is 192 queries a head on the default model;
// in one pass their 1 KB accumulators went through L2 for every 16 keys (1.9x slower). 24 keeps a
// verify block of up to 8 rows (3 query heads a KV head) in one pass over its keys.
constexpr int QUERY_GROUP = 24;

// AVX2 has 16 vector registers and a vf is two of them: kv_unit's loops that keep 16 or more vf
// live at once (fine in AVX-512's 32) spilled to the stack around every FMA (44% of the kernel's
// samples were moves). Under kFewRegisters they take their keys or dimensions in smaller groups:
// loop orders only, each lane's arithmetic unchanged, so both builds still give the same bits.
// 5-15% faster at every cache type, one row or 64 (scripts/attention_kernel_bench.py, two
// interleaved runs on a Zen 4 without AVX-512); the AVX2 build stays compute-bound, so f16 and
// q8_0 rows gain little over float32 there (1.0-1.1x at 6k keys, against 2x on AVX-512).
constexpr bool kFewRegisters = !MLXCEL_ISA_AVX512;

// exp(x) for x <= 0 (scores minus their max); below -88 the result is 0, as MLX's is
inline vf exp_le0(vf x) {
  x = max(x, set1(-88.0f));
  const vf r = exp_poly(x);
  // n = -127 would be a denormal exponent field of 0: flush those to exactly 0
  return keep_ge(x, -87.33f, r);
}

template <typename TK>
inline float dot(const float* a, const TK* b, int D) {
  vf acc = zero();
  int d = 0;
  for (; d + 16 <= D; d += 16) acc = fmadd(load(a + d), load_kv(b + d), acc);
  if (d < D) acc = fmadd(load_n(a + d, D - d), load_kv_n(b + d, D - d), acc);
  return reduce_add(acc);
}

// p_j = exp(s_j - m) in place, 16 at a time (the last group masked); returns the fixed 16-lane sum
inline float softmax_in_place(float* s, int visible, float m) {
  const vf mv = set1(m);
  vf lsum = zero();
  int j = 0;
  for (; j + 16 <= visible; j += 16) {
    const vf p = exp_le0(sub(load(s + j), mv));
    store(s + j, p);
    lsum = add(lsum, p);
  }
  if (j < visible) {
    const int n = visible - j;
    const vf p = keep_n(exp_le0(sub(load_n(s + j, n), mv)), n);
    store_n(s + j, p, n);
    lsum = add(lsum, p);
  }
  return reduce_add(lsum);
}

// Key j of a query: row j of the buffer below `base`, else row tail[j - base] (tree rows: the
// context, then the node's ancestors and itself). Plain rows have base == their visible count.
inline int64_t key_at(int j, int base, const int* tail) { return j < base ? j : tail[j - base]; }

template <typename TK, typename TV>
void one_row(const AttentionArgs& a, const float* q, const TK* k, const TV* v, float* out, int visible, int base,
             const int* tail, std::vector<float>& s) {
  const int D = a.D;
  if (visible == 0) {  // no key to attend to (never in a causal block; kept well-defined)
    std::fill(out, out + D, 0.0f);
    return;
  }
  s.resize(visible);
  float m = -INFINITY;
  for (int j = 0; j < visible; ++j) {
    s[j] = dot(q, k + key_at(j, base, tail) * a.k_strides[2], D) * a.scale;
    m = std::max(m, s[j]);
  }
  const float inv = 1.0f / softmax_in_place(s.data(), visible, m);
  for (int d0 = 0; d0 < D; d0 += 64) {  // up to 4 accumulators of 16 dims, keys in order
    const int width = std::min(64, D - d0);
    vf acc[4] = {zero(), zero(), zero(), zero()};
    int lanes[4];
    for (int c = 0; c < 4; ++c) lanes[c] = std::max(0, std::min(16, width - 16 * c));
    for (int jj = 0; jj < visible; ++jj) {
      const vf p = set1(s[jj]);
      const TV* vr = v + key_at(jj, base, tail) * a.v_strides[2] + d0;
      for (int c = 0; c < 4; ++c)
        if (lanes[c]) acc[c] = fmadd(p, load_kv_n(vr + 16 * c, lanes[c]), acc[c]);
    }
    for (int c = 0; c < 4; ++c)
      if (lanes[c]) store_n(out + d0 + 16 * c, mul(acc[c], set1(inv)), lanes[c]);
  }
}

// one query row over its `vis` visible keys (head widths other than 32, 64, 128)
template <typename TK, typename TV>
inline void row(const AttentionArgs& a, const float* q, const TK* k, const TV* v, float* out, int vis, int base,
                const int* tail, std::vector<float>& s) {
  if (vis == 0) std::fill(out, out + a.D, 0.0f);  // no key to attend to (never in a causal block)
  else one_row(a, q, k, v, out, vis, base, tail, s);
}

// Keys a query reads in one pass, at most (a multiple of 16). A query with more visible keys is
// computed in chunks of KEY_CHUNK keys (keys 0..KEY_CHUNK-1, then the next KEY_CHUNK...), each
// with its own max, exp sum and weighted values, merged in chunk order (merge()): the chunks are
// a function of the visible keys alone, so a row's bits do not depend on its block, its place in
// it or the threads, and the threads can split one long query's keys instead of only whole KV
// heads (3 KV heads on 2 threads left one thread idle a third of the time at long contexts).
constexpr int KEY_CHUNK = 1024;

inline int chunks_of(int vis) { return std::max(1, (vis + KEY_CHUNK - 1) / KEY_CHUNK); }

struct Query {
  const float* q;
  float* out;
  int vis;
  int base;                    // keys 0..base-1 are the buffer's rows 0..base-1 (== vis: all of them)
  const int* tail = nullptr;   // then buffer rows tail[0..vis-base-1] (tree rows; key_at)
  int id = 0;                  // its partial results' place (Partials)
};

// Per query and chunk: the chunk's max score, its exp sum and its unnormalized weighted values
// (D floats), [m, l, acc...] at (id * chunks + c) * stride
struct Partials {
  float* p = nullptr;
  int chunks = 1, stride = 0;
  float* at(int id, int c) const { return p + (static_cast<int64_t>(id) * chunks + c) * stride; }
};

struct Scratch {
  std::vector<float> s, acc, m, l;
  std::vector<Query> queries;
};

// Rows j0..j1-1 of a head's keys or values on their way to L1. A unit's keys are one short stream
// per (sequence, KV head): a batch of 16 sequences at 60 tokens starts 48 of them a layer, each
// too short for the hardware prefetcher to catch before it ends, and the scores waited on them.
constexpr int KEYS_AHEAD = 32;

template <typename T>
inline void prefetch_rows(const T* base, int64_t stride, int j0, int j1) {
  const int bytes = static_cast<int>(stride * sizeof(T));  // one row (rows are contiguous)
  for (int j = j0; j < j1; ++j)
    for (int off = 0; off < bytes; off += 64)
      _mm_prefetch(reinterpret_cast<const char*>(base + j * stride) + off, _MM_HINT_T0);
}

// Scores of up to 16 shared key rows (row(jj), jj < maxcnt) for G queries at once, AVX2
// (kFewRegisters): each key's 16-dim slice is loaded (and widened) once for the G queries, whose
// own values come from L1 (a tree query, whose rows are its own, goes alone: G = 1). A query's sum for key jj is kv_unit's (q . k over the slices in order,
// then hsum16's tree), folded to 4 lanes as it is made (fold16), so only 16 bytes of it wait in
// L1 for the rest of the tree (hsum16_folded) instead of 64: the same bits.
template <int G, int NC, typename Row>
inline void score_group(Row row, const float* const* q, float* const* out, const int* cnt, int maxcnt, vf scl) {
  constexpr int D = 16 * NC;
  __m128 p[G][16];
  for (int jj = 0; jj < maxcnt; ++jj) {
    vf x[G];
    const auto* kr = row(jj);
    const vf k0 = row16<D>(kr, 0);
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) x[g] = mul(load(q[g]), k0);
#pragma GCC unroll 8
    for (int cc = 1; cc < NC; ++cc) {
      const vf k = row16<D>(kr, cc);
#pragma GCC unroll 4
      for (int g = 0; g < G; ++g) x[g] = fmadd(load(q[g] + 16 * cc), k, x[g]);
    }
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) p[g][jj] = jj < cnt[g] ? fold16(x[g]) : _mm_setzero_ps();
  }
#pragma GCC unroll 4
  for (int g = 0; g < G; ++g) {
    if (cnt[g] <= 0) continue;
    for (int jj = maxcnt; jj < 16; ++jj) p[g][jj] = _mm_setzero_ps();
    store_n(out[g], mul(hsum16_folded(p[g]), scl), cnt[g]);
  }
}

// Weighted values of up to 16 shared rows (row(jj), jj < maxcnt) for G queries at once, AVX2
// (kFewRegisters): one 16-dim slice and one accumulator set at a time, so G queries' accumulators
// (2G registers), the row's slice (2) and a broadcast fit 16 registers. Each row slice is loaded
// (and widened) once for the G queries instead of once per query: the value pass was bound by
// loads (two a cycle), a row slice and a broadcast per two FMAs. Accumulator (query, set e, slice)
// still sees keys e, e + SETS, ... in key order, the FMAs kv_unit's own loop gives it: the same
// bits. On the staged rows only: float32 rows read in place from a cache bigger than L3 (a
// 6k-token context) ran 5-12% slower in this order, which visits a block's rows four times a slice.
template <int G, int NC, int SETS, typename Row>
inline void weigh_group(Row row, const float* const* sp, float* const* ap, const int* cnt, int maxcnt) {
  constexpr int D = 16 * NC;
  for (int cc = 0; cc < NC; ++cc) {
    for (int e = 0; e < SETS; ++e) {
      vf acc[G];
#pragma GCC unroll 4
      for (int g = 0; g < G; ++g) acc[g] = load(ap[g] + (e * NC + cc) * 16);
      for (int jj = e; jj < maxcnt; jj += SETS) {
        const vf x = row16<D>(row(jj), cc);
#pragma GCC unroll 4
        for (int g = 0; g < G; ++g)
          if (jj < cnt[g]) acc[g] = fmadd(set1(sp[g][jj]), x, acc[g]);
      }
#pragma GCC unroll 4
      for (int g = 0; g < G; ++g) store(ap[g] + (e * NC + cc) * 16, acc[g]);
    }
  }
}

// Every query of one KV head at once (the heads that share it, the rows of a block), over the keys
// of chunk c: keys and values pass through 16 at a time for all the queries while they sit in L1,
// instead of once per query from L2. Each query's arithmetic is fixed by its own keys (the same
// hsum16 groups of 16 keys, the same max, the same exp and sum, key j into value set j % SETS in
// key order, the sets added in the same order); which queries go through together only
// interchanges loops. GATHER: some query sees listed rows after its prefix (tree rows, key_at);
// the keys each query reads, and their order, are then its own, with the same arithmetic over them.
template <int NC, bool GATHER, typename TK, typename TV>
void kv_unit(const Query* qs, int n, const TK* k, const TV* v, int64_t ks, int64_t vs, float scale, int c,
             const Partials& parts, Scratch& sc) {
  constexpr int SETS = NC <= 4 ? 4 : 2;
  constexpr int ACC = SETS * NC * 16;  // floats of one query's value accumulators
  const int lo = c * KEY_CHUNK;        // this chunk's first key
  const auto count = [&](int t) { return std::max(0, std::min(KEY_CHUNK, qs[t].vis - lo)); };
  int maxvis = 0;
  for (int t = 0; t < n; ++t) maxvis = std::max(maxvis, count(t));
  const size_t stride = static_cast<size_t>(maxvis + 15) / 16 * 16;
  sc.s.resize(stride * n);
  sc.m.resize(n);
  sc.l.resize(n);
  sc.acc.assign(static_cast<size_t>(ACC) * n, 0.0f);
  const vf scl = set1(scale);
  constexpr int D = 16 * NC;
  prefetch_rows(k, ks, lo, lo + std::min(maxvis, KEYS_AHEAD));
  prefetch_rows(v, vs, lo, lo + std::min(maxvis, KEYS_AHEAD));
  // float16, bfloat16 and q8_0 rows shared by several queries (a block's rows, a KV head's query
  // heads) are widened once per 16 keys into an L1 buffer instead of once per query: the same
  // float32 values (the conversion is exact), so the same bits, for a fraction of the conversions.
  // Not for tree rows (GATHER: each query's tail rows are its own). From 2 queries: a decode step
  // of the default model (3 query heads a KV head) at 6k keys went from 1.28-1.32x float32's speed
  // to 1.74-1.77x at f16 (two A/B runs; 64-row prompt chunks were already staged, 1.25x).
  constexpr int kStageQueries = 2;
  constexpr bool STAGE_K = !GATHER && !std::is_same_v<TK, float>;
  constexpr bool STAGE_V = !GATHER && !std::is_same_v<TV, float>;
  alignas(64) float staged[16 * D];
  // f(row): the pass over keys (or values) j0..j0+15 with row(t, jj) the pointer to query t's key
  // j0 + jj: the widened copy where `stageable` and enough queries share it, else the buffer's row
  const auto with_rows = [&](auto stageable, const auto* rows, int64_t rs, int j0, auto f) {
    if (stageable && n >= kStageQueries) {
      const int g = std::min(16, maxvis - j0);
      for (int jj = 0; jj < g; ++jj)
#pragma GCC unroll 8
        for (int cc = 0; cc < NC; ++cc) store(staged + jj * D + 16 * cc, row16<D>(rows + (lo + j0 + jj) * rs, cc));
      f([&](int, int jj) -> const float* { return staged + jj * D; });
    } else {
      f([&](int t, int jj) {
        const int j = lo + j0 + jj;
        return rows + (GATHER ? key_at(j, qs[t].base, qs[t].tail) : j) * rs;
      });
    }
  };
  // AVX2's passes (score_group, weigh_group): the queries in groups of three where they read the
  // same rows, one at a time where tree rows make a query's keys its own (GATHER), with each one's
  // count of keys among j0..j0+15: f(G as a compile-time constant, first query, counts, their max)
  constexpr int kGroup = GATHER ? 1 : 3;
  const auto in_groups = [&](int j0, auto f) {
    for (int t0 = 0; t0 < n; t0 += kGroup) {
      const int G = std::min(kGroup, n - t0);
      int cnt[3], maxcnt = 0;
      for (int g = 0; g < G; ++g) {
        cnt[g] = std::max(0, std::min(16, count(t0 + g) - j0));
        maxcnt = std::max(maxcnt, cnt[g]);
      }
      if (G == 3) f(std::integral_constant<int, 3>{}, t0, cnt, maxcnt);
      else if (G == 2) f(std::integral_constant<int, 2>{}, t0, cnt, maxcnt);
      else f(std::integral_constant<int, 1>{}, t0, cnt, maxcnt);
    }
  };
  for (int j0 = 0; j0 < maxvis; j0 += 16) {  // scores
    if (j0 + KEYS_AHEAD < maxvis) prefetch_rows(k, ks, lo + j0 + KEYS_AHEAD, lo + std::min(maxvis, j0 + KEYS_AHEAD + 16));
    const auto scores = [&](auto key_row) {
      if constexpr (kFewRegisters) {
        in_groups(j0, [&](auto G, int t0, const int* cnt, int maxcnt) {
          const float* qg[3];
          float* out[3];
          for (int g = 0; g < G; ++g) {
            qg[g] = qs[t0 + g].q;
            out[g] = sc.s.data() + stride * (t0 + g) + j0;
          }
          // key_row(t0, .): every query's rows in a group (they share them), a tree query's own
          score_group<G, NC>([&](int jj) { return key_row(t0, jj); }, qg, out, cnt, maxcnt, scl);
        });
      } else {
        for (int t = 0; t < n; ++t) {
          const int left = count(t) - j0;
          if (left <= 0) continue;
          const int cnt = std::min(16, left);
          vf qv[NC], acc[16];
#pragma GCC unroll 8
          for (int cc = 0; cc < NC; ++cc) qv[cc] = load(qs[t].q + 16 * cc);
          const auto key_sum = [&](int jj) {
            const auto* kr = key_row(t, jj);
            vf x = mul(qv[0], row16<D>(kr, 0));
#pragma GCC unroll 8
            for (int cc = 1; cc < NC; ++cc) x = fmadd(qv[cc], row16<D>(kr, cc), x);
            return x;
          };
#pragma GCC unroll 16
          for (int jj = 0; jj < 16; ++jj) acc[jj] = jj < cnt ? key_sum(jj) : zero();
          store_n(sc.s.data() + stride * t + j0, mul(hsum16(acc), scl), cnt);
        }
      }
    };
    with_rows(std::bool_constant<STAGE_K>{}, k, ks, j0, scores);
  }
  for (int t = 0; t < n; ++t) {  // softmax (unnormalized: merge() divides)
    float* sp = sc.s.data() + stride * t;
    const int vis = count(t);
    vf mv = set1(-INFINITY);
    for (int j = 0; j < vis; j += 16) mv = max_n(mv, load_n(sp + j, vis - j), vis - j);
    sc.m[t] = reduce_max(mv);
    sc.l[t] = vis > 0 ? softmax_in_place(sp, vis, sc.m[t]) : 0.0f;
  }
  for (int j0 = 0; j0 < maxvis; j0 += 16) {  // weighted values
    if (j0 + KEYS_AHEAD < maxvis) prefetch_rows(v, vs, lo + j0 + KEYS_AHEAD, lo + std::min(maxvis, j0 + KEYS_AHEAD + 16));
    const auto weigh = [&](auto value_row) {
      if constexpr (kFewRegisters && STAGE_V) {
        if (n >= kStageQueries) {  // every query reads the same staged rows: three a pass (weigh_group)
          in_groups(j0, [&](auto G, int t0, const int* cnt, int maxcnt) {
            const float* sp[3];
            float* ap[3];
            for (int g = 0; g < G; ++g) {
              sp[g] = sc.s.data() + stride * (t0 + g) + j0;
              ap[g] = sc.acc.data() + static_cast<size_t>(ACC) * (t0 + g);
            }
            weigh_group<G, NC, SETS>([&](int jj) { return value_row(0, jj); }, sp, ap, cnt, maxcnt);
          });
          return;
        }
      }
      for (int t = 0; t < n; ++t) {
        const int left = count(t) - j0;
        if (left <= 0) continue;
        const int cnt = std::min(16, left);
        const float* sp = sc.s.data() + stride * t + j0;
        float* ap = sc.acc.data() + static_cast<size_t>(ACC) * t;
        if constexpr (kFewRegisters) {
          // SETS x NC accumulators (32 of AVX2's 16 registers at D = 64) would live on the
          // stack, a load and a store around every FMA: one 16-dim slice of them at a time
          // instead, the keys passing once per slice (each accumulator sees the same FMAs in the
          // same key order)
          for (int cc = 0; cc < NC; ++cc) {
            vf acc[SETS];
#pragma GCC unroll 4
            for (int e = 0; e < SETS; ++e) acc[e] = load(ap + (e * NC + cc) * 16);
            if (cnt == 16) {
#pragma GCC unroll 16
              for (int jj = 0; jj < 16; ++jj)
                acc[jj % SETS] = fmadd(set1(sp[jj]), row16<D>(value_row(t, jj), cc), acc[jj % SETS]);
            } else {
              for (int jj = 0; jj < cnt; ++jj)
                acc[jj % SETS] = fmadd(set1(sp[jj]), row16<D>(value_row(t, jj), cc), acc[jj % SETS]);
            }
#pragma GCC unroll 4
            for (int e = 0; e < SETS; ++e) store(ap + (e * NC + cc) * 16, acc[e]);
          }
          continue;
        }
        vf acc[SETS][NC];
#pragma GCC unroll 4
        for (int e = 0; e < SETS; ++e)
#pragma GCC unroll 8
          for (int cc = 0; cc < NC; ++cc) acc[e][cc] = load(ap + (e * NC + cc) * 16);
        if (cnt == 16) {
#pragma GCC unroll 16
          for (int jj = 0; jj < 16; ++jj) {
            const vf p = set1(sp[jj]);
            const auto* vr = value_row(t, jj);
#pragma GCC unroll 8
            for (int cc = 0; cc < NC; ++cc) acc[jj % SETS][cc] = fmadd(p, row16<D>(vr, cc), acc[jj % SETS][cc]);
          }
        } else {
          for (int jj = 0; jj < cnt; jj += SETS) {
#pragma GCC unroll 4
            for (int e = 0; e < SETS; ++e) {
              if (jj + e >= cnt) break;
              const vf p = set1(sp[jj + e]);
              const auto* vr = value_row(t, jj + e);
#pragma GCC unroll 8
              for (int cc = 0; cc < NC; ++cc) acc[e][cc] = fmadd(p, row16<D>(vr, cc), acc[e][cc]);
            }
          }
        }
#pragma GCC unroll 4
        for (int e = 0; e < SETS; ++e)
#pragma GCC unroll 8
          for (int cc = 0; cc < NC; ++cc) store(ap + (e * NC + cc) * 16, acc[e][cc]);
      }
    };
    with_rows(std::bool_constant<STAGE_V>{}, v, vs, j0, weigh);
  }
  for (int t = 0; t < n; ++t) {
    if (count(t) == 0) continue;  // no key of this chunk (or none at all: merge() writes zeros)
    float* out = parts.at(qs[t].id, c);
    out[0] = sc.m[t];
    out[1] = sc.l[t];
    const float* ap = sc.acc.data() + static_cast<size_t>(ACC) * t;
#pragma GCC unroll 8
    for (int cc = 0; cc < NC; ++cc) {
      vf x = add(load(ap + cc * 16), load(ap + (NC + cc) * 16));
      if constexpr (SETS == 4) x = add(x, add(load(ap + (2 * NC + cc) * 16), load(ap + (3 * NC + cc) * 16)));
      store(out + 2 + 16 * cc, x);
    }
  }
}

// A query's output from its chunks (kv_unit), in chunk order: one chunk is acc / l, as a single
// pass gives; several are rescaled to their common max, w_c = exp(m_c - m), and summed in order:
// out = (sum_c w_c acc_c) / (sum_c w_c l_c)
void merge(const Query& q, const Partials& parts, int D) {
  if (q.vis == 0) {  // no key to attend to (never in a causal block; kept well-defined)
    std::fill(q.out, q.out + D, 0.0f);
    return;
  }
  const int n = chunks_of(q.vis);
  if (n == 1) {
    const float* p = parts.at(q.id, 0);
    const vf iv = set1(1.0f / p[1]);
    for (int d = 0; d < D; d += 16) store(q.out + d, mul(load(p + 2 + d), iv));
    return;
  }
  float m = -INFINITY;
  for (int c = 0; c < n; ++c) m = std::max(m, parts.at(q.id, c)[0]);
  vf lsum = zero();
  for (int d = 0; d < D; d += 16) store(q.out + d, zero());
  for (int c = 0; c < n; ++c) {
    const float* p = parts.at(q.id, c);
    const vf w = exp_le0(set1(p[0] - m));  // the same exp for every lane
    lsum = fmadd(w, set1(p[1]), lsum);
    for (int d = 0; d < D; d += 16) store(q.out + d, fmadd(w, load(p + 2 + d), load(q.out + d)));
  }
  const vf iv = set1(1.0f / lane0(lsum));
  for (int d = 0; d < D; d += 16) store(q.out + d, mul(load(q.out + d), iv));
}

inline bool chunked(int D) { return D == 64 || D == 128 || D == 32; }

// the queries of one KV head over the keys of chunk c, by head dimension (other widths: one row at
// a time over all its keys, in chunk 0's call)
template <typename TK, typename TV>
void unit_of(const AttentionArgs& a, const Query* qs, int n, const TK* k, const TV* v, int c, const Partials& parts,
             Scratch& sc) {
  const int64_t ks = a.k_strides[2], vs = a.v_strides[2];
  if (n > QUERY_GROUP && chunked(a.D)) {
    for (int i = 0; i < n; i += QUERY_GROUP) unit_of(a, qs + i, std::min(QUERY_GROUP, n - i), k, v, c, parts, sc);
    return;
  }
  bool gather = false;
  for (int t = 0; t < n; ++t) gather = gather || qs[t].tail != nullptr;
  if (gather) {
    if (a.D == 64) return kv_unit<4, true>(qs, n, k, v, ks, vs, a.scale, c, parts, sc);
    if (a.D == 128) return kv_unit<8, true>(qs, n, k, v, ks, vs, a.scale, c, parts, sc);
    if (a.D == 32) return kv_unit<2, true>(qs, n, k, v, ks, vs, a.scale, c, parts, sc);
  } else {
    if (a.D == 64) return kv_unit<4, false>(qs, n, k, v, ks, vs, a.scale, c, parts, sc);
    if (a.D == 128) return kv_unit<8, false>(qs, n, k, v, ks, vs, a.scale, c, parts, sc);
    if (a.D == 32) return kv_unit<2, false>(qs, n, k, v, ks, vs, a.scale, c, parts, sc);
  }
  // q8_0 and q4_0 rows are read by the chunked kernels only (kv_block_head_dim: the callers refuse other widths)
  if constexpr (!kv_block_type<TK> && !kv_block_type<TV>)
    for (int t = 0; t < n; ++t) row(a, qs[t].q, k, v, qs[t].out, qs[t].vis, qs[t].base, qs[t].tail, sc.s);
}

// the same code for each pair of stored types (a row is widened where it is loaded, row16())
template <typename TK>
void unit_k(const AttentionArgs& a, const Query* qs, int n, const TK* k, const void* v, int c, const Partials& parts,
            Scratch& sc) {
  switch (a.vt) {
    case KvType::f16: return unit_of(a, qs, n, k, static_cast<const uint16_t*>(v), c, parts, sc);
    case KvType::bf16: return unit_of(a, qs, n, k, static_cast<const bf16_bits*>(v), c, parts, sc);
    case KvType::q8_0: return unit_of(a, qs, n, k, static_cast<const int8_t*>(v), c, parts, sc);
    case KvType::q4_0: return unit_of(a, qs, n, k, static_cast<const uint8_t*>(v), c, parts, sc);
    default: return unit_of(a, qs, n, k, static_cast<const float*>(v), c, parts, sc);
  }
}

void unit(const AttentionArgs& a, const Query* qs, int n, const void* k, const void* v, int c, const Partials& parts,
          Scratch& sc) {
  switch (a.kt) {
    case KvType::f16: return unit_k(a, qs, n, static_cast<const uint16_t*>(k), v, c, parts, sc);
    case KvType::bf16: return unit_k(a, qs, n, static_cast<const bf16_bits*>(k), v, c, parts, sc);
    case KvType::q8_0: return unit_k(a, qs, n, static_cast<const int8_t*>(k), v, c, parts, sc);
    case KvType::q4_0: return unit_k(a, qs, n, static_cast<const uint8_t*>(k), v, c, parts, sc);
    default: return unit_k(a, qs, n, static_cast<const float*>(k), v, c, parts, sc);
  }
}

// One KV head's queries, or a part of them (a query's result never depends on the others).
struct Item {
  const void* k;
  const void* v;
  std::vector<Query> queries;
};

// The work of a query over chunk c: its visible keys there, plus a fixed cost (its own loads,
// sums and stores).
inline double query_work(const Query& q, int c) {
  const int keys = std::max(0, std::min(KEY_CHUNK, q.vis - c * KEY_CHUNK));
  return keys > 0 || c == 0 ? keys + 16.0 : 0.0;
}

// Items split over the threads when the work pays for the hand-off. An item bigger than a
// thread's fair share is cut into parts of whole queries first (a prompt chunk's rows see few
// keys each), then every part into tasks of one key chunk each (a decode row sees many): threads
// get contiguous ranges of tasks of equal work. Chunk results are merged per query at the end.
void run_items(const AttentionArgs& a, std::vector<Item>& items, double work, int threads) {
  threads = std::max(1, std::min(threads, static_cast<int>(work / 1.0e5)));
  const bool by_chunk = chunked(a.D);
  int max_chunks = 1, nq = 0;
  for (auto& it : items)
    for (auto& q : it.queries) {
      q.id = nq++;
      if (by_chunk) max_chunks = std::max(max_chunks, chunks_of(q.vis));
    }
  std::vector<double> item_work(items.size(), 0.0);
  double total = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    for (auto& q : items[i].queries) item_work[i] += q.vis + 16.0;
    total += item_work[i];
  }
  const double cap = total / (2 * threads);
  if (threads > 1 && *std::max_element(item_work.begin(), item_work.end()) > cap) {
    std::vector<Item> parts;
    for (auto& it : items) {
      double w = 0;
      size_t from = 0;
      for (size_t i = 0; i < it.queries.size(); ++i) {
        w += it.queries[i].vis + 16.0;
        if ((w >= cap && i + 1 < it.queries.size()) || i + 1 == it.queries.size()) {
          parts.push_back({it.k, it.v, std::vector<Query>(it.queries.begin() + from, it.queries.begin() + i + 1)});
          from = i + 1;
          w = 0;
        }
      }
    }
    items.swap(parts);
  }
  struct Task {
    int item, chunk;
    double work;
  };
  std::vector<Task> tasks;
  for (size_t i = 0; i < items.size(); ++i)
    for (int c = 0; c < (by_chunk ? max_chunks : 1); ++c) {
      double w = 0;
      for (auto& q : items[i].queries) w += query_work(q, c);
      if (w > 0) tasks.push_back({static_cast<int>(i), c, w});
    }
  std::vector<float> store;
  Partials parts;
  if (by_chunk) {
    parts.chunks = max_chunks;
    parts.stride = a.D + 2;
    store.resize(static_cast<size_t>(nq) * max_chunks * parts.stride);
    parts.p = store.data();
  }
  auto run = [&](int t0, int t1) {
    Scratch sc;
    for (int t = t0; t < t1; ++t) {
      const Item& it = items[tasks[t].item];
      unit(a, it.queries.data(), static_cast<int>(it.queries.size()), it.k, it.v, tasks[t].chunk, parts, sc);
    }
  };
  const int count = static_cast<int>(tasks.size());
  threads = std::min(threads, count);
  if (threads <= 1) {
    run(0, count);
  } else {
    // a few ranges of equal work a thread: the threads take them in turn (thread_pool.h), so a
    // thread the scheduler runs late leaves its ranges to the others
    double sum = 0;
    for (auto& t : tasks) sum += t.work;
    const int nparts = std::min(count, 4 * threads);
    std::vector<int> bounds(nparts + 1, count);
    bounds[0] = 0;
    double acc = 0;
    int b = 1;
    for (int i = 0; i < count && b < nparts; ++i) {
      acc += tasks[i].work;
      while (b < nparts && acc * nparts >= sum * b) bounds[b++] = i + 1;
    }
    ThreadPool::instance().run(nparts, threads, [&](int p) { run(bounds[p], bounds[p + 1]); });
  }
  if (by_chunk)
    for (auto& it : items)
      for (auto& q : it.queries) merge(q, parts, a.D);
}

// q8_0 and q4_0 rows are stored rotated (store_kv_row): rotate(x) is the Hadamard transform
// (butterflies of adds and subtracts, in one fixed order) times c = 2^-floor(log2(D)/2), so the
// rows keep about their scale. An orthogonal rotation spreads a key's few large channels over
// all of them, and a block of 32 then rounds its values to a finer step (teacher-forced top-1
// agreement with float32 on a float copy of the default model: q8_0 99.33% -> 99.55%, q4_0
// 85.94% -> 91.52%; docs/bench/kv-cache-types.md). Scores and outputs are the same sums in the rotated basis:
// q.k = rotate(q).rotate(k) / (c^2 D) and out = rotate(sum p_j rotate(v_j)) / (c^2 D), where
// c^2 D is 1 or 2 (head dims 32, 64, 128), so those divisions are exact.
inline void rotate(float* x, int n) {
  for (int len = 1; len < n; len <<= 1)
    for (int i = 0; i < n; i += 2 * len)
      for (int j = i; j < i + len; ++j) {
        const float u = x[j], w = x[j + len];
        x[j] = u + w;
        x[j + len] = u - w;
      }
  const float c = n == 32 ? 0.25f : 0.125f;  // 2^-floor(log2(n)/2) for n = 32, 64, 128
  for (int j = 0; j < n; ++j) x[j] *= c;
}
// 1 / (c^2 D): what a score or an output read in the rotated basis is divided by
inline float rotated_gain(int D) { return D == 64 ? 1.0f : 0.5f; }

// Queries of a q8_0/q4_0 key cache go in rotated, as copies in `buf`; run_items then reads them.
void rotate_queries(std::vector<Item>& items, int D, std::vector<float>& buf) {
  size_t n = 0;
  for (const auto& it : items) n += it.queries.size();
  buf.resize(n * D);
  float* p = buf.data();
  for (auto& it : items)
    for (auto& q : it.queries) {
      std::copy(q.q, q.q + D, p);
      rotate(p, D);
      q.q = p;
      p += D;
    }
}
// A q8_0/q4_0 value cache gives outputs in the rotated basis: back to the model's.
void unrotate_outputs(const std::vector<Item>& items, int D) {
  const float g = rotated_gain(D);
  for (const auto& it : items)
    for (const auto& q : it.queries) {
      rotate(q.out, D);
      for (int j = 0; j < D; ++j) q.out[j] *= g;
    }
}

// run_items over rows whose q8_0/q4_0 sides are stored rotated (rotate())
void run_rotated(const AttentionArgs& a, std::vector<Item>& items, double work, int threads) {
  if (!kv_blocks(a.kt) && !kv_blocks(a.vt)) return run_items(a, items, work, threads);
  std::vector<float> qs;  // the rotated queries, read by run_items
  AttentionArgs r = a;
  if (kv_blocks(a.kt)) {
    rotate_queries(items, a.D, qs);
    r.scale = a.scale * rotated_gain(a.D);
  }
  run_items(r, items, work, threads);
  if (kv_blocks(a.vt)) unrotate_outputs(items, a.D);
}

}  // namespace

void attention(const AttentionArgs& a, int threads) {
  const int group = a.Hq / a.Hkv;
  std::vector<Item> items;
  for (int b = 0; b < a.B; ++b)
    for (int kvh = 0; kvh < a.Hkv; ++kvh) {
      Item it{kv_at(a.k, b * a.k_strides[0] + kvh * a.k_strides[1], a.kt),
              kv_at(a.v, b * a.v_strides[0] + kvh * a.v_strides[1], a.vt), {}};
      for (int h = kvh * group; h < (kvh + 1) * group; ++h)
        for (int i = 0; i < a.L; ++i) {
          const int visible = a.causal ? a.S - a.L + i + 1 : a.S;
          it.queries.push_back({a.q + b * a.q_strides[0] + h * a.q_strides[1] + i * a.q_strides[2],
                                a.out + ((static_cast<int64_t>(b) * a.Hq + h) * a.L + i) * a.D, std::max(visible, 0),
                                std::max(visible, 0)});
        }
      items.push_back(std::move(it));
    }
  run_rotated(a, items, static_cast<double>(a.B) * a.Hq * a.L * a.S * a.D, threads);
}

void attention_rows(const RowsAttentionArgs& r, int threads) {
  const int group = r.Hq / r.Hkv;
  // entries that share a buffer are one sequence's rows: one item per (sequence, KV head)
  std::vector<std::vector<int>> seqs;
  std::vector<const void*> seen;
  for (int e = 0; e < r.B; ++e) {
    const auto it = std::find(seen.begin(), seen.end(), r.k[e]);
    if (it == seen.end()) {
      seen.push_back(r.k[e]);
      seqs.push_back({e});
    } else {
      seqs[it - seen.begin()].push_back(e);
    }
  }
  // what entry e's row i sees: keys 0..offset+i, or (tree rows) a prefix and then listed rows
  const auto visible = [&](int e, int i) { return r.vis_base ? r.vis_base[e] + r.vis_tail_n[e] : r.offset[e] + i + 1; };
  double work = 0;
  for (int e = 0; e < r.B; ++e)
    work += static_cast<double>(r.Hq) * r.L * (r.vis_base ? visible(e, 0) : r.offset[e] + r.L) * r.D;
  AttentionArgs a{};  // what the kernels read: D, scale and the key/value row strides
  a.D = r.D;
  a.scale = r.scale;
  a.k_strides[2] = kv_row(r.D, r.kt);
  a.v_strides[2] = kv_row(r.D, r.vt);
  a.kt = r.kt;
  a.vt = r.vt;
  std::vector<Item> items;
  for (const auto& entries : seqs)
    for (int kvh = 0; kvh < r.Hkv; ++kvh) {
      const int e0 = entries[0];
      Item it{kv_row_at(const_cast<void*>(r.k[e0]), r.capacity[e0], kvh, 0, r.D, r.kt),
              kv_row_at(const_cast<void*>(r.v[e0]), r.capacity[e0], kvh, 0, r.D, r.vt), {}};
      for (int e : entries)
        for (int h = kvh * group; h < (kvh + 1) * group; ++h)
          for (int i = 0; i < r.L; ++i) {
            const bool tree = r.vis_base != nullptr && r.vis_tail_n[e] > 0;
            it.queries.push_back({r.q + e * r.q_strides[0] + h * r.q_strides[1] + i * r.q_strides[2],
                                  r.out + ((static_cast<int64_t>(e) * r.Hq + h) * r.L + i) * r.D, visible(e, i),
                                  r.vis_base ? r.vis_base[e] : visible(e, i), tree ? r.vis_tail[e] : nullptr});
          }
      items.push_back(std::move(it));
    }
  run_rotated(a, items, work, threads);
}

void store_kv_row(void* dst, KvType t, const float* src, int n) {
  float rotated[128];
  if (kv_blocks(t) && kv_block_head_dim(n)) {  // the widths attention reads q8_0/q4_0 rows at
    std::copy(src, src + n, rotated);
    rotate(rotated, n);
    src = rotated;
  }
  switch (t) {
    case KvType::f16: return store_kv(static_cast<uint16_t*>(dst), src, n);
    case KvType::bf16: return store_kv(static_cast<bf16_bits*>(dst), src, n);
    case KvType::q8_0: return store_kv(static_cast<int8_t*>(dst), src, n);
    case KvType::q4_0: return store_kv(static_cast<uint8_t*>(dst), src, n);
    default: return store_kv(static_cast<float*>(dst), src, n);
  }
}

}  // namespace MLXCEL_ISA
}  // namespace mlxcel
