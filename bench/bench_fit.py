#!/usr/bin/env python3
"""Benchmark: `invoke fit`'s header read of a huge checkpoint, against huggingface_hub's own whole-repo call.

Run on demand from the repository root:  python3 bench/bench_fit.py [--shards N] [--runs R]

It serves a header-only synthetic checkpoint (N shards × 1,500 tensors of 8 MiB declared: hundreds of GiB, no
weight bytes) from the Hub stand-in on 127.0.0.1 and times, alternating:
  fit       — resolving.fit.checkpoint.estimate_for: config + headers (ranged GETs, 4 in flight), estimated
  hf-meta   — HfApi.get_safetensors_metadata on the same commit (HEAD probes, the index, threaded header GETs)
Prints medians (timed without tracemalloc), bytes the server sent, the peak Python memory of each (one more
run under tracemalloc) and the ratios fit / hf-meta measured in this run. Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "src"), str(REPO)]
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

from huggingface_hub import HfApi  # noqa: E402
from tests.support.checkpoints import large_header_only, make_spec  # noqa: E402
from tests.support.hubserver import HubServer  # noqa: E402

from rigsmith.resolving.fit.checkpoint import estimate_for, open_checkpoint  # noqa: E402
from rigsmith.resolving.lock.lock import Lock  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shards", type=int, default=48)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    files, declared = large_header_only(args.shards)
    with HubServer() as hub, tempfile.TemporaryDirectory() as tmp:
        os.environ["HF_HOME"] = str(Path(tmp) / "hf-home")
        sha = hub.repo("acme/bench-fit").add_commit(files)
        spec = make_spec(Path(tmp), [], repo="acme/bench-fit", revision=sha)
        env = {"HF_ENDPOINT": hub.url}
        api = HfApi(endpoint=hub.url, token=False)

        def fit_once() -> None:
            estimate_for(spec, open_checkpoint(spec, Lock(), env))

        def hf_once() -> None:
            api.get_safetensors_metadata("acme/bench-fit", revision=sha)

        times: dict[str, list[float]] = {"fit": [], "hf-meta": []}
        sent: dict[str, int] = {}
        peak: dict[str, int] = {}
        for _ in range(args.runs):
            for name, fn in (("fit", fit_once), ("hf-meta", hf_once)):
                hub.reset()
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
                time.sleep(0.05)  # let the server finish its accounting
                sent[name] = sum(r.sent for r in hub.hub_requests())
        for name, fn in (("fit", fit_once), ("hf-meta", hf_once)):
            tracemalloc.start()
            fn()
            peak[name] = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
        print(
            f"checkpoint: {args.shards} shards, {declared / 2**30:,.0f} GiB declared, no weight bytes served"
        )
        for name, ts in times.items():
            print(
                f"{name:8s} median {statistics.median(ts):6.3f} s  sent {sent[name] / 2**20:7.2f} MiB  "
                f"peak Python memory {peak[name] / 2**20:6.1f} MiB"
            )
        ratio = statistics.median(times["fit"]) / statistics.median(times["hf-meta"])
        print(f"fit / hf-meta time ratio: {ratio:.2f}; memory ratio: {peak['fit'] / peak['hf-meta']:.2f}")


if __name__ == "__main__":
    main()
