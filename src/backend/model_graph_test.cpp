// The model graph run on symbols instead of numbers: each buffer holds the identity of the value
// last written to it (a hash of the op, its sizes and the identities it read), so two runs compute
// the same values exactly when their gradients' identities agree, whichever buffers held them.
// This checks, without a GPU, what the CUDA backend's --recompute levels rely on: with the arena
// CUDA carves at each level (blocks sharing the recomputed buffers), every read in a block's
// backward still sees that block's value, so the gradients are those of keeping everything. It
// also checks that each span's weights are read only after its forward hook, and that one backward
// writes every tensor of the gradient.
#include "backend/model_graph.h"

#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "backend/cuda/cuda_arena.h"
#include "backend/cuda/cuda_backend_buffers.h"
#include "model/model_config.h"
#include "model/parameter_layout.h"

namespace layup {
namespace {

using Activations = CudaArena<float>::BlockActivations;

uint64_t mix(uint64_t h, uint64_t value) {
  h ^= value + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  return h * 0xbf58476d1ce4e5b9ull;
}

uint64_t tag(std::string_view name) {
  uint64_t h = 1469598103934665603ull;
  for (char c : name) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return h;
}

template <class... Values>
uint64_t id(std::string_view name, Values... values) {
  uint64_t h = tag(name);
  ((h = mix(h, static_cast<uint64_t>(values))), ...);
  return h;
}

// The graph's ops (model_graph.h) on identities. A read of a weight checks that its span's hook
// has run; a read of anything no op wrote fails the test.
class SymbolicOps {
 public:
  SymbolicOps(const ParameterLayout& layout, const float* params)
      : layout_(layout), params_(params), opened_(layout.spans().size(), false) {}

  void open(size_t span) { opened_.at(span) = true; }
  void open_all() { opened_.assign(opened_.size(), true); }
  // The identity `p` holds (0 for null).
  uint64_t read(const void* p) {
    if (p == nullptr) return 0;
    const float* f = static_cast<const float*>(p);
    if (f >= params_ && f < params_ + layout_.total_count()) {
      const size_t offset = static_cast<size_t>(f - params_);
      for (size_t i = 0; i < layout_.spans().size(); ++i) {
        const Span& span = layout_.spans()[i];
        if (offset >= span.offset && offset < span.offset + span.count) {
          EXPECT_TRUE(opened_[i]) << "weights of span " << i << " read before its hook";
        }
      }
      return id("weight", offset);
    }
    const auto value = values_.find(p);
    if (value == values_.end()) {
      ADD_FAILURE() << "an op reads a buffer no op wrote";
      return 0;
    }
    return value->second;
  }
  void write(const void* p, uint64_t value) {
    if (p != nullptr) values_[p] = value;
  }
  bool holds(const void* p) const { return values_.count(p) > 0; }

  void embedding_forward(float* out, const float* wte, const float* wpe) {
    write(out, id("embedding", read(wte), read(wpe)));
  }
  void norm_forward(float* out, float* mean, float* rstd, const float* x, const float* weight,
                    const float* bias) {
    const uint64_t in = read(x);
    write(out, id("norm", in, read(weight), read(bias)));
    write(mean, id("mean", in));
    write(rstd, id("rstd", in));
  }
  void residual_forward(float* sum, const float* x, const float* branch) {
    write(sum, id("add", read(x), read(branch)));
  }
  template <class BeforeNorm>
  void residual_norm_forward(float* sum, float* out, float* mean, float* rstd, const float* x,
                             const float* branch, const float* weight, const float* bias,
                             BeforeNorm&& before_norm) {
    residual_forward(sum, x, branch);
    before_norm();
    norm_forward(out, mean, rstd, sum, weight, bias);
  }
  void matmul_forward(float* out, const float* in, const float* weight, const float* bias,
                      int in_width, int out_width) {
    write(out, id("matmul", read(in), read(weight), read(bias), in_width, out_width));
  }
  void matmul_activation_forward(float* act, float* pre, const float* in, const float* weight,
                                 const float* bias, int in_width, int out_width) {
    matmul_forward(pre, in, weight, bias, in_width, out_width);
    activation_forward(act, pre);
  }
  void activation_forward(float* act, const float* pre) { write(act, id("act", read(pre))); }
  void rope_forward(float* qkv) { write(qkv, id("rope", read(qkv))); }
  void attention_forward(Activations& a) {
    const uint64_t qkv = read(a.qkv);
    write(a.att_out, id("attention", qkv));
    write(a.att_lse, id("lse", qkv));
  }

  void matmul_backward(float* din, float* dweight, float* dbias, const float* dout, const float* in,
                       const float* weight, int in_width, int out_width) {
    const uint64_t d = read(dout);
    write(din, id("d_in", d, read(weight), in_width));
    write(dweight, id("d_weight", d, read(in), out_width));
    write(dbias, id("d_bias", d));
  }
  void matmul_activation_backward(float* d_pre, float* /*d_act*/, float* dweight, float* dbias,
                                  const float* dout, const float* act, const float* pre,
                                  const float* weight, int in_width, int out_width) {
    const uint64_t d = read(dout);
    write(dweight, id("d_weight", d, read(act), out_width));
    write(dbias, id("d_bias", d));
    write(d_pre, id("d_act", id("d_in", d, read(weight), in_width), read(pre)));
  }
  void norm_backward(float* din, float* dweight, float* dbias, const float* dout, const float* x,
                     const float* weight, const float* mean, const float* rstd) {
    const uint64_t d = read(dout), in = read(x), m = read(mean), r = read(rstd);
    write(din, id("add", read(din), id("d_norm", d, in, read(weight), m, r)));
    write(dweight, id("d_norm_weight", d, in, m, r));
    write(dbias, id("d_norm_bias", d));
  }
  void attention_backward(float* dqkv, const float* dout, const Activations& a) {
    write(dqkv, id("d_attention", read(dout), read(a.qkv), read(a.att_out), read(a.att_lse)));
  }
  void rope_backward(float* dqkv) { write(dqkv, id("d_rope", read(dqkv))); }
  void lm_head_backward(float* d_in, float* dweight, float* logits, const float* logsumexp,
                        const int32_t* targets, const float* in, const float* weight, float dloss) {
    uint32_t dloss_bits;
    std::memcpy(&dloss_bits, &dloss, sizeof dloss_bits);
    const uint64_t d = id("d_logits", read(logits), read(logsumexp), read(targets), dloss_bits);
    write(logits, d);  // in place, as on CUDA
    write(d_in, id("d_in", d, read(weight)));
    write(dweight, id("d_weight", d, read(in)));
  }
  void embedding_backward(float* dwte, float* dwpe, const float* dout) {
    const uint64_t d = read(dout);
    write(dwte, id("add", read(dwte), id("d_wte", d)));
    if (dwpe) write(dwpe, id("add", read(dwpe), id("d_wpe", d)));
  }
  void zero(float* buffer, size_t count) { write(buffer, id("zero", count)); }
  void zero_gradient(float* gradient, size_t count) {
    if (count > 0) write(gradient, id("zero", count));
  }

 private:
  const ParameterLayout& layout_;
  const float* params_;
  std::vector<bool> opened_;
  std::unordered_map<const void*, uint64_t> values_;
};

// Opens each span as its hook runs, and notes the order.
class OpeningHooks final : public ForwardHooks {
 public:
  OpeningHooks(SymbolicOps& ops, int layers) : ops_(ops), layers_(layers) {}
  void before_embeddings() override { open(0); }
  void before_block(int layer) override { open(1 + layer); }
  void before_head() override { open(1 + layers_); }
  std::vector<int> order;

 private:
  void open(int span) {
    order.push_back(span);
    ops_.open(span);
  }
  SymbolicOps& ops_;
  int layers_;
};

// The arena the CUDA backend carves for this level, in host memory nothing dereferences.
struct CarvedArena {
  CarvedArena(const ModelConfig& config, int B, int T, int recompute) {
    const CudaArenaShape shape = cuda_arena_shape<float>(config, B, T, recompute);
    Carver measure;
    CudaArena<float> sizing;
    sizing.carve(measure, shape);
    for (int r = 0; r < kArenaRegions; ++r)
      memory[r].resize(measure.used(static_cast<ArenaRegion>(r)) + kArenaAlignBytes);
    Carver place({memory[0].data(), memory[1].data(), memory[2].data()});
    arena.carve(place, shape);
  }
  std::array<std::vector<char>, kArenaRegions> memory;
  CudaArena<float> arena;
};

constexpr int kB = 2, kT = 5;

struct GraphRun {
  std::vector<uint64_t> gradient;  // the identity of each graph_tensors' gradient
  std::vector<int> hook_order;
};

// Where each tensor the graph reads lies in the flat buffer, named as the offsets name it: the
// stacked matrices (q,k,v; gate and up) are one tensor each here.
std::vector<std::pair<std::string, size_t>> graph_tensors(const ParameterLayout& layout) {
  std::vector<std::pair<std::string, size_t>> tensors;
  auto add = [&](const std::string& name, size_t span, size_t offset) {
    if (offset != kAbsent) tensors.emplace_back(name, span + offset);
  };
  const EmbeddingOffsets& e = layout.embeddings();
  add("wte", 0, e.wte);
  add("wpe", 0, e.wpe);
  const BlockOffsets& o = layout.block();
  for (int l = 0; l < layout.config().n_layer; ++l) {
    const size_t span = layout.block_offset(l);
    const std::string block = "block " + std::to_string(l) + " ";
    add(block + "ln_1_weight", span, o.ln_1_weight);
    add(block + "ln_1_bias", span, o.ln_1_bias);
    add(block + "attn_qkv_weight", span, o.attn_qkv_weight);
    add(block + "attn_qkv_bias", span, o.attn_qkv_bias);
    add(block + "attn_proj_weight", span, o.attn_proj_weight);
    add(block + "attn_proj_bias", span, o.attn_proj_bias);
    add(block + "ln_2_weight", span, o.ln_2_weight);
    add(block + "ln_2_bias", span, o.ln_2_bias);
    add(block + "mlp_fc_weight", span, o.mlp_fc_weight);
    add(block + "mlp_fc_bias", span, o.mlp_fc_bias);
    add(block + "mlp_proj_weight", span, o.mlp_proj_weight);
    add(block + "mlp_proj_bias", span, o.mlp_proj_bias);
  }
  const FinalNormOffsets& f = layout.final_norm();
  add("final norm weight", layout.final_norm_offset(), f.weight);
  add("final norm bias", layout.final_norm_offset(), f.bias);
  add("lm_head", layout.final_norm_offset(), f.lm_head);
  return tensors;
}

// One forward and backward at `recompute`.
GraphRun run_graph(const ModelConfig& config, int recompute) {
  const ParameterLayout layout(config);
  const std::vector<float> params(layout.total_count());
  std::vector<float> grads(layout.total_count());
  CarvedArena carved(config, kB, kT, recompute);
  CudaArena<float>& arena = carved.arena;
  SymbolicOps ops(layout, params.data());
  ops.write(arena.targets, id("targets"));
  const graph::Shape shape = graph::shape_of(config, kB, kT);
  const SpanPointers<const float> w = layout.pointers<const float>(params.data());
  const SpanPointers<float> g = layout.pointers(grads.data());

  OpeningHooks hooks(ops, config.n_layer);
  graph::forward(ops, shape, layout, w, arena, hooks);
  // The loss is the backend's, after the graph: its log-sum-exp is what the head's backward reads.
  ops.write(arena.logsumexp, id("logsumexp", ops.read(arena.logits), ops.read(arena.targets)));
  ops.open_all();
  graph::backward_head(ops, shape, layout, w, arena, g.final_norm, g.embeddings, 0.5f);
  for (int l = config.n_layer - 1; l >= 0; --l)
    graph::backward_block(ops, shape, layout.block(), l, w.blocks[l], g.blocks[l], arena,
                          recompute);
  graph::backward_embeddings(ops, layout.embeddings(), arena, g.embeddings);

  GraphRun run;
  run.hook_order = hooks.order;
  for (const auto& [name, offset] : graph_tensors(layout)) {
    const float* gradient = grads.data() + offset;
    EXPECT_TRUE(ops.holds(gradient)) << "the backward leaves " << name << " unwritten";
    run.gradient.push_back(ops.holds(gradient) ? ops.read(gradient) : 0);
  }
  return run;
}

// The layer-major forward (graph::forward_embeddings, forward_block, forward_head) of one
// micro-batch, its residual stream in a hidden state of its own and each block's input kept as a
// store keeps it, then the backward at --recompute 3 from the kept inputs, as layer-major runs it
// (every block's forward computed again, the last block's too).
GraphRun run_graph_layer_major(const ModelConfig& config) {
  const ParameterLayout layout(config);
  const std::vector<float> params(layout.total_count());
  std::vector<float> grads(layout.total_count());
  CarvedArena carved(config, kB, kT, kMaxRecompute);
  CudaArena<float>& arena = carved.arena;
  SymbolicOps ops(layout, params.data());
  ops.write(arena.targets, id("targets"));
  const graph::Shape shape = graph::shape_of(config, kB, kT);
  const SpanPointers<const float> w = layout.pointers<const float>(params.data());
  const SpanPointers<float> g = layout.pointers(grads.data());

  OpeningHooks hooks(ops, config.n_layer);
  std::vector<float> hidden(1);
  std::vector<uint64_t> stored;  // each block's input, as the store keeps it
  graph::forward_embeddings(ops, layout, w, hidden.data(), hooks);
  for (int l = 0; l < config.n_layer; ++l) {
    stored.push_back(ops.read(hidden.data()));
    graph::forward_block(ops, shape, layout.block(), l, w.blocks[l], arena,
                         static_cast<const float*>(hidden.data()), hidden.data(), hooks);
  }
  ops.write(arena.residual[config.n_layer], ops.read(hidden.data()));
  graph::forward_head(ops, shape, layout, w, arena, hooks);
  ops.write(arena.logsumexp, id("logsumexp", ops.read(arena.logits), ops.read(arena.targets)));
  ops.open_all();
  graph::backward_head(ops, shape, layout, w, arena, g.final_norm, g.embeddings, 0.5f);
  for (int l = config.n_layer - 1; l >= 0; --l) {
    ops.write(arena.residual[l], stored[l]);  // resume_micro_batch
    graph::backward_block(ops, shape, layout.block(), l, w.blocks[l], g.blocks[l], arena,
                          kMaxRecompute, /*last_kept=*/false);
  }
  graph::backward_embeddings(ops, layout.embeddings(), arena, g.embeddings);

  GraphRun run;
  run.hook_order = hooks.order;
  for (const auto& [name, offset] : graph_tensors(layout)) {
    const float* gradient = grads.data() + offset;
    EXPECT_TRUE(ops.holds(gradient)) << "the backward leaves " << name << " unwritten";
    run.gradient.push_back(ops.holds(gradient) ? ops.read(gradient) : 0);
  }
  return run;
}

// Three blocks (so that --recompute 3 recomputes two of them), each family's variants.
ModelConfig graph_config(const std::string& model) {
  if (model == "gpt2") return gpt2_config(3, 2, 64, 16, 300);
  ModelConfig config = llama_config(3, 4, 2, 64, 96, 16, 300);
  if (model == "llama_untied_biases") {
    config.tie_word_embeddings = false;
    config.attention_bias = config.attention_output_bias = true;
  } else {  // qwen2: one K/V head, q/k/v biases, a tied head
    config.n_kv_head = 1;
    config.tie_word_embeddings = true;
    config.attention_bias = true;
    config.hf_model_type = "qwen2";
  }
  return config;
}

class ModelGraph : public testing::TestWithParam<std::string> {};

TEST_P(ModelGraph, RecomputingGivesTheGradientsOfKeepingEveryActivation) {
  const ModelConfig config = graph_config(GetParam());
  const GraphRun kept = run_graph(config, 0);
  const auto tensors = graph_tensors(ParameterLayout(config));
  for (int recompute = 1; recompute <= kMaxRecompute; ++recompute) {
    const GraphRun recomputed = run_graph(config, recompute);
    for (size_t i = 0; i < tensors.size(); ++i)
      EXPECT_EQ(recomputed.gradient[i], kept.gradient[i])
          << tensors[i].first << " at --recompute " << recompute;
  }
}

TEST_P(ModelGraph, RunsEachHookOnceInOrderBeforeItsSpanIsRead) {
  const ModelConfig config = graph_config(GetParam());
  const GraphRun run = run_graph(config, 0);  // the reads are checked as they happen
  std::vector<int> expected;
  for (int span = 0; span < config.n_layer + 2; ++span) expected.push_back(span);
  EXPECT_EQ(run.hook_order, expected);
}

// The forward cut at block boundaries computes the values the whole forward does (each norm after
// a residual add on the sum it wrote), its hooks in the same order before each span's first read,
// and the backward from the kept block inputs gives every gradient of keeping every activation.
TEST_P(ModelGraph, TheLayerMajorForwardGivesTheGradientsOfTheWholeForward) {
  const ModelConfig config = graph_config(GetParam());
  const GraphRun kept = run_graph(config, 0);
  const GraphRun layer_major = run_graph_layer_major(config);
  const auto tensors = graph_tensors(ParameterLayout(config));
  for (size_t i = 0; i < tensors.size(); ++i)
    EXPECT_EQ(layer_major.gradient[i], kept.gradient[i]) << tensors[i].first;
  EXPECT_EQ(layer_major.hook_order, kept.hook_order);
}

TEST_P(ModelGraph, TellsEveryTensorsGradientApart) {
  // A check of the check above: no two tensors' gradients share an identity.
  const ModelConfig config = graph_config(GetParam());
  const GraphRun run = run_graph(config, 0);
  for (size_t i = 0; i < run.gradient.size(); ++i)
    for (size_t j = i + 1; j < run.gradient.size(); ++j)
      EXPECT_NE(run.gradient[i], run.gradient[j]) << i << " and " << j;
}

INSTANTIATE_TEST_SUITE_P(Families, ModelGraph,
                         testing::Values("gpt2", "llama_untied_biases", "qwen2"));

}  // namespace
}  // namespace layup
