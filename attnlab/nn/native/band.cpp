// The elementwise passes of the banded attention kernel (attnlab.nn.kernels.band), fused: each
// op reads a chunk's window scores once per pass instead of once per PyTorch operation. Built,
// loaded and given its PyTorch equivalents by attnlab/nn/native/__init__.py, whose docstring
// states what each op computes.
//
// Both take the scores of a chunk, s (c, b, K) fp32 with the last dimension contiguous (the
// window of each of c query tiles of b rows), and the band's additive mask bias (b, K): row r of
// every tile gets bias row r (0 where a key is in the window, a large negative elsewhere).
//
// band_softmax_: m = max_k (s + bias), s = exp2(s + bias - m), z = sum_k s; m, z (c, b, 1).
// band_weights:  p = exp2(s + bias), ds = p * dp (the backward's weights and their product with
//                dP - delta); p and ds may be strided views (the kernel's pitched buffers).
//
// exp2 here: x = n + f with n = round(x) and |f| <= 1/2, 2^f by its Taylor series to degree 7
// (truncation below 6e-9 relative), times 2^n built in the exponent bits; x < -126 gives 0
// (masked scores are about -8.5e37), x >= 127.5 gives inf, NaN stays NaN. Within 2 ulp of the exact power, not the
// same bits as torch.exp2: the forward's log-sum-exp and the backward's weights both come from
// this function, so they stay consistent with each other.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "simd.h"

namespace {

// ln(2)^k / k!, k = 1 .. 7
constexpr float kC1 = 0.6931471805599453f, kC2 = 0.2402265069591007f, kC3 = 0.05550410866482158f,
                kC4 = 0.009618129107628477f, kC5 = 0.0013333558146428443f, kC6 = 0.00015403530393381608f,
                kC7 = 1.525273380405984e-05f;
// below kLowest the power is 0; from 127.5 it rounds to 2^128 built as the exponent of inf
constexpr float kLowest = -126.f, kHighest = 128.f;

inline float exp2_one(float x) {
  if (std::isnan(x)) return x;
  if (x < kLowest) return 0.f;
  x = std::min(x, kHighest);
  const float n = std::nearbyint(x), f = x - n;
  const float p = 1.f + f * (kC1 + f * (kC2 + f * (kC3 + f * (kC4 + f * (kC5 + f * (kC6 + f * kC7))))));
  const uint32_t bits = static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

#ifdef ATTNLAB_AVX2
inline __m256 exp2_8(__m256 x) {
  const __m256 below = _mm256_cmp_ps(x, _mm256_set1_ps(kLowest), _CMP_LT_OQ);  // false for NaN
  // min / max return their second operand when either is NaN: x second keeps a NaN
  x = _mm256_max_ps(_mm256_set1_ps(kLowest), _mm256_min_ps(_mm256_set1_ps(kHighest), x));
  const __m256 n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 f = _mm256_sub_ps(x, n);
  __m256 p = _mm256_set1_ps(kC7);
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(kC6));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(kC5));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(kC4));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(kC3));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(kC2));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(kC1));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.f));
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(below, _mm256_mul_ps(p, _mm256_castsi256_ps(bits)));
}

inline float max8(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
#endif

// one row: m = max(s + bias), s = exp2(s + bias - m), returns sum(s)
float softmax_row(float* s, const float* bias, int64_t K, float& top) {
  int64_t k = 0;
  float m = -std::numeric_limits<float>::infinity(), total = 0.f;
#ifdef ATTNLAB_AVX2
  __m256 vm = _mm256_set1_ps(m);
  for (; k + 8 <= K; k += 8) vm = _mm256_max_ps(vm, _mm256_add_ps(_mm256_loadu_ps(s + k), _mm256_loadu_ps(bias + k)));
  m = max8(vm);
#endif
  for (; k < K; ++k) m = std::max(m, s[k] + bias[k]);
  k = 0;
#ifdef ATTNLAB_AVX2
  vm = _mm256_set1_ps(m);
  __m256 vz = _mm256_setzero_ps();
  for (; k + 8 <= K; k += 8) {
    const __m256 e = exp2_8(_mm256_sub_ps(_mm256_add_ps(_mm256_loadu_ps(s + k), _mm256_loadu_ps(bias + k)), vm));
    _mm256_storeu_ps(s + k, e);
    vz = _mm256_add_ps(vz, e);
  }
  total = sum_lanes(vz);
#endif
  for (; k < K; ++k) {
    s[k] = exp2_one((s[k] + bias[k]) - m);
    total += s[k];
  }
  top = m;
  return total;
}

// one row: p = exp2(s + bias), ds = p * dp
void weights_row(const float* s, const float* bias, const float* dp, float* p, float* ds, int64_t K) {
  int64_t k = 0;
#ifdef ATTNLAB_AVX2
  for (; k + 8 <= K; k += 8) {
    const __m256 e = exp2_8(_mm256_add_ps(_mm256_loadu_ps(s + k), _mm256_loadu_ps(bias + k)));
    _mm256_storeu_ps(p + k, e);
    _mm256_storeu_ps(ds + k, _mm256_mul_ps(e, _mm256_loadu_ps(dp + k)));
  }
#endif
  for (; k < K; ++k) {
    p[k] = exp2_one(s[k] + bias[k]);
    ds[k] = p[k] * dp[k];
  }
}

void check_tiles(const at::Tensor& x, const char* name, int64_t c, int64_t b, int64_t K) {
  TORCH_CHECK(x.scalar_type() == at::kFloat, name, " must be float32, got ", x.scalar_type());
  TORCH_CHECK(x.dim() == 3 && x.size(0) == c && x.size(1) == b && x.size(2) == K, name, " must be (", c, ", ", b,
              ", ", K, "), got ", x.sizes());
  TORCH_CHECK(x.stride(2) == 1, name, " must be contiguous in its last dimension");
}

void check_bias(const at::Tensor& bias, int64_t b, int64_t K) {
  TORCH_CHECK(bias.scalar_type() == at::kFloat && bias.is_contiguous() && bias.dim() == 2 && bias.size(0) == b &&
                  bias.size(1) == K,
              "bias must be a contiguous float32 (", b, ", ", K, "), got ", bias.scalar_type(), " ", bias.sizes());
}

// rows per task: a row is K (a few hundred) values, so hand threads many at a time
constexpr int64_t kGrainRows = 64;

void band_softmax_(const at::Tensor& s, const at::Tensor& bias, const at::Tensor& top, const at::Tensor& total) {
  TORCH_CHECK(s.dim() == 3, "scores must be (c, b, K), got ", s.sizes());
  const int64_t c = s.size(0), b = s.size(1), K = s.size(2);
  check_tiles(s, "scores", c, b, K);
  check_bias(bias, b, K);
  for (const auto* x : {&top, &total}) {
    TORCH_CHECK(x->scalar_type() == at::kFloat && x->is_contiguous() && x->numel() == c * b,
                "max and sum must be contiguous float32 with c * b = ", c * b, " values, got ", x->sizes());
  }
  float* sp = s.data_ptr<float>();
  const float* bp = bias.data_ptr<float>();
  float *mp = top.data_ptr<float>(), *zp = total.data_ptr<float>();
  const int64_t s0 = s.stride(0), s1 = s.stride(1);
  at::parallel_for(0, c * b, kGrainRows, [&](int64_t lo, int64_t hi) {
    for (int64_t row = lo; row < hi; ++row) {
      const int64_t i = row / b, r = row % b;
      zp[row] = softmax_row(sp + i * s0 + r * s1, bp + r * K, K, mp[row]);
    }
  });
}

void band_weights(const at::Tensor& s, const at::Tensor& bias, const at::Tensor& dp, const at::Tensor& p,
                  const at::Tensor& ds) {
  TORCH_CHECK(s.dim() == 3, "scores must be (c, b, K), got ", s.sizes());
  const int64_t c = s.size(0), b = s.size(1), K = s.size(2);
  check_tiles(s, "scores", c, b, K);
  check_tiles(dp, "dp", c, b, K);
  check_tiles(p, "p", c, b, K);
  check_tiles(ds, "ds", c, b, K);
  check_bias(bias, b, K);
  const float *sp = s.data_ptr<float>(), *bp = bias.data_ptr<float>(), *dpp = dp.data_ptr<float>();
  float *pp = p.data_ptr<float>(), *dsp = ds.data_ptr<float>();
  // element (i, r, 0) of each, by its own strides
  auto offset = [](const at::Tensor& x, int64_t i, int64_t r) { return i * x.stride(0) + r * x.stride(1); };
  at::parallel_for(0, c * b, kGrainRows, [&](int64_t lo, int64_t hi) {
    for (int64_t row = lo; row < hi; ++row) {
      const int64_t i = row / b, r = row % b;
      weights_row(sp + offset(s, i, r), bp + r * K, dpp + offset(dp, i, r), pp + offset(p, i, r), dsp + offset(ds, i, r),
                  K);
    }
  });
}

at::Tensor exp2_(const at::Tensor& x) {  // for the tests: this file's exp2, elementwise, in place
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.is_contiguous(), "x must be contiguous float32");
  float* xp = x.data_ptr<float>();
  const int64_t n = x.numel();
  int64_t k = 0;
#ifdef ATTNLAB_AVX2
  for (; k + 8 <= n; k += 8) _mm256_storeu_ps(xp + k, exp2_8(_mm256_loadu_ps(xp + k)));
#endif
  for (; k < n; ++k) xp[k] = exp2_one(xp[k]);
  return x;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(attnlab_native, m) {
  m.def("band_softmax_(Tensor(a!) scores, Tensor bias, Tensor(b!) top, Tensor(c!) total) -> ()");
  m.def("band_weights(Tensor scores, Tensor bias, Tensor dp, Tensor(a!) p, Tensor(b!) ds) -> ()");
  m.def("exp2_(Tensor(a!) x) -> Tensor(a!)");
}

TORCH_LIBRARY_IMPL(attnlab_native, CPU, m) {
  m.impl("band_softmax_", band_softmax_);
  m.impl("band_weights", band_weights);
  m.impl("exp2_", exp2_);
}
