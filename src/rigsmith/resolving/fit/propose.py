"""Propose the layout for this rig: every layout vLLM accepts (resolving.fit.layout), sized against each GPU's
free memory and ranked by one written objective. Pure: a ``Summary`` of the checkpoint, the recipe's engine
flags and a ``Rig`` (cards, what other processes hold on them, which pairs talk P2P) in; ranked
``Proposal``s out.

Where. Every choice of the rig's cards (``_subsets``: alike cards count once), TP only inside a group of
equal cards, each stage split as vLLM splits it, within a few layers of that, and weighted by free memory
(``resolving.fit.split``).

Sizing keeps the recipe's pins (``sizing``; ``--allow NAME`` frees one): its ``--max-model-len`` (or the
model's own context) must fit in the pool; its ``--kv-cache-memory`` is a fixed pool on every rank, the
utilisation then only vLLM's start check (utilisation × total free after its runtime: "Free memory on
device … is less than desired GPU memory utilization"); without one, the pool is what the utilisation
leaves. ``--gpu-memory-utilization`` is the recipe's, lowered to the largest thousandth that check passes
on every card with the asked headroom (a squatter's card has less room), never raised unless allowed. The
per-rank figures are fit's own (``Estimate.usage``), so ``invoke fit`` on the applied layout counts what the
proposal counted.

The objective, in order (``Proposal.key``; larger is better):

1. it fits: plain ``invoke fit`` says GO on every rank (``resolving.fit.fitverdict``, the one computation
   both use): each keeps the headroom asked for (by default fit's own warn margin, 512 MiB) and its pool
   holds one request of the served context (a recipe's host KV offload is not modelled: not a GO);
2. the longest context: the recipe's (pinned), or where allowed the smaller of the cap (the user's, else
   the recipe's, else the model's limit; never past the model's limit) and the pool;
3. the most concurrent sequences of that context (KV tokens = context × sequences, per DP replica);
4. tensor parallelism inside P2P groups: fewest TP GPU pairs that do not share a bridge with P2P;
5. the fewest pipeline stages, then the fewest stage boundaries that cross a host bridge;
6. the most KV tokens, then the fewest GPUs, then the fewest changes from the recipe, then the most
   headroom on the tightest rank.

Only layouts that fit are proposed; where the recipe's own layout fits, none holds fewer KV tokens than it.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

from rigsmith.resolving.fit.fit import KV_DTYPE_BYTES, Estimate, RankNeed
from rigsmith.resolving.fit.fitengine import torch_total
from rigsmith.resolving.fit.fitparams import EngineParams
from rigsmith.resolving.fit.fitverdict import Verdict, rank_verdict
from rigsmith.resolving.fit.layout import Layout, Summary, layouts, of_params
from rigsmith.resolving.fit.split import weighted_split

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

#: The most choices of cards of one size the search sizes (C(5, k) ≤ 10: every choice on up to 5 cards).
SUBSETS = 10

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
    verdict: Verdict = "go"  # plain fit's verdict on this rank (fitverdict), at the asked margin
    why: str = ""


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
    fits: bool  # plain fit's GO on every rank (resolving.fit.fitverdict), with the asked headroom
    changes: int
    runs: bool = True  # fit's own line: no rank short of memory, a pool of at least one sequence

    @property
    def cards(self) -> tuple[Card, ...]:
        """The cards it runs on, in the order vLLM numbers its ranks."""
        return tuple(r.card for r in self.ranks)

    def key(self) -> tuple[int, ...]:
        """The objective (module docstring), as a tuple compared largest first."""
        least = min(r.headroom for r in self.ranks)
        return (int(self.fits), self.max_context, self.sequences, -self.tp_cross, -self.layout.pp,
                -self.pp_cross, self.kv_tokens, -self.layout.gpus, -self.changes, least)  # fmt: skip


def on_cards(s: Summary, params: EngineParams, cards: Sequence[Card]) -> Estimate:
    """fit's estimate of ``params`` on these cards, as ``invoke fit`` makes it: the profile's batched tokens
    and sequences are the engine's, from the first card (vLLM reads device 0); each rank's pool is then
    sized on its own card (``Estimate.usage``) and the engine keeps the fewest blocks of any rank."""
    est = s.estimate(params)
    return est.for_card(cards[0].total, cards[0].name) if cards else est


def _place(s: Summary, lay: Layout, params: EngineParams, rig: Rig) -> tuple[RankFit, ...]:
    est = on_cards(s, params, rig.cards)
    out = []
    for d in range(lay.dp):
        for r in est.ranks:
            card = rig.cards[d * lay.group + r.rank]
            kv, _, needs = est.usage(r, card.total)
            out.append(RankFit(card, r, kv, needs, card.has - needs))
    return tuple(out)


def _judged(
    s: Summary, params: EngineParams, rig: Rig, ranks: Sequence[RankFit], margin: int, context: int | None
) -> tuple[RankFit, ...]:
    """Each rank with plain fit's verdict on it (``fitverdict.rank_verdict``, the one computation both
    use), a pool of ``context`` tokens asked for and ``margin`` kept free."""
    est = on_cards(s, params, rig.cards)
    offload = "host memory" if params.host_kv_offload else None
    out = []
    for rf in ranks:
        v = rank_verdict(est, rf.need, rf.card.total, rf.card.others, margin=margin, offload=offload,
                         context=context)  # fmt: skip
        out.append(RankFit(rf.card, rf.need, v.kv, v.needs, v.headroom, v.verdict, v.why))
    return tuple(out)


#: The recipe's values a proposal keeps unless ``--allow NAME`` (``fit --allow``) lets it change them.
PINS = ("max-model-len", "kv-cache-memory", "kv-cache-dtype", "gpu-memory-utilization")


@dataclass(frozen=True)
class Sizing:
    """How a proposal sizes its memory: what the recipe pinned and what ``--allow`` frees.

    ``pool``: the recipe's ``--kv-cache-memory``, kept as it is (None: not pinned, or allowed to change);
    ``free_pool``: a pool is set, as large as every rank holds (the recipe had one and ``--allow
    kv-cache-memory``); neither: the pool is what the utilisation leaves, as the recipe sizes it.
    ``util_cap``: the highest ``--gpu-memory-utilization`` (the recipe's, unless allowed); ``context``:
    the served context every proposal must hold (None: chosen up to ``cap``); ``kv_dtypes``: those tried."""

    pool: int | None
    free_pool: bool
    util_cap: float
    context: int | None
    cap: int | None
    kv_dtypes: tuple[str, ...]
    write_len: int | None  # the --max-model-len a proposal writes when the context is pinned


def sizing(s: Summary, base: EngineParams, arch: tuple[int, int] | None, allow: frozenset[str],
           user_cap: int | None = None) -> Sizing:  # fmt: skip
    """The recipe's pins, less the ``allow``ed ones. A ``--max-model-len`` the user gives is their choice
    of context (it allows max-model-len with that cap)."""
    free_len = "max-model-len" in allow or user_cap is not None
    limit = s.shape.max_position_embeddings
    served = base.max_model_len or limit
    return Sizing(
        pool=base.kv_cache_memory if "kv-cache-memory" not in allow else None,
        free_pool=base.kv_cache_memory is not None and "kv-cache-memory" in allow,
        util_cap=MAX_UTIL if "gpu-memory-utilization" in allow else base.gpu_memory_utilization,
        context=None if free_len else served,
        cap=model_cap(s, base, user_cap) if free_len else served,
        kv_dtypes=tuple(kv_dtypes(arch, base.kv_cache_dtype))
        if "kv-cache-dtype" in allow
        else (base.kv_cache_dtype,),
        write_len=base.max_model_len,
    )


def changed_pins(p: EngineParams, base: EngineParams) -> list[str]:
    """The recipe's pinned values this proposal's flags change (``PINS`` names)."""
    out = []
    if p.max_model_len != base.max_model_len:
        out.append("max-model-len")
    if base.kv_cache_memory is not None and p.kv_cache_memory != base.kv_cache_memory:
        out.append("kv-cache-memory")
    if p.kv_cache_dtype != base.kv_cache_dtype:
        out.append("kv-cache-dtype")
    if p.gpu_memory_utilization > base.gpu_memory_utilization:
        out.append("gpu-memory-utilization")
    return out


def _size(
    s: Summary, lay: Layout, params: EngineParams, cards: Sequence[Card], headroom: int, how: Sizing
) -> EngineParams | None:
    """Utilisation (the largest thousandth every card passes vLLM's start check at with ``headroom`` left,
    never above ``how.util_cap``) and the KV pool: the recipe's, the largest every rank holds, or none (the
    utilisation sizes it). None: no room."""
    est = on_cards(s, params, cards)
    pairs = list(zip(cards[: lay.gpus], est.ranks * lay.dp, strict=True))
    # vLLM wants utilisation × PyTorch's total free at start (after the driver's reserve and its runtime)
    util = min((est.free_at_start(r, c.total) - (c.total - c.has) - headroom) / torch_total(c.total)
               for c, r in pairs)  # fmt: skip
    # the ceiling where it passes (the recipe's own value, not rounded down), else the largest thousandth
    util = how.util_cap if util >= how.util_cap - 1e-9 else int(util * 1000) / 1000
    if util <= 0:
        return None
    pool: int | None = how.pool
    if how.free_pool:
        # a fixed pool: what each card has left beside everything else the rank keeps (fit's count)
        pool = min(c.has - headroom - est.outside_pool(r, c.total) for c, r in pairs)
        if pool <= 0:
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
    context: int | None = None,
) -> Proposal:
    """One layout with the given flags on the rig, by fit's per-rank count. ``context``: the served
    context the pool must hold (the recipe's, pinned), else ``params.max_model_len``."""
    ranks = _place(s, lay, params, rig)
    block = params.block_size
    per = [_tokens(ranks[d * lay.group : (d + 1) * lay.group], block) for d in range(lay.dp)]
    tokens = min(per)
    ctx = tokens if cap is None else min(cap, tokens)
    # plain fit's verdict on every rank: it checks one request of the served context (pinned, else what
    # the pool gives) and the margin; stock vLLM refuses a pool shorter than one request (no-go), a recipe
    # offloading KV to host memory is not modelled (warn, not a GO)
    ranks = _judged(s, params, rig, ranks, headroom, context or params.max_model_len or ctx)
    runs = tokens >= block and all(r.verdict != "no-go" and r.kv > 0 for r in ranks)
    if context is not None and runs:
        ctx = context  # (with a host KV offload, the recipe's context whatever the GPU pool holds)
    seqs = sum(t // ctx for t in per) if ctx else 0
    fits = runs and all(r.verdict == "go" for r in ranks)
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
    ctx = base.max_model_len or model_cap(s, base, None)  # none given: vLLM serves the model's maximum
    return evaluate(s, lay, base, rig, cap=ctx, headroom=headroom, context=ctx)


def _subsets(rig: Rig, k: int) -> list[Rig]:
    """The choices of ``k`` of the rig's cards (in nvidia-smi order), once per kind (two choices whose cards
    — model, size, what others hold — and P2P pairs are the same give the same figures), at most ``SUBSETS``
    of them: those with the most free memory, then the most P2P pairs (on a rig of up to 5 cards, all)."""
    seen: dict[object, tuple[tuple[int, int, tuple[int, ...]], Rig]] = {}
    for pick in itertools.combinations(range(len(rig.cards)), k):
        cards = tuple(rig.cards[i] for i in pick)
        close = None
        if rig.close is not None:
            close = frozenset(
                (a, b) for a in range(k) for b in range(a + 1, k) if (pick[a], pick[b]) in rig.close
            )
        sig = (tuple((c.name, c.total, c.others, bool(c.squatters)) for c in cards), close)
        if sig not in seen:
            order = (-sum(c.has for c in cards), -len(close or ()), pick)
            seen[sig] = (order, Rig(cards, close, rig.arch))
    return [r for _, r in sorted(seen.values(), key=lambda x: x[0])][:SUBSETS]


def equal_tp_groups(lay: Layout, cards: Sequence[Card]) -> bool:
    """TP only inside a group of equal cards (same model, same size): vLLM gives every TP rank the same
    shard and the same pool, so the smallest card would set them all."""
    for g in range(lay.pp * lay.dp):
        group = cards[g * lay.tp : (g + 1) * lay.tp]
        if len({(c.name, c.total) for c in group}) > 1:
            return False
    return True


def search(
    s: Summary,
    base: EngineParams,
    rig: Rig,
    *,
    headroom: int,
    user_cap: int | None = None,
    allow: frozenset[str] = frozenset(),
    own: Rig | None = None,
) -> tuple[list[Proposal], int]:
    """Every layout on every choice of the rig's cards, sized and ranked by the objective: the best split
    and cards of each (TP, PP, DP, KV dtype), best first. The recipe's pins (``sizing``) hold unless
    ``allow``ed. Where the recipe's own layout fits (on ``own``, the cards the spec selects; default: the
    rig's first), layouts with fewer KV tokens are left out. Returns the ranking and the number of
    candidates evaluated."""
    recipe = of_params(base)
    how = sizing(s, base, rig.arch, allow, user_cap)
    known = set(s.keys)
    own = own or Rig(rig.cards[: base.world], _relabel(rig, base.world), rig.arch)
    row = recipe_row(s, base, own, headroom) if base.world <= len(own.cards) else None
    floor = row.kv_tokens if row is not None and row.fits else 0  # a GO recipe: nothing smaller
    seen = 0
    best: dict[tuple[int, int, int, str], Proposal] = {}
    every = list(layouts(s.shape, base, len(rig.cards), how.kv_dtypes))
    for k in range(1, len(rig.cards) + 1):
        for sub in _subsets(rig, k):
            for lay in every:
                if lay.gpus != k or (lay.tp, lay.ep) not in known or not equal_tp_groups(lay, sub.cards):
                    continue
                seen += 1
                prop = _sized(s, lay, base, sub, headroom, how, recipe)
                if prop is None or not prop.fits or prop.kv_tokens < floor:
                    continue
                key = (lay.tp, lay.pp, lay.dp, lay.kv_dtype)
                if key not in best or prop.key() > best[key].key():
                    best[key] = prop
    ranked = sorted(best.values(), key=Proposal.key, reverse=True)
    return ranked, seen


def _relabel(rig: Rig, k: int) -> frozenset[tuple[int, int]] | None:
    return None if rig.close is None else frozenset(p for p in rig.close if p[1] < k)


def _sized(
    s: Summary, lay: Layout, base: EngineParams, rig: Rig, headroom: int, how: Sizing, recipe: Layout
) -> Proposal | None:
    """``lay`` on ``rig``'s cards, sized (``_size``) and evaluated; a layout with more than one stage also
    tries the split weighted by free memory (``weighted_split``) and keeps the better."""
    p0 = lay.params(replace(base, max_model_len=how.context))
    sized = _size(s, lay, p0, rig.cards, headroom, how)
    if sized is None:
        return None
    out = _one(s, lay, sized, rig, headroom, how, recipe)
    if lay.pp > 1 and lay.dp == 1 and lay.partition is None:
        part = weighted_split(s, lay, sized, rig.cards, headroom)
        even = lay.parts(s.shape.num_layers)
        if part is not None and part != even:
            alt = replace(lay, partition=part)
            other = _one(s, alt, replace(sized, pp_partition=part), rig, headroom, how, recipe)
            if other.fits and (not out.fits or other.key() > out.key()):
                out = other
    return out


def _one(
    s: Summary, lay: Layout, sized: EngineParams, rig: Rig, headroom: int, how: Sizing, recipe: Layout
) -> Proposal:
    prop = evaluate(s, lay, sized, rig, cap=how.cap, headroom=headroom, recipe=recipe, context=how.context)
    written = how.write_len if how.context is not None else prop.max_context
    return replace(prop, params=replace(sized, max_model_len=written))
