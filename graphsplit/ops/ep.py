"""Expert parallelism's token exchange, as autograd functions the stage graphs call by name.

A mixture-of-experts layer whose experts are one grouped weight `[E, ..]` runs them on its
tokens sorted by expert (`offsets`: the running count of rows per expert; HF's grouped experts,
torch's grouped_mm). Under `--ep N` each rank of an expert-parallel group holds E / N whole
experts (rank r: experts r*E/N .. (r+1)*E/N - 1) and these two calls surround the experts:

- `ep_dispatch(x, offsets, comm, layer, *extras)` -> (rows for this rank's experts, their offsets,
  counts, extras moved alike):
  the tokens' counts per expert are exchanged first (one all-to-all of E numbers), then each
  rank's sorted rows go to the ranks holding their experts (one `all_to_all_single` with the
  variable split sizes the counts give) and the rows received are regrouped by local expert.
- `ep_combine(y, routed, offsets, comm)`: the experts' outputs back to the ranks and the rows
  they came from (the inverse regrouping, the inverse all-to-all), in the order `x` had.

Experts written as a Python loop over an `nn.ModuleList` (mistral-inference's reference MoE, older HF
Mixtral: each expert called on the rows it picked) use the same exchange through two calls around the
loop (passes/expert_loops.py): `ep_send(comm, layer, *pieces)` takes each expert's rows as the model
picked them and returns the rows of each expert this rank holds; `ep_return(comm, received, pieces,
outputs)` the outputs of this rank's experts back to the pieces they came from, one per expert.

Experts written as a stacked weight gathered per row (`self.w1[expert_ids]`, one `[d, h]` matrix per
token, then `torch.bmm` or an einsum over the rows: passes/expert_gathers.py) move their rows around
each op that reads such a gather: `ep_route_rows(index, E, comm, layer, *rows)` sorts the rows by their
expert and sends them (their expert ids with them, made local) to the experts' ranks, where the op reads
the rank's slice of the weight; `ep_unroute_rows(y, routed, comm)` brings the op's output rows back in
their own order.

Backward of each all-to-all is the all-to-all of the gradients the other way. No token is
dropped: every row goes where the model's own routing sent it (the model's capacity policy,
if any, stays in its graph). The communicator (`EPComm`, `self.ep_comm`) holds the group;
unbound (the meta analysis) every expert is local and nothing moves, the shapes a balanced
routing gives. It counts the rows each local expert received: the load balance.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .communicator import Communicator
from .eager import eager as _eager

EP_COMM_ATTR = "ep_comm"


class EPComm(Communicator):
    """The expert-parallel ranks one graph's token exchanges run over (see the module doc)."""

    axis = "ep"
    link: dist.ProcessGroup | None

    def __init__(self, ep: int) -> None:
        super().__init__(ep)
        # the layer's index -> rows each local expert received, summed over calls (`take_tokens`)
        self.tokens: dict[int, torch.Tensor] = {}

    @property
    def ep(self) -> int:
        return self.degree

    @property
    def group(self) -> dist.ProcessGroup | None:
        return self.link

    def exchange(self, x: torch.Tensor, out_splits: list[int], in_splits: list[int]) -> torch.Tensor:
        out = x.new_empty((sum(out_splits), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=self.group)
        return out

    @property
    def rank(self) -> int:
        """This rank's place in its expert-parallel group (it holds experts rank*E/ep ..)."""
        return dist.get_rank(group=self.group)

    def count(self, received: torch.Tensor, layer: int) -> None:
        per_expert = received.sum(0).detach().cpu()
        self.tokens[layer] = per_expert + self.tokens[layer] if layer in self.tokens else per_expert

    def take_tokens(self) -> dict[int, torch.Tensor]:
        """The rows each local expert received since the last call, by layer (then zeroed)."""
        found, self.tokens = self.tokens, {}
        return found


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, out_splits, in_splits, comm):  # type: ignore[override]
        ctx.splits, ctx.comm = (out_splits, in_splits), comm
        return comm.exchange(x, out_splits, in_splits)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        out_splits, in_splits = ctx.splits
        return ctx.comm.exchange(grad.contiguous(), in_splits, out_splits), None, None, None


def _counts(offsets: torch.Tensor) -> torch.Tensor:
    """Rows per expert from the running counts."""
    running = offsets.long()
    return torch.diff(running, prepend=running.new_zeros(1))


def _by_expert(received: torch.Tensor) -> torch.Tensor:
    """The order that regroups rows laid out source by source (each source's rows by local expert,
    `received[source, expert]` of them) expert by expert (each expert's rows source by source)."""
    flat = received.flatten()
    starts = (torch.cumsum(flat, 0) - flat).view_as(received)
    counts_t, starts_t = received.t().flatten(), starts.t().flatten()
    total = int(flat.sum())
    first = torch.repeat_interleave(starts_t, counts_t, output_size=total)
    within = torch.arange(total, device=received.device) - torch.repeat_interleave(
        torch.cumsum(counts_t, 0) - counts_t, counts_t, output_size=total)
    return first + within


def _route(offsets: torch.Tensor, rows: int, comm: EPComm) -> tuple[torch.Tensor, list[int], list[int]]:
    """(rows each source sends each local expert [ep, E/ep], rows sent per rank, rows received per rank)."""
    counts = _counts(offsets)
    experts = counts.numel()
    if experts % comm.ep:
        raise RuntimeError(f"expert parallelism over {comm.ep} ranks needs the experts ({experts}) divisible by it")
    if int(counts.sum()) != rows:
        raise RuntimeError(f"the experts' offsets count {int(counts.sum())} rows but {rows} were routed; expert "
                           "parallelism exchanges exactly the rows the offsets cover")
    received = torch.empty_like(counts)
    dist.all_to_all_single(received, counts, group=comm.group)  # equal splits: E/ep counts per rank
    local = experts // comm.ep
    sent = counts.view(comm.ep, local).sum(1).tolist()
    received = received.view(comm.ep, local)
    return received, sent, received.sum(1).tolist()


def _send(x: torch.Tensor, offsets: torch.Tensor, comm: EPComm, layer: int,
          extras: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    received, sent, got = _route(offsets, x.shape[0], comm)
    if layer >= 0:  # (a layer's later exchanges move the same rows: counted once)
        comm.count(received, layer)
    order = _by_expert(received)
    local_offsets = torch.cumsum(received.sum(0), 0).to(offsets.dtype)
    moved = [_AllToAll.apply(t, got, sent, comm)[order] for t in (x, *extras)]
    return (moved[0], local_offsets, received, *moved[1:])


def _back(y: torch.Tensor, received: torch.Tensor, offsets: torch.Tensor, comm: EPComm) -> torch.Tensor:
    order = _by_expert(received)
    by_source = torch.empty_like(order)
    by_source[order] = torch.arange(order.numel(), device=order.device)
    back = y[by_source]
    sent = _counts(offsets).view(comm.ep, -1).sum(1).tolist()
    return _AllToAll.apply(back, sent, received.sum(1).tolist(), comm)


@torch.fx.wrap
@_eager
def ep_dispatch(x: torch.Tensor, offsets: torch.Tensor, comm: EPComm, layer: int = 0,
                *extras: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(rows for this rank's experts grouped by expert, their offsets, rows per (source, local expert),
    then each of `extras` moved alike); `layer`: the layer's index among the program's expert layers,
    for counting its load; `extras`: other values with one row per routed row that the experts read
    (gpt-oss's per-row bias), exchanged with the same splits."""
    if not comm.bound:
        return (x, offsets, _counts(offsets).view(1, -1), *extras)
    return _send(x, offsets, comm, layer, extras)


@torch.fx.wrap
@_eager
def ep_combine(y: torch.Tensor, routed: tuple[torch.Tensor, torch.Tensor, torch.Tensor], offsets: torch.Tensor,
               comm: EPComm) -> torch.Tensor:
    """The experts' output rows `y` (as `ep_dispatch` grouped them) back in the order of its `x`."""
    if not comm.bound:
        return y
    return _back(y, routed[2], offsets, comm)


def _offsets(pieces: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """The running count of rows of `pieces` laid end to end (each expert's, in expert order)."""
    return torch.tensor([p.shape[0] for p in pieces], dtype=torch.long, device=pieces[0].device).cumsum(0)


@torch.fx.wrap
@_eager
def ep_send(comm: EPComm, layer: int, *pieces: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Each expert's rows (`pieces`, one per expert of a layer written as a loop, in expert order) to the
    rank holding that expert: (the rows of each of this rank's E / ep experts, from every source in rank
    order, ..., then rows per (source, local expert)). Unbound (the analysis): this rank's experts are the
    first E / ep and keep their own rows; the others' rows stay behind (`ep_return` stands in for them)."""
    local = len(pieces) // comm.ep
    if not comm.bound:
        return (*pieces[:local], torch.zeros((1, local), dtype=torch.long, device=pieces[0].device))
    rows, local_offsets, received = _send(torch.cat(pieces), _offsets(pieces), comm, layer, ())
    return (*rows.split(received.sum(0).tolist()), received)


@torch.fx.wrap
@_eager
def ep_return(comm: EPComm, received: torch.Tensor, pieces: tuple[torch.Tensor, ...],
              outputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """The outputs of this rank's experts (`outputs`, on the rows `ep_send` gave them) back to where each
    expert's rows came from: one output per piece of `pieces`, row for row (only their sizes are read).
    Unbound: the experts held elsewhere give zeros of their pieces' sizes (shapes for the analysis)."""
    sizes = [p.shape[0] for p in pieces]
    if not comm.bound:
        return (*outputs, *(outputs[0].new_zeros((n, *outputs[0].shape[1:])) for n in sizes[len(outputs):]))
    return _back(torch.cat(outputs), received, _offsets(pieces), comm).split(sizes)


@torch.fx.wrap
@_eager
def ep_route_rows(index: torch.Tensor, experts: int, comm: EPComm, layer: int,
                  *rows: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Rows that read a per-row gather of an `[experts, ..]` weight (`index`: each row's expert) to the
    ranks holding their experts: (each of `rows` as this rank received them, their experts' indices into
    this rank's slice of the weight, rows per (source, local expert), the order that sorted them, the
    running count of rows per expert). Unbound: the rows and the index as they are (the whole weight)."""
    if not comm.bound:
        spare = index.new_zeros(1)
        return (*rows, index, spare, spare, spare)
    order = torch.argsort(index, stable=True)
    offsets = torch.bincount(index, minlength=experts).cumsum(0)
    moved = _send(rows[0][order], offsets, comm, layer, (*(r[order] for r in rows[1:]), index[order]))
    received, extras = moved[2], moved[3:]
    local = extras[-1] - comm.rank * (experts // comm.ep)
    return (moved[0], *extras[:-1], local, received, order, offsets)


@torch.fx.wrap
@_eager
def ep_unroute_rows(y: torch.Tensor, routed: tuple[torch.Tensor, ...], comm: EPComm) -> torch.Tensor:
    """An op's output rows, computed where `ep_route_rows` sent its rows, back in their own order."""
    if not comm.bound:
        return y
    received, order, offsets = routed[-3], routed[-2], routed[-1]
    return _back(y, received, offsets, comm).index_select(0, torch.argsort(order))
