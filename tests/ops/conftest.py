"""Ops fixtures: a vLLM-like stand-in image (startup lines with the KV-cache gate), a host-side stand-in
OpenAI server on a free 127.0.0.1 port."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from rigsmith.ops.standin import Standin, StandinConfig
from tests.conftest import Podman

OPS_IMAGE = "localhost/rigsmith-ops-standin:1"

#: vLLM's startup as far as `wait` cares: banner, (delay), KV cache line, readiness line; then idle until
#: SIGTERM. STANDIN_KV / STANDIN_DELAY / STANDIN_FATAL change what it logs.
ENGINE = textwrap.dedent(
    """\
    #!/bin/sh
    echo "INFO 09-20 10:00:00 [api_server.py:1880] vLLM API server version 0.0.0+standin"
    echo "INFO 09-20 10:00:01 [api_server.py:1881] args: $*"
    sleep "${STANDIN_DELAY:-0}"
    if [ -n "${STANDIN_FATAL:-}" ]; then echo "$STANDIN_FATAL"; exit 1; fi
    echo "INFO 09-20 10:00:09 [kv_cache_utils.py:829] GPU KV cache size: ${STANDIN_KV:-924,993} tokens"
    echo "INFO:     Application startup complete."
    trap 'echo "SIGTERM received"; exit 0' TERM
    while :; do sleep 1; done
    """
)


@pytest.fixture(scope="session")
def ops_image(podman: Podman, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A busybox image whose `vllm` logs like vLLM's startup (imported; nothing is pulled)."""
    root = tmp_path_factory.mktemp("ops-rootfs")
    for d in ("bin", "usr/local/bin", "tmp", "proc", "sys", "dev", "etc"):
        (root / d).mkdir(parents=True)
    shutil.copy2("/bin/busybox", root / "bin/busybox")
    for tool in ("sh", "sleep", "echo"):
        (root / "bin" / tool).symlink_to("busybox")
    (root / "usr/local/bin/vllm").write_text(ENGINE)
    (root / "usr/local/bin/vllm").chmod(0o755)
    tar = subprocess.run(["tar", "-C", str(root), "-c", "."], capture_output=True, check=True).stdout
    proc = subprocess.run(
        podman.argv("import", "--change", "ENV=PATH=/usr/local/bin:/bin", "-", OPS_IMAGE),
        input=tar,
        capture_output=True,
        env={**os.environ, "CONTAINERS_CONF": str(podman.conf)},
        check=False,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    return OPS_IMAGE


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def standin_server(tmp_path: Path) -> Iterator[Standin]:
    """A stand-in OpenAI server on 127.0.0.1 at 200 tok/s with 20 ms TTFT, logging to tmp_path/standin.log."""
    cfg = StandinConfig(
        model_names=("flash-next-v2", "flash-next"), rate=200.0, ttft=0.02, log=tmp_path / "standin.log"
    )
    with Standin(cfg, port=free_port()) as s:
        yield s


@pytest.fixture(autouse=True)
def _fake_cdi_present(request: pytest.FixtureRequest) -> None:
    """Re-create the shared fake CDI spec if a concurrent test session (another checkout) removed it."""
    if "fake_cdi" in request.fixturenames:
        from tests.conftest import FAKE_CDI_SPEC

        path: Path = request.getfixturevalue("fake_cdi")
        if not path.exists():
            import json

            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(FAKE_CDI_SPEC, indent=1))
            tmp.replace(path)
