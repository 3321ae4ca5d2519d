"""Benchmark of `invoke bench`'s client (run on demand: `python bench/bench_ops.py`).

1. Accuracy: the stand-in OpenAI server (a separate process pinned to one core) streams at known rates;
   the client's measured 1-stream decode rate and 2-stream aggregate must be within ±2 % of them.
2. Ceiling: the stand-in streams unthrottled; the client, pinned to the other core, must sustain
   ≥ 5,000 tok/s. The baseline measured in the same run is a minimal raw-socket SSE reader (no HTTP library,
   no JSON) on the same stream, so the ratio shows what the real client costs over reading bytes.

Prints ratios; exits 1 if a target is missed.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src")]

from rigsmith.operating.bench import bench  # noqa: E402

CLIENT_CORE, SERVER_CORE = 0, 1
TARGET_TPS = 5000.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(rate: float, ttft: float) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "tests.support.standin",
        "--port",
        str(port),
        "--rate",
        str(rate),
        "--ttft",
        str(ttft),
        "--model",
        "m",
    ]
    if hasattr(os, "sched_setaffinity") and os.cpu_count() and os.cpu_count() > 1:  # type: ignore[operator]
        argv = ["taskset", "-c", str(SERVER_CORE), *argv]
    path = f"{ROOT / 'src'}:{ROOT}"  # the stand-in is tests.support.standin
    proc = subprocess.Popen(argv, env={**os.environ, "PYTHONPATH": path}, stdout=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return proc, url
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit("stand-in server did not start")


def raw_reader_tps(port: int, tokens: int) -> float:
    """Baseline: read the same SSE stream over a bare socket, counting token events by a byte marker."""
    body = json.dumps({"model": "m", "prompt": "x", "max_tokens": tokens, "stream": True}).encode()
    req = (
        b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body)
    )
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(req)
        first = last = 0.0
        seen = 0
        tail = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            n = (tail + chunk).count(b'"text":" tok"')
            if n:
                now = time.monotonic()
                if seen == 0:
                    first = now
                seen += n
                last = now
            tail = chunk[-16:]
    return (seen - 1) / (last - first) if last > first else 0.0


def main() -> int:
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {CLIENT_CORE})
    ok = True
    print("== accuracy: measured vs known rate (target: within ±2 %)")
    for rate, streams, tokens in ((67.4, 1, 200), (36.55, 2, 200), (200.0, 1, 600), (1000.0, 1, 3000)):
        proc, url = start_server(rate, 0.05)
        try:
            bench.run_streams(url, "m", 1, 4, "warm up")
            results, wall = bench.run_streams(url, "m", streams, tokens, bench.prompt_of(256))
        finally:
            proc.terminate()
            proc.wait()
        s = bench.summarize(results, wall)
        measured = s.mean_stream_decode_tps if streams == 1 else s.aggregate_decode_tps
        known = rate * streams
        ratio = measured / known
        good = abs(ratio - 1) <= 0.02
        ok &= good
        label = "1-stream decode" if streams == 1 else f"{streams}-stream aggregate"
        print(
            f"  {label:<20} known {known:8.2f} tok/s  measured {measured:8.2f}  ratio {ratio:.4f}  "
            f"TTFT {s.ttft_mean_s * 1000:5.1f} ms  {'ok' if good else 'MISS'}"
        )

    print(
        f"== ceiling: client on core {CLIENT_CORE}, unthrottled server on core {SERVER_CORE} "
        f"(target ≥ {TARGET_TPS:,.0f} tok/s)"
    )
    proc, url = start_server(0, 0.0)
    port = int(url.rsplit(":", 1)[1])
    try:
        n = 60_000
        bench.run_streams(url, "m", 1, 100, "warm up")
        baseline = max(raw_reader_tps(port, n) for _ in range(2))
        best = 0.0
        cpu = 0.0
        for _ in range(3):
            c0 = time.process_time()
            results, wall = bench.run_streams(url, "m", 1, n, "x")
            cpu = time.process_time() - c0
            best = max(best, results[0].decode_tps)
    finally:
        proc.terminate()
        proc.wait()
    ok &= best >= TARGET_TPS
    print(f"  raw-socket baseline  {baseline:10,.0f} tok/s")
    print(
        f"  bench client         {best:10,.0f} tok/s  (client CPU {cpu:.2f} s for {n:,} tokens: "
        f"{n / cpu:,.0f} tok/s per CPU-second)"
    )
    print(
        f"  ratio client/baseline {best / baseline:.3f}   ratio client/target {best / TARGET_TPS:.2f}  "
        f"{'ok' if best >= TARGET_TPS else 'MISS'}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
