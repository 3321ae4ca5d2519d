"""``invoke fit --propose``: this rig as the layout search sees it, and the recipe's layout beside the top
proposals. Pure: doctor's HostFacts and the spec in, a ``Rig`` and text out (``resolving.fit.propose`` ranks).
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from rigsmith.errors import RigsmithError
from rigsmith.importing.importer import merge_user_change
from rigsmith.operating.fit.observed import Observed
from rigsmith.operating.fit.pastruns import Measured, calibrate, faster, measured
from rigsmith.operating.fit.report import facts_cards, host_cards, host_kv_offload, planned_for
from rigsmith.operating.fit.rigsource import Planned
from rigsmith.operating.probes import P2P_LINKS, HostFacts
from rigsmith.resolving.fit.applylayout import with_gpus, with_layout, with_readiness
from rigsmith.resolving.fit.fit import WARN_HEADROOM, GiB, MiB, ModelShape, engine_inputs
from rigsmith.resolving.fit.fitparams import EngineParams
from rigsmith.resolving.fit.layout import Summary, of_params, summary_keys
from rigsmith.resolving.fit.prescribe import prescribe
from rigsmith.resolving.fit.propose import (
    PINS,
    Card,
    Proposal,
    Rig,
    arch_of,
    changed_pins,
    recipe_row,
    search,
)
from rigsmith.resolving.fit.proposewhy import reasons
from rigsmith.spec import Deployment

#: P2P statuses of ``nvidia-smi topo -p2p r`` under which a pair really talks peer to peer.
P2P_OK = frozenset({"OK"})


def rig_of(spec: Deployment, facts: HostFacts | None, planned: Planned | None, world: int) -> Rig | None:
    """The whole rig the search ranges over: every GPU nvidia-smi lists (not only the spec's), with what
    others hold on each and which pairs share a bridge with P2P (NVLink, or PIX/PXB with ``topo -p2p r``
    OK); or the ``planned`` rig (``--vram-gib``, ``--gpus``, ``--rig``); else idle cards of the spec's
    size (no topology: every pair counts). None: no size known."""
    if planned is None and facts is not None and facts.gpus and not facts.gpu_error:
        cards = tuple(facts_cards(spec, facts))
        return Rig(cards, _topology(facts, cards), arch_of(cards[0].name, spec.resources.gpus.arch))
    planned = planned or planned_for(spec, None, world)
    if planned is None or not planned.cards:
        return None
    return Rig(planned.cards, planned.close, arch_of(planned.cards[0].name, spec.resources.gpus.arch))


def _topology(facts: HostFacts, cards: Sequence[Card]) -> frozenset[tuple[int, int]] | None:
    if facts.topo is None or not facts.topo.gpus:
        return None
    pairs = set()
    for a, ca in enumerate(cards):
        for b in range(a + 1, len(cards)):
            x, y = f"GPU{ca.index}", f"GPU{cards[b].index}"
            link = facts.topo.links.get((x, y), "")
            status = facts.p2p.get((x, y))
            if P2P_LINKS.match(link) and (status is None or status in P2P_OK):
                pairs.add((a, b))
    return frozenset(pairs)


def own_rig(spec: Deployment, facts: HostFacts | None, planned: Planned | None, rig: Rig) -> Rig:
    """The cards of ``rig`` the spec selects (its CDI list), where the recipe's own layout is sized."""
    world = engine_inputs(spec).world
    chosen = host_cards(spec, facts, None, world, planned) or list(rig.cards)
    at = {c.index: i for i, c in enumerate(rig.cards)}
    pos = [at[c.index] for c in chosen if c.index in at]
    close = None
    if rig.close is not None:
        close = frozenset(
            (a, b) for a in range(len(pos)) for b in range(a + 1, len(pos)) if rig.near(pos[a], pos[b])
        )
    return Rig(tuple(rig.cards[i] for i in pos), close, rig.arch)


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
    own: Rig | None = None  # the cards the spec selects (the recipe's row is sized there)
    allow: frozenset[str] = frozenset()
    apart: tuple[Proposal, ...] = ()  # the best that change a pinned value (offered with --allow NAME)

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
    own: Rig | None = None,
    allow: frozenset[str] = frozenset(),
) -> Proposed:
    """Read the headers once into a summary and rank every layout on every choice of ``rig``'s cards
    (``headroom`` None: plain fit's warn margin, so that what fits here is GO there). ``own``: the cards
    the spec selects (default: the rig's first); ``allow``: the recipe's pins a proposal may change
    (``propose.PINS``; a ``cap`` allows max-model-len). ``seen``: the engine's KV size at the last boot of
    these exact inputs, which calibrates every layout's allowances; ``bench_rows``: this deployment's bench
    results."""
    base = replace(engine_inputs(spec), host_kv_offload=host_kv_offload(spec) is not None)
    own = own or Rig(rig.cards[: base.world], None, rig.arch)
    summary = Summary(shape, base, summary_keys(shape, len(rig.cards), base), headers)
    line = calibrate(summary, base, own, seen)
    if headroom is None:
        headroom = WARN_HEADROOM  # plain fit's margin: a proposal that fits is a GO there
    ranked, seen_n = search(summary, base, rig, headroom=headroom, user_cap=cap, allow=allow, own=own)
    apart = _apart(summary, base, rig, own, headroom, cap, allow, ranked)
    runs_here = base.world <= len(own.cards)
    row = recipe_row(summary, base, own, headroom) if runs_here else None
    fix = prescribe(summary, base, own, ranked)
    return Proposed(
        summary, base, rig, headroom, row, tuple(ranked), seen_n, fix, line, tuple(measured(bench_rows)),
        own, allow, tuple(apart),
    )  # fmt: skip


def _apart(
    summary: Summary,
    base: EngineParams,
    rig: Rig,
    own: Rig,
    headroom: int,
    cap: int | None,
    allow: frozenset[str],
    ranked: Sequence[Proposal],
) -> list[Proposal]:
    """What changing a pinned value would buy, listed apart: the best with every pin free, then the best
    that each pin it changes would allow alone (fewer --allow for as much); each only where it holds more
    than the best proposal that keeps the pins and those listed before it, at most three."""
    held = frozenset(PINS) - allow
    if not held:
        return []

    def best(extra: frozenset[str]) -> Proposal | None:
        found, _ = search(summary, base, rig, headroom=headroom, user_cap=cap, allow=allow | extra, own=own)
        return next((p for p in found if set(changed_pins(p.params, base)) - allow), None)

    top = best(held)
    if top is None:
        return []
    wanted = set(changed_pins(top.params, base)) & held
    singles = [best(frozenset({name})) for name in sorted(wanted)] if len(wanted) > 1 else []
    shown = {(p.layout, p.params) for p in ranked[:3]}
    out: list[Proposal] = []
    kept = [q for q in ranked[:1] if q.fits]
    for p in [*sorted((q for q in singles if q is not None), key=lambda q: q.kv_tokens), top]:
        gain = all((p.kv_tokens, p.max_context) > (q.kv_tokens, q.max_context) for q in [*kept, *out])
        if gain and (p.layout, p.params) not in shown and len(out) < 3:
            out.append(p)
            shown.add((p.layout, p.params))
    return out


def _gib(n: int) -> str:
    return f"{n / GiB:.2f}"


def _column(p: Proposal | None, rig: Rig, s: Summary) -> list[str]:
    if p is None:
        return ["needs more GPUs than the rig has", *[""] * (len(rig.cards) + 9)]
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
        ",".join(f"GPU{c.index}" for c in p.cards),
        ",".join(map(str, lay.parts(s.shape.num_layers))),
        kv,
        *gpus,
        f"{p.kv_tokens:,}",
        f"{p.max_context:,}",
        str(p.sequences),
        str(lay.pp),
        f"{p.tp_cross} TP / {p.pp_cross} PP",
        _fits(p),
    ]


def _fits(p: Proposal) -> str:
    """The proposal's plain-fit verdict in a word or three (the same count ``invoke fit`` makes)."""
    if p.fits:
        return "yes (GO)"
    if not p.runs:
        return "NO"
    warn = next(r for r in p.ranks if r.verdict == "warn")
    return "WARN: pool < one request" if "less than one" in warn.why else "WARN: below the asked headroom"


def render(prop: Proposed, title: str, width: int = 220) -> str:
    """The recipe's layout and the top three proposals side by side, each proposal's reasons, the fix."""
    s, rig = prop.summary, prop.rig
    top = prop.top()
    t = Table(title=title, expand=False)
    t.add_column("", no_wrap=True)
    t.add_column("recipe", overflow="fold")
    for n in range(len(top)):
        t.add_column(f"proposal {n + 1}", overflow="fold")
    labels = ["layout", "GPUs", "layers per stage", "KV pool @ util"]
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
        + (
            f" (closer than plain fit's {WARN_HEADROOM // MiB} MiB margin: plain fit warns on these; without "
            "--headroom-gib the proposals keep that margin)"
            if prop.headroom < WARN_HEADROOM
            else ""
        )
    )
    lines.append(
        f"searched {prop.candidates} layouts on every choice of the rig's {len(rig.cards)} GPU(s): "
        + ", ".join(_card(c) for c in rig.cards)
    )
    if top:
        lines.append(why_first(top))
    lines.append(kept(prop))
    if prop.base.host_kv_offload:
        lines.append(
            "the recipe offloads KV to host memory, which fit does not model: a GPU pool shorter than one "
            "request of the context is a WARN in plain fit, so such a layout is not proposed"
        )
    lines += [
        f"listed apart, with --allow {','.join(_needs(p, prop))}: {p.layout.label()} on "
        f"{'+'.join(f'GPU{c.index}' for c in p.cards)}, {p.kv_tokens:,} KV tokens, max context "
        f"{p.max_context:,} ({'; '.join(_pin_changes(p.params, prop.base))})"
        for p in prop.apart
    ]
    if prop.calibration:
        lines.append(prop.calibration)
    lines += faster(prop.measured, recipe_lay, top)
    if prop.fix:
        lines.append(
            "the recipe's layout does not run as it stands; cheapest fix: " + "; then ".join(prop.fix)
        )
    elif prop.recipe is not None:
        lines.append(
            "the recipe's layout runs as it stands"
            + ("" if prop.recipe.fits else f" (plain fit: {_fits(prop.recipe)}, not a GO)")
        )
    if not top and prop.apart:
        lines.append(
            "no layout fits this rig while keeping the recipe's pinned values; those listed apart fit with "
            "the --allow they name"
        )
    elif not top:
        lines.append(
            "no layout fits this rig with that headroom (to plan for more cards: --gpus N, "
            "--vram-gib 24,24,24 or --rig FILE)"
        )
    else:
        lines.append("`invoke fit --apply N` writes proposal N into the spec")
    console.print("\n".join(lines), highlight=False, markup=False)
    return buf.getvalue()


def _card(c: Card) -> str:
    who = "; ".join(w for w, _ in c.squatters)
    free = f"{c.has / GiB:.2f} of {c.total / GiB:.2f} GiB free"
    return f"GPU{c.index} {c.name} ({free}{'; ' + who if who else ''})"


def _needs(p: Proposal, prop: Proposed) -> list[str]:
    """The ``--allow`` names proposal ``p`` needs beyond those given."""
    return [n for n in changed_pins(p.params, prop.base) if n not in prop.allow]


def why_first(top: Sequence[Proposal]) -> str:
    """Why proposal 1 wins, in words: tokens of KV, the tightest card, PCIe hops."""
    p = top[0]
    words = f"proposal 1 wins: {p.kv_tokens:,} tokens of KV ({p.sequences} sequence(s) of {p.max_context:,})"
    if len(top) > 1:
        q = top[1]
        words += f" against {q.kv_tokens:,} for proposal 2 ({q.layout.label()} on {len(q.cards)} GPU(s))"
    tight = min(p.ranks, key=lambda r: r.headroom)
    words += (
        f"; the tightest card is GPU{tight.card.index} ({tight.card.name}) with "
        f"{tight.headroom / MiB:,.0f} MiB left"
    )
    if p.tp_cross or p.pp_cross:
        words += (
            f"; {p.tp_cross} TP pair(s) and {p.pp_cross} stage boundary(ies) cross a PCIe host bridge "
            "without P2P"
        )
    elif len(p.cards) > 1:
        words += "; no TP pair or stage boundary crosses a bridge without P2P (or the topology is unknown)"
    return words


def _pin_changes(p: EngineParams, base: EngineParams) -> list[str]:
    out = []
    for name in changed_pins(p, base):
        old, new = {
            "max-model-len": (base.max_model_len or "the model's limit", p.max_model_len),
            "kv-cache-memory": (base.kv_cache_memory, p.kv_cache_memory),
            "kv-cache-dtype": (base.kv_cache_dtype, p.kv_cache_dtype),
            "gpu-memory-utilization": (f"{base.gpu_memory_utilization:g}", f"{p.gpu_memory_utilization:g}"),
        }[name]
        out.append(f"--{name} {old} → {new}")
    return out


def kept(prop: Proposed) -> str:
    """The recipe's pinned values the proposals keep, and how to let them change."""
    b = prop.base
    ctx = f"--max-model-len {b.max_model_len:,}" if b.max_model_len else "the model's own context"
    pins = [
        ("max-model-len", ctx),
        ("kv-cache-memory", f"--kv-cache-memory {b.kv_cache_memory} (a fixed pool on every rank)")
        if b.kv_cache_memory is not None
        else None,
        ("kv-cache-dtype", f"--kv-cache-dtype {b.kv_cache_dtype}"),
        ("gpu-memory-utilization", f"--gpu-memory-utilization ≤ {b.gpu_memory_utilization:g}"),
    ]
    held = [words for pin in pins if pin is not None for name, words in [pin] if name not in prop.allow]
    if not held:
        return "every pinned value may change (--allow)"
    return (
        f"the proposals keep the recipe's {', '.join(held)}; `--allow NAME` ({', '.join(PINS)}, or all) lets "
        "a proposal change one"
    )


def chosen(prop: Proposed, n: int) -> Proposal:
    """Proposal ``n`` (1-based) of the ones ``render`` shows."""
    top = prop.top()
    if not 1 <= n <= len(top):
        raise RigsmithError(
            f"--apply {n}: this rig has {len(top)} proposal(s) that fit" + ("" if top else " (none)"),
            hint="`invoke fit --propose` lists them; --apply takes the number of one"
            + "".join(f"; with --allow {','.join(_needs(p, prop))} one fits" for p in prop.apart[:1]),
        )
    return top[n - 1]


def apply(path: Path, read: str, spec: Deployment, prop: Proposed, n: int) -> tuple[Deployment, str]:
    """``spec`` (read from ``path`` as the text ``read``) with proposal ``n`` written in: argv flags, the
    partition env, the cards it runs on (CDI list), the readiness figures the layout decides and a note,
    merged three-way into the file as it is now (importer.merge_user_change). Also the reason, in words."""
    p = chosen(prop, n)
    cards = p.cards[: p.layout.gpus]
    names = ", ".join(f"GPU{c.index} {c.name}" for c in cards)
    why = f"{names}; " + "; ".join(reasons(p, prop.summary, of_params(prop.base), prop.headroom))
    changed = _pin_changes(p.params, prop.base)
    if changed:
        why += "; changes the recipe's " + ", ".join(changed) + " (allowed by --allow)"
    new = with_layout(spec, p.layout, p.params, why)
    mixed = len({(c.name, c.total) for c in cards}) > 1
    new = with_gpus(new, [c.index for c in cards], [c.total / GiB for c in cards], mixed)
    new, moved = with_readiness(new, _published_tokens(prop, p, spec), _load_scale(prop, p))
    if moved:
        notes = list(new.notes)
        notes[-1] += "; " + "; ".join(moved)
        new = new.model_copy(update={"notes": tuple(notes)})
    return merge_user_change(path, read, new), f"proposal {n}, {p.layout.label()} on {names}"


def _published_tokens(prop: Proposed, p: Proposal, spec: Deployment) -> int | None:
    """The recipe's published KV size moved to proposal ``p``: scaled by fit's own count of both pools
    where both are fixed (``--kv-cache-memory``: the count is exact but for the engine's own rounding), so
    the recipe's calibration carries over; None where the pool follows the utilisation."""
    published = spec.readiness.kv_cache_tokens
    base = prop.base
    if published is None or base.kv_cache_memory is None or p.params.kv_cache_memory is None:
        return None
    old = prop.summary.estimate(base).kv_tokens([base.kv_cache_memory] * base.world)
    new = prop.summary.estimate(p.params).kv_tokens([p.params.kv_cache_memory] * p.layout.group)
    if not old or new is None:
        return None
    return published if new == old else round(published * new / old)


def _load_scale(prop: Proposed, p: Proposal) -> float:
    """How much more the heaviest rank loads than the recipe's heaviest (start-up is mostly loading)."""
    old = max(r.weights for r in prop.summary.estimate(prop.base).ranks)
    new = max(r.need.weights for r in p.ranks)
    return new / old if old else 1.0
