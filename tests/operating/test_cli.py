"""The ops tasks through the real `invoke` CLI: help, user errors without tracebacks, and a full
up → wait → bench → status → proxy-entry → down cycle against real podman and the stand-in server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.support.common import REPO, invoke_cli, write_project
from tests.support.ops import OPS_IMAGE, ops_data
from tests.support.podman import Podman
from tests.support.standin import Standin, StandinConfig


def invoke(
    *args: str, env: dict[str, str] | None = None, root: Path | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    return invoke_cli(root, *args, env=env, timeout=timeout)


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
            # no lock and a 40-token workload: no verdict against the recipe's numbers, and it says why
            assert "PASS" not in b.stdout and "published decode_1stream" not in b.stdout
            why = b.stdout.split("not compared with the recipe's published numbers: ", 1)[1]
            assert "rigsmith.lock pins no model for ops-cli" in why and "--max-tokens 40" in why
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


# -- the default deployment (issue 11: the mission's bare commands answered "say which one") -----------


def test_bare_commands_act_on_the_default_deployment_from_invoke_yaml_or_the_env(tmp_path: Path) -> None:
    from tests.support.common import make_seed_project

    project = make_seed_project(tmp_path)
    out = tmp_path / "out"
    ambiguous = invoke("deploy", "--target", "lxc", "--out", str(out), root=project.root)
    assert ambiguous.returncode == 1 and "2 deployments in" in ambiguous.stderr
    assert "--deployment NAME (one of: flash-next-int4-3x3090, flash-next-merlin-4x3090)" in ambiguous.stderr
    assert "`rigsmith: {deployment: NAME}` in invoke.yaml" in ambiguous.stderr
    assert "RIGSMITH_DEPLOYMENT=NAME" in ambiguous.stderr

    (project.root / "invoke.yaml").write_text("rigsmith:\n  deployment: flash-next-merlin-4x3090\n")
    bare = invoke("deploy", "--target", "lxc", "--out", str(out), "--yes", root=project.root)
    assert bare.returncode == 0, bare.stderr
    assert (out / "lxc" / "flash-next-merlin-4x3090" / "provision.sh").is_file()

    env = {**os.environ, "RIGSMITH_DEPLOYMENT": "flash-next-int4-3x3090"}
    chosen = invoke("deploy", "--target", "lxc", "--out", str(out), "--yes", env=env, root=project.root)
    assert chosen.returncode == 0, chosen.stderr
    assert (out / "lxc" / "flash-next-int4-3x3090").is_dir()
    env["RIGSMITH_DEPLOYMENT"] = "gone"
    wrong = invoke("fetch-model", env=env, root=project.root)
    assert wrong.returncode == 1 and "RIGSMITH_DEPLOYMENT names 'gone', which is not in" in wrong.stderr


def test_the_checkout_ships_the_main_job_as_its_default(tmp_path: Path) -> None:
    import yaml

    from rigsmith.project import Project
    from rigsmith.resolving.image import build as buildmod

    data = yaml.safe_load((REPO / "invoke.yaml").read_text())
    assert data == {"rigsmith": {"deployment": "flash-next-merlin-4x3090"}}
    # bare `invoke build` builds every image a deployment builds (merlin runs a prebuilt one)
    assert buildmod.images_to_build(Project(REPO), image=None, deployment=None) == ["vllm-3x3090"]
    assert buildmod.images_to_build(Project(REPO), image="x", deployment=None) == ["x"]
    # through Invoke's own config loading (no RIGSMITH_ROOT: the checkout invoke runs in)
    env = {k: v for k, v in os.environ.items() if k not in ("RIGSMITH_ROOT", "RIGSMITH_DEPLOYMENT")}
    bare = invoke("deploy", "--target", "lxc", "--out", str(tmp_path), "--yes", env=env)
    assert bare.returncode == 0, bare.stderr
    assert (tmp_path / "lxc" / "flash-next-merlin-4x3090" / "provision.sh").is_file()


# -- task wiring (issue 11 §6) ----------------------------------------------------------------------------


def test_no_task_has_an_invented_short_flag() -> None:
    for name, flag in (("wait", "-i"), ("deploy", "-e"), ("up", "-i"), ("doctor", "-v")):
        out = invoke("--help", name)
        assert out.returncode == 0 and f"{flag}," not in out.stdout and f" {flag} " not in out.stdout, (
            out.stdout
        )
    refused = invoke("wait", "-i", "5", root=REPO)
    assert refused.returncode != 0 and "No idea what '-i' is" in refused.stderr + refused.stdout


def test_import_with_stdin_closed_writes_a_new_spec_and_refuses_a_change_without_a_traceback(
    tmp_path: Path,
) -> None:
    root = tmp_path / "rig"
    (root / "deployments").mkdir(parents=True)
    recipe = tmp_path / "r.txt"
    recipe.write_text("vllm serve Qwen/Qwen3-0.6B --port 8011\n")

    def closed_stdin(*extra: str) -> subprocess.CompletedProcess[str]:
        args = ["import-recipe", str(recipe), "--name", "q", *extra]
        cmd = f"exec {sys.executable} -m invoke " + " ".join(f"'{a}'" for a in args) + " <&-"
        e = {**os.environ, "RIGSMITH_ROOT": str(root), "PYTHONPATH": f"{REPO / 'src'}:{REPO}"}
        return subprocess.run(
            ["bash", "-c", cmd], cwd=REPO, env=e, capture_output=True, text=True, timeout=120, check=False
        )

    first = closed_stdin("--image", "docker.io/vllm/vllm-openai:v0.11.0")
    assert first.returncode == 0, first.stderr
    assert (root / "deployments" / "q.yaml").is_file()
    change = closed_stdin("--image", "docker.io/vllm/vllm-openai:v0.11.1")
    assert change.returncode == 1 and "Traceback" not in change.stderr, change.stderr
    assert "v0.11.0" in (root / "deployments" / "q.yaml").read_text()


def test_model_dir_state_and_bench_results_are_git_ignored() -> None:
    for path in (".rigsmith/bench.jsonl", "models/x/.rigsmith/state.json"):
        proc = subprocess.run(
            ["git", "check-ignore", "--no-index", "-q", path], cwd=REPO, check=False, capture_output=True
        )
        assert proc.returncode == 0, f"{path} is not git-ignored"
