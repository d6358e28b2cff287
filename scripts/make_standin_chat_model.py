#!/usr/bin/env python3
"""A small stand-in for a downloaded instruction model, for trying the fine-tuning walkthrough
(docs/finetune.md) on a machine without network access: a Hugging Face folder shaped as SmolLM2's
(a Llama-family model, ChatML special tokens, SmolLM2's chat template) with random weights and a
byte-level BPE trained on the shipped corpus.

  python3 scripts/make_standin_chat_model.py OUT_FOLDER   (needs torch, transformers, tokenizers)

The chat template is tests/oracle/data/chat_templates/smollm2.jinja (SmolLM2's, Apache-2.0).
"""
import pathlib
import sys

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

REPO = pathlib.Path(__file__).resolve().parent.parent
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def main(out):
    out = pathlib.Path(out)
    corpus = (REPO / "data" / "corpus" / "austen.txt").read_text()[:400_000]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=2048, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator([corpus], trainer)
    template = (REPO / "tests/oracle/data/chat_templates/smollm2.jinja").read_text()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<|im_start|>",
                                        eos_token="<|im_end|>", pad_token="<|im_end|>")
    tokenizer.chat_template = template
    tokenizer.save_pretrained(out)

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=192, intermediate_size=512,
                         num_hidden_layers=4, num_attention_heads=6, num_key_value_heads=2,
                         max_position_embeddings=512, tie_word_embeddings=True,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    model = LlamaForCausalLM(config)
    model.to(torch.bfloat16).save_pretrained(out)
    parameters = sum(p.numel() for p in model.parameters()) / 1e6
    print(f"{out}: a Llama-family model of {parameters:.1f}M parameters (random weights), "
          f"vocabulary {len(tokenizer)}, SmolLM2's chat template")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
