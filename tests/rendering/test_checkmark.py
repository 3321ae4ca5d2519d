"""`invoke deploy --check` of files that are up to date answers from stat calls (no spec models, no Jinja),
and checks in full whenever anything it follows from changed: a generated file, the spec, the lock, the
flags, rigsmith's templates."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rigsmith import render
from rigsmith.rendering import checkmark
from tests.support.common import REPO, make_seed_project

SEED = "flash-next-int4-3x3090"
HEAVY = ("pydantic", "jinja2", "rigsmith.spec", "rigsmith.rendering.deploy")


def _check(root: Path, *extra: str) -> tuple[int, str, list[str]]:
    """`invoke deploy podman --check` in a fresh interpreter: exit code, output, heavy modules loaded."""
    args = ["invoke", "-r", str(REPO), "deploy", "podman", "--check", "--deployment", SEED, *extra]
    code = (
        "import json, sys\nfrom invoke.main import program\n"
        f"try:\n    program.run({args!r})\nexcept SystemExit as e:\n    rc = e.code or 0\nelse:\n    rc = 0\n"
        "print('MODULES', json.dumps(sorted(sys.modules)))\nsys.exit(rc)\n"
    )
    env = {**os.environ, "RIGSMITH_ROOT": str(root), "PYTHONPATH": f"{REPO / 'src'}:{REPO}"}
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    *said, mods = res.stdout.splitlines()
    loaded = json.loads(mods.removeprefix("MODULES "))
    heavy = [m for m in loaded if any(m == h or m.startswith(h + ".") for h in HEAVY)]
    return res.returncode, "\n".join(said) + res.stderr, heavy


def _warm(root: Path) -> str:
    """A passing check (full, or already from the mark), then one answered from its mark: its output."""
    rc, full, _ = _check(root)
    assert rc == 0, full
    rc, fast, heavy = _check(root)
    assert (rc, fast, heavy) == (0, full, [])
    return fast


@pytest.fixture
def root(tmp_path: Path) -> Path:
    from rigsmith.rendering import deploy

    project = make_seed_project(tmp_path)
    deploy.deploy(project, "podman", deployment=SEED, yes=True, echo=lambda _: None)
    return project.root


def test_an_up_to_date_check_loads_no_spec_models_and_no_jinja(root: Path) -> None:
    said = _warm(root)
    assert f"identical  podman/{SEED}/run.sh" in said and "image: " in said
    assert (root / ".rigsmith" / "checked" / f"podman-{SEED}.json").is_file()


def test_a_changed_or_touched_generated_file_is_checked_in_full(root: Path) -> None:
    _warm(root)
    run_sh = root / "podman" / SEED / "run.sh"
    run_sh.write_text(run_sh.read_text() + "# edited\n")
    rc, said, heavy = _check(root)
    assert rc == 1 and "differ from what the spec renders" in said and heavy
    run_sh.write_text(run_sh.read_text().removesuffix("# edited\n"))
    _warm(root)
    os.utime(run_sh, ns=(1, 1))  # same bytes, another mtime: the full check decides (and passes)
    rc, said, heavy = _check(root)
    assert rc == 0 and heavy


def test_a_changed_spec_lock_or_flag_is_checked_in_full(root: Path) -> None:
    _warm(root)
    spec = root / "deployments" / f"{SEED}.yaml"
    spec.write_text(spec.read_text() + "# a comment renders nothing new\n")
    rc, _said, heavy = _check(root)
    assert rc == 0 and heavy
    _warm(root)
    lock = root / "rigsmith.lock"
    lock.write_text(lock.read_text().replace("4444", "5555", 1))
    rc, said, heavy = _check(root)
    assert rc == 1 and "5555" in said and heavy
    lock.write_text(lock.read_text().replace("5555", "4444", 1))
    _warm(root)
    rc, said, heavy = _check(root, "--image", "docker.io/vllm/vllm-openai@sha256:" + "6" * 64)
    assert rc == 1 and heavy


def test_a_touched_template_changes_the_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert checkmark.TEMPLATES == render.TEMPLATES
    (tmp_path / "t.j2").write_text("x")
    monkeypatch.setattr(checkmark, "TEMPLATES", tmp_path)
    before = checkmark.key(tmp_path, "podman", SEED, {})
    assert checkmark.key(tmp_path, "podman", SEED, {}) == before
    os.utime(tmp_path / "t.j2", ns=(1, 1))
    assert checkmark.key(tmp_path, "podman", SEED, {}) != before
