"""Shared test harness: real podman in isolated storage, a fake CDI GPU vendor, a recording stand-in image.

Settings that only this machine needs (runc, cgroupfs, nofile limits, memlock override) live here, never in
what rigsmith generates. See shared/ENVIRONMENT.md.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import textwrap
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from rigsmith import lock as lockmod
from rigsmith.project import Project

REPO = Path(__file__).resolve().parents[1]
# One temp root per checkout: concurrent pytest runs from several worktrees must not prune each other's
# temp dirs (pytest keeps only the newest few under a shared root).
os.environ.setdefault(
    "PYTEST_DEBUG_TEMPROOT",
    str(Path("/tmp") / f"rs-pytest-{hashlib.sha256(str(REPO).encode()).hexdigest()[:8]}"),
)
Path(os.environ["PYTEST_DEBUG_TEMPROOT"]).mkdir(parents=True, exist_ok=True)
GOLDEN = REPO / "tests" / "golden"
FAKE_VENDOR = "example.com/gpu"
FAKE_GPUS = ("0", "1", "2", "3")
STANDIN_IMAGE = "localhost/rigsmith-standin:1"
#: This machine refuses any RLIMIT_MEMLOCK change in a container (even to its own 8 MiB hard limit), so
#: real runs override memlock through rigsmith's own option to "host" (no --ulimit); unit and golden tests
#: still assert the unlimited request.
HOST_MEMLOCK = "host"
#: A built image digest used by golden tests (seed 000 runs a locked build).
GOLDEN_BUILD_DIGEST = "sha256:" + "4" * 64


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-golden", action="store_true", help="rewrite tests/golden/ from the current output"
    )


@pytest.fixture
def update_golden(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--update-golden"))


def require(binary: str) -> str:
    """Path of a binary the tests need; a missing engine is a failure, never a skip."""
    path = shutil.which(binary)
    if path is None:
        pytest.fail(f"{binary} is not installed; run `bash .ci/run` (or its apt line) first", pytrace=False)
    return path


def compare_tree(actual: dict[str, str], golden_dir: Path, update: bool) -> None:
    """Exact file set and contents against golden_dir (relative path → text)."""
    if update:
        if golden_dir.exists():
            shutil.rmtree(golden_dir)
        for rel, text in actual.items():
            p = golden_dir / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text, encoding="utf-8")
        return
    assert golden_dir.is_dir(), f"no golden files at {golden_dir}; run pytest --update-golden and review"
    expected = {
        str(p.relative_to(golden_dir)): p.read_text(encoding="utf-8")
        for p in sorted(golden_dir.rglob("*"))
        if p.is_file()
    }
    assert sorted(actual) == sorted(expected), "the set of generated files changed"
    for rel in expected:
        assert actual[rel] == expected[rel], f"{rel} differs from {golden_dir / rel}"


# -- projects -------------------------------------------------------------------------------------------


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


@pytest.fixture
def seed_project(tmp_path: Path) -> Project:
    """The shipped deployments with a locked build (see make_seed_project)."""
    return make_seed_project(tmp_path)


# -- podman ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Podman:
    """Rootful podman confined to test storage; ``bin`` holds a `podman` wrapper for generated scripts."""

    root: Path
    runroot: Path
    conf: Path
    bin: Path

    @property
    def env(self) -> dict[str, str]:
        """Environment for a generated script: wrapper first in PATH."""
        env = dict(os.environ)
        env["PATH"] = f"{self.bin}:{env['PATH']}"
        env["CONTAINERS_CONF"] = str(self.conf)
        return env

    def argv(self, *args: str) -> list[str]:
        return ["podman", "--root", str(self.root), "--runroot", str(self.runroot), *args]

    def run(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            self.argv(*args),
            env={**os.environ, "CONTAINERS_CONF": str(self.conf)},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"podman {' '.join(args)} failed ({proc.returncode}): {proc.stderr}")
        return proc

    def inspect(self, name: str) -> dict[str, object]:
        data = json.loads(self.run("inspect", name).stdout)
        assert isinstance(data, list) and data
        return dict(data[0])

    def logs_until(self, name: str, marker: str, timeout: float = 60) -> str:
        """Container logs once ``marker`` shows up (fails with the logs on timeout)."""
        deadline = time.monotonic() + timeout
        out = ""
        while time.monotonic() < deadline:
            out = self.run("logs", name, check=False).stdout
            if marker in out:
                return out
            time.sleep(0.2)
        raise AssertionError(f"{marker!r} not in logs of {name} after {timeout}s:\n{out}")


CONTAINERS_CONF = """\
[containers]
default_ulimits = ["nofile=1024:1024", "nproc=4096:4096"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
"""


@pytest.fixture(scope="session")
def podman(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Podman]:
    """Real podman with its own storage (session-wide), and a `podman` wrapper on a PATH prefix."""
    require("podman")
    require("runc")
    base = tmp_path_factory.mktemp("podman")
    # podman refuses a runroot longer than 50 characters
    runroot = Path(tempfile.mkdtemp(prefix="rsrr-", dir="/tmp"))
    p = Podman(base / "root", runroot, base / "containers.conf", base / "bin")
    # Own libpod tmp dir: the default /run/libpod (its "alive" file) is shared by every podman on the machine,
    # and a concurrent session resetting it makes this one "refresh" its containers mid-test.
    p.conf.write_text(CONTAINERS_CONF + f'tmp_dir = "{runroot}/libpod"\n')
    p.bin.mkdir()
    wrapper = p.bin / "podman"
    wrapper.write_text(
        "#!/bin/sh\n"
        f"CONTAINERS_CONF={p.conf}; export CONTAINERS_CONF\n"
        f'exec /usr/bin/podman --root {p.root} --runroot {p.runroot} "$@"\n'
    )
    wrapper.chmod(0o755)
    yield p
    subprocess.run(
        p.argv("rm", "--all", "--force", "--time", "0"),
        capture_output=True,
        check=False,
        env={**os.environ, "CONTAINERS_CONF": str(p.conf)},
    )
    subprocess.run(
        p.argv("system", "reset", "--force"),
        capture_output=True,
        check=False,
        env={**os.environ, "CONTAINERS_CONF": str(p.conf)},
    )
    _unmount_under(base)
    _unmount_under(runroot)
    shutil.rmtree(runroot, ignore_errors=True)


def _unmount_under(base: Path) -> None:
    """podman leaves its overlay dir bind-mounted; unmount so pytest can prune old temp dirs."""
    mounts = [ln.split()[1] for ln in Path("/proc/mounts").read_text().splitlines()]
    for m in sorted((m for m in mounts if m.startswith(str(base))), key=len, reverse=True):
        subprocess.run(["umount", "-l", m], capture_output=True, check=False)


FAKE_CDI_SPEC = {
    "cdiVersion": "0.5.0",
    "kind": FAKE_VENDOR,
    "devices": [
        {
            "name": n,
            "containerEdits": {
                "env": [f"FAKE_GPU_{n.upper()}=present"],
                "deviceNodes": [{"path": f"/dev/fakegpu{n}", "hostPath": "/dev/null"}],
            },
        }
        for n in (*FAKE_GPUS, "all")
    ],
}


@pytest.fixture(scope="session")
def fake_cdi() -> Iterator[Path]:
    """A fake CDI vendor spec in /etc/cdi (podman < 5.5 reads only the default dirs).

    Left in place after the run: concurrent test sessions (several checkouts) share it, and a second file
    defining the same devices would make podman's CDI registry refuse both. Vendor example.com is inert.
    """
    path = Path("/etc/cdi/rigsmith-test-example-gpu.json")
    text = json.dumps(FAKE_CDI_SPEC, indent=1)
    if not path.exists() or path.read_text() != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(text)
        tmp.replace(path)
    yield path


#: The stand-in engine: records argv (hex, one per line), env (hex of `env -0`), /dev/shm, memlock and
#: devices, logs vLLM's readiness line, then idles until SIGTERM.
RECORDER = textwrap.dedent(
    """\
    #!/bin/sh
    hex() { od -An -v -tx1 | tr -d ' \\n'; }
    echo ARGV-BEGIN
    for a in "$@"; do printf '%s' "$a" | hex; echo; done
    echo ARGV-END
    echo "ENV $(env -0 | hex)"
    echo "SHM $(df -k /dev/shm | tail -n 1 | tr -s ' ' | cut -d ' ' -f 2)"
    echo "MEMLOCK $(ulimit -l)"
    echo "DEVICES $(ls /dev | tr '\\n' ' ')"
    echo "INFO: Application startup complete."
    trap 'echo "SIGTERM received"; exit 0' TERM
    while :; do sleep 1; done
    """
)


@dataclass(frozen=True)
class Recording:
    """What the stand-in engine saw."""

    argv: list[str]
    env: dict[str, str]
    shm_kib: int
    memlock: str
    devices: list[str]


def parse_recording(logs: str) -> Recording:
    lines = logs.splitlines()
    start, end = lines.index("ARGV-BEGIN"), lines.index("ARGV-END")
    argv = [bytes.fromhex(h).decode() for h in lines[start + 1 : end]]
    fields = {ln.split(" ", 1)[0]: [*ln.split(" ", 1), ""][1] for ln in lines[end + 1 :] if " " in ln}
    env: dict[str, str] = {}
    for item in bytes.fromhex(fields["ENV"]).decode().split("\0"):
        if "=" in item:
            k, v = item.split("=", 1)
            env[k] = v
    return Recording(argv, env, int(fields["SHM"]), fields["MEMLOCK"], fields["DEVICES"].split())


#: The stand-in images' PATH (podman import --change).
BUSYBOX_IMAGE_ENV = "ENV=PATH=/usr/local/bin:/bin"


def busybox_rootfs_tar(root: Path, tools: Sequence[str], scripts: dict[str, str]) -> bytes:
    """A busybox rootfs built under ``root``, as a tar: ``tools`` linked in /bin, ``scripts`` (name → text)
    as executables in /usr/local/bin."""
    busybox = Path("/bin/busybox")
    if not busybox.exists():
        pytest.fail("busybox-static is not installed; run `bash scripts/setup.sh` first", pytrace=False)
    for d in ("bin", "usr/local/bin", "tmp", "proc", "sys", "dev", "etc"):
        (root / d).mkdir(parents=True)
    shutil.copy2(busybox, root / "bin/busybox")
    for tool in tools:
        (root / "bin" / tool).symlink_to("busybox")
    for name, text in scripts.items():
        exe = root / "usr/local/bin" / name
        exe.write_text(text)
        exe.chmod(0o755)
    return subprocess.run(["tar", "-C", str(root), "-c", "."], capture_output=True, check=True).stdout


def import_busybox_image(podman: Podman, root: Path, ref: str, tools: Sequence[str], vllm: str) -> str:
    """Import a busybox rootfs under ``ref`` whose ``/usr/local/bin/vllm`` is the script ``vllm``."""
    tar = busybox_rootfs_tar(root, tools, {"vllm": vllm})
    proc = subprocess.run(
        podman.argv("import", "--change", BUSYBOX_IMAGE_ENV, "-", ref),
        input=tar,
        capture_output=True,
        env={**os.environ, "CONTAINERS_CONF": str(podman.conf)},
        check=False,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    return ref


@pytest.fixture(scope="session")
def standin_image(podman: Podman, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A busybox image whose `vllm` records what it was given (imported; nothing is pulled)."""
    tools = ("sh", "od", "tr", "env", "printf", "echo", "df", "tail", "cut", "ls", "sleep", "cat", "wc")
    return import_busybox_image(
        podman, tmp_path_factory.mktemp("standin-rootfs"), STANDIN_IMAGE, tools, RECORDER
    )


def run_script(
    script: Path, env: dict[str, str], args: Sequence[str] = (), timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Execute a generated script with bash, as a user would."""
    return subprocess.run(
        ["bash", str(script), *args], env=env, capture_output=True, text=True, timeout=timeout, check=False
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
