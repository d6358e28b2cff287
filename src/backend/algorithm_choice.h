// How the CUDA backend picks the algorithm of each cuBLASLt matmul and each cuDNN attention graph
// (--algorithms), and which attention kernel it runs (--attention). A plain header: the CLI, the
// backend factory and the CUDA ops share it.
#pragma once

#include "core/run_choices.h"

namespace layup {

enum class AlgorithmChoice {
  // The libraries' first heuristic answer: the same algorithm, so the same bits, in every run.
  kHeuristic,
  // Time the candidates on a problem's first call and keep the fastest (as cuDNN's benchmark mode
  // and PyTorch's TunableOp do): cuBLASLt's first 8 heuristic answers, every plan cuDNN builds
  // for the attention graph. The first step runs each product a few more times and waits for
  // them; on a busy GPU the choice can differ between runs, and two algorithms may round
  // differently, so two runs give the same bits only where they chose alike. Matmuls that add
  // into their output (beta != 0) keep the heuristic's answer: a trial would add again.
  kTimed,
};

inline constexpr EnumNames<AlgorithmChoice, 2> kAlgorithmChoiceNames = {
    {{AlgorithmChoice::kHeuristic, "heuristic"}, {AlgorithmChoice::kTimed, "timed"}}};
inline std::string name_of(AlgorithmChoice choice) {
  return name_in(kAlgorithmChoiceNames, choice);
}

// Which kernel the CUDA backend's bf16 attention runs (--attention, or LAYUP_ATTENTION): cuDNN's
// fused attention where this build and machine have it (auto), cuDNN or fail (cudnn), or layup's
// own kernel (layup). fp32 always runs layup's kernel.
enum class AttentionChoice { kAuto, kCudnn, kLayup };

inline constexpr EnumNames<AttentionChoice, 3> kAttentionChoiceNames = {
    {{AttentionChoice::kAuto, "auto"},
     {AttentionChoice::kCudnn, "cudnn"},
     {AttentionChoice::kLayup, "layup"}}};
inline std::string name_of(AttentionChoice choice) {
  return name_in(kAttentionChoiceNames, choice);
}

}  // namespace layup
