// mean's torch binding (torch.ops.opscope_cuda.mean_forward): the shared one-dim reduction view
// (../csrc/cuda_binding.h) and mean's launcher; an empty reduced dim gives NaN, as torch.mean.
#include "../csrc/cuda_binding.h"
#include "cuda_launchers.h"

namespace opscope::mean_cuda {
namespace {

at::Tensor mean_forward(const at::Tensor& x, int64_t dim, bool keepdim) {
  return reduce_one_dim(x, dim, keepdim, true, "opscope::mean", &opscope_cuda::mean_dim);
}

}  // namespace
}  // namespace opscope::mean_cuda

TORCH_LIBRARY_FRAGMENT(opscope_cuda, m) {
  m.def("mean_forward(Tensor x, int dim, bool keepdim=False) -> Tensor", &opscope::mean_cuda::mean_forward);
}
