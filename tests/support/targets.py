"""The real consumers of each artifact (quadlet generator, podman-compose, liblxc) and render helpers."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from filelock import FileLock

from rigsmith.project import Project
from rigsmith.rendering import deploy
from rigsmith.rendering.plan import RunPlan
from rigsmith.rendering.targets import LxcOptions
from tests.support.common import GOLDEN_SUFFIX
from tests.support.podman import Podman

CACHE = Path(os.environ.get("RIGSMITH_TEST_CACHE", "/var/cache/rigsmith-test"))
QUADLET_DIR = CACHE / "quadlet"
QUADLET = QUADLET_DIR / "x/usr/libexec/podman/quadlet"
PC106_DIR = CACHE / "pc106"
SEEDS = ("flash-next-int4-3x3090", "flash-next-merlin-4x3090")


def capture(argv: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=False, **kw)  # type: ignore[call-overload]


def fetch_quadlet(dest: Path = QUADLET_DIR) -> Path:
    """podman's quadlet generator from Debian trixie (apt-get download with a private sources.list)."""
    binary = dest / "x/usr/libexec/podman/quadlet"
    dest.mkdir(parents=True, exist_ok=True)
    with FileLock(str(dest) + ".lock"):
        if binary.is_file():
            return binary
        (dest / "lists/partial").mkdir(parents=True, exist_ok=True)
        (dest / "sources.list").write_text("deb http://deb.debian.org/debian trixie main\n")
        o = [
            "-o",
            f"Dir::Etc::SourceList={dest}/sources.list",
            "-o",
            "Dir::Etc::SourceParts=/dev/null",
            "-o",
            f"Dir::State::Lists={dest}/lists",
        ]
        for argv, cwd in ((["apt-get", *o, "update"], None), (["apt-get", *o, "download", "podman"], dest)):
            proc = capture(argv, cwd=cwd, timeout=600)
            if proc.returncode != 0:
                pytest.fail(f"{shlex.join(argv)} failed: {proc.stderr[-2000:]}", pytrace=False)
        deb = sorted(dest.glob("podman_*.deb"))[-1]
        proc = capture(["dpkg", "-x", str(deb), str(dest / "x")])
        assert proc.returncode == 0, proc.stderr
    return binary


@dataclass(frozen=True)
class Quadlet:
    """What podman's generator made of one unit file."""

    service: str
    stderr: str


def run_quadlet(binary: Path, unit: Path, workdir: Path) -> subprocess.CompletedProcess[str]:
    """quadlet -dryrun on a directory holding just this unit."""
    units = workdir / "units"
    if units.exists():
        shutil.rmtree(units)
    units.mkdir(parents=True)
    shutil.copy(unit, units / unit.name.removesuffix(GOLDEN_SUFFIX))
    return capture([str(binary), "-dryrun"], env={**os.environ, "QUADLET_UNIT_DIRS": str(units)}, timeout=60)


#: What ``~/`` means in the golden renders (issue 24: one home, written out in every target).
GOLDEN_HOME = "/home/rig"


def render_seed(project: Project, target: str, name: str, out: Path, **options: object) -> dict[str, str]:
    """Render a target into memory: path relative to out/<target> → text (``~/`` is GOLDEN_HOME unless
    ``home`` is given: the goldens must not depend on who runs the tests)."""
    options.setdefault("home", GOLDEN_HOME)
    _plan, files = deploy.artifacts(project, target, deployment=name, out=out, **options)  # type: ignore[arg-type]
    base = out.resolve() / target
    return {
        str(a.path.relative_to(base)) if a.path.is_relative_to(base) else str(a.path): a.content
        for a in files
    }


def lxc_options(**kw: object) -> LxcOptions:
    """LxcOptions with overrides."""
    return LxcOptions(**kw)  # type: ignore[arg-type]


#: Where the venv variants put the venv inside the CT (seed 003's recipe ran ./venv-v2.5 of a patched tree).
CT_VENV = "/opt/vllm-merlin/venv-v2.5"


def as_venv(project: Project, name: str, venv: str = CT_VENV) -> Project:
    """Turn a deployment of ``project`` into its venv variant: ``engine.runtime: venv``, no image."""
    import yaml

    path = project.root / "deployments" / f"{name}.yaml"
    data = yaml.safe_load(path.read_text())
    data["engine"] = {
        **{k: v for k, v in data["engine"].items() if k not in ("image", "build")},
        "runtime": "venv",
        "venv": venv,
    }
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return project


#: Values a shell would read as code or split: every target must hand them to the engine byte for byte.
HOSTILE = [
    "$(touch /tmp/rigsmith-pwned-1)",
    "`touch /tmp/rigsmith-pwned-2`",
    "'; touch /tmp/rigsmith-pwned-3; echo '",
    'a "double" and \\back\\slash',
    "line one\nline two\n",
    "${HOME} $PATH *.json ~ !! & | ; < >",
    "tab\tand ünïcødé ✓",
    "",
]


def hostile_deployment(base: Path, name: str, values: list[str]) -> dict[str, object]:
    """A stand-in deployment whose engine args and env carry each of ``values`` (flag/variable i)."""
    from tests.support.common import standin_deployment

    args = ["/models/x"]
    for i, v in enumerate(values):
        args += [f"--flag-{i}", v]
    env = [{"name": f"HOSTILE_{i}", "value": v} for i, v in enumerate(values)]
    engine = {"args": args, "model_arg": 0}
    return standin_deployment(base, name=name, env=env, placeholders={}, engine=engine)


def quadlet_service(
    binary: Path, unit_text: str, name: str, workdir: Path
) -> subprocess.CompletedProcess[str]:
    """quadlet -dryrun on the unit text as ``NAME.container`` (must succeed): the service it generates."""
    unit = workdir / f"{name}.container"
    unit.parent.mkdir(parents=True, exist_ok=True)
    unit.write_text(unit_text)
    proc = run_quadlet(binary, unit, workdir / "w")
    assert proc.returncode == 0, proc.stderr
    return proc


def assert_standin_ran_the_plan(log: str, data: dict[str, object], plan: RunPlan) -> None:
    """The stand-in's recording: the recipe argv, every fake GPU, the plan's env and an 8 GiB /dev/shm."""
    import json

    from rigsmith.spec import loads
    from tests.support.podman import parse_recording

    rec = parse_recording(log)
    spec = loads(json.dumps(data))
    assert rec.argv == ["serve", spec.model.container_path, *spec.engine.args[1:]]
    for i in range(4):
        assert f"fakegpu{i}" in rec.devices and rec.env[f"FAKE_GPU_{i}"] == "present"
    assert {k: rec.env.get(k) for k, _ in plan.env} == dict(plan.env)
    assert rec.shm_kib == 8 * 1024 * 1024


def compose_up(
    bins: list[str], compose_file: Path, podman: Podman, extra: list[str]
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*bins, "-f", str(compose_file), *extra, "up", "-d"],
        cwd=compose_file.parent,
        env=podman.env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def conf_pairs(text: str) -> list[tuple[str, str]]:
    out = []
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        if line.startswith("["):
            break
        key, _, value = line.partition(":")
        out.append((key.strip(), value.strip()))
    return out


def fake_ct(
    tmp_path: Path, *, uvm: bool = True, kernel: str = "550.54.14", user: str = "550.54.14"
) -> dict[str, str]:
    """A CT as provision.sh sees it: device nodes, the host's module version, the CT's libs, fake tools."""
    dev, lib, bin_ = tmp_path / "ct/dev", tmp_path / "ct/lib", tmp_path / "ct/bin"
    for d in (dev, lib, bin_):
        d.mkdir(parents=True, exist_ok=True)
    for node in ("nvidia0", "nvidia1", "nvidia2", "nvidia3", "nvidiactl", *(["nvidia-uvm"] if uvm else [])):
        os.mknod(dev / node, 0o666 | 0o020000, os.makedev(1, 3))
    (tmp_path / "ct/version").write_text(
        f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {kernel}  Thu Feb 22 01:44:30 UTC 2024\n"
    )
    (lib / f"libnvidia-ml.so.{user}").touch()
    log = tmp_path / "ct/calls"
    for tool, body in (
        ("nvidia-ctk", 'echo "nvidia-ctk $*" >> "$RIGSMITH_CALLS"'),
        (
            "podman",
            'case "$1 $2" in "image exists") exit 0;; "container exists") exit 1;; esac\n'
            'for a in "$@"; do printf "%s\\0" "$a"; done >> "$RIGSMITH_CALLS.podman"',
        ),
    ):
        p = bin_ / tool
        p.write_text(f"#!/bin/sh\n{body}\n")
        p.chmod(0o755)
    return {
        **os.environ,
        "PATH": f"{bin_}:{os.environ['PATH']}",
        "RIGSMITH_DEV": str(dev),
        "RIGSMITH_NVIDIA_VERSION": str(tmp_path / "ct/version"),
        "RIGSMITH_LIB_DIRS": str(lib),
        "RIGSMITH_CALLS": str(log),
    }
