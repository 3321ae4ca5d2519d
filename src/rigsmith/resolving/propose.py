"""Propose the layout for this rig: every layout vLLM accepts (resolving.layout), sized against each GPU's
free memory and ranked by one written objective. Pure: a ``Summary`` of the checkpoint, the recipe's engine
flags and a ``Rig`` (cards, what other processes hold on them, which pairs talk P2P) in; ranked
``Proposal``s out.

Sizing. vLLM with ``--kv-cache-memory`` allocates that pool on every rank and checks utilisation only at
start (utilisation × total must be free after its runtime: "Free memory on device … is less than desired GPU
memory utilization"). A proposal sets ``--gpu-memory-utilization`` to the largest thousandth that check
passes on every card with the asked headroom, and ``--kv-cache-memory`` to the largest pool every rank holds
on its own card after its weights, activations, CUDA graphs, runtime and the headroom: a card that holds a
squatter's process has less room, so a stage there can hold fewer layers. The per-rank figures are fit's
own (``Estimate.usage``), so ``invoke fit`` on the applied layout counts what the proposal counted (it
warns where a rank uses more than utilisation × total: vLLM does not check that with an explicit pool).

The objective, in order (``Proposal.key``; larger is better):

1. it fits: every rank keeps the headroom asked for (by default fit's warn margin, 512 MiB, or the recipe's
   own least headroom where that is less), and the KV pool holds at least one block;
2. the longest context: ``--max-model-len`` = the smaller of the cap (the user's, else the recipe's, else
   the model's limit; never past the model's limit) and the pool;
3. the most concurrent sequences of that context (KV tokens = context × sequences, per DP replica);
4. tensor parallelism inside P2P groups: fewest TP GPU pairs that do not share a bridge with P2P;
5. the fewest pipeline stages, then the fewest stage boundaries that cross a host bridge;
6. the most KV tokens, then the fewest GPUs, then the fewest changes from the recipe, then the most
   headroom on the tightest rank.

Only layouts that fit are proposed; where the recipe's own layout runs, none holds fewer KV tokens than it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

from rigsmith.resolving.fit import KV_DTYPE_BYTES, WARN_HEADROOM, MiB, RankNeed
from rigsmith.resolving.fitengine import torch_total
from rigsmith.resolving.fitparams import EngineParams, pp_partition
from rigsmith.resolving.layout import Layout, Summary, layouts, of_params

#: Compute capability by GPU name (nvidia-smi's ``name``), first match wins.
GPU_ARCH: tuple[tuple[str, tuple[int, int]], ...] = (
    (r"RTX 50\d\d|RTX PRO \d+ Blackwell", (12, 0)),
    (r"B200|B100|GB200", (10, 0)),
    (r"H100|H200|H800|GH200", (9, 0)),
    (r"RTX 40\d\d|L40|L4\b|RTX \d+ Ada", (8, 9)),
    (r"A100|A800|A30\b", (8, 0)),
    (r"RTX 30\d\d|A40|A10\b|A16|A2\b|RTX A\d+", (8, 6)),
    (r"RTX 20\d\d|T4\b|Quadro RTX|TITAN RTX", (7, 5)),
    (r"V100|TITAN V", (7, 0)),
)

#: KV-cache dtypes vLLM supports by compute capability (docs: quantization/quantized_kvcache; FP8 KV
#: stores 8-bit values and dequantises in the attention kernel, which vLLM has for sm_80 and later).
KV_DTYPES_FROM: tuple[tuple[tuple[int, int], tuple[str, ...]], ...] = (
    ((8, 0), ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")),
    ((0, 0), ("auto",)),
)

#: KV tokens of a replica with no attention layer at all: only the cap bounds its context.
NO_ATTENTION = 1 << 40

#: The most ``--gpu-memory-utilization`` a proposal sets (vLLM's own guidance stops short of 1.0).
MAX_UTIL = 0.98


@dataclass(frozen=True)
class Card:
    """One GPU of the rig and what is not this deployment's on it."""

    index: int
    name: str
    total: int
    others: int  # bytes used by anything that is not this deployment
    squatters: tuple[tuple[str, int], ...] = ()  # (who, bytes)

    @property
    def has(self) -> int:
        return self.total - self.others


@dataclass(frozen=True)
class Rig:
    """The cards in the order vLLM numbers them, and which pairs (card positions) share a bridge with P2P.
    ``close`` None: no topology known (every pair counts as close)."""

    cards: tuple[Card, ...]
    close: frozenset[tuple[int, int]] | None = None
    arch: tuple[int, int] | None = None

    def near(self, a: int, b: int) -> bool:
        return self.close is None or (min(a, b), max(a, b)) in self.close


def arch_of(name: str, declared: str | None = None) -> tuple[int, int] | None:
    """Compute capability of a GPU from its name, else from the spec's ``resources.gpus.arch`` (sm_86)."""
    for pattern, cc in GPU_ARCH:
        if re.search(pattern, name):
            return cc
    m = re.fullmatch(r"sm_?(\d+)(\d)", declared or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def kv_dtypes(arch: tuple[int, int] | None, recipe: str) -> list[str]:
    """The KV dtypes to try: the recipe's, plain ``auto`` and ``fp8`` where the architecture has it."""
    ok = next((d for cc, d in KV_DTYPES_FROM if arch is not None and arch >= cc), ("auto",))
    same = KV_DTYPE_BYTES.get(recipe)  # auto and fp8 differ in size: at most one of them is the recipe's
    return [recipe, *(d for d in ("auto", "fp8") if d in ok and KV_DTYPE_BYTES.get(d) != same)]


@dataclass(frozen=True)
class RankFit:
    """One rank on its card, by fit's count."""

    card: Card
    need: RankNeed
    kv: int
    needs: int
    headroom: int


@dataclass(frozen=True)
class Proposal:
    """A layout with its engine flags, per-rank figures and place in the objective."""

    layout: Layout
    params: EngineParams
    ranks: tuple[RankFit, ...]  # every rank of every DP replica, in card order
    kv_tokens: int  # all replicas together
    max_context: int
    sequences: int
    tp_cross: int
    pp_cross: int
    fits: bool  # runs, with the asked headroom on every rank
    changes: int
    runs: bool = True  # fit's own line: no rank short of memory, a pool of at least one sequence

    def key(self) -> tuple[int, ...]:
        """The objective (module docstring), as a tuple compared largest first."""
        least = min(r.headroom for r in self.ranks)
        return (int(self.fits), self.max_context, self.sequences, -self.tp_cross, -self.layout.pp,
                -self.pp_cross, self.kv_tokens, -self.layout.gpus, -self.changes, least)  # fmt: skip


def _place(s: Summary, lay: Layout, params: EngineParams, rig: Rig) -> tuple[RankFit, ...]:
    est = s.estimate(params)
    out = []
    for d in range(lay.dp):
        for r in est.ranks:
            card = rig.cards[d * lay.group + r.rank]
            kv, _, needs = est.usage(r, card.total)
            out.append(RankFit(card, r, kv, needs, card.has - needs))
    return tuple(out)


def _size(s: Summary, lay: Layout, params: EngineParams, rig: Rig, headroom: int) -> EngineParams | None:
    """Utilisation and KV pool every rank holds with ``headroom`` left on its own card (None: no pool)."""
    est = s.estimate(params)
    pairs = list(zip(rig.cards[: lay.gpus], est.ranks * lay.dp, strict=True))
    # vLLM wants utilisation × PyTorch's total free at start, and the pool is what that leaves (fit's count)
    util = min((est.free_at_start(r, c.total) - (c.total - c.has) - headroom) / torch_total(c.total)
               for c, r in pairs)  # fmt: skip
    util = min(MAX_UTIL, int(util * 1000) / 1000)
    pool = min(c.has - headroom - est.outside_pool(r, c.total) for c, r in pairs)
    if util <= 0 or pool <= 0:
        return None
    return replace(params, gpu_memory_utilization=util, kv_cache_memory=pool)


def _tokens(ranks: Sequence[RankFit], block: int) -> int:
    """vLLM's KV cache size of one replica: whole blocks, the smallest rank decides."""
    out = [r.kv // (r.need.kv_bytes_per_token * block) * block for r in ranks if r.need.kv_bytes_per_token]
    return min(out) if out else NO_ATTENTION


def _cross(lay: Layout, rig: Rig) -> tuple[int, int]:
    """(TP pairs without a P2P bridge between them, PP boundaries that cross a host bridge)."""
    tp = pp = 0
    for d in range(lay.dp):
        base = d * lay.group
        for st in range(lay.pp):
            g = [base + st * lay.tp + t for t in range(lay.tp)]
            tp += sum(not rig.near(a, b) for i, a in enumerate(g) for b in g[i + 1 :])
            if st + 1 < lay.pp:
                pp += not rig.near(g[0], g[0] + lay.tp)
    return tp, pp


def evaluate(
    s: Summary,
    lay: Layout,
    params: EngineParams,
    rig: Rig,
    *,
    cap: int | None,
    headroom: int,
    recipe: Layout | None = None,
) -> Proposal:
    """One layout with the given flags on the rig, by fit's per-rank count."""
    ranks = _place(s, lay, params, rig)
    block = params.block_size
    per = [_tokens(ranks[d * lay.group : (d + 1) * lay.group], block) for d in range(lay.dp)]
    tokens = min(per)
    ctx = tokens if cap is None else min(cap, tokens)
    seqs = sum(t // ctx for t in per) if ctx else 0
    runs = tokens >= block and all(r.headroom >= 0 and r.kv > 0 for r in ranks)
    if params.max_model_len is not None and tokens < params.max_model_len:
        runs = False  # stock vLLM refuses a pool shorter than one --max-model-len sequence
    fits = runs and all(r.headroom >= headroom for r in ranks)
    tp_x, pp_x = _cross(lay, rig)
    changes = 0 if recipe is None else sum(
        getattr(lay, f) != getattr(recipe, f) for f in ("tp", "pp", "dp", "ep", "partition", "kv_dtype")
    )  # fmt: skip
    return Proposal(lay, params, ranks, sum(per), ctx, seqs, tp_x, pp_x, fits, changes, runs)


def model_cap(s: Summary, base: EngineParams, user_cap: int | None) -> int | None:
    """The longest context to ask for: the user's cap, else the recipe's, never past the model's limit."""
    limit = s.shape.max_position_embeddings
    want = user_cap or base.max_model_len or limit
    return min(want, limit) if want and limit else want


def recipe_row(s: Summary, base: EngineParams, rig: Rig, headroom: int, dp: int = 1) -> Proposal:
    """The recipe's layout as it stands (its own KV flags), on this rig."""
    lay = of_params(base, dp)
    ctx = base.max_model_len or model_cap(s, base, None)
    return evaluate(s, lay, base, rig, cap=ctx, headroom=headroom)


def default_headroom(s: Summary, base: EngineParams, rig: Rig) -> int:
    """fit's warn margin (512 MiB), or the recipe's own least headroom where its layout runs closer."""
    if base.world > len(rig.cards):
        return WARN_HEADROOM
    own = recipe_row(s, base, rig, 0)
    least = min(r.headroom for r in own.ranks)
    return min(WARN_HEADROOM, least) if own.runs else WARN_HEADROOM


def search(
    s: Summary, base: EngineParams, rig: Rig, *, headroom: int, user_cap: int | None = None
) -> tuple[list[Proposal], int]:
    """Every layout on this rig, sized and ranked by the objective: the best split of each (TP, PP, DP,
    KV dtype), best first. Where the recipe's own layout runs, layouts with fewer KV tokens are left out.
    Returns the ranking and the number of candidates evaluated."""
    recipe = of_params(base)
    cap = model_cap(s, base, user_cap)
    known = set(s.keys)
    own = recipe_row(s, base, rig, headroom) if base.world <= len(rig.cards) else None
    floor = own.kv_tokens if own is not None and own.runs else 0
    seen = 0
    best: dict[tuple[int, int, int, str], Proposal] = {}
    for lay in layouts(s.shape, base, len(rig.cards), kv_dtypes(rig.arch, base.kv_cache_dtype)):
        if (lay.tp, lay.ep) not in known:
            continue
        seen += 1
        p0 = lay.params(replace(base, max_model_len=None))
        sized = _size(s, lay, p0, rig, headroom)
        prop = evaluate(s, lay, sized or p0, rig, cap=cap, headroom=headroom, recipe=recipe)
        if sized is None or not prop.fits or prop.kv_tokens < floor:
            continue
        prop = replace(prop, params=replace(sized, max_model_len=prop.max_context))
        k = (lay.tp, lay.pp, lay.dp, lay.kv_dtype)
        if k not in best or prop.key() > best[k].key():
            best[k] = prop
    ranked = sorted(best.values(), key=Proposal.key, reverse=True)
    return ranked, seen


# -- reasons in words ---------------------------------------------------------------------------------------


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
    out = []
    for st, (got, want) in enumerate(zip(parts, even, strict=True)):
        cards = [r.card for r in p.ranks[st * lay.tp : (st + 1) * lay.tp]]
        if got < want:
            squat = [(c, sum(b for _, b in c.squatters)) for c in cards if c.squatters]
            if squat:
                c, b = squat[0]
                out.append(f"GPU {c.index} holds a {b // MiB} MiB process: {_layers(want - got)} fewer there")
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
    if prm.kv_cache_memory is not None:
        out.append(
            f"--kv-cache-memory {prm.kv_cache_memory} at --gpu-memory-utilization "
            f"{prm.gpu_memory_utilization:g}: the largest pool every rank holds with "
            f"{headroom // MiB} MiB left"
        )
    out.append(f"max context {p.max_context:,} tokens, {p.sequences} sequence(s) of it at once")
    return out


# -- the cheapest fix --------------------------------------------------------------------------------


def _without_squatters(rig: Rig) -> Rig:
    cards = tuple(
        replace(c, others=max(c.others - sum(b for _, b in c.squatters), 0), squatters=()) for c in rig.cards
    )
    return replace(rig, cards=cards)


def prescribe(s: Summary, base: EngineParams, rig: Rig, ranked: Sequence[Proposal]) -> list[str]:
    """When the recipe's layout does not run (a rank short of memory, or a pool shorter than one
    --max-model-len sequence): the cheapest fixes, in this order, each taken only if it is needed: evict
    the named process, lower --max-model-len to what the pool holds (or switch the KV dtype), add a
    pipeline stage; else the best proposal. Empty when it runs."""
    if base.world > len(rig.cards):
        return _best(ranked, f"the recipe's layout needs {base.world} GPUs, the rig has {len(rig.cards)}")
    own = recipe_row(s, base, rig, 0)
    if own.runs:
        return []
    steps: list[str] = []
    short = [r.card for r in own.ranks if r.headroom < 0 and r.card.squatters]
    if short:
        clean = _without_squatters(rig)
        if all(r.headroom >= 0 for r in recipe_row(s, base, clean, 0).ranks):
            who = "; ".join(f"{w} on GPU {c.index}" for c in short for w, _ in c.squatters)
            steps.append(f"evict {who} (`kill PID`, `podman stop NAME`): the memory is then there")
            rig, own = clean, recipe_row(s, base, clean, 0)
    if all(r.headroom >= 0 and r.kv > 0 for r in own.ranks):
        tokens, mml = own.kv_tokens, base.max_model_len or 0
        if own.runs:
            return steps
        if tokens >= base.block_size:
            step = (
                f"lower --max-model-len to {tokens}: the KV pool holds {tokens:,} tokens, less than one "
                f"{mml:,}-token sequence"
            )
            for d in kv_dtypes(rig.arch, base.kv_cache_dtype)[1:]:
                if kv_bytes(d, s) < kv_bytes(base.kv_cache_dtype, s):
                    alt = recipe_row(s, replace(base, kv_cache_dtype=d), rig, 0)
                    step += f" (or switch --kv-cache-dtype {d}: {alt.kv_tokens:,} tokens)"
            return [*steps, step]
    more = replace(base, pp=base.pp + 1, pp_partition=None)
    if more.world <= len(rig.cards) and more.pp <= s.shape.num_layers and recipe_row(s, more, rig, 0).runs:
        return [*steps, f"add a stage: --pipeline-parallel-size {more.pp} (vLLM's even split)"]
    return _best(ranked, "")


def _best(ranked: Sequence[Proposal], why: str) -> list[str]:
    best = next((p for p in ranked if p.fits), None)
    if best is None:
        return [
            f"{why + ', and ' if why else ''}no layout fits with that headroom: free GPU memory or add GPUs"
        ]
    return [f"{why + ': ' if why else ''}take proposal 1, {best.layout.label()} (`invoke fit --apply 1`)"]
