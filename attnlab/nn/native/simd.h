// What both kernel sources share: whether to use AVX2 + FMA (the build passes -mavx2 -mfma where
// the CPU has them), and the horizontal sum of 8 fp32 lanes.
#pragma once

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define ATTNLAB_AVX2 1

namespace {

inline float sum_lanes(__m256 v) {  // lanes paired 4 + 4, then 2 + 2, then 1 + 1
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

}  // namespace
#endif
