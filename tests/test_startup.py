"""Start-up stays light: importing the CLI (rigsmith.cli, and the checkout's tasks.py that `invoke` loads:
what every command, `--list` included, pays) loads no heavy library and none of rigsmith's areas; each task
loads what it needs inside its body. Structural, not timed: the modules are counted in a fresh interpreter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

#: Libraries (and rigsmith modules) that cost tens of milliseconds each to import.
HEAVY = (
    "huggingface_hub",
    "httpx",
    "httpx2",
    "rich",
    "docker",
    "jinja2",
    "pydantic",
    "tenacity",
    "filelock",
    "rigsmith.spec",  # rigsmith.project (0.6 ms) loads it only when a spec is read
    "rigsmith.importing",
    "rigsmith.resolving",
    "rigsmith.rendering",
    "rigsmith.operating",
)


def _loaded_after(code: str) -> list[str]:
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    res = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=REPO,
        # A bare environment, but the suite's home and temp dir (rendering writes Jinja's compiled templates
        # to the temp dir: without TMPDIR that is the machine's /tmp).
        env={
            "PYTHONPATH": f"{REPO / 'src'}:{REPO}",
            "PATH": "/usr/bin:/bin",
            "HOME": os.environ["HOME"],
            "TMPDIR": os.environ["TMPDIR"],
        },
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return list(json.loads(res.stdout.splitlines()[-1]))


def _heavy(mods: list[str]) -> list[str]:
    return [m for m in mods if any(m == h or m.startswith(h + ".") for h in HEAVY)]


@pytest.mark.parametrize("module", ["rigsmith.cli", "tasks", "rigsmith.cli.program"])
def test_importing_the_cli_loads_nothing_heavy(module: str) -> None:
    assert _heavy(_loaded_after(f"import {module}")) == []


@pytest.mark.parametrize(
    "run",
    [
        "from invoke.main import program\nprogram.run(['invoke', '--list'], exit=False)",  # loads ./tasks.py
        "from rigsmith.cli.program import program\nprogram().run(['rigsmith', '--list'], exit=False)",
    ],
    ids=["invoke", "rigsmith"],
)
def test_listing_the_tasks_loads_nothing_heavy(run: str) -> None:
    # What `invoke --list` and `rigsmith --list` do: load the collection and print every task's name and help.
    code = "import io, contextlib\nwith contextlib.redirect_stdout(io.StringIO()):\n"
    code += "".join(f"    {line}\n" for line in run.splitlines())
    loaded = _loaded_after(code)
    assert "rigsmith.cli" in loaded and _heavy(loaded) == []


def test_deploy_check_of_one_target_loads_no_other_target(tmp_path: Path) -> None:
    # `deploy --check` computes its answer every run; it stays fast by importing only the target it renders.
    from rigsmith.rendering import deploy
    from tests.support.common import make_seed_project

    project = make_seed_project(tmp_path)
    seed = "flash-next-int4-3x3090"
    deploy.deploy(project, "podman", deployment=seed, yes=True, echo=lambda _: None)
    code = "from pathlib import Path\nfrom rigsmith.project import Project\n"
    code += "from rigsmith.rendering import deploy\n"
    code += f"deploy.deploy(Project(Path({str(project.root)!r})), 'podman', deployment={seed!r}, check=True)"
    targets = [m for m in _loaded_after(code) if m.startswith("rigsmith.rendering.targets.")]
    # timing, refusals, filecheck, ini and context are shared; every other module there is one target (or one
    # form of it).
    shared = {"timing", "refusals", "filecheck", "context", "ini"}
    assert sorted(m.rpartition(".")[2] for m in targets if m.rpartition(".")[2] not in shared) == ["podman"]


def test_the_fetch_model_default_matches_modelfetch() -> None:
    from rigsmith.cli import models
    from rigsmith.resolving.model import modelfetch

    assert models.WORKERS == modelfetch.WORKERS


def test_bundle_and_unbundle_load_no_http_client() -> None:
    # A bundle re-run on an unchanged deployment touches nothing; it should not pay for a registry client
    # either (the OCI archive code needs the media-type names, which live in the pure imageref).
    mods = _loaded_after("import rigsmith.operating.bundle.bundle, rigsmith.operating.bundle.unbundle")
    assert [m for m in mods if m.split(".")[0] in ("httpx", "httpx2", "huggingface_hub")] == []


def test_rigsmith_writes_bytecode_as_python_does(tmp_path: Path) -> None:
    # Invoke turns bytecode off unless --write-pyc; the rigsmith command follows Python's own setting, so a
    # command does not compile rigsmith's modules again every time (rigsmith/cli/program.py, core_args).
    def written(**env: str) -> list[Path]:
        cache = tmp_path / str(len(env))
        full = {
            "PYTHONPATH": f"{REPO / 'src'}:{REPO}",
            "PATH": "/usr/bin:/bin",
            "PYTHONPYCACHEPREFIX": str(cache),
        }
        subprocess.run(
            [sys.executable, "-m", "rigsmith", "--list"], cwd=REPO, env={**full, **env}, capture_output=True,
            check=True, timeout=60,
        )  # fmt: skip
        return sorted(cache.rglob("*.pyc"))

    assert any(p.name.startswith("flags.") for p in written())
    assert written(PYTHONDONTWRITEBYTECODE="1") == []
