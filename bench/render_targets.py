"""On-demand benchmark: render time of each deploy target for both seed deployments, as a ratio against the
podman target measured in the same run (so machine speed cancels out).

    PYTHONPATH=src:. python bench/render_targets.py [--rounds N]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from tests.support.common import make_seed_project

from rigsmith.project import TARGETS, Project
from rigsmith.rendering import deploy

REPO = Path(__file__).resolve().parents[1]
SEEDS = ("flash-next-int4-3x3090", "flash-next-merlin-4x3090")


def _time(project: Project, target: str, out: Path, rounds: int) -> float:
    samples = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for seed in SEEDS:
            deploy.artifacts(project, target, deployment=seed, out=out)
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=50)
    rounds = ap.parse_args().rounds
    with tempfile.TemporaryDirectory() as tmp:
        project = make_seed_project(Path(tmp))
        out = Path(tmp) / "out"
        for target in TARGETS:  # warm-up: imports, template compilation
            _time(project, target, out, 2)
        base = _time(project, "podman", out, rounds)
        print(f"median of {rounds} rounds, both seeds per round; baseline podman = {base * 1e3:.2f} ms")
        for target in TARGETS:
            t = _time(project, target, out, rounds)
            print(f"{target:8s} {t * 1e3:8.2f} ms   x{t / base:5.2f} vs podman")


if __name__ == "__main__":
    main()
