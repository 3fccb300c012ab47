// Row-exact quantized matmul: int8 activations x 4/8-bit weights with AVX-512 VNNI.
//
// This file is compiled with -mavx512f/bw/vl/vnni (CMakeLists.txt): nothing in it may run before
// cpu_supported() (qmm_primitive.cpp, built for the baseline) said yes.
//
// Layout. A row of K values is nb = K/32 blocks of 32. Blocks go 16 at a time into
// "superblocks" of 8 chunks; chunk c holds values 4c..4c+3 of each of the 16 blocks, so after one
// vpdpbusd per chunk each int32 lane holds the whole integer dot product of one block: no
// horizontal sums in the loop, and the float work (weight scale x activation scale, plus
// bias x activation scale x block sum) is one vector step per 16 blocks.
//   8 bits: a chunk is 64 bytes, lane l = block l.
//   4 bits: a chunk is 32 bytes; byte 4j+e holds block j (low nibble) and block 8+j (high).
// The nb % 16 leftover blocks (even, since K % 64 == 0) go in pairs of 64 values:
//   8 bits: [block a | block b]; 4 bits: byte i holds a[i] | a[16+i] << 4, byte 16+i the same
//   for b, which unpack to lanes a a a a b b b b a a a a b b b b.
// Exactness. An output element is: its activation row quantized to int8 per block (scale
// amax/127, round to nearest even; it depends on that row alone), int32 lanes per block, one
// float accumulator per lane added superblock by superblock and then pair by pair, and one fixed
// 16-lane sum. Tiling rows (up to 4 share each weight load) and splitting N over threads never
// change that sequence, so row i of an M-row product is bit-identical to the one-row product of
// row i.
#include "qmm_kernel.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "thread_pool.h"

namespace mlxcel {

namespace {

constexpr int kBlock = 32;
constexpr int kSuper = 16;  // blocks per superblock
constexpr int kChunks = 8;  // chunks per superblock (4 values of each block)

struct Shape {
  int nb, full, pairs;  // blocks, full superblocks, leftover pairs
};

Shape shape_of(int K) {
  const int nb = K / kBlock;
  return {nb, nb / kSuper, (nb % kSuper) / 2};
}

// The activation row in the weights' order: per superblock 8 x 64 bytes, per pair 64 bytes; and
// 16 lanes of activation scale and of scale x block sum (per lane share) per superblock or pair.
struct QuantRow {
  int8_t* q;
  float* d;
  float* dsum;
};

size_t q_stride(const Shape& s) { return static_cast<size_t>(s.full) * kChunks * 64 + static_cast<size_t>(s.pairs) * 64; }
size_t f_stride(const Shape& s) { return static_cast<size_t>(s.full + s.pairs) * 16; }

// int8 values of one block of 32, its scale and its integer sum
inline void quantize_block(const float* xb, int8_t* qb, float* d, int* sum) {
  const __m512i lim = _mm512_set1_epi32(127), nlim = _mm512_set1_epi32(-127);
  const __m512 v0 = _mm512_loadu_ps(xb), v1 = _mm512_loadu_ps(xb + 16);
  const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
  *d = amax / 127.0f;
  const __m512 id = _mm512_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
  __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, id));  // MXCSR: round to nearest even
  __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, id));
  q0 = _mm512_max_epi32(_mm512_min_epi32(q0, lim), nlim);
  q1 = _mm512_max_epi32(_mm512_min_epi32(q1, lim), nlim);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(qb), _mm512_cvtepi32_epi8(q0));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(qb + 16), _mm512_cvtepi32_epi8(q1));
  *sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
}

void quantize_row(const float* x, const Shape& s, int bits, QuantRow r) {
  alignas(64) int8_t qb[kBlock];
  float d;
  int sum;
  for (int sb = 0; sb < s.full; ++sb) {
    int8_t* base = r.q + static_cast<size_t>(sb) * kChunks * 64;
    for (int lane = 0; lane < kSuper; ++lane) {
      quantize_block(x + static_cast<size_t>(sb * kSuper + lane) * kBlock, qb, &d, &sum);
      for (int c = 0; c < kChunks; ++c) std::memcpy(base + c * 64 + 4 * lane, qb + 4 * c, 4);
      r.d[sb * 16 + lane] = d;
      r.dsum[sb * 16 + lane] = d * static_cast<float>(sum);
    }
  }
  for (int p = 0; p < s.pairs; ++p) {
    int8_t* base = r.q + static_cast<size_t>(s.full) * kChunks * 64 + static_cast<size_t>(p) * 64;
    float* dl = r.d + (s.full + p) * 16;
    float* sl = r.dsum + (s.full + p) * 16;
    for (int half = 0; half < 2; ++half) {
      quantize_block(x + static_cast<size_t>(s.full * kSuper + 2 * p + half) * kBlock, qb, &d, &sum);
      if (bits == 8) {
        std::memcpy(base + 32 * half, qb, 32);
      } else {
        std::memcpy(base + 16 * half, qb, 16);
        std::memcpy(base + 32 + 16 * half, qb + 16, 16);
      }
      for (int lane = 0; lane < 16; ++lane) {
        const int owner = bits == 8 ? lane / 8 : (lane / 4) % 2;
        if (owner != half) continue;
        dl[lane] = d;
        sl[lane] = d * static_cast<float>(sum) / 8.0f;  // 8 lanes per block: an exact division
      }
    }
  }
}

// 64 unpacked weight bytes of one chunk (superblock) or pair; 4-bit: the low nibbles of the 32
// bytes fill lanes 0-7, the high nibbles lanes 8-15
template <int BITS>
inline __m512i load_weights(const uint8_t* p) {
  if (BITS == 8) return _mm512_loadu_si512(p);
  const __m512i both = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  const __m512i shifts = _mm512_setr_epi64(0, 0, 0, 0, 4, 4, 4, 4);
  return _mm512_and_si512(_mm512_srlv_epi64(both, shifts), _mm512_set1_epi8(0x0F));
}

// rows r0..r0+NR-1 against one weight row; writes out[r * out_stride]
template <int BITS, int NR>
inline void tile(const QuantRow* rows, const Shape& s, const uint8_t* w, const float* sc, const float* bi,
                 float* out, int out_stride) {
  constexpr int cb = BITS == 8 ? 64 : 32;  // weight bytes per chunk or pair
  __m512 acc[NR];
  for (int r = 0; r < NR; ++r) acc[r] = _mm512_setzero_ps();
  const uint8_t* wp = w;
  for (int sb = 0; sb < s.full; ++sb, wp += kChunks * cb) {
    __m512i iacc[NR];
    for (int r = 0; r < NR; ++r) iacc[r] = _mm512_setzero_si512();
    const size_t qoff = static_cast<size_t>(sb) * kChunks * 64;
    for (int c = 0; c < kChunks; ++c) {
      const __m512i wq = load_weights<BITS>(wp + c * cb);
      for (int r = 0; r < NR; ++r)
        iacc[r] = _mm512_dpbusd_epi32(iacc[r], wq, _mm512_loadu_si512(rows[r].q + qoff + c * 64));
    }
    const __m512 sv = _mm512_loadu_ps(sc + sb * kSuper), bv = _mm512_loadu_ps(bi + sb * kSuper);
    for (int r = 0; r < NR; ++r) {
      __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(iacc[r]), _mm512_mul_ps(sv, _mm512_loadu_ps(rows[r].d + sb * 16)));
      t = _mm512_fmadd_ps(bv, _mm512_loadu_ps(rows[r].dsum + sb * 16), t);
      acc[r] = _mm512_add_ps(acc[r], t);
    }
  }
  const __m512i pick = BITS == 8 ? _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1)
                                 : _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1);
  for (int p = 0; p < s.pairs; ++p, wp += cb) {
    const __m512i wq = load_weights<BITS>(wp);
    const int blk = s.full * kSuper + 2 * p;
    const __m512 sv = _mm512_permutexvar_ps(pick, _mm512_castps128_ps512(_mm_setr_ps(sc[blk], sc[blk + 1], 0.f, 0.f)));
    const __m512 bv = _mm512_permutexvar_ps(pick, _mm512_castps128_ps512(_mm_setr_ps(bi[blk], bi[blk + 1], 0.f, 0.f)));
    const size_t qoff = static_cast<size_t>(s.full) * kChunks * 64 + static_cast<size_t>(p) * 64;
    const int foff = (s.full + p) * 16;
    for (int r = 0; r < NR; ++r) {
      const __m512i iv = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wq, _mm512_loadu_si512(rows[r].q + qoff));
      __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(iv), _mm512_mul_ps(sv, _mm512_loadu_ps(rows[r].d + foff)));
      t = _mm512_fmadd_ps(bv, _mm512_loadu_ps(rows[r].dsum + foff), t);
      acc[r] = _mm512_add_ps(acc[r], t);
    }
  }
  for (int r = 0; r < NR; ++r) out[static_cast<size_t>(r) * out_stride] = _mm512_reduce_add_ps(acc[r]);
}

template <int BITS>
void weight_row(const QuantRow* rows, int nrows, const Shape& s, const uint8_t* w, const float* sc,
                const float* bi, float* out, int out_stride) {
  int r0 = 0;
  for (; r0 + 4 <= nrows; r0 += 4) tile<BITS, 4>(rows + r0, s, w, sc, bi, out + static_cast<size_t>(r0) * out_stride, out_stride);
  switch (nrows - r0) {
    case 3: tile<BITS, 3>(rows + r0, s, w, sc, bi, out + static_cast<size_t>(r0) * out_stride, out_stride); break;
    case 2: tile<BITS, 2>(rows + r0, s, w, sc, bi, out + static_cast<size_t>(r0) * out_stride, out_stride); break;
    case 1: tile<BITS, 1>(rows + r0, s, w, sc, bi, out + static_cast<size_t>(r0) * out_stride, out_stride); break;
    default: break;
  }
}

// natural-order values <-> the kernel's bytes, one row
template <bool PACK>
void convert_row(uint8_t* q, uint8_t* packed, int K, int bits) {
  const Shape s = shape_of(K);
  const int cb = bits == 8 ? 64 : 32;
  uint8_t* p = packed;
  if (PACK) std::memset(packed, 0, row_bytes(K, bits));
  auto move = [&](uint8_t* byte, uint8_t* value, bool high) {
    if (bits == 8) {
      if (PACK) *byte = *value; else *value = *byte;
    } else if (PACK) {
      *byte |= high ? static_cast<uint8_t>(*value << 4) : *value;
    } else {
      *value = high ? *byte >> 4 : *byte & 0x0F;
    }
  };
  for (int sb = 0; sb < s.full; ++sb)
    for (int c = 0; c < kChunks; ++c, p += cb)
      for (int lane = 0; lane < kSuper; ++lane)
        for (int e = 0; e < 4; ++e) {
          uint8_t* v = q + static_cast<size_t>(sb * kSuper + lane) * kBlock + 4 * c + e;
          if (bits == 8) move(p + 4 * lane + e, v, false);
          else move(p + 4 * (lane % 8) + e, v, lane >= 8);
        }
  for (int pr = 0; pr < s.pairs; ++pr, p += cb)
    for (int half = 0; half < 2; ++half)
      for (int i = 0; i < kBlock; ++i) {
        uint8_t* v = q + static_cast<size_t>(s.full * kSuper + 2 * pr + half) * kBlock + i;
        if (bits == 8) move(p + 32 * half + i, v, false);
        else move(p + 16 * half + (i % 16), v, i >= 16);
      }
}

}  // namespace

void repack_row(const uint8_t* mlx_row, uint8_t* out, int K, int bits) {
  std::vector<uint8_t> q(K);
  if (bits == 8) {
    std::memcpy(q.data(), mlx_row, K);
  } else {
    for (int k = 0; k < K / 2; ++k) {
      q[2 * k] = mlx_row[k] & 0x0F;
      q[2 * k + 1] = mlx_row[k] >> 4;
    }
  }
  convert_row<true>(q.data(), out, K, bits);
}

void unpack_row(const uint8_t* packed, uint8_t* q, int K, int bits) {
  convert_row<false>(q, const_cast<uint8_t*>(packed), K, bits);
}

void dequantize_rows(const uint8_t* w, const float* scales, const float* biases, const uint32_t* ids, int R,
                     int K, int bits, float* out) {
  const size_t rb = row_bytes(K, bits);
  const int nb = K / kBlock;
  std::vector<uint8_t> q(K);
  for (int r = 0; r < R; ++r) {
    const size_t row = ids[r];
    unpack_row(w + row * rb, q.data(), K, bits);
    const float* sc = scales + row * nb;
    const float* bi = biases + row * nb;
    float* o = out + static_cast<size_t>(r) * K;
    for (int k = 0; k < K; ++k) o[k] = sc[k / kBlock] * static_cast<float>(q[k]) + bi[k / kBlock];
  }
}

void qmm_multi(const float* x, const WeightRef* weights, int count, int M, int K, int bits, int threads) {
  const Shape s = shape_of(K);
  const size_t qstride = q_stride(s), fstride = f_stride(s);
  std::vector<int8_t> qbuf(static_cast<size_t>(M) * qstride);
  std::vector<float> dbuf(static_cast<size_t>(M) * fstride), sbuf(static_cast<size_t>(M) * fstride);
  std::vector<QuantRow> rows(M);
  for (int m = 0; m < M; ++m) {
    rows[m] = {qbuf.data() + m * qstride, dbuf.data() + m * fstride, sbuf.data() + m * fstride};
    quantize_row(x + static_cast<size_t>(m) * K, s, bits, rows[m]);
  }
  const size_t wstride = row_bytes(K, bits);
  // all weights' rows as one range of "global" rows, split evenly over the threads
  std::vector<int> starts(count + 1, 0);
  for (int i = 0; i < count; ++i) starts[i + 1] = starts[i] + weights[i].N;
  const int total = starts[count];
  auto run = [&](int g0, int g1) {
    for (int i = 0; i < count; ++i) {
      const WeightRef& wr = weights[i];
      const int n0 = std::max(g0, starts[i]) - starts[i], n1 = std::min(g1, starts[i + 1]) - starts[i];
      for (int n = n0; n < n1; ++n) {
        const uint8_t* wrow = wr.w + n * wstride;
        const float* sc = wr.scales + static_cast<size_t>(n) * s.nb;
        const float* bi = wr.biases + static_cast<size_t>(n) * s.nb;
        if (bits == 8) weight_row<8>(rows.data(), M, s, wrow, sc, bi, wr.out + n, wr.N);
        else weight_row<4>(rows.data(), M, s, wrow, sc, bi, wr.out + n, wr.N);
      }
    }
  };
  // threads only pay off on big enough products (handing work to a thread costs microseconds)
  const double work = static_cast<double>(total) * K * (M + 3);
  threads = std::max(1, std::min(threads, static_cast<int>(work / 2.0e5)));
  if (threads == 1 || total < 64) {
    run(0, total);
    return;
  }
  ThreadPool::instance().run(threads, [&](int t) {
    const int nt = threads;
    const int chunk = ((total + nt - 1) / nt + 15) / 16 * 16;  // whole cache lines of output per thread
    const int g0 = std::min(total, t * chunk), g1 = std::min(total, g0 + chunk);
    run(g0, g1);
  });
}

void qmm(const float* x, const uint8_t* w, const float* scales, const float* biases, float* out,
         int M, int N, int K, int bits, int threads) {
  const WeightRef one{w, scales, biases, out, N};
  qmm_multi(x, &one, 1, M, K, bits, threads);
}

}  // namespace mlxcel
