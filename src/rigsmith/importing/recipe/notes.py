"""Facts the notes state in prose (Hub repo, size, GPUs, shm, memlock, stop grace, readiness, patches)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rigsmith import spec as specmod
from rigsmith.importing.recipe.tables import _SIZE_UNITS, GPUS, NOTE_FACTS

# -- notes -------------------------------------------------------------------------------------------


@dataclass
class NoteFacts:
    """What ``NOTE_FACTS`` found in the recipe notes."""

    repo: str | None = None
    revision: str | None = None
    local_dir: str | None = None
    size_bytes: int | None = None
    gpu_count: int | None = None
    gpu_model: str | None = None
    gpu_arch: str | None = None
    p2p: str | None = None
    nvlink: bool | None = None
    host_ram_gib: float | None = None
    disk_gib: float | None = None
    shm_size: str | None = None
    memlock: str | int | None = None
    stop_grace: int | None = None
    log_lines: list[str] = field(default_factory=list)
    kv_tokens: int | None = None
    startup: int | None = None
    warm: int | None = None
    patches: list[specmod.ConfigPatch] = field(default_factory=list)
    #: Files the notes create (``truncate -s``, ``fallocate -l``, ``dd of=``, ``touch``): path → size in
    #: bytes (None when the command gives none), with the command as written, in ``file_commands``.
    files: dict[str, int | None] = field(default_factory=dict)
    file_commands: dict[str, str] = field(default_factory=dict)


def _upper_minutes(m: re.Match[str]) -> int:
    return int(m.group("hi") or m.group("lo")) * 60


def _note_value(raw: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw


_FACT_READERS: Mapping[str, Callable[[NoteFacts, re.Match[str]], None]] = {
    "download": lambda f, m: _download(f, m),
    "gpus": lambda f, m: _gpu_fact(f, m),
    "p2p": lambda f, m: setattr(f, "p2p", m.group("p2p").lower()),
    "no_nvlink": lambda f, m: setattr(f, "nvlink", False),
    "host_ram": lambda f, m: setattr(f, "host_ram_gib", float(m.group("gb"))),
    "disk": lambda f, m: setattr(f, "disk_gib", float(m.group("gb"))),
    "shm": lambda f, m: setattr(f, "shm_size", m.group("size").lower()),
    "memlock": lambda f, m: setattr(
        f, "memlock", "unlimited" if m.group("memlock") in ("-1", "unlimited") else int(m.group("memlock"))
    ),
    "stop_grace": lambda f, m: setattr(f, "stop_grace", int(m.group("seconds"))),
    "ready": lambda f, m: f.log_lines.extend(re.findall(r"'([^']+)'", m.group("lines"))),
    "kv_tokens": lambda f, m: setattr(f, "kv_tokens", int(m.group("tokens").replace(",", ""))),
    "startup": lambda f, m: setattr(f, "startup", _upper_minutes(m)),
    "warm": lambda f, m: setattr(f, "warm", _upper_minutes(m)),
    "patch": lambda f, m: f.patches.append(
        specmod.ConfigPatch(
            key=f"{m.group('parent')}.{m.group('key')}",
            value=_note_value(m.group("value")),
            note=m.group("note"),
        )
    ),
}


def _download(f: NoteFacts, m: re.Match[str]) -> None:
    f.repo, f.revision, f.local_dir = m.group("repo"), m.group("rev") or m.group("rev2"), m.group("dir")
    if m.group("size"):
        f.size_bytes = int(float(m.group("size")) * _SIZE_UNITS[m.group("unit").upper()])


def _gpu_fact(f: NoteFacts, m: re.Match[str]) -> None:
    f.gpu_count, f.gpu_model = int(m.group("count")), m.group("model")
    f.gpu_arch = m.group("arch") or GPUS.get(f.gpu_model, (0.0, None))[1]


#: A coreutils size (truncate -s, fallocate -l, dd's bs=/seek=/count=): K, M, G, T are powers of 1024 (KiB
#: too), KB, MB, GB, TB powers of 1000.
_COREUTILS_SIZE_RE = re.compile(r"(\d+)([KMGT](?:i?B)?)?", re.IGNORECASE)
#: A path word in prose: not a flag, ends at whitespace, a quote, a closing paren or sentence punctuation.
_PATH = r"(?P<path>[^\s'\"`()-][^\s'\"`()]*?)(?=[.,;:)]?(?:\s|$|['\"`]))"
_FILE_COMMAND_RES = (
    re.compile(r"\btruncate\s+(?:-s\s*|--size[= ])(?P<size>\d+[A-Za-z]*)\s+" + _PATH),
    re.compile(r"\bfallocate\s+(?:-l\s*|--length[= ])(?P<size>\d+[A-Za-z]*)\s+" + _PATH),
    re.compile(r"\bdd\s+(?P<ops>(?:[a-z]+=\S+\s+)*?)of=" + _PATH + r"(?P<rest>(?:\s+[a-z]+=\S+)*)"),
    re.compile(r"\btouch\s+" + _PATH),
)


def coreutils_size(text: str) -> int | None:
    """Bytes in ``text`` as truncate/fallocate/dd read it, or None."""
    m = _COREUTILS_SIZE_RE.fullmatch(text.strip())
    if not m:
        return None
    unit = (m.group(2) or "").upper()
    power = 1000 if unit.endswith("B") and "I" not in unit else 1024
    exponent = " KMGT".index(unit[0]) if unit else 0
    return int(m.group(1)) * int(power**exponent)


def _dd_size(ops: str) -> int | None:
    """``dd``'s output size from ``bs=``/``seek=``/``count=`` (``count=0 seek=N``: a sparse N blocks)."""
    kv = dict(op.split("=", 1) for op in ops.split() if "=" in op)
    bs = coreutils_size(kv.get("bs", "512"))
    seek = coreutils_size(kv.get("seek", "0"))
    count = coreutils_size(kv["count"]) if "count" in kv else None
    if bs is None or seek is None or count is None:
        return None
    return bs * (seek + count)


def file_facts(text: str, facts: NoteFacts) -> None:
    """The files the notes create, by path, into ``facts`` (the first command per path wins)."""
    for pattern in _FILE_COMMAND_RES:
        for m in pattern.finditer(text):
            path = m.group("path")
            groups = m.groupdict()
            if groups.get("size") is not None:
                size = coreutils_size(groups["size"])
            elif groups.get("ops") is not None:
                size = _dd_size(f"{groups['ops']} {groups['rest']}")
            else:
                size = None
            facts.files.setdefault(path, size)
            facts.file_commands.setdefault(path, m.group(0))


def note_facts(text: str) -> NoteFacts:
    """Read the structural facts out of recipe notes (first match of each pattern wins)."""
    facts = NoteFacts()
    for key, pattern in NOTE_FACTS:
        if key == "patch":
            for m in pattern.finditer(text):
                _FACT_READERS[key](facts, m)
            continue
        found = pattern.search(text)
        if found:
            _FACT_READERS[key](facts, found)
    file_facts(text, facts)
    return facts
