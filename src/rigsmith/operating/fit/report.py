"""The fit estimate against real GPUs: per-GPU needs, has, headroom and verdict; published numbers compared.

Pure: an ``Estimate`` (resolving.fit.fit), the spec and doctor's HostFacts in; rows, a rich table and one
doctor row out. A squatter (a compute process on the GPU that is not this deployment) is named on the GPU
whose headroom it eats.
"""

from __future__ import annotations

import io
import re
from collections.abc import Mapping
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

from rigsmith.digits import ascii_digits
from rigsmith.errors import RigsmithError
from rigsmith.operating.checkrow import Check, Verdict, requested_gpus
from rigsmith.operating.fit import rigsource
from rigsmith.operating.fit.rigsource import Planned
from rigsmith.operating.probes import HostFacts
from rigsmith.resolving.fit.fit import Estimate, GiB, MiB, RankNeed
from rigsmith.resolving.fit.fitverdict import rank_verdict
from rigsmith.resolving.fit.propose import Card
from rigsmith.resolving.lock.lock import Lock
from rigsmith.spec import Deployment


@dataclass(frozen=True)
class GpuFit:
    """One rank on the GPU it gets."""

    need: RankNeed
    gpu: int | None  # nvidia-smi index; None: the spec selects fewer GPUs than TP × PP
    card: str
    total: int
    others: int  # bytes used on the card by anything that is not this deployment
    squatters: tuple[str, ...]
    squat_bytes: int
    kv: int
    needs: int
    has: int
    headroom: int
    verdict: Verdict
    why: str


@dataclass(frozen=True)
class Comparison:
    """An estimate next to the number the recipe published."""

    what: str
    estimate: float
    published: float
    unit: str

    @property
    def ratio(self) -> float:
        return self.estimate / self.published if self.published else float("nan")


def _mib(n: int) -> str:
    return f"{n / MiB:,.0f} MiB"


def _gib(n: int) -> str:
    return f"{n / GiB:.2f} GiB"


def facts_cards(spec: Deployment, facts: HostFacts) -> list[Card]:
    """Every GPU nvidia-smi lists, with what is not this deployment's on it (squatters named with their
    bytes)."""
    cards = []
    for g in facts.gpus:
        own, squat = 0, []
        for app in facts.apps:
            if app.gpu_uuid != g.uuid:
                continue
            used = (app.used_mib or 0) * MiB
            ctr = facts.containers.get(app.pid)
            if ctr == spec.name:
                own += used
            else:
                where = f" (container {ctr})" if ctr else ""
                squat.append((f"PID {app.pid} {app.name}{where} holds {_mib(used)}", used))
        others = max(g.memory_used_mib * MiB - own, 0)
        cards.append(Card(g.index, g.name, g.memory_total_mib * MiB, others, tuple(squat)))
    return cards


def _planned_selected(spec: Deployment, planned: Planned) -> list[Card]:
    """The cards of a planned rig the spec's CDI list names by index ('all' or none by index: every card)."""
    names = [d.split("=", 1)[1] for d in spec.resources.gpus.cdi_devices]
    by_index = {c.index: c for c in planned.cards}
    picked = [by_index[int(n)] for n in names if ascii_digits(n) and int(n) in by_index]
    return list(planned.cards) if "all" in names or not picked else picked


def planned_for(spec: Deployment, vram_gib: float | None, world: int) -> Planned | None:
    """Idle cards of ``vram_gib`` (else the spec's size): as many as the spec selects, ranks or CDI indices
    ask for. None: no size known."""
    size = vram_gib if vram_gib is not None else spec.resources.gpus.vram_gib
    if size is None:
        return None
    idx = [int(x) + 1 for d in spec.resources.gpus.cdi_devices if ascii_digits(x := d.split("=", 1)[1])]
    n = max(world, spec.resources.gpus.count, *idx)
    return rigsource.idle(spec.resources.gpus.model, [size] * n, f"{n} × {size:g} GiB")


def host_cards(
    spec: Deployment,
    facts: HostFacts | None,
    vram_gib: float | None,
    world: int,
    planned: Planned | None = None,
) -> list[Card] | None:
    """The GPUs the spec selects, with what others hold on them: on this host (nvidia-smi), or on the
    ``planned`` rig (``--vram-gib`` list, ``--rig FILE``), or idle cards of ``vram_gib`` (else the spec's
    size), at least ``world`` of them. None: no size known."""
    if planned is None and facts is not None and facts.gpus and not facts.gpu_error and vram_gib is None:
        by_index = {c.index: c for c in facts_cards(spec, facts)}
        return [by_index[i] for i in requested_gpus(spec, facts) if i in by_index]
    planned = planned or planned_for(spec, vram_gib, world)
    return None if planned is None else _planned_selected(spec, planned)


def fit_gpus(
    est: Estimate,
    spec: Deployment,
    facts: HostFacts | None,
    vram_gib: float | None = None,
    planned: Planned | None = None,
) -> list[GpuFit]:
    """Each rank on its GPU (rank r → the r-th GPU the spec selects, as vLLM numbers local ranks).

    Without GPU facts (no driver here) or with ``vram_gib``, the cards are the spec's (or that size), idle;
    with ``planned``, the cards of that rig the spec selects.
    """
    p = est.params
    cards = host_cards(spec, facts, vram_gib, p.world, planned)
    if cards is None:
        return []
    offload = host_kv_offload(spec)
    # The profile's batched tokens and sequences are the engine's, from the first card it sees (vLLM's
    # EngineArgs read device 0's total and name); each rank then sizes its pool on its own card (``_one``)
    # and the engine keeps the fewest blocks of any rank (``Estimate.kv_tokens``).
    est = est.for_card(cards[0].total, cards[0].name) if cards else est
    out = []
    for r in est.ranks:
        if r.rank >= len(cards):
            out.append(
                GpuFit(
                    r,
                    None,
                    "-",
                    0,
                    0,
                    (),
                    0,
                    0,
                    0,
                    0,
                    0,
                    "no-go",
                    f"no GPU for rank {r.rank}: TP×PP = {p.world}, the spec selects {len(cards)}",
                )
            )
            continue
        out.append(_one(est, r, cards[r.rank], offload))
    return out


_OFFLOAD_ENV = re.compile(r"KV_OFFLOAD$")
_OFFLOAD_GIB = re.compile(r"KV_OFFLOAD\w*(?:GIB|_GB)$")
_OFFLOAD_CONNECTORS = ("OffloadingConnector", "LMCacheConnector")


def host_kv_offload(spec: Deployment) -> str | None:
    """The recipe's host-memory KV offload, in words (None: none): an engine env switch such as seed 000's
    ``VLLM_QSA_KV_OFFLOAD=1`` (with its ``…_MAX_GIB``), vLLM's ``--kv-offloading-size`` or a
    ``--kv-transfer-config`` offloading connector. fit does not model how such an engine admits a sequence
    longer than its GPU pool: a row names it instead of saying vLLM refuses."""
    env = {e.name: e.value for e in spec.active_env()}
    on = [
        n
        for n, v in env.items()
        if _OFFLOAD_ENV.search(n) and v.strip().lower() in ("1", "true", "yes", "on")
    ]
    size = next((v for n, v in env.items() if _OFFLOAD_GIB.search(n)), None)
    args = list(spec.engine.args)
    for i, a in enumerate(args[:-1]):
        if a == "--kv-offloading-size":
            on.append(a)
            size = args[i + 1]
        elif a == "--kv-transfer-config" and any(c in args[i + 1] for c in _OFFLOAD_CONNECTORS):
            on.append(f"{a} {next(c for c in _OFFLOAD_CONNECTORS if c in args[i + 1])}")
    if not on:
        return None
    return ", ".join(f"{n}={env[n]}" if n in env else n for n in on) + (
        f" (up to {size} GiB of host memory)" if size else ""
    )


def _one(est: Estimate, r: RankNeed, card: Card, offload: str | None) -> GpuFit:
    total, others, squat = card.total, card.others, list(card.squatters)
    v = rank_verdict(est, r, total, others, offload=offload)  # the count --propose ranks by, too
    headroom, verdict, why = v.headroom, v.verdict, v.why
    squat_bytes = sum(b for _, b in squat)
    if squat:
        names = "; ".join(s for s, _ in squat)
        if verdict == "no-go" and headroom < 0 <= headroom + squat_bytes:
            why = (
                f"{names}: it takes the rank's headroom ({_mib(headroom + squat_bytes)} without it, "
                f"{_mib(headroom)} with it); {why}"
            )
        else:
            why = f"{names} of the headroom" + (f"; {why}" if why else "")
    names_t = tuple(s for s, _ in squat)
    gpu = (card.index, card.name, total, others, names_t, squat_bytes)
    return GpuFit(r, *gpu, v.kv, v.needs, v.has, headroom, verdict, why)


_PER_RANK = re.compile(r"[Ww]eights?[^.;]*?(\d+(?:\.\d+)?)\s*GiB\s*/\s*rank")


def published(
    est: Estimate, spec: Deployment, fits: list[GpuFit], observed: int | None = None
) -> list[Comparison]:
    """The recipe's numbers (readiness.kv_cache_tokens; "weights … N GiB/rank" in its notes) next to ours,
    and ``observed``: the KV-cache size the engine itself logged on this rig's last boot (``invoke wait``)."""
    out = []
    for note in spec.notes:
        m = _PER_RANK.search(note)
        if m:
            heaviest = max(r.weights for r in est.ranks)
            out.append(Comparison("weights, heaviest rank", heaviest / GiB, float(m.group(1)), "GiB"))
            break
    kv = spec.readiness.kv_cache_tokens
    totals = [f.total for f in fits if f.gpu is not None]
    if totals:
        est = est.for_card(totals[0], fits[0].card)
    tokens = est.kv_tokens(totals) if len(totals) == len(est.ranks) else None
    if tokens is not None and kv:
        out.append(Comparison("GPU KV cache size", float(tokens), float(kv), "tokens"))
    if tokens is not None and observed:
        out.append(Comparison("GPU KV cache size, last boot here", float(tokens), float(observed), "tokens"))
    return out


_STYLE = {"go": "green", "warn": "yellow", "no-go": "bold red"}


def table(fits: list[GpuFit], title: str) -> Table:
    """Per-GPU rich table: needs, has, headroom, verdict."""
    t = Table(title=title, expand=False)
    for col in (
        "GPU",
        "rank",
        "weights",
        "KV",
        "act+graphs+other est.",
        "runtime est.",
        "needs",
        "has",
        "headroom",
    ):
        t.add_column(col, justify="right" if col not in ("GPU", "rank") else "left", no_wrap=True)
    t.add_column("verdict", no_wrap=True)
    t.add_column("why", overflow="fold")
    for f in fits:
        r = f.need
        t.add_row(
            "-" if f.gpu is None else f"GPU{f.gpu}",
            f"PP{r.pp_rank}/TP{r.tp_rank}",
            _gib(r.weights),
            _gib(f.kv),
            _mib(r.activation + r.cuda_graphs + r.non_torch),
            _mib(r.runtime),
            _gib(f.needs),
            _gib(f.has),
            _mib(f.headroom),
            f"[{_STYLE[f.verdict]}]{f.verdict}[/]",
            f.why,
        )
    return t


def render(est: Estimate, fits: list[GpuFit], comps: list[Comparison], title: str, width: int = 200) -> str:
    """Plain text: the table, the published comparisons, and what the estimate left out."""
    buf = io.StringIO()
    console = Console(file=buf, width=width, color_system=None, force_terminal=False, legacy_windows=False)
    console.print(table(fits, title))
    p = est.params
    kv_src = (
        f"--kv-cache-memory {p.kv_cache_memory}"
        if p.kv_cache_memory is not None
        else f"what --gpu-memory-utilization {p.gpu_memory_utilization:g} leaves"
    )
    lines = [
        f"layers per stage: {', '.join(f'{b - a}' for a, b in est.stages)} (TP={p.tp}, PP={p.pp}"
        + (", expert parallel" if p.expert_parallel else "")
        + (", MTP" if p.mtp else "")
        + f"); {est.tensors} tensors; KV = {kv_src}",
        "needs = what the driver keeps + runtime + the larger of --gpu-memory-utilization × PyTorch's total "
        "(vLLM wants it free at start) and the rank's peak: weights + memory outside PyTorch + the larger of "
        "the profile's activations and KV + graphs",
        "est. = estimate: profile-run activation peak, CUDA graphs, memory outside PyTorch (other), CUDA "
        f"context + NCCL; vLLM's rules for {est.era.name} engines (resolving/fit/fitengine.py, docs/fit.md)",
    ]
    lines += [f"{c.what}: estimate {c.estimate:,.2f} {c.unit}, published {c.published:,.2f} {c.unit}, "
              f"ratio {c.ratio:.3f}" for c in comps]  # fmt: skip
    lines += [f"not on the GPU: {why} ({_gib(n)})" for why, n in est.skipped.items()]
    lines += [f"note: {n}" for n in est.notes]
    if est.unknown:
        lines.append(f"placed on the first stage, replicated (unrecognised names): {', '.join(est.unknown)}")
    lines.append(overall(fits)[1])
    console.print("\n".join(lines), highlight=False, markup=False)
    return buf.getvalue()


NO_SIZE = "no GPU size known (no driver, no resources.gpus.vram_gib)"


def overall(fits: list[GpuFit]) -> tuple[Verdict | None, str]:
    """The one answer: the conjunction of the rows (any no-go: NO-GO; else any warn: WARN; GO only when
    every rank is go), or no verdict where no GPU size is known."""
    if not fits:
        return None, f"fit: no verdict: {NO_SIZE}; pass --vram-gib 24 (one size per card: 24,24,12)"
    bad = sum(f.verdict == "no-go" for f in fits)
    warn = sum(f.verdict == "warn" for f in fits)
    if bad:
        return "no-go", f"fit: NO-GO on {bad} GPU(s)"
    if warn:
        return "warn", f"fit: WARN on {warn} GPU(s), not a GO (reasons in the table)"
    return "go", "fit: GO"


def doctor_row(fits: list[GpuFit], comps: list[Comparison]) -> Check:
    """One row for ``doctor``: the worst GPU, named with its squatter."""
    if not fits:
        return Check("fit", "warn", f"no verdict: {NO_SIZE}")
    bad = [f for f in fits if f.verdict == "no-go"]
    warn = [f for f in fits if f.verdict == "warn"]
    shown = bad or warn
    ratio = "; ".join(f"{c.what} est./published {c.ratio:.2f}" for c in comps)

    def line(f: GpuFit) -> str:
        where = "-" if f.gpu is None else f"GPU{f.gpu}" + (f" ({f.card})" if "assumed" in f.card else "")
        return (
            f"{where} PP{f.need.pp_rank}/TP{f.need.tp_rank}: needs {_gib(f.needs)}, has {_gib(f.has)}, "
            f"headroom {_mib(f.headroom)}" + (f" — {f.why}" if f.why else "")
        )

    if not shown:
        least = min(fits, key=lambda f: f.headroom)
        detail = f"every rank fits; least headroom {_mib(least.headroom)} on GPU{least.gpu}"
        return Check("fit", "go", detail + (f" ({ratio})" if ratio else ""))
    detail = "; ".join(line(f) for f in shown) + (f" ({ratio})" if ratio else "")
    if not bad:
        return Check("fit", "warn", detail, "`invoke fit` shows the per-rank estimate")
    hint = (
        "stop the process(es) named (`kill PID`, `podman stop NAME`), then run doctor again"
        if any(f.squatters for f in bad)
        else "lower --gpu-memory-utilization/--kv-cache-memory/--max-model-len, or use more or larger GPUs"
    ) + "; `invoke fit --propose` ranks the layouts that fit this rig"
    return Check("fit", "no-go", detail, hint)


def fit_check(spec: Deployment, lock: Lock, facts: HostFacts, env: Mapping[str, str]) -> Check:
    """doctor's fit row, from the metadata of a checkpoint on this host (doctor makes no network request);
    an estimate that cannot be made is a warn."""
    # Here, not at the top: checkpoint loads huggingface_hub (~330 ms measured), and doctor, up and down
    # import this module; only doctor's fit row reads a checkpoint.
    from rigsmith.resolving.fit.checkpoint import estimate_for, open_checkpoint

    try:
        est = estimate_for(spec, open_checkpoint(spec, lock, env, local_only=True))
    except RigsmithError as err:
        return Check("fit", "warn", f"not estimated: {err.message}", err.hint or "`invoke fit` says more")
    fits = fit_gpus(est, spec, facts)
    return doctor_row(fits, published(est, spec, fits))
