// Weight-only products for decoding (attnlab.decoding.quantize): rows of activations against an
// int8 or bf16 matrix, reading each weight once. Registered as torch.ops.attnlab_native; built,
// loaded and given its PyTorch references by attnlab/nn/native/__init__.py, whose docstring
// states what each op computes. Compiled with -ffp-contract=off, so that every fp32 operation
// below rounds once, as the references' separate torch operations do.
//
// int8_rows: y = float(sum_k xq[n,k] * q[o,k]) * sx[n] * s[o] (+ b[o]), each row of x scaled to
// int16 (xq = round(x / sx), sx = max|x[n]| / 32767) and the sum taken exactly in integers
// (int32 lanes of at most 8192 columns, then int64), so any order of summing gives the same bits.
// bf16_rows: y = bf16(bf16(x) @ w^T), fp32 accumulation (the order of the sums is this kernel's).
//
// Output rows are split among torch's intra-op threads (at::parallel_for), so torch.set_num_threads
// governs these kernels as it does every other.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <vector>

#include "simd.h"

namespace {

constexpr float kInt16Max = 32767.f;
// columns one int32 lane may sum: each step adds a pair of products, at most 2 * 32767 * 127 < 2^23
constexpr int64_t kExactColumns = 8192;
// rows of x that share each widened weight when there are that many (a prompt)
constexpr int64_t kRowsAtOnce = 4;

inline float bf16_to_float(uint16_t b) {  // its 16 bits are the high half of the fp32's
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// ---------------------------------------------------------------- int8 weights, int16 activations

#ifdef ATTNLAB_AVX2
inline int64_t sum_lanes(__m256i v) {  // the 8 int32 lanes summed in int64
  __m256i wide = _mm256_add_epi64(_mm256_cvtepi32_epi64(_mm256_castsi256_si128(v)),
                                  _mm256_cvtepi32_epi64(_mm256_extracti128_si256(v, 1)));
  alignas(32) int64_t part[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(part), wide);
  return part[0] + part[1] + part[2] + part[3];
}
#endif

// the next weights a row will read, fetched this many bytes ahead of the loads (measured on a
// 2-core AMD EPYC: 27% more int8 weights per second on one thread than without)
constexpr int64_t kPrefetchBytes = 1024;

// sum_k x[k] * w[k], exact
inline int64_t dot_int16_int8(const int16_t* x, const int8_t* w, int64_t K) {
  int64_t total = 0, k = 0;
#ifdef ATTNLAB_AVX2
  auto step = [&](__m256i acc, int64_t at) {  // 16 int8 weights widened to int16, multiplied and summed in pairs
    __m256i wide = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + at)));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(wide, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + at))));
  };
  while (k + 32 <= K) {
    const int64_t stop = std::min(K, k + kExactColumns);
    __m256i a0 = _mm256_setzero_si256(), a1 = _mm256_setzero_si256();
    for (; k + 64 <= stop; k += 64) {
      _mm_prefetch(reinterpret_cast<const char*>(w + k + kPrefetchBytes), _MM_HINT_T0);
      a0 = step(step(a0, k), k + 32);
      a1 = step(step(a1, k + 16), k + 48);
    }
    for (; k + 32 <= stop; k += 32) {
      a0 = step(a0, k);
      a1 = step(a1, k + 16);
    }
    total += sum_lanes(a0) + sum_lanes(a1);
  }
#endif
  for (; k < K; ++k) total += static_cast<int64_t>(x[k]) * w[k];
  return total;
}

// sums[r] = sum_k x[r * K + k] * w[k] for R rows of x at once, exact: each 16 weights are widened
// once for the R rows (a prompt's rows; one accumulator per row, so blocks of 4,096 columns)
template <int R>
inline void dot_rows_int16_int8(const int16_t* x, const int8_t* w, int64_t K, int64_t* sums) {
  int64_t k = 0;
  for (int r = 0; r < R; ++r) sums[r] = 0;
#ifdef ATTNLAB_AVX2
  while (k + 16 <= K) {
    const int64_t stop = std::min(K, k + kExactColumns / 2);
    __m256i acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_si256();
    for (; k + 16 <= stop; k += 16) {
      __m256i wide = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + k)));
      for (int r = 0; r < R; ++r)
        acc[r] = _mm256_add_epi32(acc[r], _mm256_madd_epi16(wide, _mm256_loadu_si256(
                                                                     reinterpret_cast<const __m256i*>(x + r * K + k))));
    }
    for (int r = 0; r < R; ++r) sums[r] += sum_lanes(acc[r]);
  }
#endif
  for (; k < K; ++k)
    for (int r = 0; r < R; ++r) sums[r] += static_cast<int64_t>(x[r * K + k]) * w[k];
}

// row n of x as int16 and its scale; false when the row holds inf or NaN
inline bool to_int16(const float* x, int64_t K, int16_t* out, float* scale) {
  float top = 0.f;
  bool finite = true;
  for (int64_t k = 0; k < K; ++k) {
    top = std::max(top, std::fabs(x[k]));
    finite = finite && std::isfinite(x[k]);
  }
  if (!finite) return false;
  const float s = top > 0.f ? top / kInt16Max : 1.f;
  for (int64_t k = 0; k < K; ++k)
    out[k] = static_cast<int16_t>(std::clamp(std::nearbyint(x[k] / s), -kInt16Max, kInt16Max));
  *scale = s;
  return true;
}

at::Tensor int8_rows(const at::Tensor& x, const at::Tensor& q, const at::Tensor& scale,
                     const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.device().is_cpu() && q.device().is_cpu(), "int8_rows: CPU tensors only");
  TORCH_CHECK(x.scalar_type() == at::kFloat && q.scalar_type() == at::kChar && scale.scalar_type() == at::kFloat,
              "int8_rows: x fp32, q int8 and scale fp32, got ", x.scalar_type(), ", ", q.scalar_type(), " and ",
              scale.scalar_type());
  TORCH_CHECK(x.dim() == 2 && q.dim() == 2 && x.size(1) == q.size(1), "int8_rows: x (N, K) and q (O, K), got ",
              x.sizes(), " and ", q.sizes());
  const int64_t N = x.size(0), K = x.size(1), O = q.size(0);
  TORCH_CHECK(scale.numel() == O && (!bias || (bias->scalar_type() == at::kFloat && bias->numel() == O)),
              "int8_rows: scale and bias need ", O, " fp32 values");
  TORCH_CHECK(x.is_contiguous() && q.is_contiguous() && scale.is_contiguous() && (!bias || bias->is_contiguous()),
              "int8_rows: contiguous tensors only");
  at::Tensor y = at::empty({N, O}, x.options());
  if (N == 0 || O == 0) return y;
  std::vector<int16_t> xq(static_cast<size_t>(N * K));
  std::vector<float> sx(static_cast<size_t>(N));
  std::vector<char> finite(static_cast<size_t>(N));
  const float* xp = x.data_ptr<float>();
  for (int64_t n = 0; n < N; ++n) finite[n] = to_int16(xp + n * K, K, xq.data() + n * K, &sx[n]);
  const int8_t* qp = q.data_ptr<int8_t>();
  const float* sp = scale.data_ptr<float>();
  const float* bp = bias ? bias->data_ptr<float>() : nullptr;
  float* yp = y.data_ptr<float>();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // about 64 KiB of weights per task: enough work to pay for a thread's start
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / K);
  at::parallel_for(0, O, grain, [&](int64_t begin, int64_t end) {
    for (int64_t o = begin; o < end; ++o) {
      const int8_t* row = qp + o * K;  // read from memory once; from the L1 cache for the other rows of x
      int64_t sums[kRowsAtOnce];
      for (int64_t n = 0; n < N;) {
        const int64_t rows = N - n >= kRowsAtOnce ? kRowsAtOnce : 1;
        if (rows == kRowsAtOnce)
          dot_rows_int16_int8<kRowsAtOnce>(xq.data() + n * K, row, K, sums);
        else
          sums[0] = dot_int16_int8(xq.data() + n * K, row, K);
        for (int64_t r = 0; r < rows; ++r, ++n) {
          float v = nan;
          if (finite[n]) {
            v = static_cast<float>(sums[r]) * sx[n];
            v = v * sp[o];
            if (bp) v = v + bp[o];
          }
          yp[n * O + o] = v;
        }
      }
    }
  });
  return y;
}

// ---------------------------------------------------------------- bf16 weights

// The bf16 loop reads 16 weights as 8 32-bit words: a word's low half is an even column's weight
// and its high half the next odd column's, and each becomes an fp32 in one instruction (shift
// left 16 / clear the low half). So the activations of each 16 columns are laid out evens first,
// then odds ("paired"), and the fp32 sums pair them as the weights come. Columns past the last
// full 32 keep their order.
inline void pair_columns(const float* x, int64_t K, float* out) {
  int64_t k = 0;
#ifdef ATTNLAB_AVX2
  for (const int64_t paired = K & ~int64_t{31}; k < paired; k += 16)  // what the loop of 32 reads
    for (int64_t j = 0; j < 8; ++j) {
      out[k + j] = x[k + 2 * j];
      out[k + 8 + j] = x[k + 2 * j + 1];
    }
#endif
  for (; k < K; ++k) out[k] = x[k];
}

// sum_k x[k] * w[k] for a bf16 row, x paired (above)
inline float dot_bf16(const float* x, const uint16_t* w, int64_t K) {
  int64_t k = 0;
  float total = 0.f;
#ifdef ATTNLAB_AVX2
  const __m256i high = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
  for (; k + 32 <= K; k += 32) {
    _mm_prefetch(reinterpret_cast<const char*>(w + k) + 2 * kPrefetchBytes, _MM_HINT_T0);
    __m256i v0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + k));
    __m256i v1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + k + 16));
    a0 = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(v0, 16)), _mm256_loadu_ps(x + k), a0);
    a1 = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_and_si256(v0, high)), _mm256_loadu_ps(x + k + 8), a1);
    a2 = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(v1, 16)), _mm256_loadu_ps(x + k + 16), a2);
    a3 = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_and_si256(v1, high)), _mm256_loadu_ps(x + k + 24), a3);
  }
  total = sum_lanes(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
#endif
  for (; k < K; ++k) total += x[k] * bf16_to_float(w[k]);
  return total;
}

at::Tensor bf16_rows(const at::Tensor& x, const at::Tensor& w) {
  TORCH_CHECK(x.device().is_cpu() && w.device().is_cpu(), "bf16_rows: CPU tensors only");
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && w.scalar_type() == at::kBFloat16, "bf16_rows: x and w bf16, got ",
              x.scalar_type(), " and ", w.scalar_type());
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), "bf16_rows: x (N, K) and w (O, K), got ",
              x.sizes(), " and ", w.sizes());
  TORCH_CHECK(x.is_contiguous() && w.is_contiguous(), "bf16_rows: contiguous tensors only");
  const int64_t N = x.size(0), K = x.size(1), O = w.size(0);
  at::Tensor y = at::empty({N, O}, x.options());
  if (N == 0 || O == 0) return y;
  std::vector<float> plain(static_cast<size_t>(K)), xf(static_cast<size_t>(N * K));  // the activations in fp32, once
  const uint16_t* xb = reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>());
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t k = 0; k < K; ++k) plain[k] = bf16_to_float(xb[n * K + k]);
    pair_columns(plain.data(), K, xf.data() + n * K);
  }
  const uint16_t* wp = reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>());
  c10::BFloat16* yp = y.data_ptr<c10::BFloat16>();
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 15) / K);
  at::parallel_for(0, O, grain, [&](int64_t begin, int64_t end) {
    for (int64_t o = begin; o < end; ++o)
      for (int64_t n = 0; n < N; ++n) yp[n * O + o] = c10::BFloat16(dot_bf16(xf.data() + n * K, wp + o * K, K));
  });
  return y;
}

}  // namespace

TORCH_LIBRARY(attnlab_native, m) {
  m.def("int8_rows(Tensor x, Tensor q, Tensor scale, Tensor? bias) -> Tensor");
  m.def("bf16_rows(Tensor x, Tensor w) -> Tensor");
}

TORCH_LIBRARY_IMPL(attnlab_native, CPU, m) {
  m.impl("int8_rows", int8_rows);
  m.impl("bf16_rows", bf16_rows);
}
