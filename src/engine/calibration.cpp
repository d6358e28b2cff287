// Measuring and caching the machine's rates (calibration.h).
#include "engine/calibration.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "io/atomic_file.h"
#include "memory/host_memory_need.h"
#include "model/init.h"
#include "model/parameter_layout.h"
#include "model/shape_limits.h"
#include "model/token_batch.h"
#include "optim/adamw_moments.h"
#include "optim/adamw_state.h"
#include "optim/adamw_timing.h"
#include "optim/host_adamw.h"
#include "tier/disk_throughput.h"

namespace layup {

namespace {

constexpr int kFormatVersion = 1;

// The file's name of each rate, and where it goes.
struct RateField {
  const char* key;
  std::optional<double> MachineRates::*rate;
};
constexpr RateField kRateFields[] = {
    {"gpu_flops", &MachineRates::gpu_flops},
    {"gpu_block_flops", &MachineRates::gpu_block_flops},
    {"gpu_head_flops", &MachineRates::gpu_head_flops},
    {"gpu_adamw_params_per_s", &MachineRates::gpu_adamw_params_per_s},
    {"cpu_adamw_params_per_s", &MachineRates::cpu_adamw_params_per_s},
    {"cpu_adamw_alone_params_per_s", &MachineRates::cpu_adamw_alone_params_per_s},
    {"gpu_adamw_bf16_params_per_s", &MachineRates::gpu_adamw_bf16_params_per_s},
    {"cpu_adamw_bf16_params_per_s", &MachineRates::cpu_adamw_bf16_params_per_s},
    {"cpu_adamw_bf16_alone_params_per_s", &MachineRates::cpu_adamw_bf16_alone_params_per_s},
    {"gpu_adamw_8bit_params_per_s", &MachineRates::gpu_adamw_8bit_params_per_s},
    {"cpu_adamw_8bit_params_per_s", &MachineRates::cpu_adamw_8bit_params_per_s},
    {"cpu_adamw_8bit_alone_params_per_s", &MachineRates::cpu_adamw_8bit_alone_params_per_s},
    {"host_add_floats_per_s", &MachineRates::host_add_floats_per_s},
    {"d2h_bytes_per_s", &MachineRates::d2h_bytes_per_s},
    {"h2d_bytes_per_s", &MachineRates::h2d_bytes_per_s},
    {"disk_read_bytes_per_s", &MachineRates::disk_read_bytes_per_s},
    {"disk_write_bytes_per_s", &MachineRates::disk_write_bytes_per_s},
    {"disk_mixed_bytes_per_s", &MachineRates::disk_mixed_bytes_per_s},
};

double median_of(std::vector<double> values) {
  return summarize_timing(std::move(values)).median_s;
}

// The median seconds of `repeats` calls of `work` after one untimed, more calls while they have
// taken less than min_seconds together.
template <class Work>
double median_seconds(int repeats, Work work, double min_seconds = 0.0) {
  work();
  std::vector<double> seconds;
  double total_s = 0.0;
  for (int i = 0; i < repeats || total_s < min_seconds; ++i) {
    const auto start = std::chrono::steady_clock::now();
    work();
    seconds.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    total_s += seconds.back();
  }
  return median_of(seconds);
}

void say(FILE* log, const std::string& what, double value, const char* unit) {
  if (log) std::fprintf(log, "  %-44s %10.3g %s\n", what.c_str(), value, unit);
}

// The median seconds of forward and backward of `layout`'s model (the options' model cut to a
// few blocks), with the whole gradient in device memory.
double time_training(const CalibrationOptions& options, BackendAndDevice& compute,
                     const ParameterLayout& layout) {
  ModelBackend& backend = *compute.backend;
  Device& device = *compute.device;
  const ModelConfig& config = layout.config();
  std::vector<float> initial(layout.total_count());
  init_parameters(layout, initial.data(), 1337);
  const DeviceBuffer params = device.allocate(layout.total_count(), TensorClass::kWeights);
  device.copy_to_device(params.data(), initial.data(), initial.size());
  const DeviceBuffer grads = device.allocate(layout.total_count(), TensorClass::kWeightGrads);
  const ParameterPointers p = layout.pointers<const float>(params.data());
  const GradientPointers g = layout.pointers(grads.data());
  const size_t tokens = static_cast<size_t>(options.batch) * options.seq_len;
  std::vector<int32_t> ids(tokens);
  for (size_t i = 0; i < tokens; ++i) ids[i] = static_cast<int32_t>((i * 7919) % config.vocab_size);
  const TokenBatch batch{ids.data(), ids.data(), options.batch, options.seq_len};
  return median_seconds(options.repeats, [&] {
    backend.forward(p, batch);
    backend.backward_head(p, g.final_norm, g.embeddings, 1.0f);
    for (int layer = config.n_layer - 1; layer >= 0; --layer)
      backend.backward_block(layer, p, g.blocks[layer]);
    backend.backward_embeddings(p, g.embeddings);
    device.wait_for(*device.fence());
  });
}

// The fp32 AdamW rates and each compact kind's, where MachineRates keeps them.
struct AdamWRateFields {
  OptimizerStateKind kind;
  std::optional<double> MachineRates::*gpu;
  std::optional<double> MachineRates::*cpu;
  std::optional<double> MachineRates::*cpu_alone;
};
constexpr AdamWRateFields kAdamWRateFields[] = {
    {OptimizerStateKind::kFp32, &MachineRates::gpu_adamw_params_per_s,
     &MachineRates::cpu_adamw_params_per_s, &MachineRates::cpu_adamw_alone_params_per_s},
    {OptimizerStateKind::kBf16, &MachineRates::gpu_adamw_bf16_params_per_s,
     &MachineRates::cpu_adamw_bf16_params_per_s, &MachineRates::cpu_adamw_bf16_alone_params_per_s},
    {OptimizerStateKind::kBlockwise8Bit, &MachineRates::gpu_adamw_8bit_params_per_s,
     &MachineRates::cpu_adamw_8bit_params_per_s, &MachineRates::cpu_adamw_8bit_alone_params_per_s},
};

// The floats of one buffer holding `count` parameters' moments of `kind`.
size_t moment_floats(OptimizerStateKind kind, size_t count) {
  return optimizer_moments_padded_bytes(kind, count) / sizeof(float);
}

// A rate's name in the log: "CPU AdamW", "CPU AdamW (8bit moments)".
std::string adamw_what(const std::string& what, OptimizerStateKind kind) {
  return kind == OptimizerStateKind::kFp32 ? what : what + " (" + name_of(kind) + " moments)";
}

// The device's AdamW on one block span with moments of `kind`.
double measure_gpu_adamw(const CalibrationOptions& options, Device& device,
                         const ParameterLayout& layout, OptimizerStateKind kind) {
  const Span& span = layout.spans()[1];
  DeviceBuffer params = device.allocate(span.count, TensorClass::kMasterWeights);
  DeviceBuffer grads = device.allocate(span.count, TensorClass::kWeightGrads);
  DeviceBuffer moments =
      device.allocate(moment_floats(kind, span.count), TensorClass::kOptimizerMoments);
  device.fill_zero(moments.data(), moments.count());
  const AdamWMoments state = AdamWMoments::in_buffer(kind, moments.data(), span.count);
  AdamWStep step;
  step.hyper = {1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f};
  const double seconds = median_seconds(options.repeats, [&] {
    ++step.t;
    device.adamw_update_span_state(layout, span, params.data(), grads.data(), state, step, nullptr);
    device.wait_for(*device.fence());
  });
  return static_cast<double>(span.count) / seconds;
}

}  // namespace

TimedCuts timed_cuts(const CalibrationOptions& options) {
  const int blocks = std::min(options.config.n_layer, options.timed_layers);
  return {blocks, options.config.n_layer >= 2 * blocks ? 2 * blocks : 0};
}

std::optional<FlopRateSplit> split_flop_rate(double cut_flops, double cut_s, double twice_flops,
                                             double twice_s) {
  // The cut twice as deep adds as many blocks again: their FLOPs and time are the difference; the
  // rest of the shallow cut's time is the head's, embeddings' and loss's.
  const double block_flops = twice_flops - cut_flops, block_s = twice_s - cut_s;
  const double head_flops = cut_flops - block_flops, head_s = cut_s - block_s;
  // Timing noise can leave one part at no time or less: then the split says nothing.
  if (!(block_flops > 0.0 && block_s > 0.0 && head_flops > 0.0 && head_s > 0.0)) return {};
  // A head of few FLOPs (a 32000-token vocabulary) has its time as a small difference of two
  // timings, which noise can shrink to nothing (Llama 2 13B's read 2,370 TFLOP/s on an H100, 4.4x
  // its blocks'; GPU heads measure 1.2-1.4x): a head under a tenth of the cut's time at over three
  // times the blocks' rate says nothing. (On a CPU a large head beside tiny blocks is that fast.)
  const double block_rate = block_flops / block_s, head_rate = head_flops / head_s;
  if (head_s < 0.1 * cut_s && head_rate > 3.0 * block_rate) return {};
  return FlopRateSplit{block_rate, head_rate};
}

std::string FlopRateShape::describe() const {
  return "C=" + std::to_string(width) + ", B=" + std::to_string(batch) +
         " x T=" + std::to_string(seq_len) +
         (recompute ? ", recompute " + std::to_string(recompute) : std::string());
}

std::string Calibration::describe() const {
  std::string text = host + ", " + date + ", " + device;
  if (gpu_shape) text += " (FLOP rate at " + gpu_shape->describe() + ")";
  return text;
}

std::string Calibration::shape_note(const FlopRateShape& run) const {
  if (!gpu_shape ||
      (gpu_shape->width == run.width &&
       int64_t{gpu_shape->batch} * gpu_shape->seq_len == int64_t{run.batch} * run.seq_len))
    return "";
  return "note: the FLOP rate was measured at " + gpu_shape->describe() + ", this run is " +
         run.describe() +
         ": GEMMs of another width or row count run at another rate; `layup calibrate` with this "
         "run's model, --batch and --seq-len measures this shape's\n";
}

std::string default_calibration_path() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  if (xdg != nullptr && *xdg != '\0') return std::string(xdg) + "/layup/calibration.json";
  const char* home = std::getenv("HOME");
  LAYUP_CHECK(home != nullptr && *home != '\0',
              "neither XDG_CACHE_HOME nor HOME is set: give the calibration file with "
              "--calibration FILE");
  return std::string(home) + "/.cache/layup/calibration.json";
}

nlohmann::json calibration_json(const Calibration& calibration) {
  nlohmann::json rates = nlohmann::json::object();
  for (const RateField& field : kRateFields)
    if (const std::optional<double>& rate = calibration.rates.*field.rate; rate)
      rates[field.key] = *rate;
  nlohmann::json shape;  // null: not known
  if (const std::optional<FlopRateShape>& at = calibration.gpu_shape; at)
    shape = {{"width", at->width},
             {"batch", at->batch},
             {"seq_len", at->seq_len},
             {"recompute", at->recompute}};
  return {{"layup_calibration", kFormatVersion},
          {"host", calibration.host},
          {"date", calibration.date},
          {"device", calibration.device},
          {"gpu_shape", shape},
          {"disk_dir", calibration.disk_dir},
          {"rates", rates}};
}

Calibration parse_calibration(const std::string& text, const std::string& source) {
  const std::string remedy = "; run `layup calibrate` to write a new one";
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& error) {
    throw Error(source + " is not a layup calibration: not JSON (" + error.what() + ")" + remedy);
  }
  LAYUP_CHECK(json.is_object() && json.contains("layup_calibration"), source,
              " is not a layup calibration: no \"layup_calibration\" field", remedy);
  LAYUP_CHECK(json["layup_calibration"] == kFormatVersion, source,
              " is a layup calibration of "
              "format ",
              json["layup_calibration"].dump(), ", this layup reads ", kFormatVersion, remedy);
  Calibration calibration;
  const auto text_field = [&](const char* key, std::string& out) {
    if (!json.contains(key)) return;
    LAYUP_CHECK(json[key].is_string(), source, ": \"", key, "\" should be a string", remedy);
    out = json[key].get<std::string>();
  };
  text_field("host", calibration.host);
  text_field("date", calibration.date);
  text_field("device", calibration.device);
  // An object since the shape is compared with a run's; files before that kept a line of text,
  // which says nothing comparable, so they read as "shape not known".
  if (json.contains("gpu_shape") && json["gpu_shape"].is_object()) {
    const nlohmann::json& shape = json["gpu_shape"];
    FlopRateShape& out = calibration.gpu_shape.emplace();
    for (const auto& [key, field] :
         {std::pair{"width", &out.width}, std::pair{"batch", &out.batch},
          std::pair{"seq_len", &out.seq_len}, std::pair{"recompute", &out.recompute}}) {
      LAYUP_CHECK(shape.contains(key) && shape[key].is_number_integer() && shape[key] >= 0, source,
                  ": \"gpu_shape\" should hold \"", key, "\" as a non-negative integer", remedy);
      *field = shape[key].get<int>();
    }
  }
  text_field("disk_dir", calibration.disk_dir);
  LAYUP_CHECK(json.contains("rates") && json["rates"].is_object(), source, ": no \"rates\" object",
              remedy);
  for (const auto& [key, value] : json["rates"].items()) {
    const RateField* field = std::find_if(std::begin(kRateFields), std::end(kRateFields),
                                          [&](const RateField& f) { return key == f.key; });
    LAYUP_CHECK(field != std::end(kRateFields), source, ": unknown rate \"", key, "\"", remedy);
    LAYUP_CHECK(value.is_number() && value.get<double>() > 0.0, source, ": rate \"", key,
                "\" should be a positive number, not ", value.dump(), remedy);
    calibration.rates.*field->rate = value.get<double>();
  }
  return calibration;
}

std::optional<Calibration> load_calibration(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    LAYUP_CHECK(!std::filesystem::exists(path), "cannot read the calibration file ", path,
                "; check its permissions");
    return std::nullopt;
  }
  std::stringstream text;
  text << in.rdbuf();
  return parse_calibration(text.str(), path);
}

std::optional<MachineRates> cached_machine_rates() {
  try {
    if (const std::optional<Calibration> calibration = load_calibration(default_calibration_path()))
      return calibration->rates;
  } catch (const Error&) {
  }
  return std::nullopt;
}

void save_calibration(const std::string& path, const Calibration& calibration) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  write_text_atomically(path, calibration_json(calibration).dump(2) + "\n");
}

namespace {

// Spans of up to 64 MiB of params, m and v; at least four, so the two slots take turns and the
// mixed pass has records to read that are not being written.
size_t disk_record_floats(const CalibrationOptions& options) {
  return std::min(size_t{64} << 20, std::max<size_t>(options.disk_bytes / 4, 1 << 20)) / 12;
}

}  // namespace

void check_calibration_host_memory(const CalibrationOptions& options,
                                   const HostMemoryLimit& machine) {
  constexpr size_t kAdamWBytesPerParam = 4 * sizeof(float);  // params, grads, m, v
  // Where the device is the host (the CPU backend) both ends of a copy are host memory.
  const size_t link_buffers = options.target.device == DeviceKind::kCuda ? 1 : 2;
  const size_t adamw_bytes = options.cpu_params > SIZE_MAX / kAdamWBytesPerParam
                                 ? SIZE_MAX
                                 : options.cpu_params * kAdamWBytesPerParam;
  const size_t link_bytes =
      options.link_bytes > SIZE_MAX / link_buffers ? SIZE_MAX : options.link_bytes * link_buffers;
  // The disk measurement's two write and two read slots, and its store's bounce buffer.
  const size_t disk_bytes = options.disk_dir.empty()
                                ? 0
                                : 4 * disk_record_layout(disk_record_floats(options)).bytes +
                                      DiskStateStoreOptions{}.chunk_bytes;
  const size_t usable = machine.usable_bytes();
  const auto add = [](size_t a, size_t b) { return a > SIZE_MAX - b ? SIZE_MAX : a + b; };
  const size_t total = add(add(adamw_bytes, link_bytes), disk_bytes);
  // The flag to lower is the one whose buffers are the larger part of the need.
  const bool adamw_larger = adamw_bytes >= link_bytes;
  const std::string what =
      adamw_larger ? "calibrate's CPU AdamW (--cpu-mparams " +
                         format_flag_value(options.cpu_params / 1e6) + ": 4 arrays of floats)"
                   : "calibrate's copies (--link-mib " +
                         format_flag_value(options.link_bytes / double(1 << 20)) + ", " +
                         std::to_string(link_buffers) + " buffer(s))";
  const std::string fix =
      adamw_larger
          ? "give --cpu-mparams at most " +
                format_flag_value(std::floor(largest_fitting(usable, link_bytes + disk_bytes,
                                                             kAdamWBytesPerParam) /
                                             1e4) /
                                  100)
          : "give --link-mib at most " +
                std::to_string(largest_fitting(usable, adamw_bytes + disk_bytes,
                                               link_buffers * (size_t{1} << 20)));
  check_host_memory_need(total, machine, what, fix);
}

MachineRates measure_machine_rates(const CalibrationOptions& options, FILE* log) {
  LAYUP_CHECK(options.repeats > 0, "--repeats must be positive, not ", options.repeats);
  LAYUP_CHECK(options.timed_layers > 0, "the calibration needs at least one block to time");
  LAYUP_CHECK(options.batch > 0 && options.seq_len > 0, "--batch and --seq-len must be positive");
  MachineRates rates;
  ModelConfig config = options.config;
  const TimedCuts cuts = timed_cuts(options);
  config.n_layer = cuts.blocks;
  validate_config(config);
  LAYUP_CHECK(options.seq_len <= config.n_positions, "--seq-len ", options.seq_len,
              " is longer than the model's context of ", config.n_positions);
  check_shape_limits(config, options.batch, options.seq_len);
  const ParameterLayout layout(config);
  const double tokens = static_cast<double>(options.batch) * options.seq_len;
  const auto executed_flops = [&](const ModelConfig& cut) {
    return tokens * executed_flops_per_token(cut, options.seq_len, options.target.recompute);
  };
  // A cut twice as deep where the model has the blocks, first (so the two cuts' buffers are not
  // on the device together): the blocks and the head run at different rates (the head's GEMM is
  // one wide matrix, a block's are narrower and come with attention and elementwise work), and
  // one blended rate from a shallow cut over-weights the head.
  std::optional<double> twice_s;
  ModelConfig twice = config;
  twice.n_layer = cuts.twice;
  if (cuts.twice > 0) {
    BackendAndDevice compute = make_backend(options.target, twice, options.batch, options.seq_len);
    twice_s = time_training(options, compute, ParameterLayout(twice));
  }
  {
    BackendAndDevice compute = make_backend(options.target, config, options.batch, options.seq_len);
    const double cut_s = time_training(options, compute, layout);
    rates.gpu_flops = executed_flops(config) / cut_s;
    say(log, "device training FLOP rate", *rates.gpu_flops / 1e12, "TFLOP/s");
    if (twice_s) {
      if (const std::optional<FlopRateSplit> split =
              split_flop_rate(executed_flops(config), cut_s, executed_flops(twice), *twice_s)) {
        rates.gpu_block_flops = split->blocks;
        rates.gpu_head_flops = split->head;
        say(log, "  of it the blocks", split->blocks / 1e12, "TFLOP/s");
        say(log, "  the head, embeddings and loss", split->head / 1e12, "TFLOP/s");
      } else if (log) {
        std::fprintf(log,
                     "  (the blocks' and the head's rates apart: timing too noisy to split)\n");
      }
    }
    for (const AdamWRateFields& fields : kAdamWRateFields) {
      rates.*fields.gpu = measure_gpu_adamw(options, *compute.device, layout, fields.kind);
      say(log, adamw_what("device AdamW", fields.kind), *(rates.*fields.gpu) / 1e9, "G params/s");
    }

    Device& device = *compute.device;
    const size_t floats = std::max<size_t>(1, options.link_bytes / sizeof(float));
    const DeviceBuffer on_device = device.allocate(floats, TensorClass::kWeightGrads);
    const DeviceBuffer on_host = device.allocate_host(floats, TensorClass::kWeightGrads);
    const double bytes = static_cast<double>(floats * sizeof(float));
    rates.d2h_bytes_per_s = bytes / median_seconds(options.repeats, [&] {
                              device.copy_to_host(on_host.data(), on_device.data(), floats);
                            });
    say(log, "device to host", *rates.d2h_bytes_per_s / 1e9, "GB/s");
    rates.h2d_bytes_per_s = bytes / median_seconds(options.repeats, [&] {
                              device.copy_to_device(on_device.data(), on_host.data(), floats);
                            });
    say(log, "host to device", *rates.h2d_bytes_per_s / 1e9, "GB/s");

    // The CPU's AdamW and gradient add on the buffers a step runs them on: master weights and
    // gradients in the host memory the device copies (pinned on CUDA), moments pageable. The
    // AdamW is timed twice, with no copies and with copies to and from the device going on the
    // whole time; in a step copies run beside part of each update, so the step's rate lies
    // between the two (docs/time_model.md). The add runs beside the gradients' copies in a step,
    // so it is timed beside them.
    HostAdamWOptions adamw_options;
    adamw_options.workers = options.cpu_workers;
    HostAdamW engine(adamw_options);
    const size_t n = std::max<size_t>(1, options.cpu_params);
    const DeviceBuffer params_buffer = device.allocate_host(n, TensorClass::kMasterWeights);
    const DeviceBuffer grads_buffer = device.allocate_host(n, TensorClass::kWeightGrads);
    float* params = params_buffer.data();
    float* grads = grads_buffer.data();
    // Moments in plain memory, one buffer as a span's (fp32's the largest, so it serves all).
    std::vector<float> moments(moment_floats(OptimizerStateKind::kFp32, n));
    engine.for_each_worker_share(n, [&](size_t begin, size_t end) {
      for (size_t i = begin; i < end; ++i) {
        params[i] = 0.02f * static_cast<float>(static_cast<int>(i % 2001) - 1000) * 1e-3f;
        grads[i] = 1e-3f * params[i];
      }
    });
    const auto adamw_rate = [&](OptimizerStateKind kind) {
      std::fill(moments.begin(), moments.end(), 0.0f);
      const AdamWStateBuffers buffers = AdamWStateBuffers::in_place(
          params, grads, AdamWMoments::in_buffer(kind, moments.data(), n));
      const AdamWTiming timing = time_adamw_updates(
          options.repeats, [&](const AdamWStep& step) { engine.update(buffers, n, step, true); },
          [] {}, options.cpu_seconds);
      return static_cast<double>(n) / timing.median_s;
    };
    // Where the device's memory is the host's (the CPU backend) there are no copies to run beside.
    const bool copies_apart = device.kinds().own != MemoryKind::kHost;
    if (copies_apart)
      for (const AdamWRateFields& fields : kAdamWRateFields) {
        rates.*fields.cpu_alone = adamw_rate(fields.kind);
        say(log, adamw_what("CPU AdamW, no copies beside", fields.kind),
            *(rates.*fields.cpu_alone) / 1e9, "G params/s");
      }
    const std::jthread copies([&](const std::stop_token& stop) {
      while (copies_apart && !stop.stop_requested()) {
        device.copy_to_host(on_host.data(), on_device.data(), floats);
        device.copy_to_device(on_device.data(), on_host.data(), floats);
      }
    });
    for (const AdamWRateFields& fields : kAdamWRateFields) {
      rates.*fields.cpu = adamw_rate(fields.kind);
      say(log, adamw_what(copies_apart ? "CPU AdamW beside copies" : "CPU AdamW", fields.kind),
          *(rates.*fields.cpu) / 1e9, "G params/s");
      if (!copies_apart) rates.*fields.cpu_alone = rates.*fields.cpu;
    }
    // The host's gradient accumulation: one float add per element, split as the workers split it.
    const double add_s = median_seconds(
        options.repeats,
        [&] {
          engine.for_each_worker_share(n, [&](size_t begin, size_t end) {
            for (size_t i = begin; i < end; ++i) grads[i] += params[i];
          });
        },
        options.cpu_seconds);
    rates.host_add_floats_per_s = static_cast<double>(n) / add_s;
    say(log, "host gradient add", *rates.host_add_floats_per_s / 1e9, "G floats/s");
  }
  if (!options.disk_dir.empty()) {
    const size_t record_floats = disk_record_floats(options);
    DiskThroughputBench bench(
        options.disk_dir, record_floats,
        std::max<size_t>(4, options.disk_bytes / disk_record_layout(record_floats).bytes));
    // Each rate is the median of `repeats` passes: a disk's rate moves from one pass to the next.
    std::vector<double> writes, reads, mixed;
    std::string io_mode;
    for (int i = 0; i < options.repeats; ++i) {
      const DiskThroughput disk = bench.measure(DiskStateStoreOptions{});
      writes.push_back(disk.write_bytes_per_s);
      reads.push_back(disk.read_bytes_per_s);
      if (disk.mixed_bytes_per_s > 0) mixed.push_back(disk.mixed_bytes_per_s);
      io_mode = disk.io_mode;
    }
    const auto say_disk = [&](const std::string& what, const std::vector<double>& passes) {
      const double median = median_of(passes);
      const auto [low, high] = std::minmax_element(passes.begin(), passes.end());
      if (log)
        std::fprintf(log, "  %-44s %10.3g GB/s (median of %zu passes, %.2f-%.2f)\n", what.c_str(),
                     median / 1e9, passes.size(), *low / 1e9, *high / 1e9);
      return median;
    };
    rates.disk_read_bytes_per_s = say_disk("disk read (" + io_mode + ")", reads);
    rates.disk_write_bytes_per_s = say_disk("disk write", writes);
    if (!mixed.empty())
      rates.disk_mixed_bytes_per_s = say_disk("disk read and write at once", mixed);
  }
  return rates;
}

StepTimeRequest step_time_request(const MemoryPlanRequest& plan, const StepPlan& step) {
  return {plan.config,
          plan.batch,
          plan.seq_len,
          plan.recompute,
          step,
          plan.optimizer_state,
          plan.dtype == Dtype::kBf16 ? 2 : 4};
}

std::string format_machine_rates(const MachineRates& r) {
  std::string text;
  const auto line = [&](const char* what, const std::optional<double>& rate, double unit,
                        const char* unit_name) {
    char row[128];
    if (rate)
      std::snprintf(row, sizeof row, "  %-44s %10.2f %s\n", what, *rate / unit, unit_name);
    else
      std::snprintf(row, sizeof row, "  %-44s %10s\n", what, "-");
    text += row;
  };
  line("device training FLOP rate", r.gpu_flops, 1e12, "TFLOP/s");
  line("  of it the blocks", r.gpu_block_flops, 1e12, "TFLOP/s");
  line("  the head, embeddings, loss", r.gpu_head_flops, 1e12, "TFLOP/s");
  for (const AdamWRateFields& fields : kAdamWRateFields) {
    line(adamw_what("device AdamW", fields.kind).c_str(), r.*fields.gpu, 1e9, "G params/s");
    line(adamw_what("CPU AdamW", fields.kind).c_str(), r.*fields.cpu, 1e9, "G params/s");
    line(adamw_what("CPU AdamW, no copies beside", fields.kind).c_str(), r.*fields.cpu_alone, 1e9,
         "G params/s");
  }
  line("host gradient add", r.host_add_floats_per_s, 1e9, "G floats/s");
  line("device to host", r.d2h_bytes_per_s, 1e9, "GB/s");
  line("host to device", r.h2d_bytes_per_s, 1e9, "GB/s");
  line("disk read", r.disk_read_bytes_per_s, 1e9, "GB/s");
  line("disk write", r.disk_write_bytes_per_s, 1e9, "GB/s");
  line("disk read and write at once", r.disk_mixed_bytes_per_s, 1e9, "GB/s");
  return text;
}

}  // namespace layup
