"""Trains a small randomly initialised Qwen3 (transformers' Qwen3ForCausalLM: grouped-query
attention with RMS-normed queries and keys, tied embeddings; nothing downloaded) on synthetic token
sequences with AdamW and gradient clipping, then generates greedily.

    python examples/qwen.py [--steps N] [--device tpu|cpu] [--tiny] [--seed S] [--compile | --graph]
"""

from __future__ import annotations

from transformers import Qwen3Config, Qwen3ForCausalLM

import common

# (vocab, hidden, intermediate, layers, heads, kv heads, head dim, batch, sequence length)
SIZES = {True: (64, 32, 64, 2, 4, 2, 8, 4, 16), False: (128, 128, 384, 4, 4, 2, 32, 16, 64)}


def config(tiny: bool) -> Qwen3Config:
    vocab, hidden, inter, layers, heads, kv_heads, head_dim, _, length = SIZES[tiny]
    return Qwen3Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter,
                       num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                       head_dim=head_dim, max_position_embeddings=2 * length, tie_word_embeddings=True,
                       attention_dropout=0.0, bos_token_id=None, eos_token_id=None, pad_token_id=0)


def build(tiny: bool, seed: int) -> Qwen3ForCausalLM:
    return common.build_on_cpu(lambda: Qwen3ForCausalLM(config(tiny)), seed)


def train(device: str, steps: int, tiny: bool = True, seed: int = 0, model: Qwen3ForCausalLM | None = None,
          progress: bool = False, compile: bool = False, graph: bool = False) -> list[float]:
    vocab, *_, batch, length = SIZES[tiny]
    return common.train_causal_lm(build(tiny, seed) if model is None else model, device, steps, seed, batch, length,
                                  vocab, progress, compile, graph)


def infer(model: Qwen3ForCausalLM, device: str, tiny: bool, seed: int) -> None:
    common.generate_greedily(model, device, SIZES[tiny][0], seed)


if __name__ == "__main__":
    common.main(__doc__, build, train, infer, steps=200)
