"""What every section of the spec is built from: the frozen base model, the patterns its values must match
(names, Hub repo ids, placeholders, CDI names, sizes) and the small parsers that read them."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Literal

from pydantic import AfterValidator, BaseModel, ConfigDict

SPEC_VERSION: Literal[1] = 1


#: A Hugging Face Hub repo id, owner/name.
HUB_REPO_RE = r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*"
#: A placeholder token in a recipe value: ``<repo>``, ``<vllm tree>``, ``<n_of_tokens>``, ``<1>`` ($1).
PLACEHOLDER_RE = re.compile(r"<(?:[A-Za-z_][A-Za-z0-9_ .-]*|[1-9][0-9]*)>")
# Anchored with \Z, not $: `$` also matches before a trailing newline, and targets write these bare.
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
#: ``$NAME`` or ``${NAME}``: a value read from the host's variable NAME.
HOST_REF_RE = re.compile(r"^\$(?:([A-Za-z_][A-Za-z0-9_]*)|\{([A-Za-z_][A-Za-z0-9_]*)\})\Z")
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}\Z")
SIZE_RE = re.compile(r"^(\d+(?:\.\d+)?)([kmgt]?)(i?b?)\Z", re.IGNORECASE | re.ASCII)
CDI_RE = re.compile(r"^[a-z0-9.-]+/[A-Za-z0-9_.-]+=[A-Za-z0-9_.:-]+\Z")
SHA1_RE = re.compile(r"^[0-9a-f]{40}\Z")
_ASCII_INT_RE = re.compile(r"[0-9]+\Z")
#: Most GPUs one node gives a container. The largest nodes sold carry 8-16; 64 leaves room for any real
#: machine while a recipe's ``--gpus 3000000`` cannot make every target write three million CDI names.
MAX_GPUS = 64


def hub_repo_id(v: str) -> bool:
    """``v`` is a repo id the Hub accepts, ``owner/name``: ``HUB_REPO_RE`` plus the rules of
    huggingface_hub's ``validate_repo_id`` (no ``--`` or ``..``, no ``.git`` or ``.``/``-`` at the end of
    a part, at most 96 characters a part), so what passes here is never refused later by the Hub client."""
    parts = v.split("/")
    return (
        re.fullmatch(HUB_REPO_RE, v) is not None
        and "--" not in v
        and ".." not in v
        and not v.endswith(".git")
        and all(len(p) <= 96 and not p.endswith((".", "-")) for p in parts)
    )


def repeated(values: Iterable[str]) -> list[str]:
    """The values that stand more than once, sorted (each named once)."""
    seen = list(values)
    return sorted({v for v in seen if seen.count(v) > 1})


def ascii_int(text: str) -> int | None:
    """``text`` as a non-negative whole number written in ASCII digits, else None.

    ``int()`` accepts other scripts' digits (``²``, ``٣``), which vLLM, podman and
    shells do not; every count or port read from a recipe or spec goes through here.
    """
    return int(text) if _ASCII_INT_RE.match(text) else None


def parse_size(text: str) -> int:
    """Bytes in a podman-style size (``8g``, ``1GB``, ``512m``, ``102400491520``); binary units."""
    m = SIZE_RE.match(text)
    if not m:
        raise ValueError(f"{text!r} is not a size; write it like 8g, 512m or a byte count")
    num, unit = float(m.group(1)), m.group(2).lower()
    return int(num * 1024 ** "_kmgt".index(unit)) if unit else int(num)


def container_abs(v: str) -> str:
    """``v`` when it is an absolute container path, else ValueError."""
    if not v.startswith("/"):
        raise ValueError("must be an absolute path inside the container")
    return v


class Frozen(BaseModel):
    """Base of every spec model: immutable, no unknown keys."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


def matching(pattern: re.Pattern[str], problem: str) -> AfterValidator:
    """A string ``pattern`` matches; else ``problem`` (``{v!r}`` is the value) is the error."""

    def check(v: str) -> str:
        if not pattern.match(v):
            raise ValueError(problem.format(v=v))
        return v

    return AfterValidator(check)


def cdi_names(v: tuple[str, ...]) -> tuple[str, ...]:
    """``v`` when every entry is a fully qualified CDI name, else ValueError naming the others."""
    bad = [d for d in v if not CDI_RE.match(d)]
    if bad:
        raise ValueError(f"{bad} are not CDI names; write vendor.com/class=name, e.g. nvidia.com/gpu=0")
    return v
