// What the ranks of `layup train` and `layup bench` under mpirun must share, in the order a
// refusal names the first difference (comm/rank_agreement.h): the build, then the flags, then
// the data. docs/parallel.md.
#pragma once

#include <string>
#include <vector>

#include "comm/rank_agreement.h"
#include "data/token_dataset.h"
#include "train/benchmark.h"
#include "train/train_options.h"

namespace layup {

// `options` as train() holds them once a resume took the checkpoint's settings, before it
// changes any for the ranks after 0; `checkpoint` the checkpoint resumed from (empty: a fresh
// run). The data the run reads is compared once found, as describe_shards says it.
std::vector<SharedSetting> train_settings_ranks_share(const TrainOptions& options,
                                                      const std::string& checkpoint);

std::vector<SharedSetting> bench_settings_ranks_share(const BenchmarkOptions& options);

// The data's identity, cheap enough to take on every start: how many shards of each split, their
// bytes, and a digest of their file names and sizes (not of their contents: reading every token
// twice would cost the start of a large run minutes).
std::string describe_shards(const DataFolderShards& shards);

}  // namespace layup
