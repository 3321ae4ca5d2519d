#!/usr/bin/env python3
"""Benchmark `invoke fetch-model` against the tools a user would otherwise run, in one run, as ratios.

    python bench/bench_fetch.py [--sizes 16x128,8x256] [--repeat 3] [--against DIR]

Everything talks to a Hub stand-in on 127.0.0.1 (tests/support/hubserver.py) started in its own process;
its shards are files on disk sent with sendfile, one repo per ``--sizes`` entry (SHARDSxMiB). Every
number is a wall-clock median over ``--repeat`` runs of a whole command (process start included):

- cold download, at each size: ``invoke fetch-model`` (pin + download + verify) vs ``curl --parallel
  --parallel-max 4`` of the same URLs; at the first size also vs curl followed by ``sha256sum`` (what
  verifying by hand costs) and vs ``hf download`` of the same snapshot;
- verify (first size): ``invoke fetch-model --verify`` (parallel hashing, no network) vs ``sha256sum``;
- warm re-run (first size): ``invoke fetch-model`` on a complete dir vs ``hf download --local-dir``
  re-run on its own complete dir (huggingface_hub's CLI).

Ratios are rigsmith / baseline: below 1 is faster than the baseline; "speed" is baseline / rigsmith, the
form the issue's goals take (cold ≥ 0.9× curl, ≥ 1.2× hf download; verify ≥ 2× sha256sum). ``--against
DIR`` times the rigsmith commands of another checkout too (e.g. ``git archive main | tar -x -C DIR``):
before and after in one run. Bytecode is cached (``PYTHONPYCACHEPREFIX``), as an installed checkout has it.
The cases run interleaved round by round, so a neighbour's load drifting over minutes hits all alike.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REPO = "acme/bench"


def _timed(fn: Callable[[], object], repeat: int, before: Callable[[], object] | None = None) -> float:
    times = []
    for _ in range(repeat):
        if before is not None:
            before()
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def _rounds(
    cases: dict[str, tuple[Callable[[], object], Callable[[], object] | None]], repeat: int
) -> dict[str, float]:
    """Median seconds of each case, the cases interleaved round by round (``before`` untimed)."""
    times: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(repeat):
        for name, (fn, before) in cases.items():
            times[name].append(_timed(fn, 1, before))
    return {k: statistics.median(v) for k, v in times.items()}


def _run(argv: list[str], env: dict[str, str]) -> None:
    res = subprocess.run(argv, env=env, capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"{argv[:3]}… failed ({res.returncode}):\n{res.stdout}\n{res.stderr}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--sizes", default="16x128,8x256", help="SHARDSxMiB,… (a repo each; the first is the main)"
    )
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--against", type=Path, help="another checkout whose fetch-model is timed too")
    args = ap.parse_args()
    for tool in ("curl", "sha256sum", "hf", "invoke"):
        if not shutil.which(tool):
            raise SystemExit(f"{tool} is not installed")
    sizes = [tuple(int(x) for x in one.lower().split("x")) for one in args.sizes.split(",")]

    tmp = Path(tempfile.mkdtemp(prefix="bench-fetch-"))
    pyenv = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    pyenv.pop("PYTHONDONTWRITEBYTECODE", None)
    pyenv["PYTHONPYCACHEPREFIX"] = str(tmp / "pycache")
    repos = [f"{REPO}{n}x{mib}" for n, mib in sizes]
    argv = [
        sys.executable,
        "-m",
        "tests.support.hubserver",
        "--data-dir",
        str(tmp / "blobs"),
        "--repo",
        repos[0],
        "--shards",
        str(sizes[0][0]),
        "--shard-mib",
        str(sizes[0][1]),
    ]
    for repo, (n, mib) in zip(repos[1:], sizes[1:], strict=True):
        argv += ["--also", f"{repo}:{n}:{mib}"]
    server = subprocess.Popen(argv, cwd=ROOT, env=pyenv, stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert server.stdout is not None
        served = [server.stdout.readline().split() for _ in repos]
        _bench(args, tmp, pyenv, served[0][0], [(r, sha) for r, (_u, sha) in zip(repos, served, strict=True)])
    finally:
        server.terminate()
        server.wait(timeout=30)
        shutil.rmtree(tmp, ignore_errors=True)


@dataclass
class _Size:
    """One repo of the run: its deployment, its files, the commands that fetch it."""

    repo: str
    sha: str
    name: str
    paths: list[str]
    total: int
    rig: Path
    curled: Path


def _bench(
    args: argparse.Namespace, tmp: Path, pyenv: dict[str, str], url: str, served: list[tuple[str, str]]
) -> None:
    sys.path[:0] = [str(ROOT / "src")]
    sys.path[:0] = [str(ROOT)]
    from tests.support.hubserver import bench_env

    from rigsmith import spec as specmod

    proj = tmp / "proj"
    (proj / "deployments").mkdir(parents=True)
    base = specmod.to_data(specmod.load(ROOT / "deployments" / "flash-next-merlin-4x3090.yaml"))
    sizes: list[_Size] = []
    for i, (repo, sha) in enumerate(served):
        name = f"bench{i}"
        data = {
            **base,
            "name": name,
            "model": {"repo": repo, "revision": sha, "local_dir": str(tmp / f"rig{i}")},
        }
        (proj / "deployments" / f"{name}.yaml").write_text(specmod.dump(specmod.from_data(data)))
        with urllib.request.urlopen(f"{url}/api/models/{repo}/tree/{sha}?recursive=true") as resp:
            tree = [e for e in json.load(resp) if e["type"] == "file"]
        paths = [e["path"] for e in tree]
        sizes.append(
            _Size(repo, sha, name, paths, sum(e["size"] for e in tree), tmp / f"rig{i}", tmp / "curl")
        )
    env = bench_env(pyenv, url, tmp / "hf-home", proj)
    beside = Path(sys.executable).with_name("invoke")  # the console script, not a pyenv shim
    script = str(beside) if beside.exists() else shutil.which("invoke") or "invoke"

    def invoke_in(checkout: Path, size: _Size) -> tuple[list[str], dict[str, str]]:
        paths = os.pathsep.join([str(checkout / "src"), str(checkout)])
        argv = [sys.executable, script, "-r", str(checkout), "fetch-model", "--deployment", size.name]
        return argv, {**env, "PYTHONPATH": paths}

    def wipe(*dirs: Path) -> Callable[[], None]:
        def go() -> None:
            for d in dirs:
                shutil.rmtree(d, ignore_errors=True)
            (proj / "rigsmith.lock").unlink(missing_ok=True)

        return go

    def curl(size: _Size) -> list[str]:
        argv = ["curl", "--parallel", "--parallel-max", "4", "-sS", "--fail", "--create-dirs"]
        for p in size.paths:
            argv += ["-o", str(size.curled / p), f"{url}/{size.repo}/resolve/{size.sha}/{p}"]
        return argv

    main = sizes[0]
    sums = ["sha256sum", *(str(main.curled / p) for p in main.paths)]
    hfdir = tmp / "hf"
    hf = ["hf", "download", main.repo, "--revision", main.sha, "--local-dir", str(hfdir)]
    r = args.repeat
    cases: dict[str, tuple[Callable[[], object], Callable[[], object] | None]] = {}
    for i, size in enumerate(sizes):
        inv, env_i = invoke_in(ROOT, size)
        cases[f"cold_rig{i}"] = (lambda inv=inv, env_i=env_i: _run(inv, env_i), wipe(size.rig))
        fetch = curl(size)
        cases[f"cold_curl{i}"] = (lambda c=fetch: _run(c, env), wipe(size.curled))
    cases["cold_curl_sum"] = (lambda: (_run(curl(main), env), _run(sums, env)), wipe(main.curled))
    cases["cold_hf"] = (lambda: _run(hf, env), wipe(hfdir))
    invoke, env0 = invoke_in(ROOT, main)
    inv0, envo = invoke_in(args.against.resolve(), main) if args.against is not None else (invoke, env0)
    if args.against is not None:
        cases["cold_old"] = (lambda: _run(inv0, envo), wipe(main.rig))
    med = _rounds(cases, r)
    _run(invoke, env0)  # the last cold round may have been another tool's: fetch into rig for these
    _run(curl(main), env)
    _run(hf, env)
    cases = {
        "verify_rig": (lambda: _run([*invoke, "--verify"], env0), None),
        "verify_sum": (lambda: _run(sums, env), None),
        "warm_rig": (lambda: _run(invoke, env0), None),
        "warm_hf": (lambda: _run(hf, env), None),
    }
    if args.against is not None:
        cases["verify_old"] = (lambda: _run([*inv0, "--verify"], envo), None)
        cases["warm_old"] = (lambda: _run(inv0, envo), None)
    med.update(_rounds(cases, r))
    _report(args, sizes, med)


def _report(args: argparse.Namespace, sizes: list[_Size], med: dict[str, float]) -> None:
    main = sizes[0]
    print(f"Hub stand-in on 127.0.0.1, {os.cpu_count()} cores; medians of {args.repeat}, interleaved")
    rows = []
    for i, size in enumerate(sizes):
        shards = len(size.paths) - 2
        label = f"cold {shards}x{(size.total // max(shards, 1)) >> 20}MiB"
        rows.append(
            (label, "invoke fetch-model", med[f"cold_rig{i}"], "curl --parallel-max 4", med[f"cold_curl{i}"])
        )
        if i == 0:
            first = label
            rows.append(
                (first, "invoke fetch-model", med["cold_rig0"], "curl + sha256sum", med["cold_curl_sum"])
            )
            rows.append((first, "invoke fetch-model", med["cold_rig0"], "hf download", med["cold_hf"]))
    rows.append(("verify", "fetch-model --verify", med["verify_rig"], "sha256sum", med["verify_sum"]))
    rows.append(
        ("warm re-run", "invoke fetch-model", med["warm_rig"], "hf download (re-run)", med["warm_hf"])
    )
    print(f"{'case':<18} {'rigsmith':<21} {'s':>7}  {'baseline':<22} {'s':>7}  {'ratio':>6}  speed")
    for case, a, ta, b, tb in rows:
        print(f"{case:<18} {a:<21} {ta:7.3f}  {b:<22} {tb:7.3f}  {ta / tb:5.2f}x  {tb / ta:5.2f}x")
    for i, size in enumerate(sizes):
        mib = size.total / 2**20
        print(f"({size.repo}: {mib:.0f} MiB; rigsmith {mib / med[f'cold_rig{i}']:.0f} MiB/s, "
              f"curl {mib / med[f'cold_curl{i}']:.0f} MiB/s)")  # fmt: skip
    old = {k.removesuffix("_old"): v for k, v in med.items() if k.endswith("_old")}
    if old:
        print(f"--against {args.against}: the same runs of that checkout, in this run ({main.repo})")
        for case, mine, theirs, base in (
            ("cold download", med["cold_rig0"], old["cold"], med["cold_curl0"]),
            ("verify", med["verify_rig"], old["verify"], med["verify_sum"]),
            ("warm re-run", med["warm_rig"], old["warm"], med["warm_hf"]),
        ):
            print(f"{case:<14} this {mine:7.3f} s ({mine / base:5.2f}x)   against {theirs:7.3f} s "
                  f"({theirs / base:5.2f}x of the same baseline)")  # fmt: skip


if __name__ == "__main__":
    main()
