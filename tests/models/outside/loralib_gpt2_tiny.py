"""microsoft/LoRA's loralib (lora/loralib/, unchanged) and its GPT-2 of examples/NLG/src/model.py
(lora/examples/NLG/src/, unchanged) at a tiny config, built and trained as its gpt2_ft.py does (the
E2E command of examples/NLG/README.md: `--lora_dim 4 --lora_alpha 32 --label_smooth 0.1`):
`GPT2LMModel(GPT2Config(..., lora_attn_dim, lora_attn_alpha, lora_dropout))`,
`lora.mark_only_lora_as_trainable(lm_net)`, then `_lm_logits, _lm_loss = model(_input,
lm_labels=_target, lm_mask=_msk, label_smooth=args.label_smooth)` and `_lm_loss.mean()`. The model
computes its own loss: label-smoothed NLL per token, times the 0/1 mask (0 over the prompt and
padding), summed and divided by `lm_mask.sum() + 0.0001`. Exercises loralib's `MergedLinear` on the
fused q/k/v (LoRA on q and v only, `enable_lora=[True, False, True]`, `fan_in_fan_out=True`): its
low-rank update made by a grouped `F.conv1d` and scattered into the fused output through
`result[self.lora_ind] = x`, where `lora_ind` is a plain bool tensor attribute (not a buffer); frozen
base weights; a causal mask buffer used as `w * b - 1e10 * (1 - b)`; a tied LM head. lora_dropout 0
(the README uses 0.1), so runs compare."""

import importlib.util
import sys
from pathlib import Path

import torch

_root = Path(__file__).parent / "lora"
if str(_root) not in sys.path:
    sys.path.insert(0, str(_root))  # model.py: `import loralib as lora`
_spec = importlib.util.spec_from_file_location("lora_nlg_model", _root / "examples" / "NLG" / "src" / "model.py")
nlg_model = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = nlg_model
_spec.loader.exec_module(nlg_model)
import loralib as lora  # noqa: E402

VOCAB, BATCH, SEQ = 64, 4, 16


def build_model():
    torch.manual_seed(0)
    config = nlg_model.GPT2Config(vocab_size_or_config_json_file=VOCAB, n_positions=SEQ, n_ctx=SEQ, n_embd=32,
                                  n_layer=2, n_head=4, lora_attn_dim=4, lora_attn_alpha=32, lora_dropout=0.0)
    lm_net = nlg_model.GPT2LMModel(config)
    lora.mark_only_lora_as_trainable(lm_net)
    return lm_net


def example_inputs():
    # as data_utils.FT_Dataset pads them: prompt and completion, then zeros; the mask is 1 on the completion
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(1, VOCAB, (BATCH, SEQ + 1), generator=g)
    prompt = torch.tensor([5, 7, 4, 6])
    end = torch.tensor([16, 12, 14, 9])
    pos = torch.arange(SEQ)
    inside = pos[None, :] < end[:, None]
    _input = torch.where(inside, tokens[:, :-1], 0)
    _target = torch.where(inside, tokens[:, 1:], 0)
    _msk = (inside & (pos[None, :] >= prompt[:, None])).float()
    return {"input_ids": _input, "lm_labels": _target, "lm_mask": _msk, "label_smooth": 0.1}
