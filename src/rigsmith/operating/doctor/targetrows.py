"""doctor's rows that belong to one target: the podman-compose front-end for ``compose``, and what a Proxmox
VE host must have for ``lxc`` (doctor runs there; the CT checks its own memlock and CDI in provision.sh).

The seed-000 pitfall is a compose front-end that starts the container without its GPUs and says nothing.
Which front-end does that depends on its version and on the form the devices are written in
(research/runtime-facts.md §1), so the row does not guess from a table: when the rendered
``compose/NAME/compose.yaml`` exists it asks podman-compose itself for a dry run and reads the ``--device``
arguments it would hand to podman.

``gather`` runs the probes (host adapter); ``rows`` is pure.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

from rigsmith.digits import ascii_digits
from rigsmith.operating.checkrow import Check
from rigsmith.operating.host import Host
from rigsmith.operating.probes import COMMANDS
from rigsmith.rendering.targets.lxc import NVIDIA_MAJOR
from rigsmith.spec import Deployment

#: podman-compose prints the podman commands of a dry run: 1.0.6 by itself, 1.6.0 only with --verbose (which
#: 1.0.6 rejects), so the verbose form is tried first.
_DRY_RUN = (
    'podman-compose --verbose -f "$1" --dry-run up -d 2>&1 || podman-compose -f "$1" --dry-run up -d 2>&1'
)
_RUN_LINE = re.compile(r"\bpodman (?:run|create)\b")
#: The /dev nodes a CT's NVIDIA passthrough binds (provision.sh binds them; the host must have them).
NVIDIA_NODES = ("nvidiactl", "nvidia-uvm")


def dry_run_argv(compose_file: str) -> tuple[str, ...]:
    """The probe: the podman commands podman-compose would run for ``compose_file`` (nothing started)."""
    return ("sh", "-c", _DRY_RUN, "sh", compose_file)


def parse_passed_devices(text: str) -> list[str]:
    """Every ``--device X`` of the podman run/create lines a podman-compose dry run printed."""
    out: list[str] = []
    for line in text.splitlines():
        m = _RUN_LINE.search(line)
        if m is None:
            continue
        try:
            words = shlex.split(line[m.start() :])
        except ValueError:
            words = line.split()
        for i, w in enumerate(words):
            if w == "--device" and i + 1 < len(words):
                out.append(words[i + 1])
            elif w.startswith("--device="):
                out.append(w.split("=", 1)[1])
    return out


def parse_compose_version(text: str) -> str | None:
    """``podman-compose --version`` → '1.6.0' (1.0.6 prints 'podman-compose version: 1.0.6' first)."""
    m = re.search(r"podman-compose version:? (\d+\.\d+\.\d+)", text)
    return m.group(1) if m else None


def parse_proc_devices(text: str) -> dict[str, int]:
    """``/proc/devices`` character section → driver name → major."""
    out: dict[str, int] = {}
    for line in text.split("Block devices:")[0].splitlines():
        major, _, name = line.strip().partition(" ")
        if ascii_digits(major) and name:
            out.setdefault(name.strip(), int(major))
    return out


@dataclass
class TargetFacts:
    """What the target's own rows look at."""

    compose_version: str | None = None
    compose_file: str | None = None  # the rendered file the dry run read (None: not rendered, not asked)
    compose_devices: list[str] | None = None  # --device values of the dry run (None: it did not run)
    compose_error: str | None = None
    majors: dict[str, int] = field(default_factory=dict)
    dev_nodes: list[str] = field(default_factory=list)  # nvidia* names under /dev
    pct: bool = False


def gather(host: Host, target: str, compose_file: str | None) -> TargetFacts:
    """Run the target's probes on ``host`` (none for podman, quadlet and kube)."""
    tf = TargetFacts()
    if target == "compose":
        res = host.run(COMMANDS["compose_version"])
        tf.compose_version = parse_compose_version(res.stdout) if res.code == 0 else None
        if tf.compose_version and compose_file and host.size(compose_file) is not None:
            tf.compose_file = compose_file
            dry = host.run(dry_run_argv(compose_file))
            if dry.code == 0:
                tf.compose_devices = parse_passed_devices(dry.stdout)
            else:
                tf.compose_error = next(
                    (ln.strip() for ln in reversed((dry.stdout + dry.stderr).splitlines()) if ln.strip()),
                    f"exit {dry.code}",
                )
    elif target == "lxc":
        text = host.read("/proc/devices")
        tf.majors = parse_proc_devices(text) if text else {}
        tf.dev_nodes = [n for n in host.listdir("/dev") if n.startswith("nvidia")]
        tf.pct = host.run(COMMANDS["pct"]).code == 0
    return tf


def rows(spec: Deployment, tf: TargetFacts, target: str) -> list[Check]:
    """The target's rows, in table order."""
    if target == "compose":
        return [_compose(spec, tf)]
    if target == "lxc":
        return [_pct(tf), _nvidia_nodes(spec, tf)]
    return []


def _compose(spec: Deployment, tf: TargetFacts) -> Check:
    if tf.compose_version is None:
        return Check(
            "podman-compose",
            "no-go",
            "podman-compose not found (the compose target's up command runs it)",
            "pip install podman-compose (1.0.6 and 1.6.0 pass `devices:`), or use --target podman",
        )
    detail = f"podman-compose {tf.compose_version}"
    if tf.compose_file is None:
        return Check(
            "podman-compose",
            "warn",
            detail + f"; whether it passes the CDI devices is not checked: compose/{spec.name}/compose.yaml "
            "is not rendered yet",
            f"`invoke deploy --target compose --deployment {spec.name}`, then doctor again (it dry-runs it)",
        )
    if tf.compose_devices is None:
        return Check(
            "podman-compose",
            "no-go",
            detail + f"; its dry run of {tf.compose_file} failed: {tf.compose_error}",
            f"run `podman-compose -f {tf.compose_file} --dry-run up -d` and fix what it names",
        )
    want = list(spec.resources.gpus.cdi_devices)
    dropped = [d for d in want if d not in tf.compose_devices]
    if dropped:
        return Check(
            "podman-compose",
            "no-go",
            detail + f" drops CDI device(s) {', '.join(dropped)} from {tf.compose_file} without a word "
            "(seeds/000 pitfall 1)",
            "list the devices under the service's `devices:` (as `invoke deploy --target compose` writes "
            "them), not deploy.resources.reservations",
        )
    return Check("podman-compose", "go", detail + f"; its dry run passes all {len(want)} CDI device(s)")


def _pct(tf: TargetFacts) -> Check:
    if tf.pct:
        return Check("pct", "go", "pct is here (Proxmox VE host)")
    return Check(
        "pct",
        "no-go",
        "pct not found: this is not a Proxmox VE host",
        "run `invoke doctor --target lxc` on the PVE host; inside the CT, provision.sh checks the CT's side",
    )


def _nvidia_nodes(spec: Deployment, tf: TargetFacts) -> Check:
    if not any(d.startswith("nvidia.com/") for d in spec.resources.gpus.cdi_devices):
        return Check("device nodes", "go", "no NVIDIA GPU in the spec; no /dev/nvidia* node to pass")
    nv = tf.majors.get("nvidia-frontend") or tf.majors.get("nvidia")
    uvm = tf.majors.get("nvidia-uvm")
    gpus = sorted(n for n in tf.dev_nodes if ascii_digits(n.removeprefix("nvidia")))
    missing = [n for n in NVIDIA_NODES if n not in tf.dev_nodes]
    problems = []
    if nv is None:
        problems.append("no nvidia major in /proc/devices (driver not loaded)")
    elif nv != NVIDIA_MAJOR:
        problems.append(
            f"nvidia major is {nv}, not {NVIDIA_MAJOR} (the pct.conf allow line says {NVIDIA_MAJOR})"
        )
    if uvm is None:
        problems.append("no nvidia-uvm major in /proc/devices (module not loaded)")
    if missing or len(gpus) < spec.resources.gpus.count:
        problems.append(
            f"/dev has {', '.join(gpus) or 'no nvidiaN'}"
            + (f"; missing {', '.join(missing)}" if missing else "")
        )
    if problems:
        return Check(
            "device nodes",
            "no-go",
            "; ".join(problems),
            "load the driver on the host (`modprobe nvidia nvidia-uvm`; `nvidia-smi` once creates the "
            "nodes, `nvidia-modprobe -u -c=0` creates nvidia-uvm's)",
        )
    return Check(
        "device nodes",
        "go",
        f"/dev/{', /dev/'.join(gpus)}, nvidiactl, nvidia-uvm; majors nvidia {nv}, nvidia-uvm {uvm} "
        f"(`--uvm-major {uvm}` for PVE < 8.1)",
    )
