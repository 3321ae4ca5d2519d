"""`fit --propose` beside the bench history: bench rows carry the layout the spec ran with, and where more
than one layout of the deployment was benchmarked, fit says which was measured faster (issue 28)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from rigsmith import spec as specmod
from rigsmith.operating.bench import bench as benchmod
from rigsmith.operating.fit import layoutmenu as fitpropose
from rigsmith.operating.fit import pastruns as fithistory
from rigsmith.operating.fit import report as fitreport
from rigsmith.resolving.fit import fit
from rigsmith.resolving.fit.checkpoint import LocalCheckpoint, rows
from rigsmith.resolving.fit.layout import Layout, of_params
from rigsmith.resolving.fit.propose import PINS
from tests.support import checkpoints as ck
from tests.support.common import standin_deployment


def _spec(tmp_path: Path, *extra: str) -> specmod.Deployment:
    data = standin_deployment(tmp_path, name="t")
    data["engine"]["args"] = [*data["engine"]["args"], *extra]  # type: ignore[index]
    return specmod.from_data(data)


def _bench(root: Path, layout: object, when: str, tps: float, ttft_s: float) -> None:
    run = {"streams": 1, "mean_stream_decode_tps": tps, "ttft_mean_s": ttft_s}
    many = {"streams": 4, "mean_stream_decode_tps": tps * 3, "ttft_mean_s": ttft_s * 2}
    row = {"time": when, "deployment": "t", "lock_key": "k", "runs": [many, run], "layout": layout}
    benchmod.append(benchmod.results_path(root), row)


def test_a_bench_row_records_the_layout_the_spec_ran_with(tmp_path: Path) -> None:
    spec = _spec(tmp_path, "--tensor-parallel-size", "2", "--pipeline-parallel-size", "2")
    row = benchmod.record(spec, "k", "http://127.0.0.1:1", "m", 16, [], "2026-12-01T10:00:00Z")
    benchmod.append(benchmod.results_path(tmp_path), row)
    (back,) = benchmod.history(benchmod.results_path(tmp_path), "t")
    assert back["layout"]["tp"] == 2 and back["layout"]["pp"] == 2
    assert fithistory._layout(back["layout"]) == of_params(fit.engine_inputs(spec))


def test_the_newest_run_of_each_layout_is_compared_and_the_faster_one_named(tmp_path: Path) -> None:
    tp2 = Layout(2, 1)
    pp2 = Layout(1, 2, partition=(25, 23))
    _bench(tmp_path, dataclasses.asdict(tp2), "2026-11-01T10:00:00Z", 20.0, 0.100)
    _bench(tmp_path, dataclasses.asdict(tp2), "2026-11-02T10:00:00Z", 40.0, 0.200)  # newest of TP2
    _bench(tmp_path, dataclasses.asdict(pp2), "2026-11-03T10:00:00Z", 35.0, 0.150)
    _bench(tmp_path, None, "2026-11-04T10:00:00Z", 99.0, 0.010)  # written before rows had a layout
    _bench(tmp_path, {"tp": "two", "pp": 1}, "2026-11-05T10:00:00Z", 99.0, 0.010)  # hand-edited
    ms = fithistory.measured(benchmod.history(benchmod.results_path(tmp_path), "t"))
    assert [(m.layout, m.run.decode_tps) for m in ms] == [(tp2, 40.0), (pp2, 35.0)]
    lines = fithistory.faster(ms, tp2, [])
    assert "TP1×PP2 KV auto layers 25,23: decode 35.0 tok/s, TTFT 150 ms (2026-11-03T10:00:00Z)" in lines[2]
    assert lines[-1] == (
        "TP2×PP1 KV auto (the recipe's) was measured faster: decode 40.0 vs 35.0 tok/s; "
        "TP1×PP2 KV auto layers 25,23 had the lower TTFT (150 ms)"
    )
    # one layout measured: nothing to compare
    assert fithistory.faster(ms[:1], tp2, []) == []


def test_propose_names_the_measured_faster_layout_beside_the_proposals(tmp_path: Path) -> None:
    a = ck.seed000_like()
    root = a.headers(tmp_path / "ckpt")
    data = standin_deployment(tmp_path, seed="flash-next-int4-3x3090", name="t")
    data["model"]["local_dir"] = str(root)  # type: ignore[index]
    spec = specmod.from_data(data)
    ckpt = LocalCheckpoint(root)
    shape = fit.ModelShape.from_config(ckpt.config())
    rig = fitpropose.rig_of(spec, None, fitreport.planned_for(spec, 24.0, 3), 3)
    assert rig is not None
    every = frozenset(PINS)  # the recipe's pins free: the best layout differs from the recipe's
    plain = fitpropose.propose(spec, shape, rows(ckpt), rig, headroom=None, cap=None, allow=every)
    assert plain.measured == () and "measured faster" not in fitpropose.render(plain, "t")
    best = plain.top()[0].layout
    recipe = of_params(plain.base)
    assert best != recipe
    _bench(tmp_path, dataclasses.asdict(recipe), "2026-11-01T10:00:00Z", 30.0, 0.300)
    _bench(tmp_path, dataclasses.asdict(best), "2026-11-02T10:00:00Z", 45.0, 0.250)
    history = benchmod.history(benchmod.results_path(tmp_path), "t")
    prop = fitpropose.propose(
        spec, shape, rows(ckpt), rig, headroom=None, cap=None, bench_rows=history, allow=every
    )
    out = fitpropose.render(prop, "t")
    assert f"{best.label()} (proposal 1) was measured faster: decode 45.0 vs 30.0 tok/s" in out
    (mine,) = [line for line in out.splitlines() if line.startswith(f"  {recipe.label()} (the recipe's")]
    assert mine.endswith("): decode 30.0 tok/s, TTFT 300 ms (2026-11-01T10:00:00Z)")
    assert prop.top() == plain.top()  # the history is shown, it does not reorder the proposals
