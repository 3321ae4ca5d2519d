"""One validation pass: every problem of a spec + lock + target, collected and reported at once.

The rules live where they belong (the spec model, ``plan.problems``, each target's ``CHECKS``); this module
only runs them all without stopping at the first, so the user fixes a broken spec in one round. Pure.
"""

from __future__ import annotations

from typing import Literal

from rigsmith import spec as specmod
from rigsmith.errors import RigsmithError, SpecError
from rigsmith.rendering import plan as planmod
from rigsmith.rendering.targets import RenderContext, find
from rigsmith.rendering.targets.refusals import problems as target_problems
from rigsmith.resolving.lock import lock as lockmod


def problems(
    spec: specmod.Deployment,
    lock: lockmod.Lock,
    target: str,
    ctx: RenderContext,
    *,
    spec_path: str,
    image: str | None = None,
    memlock: Literal["unlimited", "host"] | int | None = None,
) -> list[tuple[str, str]]:
    """(field path, message) of every problem: the spec's and the plan's first, then the target's.

    A missing pin or image is not among them: ``plan.make`` refuses it afterwards with the command that
    fixes it; the target's checks here run on the plan without an image.
    """
    out = planmod.problems(spec, image)
    try:
        ref = planmod.resolve_image(spec, lock, image)
    except RigsmithError:
        ref = ("", False)
    plan = planmod.build(spec, ref, spec_path=spec_path, memlock=memlock)
    found = find(target)
    checks = found[1] if found is not None else ()
    return out + [p for p in target_problems(plan, ctx, checks) if p not in out]


def refuse(spec_path: str, found: list[tuple[str, str]]) -> None:
    """Raise one SpecError naming ``spec_path`` with every problem :func:`problems` found, or nothing."""
    if found:
        raise SpecError(spec_path, found)
