"""vLLM flag values in the argv: canonical names, JSON and number checks."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from rigsmith import policy
from rigsmith import spec as specmod
from rigsmith.importing import vllmflags
from rigsmith.importing.recipe.tables import JSON_FLAGS

# -- flags -------------------------------------------------------------------------------------------


def canonical_flag(token: str) -> str | None:
    """The canonical name of the vLLM flag (:mod:`rigsmith.importing.vllmflags`) ``token`` spells."""
    flag = vllmflags.lookup(token)
    return None if flag is None else flag.name


def flag_values(args: Sequence[str], canon: str) -> list[tuple[int, str]]:
    """Every (index of the value, value) given for ``canon`` in ``args``."""
    out = []
    for i, a in enumerate(args):
        if canonical_flag(a) != canon:
            continue
        if "=" in a:
            out.append((i, a.split("=", 1)[1]))
        elif i + 1 < len(args):
            out.append((i + 1, args[i + 1]))
    return out


def _json_problems(args: Sequence[str], notes: list[str]) -> list[str]:
    out = []
    for i, a in enumerate(args):
        name, eq, val = a.partition("=")
        flag = name.replace("_", "-") if name.startswith("--") else name
        if flag not in JSON_FLAGS:
            continue
        if not eq:
            if i + 1 >= len(args):
                out.append(f"args[{i}]: {a} needs a JSON value")
                continue
            val = args[i + 1]
        try:
            json.loads(val)
        except ValueError as err:
            if _LEGACY_KV_RE.fullmatch(val):
                # vLLM ≤ 0.8 took `k=v,k=v` here; rigsmith does not know the engine's version: pass it on.
                notes.append(
                    f"{flag} {val}: the key=value form of older vLLM releases (newer ones want JSON such as "
                    f"{json.dumps(_legacy_kv(val))}); passed through literally — check your engine's version"
                )
            else:
                out.append(f"{flag} takes JSON, but its value is not valid JSON ({err}): {val}")
    return out


_LEGACY_KV_RE = re.compile(r"[A-Za-z_][\w.-]*=[^,=]+(,[A-Za-z_][\w.-]*=[^,=]+)*")


def _legacy_kv(val: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in val.split(","):
        k, _, v = pair.partition("=")
        n = specmod.ascii_int(v)
        out[k] = n if n is not None else v
    return out


_NUMBER_FLAGS = vllmflags.NUMBER_FLAGS


def _number_problems(args: Sequence[str]) -> list[str]:
    """Numbers written in non-ASCII digits (``-tp ²``, ``--port ٨٠``): vLLM refuses them, and ``int()``
    would read some and crash on others, so the import refuses them naming the flag."""
    out = []
    for i, a in enumerate(args):
        flag = canonical_flag(a) or policy.vllm_flag_name(a)
        if flag not in _NUMBER_FLAGS:
            continue
        _, eq, value = a.partition("=")
        if not eq:
            value = args[i + 1] if i + 1 < len(args) else ""
        if any(not ch.isascii() and (ch.isdigit() or ch.isnumeric()) for ch in value):
            out.append(
                f"args[{i}]: {flag} {value!r} is not a whole number in ASCII digits (0-9), which vLLM "
                "needs; write it with 0-9"
            )
    return out
