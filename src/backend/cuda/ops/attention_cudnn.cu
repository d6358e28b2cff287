// CudnnAttention: the SDPA forward and backward graphs of the cuDNN frontend, cached by shape.
// Grouped-query attention needs nothing special: k and v are given kv_heads heads, and cuDNN
// maps query head h to key/value head h / (heads / kv_heads) (the repeat_kv order) itself.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <tuple>
#include <utility>

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

void check_frontend(fe::error_object status, const char* what, const AttentionShape& shape) {
  if (status.is_bad()) {
    fail("cuDNN attention: ", what, " failed for B=", shape.B, " T=", shape.T,
         " heads=", shape.heads, " kv_heads=", shape.kv_heads, " head_dim=", shape.head_dim, ": ",
         status.get_message(), " (--attention layup runs layup's own kernel)");
  }
}

// A [B, T, row_width] tensor whose rows hold `heads` heads side by side, seen as [B, heads, T, hd]
// (cuDNN's order) through strides, without a copy: q, k and v in qkv, dq, dk and dv in dqkv, out
// and dout. Giving k and v kv_heads heads is all cuDNN needs to know the attention is grouped.
std::vector<int64_t> split_heads_dim(const AttentionShape& shape, int heads) {
  return {shape.B, heads, shape.T, shape.head_dim};
}
std::vector<int64_t> split_heads_stride(const AttentionShape& shape, int row_width) {
  return {int64_t{shape.T} * row_width, shape.head_dim, row_width, 1};
}

std::shared_ptr<fe::graph::Tensor_attributes> heads_tensor(fe::graph::Graph& graph,
                                                           const char* name, int64_t id,
                                                           const AttentionShape& shape, int heads,
                                                           int row_width) {
  return graph.tensor(fe::graph::Tensor_attributes()
                          .set_name(name)
                          .set_uid(id)
                          .set_dim(split_heads_dim(shape, heads))
                          .set_stride(split_heads_stride(shape, row_width)));
}

// lse [B, heads, T] as the [B, heads, T, 1] cuDNN calls its stats.
std::vector<int64_t> lse_dim(const AttentionShape& shape) {
  return {shape.B, shape.heads, shape.T, 1};
}
std::vector<int64_t> lse_stride(const AttentionShape& shape) {
  return {int64_t{shape.heads} * shape.T, shape.T, 1, 1};
}

// Element offsets of the key and value heads inside a row of qkv (and of dqkv); q is at 0.
size_t k_offset(const AttentionShape& shape) {
  return static_cast<size_t>(shape.heads) * shape.head_dim;
}
size_t v_offset(const AttentionShape& shape) {
  return static_cast<size_t>(shape.heads + shape.kv_heads) * shape.head_dim;
}

}  // namespace

struct CudnnAttention::State {
  struct Built {
    std::shared_ptr<fe::graph::Graph> graph;
    bool tuned = false;  // AlgorithmChoice::kTimed: its plans were timed on a first execution
  };
  // The whole AttentionShape (B, T, heads, kv_heads, head_dim), and whether the graph is the
  // backward.
  using Key = std::tuple<int, int, int, int, int, bool>;

  cudaStream_t stream = nullptr;
  cudnnHandle_t handle = nullptr;
  AlgorithmChoice choice = AlgorithmChoice::kHeuristic;
  std::map<Key, Built> graphs;
  GrowableWorkspace* workspace = nullptr;

  Built& graph(const AttentionShape& shape, bool backward) {
    const Key key{shape.B, shape.T, shape.heads, shape.kv_heads, shape.head_dim, backward};
    auto found = graphs.find(key);
    if (found != graphs.end()) return found->second;

    const bool timed = choice == AlgorithmChoice::kTimed;
    // cuDNN's default backward sums dQ with atomics, so two runs differ in their last bits;
    // kHeuristic promises the same bits in every run, so it asks for the ordered-dQ algorithm
    // (a few percent of attention's backward, which is a small part of a step at any width).
    const bool deterministic = backward && !timed;
    auto graph = describe(shape, backward, deterministic);
    std::string failed = finalize(*graph, timed);
    if (!failed.empty() && deterministic) {
      std::fprintf(stderr,
                   "layup: cuDNN has no deterministic attention backward here (%s); using its "
                   "default one: runs will differ in their last bits (--attention layup is "
                   "deterministic)\n",
                   failed.c_str());
      graph = describe(shape, backward, false);
      failed = finalize(*graph, timed);
    }
    if (!failed.empty()) {
      fail("cuDNN attention: ", failed, " for B=", shape.B, " T=", shape.T, " heads=", shape.heads,
           " kv_heads=", shape.kv_heads, " head_dim=", shape.head_dim,
           " (--attention layup runs layup's own kernel)");
    }

    int64_t needed = 0;
    check_frontend(graph->get_workspace_size(needed), "sizing the workspace", shape);
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

  // The forward or backward SDPA graph of `shape`, described but not built.
  std::shared_ptr<fe::graph::Graph> describe(const AttentionShape& shape, bool backward,
                                             bool deterministic) const {
    const int qkv_width = shape.qkv_width(), out_width = shape.out_width();
    auto graph = std::make_shared<fe::graph::Graph>();
    graph->set_io_data_type(fe::DataType_t::BFLOAT16)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    auto q = heads_tensor(*graph, "q", kQ, shape, shape.heads, qkv_width);
    auto k = heads_tensor(*graph, "k", kK, shape, shape.kv_heads, qkv_width);
    auto v = heads_tensor(*graph, "v", kV, shape, shape.kv_heads, qkv_width);
    const float scale = 1.0f / std::sqrt(static_cast<float>(shape.head_dim));
    if (!backward) {
      auto options = fe::graph::SDPA_attributes()
                         .set_name("attention_forward")
                         .set_generate_stats(true)
                         .set_causal_mask(true)
                         .set_attn_scale(scale);
      auto [o, stats] = graph->sdpa(q, k, v, options);
      o->set_output(true)
          .set_uid(kO)
          .set_dim(split_heads_dim(shape, shape.heads))
          .set_stride(split_heads_stride(shape, out_width));
      stats->set_output(true)
          .set_uid(kStats)
          .set_data_type(fe::DataType_t::FLOAT)
          .set_dim(lse_dim(shape))
          .set_stride(lse_stride(shape));
    } else {
      auto o = heads_tensor(*graph, "o", kO, shape, shape.heads, out_width);
      auto d_o = heads_tensor(*graph, "d_o", kDO, shape, shape.heads, out_width);
      auto stats = graph->tensor(fe::graph::Tensor_attributes()
                                     .set_name("stats")
                                     .set_uid(kStats)
                                     .set_dim(lse_dim(shape))
                                     .set_stride(lse_stride(shape))
                                     .set_data_type(fe::DataType_t::FLOAT));
      auto options = fe::graph::SDPA_backward_attributes()
                         .set_name("attention_backward")
                         .set_causal_mask(true)
                         .set_attn_scale(scale)
                         .set_deterministic_algorithm(deterministic);
      // With fewer key/value heads, cuDNN sums dk and dv over each group's query heads itself.
      auto [d_q, d_k, d_v] = graph->sdpa_backward(q, k, v, o, d_o, stats, options);
      d_q->set_output(true)
          .set_uid(kDQ)
          .set_dim(split_heads_dim(shape, shape.heads))
          .set_stride(split_heads_stride(shape, qkv_width));
      d_k->set_output(true)
          .set_uid(kDK)
          .set_dim(split_heads_dim(shape, shape.kv_heads))
          .set_stride(split_heads_stride(shape, qkv_width));
      d_v->set_output(true)
          .set_uid(kDV)
          .set_dim(split_heads_dim(shape, shape.kv_heads))
          .set_stride(split_heads_stride(shape, qkv_width));
    }
    return graph;
  }

  // Validates and builds `graph`'s plans; the failing step and cuDNN's message, or "" when built.
  std::string finalize(fe::graph::Graph& graph, bool timed) const {
    const std::pair<const char*, std::function<fe::error_object()>> steps[] = {
        {"validating the graph", [&] { return graph.validate(); }},
        {"building the operation graph", [&] { return graph.build_operation_graph(handle); }},
        {"finding execution plans",
         [&] { return graph.create_execution_plans({fe::HeurMode_t::A}); }},
        {"checking support", [&] { return graph.check_support(handle); }},
        {"building the plan", [&] {
           return graph.build_plans(handle, timed ? fe::BuildPlanPolicy_t::ALL
                                                  : fe::BuildPlanPolicy_t::HEURISTICS_CHOICE);
         }}};
    for (const auto& [what, step] : steps) {
      fe::error_object status = step();  // get_message is not const
      if (status.is_bad()) return std::string(what) + " failed: " + status.get_message();
    }
    return "";
  }

  void execute(Built& built, std::unordered_map<int64_t, void*>& pointers,
               const AttentionShape& shape) {
    if (choice == AlgorithmChoice::kTimed && !built.tuned) {
      // Runs every plan on these operands (the outputs are written, never read) and makes the
      // fastest the one execute runs.
      check_frontend(built.graph->autotune(handle, pointers, workspace->data()), "timing the plans",
                     shape);
      built.tuned = true;
    }
    check_frontend(built.graph->execute(handle, pointers, workspace->data()), "executing", shape);
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

void CudnnAttention::forward(__nv_bfloat16* out, float* lse, const __nv_bfloat16* qkv,
                             const AttentionShape& shape) {
  State::Built& graph = state_->graph(shape, false);
  auto* base = const_cast<__nv_bfloat16*>(qkv);  // cuDNN's variant pack takes void*
  std::unordered_map<int64_t, void*> pointers = {{kQ, base},
                                                 {kK, base + k_offset(shape)},
                                                 {kV, base + v_offset(shape)},
                                                 {kO, out},
                                                 {kStats, lse}};
  state_->execute(graph, pointers, shape);
}

void CudnnAttention::backward(__nv_bfloat16* dqkv, const __nv_bfloat16* dout,
                              const __nv_bfloat16* qkv, const __nv_bfloat16* out, const float* lse,
                              const AttentionShape& shape) {
  State::Built& graph = state_->graph(shape, true);
  auto* base = const_cast<__nv_bfloat16*>(qkv);
  std::unordered_map<int64_t, void*> pointers = {{kQ, base},
                                                 {kK, base + k_offset(shape)},
                                                 {kV, base + v_offset(shape)},
                                                 {kO, const_cast<__nv_bfloat16*>(out)},
                                                 {kDO, const_cast<__nv_bfloat16*>(dout)},
                                                 {kStats, const_cast<float*>(lse)},
                                                 {kDQ, dqkv},
                                                 {kDK, dqkv + k_offset(shape)},
                                                 {kDV, dqkv + v_offset(shape)}};
  state_->execute(graph, pointers, shape);
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
void CudnnAttention::forward(__nv_bfloat16*, float*, const __nv_bfloat16*, const AttentionShape&) {}
void CudnnAttention::backward(__nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*,
                              const __nv_bfloat16*, const float*, const AttentionShape&) {}

#endif

}  // namespace layup::cuda
