"""The rig fit sizes against when it is not this host's: idle cards of the sizes ``--vram-gib`` lists (one
size per card, ``24,24,12``; one size for ``--gpus N`` cards), or a ``--rig FILE`` for a rig you do not have
yet (every card with its total and free memory, what holds the rest, and the pairs that talk P2P). Pure:
text in, ``propose.Card``s out; every bad value is one RigsmithError naming the field.

A rig file::

    cards:                      # in the order nvidia-smi numbers them (GPU0 first)
      - name: RTX 3090
        total_gib: 24
        free_gib: 23.75         # optional (default: total); the rest is held by something else
        held_by: ComfyUI        # optional: what holds it (named where it costs headroom)
      - {name: RTX 3060, total_gib: 12}
    links: [[0, 1]]             # optional: card pairs with P2P (NVLink, or one PCIe switch); absent:
                                # unknown, every pair counts as close; [] : no pair has P2P
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from rigsmith.errors import RigsmithError, shown
from rigsmith.resolving.fit.fit import GiB
from rigsmith.resolving.fit.propose import Card
from rigsmith.yamldoc import load_yaml, yaml_problem

#: The most cards a planned rig may list (the layout search visits every subset of them).
MAX_CARDS = 16
RIG_HINT = "a rig file lists cards: [{name: RTX 3090, total_gib: 24, free_gib: 23.5}, …] and links: [[0, 1]]"


@dataclass(frozen=True)
class Planned:
    """A rig named on the command line: its cards (nvidia-smi order) and P2P pairs (None: unknown)."""

    cards: tuple[Card, ...]
    close: frozenset[tuple[int, int]] | None
    source: str


class _Card(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field(min_length=1, max_length=200)
    total_gib: float = Field(gt=0, le=4096, allow_inf_nan=False)
    free_gib: float | None = Field(None, ge=0, allow_inf_nan=False)
    held_by: str | None = Field(None, max_length=200)

    @model_validator(mode="after")
    def _free_within_total(self) -> _Card:
        if self.free_gib is not None and self.free_gib > self.total_gib:
            raise ValueError(f"free_gib {self.free_gib:g} is more than total_gib {self.total_gib:g}")
        return self


class _Rig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    cards: list[_Card] = Field(min_length=1, max_length=MAX_CARDS)
    links: list[tuple[int, int]] | None = None


def _sizes(text: str) -> list[float]:
    out = []
    for word in text.split(","):
        try:
            v = float(word)
        except ValueError:
            raise RigsmithError(
                f"--vram-gib {text!r}: {word.strip()!r} is not a number",
                hint="one size per card in GiB, e.g. --vram-gib 24,24,12 (or one size: --vram-gib 24)",
            ) from None
        if not math.isfinite(v) or v <= 0:
            raise RigsmithError(
                f"--vram-gib {text!r}: {word.strip()!r} is not a size > 0",
                hint="one size per card in GiB, e.g. --vram-gib 24,24,12",
            )
        out.append(v)
    if len(out) > MAX_CARDS:
        raise RigsmithError(f"--vram-gib {text!r} names {len(out)} cards (at most {MAX_CARDS})")
    return out


def idle(label: str | None, sizes: list[float], source: str) -> Planned:
    """Idle cards of these sizes, numbered from 0; no topology (every pair counts as close)."""
    name = label or "GPU"
    cards = tuple(Card(i, f"{name} ({s:g} GiB, assumed idle)", int(s * GiB), 0) for i, s in enumerate(sizes))
    return Planned(cards, None, source)


def from_flags(
    vram_gib: str | None, gpus: int | None, default_gib: float | None, least: int, label: str | None
) -> Planned | None:
    """``--vram-gib`` (a list: one card each; one size: ``--gpus`` cards, else ``least``) or ``--gpus N``
    alone (cards of ``default_gib``: the spec's size). None: neither flag given, or no size known."""
    if gpus is not None and not 1 <= gpus <= MAX_CARDS:
        raise RigsmithError(f"--gpus {gpus}: give 1 to {MAX_CARDS} cards", hint="e.g. --gpus 3 --vram-gib 24")
    if vram_gib is None:
        if gpus is None:
            return None
        if default_gib is None:
            raise RigsmithError(
                f"--gpus {gpus}: no card size known (the spec has no resources.gpus.vram_gib)",
                hint=f"give one: --gpus {gpus} --vram-gib 24",
            )
        return idle(label, [default_gib] * gpus, f"--gpus {gpus} of {default_gib:g} GiB")
    sizes = _sizes(vram_gib)
    if len(sizes) > 1:
        if gpus is not None and gpus != len(sizes):
            raise RigsmithError(
                f"--gpus {gpus} and --vram-gib {vram_gib} ({len(sizes)} cards) disagree",
                hint="give one size per card, or one size and --gpus N",
            )
        return idle(label, sizes, f"--vram-gib {vram_gib}")
    n = gpus if gpus is not None else least
    return idle(label, sizes * n, f"{n} × {sizes[0]:g} GiB")


def load(path: Path) -> Planned:
    """A rig file (module docstring), checked."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        why = err.strerror if isinstance(err, OSError) else "not UTF-8 text"
        raise RigsmithError(f"--rig {path}: cannot read it: {why}", hint=RIG_HINT) from None
    try:
        data = load_yaml(text)
    except yaml.YAMLError as err:
        raise RigsmithError(f"--rig {path}: not YAML: {yaml_problem(err)}", hint=RIG_HINT) from None
    except RecursionError:
        raise RigsmithError(f"--rig {path}: nested too deeply to be a rig file", hint=RIG_HINT) from None
    try:
        rig = _Rig.model_validate(data)
    except ValidationError as err:
        e = err.errors()[0]
        where = ".".join(str(p) for p in e["loc"]) or "(file)"
        raise RigsmithError(f"--rig {path}: {where}: {e['msg']}", hint=RIG_HINT) from None
    cards = []
    for i, c in enumerate(rig.cards):
        total = int(c.total_gib * GiB)
        held = total - int(c.free_gib * GiB) if c.free_gib is not None else 0
        by = shown(c.held_by or "something else")
        who = ((f"{by} holds {held / GiB:.2f} GiB", held),) if held else ()
        cards.append(Card(i, shown(c.name), total, held, who))
    close = None
    if rig.links is not None:
        pairs = set()
        for a, b in rig.links:
            if not (0 <= a < len(cards) and 0 <= b < len(cards)) or a == b:
                raise RigsmithError(
                    f"--rig {path}: links: [{a}, {b}] is not a pair of two of the {len(cards)} cards "
                    f"(numbered 0 to {len(cards) - 1})",
                    hint=RIG_HINT,
                )
            pairs.add((min(a, b), max(a, b)))
        close = frozenset(pairs)
    return Planned(tuple(cards), close, f"rig file {path.name}")
