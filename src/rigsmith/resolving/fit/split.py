"""The pipeline stage split weighted by each card's free memory (vLLM's ``VLLM_PP_LAYER_PARTITION``): as
many decoder layers on each stage as its tightest card holds. Pure: a ``layout.Summary`` and the cards in,
layer counts out; ``propose`` evaluates the split with fit's own count beside the others it tries.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from rigsmith.resolving.fit.fitengine import torch_total
from rigsmith.resolving.fit.fitparams import EngineParams
from rigsmith.resolving.fit.layout import Layout, Summary


class Room(Protocol):
    """A card as the split sees it: its name, its total bytes and what is free of other processes."""

    @property
    def name(self) -> str: ...

    @property
    def total(self) -> int: ...

    @property
    def has(self) -> int: ...


def weighted_split(
    s: Summary, lay: Layout, params: EngineParams, cards: Sequence[Room], headroom: int
) -> tuple[int, ...] | None:
    """The stage split weighted by each stage's free memory: as many layers on each stage as its tightest
    card holds, for the most KV tokens every stage keeps (``params.kv_cache_memory`` None: the pool is what
    utilisation × total leaves; set: that pool on every rank, for the most headroom on the tightest card).
    A 48 GiB card among 24s takes more layers, a card with a squatter fewer; 64 layers on three cards come
    out as whatever split holds. None: PP = 1 or no split fits."""
    n, pp, tp = s.shape.num_layers, lay.pp, lay.tp
    if pp == 1 or n < pp:
        return None
    est = s.estimate(lay.params(params))
    est = est.for_card(cards[0].total, cards[0].name) if cards else est
    per_layer = s.layer_bytes(tp, lay.ep)
    attn = set(s.shape.attention_layers)
    kv_layers = len(attn) + (s.shape.mtp_layers if params.mtp else 0)
    per_kv = sum(est.ranks[st * tp].kv_bytes_per_token for st in range(pp)) // kv_layers if kv_layers else 0
    mtp_kv = per_kv * (s.shape.mtp_layers if params.mtp else 0)
    stages = est.stages
    prefix = [[0] * (n + 1) for _ in range(tp)]
    for t in range(tp):
        for i in range(n):
            prefix[t][i + 1] = prefix[t][i] + per_layer[t][i]
    n_attn = [0] * (n + 1)
    for i in range(n):
        n_attn[i + 1] = n_attn[i] + (i in attn)
    room = []  # [stage][t]: bytes for this stage's layers and KV on its card
    for st, (a, b) in enumerate(stages):
        row = []
        for t in range(tp):
            r, c = est.ranks[st * tp + t], cards[st * tp + t]
            fixed = r.weights - (prefix[t][b] - prefix[t][a])
            # fit's count (Estimate.usage): the budget is utilisation × PyTorch's total, and what the rank
            # keeps beside its pool (driver reserve, runtime, memory outside PyTorch, graphs) comes off it
            beside = est.outside_pool(r, c.total) - r.weights
            if params.kv_cache_memory is None:
                top = int(torch_total(c.total) * params.gpu_memory_utilization)
                top = min(top, est.free_at_start(r, c.total) - (c.total - c.has) - headroom)
                top -= r.activation + r.non_torch + r.cuda_graphs
            else:
                top = c.has - headroom - beside - params.kv_cache_memory
            row.append(top - fixed)
        room.append(row)
    fixed_pool = params.kv_cache_memory is not None
    need = 0 if params.host_kv_offload else params.max_model_len or 0

    def kv(st: int, a: int, b: int) -> int:
        return per_kv * (n_attn[b] - n_attn[a]) + (mtp_kv if st == pp - 1 else 0)

    def ok(x: int) -> tuple[int, ...] | None:
        def fits(st: int, a: int, b: int) -> bool:
            if fixed_pool and kv(st, a, b) * need > (params.kv_cache_memory or 0):
                return False
            extra = x if fixed_pool else x * kv(st, a, b)
            return all(prefix[t][b] - prefix[t][a] + extra <= room[st][t] for t in range(tp))

        return _greedy(n, pp, fits)

    lo, hi = 0, 1 << 44
    best = ok(lo)
    if best is None:
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        got = ok(mid)
        if got is None:
            hi = mid - 1
        else:
            lo, best = mid, got
    return best


def _greedy(n: int, pp: int, fits: Callable[[int, int, int], bool]) -> tuple[int, ...] | None:
    """Stage by stage, as many layers as fit (each stage at least one; the last takes the rest): where
    adding a layer never makes a stage fit that did not, no split fits if this one does not."""
    parts, a = [], 0
    for st in range(pp):
        if st == pp - 1:
            if a >= n or not fits(st, a, n):
                return None
            parts.append(n - a)
            break
        b = a
        while b + 1 <= n - (pp - 1 - st) and fits(st, a, b + 1):
            b += 1
        if b == a:
            return None
        parts.append(b - a)
        a = b
    return tuple(parts)
