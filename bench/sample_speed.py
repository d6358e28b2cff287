#!/usr/bin/env python3
"""`layup sample`'s speed: with the key/value cache against --no-kv-cache, and (--mode h200)
against transformers' generate on the same GPU, dtype and prompt ids.

The model is a random one of a published shape, written as a Hugging Face folder (nothing is
downloaded): GPT-2 124M for --mode cpu, Llama 3.2 1B for --mode h200. Generation is greedy and
ignores EOS, so every engine makes exactly --tokens tokens. layup reports its prefill and decode
times on stderr; transformers' are timed here: generate with one new token is the prefill (and
one sampling step), the full generate less that is the decode.

  bench/sample_speed.py --mode cpu --layup build-cpu/layup [--tokens 512] [--threads N]
  bench/sample_speed.py --mode h200 --layup /tmp/build-gpu/layup
"""
import argparse
import json
import re
import subprocess
import time
from pathlib import Path

import torch

PROMPT_IDS = [464, 3139, 286, 4673, 257, 3303, 2746, 318, 284, 4331, 262, 1306, 11241, 422, 262,
              2180]  # 16 ids, valid in GPT-2's and Llama 3's vocabularies alike

LAYUP_TIMES = re.compile(r"prefill: (\d+) tokens in ([\d.]+) s \(([\d.]+) tokens/s\); decode: "
                         r"(\d+) tokens in ([\d.]+) s \(([\d.]+) tokens/s\)")


def write_model(mode, folder):
    """The random model of the mode's shape, saved once per folder (bf16 for the GPU: its bytes)."""
    if (folder / "config.json").exists():
        return
    torch.manual_seed(0)
    if mode == "cpu":
        from transformers import GPT2Config, GPT2LMHeadModel
        model = GPT2LMHeadModel(GPT2Config())  # 124M, 1024 positions
        model.save_pretrained(folder)
        return
    from transformers import LlamaConfig, LlamaForCausalLM
    config = LlamaConfig(
        vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
        num_attention_heads=32, num_key_value_heads=8, head_dim=64, max_position_embeddings=131072,
        rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=True,
        rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        bos_token_id=128000, eos_token_id=128001, torch_dtype="bfloat16")
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(folder)


def run_layup(args, folder, *flags):
    command = [args.layup, "sample", "--checkpoint", str(folder), "--prompt-ids",
               ",".join(map(str, PROMPT_IDS)), "--tokens", str(args.tokens), "--top-k", "1",
               "--ignore-eos", *flags]
    result = subprocess.run(command, capture_output=True, text=True, errors="replace")
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{result.stderr}")
    match = LAYUP_TIMES.search(result.stderr)
    prefill_tokens, prefill_s, _, decode_tokens, decode_s, _ = match.groups()
    return {"prefill_tokens": int(prefill_tokens), "prefill_s": float(prefill_s),
            "decode_tokens": int(decode_tokens), "decode_s": float(decode_s),
            "decode_tokens_per_s": int(decode_tokens) / float(decode_s)}


def run_transformers(args, folder):
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.bfloat16,
                                                 attn_implementation="sdpa").cuda().eval()
    ids = torch.tensor([PROMPT_IDS], device="cuda")

    def timed(new_tokens):
        torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                 do_sample=False, eos_token_id=None, pad_token_id=0)
        torch.cuda.synchronize()
        assert out.shape[1] == len(PROMPT_IDS) + new_tokens
        return time.perf_counter() - start

    timed(8)  # warm-up: kernels, allocator
    prefill_s = min(timed(1) for _ in range(3))
    total_s = timed(args.tokens)
    decode_s = total_s - prefill_s
    generate = {"prefill_tokens": len(PROMPT_IDS), "prefill_s": prefill_s,
                "decode_tokens": args.tokens - 1, "decode_s": decode_s,
                "decode_tokens_per_s": (args.tokens - 1) / decode_s}

    # The same model called by hand, one token at a time with its key/value cache and greedy
    # argmax: what a decode costs without generate's own work per token (logits processors,
    # stopping criteria), so a slow generate is told apart from a slow model.
    def loop(new_tokens):
        torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.no_grad():
            out = model(ids, use_cache=True)
            token = out.logits[:, -1].argmax(-1, keepdim=True)
            torch.cuda.synchronize()
            prefill = time.perf_counter() - start
            cache = out.past_key_values
            for _ in range(new_tokens - 1):
                out = model(token, past_key_values=cache, use_cache=True)
                cache = out.past_key_values
                token = out.logits[:, -1].argmax(-1, keepdim=True)
        torch.cuda.synchronize()
        return prefill, time.perf_counter() - start - prefill

    loop(8)
    prefill_s, decode_s = loop(args.tokens)
    by_hand = {"prefill_tokens": len(PROMPT_IDS), "prefill_s": prefill_s,
               "decode_tokens": args.tokens - 1, "decode_s": decode_s,
               "decode_tokens_per_s": (args.tokens - 1) / decode_s}
    return generate, by_hand


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=["cpu", "h200"], default="cpu")
    parser.add_argument("--layup", required=True)
    parser.add_argument("--out", default="/tmp/sample_speed")
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--threads", type=int, default=0, help="layup's --threads (cpu mode)")
    parser.add_argument("--skip-no-cache", action="store_true")
    args = parser.parse_args()
    out = Path(args.out)
    folder = out / ("gpt2-124m" if args.mode == "cpu" else "llama-3.2-1b")
    folder.mkdir(parents=True, exist_ok=True)
    write_model(args.mode, folder)

    device = ["--device", "cpu"] if args.mode == "cpu" else ["--device", "cuda", "--dtype", "bf16"]
    if args.threads:
        device += ["--threads", str(args.threads)]
    results = {"layup, key/value cache": run_layup(args, folder, *device)}
    if not args.skip_no_cache:
        results["layup, --no-kv-cache"] = run_layup(args, folder, *device, "--no-kv-cache")
    if args.mode == "h200":
        (results["transformers generate (bf16, sdpa)"],
         results["transformers forward loop (cache)"]) = run_transformers(args, folder)

    print(f"{folder.name}, {len(PROMPT_IDS)} prompt ids, {args.tokens} new tokens (greedy), "
          f"{args.mode}:")
    for name, r in results.items():
        print(f"  {name:36s} prefill {r['prefill_s']:8.3f} s   decode {r['decode_tokens']} tokens "
              f"in {r['decode_s']:8.3f} s = {r['decode_tokens_per_s']:8.1f} tokens/s")
    cached = results["layup, key/value cache"]
    if "layup, --no-kv-cache" in results:
        uncached = results["layup, --no-kv-cache"]
        whole = (uncached["prefill_s"] + uncached["decode_s"]) / (cached["prefill_s"] +
                                                                  cached["decode_s"])
        print(f"  the cache is {whole:.1f}x faster over the whole generation")
    if args.mode == "h200":
        peer = results["transformers generate (bf16, sdpa)"]
        loop = results["transformers forward loop (cache)"]
        print(f"  layup decode / transformers decode: "
              f"{cached['decode_tokens_per_s'] / peer['decode_tokens_per_s']:.2f}x (generate), "
              f"{cached['decode_tokens_per_s'] / loop['decode_tokens_per_s']:.2f}x (forward loop)")
        import transformers
        print(f"  torch {torch.__version__}, transformers {transformers.__version__}, "
              f"{torch.cuda.get_device_name()}")
    (out / f"sample_speed_{args.mode}.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
