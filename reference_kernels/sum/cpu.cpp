// sum over one dim: the shared reduction in ../csrc/reduce.h (strategy by shape and layout, see there).
#include "../csrc/reduce.h"

namespace opscope::reduce {

at::Tensor sum_forward(const at::Tensor& x, int64_t dim, bool keepdim, int64_t grain) {
  return reduce(x, dim, keepdim, false, grain, "opscope::sum");
}

}  // namespace opscope::reduce

TORCH_LIBRARY_FRAGMENT(opscope_cpu, m) {
  m.def("sum_forward(Tensor x, int dim, bool keepdim=False, int grain=0) -> Tensor", &opscope::reduce::sum_forward);
  m.def("reduce_strategy(Tensor x, int dim) -> str", &opscope::reduce::strategy);
}
