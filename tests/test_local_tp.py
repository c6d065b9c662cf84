"""The local backend runs tp shards too: one thread per tp rank, one process, real collectives.

Each model at tp 2 (and tp 2 x pp 2, and tp 4 where its heads allow) equals the
untouched model: loss, output, and each rank's gradient against the matching
slice of the original gradient (fp32, 1e-5 relative, or the untouched model's own noise x10); every rank runs
exactly the collectives the graphs say, per micro-batch.
"""

import threading

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from graphsplit import GraphsplitError, Plan
from graphsplit.analysis.collectives import collectives, count_table
from graphsplit.backends import threads
from graphsplit.backends.local import LocalProgram
from graphsplit.ir.sharding import Shard, shard_tensor, unpad
from graphsplit.launch.parity import check_locally
from graphsplit.launch.reference import reference_step
from graphsplit.loader import load_model
from graphsplit.ops import tp as tpops
from graphsplit.ops.tp_comm import TPComm
from graphsplit.rewrite import rewrite_loaded
from graphsplit.runtime.materialize import model_tensors

from .conftest import EXAMPLES, MODELS, traced_once

PLANS = {
    "tp2": Plan(tp=2), "tp2-pp2": Plan(tp=2, pp=2), "tp4": Plan(tp=4),
    "tp2-pp2-gpipe": Plan(tp=2, pp=2, schedule="gpipe"),
    "tp2-pp2-blocks": Plan(tp=2, pp=2, checkpoint="blocks"),  # recomputation runs the forward collectives again
    "tp2-pp2-bf16": Plan(tp=2, pp=2, autocast="bf16"),  # loss and outputs within bf16 tolerance of fp32
}
CASES = [("gpt", "tp2"), ("gpt", "tp2-pp2"), ("gpt", "tp4"), ("gpt", "tp2-pp2-blocks"), ("gpt", "tp2-pp2-bf16"),
         ("llama", "tp2"), ("llama", "tp2-pp2-gpipe"), ("llama", "tp4"),  # tp4: 2 kv heads, replicated and sliced per rank
         ("bert", "tp2"), ("bert", "tp2-pp2"), ("bert", "tp4"),
         ("mlp", "tp2")]  # an MSE loss: the output is gathered, not kept sharded


@pytest.mark.parametrize("name, plan", CASES, ids=[f"{n}-{p}" for n, p in CASES])
def test_tp_shards_in_threads_equal_the_untouched_model(name, plan):
    program, cmp = check_locally(load_model(str(EXAMPLES / f"{name}.py")), PLANS[plan])
    assert cmp.ok, cmp.failures
    tp = PLANS[plan].tp
    for rank in range(tp):  # every rank's gradients were compared, sharded ones among them
        compared = {k.removeprefix("grad ").removesuffix(f" (rank {rank})") for k in cmp.max_diff if k.endswith(f"(rank {rank})")}
        assert compared and compared & set(program.param_shardings)
    assert {"loss", "output[0]"} <= set(cmp.max_diff)


# tied: 3 padding rows at tp 4, 1 at tp 2 under a pipeline; untied with a bias
ODD = [("odd_vocab.py", "tp4"), ("odd_vocab.py", "tp2-pp2"), ("odd_vocab.py:build_untied", "tp2")]


@pytest.mark.parametrize("spec, plan", ODD, ids=[f"{s}-{p}" for s, p in ODD])
def test_a_vocabulary_tp_does_not_divide_equals_the_untouched_model(spec, plan):
    """97 tokens, tied or an LM head of its own with a bias: padded inside, vocab-parallel
    cross-entropy, the user's output exactly 97 wide, each rank's real rows of the gradient equal
    to the original's (check_locally compares them; the padding rows' gradient is zero)."""
    program, cmp = check_locally(load_model(str(MODELS / spec)), PLANS[plan])
    assert cmp.ok, cmp.failures
    assert program.loss_gm is not None and program.sharded_outputs  # the logits stay sharded into the loss
    head = "lm_head.weight" if "untied" in spec else "wte.weight"
    tp = PLANS[plan].tp
    assert program.param_shardings[head].size == 97
    for rank in range(tp):
        assert f"grad {head} (rank {rank})" in cmp.max_diff
    assert {"loss", "output[0]"} <= set(cmp.max_diff)


def test_padding_rows_stay_zero_and_out_of_the_output():
    loaded = load_model(str(MODELS / "odd_vocab.py:build_untied"))
    program = rewrite_loaded(loaded, Plan(tp=4)).program
    model = loaded.build("cpu", seed=0)
    local = LocalProgram(program, model_tensors(model), loaded.loss_fn)
    results = local.step(program.traced.flatten_inputs(loaded.args, loaded.kwargs), loaded.target)
    assert results[0].output.shape[-1] == 97  # what the user sees: the real vocabulary
    last = results[3]  # 25 rows: 22 real, 3 padding
    for name in ("lm_head.weight", "lm_head.bias"):
        assert last.grads[name].shape[0] == 25 and not last.grads[name][22:].any()


def test_vocab_parallel_cross_entropy_masks_the_padding_columns():
    """tp 4 threads, 97 classes in blocks of 25 (the last with 3 padding columns holding garbage):
    the loss and the real columns' gradients of F.cross_entropy on the whole logits."""
    logits = torch.randn(6, 97, dtype=torch.float64)
    target = torch.tensor([0, 96, 50, 75, -100, 24])
    ref = logits.clone().requires_grad_(True)
    want = F.cross_entropy(ref, target)
    want.backward()
    hub = threads.ThreadHub(4)

    def work(rank):
        comm = TPComm(4)
        comm.bind(threads.ThreadLink(hub, rank))
        block = shard_tensor(logits, Shard(1, size=97), rank, 4).clone()
        if rank == 3:
            block[:, 22:] = 1e4  # padding: never a logit
        block.requires_grad_(True)
        loss = tpops.vocab_parallel_cross_entropy(block, target, -100, "mean", comm, vocab=97)
        loss.backward()
        whole = tpops.gather_from_tp(block.detach(), 1, comm, size=97)
        return loss.detach(), block.grad, whole

    out = threads.run_ranks(hub, work)
    for rank, (loss, grad, whole) in enumerate(out):
        torch.testing.assert_close(loss, want.detach())
        torch.testing.assert_close(unpad(grad, Shard(1, size=97), rank, 4), shard_tensor(ref.grad, Shard(1, size=97), rank, 4, pad=False))
        assert torch.equal(whole, logits)  # gathered and cut to 97
    assert not out[3][1][:, 22:].any()


def _static_counts(program):
    graphs = [st.gm.graph for st in program.stages] + ([program.loss_gm.graph] if program.loss_gm is not None else [])
    return count_table(collectives(graphs))["total"]


@pytest.mark.parametrize("name", ["gpt", "llama", "bert", "mlp"])
def test_each_rank_runs_exactly_the_statically_counted_collectives(name):
    loaded = load_model(str(EXAMPLES / f"{name}.py"))
    program = rewrite_loaded(loaded, Plan(tp=2, pp=2)).program
    local = LocalProgram(program, model_tensors(loaded.build("cpu", seed=0)), loaded.loss_fn)
    local.step(program.traced.flatten_inputs(loaded.args, loaded.kwargs), loaded.target)
    per_microbatch = _static_counts(program)
    assert per_microbatch["forward"]["all_reduce"] > 0 and per_microbatch["backward"]["all_reduce"] > 0
    n = program.plan.num_microbatches
    for rank in range(2):
        counts = local.counts(rank)
        runtime = {d: {k: c for (dd, k), c in counts.items() if dd == d} for d in ("forward", "backward")}
        assert runtime == {d: {k: c * n for k, c in kinds.items()} for d, kinds in per_microbatch.items()}


def test_the_check_fails_when_a_collective_does_not_reduce(monkeypatch):
    """Sabotage: an all-reduce that keeps each rank's own partial sum. The check must see it."""
    monkeypatch.setattr(threads.ThreadLink, "all_reduce", lambda self, x, op: x)
    _, cmp = check_locally(load_model(str(EXAMPLES / "gpt.py")), Plan(tp=2))
    assert not cmp.ok
    assert any(f.startswith(("loss", "output")) for f in cmp.failures)


def test_each_rank_holds_its_slice_of_the_gradient():
    """What `check_ranks` compares, spelled out once: rank r's gradient of a column-parallel weight is
    rows r of the untouched model's gradient, and of a row-parallel weight its columns."""
    loaded = load_model(str(EXAMPLES / "llama.py"))
    program = rewrite_loaded(loaded, Plan(tp=2)).program
    model = loaded.build("cpu", seed=0)
    local = LocalProgram(program, model_tensors(model), loaded.loss_fn)
    results = local.step(program.traced.flatten_inputs(loaded.args, loaded.kwargs), loaded.target)
    ref = reference_step(model, loaded.args, loaded.kwargs, loaded.target, loaded.loss_fn, program.plan.num_microbatches)
    for name, dim in (("layers.0.attention.wq.weight", 0), ("layers.0.attention.wo.weight", 1)):
        full = ref.grads[name]
        for r in results:
            assert r.grads[name].shape[dim] == full.shape[dim] // 2
            torch.testing.assert_close(r.grads[name], full.chunk(2, dim=dim)[r.tp_rank], rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(r.grads[name], shard_tensor(full, program.param_sharding(name), r.tp_rank, 2))
    assert torch.equal(results[0].loss, results[1].loss)  # every rank computes the same loss


def test_thread_collectives_have_process_group_semantics():
    hub = threads.ThreadHub(3)

    def work(rank):
        link = threads.ThreadLink(hub, rank)
        x = torch.tensor([float(rank), 10.0 - rank])
        total = link.all_reduce(x.clone(), dist.ReduceOp.SUM)
        biggest = link.all_reduce(x.clone(), dist.ReduceOp.MAX)
        parts = link.all_gather(x)
        x.add_(100)  # a rank changing its tensor afterwards changes nobody's result
        return total, biggest, parts

    for total, biggest, parts in threads.run_ranks(hub, work):
        assert total.tolist() == [3.0, 27.0] and biggest.tolist() == [2.0, 10.0]
        assert [p.tolist() for p in parts] == [[0.0, 10.0], [1.0, 9.0], [2.0, 8.0]]


def test_a_failing_rank_stops_the_others_and_its_error_is_raised():
    hub = threads.ThreadHub(2, timeout_s=30)

    def work(rank):
        if rank == 1:
            raise GraphsplitError("rank 1 broke")
        return threads.ThreadLink(hub, rank).all_reduce(torch.ones(1), dist.ReduceOp.SUM)  # would wait forever

    with pytest.raises(GraphsplitError, match="rank 1 broke"):
        threads.run_ranks(hub, work)
    assert threading.active_count() == 1 or all(not t.name.startswith("tp-rank-") for t in threading.enumerate())


@pytest.mark.parametrize("model, plan", [
    ("resnet.py", Plan(dp=2)),  # BatchNorm: each replica's statistics are its share's, not the batch's
    ("resnet.py", Plan(dp=4, pp=2)),
    ("gpt.py", Plan(dp=2, pp=2, tp=2)),
])
def test_the_local_backend_runs_dp_replicas_on_their_shares_and_averages_their_gradients(model, plan):
    loaded, traced = traced_once(EXAMPLES / model)
    program, cmp = check_locally(loaded, plan, traced=traced)
    assert cmp.ok, cmp.failures
    world = plan.dp * plan.tp
    assert {int(k.rsplit("rank ", 1)[1].rstrip(")")) for k in cmp.max_diff if k.startswith("grad")} == set(range(world))


def test_the_local_backend_gives_each_replica_its_share_and_the_mean_of_their_gradients():
    """What the replicas report, against the untouched model run on each share by hand: replica d's
    output is the model's on the d-th half of the batch, every replica's gradient the halves' mean."""
    loaded, traced = traced_once(EXAMPLES / "resnet.py")
    program = rewrite_loaded(loaded, Plan(dp=2), traced=traced).program
    model = loaded.build("cpu", seed=0)
    local = LocalProgram(program, model_tensors(model), loaded.loss_fn)
    inputs = program.traced.flatten_inputs(loaded.args, loaded.kwargs)
    target = loaded.target
    steps = local.step(inputs, target)
    assert [s.dp_rank for s in steps] == [0, 1]
    halves = [reference_step(model, (x,), {}, t, loaded.loss_fn, 1)
              for x, t in zip(inputs[0].chunk(2), target.chunk(2))]
    for d, s in enumerate(steps):
        assert torch.allclose(s.output, halves[d].output, atol=1e-5)
        for name, g in s.grads.items():
            assert torch.allclose(g, (halves[0].grads[name] + halves[1].grads[name]) / 2, atol=1e-6), name
    assert torch.allclose(steps[0].loss, (halves[0].loss + halves[1].loss) / 2, atol=1e-6)


def test_the_local_backend_refuses_sync_bn_over_dp_replicas():
    loaded, traced = traced_once(EXAMPLES / "resnet.py")
    program = rewrite_loaded(loaded, Plan(dp=2, sync_bn=True), traced=traced).program
    with pytest.raises(GraphsplitError, match="synchronized BatchNorm needs them together; check --sync-bn with run --check"):
        LocalProgram(program, model_tensors(loaded.build("cpu", seed=0)), loaded.loss_fn)


