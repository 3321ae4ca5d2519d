"""The parallel layouts vLLM accepts for a model, and the per-rank estimate of each from one pass over the
checkpoint's headers. Pure.

A layout is TP × PP (× DP replicas of that group), the stage split (``VLLM_PP_LAYER_PARTITION``), expert
parallelism and the KV-cache dtype. ``Summary`` places the checkpoint once per (TP, EP) with one decoder
layer per stage (fit's own ``Placement``); ``Summary.estimate`` sums those slots into the stages of any PP
and split and hands the bytes to ``fit.from_placed``, the same function ``fit.estimate`` ends in, so every
candidate's per-rank figures are fit's own count (tests compare them candidate by candidate).

What vLLM accepts (vllm/config/parallel.py, vllm/model_executor/models/utils.py):

- TP divides the attention heads, and the KV heads divide TP or TP divides them (KV heads replicate);
- PP ≤ the decoder layers, every stage at least one layer; embeddings on the first stage, final norm, LM
  head and MTP modules on the last (``get_pp_indices``; MTP runs after the last decoder layer);
- EP only for MoE checkpoints and a TP group of more than one GPU;
- DP replicates the whole TP group (one replica per group of GPUs); its replicas do not share KV.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace

from rigsmith.resolving.fit import fitengine
from rigsmith.resolving.fit.calibrate import calibrated
from rigsmith.resolving.fit.fit import (
    CATEGORIES,
    SKIP_MTP,
    SKIP_VISION,
    EngineParams,
    Estimate,
    FitError,
    ModelShape,
    Placed,
    Placement,
    from_placed,
    pp_partition,
)

#: The most splits tried per pipeline depth, and the most layers a stage moves from vLLM's even split:
#: (2d + 1)^(PP - 1) ≤ SPLITS bounds d (6 for PP=2 and 3, 3 for PP=4, 1 for PP=5 and 6); deeper pipelines
#: try every one-layer move between two stages instead. See ``partitions``.
SPLITS = 400
MAX_SPREAD = 6
MAX_PP = 8


@dataclass(frozen=True)
class Layout:
    """One way to run the model: TP × PP per replica, DP replicas, stage split, EP, KV dtype."""

    tp: int
    pp: int
    dp: int = 1
    ep: bool = False
    partition: tuple[int, ...] | None = None  # None: vLLM's even split (no VLLM_PP_LAYER_PARTITION)
    kv_dtype: str = "auto"

    @property
    def group(self) -> int:
        return self.tp * self.pp

    @property
    def gpus(self) -> int:
        return self.group * self.dp

    def parts(self, layers: int) -> tuple[int, ...]:
        """Decoder layers per stage."""
        return self.partition or tuple(b - a for a, b in pp_partition(layers, self.pp))

    def params(self, base: EngineParams) -> EngineParams:
        """The recipe's engine flags with this layout in place."""
        return replace(
            base,
            tp=self.tp,
            pp=self.pp,
            expert_parallel=self.ep,
            pp_partition=self.partition,
            kv_cache_dtype=self.kv_dtype,
        )

    def label(self) -> str:
        out = f"TP{self.tp}×PP{self.pp}" + (f"×DP{self.dp}" if self.dp > 1 else "")
        return out + (" EP" if self.ep else "") + f" KV {self.kv_dtype}"


def of_params(p: EngineParams, dp: int = 1) -> Layout:
    """The layout a recipe's flags describe."""
    return Layout(p.tp, p.pp, dp, p.expert_parallel, p.pp_partition, p.kv_cache_dtype)


@dataclass(frozen=True)
class _Slots:
    """One placement with one decoder layer per stage, as prefix sums per TP rank."""

    layers: tuple[tuple[int, ...], ...]  # [tp rank][i]: bytes of layers 0..i-1 (category "layers")
    experts: tuple[tuple[int, ...], ...]
    first: tuple[dict[str, int], ...]  # [tp rank]: embed, vision, other (first stage)
    last: tuple[dict[str, int], ...]  # [tp rank]: head, mtp (last stage)
    tie_copy: int  # the last stage's copy of a tied embedding, included in "head" when PP > 1


class Summary:
    """The checkpoint placed once per (TP, EP) with one layer per slot: any layout's per-rank bytes are sums.

    ``headers`` is consumed once, whatever the number of (TP, EP) pairs, so the Hub is read once."""

    def __init__(
        self,
        shape: ModelShape,
        base: EngineParams,
        keys: Iterable[tuple[int, bool]],
        headers: Iterable[tuple[str, int, Sequence[int]]],
    ) -> None:
        self.shape, self.base = shape, base
        n = shape.num_layers
        wanted = sorted(set(keys))
        places = {
            k: Placement(shape, replace(base, tp=k[0], pp=n, pp_partition=None, expert_parallel=k[1],
                                        mtp=True, language_model_only=False))
            for k in wanted
        }  # fmt: skip
        # what is left off the GPU is the same for every TP: one more placement with everything off says it
        off = Placement(
            shape, replace(base, tp=1, pp=1, pp_partition=None, mtp=False, language_model_only=True)
        )
        for name, nbytes, tshape in headers:
            off.add(name, nbytes, tshape)
            for place in places.values():
                place.add(name, nbytes, tshape)
        self.tensors, self.skipped = off.tensors, dict(off.skipped)
        self.unknown, self.lm_head_seen = tuple(off.unknown), off.lm_head_seen
        self._slots = {k: self._slots_of(p) for k, p in places.items()}
        #: bytes per GPU added to every rank's allowances (``calibrate``: what a boot here measured)
        self.allowance = 0
        self._estimates: dict[tuple[object, ...], Estimate] = {}

    def _slots_of(self, place: Placement) -> _Slots:
        n, tp = self.shape.num_layers, place.params.tp

        def prefix(cat: str, t: int) -> tuple[int, ...]:
            return tuple(itertools.accumulate((place.bytes[i * tp + t][cat] for i in range(n)), initial=0))

        tie = place.embed_rank_bytes if self.shape.tie_word_embeddings and n > 1 else 0
        lo, hi = place.bytes[:tp], place.bytes[(n - 1) * tp :]
        return _Slots(
            tuple(prefix("layers", t) for t in range(tp)),
            tuple(prefix("experts", t) for t in range(tp)),
            tuple({c: lo[t][c] for c in ("embed", "vision", "other")} for t in range(tp)),
            tuple({c: hi[t][c] for c in ("head", "mtp")} for t in range(tp)),
            tie,
        )

    def layer_bytes(self, tp: int, ep: bool) -> list[list[int]]:
        """[TP rank][layer]: bytes of each decoder layer on that rank (its experts included)."""
        s = self._slots[(tp, ep)]
        n = self.shape.num_layers
        return [
            [s.layers[t][i + 1] - s.layers[t][i] + s.experts[t][i + 1] - s.experts[t][i] for i in range(n)]
            for t in range(tp)
        ]

    @property
    def keys(self) -> tuple[tuple[int, bool], ...]:
        return tuple(self._slots)

    def estimate(self, params: EngineParams) -> Estimate:
        """What ``fit.estimate(shape, params, headers)`` says, from the slots (no header read again), with
        ``allowance`` (0 unless a boot here calibrated it) on every rank. Kept per layout: the flags that
        only size the pool (utilisation, ``--kv-cache-memory``, ``--max-model-len``) do not change the
        per-rank figures, so the search asks once per layout and sizing (a V0 engine's profile follows the
        context, so there ``--max-model-len`` is part of the key; fitengine.profile_shape)."""
        p = params
        v0_context = None if fitengine.era(p.vllm_version).v1 else p.max_model_len
        key = (p.tp, p.pp, p.pp_partition, p.expert_parallel, p.kv_cache_dtype, p.mtp, p.draft_model,
               p.language_model_only, p.cuda_graphs, p.max_num_batched_tokens, p.max_num_seqs, p.block_size,
               p.given, p.vllm_version, p.big_card, p.nvswitch, v0_context, self.allowance)  # fmt: skip
        hit = self._estimates.get(key)
        if hit is None:
            hit = self._estimates[key] = self._estimate(params)
        return hit if hit.params == params else replace(hit, params=params)

    def _estimate(self, params: EngineParams) -> Estimate:
        s = self._slots.get((params.tp, params.expert_parallel))
        if s is None:
            raise FitError(f"no placement for TP={params.tp} EP={params.expert_parallel} in this summary")
        stages = pp_partition(self.shape.num_layers, params.pp, params.pp_partition)
        out: list[dict[str, int]] = []
        for k, (a, b) in enumerate(stages):
            for t in range(params.tp):
                d: dict[str, int] = dict.fromkeys(CATEGORIES, 0)
                d["layers"] = s.layers[t][b] - s.layers[t][a]
                d["experts"] = s.experts[t][b] - s.experts[t][a]
                if k == 0:
                    d["embed"], d["other"] = s.first[t]["embed"], s.first[t]["other"]
                    d["vision"] = 0 if params.language_model_only else s.first[t]["vision"]
                if k == params.pp - 1:
                    d["head"] = s.last[t]["head"] - (s.tie_copy if params.pp == 1 else 0)
                    d["mtp"] = s.last[t]["mtp"] if params.mtp else 0
                out.append(d)
        skipped = {
            why: n
            for why, n in self.skipped.items()
            if (why == SKIP_MTP and not params.mtp) or (why == SKIP_VISION and params.language_model_only)
        }
        est = from_placed(
            self.shape, params, Placed(out, self.tensors, skipped, self.unknown, self.lm_head_seen)
        )
        return calibrated(est, self.allowance)


def tp_sizes(shape: ModelShape, gpus: int) -> list[int]:
    """TP sizes vLLM accepts for this model on up to ``gpus`` GPUs: they divide the heads and the MLP and
    expert widths (vLLM's ``divide`` asserts it), and the KV heads divide them or they divide the KV heads."""
    kv = shape.num_kv_heads
    widths = [w for w in (shape.intermediate_size, shape.moe_intermediate_size) if w]
    return [
        t
        for t in range(1, gpus + 1)
        if shape.num_heads % t == 0 and (kv % t == 0 or t % kv == 0) and all(w % t == 0 for w in widths)
    ]


def spread(pp: int) -> int:
    """How far a stage may move from the even split at this depth (``SPLITS``)."""
    d = 0
    while d < MAX_SPREAD and (2 * d + 3) ** (pp - 1) <= SPLITS:
        d += 1
    return d


def partitions(layers: int, pp: int) -> list[tuple[int, ...] | None]:
    """vLLM's even split (None) and the other splits tried: every split whose stages stay within
    ``spread(pp)`` layers of it (each stage ≥ 1 layer), or where that is 0, every move of one layer from
    one stage to another. At most ``SPLITS`` + 1."""
    even = tuple(b - a for a, b in pp_partition(layers, pp))
    if pp == 1:
        return [None]
    d = spread(pp)
    found: set[tuple[int, ...]] = set()
    if d:
        for head in itertools.product(range(-d, d + 1), repeat=pp - 1):
            parts = [e + h for e, h in zip(even, head, strict=False)]
            parts.append(layers - sum(parts))
            if abs(parts[-1] - even[-1]) <= d:
                found.add(tuple(parts))
    else:
        for i, j in itertools.permutations(range(pp), 2):
            parts = list(even)
            parts[i], parts[j] = parts[i] - 1, parts[j] + 1
            found.add(tuple(parts))
    return [None, *sorted(p for p in found if min(p) >= 1 and p != even)]


def layouts(shape: ModelShape, base: EngineParams, gpus: int, kv_dtypes: Sequence[str]) -> Iterator[Layout]:
    """Every layout vLLM accepts on up to ``gpus`` GPUs, for the KV dtypes given."""
    moe = shape.num_experts > 0
    for tp in tp_sizes(shape, gpus):
        for pp in range(1, min(gpus // tp, shape.num_layers, MAX_PP) + 1):
            for dp in range(1, gpus // (tp * pp) + 1):
                if dp > 1 and pp > 1:
                    continue  # DP replicates a group that fits on its own; with PP that is not vLLM's DP
                eps = [False, True] if moe and tp > 1 and dp == 1 else [False]
                for ep, part, kvd in itertools.product(eps, partitions(shape.num_layers, pp), kv_dtypes):
                    yield Layout(tp, pp, dp, ep, part, kvd)


def summary_keys(shape: ModelShape, gpus: int, base: EngineParams) -> list[tuple[int, bool]]:
    """The (TP, EP) placements the search needs, and the recipe's own."""
    keys = {(base.tp, base.expert_parallel)}
    for tp in tp_sizes(shape, gpus):
        keys.add((tp, False))
        if shape.num_experts and tp > 1:
            keys.add((tp, True))
    return sorted(keys)
