"""Parsers for the parity matrix: what each real consumer produced, reduced to the same facts.

Test helpers only (pure): a systemd command-line splitter for quadlet's ExecStart, and a `podman run/create`
argv reader.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from rigsmith.rendering.plan import RunPlan

_C = {
    "n": "\n",
    "t": "\t",
    "r": "\r",
    "a": "\a",
    "b": "\b",
    "f": "\f",
    "v": "\v",
    "\\": "\\",
    '"': '"',
    "'": "'",
    "s": " ",
    ";": ";",
}


def split_systemd(line: str, home: str = "~") -> list[str]:
    """Split a systemd ExecStart= value into argv as systemd runs it (quotes, C escapes, %% and $$)."""
    words: list[str] = []
    i, n = 0, len(line)
    while i < n:
        while i < n and line[i] in " \t":
            i += 1
        if i >= n:
            break
        word: list[str] = []
        quote: str | None = None
        while i < n:
            ch = line[i]
            if quote is None and ch in " \t":
                break
            if ch in "\"'" and (quote is None or quote == ch):
                quote = None if quote else ch
                i += 1
                continue
            if ch == "\\" and i + 1 < n:
                nxt = line[i + 1]
                if nxt in "xuU":
                    width = {"x": 2, "u": 4, "U": 8}[nxt]
                    word.append(chr(int(line[i + 2 : i + 2 + width], 16)))
                    i += 2 + width
                    continue
                word.append(_C.get(nxt, nxt))
                i += 2
                continue
            if ch == "%" and i + 1 < n:
                nxt = line[i + 1]
                word.append("%" if nxt == "%" else (home if nxt == "h" else "%" + nxt))
                i += 2
                continue
            if ch == "$" and i + 1 < n and line[i + 1] == "$":
                word.append("$")
                i += 2
                continue
            word.append(ch)
            i += 1
        words.append("".join(word))
    return words


#: podman run options that take a value (the ones rigsmith's consumers emit).
_VALUED = {
    "--name",
    "--shm-size",
    "--pull",
    "--ulimit",
    "--network",
    "--net",
    "--device",
    "-v",
    "--volume",
    "--env",
    "-e",
    "--label",
    "--entrypoint",
    "--stop-timeout",
    "--health-cmd",
    "--health-interval",
    "--health-timeout",
    "--health-retries",
    "--health-start-period",
    "--secret",
    "--cidfile",
    "--cgroups",
    "--sdnotify",
    "--network-alias",
    "--pod",
    "--requires",
    "--security-opt",
    "--healthcheck-command",
    "--healthcheck-interval",
    "--healthcheck-timeout",
    "--healthcheck-retries",
    "--healthcheck-start-period",
}


@dataclass
class Facts:
    """What a target carries, in comparable form."""

    devices: list[str] = field(default_factory=list)
    shm: str | None = None
    memlock: str | None = None
    stop_timeout: int | None = None
    env: dict[str, str] = field(default_factory=dict)
    mounts: list[tuple[str, str, bool]] = field(default_factory=list)
    entrypoint: str | None = None
    command: list[str] = field(default_factory=list)
    image: str | None = None
    init: bool = False
    network: str | None = None


def _norm_home(path: str, home: str) -> str:
    for prefix in (home.rstrip("/") + "/", "${HOME}/", "%h/"):
        if path.startswith(prefix):
            return "~/" + path[len(prefix) :]
    return path


def podman_facts(argv: list[str], home: str = "/root") -> Facts:
    """Facts from a `podman run|create …` argv (leading words up to `run`/`create` are skipped)."""
    i = next(k for k, a in enumerate(argv) if a in ("run", "create")) + 1
    f = Facts()
    while i < len(argv):
        a = argv[i]
        if not a.startswith("-"):
            f.image = a
            f.command = argv[i + 1 :]
            break
        if "=" in a and a.split("=", 1)[0] in _VALUED:
            key, value = a.split("=", 1)
            i += 1
        elif a in _VALUED:
            key, value = a, argv[i + 1]
            i += 2
        else:
            key, value = a, ""
            i += 1
        if key == "--device":
            f.devices.append(value)
        elif key == "--shm-size":
            f.shm = value
        elif key == "--ulimit" and value.startswith("memlock="):
            f.memlock = value
        elif key == "--stop-timeout":
            f.stop_timeout = int(value)
        elif key in ("--env", "-e"):
            k, _, v = value.partition("=")
            f.env[k] = v
        elif key in ("-v", "--volume"):
            parts = value.split(":")
            f.mounts.append((_norm_home(parts[0], home), parts[1], "ro" in parts[2:]))
        elif key == "--entrypoint":
            f.entrypoint = value.strip('[]"') if value.startswith('["') else value
        elif key == "--init":
            f.init = True
        elif key in ("--network", "--net"):
            f.network = value
    return f


def plan_facts(plan: RunPlan) -> Facts:
    """What every target must carry, from the RunPlan."""
    return Facts(
        devices=list(plan.devices),
        shm=plan.shm_size,
        memlock=plan.memlock_ulimit,
        stop_timeout=plan.stop_timeout,
        env=dict(plan.env),
        mounts=[(m.host, m.container, m.readonly) for m in plan.mounts],
        entrypoint=plan.entrypoint,
        command=list(plan.command),
        image=plan.image,
        init=True,
        network=plan.network_mode,
    )


def exec_start(service_text: str) -> str:
    """The ExecStart= value of a generated service."""
    m = re.search(r"^ExecStart=(.*)$", service_text, re.MULTILINE)
    assert m, service_text
    return m.group(1)


def ini_values(text: str, section: str, key: str) -> list[str]:
    """All values of key in [section] of a systemd-style file."""
    out, current = [], None
    for line in text.splitlines():
        if line.startswith("["):
            current = line.strip("[]")
        elif current == section and line.startswith(key + "="):
            out.append(line.split("=", 1)[1])
    return out
