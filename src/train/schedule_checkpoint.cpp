// Checkpoints to and from a schedule through one span of host memory; the disk they need.
#include "train/schedule_checkpoint.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <filesystem>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include "core/error.h"
#include "io/hf_checkpoint.h"
#include "memory/memory_accountant.h"
#include "tier/output_file.h"

namespace layup {

namespace {

namespace fs = std::filesystem;

constexpr size_t kNoSpan = std::numeric_limits<size_t>::max();

// kCoded: a compact optimizer state's coded moments, addressed in bytes (coded_moments_offsets).
enum class Field { kParams, kFirstMoment, kSecondMoment, kCoded };

Field field_of(AdamMoment moment) {
  return moment == AdamMoment::kFirst    ? Field::kFirstMoment
         : moment == AdamMoment::kSecond ? Field::kSecondMoment
                                         : Field::kCoded;
}

// The index in layout.spans() of the span holding flat offset `offset`.
size_t span_of(const std::vector<Span>& spans, size_t offset) {
  const auto after = std::upper_bound(spans.begin(), spans.end(), offset,
                                      [](size_t at, const Span& span) { return at < span.offset; });
  return static_cast<size_t>(after - spans.begin()) - 1;
}

// One span's parameters and moments, sized for the largest span.
struct SpanBuffers {
  std::vector<float> params, m, v;
  // A compact kind: the span's coded moments, and where each span's start in the coded stream.
  std::vector<float> coded;
  std::vector<size_t> coded_at;

  SpanBuffers(const ParameterLayout& layout, OptimizerStateKind kind) {
    size_t largest = 0;
    for (const Span& span : layout.spans()) largest = std::max(largest, span.count);
    params.assign(largest, 0.0f);
    if (kind == OptimizerStateKind::kFp32) {
      m.assign(largest, 0.0f);
      v.assign(largest, 0.0f);
      return;
    }
    coded.assign(optimizer_moments_padded_bytes(kind, largest) / sizeof(float), 0.0f);
    coded_at = coded_moments_offsets(layout, kind);
  }
  uint8_t* coded_bytes() { return reinterpret_cast<uint8_t*>(coded.data()); }
  // The span whose coded moments hold byte `offset` of the stream.
  size_t coded_span(size_t offset) const {
    return static_cast<size_t>(std::upper_bound(coded_at.begin(), coded_at.end(), offset) -
                               coded_at.begin()) -
           1;
  }
  float* field(Field which) {
    return which == Field::kParams ? params.data()
                                   : (which == Field::kFirstMoment ? m.data() : v.data());
  }
};

// Answers the writers' reads of the flat layout from the span that holds them, exported whole
// when a read first reaches it. The writers read each tensor in increasing offsets, so a pass over
// the model exports every span once.
class SpanExporter {
 public:
  explicit SpanExporter(const Schedule& schedule)
      : schedule_(schedule), buffers_(schedule.layout(), schedule.optimizer_state()) {}

  void read(Field field, size_t offset, size_t count, float* out) {
    const std::vector<Span>& spans = schedule_.layout().spans();
    if (field == Field::kCoded) return read_coded(offset, count, out);
    while (count > 0) {
      const size_t index = span_of(spans, offset);
      // Only the field asked for: a pass over the weights (or one moment) moves a third of the
      // state (export_span skips the null parts).
      size_t& exported = exported_[static_cast<size_t>(field)];
      if (index != exported) {
        float* part = buffers_.field(field);
        schedule_.export_span(index, {field == Field::kParams ? part : nullptr,
                                      field == Field::kFirstMoment ? part : nullptr,
                                      field == Field::kSecondMoment ? part : nullptr});
        exported = index;
      }
      const Span& span = spans[index];
      const size_t piece = std::min(count, span.offset + span.count - offset);
      std::memcpy(out, buffers_.field(field) + (offset - span.offset), piece * sizeof(float));
      offset += piece;
      out += piece;
      count -= piece;
    }
  }

 private:
  // The coded moments' bytes [offset, offset + count), each as a float of its value.
  void read_coded(size_t offset, size_t count, float* out) {
    size_t& exported = exported_[static_cast<size_t>(Field::kCoded)];
    while (count > 0) {
      const size_t index = buffers_.coded_span(offset);
      if (index != exported) {
        schedule_.export_span(index, {nullptr, nullptr, nullptr, buffers_.coded.data()});
        exported = index;
      }
      const size_t first = offset - buffers_.coded_at[index];
      const size_t piece = std::min(count, buffers_.coded_at[index + 1] - offset);
      const uint8_t* bytes = buffers_.coded_bytes() + first;
      for (size_t i = 0; i < piece; ++i) out[i] = bytes[i];
      offset += piece;
      out += piece;
      count -= piece;
    }
  }

  const Schedule& schedule_;
  SpanBuffers buffers_;
  std::array<size_t, 4> exported_ = {kNoSpan, kNoSpan, kNoSpan, kNoSpan};  // per Field
};

// Takes one pass of the readers' writes (increasing offsets, each element once) and imports each
// span as soon as the pass has filled it: the weights pass with zero moments, then the moments
// pass with those weights, exported back first. import_span takes a span's whole state, and the
// files hold the weights and the moments apart: two passes keep one span in memory, not the model.
class SpanImporter {
 public:
  SpanImporter(Schedule& schedule, SpanBuffers& buffers, bool moments)
      : schedule_(schedule), buffers_(buffers), moments_(moments) {}

  void write(Field field, size_t offset, size_t count, const float* in) {
    const std::vector<Span>& spans = schedule_.layout().spans();
    const bool coded = field == Field::kCoded;
    while (count > 0) {
      const size_t index = coded ? buffers_.coded_span(offset) : span_of(spans, offset);
      if (index != current_) start(index);
      const Span& span = spans[index];
      size_t piece = 0;
      if (coded) {  // bytes, each a float of its value
        const size_t first = offset - buffers_.coded_at[index];
        piece = std::min(count, buffers_.coded_at[index + 1] - offset);
        uint8_t* bytes = buffers_.coded_bytes() + first;
        for (size_t i = 0; i < piece; ++i) bytes[i] = static_cast<uint8_t>(in[i]);
      } else {
        piece = std::min(count, span.offset + span.count - offset);
        std::memcpy(buffers_.field(field) + (offset - span.offset), in, piece * sizeof(float));
      }
      filled_ += piece;
      const size_t full = !moments_ ? span.count
                          : coded   ? buffers_.coded_at[index + 1] - buffers_.coded_at[index]
                                    : 2 * span.count;
      if (filled_ == full) {
        // A compact kind's weights pass imports the coded buffer, zero until the moments pass
        // fills it: fresh moments, as fp32's zero m and v.
        if (buffers_.coded.empty())
          schedule_.import_span(index,
                                {buffers_.params.data(), buffers_.m.data(), buffers_.v.data()});
        else
          schedule_.import_span(index,
                                {buffers_.params.data(), nullptr, nullptr, buffers_.coded.data()});
        current_ = kNoSpan;
        ++imported_;
      }
      offset += piece;
      in += piece;
      count -= piece;
    }
  }

  void check_complete() const {
    LAYUP_CHECK(current_ == kNoSpan && imported_ == schedule_.layout().spans().size(),
                "internal error: the checkpoint reader left spans of the model unwritten");
  }

 private:
  void start(size_t index) {
    LAYUP_CHECK(current_ == kNoSpan && index == imported_,
                "internal error: the checkpoint reader wrote span ", index, " out of order");
    // The weights pass imports the buffers' moments, which only the moments pass writes: zero.
    // The moments pass needs the span's weights back (the moments come from the file).
    if (moments_) schedule_.export_span(index, {buffers_.params.data(), nullptr, nullptr});
    current_ = index;
    filled_ = 0;
  }

  Schedule& schedule_;
  SpanBuffers& buffers_;
  const bool moments_;
  size_t current_ = kNoSpan;
  size_t filled_ = 0;
  size_t imported_ = 0;
};

}  // namespace

SavedCheckpoint save_schedule_checkpoint(const std::string& run_dir, const Schedule& schedule,
                                         const TrainingProgress& progress,
                                         CheckpointContents contents,
                                         const CheckpointWriteOptions& options) {
  SpanExporter exporter(schedule);
  StreamedCheckpoint checkpoint;
  checkpoint.progress = progress;
  checkpoint.progress.optimizer_state = schedule.optimizer_state();  // the moments as kept
  checkpoint.read_params = [&exporter](size_t offset, size_t count, float* out) {
    exporter.read(Field::kParams, offset, count, out);
  };
  if (contents == CheckpointContents::kFull)
    checkpoint.read_moments = [&exporter](AdamMoment moment, size_t offset, size_t count,
                                          float* out) {
      exporter.read(field_of(moment), offset, count, out);
    };
  const ParameterLayout& layout = schedule.layout();
  return save_checkpoint_streamed(run_dir, layout.config(), layout, checkpoint, options);
}

void check_resumable_shape(const CheckpointInfo& info) {
  const ModelConfig& config = info.config;
  // The sizes the run kept beside its settings (train_options.cpp's table, under these keys).
  const std::pair<const char*, int> saved_sizes[] = {
      {"n_layer", config.n_layer},       {"n_head", config.n_head},
      {"n_embd", config.n_embd},         {"n_positions", config.n_positions},
      {"vocab_size", config.vocab_size},
  };
  const nlohmann::json& saved = info.progress.options;
  for (const auto& [key, value] : saved_sizes) {
    if (!saved.contains(key) || !saved[key].is_number_integer()) continue;
    const long long trained = saved[key].get<long long>();
    LAYUP_CHECK(trained == value, "cannot resume ", info.path, ": its ", kHfConfigFileName,
                " describes a model with ", key, " ", value, ", but its training state (",
                info.training_state_path, ") was saved by a run with ", key, " ", trained,
                ": one of the two was changed or comes from another checkpoint. Put back the ",
                kHfConfigFileName, " saved with this checkpoint, or resume from another one");
  }
  // The fields the settings do not keep (a Llama's head widths, say) show in the weights' shapes.
  check_hf_weights(info.path, config);
}

void load_schedule_checkpoint(const CheckpointInfo& info, Schedule& schedule) {
  LAYUP_CHECK(info.has_training_state, info.path,
              " holds model weights only, so a run cannot resume from it");
  const ParameterLayout& layout = schedule.layout();
  if (const std::optional<ShapeDifference> difference =
          first_shape_difference(info.config, layout.config()))
    fail("cannot resume ", info.path, ": its ", kHfConfigFileName, " describes a model with ",
         difference->field, " ", difference->first, ", but the run was built with ",
         difference->second,
         " (from its training state's settings or the command line); put "
         "back the ",
         kHfConfigFileName, " saved with this checkpoint, or resume from another one");
  // Compact moments resume only in their own kind, bit for bit; fp32 ones may be coded into
  // another kind where the run asks for it (a state written before kinds existed, resumed with
  // --optimizer-state bf16|8bit).
  const OptimizerStateKind saved = info.progress.optimizer_state;
  LAYUP_CHECK(saved == OptimizerStateKind::kFp32 || saved == schedule.optimizer_state(),
              "cannot resume ", info.path, ": its optimizer state is ", name_of(saved),
              " and this run keeps ", name_of(schedule.optimizer_state()),
              " moments; resume with --optimizer-state ", name_of(saved));
  SpanBuffers buffers(layout, saved);
  SpanImporter weights(schedule, buffers, false);
  SpanImporter moments(schedule, buffers, true);
  load_checkpoint_streamed(
      info,
      [&weights](size_t offset, size_t count, const float* in) {
        weights.write(Field::kParams, offset, count, in);
      },
      [&](AdamMoment moment, size_t offset, size_t count, const float* in) {
        moments.write(field_of(moment), offset, count, in);
      });
  weights.check_complete();
  moments.check_complete();
}

void load_schedule_weights(const std::string& hf_dir, Schedule& schedule) {
  const ParameterLayout& layout = schedule.layout();
  // Zero moments in the run's own kind: a compact kind's coded zeros go in as they are (as
  // initialize_fresh's), where fp32 zeros would hold 8 bytes a parameter of the largest span and be
  // coded again on the way in.
  SpanBuffers buffers(layout, schedule.optimizer_state());
  SpanImporter weights(schedule, buffers, false);
  load_hf_model_streamed(hf_dir, layout.config(),
                         [&weights](size_t offset, size_t count, const float* in) {
                           weights.write(Field::kParams, offset, count, in);
                         });
  weights.check_complete();
}

CheckpointDiskNeed checkpoint_disk_need(const ParameterLayout& layout, CheckpointContents contents,
                                        size_t max_shard_bytes, int saves, int keep_last,
                                        int existing, WeightsDtype dtype, OptimizerStateKind kind) {
  CheckpointDiskNeed need;
  need.each = checkpoint_bytes(layout, contents == CheckpointContents::kWeights, max_shard_bytes,
                               dtype, kind);
  need.contents = contents;
  need.keep_last = keep_last;
  // Before the i-th save the folder holds min(existing + i - 1, keep_last) checkpoints, during it
  // one more; the folder's own count as the new ones' size (rotation deletes them as it goes).
  if (saves > 0) need.checkpoints = std::max(1, std::min(saves, keep_last + 1 - existing));
  return need;
}

void check_checkpoint_disk(const CheckpointDiskNeed& need, const DiskSpace& space) {
  if (need.bytes() <= space.free_bytes) return;
  const bool full = need.contents == CheckpointContents::kFull;
  std::string each = format_bytes(need.each.total());
  if (full)
    each += " (weights " + format_bytes(need.each.weights) + ", optimizer state " +
            format_bytes(need.each.training_state) + ")";
  std::string at_once = "needs room for one";
  if (need.checkpoints > 1)
    at_once = "holds " + std::to_string(need.checkpoints) +
              " more at once (a new one is written before the oldest beyond --keep-checkpoints " +
              std::to_string(need.keep_last) + " is deleted): " + format_bytes(need.bytes());
  std::string fixes = "Free space there, choose an --out on a larger disk";
  if (need.keep_last > 1 && need.checkpoints > 1) fixes += ", keep fewer (--keep-checkpoints 1)";
  if (full)
    fixes += ", save the weights only (--checkpoint-contents weights: " +
             format_bytes(need.each.weights) + " each, not resumable)";
  fixes += " or train without checkpoints (--no-checkpoints)";
  fail("the run's checkpoints do not fit on the disk of its folder: one takes ", each,
       " and the run ", at_once, ", but ", space.dir, " has ", format_bytes(space.free_bytes),
       " free. ", fixes);
}

void check_checkpoint_file_size_limit(const ParameterLayout& layout, CheckpointContents contents,
                                      size_t max_shard_bytes, std::optional<size_t> limit_bytes) {
  const bool weights_only = contents == CheckpointContents::kWeights;
  const CheckpointFile largest = largest_checkpoint_file(layout, weights_only, max_shard_bytes);
  if (!limit_bytes || largest.bytes <= *limit_bytes) return;
  // A shard holds at least its largest tensor, and a header's allowance of 1 MiB beside it.
  constexpr size_t kHeaderAllowance = size_t{1} << 20;
  std::string fixes;
  if (*limit_bytes >= largest.largest_tensor_bytes + kHeaderAllowance + 1000 * 1000)
    fixes = "cut checkpoints into smaller files with --checkpoint-shard-mb " +
            std::to_string((*limit_bytes - kHeaderAllowance) / (1000 * 1000)) + ", or ";
  check_file_size_limit(largest.bytes, "a checkpoint's largest file (" + largest.name + ")",
                        limit_bytes, fixes + "train without checkpoints (--no-checkpoints)");
}

std::string existing_folder_of(const std::string& dir) {
  fs::path folder = fs::absolute(dir).lexically_normal();
  std::error_code error;
  while (!fs::is_directory(folder, error) && folder.has_parent_path() &&
         folder.parent_path() != folder)
    folder = folder.parent_path();
  return folder.string();
}

}  // namespace layup
