"""The ops tasks through the real `invoke` CLI: help, user errors without tracebacks, and a full
up → wait → bench → status → proxy-entry → down cycle against real podman and the stand-in server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from rigsmith.operating.standin import Standin, StandinConfig
from tests.support.common import REPO, write_project
from tests.support.ops import OPS_IMAGE, ops_data
from tests.support.podman import Podman

WORKTREE = Path(__file__).resolve().parents[2]


def invoke(
    *args: str, env: dict[str, str] | None = None, root: Path | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    e = dict(env or os.environ)
    e["PYTHONPATH"] = f"{WORKTREE / 'src'}:{WORKTREE}"
    if root is not None:
        e["RIGSMITH_ROOT"] = str(root)
    return subprocess.run(
        [sys.executable, "-m", "invoke", *args],
        cwd=WORKTREE,
        env=e,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_every_ops_task_has_help_for_every_flag() -> None:
    for name in ("doctor", "up", "down", "status", "logs", "wait", "bench", "proxy-entry"):
        out = invoke("--help", name)
        assert out.returncode == 0, out.stderr
        assert "Docstring:\n  none" not in out.stdout
        for line in out.stdout.split("Options:")[1].strip().splitlines():
            assert len(line.split(None, 1)) == 2 or line.startswith(" " * 20), (
                f"{name}: flag without help: {line}"
            )


def test_doctor_here_is_no_go_with_hints_and_no_traceback() -> None:
    out = invoke("doctor", "--deployment", "flash-next-merlin-4x3090", root=REPO)
    assert out.returncode == 1
    assert "NO-GO" in out.stderr and "memlock" in out.stderr and "Traceback" not in out.stderr + out.stdout
    assert (
        "LimitMEMLOCK=infinity" in out.stdout.replace("\n", " ").replace("│", " ").replace("  ", " ")
        or "LimitMEMLOCK" in out.stdout
    )


def test_user_errors_are_one_paragraph_not_tracebacks() -> None:
    out = invoke("up", "--deployment", "flash-next-merlin-4x3090", "--target", "lxc", root=REPO)
    assert out.returncode == 1 and "drive the podman and quadlet targets" in out.stderr
    assert "Traceback" not in out.stderr
    out = invoke("status", "--deployment", "nope", root=REPO)
    assert out.returncode == 1 and "no deployment 'nope'" in out.stderr and "Traceback" not in out.stderr
    out = invoke("logs", "--deployment", "flash-next-merlin-4x3090", "--tail", "x", root=REPO)
    assert out.returncode == 1 and "--tail 'x' is not a whole number" in out.stderr
    out = invoke("doctor", "--deployment", "flash-next-merlin-4x3090", "--target", "swarm", root=REPO)
    assert out.returncode == 1 and "unknown target 'swarm'" in out.stderr and "NO-GO" not in out.stderr


def test_full_cycle_through_the_cli(tmp_path: Path, podman: Podman, fake_cdi: Path, ops_image: str) -> None:
    data = ops_data(
        tmp_path,
        "ops-cli",
        env={"STANDIN_DELAY": "0.5"},
        benchmarks=[{"name": "decode_1stream", "tokens_per_second": 150.0}],
    )
    project = write_project(tmp_path, data)
    env = podman.env
    port = data["network"]["port"]  # type: ignore[index]
    try:
        up = invoke("up", "--memlock", "host", env=env, root=project.root)
        assert up.returncode == 0, up.stderr
        assert "verified ops-cli: running; 4 CDI device(s)" in up.stdout
        with Standin(StandinConfig(model_names=("flash-next-v2",), rate=150.0, ttft=0.01), port=port):
            w = invoke("wait", env=env, root=project.root)
            assert w.returncode == 0, w.stderr
            assert "ready after" in w.stdout and "GPU KV cache 924,993 tokens" in w.stdout
            b = invoke(
                "bench", "--max-tokens", "40", "--prompt-words", "20", "--compare", env=env, root=project.root
            )
            assert b.returncode == 0, b.stderr
            assert "published decode_1stream" in b.stdout and "PASS" in b.stdout
            st = invoke("status", env=env, root=project.root)
            assert st.returncode == 0 and "ops-cli: running" in st.stdout and "healthy" in st.stdout
        rows = (project.root / ".rigsmith" / "bench.jsonl").read_text().splitlines()
        assert json.loads(rows[0])["deployment"] == "ops-cli"
        lg = invoke("logs", "--tail", "3", env=env, root=project.root)
        assert lg.returncode == 0 and "Application startup complete" in lg.stdout
        px = invoke("proxy-entry", "--write", env=env, root=project.root)
        assert px.returncode == 0 and (project.root / "proxy/ops-cli/llama-swap.yaml").is_file()
        dn = invoke("down", env=env, root=project.root)
        assert dn.returncode == 0, dn.stderr
        assert "container stopped and removed" in dn.stdout
        assert podman.run("container", "exists", "ops-cli", check=False).returncode == 1
    finally:
        podman.run("rm", "--force", "--time", "0", "ops-cli", check=False)
    assert OPS_IMAGE
