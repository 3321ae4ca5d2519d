"""Calibration of fit's allowances from the KV size the engine reported at a boot on this rig: the pure
correction, and `fit --propose` carrying it into every layout it sizes (issue 28)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from rigsmith.operating.fit import layoutmenu as fitpropose
from rigsmith.operating.fit import report as fitreport
from rigsmith.operating.fit.observed import Observed
from rigsmith.project import Project
from rigsmith.resolving.fit import fit, fitengine, layout
from rigsmith.resolving.fit.calibrate import allowance_delta, calibrated
from rigsmith.resolving.fit.checkpoint import LocalCheckpoint, rows
from rigsmith.spec import Deployment, from_data, to_data
from tests.support import checkpoints as ck
from tests.support.common import REPO

GiB = fit.GiB
SHORT = int(0.41 * GiB)  # what the synthetic boot's runtime took beyond fit's allowances, per GPU
ARGV = ["--pipeline-parallel-size", "3", "--gpu-memory-utilization", "0.9", "--max-model-len", "4096"]


def reported(est: fit.Estimate, totals: list[int], short: int) -> int:
    """vLLM's "GPU KV cache size: N tokens", counted independently: utilisation × PyTorch's total less the
    weights, activations, memory outside PyTorch, graphs and ``short`` more, in whole blocks, the smallest
    rank deciding."""
    block = est.params.block_size
    util = est.params.gpu_memory_utilization
    pools = [
        (
            int((t - fitengine.DRIVER_RESERVE) * util)
            - r.weights
            - r.activation
            - r.non_torch
            - r.cuda_graphs
            - short
        )
        // (r.kv_bytes_per_token * block)
        * block
        for r, t in zip(est.ranks, totals, strict=True)
    ]
    return min(pools)


def _estimate(argv: list[str]) -> fit.Estimate:
    a = ck.dense()
    shape = fit.ModelShape.from_config(a.config)
    base = fit.engine_params(argv, {})
    heads = [(t.name, t.array.nbytes, tuple(t.array.shape)) for t in a.tensors]
    return layout.Summary(shape, base, layout.summary_keys(shape, 3, base), heads).estimate(base)


def test_the_correction_reproduces_what_the_engine_reported() -> None:
    est = _estimate(ARGV)
    totals = [24 * GiB] * 3
    seen = reported(est, totals, SHORT)
    delta = allowance_delta(est, totals, seen)
    assert delta is not None
    one_block = max(r.kv_bytes_per_token for r in est.ranks) * est.params.block_size
    assert SHORT <= delta < SHORT + one_block
    assert calibrated(est, delta).kv_tokens(totals) == seen
    # the runtime took less than fit allowed: a negative correction, same reproduction
    less = 48 * fit.MiB
    assert all(r.activation + r.cuda_graphs > less for r in est.ranks)
    seen_more = reported(est, totals, -less)
    more = allowance_delta(est, totals, seen_more)
    assert more is not None and -less <= more < -less + one_block
    assert calibrated(est, more).kv_tokens(totals) == seen_more


def test_a_boot_that_matches_the_estimate_or_ran_a_fixed_pool_changes_nothing() -> None:
    est = _estimate(ARGV)
    totals = [24 * GiB] * 3
    assert allowance_delta(est, totals, reported(est, totals, 0)) == 0
    fixed = _estimate([*ARGV, "--kv-cache-memory", "550000000"])
    assert allowance_delta(fixed, totals, 4096) is None
    assert calibrated(est, 0) is est


def _spec(root: Path) -> Deployment:
    """Seed 000's spec with a utilisation-sized pool (its --kv-cache-memory dropped)."""
    data = to_data(Project(REPO).load("flash-next-int4-3x3090"))
    data["model"]["local_dir"] = str(root)
    args = data["engine"]["args"]
    at = args.index("--kv-cache-memory")
    data["engine"]["args"] = args[:at] + args[at + 2 :]
    return from_data(data)


def test_propose_sizes_every_layout_with_the_calibrated_allowances_and_says_so(tmp_path: Path) -> None:
    a = ck.seed000_roomy()
    root = a.headers(tmp_path / "ckpt")
    spec = _spec(root)
    ckpt = LocalCheckpoint(root)
    shape = fit.ModelShape.from_config(ckpt.config())
    rig = fitpropose.rig_of(spec, None, fitreport.planned_for(spec, 24.0, 3), 3)
    assert rig is not None
    # the recipe's 262,144-token context is longer than these pools: only its host KV offload (not modelled,
    # so not a GO) admits it, and the proposals may choose the context
    free = frozenset({"max-model-len"})
    plain = fitpropose.propose(spec, shape, rows(ckpt), rig, headroom=None, cap=None, allow=free)
    totals = [c.total for c in rig.cards]
    seen_tokens = reported(plain.summary.estimate(plain.base), totals, SHORT)
    boot = Observed(spec.name, spec.model.repo, None, "x", seen_tokens, "2026-11-30T10:00:00Z")
    prop = fitpropose.propose(spec, shape, rows(ckpt), rig, headroom=None, cap=None, seen=boot, allow=free)
    assert prop.calibration is not None
    want = "calibrated from the boot of 2026-11-30T10:00:00Z: allowances +0.41 GiB per GPU"
    assert prop.calibration.startswith(want)
    assert prop.calibration in fitpropose.render(prop, "t")
    assert plain.calibration is None
    # the recipe's own layout, recounted with the correction, holds what the engine reported
    assert prop.recipe is not None and prop.recipe.kv_tokens == seen_tokens
    delta = prop.summary.allowance
    assert prop.top() and plain.top()
    for p in prop.top():
        uncal = fit.estimate(shape, p.params, rows(ckpt))
        for r in p.ranks:
            u = uncal.ranks[r.need.rank]
            assert r.need.non_torch == u.non_torch + delta
            # a fixed pool: the profile's activation peak comes and goes before it is allocated
            inside = u.weights + u.non_torch + delta + max(u.activation, r.kv + u.cuda_graphs)
            torch_total = r.card.total - fitengine.DRIVER_RESERVE
            budget = int(torch_total * p.params.gpu_memory_utilization)
            needs = fitengine.DRIVER_RESERVE + u.runtime + max(budget, inside)
            assert r.card.has - needs == r.headroom >= prop.headroom
    # the calibrated search sizes smaller pools than the uncalibrated one on the same layout (the recipe's
    # utilisation sizes them: what it leaves after the larger allowances)
    same = {p.layout: p for p in plain.top()}
    shared = [p for p in prop.top() if p.layout in same]
    assert shared
    for p in shared:
        assert p.params.kv_cache_memory is None
        assert min(r.kv for r in p.ranks) < min(r.kv for r in same[p.layout].ranks)


def test_a_boot_that_reported_0_tokens_says_nothing_about_the_allowances() -> None:
    """0 tokens (a log line of a pool that did not fit, or a parse of nothing) is no measurement: with it
    counted, every rank's whole budget would read as allowance fit missed."""
    est = _estimate(ARGV)
    totals = [24 * GiB] * 3
    assert allowance_delta(est, totals, 0) is None
    assert allowance_delta(est, totals, -1) is None
    assert allowance_delta(est, totals, 1) is not None  # the least count that is a measurement


def test_a_rank_without_an_attention_layer_does_not_decide_and_none_at_all_says_nothing() -> None:
    """A pipeline stage holding no attention layer keeps no KV cache: its budget bounds no token count. Its
    card here is the smallest (its budget the least), so counting it would decide the correction."""
    est = _estimate(ARGV)
    totals = [24 * GiB] * 3
    seen = reported(est, totals, SHORT)
    want = allowance_delta(dataclasses.replace(est, ranks=est.ranks[1:]), totals[1:], seen)  # ranks 1, 2 only
    no_kv = dataclasses.replace(est.ranks[0], kv_bytes_per_token=0)
    mixed = dataclasses.replace(est, ranks=(no_kv, *est.ranks[1:]))
    small_first = [8 * GiB, *totals[1:]]
    assert mixed.kv_budget(no_kv, small_first[0]) < min(mixed.kv_budget(r, 24 * GiB) for r in est.ranks)
    assert allowance_delta(mixed, small_first, seen) == want
    none = dataclasses.replace(
        est, ranks=tuple(dataclasses.replace(r, kv_bytes_per_token=0) for r in est.ranks)
    )
    assert allowance_delta(none, totals, seen) is None


def test_a_rig_with_a_card_the_layout_does_not_use_calibrates_from_the_cards_it_used() -> None:
    """fit's history passes every card of the rig: a layout of 3 ranks on 4 cards is measured on its 3."""
    est = _estimate(ARGV)
    totals = [24 * GiB] * 3
    seen = reported(est, totals, SHORT)
    assert allowance_delta(est, [*totals, 8 * GiB], seen) == allowance_delta(est, totals, seen)
