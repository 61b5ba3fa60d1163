// L2L-CMP's host commit of one layer in one pass: each element's 16-bit gradient read, widened and multiplied by
// the step's gradient factor (a clipping coefficient, or 1), AdamW applied to the FP32 master and both moments, and
// the master's 16-bit copy written, all while the element is in registers. 2 + 12 bytes read and 12 + 2 written a
// parameter: 28, as torch's fused AdamW on FP32 gradients. One parallel region over the whole layer: fixed chunks
// of every tensor, handed out dynamically, so that a thread the OS preempts holds up only the chunk it has.
//
// The arithmetic is torch's fused CPU AdamW's vector loop (aten/src/ATen/native/cpu/FusedAdamKernel.cpp, ADAMW
// mode) operation by operation: the weight decay as a product by (1 - lr * wd) rounded to float, the first moment
// as a lerp by one fused multiply-add, the second as fma((1 - beta2) * g, g, v * beta2) (the contraction torch's
// own build makes of its v * beta2 + (1 - beta2) * g * g), the master as p + ((-lr / c1) * m) / (sqrt(v) /
// sqrt(c2) + eps), each constant rounded to float from its double as torch does. Built with -ffp-contract=off, so
// no other product is fused; every element is computed alone, whatever the chunks, threads or vector width.
//
// Torch runs its vector loop over every whole 16 elements of a tensor (its task units) and computes the last
// numel % 16 apart, in a scalar loop its compiler contracts otherwise. So this kernel steps each tensor's first
// numel - numel % 16 elements (its `body`) and leaves the rest to torch's own kernel (suite/harness/optim.py), and
// the whole is torch's bits: the widening copy, torch's fused AdamW and the rounding copy of the windowed path,
// checked on this machine before first use (suite/harness/host_commit.py) and by tests/l2l/test_l2l_host_bytes.py.

#include <torch/extension.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace {

constexpr int64_t kChunk = 1 << 16;  // elements per chunk: 1.8 MiB of traffic, thousands per layer of an 8B model
constexpr int64_t kUnit = 16;        // torch's task unit: its vector loop covers whole units

inline int64_t body(int64_t numel) { return numel - numel % kUnit; }

inline float widen(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// c10::BFloat16's rounding: to nearest, ties to even; a NaN becomes the quiet NaN 0x7FC0.
inline uint16_t round_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  return f != f ? static_cast<uint16_t>(0x7FC0) : static_cast<uint16_t>(rounded);
}

struct Coeffs {
  float lerp, beta2, sq_coef, bc2_sqrt, eps, neg_step, grad_mul;
  bool small;  // |1 - beta1| < 0.5: torch's lerp from the moment, else from the gradient
};

constexpr int64_t kBlock = 512;  // elements whose 16-bit copies are rounded into an L1 buffer, then streamed out

// Copy `n` 16-bit values from `src` to `dst` with non-temporal stores where the CPU has them: the copy is read next
// by the upload to the device, not by this core, and a store that misses the cache would first read its line
// (2 bytes a parameter more than the 28 torch's fused AdamW moves, measured as 1.07x its time at the bandwidth
// limit). The caller fences (end_streams) before the copy is read.
inline void stream_out(uint16_t* dst, const uint16_t* src, int64_t n) {
  int64_t j = 0;
#if defined(__SSE2__)
  for (; j < n && (reinterpret_cast<uintptr_t>(dst + j) & 15) != 0; ++j) dst[j] = src[j];
  for (; j + 8 <= n; j += 8)
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + j), _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + j)));
#endif
  for (; j < n; ++j) dst[j] = src[j];
}

inline void end_streams() {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

// Elements [b, e) of one tensor. The two choices are template parameters: a branch inside the loop, even on a
// constant, kept GCC from vectorising it (2.9x torch's time, measured).
template <bool Decays, bool Small>
void span(float* __restrict p, const uint16_t* __restrict g16, float* __restrict m, float* __restrict v,
          uint16_t* __restrict out, int64_t b, int64_t e, const Coeffs k, const float decay) {
  alignas(64) uint16_t rounded[kBlock];
  for (int64_t lo = b; lo < e; lo += kBlock) {
    const int64_t hi = std::min(lo + kBlock, e);
#pragma omp simd
    for (int64_t j = lo; j < hi; ++j) {
      const float g = widen(g16[j]) * k.grad_mul;
      const float pj = Decays ? p[j] * decay : p[j];
      const float mj = Small ? std::fma(k.lerp, g - m[j], m[j]) : std::fma(k.lerp, g - m[j], g);
      const float vj = std::fma(k.sq_coef * g, g, v[j] * k.beta2);
      const float denom = std::sqrt(vj) / k.bc2_sqrt + k.eps;
      const float pn = pj + (k.neg_step * mj) / denom;
      m[j] = mj;
      v[j] = vj;
      p[j] = pn;
      rounded[j - lo] = round_bf16(pn);
    }
    stream_out(out + lo, rounded, hi - lo);
  }
}

void check(const std::vector<at::Tensor>& ts, const std::vector<at::Tensor>& like, at::ScalarType type,
           const char* what) {
  TORCH_CHECK(ts.size() == like.size(), "adamw_cmp_step: ", what, " has ", ts.size(), " tensors, params ",
              like.size());
  for (size_t i = 0; i < ts.size(); ++i) {
    const auto& t = ts[i];
    TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == type && t.is_contiguous(), "adamw_cmp_step: ", what, "[",
                i, "] must be a contiguous ", c10::toString(type), " CPU tensor");
    TORCH_CHECK(t.numel() == like[i].numel(), "adamw_cmp_step: ", what, "[", i, "] has ", t.numel(),
                " elements, its parameter ", like[i].numel());
  }
}

}  // namespace

// One AdamW step (step number `step`, counted from 1) of the bodies of tensors with their own weight decays, from
// bf16 gradients times `grad_mul`, writing each master's bf16 copy. `threads`: the team's size.
void adamw_cmp_step(std::vector<at::Tensor> params, std::vector<at::Tensor> grads, std::vector<at::Tensor> exp_avgs,
                    std::vector<at::Tensor> exp_avg_sqs, std::vector<at::Tensor> copies,
                    std::vector<double> weight_decays, double lr, double beta1, double beta2, double eps, double step,
                    double grad_mul, int64_t threads) {
  check(params, params, at::kFloat, "params");
  check(grads, params, at::kBFloat16, "grads");
  check(exp_avgs, params, at::kFloat, "exp_avgs");
  check(exp_avg_sqs, params, at::kFloat, "exp_avg_sqs");
  check(copies, params, at::kBFloat16, "copies");
  TORCH_CHECK(weight_decays.size() == params.size(), "adamw_cmp_step: a weight decay a parameter");
  TORCH_CHECK(threads >= 1, "adamw_cmp_step: threads must be at least 1");
  // As torch's adam_fused_step_impl: in double, then each constant rounded to float where it meets the data.
  const double c1 = 1 - std::pow(beta1, step), c2 = 1 - std::pow(beta2, step);
  const double w = 1 - beta1;
  Coeffs k{};
  k.small = std::abs(static_cast<float>(w)) < 0.5f;
  k.lerp = k.small ? static_cast<float>(w) : static_cast<float>(w) - 1.f;
  k.beta2 = static_cast<float>(beta2);
  k.sq_coef = static_cast<float>(1 - beta2);
  k.bc2_sqrt = static_cast<float>(std::sqrt(c2));
  k.eps = static_cast<float>(eps);
  k.neg_step = static_cast<float>(-(lr / c1));
  k.grad_mul = static_cast<float>(grad_mul);
  std::vector<float> decay(params.size());
  for (size_t i = 0; i < params.size(); ++i) decay[i] = static_cast<float>(1 - lr * weight_decays[i]);

  struct Chunk {
    int32_t tensor;
    int64_t begin, end;
  };
  std::vector<Chunk> chunks;
  for (size_t i = 0; i < params.size(); ++i)
    for (int64_t b = 0; b < body(params[i].numel()); b += kChunk)
      chunks.push_back({static_cast<int32_t>(i), b, std::min(b + kChunk, body(params[i].numel()))});
  const int64_t n = static_cast<int64_t>(chunks.size());
  struct Ptrs {
    float *p, *m, *v;
    const uint16_t* g16;
    uint16_t* out;
  };
  std::vector<Ptrs> ptrs;
  for (size_t i = 0; i < params.size(); ++i)
    ptrs.push_back({params[i].data_ptr<float>(), exp_avgs[i].data_ptr<float>(), exp_avg_sqs[i].data_ptr<float>(),
                    reinterpret_cast<const uint16_t*>(grads[i].data_ptr<at::BFloat16>()),
                    reinterpret_cast<uint16_t*>(copies[i].data_ptr<at::BFloat16>())});

#pragma omp parallel for schedule(dynamic, 1) num_threads(static_cast<int>(threads)) if (n > 1)
  for (int64_t c = 0; c < n; ++c) {
    const Chunk ch = chunks[c];
    const int i = ch.tensor;
    const auto [p, m, v, g16, out] = ptrs[i];
    const bool decays = weight_decays[i] != 0.0;
    if (decays && k.small)
      span<true, true>(p, g16, m, v, out, ch.begin, ch.end, k, decay[i]);
    else if (decays)
      span<true, false>(p, g16, m, v, out, ch.begin, ch.end, k, decay[i]);
    else if (k.small)
      span<false, true>(p, g16, m, v, out, ch.begin, ch.end, k, decay[i]);
    else
      span<false, false>(p, g16, m, v, out, ch.begin, ch.end, k, decay[i]);
    end_streams();  // this chunk's copies are in memory before the region ends
  }
}
