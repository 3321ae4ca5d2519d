#!/usr/bin/env python3
"""Benchmark `invoke bundle` / `invoke unbundle` against doing it by hand with tar + sha256sum, as ratios.

    python bench/bench_bundle.py [--model-mib 256 | --gib 2] [--image-mib 32] [--repeat 1]

Set-up (not timed): a Hub stand-in serving a model in shards of at most 128 MiB, a local registry, an engine
image (busybox + ``--image-mib`` of random bytes) pushed there, `invoke pin`, `invoke fetch-model`. Then, each
a whole command (process start included), median over ``--repeat`` runs, every run from fresh dirs and
fresh podman storage:

- bundle:   ``invoke bundle --out DIR`` (same filesystem: hard links) and ``--tar FILE``, and a re-run on an
  unchanged deployment, vs ``podman save`` + ``sha256sum`` of every file + ``tar -cf``;
- unbundle: ``invoke unbundle DIR`` and ``invoke unbundle FILE.tar`` into a fresh model dir and podman
  storage, vs ``tar -xf`` + ``sha256sum -c`` + ``podman load``.

Ratios are rigsmith / baseline: below 1 is faster than doing it by hand.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

from tests.support import services  # noqa: E402
from tests.support.podman import CONTAINERS_CONF  # noqa: E402

REPO = "acme/bench-bundle"


def _sh(argv: list[str], env: dict[str, str], cwd: Path | None = None) -> str:
    res = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=cwd)
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:4])}… failed ({res.returncode}):\n{res.stdout}\n{res.stderr}")
    return res.stdout


@contextmanager
def _storage(base: Path) -> Iterator[dict[str, str]]:
    """Fresh podman storage under ``base`` (podman on PATH is a wrapper onto it); reset and removed after."""
    runroot = Path(tempfile.mkdtemp(prefix="rsbb-", dir="/tmp"))
    conf = base / "containers.conf"
    base.mkdir(parents=True, exist_ok=True)
    conf.write_text(CONTAINERS_CONF + f'tmp_dir = "{runroot}/libpod"\n')
    (base / "bin").mkdir()
    wrapper = base / "bin" / "podman"
    wrapper.write_text(
        f"#!/bin/sh\nCONTAINERS_CONF={conf}; export CONTAINERS_CONF\n"
        f'exec /usr/bin/podman --root {base / "root"} --runroot {runroot} "$@"\n'
    )
    wrapper.chmod(0o755)
    env = {**os.environ, "PATH": f"{base / 'bin'}:{os.environ['PATH']}", "CONTAINERS_CONF": str(conf)}
    try:
        yield env
    finally:
        subprocess.run(["podman", "system", "reset", "--force"], env=env, capture_output=True, check=False)
        shutil.rmtree(runroot, ignore_errors=True)


def _timed(fn: Callable[[int], object], repeat: int) -> float:
    times = []
    for i in range(repeat):
        t = time.perf_counter()
        fn(i)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-mib", type=int, default=256, help="model size (4+ shards of at most 128 MiB)")
    ap.add_argument("--gib", type=float, default=None, help="model size in GiB instead (e.g. --gib 2)")
    ap.add_argument("--image-mib", type=int, default=32, help="random bytes added to the engine image")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--dir", help="where the bench's files go (default: the system's temp dir; not a tmpfs)")
    args = ap.parse_args()
    mib = int(args.gib * 1024) if args.gib else args.model_mib
    shards = max(4, mib // 128)  # the stand-in generates each shard in one call, at most 128 MiB
    for tool in ("invoke", "podman", "skopeo", "docker-registry", "tar", "sha256sum"):
        if not shutil.which(tool):
            raise SystemExit(f"{tool} is not installed")
    # Not /var/tmp: a model dir may not be inside a system tree (rigsmith.modeldir), the bench's included.
    tmp = Path(tempfile.mkdtemp(prefix="bench-bundle-", dir=args.dir))
    pyenv = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    server = subprocess.Popen(
        [sys.executable, "-m", "tests.support.hubserver", "--repo", REPO, "--shards", str(shards),
         "--shard-mib", str(max(1, mib // shards))],
        cwd=ROOT, env=pyenv, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert server.stdout is not None
        url, sha = server.stdout.readline().split()
        with services.registry(tmp / "registry") as reg, _storage(tmp / "connected-podman") as penv:
            _bench(args, mib, tmp, {**pyenv, **penv}, url, sha, reg.host)
    finally:
        server.terminate()
        server.wait(timeout=30)
        shutil.rmtree(tmp, ignore_errors=True)


def _bench(
    args: argparse.Namespace, mib: int, tmp: Path, env: dict[str, str], url: str, sha: str, registry: str
) -> None:
    import yaml

    rootfs = services.busybox_rootfs(tmp / "rootfs")
    with (rootfs / "opt" / "weights.bin").open("wb") as fh:
        fh.write(os.urandom(args.image_mib << 20))
    ref = f"{registry}/bench-engine:1"
    tar = _tar_bytes(rootfs)
    subprocess.run(["podman", "import", "-", ref], input=tar, env=env, capture_output=True, check=True)
    _sh(["podman", "push", "--tls-verify=false", ref], env)

    proj = tmp / "project"
    (proj / "deployments").mkdir(parents=True)
    data = yaml.safe_load((ROOT / "deployments" / "flash-next-merlin-4x3090.yaml").read_text())
    data.update(name="bench")
    data["engine"].pop("build", None)
    data["engine"]["image"] = ref
    data["model"] = {
        "repo": REPO,
        "revision": sha,
        "local_dir": str(tmp / "models" / "bench"),
        "config_patches": [],
    }
    data["mounts"] = []
    data["env"] = []  # its paths point into the recipe's checkout, which a bundle bench has no use for
    (proj / "deployments" / "bench.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    cli = {**env, "RIGSMITH_ROOT": str(proj), "HF_ENDPOINT": url, "HF_HOME": str(tmp / "hf"),
           "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_DISABLE_XET": "1"}  # fmt: skip
    inv = [sys.executable, shutil.which("invoke") or "invoke", "-r", str(ROOT)]
    _sh([*inv, "pin"], cli)
    _sh([*inv, "fetch-model"], cli)
    model = tmp / "models" / "bench"
    files = sorted(
        str(p.relative_to(model)) for p in model.rglob("*") if p.is_file() and ".rigsmith" not in p.parts
    )
    total = sum((model / f).stat().st_size for f in files)
    print(f"model: {len(files)} files, {total / 2**20:.0f} MiB; image: busybox + {args.image_mib} MiB; "
          f"repeat {args.repeat}; {os.cpu_count()} CPUs", flush=True)  # fmt: skip

    # -- bundle ------------------------------------------------------------------------------------------
    def ours_dir(i: int) -> None:
        _sh([*inv, "bundle", "--out", str(tmp / f"b{i}")], cli)

    def ours_tar(i: int) -> None:
        _sh([*inv, "bundle", "--out", str(tmp / f"bt{i}"), "--tar", str(tmp / f"bt{i}.tar")], cli)

    def ours_rerun(i: int) -> None:
        _sh([*inv, "bundle", "--out", str(tmp / "b0")], cli)

    def by_hand(i: int) -> None:
        d = tmp / f"h{i}"
        d.mkdir()
        _sh(["podman", "save", "--format", "oci-archive", "-o", str(d / "image.tar"), ref], env)
        sums = _sh(["sha256sum", *files], env, cwd=model)
        sums += _sh(["sha256sum", "image.tar"], env, cwd=d)
        (d / "SUMS").write_text(sums)
        _sh(
            [
                "tar",
                "-cf",
                str(
                    tmp / f"h{i}.tar",
                ),
                "-C",
                str(model),
                *files,
                "-C",
                str(d),
                "image.tar",
                "SUMS",
            ],
            env,
        )

    t_dir = _timed(ours_dir, args.repeat)
    t_tar = _timed(ours_tar, args.repeat)
    t_rerun = _timed(ours_rerun, args.repeat)
    t_hand = _timed(by_hand, args.repeat)

    # -- unbundle ----------------------------------------------------------------------------------------
    off = {k: v for k, v in cli.items() if k != "HF_ENDPOINT"} | {"HF_ENDPOINT": "http://127.0.0.1:9"}

    def unbundle(src: Path, tag: str) -> Callable[[int], None]:
        def run(i: int) -> None:
            p = tmp / f"off-{tag}{i}"
            (p / "deployments").mkdir(parents=True)
            with _storage(tmp / f"podman-{tag}{i}") as penv:
                _sh(
                    [*inv, "unbundle", str(src), "--into", str(p / "model")],
                    {**off, **penv, "RIGSMITH_ROOT": str(p)},
                )

        return run

    def unbundle_by_hand(i: int) -> None:
        d = tmp / f"hand-off{i}"
        d.mkdir()
        with _storage(tmp / f"podman-hand{i}") as penv:
            _sh(["tar", "-xf", str(tmp / "h0.tar"), "-C", str(d)], env)
            _sh(["sha256sum", "--quiet", "-c", "SUMS"], env, cwd=d)
            _sh(["podman", "load", "-q", "-i", str(d / "image.tar")], penv)

    u_dir = _timed(unbundle(tmp / "b0", "d"), args.repeat)
    u_tar = _timed(unbundle(tmp / "bt0.tar", "t"), args.repeat)
    u_hand = _timed(unbundle_by_hand, args.repeat)

    rows = [
        ("bundle --out DIR (hard links)", t_dir, t_hand),
        ("bundle --out DIR --tar FILE", t_tar, t_hand),
        ("bundle re-run, unchanged", t_rerun, t_hand),
        ("unbundle DIR (hard links)", u_dir, u_hand),
        ("unbundle FILE.tar", u_tar, u_hand),
    ]
    print(f"{'':34} {'rigsmith':>9} {'by hand':>9} {'ratio':>7}")
    for name, ours, base in rows:
        print(f"{name:34} {ours:8.2f}s {base:8.2f}s {ours / base:7.2f}")
    print(
        "by hand: bundle = podman save + sha256sum + tar -cf; unbundle = tar -xf + sha256sum -c + podman load"
    )
    floor = _timed(lambda _i: _sh([*inv, "--list"], cli), args.repeat)
    print(f"start-up alone (`invoke --list`), part of every figure above: {floor:.2f}s")


def _tar_bytes(root: Path) -> bytes:
    argv = ["tar", "--sort=name", "--mtime=@0", "--owner=0", "--group=0", "--numeric-owner"]
    return subprocess.run([*argv, "-C", str(root), "-c", "."], capture_output=True, check=True).stdout


if __name__ == "__main__":
    main()
