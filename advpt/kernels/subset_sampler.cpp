// PyTorch binding of the fused relaxed subset sampler (subset_sampler.cu): input checks, output
// and saved-state allocation on the inputs' device, and launches on PyTorch's current stream.
// The autograd wrapper is advpt/kernels/loader.py.

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>

#include <vector>

namespace advpt {

// Defined in subset_sampler.cu, instantiated for float and double.
template <typename scalar_t>
cudaError_t subset_sampler_forward(const scalar_t* g0, const bool* eligible, const int64_t* k,
                                   int64_t batch, int64_t length, int64_t max_k,
                                   double temperature, double eps, scalar_t* y_out,
                                   scalar_t* p_steps, scalar_t* y_steps, cudaStream_t stream);

template <typename scalar_t>
cudaError_t subset_sampler_backward(const scalar_t* grad_y, const bool* eligible,
                                    const int64_t* k, const scalar_t* p_steps,
                                    const scalar_t* y_steps, int64_t batch, int64_t length,
                                    int64_t max_k, double temperature, double eps,
                                    scalar_t* grad_g0, cudaStream_t stream);

int64_t subset_sampler_max_length();

}  // namespace advpt

namespace {

// `rows` is a contiguous float32/float64 [B, L] CUDA tensor; eligible and k describe its rows.
void check_rows(const torch::Tensor& rows, const torch::Tensor& eligible, const torch::Tensor& k,
                double temperature, int64_t max_k) {
  TORCH_CHECK(rows.is_cuda(), "subset sampler: tensors must be on a CUDA device");
  TORCH_CHECK(rows.dim() == 2 && rows.is_contiguous(),
              "subset sampler: expected a contiguous [B, L] tensor");
  TORCH_CHECK(rows.scalar_type() == at::kFloat || rows.scalar_type() == at::kDouble,
              "subset sampler: float32 or float64 only, got ", rows.scalar_type());
  TORCH_CHECK(rows.size(1) <= advpt::subset_sampler_max_length(), "subset sampler: rows of ",
              rows.size(1), " tokens exceed the kernel's ", advpt::subset_sampler_max_length());
  TORCH_CHECK(eligible.scalar_type() == at::kBool && eligible.sizes() == rows.sizes() &&
                  eligible.is_contiguous() && eligible.device() == rows.device(),
              "subset sampler: eligible must be a contiguous bool [B, L] on the rows' device");
  TORCH_CHECK(k.scalar_type() == at::kLong && k.dim() == 1 && k.size(0) == rows.size(0) &&
                  k.is_contiguous() && k.device() == rows.device(),
              "subset sampler: k must be a contiguous int64 [B] on the rows' device");
  TORCH_CHECK(temperature > 0, "subset sampler: temperature must be > 0");
  TORCH_CHECK(max_k >= 0, "subset sampler: max_k must be >= 0");
}

// Returns y [B, L] and, with save_state, the backward's p_steps and y_steps [B, max_k, L]
// (empty otherwise).
std::vector<torch::Tensor> forward(const torch::Tensor& g0, const torch::Tensor& eligible,
                                   const torch::Tensor& k, double temperature, int64_t max_k,
                                   double eps, bool save_state) {
  check_rows(g0, eligible, k, temperature, max_k);
  const c10::cuda::CUDAGuard device_guard(g0.device());
  const int64_t batch = g0.size(0), length = g0.size(1);
  auto y = torch::empty_like(g0);
  const std::vector<int64_t> state_shape =
      save_state ? std::vector<int64_t>{batch, max_k, length} : std::vector<int64_t>{0};
  auto p_steps = torch::empty(state_shape, g0.options());
  auto y_steps = torch::empty(state_shape, g0.options());
  AT_DISPATCH_FLOATING_TYPES(g0.scalar_type(), "subset_sampler_forward", [&] {
    C10_CUDA_CHECK(advpt::subset_sampler_forward<scalar_t>(
        g0.data_ptr<scalar_t>(), eligible.data_ptr<bool>(), k.data_ptr<int64_t>(), batch, length,
        max_k, temperature, eps, y.data_ptr<scalar_t>(),
        save_state ? p_steps.data_ptr<scalar_t>() : nullptr,
        save_state ? y_steps.data_ptr<scalar_t>() : nullptr,
        c10::cuda::getCurrentCUDAStream()));
  });
  return {y, p_steps, y_steps};
}

// Returns dL/dg0 [B, L] from dL/dy [B, L] and the state saved by forward.
torch::Tensor backward(const torch::Tensor& grad_y, const torch::Tensor& eligible,
                       const torch::Tensor& k, const torch::Tensor& p_steps,
                       const torch::Tensor& y_steps, double temperature, int64_t max_k,
                       double eps) {
  check_rows(grad_y, eligible, k, temperature, max_k);
  const int64_t batch = grad_y.size(0), length = grad_y.size(1);
  const std::vector<int64_t> state_shape{batch, max_k, length};
  for (const auto& state : {p_steps, y_steps}) {
    TORCH_CHECK(state.sizes() == state_shape && state.is_contiguous() &&
                    state.scalar_type() == grad_y.scalar_type() &&
                    state.device() == grad_y.device(),
                "subset sampler: saved state must be [B, max_k, L] like grad_y");
  }
  const c10::cuda::CUDAGuard device_guard(grad_y.device());
  auto grad_g0 = torch::empty_like(grad_y);
  AT_DISPATCH_FLOATING_TYPES(grad_y.scalar_type(), "subset_sampler_backward", [&] {
    C10_CUDA_CHECK(advpt::subset_sampler_backward<scalar_t>(
        grad_y.data_ptr<scalar_t>(), eligible.data_ptr<bool>(), k.data_ptr<int64_t>(),
        p_steps.data_ptr<scalar_t>(), y_steps.data_ptr<scalar_t>(), batch, length, max_k,
        temperature, eps, grad_g0.data_ptr<scalar_t>(), c10::cuda::getCurrentCUDAStream()));
  });
  return grad_g0;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &forward, "Relaxed subset sampler forward: y, p_steps, y_steps");
  m.def("backward", &backward, "Relaxed subset sampler backward: dL/dg0");
  m.def("max_length", &advpt::subset_sampler_max_length, "Longest row the kernel supports");
}
