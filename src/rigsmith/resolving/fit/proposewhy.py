"""A proposal's reasons in words (``fit --propose``): placement on the bridges, the stage split, the KV flags
and the context. Pure: a ``propose.Proposal`` and the checkpoint's ``Summary`` in, sentences out.
"""

from __future__ import annotations

from collections.abc import Sequence

from rigsmith.resolving.fit.fit import KV_DTYPE_BYTES, GiB, MiB
from rigsmith.resolving.fit.fitparams import pp_partition
from rigsmith.resolving.fit.layout import Layout, Summary
from rigsmith.resolving.fit.propose import Card, Proposal


def kv_bytes(dtype: str, s: Summary) -> int:
    """Bytes of one cached value in ``dtype`` (``auto``: the model's dtype)."""
    return KV_DTYPE_BYTES.get(dtype) or (1 if dtype.startswith("fp8") else s.shape.dtype_bytes)


def _layers(n: int) -> str:
    return "one layer" if n == 1 else f"{n} layers"


def _gpus(cards: Sequence[Card]) -> str:
    return "+".join(f"GPU{c.index}" for c in cards)


def _split_reasons(p: Proposal, s: Summary) -> list[str]:
    lay, n = p.layout, s.shape.num_layers
    even = tuple(b - a for a, b in pp_partition(n, lay.pp))
    parts = lay.parts(n)
    most = max(r.card.has for r in p.ranks)
    out = []
    for st, (got, want) in enumerate(zip(parts, even, strict=True)):
        cards = [r.card for r in p.ranks[st * lay.tp : (st + 1) * lay.tp]]
        if got < want:
            squat = [(c, sum(b for _, b in c.squatters)) for c in cards if c.squatters]
            smallest = min(cards, key=lambda c: c.has)
            if squat:
                c, b = squat[0]
                out.append(f"GPU {c.index} holds a {b // MiB} MiB process: {_layers(want - got)} fewer there")
            elif smallest.has < most:  # a smaller card (a 3060 beside 3090s) before the stage's own extras
                out.append(
                    f"{_gpus(cards)} has {smallest.has / GiB:.2f} GiB free where the largest card has "
                    f"{most / GiB:.2f}: {_layers(want - got)} fewer there"
                )
            elif st == lay.pp - 1:
                extra = "the LM head" + (" and the MTP module" if p.params.mtp else "")
                out.append(
                    f"stage {st} ({_gpus(cards)}) also holds {extra}: {_layers(want - got)} fewer there"
                )
            elif st == 0:
                out.append(f"stage 0 ({_gpus(cards)}) also holds the embeddings: {_layers(want - got)} fewer")
            else:
                out.append(f"{_gpus(cards)} has less free memory: {_layers(want - got)} fewer there")
        elif got > want:
            out.append(f"{_gpus(cards)} takes {_layers(got - want)} more (it has the room)")
    return out


def reasons(p: Proposal, s: Summary, recipe: Layout, headroom: int) -> list[str]:
    """Why this proposal, in words: placement on the bridges, the split, the KV flags, the context."""
    lay, prm = p.layout, p.params
    out = []
    if lay.tp > 1:
        groups = [
            _gpus([r.card for r in p.ranks[g * lay.tp : (g + 1) * lay.tp]]) for g in range(lay.pp * lay.dp)
        ]
        where = "inside P2P groups" if p.tp_cross == 0 else f"with {p.tp_cross} GPU pair(s) without P2P"
        out.append(f"TP{lay.tp} {where} ({', '.join(groups)})")
    if lay.pp > 1:
        out.append(
            f"PP{lay.pp}: {', '.join(map(str, lay.parts(s.shape.num_layers)))} layers per stage"
            + (f"; {p.pp_cross} stage boundary(ies) cross a host bridge" if p.pp_cross else "")
        )
    out += _split_reasons(p, s)
    if lay.dp > 1:
        out.append(f"DP{lay.dp}: {lay.dp} replicas of the group, each with its own KV pool")
    if lay.ep != recipe.ep:
        out.append("expert parallel: whole experts per GPU" if lay.ep else "experts split over TP (no EP)")
    if lay.kv_dtype != recipe.kv_dtype:
        out.append(
            f"KV cache in {lay.kv_dtype} ({kv_bytes(lay.kv_dtype, s)} byte(s) a value; "
            "vLLM supports it on this GPU)"
        )
    base = s.base
    util = f"--gpu-memory-utilization {prm.gpu_memory_utilization:g}"
    if prm.gpu_memory_utilization < base.gpu_memory_utilization:
        util += f" (the recipe's {base.gpu_memory_utilization:g} is more than vLLM's start check passes)"
    if prm.kv_cache_memory is not None and prm.kv_cache_memory == base.kv_cache_memory:
        out.append(
            f"the recipe's --kv-cache-memory {prm.kv_cache_memory} kept (a fixed pool on every rank) at "
            + util
        )
    elif prm.kv_cache_memory is not None:
        out.append(
            f"--kv-cache-memory {prm.kv_cache_memory} at {util}: the largest pool every rank holds with "
            f"{headroom // MiB} MiB left"
        )
    else:
        out.append(f"the KV pool is what {util} leaves on each card, as the recipe sizes it")
    out.append(f"max context {p.max_context:,} tokens, {p.sequences} sequence(s) of it at once")
    return out
