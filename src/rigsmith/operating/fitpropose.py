"""``invoke fit --propose``: this rig as the layout search sees it, and the recipe's layout beside the top
proposals. Pure: doctor's HostFacts and the spec in, a ``Rig`` and text out (``resolving.propose`` ranks).
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from rigsmith.errors import RigsmithError
from rigsmith.importing.importer import merge_user_change
from rigsmith.operating.fithistory import Measured, calibrate, faster, measured
from rigsmith.operating.fitreport import host_cards
from rigsmith.operating.observed import Observed
from rigsmith.operating.probes import P2P_LINKS, HostFacts
from rigsmith.resolving.applylayout import with_layout
from rigsmith.resolving.fit import GiB, MiB, ModelShape, engine_inputs
from rigsmith.resolving.fitparams import EngineParams
from rigsmith.resolving.layout import Summary, of_params, summary_keys
from rigsmith.resolving.propose import (
    Card,
    Proposal,
    Rig,
    arch_of,
    default_headroom,
    prescribe,
    reasons,
    recipe_row,
    search,
)
from rigsmith.spec import Deployment

#: P2P statuses of ``nvidia-smi topo -p2p r`` under which a pair really talks peer to peer.
P2P_OK = frozenset({"OK"})


def rig_of(spec: Deployment, facts: HostFacts | None, vram_gib: float | None, world: int) -> Rig | None:
    """The spec's GPUs with what others hold on them and which pairs share a bridge with P2P (NVLink, or
    PIX/PXB with ``topo -p2p r`` OK). Idle cards of ``vram_gib`` have no topology (every pair counts)."""
    raw = host_cards(spec, facts, vram_gib, world)
    if not raw:
        return None
    cards = tuple(
        Card(i if i is not None else n, name, total, others, tuple(squat))
        for n, (i, name, total, others, squat) in enumerate(raw)
    )
    close: frozenset[tuple[int, int]] | None = None
    if facts is not None and facts.topo is not None and facts.topo.gpus and vram_gib is None:
        pairs = set()
        for a, ca in enumerate(cards):
            for b in range(a + 1, len(cards)):
                x, y = f"GPU{ca.index}", f"GPU{cards[b].index}"
                link = facts.topo.links.get((x, y), "")
                status = facts.p2p.get((x, y))
                if P2P_LINKS.match(link) and (status is None or status in P2P_OK):
                    pairs.add((a, b))
        close = frozenset(pairs)
    return Rig(cards, close, arch_of(cards[0].name, spec.resources.gpus.arch))


@dataclass(frozen=True)
class Proposed:
    """What ``fit --propose`` shows: the recipe's row, the ranking, the fix, and how the search went."""

    summary: Summary
    base: EngineParams
    rig: Rig
    headroom: int
    recipe: Proposal | None
    ranked: tuple[Proposal, ...]
    candidates: int
    fix: list[str]
    calibration: str | None = None  # fithistory.calibrate's line, where a boot here calibrated the allowances
    measured: tuple[Measured, ...] = ()  # bench runs here, one per layout, fastest first

    def top(self, n: int = 3) -> list[Proposal]:
        return [p for p in self.ranked if p.fits][:n]


def propose(
    spec: Deployment,
    shape: ModelShape,
    headers: Iterable[tuple[str, int, Sequence[int]]],
    rig: Rig,
    *,
    headroom: int | None,
    cap: int | None,
    seen: Observed | None = None,
    bench_rows: Iterable[dict[str, Any]] = (),
) -> Proposed:
    """Read the headers once into a summary and rank every layout on ``rig`` (``headroom`` None: the
    default, ``propose.default_headroom``). ``seen``: the engine's KV size at the last boot of these exact
    inputs, which calibrates every layout's allowances; ``bench_rows``: this deployment's bench results."""
    base = engine_inputs(spec)
    summary = Summary(shape, base, summary_keys(shape, len(rig.cards), base), headers)
    line = calibrate(summary, base, rig, seen)
    if headroom is None:
        headroom = default_headroom(summary, base, rig)
    ranked, seen_n = search(summary, base, rig, headroom=headroom, user_cap=cap)
    own = recipe_row(summary, base, rig, headroom) if base.world <= len(rig.cards) else None
    fix = prescribe(summary, base, rig, ranked)
    return Proposed(
        summary, base, rig, headroom, own, tuple(ranked), seen_n, fix, line, tuple(measured(bench_rows))
    )


def _gib(n: int) -> str:
    return f"{n / GiB:.2f}"


def _column(p: Proposal | None, rig: Rig, s: Summary) -> list[str]:
    if p is None:
        return ["needs more GPUs than the rig has", *[""] * (len(rig.cards) + 7)]
    lay, prm = p.layout, p.params
    kv = (
        f"{prm.kv_cache_memory / GiB:.2f} GiB" if prm.kv_cache_memory is not None else "(utilisation)"
    ) + f" @ {prm.gpu_memory_utilization:g}"
    by_card = {r.card.index: r for r in p.ranks}
    gpus = []
    for c in rig.cards:
        r = by_card.get(c.index)
        if r is None:
            gpus.append("-")
            continue
        allow = r.need.activation + r.need.cuda_graphs + r.need.runtime + r.need.non_torch
        gpus.append(f"{_gib(r.need.weights)} / {_gib(r.kv)} / {_gib(allow)} / {r.headroom / MiB:,.0f} MiB")
    return [
        lay.label(),
        ",".join(map(str, lay.parts(s.shape.num_layers))),
        kv,
        *gpus,
        f"{p.kv_tokens:,}",
        f"{p.max_context:,}",
        str(p.sequences),
        str(lay.pp),
        f"{p.tp_cross} TP / {p.pp_cross} PP",
        "yes" if p.fits else ("below the asked headroom" if p.runs else "NO"),
    ]


def render(prop: Proposed, title: str, width: int = 220) -> str:
    """The recipe's layout and the top three proposals side by side, each proposal's reasons, the fix."""
    s, rig = prop.summary, prop.rig
    top = prop.top()
    t = Table(title=title, expand=False)
    t.add_column("", no_wrap=True)
    t.add_column("recipe", overflow="fold")
    for n in range(len(top)):
        t.add_column(f"proposal {n + 1}", overflow="fold")
    labels = ["layout", "layers per stage", "KV pool @ util"]
    labels += [f"GPU{c.index} W/KV/allow GiB, headroom" for c in rig.cards]
    labels += ["KV tokens", "max context", "sequences at once", "stages", "cross-bridge", "fits"]
    cols = [_column(prop.recipe, rig, s), *(_column(p, rig, s) for p in top)]
    for i, label in enumerate(labels):
        t.add_row(label, *(c[i] for c in cols))
    buf = io.StringIO()
    console = Console(file=buf, width=width, color_system=None, force_terminal=False, legacy_windows=False)
    console.print(t)
    recipe_lay = prop.recipe.layout if prop.recipe else None
    lines = []
    for n, p in enumerate(top, 1):
        why = reasons(p, s, recipe_lay or p.layout, prop.headroom)
        lines.append(f"proposal {n} ({p.layout.label()}): " + "; ".join(why))
    lines.append(
        "W/KV/allow: weights, KV pool, allowances (activations + CUDA graphs + runtime + memory outside "
        f"PyTorch, est.); headroom after all of it; asked headroom {prop.headroom // MiB} MiB"
    )
    lines.append(f"searched {prop.candidates} layouts on {len(rig.cards)} GPU(s)")
    if prop.calibration:
        lines.append(prop.calibration)
    lines += faster(prop.measured, recipe_lay, top)
    if prop.fix:
        lines.append(
            "the recipe's layout does not run as it stands; cheapest fix: " + "; then ".join(prop.fix)
        )
    elif prop.recipe is not None:
        lines.append("the recipe's layout runs as it stands")
    if not top:
        lines.append("no layout fits this rig with that headroom")
    else:
        lines.append("`invoke fit --apply N` writes proposal N into the spec")
    console.print("\n".join(lines), highlight=False, markup=False)
    return buf.getvalue()


def chosen(prop: Proposed, n: int) -> Proposal:
    """Proposal ``n`` (1-based) of the ones ``render`` shows."""
    top = prop.top()
    if not 1 <= n <= len(top):
        raise RigsmithError(
            f"--apply {n}: this rig has {len(top)} proposal(s) that fit" + ("" if top else " (none)"),
            hint="`invoke fit --propose` lists them; --apply takes the number of one",
        )
    return top[n - 1]


def apply(path: Path, read: str, spec: Deployment, prop: Proposed, n: int) -> Deployment:
    """``spec`` (read from ``path`` as the text ``read``) with proposal ``n`` written in: argv flags, the
    partition env and a note, merged three-way into the file as it is now (importer.merge_user_change)."""
    p = chosen(prop, n)
    cards = ", ".join(f"GPU{c.index} {c.name}" for c in prop.rig.cards[: p.layout.gpus])
    why = f"{cards}; " + "; ".join(reasons(p, prop.summary, of_params(prop.base), prop.headroom))
    return merge_user_change(path, read, with_layout(spec, p.layout, p.params, why))
