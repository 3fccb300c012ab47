// Row-exact quantized matmul: int8 activations x 4/8-bit weights, with AVX-512 VNNI, AVX-VNNI or
// AVX2.
//
// Built thrice (isa_begin.h: for AVX-512 F/BW/VL/VNNI, for AVX2/FMA/F16C, and for AVX2 with
// AVX-VNNI); nothing in a build runs before isa.cpp chose it for this CPU.
//
// Layout. Weight rows go in groups of 16 (the last group holds N % 16 rows when that is not 0;
// call a group's row count r). Within a group, block by block (32 values of K), the values go in
// 8 runs of 4 (values 4c..4c+3 of the block), and each run holds those 4 values of every row of
// the group side by side: one 64-byte vector holds 4 values of 16 rows, so one vpdpbusd against
// 4 activation bytes broadcast to every lane adds 4 products to each row's integer dot product,
// and 8 of them finish the block for 16 rows at once: no horizontal sums anywhere.
//   8 bits: a block is 8 runs of 4r bytes.
//   4 bits: a block is 4 runs of 4r bytes; byte 4i+e of run j holds value 8j+e of row i in its low
//   nibble and value 8j+4+e in its high nibble (one load, a shift and two ANDs give both runs).
// Scales and biases are interleaved the same way (per block, the group's r values side by side),
// so the float work is one vector step per block for 16 rows.
// Exactness. An activation row is quantized to int8 per block of 32 (scale amax/127, round to
// nearest even; it depends on that row alone), each block's dot product is an exact int32, and
// then, block after block in order, t = float(dot) * (scale * act_scale), t = fma(bias,
// act_scale * act_sum, t), acc += t. The lanes are weight rows, so no step mixes rows; tiling the
// activation rows (up to 8 share each weight load; 4 in the AVX2 build), splitting N over
// threads and the number of rows never change that sequence, so row i of an M-row product is
// bit-identical to the one-row product of row i.
// AVX2. A 64-byte run is two 32-byte halves (rows 0-7, 8-15). Without vpdpbusd, vpmaddubsw
// multiplies unsigned weight bytes by signed activation bytes and adds neighbours into int16: a
// 4-bit value (0..15) times an int8 (|q| <= 127), two at a time, is at most 3,810, so a block's 8
// runs sum in int16 without saturating (30,480), and vpmaddwd with ones makes each row's int32.
// An 8-bit weight goes as its two nibbles (w = lo + 16 hi), each summed that way. These are the
// same exact integers vpdpbusd gives, and the float steps after them are the same lane-wise
// operations (simd.h), so an AVX2 row is bit-identical to an AVX-512 row. AVX-VNNI: the AVX2
// layout and float steps, with vpdpbusd on 32-byte halves: the same integers again.
#include <immintrin.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <new>
#include <vector>

#include "qmm_kernel.h"
#include "thread_pool.h"
// after every other header: the ISA's target applies to this file's own code only
#include "isa_begin.h"
#include "simd.h"

// AMX tiles only in the AVX-512 build, and only where the compiler knows them
#define MLXCEL_USE_AMX (MLXCEL_AMX && MLXCEL_ISA_AVX512)

namespace mlxcel {
namespace MLXCEL_ISA {

namespace {

constexpr int kPrefetch = 8;  // blocks ahead

// 64-byte aligned storage for what AMX tiles load and store: a tile row that straddles two cache
// lines is a split access, and with the 16-byte alignment of malloc every row of a weight tile
// and of the result buffer, and half the rows of an activation tile, did
template <class T>
struct Aligned64 {
  using value_type = T;
  Aligned64() = default;
  template <class U>
  Aligned64(const Aligned64<U>&) {}
  T* allocate(size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t(64))); }
  void deallocate(T* p, size_t) { ::operator delete(p, std::align_val_t(64)); }
  template <class U>
  bool operator==(const Aligned64<U>&) const { return true; }
  template <class U>
  bool operator!=(const Aligned64<U>&) const { return false; }
};

// Quantized activation rows: q [M, K] int8 in natural order, per block the scale d and d * sum(q)
struct Act {
  std::vector<int8_t, Aligned64<int8_t>> q;
  std::vector<float> d, ds;
};

// int8 values of one block of 32, its scale and its integer sum
inline void quantize_block(const float* xb, int8_t* qb, float* d, int* sum) {
  const vf v0 = load(xb), v1 = load(xb + 16);
  const float amax = reduce_max(max(abs(v0), abs(v1)));
  *d = amax / 127.0f;
  const vf id = set1(amax > 0.0f ? 127.0f / amax : 0.0f);
  const vi q0 = clamp(to_int(mul(v0, id)), -127, 127);  // MXCSR: round to nearest even
  const vi q1 = clamp(to_int(mul(v1, id)), -127, 127);
  store_i8(qb, q0, q1);
  *sum = reduce_add(add(q0, q1));
}

void quantize_rows(const float* x, int M, int K, Act& a) {
  const int nb = K / kBlock;
  a.q.resize(static_cast<size_t>(M) * K);
  a.d.resize(static_cast<size_t>(M) * nb);
  a.ds.resize(static_cast<size_t>(M) * nb);
  for (int m = 0; m < M; ++m)
    for (int b = 0; b < nb; ++b) {
      const size_t off = static_cast<size_t>(m) * K + static_cast<size_t>(b) * kBlock;
      float d;
      int sum;
      quantize_block(x + off, a.q.data() + off, &d, &sum);
      a.d[static_cast<size_t>(m) * nb + b] = d;
      a.ds[static_cast<size_t>(m) * nb + b] = d * static_cast<float>(sum);
    }
}

// One block's contribution to 16 outputs of one activation row: the block's exact integer dot
// products scaled by weight scale x activation scale, plus bias x (activation scale x sum of the
// row's quantized block). The VNNI tiles and the AMX tiles both go through this, in this order, so
// their outputs are bit-identical.
inline vf block_term(vi dot, vf sv, vf bv, float d, float ds) {
  const vf t = mul(to_float(dot), mul(sv, set1(d)));
  return fmadd(bv, set1(ds), t);
}

// r <= 16 per-row scales or biases of one block, as float32: stored as float32, or as float16
// where every value of the weight is one exactly (a GGUF's own d and m), which reads 2 fewer bytes
// a block and row and gives the same float32 values
inline vf load_scales(const float* p, int r) { return load_n(p, r); }
inline vf load_scales(const uint16_t* p, int r) { return load_half_n(p, r); }

// A block's biases: stored, or (bg null: a symmetric weight, a GGUF's Q4_0 or Q8_0) the scales
// times -2^(bits-1), which is what they were, exactly: one multiply by a power of two
template <typename S>
inline vf block_biases(const S* bg, size_t at, int r, vf sv, float sym) {
  return bg != nullptr ? load_scales(bg + at, r) : mul(sv, set1(sym));
}

inline int32_t load4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

#if MLXCEL_ISA_AVX512
// One block's exact integer dot products of 16 weight rows with one activation row, from the
// block's weight vectors (w: 8 runs of 4 values x 16 rows); CH independent integer chains (integer
// sums: their order cannot change a bit) keep the vpdpbusd latency hidden when few rows share
// the weights.
struct BlockWeights {
  __m512i w[8];
};

template <int BITS>
inline void load_block(const uint8_t* wb, size_t run, int r, BlockWeights& bw) {
  const __mmask64 bm = r == kGroup ? ~0ULL : ((1ULL << (4 * r)) - 1);
  if (BITS == 8) {
#pragma GCC unroll 8
    for (int c = 0; c < 8; ++c) bw.w[c] = _mm512_maskz_loadu_epi8(bm, wb + c * run);
  } else {
    const __m512i low = _mm512_set1_epi8(0x0F);
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      const __m512i p = _mm512_maskz_loadu_epi8(bm, wb + j * run);
      bw.w[2 * j] = _mm512_and_si512(p, low);
      bw.w[2 * j + 1] = _mm512_and_si512(_mm512_srli_epi16(p, 4), low);
    }
  }
}

template <int BITS, int CH>
inline vi block_dot(const BlockWeights& bw, const int8_t* xq) {
  __m512i s[CH];
#pragma GCC unroll 4
  for (int c = 0; c < CH; ++c) s[c] = _mm512_setzero_si512();
#pragma GCC unroll 8
  for (int c = 0; c < 8; ++c) s[c % CH] = _mm512_dpbusd_epi32(s[c % CH], bw.w[c], _mm512_set1_epi32(load4(xq + 4 * c)));
  __m512i dot = s[0];
#pragma GCC unroll 4
  for (int c = 1; c < CH; ++c) dot = _mm512_add_epi32(dot, s[c]);
  return {dot};
}
#else

#if MLXCEL_ISA_AVXVNNI
// AVX-VNNI: the block's runs stay where they are (one 64-byte run is two 32-byte halves, rows 0-7
// and 8-15; a partial group reads only its own 4r bytes) and each activation row reads them
// from L1: 16 ymm registers cannot hold a block's weights beside the accumulators. (AVX2 without
// VNNI: rows innermost, tile_rows_inner below.)
struct BlockWeights {
  const uint8_t* wb;
  size_t run;
  __m256i mask[2];  // the dwords (rows) of each half this group has
  bool full;
};

template <int BITS>
inline void load_block(const uint8_t* wb, size_t run, int r, BlockWeights& bw) {
  bw.wb = wb;
  bw.run = run;
  bw.full = r == kGroup;
  bw.mask[0] = first8(r);
  bw.mask[1] = first8(r - 8);
}

inline __m256i run_half(const BlockWeights& bw, int c, int h) {
  const uint8_t* p = bw.wb + c * bw.run + 32 * h;
  if (bw.full) return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm256_maskload_epi32(reinterpret_cast<const int*>(p), bw.mask[h]);
}

// the 4 activation bytes of each of a block's 8 runs, broadcast to every dword lane
inline void broadcast_runs(const int8_t* xq, __m256i x[8]) {
#pragma GCC unroll 8
  for (int c = 0; c < 8; ++c) x[c] = _mm256_set1_epi32(load4(xq + 4 * c));
}

// AVX-VNNI: vpdpbusd on each 32-byte half, as the AVX-512 build does on 64 bytes. 4 bits: the two
// nibble runs of a byte; 8 bits: the bytes as they are (0..255 x -127..127, four to a dword, in
// int32: nothing to split). The same exact integers as the vpmaddubsw path below.
inline __m256i dpbusd(__m256i acc, __m256i w, __m256i x) {
#if MLXCEL_AVXVNNI_EVEX
  return _mm256_dpbusd_epi32(acc, w, x);  // the test build (CMakeLists.txt): same operation, EVEX
#else
  return _mm256_dpbusd_avx_epi32(acc, w, x);
#endif
}

template <int BITS, int CH>
inline vi block_dot(const BlockWeights& bw, const int8_t* xq) {
  const __m256i low = _mm256_set1_epi8(0x0F);
  __m256i x[8];
  broadcast_runs(xq, x);
  __m256i out[2];
#pragma GCC unroll 2
  for (int h = 0; h < 2; ++h) {
    // two chains a half: the 8 products of a block are one dependent sequence otherwise
    __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();
    if (BITS == 4) {
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) {
        const __m256i p = run_half(bw, j, h);
        s0 = dpbusd(s0, _mm256_and_si256(p, low), x[2 * j]);
        s1 = dpbusd(s1, _mm256_and_si256(_mm256_srli_epi16(p, 4), low), x[2 * j + 1]);
      }
    } else {
#pragma GCC unroll 4
      for (int c = 0; c < 8; c += 2) {
        s0 = dpbusd(s0, run_half(bw, c, h), x[c]);
        s1 = dpbusd(s1, run_half(bw, c + 1, h), x[c + 1]);
      }
    }
    out[h] = _mm256_add_epi32(s0, s1);
  }
  return {out[0], out[1]};
}
#else
// AVX2 without VNNI: rows innermost. Per block, per stored run, the run's two halves are split
// into nibbles once and stay in registers while each activation row (up to 4 a tile) adds its
// vpmaddubsw products to its own int16 sums, also in registers (4 rows: 8 sums, 2 runs, 2
// operands, a broadcast and a product: the 16 ymm registers). The float accumulators are touched
// once a block, by block_term in the usual order, so the bits are the other builds'. Run row
// after row instead (as the VNNI builds do, with 32 registers or vpdpbusd), 8 rows' sums, operands
// and accumulators went through the stack, and the compiler, free to regroup the integer adds,
// computed a block's products first and spilled them; one thread, 4-bit 3072 x 576: 62 -> 89
// GMAC/s at 8 rows, 8-bit 30 -> 48, one row 1.1-1.6x (interleaved runs, a Zen 4 without AVX-512).

// a sum as it stands, in a register: integer adds are associative, so the compiler would regroup
// a row's chain of adds into a tree, computing every product first and spilling them
inline void keep(__m256i& v) { __asm__("" : "+x"(v)); }

// 4 activation bytes broadcast to every dword lane, as one load where it stands: set1_epi32 of a
// memcpy'd int became a load into a general register, vmovd and a broadcast, and the compiler
// shares a broadcast between rows' passes and keeps it (spilled) across them
inline __m256i broadcast4(const int8_t* p) {
  __m256i v;
  __asm__ volatile("vbroadcastss %1, %0" : "=x"(v) : "m"(*reinterpret_cast<const float*>(p)));
  return v;
}

template <int BITS, int NR, bool FULL, typename S>
inline void tile_rows_inner(const Act& a, int m0, int K, const uint8_t* wg, const S* sg, const S* bg, int r,
                            float* out, int ldo) {
  static_assert(NR <= 4, "16 ymm registers: 2 x NR sums, 2 runs, 2 operands, a broadcast, a product");
  const int nb = K / kBlock;
  const size_t bb = block_bytes(r, BITS), run = static_cast<size_t>(4) * r;
  const __m256i low = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  const __m256i mask0 = first8(r), mask1 = first8(r - 8);
  auto half = [&](const uint8_t* p, int h) {
    if constexpr (FULL) return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32 * h));
    return _mm256_maskload_epi32(reinterpret_cast<const int*>(p + 32 * h), h == 0 ? mask0 : mask1);
  };
  vf acc[NR];
#pragma GCC unroll 4
  for (int i = 0; i < NR; ++i) acc[i] = zero();
  const int8_t* x0 = a.q.data() + static_cast<size_t>(m0) * K;
  for (int b = 0; b < nb; ++b) {
    const uint8_t* wb = wg + b * bb;
    for (size_t off = 0; off < bb; off += 64) _mm_prefetch(reinterpret_cast<const char*>(wb + kPrefetch * bb + off), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(sg + static_cast<size_t>(b + kPrefetch) * r), _MM_HINT_T0);
    if (bg != nullptr) _mm_prefetch(reinterpret_cast<const char*>(bg + static_cast<size_t>(b + kPrefetch) * r), _MM_HINT_T0);
    const int8_t* xb = x0 + static_cast<size_t>(b) * kBlock;
    __m256i d0[NR], d1[NR];  // the rows' exact int32 dot products, halves 0 and 1
    // 4 bits: one pass, a packed run j holding runs 2j (low nibbles) and 2j + 1 (high); 8 bits:
    // a pass per nibble (w = lo + 16 hi), each over the 8 runs
    constexpr int PASSES = BITS == 4 ? 1 : 2;
#pragma GCC unroll 2
    for (int pass = 0; pass < PASSES; ++pass) {
      __m256i s0[NR], s1[NR];
#pragma GCC unroll 4
      for (int i = 0; i < NR; ++i) s0[i] = s1[i] = _mm256_setzero_si256();
      // per stored run: its two halves, then each nibble the pass takes against every row
      constexpr int RUNS = BITS == 4 ? 4 : 8;
#pragma GCC unroll 8
      for (int j = 0; j < RUNS; ++j) {
        const __m256i p0 = half(wb + j * run, 0), p1 = half(wb + j * run, 1);
#pragma GCC unroll 2
        for (int nib = 0; nib < 2; ++nib) {
          if (BITS == 8 && nib != pass) continue;
          const __m256i w0 = _mm256_and_si256(nib ? _mm256_srli_epi16(p0, 4) : p0, low);
          const __m256i w1 = _mm256_and_si256(nib ? _mm256_srli_epi16(p1, 4) : p1, low);
#pragma GCC unroll 4
          for (int i = 0; i < NR; ++i) {
            const int8_t* xq = xb + static_cast<size_t>(i) * K + (BITS == 4 ? 8 * j + 4 * nib : 4 * j);
            const __m256i x = broadcast4(xq);
            s0[i] = _mm256_add_epi16(s0[i], _mm256_maddubs_epi16(w0, x));
            s1[i] = _mm256_add_epi16(s1[i], _mm256_maddubs_epi16(w1, x));
            keep(s0[i]);
            keep(s1[i]);
          }
        }
      }
#pragma GCC unroll 4
      for (int i = 0; i < NR; ++i) {
        const __m256i e0 = _mm256_madd_epi16(s0[i], ones), e1 = _mm256_madd_epi16(s1[i], ones);
        if (pass == 0) {
          d0[i] = e0;
          d1[i] = e1;
        } else {
          d0[i] = _mm256_add_epi32(d0[i], _mm256_slli_epi32(e0, 4));
          d1[i] = _mm256_add_epi32(d1[i], _mm256_slli_epi32(e1, 4));
        }
      }
    }
    const vf sv = load_scales(sg + static_cast<size_t>(b) * r, r);
    const vf bv = block_biases(bg, static_cast<size_t>(b) * r, r, sv, symmetric_bias(BITS));
#pragma GCC unroll 4
    for (int i = 0; i < NR; ++i) {
      const size_t f = static_cast<size_t>(m0 + i) * nb + b;
      acc[i] = add(acc[i], block_term({d0[i], d1[i]}, sv, bv, a.d[f], a.ds[f]));
    }
  }
#pragma GCC unroll 4
  for (int i = 0; i < NR; ++i) store_n(out + static_cast<size_t>(m0 + i) * ldo, acc[i], r);
}

// rows m0..m0 + NR - 1, full and partial groups apart (no mask on a full group's loads)
template <int BITS, int NR, typename S>
inline void rows_inner(const Act& a, int m0, int K, const uint8_t* wg, const S* sg, const S* bg, int r, float* out,
                       int ldo) {
  if constexpr (NR > 4) {
    rows_inner<BITS, 4, S>(a, m0, K, wg, sg, bg, r, out, ldo);
    rows_inner<BITS, NR - 4, S>(a, m0 + 4, K, wg, sg, bg, r, out, ldo);
  } else if (r == kGroup) {
    tile_rows_inner<BITS, NR, true, S>(a, m0, K, wg, sg, bg, r, out, ldo);
  } else {
    tile_rows_inner<BITS, NR, false, S>(a, m0, K, wg, sg, bg, r, out, ldo);
  }
}
#endif  // MLXCEL_ISA_AVXVNNI
#endif

// activation rows m0..m0+NR-1 against one group of r weight rows
template <int BITS, int NR, int CH, typename S>
inline void tile(const Act& a, int m0, int K, const uint8_t* wg, const S* sg, const S* bg, int r,
                 float* out, int ldo) {
#if !(MLXCEL_ISA_AVX512 || MLXCEL_ISA_AVXVNNI)
  rows_inner<BITS, NR, S>(a, m0, K, wg, sg, bg, r, out, ldo);
#else
  const int nb = K / kBlock;
  const size_t bb = block_bytes(r, BITS), run = static_cast<size_t>(4) * r;
  vf acc[NR];
#pragma GCC unroll 8
  for (int i = 0; i < NR; ++i) acc[i] = zero();
  for (int b = 0; b < nb; ++b) {
    const uint8_t* wb = wg + b * bb;
    // the weight stream runs ahead of the hardware prefetcher on small matrices (a layer's
    // q/k/v, o, MLP are 0.1-0.7 MB each): ask for the lines kPrefetch blocks on
    for (size_t off = 0; off < bb; off += 64) _mm_prefetch(reinterpret_cast<const char*>(wb + kPrefetch * bb + off), _MM_HINT_T0);
    // and the scale and bias streams, which the core otherwise waits on at every block's first
    // float step (their own lines, beside the weights')
    _mm_prefetch(reinterpret_cast<const char*>(sg + static_cast<size_t>(b + kPrefetch) * r), _MM_HINT_T0);
    if (bg != nullptr) _mm_prefetch(reinterpret_cast<const char*>(bg + static_cast<size_t>(b + kPrefetch) * r), _MM_HINT_T0);
    BlockWeights bw;
    load_block<BITS>(wb, run, r, bw);
    const vf sv = load_scales(sg + static_cast<size_t>(b) * r, r);
    const vf bv = block_biases(bg, static_cast<size_t>(b) * r, r, sv, symmetric_bias(BITS));
#pragma GCC unroll 8
    for (int i = 0; i < NR; ++i) {
      const int m = m0 + i;
      const int8_t* xq = a.q.data() + static_cast<size_t>(m) * K + static_cast<size_t>(b) * kBlock;
      const vi dot = block_dot<BITS, CH>(bw, xq);
      const size_t f = static_cast<size_t>(m) * nb + b;
      acc[i] = add(acc[i], block_term(dot, sv, bv, a.d[f], a.ds[f]));
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < NR; ++i) store_n(out + static_cast<size_t>(m0 + i) * ldo, acc[i], r);
#endif
}

template <int BITS, typename S>
void group(const Act& a, int M, int K, const uint8_t* wg, const S* sg, const S* bg, int r, float* out,
           int ldo) {
  int m0 = 0;
  for (; m0 + 8 <= M; m0 += 8) tile<BITS, 8, 1, S>(a, m0, K, wg, sg, bg, r, out, ldo);
  switch (M - m0) {
    case 7: tile<BITS, 7, 1, S>(a, m0, K, wg, sg, bg, r, out, ldo); break;
    case 6: tile<BITS, 6, 1, S>(a, m0, K, wg, sg, bg, r, out, ldo); break;
    case 5: tile<BITS, 5, 1, S>(a, m0, K, wg, sg, bg, r, out, ldo); break;
    case 4: tile<BITS, 4, 1, S>(a, m0, K, wg, sg, bg, r, out, ldo); break;
    case 3: tile<BITS, 3, 2, S>(a, m0, K, wg, sg, bg, r, out, ldo); break;
    case 2: tile<BITS, 2, 2, S>(a, m0, K, wg, sg, bg, r, out, ldo); break;
    case 1: tile<BITS, 1, 4, S>(a, m0, K, wg, sg, bg, r, out, ldo); break;
    default: break;
  }
}

#if MLXCEL_USE_AMX
// ---- AMX tiles (Sapphire Rapids and later) ------------------------------------------------
// TDPBSUD multiplies an int8 activation tile (A: 16 rows x one block of 32 values, straight from
// the quantized rows, padded with zero rows to a multiple of 16) by a uint8 weight tile (B: 8
// rows, each the 4 values of one run for the group's 16 weight rows side by side: the layout
// above, one block) into 16 x 16 int32 dot products: exactly the integers the VNNI tile sums.
// They then go through block_term in the same order, so an AMX row is bit-identical to a VNNI
// row (tests check it for every M). For 16 rows and a block that is one instruction instead of
// 128 vpdpbusd, so what is left is the float work; two blocks are in flight (tiles 0/2/4 and
// 1/3/5) so the next block's product runs while this one's floats are summed.
struct TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

void load_tiles() {
  alignas(64) TileConfig c;
  for (int t = 0; t < 2; ++t) {
    c.colsb[t] = 64; c.rows[t] = kGroup;          // C: 16 rows x 16 int32
    c.colsb[2 + t] = kBlock; c.rows[2 + t] = kGroup;  // A: 16 rows x 32 int8
    c.colsb[4 + t] = 64; c.rows[4 + t] = kBlock / 4;  // B: 8 rows x (16 weight rows x 4)
  }
  _tile_loadconfig(&c);
}

// the group's weight tiles, block after block (512 bytes each: load_block's 8 vectors, so 4-bit
// runs split into their low and high nibbles and partial groups padded); 8-bit full groups are
// already in that form (used in place when 64-byte aligned)
template <int BITS>
const uint8_t* weight_tiles(const uint8_t* wg, int K, int r, uint8_t* buf) {
  if (BITS == 8 && r == kGroup && reinterpret_cast<uintptr_t>(wg) % 64 == 0) return wg;
  const int nb = K / kBlock;
  const size_t bb = block_bytes(r, BITS), run = static_cast<size_t>(4) * r;
  for (int b = 0; b < nb; ++b) {  // the VNNI tile's block vectors, one after the other
    BlockWeights bw;
    load_block<BITS>(wg + b * bb, run, r, bw);
    uint8_t* o = buf + static_cast<size_t>(b) * 512;
#pragma GCC unroll 8
    for (int c = 0; c < 8; ++c) _mm512_storeu_si512(o + 64 * c, bw.w[c]);
  }
  return buf;
}

// tile ids must be literals (the intrinsics paste them into the instruction)
#define MLXCEL_DOTS(C, A, B, aq, K, bt) \
  do {                                  \
    _tile_zero(C);                      \
    _tile_loadd(A, aq, K);              \
    _tile_loadd(B, bt, 64);             \
    _tile_dpbsud(C, A, B);              \
  } while (0)

// the block's 16 x 16 dot products (in cbuf) into the rows' accumulators
template <typename S>
inline void block_floats(const Act& a, int m0, int rows, int nb, int b, const int32_t* cbuf, const S* sg,
                         const S* bg, int r, float sym, vf* acc) {
  const vf sv = load_scales(sg + static_cast<size_t>(b) * r, r);
  const vf bv = block_biases(bg, static_cast<size_t>(b) * r, r, sv, sym);
#pragma GCC unroll 16
  for (int i = 0; i < kGroup; ++i) {
    if (i < rows) {
      const size_t f = static_cast<size_t>(m0 + i) * nb + b;
      acc[i] = add(acc[i], block_term({_mm512_loadu_si512(cbuf + 16 * i)}, sv, bv, a.d[f], a.ds[f]));
    }
  }
}

// activation rows m0..m0+rows-1 (rows <= 16; a.q has zero rows up to m0+16) against one group's
// weight tiles
template <typename S>
void amx_tile_rows(const Act& a, int m0, int rows, int K, const uint8_t* bt, const S* sg, const S* bg,
                   int r, float sym, float* out, int ldo, int32_t* cbuf) {
  const int nb = K / kBlock;
  vf acc[kGroup];
#pragma GCC unroll 16
  for (int i = 0; i < kGroup; ++i) acc[i] = zero();
  const int8_t* aq = a.q.data() + static_cast<size_t>(m0) * K;
  int32_t* c0 = cbuf;
  int32_t* c1 = cbuf + 256;
  MLXCEL_DOTS(0, 2, 4, aq, K, bt);
  for (int b = 0; b < nb; b += 2) {
    const bool next = b + 1 < nb;
    if (next) MLXCEL_DOTS(1, 3, 5, aq + (b + 1) * kBlock, K, bt + static_cast<size_t>(b + 1) * 512);
    _tile_stored(0, c0, 64);
    if (b + 2 < nb) MLXCEL_DOTS(0, 2, 4, aq + (b + 2) * kBlock, K, bt + static_cast<size_t>(b + 2) * 512);
    block_floats(a, m0, rows, nb, b, c0, sg, bg, r, sym, acc);
    if (next) {
      _tile_stored(1, c1, 64);
      block_floats(a, m0, rows, nb, b + 1, c1, sg, bg, r, sym, acc);
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < kGroup; ++i)
    if (i < rows) store_n(out + static_cast<size_t>(m0 + i) * ldo, acc[i], r);
}
#undef MLXCEL_DOTS

template <int BITS, typename S>
void amx_group(const Act& a, int M, int K, const uint8_t* wg, const S* sg, const S* bg, int r, float* out,
               int ldo, uint8_t* buf, int32_t* cbuf) {
  const uint8_t* bt = weight_tiles<BITS>(wg, K, r, buf);
  for (int m0 = 0; m0 < M; m0 += kGroup)
    amx_tile_rows(a, m0, std::min(kGroup, M - m0), K, bt, sg, bg, r, symmetric_bias(BITS), out, ldo, cbuf);
}
#endif  // MLXCEL_USE_AMX

}  // namespace

namespace {
// f(scales, biases) with a weight's scales and biases from block offset fo, at their stored type
// (null biases: a symmetric weight, block_biases)
template <class F>
inline void with_scales(const WeightRef& wr, size_t fo, F&& f) {
  const bool sym = wr.biases == nullptr;
  if (wr.half)
    f(static_cast<const uint16_t*>(wr.scales) + fo, sym ? nullptr : static_cast<const uint16_t*>(wr.biases) + fo);
  else
    f(static_cast<const float*>(wr.scales) + fo, sym ? nullptr : static_cast<const float*>(wr.biases) + fo);
}

inline float scale_at(const void* p, size_t i, bool half) {
  if (!half) return static_cast<const float*>(p)[i];
  return _cvtsh_ss(static_cast<const uint16_t*>(p)[i]);
}
}  // namespace

void dequantize_rows(const uint8_t* w, const void* scales, const void* biases, bool half, const uint32_t* ids, int R,
                     int N, int K, int bits, float* out) {
  const size_t rb = row_bytes(K, bits);
  const int nb = K / kBlock;
  for (int row = 0; row < R; ++row) {
    const int n = static_cast<int>(ids[row]);
    const int g = n / kGroup, r = group_rows(N, g), i = n % kGroup;
    const uint8_t* base = w + static_cast<size_t>(g) * kGroup * rb;
    const size_t fbase = static_cast<size_t>(g) * kGroup * nb;
    float* o = out + static_cast<size_t>(row) * K;
    for (int k = 0; k < K; ++k) {
      bool high;
      const uint8_t byte = base[value_offset(i, k, r, bits, &high)];
      const uint8_t q = bits == 8 ? byte : (high ? byte >> 4 : byte & 0x0F);
      const size_t f = fbase + static_cast<size_t>(k / kBlock) * r + i;
      const float s = scale_at(scales, f, half);
      o[k] = s * static_cast<float>(q) + (biases != nullptr ? scale_at(biases, f, half) : s * symmetric_bias(bits));
    }
  }
}

void qmm_multi(const float* x, const WeightRef* weights, int count, int M, int K, int bits, int threads) {
  Act a;
  quantize_rows(x, M, K, a);
#if MLXCEL_USE_AMX
  const bool amx = M >= amx_rows.load(std::memory_order_relaxed);
  if (amx) a.q.resize(static_cast<size_t>((M + kGroup - 1) / kGroup * kGroup) * K, 0);  // whole A tiles
#endif
  const size_t rb = row_bytes(K, bits);
  const int nb = K / kBlock;
  // all weights' groups as one range of "global" groups, split evenly over the threads
  std::vector<int> starts(count + 1, 0);
  for (int i = 0; i < count; ++i) starts[i + 1] = starts[i] + (weights[i].N + kGroup - 1) / kGroup;
  const int total = starts[count];
  auto run = [&](int g0, int g1) {
#if MLXCEL_USE_AMX
    thread_local std::vector<uint8_t, Aligned64<uint8_t>> buf;
    thread_local std::vector<int32_t, Aligned64<int32_t>> cbuf(2 * 16 * kGroup);
    if (amx) {
      buf.resize(static_cast<size_t>(nb) * 512);
      load_tiles();
    }
#endif
    for (int i = 0; i < count; ++i) {
      const WeightRef& wr = weights[i];
      const int a0 = std::max(g0, starts[i]) - starts[i], a1 = std::min(g1, starts[i + 1]) - starts[i];
      for (int g = a0; g < a1; ++g) {
        const int r = group_rows(wr.N, g);
        const uint8_t* wg = wr.w + static_cast<size_t>(g) * kGroup * rb;
        const size_t fo = static_cast<size_t>(g) * kGroup * nb;
        float* out = wr.out + static_cast<size_t>(g) * kGroup;
        with_scales(wr, fo, [&](auto sg, auto bg) {
#if MLXCEL_USE_AMX
          if (amx) {
            if (bits == 8) amx_group<8>(a, M, K, wg, sg, bg, r, out, wr.N, buf.data(), cbuf.data());
            else amx_group<4>(a, M, K, wg, sg, bg, r, out, wr.N, buf.data(), cbuf.data());
            return;
          }
#endif
          if (bits == 8) group<8>(a, M, K, wg, sg, bg, r, out, wr.N);
          else group<4>(a, M, K, wg, sg, bg, r, out, wr.N);
        });
      }
    }
#if MLXCEL_USE_AMX
    if (amx) _tile_release();
#endif
  };
  // threads only pay off on big enough products (handing work to a thread costs microseconds)
  const double work = static_cast<double>(total) * kGroup * K * (M + 3);
  run_ranges(total, std::min({threads, total, static_cast<int>(work / 2.0e5)}),
             [&](int64_t g0, int64_t g1) { run(static_cast<int>(g0), static_cast<int>(g1)); });
}

}  // namespace MLXCEL_ISA
}  // namespace mlxcel
