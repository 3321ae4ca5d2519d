"""invoke deploy.

rigsmith.rendering.deploy (the spec models, Jinja, the targets) loads inside the tasks: invoke imports
every task module for every command, ``--list`` included.
"""

from __future__ import annotations

import json
from pathlib import Path

from invoke.context import Context
from invoke.tasks import task

from rigsmith import writer
from rigsmith.cli.flags import DEPLOYMENT, IMAGE, MEMLOCK, OUT, TARGET, YES, helps, whole
from rigsmith.cli.wiring import confirm, echo, project, side, user_errors
from rigsmith.digits import ascii_digits
from rigsmith.userhome import invoking_home  # what ~ means is part of what is rendered


def _vmid(value: str | None, lxc_config: str | None) -> int:
    """--vmid, else the CT id a PVE config is named by (/etc/pve/lxc/101.conf → 101), else 100."""
    if value is not None:
        return whole("--vmid", value) or 100
    stem = Path(lxc_config).stem if lxc_config else ""
    return int(stem) if ascii_digits(stem) else 100


@task(
    help={
        **helps(TARGET, DEPLOYMENT, IMAGE, OUT, YES, MEMLOCK),
        "check": "write nothing; fail if the files on disk differ from what would be rendered",
        "podman_version": "target host's podman version (quadlet keys depend on it)",
        "vmid": "lxc: Proxmox CT id (names lxc/NAME/VMID.conf; default 100)",
        "pve_version": "lxc: Proxmox VE version (devN passthrough needs 8.1; default 8.2)",
        "lxc_config": "lxc: your CT's pct.conf (read, never written): only rigsmith's settings merge in, "
        "into lxc/NAME/VMID.conf (VMID from its name unless --vmid); every other line kept byte for byte",
        "ours": "lxc --lxc-config: where you and rigsmith changed the same setting, keep your value",
        "theirs": "lxc --lxc-config: where you and rigsmith changed the same setting, take rigsmith's",
        "replace_gpu_passthrough": "lxc --lxc-config: drop GPU passthrough lines of another form (raw "
        "lxc.mount.entry /dev/nvidia*, cgroup allow c 195:*) that devN lines replace",
        "uvm_major": "lxc, PVE < 8.1: nvidia-uvm char major from `grep nvidia-uvm /proc/devices` on the host",
    }
)
@user_errors
def deploy(
    c: Context,
    target: str,
    deployment: str | None = None,
    image: str | None = None,
    out: str | None = None,
    yes: bool = False,
    check: bool = False,
    memlock: str | None = None,
    podman_version: str | None = None,
    vmid: str | None = None,
    pve_version: str = "8.2",
    lxc_config: str | None = None,
    uvm_major: str | None = None,
    ours: bool = False,
    theirs: bool = False,
    replace_gpu_passthrough: bool = False,
) -> None:
    """Render run artifacts for one target from the spec and the lock."""
    home = invoking_home()
    from rigsmith.rendering import deploy as deploymod
    from rigsmith.rendering.targets import LxcOptions

    mem, uvm = MEMLOCK.value(memlock), None if uvm_major is None else whole("--uvm-major", uvm_major)
    if not check:  # --memlock and --image shape the artifacts: the spec keeps them, so later commands agree
        from rigsmith.operating.lifecycle.keptflags import keep_flags

        keep_flags(project(c), deployment, echo, memlock=mem, image=image)
    deploymod.deploy(
        project(c),
        target,
        deployment=deployment,
        image=image,
        out=Path(out) if out else None,
        home=home,
        yes=yes,
        check=check,
        confirm=confirm(),
        echo=echo,
        memlock=mem,
        podman_version=podman_version,
        lxc=LxcOptions(
            vmid=_vmid(vmid, lxc_config),
            pve_version=pve_version,
            config=Path(lxc_config) if lxc_config else None,
            uvm_major=uvm,
            resolve=side(ours, theirs),
            replace_passthrough=replace_gpu_passthrough,
        ),
    )


@task(
    help={
        **helps(DEPLOYMENT),
        "container": "container name, when it differs from the deployment name",
        "memlock": "the --memlock the artifacts were rendered with, if any",
    }
)
@user_errors
def check_container(
    c: Context, deployment: str | None = None, container: str | None = None, memlock: str | None = None
) -> None:
    """Fail loudly unless the running container got its CDI devices, shm and stop timeout."""
    from rigsmith.operating.lifecycle import verify

    verify.check_deployment(
        project(c),
        deployment=deployment,
        container=container,
        memlock=MEMLOCK.value(memlock),
    )
    echo("ok: devices, shm and stop timeout are as the deployment asks")


@task(help={"check": "write nothing; fail if the committed schema is stale"})
@user_errors
def schema(c: Context, check: bool = False) -> None:
    """Write schema/{deployment,image}.schema.json (JSON Schemas of the spec files, for editors)."""
    from rigsmith import spec
    from rigsmith.resolving.image import imagedef

    root = project(c).root
    schemas = {"deployment": spec.json_schema(), "image": imagedef.schema()}
    writer.write(
        [
            writer.Artifact(root / f"schema/{n}.schema.json", json.dumps(s, indent=2, sort_keys=True) + "\n")
            for n, s in schemas.items()
        ],
        yes=True,
        check=check,
        echo=echo,
        root=root,
    )
