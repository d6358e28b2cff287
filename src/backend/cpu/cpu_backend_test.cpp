// The CPU backend on a tiny GPT-2: its logits and loss against a double-precision forward written
// out here, its gradients against finite differences of its own loss, and the contract of the
// backward calls (accumulation, loss scaling, order, input checks).
#include "backend/cpu/cpu_backend.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "backend/cpu/ops/gradient_check.h"
#include "core/error.h"
#include "core/rng.h"

namespace layup {
namespace {

using op_test::expect_close;

// Two layers, two heads, width 16, a 61-token vocabulary padded to 128.
ModelConfig tiny_config() {
  return gpt2_config(2, 2, 16, 8, 61);
}

constexpr int kMaxBatch = 3, kMaxSeqLen = 7;

// Weights large enough that every nonlinearity is off its linear regime; padded wte rows zero.
std::vector<float> random_parameters(const ParameterLayout& layout, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> params(layout.total_count());
  for (const TensorSpec& tensor : layout.tensors()) {
    const bool gain = tensor.name.find("ln") != std::string::npos &&
                      tensor.name.find("weight") != std::string::npos;
    for (size_t i = 0; i < tensor.count; ++i)
      params[tensor.offset + i] = gain ? 1.0f + 0.2f * rng.normal() : 0.3f * rng.normal();
  }
  const ModelConfig& config = layout.config();
  for (size_t i = static_cast<size_t>(config.vocab_size) * config.n_embd;
       i < static_cast<size_t>(config.padded_vocab_size) * config.n_embd; ++i)
    params[layout.embeddings().wte + i] = 0.0f;
  return params;
}

struct Batch {
  std::vector<int32_t> inputs, targets;
  int B, T;
  TokenBatch view(bool with_targets = true) const {
    return TokenBatch{inputs.data(), with_targets ? targets.data() : nullptr, B, T};
  }
};

Batch random_batch(int B, int T, int vocab_size, uint64_t seed) {
  Rng rng(seed);
  Batch batch{std::vector<int32_t>(B * T), std::vector<int32_t>(B * T), B, T};
  for (int32_t& token : batch.inputs) token = static_cast<int32_t>(rng.below(vocab_size));
  for (int32_t& token : batch.targets) token = static_cast<int32_t>(rng.below(vocab_size));
  return batch;
}

// GPT-2's forward in double, written independently of the ops: returns the mean loss and fills
// logits [B*T, Vp].
double reference_forward(const ParameterLayout& layout, const std::vector<double>& P,
                         const Batch& batch, std::vector<double>& logits) {
  const ModelConfig& cfg = layout.config();
  const int C = cfg.n_embd, NH = cfg.n_head, hd = C / NH, BT = batch.B * batch.T;
  const int V = cfg.vocab_size, Vp = cfg.padded_vocab_size;
  using Rows = std::vector<std::vector<double>>;
  auto layernorm = [&](const Rows& x, size_t w, size_t b) {
    Rows y = x;
    for (auto& row : y) {
      double mean = 0.0, var = 0.0;
      for (double v : row) mean += v / C;
      for (double v : row) var += (v - mean) * (v - mean) / C;
      for (int c = 0; c < C; ++c)
        row[c] = (row[c] - mean) / std::sqrt(var + cfg.layer_norm_epsilon) * P[w + c] + P[b + c];
    }
    return y;
  };
  auto linear = [&](const Rows& x, size_t w, size_t b, int out) {
    Rows y(x.size(), std::vector<double>(out));
    for (size_t n = 0; n < x.size(); ++n)
      for (int o = 0; o < out; ++o) {
        y[n][o] = P[b + o];
        for (size_t i = 0; i < x[n].size(); ++i) y[n][o] += x[n][i] * P[w + o * x[n].size() + i];
      }
    return y;
  };
  auto add = [](Rows a, const Rows& b) {
    for (size_t n = 0; n < a.size(); ++n)
      for (size_t c = 0; c < a[n].size(); ++c) a[n][c] += b[n][c];
    return a;
  };

  const size_t wte = layout.embeddings().wte, wpe = layout.embeddings().wpe;
  Rows x(BT, std::vector<double>(C));
  for (int n = 0; n < BT; ++n)
    for (int c = 0; c < C; ++c)
      x[n][c] = P[wte + batch.inputs[n] * C + c] + P[wpe + (n % batch.T) * C + c];

  const BlockOffsets& o = layout.block();
  for (int l = 0; l < cfg.n_layer; ++l) {
    const size_t base = layout.block_offset(l);
    const Rows qkv = linear(layernorm(x, base + o.ln_1_weight, base + o.ln_1_bias),
                            base + o.attn_qkv_weight, base + o.attn_qkv_bias, 3 * C);
    Rows att(BT, std::vector<double>(C, 0.0));
    for (int b = 0; b < batch.B; ++b)
      for (int h = 0; h < NH; ++h)
        for (int t = 0; t < batch.T; ++t) {
          const auto& q = qkv[b * batch.T + t];
          std::vector<double> p(t + 1);
          double sum = 0.0;
          for (int u = 0; u <= t; ++u) {
            double score = 0.0;
            for (int i = 0; i < hd; ++i)
              score += q[h * hd + i] * qkv[b * batch.T + u][C + h * hd + i];
            sum += p[u] = std::exp(score / std::sqrt(static_cast<double>(hd)));
          }
          for (int u = 0; u <= t; ++u)
            for (int i = 0; i < hd; ++i)
              att[b * batch.T + t][h * hd + i] +=
                  p[u] / sum * qkv[b * batch.T + u][2 * C + h * hd + i];
        }
    x = add(x, linear(att, base + o.attn_proj_weight, base + o.attn_proj_bias, C));
    Rows fc = linear(layernorm(x, base + o.ln_2_weight, base + o.ln_2_bias), base + o.mlp_fc_weight,
                     base + o.mlp_fc_bias, 4 * C);
    for (auto& row : fc)
      for (double& v : row)
        v = 0.5 * v * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v)));
    x = add(x, linear(fc, base + o.mlp_proj_weight, base + o.mlp_proj_bias, C));
  }

  const size_t f = layout.final_norm_offset();
  const Rows xf = layernorm(x, f + layout.final_norm().weight, f + layout.final_norm().bias);
  logits.assign(static_cast<size_t>(BT) * Vp, 0.0);
  double loss = 0.0;
  for (int n = 0; n < BT; ++n) {
    double sum = 0.0;
    for (int v = 0; v < Vp; ++v) {
      for (int c = 0; c < C; ++c) logits[n * Vp + v] += xf[n][c] * P[wte + v * C + c];
      if (v < V) sum += std::exp(logits[n * Vp + v]);
    }
    loss += (std::log(sum) - logits[n * Vp + batch.targets[n]]) / BT;
  }
  return loss;
}

// One whole backward pass, in the order the interface prescribes.
void run_backward(ModelBackend& backend, const ParameterPointers& params,
                  const GradientPointers& grads, int n_layer, float loss_scale = 1.0f) {
  backend.backward_head(params, grads.final_norm, grads.embeddings, loss_scale);
  for (int l = n_layer - 1; l >= 0; --l) backend.backward_block(l, params, grads.blocks[l]);
  backend.backward_embeddings(params, grads.embeddings);
}

class CpuBackendTest : public ::testing::Test {
 protected:
  CpuBackendTest()
      : config(tiny_config()),
        layout(config),
        params(random_parameters(layout, 7)),
        backend(make_cpu_backend(config, kMaxBatch, kMaxSeqLen)) {}

  ParameterPointers param_pointers() const { return layout.pointers<const float>(params.data()); }

  ModelConfig config;
  ParameterLayout layout;
  std::vector<float> params;
  std::unique_ptr<ModelBackend> backend;
};

TEST_F(CpuBackendTest, ForwardMatchesDoublePrecisionReference) {
  const int Vp = config.padded_vocab_size, V = config.vocab_size;
  // Largest batch first, then smaller ones: buffers sized for the maximum must serve any batch.
  for (auto [B, T] : {std::pair{3, 7}, std::pair{1, 1}, std::pair{2, 5}}) {
    const Batch batch = random_batch(B, T, V, 100 + B * 10 + T);
    const float loss = backend->forward(param_pointers(), batch.view());
    std::vector<double> expected_logits;
    const double expected_loss = reference_forward(
        layout, std::vector<double>(params.begin(), params.end()), batch, expected_logits);
    const std::string where = "B=" + std::to_string(B) + " T=" + std::to_string(T);
    EXPECT_NEAR(loss, expected_loss, 1e-6 * expected_loss) << where;
    expect_close(backend->logits(), expected_logits, 3e-6, 3e-6, "logits " + where);
    EXPECT_GT(expected_loss, 1.0) << "a trivial loss would not test much";
    for (int n = 0; n < B * T; ++n)
      for (int v = V; v < Vp; ++v) ASSERT_EQ(backend->logits()[n * Vp + v], 0.0f);
  }
}

TEST_F(CpuBackendTest, ForwardWithoutTargetsGivesNanAndTheSameLogits) {
  const Batch batch = random_batch(2, 5, config.vocab_size, 1);
  backend->forward(param_pointers(), batch.view());
  const size_t count = static_cast<size_t>(2 * 5) * config.padded_vocab_size;
  const std::vector<float> with_targets(backend->logits(), backend->logits() + count);
  EXPECT_TRUE(std::isnan(backend->forward(param_pointers(), batch.view(false))));
  EXPECT_EQ(std::vector<float>(backend->logits(), backend->logits() + count), with_targets);
  std::vector<float> grads(layout.total_count(), 0.0f);
  const GradientPointers g = layout.pointers(grads.data());
  EXPECT_THROW(backend->backward_head(param_pointers(), g.final_norm, g.embeddings, 1.0f), Error);
}

// Every tensor: a few random elements, plus the rows of wte the batch uses, against central
// differences of the backend's own fp32 loss. The loss (about 4) is quantized at ~5e-7, which
// puts a noise of ~2.5e-5 on a difference quotient over 2e-2: the absolute tolerance is 4x that;
// the relative one covers the eps^2 truncation error.
TEST_F(CpuBackendTest, GradientsMatchFiniteDifferencesOfTheLoss) {
  const Batch batch = random_batch(2, 5, config.vocab_size, 3);
  std::vector<float> grads(layout.total_count(), 0.0f);
  backend->forward(param_pointers(), batch.view());
  run_backward(*backend, param_pointers(), layout.pointers(grads.data()), config.n_layer);

  Rng rng(11);
  const size_t C = config.n_embd;
  int checked = 0;
  for (const TensorSpec& tensor : layout.tensors()) {
    std::set<size_t> picks;
    while (picks.size() < 6) picks.insert(rng.below(tensor.count));
    if (tensor.name == "wte.weight") {
      picks.clear();  // real rows only; padded rows are checked below
      while (picks.size() < 6) picks.insert(rng.below(config.vocab_size * C));
      for (int k = 0; k < 3; ++k) picks.insert(batch.inputs[k] * C + rng.below(C));
    }
    for (size_t index : picks) {
      float& p = params[tensor.offset + index];
      const float saved = p;
      const float eps = 1e-2f;
      p = saved + eps;
      const double loss_plus = backend->forward(param_pointers(), batch.view());
      const float plus_value = p;
      p = saved - eps;
      const double loss_minus = backend->forward(param_pointers(), batch.view());
      const float minus_value = p;
      p = saved;
      const double numeric = (loss_plus - loss_minus) / (double{plus_value} - minus_value);
      const double analytic = grads[tensor.offset + index];
      EXPECT_NEAR(analytic, numeric, 1e-4 + 2e-3 * std::fabs(numeric))
          << tensor.name << "[" << index << "]";
      ++checked;
    }
  }
  EXPECT_GE(checked, (config.n_layer * 12 + 4) * 6);

  for (size_t i = config.vocab_size * C; i < config.padded_vocab_size * C; ++i)
    ASSERT_EQ(grads[layout.embeddings().wte + i], 0.0f) << "padded wte element " << i;
}

// Backward overwrites (ModelBackend): a second pass over the same batch into memory holding
// anything (NaN here) gives the first pass's gradient bit for bit.
TEST_F(CpuBackendTest, BackwardOverwritesWhatTheMemoryHeld) {
  const Batch batch = random_batch(3, 7, config.vocab_size, 5);
  std::vector<float> grads(layout.total_count(), 0.0f);
  const GradientPointers g = layout.pointers(grads.data());
  const float loss = backend->forward(param_pointers(), batch.view());
  run_backward(*backend, param_pointers(), g, config.n_layer);
  const std::vector<float> once = grads;
  std::fill(grads.begin(), grads.end(), std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(backend->forward(param_pointers(), batch.view()), loss) << "forward is deterministic";
  run_backward(*backend, param_pointers(), g, config.n_layer);

  size_t nonzero = 0;
  for (size_t i = 0; i < grads.size(); ++i) {
    nonzero += once[i] != 0.0f;
    ASSERT_EQ(std::memcmp(&grads[i], &once[i], sizeof(float)), 0)
        << "element " << i << ": " << grads[i] << " after " << once[i];
  }
  // wpe rows beyond T and padded wte rows are the only zeros.
  EXPECT_EQ(nonzero, grads.size() - (config.n_positions - 7) * config.n_embd -
                         (config.padded_vocab_size - config.vocab_size) * config.n_embd);
}

// The gradient is linear in d(loss), and scaling by a power of two commutes with rounding.
TEST_F(CpuBackendTest, LossScaleScalesEveryGradientExactly) {
  const Batch batch = random_batch(2, 6, config.vocab_size, 9);
  std::vector<float> full(layout.total_count(), 0.0f), quarter(layout.total_count(), 0.0f);
  backend->forward(param_pointers(), batch.view());
  run_backward(*backend, param_pointers(), layout.pointers(full.data()), config.n_layer);
  run_backward(*backend, param_pointers(), layout.pointers(quarter.data()), config.n_layer, 0.25f);
  for (size_t i = 0; i < full.size(); ++i) ASSERT_EQ(quarter[i], 0.25f * full[i]) << i;
}

// Targets below 0 are not learned: the loss is the mean over the learned positions (read off the
// logits here), so a batch split into two complementary masks gives, weighted by the learned
// counts, the loss and the gradient of the whole batch. A batch with nothing learned gives 0.
TEST_F(CpuBackendTest, NotLearnedTargetsLeaveTheLossAndGradientOfTheLearnedMean) {
  const Batch batch = random_batch(2, 6, config.vocab_size, 21);
  const int BT = batch.B * batch.T, Vp = config.padded_vocab_size;
  std::vector<float> all_grads(layout.total_count(), 0.0f);
  const float all_loss = backend->forward(param_pointers(), batch.view());
  run_backward(*backend, param_pointers(), layout.pointers(all_grads.data()), config.n_layer);

  // A prompt of 4 positions in the first sequence and of 1 in the second, and its complement.
  Batch prompt = batch, completion = batch;
  for (int n = 0; n < BT; ++n) {
    const bool in_prompt = n < 4 || n == batch.T;
    (in_prompt ? completion : prompt).targets[n] = kNotLearned;
  }
  double weighted_loss = 0.0;
  std::vector<double> weighted_grads(layout.total_count(), 0.0);
  for (const Batch* part : {&prompt, &completion}) {
    const int learned = learned_target_count(part->targets.data(), BT);
    const float loss = backend->forward(param_pointers(), part->view());
    double expected = 0.0;
    for (int n = 0; n < BT; ++n) {
      if (part->targets[n] < 0) continue;
      const float* z = backend->logits() + static_cast<size_t>(n) * Vp;
      double sum = 0.0;
      for (int v = 0; v < config.vocab_size; ++v) sum += std::exp(double{z[v]});
      expected += std::log(sum) - z[part->targets[n]];
    }
    EXPECT_NEAR(loss, expected / learned, 2e-6 * loss) << learned << " learned";
    weighted_loss += double{loss} * learned;
    std::vector<float> grads(layout.total_count(), 0.0f);
    run_backward(*backend, param_pointers(), layout.pointers(grads.data()), config.n_layer);
    for (size_t i = 0; i < grads.size(); ++i) weighted_grads[i] += double{grads[i]} * learned;
  }
  EXPECT_NEAR(weighted_loss / BT, all_loss, 2e-6 * all_loss);
  std::vector<double> expected_grads(all_grads.begin(), all_grads.end());
  for (double& g : expected_grads) g *= BT;
  expect_close(std::vector<float>(weighted_grads.begin(), weighted_grads.end()), expected_grads,
               1e-5, 1e-5, "masked gradients, weighted");

  Batch nothing = batch;
  std::fill(nothing.targets.begin(), nothing.targets.end(), kNotLearned);
  EXPECT_EQ(backend->forward(param_pointers(), nothing.view()), 0.0f);
  std::vector<float> grads(layout.total_count(), 1.0f);
  run_backward(*backend, param_pointers(), layout.pointers(grads.data()), config.n_layer);
  for (size_t i = 0; i < grads.size(); ++i) ASSERT_EQ(grads[i], 0.0f) << "element " << i;
}

// Each backward call writes only into the gradient memory it is handed: a block's gradient lands
// in its slot laid out like one block span, whatever other slots hold.
TEST_F(CpuBackendTest, BlockGradientsGoToTheGivenSlot) {
  const Batch batch = random_batch(2, 4, config.vocab_size, 13);
  std::vector<float> whole(layout.total_count(), 0.0f);
  backend->forward(param_pointers(), batch.view());
  run_backward(*backend, param_pointers(), layout.pointers(whole.data()), config.n_layer);

  const size_t block_count = layout.block().count;
  std::vector<float> head(layout.total_count(), 0.0f), slot(block_count + 2, -1.0f);
  const GradientPointers g = layout.pointers(head.data());
  backend->backward_head(param_pointers(), g.final_norm, g.embeddings, 1.0f);
  for (int l = config.n_layer - 1; l >= 0; --l) {
    std::fill(slot.begin() + 1, slot.end() - 1, 0.0f);
    backend->backward_block(l, param_pointers(), slot.data() + 1);
    EXPECT_EQ(slot.front(), -1.0f);
    EXPECT_EQ(slot.back(), -1.0f);
    const float* expected = whole.data() + layout.block_offset(l);
    EXPECT_TRUE(std::equal(slot.begin() + 1, slot.end() - 1, expected)) << "block " << l;
  }
  backend->backward_embeddings(param_pointers(), g.embeddings);
  EXPECT_TRUE(std::equal(head.begin(), head.begin() + layout.embeddings().count, whole.begin()));
}

// Layer-major accumulation's interleaving (ModelBackend::park_micro_batch): three micro-batches'
// forwards and head backwards first, each parked in a store, then each block's backward of every
// micro-batch, and the embeddings' last, give every gradient of each micro-batch bit for bit as
// its own backward right after its forward does (the blocks' forwards computed again from their
// stored inputs, the last block's too).
TEST_F(CpuBackendTest, InterleavedMicroBatchesGiveEachOnesOwnGradients) {
  constexpr int kMicroBatches = 3;
  std::vector<Batch> batches;
  std::vector<std::vector<float>> expected, interleaved;
  for (int k = 0; k < kMicroBatches; ++k) {
    batches.push_back(random_batch(2, 5, config.vocab_size, 40 + k));
    expected.emplace_back(layout.total_count(), 0.0f);
    interleaved.emplace_back(layout.total_count(), -1.0f);
    backend->forward(param_pointers(), batches[k].view());
    run_backward(*backend, param_pointers(), layout.pointers(expected[k].data()), config.n_layer);
  }
  const size_t store_bytes = backend->micro_batch_state_bytes();
  EXPECT_EQ(store_bytes, micro_batch_state_bytes(config, kMaxBatch, kMaxSeqLen, sizeof(float)));
  std::vector<std::vector<float>> stores(kMicroBatches,
                                         std::vector<float>(store_bytes / sizeof(float) + 1));
  for (int k = 0; k < kMicroBatches; ++k) {
    const GradientPointers g = layout.pointers(interleaved[k].data());
    backend->forward(param_pointers(), batches[k].view());
    backend->backward_head(param_pointers(), g.final_norm, g.embeddings, 1.0f);
    backend->park_micro_batch(stores[k].data(), /*with_inputs=*/true);
  }
  for (int l = config.n_layer - 1; l >= 0; --l)
    for (int k = 0; k < kMicroBatches; ++k) {
      backend->resume_micro_batch(stores[k].data(), l);
      backend->backward_block(l, param_pointers(),
                              layout.pointers(interleaved[k].data()).blocks[l]);
      backend->park_micro_batch(stores[k].data(), /*with_inputs=*/false);
    }
  for (int k = 0; k < kMicroBatches; ++k) {
    backend->resume_micro_batch(stores[k].data(), -1);
    backend->backward_embeddings(param_pointers(),
                                 layout.pointers(interleaved[k].data()).embeddings);
    ASSERT_EQ(
        std::memcmp(interleaved[k].data(), expected[k].data(), expected[k].size() * sizeof(float)),
        0)
        << "micro-batch " << k;
  }
  EXPECT_NE(expected[0], expected[1]);
  EXPECT_THROW(backend->resume_micro_batch(stores[0].data(), config.n_layer), Error);
}

// Records the order of the hooks a forward calls.
struct OrderHooks final : ForwardHooks {
  void before_embeddings() override { spans.push_back(0); }
  void before_block(int layer) override { spans.push_back(1 + layer); }
  void before_head() override { spans.push_back(-1); }
  std::vector<int> spans;
};

// The layer-major forward (ModelBackend::forward_block): three micro-batches' embeddings, then
// each block of every micro-batch, each one's residual stream in a hidden state of its own and
// its block inputs parked in its store, then each one's head (its loss) and head backward; then
// the layer-major backward from the stores. Every micro-batch's loss and gradients are bit for bit
// those of its own forward and backward, with targets masked differently in each (the loss's
// divisor is the micro-batch's own), and each hook runs once per micro-batch, before its span.
TEST_F(CpuBackendTest, LayerMajorForwardGivesEachMicroBatchItsOwnLossAndGradients) {
  constexpr int kMicroBatches = 3;
  std::vector<Batch> batches;
  std::vector<float> losses;
  std::vector<std::vector<float>> expected, layer_major;
  for (int k = 0; k < kMicroBatches; ++k) {
    batches.push_back(random_batch(2, 5, config.vocab_size, 70 + k));
    for (size_t i = 0; i < batches[k].targets.size(); i += 2 + k)
      batches[k].targets[i] = kNotLearned;
    expected.emplace_back(layout.total_count(), 0.0f);
    layer_major.emplace_back(layout.total_count(), -1.0f);
    losses.push_back(backend->forward(param_pointers(), batches[k].view()));
    run_backward(*backend, param_pointers(), layout.pointers(expected[k].data()), config.n_layer);
  }
  EXPECT_EQ(backend->hidden_state_bytes(),
            hidden_state_bytes(config, kMaxBatch, kMaxSeqLen, sizeof(float)));
  const size_t store_floats = backend->micro_batch_state_bytes() / sizeof(float) + 1;
  const size_t hidden_floats = backend->hidden_state_bytes() / sizeof(float);
  std::vector<std::vector<float>> stores(kMicroBatches, std::vector<float>(store_floats)),
      hidden(kMicroBatches, std::vector<float>(hidden_floats));
  std::vector<OrderHooks> hooks(kMicroBatches);
  for (int k = 0; k < kMicroBatches; ++k)
    backend->forward_embeddings(param_pointers(), batches[k].view(), hidden[k].data(),
                                stores[k].data(), hooks[k]);
  for (int l = 0; l < config.n_layer; ++l)
    for (int k = 0; k < kMicroBatches; ++k)
      backend->forward_block(l, param_pointers(), hidden[k].data(), stores[k].data(), hooks[k]);
  for (int k = 0; k < kMicroBatches; ++k) {
    const float loss =
        backend->forward_head(param_pointers(), batches[k].view(), hidden[k].data(), hooks[k]);
    EXPECT_EQ(std::memcmp(&loss, &losses[k], sizeof loss), 0) << "micro-batch " << k;
    const GradientPointers g = layout.pointers(layer_major[k].data());
    backend->backward_head(param_pointers(), g.final_norm, g.embeddings, 1.0f);
    // A block's backward needs its micro-batch resumed: its input is in the store only.
    if (k == 0) {
      EXPECT_THROW(backend->backward_block(config.n_layer - 1, param_pointers(),
                                           g.blocks[config.n_layer - 1]),
                   Error);
    }
    backend->park_micro_batch(stores[k].data(), /*with_inputs=*/false);
    EXPECT_EQ(hooks[k].spans, (std::vector<int>{0, 1, 2, -1}));
  }
  for (int l = config.n_layer - 1; l >= 0; --l)
    for (int k = 0; k < kMicroBatches; ++k) {
      backend->resume_micro_batch(stores[k].data(), l);
      backend->backward_block(l, param_pointers(),
                              layout.pointers(layer_major[k].data()).blocks[l]);
      backend->park_micro_batch(stores[k].data(), /*with_inputs=*/false);
    }
  for (int k = 0; k < kMicroBatches; ++k) {
    backend->resume_micro_batch(stores[k].data(), -1);
    backend->backward_embeddings(param_pointers(),
                                 layout.pointers(layer_major[k].data()).embeddings);
    EXPECT_EQ(
        std::memcmp(layer_major[k].data(), expected[k].data(), expected[k].size() * sizeof(float)),
        0)
        << "micro-batch " << k;
  }
  EXPECT_NE(losses[0], losses[1]);
  // A forward_block or forward_head needs forward_embeddings first.
  backend->forward(param_pointers(), batches[0].view());
  EXPECT_THROW(
      backend->forward_block(0, param_pointers(), hidden[0].data(), stores[0].data(), hooks[0]),
      Error);
}

// Hooks that, when called for a span, write that span's new weights into the parameters the
// forward is reading: the forward then gives the new weights' loss and logits only if it reads
// each span after its hook (and never before), which is what a schedule whose updates land during
// the forward relies on. Also records the order of the calls.
struct SwapInHooks final : ForwardHooks {
  SwapInHooks(const ParameterLayout& layout, std::vector<float>& params,
              const std::vector<float>& next)
      : layout(layout), params(params), next(next) {}
  void before_embeddings() override { swap_in(layout.spans().front(), "embeddings"); }
  void before_block(int layer) override {
    swap_in(layout.spans()[1 + layer], "block " + std::to_string(layer));
  }
  void before_head() override { swap_in(layout.spans().back(), "head"); }
  void swap_in(const Span& span, const std::string& name) {
    std::copy_n(next.begin() + span.offset, span.count, params.begin() + span.offset);
    calls.push_back(name);
  }
  const ParameterLayout& layout;
  std::vector<float>& params;
  const std::vector<float>& next;
  std::vector<std::string> calls;
};

TEST_F(CpuBackendTest, ForwardCallsEachHookRightBeforeItReadsTheSpan) {
  const Batch batch = random_batch(2, 5, config.vocab_size, 21);
  const std::vector<float> next = random_parameters(layout, 8);
  std::vector<float> reading = params;
  SwapInHooks hooks(layout, reading, next);
  const float loss =
      backend->forward(layout.pointers<const float>(reading.data()), batch.view(), hooks);
  const size_t count = static_cast<size_t>(2 * 5) * config.padded_vocab_size;
  const std::vector<float> logits(backend->logits(), backend->logits() + count);
  EXPECT_EQ(hooks.calls, (std::vector<std::string>{"embeddings", "block 0", "block 1", "head"}));
  EXPECT_EQ(reading, next);

  EXPECT_EQ(backend->forward(layout.pointers<const float>(next.data()), batch.view()), loss);
  EXPECT_EQ(std::vector<float>(backend->logits(), backend->logits() + count), logits);
  EXPECT_NE(backend->forward(param_pointers(), batch.view()), loss) << "the swap must matter";
}

TEST_F(CpuBackendTest, RejectsBatchesThatDoNotFit) {
  const Batch fits = random_batch(kMaxBatch, kMaxSeqLen, config.vocab_size, 1);
  EXPECT_NO_THROW(backend->forward(param_pointers(), fits.view()));
  const Batch too_many = random_batch(kMaxBatch + 1, 2, config.vocab_size, 1);
  EXPECT_THROW(backend->forward(param_pointers(), too_many.view()), Error);
  const Batch too_long = random_batch(1, kMaxSeqLen + 1, config.vocab_size, 1);
  EXPECT_THROW(backend->forward(param_pointers(), too_long.view()), Error);
  Batch bad_token = random_batch(1, 3, config.vocab_size, 1);
  bad_token.inputs[2] = config.vocab_size;  // a padded row: not a real token
  EXPECT_THROW(backend->forward(param_pointers(), bad_token.view()), Error);
  Batch bad_target = random_batch(1, 3, config.vocab_size, 1);
  bad_target.targets[0] = config.vocab_size;  // below 0 is "not learned", above V is wrong
  EXPECT_THROW(backend->forward(param_pointers(), bad_target.view()), Error);
  EXPECT_THROW(make_cpu_backend(config, 2, config.n_positions + 1), Error);
  try {
    backend->forward(param_pointers(), too_many.view());
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("batch of 4"), std::string::npos) << error.what();
  }
}

TEST_F(CpuBackendTest, RejectsBackwardOutOfOrder) {
  const Batch batch = random_batch(1, 3, config.vocab_size, 1);
  std::vector<float> grads(layout.total_count(), 0.0f);
  const GradientPointers g = layout.pointers(grads.data());
  const ParameterPointers p = param_pointers();
  EXPECT_THROW(backend->backward_head(p, g.final_norm, g.embeddings, 1.0f), Error);  // no forward
  backend->forward(p, batch.view());
  EXPECT_THROW(backend->backward_block(1, p, g.blocks[1]), Error);  // head first
  backend->backward_head(p, g.final_norm, g.embeddings, 1.0f);
  EXPECT_THROW(backend->backward_block(0, p, g.blocks[0]), Error);  // block 1 first
  EXPECT_THROW(backend->backward_embeddings(p, g.embeddings), Error);
  backend->backward_block(1, p, g.blocks[1]);
  backend->backward_block(0, p, g.blocks[0]);
  EXPECT_THROW(backend->backward_block(0, p, g.blocks[0]), Error);
  backend->backward_embeddings(p, g.embeddings);
}

}  // namespace
}  // namespace layup
