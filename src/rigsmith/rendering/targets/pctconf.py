"""A Proxmox CT config the user owns, with rigsmith's settings merged in (``deploy --lxc-config FILE``).

Ownership is data. rigsmith owns only what it renders for the deployment, each setting with an identity:
GPU ``devN`` lines (by device path), the ``mpN`` it adds (by mount point), ``lxc.prlimit.memlock``, the
``lxc.mount.entry`` lines it adds (by target: the sized /dev/shm, sparse files, raw GPU nodes on PVE < 8.1),
the ``lxc.hook.pre-start`` file check before each file mount (by path),
``lxc.environment`` (by variable), raw ``lxc.cgroup2.devices.allow`` lines, single ``features`` flags
(``keyctl``, ``nesting``) and the ``up=``/``down=`` parts of ``startup``. Everything else — ``rootfs``,
``hostname``, ``cores``, ``memory``, ``swap``, ``net*``, ``ostype``, ``arch``, ``unprivileged``, idmap lines,
the user's own mount points, the leading comments PVE shows as the CT's notes, snapshot sections — stays
byte for byte. A line whose owned value does not change is not rewritten.

Updates are three-way (:mod:`rigsmith.merge`) against the owned settings rigsmith wrote last (the base,
kept beside the output; ignored for a file that holds none of rigsmith's lines, i.e. one that never took
the last merge): a setting the user changed stays theirs, a setting only the render changed is
updated, a setting both changed is a conflict that needs ``--ours``/``--theirs``. GPU passthrough the user
set up in another form (raw ``lxc.mount.entry /dev/nvidia*``, ``lxc.cgroup2.devices.allow c 195:*``) is
replaced only with consent, never doubled.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from rigsmith.errors import RigsmithError
from rigsmith.merge import MISSING, Conflict, Resolve, merge3

#: ``key: value`` (PVE) or ``key = value``; a line that does not match is kept as it is.
KEY_RE = re.compile(r"^(lxc\.[a-z0-9_.\-]+|[a-z][a-z_]*\d*)\s*(?::|=)\s*(.*?)\s*$")
#: Keys whose value is a comma list rigsmith owns only parts of: key → the parts it may own.
PARTIAL = {"features": ("keyctl", "nesting"), "startup": ("up", "down")}
#: Indexed keys rigsmith adds with the next free index (PVE allows 0..255).
INDEXED = ("mp", "dev")
MAX_INDEX = 256
#: A GPU passed through by raw liblxc keys: nvidia device binds and the nvidia char-major allow lines.
_RAW_NVIDIA_BIND = re.compile(r"^/dev/nvidia\S*\s")
_RAW_NVIDIA_ALLOW = re.compile(r"^c\s+195:")


def identity(key: str, value: str) -> str | None:
    """The setting a line is, for the keys rigsmith may own (None for keys it never owns). ``mp``/``dev``
    with or without their index: the same mount point or device is the same setting."""
    base = re.sub(r"\d+$", "", key)
    if base == "mp":
        m = re.search(r"(?:^|,)mp=([^,]+)", value)
        return f"mp {m.group(1) if m else value}"
    if base == "dev":
        return f"dev {value.split(',', 1)[0].removeprefix('path=')}"
    if key == "lxc.mount.entry":
        fields = value.split()
        return f"{key} {fields[1] if len(fields) > 1 else value}"
    if key == "lxc.environment":
        return f"{key} {value.split('=', 1)[0]}"
    hook = re.search(r"\srigsmith-file-check\s+(\S+)", value) if key == "lxc.hook.pre-start" else None
    if hook:  # the file check of one file mount (a user's own hooks are theirs)
        return f"{key} {hook.group(1)}"
    if key == "lxc.cgroup2.devices.allow":
        return f"{key} {value}"
    if key == "lxc.prlimit.memlock":
        return key
    return None


def _parts(value: str) -> list[tuple[str, str]]:
    """``a=1,b=2`` → [(a, 1), (b, 2)]; a part without ``=`` (startup's bare order) is not a named part."""
    return [(k, v) for k, eq, v in (p.partition("=") for p in value.split(",") if p) if eq]


def owned(lines: Iterable[tuple[str, str]]) -> dict[str, str]:
    """rigsmith's settings (key, value as rendered, mp/dev without index) as identity → ``key: value``."""
    out: dict[str, str] = {}
    for key, value in lines:
        if key in PARTIAL:
            for k, v in _parts(value):
                if k in PARTIAL[key]:
                    out[f"{key}.{k}"] = v
            continue
        ident = identity(key, value)
        if ident is not None:
            out[ident] = f"{key}: {value}"
    return out


def _current(main: Sequence[str], ids: set[str]) -> dict[str, str]:
    """The user's values for the identities rigsmith owns (same shape as :func:`owned`)."""
    out: dict[str, str] = {}
    for ln in main:
        m = KEY_RE.match(ln)
        if not m or ln.lstrip().startswith("#"):
            continue
        key, value = m.groups()
        if key in PARTIAL:
            out |= {f"{key}.{k}": v for k, v in _parts(value) if f"{key}.{k}" in ids}
            continue
        ident = identity(key, value)
        if ident in ids:
            base = re.sub(r"\d+$", "", key)
            out[ident] = f"{base if base in INDEXED else key}: {value}"
    return out


def foreign_passthrough(main: Sequence[str], ids: set[str]) -> list[str]:
    """User lines passing NVIDIA GPUs in a form rigsmith does not render now (kept, they would double)."""
    found = []
    for ln in main:
        m = KEY_RE.match(ln)
        if not m or ln.lstrip().startswith("#"):
            continue
        key, value = m.groups()
        ident = identity(key, value)
        if ident in ids:
            continue
        raw_bind = key == "lxc.mount.entry" and _RAW_NVIDIA_BIND.match(value + " ")
        raw_allow = key == "lxc.cgroup2.devices.allow" and _RAW_NVIDIA_ALLOW.match(value)
        dev = re.fullmatch(r"dev\d+", key) and "/dev/nvidia" in value
        if raw_bind or raw_allow or dev:
            found.append(ln)
    return found


@dataclass(frozen=True)
class Merged:
    """The merged file, the base to record, and what the caller must report (conflicts, passthrough)."""

    text: str
    base: str
    conflicts: tuple[Conflict, ...] = ()
    passthrough: tuple[str, ...] = ()


def _split(text: str) -> tuple[list[str], list[str]]:
    lines = text.splitlines()
    cut = next((i for i, ln in enumerate(lines) if ln.startswith("[")), len(lines))
    return lines[:cut], lines[cut:]


def _rebuild_partial(key: str, value: str, merged: dict[str, str], ids: set[str]) -> str:
    """``key``'s comma list with the parts rigsmith owns set as merged; the user's other parts as they are."""
    out: list[str] = []
    have: set[str] = set()
    for part in (p for p in value.split(",") if p):
        k, eq, _ = part.partition("=")
        sub = f"{key}.{k}"
        if eq and sub in ids:
            have.add(k)
            if sub in merged:
                out.append(f"{k}={merged[sub]}")  # else: rendered before, no longer: dropped
        else:
            out.append(part)
    out += [f"{k}={merged[f'{key}.{k}']}" for k in PARTIAL[key] if k not in have and f"{key}.{k}" in merged]
    return ",".join(out)


def merge_conf(
    existing: str,
    ours: Sequence[tuple[str, str]],
    base: str | None,
    *,
    resolve: Resolve | None = None,
    replace_passthrough: bool = False,
) -> Merged:
    """Merge rigsmith's settings ``ours`` into the user's pct.conf ``existing`` (see the module doc).

    Args:
        existing: the user's file.
        ours: rigsmith's settings in order (``mp``/``dev`` keys without index).
        base: what :attr:`Merged.base` was after the last merge (None: no record).
        resolve: how conflicts are settled (they are reported either way).
        replace_passthrough: drop the user's GPU passthrough in another form (consent given).
    """
    main, rest = _split(existing)
    theirs = owned(ours)
    recorded: dict[str, str] | None = json.loads(base) if base else None
    ids = set(theirs) | set(recorded or {})
    mine = _current(main, ids)
    if recorded and not any(i in mine for i in recorded if i.split(".", 1)[0] not in PARTIAL):
        # None of rigsmith's lines is in this file: it never held the last merge (the user handed in the
        # original again), so the record says nothing about the user's intent here.
        recorded = None
    result = merge3(recorded, mine, theirs, resolve=resolve)
    merged: dict[str, str] = result.value
    gpus = any("/dev/nvidia" in i or "dev/nvidia" in i for i in theirs)
    foreign = foreign_passthrough(main, ids) if gpus else []
    drop = set(foreign) if replace_passthrough else set()
    kept, seen, used = _kept_lines(main, drop, merged, mine, ids)
    added = _added_lines(merged, seen, used)
    while kept and not kept[-1].strip():
        kept.pop()
    body = [*kept, *added]
    if rest:
        body += ["", *rest]
    return Merged(
        text="\n".join(body) + "\n",
        base=json.dumps(theirs, indent=1, sort_keys=True) + "\n",
        conflicts=result.conflicts,
        passthrough=tuple(foreign),
    )


def _kept_lines(
    main: Sequence[str], drop: set[str], merged: dict[str, str], mine: dict[str, str], ids: set[str]
) -> tuple[list[str], set[str], dict[str, set[int]]]:
    """The user's lines in order, each owned one as merged (dropped when rigsmith no longer renders it, or
    in ``drop``); the owned identities seen, and the ``mp``/``dev`` indexes in use."""
    kept: list[str] = []
    used: dict[str, set[int]] = {k: set() for k in INDEXED}
    seen: set[str] = set()
    for ln in main:
        m = KEY_RE.match(ln)
        if ln in drop:
            continue
        if not m or ln.lstrip().startswith("#"):
            kept.append(ln)
            continue
        key, value = m.groups()
        idx = re.fullmatch(r"(mp|dev)(\d+)", key)
        if idx:
            used[idx.group(1)].add(int(idx.group(2)))
        if key in PARTIAL:
            new = _rebuild_partial(key, value, merged, ids)
            seen |= {f"{key}.{k}" for k in PARTIAL[key]}
            kept.append(ln if new == value else f"{key}: {new}")
            continue
        ident = identity(key, value)
        if ident not in ids:
            kept.append(ln)
            continue
        seen.add(ident)
        want = merged.get(ident, MISSING)
        if want is MISSING:
            continue  # rigsmith rendered it before and no longer does
        have = mine.get(ident)
        kept.append(ln if want == have else f"{key}: {want.split(': ', 1)[1]}")
    return kept, seen, used


def _added_lines(merged: dict[str, str], seen: set[str], used: dict[str, set[int]]) -> list[str]:
    """The merged settings no line of the file holds yet: partial keys' missing parts, then each new setting
    (``mp``/``dev`` at the next free index)."""
    added: list[str] = []
    for key in PARTIAL:
        missing_parts = {k: v for k, v in merged.items() if k.startswith(f"{key}.") and k not in seen}
        if missing_parts:
            added.append(f"{key}: " + ",".join(f"{k.split('.', 1)[1]}={v}" for k, v in missing_parts.items()))
    for ident, line in merged.items():
        if ident in seen or ident.split(".", 1)[0] in PARTIAL:
            continue
        key, value = line.split(": ", 1)
        if key in INDEXED:
            n = next((i for i in range(MAX_INDEX) if i not in used[key]), None)
            if n is None:
                raise RigsmithError(
                    f"the CT config uses every {key}N index ({key}0..{key}{MAX_INDEX - 1}); none is free for "
                    f"{value}",
                    hint=f"remove {key}N lines the CT no longer needs",
                )
            used[key].add(n)
            key = f"{key}{n}"
        added.append(f"{key}: {value}")
    return added
