"""kube: `podman kube play` runs the rendered manifests with the stand-in engine, then `podman kube down`."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from rigsmith.errors import SpecError
from rigsmith.project import Project
from rigsmith.rendering import deploy
from rigsmith.rendering.plan import RunPlan
from rigsmith.spec import loads
from tests.support.common import prepare_host_dirs, standin_deployment, write_project
from tests.support.podman import Podman, parse_recording
from tests.support.targets import SEEDS

#: Values Kubernetes' expansion leaves alone reach the container verbatim; those it would expand are
#: escaped in the manifest (test_units checks that against a model of Kubernetes' expansion), which
#: podman 4.3's kube play, expanding nothing, would pass on doubled.
KUBE_HOSTILE = ["$HOME ${TREE} `id`", "cost: 5$", "'quoted' \"double\"", "100% %h", "line\nbreak"]


@pytest.fixture
def played(
    tmp_path: Path, podman: Podman, standin_image: str
) -> Iterator[tuple[dict[str, Any], RunPlan, Path]]:
    data = standin_deployment(tmp_path, name="standin-kube")
    # Kubernetes expands $(VAR) in command, args and env values and turns $$ into $; recipe text must
    # reach the engine literally all the same.
    data["engine"]["args"] = [*data["engine"]["args"], "--literal", *KUBE_HOSTILE]  # type: ignore[index]
    data["env"] = [
        *data["env"],
        *({"name": f"KUBE_HOSTILE_{i}", "value": v} for i, v in enumerate(KUBE_HOSTILE)),
    ]  # type: ignore[misc]
    prepare_host_dirs(data)
    project = write_project(tmp_path, data)
    out = tmp_path / "out"
    deploy.deploy(project, "kube", deployment="standin-kube", out=out, echo=lambda _m: None)
    plan, _ = deploy.artifacts(project, "kube", deployment="standin-kube", out=out)
    manifest = out / "kube/standin-kube.yaml"
    try:
        proc = podman.run("kube", "play", str(manifest), check=False, timeout=180)
        assert proc.returncode == 0, proc.stderr
        yield data, plan, manifest
    finally:
        podman.run("kube", "down", str(manifest), check=False)
        podman.run("volume", "rm", "--force", "standin-kube-shm", check=False)


def _container(podman: Podman) -> str:
    listing = podman.run("ps", "-a", "--format", "{{.Names}} {{.Status}}").stdout
    names = [ln.split()[0] for ln in listing.splitlines() if ln.strip()]
    found = [n for n in names if n.endswith("-standin-kube")]
    assert found, f"kube play left no standin-kube container:\n{listing}"
    return found[0]


def test_kube_play_runs_the_exact_argv_env_and_mounts(played, podman: Podman) -> None:
    data, plan, _manifest = played
    name = _container(podman)
    rec = parse_recording(podman.logs_until(name, "Application startup complete"))
    spec = loads(json.dumps(data))
    assert rec.argv == ["serve", spec.model.container_path, *spec.engine.args[1:]]
    assert {k: rec.env.get(k) for k, _ in plan.env} == dict(plan.env)
    info = podman.inspect(name)
    mounts = {m["Destination"]: m for m in info["Mounts"]}  # type: ignore[index, union-attr]
    for m in plan.mounts:
        assert mounts[m.container]["Source"] == m.host and mounts[m.container]["RW"] is (not m.readonly)
    assert "/dev/shm" in mounts
    assert info["Config"]["Entrypoint"] in (plan.entrypoint, [plan.entrypoint])  # type: ignore[index]


def test_manifest_carries_gpus_shm_grace_and_probes(played) -> None:
    _data, plan, manifest = played
    docs = [d for d in yaml.safe_load_all(manifest.read_text()) if d]
    assert [d["kind"] for d in docs] == ["Deployment", "Service"]
    pod = docs[0]["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert c["resources"]["limits"] == {"example.com/gpu": len(plan.devices)}
    shm = next(v for v in pod["volumes"] if v.get("emptyDir"))
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "8Gi"}
    assert pod["terminationGracePeriodSeconds"] == plan.stop_timeout
    assert c["startupProbe"]["httpGet"]["path"] == plan.health_path
    assert (
        c["startupProbe"]["periodSeconds"] * c["startupProbe"]["failureThreshold"] >= plan.startup_seconds * 2
    )
    assert c["readinessProbe"]["httpGet"]["port"] == plan.port
    assert docs[1]["spec"]["ports"][0]["targetPort"] == plan.port


def test_what_kube_cannot_express_is_refused_naming_target_and_field(
    seed_project: Project, tmp_path: Path
) -> None:
    data = standin_deployment(tmp_path, name="refuse-kube", resources={"memlock": 65536})
    data["resources"]["gpus"]["cdi_devices"] = ["example.com/gpu=2"]  # type: ignore[index]
    data["resources"]["gpus"]["count"] = 1  # type: ignore[index]
    project = write_project(tmp_path, data)
    with pytest.raises(SpecError) as err:
        deploy.artifacts(project, "kube", deployment="refuse-kube", out=tmp_path / "out")
    assert "resources.memlock" in str(err.value) and "kube target cannot express" in str(err.value)
    data["resources"]["memlock"] = "unlimited"  # type: ignore[index]
    project = write_project(tmp_path / "b", data)
    with pytest.raises(SpecError) as err:
        deploy.artifacts(project, "kube", deployment="refuse-kube", out=tmp_path / "out")
    assert "resources.gpus.cdi_devices" in str(err.value) and "fixed indices" in str(err.value)
    for seed in SEEDS:
        deploy.artifacts(seed_project, "kube", deployment=seed, out=tmp_path / "out")  # the seeds render


#: Kubernetes' own validation (k8s.io/apimachinery/pkg/util/validation): Service names are DNS-1035 labels,
#: container names DNS-1123 labels, Deployment and Secret names DNS-1123 subdomains.
DNS1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


@pytest.mark.parametrize("name", ["qwen2.5-7b", "3x3090_a", "flash-next-int4-3x3090", "m_"])
def test_object_names_are_valid_kubernetes_names_for_any_deployment_name(tmp_path: Path, name: str) -> None:
    data = standin_deployment(
        tmp_path, name=name, env=[{"name": "HF_TOKEN", "value": "", "secret": True}], placeholders={}
    )
    project = write_project(tmp_path, data)
    _plan, files = deploy.artifacts(project, "kube", deployment=name, out=tmp_path / "out")
    dep, svc = list(yaml.safe_load_all(files[0].content))
    names = {
        "service": (svc["metadata"]["name"], DNS1035),
        "container": (dep["spec"]["template"]["spec"]["containers"][0]["name"], DNS1123_LABEL),
        "deployment": (dep["metadata"]["name"], DNS1123_SUBDOMAIN),
    }
    for vol in dep["spec"]["template"]["spec"]["volumes"]:
        names[f"volume {vol['name']}"] = (vol["name"], DNS1123_LABEL)
    for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]:
        if "valueFrom" in e:
            names["secret"] = (e["valueFrom"]["secretKeyRef"]["name"], DNS1123_SUBDOMAIN)
    for key, value in dep["metadata"]["labels"].items():
        names[f"label {key}"] = (value, LABEL_VALUE)
    for what, (value, rule) in names.items():
        assert rule.fullmatch(value) and len(value) <= 63, f"{what}: {value!r}"
    assert names["service"][0] == names["container"][0] == names["deployment"][0]


def test_a_file_mount_is_refused_until_the_printed_step_makes_it_then_is_a_file_inside(
    tmp_path: Path, podman: Podman, standin_image: str
) -> None:
    # Seed 000's pitfall 2 on kube: a hostPath of type File, which nothing on the kube side creates.
    table = tmp_path / "host/ple/ngram_table.bin"
    mount = {
        "host": str(table),
        "container": "/workstation/ngram_table.bin",
        "kind": "file",
        "sparse_size": 4096,
    }
    data = standin_deployment(tmp_path, name="standin-kfile")
    data["mounts"] = [*data["mounts"], mount]  # type: ignore[misc]
    prepare_host_dirs(data)
    project = write_project(tmp_path, data)
    out, said = tmp_path / "out", []
    deploy.deploy(project, "kube", deployment="standin-kfile", out=out, echo=said.append)
    manifest = out / "kube/standin-kfile.yaml"
    steps = [ln for ln in "\n".join(said).splitlines() if "on each node first" in ln]
    assert len(steps) == 1 and f"{table} must be a file of exactly 4096 bytes" in steps[0], said
    assert "truncate -s 4096" in manifest.read_text()
    try:
        refused = podman.run("kube", "play", str(manifest), check=False, timeout=180)
        assert refused.returncode != 0 and not table.exists()
        podman.run("kube", "down", str(manifest), check=False)
        subprocess.run(
            ["bash", "-c", steps[0].split(" bytes (sparse; never a directory): ", 1)[1]], check=True
        )
        assert table.stat().st_size == 4096 and table.stat().st_blocks == 0
        played = podman.run("kube", "play", str(manifest), check=False, timeout=180)
        assert played.returncode == 0, played.stderr
        name = next(
            n
            for n in podman.run("ps", "--format", "{{.Names}}").stdout.split()
            if n.endswith("-standin-kfile")
        )
        inside = podman.run("exec", name, "sh", "-c", "test -f /workstation/ngram_table.bin", check=False)
        assert inside.returncode == 0, inside.stderr
    finally:
        podman.run("kube", "down", str(manifest), check=False)
        podman.run("volume", "rm", "--force", "standin-kfile-shm", check=False)
