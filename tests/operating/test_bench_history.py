"""`bench --history`: each 1-stream run tied to its recorded lock, upgrades and rollbacks marked, in the
terminal and as an SVG file."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from rigsmith import spec as specmod
from rigsmith.errors import RigsmithError
from rigsmith.operating import bench as benchmod
from rigsmith.operating import benchhistory
from rigsmith.resolving import lock as lockmod
from rigsmith.resolving import lockhistory
from tests.support.common import standin_deployment


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
    _lock(path, "1", "invoke upgrade", "upgrade rolled back: bench: decode", "2026-12-01T10:01:06Z")
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
