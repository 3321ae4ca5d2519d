"""Deploy targets: each turns a RunPlan into artifacts; ``find`` imports the one asked for."""

from __future__ import annotations

from rigsmith.project import TARGETS
from rigsmith.rendering.targets.context import Checker as Checker
from rigsmith.rendering.targets.context import LxcOptions as LxcOptions
from rigsmith.rendering.targets.context import RenderContext as RenderContext
from rigsmith.rendering.targets.context import Renderer as Renderer


def find(name: str) -> tuple[Renderer, tuple[Checker, ...]] | None:
    """The renderer of target ``name`` and the checks it refuses a plan with; None for an unknown name.

    Only that target's module is imported (a check or render of one target pays for no other), and an
    import error names that target.
    """
    # deploy --check loads only the target it renders: the other four cost 13 ms (tests/test_startup.py).
    if name == "podman":
        from rigsmith.rendering.targets import podman

        return podman.render, podman.CHECKS
    if name == "quadlet":
        from rigsmith.rendering.targets import quadlet

        return quadlet.render, quadlet.CHECKS
    if name == "compose":
        from rigsmith.rendering.targets import compose

        return compose.render, compose.CHECKS
    if name == "lxc":
        from rigsmith.rendering.targets import lxc

        return lxc.render, lxc.CHECKS
    if name == "kube":
        from rigsmith.rendering.targets import kube

        return kube.render, kube.CHECKS
    return None


def renderers() -> dict[str, Renderer]:
    """Target name → renderer, for every target (imports them all)."""
    return {name: found[0] for name in TARGETS if (found := find(name)) is not None}


def checks() -> dict[str, tuple[Checker, ...]]:
    """Target name → what the target cannot express, as data: the checks its renderer refuses with."""
    return {name: found[1] for name in TARGETS if (found := find(name)) is not None}
