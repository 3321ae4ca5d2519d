"""Deploy targets: each turns a RunPlan into artifacts; ``find`` gives one by name, with its checks."""

from __future__ import annotations

from rigsmith.project import TARGETS
from rigsmith.rendering.targets import compose, kube, lxc, podman, quadlet
from rigsmith.rendering.targets.context import Checker as Checker
from rigsmith.rendering.targets.context import LxcOptions as LxcOptions
from rigsmith.rendering.targets.context import RenderContext as RenderContext
from rigsmith.rendering.targets.context import Renderer as Renderer

_MODULES = {"podman": podman, "quadlet": quadlet, "compose": compose, "lxc": lxc, "kube": kube}


def find(name: str) -> tuple[Renderer, tuple[Checker, ...]] | None:
    """The renderer of target ``name`` and the checks it refuses a plan with; None for an unknown name."""
    module = _MODULES.get(name)
    return (module.render, module.CHECKS) if module is not None else None


def renderers() -> dict[str, Renderer]:
    """Target name → renderer, for every target (imports them all)."""
    return {name: found[0] for name in TARGETS if (found := find(name)) is not None}


def checks() -> dict[str, tuple[Checker, ...]]:
    """Target name → what the target cannot express, as data: the checks its renderer refuses with."""
    return {name: found[1] for name in TARGETS if (found := find(name)) is not None}
