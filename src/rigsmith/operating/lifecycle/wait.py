"""``invoke wait``: follow the logs and ``/health`` until the recipe's readiness gates pass.

Gates (spec ``readiness``): every ``log_lines`` entry seen, ``GPU KV cache size: N tokens`` within the
tolerance of the recipe's number when it publishes one, and ``/health`` answering 200. The timeout derives
from the recipe's startup note (``startup_seconds``, the first-boot time): ``TIMEOUT_FACTOR`` × it. Known
fatal log lines end the wait early with the matching hint; on any failure the last log lines are shown.
"""

from __future__ import annotations

import queue
import re
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from rigsmith.errors import RigsmithError
from rigsmith.operating.host import LocalHost
from rigsmith.spec import Deployment

#: A first boot may take this many times the recipe's stated startup time before wait gives up.
TIMEOUT_FACTOR = 2.0
KV_RE = re.compile(r"GPU KV cache size: ([\d,]+) tokens")

#: Log text that means the engine will not come up, and what to do (seeds' pitfalls, anchors pain points).
FATAL: tuple[tuple[str, str], ...] = (
    (
        "Failed to infer device type",
        "the GPUs did not reach the container (CDI devices dropped or no NVML): `invoke doctor`, then check "
        "`podman inspect` devices (seeds/000 pitfall 1)",
    ),
    (
        "CUDA out of memory",
        "another process may hold VRAM: `invoke doctor` lists squatters (seeds/000 pitfall 3)",
    ),
    ("torch.OutOfMemoryError", "another process may hold VRAM: `invoke doctor` lists squatters"),
    (
        "less than desired GPU memory utilization",
        "free memory is below gpu-memory-utilization: stop other GPU processes (`invoke doctor`)",
    ),
    (
        "No available memory for the cache blocks",
        "the KV cache does not fit: check kv-cache-memory / max-model-len",
    ),
    ("Engine core initialization failed", "the engine crashed while loading; read the log above"),
    ("ncclShmOpen", "NCCL could not map shared memory: raise resources.shm_size"),
    ("Bus error", "shared memory exhausted: raise resources.shm_size"),
)


@dataclass
class Gates:
    """Pure readiness state, fed log lines and health results."""

    log_lines: tuple[str, ...]
    kv_expected: int | None = None
    kv_tolerance: float = 0.02
    seen: set[str] = field(default_factory=set)
    kv_seen: int | None = None
    healthy: bool = False
    fatal: tuple[str, str] | None = None  # (line, hint)

    @classmethod
    def from_spec(cls, spec: Deployment) -> Gates:
        r = spec.readiness
        return cls(r.log_lines, r.kv_cache_tokens, r.kv_cache_tolerance)

    def feed(self, line: str) -> None:
        """Take one log line."""
        for want in self.log_lines:
            if want in line:
                self.seen.add(want)
        m = KV_RE.search(line)
        if m:
            self.kv_seen = int(m.group(1).replace(",", ""))
        if self.fatal is None:
            for pattern, hint in FATAL:
                if pattern in line:
                    self.fatal = (line.strip(), hint)

    @property
    def kv_ok(self) -> bool | None:
        """None while unknown; True when no number is published or it is within tolerance."""
        if self.kv_expected is None:
            return True
        if self.kv_seen is None:
            return None
        return abs(self.kv_seen - self.kv_expected) <= self.kv_tolerance * self.kv_expected

    @property
    def passed(self) -> bool:
        return self.healthy and self.kv_ok is True and all(w in self.seen for w in self.log_lines)

    def failure(self) -> str | None:
        """Why the wait can stop now without success, if it can."""
        if self.fatal:
            return f"the engine logged a fatal error: {self.fatal[0]}"
        if self.kv_ok is False and self.kv_expected is not None and self.kv_seen is not None:
            return (
                f"GPU KV cache size is {self.kv_seen:,} tokens; the recipe says {self.kv_expected:,} "
                f"(±{self.kv_tolerance:.0%})"
            )
        return None

    def hint(self, ended: bool = False) -> str:
        """What to do after ``failure`` (or a timeout): only a slow first boot is helped by more time, and
        a container whose log ended (``ended``) is not booting at all."""
        if self.fatal:
            return self.fatal[1]
        if self.kv_ok is False:
            return (
                "the KV-cache gate failed, more time will not change it: vLLM sized its pool from the free "
                "VRAM, so check gpu-memory-utilization / kv-cache-memory, --max-model-len, --kv-cache-dtype, "
                "the GPUs' model and another process holding VRAM (`invoke doctor`); if this rig really "
                "differs from the recipe's, set readiness.kv_cache_tokens to what it logs"
            )
        if ended:
            return "the container stopped: the last log lines above say why; more time will not help"
        return "check the log (`invoke logs`); raise --timeout if the first boot is just slow"

    def progress(self) -> str:
        """One status line."""
        parts = [f"health {'ok' if self.healthy else 'no'}"]
        parts += [f"{w!r} {'seen' if w in self.seen else 'not yet'}" for w in self.log_lines]
        if self.kv_expected is not None:
            kv = (
                "not yet"
                if self.kv_seen is None
                else f"{self.kv_seen:,}" + (" ok" if self.kv_ok else " WRONG")
            )
            parts.append(f"KV cache {kv} (want {self.kv_expected:,})")
        return "; ".join(parts)


def timeout_for(spec: Deployment) -> float:
    """Seconds wait allows by default: TIMEOUT_FACTOR × the recipe's first-boot time."""
    return TIMEOUT_FACTOR * spec.readiness.startup_seconds


# -- log sources --------------------------------------------------------------------------------------


class LogFollower:
    """Lines of a log as they appear, from a command (``podman logs -f``) or a file, on a queue."""

    def __init__(
        self,
        argv: Sequence[str] | None = None,
        path: Path | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.lines: queue.Queue[str | None] = queue.Queue()
        self._stop = threading.Event()
        self._proc: subprocess.Popen[str] | None = None
        if argv is not None:
            self._proc = LocalHost(env or None).stream(argv)
            target: Callable[[], None] = self._pump_proc
        elif path is not None:
            self.path = path
            target = self._pump_file
        else:
            raise ValueError("give argv or path")
        self._thread = threading.Thread(target=target, daemon=True)
        self._thread.start()

    def _pump_proc(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self._proc.wait()
        self.lines.put(None)  # the log ended: the container (or `podman logs`) exited

    def _pump_file(self) -> None:
        while not self.path.exists():
            if self._stop.wait(0.1):
                return
        with self.path.open(encoding="utf-8", errors="replace") as fh:
            buf = ""
            while not self._stop.is_set():
                chunk = fh.readline()
                if not chunk:
                    self._stop.wait(0.05)
                    continue
                buf += chunk
                if buf.endswith("\n"):
                    self.lines.put(buf.rstrip("\n"))
                    buf = ""

    def close(self) -> None:
        self._stop.set()
        if self._proc and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(5)
            except subprocess.TimeoutExpired:
                self._proc.kill()


def http_health(url: str, timeout: float = 2.0) -> Callable[[], bool]:
    """A probe returning True when ``url`` answers 200."""
    client = httpx.Client(timeout=timeout)

    def probe() -> bool:
        try:
            return client.get(url).status_code == 200
        except httpx.HTTPError:
            return False

    return probe


def http_health_url(url: str) -> bool:
    """One-shot: True when ``url`` answers 200."""
    return http_health(url)()


@dataclass(frozen=True)
class WaitResult:
    """How the wait ended (success only; failures raise)."""

    seconds: float
    kv_seen: int | None
    lines: int


def wait(
    gates: Gates,
    logs: LogFollower,
    health: Callable[[], bool],
    *,
    timeout: float,
    echo: Callable[[str], None] = print,
    poll: float = 1.0,
    progress_every: float = 10.0,
    tail: int = 25,
) -> WaitResult:
    """Follow ``logs`` and poll ``health`` until the gates pass, a fatal line shows, or ``timeout``."""
    t0 = time.monotonic()
    last_lines: deque[str] = deque(maxlen=tail)
    n = 0
    ended = False
    next_health = t0
    next_progress = t0 + progress_every
    shown = ""
    try:
        while True:
            now = time.monotonic()
            if now >= next_health:
                gates.healthy = health()
                next_health = now + poll
            status = gates.progress()
            if status != shown or now >= next_progress:
                echo(f"wait {now - t0:5.0f}s/{timeout:.0f}s  {status}")
                shown, next_progress = status, now + progress_every
            if gates.passed:
                return WaitResult(now - t0, gates.kv_seen, n)
            why = gates.failure()
            if why is None and ended and not gates.healthy:
                why = "the log ended (the container exited) before the gates passed"
            if why is None and now - t0 > timeout:
                why = f"not ready after {timeout:.0f}s ({status})"
            if why:
                raise RigsmithError(
                    why + "\n  last log lines:\n" + "\n".join(f"  | {ln}" for ln in last_lines),
                    hint=gates.hint(ended and not gates.healthy),
                )
            try:
                line = logs.lines.get(timeout=min(poll, 0.2))
            except queue.Empty:
                continue
            while True:
                if line is None:
                    ended = True
                else:
                    n += 1
                    last_lines.append(line)
                    gates.feed(line)
                try:
                    line = logs.lines.get_nowait()
                except queue.Empty:
                    break
    finally:
        logs.close()
