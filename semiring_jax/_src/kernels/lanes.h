// Lists, in order, the lanes of a short chunk that pass a test: the
// searches' filters (a beam search's candidates at or above a cutoff, a
// lattice pass's arcs into live states). Most lanes fail, and each passes
// or fails unpredictably, so a branch per lane would be mispredicted often.
// With AVX-512 a chunk is tested 16 lanes to an instruction and the passing
// indices packed by a compress; elsewhere by a branch-free scalar loop
// (the same list).

#ifndef SEMIRING_JAX_KERNELS_LANES_H_
#define SEMIRING_JAX_KERNELS_LANES_H_

#include <cstdint>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace {

// Both pack, in order, the lanes k < n that pass into out[0 .. count) and
// return count; out must hold n + 15 entries. PackChunks tests 16 lanes to
// an instruction (AVX-512), PackLanes one at a time (elsewhere, and for
// doubles).
#if defined(__AVX512F__)
// chunk(k, tail) is the mask of the lanes k .. k + 15 that pass; tail
// masks off those at or past n (they must not be read).
template <class Chunk>
inline int32_t PackChunks(int32_t n, int32_t* out, Chunk chunk) {
  const __m512i step = _mm512_set1_epi32(16);
  __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  int32_t m = 0;
  for (int32_t k = 0; k < n; k += 16) {
    const __mmask16 tail = n - k >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - k)) - 1);
    const __mmask16 pass = chunk(k, tail);
    // A compress into a register and a full store: a compress straight to
    // memory is microcoded (slow) on some CPUs.
    _mm512_storeu_si512(out + m, _mm512_maskz_compress_epi32(pass, lane));
    m += __builtin_popcount(pass);
    lane = _mm512_add_epi32(lane, step);
  }
  return m;
}
#endif

// passes(k) says whether lane k passes; every lane is written, the count
// advanced without a branch.
template <class Lane>
inline int32_t PackLanes(int32_t n, int32_t* out, Lane passes) {
  int32_t m = 0;
  for (int32_t k = 0; k < n; ++k) {
    out[m] = k;
    m += passes(k);
  }
  return m;
}

// The k < n with value[k] >= cutoff (false for NaN), in order, into
// out[0 .. count); returns count. out must hold n + 15 entries.
inline int32_t ListAtLeast(const float* value, int32_t n, float cutoff, int32_t* out) {
#if defined(__AVX512F__)
  const __m512 bound = _mm512_set1_ps(cutoff);
  return PackChunks(n, out, [&](int32_t k, __mmask16 tail) {
    const __m512 v = _mm512_maskz_loadu_ps(tail, value + k);
    return _mm512_mask_cmp_ps_mask(tail, v, bound, _CMP_GE_OQ);
  });
#else
  return PackLanes(n, out, [&](int32_t k) { return value[k] >= cutoff; });
#endif
}

inline int32_t ListAtLeast(const double* value, int32_t n, double cutoff, int32_t* out) {
  return PackLanes(n, out, [&](int32_t k) { return value[k] >= cutoff; });
}

// The k < n with table[index[k]] != 0, in order, into out[0 .. count);
// returns count. out must hold n + 15 entries; index[k] must be in table.
inline int32_t ListNonzero(const int32_t* index, const int32_t* table, int32_t n, int32_t* out) {
#if defined(__AVX512F__)
  const __m512i zero = _mm512_setzero_si512();
  return PackChunks(n, out, [&](int32_t k, __mmask16 tail) {
    const __m512i at = _mm512_maskz_loadu_epi32(tail, index + k);
    const __m512i value = _mm512_mask_i32gather_epi32(zero, tail, at, table, 4);
    return _mm512_mask_cmpneq_epi32_mask(tail, value, zero);
  });
#else
  return PackLanes(n, out, [&](int32_t k) { return table[index[k]] != 0; });
#endif
}

}  // namespace

#endif  // SEMIRING_JAX_KERNELS_LANES_H_
