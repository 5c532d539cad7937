// Fused relaxed subset sampler (paper, Algorithm 1; Xie & Ermon 2019): forward and backward.
//
// The PyTorch reference (advpt/masking/subset.py) runs k sequential steps per row, each a handful
// of elementwise kernels and a softmax; here each row's whole loop is one thread block, so the
// sampler costs one launch forward and one backward instead of hundreds. Per row, with
// g_0 = scores + gumbel, y_0 = 0, eligibility e and temperature t, step j = 0 .. n - 1 with
// n = min(k, max_k) is
//
//     c_j     = clamp((1 - y_j) * e, min=eps)
//     g_{j+1} = g_j + log(c_j)
//     p_j     = softmax(g_{j+1} / t)
//     y_{j+1} = y_j + p_j
//
// the reference's arithmetic in the same order (only the reductions are summed differently).
// The reference keeps updating g of rows whose k is spent; that never reaches y, so a row simply
// stops after its own n steps, and a k = 0 row writes zeros.
//
// Layout: one block of kThreads threads per row; thread `tid` owns positions
// tid, tid + kThreads, ..., tid + (kElems - 1) * kThreads, so every load and store of a step is
// coalesced and the row's g and y stay in registers for all n steps. kElems is the smallest power
// of two with kThreads * kElems >= length, a template parameter so that the per-thread arrays are
// registers, not local memory; kMaxElems bounds the row length at kThreads * kMaxElems = 8192.
// 256 threads (8 warps) keep each block-wide reduction to one shuffle tree, one shared-memory
// round and two barriers, and let several rows share an SM to hide the reductions' latency.
//
// Save versus recompute: the backward needs p_j (softmax backward) and y_j (through 1 / c_j)
// for every step, bit-exact: where a chosen position has y_j within a few ulps of 1, c_j is a
// few ulps and an ulp of error in y_j changes 1 / c_j by O(1). Neither can be rebuilt exactly in
// reverse (y_j = y_{j+1} - p_j rounds), so the forward stores both: 2 * n * length values per
// row, a float32 row of 512 tokens at k = 51 taking 209 kB, small next to the models'
// activations. A checkpointed replay would keep O(sqrt(n)) rows of state instead, but would run
// the forward's two block reductions per step again in the backward, and those reductions, not
// memory traffic, are expected to set the time. This is argued, not yet measured on a GPU;
// scripts/bench_sampler.py times the kernel against the memory-traffic floor of this design.
// Without a gradient to compute, the forward stores nothing (null state pointers).
//
// Standalone CUDA C++ (no torch headers) so that `nvcc -c` checks it on machines without a GPU;
// the PyTorch binding is subset_sampler.cpp. Build without --use_fast_math: its approximate
// log/exp and flushed denormals would move the results away from the reference's, which the
// tests compare to 1e-5.

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

namespace advpt {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxElems = 32;
constexpr unsigned kFullMask = 0xffffffffu;

// Precise log/exp/max per scalar type, so float rows never silently run the double functions.
template <typename T>
struct Math;

template <>
struct Math<float> {
  static __device__ __forceinline__ float log(float x) { return logf(x); }
  static __device__ __forceinline__ float exp(float x) { return expf(x); }
  static __device__ __forceinline__ float max(float a, float b) { return fmaxf(a, b); }
};

template <>
struct Math<double> {
  static __device__ __forceinline__ double log(double x) { return ::log(x); }
  static __device__ __forceinline__ double exp(double x) { return ::exp(x); }
  static __device__ __forceinline__ double max(double a, double b) { return fmax(a, b); }
};

struct SumOp {
  template <typename T>
  __device__ __forceinline__ T operator()(T a, T b) const { return a + b; }
};

struct MaxOp {
  template <typename T>
  __device__ __forceinline__ T operator()(T a, T b) const { return Math<T>::max(a, b); }
};

// Reduces `value` over the block and returns the result to every thread. Butterfly shuffles of a
// commutative op give every lane the same bits, so all threads normalise by the same sum.
// `scratch` holds kWarps partials; the trailing barrier lets the next call reuse it.
template <typename T, typename Op>
__device__ __forceinline__ T block_all_reduce(T value, Op op, T* scratch) {
  for (int offset = 16; offset > 0; offset /= 2) {
    value = op(value, __shfl_xor_sync(kFullMask, value, offset));
  }
  const int lane = threadIdx.x % 32;
  if (lane == 0) scratch[threadIdx.x / 32] = value;
  __syncthreads();
  value = scratch[lane % kWarps];
  for (int offset = kWarps / 2; offset > 0; offset /= 2) {
    value = op(value, __shfl_xor_sync(kFullMask, value, offset));
  }
  __syncthreads();
  return value;
}

// Steps of this row: min(k, max_k), and none for k <= 0.
__device__ __forceinline__ int64_t row_steps(const int64_t* k, int64_t row, int64_t max_k) {
  const int64_t budget = k[row] > 0 ? k[row] : 0;
  return budget < max_k ? budget : max_k;
}

// Forward: y [B, L]; with p_steps and y_steps non-null also saves, for step j of row b,
// p_j at p_steps[b, j, :] and y_j at y_steps[b, j, :] (both [B, max_k, L]).
template <typename scalar_t, int kElems>
__global__ void __launch_bounds__(kThreads) subset_forward_kernel(
    const scalar_t* __restrict__ g0, const bool* __restrict__ eligible,
    const int64_t* __restrict__ k, int64_t length, int64_t max_k, scalar_t inv_temperature,
    scalar_t eps, scalar_t* __restrict__ y_out, scalar_t* __restrict__ p_steps,
    scalar_t* __restrict__ y_steps) {
  using M = Math<scalar_t>;
  __shared__ scalar_t scratch[kWarps];
  const int64_t row = blockIdx.x;
  const int64_t steps = row_steps(k, row, max_k);
  const bool save = p_steps != nullptr;

  scalar_t g[kElems], y[kElems], z[kElems];  // z: g / t, then exp(g / t - max)
  bool in_row[kElems], e[kElems];
#pragma unroll
  for (int m = 0; m < kElems; ++m) {
    const int64_t i = threadIdx.x + int64_t(m) * kThreads;
    in_row[m] = i < length;
    g[m] = in_row[m] ? g0[row * length + i] : scalar_t(0);
    e[m] = in_row[m] && eligible[row * length + i];
    y[m] = scalar_t(0);
  }

  for (int64_t step = 0; step < steps; ++step) {
    scalar_t local_max = -INFINITY;
#pragma unroll
    for (int m = 0; m < kElems; ++m) {
      if (!in_row[m]) continue;
      const scalar_t kept = e[m] ? scalar_t(1) - y[m] : scalar_t(0);
      g[m] += M::log(kept < eps ? eps : kept);
      z[m] = g[m] * inv_temperature;
      local_max = M::max(local_max, z[m]);
    }
    const scalar_t row_max = block_all_reduce(local_max, MaxOp(), scratch);

    scalar_t local_sum = 0;
#pragma unroll
    for (int m = 0; m < kElems; ++m) {
      if (!in_row[m]) continue;
      z[m] = M::exp(z[m] - row_max);
      local_sum += z[m];
    }
    const scalar_t row_sum = block_all_reduce(local_sum, SumOp(), scratch);

    const int64_t saved = (row * max_k + step) * length;
#pragma unroll
    for (int m = 0; m < kElems; ++m) {
      if (!in_row[m]) continue;
      const int64_t i = threadIdx.x + int64_t(m) * kThreads;
      const scalar_t p = z[m] / row_sum;
      if (save) {
        p_steps[saved + i] = p;
        y_steps[saved + i] = y[m];
      }
      y[m] += p;
    }
  }

#pragma unroll
  for (int m = 0; m < kElems; ++m) {
    const int64_t i = threadIdx.x + int64_t(m) * kThreads;
    if (in_row[m]) y_out[row * length + i] = y[m];
  }
}

// Backward: the reverse recurrence over the saved p_j, y_j. Going down from j = n - 1, with
// dy = dL/dy_{j+1} and dg = dL/dg_{j+1} as carried from the later steps (zero at j = n - 1):
//
//     dg += p_j * (dy - <dy, p_j>) / t             softmax and temperature: now dL/dg_{j+1}
//     dy -= dg / c_j  where (1 - y_j) e >= eps     log and clamp (no gradient where clamped)
//
// after which dy = dL/dy_j and dg = dL/dg_j (y_{j+1} = y_j + p_j and g_{j+1} = g_j + log(c_j)
// pass both through unchanged). The result is dL/dg_0, the gradient of the scores.
template <typename scalar_t, int kElems>
__global__ void __launch_bounds__(kThreads) subset_backward_kernel(
    const scalar_t* __restrict__ grad_y, const bool* __restrict__ eligible,
    const int64_t* __restrict__ k, const scalar_t* __restrict__ p_steps,
    const scalar_t* __restrict__ y_steps, int64_t length, int64_t max_k,
    scalar_t inv_temperature, scalar_t eps, scalar_t* __restrict__ grad_g0) {
  __shared__ scalar_t scratch[kWarps];
  const int64_t row = blockIdx.x;
  const int64_t steps = row_steps(k, row, max_k);

  scalar_t dy[kElems], dg[kElems], p[kElems];
  bool in_row[kElems], e[kElems];
#pragma unroll
  for (int m = 0; m < kElems; ++m) {
    const int64_t i = threadIdx.x + int64_t(m) * kThreads;
    in_row[m] = i < length;
    dy[m] = in_row[m] ? grad_y[row * length + i] : scalar_t(0);
    dg[m] = scalar_t(0);
    e[m] = in_row[m] && eligible[row * length + i];
  }

  for (int64_t step = steps - 1; step >= 0; --step) {
    const int64_t saved = (row * max_k + step) * length;
    scalar_t local_dot = 0;
#pragma unroll
    for (int m = 0; m < kElems; ++m) {
      if (!in_row[m]) continue;
      p[m] = p_steps[saved + threadIdx.x + int64_t(m) * kThreads];
      local_dot += dy[m] * p[m];
    }
    const scalar_t dot = block_all_reduce(local_dot, SumOp(), scratch);

#pragma unroll
    for (int m = 0; m < kElems; ++m) {
      if (!in_row[m]) continue;
      const int64_t i = threadIdx.x + int64_t(m) * kThreads;
      dg[m] += p[m] * (dy[m] - dot) * inv_temperature;
      const scalar_t kept = e[m] ? scalar_t(1) - y_steps[saved + i] : scalar_t(0);
      if (kept >= eps) dy[m] -= dg[m] / kept;
    }
  }

#pragma unroll
  for (int m = 0; m < kElems; ++m) {
    const int64_t i = threadIdx.x + int64_t(m) * kThreads;
    if (in_row[m]) grad_g0[row * length + i] = dg[m];
  }
}

// Calls launch(std::integral_constant<int, kElems>) with the smallest kElems that covers the row.
template <int kElems, typename Launch>
cudaError_t with_elems_per_thread(int64_t length, const Launch& launch) {
  if constexpr (kElems > kMaxElems) {
    return cudaErrorInvalidValue;
  } else {
    if (length <= int64_t(kElems) * kThreads) {
      return launch(std::integral_constant<int, kElems>());
    }
    return with_elems_per_thread<kElems * 2>(length, launch);
  }
}

bool launchable(int64_t batch, int64_t length) {
  return batch <= INT32_MAX && length <= int64_t(kThreads) * kMaxElems;
}

}  // namespace

int64_t subset_sampler_max_length() { return int64_t(kThreads) * kMaxElems; }

template <typename scalar_t>
cudaError_t subset_sampler_forward(const scalar_t* g0, const bool* eligible, const int64_t* k,
                                   int64_t batch, int64_t length, int64_t max_k,
                                   double temperature, double eps, scalar_t* y_out,
                                   scalar_t* p_steps, scalar_t* y_steps, cudaStream_t stream) {
  if (batch == 0 || length == 0) return cudaSuccess;
  if (!launchable(batch, length)) return cudaErrorInvalidValue;
  return with_elems_per_thread<1>(length, [&](auto elems) {
    subset_forward_kernel<scalar_t, decltype(elems)::value>
        <<<static_cast<unsigned>(batch), kThreads, 0, stream>>>(
            g0, eligible, k, length, max_k, static_cast<scalar_t>(1.0 / temperature),
            static_cast<scalar_t>(eps), y_out, p_steps, y_steps);
    return cudaGetLastError();
  });
}

template <typename scalar_t>
cudaError_t subset_sampler_backward(const scalar_t* grad_y, const bool* eligible,
                                    const int64_t* k, const scalar_t* p_steps,
                                    const scalar_t* y_steps, int64_t batch, int64_t length,
                                    int64_t max_k, double temperature, double eps,
                                    scalar_t* grad_g0, cudaStream_t stream) {
  if (batch == 0 || length == 0) return cudaSuccess;
  if (!launchable(batch, length)) return cudaErrorInvalidValue;
  return with_elems_per_thread<1>(length, [&](auto elems) {
    subset_backward_kernel<scalar_t, decltype(elems)::value>
        <<<static_cast<unsigned>(batch), kThreads, 0, stream>>>(
            grad_y, eligible, k, p_steps, y_steps, length, max_k,
            static_cast<scalar_t>(1.0 / temperature), static_cast<scalar_t>(eps), grad_g0);
    return cudaGetLastError();
  });
}

#define ADVPT_INSTANTIATE_SUBSET_SAMPLER(scalar_t)                                              \
  template cudaError_t subset_sampler_forward<scalar_t>(                                        \
      const scalar_t*, const bool*, const int64_t*, int64_t, int64_t, int64_t, double, double, \
      scalar_t*, scalar_t*, scalar_t*, cudaStream_t);                                           \
  template cudaError_t subset_sampler_backward<scalar_t>(                                       \
      const scalar_t*, const bool*, const int64_t*, const scalar_t*, const scalar_t*, int64_t,  \
      int64_t, int64_t, double, double, scalar_t*, cudaStream_t);

ADVPT_INSTANTIATE_SUBSET_SAMPLER(float)
ADVPT_INSTANTIATE_SUBSET_SAMPLER(double)

}  // namespace advpt
