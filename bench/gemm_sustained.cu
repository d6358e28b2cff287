// Which of cuBLASLt's candidate algorithms runs a training step's GEMMs fastest when the GPU is
// held at its power limit, as it is through a training run, rather than for the few milliseconds
// `--algorithms timed` gives each candidate on a cool GPU.
//
//   layup_gemm_sustained [--model-width C] [--tokens N] [--vocab V] [--layers L] [--seconds S]
//                        [--candidates K]
//
// Defaults: gpt2-medium at B=16, T=1024 (C 1024, N 16384 tokens, V 50304, L 24), S 1, K 8.
//
// For each GEMM of a GPT-2 block (and the tied LM head) in the layouts and epilogues
// backend/cuda/ops/matmul.cu issues them, asks the heuristic for up to K algorithms, then runs
// each back to back for S seconds after a load of S seconds has brought the GPU to its steady
// clock, and prints TFLOP/s per candidate (candidate 0 is the heuristic's choice, what layup runs
// by default). Random bf16 operands; the outputs are not checked: this measures speed only.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(status));
    std::exit(1);
  }
}
void check(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "%s: cuBLAS status %d\n", what, static_cast<int>(status));
    std::exit(1);
  }
}

// One product as matmul.cu issues it: D [m,n] = op(A) op(B), column-major.
struct Problem {
  std::string name;
  long long m, n, k;
  bool transpose_a, transpose_b;
  long long lda, ldb, ldd;
  cudaDataType_t d_type;
  cublasLtEpilogue_t epilogue;
  int per_step;  // launches a training step makes of it (layers, or 1 for the head)
};

__global__ void fill_kernel(__nv_bfloat16* data, size_t count, unsigned seed) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    unsigned x = static_cast<unsigned>(i) * 2654435761u + seed;
    x ^= x >> 13;
    x *= 0x5bd1e995u;
    x ^= x >> 15;
    data[i] = __float2bfloat16((static_cast<float>(x & 0xffff) / 65536.0f - 0.5f) * 0.1f);
  }
}

}  // namespace

int main(int argc, char** argv) {
  long long C = 1024, N = 16384, V = 50304;
  int layers = 24, max_candidates = 8;
  double seconds = 1.0;
  for (int i = 1; i < argc; i += 2) {
    const std::string flag = argv[i];
    if (i + 1 == argc) {
      std::fprintf(stderr, "%s needs a value\n", flag.c_str());
      return 2;
    }
    const char* value = argv[i + 1];
    if (flag == "--model-width")
      C = std::atoll(value);
    else if (flag == "--tokens")
      N = std::atoll(value);
    else if (flag == "--vocab")
      V = std::atoll(value);
    else if (flag == "--layers")
      layers = std::atoi(value);
    else if (flag == "--seconds")
      seconds = std::atof(value);
    else if (flag == "--candidates")
      max_candidates = std::atoi(value);
    else {
      std::fprintf(stderr,
                   "unknown flag %s (flags: --model-width --tokens --vocab --layers --seconds "
                   "--candidates)\n",
                   flag.c_str());
      return 2;
    }
  }
  if (C <= 0 || N <= 0 || V <= 0 || layers <= 0 || seconds <= 0 || max_candidates <= 0) {
    std::fprintf(stderr, "every flag's value must be positive\n");
    return 2;
  }

  const cudaDataType_t bf16 = CUDA_R_16BF;
  std::vector<Problem> problems;
  // Forward: y^T [OC,N] = W (stored [OC,IC], read transposed) x^T; bias (or GELU) epilogue.
  const auto forward = [&](const char* name, long long ic, long long oc, cublasLtEpilogue_t e,
                           int per_step) {
    problems.push_back({name, oc, N, ic, true, false, ic, ic, oc, bf16, e, per_step});
  };
  // Input gradient: dx^T [IC,N] = W^T dy^T.
  const auto input_gradient = [&](const char* name, long long ic, long long oc,
                                  cublasLtEpilogue_t e, int per_step) {
    problems.push_back({name, ic, N, oc, false, false, ic, oc, ic, bf16, e, per_step});
  };
  // Weight gradient: dW^T [IC,OC] = x^T dy (fp32 out).
  const auto weight_gradient = [&](const char* name, long long ic, long long oc, int per_step) {
    problems.push_back({name, ic, oc, N, false, true, ic, oc, ic, CUDA_R_32F,
                        CUBLASLT_EPILOGUE_DEFAULT, per_step});
  };
  forward("fwd qkv", C, 3 * C, CUBLASLT_EPILOGUE_BIAS, layers);
  forward("fwd attn proj", C, C, CUBLASLT_EPILOGUE_BIAS, layers);
  forward("fwd fc+gelu", C, 4 * C, CUBLASLT_EPILOGUE_GELU_AUX_BIAS, layers);
  forward("fwd mlp proj", 4 * C, C, CUBLASLT_EPILOGUE_BIAS, layers);
  forward("fwd lm head", C, V, CUBLASLT_EPILOGUE_DEFAULT, 1);
  input_gradient("dx mlp proj+dgelu", 4 * C, C, CUBLASLT_EPILOGUE_DGELU, layers);
  input_gradient("dx fc", C, 4 * C, CUBLASLT_EPILOGUE_DEFAULT, layers);
  input_gradient("dx attn proj", C, C, CUBLASLT_EPILOGUE_DEFAULT, layers);
  input_gradient("dx qkv", C, 3 * C, CUBLASLT_EPILOGUE_DEFAULT, layers);
  input_gradient("dx lm head", C, V, CUBLASLT_EPILOGUE_DEFAULT, 1);
  weight_gradient("dw mlp proj", 4 * C, C, layers);
  weight_gradient("dw fc", C, 4 * C, layers);
  weight_gradient("dw attn proj", C, C, layers);
  weight_gradient("dw qkv", C, 3 * C, layers);
  weight_gradient("dw lm head", C, V, 1);

  // Operands big enough for every problem; the aux and bias buffers likewise.
  const size_t largest = static_cast<size_t>(N) * std::max(V, 4 * C);
  __nv_bfloat16 *a = nullptr, *b = nullptr, *aux = nullptr, *bias = nullptr;
  void* d = nullptr;
  void* workspace = nullptr;
  const size_t workspace_bytes = 32u << 20;
  check(cudaMalloc(&a, largest * sizeof(__nv_bfloat16)), "cudaMalloc A");
  check(cudaMalloc(&b, largest * sizeof(__nv_bfloat16)), "cudaMalloc B");
  check(cudaMalloc(&aux, largest * sizeof(__nv_bfloat16)), "cudaMalloc aux");
  check(cudaMalloc(&d, largest * sizeof(float)), "cudaMalloc D");
  check(cudaMalloc(&bias, static_cast<size_t>(V + 4 * C) * sizeof(__nv_bfloat16)), "bias");
  check(cudaMalloc(&workspace, workspace_bytes), "cudaMalloc workspace");
  fill_kernel<<<1024, 256>>>(a, largest, 1);
  fill_kernel<<<1024, 256>>>(b, largest, 2);
  fill_kernel<<<1024, 256>>>(aux, largest, 3);
  fill_kernel<<<64, 256>>>(bias, V + 4 * C, 4);
  check(cudaDeviceSynchronize(), "fill");

  cublasLtHandle_t handle;
  check(cublasLtCreate(&handle), "cublasLtCreate");
  cudaStream_t stream;
  check(cudaStreamCreate(&stream), "stream");
  std::printf("| GEMM | m x n x k | per step | candidate | TFLOP/s sustained | vs heuristic |\n");
  std::printf("|---|---|---|---|---|---|\n");
  double step_ms_heuristic = 0.0, step_ms_best = 0.0;
  bool preheated = false;
  for (const Problem& p : problems) {
    cublasLtMatmulDesc_t desc;
    check(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc");
    const cublasOperation_t ta = p.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t tb = p.transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    check(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta), "ta");
    check(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb), "tb");
    check(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &p.epilogue,
                                         sizeof p.epilogue),
          "epilogue");
    if (p.epilogue == CUBLASLT_EPILOGUE_BIAS || p.epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS)
      check(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                           sizeof bias),
            "bias");
    if (p.epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || p.epilogue == CUBLASLT_EPILOGUE_DGELU) {
      const long long aux_ld = p.m;
      check(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux,
                                           sizeof aux),
            "aux");
      check(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld,
                                           sizeof aux_ld),
            "aux ld");
    }
    cublasLtMatrixLayout_t la, lb, ld;
    check(p.transpose_a ? cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, p.k, p.m, p.lda)
                        : cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, p.m, p.k, p.lda),
          "layout A");
    check(p.transpose_b ? cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, p.n, p.k, p.ldb)
                        : cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, p.k, p.n, p.ldb),
          "layout B");
    check(cublasLtMatrixLayoutCreate(&ld, p.d_type, p.m, p.n, p.ldd), "layout D");
    cublasLtMatmulPreference_t preference;
    check(cublasLtMatmulPreferenceCreate(&preference), "preference");
    const uint64_t bytes = workspace_bytes;
    check(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                               &bytes, sizeof bytes),
          "workspace");
    std::vector<cublasLtMatmulHeuristicResult_t> candidates(max_candidates);
    int returned = 0;
    check(cublasLtMatmulAlgoGetHeuristic(handle, desc, la, lb, ld, ld, preference, max_candidates,
                                         candidates.data(), &returned),
          "heuristic");
    const float alpha = 1.0f, beta = 0.0f;
    const double flops = 2.0 * p.m * p.n * p.k;
    const auto run = [&](const cublasLtMatmulAlgo_t& algo) {
      return cublasLtMatmul(handle, desc, &alpha, a, la, b, lb, &beta, d, ld, d, ld, &algo,
                            workspace, workspace_bytes, stream);
    };
    // Runs `algo` back to back for `duration` seconds; returns ms per product.
    const auto sustained_ms = [&](const cublasLtMatmulAlgo_t& algo, double duration) {
      int runs = 0;
      const auto start = std::chrono::steady_clock::now();
      double elapsed = 0.0;
      while (elapsed < duration) {
        for (int i = 0; i < 20; ++i)
          if (run(algo) != CUBLAS_STATUS_SUCCESS) return -1.0;
        runs += 20;
        check(cudaStreamSynchronize(stream), "sync");
        elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      }
      return elapsed * 1e3 / runs;
    };
    if (!preheated && returned > 0) {
      sustained_ms(candidates[0].algo, 2.0 * seconds);  // to the power limit's steady clock
      preheated = true;
    }
    double heuristic_ms = 0.0, best_ms = 0.0;
    for (int i = 0; i < returned; ++i) {
      const double ms = sustained_ms(candidates[i].algo, seconds);
      if (ms < 0) {
        std::printf("| %s | | | %d | failed | |\n", p.name.c_str(), i);
        continue;
      }
      if (i == 0) heuristic_ms = ms;
      if (best_ms == 0.0 || ms < best_ms) best_ms = ms;
      std::printf("| %s | %lld x %lld x %lld | %d | %d | %.1f | %.3f |\n", p.name.c_str(), p.m, p.n,
                  p.k, p.per_step, i, flops / (ms * 1e-3) / 1e12, heuristic_ms / ms);
      std::fflush(stdout);
    }
    step_ms_heuristic += heuristic_ms * p.per_step;
    step_ms_best += best_ms * p.per_step;
    cublasLtMatmulPreferenceDestroy(preference);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatmulDescDestroy(desc);
  }
  std::printf(
      "\nGEMM ms a step, sustained: heuristic's choices %.2f, best candidates %.2f (%.3fx)\n",
      step_ms_heuristic, step_ms_best, step_ms_heuristic / step_ms_best);
  return 0;
}
