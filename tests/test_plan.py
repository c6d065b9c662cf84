import pytest

from graphsplit import GraphsplitError, Plan


def test_defaults_and_json_round_trip():
    plan = Plan(pp=4, microbatches=8, split_at=("h.2", "h.4", "h.6"))
    assert plan.num_stages == 4
    assert plan.num_microbatches == 8
    again = Plan.from_json(plan.to_json())
    assert again == plan
    assert isinstance(again.split_at, tuple)
    assert not plan.compile and Plan.from_json(plan.replace(compile=True).to_json()).compile


def test_checkpoint_overrides_round_trip_through_json():
    plan = Plan(pp=2, checkpoint="blocks", checkpoint_overrides=[["h.0", "none"], ("h.1*", "selective")])
    assert plan.checkpoint_overrides == (("h.0", "none"), ("h.1*", "selective"))
    assert plan.to_dict()["checkpoint_overrides"] == [["h.0", "none"], ["h.1*", "selective"]]
    again = Plan.from_json(plan.to_json())
    assert again == plan and hash(again) == hash(plan)
    assert Plan(checkpoint_overrides={"h.*.mlp": "full"}).checkpoint_overrides == (("h.*.mlp", "full"),)
    # a plan.json written before the field existed still loads
    old = {k: v for k, v in Plan(pp=2).to_dict().items() if k != "checkpoint_overrides"}
    assert Plan.from_dict(old).checkpoint_overrides == ()


def test_microbatches_default_to_number_of_stages():
    assert Plan(pp=2, schedule="interleaved-1f1b", stages_per_rank=2).num_microbatches == 4


def test_interleaved_placement_loops_over_ranks():
    plan = Plan(pp=2, schedule="interleaved-1f1b", stages_per_rank=2)
    assert [plan.stage_rank(s) for s in range(4)] == [0, 1, 0, 1]
    assert plan.stages_of_rank(1) == [1, 3]


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"pp": 0}, "Plan.pp"),
        ({"tp": -1}, "Plan.tp"),
        ({"microbatches": 0}, "Plan.microbatches"),
        ({"schedule": "zigzag"}, "Plan.schedule"),
        ({"stages_per_rank": 2}, "Plan.stages_per_rank"),
        ({"schedule": "interleaved-1f1b"}, "Plan.stages_per_rank"),
        ({"pp": 2, "split_at": ("a", "b")}, "Plan.split_at"),
        ({"checkpoint": "always"}, "Plan.checkpoint"),
        ({"autocast": "int8"}, "Plan.autocast"),
        ({"compile": "yes"}, "Plan.compile"),
        ({"checkpoint_overrides": (("h.0", "sometimes"),)}, "Plan.checkpoint_overrides"),
        ({"checkpoint_overrides": ("h.0",)}, "Plan.checkpoint_overrides"),
        ({"checkpoint_overrides": (("", "none"),)}, "Plan.checkpoint_overrides"),
        ({"checkpoint_overrides": "h.0=none"}, "Plan.checkpoint_overrides"),
    ],
)
def test_invalid_plans_name_the_field(kwargs, field):
    with pytest.raises(GraphsplitError, match=field.replace(".", r"\.")):
        Plan(**kwargs)


def test_unknown_json_field_is_refused():
    with pytest.raises(GraphsplitError, match="unknown field"):
        Plan.from_dict({"pp": 2, "pipelines": 3})


def test_zero_bubble_compiled_with_fsdp_low_precision_and_tp_is_refused():
    """That combination fails in torch's weight backward (run --check on the Llama example); refused
    in one line until fixed, and without any one of its features it runs (FSDP under bf16 with
    checkpointing too: ops/activation_checkpoint.py, passes/activation_checkpoint.py)."""
    full = dict(pp=2, dp=2, tp=2, schedule="zero-bubble", stages_per_rank=2, fsdp=True, autocast="bf16", compile=True)
    with pytest.raises(GraphsplitError, match=r"pytorch/pytorch#161904, open\); use interleaved-1f1b, or drop --compile"):
        Plan(**full)
    for dropped in ("fsdp", "autocast", "compile"):
        Plan(**{**full, dropped: None if dropped == "autocast" else False})
    Plan(**{**full, "tp": 1})
    Plan(**{**full, "schedule": "interleaved-1f1b"})
    Plan(**{**full, "compile": False, "checkpoint": "selective"})
