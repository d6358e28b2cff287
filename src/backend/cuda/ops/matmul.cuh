// Fully connected layer on the GPU through cuBLASLt: out = inp W^T + bias, with W stored
// [out_features, in_features] row-major as in the parameter layout. Same math as the CPU op
// (backend/cpu/ops/matmul.h). Activations and weights are T (float or __nv_bfloat16); the weight
// and bias gradients are fp32 whatever T is, added to or stored as WeightGradient says.
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
#include <memory>

#include "backend/algorithm_choice.h"
#include "backend/cuda/ops/scratch_floats.h"
#include "backend/cuda/ops/weight_gradient.cuh"

namespace layup::cuda {

// A cuBLASLt handle and the algorithm chosen for each problem (as `algorithms` says,
// backend/algorithm_choice.h). The workspace, `workspace_bytes` of device memory, is the
// caller's: it outlives the CublasLt and is used by one stream at a time.
class CublasLt {
 public:
  CublasLt(void* workspace, size_t workspace_bytes,
           AlgorithmChoice algorithms = AlgorithmChoice::kHeuristic);
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

  // What cuBLASLt does to the product before it stores D. kBias: + bias[m] broadcast over the
  // columns (bias has D's type, 16-byte aligned). kGeluAuxBias: Z = product + bias is stored in
  // aux (ld aux_ld) and D = gelu(Z). kDGelu: D = product * gelu'(aux). GELU is the tanh form.
  enum class EpilogueKind { kNone, kBias, kGeluAuxBias, kDGelu };
  struct Epilogue {
    EpilogueKind kind = EpilogueKind::kNone;
    const void* bias = nullptr;
    void* aux = nullptr;
    int64_t aux_ld = 0;
  };

  // D [m,n] = epilogue(op(A) [m,k] op(B) [k,n]) + beta D. Column-major, fp32 accumulation.
  void matmul(int64_t m, int64_t n, int64_t k, const Operand& a, const Operand& b, void* d,
              cudaDataType_t d_type, int64_t ldd, float beta, const Epilogue& epilogue,
              cudaStream_t stream);

 private:
  using Key = std::array<int64_t, 18>;
  // The fastest of the heuristic's candidates on this problem, timed in place on `stream` (D is
  // overwritten by each trial; the caller runs the real product after).
  cublasLtMatmulAlgo_t fastest_algorithm(const cublasLtMatmulHeuristicResult_t* candidates,
                                         int count, cublasLtMatmulDesc_t desc,
                                         cublasLtMatrixLayout_t a_layout, const void* a,
                                         cublasLtMatrixLayout_t b_layout, const void* b,
                                         cublasLtMatrixLayout_t d_layout, void* d,
                                         cudaStream_t stream);
  AlgorithmChoice choice_;
  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  std::map<Key, cublasLtMatmulAlgo_t> algorithms_;
};

// out [N,OC] = inp [N,IC] weight[OC,IC]^T + bias [OC]. bias may be null (the tied LM head).
template <class T>
void matmul_forward(CublasLt& blas, T* out, const T* inp, const T* weight, const T* bias, int N,
                    int IC, int OC, cudaStream_t stream);

// Whether the fused GELU forms below can run on these buffers: cuBLASLt's GELU epilogues want
// 16-byte aligned buffers and an output width that is a multiple of 8.
bool matmul_gelu_fusable(const void* pre_gelu, const void* out, const void* bias, int OC);

// The MLP's first layer with its GELU: pre_gelu [N,OC] = inp weight^T + bias, out = gelu(pre_gelu),
// both written by the one matmul (the GELU runs in cuBLASLt's epilogue). Same math as
// matmul_forward followed by gelu_forward; needs matmul_gelu_fusable.
template <class T>
void matmul_gelu_forward(CublasLt& blas, T* out, T* pre_gelu, const T* inp, const T* weight,
                         const T* bias, int N, int IC, int OC, cudaStream_t stream);

// Floats of scratch matmul_backward needs (for the bias gradient's column sums):
// matmul_backward_scratch_floats (scratch_floats.h).

// Whether matmul_backward adds the input gradient to dinp or overwrites dinp. Overwriting spares
// the caller a zero fill and the product a read of dinp: in a transformer block most input
// gradients go into a fresh buffer.
enum class InputGradient { kAccumulate, kOverwrite };

// dinp [N,IC] (+)= dout weight, as dinp_mode says; dweight [OC,IC] (+)= dout^T inp and dbias [OC]
// (+)= sum_n dout, as dweight_mode says. dbias may be null. dbias is summed deterministically (no
// atomics).
template <class T>
void matmul_backward(CublasLt& blas, T* dinp, float* dweight, float* dbias, const T* dout,
                     const T* inp, const T* weight, int N, int IC, int OC, float* scratch,
                     InputGradient dinp_mode, WeightGradient dweight_mode, cudaStream_t stream);

// matmul_backward of a layer whose input was gelu(pre_gelu): the input gradient goes through the
// GELU in the same matmul, d_pre_gelu [N,IC] = (dout weight) * gelu'(pre_gelu) (overwritten);
// dweight and dbias as in matmul_backward. Needs matmul_gelu_fusable(pre_gelu, d_pre_gelu,
// nullptr, IC).
template <class T>
void matmul_backward_through_gelu(CublasLt& blas, T* d_pre_gelu, float* dweight, float* dbias,
                                  const T* dout, const T* inp, const T* pre_gelu, const T* weight,
                                  int N, int IC, int OC, float* scratch,
                                  WeightGradient dweight_mode, cudaStream_t stream);

}  // namespace layup::cuda
