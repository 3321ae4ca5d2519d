"""Import time of a typical pasted script (issue 35: bash in the bubblewrap jail).

Run on demand: ``python bench/bench_script_import.py`` (this tree), or with another tree's ``src`` first on
``PYTHONPATH`` to compare (``PYTHONPATH=/path/to/main/src python bench/bench_script_import.py``). Prints
the median of 15 imports of each text, and the corpus's import/refuse counts. Not a test.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if "PYTHONPATH" not in os.environ:
    sys.path[:0] = [str(ROOT / "src")]

from rigsmith.errors import RigsmithError  # noqa: E402
from rigsmith.importing import recipe  # noqa: E402

TEXTS = {
    "one command": "vllm serve Qwen/Qwen3-0.6B --port 8000 -tp 2\n",
    "script": (
        "#!/bin/bash\nset -euo pipefail\nMODEL=Qwen/Qwen3-0.6B\nexport CUDA_VISIBLE_DEVICES=0,1\n"
        'ARGS="--max-model-len 8192"\nif [ "${NVLINK:-0}" = 1 ]; then ARGS+=" -tp 2"; fi\n'
        "cd /srv/vllm\nsource .venv/bin/activate\n"
        "nohup vllm serve $MODEL --port ${PORT:-8000} $ARGS > server.log 2>&1 &\n"
    ),
}


def _median(text: str) -> float:
    times = []
    for _ in range(15):
        t0 = time.perf_counter()
        with contextlib.suppress(RigsmithError):
            recipe.parse(text, source="bench", sha256="0" * 64)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    print(f"rigsmith from {Path(recipe.__file__).parents[3]}")
    for label, text in TEXTS.items():
        print(f"{label:<12} {_median(text) * 1e3:8.1f} ms (median of 15)")
    corpus = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "tests/importing/data/vllm-commands.json"
    cases = json.loads(corpus.read_text(encoding="utf-8"))
    imported = 0
    for c in cases:
        with contextlib.suppress(RigsmithError):
            recipe.parse(c["raw"], source="bench", sha256="0" * 64)
            imported += 1
    print(f"corpus {corpus.name}: {imported} of {len(cases)} imported, {len(cases) - imported} refused")


if __name__ == "__main__":
    main()
