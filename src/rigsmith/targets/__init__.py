"""Deploy targets: each turns a RunPlan into artifacts. Registered by name in RENDERERS."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rigsmith.plan import RunPlan
from rigsmith.spec import Deployment
from rigsmith.writer import Artifact


@dataclass(frozen=True)
class RenderContext:
    """What every renderer gets besides the plan."""

    spec: Deployment
    out: Path  # artifacts go under out/<target>/…
    command: str  # the invoke command line for the banner
    podman_version: str | None = None


Renderer = Callable[[RunPlan, RenderContext], list[Artifact]]


def renderers() -> dict[str, Renderer]:
    """Target name → renderer. Imported lazily so one target's import error names that target."""
    from rigsmith.targets import podman

    return {"podman": podman.render}
