// Token + position embedding on the GPU. Same math as the CPU op (backend/cpu/ops/embedding.h);
// activations are T (float or __nv_bfloat16), the weight gradients fp32.
//
// The backward is a scatter into dwte: positions that share a token add into one row. To keep it
// deterministic without float atomics, the positions are grouped by token on the host (the token
// ids are there anyway, in the batch) into an EmbeddingBackwardPlan, uploaded once per batch;
// the kernel then gives each distinct token one block that sums its positions in a fixed order.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

namespace layup::cuda {

// The positions of a [B,T] token batch grouped by token id.
struct EmbeddingBackwardPlan {
  std::vector<int32_t> positions;      // [B*T]: positions sorted by token, ascending within a token
  std::vector<int32_t> segment_start;  // [segments + 1]: the positions of token k are
                                       // positions[segment_start[k] .. segment_start[k+1])
  std::vector<int32_t> segment_token;  // [segments]: the token id of each segment
  int segments() const { return static_cast<int>(segment_token.size()); }
};

// Groups the B*T tokens (host memory) by id. O(BT log BT).
EmbeddingBackwardPlan make_embedding_backward_plan(const int32_t* tokens, int count);

// out[b,t,:] = wte[tokens[b,t], :] + wpe[t, :]; wpe may be null (no position table: the Llama
// family). tokens in device memory.
template <class T>
void embedding_forward(T* out, const int32_t* tokens, const T* wte, const T* wpe, int B, int T_,
                       int C, cudaStream_t stream);

// dwte[tokens[b,t], :] += dout[b,t,:];  dwpe[t, :] += sum_b dout[b,t,:]   (accumulates; dwpe
// may be null)
// The plan's three arrays, uploaded to device memory: positions [B*T], segment_start
// [segments + 1], segment_token [segments]. Each gradient row is summed in fp32 in a fixed order
// and added once: the result is bitwise reproducible.
template <class T>
void embedding_backward(float* dwte, float* dwpe, const T* dout, const int32_t* positions,
                        const int32_t* segment_start, const int32_t* segment_token, int segments,
                        int B, int T_, int C, cudaStream_t stream);

}  // namespace layup::cuda
