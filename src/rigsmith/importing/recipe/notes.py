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
    return facts
