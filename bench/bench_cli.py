#!/usr/bin/env python3
"""Benchmark the commands that should answer at once, as whole processes, with ratios in one run.

    python bench/bench_cli.py [--repeat 7] [--files 100] [--against DIR]

- ``invoke --list`` (goal: 0.25 s) and ``invoke deploy podman --check`` of one target with nothing to
  change (goal: 0.35 s; it renders and compares every run, no cache), each against ``python -c pass``
  (the interpreter's own start-up);
- a warm re-run of ``invoke fetch-model`` on a complete snapshot of ``--files`` files (zero requests, no
  mark: the verified-file record and a stat per file; goal: 0.3 s for 100 files, issue 26) against
  ``hf download --local-dir`` re-run on its own complete copy.

Every figure is the median wall-clock time of ``--repeat`` runs, after one warm-up, with bytecode cached
(``PYTHONPYCACHEPREFIX`` in a temporary directory; an installed checkout has its ``__pycache__``).
``--against DIR`` times the same invoke commands in another checkout too (e.g. ``git archive main | tar -x
-C DIR``), so before and after come from one run. Everything talks to 127.0.0.1. Not a test.
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
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REPO = "acme/warm"
SEED = "flash-next-int4-3x3090"


def _once(argv: list[str], env: dict[str, str]) -> float:
    t = time.perf_counter()
    res = subprocess.run(argv, env=env, capture_output=True, text=True)
    took = time.perf_counter() - t
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:4])}… failed ({res.returncode}):\n{res.stdout}\n{res.stderr}")
    return took


def _writing_pyc(argv: list[str]) -> list[str]:
    """The warm-up run of an invoke command, with bytecode written: Invoke turns writing off before it loads
    tasks.py, so without this every timed run compiled rigsmith, pydantic, jinja2… anew (the
    PYTHONPYCACHEPREFIX cache starts empty)."""
    return [argv[0], "--write-pyc", *argv[1:]] if Path(argv[0]).name == "invoke" else argv


def _invoke_bin() -> str:
    """The console script itself (a pyenv shim in front of it is a bash script: not what a venv runs)."""
    beside = Path(sys.executable).with_name("invoke")
    return str(beside) if beside.exists() else shutil.which("invoke") or "invoke"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--files", type=int, default=100, help="files in the warm snapshot")
    ap.add_argument("--against", type=Path, help="another checkout to time the same invoke commands in")
    args = ap.parse_args()
    checkouts = [("this", ROOT)] + ([("against", args.against.resolve())] if args.against else [])
    tmp = Path(tempfile.mkdtemp(prefix="bench-cli-"))
    base = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING", "RIGSMITH_"))}
    base.pop("PYTHONDONTWRITEBYTECODE", None)
    base["PYTHONPYCACHEPREFIX"] = str(tmp / "pycache")
    pyenv = {**base, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    shards = str(max(args.files - 2, 1))  # and config.json, tokenizer.json
    server = subprocess.Popen(
        [sys.executable, "-m", "tests.support.hubserver", "--repo", REPO, "--shards", shards,
         "--shard-mib", "1"],
        cwd=ROOT, env=pyenv, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert server.stdout is not None
        url, sha = server.stdout.readline().split()
        _bench(args, checkouts, tmp, base, pyenv, url, sha)
    finally:
        server.terminate()
        server.wait(timeout=30)
        shutil.rmtree(tmp, ignore_errors=True)


def _bench(
    args: argparse.Namespace,
    checkouts: list[tuple[str, Path]],
    tmp: Path,
    base: dict[str, str],
    pyenv: dict[str, str],
    url: str,
    sha: str,
) -> None:
    sys.path[:0] = [str(ROOT / "src"), str(ROOT)]
    from tests.support.common import make_seed_project
    from tests.support.hubserver import bench_env

    from rigsmith import spec as specmod
    from rigsmith.rendering import deploy

    project = make_seed_project(tmp / "seed")
    deploy.deploy(project, "podman", deployment=SEED, yes=True, echo=lambda _: None)
    data = specmod.to_data(specmod.load(ROOT / "deployments" / f"{SEED}.yaml"))
    for n in range(len(checkouts)):
        # A model dir each: a fetch of one checkout must not touch what the other's warm path looks at.
        data["name"] = f"warm-{n}"
        data["model"] = {"repo": REPO, "revision": sha, "local_dir": str(tmp / f"rig-{n}")}
        (project.root / "deployments" / f"warm-{n}.yaml").write_text(specmod.dump(specmod.from_data(data)))
    hub = bench_env({}, url, tmp / "hf-home", project.root)
    r = args.repeat
    hf = ["hf", "download", REPO, "--revision", sha, "--local-dir", str(tmp / "hf")]
    cmds: dict[str, tuple[list[str], dict[str, str]]] = {"python": ([sys.executable, "-c", "pass"], base)}
    if shutil.which("hf"):
        cmds["hf"] = (hf, {**base, **hub})
    for n, (label, checkout) in enumerate(checkouts):
        env = {**base, **hub, "PYTHONPATH": os.pathsep.join([str(checkout / "src"), str(checkout)])}
        invoke = [_invoke_bin(), "-r", str(checkout)]
        cmds[f"{label} list"] = ([*invoke, "--list"], env)
        cmds[f"{label} check"] = ([*invoke, "deploy", "podman", "--check", "--deployment", SEED], env)
        cmds[f"{label} warm"] = (
            [*invoke, "fetch-model", "--deployment", f"warm-{n}"],
            env,
        )  # warm-up downloads
    # One warm-up each, then rounds: every command once a round, so drifting load hits all alike.
    times: dict[str, list[float]] = {k: [] for k in cmds}
    for rnd in range(r + 1):
        for name, (argv, env) in cmds.items():
            took = _once(argv if rnd else _writing_pyc(argv), env)
            if rnd:
                times[name].append(took)
    med = {k: statistics.median(v) for k, v in times.items()}
    python, hf_warm = med["python"], med.get("hf", float("nan"))
    rows: list[tuple[str, str, float, str, float, float | None]] = []
    for label, _checkout in checkouts:
        rows += [
            (label, "invoke --list", med[f"{label} list"], "python -c pass", python, 0.25),
            (label, "invoke deploy --check", med[f"{label} check"], "python -c pass", python, 0.35),
            (
                label,
                f"warm fetch-model ({args.files})",
                med[f"{label} warm"],
                "hf download (re-run)",
                hf_warm,
                0.3,
            ),
        ]
    print(f"median of {r} after a warm-up; bytecode cached; 127.0.0.1; {os.cpu_count()} cores")
    print(f"{'checkout':<8} {'command':<28} {'s':>6}  {'goal':>5}  {'baseline':<20} {'s':>6}  ratio")
    for label, a, ta, b, tb, goal in rows:
        mark = "" if goal is None else ("ok" if ta <= goal else "MISS")
        print(f"{label:<8} {a:<28} {ta:6.3f}  {goal or 0:5.2f}  {b:<20} {tb:6.3f}  {ta / tb:5.2f}x  {mark}")
    for label, checkout in checkouts:
        print(f"  {label}: {checkout}")


if __name__ == "__main__":
    main()
