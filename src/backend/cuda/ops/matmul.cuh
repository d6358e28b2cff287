// Fully connected layer on the GPU through cuBLASLt: out = inp W^T + bias, with W stored
// [out_features, in_features] row-major as in the parameter layout. Same math as the CPU op
// (backend/cpu/ops/matmul.h). Activations and weights are T (float or __nv_bfloat16); the weight
// and bias gradients are fp32 and accumulate (+=) whatever T is.
//
// fp32 runs as true fp32 (CUBLAS_COMPUTE_32F, no TF32): it is the mode that must match the CPU
// to 1e-5. bf16 runs on the tensor cores with fp32 accumulation.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>

namespace layup::cuda {

// A cuBLASLt handle, its workspace, and the algorithms its heuristic chose, by problem.
class CublasLt {
 public:
  CublasLt();
  ~CublasLt();
  CublasLt(const CublasLt&) = delete;
  CublasLt& operator=(const CublasLt&) = delete;

  // One operand of a column-major product: the matrix as stored (column-major, leading dimension
  // ld) and whether the product uses its transpose.
  struct Operand {
    const void* data;
    cudaDataType_t type;
    bool transposed;
    int64_t ld;
  };

  // D [m,n] = op(A) [m,k] op(B) [k,n] + beta D (+ bias[m] broadcast over the columns when bias is
  // not null; bias has D's type and must be 16-byte aligned). Column-major, fp32 accumulation.
  void matmul(int64_t m, int64_t n, int64_t k, const Operand& a, const Operand& b, void* d,
              cudaDataType_t d_type, int64_t ldd, float beta, const void* bias,
              cudaStream_t stream);

 private:
  using Key = std::array<int64_t, 17>;
  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  std::map<Key, cublasLtMatmulAlgo_t> algorithms_;
};

// out [N,OC] = inp [N,IC] weight[OC,IC]^T + bias [OC]. bias may be null (the tied LM head).
template <class T>
void matmul_forward(CublasLt& blas, T* out, const T* inp, const T* weight, const T* bias, int N,
                    int IC, int OC, cudaStream_t stream);

// Floats of scratch matmul_backward needs (for the bias gradient's column sums).
size_t matmul_backward_scratch_floats(int N, int OC);

// Accumulates dinp [N,IC] += dout weight, dweight [OC,IC] += dout^T inp, dbias [OC] += sum_n dout.
// dbias may be null. dbias is summed deterministically (no atomics).
template <class T>
void matmul_backward(CublasLt& blas, T* dinp, float* dweight, float* dbias, const T* dout,
                     const T* inp, const T* weight, int N, int IC, int OC, float* scratch,
                     cudaStream_t stream);

}  // namespace layup::cuda
