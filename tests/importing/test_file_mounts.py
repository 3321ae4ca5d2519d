"""A bind-mounted file never becomes a directory (seed 000's pitfall 2, issue 24): import reads which mounts
are files (the notes create them, a file's name, a file on this host), and the podman target starts with
the file at its exact size."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from rigsmith.importing import recipe
from rigsmith.importing.recipe.notes import note_facts
from tests.support.common import FAKE_VENDOR, STANDIN_IMAGE, invoke_cli, run_script, write_project
from tests.support.podman import Podman

IMAGE = "vllm/vllm-openai:v0.11.0"
SEED_NOTE = (
    "2. PLE bind-mount needs a pre-existing file at the exact size. Fix: truncate -s 102400491520 "
    "WORKSTATION/ngram_table.bin (sparse) before first launch; loader fills it."
)


def _json_recipe(command: str, notes: str) -> str:
    return json.dumps({"id": "t", "title": "t", "command": command, "env": "", "notes": notes})


@pytest.mark.parametrize(
    ("notes", "path", "size"),
    [
        (SEED_NOTE, "WORKSTATION/ngram_table.bin", 102400491520),
        ("first: `fallocate -l 10G /srv/x/swap.img`.", "/srv/x/swap.img", 10 * 1024**3),
        ("dd if=/dev/zero of=/srv/a.bin bs=1M count=0 seek=100", "/srv/a.bin", 100 * 1024**2),
        ("truncate --size=4KB /x/y.bin", "/x/y.bin", 4000),
        ("touch ~/cfg.yaml.", "~/cfg.yaml", None),
    ],
)
def test_notes_that_create_a_file_are_read_with_its_size(notes: str, path: str, size: int | None) -> None:
    assert note_facts(notes).files == {path: size}


def test_a_mount_the_notes_truncate_is_a_sparse_file_of_that_size() -> None:
    volume = "/srv/ws/ngram_table.bin:/workstation/ngram_table.bin"
    cmd = f"docker run --gpus 1 -v {volume} {IMAGE} --model Qwen/Qwen3-8B"
    dep = recipe.parse(_json_recipe(cmd, SEED_NOTE), source="t", sha256="0" * 64)
    (m,) = dep.mounts
    assert (m.kind, m.sparse_size) == ("file", 102400491520)
    assert any("decision: mounts[0]" in n and "truncate -s 102400491520" in n for n in dep.notes)


@pytest.mark.parametrize(
    ("volume", "kind"),
    [
        ("/srv/cfg/chat.jinja:/templates/chat.jinja:ro", "file"),
        ("./config.yaml:/app/config.yaml", "file"),
        ("/srv/data:/data", "dir"),
        ("~/.cache/huggingface:/root/.cache/huggingface", "dir"),
        ("/srv/Qwen2.5-7B:/extra/Qwen2.5-7B", "dir"),
    ],
)
def test_a_file_name_makes_a_file_mount(volume: str, kind: str) -> None:
    dep = recipe.parse(
        f"docker run --gpus 1 -v {volume} {IMAGE} --model Qwen/Qwen3-8B", source="t", sha256="0" * 64
    )
    assert dep.mounts[0].kind == kind


def test_cli_import_makes_a_mount_whose_host_path_is_a_file_here_a_file_mount(tmp_path: Path) -> None:
    root = write_project(tmp_path).root
    table = tmp_path / "host" / "table"  # no suffix: only the host says it is a file
    table.parent.mkdir()
    table.write_bytes(b"x")
    src = tmp_path / "r.sh"
    src.write_text(f"docker run --gpus 1 -v {table}:/ws/table {IMAGE} --model Qwen/Qwen3-8B\n")
    proc = invoke_cli(root, "import-recipe", str(src), "--name", "filehere", "--yes")
    assert proc.returncode == 0, proc.stderr
    spec = yaml.safe_load((root / "deployments/filehere.yaml").read_text())
    assert spec["mounts"][0]["kind"] == "file"
    assert any("is a file on this host" in n for n in spec["notes"])


def test_cli_import_and_deploy_start_with_the_file_at_its_exact_size(
    tmp_path: Path, podman: Podman, fake_cdi: Path, standin_image: str
) -> None:
    root = write_project(tmp_path).root
    ws, models = tmp_path / "ws", tmp_path / "models"
    (models / "m").mkdir(parents=True)
    ws.mkdir()
    table = ws / "ngram_table.bin"
    cmd = (
        f"docker run --device {FAKE_VENDOR}=0 -v {table}:/workstation/ngram_table.bin -v {models}:/models "
        f"{STANDIN_IMAGE} --model /models/m"
    )
    src = tmp_path / "recipe.json"
    src.write_text(_json_recipe(cmd, SEED_NOTE))
    proc = invoke_cli(root, "import-recipe", str(src), "--name", "ngram", "--yes")
    assert proc.returncode == 0, proc.stderr
    proc = invoke_cli(root, "deploy", "--target", "podman", "--deployment", "ngram", "--memlock", "host")
    assert proc.returncode == 0, proc.stderr
    try:
        proc = run_script(root / "podman/ngram/run.sh", podman.env)
        assert proc.returncode == 0, proc.stderr
        podman.logs_until("ngram", "Application startup complete")
        assert table.is_file() and table.stat().st_size == 102400491520
        assert table.stat().st_blocks == 0, "sparse, not 95 GiB of zeros"
        inside = podman.run("exec", "ngram", "sh", "-c", "test -f /workstation/ngram_table.bin", check=False)
        assert inside.returncode == 0, "the container sees a file"
    finally:
        podman.run("rm", "--force", "--time", "0", "ngram", check=False)


def test_run_refuses_a_missing_file_mount_without_a_size_instead_of_making_a_directory(
    tmp_path: Path, podman: Podman, fake_cdi: Path, standin_image: str
) -> None:
    root = write_project(tmp_path).root
    models = tmp_path / "models"
    (models / "m").mkdir(parents=True)
    cfg = tmp_path / "cfg" / "chat.jinja"
    src = tmp_path / "r.sh"
    src.write_text(
        f"docker run --device {FAKE_VENDOR}=0 -v {cfg}:/t/chat.jinja -v {models}:/models {STANDIN_IMAGE} "
        "--model /models/m\n"
    )
    assert invoke_cli(root, "import-recipe", str(src), "--name", "jinja", "--yes").returncode == 0
    proc = invoke_cli(root, "deploy", "--target", "podman", "--deployment", "jinja", "--memlock", "host")
    assert proc.returncode == 0, proc.stderr
    proc = run_script(root / "podman/jinja/run.sh", podman.env)
    assert proc.returncode == 1 and f"{cfg} does not exist: create the file the engine reads" in proc.stderr
    assert not cfg.exists(), "nothing was made in its place"
    assert podman.run("container", "exists", "jinja", check=False).returncode == 1
