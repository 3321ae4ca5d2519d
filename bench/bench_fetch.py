#!/usr/bin/env python3
"""Benchmark `invoke fetch-model` against the tools a user would otherwise run, in one run, as ratios.

    python bench/bench_fetch.py [--shards 16] [--shard-mib 128] [--repeat 3] [--against DIR]

Everything talks to a Hub stand-in on 127.0.0.1 (tests/support/hubserver.py) started in its own process.
Every number is a wall-clock median over ``--repeat`` runs of a whole command (process start included):

- cold download: ``invoke fetch-model`` (pin + download + verify) vs ``curl --parallel`` of the same URLs
  (and vs curl followed by ``sha256sum``, which is what verifying by hand costs);
- verify: ``invoke fetch-model --verify`` (parallel hashing, no network) vs ``sha256sum`` of the same files;
- warm re-run: ``invoke fetch-model`` on a complete dir vs ``hf download --local-dir`` re-run on its own
  complete dir (huggingface_hub's CLI).

Ratios are rigsmith / baseline: below 1 is faster than the baseline. ``--against DIR`` times the
rigsmith commands of another checkout too (e.g. ``git archive main | tar -x -C DIR``): before and after in
one run. Bytecode is cached (``PYTHONPYCACHEPREFIX``), as an installed checkout has it.
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
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--shard-mib", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--against", type=Path, help="another checkout whose fetch-model is timed too")
    args = ap.parse_args()
    for tool in ("curl", "sha256sum", "hf", "invoke"):
        if not shutil.which(tool):
            raise SystemExit(f"{tool} is not installed")

    tmp = Path(tempfile.mkdtemp(prefix="bench-fetch-"))
    pyenv = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    pyenv.pop("PYTHONDONTWRITEBYTECODE", None)
    pyenv["PYTHONPYCACHEPREFIX"] = str(tmp / "pycache")
    server = subprocess.Popen(
        [sys.executable, "-m", "tests.support.hubserver", "--repo", REPO, "--shards", str(args.shards),
         "--shard-mib", str(args.shard_mib)],
        cwd=ROOT, env=pyenv, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert server.stdout is not None
        url, sha = server.stdout.readline().split()
        _bench(args, tmp, pyenv, url, sha)
    finally:
        server.terminate()
        server.wait(timeout=30)
        shutil.rmtree(tmp, ignore_errors=True)


def _bench(args: argparse.Namespace, tmp: Path, pyenv: dict[str, str], url: str, sha: str) -> None:
    sys.path[:0] = [str(ROOT / "src")]
    sys.path[:0] = [str(ROOT)]
    from tests.support.hubserver import bench_env

    from rigsmith import spec as specmod

    proj = tmp / "proj"
    (proj / "deployments").mkdir(parents=True)
    data = specmod.to_data(specmod.load(ROOT / "deployments" / "flash-next-merlin-4x3090.yaml"))
    data["name"] = "bench"
    data["model"] = {"repo": REPO, "revision": sha, "local_dir": str(tmp / "rig")}
    (proj / "deployments" / "bench.yaml").write_text(specmod.dump(specmod.from_data(data)))
    env = bench_env(pyenv, url, tmp / "hf-home", proj)
    with urllib.request.urlopen(f"{url}/api/models/{REPO}/tree/{sha}?recursive=true") as resp:
        tree = [e for e in json.load(resp) if e["type"] == "file"]
    paths = [e["path"] for e in tree]
    total = sum(e["size"] for e in tree)
    rig, curled, hfdir = tmp / "rig", tmp / "curl", tmp / "hf"
    beside = Path(sys.executable).with_name("invoke")  # the console script, not a pyenv shim
    script = str(beside) if beside.exists() else shutil.which("invoke") or "invoke"

    def invoke_in(checkout: Path) -> tuple[list[str], dict[str, str]]:
        paths = os.pathsep.join([str(checkout / "src"), str(checkout)])
        return [sys.executable, script, "-r", str(checkout), "fetch-model"], {**env, "PYTHONPATH": paths}

    invoke, env = invoke_in(ROOT)

    def wipe(*dirs: Path) -> Callable[[], None]:
        def go() -> None:
            for d in dirs:
                shutil.rmtree(d, ignore_errors=True)
            (proj / "rigsmith.lock").unlink(missing_ok=True)

        return go

    curl = ["curl", "--parallel", "--parallel-max", "4", "-sS", "--fail", "--create-dirs"]
    for p in paths:
        curl += ["-o", str(curled / p), f"{url}/{REPO}/resolve/{sha}/{p}"]
    sums = ["sha256sum", *(str(curled / p) for p in paths)]

    r = args.repeat
    hf = ["hf", "download", REPO, "--revision", sha, "--local-dir", str(hfdir)]
    inv0, env0 = invoke_in(args.against.resolve()) if args.against is not None else (invoke, env)
    # Each round runs every case once, so a neighbour's load drifting over minutes hits all of them alike.
    cases: dict[str, tuple[Callable[[], object], Callable[[], object] | None]] = {
        "cold_rig": (lambda: _run(invoke, env), wipe(rig)),
        "cold_curl": (lambda: _run(curl, env), wipe(curled)),
        "cold_curl_sum": (lambda: (_run(curl, env), _run(sums, env)), wipe(curled)),
        "cold_hf": (lambda: _run(hf, env), wipe(hfdir)),
    }
    if args.against is not None:
        cases["cold_old"] = (lambda: _run(inv0, env0), wipe(rig))
    cold = _rounds(cases, r)
    cases = {
        "verify_rig": (lambda: _run([*invoke, "--verify"], env), None),
        "verify_sum": (lambda: _run(sums, env), None),
        "warm_rig": (lambda: _run(invoke, env), None),
        "warm_hf": (lambda: _run(hf, env), None),
    }
    if args.against is not None:
        cases["verify_old"] = (lambda: _run([*inv0, "--verify"], env0), None)
        cases["warm_old"] = (lambda: _run(inv0, env0), None)
    _run(invoke, env)  # the last cold round may have been another tool's: fetch into rig for these
    _run(hf, env)
    med = {**cold, **_rounds(cases, r)}
    cold_rig, cold_curl, cold_curl_sum, cold_hf = (
        med[k] for k in ("cold_rig", "cold_curl", "cold_curl_sum", "cold_hf")
    )
    verify_rig, verify_sum, warm_rig, warm_hf = (
        med[k] for k in ("verify_rig", "verify_sum", "warm_rig", "warm_hf")
    )
    old = {k.removesuffix("_old"): v for k, v in med.items() if k.endswith("_old")}

    mib = total / 2**20
    print(
        f"repo {REPO}@{sha[:12]}: {len(paths)} files, {mib:.0f} MiB; median of {r};"
        f" 127.0.0.1; {os.cpu_count()} cores"
    )
    rows = [
        ("cold download", "invoke fetch-model", cold_rig, "curl --parallel 4", cold_curl),
        ("cold download", "invoke fetch-model", cold_rig, "curl + sha256sum", cold_curl_sum),
        ("cold download", "invoke fetch-model", cold_rig, "hf download", cold_hf),
        ("verify", "fetch-model --verify", verify_rig, "sha256sum", verify_sum),
        ("warm re-run", "invoke fetch-model", warm_rig, "hf download (re-run)", warm_hf),
    ]
    print(f"{'case':<14} {'rigsmith':<22} {'s':>7}  {'baseline':<22} {'s':>7}  ratio")
    for case, a, ta, b, tb in rows:
        print(f"{case:<14} {a:<22} {ta:7.3f}  {b:<22} {tb:7.3f}  {ta / tb:5.2f}x")
    print(f"(cold throughput: rigsmith {mib / cold_rig:.0f} MiB/s, curl {mib / cold_curl:.0f} MiB/s)")
    if old:
        print(f"--against {args.against}: the same three runs of that checkout, in this run")
        for case, mine, theirs, base in (
            ("cold download", cold_rig, old["cold"], cold_curl),
            ("verify", verify_rig, old["verify"], verify_sum),
            ("warm re-run", warm_rig, old["warm"], warm_hf),
        ):
            print(f"{case:<14} this {mine:7.3f} s ({mine / base:5.2f}x)   against {theirs:7.3f} s "
                  f"({theirs / base:5.2f}x of the same baseline)")  # fmt: skip


if __name__ == "__main__":
    main()
