"""Recipe import speed, as ratios against shlex.split measured in the same run.

Run on demand: ``python bench/bench_import.py``. Not a test; numbers depend on the machine, the ratios
much less.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src")]

from rigsmith.errors import RigsmithError  # noqa: E402
from rigsmith.importing import recipe, shellwords  # noqa: E402


def _best(fn: Callable[[], object], rounds: int = 7, inner: int = 20) -> float:
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        best = min(best, (time.perf_counter() - t0) / inner)
    return best


def main() -> None:
    cases = json.loads(
        (ROOT / "tests" / "importing" / "data" / "vllm-commands.json").read_text(encoding="utf-8")
    )
    shell = [c["raw"] for c in cases if c["kind"] != "compose"]
    seed = next((ROOT / "examples" / "recipes").glob("*.json")).read_text(encoding="utf-8")
    seed_cmd = json.loads(seed)["command"]

    def baseline() -> None:
        for raw in shell:
            with contextlib.suppress(ValueError):
                shlex.split(raw, comments=True)

    def scanner() -> None:
        for raw in shell:
            shellwords.scan(raw)

    def full_import() -> None:
        for c in cases:
            with contextlib.suppress(RigsmithError):
                recipe.parse(c["raw"], source="bench", sha256="0" * 64)

    sha = hashlib.sha256(seed.encode()).hexdigest()
    rows = [
        ("shlex.split, 37 shell cases (baseline)", _best(baseline)),
        ("shellwords.scan, same 37 cases", _best(scanner)),
        ("recipe.parse, all 40 corpus cases", _best(full_import)),
        ("shlex.split, seed 003 command (baseline 2)", _best(lambda: shlex.split(seed_cmd), inner=200)),
        ("recipe.parse, seed 003 recipe JSON", _best(lambda: recipe.parse(seed, source="b", sha256=sha))),
    ]
    base, base2 = rows[0][1], rows[3][1]
    for i, (label, secs) in enumerate(rows):
        ref = base if i < 3 else base2
        print(f"{label:<45} {secs * 1e3:9.3f} ms   x{secs / ref:6.2f} of baseline")


if __name__ == "__main__":
    main()
