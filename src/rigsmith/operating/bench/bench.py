"""``invoke bench``: an OpenAI-compatible streaming client measuring what the recipes publish.

Per stream: TTFT (request → first token), decode tok/s ((tokens − 1) / (last token − first token), as
``vllm bench serve`` derives TPOT), prefill tok/s (prompt tokens / TTFT). N streams run concurrently; their
aggregate decode rate is Σ(tokens − 1) / (last token of any − first token of any). Results are appended to
``.rigsmith/bench.jsonl`` keyed by a hash of rigsmith.lock + the spec, so runs compare across image,
patch and revision changes, and against the recipe's published numbers.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
from filelock import FileLock

from rigsmith import spec as specmod
from rigsmith.errors import AdapterError, RigsmithError
from rigsmith.rendering.plan import local_url
from rigsmith.resolving.fit.fit import engine_inputs
from rigsmith.resolving.fit.layout import of_params
from rigsmith.writer import write_one

#: A prompt of plain words (the stand-in counts words as tokens; a real tokenizer gives ~1.3× as many).
DEFAULT_PROMPT_WORDS = 512


@dataclass(frozen=True)
class StreamResult:
    """One streamed request."""

    start: float  # monotonic seconds
    first_token: float
    last_token: float
    tokens: int
    prompt_tokens: int

    @property
    def ttft(self) -> float:
        return self.first_token - self.start

    @property
    def decode_tps(self) -> float:
        span = self.last_token - self.first_token
        return (self.tokens - 1) / span if self.tokens > 1 and span > 0 else 0.0

    @property
    def prefill_tps(self) -> float:
        return self.prompt_tokens / self.ttft if self.ttft > 0 else 0.0


@dataclass(frozen=True)
class Summary:
    """N concurrent streams, summarised."""

    streams: int
    tokens: int
    aggregate_decode_tps: float
    mean_stream_decode_tps: float
    ttft_mean_s: float
    ttft_max_s: float
    prefill_tps: float
    wall_s: float


def base_url(spec: specmod.Deployment) -> str:
    """Where the deployment's OpenAI API answers (a wildcard bind is reached on loopback)."""
    return local_url(spec.network.host, spec.network.port)


def served_model(client: httpx.Client, url: str) -> str:
    """The first model ``/v1/models`` lists."""
    try:
        r = client.get(f"{url}/v1/models")
        r.raise_for_status()
        return str(r.json()["data"][0]["id"])
    except (httpx.HTTPError, KeyError, IndexError, ValueError) as err:
        raise AdapterError(
            f"cannot list models at {url}/v1/models: {err}", hint="is the deployment up? `invoke wait` first"
        ) from None


def stream_once(
    client: httpx.Client, url: str, model: str, prompt: str, max_tokens: int, chat: bool = False
) -> StreamResult:
    """Send one streaming request and time its tokens."""
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": max_tokens,
        "stream": True,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }
    if chat:
        body["messages"] = [{"role": "user", "content": prompt}]
        path = "/v1/chat/completions"
    else:
        body["prompt"] = prompt
        path = "/v1/completions"
    start = time.monotonic()
    first = last = 0.0
    chunks = 0
    usage: dict[str, int] = {}
    with client.stream("POST", url + path, json=body) as r:
        if r.status_code != 200:
            r.read()
            raise AdapterError(f"POST {url}{path} answered {r.status_code}: {r.text[:300]}")
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                break
            # Cheap test first: the hot path is one small event per token.
            if '"usage"' in data and '"choices":[]' in data:
                usage = json.loads(data).get("usage") or {}
                continue
            event = json.loads(data)
            choices = event.get("choices") or []
            if not choices:
                continue
            c = choices[0]
            text = c.get("text") if "text" in c else (c.get("delta") or {}).get("content")
            if text:
                now = time.monotonic()
                if chunks == 0:
                    first = now
                last = now
                chunks += 1
    if chunks == 0:
        raise AdapterError(f"POST {url}{path} streamed no tokens", hint="check the model name and max_tokens")
    tokens = int(usage.get("completion_tokens") or chunks)
    prompt_tokens = int(usage.get("prompt_tokens") or len(prompt.split()))
    return StreamResult(start, first, last, tokens, prompt_tokens)


def run_streams(
    url: str, model: str, streams: int, max_tokens: int, prompt: str, chat: bool = False, timeout: float = 600
) -> tuple[list[StreamResult], float]:
    """``streams`` concurrent requests, released together; (results, wall seconds)."""
    results: list[StreamResult | BaseException] = [RuntimeError("not run")] * streams
    barrier = threading.Barrier(streams)
    limits = httpx.Limits(max_connections=streams + 2, max_keepalive_connections=streams + 2)
    with httpx.Client(timeout=httpx.Timeout(timeout, connect=10), limits=limits) as client:

        def one(i: int) -> None:
            try:
                barrier.wait()
                results[i] = stream_once(client, url, model, prompt, max_tokens, chat)
            except BaseException as err:
                results[i] = err

        t0 = time.monotonic()
        threads = [threading.Thread(target=one, args=(i,)) for i in range(streams)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.monotonic() - t0
    for r in results:
        if isinstance(r, RigsmithError):
            raise r
        if isinstance(r, httpx.HTTPError):
            raise AdapterError(f"streaming from {url} failed: {r}", hint="is the deployment up?") from None
        if isinstance(r, BaseException):
            raise r
    return [r for r in results if isinstance(r, StreamResult)], wall


def summarize(results: Sequence[StreamResult], wall: float) -> Summary:
    """Pure: per-stream results → the numbers recipes publish."""
    first = min(r.first_token for r in results)
    last = max(r.last_token for r in results)
    decoded = sum(r.tokens - 1 for r in results)
    ttfts = [r.ttft for r in results]
    return Summary(
        streams=len(results),
        tokens=sum(r.tokens for r in results),
        aggregate_decode_tps=decoded / (last - first) if last > first else 0.0,
        mean_stream_decode_tps=sum(r.decode_tps for r in results) / len(results),
        ttft_mean_s=sum(ttfts) / len(ttfts),
        ttft_max_s=max(ttfts),
        prefill_tps=sum(r.prefill_tps for r in results) / len(results),
        wall_s=wall,
    )


# -- results file -------------------------------------------------------------------------------------


def lock_key(lock_text: str, spec: specmod.Deployment) -> str:
    """What a result is keyed by: sha256 of rigsmith.lock's bytes + the canonical spec, 16 hex."""
    h = hashlib.sha256()
    h.update(lock_text.encode())
    h.update(b"\0")
    h.update(specmod.dump(spec).encode())
    return h.hexdigest()[:16]


def record(
    spec: specmod.Deployment,
    key: str,
    url: str,
    model: str,
    max_tokens: int,
    summaries: Sequence[Summary],
    when: str,
) -> dict[str, Any]:
    """One JSONL row."""
    return {
        "time": when,
        "deployment": spec.name,
        "lock_key": key,
        "url": url,
        "model": model,
        "max_tokens": max_tokens,
        "runs": [asdict(s) for s in summaries],
        "layout": layout_record(spec),
    }


def layout_record(spec: specmod.Deployment) -> dict[str, Any] | None:
    """The layout the spec ran with (TP, PP, DP, EP, partition, KV dtype: ``resolving.fit.layout.Layout``), so
    ``fit --propose`` can say which layout was measured faster; None where fit cannot read the flags."""
    try:
        return asdict(of_params(engine_inputs(spec)))
    except RigsmithError:
        return None


def append(path: Path, row: dict[str, Any]) -> None:
    """Append a row under a file lock, atomically replacing the file (one writer for every file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path) + ".flock", timeout=60):
        old = path.read_text(encoding="utf-8") if path.exists() else ""
        write_one(path, old + json.dumps(row, sort_keys=True) + "\n")


def history(path: Path, deployment: str) -> list[dict[str, Any]]:
    """Earlier rows of a deployment (unparseable lines are skipped, not fatal)."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and row.get("deployment") == deployment:
            out.append(row)
    return out


def metric(summary: dict[str, Any] | Summary, streams: int) -> float:
    """The number a published benchmark names: 1 stream → its decode rate; N → the aggregate."""
    s = asdict(summary) if isinstance(summary, Summary) else summary
    return float(s["mean_stream_decode_tps"] if streams == 1 else s["aggregate_decode_tps"])


@dataclass(frozen=True)
class Comparison:
    """A measured number against a reference."""

    label: str
    streams: int
    measured: float
    reference: float
    tolerance: float | None  # published benchmarks carry one; history rows do not

    @property
    def ratio(self) -> float:
        return self.measured / self.reference if self.reference else 0.0

    @property
    def passed(self) -> bool | None:
        return None if self.tolerance is None else self.ratio >= 1 - self.tolerance


def compare(
    spec: specmod.Deployment, summaries: Sequence[Summary], earlier: Sequence[dict[str, Any]], key: str
) -> list[Comparison]:
    """Pure: this run against the recipe's published numbers and the latest earlier run per lock key."""
    by_streams = {s.streams: s for s in summaries}
    out = []
    for b in spec.benchmarks:
        s = by_streams.get(b.streams)
        if s:
            out.append(
                Comparison(
                    f"published {b.name}", b.streams, metric(s, b.streams), b.tokens_per_second, b.tolerance
                )
            )
    latest: dict[str, dict[str, Any]] = {}
    for row in earlier:
        latest[str(row.get("lock_key"))] = row
    for k, row in latest.items():
        for run in row.get("runs", []):
            n = int(run.get("streams", 0))
            if n in by_streams:
                tag = "same lock" if k == key else f"lock {k}"
                out.append(
                    Comparison(
                        f"{row.get('time', '?')} ({tag})", n, metric(by_streams[n], n), metric(run, n), None
                    )
                )
    return out


# -- the whole run ------------------------------------------------------------------------------------


def stream_counts(spec: specmod.Deployment, extra: Sequence[int] = ()) -> list[int]:
    """1 stream, every stream count the recipe publishes a number for, and any asked for."""
    return sorted({1, *(b.streams for b in spec.benchmarks), *extra})


def prompt_of(words: int) -> str:
    """A deterministic plain-word prompt."""
    vocab = ("the", "rig", "serves", "tokens", "from", "four", "cards", "over", "pcie", "quickly")
    return " ".join(vocab[i % len(vocab)] for i in range(words))


def run(
    url: str,
    model: str,
    counts: Sequence[int],
    max_tokens: int,
    prompt_words: int = DEFAULT_PROMPT_WORDS,
    chat: bool = False,
    echo: Any = print,
) -> list[Summary]:
    """Run each stream count once (after a one-request warm-up) and summarise."""
    prompt = prompt_of(prompt_words)
    run_streams(url, model, 1, min(max_tokens, 8), prompt, chat)  # warm-up: connection, caches
    out = []
    for n in counts:
        results, wall = run_streams(url, model, n, max_tokens, prompt, chat)
        s = summarize(results, wall)
        echo(
            f"bench {n} stream(s): decode {s.mean_stream_decode_tps:.1f} tok/s per stream, aggregate "
            f"{s.aggregate_decode_tps:.1f} tok/s, TTFT {s.ttft_mean_s * 1000:.0f} ms, prefill "
            f"{s.prefill_tps:.0f} tok/s"
        )
        out.append(s)
    return out


def results_path(root: Path) -> Path:
    """Where bench results accumulate in a checkout."""
    return root / ".rigsmith" / "bench.jsonl"


def comparison_lines(comparisons: Sequence[Comparison]) -> list[str]:
    """Human lines for --compare."""
    out = []
    for c in comparisons:
        verdict = (
            "" if c.passed is None else ("  PASS" if c.passed else f"  BELOW (tolerance {c.tolerance:.0%})")
        )
        out.append(
            f"{c.label:<48} {c.streams} stream(s): {c.measured:8.1f} vs {c.reference:8.1f} tok/s "
            f"= {c.ratio:6.3f}x{verdict}"
        )
    return out


def bench_deployment(
    project: Any,
    deployment: str | None = None,
    *,
    url: str | None = None,
    model: str | None = None,
    streams: Sequence[int] = (),
    max_tokens: int = 256,
    prompt_words: int = DEFAULT_PROMPT_WORDS,
    chat: bool = False,
    show_compare: bool = True,
    when: str | None = None,
    echo: Any = print,
) -> tuple[list[Summary], list[Comparison]]:
    """Benchmark a running deployment, append the result keyed by the lock hash, compare."""
    spec = project.load(deployment)
    lock_text = project.lock_path.read_text(encoding="utf-8") if project.lock_path.exists() else ""
    key = lock_key(lock_text, spec)
    url = url or base_url(spec)
    if model is None:
        with httpx.Client(timeout=10) as c:
            model = served_model(c, url)
    summaries = run(url, model, stream_counts(spec, streams), max_tokens, prompt_words, chat, echo)
    path = results_path(project.root)
    earlier = history(path, spec.name)
    stamp = when or datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    append(path, record(spec, key, url, model, max_tokens, summaries, stamp))
    echo(f"bench: appended to {path} (lock key {key})")
    comparisons = compare(spec, summaries, earlier, key)
    if show_compare:
        for line in comparison_lines(comparisons):
            echo(line)
    return summaries, comparisons
