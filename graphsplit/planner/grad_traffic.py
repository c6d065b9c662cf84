"""What a step's gradients and FSDP's gathers move through memory outside the model's ops.

The op table prices every op of the graph, forward and backward; these passes run beside it, on the
compute stream, each as the program runs it (backends/parallelize.py, torch's DDP, FSDP2 and pipelining
stage), in bytes read plus written:

- Gradient accumulation over micro-batches: a parameter's gradient is added into the one already held
  (autograd's AccumulateGrad, `grad += new`: read two, write one), every micro-batch after the first,
  wherever the gradients are not reduced every micro-batch (no dp, DDP under `no_sync`, FSDP under a
  pipeline: torch's stage defers its reduce-scatter to the last backward). FSDP with a low param dtype
  accumulates in its reduce dtype, fp32 (`FSDPParam.to_accumulated_grad_if_needed` upcasts the first
  micro-batch's bf16 gradient, `accumulate_unsharded_grad_if_needed` adds each later one in): the bf16
  gradient read, the fp32 one read and written.
- DDP's buckets (`gradient_as_bucket_view=False`, torch's default, which the program keeps): each
  gradient copied into its bucket before the all-reduce and back after it (none under a split-backward
  schedule, where plain dp averages the gradients after the step without DDP).
- FSDP2's copies: after each all-gather, `foreach_all_gather_copy_out` splits the gathered buffer into
  the parameters (read and write the gathered bytes, `split_with_sizes_copy`, on the compute stream once
  it waits for the gather); before each reduce-scatter, `foreach_reduce_scatter_copy_in` packs the
  unsharded gradients into the reduce-scatter's input in the reduce dtype (`chunk_cat`, on the compute
  stream before the reduce-scatter stream waits for it).

FSDP's sharded gradients (1/dp of the bytes) and the optimizer's step (priced on its own) are left out.
"""

from __future__ import annotations

from ..plan import Plan
from .dp_traffic import DpBytes


def grad_traffic_bytes(plan: Plan, moved: DpBytes) -> float:
    """Bytes the busiest rank's gradient bookkeeping and FSDP's copies move in a step (`moved`: its
    gradients in fp32, what FSDP gathers in the gathered dtype)."""
    m = plan.num_microbatches
    grads = moved.grads  # fp32 bytes of every gradient the rank computes
    if not plan.fsdp:
        # under a split backward plain dp is no DDP: its gradients are averaged after the step, in place
        return 3 * grads * (m - 1) + (4 * (grads - moved.experts) if plan.ddp else 0.0)  # DDP skips experts
    dense = grads - moved.experts  # FSDP shards these; expert weights stay whole (added like DDP's)
    low = moved.gathered < dense  # gathered (and the unsharded gradients made) in the low dtype
    unsharded = moved.gathered  # one copy of the dense gradients as backward makes them
    total = 3 * moved.experts * (m - 1)
    if plan.num_stages > 1:
        # gathered once at the stage's first forward; gradients accumulated unsharded and reduce-scattered
        # after the last backward
        total += 2 * moved.gathered
        if m > 1 and low:
            total += (unsharded + dense) + (m - 1) * (unsharded + 2 * dense) + 2 * dense
        elif m > 1:
            total += (m - 1) * 3 * dense + 2 * dense
        else:
            total += unsharded + dense
        return total
    # one stage: each micro-batch's gradients reduce-scattered as its backward ends
    root = dense - moved.regions  # fp32 bytes of the root unit (embeddings, head, norms)
    ratio = moved.gathered / dense if dense else 1.0  # gathered bytes per fp32 byte
    gathers = (root + 2 * moved.regions) * ratio * m if plan.fsdp_reshards else moved.gathered
    return total + 2 * gathers + m * (unsharded + dense)
