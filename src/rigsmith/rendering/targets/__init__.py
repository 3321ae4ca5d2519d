"""Deploy targets: each turns a RunPlan into artifacts. Registered by name in RENDERERS."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from rigsmith.project import TARGETS
from rigsmith.rendering.plan import RunPlan
from rigsmith.spec import Deployment
from rigsmith.writer import Artifact


@dataclass(frozen=True)
class LxcOptions:
    """Proxmox facts the spec does not hold (``invoke deploy --target lxc`` options)."""

    vmid: int = 100
    pve_version: str = (
        "8.2"  # devN: passthrough needs PVE 8.1 (pve-container 5.0.7); older gets raw lxc.* keys
    )
    config: Path | None = None  # an existing /etc/pve/lxc/VMID.conf (copy) to update in place
    home: str = "/root"  # what ~/ means on the PVE host and in the CT (pct and the CT's podman run as root)
    cores: int = 8
    storage: str = "local-lvm"
    rootfs_gib: int = 64
    order: int = 10
    uvm_major: int | None = None  # host fact for PVE < 8.1: `grep nvidia-uvm /proc/devices`
    resolve: Literal["ours", "theirs"] | None = None  # --lxc-config: a setting both changed → whose value
    replace_passthrough: bool = False  # --lxc-config: drop the user's GPU passthrough in another form


def _no_file(_path: Path) -> str | None:
    return None


@dataclass(frozen=True)
class RenderContext:
    """What every renderer gets besides the plan."""

    spec: Deployment
    out: Path  # artifacts go under out/<target>/…
    command: str  # the invoke command line for the banner
    podman_version: str | None = None
    lxc: LxcOptions = field(default_factory=LxcOptions)
    #: Reads a file the target merges into (an existing pct.conf); injected by deploy, None when absent.
    read: Callable[[Path], str | None] = _no_file
    #: Tells the user something a render found and did not change (a CT's memory below the need).
    warn: Callable[[str], None] = lambda _msg: None


Renderer = Callable[[RunPlan, RenderContext], list[Artifact]]
#: (field path, message) problems a target finds in a plan; see ``common.Check``.
Checker = Callable[[RunPlan, RenderContext], list[tuple[str, str]]]


def find(name: str) -> tuple[Renderer, tuple[Checker, ...]] | None:
    """The renderer of target ``name`` and the checks it refuses a plan with; None for an unknown name.

    Only that target's module is imported (a check or render of one target pays for no other), and an
    import error names that target.
    """
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
