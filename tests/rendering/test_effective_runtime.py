"""What runs is what the recipe meant (issue 24), over every imported corpus command × every target.

The recipe's side is the argv bash parses from the published text (test_corpus proves the spec holds it
byte for byte) and its volumes; the artifact's side is what each target's consumer reads: bash running
run.sh's / provision.sh's `podman run` (podman recorded), podman's quadlet generator (ExecStart), the
compose file and the pod spec as YAML, pct.conf's mount lines. Every difference must be a mapping the spec
states (the model word → model.container_path, a secondary model's word → its mount) or a decision written
in the spec's notes ("decision: … network.listen", "decision: … --served-model-name"); anything else fails.
Mounts keep their container path and read-only flag, a file mount is never a directory mount, and `~` is
one home written out.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from rigsmith import secondary, userhome
from rigsmith import spec as specmod
from rigsmith.errors import SpecError
from rigsmith.project import Project
from rigsmith.rendering import deploy, optins
from rigsmith.rendering.targets import LxcOptions
from tests.importing.test_corpus import _import
from tests.support.facts import exec_start, podman_facts, split_systemd
from tests.support.recipes import corpus, expected, filled_as_user
from tests.support.targets import conf_pairs, run_quadlet

HOME = "/home/rig"
TARGETS = ("podman", "quadlet", "compose", "lxc", "kube")
_EXPECTED = expected()
CASES = [
    c
    for c in corpus()
    if _EXPECTED[c["id"]]["outcome"] == "imported" and "deploy_refused" not in _EXPECTED[c["id"]]
]
#: The issue's own findings as recipes (the corpus publishes every API port on all addresses).
_NGRAM_NOTE = "Fix: truncate -s 102400491520 WORKSTATION/ngram_table.bin (sparse) before first launch."
EXTRA = [
    {
        "id": "issue24-loopback-publish",
        "raw": "docker run --gpus 1 -p 127.0.0.1:8000:8000 vllm/vllm-openai:v0.11.0 --model Qwen/Qwen3-8B "
        "--host 0.0.0.0",
    },
    {
        "id": "issue24-compose-loopback",
        "raw": "services:\n  vllm:\n    image: vllm/vllm-openai:v0.11.0\n    ports: ['127.0.0.1:8000:8000']\n"
        "    command: [--model, Qwen/Qwen3-8B, --host=0.0.0.0]\n",
    },
    {
        "id": "issue24-file-mount",
        "raw": json.dumps(
            {
                "id": "ngram",
                "title": "ngram",
                "command": "docker run --gpus 1 -v /srv/ws/ngram_table.bin:/ws/ngram_table.bin "
                "-v /srv/cfg/chat.jinja:/t/chat.jinja:ro vllm/vllm-openai:v0.11.0 --model Qwen/Qwen3-8B",
                "env": "",
                "notes": _NGRAM_NOTE,
            }
        ),
    },
]
RECORD = """#!/bin/sh
for a in "$@"; do printf '%s\\0' "$a"; done > "$RIGSMITH_OUT"
"""


def _declared_argv(dep: specmod.Deployment) -> list[str]:
    """The recipe's argv with only what the spec declares applied (the model and secondary model words
    mapped; each decision only when its notes line says so)."""
    placed = {p.repo: p.container_path for p in secondary.placements(dep)}
    args = secondary.rewrite_args(dep, dep.engine.args, placed)
    notes = "\n".join(dep.notes)
    listen = dep.network.listen
    if listen is not None:
        assert f"network.listen: {listen}" in notes and "decision: the recipe publishes" in notes
        args = optins.with_flag(args, "--host", listen)
    engine = dep.engine.model_copy(update={"args": args})
    argv = [dep.engine.executable, *(dep.fill(a) for a in engine.container_argv(dep.model))]
    if dep.engine.model_arg is not None:
        word = dep.engine.args[dep.engine.model_arg].split("=", 1)[-1]
        filled = dep.fill(word)
        if f"every target adds --served-model-name {word}:" in notes:
            argv += ["--served-model-name", filled]
    return argv


def _bash_podman_run(script_text: str, tmp_path: Path) -> list[str]:
    """The `podman run` argv a generated script hands podman, as bash reads it (the checks before it are
    not run: they look at this host)."""
    lines = script_text.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("podman run --detach"))
    head = [ln for ln in lines[:start] if ln.startswith(("NAME=", "IMAGE="))]
    script = tmp_path / "run-block.sh"
    script.write_text("\n".join(["set -eu", *head, *lines[start:]]) + "\n")
    bin_ = tmp_path / "recbin"
    bin_.mkdir(exist_ok=True)
    (bin_ / "podman").write_text(RECORD)
    (bin_ / "podman").chmod(0o755)
    out = tmp_path / "argv"
    env = {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}", "RIGSMITH_OUT": str(out)}
    proc = subprocess.run(
        ["bash", str(script)], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    return ["podman", *out.read_bytes().decode().split("\0")[:-1]]


def _runtime(target: str, files: dict[str, str], tmp_path: Path, quadlet_bin: Path) -> dict[str, Any]:
    """argv (entrypoint + command) and mounts {container: (host, readonly, kind or None)} per consumer."""
    if target in ("podman", "lxc"):
        script = next(t for p, t in files.items() if p.endswith(("run.sh", "provision.sh")))
        f = podman_facts(_bash_podman_run(script, tmp_path))
        mounts = {c: (h, ro, None) for h, c, ro in f.mounts}
        if target == "lxc":
            conf = next(t for p, t in files.items() if p.endswith(".conf"))
            for k, v in conf_pairs(conf):
                if k.startswith("mp"):
                    mounts_dir = v.split(",")[0]
                    for c, (h, ro, _) in mounts.items():
                        if h == mounts_dir:
                            mounts[c] = (h, ro, "dir")
                elif k == "lxc.mount.entry" and "create=file" in v:
                    src = v.split()[0]
                    for c, (h, ro, _) in mounts.items():
                        if h == src:
                            mounts[c] = (h, ro, "file")
        return {"argv": [f.entrypoint, *f.command], "mounts": mounts}
    if target == "quadlet":
        unit = tmp_path / "x.container"
        unit.write_text(next(iter(files.values())))
        proc = run_quadlet(quadlet_bin, unit, tmp_path / "w")
        assert proc.returncode == 0, proc.stderr
        f = podman_facts(split_systemd(exec_start(proc.stdout), home="/nonexistent-home"))
        return {"argv": [f.entrypoint, *f.command], "mounts": {c: (h, ro, None) for h, c, ro in f.mounts}}
    doc = next(d for d in yaml.safe_load_all(next(iter(files.values()))) if d)
    if target == "compose":
        svc = next(iter(doc["services"].values()))
        mounts = {}
        for v in svc.get("volumes", []):
            if isinstance(v, dict):  # the long syntax: a file, never created as a directory
                assert v["bind"] == {"create_host_path": False}, v
                mounts[v["target"]] = (v["source"], v["read_only"], "file")
                continue
            host, cont, *opt = v.split(":")
            mounts[cont] = (host, opt == ["ro"], "dir")
        return {"argv": [*svc["entrypoint"], *svc["command"]], "mounts": mounts}
    pod = doc["spec"]["template"]["spec"]
    c = pod["containers"][0]
    vols = {v["name"]: v for v in pod["volumes"]}
    mounts = {
        m["mountPath"]: (
            vols[m["name"]]["hostPath"]["path"],
            bool(m.get("readOnly")),
            {"Directory": "dir", "File": "file"}[vols[m["name"]]["hostPath"]["type"]],
        )
        for m in c["volumeMounts"]
        if "hostPath" in vols[m["name"]]
    }
    return {"argv": [*c["command"], *c["args"]], "mounts": mounts}


@pytest.mark.parametrize("case", [*CASES, *EXTRA], ids=[c["id"] for c in [*CASES, *EXTRA]])
def test_every_target_runs_what_the_recipe_meant_or_a_declared_decision(
    case: dict[str, Any], tmp_path: Path, quadlet_bin: Path
) -> None:
    dep = filled_as_user(_import(case))
    if secondary.gguf_quant(dep):
        pytest.skip("a GGUF reference renders once pinned (test_corpus checks the refusal)")
    project = Project(tmp_path / "p")
    project.spec_path(dep.name).parent.mkdir(parents=True)
    project.spec_path(dep.name).write_text(specmod.dump(dep), encoding="utf-8")
    dep = project.load(dep.name)  # as the targets read it: a filled model placeholder is the model there
    want_argv = _declared_argv(dep)
    want_mounts = {m.container: (userhome.expand(m.host, HOME), m.readonly, m.kind) for m in dep.mounts}
    for target in TARGETS:
        if dep.cluster is not None and target == "kube":
            continue  # a LeaderWorkerSet: tests/rendering/test_cluster.py reads it
        lxc = LxcOptions(pve_version="8.2")
        try:
            _plan, arts = deploy.artifacts(
                project, target, deployment=dep.name, out=tmp_path / "out", home=HOME, lxc=lxc
            )
        except SpecError as err:  # a target that cannot express the recipe refuses, naming it: no drift
            assert f"the {target} target cannot express" in str(err), str(err)
            continue
        files = {str(a.path): a.content for a in arts}
        (tmp_path / target).mkdir()
        got = _runtime(target, files, tmp_path / target, quadlet_bin)
        if dep.cluster is None:  # a node's argv (its rank, the head's address) is test_cluster*.py's
            assert got["argv"] == want_argv, f"{target}: an undeclared difference in the argv"
        for cont, (host, ro, kind) in want_mounts.items():
            assert cont in got["mounts"], f"{target}: the recipe's volume {cont} is not mounted"
            g_host, g_ro, g_kind = got["mounts"][cont]
            assert (g_host, g_ro) == (host, ro), f"{target}: mount {cont}"
            assert g_kind in (None, kind), f"{target}: {cont} is a {kind} mounted as a {g_kind}"
        text = "\n".join(files.values())
        assert "%h" not in text and '"${HOME}"' not in text, f"{target}: ~ left to the runtime"
