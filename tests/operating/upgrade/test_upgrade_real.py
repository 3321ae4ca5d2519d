"""invoke upgrade / rollback end to end: the Hub stand-in moves the model branch, real podman runs the
serving stand-in, bench measures it; a failed gate or a slower engine rolls back by itself."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from rigsmith.resolving.lock import lock as lockmod
from rigsmith.resolving.lock import lockhistory
from tests.support.hubserver import HubServer
from tests.support.podman import Podman
from tests.support.upgrade import BENCH, Rig, make_rig, snapshot

pytestmark = pytest.mark.engine
UPGRADE = ("upgrade", "--memlock", "host", *BENCH)


@pytest.fixture
def rig(
    tmp_path: Path, podman: Podman, hub_server: HubServer, serving_image: str, request: pytest.FixtureRequest
) -> Iterator[Rig]:
    name = "up-" + request.node.name.removeprefix("test_")[:20].replace("_", "-").strip("-")
    hub_server.reset()
    r = make_rig(tmp_path, podman, hub_server, name)
    try:
        yield r
    finally:
        podman.run("rm", "--force", "--time", "0", r.name, check=False)


def _history(rig: Rig) -> list[lockhistory.Entry]:
    return lockhistory.entries(rig.project.lock_path)


def test_an_upgrade_that_passes_serves_the_new_snapshot_and_history_shows_both_locks(rig: Rig) -> None:
    before = lockhistory.current_number(rig.project.lock_path)
    old_commit = lockmod.read(rig.project.lock_path).models[rig.name].commit
    new_commit = rig.hub.repo(rig.repo).add_commit(snapshot(rig.repo, "model-v2", 200.0))
    out = rig.cli(*UPGRADE)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"lock {before} → " in out.stdout and "passed" in out.stdout
    assert rig.serving() == "model-v2"
    assert lockmod.read(rig.project.lock_path).models[rig.name].commit == new_commit
    hist = rig.cli("lock", "--history")
    assert hist.returncode == 0, hist.stderr
    assert any("invoke upgrade" in ln and "upgrade from lock" in ln for ln in hist.stdout.splitlines())
    diff = rig.cli("lock", "--diff", str(before))
    lines = diff.stdout.splitlines()
    assert f"  model {rig.name}: commit {old_commit[:12]} → {new_commit[:12]} ({rig.repo})" in lines
    assert f"  model {rig.name}: ~ standin-name (9 B → 9 B)" in lines
    assert f"  model {rig.name}: ~ README.md" not in diff.stdout  # the same bytes in both commits
    rows = rig.bench_rows()
    assert len({r["lock_key"] for r in rows}) == 2  # the last-known-good's bench and the new one's
    chart = rig.cli("bench", "--history", "--out", str(rig.project.root / "chart.svg"))
    assert chart.returncode == 0, chart.stderr
    assert f"── upgrade → lock #{before + 1} ──" in chart.stdout
    assert "<svg" in (rig.project.root / "chart.svg").read_text()[:400]


def _assert_rolled_back(rig: Rig, out, old_text: str, why: str) -> None:
    assert out.returncode == 1, out.stdout + out.stderr
    assert "rolled back to lock" in out.stderr and why in out.stderr, out.stderr
    assert "Traceback" not in out.stderr
    assert rig.project.lock_path.read_text() == old_text
    assert rig.serving() == "model-v1"
    last = _history(rig)[-1]
    assert last.rolled_back and "upgrade rolled back: " in (last.reason or ""), last


def test_an_engine_that_never_gets_ready_rolls_back_to_the_old_snapshot(rig: Rig) -> None:
    old_text = rig.project.lock_path.read_text()
    rig.hub.repo(rig.repo).add_commit(snapshot(rig.repo, "model-v2", 200.0, broken=True))
    out = rig.cli(*UPGRADE)
    _assert_rolled_back(rig, out, old_text, "Engine core initialization failed")
    assert "container" in out.stderr and "is not running" in out.stderr  # up saw it die, then its log


def test_a_bench_30_percent_slower_rolls_back_and_says_which_number(rig: Rig) -> None:
    old_text = rig.project.lock_path.read_text()
    rig.hub.repo(rig.repo).add_commit(snapshot(rig.repo, "model-v2", 140.0))
    out = rig.cli(*UPGRADE)
    _assert_rolled_back(rig, out, old_text, "bench regressed")
    said = re.search(r"decode [\d.]+ tok/s vs [\d.]+ \((-\d+)%, threshold -10%\)", out.stderr)
    assert said is not None and -36 <= int(said.group(1)) <= -24, out.stderr
    # a manual rollback to the slow lock works too (its files were kept), and back again
    # one entry for the attempt: the upgrade's lock as fetch-model left it, marked rolled back
    attempt = _history(rig)[-1]
    assert attempt.rolled_back and attempt.command.startswith("invoke upgrade"), attempt
    assert lockhistory.current_number(rig.project.lock_path) == attempt.last_good
    slow = attempt.n
    again = rig.cli("rollback", "--to", str(slow), "--memlock", "host")
    assert again.returncode == 0, again.stdout + again.stderr
    assert rig.cli("wait").returncode == 0
    assert rig.serving() == "model-v2"
    back = rig.cli("rollback", "--memlock", "host")
    assert back.returncode == 0, back.stderr
    assert rig.cli("wait").returncode == 0
    assert rig.serving() == "model-v1"


def _labels(rig: Rig) -> dict[str, str]:
    info = json.loads(rig.podman.run("container", "inspect", rig.name).stdout)[0]
    return dict(info["Config"]["Labels"])


def _pins(rig: Rig, n: int) -> str:
    from rigsmith.rendering import plan as planmod

    spec = rig.project.load(rig.name)
    text = lockhistory.entry(rig.project.lock_path, n).text(rig.project.lock_path)
    lock = lockmod.parse(text, f"entry {n}", hint="")
    return planmod.lock_digest(spec, lock, planmod.resolve_image(spec, lock, None)[0])[:16]


def test_after_an_upgrade_a_bare_rollback_returns_to_the_last_known_good_and_the_container_says_so(
    rig: Rig,
) -> None:
    path = rig.project.lock_path
    good = lockhistory.current_number(path)
    assert good is not None
    assert _labels(rig)["io.rigsmith.lock-entry"] == str(good)
    assert _labels(rig)["io.rigsmith.lock-sha256"] == _pins(rig, good)
    rig.hub.repo(rig.repo).add_commit(snapshot(rig.repo, "model-v2", 200.0))
    had = len(_history(rig))
    out = rig.cli(*UPGRADE)
    assert out.returncode == 0, out.stdout + out.stderr
    new = _history(rig)
    assert len(new) == had + 1, new  # one entry for the upgrade (its repin and fetch's config patch)
    assert new[-1].last_good == good and new[-1].command.startswith("invoke upgrade")
    assert _labels(rig)["io.rigsmith.lock-entry"] == str(new[-1].n)
    assert _labels(rig)["io.rigsmith.lock-sha256"] == _pins(rig, new[-1].n)
    back = rig.cli("rollback", "--memlock", "host")
    assert back.returncode == 0, back.stdout + back.stderr
    assert f"rollback: running on lock {good}" in back.stdout
    assert rig.cli("wait").returncode == 0
    assert rig.serving() == "model-v1"
    rolled = _history(rig)[-1]
    assert rolled.command.startswith("invoke rollback") and rolled.reason == f"rollback to lock {good}"
    labels = _labels(rig)
    assert labels["io.rigsmith.lock-sha256"] == _pins(rig, good)
    assert labels["io.rigsmith.lock-entry"] == str(rolled.n)  # the rollback's entry: lock {good}'s text
    status = rig.cli("status")
    assert status.returncode == 0, status.stderr
    assert f"lock {rolled.n} (sha256 {_pins(rig, good)}…); what rigsmith.lock pins now" in status.stdout
