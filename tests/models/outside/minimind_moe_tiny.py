"""jingyaogong/minimind's model/model_minimind.py (minimind/model/, unchanged) at a tiny
mixture-of-experts config (`--use_moe 1`), trained as its trainer/train_pretrain.py does:
`res = model(input_ids, labels=labels)`, `loss = res.loss + res.aux_loss`. Besides what
minimind_tiny.py exercises, MOEFeedForward is a hand-written MoE: softmax router and top-k,
then a Python loop over the experts with `if mask.any():` (a branch on tensor values),
`mask.any(dim=-1).nonzero()` (a data-dependent number of tokens per expert), boolean-mask
indexing `topk_weight[mask]`, `y.index_add_` into a zeros tensor, a fallback
`y[0, 0] += 0 * sum(p.sum() ...)` for an unused expert in training, and a load-balancing loss kept
as a module attribute (`self.aux_loss`) and summed over layers by the model."""

import torch

from minimind_tiny import VOCAB, config, example_inputs, loss_fn  # noqa: F401
from minimind.model.model_minimind import MiniMindForCausalLM


def build_model():
    torch.manual_seed(0)
    return MiniMindForCausalLM(config(use_moe=True))  # its defaults: 4 experts, top-1, aux coef 5e-4
