"""compose: a file mount is never made a directory (issue 24, seed 000's pitfall 2). podman-compose creates
a directory for any missing bind source; the compose target writes file mounts in the long syntax with
`create_host_path: false` (which podman-compose 1.6.0 honours by refusing) and says in the file's header
which files to create first (1.0.6 ignores the flag)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.common import invoke_cli, write_project
from tests.support.targets import capture

NOTE = "Fix: truncate -s 4096 WORKSTATION/ngram_table.bin (sparse) before first launch."


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
    assert f"#   truncate -s 4096 {table}" in compose.read_text()
    dry = [*compose_bins["1.6.0"], "-f", str(compose), "--dry-run", "up", "-d"]
    proc = capture(dry, timeout=120)
    assert proc.returncode != 0 and "does not exist" in proc.stderr
    assert not table.exists(), "podman-compose made a directory where the file belongs"
    capture(["truncate", "-s", "4096", str(table)])  # what the header says to do
    proc = capture(dry, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert table.is_file() and table.stat().st_size == 4096
