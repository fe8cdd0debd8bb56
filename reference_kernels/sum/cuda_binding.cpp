// sum's torch binding (torch.ops.opscope_cuda.sum_forward): the shared one-dim reduction view
// (../csrc/cuda_binding.h) and sum's launcher.
#include "../csrc/cuda_binding.h"
#include "cuda_launchers.h"

namespace opscope::sum_cuda {
namespace {

at::Tensor sum_forward(const at::Tensor& x, int64_t dim, bool keepdim) {
  return reduce_one_dim(x, dim, keepdim, false, "opscope::sum", &opscope_cuda::sum_dim);
}

}  // namespace
}  // namespace opscope::sum_cuda

TORCH_LIBRARY_FRAGMENT(opscope_cuda, m) {
  m.def("sum_forward(Tensor x, int dim, bool keepdim=False) -> Tensor", &opscope::sum_cuda::sum_forward);
}
