"""``invoke bench --history``: decode tok/s and TTFT of one deployment per lock over time, in the terminal
and as an SVG chart, with the upgrades (and rollbacks) marked.

The points are the 1-stream runs of ``.rigsmith/bench.jsonl``; each is tied to the recorded lock it ran on
by the bench's own key (``bench.lock_key`` of that lock's text and the current spec; a run under a spec
that changed since shows its key instead of a number). Marks come from the lock history: an entry whose
command is an upgrade or a rollback.

The chart is drawn by pygal: pure Python, no compiled dependencies, writes SVG (shareable, scales, opens in
any browser); loaded only when a chart is written. The SVG is self-contained: pygal's tooltip script, which
it loads from a third-party site by default, is left out (``js=[]``). It goes to ``--out FILE`` (an existing
file is replaced only with consent: ``--yes`` or the prompt) or, by default, ``.rigsmith/charts/NAME.svg``.

``bench.jsonl`` and the lock history are files anyone may have edited: every row is checked before it is
drawn (a number that is not a finite, plausible value, a ``streams`` that is not a count, a row that is not
an object) and a bad one is one RigsmithError naming its line; every foreign value printed passes
``errors.shown``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rigsmith import confine
from rigsmith.digits import ascii_digits
from rigsmith.errors import ConsentError, RigsmithError, shown
from rigsmith.operating.bench import bench as benchmod
from rigsmith.resolving.lock import lockhistory
from rigsmith.spec import Deployment
from rigsmith.writer import write_one

BAR = 30
#: The largest decode rate (tok/s) and TTFT (s) a row may carry: beyond these it is not a measurement.
MAX_TPS = 1e7
MAX_TTFT_S = 1e5
#: Where the chart goes without --out (rigsmith's own state, not the user's checkout files).
CHART_DIR = Path(".rigsmith") / "charts"


class BadRow(RigsmithError):
    """A row of bench.jsonl that cannot be charted."""


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
    what: str  # "upgrade" | "rollback" | "upgrade rolled back"
    kind: str = ""  # the chart's series: "upgrade" | "rollback" (default: what)


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
    for line, row in rows(benchmod.results_path(root), spec.name):
        key, when = str(row.get("lock_key")), str(row.get("time", "?"))
        # A lock text recorded more than once (a rollback writes an earlier text again): the newest entry
        # written by the time of the run.
        same = by_key.get(key, [])
        entry = next((e for e in reversed(same) if e.time <= when), same[0] if same else None)
        pt = point(row, f"#{entry.n}" if entry else key, where=line)
        if pt is not None:
            out.append(pt)
    return sorted(out, key=lambda p: p.time)


def rows(path: Path, deployment: str) -> list[tuple[str, dict[str, Any]]]:
    """The deployment's rows of bench.jsonl with where each is (``FILE line N``); the file read as a regular
    file (never a FIFO or a link); a line that is not a JSON object is a BadRow naming it."""
    if not (path.exists() or path.is_symlink()):
        return []
    with confine.open_file(path, "bench history", BadRow) as fh:
        data = fh.read()
    out = []
    for i, text in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
        where = f"{path} line {i}"
        if not text.strip():
            continue
        try:
            row = json.loads(text)
        except ValueError:
            raise _bad(where, "it is not JSON") from None
        if not isinstance(row, dict):
            raise _bad(where, "it is not a JSON object")
        if row.get("deployment") == deployment:
            out.append((where, row))
    return out


def _bad(where: str, why: str) -> BadRow:
    return BadRow(
        f"{where} cannot be charted: {shown(why)}; nothing was drawn",
        hint="fix or delete that line of .rigsmith/bench.jsonl (each line is one `invoke bench` run)",
    )


def _number(run: dict[str, Any], key: str, top: float, where: str) -> float:
    value = run.get(key, 0.0)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _bad(where, f"{key} is {str(value)[:40]!r}, not a number")
    if not math.isfinite(value) or not 0 <= value <= top:
        raise _bad(where, f"{key} is {value!r}, not a measurement (0 to {top:g})")
    return float(value)


def point(row: dict[str, Any], lock: str, where: str = "a bench row") -> Point | None:
    """The 1-stream run of one bench row (None: the row has none); BadRow when a value is not one."""
    runs = row.get("runs")
    if not isinstance(runs, list):
        raise _bad(where, "runs is not a list")
    run = None
    for r in runs:
        if not isinstance(r, dict):
            raise _bad(where, "a run is not a JSON object")
        streams = r.get("streams", 0)
        if isinstance(streams, bool) or not isinstance(streams, int):
            raise _bad(where, f"streams is {str(streams)[:40]!r}, not a count")
        if streams == 1 and run is None:
            run = r
    if run is None:
        return None
    time = row.get("time", "?")
    if not isinstance(time, str):
        raise _bad(where, "time is not text")
    return Point(
        time,
        lock,
        _number(run, "mean_stream_decode_tps", MAX_TPS, where),
        _number(run, "ttft_mean_s", MAX_TTFT_S, where) * 1000,
    )


def marks(lock_path: Path) -> list[Mark]:
    """Upgrades and rollbacks recorded in the lock history (an upgrade its own command rolled back is one
    entry: one mark)."""
    out = []
    for e in lockhistory.entries(lock_path):
        words = f"{e.command} {e.reason or ''}"
        if e.rolled_back and "upgrade" in words:
            out.append(Mark(e.time, e.n, "upgrade rolled back", "rollback"))
        elif "rollback" in words or "rolled back" in words:
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
    events: list[tuple[str, int, int, str]] = [(m.time, m.n, 0, _mark_line(m)) for m in mks]
    for p in pts:
        bar = _bar(p.decode_tps, top_d)
        line = f"{shown(p.time):<20} {shown(p.lock):>6}  {p.decode_tps:12.1f} {bar:<{BAR}}  "
        n = int(p.lock[1:]) if p.lock.startswith("#") and ascii_digits(p.lock[1:]) else 1 << 30
        events.append((p.time, n, 1, line + f"{p.ttft_ms:8.0f} {_bar(p.ttft_ms, top_t)}"))
    out += [text for *_key, text in sorted(events)]
    return out


def _mark_line(m: Mark) -> str:
    if m.what == "upgrade rolled back":
        return f"── upgrade to lock #{m.n}, rolled back ──"
    return f"── {m.what} → lock #{m.n} ──"


def default_chart(root: Path, name: str) -> Path:
    return root / CHART_DIR / f"{name}.svg"


def write_chart(
    pts: list[Point],
    mks: list[Mark],
    out: Path,
    title: str,
    *,
    replace: bool = True,
    confirm: Callable[[str], bool] | None = None,
) -> Path:
    """The chart as a self-contained SVG file: decode tok/s (left axis) and TTFT ms (right axis) per run,
    labelled with the lock, and the first run after each upgrade or rollback marked. An existing ``out``
    is replaced only with ``replace`` (``--yes``) or the user's yes at ``confirm``."""
    if out.suffix.lower() != ".svg":
        raise RigsmithError(
            f"--out {out}: the chart is written as SVG",
            hint="name a .svg file (any browser opens it; convert it to PNG with any SVG tool if needed)",
        )
    if not pts:
        raise RigsmithError(
            "no bench runs of this deployment yet: nothing to chart", hint="`invoke bench` first"
        )
    if not replace and (out.exists() or out.is_symlink()):
        if confirm is None:
            raise ConsentError(
                f"--out {out} exists; nothing was written",
                hint="pass --yes to replace it, or name another file",
            )
        if not confirm(f"replace {out}?"):
            raise ConsentError(f"--out {out} exists and was kept; nothing was written")
    # Here, not at the top: pygal costs ~45 ms to import and only the chart needs it, while fit --propose
    # and upgrade import this module for its points.
    import pygal  # type: ignore[import-untyped]  # pygal ships no type information

    # js=[]: no <script> from pygal's site (its default tooltip script) — the file shows offline and runs
    # nothing from elsewhere when opened
    chart = pygal.Line(title=title, x_label_rotation=30, show_dots=True, truncate_label=-1, js=[])
    chart.x_labels = [shown(f"{p.time} {p.lock}") for p in pts]
    chart.add("decode tok/s (1 stream)", [round(p.decode_tps, 1) for p in pts])
    chart.add("TTFT ms", [round(p.ttft_ms, 1) for p in pts], secondary=True)
    for what in ("upgrade", "rollback"):
        firsts = {_first_after(pts, m.time) for m in mks if (m.kind or m.what) == what} - {None}
        values: list[Any] = [
            {"value": round(p.decode_tps, 1), "label": shown(f"{what} → {p.lock}")} if i in firsts else None
            for i, p in enumerate(pts)
        ]
        chart.add(f"{what} points", values, stroke=False, dots_size=8)
    out.parent.mkdir(parents=True, exist_ok=True)

    write_one(out, chart.render(is_unicode=True))
    return out


def _first_after(pts: list[Point], time: str) -> int | None:
    return next((i for i, p in enumerate(pts) if p.time >= time), None)
