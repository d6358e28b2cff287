// Token + position embedding, forward and backward.
//
// The backward is a scatter: the same token can appear at many positions, so parallelizing over
// positions would race on dwte rows. Instead each thread owns a slice of the channels and walks
// every position. Each gradient row is summed in double, in a fixed order, and added to the
// caller's gradient once: the result is the same for any thread count, and a repeated backward
// adds exactly the same amount again.
#include "backend/cpu/ops/embedding.h"

#include <algorithm>
#include <cstddef>
#include <numeric>
#include <vector>

#include "backend/cpu/ops/thread_split.h"

namespace layup {

void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B,
                       int T, int C) {
#pragma omp parallel for schedule(static)
  for (int position = 0; position < B * T; ++position) {
    const int t = position % T;
    const float* token_row = wte + static_cast<size_t>(tokens[position]) * C;
    float* out_row = out + static_cast<size_t>(position) * C;
    if (!wpe) {
      std::copy_n(token_row, C, out_row);
      continue;
    }
    const float* position_row = wpe + static_cast<size_t>(t) * C;
    for (int c = 0; c < C; ++c) out_row[c] = token_row[c] + position_row[c];
  }
}

void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B,
                        int T, int C) {
  // Positions grouped by token (in position order within a token), so each token's rows are
  // summed first and added to dwte once.
  std::vector<int> by_token(B * T);
  std::iota(by_token.begin(), by_token.end(), 0);
  std::stable_sort(by_token.begin(), by_token.end(),
                   [tokens](int a, int b) { return tokens[a] < tokens[b]; });
#pragma omp parallel
  {
    const IndexRange channels = my_share(C, 8);
    std::vector<double> sum(channels.size());
    auto add_row = [&](const float* row) {
      for (int c = channels.begin; c < channels.end; ++c) sum[c - channels.begin] += row[c];
    };
    auto flush_into = [&](float* row) {
      for (int c = channels.begin; c < channels.end; ++c) {
        row[c] += static_cast<float>(sum[c - channels.begin]);
        sum[c - channels.begin] = 0.0;
      }
    };
    for (int i = 0; i < B * T;) {
      const int32_t token = tokens[by_token[i]];
      for (; i < B * T && tokens[by_token[i]] == token; ++i)
        add_row(dout + static_cast<size_t>(by_token[i]) * C);
      flush_into(dwte + static_cast<size_t>(token) * C);
    }
    for (int t = 0; dwpe && t < T; ++t) {
      for (int b = 0; b < B; ++b) add_row(dout + (static_cast<size_t>(b) * T + t) * C);
      flush_into(dwpe + static_cast<size_t>(t) * C);
    }
  }
}

}  // namespace layup
