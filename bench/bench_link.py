#!/usr/bin/env python3
"""Cold ``fetch-model`` over a shaped link, against huggingface_hub's own download and ``curl --parallel``.

    sudo python bench/bench_link.py [--shards 8] [--shard-mib 128] [--rates 1gbit,10gbit] [--repeat 2]
                                    [--against DIR] [--skip hf+sha] [--tmpfs]

Needs root (it makes two network namespaces). The Hub stand-in (tests/support/hubserver.py) runs in one
namespace, every client in the other; a veth pair joins them, its server end shaped with ``tc tbf`` to each
rate in turn. Addresses exist only inside the two namespaces; the server and every command run under
``timeout``, and the namespaces are deleted on the way out (also after Ctrl-C). Cases, all cold (the
target directory wiped before each run), interleaved round by round:

- ``rigsmith``: ``invoke fetch-model`` of this checkout (pin + download + verify against the lock);
- ``hf``: ``snapshot_download(local_dir=…)``, huggingface_hub's HTTP path (Xet off: the stand-in has none);
- ``hf+sha``: the same, then one threaded sha256 pass over the shards (what a verified fetch costs at least);
- ``curl``: ``curl --parallel --parallel-max 8`` of the same URLs (no verification);
- ``curl+sha``: the same, then ``sha256sum`` of the shards (verifying by hand);
- ``against`` (with ``--against DIR``): ``invoke fetch-model`` of another checkout, e.g. main before a change.

``--tmpfs`` puts the downloaded files on a tmpfs the bench mounts (and unmounts). rigsmith fsyncs
each verified file before it takes its name (its record later vouches for the bytes without hashing them);
curl and huggingface_hub do not. On a disk slower than the link (this VM's virtual disk: ~440 MB/s with
``fdatasync``) that flush, not the network, is what a 10 Gbit/s run measures; ``--tmpfs`` stands in for a
rig's NVMe, which writes faster than the link.

The report gives each case's median seconds and its ratio to ``curl`` and to ``hf`` (time / baseline: below
1 is faster). ``netem`` is not needed (not every kernel here has it): the link is rate-shaped, not delayed.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REPO = "acme/link"
#: Addresses that exist only inside the two namespaces this bench makes.
SERVER_IP, CLIENT_IP = "10.231.77.1", "10.231.77.2"
#: Every command, and the server, stops by itself after this long.
LIMIT_S = 900

_HF = """
import sys
from huggingface_hub import snapshot_download
snapshot_download(sys.argv[1], revision=sys.argv[2], local_dir=sys.argv[3], max_workers=8)
"""
_HF_SHA = (
    _HF
    + """
import hashlib, pathlib
from concurrent.futures import ThreadPoolExecutor
def digest(p):
    h = hashlib.sha256()
    with open(p, "rb") as fh:
        while block := fh.read(8 << 20):
            h.update(block)
    return h.hexdigest()
with ThreadPoolExecutor(8) as pool:
    list(pool.map(digest, sorted(pathlib.Path(sys.argv[3]).glob("*.safetensors"))))
"""
)

#: curl (its argv is "$@"), then sha256sum of the shards it wrote into "$0".
_CURL_SHA = '"$@" && cd "$0" && sha256sum -- *.safetensors >/dev/null'


class Link:
    """Two namespaces joined by a veth pair; ``shape`` sets the server end's egress rate."""

    def __init__(self) -> None:
        tag = f"{os.getpid() % 100000}"
        self.server_ns, self.client_ns = f"rsbench-s{tag}", f"rsbench-c{tag}"
        self._dev_s, self._dev_c = f"rsb{tag}s", f"rsb{tag}c"
        self.up = False

    def __enter__(self) -> Link:
        for cmd in (
            ["ip", "netns", "add", self.server_ns],
            ["ip", "netns", "add", self.client_ns],
            ["ip", "link", "add", self._dev_s, "type", "veth", "peer", "name", self._dev_c],
            ["ip", "link", "set", self._dev_s, "netns", self.server_ns],
            ["ip", "link", "set", self._dev_c, "netns", self.client_ns],
            ["ip", "-n", self.server_ns, "addr", "add", f"{SERVER_IP}/30", "dev", self._dev_s],
            ["ip", "-n", self.client_ns, "addr", "add", f"{CLIENT_IP}/30", "dev", self._dev_c],
            ["ip", "-n", self.server_ns, "link", "set", self._dev_s, "up"],
            ["ip", "-n", self.client_ns, "link", "set", self._dev_c, "up"],
            ["ip", "-n", self.server_ns, "link", "set", "lo", "up"],
            ["ip", "-n", self.client_ns, "link", "set", "lo", "up"],
        ):
            self.up = True
            subprocess.run(cmd, check=True)
        return self

    def shape(self, rate: str) -> None:
        """Token bucket at ``rate`` (tc units: 1gbit) with a burst of 4 ms of traffic (at least 64 KiB)."""
        bits = _bits(rate)
        burst = max(64 << 10, bits // 8 // 250)
        subprocess.run(
            ["ip", "netns", "exec", self.server_ns, "tc", "qdisc", "replace", "dev", self._dev_s, "root",
             "tbf", "rate", rate, "burst", str(burst), "latency", "20ms"],
            check=True,
        )  # fmt: skip

    def run_in_client(self, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.client_ns, "timeout", str(LIMIT_S), *argv]

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.up:
            for ns in (self.server_ns, self.client_ns):  # deleting a namespace removes its veth end too
                subprocess.run(["ip", "netns", "del", ns], check=False, stderr=subprocess.DEVNULL)
            self.up = False


def _bits(rate: str) -> int:
    units = {"kbit": 10**3, "mbit": 10**6, "gbit": 10**9}
    for suffix, mult in units.items():
        if rate.endswith(suffix):
            return int(float(rate.removesuffix(suffix)) * mult)
    raise SystemExit(f"--rates: {rate!r} is not N kbit|mbit|gbit")


def _run(argv: list[str], env: dict[str, str]) -> float:
    t = time.perf_counter()
    res = subprocess.run(argv, env=env, capture_output=True, text=True)
    took = time.perf_counter() - t
    if res.returncode != 0:
        tail = f"{res.stdout[-2000:]}\n{res.stderr[-2000:]}"
        raise SystemExit(f"{argv[4:8]}… failed ({res.returncode}):\n{tail}")
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--shard-mib", type=int, default=128)
    ap.add_argument("--rates", default="1gbit,10gbit", help="tc rates, comma-separated")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--against", type=Path, help="another checkout whose fetch-model is timed too")
    ap.add_argument("--tmpfs", action="store_true", help="download onto a tmpfs (the disk out of the race)")
    ap.add_argument("--skip", default="", help="cases left out, comma-separated (curl and hf always run)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench_link.py makes network namespaces: run it as root")
    for tool in ("ip", "tc", "curl", "timeout"):
        if not shutil.which(tool):
            raise SystemExit(f"{tool} is not installed")
    tmp = Path(tempfile.mkdtemp(prefix="bench-link-"))
    link = Link()
    atexit.register(link.close)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    server: subprocess.Popen[str] | None = None
    try:
        link.__enter__()
        pyenv = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
        pyenv["PYTHONPYCACHEPREFIX"] = str(tmp / "pycache")
        server = subprocess.Popen(
            ["ip", "netns", "exec", link.server_ns, "timeout", str(LIMIT_S * 4), sys.executable, "-m",
             "tests.support.hubserver", "--host", SERVER_IP, "--data-dir", str(tmp / "blobs"), "--repo", REPO,
             "--shards", str(args.shards), "--shard-mib", str(args.shard_mib)],
            cwd=ROOT, env=pyenv, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert server.stdout is not None
        url, sha = server.stdout.readline().split()
        _bench(args, link, tmp, pyenv, url, sha)
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=30)
        link.close()
        shutil.rmtree(tmp, ignore_errors=True)


def _bench(
    args: argparse.Namespace, link: Link, tmp: Path, pyenv: dict[str, str], url: str, sha: str
) -> None:
    sys.path[:0] = [str(ROOT), str(ROOT / "src")]
    from tests.support.hubserver import bench_env

    from rigsmith import spec as specmod

    proj = tmp / "proj"
    out = tmp / "out"
    (proj / "deployments").mkdir(parents=True)
    base = specmod.to_data(specmod.load(ROOT / "deployments" / "flash-next-merlin-4x3090.yaml"))
    model = {"repo": REPO, "revision": sha, "local_dir": str(out)}
    (proj / "deployments" / "link.yaml").write_text(
        specmod.dump(specmod.from_data({**base, "name": "link", "model": model}))
    )
    env = bench_env(pyenv, url, tmp / "hf-home", proj)
    tree = subprocess.run(
        link.run_in_client(["curl", "-sS", "--fail", f"{url}/api/models/{REPO}/tree/{sha}?recursive=true"]),
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    paths = [e["path"] for e in json.loads(tree) if e["type"] == "file"]
    mib = args.shards * args.shard_mib
    beside = Path(sys.executable).with_name("invoke")
    script = str(beside) if beside.exists() else shutil.which("invoke") or "invoke"

    def invoke(checkout: Path) -> tuple[list[str], dict[str, str]]:
        argv = [sys.executable, script, "-r", str(checkout), "fetch-model", "--deployment", "link"]
        return link.run_in_client(argv), {**env, "PYTHONPATH": f"{checkout / 'src'}{os.pathsep}{checkout}"}

    curl = ["curl", "--parallel", "--parallel-max", "8", "-sS", "--fail", "--create-dirs"]
    for p in paths:
        curl += ["-o", str(out / p), f"{url}/{REPO}/resolve/{sha}/{urllib.parse.quote(p)}"]
    py = [sys.executable, "-c"]
    cases: dict[str, tuple[list[str], dict[str, str]]] = {
        "rigsmith": invoke(ROOT),
        "hf": (link.run_in_client([*py, _HF, REPO, sha, str(out)]), env),
        "hf+sha": (link.run_in_client([*py, _HF_SHA, REPO, sha, str(out)]), env),
        "curl": (link.run_in_client(curl), env),
        # What checking the same bytes by hand costs: curl, then sha256sum over what it wrote.
        "curl+sha": (link.run_in_client(["sh", "-c", _CURL_SHA, str(out), *curl]), env),
    }
    if args.against is not None:
        cases["against"] = invoke(args.against.resolve())
    for name in set(args.skip.split(",")) - {"", "curl", "hf"}:
        cases.pop(name, None)

    def wipe() -> None:
        for child in out.iterdir() if out.exists() else ():
            if child.is_dir():
                shutil.rmtree(child)
            else:
                child.unlink()
        shutil.rmtree(tmp / "hf-home", ignore_errors=True)
        (proj / "rigsmith.lock").unlink(missing_ok=True)

    rates = args.rates.split(",")
    runs: dict[str, dict[str, list[float]]] = {}
    try:
        if args.tmpfs:
            out.mkdir()
            size = f"size={mib * 2}m"
            subprocess.run(["mount", "-t", "tmpfs", "-o", size, "rsbench", str(out)], check=True)
        for rate in rates:
            link.shape(rate)
            runs[rate] = _rounds(cases, args.repeat, wipe)
    finally:
        if args.tmpfs:
            subprocess.run(["umount", str(out)], check=False)
    _report(args, rates, runs, mib)


def _rounds(
    cases: dict[str, tuple[list[str], dict[str, str]]], repeat: int, before: Callable[[], None]
) -> dict[str, list[float]]:
    """Seconds of each case's runs, interleaved round by round (``before`` runs untimed before each)."""
    times: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(repeat):
        for name, (argv, env) in cases.items():
            before()
            times[name].append(_run(argv, env))
    return times


def _report(
    args: argparse.Namespace, rates: list[str], runs: dict[str, dict[str, list[float]]], mib: int
) -> None:
    print(f"{args.shards}x{args.shard_mib} MiB over a veth pair shaped with tc tbf; {os.cpu_count()} cores; "
          f"medians of {args.repeat}, interleaved; ratio = time / baseline (below 1: faster)")  # fmt: skip
    print(f"{'rate':<8} {'case':<10} {'s':>8} {'MiB/s':>7} {'vs curl':>8} {'vs hf':>7}  runs (s)")
    for rate in rates:
        m = {case: statistics.median(t) for case, t in runs[rate].items()}
        for case, took in m.items():
            each = " ".join(f"{t:.2f}" for t in runs[rate][case])
            print(f"{rate:<8} {case:<10} {took:8.2f} {mib / took:7.0f} {took / m['curl']:7.2f}x "
                  f"{took / m['hf']:6.2f}x  {each}")  # fmt: skip


if __name__ == "__main__":
    main()
