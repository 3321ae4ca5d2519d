"""What every target renderer gets (the plan's context) and the shapes of a renderer and its checks.

Below the targets package's dispatch (``targets.find``), so each target imports this and not the package
that imports it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

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
    #: run.sh's hint when the image is not in local storage (resolving.image.engineroute's routes to it, for a
    #: deployment with a proposed build); None: the generic hint.
    image_hint: str | None = None
    #: run.sh's hint for a missing mounted directory (by its container path) that a mkdir would
    #: not fix: the recipe's checkout needs a clone.
    dir_hints: Mapping[str, str] = field(default_factory=dict)


Renderer = Callable[[RunPlan, RenderContext], list[Artifact]]
#: (field path, message) problems a target finds in a plan; see ``refusals.Check``.
Checker = Callable[[RunPlan, RenderContext], list[tuple[str, str]]]
