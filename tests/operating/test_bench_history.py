"""`bench --history`: each 1-stream run tied to its recorded lock, upgrades and rollbacks marked, in the
terminal and as an SVG file."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from rigsmith import spec as specmod
from rigsmith.errors import RigsmithError
from rigsmith.operating.bench import bench as benchmod
from rigsmith.operating.bench import history as benchhistory
from rigsmith.resolving.lock import lock as lockmod
from rigsmith.resolving.lock import lockhistory
from tests.support.common import standin_deployment, write_project
from tests.support.recipes import task_cli


def _lock(path: Path, commit: str, command: str, reason: str | None, when: str) -> str:
    """Change the lock, its history entry dated ``when`` (a test runs faster than a second); its text."""
    with lockhistory.because(command, reason), lockmod.locked(path) as lock:
        lock.models["t"] = lockmod.LockedModel(repo="acme/m", commit=commit * 40)
    index = path.parent / ".rigsmith/locks/index.jsonl"
    rows = [json.loads(r) for r in index.read_text().splitlines()]
    rows[-1]["time"] = when
    index.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path.read_text()


def _bench(root: Path, spec: specmod.Deployment, text: str, when: str, tps: float, ttft: float) -> None:
    run = {"streams": 1, "mean_stream_decode_tps": tps, "aggregate_decode_tps": tps, "ttft_mean_s": ttft}
    row = {"time": when, "deployment": spec.name, "lock_key": benchmod.lock_key(text, spec), "runs": [run]}
    benchmod.append(benchmod.results_path(root), row)


def test_runs_are_tied_to_their_locks_and_upgrades_and_rollbacks_are_marked(tmp_path: Path) -> None:
    spec = specmod.from_data(standin_deployment(tmp_path, name="t"))
    path = tmp_path / "rigsmith.lock"
    one = _lock(path, "1", "invoke pin", None, "2026-12-01T10:00:00Z")
    _bench(tmp_path, spec, one, "2026-12-01T10:00:05Z", 200.0, 0.05)
    two = _lock(path, "2", "invoke upgrade", "upgrade from lock 1", "2026-12-01T10:01:00Z")
    _bench(tmp_path, spec, two, "2026-12-01T10:01:05Z", 140.0, 0.08)
    _lock(path, "1", "invoke rollback", "rollback to lock 1", "2026-12-01T10:01:06Z")
    _bench(tmp_path, spec, one, "2026-12-01T10:01:06Z", 199.0, 0.05)  # the same second as the rollback

    pts = benchhistory.points(tmp_path, path, spec)
    assert [(p.lock, p.decode_tps, round(p.ttft_ms)) for p in pts] == [
        ("#1", 200.0, 50),
        ("#2", 140.0, 80),
        ("#3", 199.0, 50),  # lock 3 is lock 1's text again, written by the rollback
    ]
    mks = benchhistory.marks(path)
    assert [(m.n, m.what) for m in mks] == [(2, "upgrade"), (3, "rollback")]
    lines = benchhistory.terminal(pts, mks)
    assert lines[1].startswith("2026-12-01T10:00:05Z     #1         200.0 " + "█" * 30)
    assert lines[2] == "── upgrade → lock #2 ──" and lines[4] == "── rollback → lock #3 ──"
    assert "140.0 " + "█" * 21 + " " in lines[3]

    svg = benchhistory.write_chart(pts, mks, tmp_path / "chart.svg", "t: decode tok/s and TTFT")
    root = ET.parse(svg).getroot()
    text = " ".join(t.strip() for t in root.itertext() if t.strip())
    for want in ("decode tok/s (1 stream)", "TTFT ms", "upgrade points", "rollback points", "upgrade → #2"):
        assert want in text, want
    with pytest.raises(RigsmithError, match="written as SVG"):
        benchhistory.write_chart(pts, mks, tmp_path / "chart.png", "t")


def test_no_runs_yet_says_so() -> None:
    assert benchhistory.terminal([], []) == ["no bench runs of this deployment yet (`invoke bench`)"]
    assert json.dumps(benchhistory.marks(Path("/nonexistent/rigsmith.lock"))) == "[]"


def _charted_project(tmp_path: Path) -> tuple[Path, specmod.Deployment]:
    """A checkout with a lock history (pin, upgrade) and two bench runs of deployment t."""
    project = write_project(tmp_path, standin_deployment(tmp_path, name="t"))
    spec = project.load("t")
    one = _lock(project.lock_path, "1", "invoke pin", None, "2026-12-01T10:00:00Z")
    _bench(project.root, spec, one, "2026-12-01T10:00:05Z", 200.0, 0.05)
    two = _lock(project.lock_path, "2", "invoke upgrade", "upgrade from lock 1", "2026-12-01T10:01:00Z")
    _bench(project.root, spec, two, "2026-12-01T10:01:05Z", 190.0, 0.05)
    return project.root, spec


def test_the_chart_is_self_contained_goes_under_rigsmith_and_an_existing_file_is_kept_without_yes(
    tmp_path: Path,
) -> None:
    root, _spec = _charted_project(tmp_path)
    done = task_cli(root, "bench", "--history")
    assert done.returncode == 0, done.stderr
    default = root / ".rigsmith/charts/t.svg"
    assert "── upgrade → lock #2 ──" in done.stdout and str(default) in done.stdout
    svg = default.read_text()
    assert "<svg" in svg[:400]
    scripts = re.findall(r"<script\b[^>]*>", svg)
    assert not [t for t in scripts if "href" in t or "src" in t], scripts  # no script from pygal's site
    assert "kozea.github.io" not in svg and "pygal-tooltips" not in svg
    assert not list(root.glob("*.svg"))  # nothing in the checkout root

    mine = root / "chart.svg"
    mine.write_text("the user's own file\n")
    kept = task_cli(root, "bench", "--history", "--out", str(mine))
    assert kept.returncode == 1 and "Traceback" not in kept.stderr
    assert "exists; nothing was written" in kept.stderr and "--yes" in kept.stderr
    assert mine.read_text() == "the user's own file\n"
    replaced = task_cli(root, "bench", "--history", "--out", str(mine), "--yes")
    assert replaced.returncode == 0, replaced.stderr
    assert "<svg" in mine.read_text()[:400]


HOSTILE = {
    "huge": {"streams": 1, "mean_stream_decode_tps": 1e308, "ttft_mean_s": 1e308},
    "streams": {"streams": "one", "mean_stream_decode_tps": 1.0, "ttft_mean_s": 0.1},
    "object": {"streams": 1, "mean_stream_decode_tps": {"tps": 1}, "ttft_mean_s": 0.1},
}


@pytest.mark.parametrize("kind", [*HOSTILE, "not-an-object", "runs-object"])
def test_a_hostile_bench_row_is_one_paragraph_naming_its_line(tmp_path: Path, kind: str) -> None:
    root, spec = _charted_project(tmp_path)
    results = benchmod.results_path(root)
    if kind == "not-an-object":
        line = json.dumps(["t", 1])
    else:
        runs: object = {"a": 1} if kind == "runs-object" else [HOSTILE[kind]]
        line = json.dumps({"time": "2026-12-01T10:02:00Z", "deployment": spec.name, "runs": runs})
    with results.open("a") as fh:
        fh.write(line + "\n")
    out = task_cli(root, "bench", "--history")
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert f"{results} line 3 cannot be charted" in out.stderr, out.stderr
    assert "nothing was drawn" in out.stderr and not (root / ".rigsmith/charts/t.svg").exists()


def test_a_fifo_for_bench_history_is_refused_without_blocking(tmp_path: Path) -> None:
    import os

    root, _spec = _charted_project(tmp_path)
    results = root / ".rigsmith/bench.jsonl"
    results.unlink()
    os.mkfifo(results)  # opened non-blocking: a blocking open would wait here for a writer forever
    out = task_cli(root, "bench", "--history")
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "is not a regular file" in out.stderr


def test_foreign_text_in_the_history_and_the_bench_rows_is_shown_escaped(tmp_path: Path) -> None:
    root, spec = _charted_project(tmp_path)
    index = root / ".rigsmith/locks/index.jsonl"
    rows = [json.loads(r) for r in index.read_text().splitlines()]
    rows[-1]["reason"] = "\x1b[2J\x1b]52;c;cGF5bG9hZA==\x07cleared"
    index.write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = {"streams": 1, "mean_stream_decode_tps": 100.0, "ttft_mean_s": 0.1}
    row = {"time": "\x1b[31mred", "deployment": spec.name, "lock_key": "#\x1b[2J", "runs": [run]}
    benchmod.append(benchmod.results_path(root), row)
    for args in (("bench", "--history"), ("lock", "--history")):
        out = task_cli(root, *args)
        assert out.returncode == 0, out.stderr
        assert "\x1b" not in out.stdout and "\x07" not in out.stdout, args
    assert "\\x1b[2J" in task_cli(root, "lock", "--history").stdout
