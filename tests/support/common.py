"""Paths, golden comparison, tool lookup and the deployment builders every test area uses."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from rigsmith.project import Project
from rigsmith.resolving.lock import lock as lockmod

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "golden"
#: Every golden file is stored as ``<name>.golden`` (Go's testdata convention): expected output is data, so
#: linters, editors and duplicate finders do not read a golden run.sh as project source.
GOLDEN_SUFFIX = ".golden"
FAKE_VENDOR = "example.com/gpu"
FAKE_GPUS = ("0", "1", "2", "3")


STANDIN_IMAGE = "localhost/rigsmith-standin:1"
#: This machine refuses any RLIMIT_MEMLOCK change in a container (even to its own 8 MiB hard limit), so
#: real runs override memlock through rigsmith's own option to "host" (no --ulimit); unit and golden tests
#: still assert the unlimited request.
HOST_MEMLOCK = "host"
#: A built image digest used by golden tests (seed 000 runs a locked build).
GOLDEN_BUILD_DIGEST = "sha256:" + "4" * 64


def require(binary: str) -> str:
    """Path of a binary the tests need; a missing engine is a failure, never a skip."""
    path = shutil.which(binary)
    if path is None:
        pytest.fail(f"{binary} is not installed; run `bash .ci/run` (or its apt line) first", pytrace=False)
    return path


def golden_path(path: Path) -> Path:
    """Where the golden copy of ``path`` (a path under tests/golden, as generated) is stored."""
    return path.with_name(path.name + GOLDEN_SUFFIX)


def golden_files(pattern: str) -> list[Path]:
    """Golden files matching ``pattern`` (written as generated, e.g. ``*/podman/*/*.sh``), sorted."""
    return sorted(GOLDEN.glob(pattern + GOLDEN_SUFFIX))


def compare_tree(actual: dict[str, str], golden_dir: Path, update: bool) -> None:
    """Exact file set and contents against golden_dir (relative path → text; stored as ``<path>.golden``)."""
    if update:
        if golden_dir.exists():
            shutil.rmtree(golden_dir)
        for rel, text in actual.items():
            p = golden_path(golden_dir / rel)
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text, encoding="utf-8")
        return
    assert golden_dir.is_dir(), f"no golden files at {golden_dir}; run pytest --update-golden and review"
    expected = {
        str(p.relative_to(golden_dir)).removesuffix(GOLDEN_SUFFIX): p.read_text(encoding="utf-8")
        for p in sorted(golden_dir.rglob("*"))
        if p.is_file()
    }
    assert sorted(actual) == sorted(expected), "the set of generated files changed"
    for rel in expected:
        assert actual[rel] == expected[rel], f"{rel} differs from {golden_dir / rel}"


def make_seed_project(base: Path) -> Project:
    """The shipped deployments copied under ``base``, with a lock holding a build of images/vllm-3x3090."""
    root = base / "project"
    shutil.copytree(REPO / "deployments", root / "deployments")
    lock = lockmod.Lock(
        builds={
            "vllm-3x3090": lockmod.LockedBuild(
                ref="127.0.0.1:5000/vllm-3x3090",
                image_id="sha256:" + "1" * 64,
                digest=GOLDEN_BUILD_DIGEST,
                base="docker.io/vllm/vllm-openai@sha256:" + "2" * 64,
            )
        }
    )
    (root / "rigsmith.lock").write_text(lockmod.dumps(lock))
    return Project(root)


def invoke_cli(
    root: Path | None, *args: str, env: Mapping[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``invoke ARGS`` on the project at ``root`` as a user runs it: this checkout's tasks.py and sources, no
    terminal on stdin, the environment ``env`` (default: this process's). ``root`` None: no RIGSMITH_ROOT,
    run in this checkout, so the project is the one Invoke finds there (with its invoke.yaml)."""
    return _cli(["-m", "invoke", "-r", str(REPO), *args], root, env, timeout)


def rigsmith_cli(
    root: Path | None, *args: str, env: Mapping[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``rigsmith ARGS`` (the console script's entry, ``python -m rigsmith``) as :func:`invoke_cli` runs
    ``invoke``."""
    return _cli(["-m", "rigsmith", *args], root, env, timeout)


def _cli(
    argv: list[str], root: Path | None, env: Mapping[str, str] | None, timeout: float
) -> subprocess.CompletedProcess[str]:
    full = {**(os.environ if env is None else env), "PYTHONPATH": f"{REPO / 'src'}:{REPO}"}
    if root is not None:
        full["RIGSMITH_ROOT"] = str(root)
    return subprocess.run(
        [sys.executable, *argv],
        cwd=REPO,
        env=full,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=timeout,
        check=False,
    )


def run_script(
    script: Path,
    env: dict[str, str],
    args: Sequence[str] = (),
    timeout: float = 120,
    wrap: Sequence[str] = (),
) -> subprocess.CompletedProcess[str]:
    """Execute a generated script with bash, as a user would (``wrap``: a prefix such as ip netns exec)."""
    return subprocess.run(
        [*wrap, "bash", str(script), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def standin_deployment(
    base: Path, *, seed: str = "flash-next-merlin-4x3090", name: str = "standin", **changes: object
) -> dict[str, object]:
    """Seed deployment data re-pointed at test paths, the fake CDI vendor and the stand-in image.

    ``changes`` replace top-level keys (or ``engine``/``resources`` sub-keys given as dicts, merged).
    """
    import yaml

    data = yaml.safe_load((REPO / "deployments" / f"{seed}.yaml").read_text())
    data["name"] = name
    data["model"]["local_dir"] = str(base / "models" / name)
    data["engine"].pop("build", None)
    data["engine"]["image"] = STANDIN_IMAGE
    gpus = data["resources"]["gpus"]
    gpus["cdi_devices"] = [f"{FAKE_VENDOR}={i}" for i in range(gpus["count"])]
    mounts = []
    for m in data.get("mounts", []):
        m = dict(m)
        m["host"] = str(base / "host" / m["host"].lstrip("~/").lstrip("/"))
        mounts.append(m)
    data["mounts"] = mounts
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}  # type: ignore[dict-item]
        else:
            data[key] = value
    return data


def write_project(base: Path, *deployments: dict[str, object]) -> Project:
    """A project dir holding these deployments (and no lock)."""
    import yaml

    root = base / "project"
    (root / "deployments").mkdir(parents=True, exist_ok=True)
    for d in deployments:
        (root / "deployments" / f"{d['name']}.yaml").write_text(yaml.safe_dump(d, sort_keys=False))
    return Project(root)


def prepare_host_dirs(data: dict[str, object]) -> None:
    """Create the model dir and the non-file mount dirs a deployment's run.sh expects."""
    Path(str(data["model"]["local_dir"])).mkdir(parents=True, exist_ok=True)  # type: ignore[index]
    for m in data.get("mounts", []):  # type: ignore[attr-defined]
        if m.get("kind", "dir") == "dir":
            Path(m["host"]).mkdir(parents=True, exist_ok=True)
