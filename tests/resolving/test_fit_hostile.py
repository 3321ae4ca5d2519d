"""`invoke fit` on a checkpoint a hostile Hub repo controls (issue 23): every malformed value is one
paragraph naming the file, and nothing outside the checkpoint is read (no absolute or ``..`` shard name, no
symlink, no FIFO that would block)."""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable
from pathlib import Path

import pytest

from rigsmith import spec as specmod
from tests.support import checkpoints as ck
from tests.support.common import invoke_cli, write_project

NAME = "fit-t"
CONFIG = ck.dense().config


def _header(obj: object) -> bytes:
    text = json.dumps(obj).encode()
    return struct.pack("<Q", len(text)) + text


def _deep(n: int) -> bytes:
    return b"[" * n + b"]" * n


def _good_shard() -> bytes:
    return ck.header_only([("model.embed_tokens.weight", "BF16", (1024, 256))])[0]


def _project(tmp_path: Path, files: dict[str, bytes]) -> Path:
    spec = ck.make_spec(tmp_path, ["-tp", "1"], repo=None)
    local = Path(spec.model.local_dir)
    local.mkdir(parents=True)
    for name, data in files.items():
        (local / name).write_bytes(data)
    return write_project(tmp_path, specmod.to_data(spec)).root


def _config(**change: object) -> bytes:
    return json.dumps({**CONFIG, **change}).encode()


ST = "model.safetensors"
CASES: dict[str, tuple[dict[str, bytes], str]] = {
    "header-is-a-list": ({"config.json": _config(), ST: _header([1, 2])}, ST),
    "header-deep": ({"config.json": _config(), ST: struct.pack("<Q", 200000) + _deep(100000)},
                    ST),
    "shape-a": ({"config.json": _config(), ST: _header(
        {"w": {"dtype": "BF16", "shape": ["a"], "data_offsets": [0, 2]}})}, ST),
    "offsets-ab": ({"config.json": _config(), ST: _header(
        {"w": {"dtype": "BF16", "shape": [1], "data_offsets": ["a", "b"]}})}, ST),
    "offsets-one": ({"config.json": _config(), ST: _header(
        {"w": {"dtype": "BF16", "shape": [1], "data_offsets": [1]}})}, ST),
    "tensor-a-number": ({"config.json": _config(), ST: _header({"w": 7})}, ST),
    "heads-zero": ({"config.json": _config(num_attention_heads=0), ST: _good_shard()},
                   "num_attention_heads"),
    "layers-huge": ({"config.json": _config(num_hidden_layers=10**12), ST: _good_shard()},
                    "num_hidden_layers"),
    "text-config-string": ({"config.json": _config(text_config="x"), ST: _good_shard()},
                           "text_config"),
    "config-deep": ({"config.json": _deep(100000), ST: _good_shard()}, "config.json"),
    "config-not-utf8": ({"config.json": b"\xff\xfe{\x00}", ST: _good_shard()}, "config.json"),
    "weight-map-a-list": ({"config.json": _config(), "model.safetensors.index.json": b'{"weight_map": ["a"]}',
                           "model-00001-of-00002.safetensors": _good_shard()}, "weight_map"),
    "header-length-huge": ({"config.json": _config(), ST: struct.pack("<Q", 1 << 62)},
                           ST),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_hostile_checkpoint_is_one_paragraph_naming_the_file_and_key(tmp_path: Path, case: str) -> None:
    files, names = CASES[case]
    root = _project(tmp_path, files)
    proc = invoke_cli(root, "fit", "--deployment", NAME, "--vram-gib", "24")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert names in proc.stderr, proc.stderr


def _index(shard: str) -> bytes:
    return json.dumps({"weight_map": {"model.embed_tokens.weight": shard}}).encode()


def _absolute(tmp_path: Path, local: Path) -> str:
    outside = tmp_path / "outside.safetensors"
    outside.write_bytes(_good_shard())
    return str(outside)


def _climbing(tmp_path: Path, local: Path) -> str:
    (tmp_path / "models" / "outside.safetensors").write_bytes(_good_shard())
    return "../outside.safetensors"


def _symlink(tmp_path: Path, local: Path) -> str:
    (tmp_path / "outside.safetensors").write_bytes(_good_shard())
    (local / "linked.safetensors").symlink_to(tmp_path / "outside.safetensors")
    return "linked.safetensors"


def _fifo(tmp_path: Path, local: Path) -> str:
    os.mkfifo(local / "blocked.safetensors")
    return "blocked.safetensors"


@pytest.mark.parametrize(
    "plant", [_absolute, _climbing, _symlink, _fifo], ids=["absolute", "dotdot", "symlink", "fifo"]
)
def test_fit_reads_nothing_outside_the_checkpoint(tmp_path: Path, plant: Callable[[Path, Path], str]) -> None:
    """The index is the repo's: a name that leaves the checkpoint (or a FIFO that would block) is refused."""
    root = _project(tmp_path, {"config.json": _config()})
    local = tmp_path / "models" / NAME
    shard = plant(tmp_path, local)
    (local / "model.safetensors.index.json").write_bytes(_index(shard))
    proc = invoke_cli(root, "fit", "--deployment", NAME, "--vram-gib", "24", timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert "outside" not in proc.stdout  # no figure was computed from the file outside
    assert shard in proc.stderr or repr(shard) in proc.stderr, proc.stderr
