// A small driver that exposes layup's model and training step to the PyTorch oracle tests.
//
//   layup_model_tool grads MODEL_DIR TOKENS B T OUT_DIR
//       forward + backward of one batch; writes OUT_DIR/outputs.safetensors (logits [B,T,V],
//       loss [1]) and the gradient as a Hugging Face checkpoint in OUT_DIR/grads/ (HF names
//       and layouts, so the test compares it tensor by tensor with torch's .grad).
//   layup_model_tool train MODEL_DIR TOKENS B T STEPS ACCUM LR MIN_LR WARMUP WD CLIP OUT_DIR
//       STEPS updates of the gpu schedule (AdamW betas 0.9/0.95, eps 1e-8, warmup + cosine);
//       writes the parameters to OUT_DIR/model/ and losses/grad norms to
//       OUT_DIR/losses.safetensors.
//   layup_model_tool loss MODEL_DIR TOKENS B T
//       prints the mean loss of one batch.
//   layup_model_tool save-sharded MODEL_DIR OUT_DIR MAX_SHARD_BYTES [CHUNK_BYTES]
//       loads MODEL_DIR (streamed, tensor by tensor) and saves it sharded into OUT_DIR, reading
//       the parameters back in chunks (default 64 MiB); prints the largest piece the save asked
//       for and the largest the load handed over, in floats.
//   layup_model_tool target
//       prints the compute target the others use, or fails saying why it is not usable.
//
// The compute target is --device/--dtype as in `layup train`, taken from the environment:
// LAYUP_ORACLE_DEVICE (default cpu) and LAYUP_ORACLE_DTYPE (default fp32).
// TOKENS is raw little-endian int32: for each micro-batch, B*T inputs then B*T targets.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "engine/backend_factory.h"
#include "io/hf_checkpoint.h"
#include "io/safetensors.h"
#include "optim/lr_schedule.h"
#include "schedule/schedule.h"

namespace {

using namespace layup;

std::vector<int32_t> read_tokens(const std::string& path, size_t expected) {
  std::ifstream in(path, std::ios::binary);
  LAYUP_CHECK(in, "cannot open ", path);
  std::vector<int32_t> tokens(expected);
  in.read(reinterpret_cast<char*>(tokens.data()), expected * sizeof(int32_t));
  LAYUP_CHECK(in.gcount() == static_cast<std::streamsize>(expected * sizeof(int32_t)), path,
              " holds fewer than ", expected, " tokens");
  return tokens;
}

ComputeTarget oracle_target() {
  const char* device = std::getenv("LAYUP_ORACLE_DEVICE");
  const char* dtype = std::getenv("LAYUP_ORACLE_DTYPE");
  return resolve_compute_target(
      {parse_in(kDeviceNames, device ? device : "cpu", "LAYUP_ORACLE_DEVICE"),
       parse_in(kDtypeNames, dtype ? dtype : "fp32", "LAYUP_ORACLE_DTYPE")});
}

// Copies `count` floats from the target's memory to the host.
std::vector<float> to_host(Device& device, const float* data, size_t count) {
  std::vector<float> host(count);
  device.copy_to_host(host.data(), data, count);
  return host;
}

TokenBatch micro_batch(const std::vector<int32_t>& tokens, int index, int B, int T) {
  const size_t n = static_cast<size_t>(B) * T;
  return TokenBatch{tokens.data() + 2 * n * index, tokens.data() + 2 * n * index + n, B, T};
}

int grads(char** argv) {
  const LoadedModel model = load_hf_model(argv[2]);
  const int B = std::atoi(argv[4]), T = std::atoi(argv[5]);
  const std::string out = argv[6];
  const std::vector<int32_t> tokens = read_tokens(argv[3], 2ull * B * T);
  const ModelConfig& config = model.config;
  const ParameterLayout layout(config);
  BackendAndDevice compute = make_backend(oracle_target(), config, B, T);
  const size_t n = layout.total_count();
  DeviceBuffer params_buffer = compute.device->allocate(n, TensorClass::kWeights);
  DeviceBuffer grad_buffer = compute.device->allocate(n, TensorClass::kWeightGrads);
  compute.device->copy_to_device(params_buffer.data(), model.params.data(), n);
  const ParameterPointers params = layout.pointers<const float>(params_buffer.data());
  const GradientPointers g = layout.pointers(grad_buffer.data());

  ModelBackend& backend = *compute.backend;
  const float loss = backend.forward(params, micro_batch(tokens, 0, B, T));
  // Logits over the real vocabulary only, copied out of the padded rows before the backward
  // (a backend may turn them into their gradient in place).
  const size_t V = config.vocab_size, Vp = config.padded_vocab_size;
  std::vector<float> logits(static_cast<size_t>(B) * T * V);
  const float* padded_logits = backend.logits();
  for (size_t row = 0; row < static_cast<size_t>(B) * T; ++row)
    std::copy_n(padded_logits + row * Vp, V, logits.data() + row * V);
  backend.backward_head(params, g.final_norm, g.embeddings, 1.0f);
  for (int layer = config.n_layer - 1; layer >= 0; --layer)
    backend.backward_block(layer, params, g.blocks[layer]);
  backend.backward_embeddings(params, g.embeddings);

  std::filesystem::create_directories(out);
  save_hf_model(out + "/grads", config, layout,
                to_host(*compute.device, grad_buffer.data(), n).data());
  const std::vector<SafetensorsTensor> outputs{
      {"logits", {static_cast<size_t>(B), static_cast<size_t>(T), V}, logits.data(), {}},
      {"loss", {1}, &loss, {}}};
  write_safetensors(out + "/outputs.safetensors", outputs);
  return 0;
}

int train(char** argv) {
  const LoadedModel model = load_hf_model(argv[2]);
  const int B = std::atoi(argv[4]), T = std::atoi(argv[5]);
  const int steps = std::atoi(argv[6]), accum = std::atoi(argv[7]);
  const LrSchedule lr{std::strtof(argv[8], nullptr), std::strtof(argv[9], nullptr),
                      std::atoi(argv[10]), steps};
  const float weight_decay = std::strtof(argv[11], nullptr), clip = std::strtof(argv[12], nullptr);
  const std::string out = argv[13];
  const std::vector<int32_t> tokens = read_tokens(argv[3], 2ull * B * T * steps * accum);
  const ParameterLayout layout(model.config);
  BackendAndDevice compute = make_backend(oracle_target(), model.config, B, T);
  auto schedule =
      make_schedule(Mode::kGpu, std::move(compute.backend), std::move(compute.device), layout);
  const size_t n = layout.total_count();
  schedule->import_tensors({model.params, std::vector<float>(n), std::vector<float>(n)});

  std::vector<float> losses, norms, clip_factors;
  for (int step = 0; step < steps; ++step) {
    std::vector<TokenBatch> batches;
    for (int i = 0; i < accum; ++i) batches.push_back(micro_batch(tokens, step * accum + i, B, T));
    UpdateSettings settings;
    settings.adamw.hyper = {lr.at(step), 0.9f, 0.95f, 1e-8f, weight_decay};
    settings.adamw.t = step + 1;
    settings.clip_max_norm = clip;
    const StepStats stats = schedule->step(batches, settings);
    LAYUP_CHECK(stats.applied, "step ", step, " was not applied");
    losses.push_back(stats.loss);
    norms.push_back(static_cast<float>(stats.grad_norm));
    clip_factors.push_back(stats.clip_factor);
  }
  std::filesystem::create_directories(out);
  save_hf_model(out + "/model", model.config, layout, schedule->export_tensors().params.data());
  const size_t s = steps;
  const std::vector<SafetensorsTensor> outputs{{"loss", {s}, losses.data(), {}},
                                               {"grad_norm", {s}, norms.data(), {}},
                                               {"clip_factor", {s}, clip_factors.data(), {}}};
  write_safetensors(out + "/losses.safetensors", outputs);
  return 0;
}

int loss(char** argv) {
  const LoadedModel model = load_hf_model(argv[2]);
  const int B = std::atoi(argv[4]), T = std::atoi(argv[5]);
  const std::vector<int32_t> tokens = read_tokens(argv[3], 2ull * B * T);
  const ParameterLayout layout(model.config);
  BackendAndDevice compute = make_backend(oracle_target(), model.config, B, T);
  const size_t n = layout.total_count();
  DeviceBuffer params = compute.device->allocate(n, TensorClass::kWeights);
  compute.device->copy_to_device(params.data(), model.params.data(), n);
  const float value = compute.backend->forward(layout.pointers<const float>(params.data()),
                                               micro_batch(tokens, 0, B, T));
  std::printf("%.9g\n", value);
  return 0;
}

int save_sharded(int argc, char** argv) {
  const std::string in = argv[2], out = argv[3];
  const size_t max_shard_bytes = std::strtoull(argv[4], nullptr, 10);
  const size_t chunk_bytes =
      argc > 5 ? std::strtoull(argv[5], nullptr, 10) : kDefaultStreamChunkBytes;
  const ModelConfig config = read_hf_model_config(in);
  const ParameterLayout layout(config);
  std::vector<float> params(layout.total_count());
  size_t largest_write = 0, largest_read = 0;
  load_hf_model_streamed(
      in, config,
      [&](size_t offset, size_t count, const float* values) {
        largest_write = std::max(largest_write, count);
        std::copy_n(values, count, params.data() + offset);
      },
      chunk_bytes);
  save_hf_model_sharded(
      out, config, layout,
      [&](size_t offset, size_t count, float* values) {
        largest_read = std::max(largest_read, count);
        std::copy_n(params.data() + offset, count, values);
      },
      max_shard_bytes, chunk_bytes);
  std::printf("%zu %zu\n", largest_read, largest_write);
  return 0;
}

int target() {
  const ComputeTarget resolved = oracle_target();
  std::printf("%s %s\n", name_of(resolved.device).c_str(), name_of(resolved.dtype).c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string command = argc > 1 ? argv[1] : "";
    if (command == "grads" && argc == 7) return grads(argv);
    if (command == "train" && argc == 14) return train(argv);
    if (command == "loss" && argc == 6) return loss(argv);
    if (command == "save-sharded" && (argc == 5 || argc == 6)) return save_sharded(argc, argv);
    if (command == "target" && argc == 2) return target();
    std::fprintf(stderr, "usage: see the comment at the top of tests/oracle/model_tool.cpp\n");
    return 2;
  } catch (const layup::Error& error) {
    std::fprintf(stderr, "layup_model_tool: %s\n", error.what());
    return 1;
  }
}
