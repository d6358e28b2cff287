// The model's graph, written once for every backend: GPT-2's and the Llama family's forward and
// block-wise backward as one sequence of ops, which each backend implements with its own kernels
// (CpuOps in backend/cpu/cpu_backend.cpp, CudaOps in backend/cuda/cuda_backend.cu).
//
//   x_0 = wte[tokens] + wpe[0:T]                         (the Llama family: no position table)
//   block l:  h       = norm_1(x)
//             q, k, v = qkv_proj(h);  q, k = rope(q), rope(k)      (rope: the Llama family)
//             mid     = x + o_proj(attention(q, k, v))   (K/V heads shared by groups of q heads)
//             x'      = mid + down_proj(act(up_proj(norm_2(mid))))
//   logits = norm_f(x_L) W^T     W = wte when tied, else lm_head (in the final norm's span)
//   loss   = mean over positions of the cross-entropy over the real vocabulary
//
// GPT-2's norm is LayerNorm and act GELU (up_proj 4C wide); the Llama family's norm is RMSNorm and
// act SwiGLU, silu(gate) * up, with gate and up the two halves of one matmul. Rotary positions are
// applied to the saved qkv in place; the rotation is linear, so its backward needs only the angles.
//
// A residual add passes its gradient to both summands unchanged, so the backward never copies the
// residual stream's gradient: d_residual is the gradient of a block's output and of its branches'
// outputs at once, and each norm's input gradient is added into it.
//
// The ops. An Ops is a plain class (no virtual call per op) bound to one batch's Shape, to the
// backend's buffers (the tokens and targets of the batch; whatever its attention saves) and, on
// CUDA, to its stream. Rows are the B*T positions and widths the Shape's; activations and their
// gradients have the backend's element type, weight gradients are fp32. The backward ops OVERWRITE
// their outputs, except where marked "adds".
//
//   embedding_forward(out, wte, wpe)           out = wte[tokens] + wpe[t]; wpe null: none
//   norm_forward(out, mean, rstd, x, w, b)     the model's norm; mean and b unused by RMSNorm
//   residual_forward(sum, x, branch)           sum = x + branch
//   residual_norm_forward(sum, out, mean, rstd, x, branch, w, b, before_norm)
//                                              residual_forward, then norm_forward of sum; calls
//                                              before_norm() once, before its first read of w
//   matmul_forward(out, in, w, b, in_w, out_w)                 out = in w^T + b; b may be null
//   matmul_activation_forward(act, pre, in, w, b, in_w, out_w) pre = in w^T + b, act = act(pre)
//   activation_forward(act, pre)
//   rope_forward(qkv)                          rotates q's and k's heads in place
//   attention_forward(a)                       a.qkv to a.att_out, saving in a what its backward
//                                              reads (the CPU: the probabilities; CUDA: the
//                                              log-sum-exp of each score row)
//   matmul_backward(din, dw, db, dout, in, w, in_w, out_w)     db may be null
//   matmul_activation_backward(d_pre, d_act, dw, db, dout, act, pre, w, in_w, out_w)
//                                              matmul_backward of a layer whose input was
//                                              act = act(pre), then act's backward into d_pre;
//                                              d_act is scratch (unused where the two are fused)
//   norm_backward(din, dw, db, dout, x, w, mean, rstd)         adds to din (d_residual)
//   attention_backward(dqkv, dout, a)
//   rope_backward(dqkv)                        in place
//   lm_head_backward(d_in, dw, logits, logsumexp, targets, in, w, dloss)
//                                              the cross-entropy's gradient (dloss per position)
//                                              through logits = in w^T: d_in and dw
//   embedding_backward(dwte, dwpe, dout)       adds
//   zero(activations, count), zero_gradient(gradient, count)
//
// Which backend fuses what is its own business: CUDA runs GPT-2's residual_norm_forward as one
// kernel and (in bf16) its GELU inside the matmuls' epilogues; the CPU runs each as two ops.
//
// The buffers are the backend's arena, whose members have the same names on every backend
// (residual[l], blocks[l].ln_1 ... fc_gelu, ln_f, logits, the d_* gradients). --recompute (CUDA
// only; 0 on the CPU) makes some of them shared by every block (cuda_backend_buffers.h): the
// backward then writes each again, from the block's own inputs, right before it reads it.
#pragma once

#include <cstddef>

#include "backend/model_backend.h"
#include "model/model_config.h"
#include "model/parameter_layout.h"

namespace layup::graph {

enum class Norm { kLayerNorm, kRmsNorm };
enum class Activation { kGelu, kSwiglu };

// The sizes one forward and its backward run at.
struct Shape {
  int B = 0, T = 0, rows = 0;  // sequences, positions per sequence, B*T
  int C = 0, L = 0;            // width, blocks
  int heads = 0, kv_heads = 0, head_dim = 0;
  // Widths per position of the fused q,k,v projection, of the attention's output (the heads
  // merged), of the MLP's first matmul and of its activation: GPT-2 3C, C, 4C, 4C; the Llama
  // family (heads + 2 kv_heads) head_dim, heads head_dim, 2I, I.
  int qkv = 0, att = 0, fc = 0, act = 0;
  int V = 0, Vp = 0;  // the vocabulary, and padded
  float eps = 0;
  Norm norm = Norm::kLayerNorm;
  Activation activation = Activation::kGelu;
  bool rotary = false;     // rotary positions (no position table)
  bool tied_head = false;  // the LM head is wte
};

inline Shape shape_of(const ModelConfig& config, int B, int T) {
  const bool llama = config.is_llama();
  Shape s;
  s.B = B;
  s.T = T;
  s.rows = B * T;
  s.C = config.n_embd;
  s.L = config.n_layer;
  s.heads = config.n_head;
  s.kv_heads = config.kv_heads();
  s.head_dim = config.head_dim();
  s.qkv = config.qkv_width();
  s.att = config.n_head * config.head_dim();
  s.fc = (llama ? 2 : 1) * config.mlp_width();
  s.act = config.mlp_width();
  s.V = config.vocab_size;
  s.Vp = config.padded_vocab_size;
  s.eps = config.layer_norm_epsilon;
  s.norm = llama ? Norm::kRmsNorm : Norm::kLayerNorm;
  s.activation = llama ? Activation::kSwiglu : Activation::kGelu;
  s.rotary = llama;
  s.tied_head = config.tie_word_embeddings;
  return s;
}

// A tensor of the span at `base`, or null where the model has none (kAbsent).
template <class T>
T* tensor_at(T* base, size_t offset) {
  return offset == kAbsent ? nullptr : base + offset;
}

// Block `layer` from its first norm's output (blocks[layer].ln_1) up to its MLP's activation
// (fc_gelu): every activation the block's backward reads. `x` is the block's input.
template <class Ops, class Arena, class W, class A>
void block_forward_to_activation(Ops& ops, const Shape& s, const BlockOffsets& o, int layer,
                                 const W* p, Arena& arena, const A* x) {
  auto& a = arena.blocks[layer];
  ops.matmul_forward(a.qkv, a.ln_1, p + o.attn_qkv_weight, tensor_at(p, o.attn_qkv_bias), s.C,
                     s.qkv);
  // q's and k's heads are adjacent in each row: one rotation covers both, v is left alone.
  if (s.rotary) ops.rope_forward(a.qkv);
  ops.attention_forward(a);
  ops.matmul_forward(arena.branch_out, a.att_out, p + o.attn_proj_weight,
                     tensor_at(p, o.attn_proj_bias), s.att, s.C);
  ops.residual_norm_forward(a.residual_mid, a.ln_2, a.ln_2_mean, a.ln_2_rstd, x, arena.branch_out,
                            p + o.ln_2_weight, tensor_at(p, o.ln_2_bias), [] {});
  ops.matmul_activation_forward(a.fc_gelu, a.fc, a.ln_2, p + o.mlp_fc_weight,
                                tensor_at(p, o.mlp_fc_bias), s.C, s.fc);
}

// The forward from the tokens to the logits (the loss is the backend's: it reads it back).
// Each norm after the first is the second half of residual_norm_forward, whose residual add
// ends the block before: so block l+1's hook (and the final norm's) runs inside the op that ends
// block l, right before the norm reads its weights (ForwardHooks).
template <class Ops, class Arena, class W>
void forward(Ops& ops, const Shape& s, const ParameterLayout& layout,
             const SpanPointers<const W>& w, Arena& arena, ForwardHooks& hooks) {
  const BlockOffsets& o = layout.block();
  const EmbeddingOffsets& e = layout.embeddings();
  const FinalNormOffsets& f = layout.final_norm();
  hooks.before_embeddings();
  ops.embedding_forward(arena.residual[0], w.embeddings + e.wte, tensor_at(w.embeddings, e.wpe));
  hooks.before_block(0);
  auto& first = arena.blocks[0];
  ops.norm_forward(first.ln_1, first.ln_1_mean, first.ln_1_rstd, arena.residual[0],
                   w.blocks[0] + o.ln_1_weight, tensor_at(w.blocks[0], o.ln_1_bias));
  for (int l = 0; l < s.L; ++l) {
    const W* p = w.blocks[l];
    auto& a = arena.blocks[l];
    block_forward_to_activation(ops, s, o, l, p, arena, arena.residual[l]);
    ops.matmul_forward(arena.branch_out, a.fc_gelu, p + o.mlp_proj_weight,
                       tensor_at(p, o.mlp_proj_bias), s.act, s.C);
    if (l + 1 < s.L) {
      auto& next = arena.blocks[l + 1];
      const W* next_p = w.blocks[l + 1];
      ops.residual_norm_forward(arena.residual[l + 1], next.ln_1, next.ln_1_mean, next.ln_1_rstd,
                                a.residual_mid, arena.branch_out, next_p + o.ln_1_weight,
                                tensor_at(next_p, o.ln_1_bias), [&] { hooks.before_block(l + 1); });
    } else {
      ops.residual_norm_forward(arena.residual[s.L], arena.ln_f, arena.ln_f_mean, arena.ln_f_rstd,
                                a.residual_mid, arena.branch_out, w.final_norm + f.weight,
                                tensor_at(w.final_norm, f.bias), [&] { hooks.before_head(); });
    }
  }
  const W* head = s.tied_head ? w.embeddings + e.wte : w.final_norm + f.lm_head;
  ops.matmul_forward(arena.logits, arena.ln_f, head, nullptr, s.C, s.Vp);
}

// The same forward cut at block boundaries, for a layer-major forward (docs/schedules.md,
// "Layer-major"): block l's forward of every micro-batch runs before block l+1's, each
// micro-batch's residual stream waiting between the calls in a buffer of the caller's. The values
// are forward's, bit for bit where residual_norm_forward is its two ops (the CPU; CUDA's RMSNorm):
// a block's first norm runs in the block's own call, after its hook, on the sum the block before
// wrote, as the backward's --recompute 3 computes it again (CUDA's fused GPT-2 kernel takes a row's
// mean in another order: a float rounding may differ).

// x_0 = the embeddings of the tokens, into `out`.
template <class Ops, class W, class A>
void forward_embeddings(Ops& ops, const ParameterLayout& layout, const SpanPointers<const W>& w,
                        A* out, ForwardHooks& hooks) {
  const EmbeddingOffsets& e = layout.embeddings();
  hooks.before_embeddings();
  ops.embedding_forward(out, w.embeddings + e.wte, tensor_at(w.embeddings, e.wpe));
}

// Block `layer` from its input `x` to its output `out` (which may be `x`: x is read last by the
// attention branch's residual add, before out is written).
template <class Ops, class Arena, class W, class A>
void forward_block(Ops& ops, const Shape& s, const BlockOffsets& o, int layer, const W* p,
                   Arena& arena, const A* x, A* out, ForwardHooks& hooks) {
  auto& a = arena.blocks[layer];
  hooks.before_block(layer);
  ops.norm_forward(a.ln_1, a.ln_1_mean, a.ln_1_rstd, x, p + o.ln_1_weight,
                   tensor_at(p, o.ln_1_bias));
  block_forward_to_activation(ops, s, o, layer, p, arena, x);
  ops.matmul_forward(arena.branch_out, a.fc_gelu, p + o.mlp_proj_weight,
                     tensor_at(p, o.mlp_proj_bias), s.act, s.C);
  ops.residual_forward(out, a.residual_mid, arena.branch_out);
}

// The final norm and the LM head, from x_L in residual[L] to the logits.
template <class Ops, class Arena, class W>
void forward_head(Ops& ops, const Shape& s, const ParameterLayout& layout,
                  const SpanPointers<const W>& w, Arena& arena, ForwardHooks& hooks) {
  const EmbeddingOffsets& e = layout.embeddings();
  const FinalNormOffsets& f = layout.final_norm();
  hooks.before_head();
  ops.norm_forward(arena.ln_f, arena.ln_f_mean, arena.ln_f_rstd, arena.residual[s.L],
                   w.final_norm + f.weight, tensor_at(w.final_norm, f.bias));
  const W* head = s.tied_head ? w.embeddings + e.wte : w.final_norm + f.lm_head;
  ops.matmul_forward(arena.logits, arena.ln_f, head, nullptr, s.C, s.Vp);
}

// The backward through the loss, the LM head and the final norm: overwrites the final norm's span
// of the gradient (an untied head's included) and the whole embeddings span (a tied head's part
// of wte, zeros elsewhere), and leaves dL/d(x_L) in d_residual. dloss: d(loss)/d(one position's
// loss), the loss scale over the learned positions (B*T when all are); not-learned positions
// (target < 0) get no gradient.
template <class Ops, class Arena, class W>
void backward_head(Ops& ops, const Shape& s, const ParameterLayout& layout,
                   const SpanPointers<const W>& w, Arena& arena, float* final_norm_grad,
                   float* embeddings_grad, float dloss) {
  const EmbeddingOffsets& e = layout.embeddings();
  const FinalNormOffsets& f = layout.final_norm();
  const W* head = s.tied_head ? w.embeddings + e.wte : w.final_norm + f.lm_head;
  float* head_grad = s.tied_head ? embeddings_grad + e.wte : final_norm_grad + f.lm_head;
  ops.lm_head_backward(arena.d_ln, head_grad, arena.logits, arena.logsumexp, arena.targets,
                       arena.ln_f, head, dloss);
  // The rest of the embeddings span (wte comes first in it): backward_embeddings adds into it.
  const size_t written = s.tied_head ? static_cast<size_t>(s.Vp) * s.C : 0;
  ops.zero_gradient(embeddings_grad + written, e.count - written);
  ops.zero(arena.d_residual, static_cast<size_t>(s.rows) * s.C);
  ops.norm_backward(arena.d_residual, final_norm_grad + f.weight,
                    tensor_at(final_norm_grad, f.bias), arena.d_ln, arena.residual[s.L],
                    w.final_norm + f.weight, arena.ln_f_mean, arena.ln_f_rstd);
}

// One block's backward, from dL/d(its output) in d_residual to dL/d(its input) there; overwrites
// g, its weights' gradient (laid out like a block span). `recompute` is the --recompute level:
//   >= 1  the MLP activation's output again, from its saved input;
//   >= 2  also each norm's output, from its input and saved statistics, right before it is read;
//   3     the block's forward up to the activation first, from its input residual[layer] (the
//         last block's activations are still there from the forward, unless `last_kept` is
//         false: the forward of another micro-batch ran since, layer-major accumulation).
// Recomputed values are the forward's, bit for bit, where the backend recomputes with the kernel
// the forward ran (CUDA's bf16 GELU runs in the matmul's epilogue forward: a rounding may differ).
template <class Ops, class Arena, class W>
void backward_block(Ops& ops, const Shape& s, const BlockOffsets& o, int layer, const W* p,
                    float* g, Arena& arena, int recompute, bool last_kept = true) {
  auto& a = arena.blocks[layer];
  const auto* x = arena.residual[layer];
  if (recompute >= 3 && (layer + 1 < s.L || !last_kept)) {
    ops.norm_forward(a.ln_1, a.ln_1_mean, a.ln_1_rstd, x, p + o.ln_1_weight,
                     tensor_at(p, o.ln_1_bias));
    block_forward_to_activation(ops, s, o, layer, p, arena, x);
  }

  // MLP branch. d_residual holds dL/d(block output) = dL/d(MLP output).
  if (recompute >= 1) ops.activation_forward(a.fc_gelu, a.fc);
  ops.matmul_activation_backward(arena.d_fc, arena.d_fc_gelu, g + o.mlp_proj_weight,
                                 tensor_at(g, o.mlp_proj_bias), arena.d_residual, a.fc_gelu, a.fc,
                                 p + o.mlp_proj_weight, s.act, s.C);
  if (recompute >= 2)
    ops.norm_forward(a.ln_2, a.ln_2_mean, a.ln_2_rstd, a.residual_mid, p + o.ln_2_weight,
                     tensor_at(p, o.ln_2_bias));
  ops.matmul_backward(arena.d_ln, g + o.mlp_fc_weight, tensor_at(g, o.mlp_fc_bias), arena.d_fc,
                      a.ln_2, p + o.mlp_fc_weight, s.C, s.fc);
  // Adding norm_2's input gradient turns d_residual into dL/d(mid).
  ops.norm_backward(arena.d_residual, g + o.ln_2_weight, tensor_at(g, o.ln_2_bias), arena.d_ln,
                    a.residual_mid, p + o.ln_2_weight, a.ln_2_mean, a.ln_2_rstd);

  // Attention branch. d_residual holds dL/d(mid) = dL/d(attention branch output).
  ops.matmul_backward(arena.d_att_out, g + o.attn_proj_weight, tensor_at(g, o.attn_proj_bias),
                      arena.d_residual, a.att_out, p + o.attn_proj_weight, s.att, s.C);
  ops.attention_backward(arena.d_qkv, arena.d_att_out, a);
  // From the rotated q and k back to the projection's outputs.
  if (s.rotary) ops.rope_backward(arena.d_qkv);
  if (recompute >= 2)
    ops.norm_forward(a.ln_1, a.ln_1_mean, a.ln_1_rstd, x, p + o.ln_1_weight,
                     tensor_at(p, o.ln_1_bias));
  ops.matmul_backward(arena.d_ln, g + o.attn_qkv_weight, tensor_at(g, o.attn_qkv_bias), arena.d_qkv,
                      a.ln_1, p + o.attn_qkv_weight, s.C, s.qkv);
  // Adding norm_1's input gradient turns d_residual into dL/d(block input).
  ops.norm_backward(arena.d_residual, g + o.ln_1_weight, tensor_at(g, o.ln_1_bias), arena.d_ln, x,
                    p + o.ln_1_weight, a.ln_1_mean, a.ln_1_rstd);
}

// The backward of the token (and position) embeddings: adds into the span backward_head wrote.
template <class Ops, class Arena>
void backward_embeddings(Ops& ops, const EmbeddingOffsets& e, Arena& arena,
                         float* embeddings_grad) {
  ops.embedding_backward(embeddings_grad + e.wte, tensor_at(embeddings_grad, e.wpe),
                         arena.d_residual);
}

}  // namespace layup::graph
