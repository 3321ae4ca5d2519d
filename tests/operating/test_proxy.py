"""Proxy entries: golden files for both seeds, and the llama-swap commands executed as llama-swap would."""

from __future__ import annotations

import json
import shlex
import subprocess
import time
from pathlib import Path

import yaml

from rigsmith import writer
from rigsmith.operating.lifecycle import proxy
from rigsmith.project import Project
from rigsmith.rendering import deploy
from rigsmith.spec import loads
from tests.support.common import GOLDEN, HOST_MEMLOCK, REPO, compare_tree, write_project
from tests.support.ops import ops_data
from tests.support.podman import Podman


def test_proxy_entries_match_golden(update_golden: bool) -> None:
    out = {}
    project = Project(REPO)
    for name in project.deployment_names():
        spec = project.load(name)
        for target in ("podman", "quadlet"):
            for fname, text in proxy.render(spec, target).items():
                if fname == "family.json" and target == "quadlet":
                    continue
                out[f"{name}/{target}/{fname}" if fname != "family.json" else f"{name}/{fname}"] = text
    compare_tree(out, GOLDEN / "ops" / "proxy", update_golden)


def test_seed000_family_entry_is_unmanaged_on_12434() -> None:
    spec = Project(REPO).load("flash-next-int4-3x3090")
    fam = proxy.family_entry(spec)
    assert (fam["family"], fam["proxy_port"], fam["backend_managed"]) == (
        "flashnext-int4-vllm-262k",
        12434,
        False,
    )
    assert fam["backend"] == "http://127.0.0.1:8001"
    entry = proxy.llama_swap_entry(spec)["models"]["flashnext-int4-vllm-262k"]
    assert entry["cmd"] == "podman wait flash-next-int4-3x3090" and entry["cmdStop"] == "true"


def test_seed003_served_names_and_ids() -> None:
    spec = Project(REPO).load("flash-next-merlin-4x3090")
    assert proxy.served_names(spec) == ["flash-next-v2", "flash-next", "flash-mtp", "flash-next-mtp"]
    assert list(proxy.llama_swap_entry(spec)["models"]) == ["flash-next-v2"]
    text = proxy.render(spec)["llama-swap.yaml"]
    assert text.startswith("# " + writer.BANNER_MARK)
    assert yaml.safe_load(text)["models"]["flash-next-v2"]["checkEndpoint"] == "/health"


def test_llama_swap_cmd_and_cmdstop_really_start_and_stop_the_deployment(
    tmp_path: Path, podman: Podman, fake_cdi: Path, ops_image: str
) -> None:
    """Run the entry the way llama-swap does: macros substituted, POSIX-split, cmd stays in the foreground."""
    data = ops_data(tmp_path, "ops-swap")
    project = write_project(tmp_path, data)
    # render the podman artifacts where ${env.RIGSMITH_ROOT} points (the checkout), without starting
    deploy.deploy(project, "podman", deployment="ops-swap", memlock=HOST_MEMLOCK, echo=lambda _m: None)
    entry = proxy.llama_swap_entry(loads(json.dumps(data)))["models"]
    ((model_id, e),) = entry.items()
    root = str(project.root)
    cmd = shlex.split(e["cmd"].replace(proxy.ROOT_MACRO, root))
    stop = shlex.split(e["cmdStop"].replace(proxy.ROOT_MACRO, root))
    proc = subprocess.Popen(cmd, env=podman.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        podman.logs_until("ops-swap", "Application startup complete")
        time.sleep(0.5)
        assert proc.poll() is None, "llama-swap's cmd must stay in the foreground while the model runs"
        s = subprocess.run(stop, env=podman.env, capture_output=True, text=True, timeout=120, check=False)
        assert s.returncode == 0, s.stderr
        assert proc.wait(30) == 0
        assert podman.run("container", "exists", "ops-swap", check=False).returncode == 1
    finally:
        proc.kill()
        podman.run("rm", "--force", "--time", "0", "ops-swap", check=False)
    assert model_id == "flash-next-v2"


def test_a_served_model_name_cannot_add_keys_to_the_llama_swap_config() -> None:
    spec = Project(REPO).load("flash-next-merlin-4x3090")
    evil = "x\nhealthCheckTimeout: 1\nmacros:\n  model: /bin/sh -c 'touch /tmp/rigsmith-pwned-p'"
    args = [*spec.engine.args, "--served-model-name", "first", evil]
    spec = spec.model_copy(update={"engine": spec.engine.model_copy(update={"args": tuple(args)})})
    text = proxy.render(spec)["llama-swap.yaml"]
    assert set(yaml.safe_load(text)) == {"models"}
    assert json.dumps(evil) in text
