"""The parity matrix: every target carries the same devices, shm, memlock, env, mounts, argv, readiness and
stop timeout as the RunPlan — read back from what each real consumer made of the artifact:

- podman: run.sh executed by bash (podman replaced by a recorder, so the exact argv is captured);
- quadlet: podman 5.4.2's quadlet generator, its ExecStart= split as systemd splits it;
- compose: podman-compose 1.6.0 really starting it; `podman inspect` → CreateCommand, Healthcheck;
- lxc: pct.conf parsed + provision.sh executed by bash in a fake CT (podman recorded);
- kube: the manifests parsed, then `podman kube play` + inspect (env, argv, mounts).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from rigsmith.rendering import deploy
from rigsmith.rendering.plan import RunPlan
from rigsmith.rendering.targets.timing import timings
from tests.support.common import prepare_host_dirs, standin_deployment, write_project
from tests.support.facts import exec_start, ini_values, podman_facts, split_systemd
from tests.support.podman import Podman
from tests.support.targets import compose_up, conf_pairs, fake_ct, run_quadlet

TARGETS = ("podman", "quadlet", "compose", "lxc", "kube")
ASPECTS = ("devices", "shm", "memlock", "env", "mounts", "argv", "readiness", "stop")

RECORDER = """#!/bin/sh
case "$1 $2" in "image exists") exit 0;; "container exists") exit 1;; esac
for a in "$@"; do printf '%s\\0' "$a"; done >> "$RIGSMITH_CALLS.podman"
"""


def expected(plan: RunPlan) -> dict[str, Any]:
    """The plan's facts, normalised the way every extractor below normalises."""
    return {
        "devices": sorted(tuple(d.split("=", 1)) for d in plan.devices),
        "shm": plan.shm_bytes,
        "memlock": plan.memlock_ulimit,
        "env": dict(plan.env),
        "mounts": sorted((m.host, m.container, m.readonly) for m in plan.mounts),
        "argv": [plan.entrypoint, *plan.command],
        "readiness": (plan.health_path, plan.port),
        "stop": plan.stop_timeout,
    }


def _size(text: str) -> int:
    from rigsmith.spec import parse_size

    return parse_size(text)


def _from_podman_argv(argv: list[str]) -> dict[str, Any]:
    f = podman_facts(argv, home=os.environ.get("HOME", "/root"))
    return {
        "devices": sorted(tuple(d.split("=", 1)) for d in f.devices),
        "shm": _size(f.shm) if f.shm else None,
        "memlock": f.memlock,
        "env": f.env,
        "mounts": sorted(f.mounts),
        "argv": [f.entrypoint, *f.command],
        "stop": f.stop_timeout,
    }


def _recorded(env: dict[str, str]) -> list[str]:
    return Path(env["RIGSMITH_CALLS"] + ".podman").read_text().split("\0")[:-1]


def _recorder_env(tmp_path: Path) -> dict[str, str]:
    bin_ = tmp_path / "recbin"
    bin_.mkdir()
    (bin_ / "podman").write_text(RECORDER)
    (bin_ / "podman").chmod(0o755)
    return {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}", "RIGSMITH_CALLS": str(tmp_path / "calls")}


def _project(tmp_path: Path, nvidia: bool = False) -> tuple[Any, str]:
    data = standin_deployment(tmp_path, name="parity")
    # A loopback-only container recipe (-p 127.0.0.1:…) whose args say --host 0.0.0.0 (issue 24): every target
    # must run what the plan decided, --host 127.0.0.1.
    args = data["engine"]["args"]  # type: ignore[index]
    data["engine"]["args"] = [  # type: ignore[index]
        "0.0.0.0" if i and args[i - 1] == "--host" else a for i, a in enumerate(args)
    ]
    data["network"] = {"listen": "127.0.0.1"}
    if nvidia:  # the lxc target knows nvidia's device nodes only
        data["resources"]["gpus"]["cdi_devices"] = [f"nvidia.com/gpu={i}" for i in range(4)]  # type: ignore[index]
    prepare_host_dirs(data)
    return write_project(tmp_path, data), "parity"


def facts_podman(tmp_path: Path, **_: Any) -> tuple[RunPlan, dict[str, Any]]:
    project, name = _project(tmp_path)
    deploy.deploy(project, "podman", deployment=name, out=tmp_path / "out", echo=lambda _m: None)
    env = _recorder_env(tmp_path)
    script = tmp_path / "out/podman/parity/run.sh"
    proc = subprocess.run(
        ["bash", str(script)], env=env, capture_output=True, text=True, check=False, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    plan, _ = deploy.artifacts(project, "podman", deployment=name, out=tmp_path / "out")
    got = _from_podman_argv(_recorded(env))
    m = re.search(r"ready when http://[^:]+:(\d+)(/\S*) answers", proc.stdout)
    got["readiness"] = (m.group(2), int(m.group(1))) if m else None
    return plan, got


def facts_quadlet(tmp_path: Path, quadlet_bin: Path, **_: Any) -> tuple[RunPlan, dict[str, Any]]:
    project, name = _project(tmp_path)
    plan, files = deploy.artifacts(project, "quadlet", deployment=name, out=tmp_path / "out")
    unit = tmp_path / "parity.container"
    unit.write_text(files[0].content)
    proc = run_quadlet(quadlet_bin, unit, tmp_path / "w")
    assert proc.returncode == 0, proc.stderr
    argv = split_systemd(exec_start(proc.stdout), home=os.environ.get("HOME", "/root"))
    got = _from_podman_argv(argv)
    health = json.loads(argv[argv.index("--health-cmd") + 1])
    m = re.search(r"http://127\.0\.0\.1:(\d+)(/[^'\"]*)", health[-1])
    got["readiness"] = (m.group(2), int(m.group(1))) if m else None
    assert int(ini_values(proc.stdout, "Service", "TimeoutStopSec")[0]) == timings(plan).systemd_stop
    return plan, got


def facts_compose(tmp_path: Path, podman: Podman, **_: Any) -> tuple[RunPlan, dict[str, Any]]:
    project, name = _project(tmp_path)
    out = tmp_path / "out"
    # This machine refuses any memlock change in a container: run with memlock=host, and read the
    # unlimited request from the default render's YAML.
    deploy.deploy(project, "compose", deployment=name, out=out, memlock="host", echo=lambda _m: None)
    plan, files = deploy.artifacts(project, "compose", deployment=name, out=tmp_path / "default")
    compose_file = out / "compose/parity/compose.yaml"
    proc = compose_up(
        ["podman-compose"], compose_file, podman, [f"--podman-run-args=--stop-timeout={plan.stop_timeout}"]
    )
    try:
        assert proc.returncode == 0, proc.stderr
        info = podman.inspect("parity")
        got = _from_podman_argv(list(info["Config"]["CreateCommand"]))  # type: ignore[index]
        got["stop"] = info["Config"]["StopTimeout"]  # type: ignore[index]
        health = info["Config"]["Healthcheck"]["Test"]  # type: ignore[index]
        m = re.search(r"http://127\.0\.0\.1:(\d+)(/[^'\"]*)", " ".join(health))
        got["readiness"] = (m.group(2), int(m.group(1))) if m else None
    finally:
        podman.run("rm", "--force", "--time", "0", "parity", check=False)
        podman.run("pod", "rm", "--force", "pod_parity", check=False)
    svc = yaml.safe_load(files[0].content)["services"]["parity"]
    lim = svc["ulimits"]["memlock"]
    got["memlock"] = f"memlock={lim['soft']}:{lim['hard']}"
    return plan, got


def facts_lxc(tmp_path: Path, **_: Any) -> tuple[RunPlan, dict[str, Any]]:
    project, name = _project(tmp_path, nvidia=True)
    out = tmp_path / "out"
    deploy.deploy(project, "lxc", deployment=name, out=out, echo=lambda _m: None)
    plan, _ = deploy.artifacts(project, "lxc", deployment=name, out=out)
    env = fake_ct(tmp_path)
    proc = subprocess.run(
        ["bash", str(out / "lxc/parity/provision.sh")],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    got = _from_podman_argv(_recorded(env))  # the engine inside the CT
    pairs = conf_pairs((out / "lxc/parity/100.conf").read_text())
    conf = dict(pairs)
    # The CT side must carry the same facts as the engine inside it.
    nodes = sorted(int(v[len("/dev/nvidia") :]) for k, v in pairs if k.startswith("dev") and v[11:].isdigit())
    assert [("nvidia.com/gpu", str(i)) for i in nodes] == got["devices"]
    shm = next(v for k, v in pairs if k == "lxc.mount.entry" and v.startswith("tmpfs dev/shm"))
    assert int(re.search(r"size=(\d+)k", shm).group(1)) * 1024 == got["shm"]  # type: ignore[union-attr]
    assert conf["lxc.prlimit.memlock"] == "unlimited" and got["memlock"] == "memlock=-1:-1"
    assert dict(v.split("=", 1) for k, v in pairs if k == "lxc.environment") == got["env"]
    mps = sorted(v.split(",")[0] for k, v in pairs if re.fullmatch(r"mp\d+", k))
    assert mps == sorted(m.host for m in plan.mounts if m.kind == "dir")
    down = int(re.search(r"down=(\d+)", conf["startup"]).group(1))  # type: ignore[union-attr]
    assert down > timings(plan).systemd_stop > got["stop"]
    m = re.search(r"ready when http://[^:]+:(\d+)(/\S*) answers", proc.stdout)
    got["readiness"] = (m.group(2), int(m.group(1))) if m else None
    return plan, got


def facts_kube(
    tmp_path: Path, podman: Podman, standin_image: str, **_: Any
) -> tuple[RunPlan, dict[str, Any]]:
    project, name = _project(tmp_path)
    out = tmp_path / "out"
    deploy.deploy(project, "kube", deployment=name, out=out, echo=lambda _m: None)
    plan, _ = deploy.artifacts(project, "kube", deployment=name, out=out)
    manifest = out / "kube/parity.yaml"
    docs = [d for d in yaml.safe_load_all(manifest.read_text()) if d]
    pod = docs[0]["spec"]["template"]["spec"]
    c = pod["containers"][0]
    shm = next(v for v in pod["volumes"] if v.get("emptyDir"))["emptyDir"]["sizeLimit"]
    limits = c["resources"]["limits"]
    proc = podman.run("kube", "play", str(manifest), check=False, timeout=180)
    try:
        assert proc.returncode == 0, proc.stderr
        cname = next(
            n for n in podman.run("ps", "--format", "{{.Names}}").stdout.split() if n.endswith("-parity")
        )
        info = podman.inspect(cname)
        env = dict(e.split("=", 1) for e in info["Config"]["Env"])  # type: ignore[index]
        entry = info["Config"]["Entrypoint"]  # type: ignore[index]
        argv = [*(entry if isinstance(entry, list) else [entry]), *info["Config"]["Cmd"]]  # type: ignore[index]
        mounts = sorted(
            (m["Source"], m["Destination"], not m["RW"])
            for m in info["Mounts"]  # type: ignore[index]
            if m["Destination"] != "/dev/shm"
        )
    finally:
        podman.run("kube", "down", str(manifest), check=False)
        podman.run("volume", "rm", "--force", "parity-shm", check=False)
    return plan, {
        # Kubernetes asks for a count; the plan's CDI names are whole GPUs 0..N-1 of one kind.
        "devices": sorted((k, str(i)) for k, n in limits.items() for i in range(n)),
        "shm": _size(shm.replace("Gi", "g").replace("Mi", "m")),
        "memlock": plan.memlock_ulimit,  # not expressible per pod: the runtime default (see the file header)
        "env": {k: env[k] for k in dict(plan.env)},
        "mounts": mounts,
        "argv": argv,
        "readiness": (c["readinessProbe"]["httpGet"]["path"], c["readinessProbe"]["httpGet"]["port"]),
        "stop": pod["terminationGracePeriodSeconds"],
    }


EXTRACTORS = {
    "podman": facts_podman,
    "quadlet": facts_quadlet,
    "compose": facts_compose,
    "lxc": facts_lxc,
    "kube": facts_kube,
}


@pytest.mark.parametrize("target", TARGETS)
def test_parity_matrix(
    target: str,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    podman: Podman,
    fake_cdi: Path,
    standin_image: str,
    compose_bins: dict[str, list[str]],
) -> None:
    kw: dict[str, Any] = {"podman": podman, "standin_image": standin_image}
    if target == "quadlet":
        kw["quadlet_bin"] = request.getfixturevalue("quadlet_bin")
    plan, got = EXTRACTORS[target](tmp_path, **kw)
    want = expected(plan)
    assert set(got) == set(ASPECTS)
    mismatched = {a: (got[a], want[a]) for a in ASPECTS if got[a] != want[a]}
    assert not mismatched, f"{target} differs from the plan in: {mismatched}"
    argv = got["argv"]
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--host"] == ["127.0.0.1"], "network.listen"
    assert (plan.shutdown_timeout or 0) < plan.stop_timeout


@pytest.mark.parametrize("seed", ["flash-next-int4-3x3090", "flash-next-merlin-4x3090"])
def test_stop_timeouts_nest_across_every_artifact(seed: str, seed_project: Any, tmp_path: Path) -> None:
    """vLLM --shutdown-timeout < container stop timeout < systemd TimeoutStopSec < PVE startup down=, read
    from the files each target writes (the same container stop timeout everywhere)."""
    from tests.support.targets import render_seed

    def one(target: str) -> str:
        return "\n".join(render_seed(seed_project, target, seed, tmp_path / target).values())

    podman_text, quadlet_text, compose_text, lxc_text, kube_text = map(one, TARGETS)
    stops = {
        "podman": int(re.search(r"--stop-timeout (\d+)", podman_text).group(1)),  # type: ignore[union-attr]
        "quadlet": int(re.search(r"--stop-timeout (\d+)", quadlet_text).group(1)),  # type: ignore[union-attr]
        "compose": int(re.search(r"stop_grace_period: (\d+)s", compose_text).group(1)),  # type: ignore[union-attr]
        "lxc": int(re.search(r"--stop-timeout (\d+)", lxc_text).group(1)),  # type: ignore[union-attr]
        "kube": int(re.search(r"terminationGracePeriodSeconds: (\d+)", kube_text).group(1)),  # type: ignore[union-attr]
    }
    assert len(set(stops.values())) == 1, stops
    stop = stops["podman"]
    m = re.search(r"'?--shutdown-timeout'? '?(\d+)", podman_text)
    shutdown = int(m.group(1)) if m else 0
    systemd = int(re.search(r"TimeoutStopSec=(\d+)", quadlet_text).group(1))  # type: ignore[union-attr]
    down = int(re.search(r"down=(\d+)", lxc_text).group(1))  # type: ignore[union-attr]
    assert shutdown < stop < systemd < down
    if seed == "flash-next-merlin-4x3090":
        assert shutdown == 60  # the recipe drains for 60 s


def test_stop_timeouts_nest_for_a_venv_engine_in_the_ct(seed_project: Any, tmp_path: Path) -> None:
    """The venv path has no container layer: vLLM --shutdown-timeout < the CT service's TimeoutStopSec < PVE
    startup down=, read from the unit provision.sh writes and the pct.conf."""
    from tests.support.facts import split_systemd
    from tests.support.targets import as_venv, render_seed

    seed = "flash-next-merlin-4x3090"
    files = render_seed(as_venv(seed_project, seed), "lxc", seed, tmp_path / "lxc")
    script = next(text for rel, text in files.items() if rel.endswith("provision.sh"))
    conf = next(text for rel, text in files.items() if rel.endswith(".conf"))
    argv = split_systemd(re.search(r"^ExecStart=(.*)$", script, re.M).group(1))  # type: ignore[union-attr]
    shutdown = int(argv[argv.index("--shutdown-timeout") + 1])
    systemd = int(re.search(r"^TimeoutStopSec=(\d+)$", script, re.M).group(1))  # type: ignore[union-attr]
    down = int(re.search(r"^startup: .*down=(\d+)", conf, re.M).group(1))  # type: ignore[union-attr]
    assert shutdown == 60 < systemd < down
    assert "--stop-timeout" not in script  # no container layer to nest
