// What every kernel's torch binding (<kernel>/cuda_binding.cpp, C++ against torch) and its launchers
// (<kernel>/cuda.cu, pure CUDA, declared in <kernel>/cuda.h) agree on: the dtype codes and the size of
// the backward workspaces. Launchers take device pointers to contiguous data unless strides are given;
// parameter vectors (weight, bias, mask) are in the accumulation type (float, double for float64);
// workspaces are allocated by the binding with torch's caching allocator.
#pragma once
#include <cstdint>

namespace opscope_cuda {

enum DType : int { DT_F32 = 0, DT_F64 = 1, DT_BF16 = 2, DT_F16 = 3 };

// Elements (of the accumulation type) of the per-chunk partial sums a chunked backward needs: one
// row of `n` per chunk of 32 rows (kRowChunk in cuda_common.cuh) for each of `sums` column sums.
inline int64_t chunked_workspace(int64_t rows, int64_t n, int64_t sums) {
  return ((rows + 31) / 32) * n * sums;
}

}  // namespace opscope_cuda
