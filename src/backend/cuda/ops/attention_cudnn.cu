// CudnnAttention: the SDPA forward and backward graphs of the cuDNN frontend, cached by shape.
#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/ops/attention_cudnn.cuh"
#include "core/error.h"

#if LAYUP_HAVE_CUDNN
#include <cudnn.h>
#include <cudnn_frontend.h>
#endif

namespace layup::cuda {

#if LAYUP_HAVE_CUDNN

namespace fe = cudnn_frontend;

namespace {

// Tensor ids of the graphs' inputs and outputs (the variant pack is keyed by them).
enum TensorId : int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV };

void check_cudnn_status(cudnnStatus_t status, const char* call) {
  if (status != CUDNN_STATUS_SUCCESS) fail(call, " failed: ", cudnnGetErrorString(status));
}

void check_frontend(fe::error_object status, const char* what, int B, int T_, int C, int NH) {
  if (status.is_bad()) {
    fail("cuDNN attention: ", what, " failed for B=", B, " T=", T_, " C=", C, " heads=", NH, ": ",
         status.get_message(), " (--attention layup runs layup's own kernel)");
  }
}

// q, k or v of head h, position t, sequence b inside qkv [B,T,3C]: dims [B,NH,T,hd] in the order
// cuDNN expects, strides that walk the fused layout without a copy.
std::shared_ptr<fe::graph::Tensor_attributes> qkv_part(fe::graph::Graph& graph, const char* name,
                                                       int64_t id, int B, int T_, int C, int NH) {
  const int64_t hd = C / NH;
  return graph.tensor(fe::graph::Tensor_attributes()
                          .set_name(name)
                          .set_uid(id)
                          .set_dim({B, NH, T_, hd})
                          .set_stride({int64_t{T_} * 3 * C, hd, 3 * int64_t{C}, 1}));
}

// out and dout [B,T,C] with heads merged, seen as [B,NH,T,hd].
std::vector<int64_t> merged_stride(int T_, int C, int NH) {
  return {int64_t{T_} * C, C / NH, C, 1};
}

std::vector<int64_t> lse_dim(int B, int T_, int NH) {
  return {B, NH, T_, 1};
}
std::vector<int64_t> lse_stride(int T_, int NH) {
  return {int64_t{NH} * T_, T_, 1, 1};
}

}  // namespace

struct CudnnAttention::State {
  struct Built {
    std::shared_ptr<fe::graph::Graph> graph;
    bool tuned = false;  // AlgorithmChoice::kTimed: its plans were timed on a first execution
  };
  cudaStream_t stream = nullptr;
  cudnnHandle_t handle = nullptr;
  AlgorithmChoice choice = AlgorithmChoice::kHeuristic;
  // key: (B, T, C, NH, backward?)
  std::map<std::tuple<int, int, int, int, bool>, Built> graphs;
  GrowableWorkspace* workspace = nullptr;

  Built& graph(int B, int T_, int C, int NH, bool backward) {
    auto key = std::make_tuple(B, T_, C, NH, backward);
    auto found = graphs.find(key);
    if (found != graphs.end()) return found->second;

    auto graph = std::make_shared<fe::graph::Graph>();
    graph->set_io_data_type(fe::DataType_t::BFLOAT16)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    auto q = qkv_part(*graph, "q", kQ, B, T_, C, NH);
    auto k = qkv_part(*graph, "k", kK, B, T_, C, NH);
    auto v = qkv_part(*graph, "v", kV, B, T_, C, NH);
    const float scale = 1.0f / std::sqrt(static_cast<float>(C / NH));
    const int64_t hd = C / NH;
    if (!backward) {
      auto options = fe::graph::SDPA_attributes()
                         .set_name("attention_forward")
                         .set_generate_stats(true)
                         .set_causal_mask(true)
                         .set_attn_scale(scale);
      auto [o, stats] = graph->sdpa(q, k, v, options);
      o->set_output(true).set_uid(kO).set_dim({B, NH, T_, hd}).set_stride(merged_stride(T_, C, NH));
      stats->set_output(true)
          .set_uid(kStats)
          .set_data_type(fe::DataType_t::FLOAT)
          .set_dim(lse_dim(B, T_, NH))
          .set_stride(lse_stride(T_, NH));
    } else {
      auto o = graph->tensor(fe::graph::Tensor_attributes()
                                 .set_name("o")
                                 .set_uid(kO)
                                 .set_dim({B, NH, T_, hd})
                                 .set_stride(merged_stride(T_, C, NH)));
      auto d_o = graph->tensor(fe::graph::Tensor_attributes()
                                   .set_name("d_o")
                                   .set_uid(kDO)
                                   .set_dim({B, NH, T_, hd})
                                   .set_stride(merged_stride(T_, C, NH)));
      auto stats = graph->tensor(fe::graph::Tensor_attributes()
                                     .set_name("stats")
                                     .set_uid(kStats)
                                     .set_dim(lse_dim(B, T_, NH))
                                     .set_stride(lse_stride(T_, NH))
                                     .set_data_type(fe::DataType_t::FLOAT));
      auto options = fe::graph::SDPA_backward_attributes()
                         .set_name("attention_backward")
                         .set_causal_mask(true)
                         .set_attn_scale(scale);
      auto [d_q, d_k, d_v] = graph->sdpa_backward(q, k, v, o, d_o, stats, options);
      const std::vector<int64_t> fused = {int64_t{T_} * 3 * C, hd, 3 * int64_t{C}, 1};
      d_q->set_output(true).set_uid(kDQ).set_dim({B, NH, T_, hd}).set_stride(fused);
      d_k->set_output(true).set_uid(kDK).set_dim({B, NH, T_, hd}).set_stride(fused);
      d_v->set_output(true).set_uid(kDV).set_dim({B, NH, T_, hd}).set_stride(fused);
    }
    check_frontend(graph->validate(), "validating the graph", B, T_, C, NH);
    check_frontend(graph->build_operation_graph(handle), "building the operation graph", B, T_, C,
                   NH);
    check_frontend(graph->create_execution_plans({fe::HeurMode_t::A}), "finding execution plans", B,
                   T_, C, NH);
    check_frontend(graph->check_support(handle), "checking support", B, T_, C, NH);
    const bool timed = choice == AlgorithmChoice::kTimed;
    check_frontend(graph->build_plans(handle, timed ? fe::BuildPlanPolicy_t::ALL
                                                    : fe::BuildPlanPolicy_t::HEURISTICS_CHOICE),
                   "building the plan", B, T_, C, NH);

    int64_t needed = 0;
    check_frontend(graph->get_workspace_size(needed), "sizing the workspace", B, T_, C, NH);
    if (timed) {
      // Room for every plan the timing may try (a plan cuDNN could not build has no size).
      for (int64_t i = 0; i < graph->get_execution_plan_count(); ++i) {
        int64_t plan_bytes = 0;
        if (graph->get_workspace_size_plan_at_index(i, plan_bytes).is_good())
          needed = std::max(needed, plan_bytes);
      }
    }
    // A graph may be built while the previous step's work still runs on the stream: growing
    // waits for it.
    workspace->reserve(static_cast<size_t>(needed), stream);
    return graphs.emplace(key, Built{graph}).first->second;
  }

  void execute(Built& built, std::unordered_map<int64_t, void*>& pointers, int B, int T_, int C,
               int NH) {
    if (choice == AlgorithmChoice::kTimed && !built.tuned) {
      // Runs every plan on these operands (the outputs are written, never read) and makes the
      // fastest the one execute runs.
      check_frontend(built.graph->autotune(handle, pointers, workspace->data()), "timing the plans",
                     B, T_, C, NH);
      built.tuned = true;
    }
    check_frontend(built.graph->execute(handle, pointers, workspace->data()), "executing", B, T_, C,
                   NH);
  }
};

bool CudnnAttention::available(std::string* why) {
  const size_t version = cudnnGetVersion();
  if (version < 90000) {
    if (why) *why = "cuDNN " + std::to_string(version) + " is older than 9.0";
    return false;
  }
  return true;
}

CudnnAttention::CudnnAttention(cudaStream_t stream, GrowableWorkspace& workspace,
                               AlgorithmChoice choice)
    : state_(std::make_unique<State>()) {
  state_->stream = stream;
  state_->choice = choice;
  state_->workspace = &workspace;
  check_cudnn_status(cudnnCreate(&state_->handle), "cudnnCreate");
  check_cudnn_status(cudnnSetStream(state_->handle, stream), "cudnnSetStream");
}

CudnnAttention::~CudnnAttention() {
  // Destructors cannot throw: free what was made and ignore the status.
  if (state_->stream) cudaStreamSynchronize(state_->stream);
  state_->graphs.clear();
  if (state_->handle) cudnnDestroy(state_->handle);
}

void CudnnAttention::forward(__nv_bfloat16* out, float* lse, const __nv_bfloat16* qkv, int B,
                             int T_, int C, int NH) {
  State::Built& graph = state_->graph(B, T_, C, NH, false);
  auto* base = const_cast<__nv_bfloat16*>(qkv);  // cuDNN's variant pack takes void*
  std::unordered_map<int64_t, void*> pointers = {
      {kQ, base}, {kK, base + C}, {kV, base + 2 * C}, {kO, out}, {kStats, lse}};
  state_->execute(graph, pointers, B, T_, C, NH);
}

void CudnnAttention::backward(__nv_bfloat16* dqkv, const __nv_bfloat16* dout,
                              const __nv_bfloat16* qkv, const __nv_bfloat16* out, const float* lse,
                              int B, int T_, int C, int NH) {
  State::Built& graph = state_->graph(B, T_, C, NH, true);
  auto* base = const_cast<__nv_bfloat16*>(qkv);
  std::unordered_map<int64_t, void*> pointers = {{kQ, base},
                                                 {kK, base + C},
                                                 {kV, base + 2 * C},
                                                 {kO, const_cast<__nv_bfloat16*>(out)},
                                                 {kDO, const_cast<__nv_bfloat16*>(dout)},
                                                 {kStats, const_cast<float*>(lse)},
                                                 {kDQ, dqkv},
                                                 {kDK, dqkv + C},
                                                 {kDV, dqkv + 2 * C}};
  state_->execute(graph, pointers, B, T_, C, NH);
}

#else  // built without cuDNN

struct CudnnAttention::State {};

bool CudnnAttention::available(std::string* why) {
  if (why) *why = "layup was built without cuDNN (CMake did not find cudnn.h and the frontend)";
  return false;
}

CudnnAttention::CudnnAttention(cudaStream_t, GrowableWorkspace&, AlgorithmChoice) {
  fail("layup was built without cuDNN; rebuild with the cuDNN frontend headers to use it");
}
CudnnAttention::~CudnnAttention() = default;
void CudnnAttention::forward(__nv_bfloat16*, float*, const __nv_bfloat16*, int, int, int, int) {}
void CudnnAttention::backward(__nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*,
                              const __nv_bfloat16*, const float*, int, int, int, int) {}

#endif

}  // namespace layup::cuda
