"""The tiny image definition and the CLI environment of the image tests."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from rigsmith.project import Project
from tests.support.common import REPO

TINY_PATCH = """\
--- a/greet.txt
+++ b/greet.txt
@@ -1 +1 @@
-hello
+hello patched by rigsmith
"""


def tiny_image(root: Path, base_ref: str, **changes: object) -> Path:
    """images/tiny: the busybox base, one path patch, one extra file, a build arg, a smoke check."""
    import yaml

    name, _, tag = base_ref.rpartition(":")
    home = root / "images" / "tiny"
    (home / "patches").mkdir(parents=True, exist_ok=True)
    (home / "patches" / "greet.patch").write_text(TINY_PATCH)
    (home / "greet.txt").write_text("hello\n")
    data: dict[str, object] = {
        "version": 1,
        "description": "busybox + one patch (tests)",
        "base": {"name": name, "tag": tag},
        "files": [{"src": "greet.txt", "dest": "/opt/src/greet.txt"}],
        "patches": [{"slot": "greet", "file": "patches/greet.patch", "target": "path", "path": "/opt/src"}],
        "build_args": {"GREETING": 'a $HOME "quoted" value'},
        "smoke": ["/bin/sh", "-c", "grep -q 'patched by rigsmith' /opt/src/greet.txt && echo smoke: ok"],
        "source": "https://example.invalid/rigsmith-tests",
        "labels": {"org.example.note": "dollar $HOME stays literal"},
    }
    data.update(changes)
    (home / "image.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return home


def tiny_project(tmp_path: Path, base_ref: str, *, deployment: bool = False, **changes: object) -> Project:
    """A checkout holding images/tiny (and, if asked, seed 000's deployment re-pointed at it)."""
    import yaml

    root = tmp_path / "project"
    (root / "deployments").mkdir(parents=True, exist_ok=True)
    tiny_image(root, base_ref, **changes)
    if deployment:
        data = yaml.safe_load((REPO / "deployments" / "flash-next-int4-3x3090.yaml").read_text())
        data["engine"]["build"] = "tiny"
        (root / "deployments" / "flash-next-int4-3x3090.yaml").write_text(
            yaml.safe_dump(data, sort_keys=False)
        )
    return Project(root)


def cli_env(project: Project, **extra: str) -> dict[str, str]:
    """Environment for `invoke` in the worktree acting on ``project`` (no user docker config)."""
    env = {k: v for k, v in os.environ.items() if k not in ("DOCKER_HOST", "CONTAINER_HOST")}
    env["RIGSMITH_ROOT"] = str(project.root)
    env["PYTHONPATH"] = f"{REPO / 'src'}:{REPO}"
    env["DOCKER_CONFIG"] = str(project.root / ".docker-config")
    env.update(extra)
    return env


def invoke_bin() -> str:
    path = shutil.which("invoke")
    if path is None:
        pytest.fail("invoke is not installed", pytrace=False)
    return path
