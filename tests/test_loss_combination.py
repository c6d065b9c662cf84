"""run says how it combines the pieces' losses where a token mean makes that matter (issue 21, item 4):
normalized by the global token count where graphsplit proves how the mean reduces (tests/test_token_mean.py),
averaged as equals, and said so, where it cannot."""

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from graphsplit import Plan
from graphsplit.analysis.loss_reduction import token_means
from graphsplit.launch.loss_combination import combination_notes
from graphsplit.loader import load_model
from graphsplit.rewrite import rewrite_loaded

from .conftest import MODELS


class Losses(nn.Module):
    def __init__(self):
        super().__init__()
        self.module_mean = nn.CrossEntropyLoss(ignore_index=-1)
        self.module_sum = nn.CrossEntropyLoss(reduction="sum")

    def forward(self, x, t):
        return (F.cross_entropy(x, t) + F.cross_entropy(x, t, reduction="sum") + F.nll_loss(x.log_softmax(-1), t)
                + self.module_mean(x, t) + self.module_sum(x, t))


def test_token_means_are_found_in_every_spelling():
    traced = fx.symbolic_trace(Losses())
    assert len(list(token_means(traced))) == 3  # the two sums are not token means
    x, t = torch.randn(6, 5), torch.randint(0, 5, (6,))
    exported = torch.export.export(Losses(), (x, t)).module()
    assert len(list(token_means(exported))) == 3  # aten.cross_entropy_loss / nll_loss with reduction 1


def test_run_names_the_token_mean_it_normalizes():
    loaded = load_model(str(MODELS / "hf_gpt2_labels.py"))  # HF's own cross-entropy, inside the graph
    notes = combination_notes(rewrite_loaded(loaded, Plan(pp=2)).program)
    assert len(notes) == 1 and notes[0].startswith("the cross-entropy at modeling_gpt2.py:"), notes
    assert "normalized by the tokens it counts in the whole global batch: each of the 2 pieces" in notes[0]
    assert combination_notes(rewrite_loaded(loaded, Plan(pp=1, microbatches=1)).program) == []
    loaded = load_model(str(MODELS / "ignore_index.py"))  # loss_fn's own cross-entropy
    notes = combination_notes(rewrite_loaded(loaded, Plan(dp=2)).program)
    assert len(notes) == 1 and notes[0].startswith("the cross-entropy in loss_fn"), notes


def test_a_loss_fn_that_does_not_trace_is_said_to_be_averaged(tmp_path):
    src = (MODELS / "loss_output_only.py").read_text().replace(
        "return (output - 0.5).abs().mean()", "return output.abs().mean() if float(output.sum()) > 0 else output.mean()")
    (tmp_path / "m.py").write_text(src)
    loaded = load_model(str(tmp_path / "m.py"))
    notes = combination_notes(rewrite_loaded(loaded, Plan(pp=2)).program)
    assert notes == ["loss_fn does not trace, so graphsplit cannot see how it reduces: the losses of the 2 pieces "
                     "of the batch (micro-batches x replicas) are averaged as equals"]
