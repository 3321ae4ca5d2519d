"""`invoke fit --propose`'s search: every layout vLLM accepts, sized against each card's free memory, ranked.

Checkpoints: the small real safetensors architectures of tests/support/checkpoints.py (dense, MoE, hybrid
with MTP) and header-only stand-ins shaped like the seeds' models (``seed000_like``, ``seed003_like``). Rigs:
the real captures under tests/operating/data (3×3090 PCIe-only with a 256 MiB squatter, 4×3090 with P2P
pairs behind two bridges, 2×H200 over NVLink), some with a squatter's size changed. The independent count
is ``checkpoints.expected`` (bytes sliced from the arrays as the test states vLLM loads them).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rigsmith.operating.fit import layoutmenu as fitpropose
from rigsmith.operating.fit import report as fitreport
from rigsmith.operating.host import gather
from rigsmith.operating.probes import HostFacts
from rigsmith.project import Project
from rigsmith.resolving.fit import (
    checkpoint,
    fit,
    fitengine,
    fitverdict,
    layout,
    prescribe,
    propose,
    proposewhy,
)
from rigsmith.resolving.fit.applylayout import with_layout
from rigsmith.resolving.fit.checkpoint import LocalCheckpoint, rows
from rigsmith.spec import Deployment, from_data, to_data
from tests.support import checkpoints as ck
from tests.support.common import REPO
from tests.support.replay import ReplayHost

GiB, MiB = fit.GiB, fit.MiB
ARCHS = {"dense": ck.dense, "moe": ck.moe, "hybrid": ck.hybrid_mtp}
MTP = '{"method":"mtp","num_speculative_tokens":3}'


def header_rows(a: ck.Arch) -> list[tuple[str, int, tuple[int, ...]]]:
    return [(t.name, t.array.nbytes, tuple(t.array.shape)) for t in a.tensors]


def stage_of(lay: layout.Layout, layers: int) -> list[int]:
    return [k for k, n in enumerate(lay.parts(layers)) for _ in range(n)]


def independent(a: ck.Arch, lay: layout.Layout, p: fit.EngineParams) -> list[int]:
    n = fit.ModelShape.from_config(a.config).num_layers
    return ck.expected(a, lay.tp, stage_of(lay, n), ep=lay.ep, mtp=p.mtp, vision=not p.language_model_only)


@pytest.mark.parametrize("arch", sorted(ARCHS))
@pytest.mark.parametrize(
    "argv", [[], ["--speculative-config", MTP], ["--language-model-only", "--kv-cache-dtype", "fp8"]]
)
def test_every_candidate_counts_what_fit_counts_and_what_slicing_the_arrays_gives(
    arch: str, argv: list[str]
) -> None:
    a = ARCHS[arch]()
    shape = fit.ModelShape.from_config(a.config)
    base = fit.engine_params(argv, {})
    summary = layout.Summary(shape, base, layout.summary_keys(shape, 4, base), header_rows(a))
    seen = 0
    for lay in layout.layouts(shape, base, 4, ["auto", "fp8"]):
        p = lay.params(base)
        got = summary.estimate(p)
        assert got == fit.estimate(shape, p, header_rows(a)), lay
        assert [r.weights for r in got.ranks] == independent(a, lay, p), lay
        seen += 1
    assert seen > 20


def _spec(name: str, root: Path) -> Deployment:
    data = to_data(Project(REPO).load(name))
    data["model"]["local_dir"] = str(root)
    return from_data(data)


def _facts(case: str, squat_mib: int | None = None) -> HostFacts:
    facts = gather(ReplayHost(case))
    if squat_mib is not None:
        old = facts.apps[0].used_mib or 0
        facts.apps = [dataclasses.replace(facts.apps[0], used_mib=squat_mib)]
        uuid = facts.apps[0].gpu_uuid
        facts.gpus = [
            dataclasses.replace(g, memory_used_mib=g.memory_used_mib - old + squat_mib)
            if g.uuid == uuid
            else g
            for g in facts.gpus
        ]
    return facts


def _propose(
    a: ck.Arch,
    name: str,
    facts: HostFacts,
    tmp_path: Path,
    headroom: int | None = None,
    allow: frozenset[str] = frozenset(),
) -> tuple[fitpropose.Proposed, Deployment]:
    root = a.headers(tmp_path / "ckpt")
    spec = _spec(name, root)
    ckpt = LocalCheckpoint(root)
    shape = fit.ModelShape.from_config(ckpt.config())
    rig = fitpropose.rig_of(spec, facts, None, fit.engine_inputs(spec).world)
    assert rig is not None
    own = fitpropose.own_rig(spec, facts, None, rig)
    prop = fitpropose.propose(spec, shape, rows(ckpt), rig, headroom=headroom, cap=None, own=own, allow=allow)
    return prop, spec


def _check_against_independent_count(a: ck.Arch, prop: fitpropose.Proposed) -> None:
    """Every shown proposal: weights equal the sliced arrays, headroom is fit's own count and fits."""
    shape = fit.ModelShape.from_config(a.config)
    for p in prop.top():
        want = independent(a, p.layout, p.params) * p.layout.dp
        assert [r.need.weights for r in p.ranks] == want
        first = p.cards[0]  # the engine's scheduler defaults follow its first card, as invoke fit counts
        est = fit.estimate(shape, p.params, header_rows(a)).for_card(first.total, first.name)
        for r in p.ranks:
            kv, _, needs = est.usage(est.ranks[r.need.rank], r.card.total)
            assert (r.kv, r.headroom) == (kv, r.card.has - needs)
            assert r.headroom >= prop.headroom and kv == (p.params.kv_cache_memory or kv)
        assert p.kv_tokens >= (prop.recipe.kv_tokens if prop.recipe and prop.recipe.fits else 0)


def test_seed000_rig_gets_three_stages_and_the_squatter_named_as_the_first_fix(tmp_path: Path) -> None:
    a = ck.seed000_like()
    # seed 000's own flags do not run beside its 256 MiB ComfyUI process (the seed's record: it broke rank 0
    # at 0.97): evicting it is the fix; the pool (550 MB: 33,568 tokens) is shorter than the 262,144-token
    # --max-model-len, but the recipe offloads KV to host memory (VLLM_QSA_KV_OFFLOAD=1), which fit does not
    # model: that is not a fix fit prescribes. Every layout needs all three cards (64 GiB of weights), and
    # with the recipe's pool kept, rank 0's peak does not fit beside the squatter: nothing is proposed.
    prop, _ = _propose(a, "flash-next-int4-3x3090", _facts("3x3090-squatter"), tmp_path / "256")
    assert prop.recipe is not None and not prop.recipe.runs and not prop.top()
    assert prop.fix == [prop.fix[0]] and prop.fix[0].startswith(
        "evict PID 48213 /opt/ComfyUI/venv/bin/python"
    )
    # a 64 MiB process leaves the recipe running, 126 MiB from the limit on GPU0, with a pool shorter than
    # one request that only the host KV offload (not modelled) admits: plain fit says WARN on it, so no
    # layout keeping the recipe's pins is a GO and none is proposed; what an --allow buys is listed apart,
    # each a GO by plain fit's own count
    prop, _ = _propose(a, "flash-next-int4-3x3090", _facts("3x3090-squatter", 64), tmp_path)
    own = prop.recipe
    assert own is not None and own.runs and not own.fits and not prop.fix and not prop.top()
    assert {r.verdict for r in own.ranks} == {"warn"} and "host KV offload" in own.ranks[0].why
    assert prop.apart and all(p.fits for p in prop.apart)
    assert (own.layout.tp, own.layout.pp, own.layout.dp) == (1, 3, 1)
    assert max(r.need.weights for r in own.ranks) == pytest.approx(21.55 * GiB, rel=1e-3)
    # A layer of this model (1.31 GiB) outweighs the squatter: one layer off GPU0 would make GPU1 the
    # tightest card with less room than GPU0 has now, so vLLM's even split is the better one.
    assert own.layout.parts(48) == (16, 16, 16)
    uneven = dataclasses.replace(own.layout, partition=(15, 17, 16))
    alt = propose.evaluate(prop.summary, uneven, uneven.params(own.params), prop.rig, cap=None, headroom=0)
    assert min(r.headroom for r in alt.ranks) < min(r.headroom for r in own.ranks)
    # allowed to change the pins, the proposals are GO with fit's 512 MiB margin on every rank
    free = frozenset(propose.PINS)
    prop, _ = _propose(
        a, "flash-next-int4-3x3090", _facts("3x3090-squatter", 64), tmp_path / "free", allow=free
    )
    assert prop.top() and all(p.fits for p in prop.top())
    _check_against_independent_count(a, prop)


@pytest.mark.parametrize(
    ("layers", "inter", "squat", "parts"),
    [(96, 860, 256, (31, 33, 32)), (48, 1700, 1536, (15, 17, 16))],
)
def test_the_squatter_card_holds_fewer_layers_where_a_layer_is_lighter_than_what_it_takes(
    tmp_path: Path, layers: int, inter: int, squat: int, parts: tuple[int, ...]
) -> None:
    a = ck.moe(layers, (2048, 16, 2, 128, 151936), experts=64, inter=inter, lazy=True)
    # the recipe's 550 MB pool, kept, is best spread evenly (the stage with the most layers decides its
    # tokens); with the pool free to grow, the squatter's card takes fewer layers
    free = frozenset({"kv-cache-memory", "max-model-len"})
    prop, _ = _propose(a, "flash-next-int4-3x3090", _facts("3x3090-squatter", squat), tmp_path, allow=free)
    best = prop.top()[0]
    assert (best.layout.tp, best.layout.pp) == (1, 3) and best.layout.parts(layers) == parts
    words = proposewhy.reasons(best, prop.summary, layout.of_params(prop.base), prop.headroom)
    assert f"GPU 0 holds a {squat} MiB process: one layer fewer there" in words
    _check_against_independent_count(a, prop)


def test_seed003_rig_gets_tp2_pp2_with_the_seeds_uneven_split(tmp_path: Path) -> None:
    a = ck.seed003_like()
    # the recipe's pins kept, its own layout runs 366 MiB from the limit on its first stage: plain fit's WARN;
    # TP4 with the experts over all four cards keeps its 4.1 GB pool with fit's 512 MiB on every rank (TP over
    # the bridges: four crossings), and shrinking the pool is listed apart
    kept, spec = _propose(a, "flash-next-merlin-4x3090", _facts("4x3090-idle"), tmp_path / "kept")
    assert kept.recipe is not None and kept.recipe.runs and not kept.recipe.fits
    assert min(r.headroom for r in kept.recipe.ranks) == pytest.approx(366 * MiB, abs=MiB)
    (only,) = kept.top()
    assert (only.layout.tp, only.layout.pp, only.layout.ep, only.tp_cross) == (4, 1, True, 4) and only.fits
    assert only.params.kv_cache_memory == 4_100_000_000 and not fitpropose._needs(only, kept)
    assert [fitpropose._needs(p, kept) for p in kept.apart] == [["kv-cache-memory"]]
    prop, spec = _propose(
        a, "flash-next-merlin-4x3090", _facts("4x3090-idle"), tmp_path, allow=frozenset({"kv-cache-memory"})
    )
    assert fit.engine_inputs(spec).pp_partition == (25, 23)
    best = prop.top()[0]
    assert (best.layout.tp, best.layout.pp, best.layout.dp, best.layout.ep) == (2, 2, 1, True)
    assert best.layout.parts(48) == (25, 23) and best.layout.kv_dtype == "fp8_e4m3"
    assert best.tp_cross == 0 and best.pp_cross == 1  # TP inside the PIX pairs, PP across the bridges
    assert prop.recipe is not None and prop.recipe.runs and not prop.fix
    # the seed's layout with the largest pool that leaves fit's 512 MiB on every rank: a GO, a little less KV
    assert best.params.kv_cache_memory is not None and best.params.kv_cache_memory < 4_100_000_000
    assert best.kv_tokens < prop.recipe.kv_tokens and best.max_context == 262_144
    assert min(r.headroom for r in best.ranks) >= fit.WARN_HEADROOM
    words = proposewhy.reasons(best, prop.summary, layout.of_params(prop.base), prop.headroom)
    assert "stage 1 (GPU2+GPU3) also holds the LM head and the MTP module: one layer fewer there" in words
    _check_against_independent_count(a, prop)


def test_tp_stays_inside_p2p_pairs_and_a_pcie_only_rig_has_none(tmp_path: Path) -> None:
    spec = _spec("flash-next-merlin-4x3090", tmp_path)
    mixed = fitpropose.rig_of(spec, _facts("4x3090-idle"), None, 4)
    pcie = fitpropose.rig_of(_spec("flash-next-int4-3x3090", tmp_path), _facts("3x3090-squatter"), None, 3)
    assert mixed is not None and pcie is not None
    assert mixed.close == frozenset({(0, 1), (2, 3)}) and pcie.close == frozenset()
    assert mixed.arch == (8, 6) and propose.kv_dtypes(mixed.arch, "auto") == ["auto", "fp8"]
    assert propose.kv_dtypes((7, 5), "auto") == ["auto"]
    assert pcie.cards[0].squatters and pcie.cards[0].squatters[0][1] == 256 * MiB
    assert propose._cross(layout.Layout(2, 2), mixed) == (0, 1)
    assert propose._cross(layout.Layout(4, 1), mixed) == (4, 0)
    assert propose._cross(layout.Layout(2, 1, dp=2), mixed) == (0, 0)


def test_on_two_nvlinked_gpus_one_copy_over_the_pair_beats_two_replicas_of_a_model_that_fits_one(
    tmp_path: Path,
) -> None:
    a = ck.moe(8, (1024, 8, 8, 128, 32000), experts=16, inter=1024, lazy=True)
    data = to_data(Project(REPO).load("flash-next-merlin-4x3090"))
    data["model"]["local_dir"] = str(a.headers(tmp_path / "ckpt"))
    data["engine"]["args"] = ["/m", "--max-model-len", "32768"]
    data["engine"]["model_arg"] = 0
    data["env"] = []
    data["resources"]["gpus"]["cdi_devices"] = ["nvidia.com/gpu=all"]
    spec = from_data(data)
    rig = fitpropose.rig_of(spec, _facts("2xh200-nvlink-ansi"), None, 1)
    assert rig is not None and rig.close == frozenset({(0, 1)}) and rig.arch == (9, 0)
    ckpt = LocalCheckpoint(Path(spec.model.local_dir))
    prop = fitpropose.propose(spec, fit.ModelShape.from_config(ckpt.config()), rows(ckpt), rig,
                              headroom=None, cap=None)  # fmt: skip
    best, *rest = prop.top()
    # one copy of the weights over the pair leaves more room for KV than a copy on each card; on this
    # NVSwitch board a TP group also pays NCCL's NVLS buffers (fitengine.NVLS_BUFFERS) on each rank, so the
    # copy split into stages holds the most
    assert (best.layout.gpus, best.layout.dp, best.tp_cross, best.max_context) == (2, 1, 0, 32_768)
    replicas = next(p for p in rest if p.layout.dp == 2)
    assert replicas.layout.tp == 1 and replicas.sequences < best.sequences
    tp2 = next(p for p in rest if p.layout.tp == 2)
    v1 = fitengine.LATEST.non_torch
    assert {r.need.non_torch for r in tp2.ranks} == {v1 + fitengine.NVLS_BUFFERS}
    assert {r.need.non_torch for r in best.ranks} == {v1} and best.layout.pp == 2
    _check_against_independent_count(a, prop)


def test_the_search_is_bounded(tmp_path: Path) -> None:
    a = ck.seed003_like()
    prop, _ = _propose(a, "flash-next-merlin-4x3090", _facts("4x3090-idle"), tmp_path)
    # TP ∈ {1, 2, 4}, PP ≤ 4, the splits within SPREAD of even, EP for TP > 1, the recipe's KV dtype; the
    # cards of a size that are alike are one choice
    assert 300 < prop.candidates < 1500
    assert all(len(layout.partitions(48, pp)) <= layout.SPLITS + 1 for pp in range(1, 9))


def test_fixes_come_in_order_lower_max_model_len_then_add_a_stage(tmp_path: Path) -> None:
    a = ck.seed000_like()
    root = a.headers(tmp_path / "ckpt")
    ckpt = LocalCheckpoint(root)
    shape = fit.ModelShape.from_config(ckpt.config())
    idle = fitpropose.rig_of(_spec("flash-next-int4-3x3090", root), _facts("4x3090-idle"), None, 4)
    assert idle is not None
    heads = list(rows(ckpt))
    # seed 000's flags on four idle cards: memory is there, the 550 MB pool is short of one sequence
    base = fit.engine_params(["-pp", "3", "--max-model-len", "262144", "--kv-cache-memory", "550000000",
                              "--gpu-memory-utilization", "0.97", "--language-model-only",
                              "--max-num-seqs", "4", "--max-num-batched-tokens", "512"], {})  # fmt: skip
    s = layout.Summary(shape, base, layout.summary_keys(shape, 4, base), heads)
    ranked, _ = propose.search(s, base, idle, headroom=512 * MiB)
    fix = prescribe.prescribe(s, base, idle, ranked)
    assert fix == [
        "lower --max-model-len to 33568: the KV pool holds 33,568 tokens, less than one 262,144-token "
        "sequence (or switch --kv-cache-dtype fp8: 67,136 tokens)"
    ]
    # two stages cannot hold 64 GiB of weights on 24 GiB cards; a third stage can
    two = fit.engine_params(["-pp", "2", "--kv-cache-memory", "550000000", "--language-model-only",
                             "--max-num-seqs", "4", "--max-num-batched-tokens", "512"], {})  # fmt: skip
    s2 = layout.Summary(shape, two, layout.summary_keys(shape, 4, two), heads)
    ranked2, _ = propose.search(s2, two, idle, headroom=512 * MiB)
    assert prescribe.prescribe(s2, two, idle, ranked2) == [
        "add a stage: --pipeline-parallel-size 3 (vLLM's even split)"
    ]


@pytest.mark.parametrize(
    ("make", "name", "case", "squat", "allow"),
    [  # the seeds' own layouts run within fit's 512 MiB margin (or on a host KV offload fit does not
        # model): their pins must give for a GO, so each is allowed what its --propose lists apart
        (ck.seed000_like, "flash-next-int4-3x3090", "3x3090-squatter", 64, propose.PINS),
        (ck.seed003_like, "flash-next-merlin-4x3090", "4x3090-idle", None, ("kv-cache-memory",)),
    ],
)
def test_every_proposal_written_into_the_spec_is_a_go_by_invoke_fits_own_table(
    tmp_path: Path,
    make: Callable[[], ck.Arch],
    name: str,
    case: str,
    squat: int | None,
    allow: tuple[str, ...],
) -> None:
    facts = _facts(case, squat)
    prop, spec = _propose(make(), name, facts, tmp_path, allow=frozenset(allow))
    assert prop.top()
    for p in prop.top():
        applied = with_layout(spec, p.layout, p.params, "test")
        est = checkpoint.estimate_for(applied, LocalCheckpoint(Path(spec.model.local_dir)))
        fits = fitreport.fit_gpus(est, applied, facts)
        group = p.ranks[: p.layout.group]
        assert [f.headroom for f in fits] == [r.headroom for r in group]
        assert [f.verdict for f in fits] == ["go"] * len(fits), [f.why for f in fits]
        assert fitreport.overall(fits)[0] == "go"
        assert est.kv_tokens([f.total for f in fits]) * p.layout.dp == p.kv_tokens


# -- unseen rigs and checkpoints: the acceptance properties ------------------------------------------------

RIG_CARD = st.tuples(st.integers(12, 48), st.integers(0, 3072))  # GiB total, MiB held by a squatter


@settings(max_examples=20, deadline=None)
@given(
    kind=st.sampled_from(["moe", "hybrid"]),
    layers=st.integers(4, 24),
    inter=st.integers(1, 16).map(lambda k: 64 * k),
    heads=st.sampled_from([(8, 2), (8, 8), (16, 4), (12, 4)]),
    cards=st.lists(RIG_CARD, min_size=2, max_size=4),
    close=st.sets(st.tuples(st.integers(0, 3), st.integers(0, 3)).map(lambda t: tuple(sorted(t)))),
    recipe=st.sampled_from([["-tp", "2"], ["-pp", "2", "--kv-cache-memory", "1G"], []]),
)
def test_on_unseen_rigs_every_proposal_fits_by_fits_own_count_and_holds_no_less_kv_than_the_recipe(
    kind: str,
    layers: int,
    inter: int,
    heads: tuple[int, int],
    cards: list[tuple[int, int]],
    close: set[tuple[int, int]],
    recipe: list[str],
) -> None:
    dims = (1024, heads[0], heads[1], 128, 32000)
    make = ck.moe if kind == "moe" else ck.hybrid_mtp
    a = make(layers, dims, experts=16, inter=inter, lazy=True)
    shape = fit.ModelShape.from_config(a.config)
    base = fit.engine_params([*recipe, "--max-model-len", "8192"], {})
    rig = propose.Rig(
        tuple(
            propose.Card(i, "NVIDIA GeForce RTX 3090", g * GiB, m * MiB, (("PID 1 x", m * MiB),) if m else ())
            for i, (g, m) in enumerate(cards)
        ),
        frozenset(p for p in close if p[0] != p[1] and p[1] < len(cards)),
        (8, 6),
    )
    s = layout.Summary(shape, base, layout.summary_keys(shape, len(cards), base), header_rows(a))
    headroom = fit.WARN_HEADROOM  # the default: plain fit's margin
    ranked, seen = propose.search(s, base, rig, headroom=headroom)
    assert seen > 0
    own = propose.recipe_row(s, base, rig, headroom) if base.world <= len(cards) else None
    for p in ranked:
        assert p.fits and p.kv_tokens >= (own.kv_tokens if own is not None and own.fits else 0)
        assert [r.need.weights for r in p.ranks] == independent(a, p.layout, p.params) * p.layout.dp
        first = p.cards[0]  # the engine's scheduler defaults follow its first card, as invoke fit counts
        est = fit.estimate(shape, p.params, header_rows(a)).for_card(first.total, first.name)
        for r in p.ranks:
            kv, _, needs = est.usage(est.ranks[r.need.rank], r.card.total)
            assert kv > 0 and r.card.has - needs == r.headroom >= headroom
            # plain fit on the applied flags says GO on this rank: what fits here is a GO there
            v = fitverdict.rank_verdict(est, est.ranks[r.need.rank], r.card.total, r.card.others)
            assert v.verdict == "go", v.why
        assert p.max_context <= 8192 and p.sequences >= 1
    assert [p.key() for p in ranked] == sorted((p.key() for p in ranked), reverse=True)
