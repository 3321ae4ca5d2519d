"""invoke fit: will the recipe fit each GPU? Estimated from checkpoint metadata, before any download."""

from __future__ import annotations

import os

from invoke.context import Context
from invoke.exceptions import Exit
from invoke.tasks import task

from rigsmith.errors import RigsmithError
from tasks._common import DEFAULT_DEP, echo, project, user_errors


@task(
    help={
        "deployment": "deployments/NAME.yaml to estimate" + DEFAULT_DEP,
        "vram_gib": "estimate for idle cards of this many GiB instead of this host's GPUs",
    }
)
@user_errors
def fit(c: Context, deployment: str | None = None, vram_gib: str | None = None) -> None:
    """Per-GPU memory verdict from the checkpoint's headers and config (range requests only)."""
    from rigsmith.operating import fitreport, observed
    from rigsmith.operating.host import LocalHost, gather
    from rigsmith.resolving import lock
    from rigsmith.resolving.checkpoint import estimate_for, open_checkpoint

    p = project(c)
    spec = p.load(deployment)
    try:
        size = float(vram_gib) if vram_gib is not None else None
    except ValueError:
        raise RigsmithError(f"--vram-gib {vram_gib!r} is not a number", hint="e.g. --vram-gib 24") from None
    locked = lock.read(p.lock_path)
    est = estimate_for(spec, open_checkpoint(spec, locked, os.environ))
    facts = None if size is not None else gather(LocalHost(), model_dir=spec.model.local_dir)
    fits = fitreport.fit_gpus(est, spec, facts, size)
    seen = observed.last(p.root, spec, locked)
    comps = fitreport.published(est, spec, fits, seen.kv_cache_tokens if seen else None)
    echo(fitreport.render(est, fits, comps, f"fit: {spec.name}").rstrip())
    bad = [f for f in fits if f.verdict == "no-go"]
    if bad:
        raise Exit(f"fit: NO-GO on {len(bad)} GPU(s) (reasons in the table)", code=1)
