// mean over one dim: the shared reduction (../csrc/reduce.h, as sum) scaled by 1/R before the store.
#include "../csrc/reduce.h"

namespace opscope::reduce {

at::Tensor mean_forward(const at::Tensor& x, int64_t dim, bool keepdim, int64_t grain) {
  return reduce(x, dim, keepdim, true, grain, "opscope::mean");
}

}  // namespace opscope::reduce

TORCH_LIBRARY_FRAGMENT(opscope_cpu, m) {
  m.def("mean_forward(Tensor x, int dim, bool keepdim=False, int grain=0) -> Tensor", &opscope::reduce::mean_forward);
}
