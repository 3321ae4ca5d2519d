"""The engine stand-in image for real clusters: this machine's Python and the installed ``ray`` package, no
registry, no network (issue 30).

The rootfs holds the interpreter at its own path (the pyenv prefix, so ``ray``'s console script and Ray's
own subprocesses find it), the stdlib, the site-packages of ``ray`` and its required distributions (read
from their RECORD files), every shared library those ELF files need (``ldd``), bash (the generated
per-node command is ``bash -c …``), busybox for the small tools, and ``vllm``: a stand-in that records its
argv and the Ray cluster it runs in (``STANDIN-ARGV``/``STANDIN-RAY`` log lines), then serves the OpenAI API
like vLLM (``tests.support.standin``, logging vLLM's readiness lines to stdout). Built once per machine
and cached as a tar (``CACHE/ray-node/KEY.tar``); each node imports it into its own podman storage.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterable
from pathlib import Path

from filelock import FileLock
from packaging.requirements import Requirement

from tests.support.common import REPO
from tests.support.podman import containers_conf
from tests.support.systemd_guest import CACHE

RAY_IMAGE = "localhost/rigsmith-ray-standin:1"
PREFIX = Path(sys.base_prefix)
STDLIB = Path(sysconfig.get_paths()["stdlib"])
#: Parts of the stdlib nothing here imports (a third of its size).
STDLIB_SKIP = {"test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "site-packages"}
BUSYBOX_TOOLS = (
    "sh", "seq", "sleep", "cat", "env", "ls", "ps", "grep", "sed", "mkdir", "rm", "tr", "id", "uname",
    "hostname", "head", "tail", "od", "date", "dirname", "basename", "true", "false", "kill", "df", "wc",
)  # fmt: skip
STANDIN_SRC = REPO / "tests" / "support" / "standin.py"

#: /usr/local/bin/vllm in the image. Prints what it was given and the Ray cluster it sees (asked with
#: Ray's own API, as vLLM's Ray executor does), then serves on the argv's --port.
VLLM = f"""#!{PREFIX}/bin/python3
import json, runpy, sys
import ray
argv = sys.argv[1:]
print("STANDIN-ARGV " + json.dumps(argv), flush=True)
ray.init(address="auto", logging_level="ERROR")
alive = [n for n in ray.nodes() if n["Alive"]]
view = {{"nodes": sorted(n["NodeManagerAddress"] for n in alive),
        "gpus": sum(n["Resources"].get("GPU", 0) for n in alive)}}
print("STANDIN-RAY " + json.dumps(view), flush=True)
ray.shutdown()
port = next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--port"), "8000")
sys.argv = ["standin", "--port", port, "--log", "/dev/stdout"]
runpy.run_path("/usr/local/lib/rigsmith_standin.py", run_name="__main__")
"""


def _dists(root: str = "ray") -> list[md.Distribution]:
    """``root`` and every distribution it requires (no extras), each once."""
    seen: dict[str, md.Distribution] = {}
    todo = [root]
    while todo:
        name = todo.pop()
        key = re.sub(r"[-_.]+", "-", name).lower()
        if key in seen:
            continue
        dist = md.distribution(name)
        seen[key] = dist
        for text in dist.requires or ():
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return list(seen.values())


def _files() -> list[Path]:
    """Every host file the image carries (absolute paths, copied to the same place)."""
    out = [PREFIX / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"]
    out += sorted(PREFIX.glob("lib/libpython*.so*"))
    for p in STDLIB.rglob("*"):
        rel = p.relative_to(STDLIB).parts
        if rel[0] not in STDLIB_SKIP and (p.is_file() or p.is_symlink()):
            out.append(p)
    for dist in _dists():
        for f in dist.files or ():
            path = Path(str(dist.locate_file(f))).resolve()
            if path.is_file() and path.is_relative_to(PREFIX):
                out.append(path)
    return [*out, Path("/usr/bin/bash"), Path("/bin/busybox")]


def _is_elf(path: Path) -> bool:
    try:
        with path.open("rb") as fh:
            return fh.read(4) == b"\x7fELF"
    except OSError:
        return False


def _libraries(elves: Iterable[Path]) -> set[Path]:
    """The shared libraries (and the loader) the ELF files load, by the paths ldd resolves."""
    libs: set[Path] = set()
    for elf in elves:
        res = subprocess.run(["ldd", str(elf)], capture_output=True, text=True, check=False)
        for line in res.stdout.splitlines():
            m = re.search(r"(/\S+) \(0x", line)
            if m:
                libs.add(Path(m.group(1)))
    return libs


def _place(src: Path, root: Path) -> None:
    dest = root / str(src).lstrip("/")
    dest.parent.mkdir(parents=True, exist_ok=True)
    if dest.exists() or dest.is_symlink():
        return
    if src.is_symlink() and src.resolve().is_relative_to(PREFIX):
        dest.symlink_to(src.readlink())
    else:
        shutil.copy2(src.resolve(), dest)


def build_rootfs(root: Path) -> None:
    """Assemble the image's rootfs under ``root``."""
    for d in ("usr/bin", "usr/sbin", "usr/lib", "usr/lib64", "usr/local/bin", "usr/local/lib", "etc", "proc",
              "sys", "dev", "run", "root"):  # fmt: skip
        (root / d).mkdir(parents=True, exist_ok=True)
    for link, to in (("bin", "usr/bin"), ("sbin", "usr/sbin"), ("lib", "usr/lib"), ("lib64", "usr/lib64")):
        (root / link).symlink_to(to)  # Debian's merged /usr: ldd's /lib/… paths land in usr/lib
    (root / "tmp").mkdir(mode=0o1777)
    (root / "tmp").chmod(0o1777)
    files = _files()
    for f in files:
        _place(f, root)
    elves = [f for f in files if f.suffix == ".so" or ".so." in f.name or os.access(f, os.X_OK)]
    for lib in _libraries(f for f in elves if _is_elf(f)):
        dest = root / str(lib).lstrip("/")
        dest.parent.mkdir(parents=True, exist_ok=True)
        if not dest.exists():
            shutil.copy2(lib.resolve(), dest)
    for tool in BUSYBOX_TOOLS:
        (root / "usr/bin" / tool).symlink_to("/bin/busybox")
    ver = f"{sys.version_info.major}.{sys.version_info.minor}"
    for name in ("python3", "python"):
        (root / str(PREFIX).lstrip("/") / "bin" / name).symlink_to(f"python{ver}")
    (root / "usr/local/bin/python3").symlink_to(PREFIX / "bin" / f"python{ver}")
    (root / "usr/local/bin/ray").symlink_to(PREFIX / "bin" / "ray")
    shutil.copy2(STANDIN_SRC, root / "usr/local/lib/rigsmith_standin.py")
    vllm = root / "usr/local/bin/vllm"
    vllm.write_text(VLLM)
    vllm.chmod(0o755)
    (root / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
    (root / "etc/group").write_text("root:x:0:\n")


def cache_key() -> str:
    h = hashlib.sha256()
    h.update(f"{sys.version}|{md.version('ray')}|{PREFIX}".encode())
    h.update(VLLM.encode() + STANDIN_SRC.read_bytes() + Path(__file__).read_bytes())
    return h.hexdigest()[:16]


def rootfs_tar() -> Path:
    """The cached rootfs tar, built under a lock when missing."""
    tar = CACHE / "ray-node" / f"{cache_key()}.tar"
    tar.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(tar) + ".lock"):
        if tar.is_file():
            return tar
        with tempfile.TemporaryDirectory(dir=tar.parent) as tmp:
            root = Path(tmp) / "rootfs"
            build_rootfs(root)
            part = Path(tmp) / "rootfs.tar"
            subprocess.run(["tar", "-C", str(root), "-cf", str(part), "."], check=True, timeout=600)
            part.replace(tar)
    return tar


#: ``podman import --change`` for the image: its PATH.
IMAGE_CHANGES = (f"ENV=PATH=/usr/local/bin:{PREFIX}/bin:/usr/bin:/bin",)


def image_store() -> Path:
    """A podman image store holding only the image, cached next to the tar: every node lists it as a
    read-only ``additionalimagestores`` entry, so no node imports 400 MB and no teardown deletes it."""
    tar = rootfs_tar()
    store = tar.with_suffix(".store")
    with FileLock(str(store) + ".lock"):
        if (store / "done").is_file():
            return store
        shutil.rmtree(store, ignore_errors=True)
        runroot = Path(tempfile.mkdtemp(prefix="rsrr-", dir="/tmp"))
        try:
            argv = ["podman", "--root", str(store), "--runroot", str(runroot), "import"]
            argv += [w for ch in IMAGE_CHANGES for w in ("--change", ch)]
            conf = runroot / "containers.conf"
            conf.write_text(containers_conf(runroot))
            env = {**os.environ, "CONTAINERS_CONF": str(conf)}
            subprocess.run(
                [*argv, str(tar), RAY_IMAGE], env=env, capture_output=True, check=True, timeout=600
            )
        finally:
            shutil.rmtree(runroot, ignore_errors=True)
        (store / "done").write_text(RAY_IMAGE + "\n")
    return store
