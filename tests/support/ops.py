"""The vLLM-like ops stand-in image and deployment data for the ops tests."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from tests.support.common import prepare_host_dirs, standin_deployment

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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ops_data(
    tmp_path: Path, name: str, *, env: dict[str, str] | None = None, **changes: Any
) -> dict[str, Any]:
    """Seed 003 stand-in data on the vLLM-like image and a free port, plus extra env; host dirs made."""
    data = standin_deployment(tmp_path, name=name, network={"port": free_port()}, **changes)
    data["engine"]["image"] = OPS_IMAGE  # type: ignore[index]
    extra = [{"name": k, "value": v} for k, v in (env or {}).items()]
    data["env"] = [*data["env"], *extra]  # type: ignore[list-item]
    prepare_host_dirs(data)
    return data


def memlock_fixed() -> bool:
    """Whether a process here cannot raise RLIMIT_MEMLOCK to unlimited (so `--ulimit memlock=-1:-1`
    fails at container start), asked without rigsmith."""
    inf = "resource.RLIM_INFINITY"
    code = f"import resource; resource.setrlimit(resource.RLIMIT_MEMLOCK, ({inf}, {inf}))"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, check=False).returncode != 0
