"""invoke fit: will the recipe fit each GPU? Estimated from checkpoint metadata, before any download."""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING

from invoke.context import Context
from invoke.exceptions import Exit
from invoke.tasks import task

from rigsmith.errors import RigsmithError
from tasks._common import DEFAULT_DEP, echo, project, user_errors

if TYPE_CHECKING:
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
        "deployment": "deployments/NAME.yaml to estimate" + DEFAULT_DEP,
        "vram_gib": "estimate for idle cards of this many GiB instead of this host's GPUs",
        "propose": "rank the layouts vLLM accepts on this rig; show the recipe's and the top three",
        "max_model_len": "with --propose/--apply: the longest context to ask for (default: the recipe's, "
        "else the model's limit)",
        "headroom_gib": "with --propose/--apply: GiB every GPU keeps free (default: 0.5, or the recipe's "
        "own where it runs closer)",
        "apply": "write proposal N (as --propose numbers them, with the same --max-model-len/--headroom-gib) "
        "into the spec: argv flags, env and a note",
    }
)
@user_errors
def fit(
    c: Context,
    deployment: str | None = None,
    vram_gib: str | None = None,
    propose: bool = False,
    max_model_len: str | None = None,
    headroom_gib: str | None = None,
    apply: str | None = None,
) -> None:
    """Per-GPU memory verdict from the checkpoint's headers and config (range requests only)."""
    from rigsmith.operating import fitreport, observed
    from rigsmith.operating.host import LocalHost, gather
    from rigsmith.resolving import lock
    from rigsmith.resolving.checkpoint import estimate_for, open_checkpoint

    p = project(c)
    spec = p.load(deployment)
    size = _number("--vram-gib", vram_gib, float)
    locked = lock.read(p.lock_path)
    facts = None if size is not None else gather(LocalHost(), model_dir=spec.model.local_dir)
    if propose or apply is not None:
        _propose(p, spec, facts, size, max_model_len, headroom_gib, apply)
        return
    est = estimate_for(spec, open_checkpoint(spec, locked, os.environ))
    fits = fitreport.fit_gpus(est, spec, facts, size)
    seen = observed.last(p.root, spec, locked)
    comps = fitreport.published(est, spec, fits, seen.kv_cache_tokens if seen else None)
    echo(fitreport.render(est, fits, comps, f"fit: {spec.name}").rstrip())
    bad = [f for f in fits if f.verdict == "no-go"]
    if bad:
        raise Exit(f"fit: NO-GO on {len(bad)} GPU(s) (reasons in the table); {PROPOSE_HINT}", code=1)


def _propose(
    p: Project,
    spec: Deployment,
    facts: HostFacts | None,
    size: float | None,
    max_model_len: str | None,
    headroom_gib: str | None,
    apply: str | None,
) -> None:
    """--propose / --apply N: the search on this rig, shown or written."""
    from rigsmith import spec as specmod
    from rigsmith.operating import bench, fitpropose, observed
    from rigsmith.resolving import lock
    from rigsmith.resolving.checkpoint import open_checkpoint, rows
    from rigsmith.resolving.fit import GiB, ModelShape, engine_inputs, parse_bytes

    cap = parse_bytes("--max-model-len", max_model_len) if max_model_len else None
    room = _number("--headroom-gib", headroom_gib, float)
    n = _number("--apply", apply, int)
    path = p.spec_path(spec.name)
    read = path.read_text(encoding="utf-8")
    rig = fitpropose.rig_of(spec, facts, size, engine_inputs(spec).world)
    if rig is None:
        raise RigsmithError(
            "no GPU size known: no driver here and no resources.gpus.vram_gib in the spec",
            hint="pass --vram-gib 24 to propose for idle cards of that size",
        )
    locked = lock.read(p.lock_path)
    ckpt = open_checkpoint(spec, locked, os.environ)
    shape = ModelShape.from_config(ckpt.config(), f"{ckpt.where}/config.json")
    headroom = None if room is None else int(room * GiB)
    seen = observed.last(p.root, spec, locked)
    runs = bench.history(bench.results_path(p.root), spec.name)
    prop = fitpropose.propose(
        spec, shape, rows(ckpt), rig, headroom=headroom, cap=cap, seen=seen, bench_rows=runs
    )
    if n is None:
        echo(fitpropose.render(prop, f"fit --propose: {spec.name}").rstrip())
        return
    from rigsmith import writer

    new = fitpropose.apply(path, read, spec, prop, int(n))
    artifacts = [writer.Artifact(path, specmod.dump(new))]
    for outcome in writer.plan(artifacts):
        if outcome.status == "update":
            echo(outcome.diff(p.root).rstrip())
    # --apply N is the user's explicit choice of this change: it is the consent
    writer.write(artifacts, yes=True, echo=echo, root=p.root)
    echo(f"proposal {n} written into {path.name}; `invoke fit` shows its per-GPU verdict")
