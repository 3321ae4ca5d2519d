"""Seed 000's pitfall 2 in the quadlet target: podman makes a directory for a missing bind-mount path, so the
unit checks each file mount before the container starts, as run.sh does — the ExecStartPre= that podman's
own quadlet generator passes through, run as systemd splits it: a missing file is created sparse at its
exact size, a directory or a file of another size stops the start with the reason."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from rigsmith.rendering import deploy
from tests.support.common import standin_deployment, write_project
from tests.support.facts import split_systemd
from tests.support.targets import quadlet_service

SIZE = 102400491520


def _pre_start(tmp_path: Path, quadlet_bin: Path) -> tuple[list[str], Path]:
    data = standin_deployment(tmp_path, seed="flash-next-int4-3x3090", name="file-q")
    project = write_project(tmp_path, data)
    _plan, files = deploy.artifacts(
        project, "quadlet", deployment="file-q", out=tmp_path / "out", podman_version="5.4.2"
    )
    service = quadlet_service(quadlet_bin, files[0].content, "file-q", tmp_path).stdout
    (line,) = re.findall(r"^ExecStartPre=(.*)$", service, re.MULTILINE)
    return split_systemd(line), Path(data["mounts"][0]["host"])  # type: ignore[index]


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60)


def test_the_unit_creates_the_missing_file_sparse_and_refuses_a_directory_or_another_size(
    tmp_path: Path, quadlet_bin: Path
) -> None:
    argv, ple = _pre_start(tmp_path, quadlet_bin)
    assert argv[0] == "/bin/sh" and argv[-2:] == [str(ple), str(SIZE)]
    proc = _run(argv)
    assert proc.returncode == 0, proc.stderr
    assert ple.stat().st_size == SIZE and ple.stat().st_blocks == 0 and "created sparse file" in proc.stdout
    assert _run(argv).returncode == 0  # the right file: the start goes on
    ple.unlink()
    ple.touch()  # the stale 0-byte file the patched loader rejects
    proc = _run(argv)
    assert proc.returncode == 1 and "has the wrong size" in proc.stderr and str(SIZE) in proc.stderr
    ple.unlink()
    ple.mkdir()  # what podman leaves for a missing path
    proc = _run(argv)
    assert proc.returncode == 1 and "is a directory" in proc.stderr
