// Fully connected layer, forward and backward, on cuBLASLt.
//
// cuBLASLt is column-major; a row-major [R, C] matrix is the column-major [C, R] matrix, its
// transpose, in the same memory. With y = x W^T + b (x [N,IC], W [OC,IC], y [N,OC]):
//
//   forward   y^T [OC,N]  = (W^T stored [IC,OC])^T  x^T [IC,N]            + b broadcast
//   backward  dx^T [IC,N] = W^T [IC,OC]             dy^T [OC,N]         (+ dx^T   when
//   accumulating)
//             dW^T [IC,OC] = x^T [IC,N]             (dy^T stored [OC,N])^T + dW^T  (beta 1)
//             db = sum_n dy_n                       (column sums, common.cuh)
//
// cuBLASLt's heuristic assumes 256-byte aligned buffers unless told otherwise, and our buffers are
// slices of larger ones (a block's bias sits wherever the layout puts it), so every call tells it
// the actual alignment of each pointer. The chosen algorithm is cached per problem.
//
// The MLP's GELU rides in cuBLASLt's epilogues (bf16 mode): forward, GELU_AUX_BIAS writes the
// pre-activation and the activation in one pass; backward, DGELU multiplies the next layer's input
// gradient by gelu'(pre-activation) before storing it. That removes two element-wise passes over
// the [N, 4C] activations per block and the buffer between them.
#include <cuda_bf16.h>

#include <limits>
#include <memory>

#include "backend/cuda/ops/common.cuh"
#include "backend/cuda/ops/matmul.cuh"

namespace layup::cuda {
namespace {

// AlgorithmChoice::kTimed: how many of the heuristic's answers are timed, and how many runs
// each (after one to warm up).
constexpr int kTimedCandidates = 8;
constexpr int kTimedRepeats = 3;

// The largest power of two (at most 256) that divides the address.
uint32_t alignment_bytes(const void* p) {
  const uintptr_t address = reinterpret_cast<uintptr_t>(p);
  if (address == 0) return 256;
  return static_cast<uint32_t>(std::min<uintptr_t>(256, address & (~address + 1)));
}

struct DescDeleter {
  void operator()(cublasLtMatmulDescOpaque_t* desc) const { cublasLtMatmulDescDestroy(desc); }
};
struct LayoutDeleter {
  void operator()(cublasLtMatrixLayoutOpaque_t* layout) const {
    cublasLtMatrixLayoutDestroy(layout);
  }
};
struct PreferenceDeleter {
  void operator()(cublasLtMatmulPreferenceOpaque_t* preference) const {
    cublasLtMatmulPreferenceDestroy(preference);
  }
};
struct EventDeleter {
  void operator()(CUevent_st* event) const { cudaEventDestroy(event); }
};
using MatmulDesc = std::unique_ptr<cublasLtMatmulDescOpaque_t, DescDeleter>;
using MatrixLayout = std::unique_ptr<cublasLtMatrixLayoutOpaque_t, LayoutDeleter>;
using Preference = std::unique_ptr<cublasLtMatmulPreferenceOpaque_t, PreferenceDeleter>;
// A timing event, destroyed however the timing ends (a failed check throws).
using Event = std::unique_ptr<CUevent_st, EventDeleter>;

Event make_timing_event() {
  cudaEvent_t event = nullptr;
  LAYUP_CUDA_CHECK(cudaEventCreate(&event));
  return Event(event);
}

MatrixLayout make_layout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld) {
  cublasLtMatrixLayout_t layout = nullptr;
  LAYUP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&layout, type, rows, cols, ld));
  return MatrixLayout(layout);
}

template <class T>
constexpr cudaDataType_t data_type() {
  if constexpr (std::is_same_v<T, float>)
    return CUDA_R_32F;
  else
    return CUDA_R_16BF;
}

template <class T>
__global__ void fill_rows_with_bias_kernel(T* out, const T* bias, int N, int OC) {
  const size_t total = static_cast<size_t>(N) * OC;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    out[i] = bias[i % OC];
}

template <class T>
struct BiasGradientTerm {
  const T* dout;
  int OC;
  template <int K>
  __device__ void at(int n, int o, float (&values)[1][K]) const {
    load_floats<K>(dout + static_cast<size_t>(n) * OC + o, values[0]);
  }
};

// dbias (+)= column sums of dout [N,OC], K = one pack of columns per thread where aligned.
template <class T>
void bias_gradient(float* dbias, const T* dout, int N, int OC, WeightGradient mode, float* scratch,
                   cudaStream_t stream) {
  column_sums<1, Pack<T>::kSize>(ColumnOutputs<1>{{dbias}}, N, OC, BiasGradientTerm<T>{dout, OC},
                                 is_aligned16(dout), mode, scratch, stream);
}

// dweight [OC,IC] (+)= dout^T inp and dbias [OC] (+)= sum_n dout (dbias may be null), as `mode`
// says. cuBLASLt's BGRADB epilogue would also give the bias gradient, but it runs as a kernel of
// its own after the GEMM (globalKernelBgradAB_v2), slower than these column sums on the H200
// (2.96 ms a step at gpt2-medium against ~2.0).
template <class T>
void weight_and_bias_gradients(CublasLt& blas, float* dweight, float* dbias, const T* dout,
                               const T* inp, int N, int IC, int OC, float* scratch,
                               WeightGradient mode, cudaStream_t stream) {
  constexpr cudaDataType_t type = data_type<T>();
  // beta 1 adds the product to dweight, 0 stores it without reading.
  const float beta = mode == WeightGradient::kAccumulate ? 1.0f : 0.0f;
  blas.matmul(IC, OC, N, {inp, type, false, IC}, {dout, type, true, OC}, dweight, CUDA_R_32F, IC,
              beta, {}, stream);
  if (dbias) bias_gradient(dbias, dout, N, OC, mode, scratch, stream);
}

}  // namespace

CublasLt::CublasLt(void* workspace, size_t workspace_bytes, AlgorithmChoice algorithms)
    : choice_(algorithms), workspace_(workspace), workspace_bytes_(workspace_bytes) {
  LAYUP_CUBLAS_CHECK(cublasLtCreate(&handle_));
}

CublasLt::~CublasLt() {
  // Destructors must not throw; a failure here leaves nothing to recover anyway.
  cublasLtDestroy(handle_);
}

void CublasLt::matmul(int64_t m, int64_t n, int64_t k, const Operand& a, const Operand& b, void* d,
                      cudaDataType_t d_type, int64_t ldd, float beta, const Epilogue& fused,
                      cudaStream_t stream) {
  const void* bias = fused.bias;
  cublasLtMatmulDesc_t raw_desc = nullptr;
  LAYUP_CUBLAS_CHECK(cublasLtMatmulDescCreate(&raw_desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const MatmulDesc desc(raw_desc);
  const cublasOperation_t trans_a = a.transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t trans_b = b.transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
  LAYUP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.get(), CUBLASLT_MATMUL_DESC_TRANSA,
                                                    &trans_a, sizeof(trans_a)));
  LAYUP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.get(), CUBLASLT_MATMUL_DESC_TRANSB,
                                                    &trans_b, sizeof(trans_b)));
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  switch (fused.kind) {
    case EpilogueKind::kNone:
      break;
    case EpilogueKind::kBias:
      epilogue = CUBLASLT_EPILOGUE_BIAS;
      break;
    case EpilogueKind::kGeluAuxBias:
      epilogue = CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
      break;
    case EpilogueKind::kDGelu:
      epilogue = CUBLASLT_EPILOGUE_DGELU;
      break;
  }
  LAYUP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.get(), CUBLASLT_MATMUL_DESC_EPILOGUE,
                                                    &epilogue, sizeof(epilogue)));
  if (bias) {
    LAYUP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.get(), CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                      &bias, sizeof(bias)));
  }
  if (fused.aux) {
    LAYUP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
        desc.get(), CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &fused.aux, sizeof(fused.aux)));
    LAYUP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
        desc.get(), CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &fused.aux_ld, sizeof(fused.aux_ld)));
  }

  // Stored shapes: op(A) is m x k, so A is k x m when transposed; likewise B.
  const MatrixLayout a_layout =
      a.transposed ? make_layout(a.type, k, m, a.ld) : make_layout(a.type, m, k, a.ld);
  const MatrixLayout b_layout =
      b.transposed ? make_layout(b.type, n, k, b.ld) : make_layout(b.type, k, n, b.ld);
  const MatrixLayout d_layout = make_layout(d_type, m, n, ldd);

  const uint32_t align_a = alignment_bytes(a.data), align_b = alignment_bytes(b.data);
  const uint32_t align_d = alignment_bytes(d);
  // The heuristic also reads the bias pointer's alignment (not its contents).
  const uint32_t align_bias = bias ? alignment_bytes(bias) : 0;
  const uint32_t align_aux = fused.aux ? alignment_bytes(fused.aux) : 0;
  const Key key{m,       n,       k,       a.transposed, b.transposed, a.type,
                b.type,  d_type,  a.ld,    b.ld,         ldd,          epilogue,
                align_a, align_b, align_d, beta != 0.0f, align_bias,   align_aux};
  auto found = algorithms_.find(key);
  if (found == algorithms_.end()) {
    cublasLtMatmulPreference_t raw_preference = nullptr;
    LAYUP_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&raw_preference));
    const Preference preference(raw_preference);
    const uint64_t workspace = workspace_bytes_;
    LAYUP_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        preference.get(), CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof(workspace)));
    const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> alignments[] = {
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_a},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_b},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_d},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_d}};
    for (const auto& [attribute, bytes] : alignments) {
      LAYUP_CUBLAS_CHECK(
          cublasLtMatmulPreferenceSetAttribute(preference.get(), attribute, &bytes, sizeof(bytes)));
    }
    // Trials of a product with beta != 0 would add into D again: those keep the heuristic's pick.
    const bool timed = choice_ == AlgorithmChoice::kTimed && beta == 0.0f;
    std::array<cublasLtMatmulHeuristicResult_t, kTimedCandidates> results = {};
    int returned = 0;
    LAYUP_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(
        handle_, desc.get(), a_layout.get(), b_layout.get(), d_layout.get(), d_layout.get(),
        preference.get(), timed ? kTimedCandidates : 1, results.data(), &returned));
    LAYUP_CHECK(returned > 0 && results[0].state == CUBLAS_STATUS_SUCCESS,
                "cuBLASLt has no algorithm for the matmul m=", m, " n=", n, " k=", k, " (A type ",
                a.type, ", ld ", a.ld, ", aligned ", align_a, "; B type ", b.type, ", ld ", b.ld,
                ", aligned ", align_b, "; D type ", d_type, ", ld ", ldd, ", aligned ", align_d,
                ")");
    const cublasLtMatmulAlgo_t algorithm =
        returned > 1 ? fastest_algorithm(results.data(), returned, desc.get(), a_layout.get(),
                                         a.data, b_layout.get(), b.data, d_layout.get(), d, stream)
                     : results[0].algo;
    found = algorithms_.emplace(key, algorithm).first;
  }

  const float alpha = 1.0f;
  LAYUP_CUBLAS_CHECK(cublasLtMatmul(handle_, desc.get(), &alpha, a.data, a_layout.get(), b.data,
                                    b_layout.get(), &beta, d, d_layout.get(), d, d_layout.get(),
                                    &found->second, workspace_, workspace_bytes_, stream));
}

cublasLtMatmulAlgo_t CublasLt::fastest_algorithm(const cublasLtMatmulHeuristicResult_t* candidates,
                                                 int count, cublasLtMatmulDesc_t desc,
                                                 cublasLtMatrixLayout_t a_layout, const void* a,
                                                 cublasLtMatrixLayout_t b_layout, const void* b,
                                                 cublasLtMatrixLayout_t d_layout, void* d,
                                                 cudaStream_t stream) {
  const Event start = make_timing_event(), stop = make_timing_event();
  const float alpha = 1.0f, beta = 0.0f;
  auto run = [&](const cublasLtMatmulAlgo_t& algorithm) {
    return cublasLtMatmul(handle_, desc, &alpha, a, a_layout, b, b_layout, &beta, d, d_layout, d,
                          d_layout, &algorithm, workspace_, workspace_bytes_, stream);
  };
  int best = 0;
  float best_ms = std::numeric_limits<float>::infinity();
  for (int i = 0; i < count; ++i) {
    if (candidates[i].state != CUBLAS_STATUS_SUCCESS) continue;
    // The first run warms the kernel up (and finds out whether it runs here at all).
    if (run(candidates[i].algo) != CUBLAS_STATUS_SUCCESS) continue;
    LAYUP_CUDA_CHECK(cudaEventRecord(start.get(), stream));
    bool ran = true;
    for (int repeat = 0; repeat < kTimedRepeats && ran; ++repeat)
      ran = run(candidates[i].algo) == CUBLAS_STATUS_SUCCESS;
    LAYUP_CUDA_CHECK(cudaEventRecord(stop.get(), stream));
    LAYUP_CUDA_CHECK(cudaEventSynchronize(stop.get()));
    float ms = 0.0f;
    LAYUP_CUDA_CHECK(cudaEventElapsedTime(&ms, start.get(), stop.get()));
    if (ran && ms < best_ms) {
      best_ms = ms;
      best = i;
    }
  }
  return candidates[best].algo;
}

template <class T>
void matmul_forward(CublasLt& blas, T* out, const T* inp, const T* weight, const T* bias, int N,
                    int IC, int OC, cudaStream_t stream) {
  constexpr cudaDataType_t type = data_type<T>();
  float beta = 0.0f;
  const T* epilogue_bias = bias;
  if (bias && !is_aligned16(bias)) {
    // The bias epilogue needs an aligned vector: start from the bias rows and add the product.
    fill_rows_with_bias_kernel<<<grid_for(static_cast<size_t>(N) * OC, 256), 256, 0, stream>>>(
        out, bias, N, OC);
    LAYUP_CUDA_CHECK_LAUNCH();
    beta = 1.0f;
    epilogue_bias = nullptr;
  }
  blas.matmul(OC, N, IC, {weight, type, true, IC}, {inp, type, false, IC}, out, type, OC, beta,
              {epilogue_bias ? CublasLt::EpilogueKind::kBias : CublasLt::EpilogueKind::kNone,
               epilogue_bias},
              stream);
}

bool matmul_gelu_fusable(const void* pre_gelu, const void* out, const void* bias, int OC) {
  return OC % 8 == 0 && is_aligned16(pre_gelu) && is_aligned16(out) &&
         (!bias || is_aligned16(bias));
}

template <class T>
void matmul_gelu_forward(CublasLt& blas, T* out, T* pre_gelu, const T* inp, const T* weight,
                         const T* bias, int N, int IC, int OC, cudaStream_t stream) {
  LAYUP_CHECK(matmul_gelu_fusable(pre_gelu, out, bias, OC),
              "matmul_gelu_forward needs 16-byte aligned buffers and a width that is a multiple of "
              "8 (got ",
              OC, ")");
  constexpr cudaDataType_t type = data_type<T>();
  blas.matmul(OC, N, IC, {weight, type, true, IC}, {inp, type, false, IC}, out, type, OC, 0.0f,
              {CublasLt::EpilogueKind::kGeluAuxBias, bias, pre_gelu, OC}, stream);
}

template <class T>
void matmul_backward(CublasLt& blas, T* dinp, float* dweight, float* dbias, const T* dout,
                     const T* inp, const T* weight, int N, int IC, int OC, float* scratch,
                     InputGradient dinp_mode, WeightGradient dweight_mode, cudaStream_t stream) {
  constexpr cudaDataType_t type = data_type<T>();
  const float dinp_beta = dinp_mode == InputGradient::kAccumulate ? 1.0f : 0.0f;
  blas.matmul(IC, N, OC, {weight, type, false, IC}, {dout, type, false, OC}, dinp, type, IC,
              dinp_beta, {}, stream);
  weight_and_bias_gradients(blas, dweight, dbias, dout, inp, N, IC, OC, scratch, dweight_mode,
                            stream);
}

template <class T>
void matmul_backward_through_gelu(CublasLt& blas, T* d_pre_gelu, float* dweight, float* dbias,
                                  const T* dout, const T* inp, const T* pre_gelu, const T* weight,
                                  int N, int IC, int OC, float* scratch,
                                  WeightGradient dweight_mode, cudaStream_t stream) {
  LAYUP_CHECK(matmul_gelu_fusable(pre_gelu, d_pre_gelu, nullptr, IC),
              "matmul_backward_through_gelu needs 16-byte aligned buffers and a width that is a "
              "multiple of 8 (got ",
              IC, ")");
  constexpr cudaDataType_t type = data_type<T>();
  blas.matmul(IC, N, OC, {weight, type, false, IC}, {dout, type, false, OC}, d_pre_gelu, type, IC,
              0.0f, {CublasLt::EpilogueKind::kDGelu, nullptr, const_cast<T*>(pre_gelu), IC},
              stream);
  weight_and_bias_gradients(blas, dweight, dbias, dout, inp, N, IC, OC, scratch, dweight_mode,
                            stream);
}

#define LAYUP_INSTANTIATE_GELU_MATMULS(T)                                                          \
  template void matmul_gelu_forward<T>(CublasLt&, T*, T*, const T*, const T*, const T*, int, int,  \
                                       int, cudaStream_t);                                         \
  template void matmul_backward_through_gelu<T>(CublasLt&, T*, float*, float*, const T*, const T*, \
                                                const T*, const T*, int, int, int, float*,         \
                                                WeightGradient, cudaStream_t);
LAYUP_INSTANTIATE_GELU_MATMULS(float)
LAYUP_INSTANTIATE_GELU_MATMULS(__nv_bfloat16)
#undef LAYUP_INSTANTIATE_GELU_MATMULS

template void matmul_forward<float>(CublasLt&, float*, const float*, const float*, const float*,
                                    int, int, int, cudaStream_t);
template void matmul_forward<__nv_bfloat16>(CublasLt&, __nv_bfloat16*, const __nv_bfloat16*,
                                            const __nv_bfloat16*, const __nv_bfloat16*, int, int,
                                            int, cudaStream_t);
template void matmul_backward<float>(CublasLt&, float*, float*, float*, const float*, const float*,
                                     const float*, int, int, int, float*, InputGradient,
                                     WeightGradient, cudaStream_t);
template void matmul_backward<__nv_bfloat16>(CublasLt&, __nv_bfloat16*, float*, float*,
                                             const __nv_bfloat16*, const __nv_bfloat16*,
                                             const __nv_bfloat16*, int, int, int, float*,
                                             InputGradient, WeightGradient, cudaStream_t);

}  // namespace layup::cuda
