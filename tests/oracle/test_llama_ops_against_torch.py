"""The Llama-family CPU ops (RMSNorm, RoPE, SwiGLU, grouped-query attention), forward and
backward, against transformers' Llama modules and torch autograd, in fp32.

Each test writes random inputs and an upstream gradient to a safetensors file, runs
layup_llama_ops_tool (tests/oracle/llama_ops_tool.cpp) on them, and compares its outputs and
gradients with torch's.
"""
import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import (LlamaRMSNorm, LlamaRotaryEmbedding,
                                                      apply_rotary_pos_emb)

from oracle_util import binary, relative_error, run

# Relative, over the whole tensor. The errors seen are 4e-8 to 2.4e-7 (fp32 rounding); a RoPE
# frequency one ulp off from transformers' at T = 2048 showed as 1.1e-5.
TOLERANCE = 1e-6


def run_op(tmp_path, op, tensors, **settings):
    """Runs the tool's `op` on `tensors` with `settings` as metadata; returns its outputs."""
    inputs, outputs = tmp_path / f"{op}_in.safetensors", tmp_path / f"{op}_out.safetensors"
    save_file({name: t.detach().contiguous() for name, t in tensors.items()}, inputs,
              metadata={key: repr(value) for key, value in settings.items()})
    run([binary("layup_llama_ops_tool"), op, inputs, outputs])
    return load_file(outputs)


def check(actual, expected, name):
    error = relative_error(actual, expected.detach())
    assert error < TOLERANCE, f"{name}: relative error {error:.3e}"


@pytest.mark.parametrize("N,C,eps", [(5, 37, 1e-6), (16, 512, 1e-5)])
def test_rmsnorm_matches_llama_rmsnorm(tmp_path, N, C, eps):
    torch.manual_seed(0)
    x = (2 * torch.randn(N, C) + 0.5).requires_grad_()
    dout = torch.randn(N, C)
    norm = LlamaRMSNorm(C, eps=eps)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.3 * torch.randn(C))
    out = norm(x)
    out.backward(dout)

    result = run_op(tmp_path, "rmsnorm", {"x": x, "weight": norm.weight, "dout": dout}, eps=eps)
    check(result["out"], out, "out")
    check(result["rstd"], torch.rsqrt(x.detach().pow(2).mean(-1) + eps), "rstd")
    check(result["dx"], x.grad, "dx")
    check(result["dweight"], norm.weight.grad, "dweight")


LLAMA3_SCALING = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 8192}


# (B, T, Hq, Hkv, D, theta, llama3 scaling or None): Llama 2/Mistral-like; Qwen2-like (theta 1e6,
# groups of 3); Llama 3.1's frequencies, once at a long position range where the angles' float
# rounding shows.
@pytest.mark.parametrize("B,T,Hq,Hkv,D,theta,scaling", [
    (2, 9, 4, 4, 16, 10000.0, None),
    (2, 33, 6, 2, 64, 1000000.0, None),
    (2, 40, 4, 2, 128, 500000.0, LLAMA3_SCALING),
    (1, 2048, 2, 1, 128, 500000.0, LLAMA3_SCALING),
])
def test_rope_matches_apply_rotary_pos_emb(tmp_path, B, T, Hq, Hkv, D, theta, scaling):
    torch.manual_seed(1)
    rope_parameters = {"rope_type": "llama3", **scaling} if scaling else {"rope_type": "default"}
    config = LlamaConfig(hidden_size=Hq * D, num_attention_heads=Hq, num_key_value_heads=Hkv,
                         head_dim=D, max_position_embeddings=131072,
                         rope_parameters={**rope_parameters, "rope_theta": theta})
    rotary = LlamaRotaryEmbedding(config)
    qkv = torch.randn(B, T, (Hq + 2 * Hkv) * D)
    dout = torch.randn(B, T, (Hq + 2 * Hkv) * D)
    q, k, v = qkv.split([Hq * D, Hkv * D, Hkv * D], dim=-1)
    q = q.reshape(B, T, Hq, D).requires_grad_()
    k = k.reshape(B, T, Hkv, D).requires_grad_()
    dq, dk, dv = dout.split([Hq * D, Hkv * D, Hkv * D], dim=-1)
    cos, sin = rotary(qkv, torch.arange(T).expand(B, T))
    q_rotated, k_rotated = apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=2)
    torch.autograd.backward([q_rotated, k_rotated], [dq.reshape(q.shape), dk.reshape(k.shape)])

    settings = {"Hq": Hq, "Hkv": Hkv, "theta": theta, **(scaling or {})}
    result = run_op(tmp_path, "rope", {"qkv": qkv, "dout": dout}, **settings)
    check(result["inv_freq"], rotary.inv_freq, "inv_freq")
    out_q, out_k, out_v = result["out"].split([Hq * D, Hkv * D, Hkv * D], dim=-1)
    check(out_q, q_rotated.reshape(B, T, -1), "q rotated")
    check(out_k, k_rotated.reshape(B, T, -1), "k rotated")
    assert torch.equal(out_v, v), "v must pass through untouched"
    grad_q, grad_k, grad_v = result["dqkv"].split([Hq * D, Hkv * D, Hkv * D], dim=-1)
    check(grad_q, q.grad.reshape(B, T, -1), "dq")
    check(grad_k, k.grad.reshape(B, T, -1), "dk")
    assert torch.equal(grad_v, dv), "dv must pass through untouched"


@pytest.mark.parametrize("N,I", [(3, 7), (64, 344)])
def test_swiglu_matches_silu_times_up(tmp_path, N, I):
    torch.manual_seed(2)
    gate_up = (3 * torch.randn(N, 2 * I)).requires_grad_()
    dout = torch.randn(N, I)
    gate, up = gate_up.split([I, I], dim=-1)
    out = torch.nn.functional.silu(gate) * up
    out.backward(dout)

    result = run_op(tmp_path, "swiglu", {"gate_up": gate_up, "dout": dout})
    check(result["out"], out, "out")
    check(result["dgate_up"], gate_up.grad, "dgate_up")


# (B, T, Hq, Hkv, D): multi-head (GPT-2's case), groups of 2 and 4, multi-query.
@pytest.mark.parametrize("B,T,Hq,Hkv,D", [
    (2, 16, 4, 4, 8), (2, 37, 8, 4, 16), (1, 64, 8, 2, 64), (3, 21, 6, 1, 12),
])
def test_grouped_query_attention_matches_sdpa(tmp_path, B, T, Hq, Hkv, D):
    torch.manual_seed(3)
    qkv = torch.randn(B, T, (Hq + 2 * Hkv) * D, requires_grad=True)
    dout = torch.randn(B, T, Hq * D)
    q, k, v = qkv.split([Hq * D, Hkv * D, Hkv * D], dim=-1)
    # [B, heads, T, D], each K/V head repeated for the Hq/Hkv query heads it serves.
    q = q.reshape(B, T, Hq, D).transpose(1, 2)
    k = k.reshape(B, T, Hkv, D).transpose(1, 2).repeat_interleave(Hq // Hkv, dim=1)
    v = v.reshape(B, T, Hkv, D).transpose(1, 2).repeat_interleave(Hq // Hkv, dim=1)
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    out = out.transpose(1, 2).reshape(B, T, Hq * D)
    out.backward(dout)

    result = run_op(tmp_path, "attention", {"qkv": qkv, "dout": dout}, Hq=Hq, Hkv=Hkv)
    check(result["out"], out, "out")
    check(result["dqkv"], qkv.grad, "dqkv")
