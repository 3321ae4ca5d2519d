"""compose: a file mount is never made a directory (issue 24 and 36, seed 000's pitfall 2). podman-compose
creates a directory for any missing bind source (1.6.0 honours `create_host_path: false` by refusing, 1.0.6
ignores it) and compose has no pre-start step of its own, so the compose target renders files.sh beside
compose.yaml — the same check quadlet's ExecStartPre= and run.sh make — and the start line deploy prints
(and the file's header) runs it first: a missing file is created sparse at its exact size, a directory or a
file of another size stops the start with the reason. Run here as a user runs it: the printed start line,
with the real podman-compose 1.0.6 (the version the seed names) on real podman with fake CDI GPUs."""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

from tests.support.common import (
    HOST_MEMLOCK,
    invoke_cli,
    prepare_host_dirs,
    standin_deployment,
    write_project,
)
from tests.support.podman import Podman
from tests.support.targets import capture

NOTE = "Fix: truncate -s 4096 WORKSTATION/ngram_table.bin (sparse) before first launch."
SIZE = 102400491520


def test_podman_compose_refuses_a_missing_file_mount_and_makes_no_directory(
    tmp_path: Path, compose_bins: dict[str, list[str]]
) -> None:
    root = write_project(tmp_path).root
    table = tmp_path / "ws" / "ngram_table.bin"
    table.parent.mkdir()
    command = (
        f"docker run --gpus 1 -v {table}:/workstation/ngram_table.bin vllm/vllm-openai:v0.11.0 "
        "--model Qwen/Qwen3-8B"
    )
    recipe = tmp_path / "r.json"
    recipe.write_text(json.dumps({"id": "ng", "title": "ng", "command": command, "env": "", "notes": NOTE}))
    assert invoke_cli(root, "import-recipe", str(recipe), "--name", "ng", "--yes").returncode == 0
    proc = invoke_cli(root, "deploy", "--target", "compose", "--deployment", "ng")
    assert proc.returncode == 0, proc.stderr
    compose = root / "compose/ng/compose.yaml"
    assert f"#   {table} (4096 bytes, created sparse when missing)" in compose.read_text()
    dry = [*compose_bins["1.6.0"], "-f", str(compose), "--dry-run", "up", "-d"]
    proc = capture(dry, timeout=120)
    assert proc.returncode != 0 and "does not exist" in proc.stderr
    assert not table.exists(), "podman-compose made a directory where the file belongs"
    proc = capture(["sh", str(compose.parent / "files.sh")])  # what the start line runs first
    assert proc.returncode == 0, proc.stderr
    proc = capture(dry, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert table.is_file() and table.stat().st_size == 4096


def _start_line(stdout: str, compose_bin: list[str]) -> str:
    """deploy's printed start line, with this test's podman-compose in place of the one on PATH."""
    [line] = [ln for ln in stdout.splitlines() if ln.startswith("start: ")]
    return line.removeprefix("start: ").replace("podman-compose ", shlex.join(compose_bin) + " ", 1)


def test_seed_000s_start_line_makes_the_ple_file_and_podman_compose_106_mounts_a_file(
    tmp_path: Path,
    podman: Podman,
    fake_cdi: Path,
    standin_image: str,
    compose_bins: dict[str, list[str]],
) -> None:
    name = "file-c106"
    data = standin_deployment(tmp_path, seed="flash-next-int4-3x3090", name=name)
    prepare_host_dirs(data)
    root = write_project(tmp_path, data).root
    ple = Path(data["mounts"][0]["host"])  # type: ignore[index]
    deployed = invoke_cli(
        root, "deploy", "--target", "compose", "--deployment", name, "--memlock", HOST_MEMLOCK, "--yes"
    )
    assert deployed.returncode == 0, deployed.stderr
    start = _start_line(deployed.stdout, compose_bins["1.0.6"])
    assert start.startswith(f"sh compose/{name}/files.sh && ")  # relative to the checkout

    def run_start() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["sh", "-c", start], cwd=root, env=podman.env, capture_output=True, text=True, timeout=180
        )

    try:
        proc = run_start()
        assert proc.returncode == 0, proc.stdout + proc.stderr
        st = ple.stat()
        assert ple.is_file() and st.st_size == SIZE and st.st_blocks * 512 < 2**20  # sparse
        inside = podman.run("exec", name, "sh", "-c", "test -f /workstation/ngram_table.bin", check=False)
        assert inside.returncode == 0, "the PLE mount is not a file in the container"
    finally:
        podman.run("rm", "--force", "--time", "0", name, check=False)
        podman.run("pod", "rm", "--force", f"pod_{name}", check=False)
    for wrong in ("dir", "size"):
        ple.unlink() if ple.is_file() else ple.rmdir()
        ple.mkdir() if wrong == "dir" else ple.write_bytes(b"stale")
        proc = run_start()
        assert proc.returncode == 1 and str(ple) in proc.stderr, proc.stdout + proc.stderr
        assert podman.run("container", "exists", name, check=False).returncode == 1
