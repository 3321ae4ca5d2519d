"""Which processes hold a GPU after a deployment stopped, and whose they are (pure: parsed ``podman top`` and
``nvidia-smi`` output in, holders out). ``invoke down`` names the orphans with the command that reaps them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rigsmith.digits import ascii_digits
from rigsmith.operating import probes

#: Process names (nvidia-smi / cmdline) of vLLM engine processes: setproctitle names + the CLI.
ENGINE_PROCESS = re.compile(r"VLLM::|EngineCore|\bvllm\b|vllm\.entrypoints")


def top_argv(name: str) -> list[str]:
    return ["podman", "top", name, "hpid", "args"]


def parse_top(text: str) -> dict[int, str]:
    """``podman top NAME hpid args`` → host PID → command line."""
    out = {}
    for line in text.splitlines():
        pid, _, args = line.strip().partition(" ")
        if ascii_digits(pid):
            out[int(pid)] = args.strip()
    return out


def survivors(snapshot: Mapping[int, str], now: Mapping[int, str | None]) -> list[tuple[int, str]]:
    """Pure: container processes (host PID → args before stop) still alive with the same command line
    after the container is gone (``now``: PID → /proc cmdline with NULs as spaces, None if gone)."""
    return [
        (pid, args)
        for pid, args in sorted(snapshot.items())
        if now.get(pid) is not None and str(now[pid]).strip() == args
    ]


@dataclass(frozen=True)
class Holder:
    """A process still holding VRAM after down."""

    pid: int
    name: str
    gpu: str
    used_mib: int | None
    why: str  # "was in the container" | "vLLM engine process" | "foreign"


def classify_holders(
    apps: Sequence[probes.GpuApp], container_pids: set[int], cmdlines: Mapping[int, str]
) -> list[Holder]:
    """Pure: GPU processes → which belong to this deployment (orphans) and which are foreign."""
    out = []
    for a in apps:
        cmd = cmdlines.get(a.pid, "")
        if a.pid in container_pids:
            why = "was in the container"
        elif ENGINE_PROCESS.search(a.name) or ENGINE_PROCESS.search(cmd):
            why = "vLLM engine process"
        else:
            why = "foreign"
        out.append(Holder(a.pid, a.name, a.gpu_uuid, a.used_mib, why))
    return out


def reap_command(holders: Sequence[Holder]) -> str:
    """The command that ends the orphans: TERM, a grace, then KILL."""
    pids = " ".join(str(h.pid) for h in holders)
    return f"kill -TERM {pids}; sleep 10; kill -KILL {pids} 2>/dev/null"
