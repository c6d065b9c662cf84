"""jadore801120/attention-is-all-you-need-pytorch's transformer/ package (attention_is_all_you_need/,
unchanged: Models, Layers, SubLayers, Modules, Constants and, as its __init__ imports them, Translator
and Optim) at a tiny size, built as its train.py builds it:

    transformer = Transformer(opt.src_vocab_size, opt.trg_vocab_size, src_pad_idx=opt.src_pad_idx,
        trg_pad_idx=opt.trg_pad_idx, trg_emb_prj_weight_sharing=opt.proj_share_weight,
        emb_src_trg_weight_sharing=opt.embs_share_weight, d_k=opt.d_k, d_v=opt.d_v, d_model=opt.d_model,
        d_word_vec=opt.d_word_vec, d_inner=opt.d_inner_hid, n_layers=opt.n_layers, n_head=opt.n_head,
        dropout=opt.dropout, scale_emb_or_prj=opt.scale_emb_or_prj)

with both sharings on (the constructor's defaults, and its usage line `-embs_share_weight
-proj_share_weight -label_smoothing`: one shared vocabulary, pad `<blank>` at index 1 as torchtext's
vocabulary puts it after `<unk>`), called as its train_epoch calls it (`pred = model(src_seq, trg_seq)`
with `trg_seq, gold = trg[:, :-1], trg[:, 1:].contiguous().view(-1)`) and trained on its cal_loss:
label-smoothed (eps 0.1) cross-entropy summed over the non-pad tokens (`reduction='sum'`, "average
later"). train.py itself cannot be imported (dill, tqdm and torchtext at its top), so cal_loss below is
its own, copied, and loss_fn calls it as its cal_performance does.

What it exercises: one embedding matrix tied three ways (source embedding, target embedding, output
projection), sinusoidal positions built with NumPy into a buffer and sliced `[:, :x.size(1)]`, pad masks
`(seq != pad_idx).unsqueeze(-2)` and a causal mask made in forward from `torch.triu(torch.ones(...))`,
`masked_fill(mask == 0, -1e9)` attention, post-norm residuals added in place (`q += residual`),
`seq_logit *= d_model ** -0.5` in place, an output flattened to (batch * length, vocab) and a flat
target, a label-smoothed loss built with `scatter` and `masked_select`, dropout 0.1 (train.py's
default) in the embeddings, attention probabilities and residual branches."""

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent / "attention_is_all_you_need"))
from transformer.Models import Transformer  # noqa: E402

UNK, PAD, BOS, EOS = 0, 1, 2, 3  # torchtext's order: <unk>, <blank>, then <s>, </s>
VOCAB, BATCH, SRC_LEN, TRG_LEN = 64, 8, 12, 13
SMOOTHING = True  # train.py's -label_smoothing, as its usage line trains


def build_model():
    torch.manual_seed(0)
    return Transformer(VOCAB, VOCAB, src_pad_idx=PAD, trg_pad_idx=PAD,
                       trg_emb_prj_weight_sharing=True, emb_src_trg_weight_sharing=True,
                       d_k=8, d_v=8, d_model=32, d_word_vec=32, d_inner=64, n_layers=2, n_head=4,
                       dropout=0.1, scale_emb_or_prj="prj")


def _sentences(g, length):
    """<s> words </s> then <blank> padding, of varied lengths, as BucketIterator pads a batch."""
    seq = torch.full((BATCH, length), PAD)
    lengths = torch.randint(length // 2, length - 1, (BATCH,), generator=g)
    lengths[0] = length - 2  # the longest fills the batch
    for i, n in enumerate(lengths.tolist()):
        seq[i, 0] = BOS
        seq[i, 1:n + 1] = torch.randint(4, VOCAB, (n,), generator=g)
        seq[i, n + 1] = EOS
    return seq


def _data():
    g = torch.Generator().manual_seed(1)
    return _sentences(g, SRC_LEN), _sentences(g, TRG_LEN)


def example_inputs():
    src, trg = _data()
    return (src, trg[:, :-1].clone())  # patch_trg: trg[:, :-1]


def example_target():
    return _data()[1][:, 1:].contiguous().view(-1)  # patch_trg: gold


def cal_loss(pred, gold, trg_pad_idx, smoothing=False):
    """train.py's cal_loss, copied."""
    gold = gold.contiguous().view(-1)

    if smoothing:
        eps = 0.1
        n_class = pred.size(1)

        one_hot = torch.zeros_like(pred).scatter(1, gold.view(-1, 1), 1)
        one_hot = one_hot * (1 - eps) + (1 - one_hot) * eps / (n_class - 1)
        log_prb = F.log_softmax(pred, dim=1)

        non_pad_mask = gold.ne(trg_pad_idx)
        loss = -(one_hot * log_prb).sum(dim=1)
        loss = loss.masked_select(non_pad_mask).sum()  # average later
    else:
        loss = F.cross_entropy(pred, gold, ignore_index=trg_pad_idx, reduction="sum")
    return loss


def loss_fn(pred, gold):
    return cal_loss(pred, gold, PAD, smoothing=SMOOTHING)  # as cal_performance calls it
