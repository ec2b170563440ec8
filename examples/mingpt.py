"""Trains a minGPT-style transformer written here (token and position embeddings, causal
self-attention through F.scaled_dot_product_attention, GELU MLP, LayerNorm, dropout) on synthetic
token sequences with AdamW, then generates greedily and by sampling.

    python examples/mingpt.py [--steps N] [--device tpu|cpu] [--tiny] [--seed S] [--compile | --graph]

Distributed, one process per device (rank 0 prints; the loss is the mean over the ranks):

    torchrun --standalone --nproc-per-node 2 examples/mingpt.py --tiny --ddp    # or --fsdp, --tp

--ddp and --fsdp split each batch over the ranks (FSDP2 shards every block, then the rest); --tp
splits every block's MLP over the ranks (not its attention: see TP_PLAN), which all take the whole
batch. Inference runs after --ddp (on rank 0) and is skipped after --fsdp and --tp.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

import common


@dataclass
class GPTConfig:
    vocab: int
    block: int       # longest sequence
    layers: int
    heads: int
    width: int
    dropout: float


# The tiny configuration has no dropout: tpu draws random numbers from its own stream, so runs on
# tpu and CPU agree only without it.
SIZES = {True: GPTConfig(vocab=64, block=16, layers=2, heads=4, width=32, dropout=0.0),
         False: GPTConfig(vocab=128, block=64, layers=4, heads=4, width=128, dropout=0.1)}
BATCH = {True: 4, False: 16}


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.heads, self.dropout = cfg.heads, cfg.dropout
        self.qkv = nn.Linear(cfg.width, 3 * cfg.width)
        self.proj = nn.Linear(cfg.width, cfg.width)
        self.resid_drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in self.qkv(x).split(c, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        return self.resid_drop(self.proj(y.transpose(1, 2).reshape(b, t, c)))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(cfg.width), nn.LayerNorm(cfg.width)
        self.attn = CausalSelfAttention(cfg)
        self.mlp = nn.Sequential(nn.Linear(cfg.width, 4 * cfg.width), nn.GELU(),
                                 nn.Linear(4 * cfg.width, cfg.width), nn.Dropout(cfg.dropout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab, cfg.width)
        self.pos_emb = nn.Embedding(cfg.block, cfg.width)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.Sequential(*(Block(cfg) for _ in range(cfg.layers)))
        self.ln_f = nn.LayerNorm(cfg.width)
        self.head = nn.Linear(cfg.width, cfg.vocab, bias=False)
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        for block in self.blocks:  # GPT-2's scaled initialisation of the residual projections
            nn.init.normal_(block.attn.proj.weight, std=0.02 / math.sqrt(2 * cfg.layers))
            nn.init.normal_(block.mlp[2].weight, std=0.02 / math.sqrt(2 * cfg.layers))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.drop(self.tok_emb(idx) + self.pos_emb(pos))
        return self.head(self.ln_f(self.blocks(x)))

    def loss(self, idx: torch.Tensor) -> torch.Tensor:
        """Cross-entropy of predicting each next token of `idx`."""
        return next_token_loss(self, idx)

    @torch.no_grad()
    def generate(self, idx: torch.Tensor, new_tokens: int, temperature: float = 1.0, sample: bool = False) -> torch.Tensor:
        for _ in range(new_tokens):
            logits = self(idx[:, -self.cfg.block:])[:, -1] / temperature
            if sample:
                nxt = torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)
            else:
                nxt = logits.argmax(dim=-1, keepdim=True)
            idx = torch.cat([idx, nxt], dim=1)
        return idx


def next_token_loss(model: nn.Module, idx: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of `model`'s (a GPT's, or a DDP wrapping one) predictions of each next token
    of `idx`: called through the wrapper's forward, which DDP needs to reduce the gradients."""
    logits = model(idx[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), idx[:, 1:].reshape(-1))


def tp_plan() -> dict[str, object]:
    """Tensor parallelism for a Block: its MLP split Megatron style (the first linear layer by
    output features, the second by input features, its output summed over the ranks).

    The attention is not split: its q, k and v come from one fused linear layer (`qkv`, output
    [q | k | v]), and ColwiseParallel cuts that output into contiguous runs of features, so a rank
    would get, say, all of q and half of k instead of q, k and v for its share of the heads."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {"mlp.0": ColwiseParallel(), "mlp.2": RowwiseParallel()}


def build(tiny: bool, seed: int) -> GPT:
    return common.build_on_cpu(lambda: GPT(SIZES[tiny]), seed)


def train(device: str, steps: int, tiny: bool = True, seed: int = 0, model: GPT | None = None,
          progress: bool = False, compile: bool = False, graph: bool = False, parallel: common.Parallel | None = None) -> list[float]:
    cfg = SIZES[tiny]
    model = (build(tiny, seed) if model is None else model).to(device)
    if parallel is not None:  # BATCH is then the global batch
        model = parallel.wrap(model, list(model.blocks), tp_plan())
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                                  lr=3e-3, betas=(0.9, 0.95), foreach=None if parallel is None else parallel.foreach)
    # block + 1 tokens: the model reads the first `block` and predicts the last `block`
    return common.fit(model, optimizer, common.token_batches(seed, BATCH[tiny], cfg.block + 1, cfg.vocab),
                      next_token_loss, steps, device, "tokens",
                      lambda b: b[0][:, 1:].numel(), clip=1.0, progress=progress, compile=compile, graph=graph, parallel=parallel)


def infer(model: GPT, device: str, tiny: bool, seed: int) -> None:
    print("greedy:")
    common.show_generations(model.generate, device, model.cfg.vocab, seed)
    torch.manual_seed(seed)
    prompt = common.progressions(common.data_generator(seed, held_out=True), 1, 4, model.cfg.vocab).to(device)
    print(f"sampled at temperature 0.7: {model.generate(prompt, 8, temperature=0.7, sample=True).tolist()[0]}")


if __name__ == "__main__":
    common.main(__doc__, build, train, infer, steps=300)
