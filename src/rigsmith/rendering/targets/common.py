"""What every target derives the same way from a RunPlan: timeouts that nest, the health probe, paths.

Pure. The nesting rule (shared/DESIGN.md): vLLM ``--shutdown-timeout`` < container stop timeout < systemd
``TimeoutStopSec`` < Proxmox ``startup: down=``. Each outer layer adds a fixed margin so a slow ``podman rm``
or a systemd unit stop is never cut short by the layer around it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from rigsmith.errors import SpecError
from rigsmith.render import breaks_line, line_breaks
from rigsmith.rendering.plan import RunPlan
from rigsmith.rendering.targets.context import Checker, RenderContext

#: Seconds each enclosing layer adds to the stop timeout inside it.
STOP_MARGIN = 30
#: The health start period is this many times the recipe's first-boot time (kernel JIT, cold caches).
START_PERIOD_FACTOR = 2
#: Seconds systemd waits before restarting a crashed engine (RestartSec=). systemd's 100 ms default was seen
#: (systemd 257 + podman 5.4.2) to burn the 5-starts-in-10-s limit in under a second and leave the unit
#: failed for good; a crash caused by VRAM still being released needs the pause too.
RESTART_SEC = 10
#: Seconds between health probes, per-probe timeout, failures before "unhealthy".
HEALTH_INTERVAL = 30
HEALTH_TIMEOUT = 10
HEALTH_RETRIES = 3


@dataclass(frozen=True)
class Timings:
    """Seconds, all derived from the plan; the nesting holds by construction."""

    shutdown: int | None  # vLLM --shutdown-timeout (None: vLLM's default 0, abort in-flight requests)
    container_stop: int  # podman --stop-timeout / compose stop_grace_period / kube terminationGracePeriod
    systemd_stop: int  # TimeoutStopSec of the unit that runs the container
    pve_down: int  # Proxmox `startup: down=` of the CT that holds the unit
    start_period: int  # health start period: failures before it do not count
    systemd_start: int  # TimeoutStartSec: start period plus one full failure window
    pve_up: int  # Proxmox `startup: up=`: delay before the next CT starts

    @property
    def chain(self) -> list[int]:
        """The stop timeouts from the innermost out (shutdown first when set)."""
        inner = [] if self.shutdown is None else [self.shutdown]
        return [*inner, self.container_stop, self.systemd_stop, self.pve_down]


def timings(plan: RunPlan) -> Timings:
    """Every timeout a target writes, from the stop grace and the expected first boot."""
    start = plan.startup_seconds * START_PERIOD_FACTOR
    return Timings(
        shutdown=plan.shutdown_timeout,
        container_stop=plan.stop_timeout,
        systemd_stop=plan.stop_timeout + STOP_MARGIN,
        pve_down=plan.stop_timeout + 2 * STOP_MARGIN,
        start_period=start,
        systemd_start=start + HEALTH_INTERVAL * (HEALTH_RETRIES + 1),
        pve_up=plan.startup_seconds,
    )


def health_url(plan: RunPlan) -> str:
    """The URL probed from inside the container's network namespace (host network: where vLLM listens,
    loopback for a wildcard bind)."""
    return plan.health_url


def health_argv(plan: RunPlan) -> list[str]:
    """The health check command, run inside the container.

    vLLM images always carry python3 but not always curl, so the probe is a python one-liner that exits
    non-zero unless the server answers 2xx.
    """
    code = f"import urllib.request as u; u.urlopen({health_url(plan)!r}, timeout={HEALTH_TIMEOUT - 2})"
    return ["python3", "-c", code]


#: One capability check of a target: the fields of a plan it cannot express, each with the final message.
Check = Checker


def cannot_express(target: str, problems: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """Spec fields a target has no way to express, each message naming the target."""
    return [(fld, f"the {target} target cannot express this: {why}") for fld, why in problems]


def problems(plan: RunPlan, ctx: RenderContext, checks: Sequence[Check]) -> list[tuple[str, str]]:
    """Every problem a target's checks find, none raised (``rendering.validate`` and each renderer)."""
    return [p for check in checks for p in check(plan, ctx)]


def refuse(plan: RunPlan, ctx: RenderContext, checks: Sequence[Check]) -> None:
    """Raise one SpecError naming every field the target's checks find, or nothing."""
    bad = problems(plan, ctx, checks)
    if bad:
        raise SpecError(plan.spec_path, bad)


def runs_container(target: str) -> Check:
    """Refuse a venv plan in a target that runs an image (podman, quadlet, compose, kube)."""

    def check(plan: RunPlan, _ctx: RenderContext) -> list[tuple[str, str]]:
        if plan.runtime == "container":
            return []
        why = (
            f"{plan.runtime!r} runs vLLM from {plan.venv or 'a venv'}, but this target runs "
            "a container image; set engine.runtime: container with engine.image (or engine.build), "
            "or use --target lxc, which runs the venv in the CT"
        )
        return cannot_express(target, [("engine.runtime", why)])

    return check


def expressed(target: str, *found: Callable[[RunPlan], list[tuple[str, str]]]) -> Check:
    """A check from plan-only problem finders, whose messages get the target's "cannot express" prefix."""

    def check(plan: RunPlan, _ctx: RenderContext) -> list[tuple[str, str]]:
        return cannot_express(target, [p for f in found for p in f(plan)])

    return check


def mount_fields(plan: RunPlan) -> list[tuple[str, str, str, str]]:
    """(host field, host path, container field, container path) of every mount, named as in the spec."""
    out = []
    extra = 0
    for m in plan.mounts:
        if m.role == "model":
            out.append(("model.local_dir", m.host, "model.container_path", m.container))
        elif m.role == "secondary":
            out.append((f"{m.field}.local_dir", m.host, f"{m.field}.container_path", m.container))
        else:
            out.append((f"mounts[{extra}].host", m.host, f"mounts[{extra}].container", m.container))
            extra += 1
    return out


def volume_problems(plan: RunPlan) -> list[tuple[str, str]]:
    """Mount paths the ``host:container[:ro]`` volume syntax (podman -v, quadlet, compose) would split.

    podman and the compose front-ends split that string on ``:``, so a path holding one would mount the
    wrong directory (or fail with a misleading option error) instead of reaching the engine literally.
    """
    return [
        (fld, f"{path!r}: the host:container volume syntax splits on ':'")
        for hfld, host, cfld, cont in mount_fields(plan)
        for fld, path in ((hfld, host), (cfld, cont))
        if ":" in path
    ]


def entrypoint_problems(plan: RunPlan) -> list[tuple[str, str]]:
    """An executable podman's ``--entrypoint`` (and quadlet's Entrypoint=) would parse as a JSON array."""
    if plan.entrypoint.lstrip().startswith("["):
        return [
            (
                "engine.executable",
                f"{plan.entrypoint!r}: podman reads an --entrypoint starting with '[' as a JSON argv",
            )
        ]
    return []


def line_value_problems(values: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """Values written raw as one ``Key=value`` line (quadlet Image=, Entrypoint=, Volume=) that would not
    stay one literal value: a newline starts a new key or section (e.g. an ExecStartPre= run as root), a
    trailing backslash continues the line, surrounding whitespace and double quotes are trimmed by the unit
    parser."""
    out = []
    for fld, value in values:
        if breaks_line(value):
            out.append((fld, f"{value!r}: holds a line break (of any kind) or other control character"))
        elif value.endswith("\\"):
            out.append((fld, f"{value!r}: a trailing backslash continues the line"))
        elif value != value.strip():
            out.append((fld, f"{value!r}: leading or trailing whitespace is trimmed"))
        elif value.startswith('"') or value.endswith('"'):  # seen with podman 5.4.2's generator
            out.append((fld, f"{value!r}: quadlet strips a leading or trailing double quote"))
    return out


def duration(seconds: int) -> str:
    """Seconds as a compact duration (``70s``, ``12m``, ``1h30m``) for compose, systemd and podman."""
    if seconds % 60 or seconds < 60:
        return f"{seconds}s"
    minutes = seconds // 60
    if minutes % 60 == 0:
        return f"{minutes // 60}h"
    return f"{minutes // 60}h{minutes % 60}m" if minutes >= 60 else f"{minutes}m"


class _NoAliasDumper(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:
        return True


#: Plain scalars that some YAML reader types as non-string: YAML 1.2 core (``1e5``, ``0o17``, ``.inf``),
#: YAML 1.1 (``yes``/``on``/``y``, ``1_000``, sexagesimal ``12:30:00``, ``0b101``, ``017``) and Go's
#: yaml/strconv (podman kube play, Kubernetes: ``0x1F``, underscores, ``+1``). PyYAML's own resolver (YAML
#: 1.1) misses the 1.2 and Go forms, so a string matching this is emitted quoted. ``\Z``: ``$`` would
#: accept a trailing newline.
_TYPED_PLAIN = re.compile(
    r"""(?:
      ~|null|Null|NULL
    | y|Y|yes|Yes|YES|n|N|no|No|NO|true|True|TRUE|false|False|FALSE|on|On|ON|off|Off|OFF
    | [-+]?(?:0[bB][01_]*|0[oO][0-7_]*|0[xX][0-9a-fA-F_]*)
    | [-+]?[0-9][0-9_]*(?::[0-5]?[0-9])*(?:\.[0-9_]*)?(?:[eE][-+]?[0-9]+)?
    | [-+]?\.[0-9][0-9_]*(?:[eE][-+]?[0-9]+)?
    | [-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN)
    )\Z""",
    re.VERBOSE,
)
_TYPED_TAG = "tag:rigsmith,2026:typed-plain"
_NoAliasDumper.add_implicit_resolver(_TYPED_TAG, _TYPED_PLAIN, None)


def _str_scalar(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    # Double quotes whenever a character would be folded or dropped in any other style: a line break of
    # any class (single quotes fold NEL/U+2028/U+2029 into a space) or anything unprintable; the
    # double-quoted style escapes them (\N, \L, \P, \x00).
    literal = not line_breaks(value) and value.isprintable() and "\ufeff" not in value
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=None if literal else '"')


_NoAliasDumper.add_representer(str, _str_scalar)


def yaml_text(*docs: Any, explicit_start: bool = False) -> str:
    """YAML for generated files: key order kept, no anchors/aliases, unicode kept, no line folding."""
    return yaml.dump_all(
        docs,
        Dumper=_NoAliasDumper,
        sort_keys=False,
        allow_unicode=True,
        width=10_000,
        explicit_start=explicit_start,
    )


def k8s_quantity(n: int) -> str:
    """Bytes as a Kubernetes quantity (``8Gi`` when exact)."""
    for unit, size in (("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
        if n % size == 0:
            return f"{n // size}{unit}"
    return str(n)


#: What every target runs for a file mount before its container starts (seeds/000 pitfall 2) — run.sh, the
#: quadlet unit's ``ExecStartPre=``, compose's files.sh, the lxc CT's ``lxc.hook.pre-start`` — as one
#: ``sh -c`` with the path and size (0: no size) as arguments, never in the script text: podman makes a
#: directory for a missing path, and a file of another size is the stale file the patched loader rejects. A
#: third argument, when not empty, is the ``uid:gid`` a created file is given (the lxc target's CT root, so an
#: unprivileged CT can write it).
FILE_CHECK = " ".join(
    [
        'f=$1 n=$2; if [ -d "$f" ]; then echo "$f is a directory, but the deployment mounts a file there:',
        'remove the directory (podman makes one for a missing path)" >&2; exit 1; fi;',
        'if [ ! -e "$f" ]; then if [ "$n" = 0 ]; then echo "$f does not exist: create the file the engine',
        'reads (never a directory)" >&2; exit 1; fi; mkdir -p "$(dirname "$f")" && truncate -s "$n" "$f"',
        '&& { [ -z "${3:-}" ] || chown "$3" "$f"; }',
        '&& echo "created sparse file $f ($n bytes)"; exit; fi;',
        'if [ ! -f "$f" ]; then echo "$f is not a regular file, but the deployment mounts a file there" >&2;',
        "exit 1; fi;",
        'if [ "$n" != 0 ] && [ "$(stat -c %s "$f")" != "$n" ]; then echo "$f has the wrong size; the engine',
        'needs exactly $n bytes: move it aside (it is then re-created sparse)" >&2; exit 1; fi',
    ]
)


def file_checks(plan: RunPlan) -> list[list[str]]:
    """One argv per file mount, run before the container starts (quadlet's ``ExecStartPre=``, compose's
    files.sh): a file of exactly ``sparse_size`` bytes (created sparse when missing), or any existing file
    when the spec gives no size (0)."""
    return [
        ["/bin/sh", "-c", FILE_CHECK, "rigsmith-file-check", m.host, str(m.sparse_size or 0)]
        for m in plan.mounts
        if m.kind == "file"
    ]
