// mean over one dim on CUDA: the sum kernels (../sum/cuda.cu, reduce_dim with mean = true) scale by 1/R
// before the store; this file only holds that entry point's documentation and is compiled with the rest
// so each manifest backend has its source.
#include "../csrc/cuda_common.cuh"
#include "../csrc/cuda_launchers.h"
