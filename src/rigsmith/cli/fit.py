"""invoke fit: will the recipe fit each GPU? Estimated from checkpoint metadata, before any download."""

# rigsmith's areas load inside the tasks: importing them here costs every command ~1 s (cli/__init__.py).

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import TYPE_CHECKING

from invoke.context import Context
from invoke.exceptions import Exit
from invoke.tasks import task

from rigsmith import writer
from rigsmith.cli.flags import DEPLOYMENT, helps
from rigsmith.cli.wiring import echo, project, user_errors
from rigsmith.digits import ascii_digits
from rigsmith.errors import RigsmithError

if TYPE_CHECKING:
    from rigsmith.operating.fit.rigsource import Planned
    from rigsmith.operating.probes import HostFacts
    from rigsmith.project import Project
    from rigsmith.spec import Deployment

PROPOSE_HINT = "`invoke fit --propose` ranks the layouts that fit this rig"


def _number(flag: str, text: str | None, kind: type[float] | type[int]) -> float | int | None:
    if text is None:
        return None
    try:
        value = kind(text)
    except ValueError:
        raise RigsmithError(f"{flag} {text!r} is not a number", hint=f"e.g. {flag} 24") from None
    if not math.isfinite(value) or value < 0:
        raise RigsmithError(f"{flag} {text!r} is not a finite number ≥ 0", hint=f"e.g. {flag} 24")
    return value


@task(
    help={
        **helps(DEPLOYMENT),
        "vram_gib": "estimate for idle cards of these sizes instead of this host's GPUs: one size per card "
        "(24,24,12), or one size for --gpus N cards (default: as many as the spec asks for)",
        "gpus": "with --vram-gib SIZE (or the spec's resources.gpus.vram_gib): a rig of N such idle cards",
        "rig": "a YAML file describing a rig you do not have (cards: name, total_gib, free_gib, held_by; "
        "links: P2P pairs), see docs/spec.md",
        "propose": "rank the layouts vLLM accepts on every choice of the rig's cards; show the recipe's and "
        "the top three",
        "max_model_len": "with --propose/--apply: the longest context to ask for (it lets a proposal change "
        "the recipe's --max-model-len)",
        "headroom_gib": "with --propose/--apply: GiB every GPU keeps free (default: 0.5, or the recipe's "
        "own where it runs closer)",
        "allow": "with --propose/--apply: the recipe's pinned values a proposal may change, comma-separated: "
        "max-model-len, kv-cache-memory, kv-cache-dtype, gpu-memory-utilization, or all (default: none)",
        "apply": "write proposal N (as --propose numbers them, with the same rig, --allow, --max-model-len "
        "and --headroom-gib) into the spec: argv flags, env, the cards, readiness and a note",
    }
)
@user_errors
def fit(
    c: Context,
    deployment: str | None = None,
    vram_gib: str | None = None,
    gpus: str | None = None,
    rig: str | None = None,
    propose: bool = False,
    max_model_len: str | None = None,
    headroom_gib: str | None = None,
    allow: str | None = None,
    apply: str | None = None,
) -> None:
    """Per-GPU memory verdict from the checkpoint's headers and config (range requests only)."""
    from rigsmith.operating.fit import observed
    from rigsmith.operating.fit import report as fitreport
    from rigsmith.operating.host import LocalHost, gather
    from rigsmith.resolving.fit.checkpoint import estimate_for, open_checkpoint
    from rigsmith.resolving.fit.fit import engine_inputs
    from rigsmith.resolving.lock import lock

    p = project(c)
    spec = p.load(deployment)
    planned = _planned(spec, vram_gib, gpus, rig, engine_inputs(spec).world)
    locked = lock.read(p.lock_path)
    facts = None if planned is not None else gather(LocalHost(), model_dir=spec.model.local_dir)
    if propose or apply is not None:
        _propose(p, spec, facts, planned, max_model_len, headroom_gib, allow, apply)
        return
    est = estimate_for(spec, open_checkpoint(spec, locked, os.environ))
    fits = fitreport.fit_gpus(est, spec, facts, planned=planned)
    seen = observed.last(p.root, spec, locked)
    comps = fitreport.published(est, spec, fits, seen.kv_cache_tokens if seen else None)
    echo(fitreport.render(est, fits, comps, f"fit: {spec.name}").rstrip())
    verdict, line = fitreport.overall(fits)
    if verdict is None:
        raise Exit(line, code=1)
    if verdict == "no-go":
        raise Exit(f"{line} (reasons in the table); {PROPOSE_HINT}", code=1)


def _planned(
    spec: Deployment, vram_gib: str | None, gpus: str | None, rig: str | None, world: int
) -> Planned | None:
    """The rig named on the command line (None: this host's GPUs)."""
    from rigsmith.operating.fit import rigsource

    n = _number("--gpus", gpus, int)
    if rig is not None:
        if vram_gib is not None or gpus is not None:
            raise RigsmithError("--rig describes the whole rig: leave out --vram-gib and --gpus")
        return rigsource.load(Path(rig))
    g = spec.resources.gpus
    idx = [int(x) + 1 for d in g.cdi_devices if ascii_digits(x := d.split("=", 1)[1])]
    return rigsource.from_flags(
        vram_gib, None if n is None else int(n), g.vram_gib, max(world, g.count, *idx), g.model
    )


def _allowed(allow: str | None) -> frozenset[str]:
    from rigsmith.resolving.fit.propose import PINS

    if allow is None:
        return frozenset()
    names = {a.strip() for a in allow.split(",") if a.strip()}
    if "all" in names:
        return frozenset(PINS)
    bad = sorted(names - set(PINS))
    if bad:
        raise RigsmithError(
            f"--allow {allow!r}: {', '.join(bad)} is not a value a proposal can change",
            hint=f"name some of {', '.join(PINS)} (comma-separated), or all",
        )
    return frozenset(names)


def _propose(
    p: Project,
    spec: Deployment,
    facts: HostFacts | None,
    planned: Planned | None,
    max_model_len: str | None,
    headroom_gib: str | None,
    allow: str | None,
    apply: str | None,
) -> None:
    """--propose / --apply N: the search on this rig, shown or written."""
    from rigsmith import spec as specmod
    from rigsmith.operating.bench import bench
    from rigsmith.operating.fit import layoutmenu as fitpropose
    from rigsmith.operating.fit import observed
    from rigsmith.operating.fit import pastruns as fithistory
    from rigsmith.resolving.fit.checkpoint import open_checkpoint, rows
    from rigsmith.resolving.fit.fit import GiB, ModelShape, engine_inputs, parse_bytes
    from rigsmith.resolving.lock import lock

    cap = parse_bytes("--max-model-len", max_model_len) if max_model_len else None
    room = _number("--headroom-gib", headroom_gib, float)
    n = _number("--apply", apply, int)
    allowed = _allowed(allow) | ({"max-model-len"} if cap is not None else set())
    path = p.spec_path(spec.name)
    read = path.read_text(encoding="utf-8")
    rig = fitpropose.rig_of(spec, facts, planned, engine_inputs(spec).world)
    if rig is None:
        raise RigsmithError(
            "no verdict: no GPU size known: no driver here and no resources.gpus.vram_gib in the spec",
            hint="pass --vram-gib 24 (one size per card: 24,24,12), or --rig FILE for a rig you do not have",
        )
    locked = lock.read(p.lock_path)
    ckpt = open_checkpoint(spec, locked, os.environ)
    shape = ModelShape.from_config(ckpt.config(), f"{ckpt.where}/config.json")
    headroom = None if room is None else int(room * GiB)
    seen = observed.last(p.root, spec, locked)
    runs = bench.history(bench.results_path(p.root), spec.name)
    prop = fitpropose.propose(
        spec, shape, rows(ckpt), rig, headroom=headroom, cap=cap, seen=seen, bench_rows=runs,
        own=fitpropose.own_rig(spec, facts, planned, rig), allow=frozenset(allowed),
    )  # fmt: skip
    if n is None:
        echo(fitpropose.render(prop, f"fit --propose: {spec.name}").rstrip())
        return
    new, what = fitpropose.apply(path, read, spec, prop, int(n))
    # the spec's own header lines (the schema modeline, the user's comments) stay on top
    current = path.read_text(encoding="utf-8")
    header = "".join(line for line in _header(current))
    artifacts = [writer.Artifact(path, header + specmod.dump(new))]
    for outcome in writer.plan(artifacts):
        if outcome.status == "update":
            echo(outcome.diff(p.root).rstrip())
    # --apply N is the user's explicit choice of this change: it is the consent
    writer.write(artifacts, yes=True, echo=echo, root=p.root)
    entry = fithistory.record_apply(p.lock_path, f"{path.name}: {what}")
    echo(
        f"proposal {n} written into {path.name}"
        + (
            f" (lock history entry {entry})"
            if entry
            else " (no rigsmith.lock yet, so no lock history entry: the note in the spec records it)"
        )
        + "; `invoke fit` shows its per-GPU verdict"
    )


def _header(text: str) -> list[str]:
    """The comment lines the file starts with."""
    out = []
    for line in text.splitlines(keepends=True):
        if not line.startswith("#"):
            break
        out.append(line)
    return out
