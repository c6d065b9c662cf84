"""The model zoo: HuggingFace transformers architectures (and diffusers' UNet2DModel and Flux), unmodified,
each from a tiny config (no download), with its inputs, target and loss.

One table row per architecture: what it exercises (`features`), how to build it, what to feed it.
tests/test_zoo.py checks every row marked `suite` at pp 2, tp 2 and pp 2 x tp 2 on the local backend
(bench/zoo_table.py every row, for README's table), and
tests/models/zoo_model.py makes any row a model file (`ZOO_ARCH=T5 graphsplit run
tests/models/zoo_model.py --tp 2 --pp 2 --check`). GPT-2, Llama, Mixtral, Qwen3-MoE and
DeepSeek-V3 are model files of their own (tests/test_hf_models.py, tests/test_hf_moe.py).

The configs are as small as each feature allows: 2 layers (one cut between blocks at pp 2),
hidden 32, 4 heads (2 per tp rank), a vocabulary of 64, a batch of 4 (2 micro-batches of 2).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from graphsplit.loader import LoadedModel

VOCAB = 64
BATCH, SEQ = 4, 8
IMAGE = 32  # pixels a side: Swin's 4x4 patches, its window of 4 and one merge fit
CLASSES = 10


@dataclass(frozen=True)
class Arch:
    """One architecture of the zoo."""

    name: str  # the table's row
    family: str  # causal LM, encoder-decoder, encoder, vision, diffusion
    features: str  # what it exercises that the others do not
    config: str  # transformers' config class (or diffusers' model class for UNet2DModel)
    model: str  # the model class
    kwargs: dict[str, Any] = field(default_factory=dict)
    inputs: str = "tokens"  # a key of INPUTS
    library: str = "transformers"
    # checked in the suite (tests/test_zoo.py) at every plan; False: at dp 2 x pp 2 x tp 2 only (pp 2 and
    # tp 2 by bench/zoo_table.py), the suite's time budget spent on rows whose features others cover
    suite: bool = True


def _tokens(gen: torch.Generator) -> torch.Tensor:
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen)


def _images(gen: torch.Generator) -> torch.Tensor:
    return torch.randn(BATCH, 3, IMAGE, IMAGE, generator=gen)


def _logits(output: Any) -> torch.Tensor:
    return output.logits if hasattr(output, "logits") else output[0]


def _token_loss(output: Any, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(_logits(output).flatten(0, 1), target.flatten())


def _class_loss(output: Any, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(_logits(output), target)


def _noise_loss(output: Any, target: torch.Tensor) -> torch.Tensor:
    sample = output.sample if hasattr(output, "sample") else output[0]
    return F.mse_loss(sample, target)


@dataclass(frozen=True)
class Inputs:
    """How a family is fed: inputs(gen), target(gen) and the loss over the model's output."""

    inputs: Callable[[torch.Generator], dict[str, torch.Tensor]]
    target: Callable[[torch.Generator], torch.Tensor]
    loss: Callable[[Any, torch.Tensor], torch.Tensor]


INPUTS: dict[str, Inputs] = {
    "tokens": Inputs(lambda g: {"input_ids": _tokens(g)}, _tokens, _token_loss),
    # encoder-decoders: the decoder reads its own tokens and the encoder's output (cross-attention)
    "seq2seq": Inputs(lambda g: {"input_ids": _tokens(g), "decoder_input_ids": _tokens(g)}, _tokens, _token_loss),
    "images": Inputs(lambda g: {"pixel_values": _images(g)},
                     lambda g: torch.randint(0, CLASSES, (BATCH,), generator=g), _class_loss),
    # a denoiser: noisy images and their diffusion timesteps in, the predicted noise out
    "noise": Inputs(lambda g: {"sample": torch.randn(BATCH, 3, 8, 8, generator=g),
                               "timestep": torch.randint(0, 1000, (BATCH,), generator=g)},
                    lambda g: torch.randn(BATCH, 3, 8, 8, generator=g), _noise_loss),
    # a rectified-flow transformer: image and text tokens, their position ids shared by the whole
    # batch ([tokens, 3], no batch dim: they go whole to every micro-batch and replica)
    "flux": Inputs(lambda g: {"hidden_states": torch.randn(BATCH, 16, 4, generator=g),
                              "encoder_hidden_states": torch.randn(BATCH, SEQ, 16, generator=g),
                              "pooled_projections": torch.randn(BATCH, 8, generator=g),
                              "timestep": torch.rand(BATCH, generator=g),
                              "img_ids": torch.stack([torch.zeros(16), torch.arange(16.0) // 4, torch.arange(16.0) % 4], -1),
                              "txt_ids": torch.zeros(SEQ, 3)},
                   lambda g: torch.randn(BATCH, 16, 4, generator=g), _noise_loss),
}

# what every tiny causal LM shares
_LM = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
           max_position_embeddings=64, use_cache=False)
_TEXT = dict(vocab_size=VOCAB, max_position_embeddings=64)

ARCHS: tuple[Arch, ...] = (
    # causal LMs
    Arch("GPT-J", "causal LM", "parallel attention + MLP, partial interleaved rotary",
         "GPTJConfig", "GPTJForCausalLM",
         dict(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, rotary_dim=4, n_positions=64, use_cache=False)),
    Arch("GPT-NeoX", "causal LM", "fused qkv interleaved per head, parallel residual",
         "GPTNeoXConfig", "GPTNeoXForCausalLM", dict(_LM, rotary_pct=0.5)),
    Arch("Falcon", "causal LM", "multi-query attention (one kv head) in a fused qkv, parallel attention + MLP",
         "FalconConfig", "FalconForCausalLM",
         dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, multi_query=True,
              parallel_attn=True, new_decoder_architecture=False, bias=False, use_cache=False)),
    Arch("Phi", "causal LM", "parallel attention + MLP, partial rotary, qk-layernorm",
         "PhiConfig", "PhiForCausalLM", dict(_LM, partial_rotary_factor=0.5, qk_layernorm=True), suite=False),
    Arch("Phi-3", "causal LM", "fused qkv and fused gate_up projections",
         "Phi3Config", "Phi3ForCausalLM", dict(_LM, num_key_value_heads=2, pad_token_id=0)),
    Arch("Mistral", "causal LM", "GQA, sliding-window attention",
         "MistralConfig", "MistralForCausalLM", dict(_LM, num_key_value_heads=2, sliding_window=4)),
    Arch("Qwen2", "causal LM", "GQA with biased q/k/v projections",
         "Qwen2Config", "Qwen2ForCausalLM", dict(_LM, num_key_value_heads=2), suite=False),
    Arch("Qwen3", "causal LM", "qk-norm per head (RMSNorm over head_dim), GQA",
         "Qwen3Config", "Qwen3ForCausalLM", dict(_LM, num_key_value_heads=2, head_dim=8)),
    Arch("OLMo-2", "causal LM", "qk-norm over all heads (RMSNorm over the whole projection), post-norm",
         "Olmo2Config", "Olmo2ForCausalLM", dict(_LM, num_key_value_heads=2)),
    Arch("Gemma", "causal LM", "multi-query attention, scaled embedding, GeLU-tanh gated MLP",
         "GemmaConfig", "GemmaForCausalLM", dict(_LM, num_key_value_heads=1, head_dim=8)),
    Arch("Gemma-2", "causal LM", "attention and final-logit softcapping, alternating sliding window",
         "Gemma2Config", "Gemma2ForCausalLM",
         dict(_LM, num_key_value_heads=2, head_dim=8, sliding_window=4, attn_logit_softcapping=50.0,
              final_logit_softcapping=30.0, attn_implementation="eager")),
    Arch("Gemma-3", "causal LM", "qk-norm, sliding window, local and global rotary",
         "Gemma3TextConfig", "Gemma3ForCausalLM",
         dict(_LM, num_key_value_heads=2, head_dim=8, sliding_window=4, sliding_window_pattern=2), suite=False),
    Arch("Bloom", "causal LM", "ALiBi, fused qkv interleaved per head, embedding layernorm",
         "BloomConfig", "BloomForCausalLM", dict(vocab_size=VOCAB, hidden_size=32, n_layer=2, n_head=4, use_cache=False)),
    Arch("MPT", "causal LM", "ALiBi, fused Wqkv, no biases",
         "MptConfig", "MptForCausalLM",
         dict(vocab_size=VOCAB, d_model=32, n_layers=2, n_heads=4, expansion_ratio=2, max_seq_len=64, use_cache=False)),
    Arch("GPT-BigCode", "causal LM", "multi-query attention in a fused c_attn (q, then one k and v)",
         "GPTBigCodeConfig", "GPTBigCodeForCausalLM",
         dict(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64, multi_query=True, use_cache=False), suite=False),
    Arch("OPT", "causal LM", "learned positions with an offset, ReLU MLP",
         "OPTConfig", "OPTForCausalLM",
         dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, ffn_dim=64, num_attention_heads=4,
              max_position_embeddings=64, word_embed_proj_dim=32, use_cache=False), suite=False),
    Arch("Qwen2-MoE", "causal LM", "MoE with a gated shared expert",
         "Qwen2MoeConfig", "Qwen2MoeForCausalLM",
         dict(_LM, num_key_value_heads=2, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
              shared_expert_intermediate_size=32, router_aux_loss_coef=0.0)),
    Arch("DeepSeek-V2", "causal LM", "multi-head latent attention, MoE",
         "DeepseekV2Config", "DeepseekV2ForCausalLM",
         dict(_LM, num_key_value_heads=4, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
              moe_intermediate_size=32, first_k_dense_replace=1, q_lora_rank=16, kv_lora_rank=16,
              qk_rope_head_dim=4, qk_nope_head_dim=8, v_head_dim=8, n_group=1, topk_group=1)),
    # encoder-decoders
    Arch("T5", "encoder-decoder", "relative position bias, cross-attention, tied embeddings",
         "T5Config", "T5ForConditionalGeneration",
         dict(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_decoder_layers=1, num_heads=4,
              decoder_start_token_id=0, use_cache=False), inputs="seq2seq"),
    Arch("BART", "encoder-decoder", "learned positions, cross-attention, final logits bias",
         "BartConfig", "BartForConditionalGeneration",
         dict(_TEXT, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
              decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, use_cache=False), inputs="seq2seq"),
    # encoders
    Arch("BERT", "encoder", "post-norm, token types, MLM head tied to the embedding",
         "BertConfig", "BertForMaskedLM",
         dict(_TEXT, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)),
    Arch("ModernBERT", "encoder", "fused Wqkv, GLU MLP, alternating local/global attention",
         "ModernBertConfig", "ModernBertForMaskedLM",
         dict(_TEXT, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
              global_attn_every_n_layers=2, local_attention=4, pad_token_id=0)),
    # vision
    Arch("ViT", "vision", "patch embedding (conv), class token, learned positions",
         "ViTConfig", "ViTForImageClassification",
         dict(image_size=IMAGE, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
              intermediate_size=64, num_labels=CLASSES), inputs="images"),
    Arch("Swin", "vision", "shifted windows, relative position bias table, patch merging",
         "SwinConfig", "SwinForImageClassification",
         dict(image_size=IMAGE, patch_size=4, embed_dim=16, depths=[2, 1], num_heads=[2, 4], window_size=4,
              num_labels=CLASSES), inputs="images"),
    Arch("ConvNeXt", "vision", "depthwise convs, channels-last LayerNorm, layer scale",
         "ConvNextConfig", "ConvNextForImageClassification",
         dict(image_size=IMAGE, num_channels=3, num_stages=2, hidden_sizes=[8, 16], depths=[1, 1], num_labels=CLASSES),
         inputs="images"),
    # diffusion
    Arch("UNet2DModel", "diffusion", "ResNet blocks, skip connections across the U, timestep embedding, mid-block attention",
         "UNet2DModel", "UNet2DModel",
         dict(sample_size=8, in_channels=3, out_channels=3, layers_per_block=1, block_out_channels=(8, 16),
              # attention in the middle block only: each attention block costs seconds of tracing
              down_block_types=("DownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "UpBlock2D"),
              norm_num_groups=4, attention_head_dim=8), inputs="noise", library="diffusers"),
    Arch("Flux", "diffusion", "joint text-image attention, 3-axis RoPE from position ids without a batch dim",
         "FluxTransformer2DModel", "FluxTransformer2DModel",
         dict(patch_size=1, in_channels=4, num_layers=1, num_single_layers=1, attention_head_dim=8,
              num_attention_heads=4, joint_attention_dim=16, pooled_projection_dim=8, guidance_embeds=False,
              axes_dims_rope=(2, 2, 4)), inputs="flux", library="diffusers"),
)

BY_NAME: dict[str, Arch] = {a.name: a for a in ARCHS}


def build(arch: Arch) -> nn.Module:
    """The model, seeded, every dropout probability 0 (parity needs a deterministic step)."""
    torch.manual_seed(0)
    library = importlib.import_module(arch.library)
    if arch.library == "diffusers":
        return getattr(library, arch.model)(**arch.kwargs)
    config = getattr(library, arch.config)(**arch.kwargs)
    for name in ("hidden_dropout_prob", "attention_probs_dropout_prob", "dropout", "attention_dropout",
                 "activation_dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop", "dropout_rate",
                 "hidden_dropout", "classifier_dropout", "mlp_dropout", "embedding_dropout", "drop_path_rate",
                 "attn_dropout", "resid_dropout", "emb_pdrop"):
        if isinstance(getattr(config, name, None), float):
            setattr(config, name, 0.0)
    return getattr(library, arch.model)(config)


def example(arch: Arch) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """The batch (seed 0) and the target (seed 1) the row is checked on."""
    feed = INPUTS[arch.inputs]
    return feed.inputs(torch.Generator().manual_seed(0)), feed.target(torch.Generator().manual_seed(1))


def loss_of(arch: Arch) -> Callable[[Any, torch.Tensor], torch.Tensor]:
    return INPUTS[arch.inputs].loss


def loaded(arch: Arch) -> LoadedModel:
    """The row as graphsplit loads a model file: builder, inputs, loss and target."""
    inputs, target = example(arch)
    return LoadedModel(Path(__file__), arch.name, lambda: build(arch), (), inputs, loss_of(arch), target)
