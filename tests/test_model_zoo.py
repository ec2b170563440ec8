"""The architectures users bring from transformers train on tpu as on the CPU, with nothing running on
the CPU behind tpu's back: decoder-only (dense and mixture-of-experts), encoder-only, encoder-decoder,
vision, speech and CLIP-style contrastive models, each in a tiny random configuration (nothing is
downloaded). The same initial weights train a few AdamW steps on one batch on both devices; the
losses must agree step by step, and fall."""

from __future__ import annotations

import pytest
import torch

from conftest import no_cpu_fallback

transformers = pytest.importorskip("transformers", reason="transformers is a test dependency")

STEPS = 3
BATCH = 2


def _tokens(generator, vocab, length=12):
    return torch.randint(3, vocab, (BATCH, length), generator=generator)


def _causal_lm(generator, vocab=64):
    ids = _tokens(generator, vocab)
    return {"input_ids": ids, "labels": ids}


def _masked_lm(generator, vocab=64):
    ids = _tokens(generator, vocab)
    labels = torch.full_like(ids, -100)
    labels[:, ::3] = ids[:, ::3]
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}


def _seq2seq(generator, vocab=64):
    return {"input_ids": _tokens(generator, vocab), "labels": _tokens(generator, vocab, 7)}


def _images(generator, labels=5):
    return {"pixel_values": torch.randn(BATCH, 3, 16, 16, generator=generator),
            "labels": torch.randint(0, labels, (BATCH,), generator=generator)}


def _speech_seq2seq(generator, vocab=64):
    return {"input_features": torch.randn(BATCH, 16, 32, generator=generator), "labels": _tokens(generator, vocab, 6)}


def _speech_ctc(generator, vocab=32):
    return {"input_values": torch.randn(BATCH, 400, generator=generator),
            "labels": torch.randint(1, vocab, (BATCH, 5), generator=generator)}


def _image_text(generator, vocab=64):
    return {"input_ids": _tokens(generator, vocab, 8), "pixel_values": torch.randn(BATCH, 3, 16, 16, generator=generator),
            "return_loss": True}


def _models():
    t = transformers
    decoder = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, max_position_embeddings=64)
    encoder = dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                   max_position_embeddings=64)
    vision = dict(image_size=16, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=2,
                  num_attention_heads=4, intermediate_size=64)
    return {
        "llama": (t.LlamaForCausalLM, t.LlamaConfig(**decoder), _causal_lm),
        "mixtral-moe": (t.MixtralForCausalLM,
                        t.MixtralConfig(**decoder, num_local_experts=4, num_experts_per_tok=2, output_router_logits=True),
                        _causal_lm),
        "qwen2-moe": (t.Qwen2MoeForCausalLM,
                      t.Qwen2MoeConfig(**decoder, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                       shared_expert_intermediate_size=32, output_router_logits=True),
                      _causal_lm),
        "gpt2": (t.GPT2LMHeadModel, t.GPT2Config(vocab_size=64, n_positions=64, n_embd=32, n_layer=2, n_head=4),
                 _causal_lm),
        "bert": (t.BertForMaskedLM, t.BertConfig(**encoder), _masked_lm),
        "t5": (t.T5ForConditionalGeneration,
               t.T5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, decoder_start_token_id=0),
               _seq2seq),
        "vit": (t.ViTForImageClassification, t.ViTConfig(**vision, num_labels=5), _images),
        "whisper": (t.WhisperForConditionalGeneration,
                    t.WhisperConfig(vocab_size=64, num_mel_bins=16, d_model=32, encoder_layers=2, decoder_layers=2,
                                    encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                                    decoder_ffn_dim=64, max_source_positions=16, max_target_positions=32,
                                    pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1),
                    _speech_seq2seq),
        "wav2vec2-ctc": (t.Wav2Vec2ForCTC,
                         t.Wav2Vec2Config(vocab_size=32, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                          intermediate_size=64, conv_dim=(16, 16), conv_kernel=(5, 3),
                                          conv_stride=(4, 2), num_conv_pos_embeddings=8,
                                          num_conv_pos_embedding_groups=4, mask_time_prob=0.0, layerdrop=0.0,
                                          ctc_loss_reduction="mean", pad_token_id=0),
                         _speech_ctc),
        "clip": (t.CLIPModel,
                 t.CLIPConfig(text_config=dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                               intermediate_size=64, max_position_embeddings=16, bos_token_id=1,
                                               eos_token_id=2, pad_token_id=0),
                              vision_config=vision, projection_dim=16),
                 _image_text),
    }


MODELS = list(_models())


def _without_dropout(config):
    """Dropout draws from each device's own generator: off, so both devices compute the same thing."""
    for part in [config] + [getattr(config, n) for n in ("text_config", "vision_config") if hasattr(config, n)]:
        for name, value in list(vars(part).items()):
            if ("dropout" in name or name.endswith("_pdrop")) and isinstance(value, float):
                setattr(part, name, 0.0)
    return config


def _train(model, batches, device) -> list[float]:
    model = model.to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    losses = []
    for batch in batches:
        batch = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
        loss = model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("name", MODELS)
def test_trains_like_cpu_without_fallback(name):
    cls, config, make_batch = _models()[name]
    config = _without_dropout(config)
    torch.manual_seed(0)
    cpu_model = cls(config)
    tpu_model = cls(config)
    tpu_model.load_state_dict(cpu_model.state_dict())
    batches = [make_batch(torch.Generator().manual_seed(1))] * STEPS
    expected = _train(cpu_model, batches, "cpu")
    with no_cpu_fallback():
        actual = _train(tpu_model, batches, "tpu")
    assert torch.allclose(torch.tensor(actual), torch.tensor(expected), rtol=1e-4, atol=1e-5), (actual, expected)
    assert actual[-1] < actual[0], actual  # it learns
