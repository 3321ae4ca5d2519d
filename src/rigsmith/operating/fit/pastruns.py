"""Where this deployment has run before: the engine's own KV size from ``wait`` calibrates fit's allowances,
and ``bench`` runs under more than one layout say which was measured faster. Pure: records in, lines out.

Calibration: ``observed.last`` is the newest "GPU KV cache size" the engine logged for the spec's exact
inputs (the recipe's layout); ``resolving.fit.calibrate`` turns it into bytes per GPU the allowances were off,
and every layout the search sizes carries that correction.

Bench: each ``.rigsmith/bench.jsonl`` row carries the layout the spec ran with (``bench.layout_record``;
rows written before that have none and are skipped). The newest 1-stream run of each layout is compared.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from filelock import FileLock

from rigsmith.operating.bench.history import Point, point
from rigsmith.operating.fit.observed import Observed
from rigsmith.resolving.fit.calibrate import allowance_delta
from rigsmith.resolving.fit.fit import GiB
from rigsmith.resolving.fit.fitparams import EngineParams
from rigsmith.resolving.fit.layout import Layout, Summary
from rigsmith.resolving.fit.propose import Proposal, Rig, on_cards
from rigsmith.resolving.lock import lockhistory


def calibrate(summary: Summary, base: EngineParams, rig: Rig, seen: Observed | None) -> str | None:
    """Set ``summary.allowance`` from the last boot of the recipe's layout on this rig; the line that says
    so (None: no boot recorded, or the recipe needs more GPUs than the rig has)."""
    if seen is None or base.world > len(rig.cards):
        return None
    summary.allowance = 0
    cards = rig.cards[: base.world]
    est = on_cards(summary, base, cards)
    delta = allowance_delta(est, [c.total for c in cards], seen.kv_cache_tokens)
    boot = f"the boot of {seen.time}" if seen.time else "the last boot"
    if delta is None:
        if base.kv_cache_memory is None:
            return None
        return (
            f"{boot} reported {seen.kv_cache_tokens:,} KV tokens from the recipe's --kv-cache-memory pool: "
            "a fixed pool says nothing about the allowances, so they stay estimates"
        )
    summary.allowance = delta
    return (
        f"calibrated from {boot}: allowances {delta / GiB:+.2f} GiB per GPU "
        f"(the engine reported {seen.kv_cache_tokens:,} KV tokens for the recipe's layout)"
    )


@dataclass(frozen=True)
class Measured:
    """The newest 1-stream bench run of one layout."""

    layout: Layout
    run: Point


def _layout(raw: object) -> Layout | None:
    if not isinstance(raw, dict):
        return None
    try:
        lay = Layout(**raw)
        part = tuple(int(n) for n in lay.partition) if lay.partition is not None else None
        return Layout(int(lay.tp), int(lay.pp), int(lay.dp), bool(lay.ep), part, str(lay.kv_dtype))
    except (TypeError, ValueError):
        return None


def measured(rows: Iterable[dict[str, Any]]) -> list[Measured]:
    """The newest 1-stream run of each layout in a deployment's bench rows, fastest decode first."""
    latest: dict[Layout, Measured] = {}
    for row in rows:
        lay = _layout(row.get("layout"))
        run = point(row, "") if lay is not None else None
        if lay is None or run is None:
            continue
        if lay not in latest or run.time >= latest[lay].run.time:
            latest[lay] = Measured(lay, run)
    return sorted(latest.values(), key=lambda m: (-m.run.decode_tps, m.run.ttft_ms))


def _name(lay: Layout, recipe: Layout | None, shown: Sequence[Proposal]) -> str:
    out = lay.label() + (f" layers {','.join(map(str, lay.partition))}" if lay.partition else "")
    tags = ["the recipe's"] if lay == recipe else []
    tags += [f"proposal {n}" for n, p in enumerate(shown, 1) if p.layout == lay]
    return out + (f" ({', '.join(tags)})" if tags else "")


def faster(ms: Sequence[Measured], recipe: Layout | None, shown: Sequence[Proposal]) -> list[str]:
    """Which layout was measured faster, where bench ran under more than one (else nothing)."""
    if len(ms) < 2:
        return []
    out = ["measured here by `invoke bench` (newest 1-stream run of each layout):"]
    out += [
        f"  {_name(m.layout, recipe, shown)}: decode {m.run.decode_tps:.1f} tok/s, "
        f"TTFT {m.run.ttft_ms:.0f} ms ({m.run.time})"
        for m in ms
    ]
    best, next_ = ms[0], ms[1]
    line = (
        f"{_name(best.layout, recipe, shown)} was measured faster: decode {best.run.decode_tps:.1f} vs "
        f"{next_.run.decode_tps:.1f} tok/s"
    )
    quick = min(ms, key=lambda m: m.run.ttft_ms)
    if quick is not best:
        line += f"; {_name(quick.layout, recipe, shown)} had the lower TTFT ({quick.run.ttft_ms:.0f} ms)"
    return [*out, line]


def record_apply(lock_path: Path, reason: str) -> int | None:
    """Record ``fit --apply`` in the lock history (the lock's text as it is, the command, ``reason``), under
    the lock's file lock; the entry's number. None: there is no rigsmith.lock to keep a history beside."""
    if not lock_path.is_file():
        return None
    with FileLock(str(lock_path) + ".flock", timeout=600):
        text = lock_path.read_text(encoding="utf-8")
        with lockhistory.because(lockhistory.current_cause()[0], reason):
            return lockhistory.record(lock_path, None, text)
