"""``invoke bench --history``: decode tok/s and TTFT of one deployment per lock over time, in the terminal
and as an SVG chart, with the upgrades (and rollbacks) marked.

The points are the 1-stream runs of ``.rigsmith/bench.jsonl``; each is tied to the recorded lock it ran on
by the bench's own key (``bench.lock_key`` of that lock's text and the current spec; a run under a spec
that changed since shows its key instead of a number). Marks come from the lock history: an entry whose
command is an upgrade or a rollback.

The chart is drawn by pygal: pure Python, no compiled dependencies, writes SVG (shareable, scales, opens in
any browser); loaded only by ``--out``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rigsmith.errors import RigsmithError
from rigsmith.operating import bench as benchmod
from rigsmith.resolving import lockhistory
from rigsmith.spec import Deployment

BAR = 30


@dataclass(frozen=True)
class Point:
    """One bench run (1 stream)."""

    time: str
    lock: str  # "#N" of the recorded lock, or the bench's lock key
    decode_tps: float
    ttft_ms: float


@dataclass(frozen=True)
class Mark:
    """An upgrade or rollback in the lock history."""

    time: str
    n: int
    what: str  # "upgrade" | "rollback"


def points(root: Path, lock_path: Path, spec: Deployment) -> list[Point]:
    """The deployment's 1-stream bench runs, oldest first, each with its lock."""
    by_key: dict[str, list[lockhistory.Entry]] = {}
    for e in lockhistory.entries(lock_path):
        try:
            text = e.text(lock_path)
        except RigsmithError:
            continue
        by_key.setdefault(benchmod.lock_key(text, spec), []).append(e)
    out = []
    for row in benchmod.history(benchmod.results_path(root), spec.name):
        key, when = str(row.get("lock_key")), str(row.get("time", "?"))
        # A lock text recorded more than once (a rollback writes an earlier text again): the newest entry
        # written by the time of the run.
        same = by_key.get(key, [])
        entry = next((e for e in reversed(same) if e.time <= when), same[0] if same else None)
        pt = point(row, f"#{entry.n}" if entry else key)
        if pt is not None:
            out.append(pt)
    return sorted(out, key=lambda p: p.time)


def point(row: dict[str, Any], lock: str) -> Point | None:
    """The 1-stream run of one bench row (None: the row has none)."""
    runs = row.get("runs")
    run = next(
        (r for r in runs if isinstance(r, dict) and int(r.get("streams", 0)) == 1), None
    ) if isinstance(runs, list) else None  # fmt: skip
    if run is None:
        return None
    return Point(
        str(row.get("time", "?")),
        lock,
        float(run.get("mean_stream_decode_tps", 0.0)),
        float(run.get("ttft_mean_s", 0.0)) * 1000,
    )


def marks(lock_path: Path) -> list[Mark]:
    """Upgrades and rollbacks recorded in the lock history."""
    out = []
    for e in lockhistory.entries(lock_path):
        words = f"{e.command} {e.reason or ''}"
        if "rollback" in words or "rolled back" in words:
            out.append(Mark(e.time, e.n, "rollback"))
        elif "upgrade" in words:
            out.append(Mark(e.time, e.n, "upgrade"))
    return out


def _bar(value: float, top: float) -> str:
    return "█" * max(1, round(BAR * value / top)) if top > 0 and value > 0 else ""


def terminal(pts: list[Point], mks: list[Mark]) -> list[str]:
    """A text chart: one line per run (decode and TTFT bars), the marks between them by time."""
    if not pts:
        return ["no bench runs of this deployment yet (`invoke bench`)"]
    top_d = max(p.decode_tps for p in pts)
    top_t = max(p.ttft_ms for p in pts)
    out = [f"{'time':<20} {'lock':>6}  {'decode tok/s':>12} {'':<{BAR}}  {'TTFT ms':>8}"]
    # (time, lock number, mark before the runs on its lock, line): one second can hold all of them
    events: list[tuple[str, int, int, str]] = [(m.time, m.n, 0, f"── {m.what} → lock #{m.n} ──") for m in mks]
    for p in pts:
        line = f"{p.time:<20} {p.lock:>6}  {p.decode_tps:12.1f} {_bar(p.decode_tps, top_d):<{BAR}}  "
        n = int(p.lock[1:]) if p.lock.startswith("#") else 1 << 30
        events.append((p.time, n, 1, line + f"{p.ttft_ms:8.0f} {_bar(p.ttft_ms, top_t)}"))
    out += [text for *_key, text in sorted(events)]
    return out


def write_chart(pts: list[Point], mks: list[Mark], out: Path, title: str) -> Path:
    """The chart as an SVG file: decode tok/s (left axis) and TTFT ms (right axis) per run, labelled with
    the lock, and the first run after each upgrade or rollback marked."""
    if out.suffix.lower() != ".svg":
        raise RigsmithError(
            f"--out {out}: the chart is written as SVG",
            hint="name a .svg file (any browser opens it; convert it to PNG with any SVG tool if needed)",
        )
    if not pts:
        raise RigsmithError(
            "no bench runs of this deployment yet: nothing to chart", hint="`invoke bench` first"
        )
    import pygal  # type: ignore[import-untyped]  # pygal ships no type information

    chart = pygal.Line(title=title, x_label_rotation=30, show_dots=True, truncate_label=-1)
    chart.x_labels = [f"{p.time} {p.lock}" for p in pts]
    chart.add("decode tok/s (1 stream)", [round(p.decode_tps, 1) for p in pts])
    chart.add("TTFT ms", [round(p.ttft_ms, 1) for p in pts], secondary=True)
    for what in ("upgrade", "rollback"):
        firsts = {_first_after(pts, m.time) for m in mks if m.what == what} - {None}
        values: list[Any] = [
            {"value": round(p.decode_tps, 1), "label": f"{what} → {p.lock}"} if i in firsts else None
            for i, p in enumerate(pts)
        ]
        chart.add(f"{what} points", values, stroke=False, dots_size=8)
    out.parent.mkdir(parents=True, exist_ok=True)
    from rigsmith.writer import write_one

    write_one(out, chart.render(is_unicode=True))
    return out


def _first_after(pts: list[Point], time: str) -> int | None:
    return next((i for i, p in enumerate(pts) if p.time >= time), None)
