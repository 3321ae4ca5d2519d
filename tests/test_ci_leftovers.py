""".ci/leftovers: .ci/run fails when the suite left anything in the home or the temp dirs outside its own."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support.common import REPO

SCRIPT = REPO / ".ci" / "leftovers"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, str(SCRIPT), *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


def test_a_run_that_left_nothing_passes_and_one_that_left_something_names_it(tmp_path: Path) -> None:
    home, tmp, skipped = tmp_path / "home", tmp_path / "tmp", tmp_path / "tmp" / "suite-temp-root"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "known_hosts").write_text("node-a key\n")
    (home / "notes").write_text("mine\n")
    skipped.mkdir(parents=True)
    snap = tmp_path / "snap.json"
    roots = ["--root", str(home), "--root", str(tmp), "--skip", str(skipped)]
    assert _run("snapshot", str(snap), *roots).returncode == 0
    (skipped / "basetemp" / "x").mkdir(parents=True)  # the suite's own temp dir: not a leftover
    clean = _run("compare", str(snap))
    assert clean.returncode == 0, clean.stdout + clean.stderr

    (tmp / "stray" / "deep").mkdir(parents=True)
    (tmp / "stray" / "deep" / "f").write_text("x")
    with (home / ".ssh" / "known_hosts").open("a") as fh:
        fh.write("node-b key\n")
    (home / "notes").unlink()
    dirty = _run("compare", str(snap))
    assert dirty.returncode == 1, dirty.stdout + dirty.stderr
    named = [ln.strip() for ln in dirty.stdout.splitlines() if ln.startswith("  ")]
    assert named == [
        f"appeared: {tmp / 'stray'} (dir)",  # a new tree is named once, by its top
        f"vanished: {home / 'notes'} (file 5 bytes)",
        f"changed: {home / '.ssh' / 'known_hosts'} (file 22 bytes)",
    ]


def test_ci_run_wraps_exactly_the_readme_s_test_command_in_the_check() -> None:
    run = (REPO / ".ci" / "run").read_text()
    readme = (REPO / "README.md").read_text()
    assert "python3 -m pytest -q" in readme
    lines = [ln.strip() for ln in run.splitlines()]
    snap, test, compare = (
        lines.index('python3 .ci/leftovers snapshot "$snap"'),
        lines.index("python3 -m pytest -q || rc=$?"),
        lines.index('python3 .ci/leftovers compare "$snap" || { [ "$rc" -ne 0 ] || rc=1; }'),
    )
    assert snap < test < compare
