"""Trains a small randomly initialised Llama (transformers' LlamaForCausalLM, nothing downloaded)
on synthetic token sequences with AdamW and gradient clipping, then generates greedily.

    python examples/llama.py [--steps N] [--device tpu|cpu] [--tiny] [--seed S] [--compile | --graph]

Distributed, one process per device (rank 0 prints; the loss is the mean over the ranks):

    torchrun --standalone --nproc-per-node 2 examples/llama.py --tiny --ddp    # or --fsdp, --tp

--ddp and --fsdp split each batch over the ranks (FSDP2 shards every decoder layer, then the rest);
--tp splits every decoder layer's attention (by heads) and MLP over the ranks, which all take the
whole batch. Inference runs after --ddp (on rank 0) and is skipped after --fsdp and --tp.
"""

from __future__ import annotations

from transformers import LlamaConfig, LlamaForCausalLM

import common

# (vocab, hidden, intermediate, layers, heads, kv heads, batch, sequence length)
SIZES = {True: (64, 32, 64, 2, 4, 2, 4, 16), False: (128, 128, 344, 4, 4, 2, 16, 64)}


def config(tiny: bool | tuple) -> LlamaConfig:
    """The config of SIZES[tiny], or of a sizes tuple in SIZES' order (the benchmark's larger Llamas)."""
    vocab, hidden, inter, layers, heads, kv_heads, _, length = tiny if isinstance(tiny, tuple) else SIZES[tiny]
    return LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter,
                       num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                       max_position_embeddings=2 * length, attention_dropout=0.0,
                       bos_token_id=None, eos_token_id=None, pad_token_id=0)


def build(tiny: bool | tuple, seed: int) -> LlamaForCausalLM:
    return common.build_on_cpu(lambda: LlamaForCausalLM(config(tiny)), seed)


def train(device: str, steps: int, tiny: bool = True, seed: int = 0, model: LlamaForCausalLM | None = None,
          progress: bool = False, compile: bool = False, graph: bool = False, parallel: common.Parallel | None = None) -> list[float]:
    vocab, *_, batch, length = SIZES[tiny]
    return common.train_causal_lm(build(tiny, seed) if model is None else model, device, steps, seed, batch, length,
                                  vocab, progress, compile, graph, parallel=parallel)


def infer(model: LlamaForCausalLM, device: str, tiny: bool, seed: int) -> None:
    common.generate_greedily(model, device, SIZES[tiny][0], seed)


if __name__ == "__main__":
    common.main(__doc__, build, train, infer, steps=200)
