"""Start-up stays light: importing tasks/ (what every `invoke` command, `--list` included, pays) loads no
heavy library and none of rigsmith's areas; each task loads what it needs inside its body. Structural,
not timed: the modules are counted in a fresh interpreter."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

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
    "rigsmith.spec",
    "rigsmith.project",
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
        env={"PYTHONPATH": f"{REPO / 'src'}:{REPO}", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return list(json.loads(res.stdout.splitlines()[-1]))


def _heavy(mods: list[str]) -> list[str]:
    return [m for m in mods if any(m == h or m.startswith(h + ".") for h in HEAVY)]


def test_importing_tasks_loads_nothing_heavy() -> None:
    assert _heavy(_loaded_after("import tasks")) == []


def test_listing_the_tasks_loads_nothing_heavy() -> None:
    # What `invoke --list` does: load the collection and print every task's name and help.
    code = "import io, contextlib\nimport tasks\nfrom invoke.main import program\n"
    code += "with contextlib.redirect_stdout(io.StringIO()):\n"
    code += "    program.run(['invoke', '--list'], exit=False)\n"
    assert _heavy(_loaded_after(code)) == []


def test_the_fetch_model_default_matches_modelfetch() -> None:
    from tasks import models

    from rigsmith.resolving import modelfetch

    assert models.WORKERS == modelfetch.WORKERS
