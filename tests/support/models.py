"""A tiny checkpoint, digests and the CLI of the model tests."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from rigsmith.project import Project
from rigsmith.resolving.model.hub import RetryPolicy
from tests.support.common import REPO
from tests.support.hubserver import HubServer, random_bytes

GOLDEN = REPO / "tests" / "golden" / "models"
FAST = RetryPolicy(attempts=3, multiplier=0.05, max_wait=0.2, jitter=0.05)


MiB = 1 << 20


def tiny_files(seed: str, *, shards: int = 2, shard_size: int = 3 * MiB) -> dict[str, bytes]:
    """A small checkpoint laid out like a real one: config, tokenizer, index, safetensors shards."""
    files: dict[str, bytes] = {
        "config.json": json.dumps(
            {
                "architectures": ["Qwen3ForCausalLM"],
                "text_config": {"hidden_size": 64, "ple_embedding_dtype": "bfloat16"},
            },
            indent=2,
        ).encode()
        + b"\n",
        "generation_config.json": b'{"do_sample": true}\n',
        "tokenizer/tokenizer.json": json.dumps({"seed": seed}).encode(),
        "README.md": f"# {seed}\n".encode(),
    }
    weight_map = {}
    for i in range(1, shards + 1):
        name = f"model-{i:05d}-of-{shards:05d}.safetensors"
        files[name] = random_bytes(f"{seed}/{i}", shard_size + i * 4099)
        weight_map[f"layers.{i}.weight"] = name
    files["model.safetensors.index.json"] = json.dumps({"weight_map": weight_map}, indent=2).encode()
    return files


def digest(kind: str, data: bytes) -> str:
    if kind == "sha256":
        return hashlib.sha256(data).hexdigest()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def cli_env(hub: HubServer, project: Project, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
    env.update(
        HF_ENDPOINT=hub.url,
        HF_HOME=str(project.root / ".hf-home"),
        HF_HUB_DISABLE_TELEMETRY="1",
        HF_HUB_DISABLE_XET="1",
        RIGSMITH_ROOT=str(project.root),
        PYTHONPATH=os.pathsep.join([str(REPO / "src"), str(REPO)]),
    )
    env.update(extra)
    return env


def invoke_argv(*args: str) -> list[str]:
    """``invoke`` from this checkout's tasks.py (the worktree under test, not an installed copy)."""
    inv = shutil.which("invoke")
    assert inv, "invoke is not installed"
    return [sys.executable, inv, "-r", str(REPO), *args]


def run_cli(hub: HubServer, project: Project, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        invoke_argv(*args), env=cli_env(hub, project, **env), capture_output=True, text=True, timeout=300
    )


def overwrite_in_place(path: Path, offset: int, data: bytes) -> None:
    """Change bytes of ``path`` and put its mtime back: size and mtime as before, only ctime tells."""
    st = path.stat()
    with path.open("r+b") as fh:
        fh.seek(offset)
        fh.write(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    now = path.stat()
    assert (now.st_size, now.st_mtime_ns) == (st.st_size, st.st_mtime_ns)


def partial_name(path: str, data: bytes) -> str:
    """Where fetch-model keeps the partial download of an LFS file ``path`` holding ``data``."""
    from rigsmith.resolving.model.modelfiles import Want

    return Want(path, path, len(data), "sha256", hashlib.sha256(data).hexdigest()).partial_name
