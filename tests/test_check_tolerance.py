"""--check's tolerance where the untouched model's own fp32 rounding is large (launch/parity.py): BatchNorm
over a few samples amplifies any summation order's rounding, so a healthy program's gradients differ from
the fp32 reference by what that reference differs from exact arithmetic. Each value's tolerance is
NOISE_FACTOR times the distance of the fp32 reference from the untouched model in float64, or RTOL where
that is larger, each by relative error; an error a real bug makes is still far outside it."""


from graphsplit import Plan
from graphsplit.launch.parity import check_locally, compare
from graphsplit.launch.reference import precise_step, reference_step, reordered_step
from graphsplit.launch.tolerance import NOISE_FACTOR, RTOL
from graphsplit.loader import load_model

from .conftest import MODELS

NOISY = MODELS / "outside" / "cifar_mobilenetv2_tiny.py"  # pytorch-cifar's MobileNetV2: 52 BatchNorms


def _steps():
    loaded = load_model(str(NOISY))
    model = loaded.build("cpu", seed=0)
    args = (loaded.args, loaded.kwargs, loaded.target, loaded.loss_fn)
    return reference_step(model, *args), precise_step(model, *args), reordered_step(model, *args)


def test_a_healthy_noisy_model_passes_where_a_fixed_atol_fails_and_a_real_error_does_not():
    """The healthy program here is the untouched model itself, on one thread (as a rank runs): its kernels
    sum in another order. That order is one of the two noise samples the check takes (the fp32 reference's
    and the reordered step's distances from float64); the end-to-end case, the program on real processes
    beside the reference, is tests/test_outside_zoo.py's pp 2 run of this model."""
    ref, precise, reordered = _steps()
    assert not compare(None, None, reordered.grads, ref).ok  # 1e-5 is below this model's own noise
    healthy = compare(None, None, reordered.grads, ref, precise=precise, reordered=reordered)
    assert healthy.ok, healthy.failures
    assert max(healthy.tolerances.values()) > 100 * RTOL
    # one gradient 10% off (a wrong scale on one rank): caught, and named
    for name in ("layers.3.conv2.weight", "linear.weight"):
        wrong = {**reordered.grads, name: reordered.grads[name] * 0.9}
        bad = compare(None, None, wrong, ref, precise=precise, reordered=reordered)
        assert [f.split(":")[0] for f in bad.failures] == [f"grad {name}"]
    # the head's gradient is far less noisy than the first convolution's: each value its own tolerance
    assert healthy.tolerances.get("grad linear.weight", RTOL) < 0.01 * healthy.tolerances["grad conv1.weight"]


def test_check_says_the_tolerance_it_used():
    program, cmp = check_locally(load_model(str(NOISY)), Plan(pp=2))
    assert cmp.ok, cmp.failures
    noisy = [what for what, tol in cmp.tolerances.items() if tol > RTOL]
    assert noisy and all(cmp.max_diff[w] <= cmp.tolerances[w] for w in noisy)
    assert NOISE_FACTOR == 10.0
