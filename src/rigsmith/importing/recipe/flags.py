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


def value_problems(args: Sequence[str], notes: list[str]) -> list[str]:
    """Every flag value vLLM would refuse: missing, not JSON where JSON is due, not a whole number."""
    return _missing_values(args) + _json_problems(args, notes) + _number_problems(args)


def _missing_values(args: Sequence[str]) -> list[str]:
    """A flag that takes a value followed by nothing or by an option (``--model --trust-remote-code``, what
    an empty variable leaves behind): vLLM's argparse stops there with "expected one argument", so the
    import would hand on a command that never runs (and read the option as the value)."""
    out = []
    for i, a in enumerate(args):
        flag = vllmflags.lookup(a)
        if flag is None or flag.kind not in ("value", "json") or "=" in a:
            continue
        if i + 1 < len(args) and not vllmflags.is_option(args[i + 1]):
            continue
        after = f"the option {args[i + 1]!r} follows it" if i + 1 < len(args) else "nothing follows it"
        out.append(
            f"args[{i}]: {a} takes a value, but {after} (an empty variable in the text?), so vLLM stops "
            "with 'expected one argument'; write its value"
        )
    return out


_NUMBER_FLAGS = vllmflags.NUMBER_FLAGS


def _number_problems(args: Sequence[str]) -> list[str]:
    """A whole-number flag (vllmflags ``number``) given anything else — a word (``--tensor-parallel-size
    Your_GPU_number``), a fraction, a sign, digits of another script (``-tp ²``, ``--port ٨٠``, which
    ``int()`` reads and vLLM's parser does not all take): refused naming the flag, since the import would
    otherwise hand vLLM an argument it refuses, or count GPUs from a guess. A placeholder (``<TP>``) is the
    user's to fill, and shell syntax is kept literally with its own note."""
    out = []
    for i, a in enumerate(args):
        flag = canonical_flag(a) or policy.vllm_flag_name(a)
        if flag not in _NUMBER_FLAGS:
            continue
        _, eq, value = a.partition("=")
        if not eq:
            if i + 1 >= len(args) or vllmflags.is_option(args[i + 1]):
                continue  # no value at all: _missing_values says so
            value = args[i + 1]
        if specmod.ascii_int(value) is not None or specmod.PLACEHOLDER_RE.fullmatch(value):
            continue
        if "$" in value or "`" in value:
            continue
        out.append(
            f"args[{i}]: {flag} takes a whole number written in ASCII digits (0-9), and the recipe gives "
            f"it {value!r}; write the number you run"
        )
    return out
