"""The quadlet target: ``quadlet/NAME.container``, keys chosen by the target host's podman version.

Quadlet validates keys strictly (an unknown key fails the whole unit), so a key newer than the target
podman is written as its ``PodmanArgs=`` equivalent instead (research/runtime-facts.md §3, from quadlet.go
at each tag).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from rigsmith import render as tpl
from rigsmith.render import banner
from rigsmith.rendering.plan import RunPlan
from rigsmith.rendering.targets.context import RenderContext
from rigsmith.rendering.targets.filecheck import file_checks
from rigsmith.rendering.targets.ini import Entry, sections, specifiers, systemd_word, systemd_words
from rigsmith.rendering.targets.refusals import (
    Check,
    cannot_express,
    entrypoint_problems,
    expressed,
    line_value_problems,
    mount_fields,
    refuse,
    runs_container,
    volume_problems,
)
from rigsmith.rendering.targets.timing import (
    HEALTH_INTERVAL,
    HEALTH_RETRIES,
    HEALTH_TIMEOUT,
    RESTART_SEC,
    health_argv,
    timings,
)
from rigsmith.writer import Artifact

Version = tuple[int, int, int]

#: podman version assumed when neither the spec nor --podman-version names one (Ubuntu 24.04, seeds/000).
DEFAULT_PODMAN_VERSION = "4.9.3"
#: Quadlet first shipped in podman 4.4.0.
QUADLET_SINCE: Version = (4, 4, 0)

#: First podman version whose quadlet accepts the key in [Container] (supportedContainerKeys per tag).
KEY_SINCE: dict[str, Version] = {
    "Image": (4, 4, 0),
    "ContainerName": (4, 4, 0),
    "Exec": (4, 4, 0),
    "AddDevice": (4, 4, 0),
    "Environment": (4, 4, 0),
    "Volume": (4, 4, 0),
    "Label": (4, 4, 0),
    "Network": (4, 4, 0),
    "RunInit": (4, 4, 0),
    "Notify": (4, 4, 0),
    "PodmanArgs": (4, 4, 0),
    "HealthCmd": (4, 5, 0),
    "HealthInterval": (4, 5, 0),
    "HealthTimeout": (4, 5, 0),
    "HealthRetries": (4, 5, 0),
    "HealthStartPeriod": (4, 5, 0),
    "Secret": (4, 5, 0),
    "Pull": (4, 6, 0),
    "ShmSize": (4, 7, 0),
    "Ulimit": (4, 7, 0),
    "StopTimeout": (5, 0, 0),
    "Entrypoint": (5, 0, 0),
}
#: Values that need a newer podman than their key (Notify=healthy → --sdnotify=healthy).
VALUE_SINCE: dict[tuple[str, str], Version] = {("Notify", "healthy"): (5, 0, 0)}
#: The `podman run` option a key stands for, used as PodmanArgs= when the key is too new.
PODMAN_FLAG: dict[str, str] = {
    "ShmSize": "--shm-size",
    "Ulimit": "--ulimit",
    "StopTimeout": "--stop-timeout",
    "Entrypoint": "--entrypoint",
    "Pull": "--pull",
    "HealthCmd": "--health-cmd",
    "HealthInterval": "--health-interval",
    "HealthTimeout": "--health-timeout",
    "HealthRetries": "--health-retries",
    "HealthStartPeriod": "--health-start-period",
    "Secret": "--secret",
}
#: CDI vendors whose spec is refreshed by a systemd unit at boot; the container unit is ordered after it.
CDI_REFRESH_UNITS: dict[str, str] = {"nvidia.com": "nvidia-cdi-refresh.service"}


_VERSION = re.compile(r"v?(\d+)\.(\d+)(?:\.(\d+))?(?:[-+~][0-9A-Za-z.+~_-]*)?")


def _version_text(ctx: RenderContext) -> str:
    return (ctx.podman_version or DEFAULT_PODMAN_VERSION).strip()  # it goes into a comment line


def parse_version(text: str) -> Version | None:
    """``4.9.3`` → (4, 9, 3); None when it is no podman version."""
    # The suffix is bounded: the text goes into a comment line of the unit, where a CR or any other line
    # break would start a new line (a `[Service]` with an ExecStartPre= run as root).
    m = _VERSION.fullmatch(text)
    return None if m is None else (int(m.group(1)), int(m.group(2)), int(m.group(3) or 0))


def _version_problems(_plan: RunPlan, ctx: RenderContext) -> list[tuple[str, str]]:
    """A bad podman_version, or a podman without quadlet."""
    text = _version_text(ctx)
    v = parse_version(text)
    if v is None:
        return [
            ("podman_version (or --podman-version)", f"{text!r} is not a podman version; write e.g. 4.9.3")
        ]
    if v < QUADLET_SINCE:
        return [
            (
                "podman_version",
                f"the quadlet target cannot express this: podman {text} has no quadlet "
                "(needs 4.4.0 or later); use --target podman, or set the host's real version",
            )
        ]
    return []


@dataclass(frozen=True)
class _Key:
    key: str
    value: str  # already in quadlet syntax
    raw: str  # the plain value for the PodmanArgs= fallback


def _container_keys(plan: RunPlan) -> list[_Key]:
    t = timings(plan)
    keys = [
        _Key("Image", specifiers(plan.image), plan.image),
        _Key("ContainerName", plan.name, plan.name),
        _Key("Entrypoint", specifiers(plan.entrypoint), plan.entrypoint),
        _Key("Pull", "never", "never"),
        _Key("RunInit", "true", "true"),
        _Key("Network", plan.network_mode, plan.network_mode),
    ]
    # Never `AddDevice=-…`: the `-` makes quadlet stat() the CDI name, which never exists → device dropped.
    keys += [_Key("AddDevice", specifiers(d), d) for d in plan.devices]
    keys.append(_Key("ShmSize", plan.shm_size, plan.shm_size))
    if plan.memlock_ulimit:
        keys.append(_Key("Ulimit", plan.memlock_ulimit, plan.memlock_ulimit))
    keys.append(_Key("StopTimeout", str(t.container_stop), str(t.container_stop)))
    keys += [_Key("Label", systemd_word(f"{k}={v}"), f"{k}={v}") for k, v in plan.labels]
    keys += [_Key("Environment", systemd_word(f"{k}={v}"), f"{k}={v}") for k, v in plan.env]
    for k in plan.secret_env:
        word = f"{plan.secret_source(k)},type=env,target={k}"  # the podman secret OTHER as the container's k
        keys.append(_Key("Secret", word, word))
    for m in plan.mounts:
        # The plan's host paths are absolute (rigsmith.userhome): never %h, which a system-wide unit reads as
        # root's home.
        host = specifiers(m.host)
        suffix = ":ro" if m.readonly else ""
        keys.append(_Key("Volume", f"{host}:{specifiers(m.container)}{suffix}", ""))
    health = json.dumps(health_argv(plan))
    keys += [
        _Key("HealthCmd", specifiers(health), health),
        _Key("HealthInterval", f"{HEALTH_INTERVAL}s", f"{HEALTH_INTERVAL}s"),
        _Key("HealthTimeout", f"{HEALTH_TIMEOUT}s", f"{HEALTH_TIMEOUT}s"),
        _Key("HealthRetries", str(HEALTH_RETRIES), str(HEALTH_RETRIES)),
        _Key("HealthStartPeriod", f"{t.start_period}s", f"{t.start_period}s"),
        _Key("Notify", "healthy", "healthy"),
    ]
    if plan.command:
        keys.append(_Key("Exec", systemd_words(plan.command), ""))
    return keys


def entries(plan: RunPlan, version: Version) -> list[Entry]:
    """The unit as ordered (section, key, value) entries for the given target podman version."""
    t = timings(plan)
    vendors = sorted({d.split("/", 1)[0] for d in plan.devices})
    after = ["network-online.target", *(CDI_REFRESH_UNITS[v] for v in vendors if v in CDI_REFRESH_UNITS)]
    out: list[Entry] = [
        ("Unit", "Description", f"vLLM {plan.name} (rigsmith)"),
        ("Unit", "Wants", "network-online.target"),
        ("Unit", "After", " ".join(after)),
    ]
    fallback: list[str] = []
    for k in _container_keys(plan):
        since = max(KEY_SINCE[k.key], VALUE_SINCE.get((k.key, k.value), (0, 0, 0)))
        if version >= since:
            out.append(("Container", k.key, k.value))
        elif k.key == "Notify":
            pass  # --sdnotify=healthy needs podman's healthy-notify; quadlet's default (conmon) stays
        else:
            fallback += [PODMAN_FLAG[k.key], k.raw]
    if fallback:
        out.append(("Container", "PodmanArgs", systemd_words(fallback)))
    out += [("Service", "ExecStartPre", systemd_words(w)) for w in file_checks(plan)]
    out += [
        ("Service", "Restart", "on-failure"),
        ("Service", "RestartSec", str(RESTART_SEC)),
        ("Service", "TimeoutStartSec", str(t.systemd_start)),
        ("Service", "TimeoutStopSec", str(t.systemd_stop)),
        ("Install", "WantedBy", "multi-user.target default.target"),
    ]
    return out


def _arg_problems(plan: RunPlan, ctx: RenderContext) -> list[tuple[str, str]]:
    """Words quadlet's Exec= cannot carry (seen with podman 5.4.2's generator).

    An empty word ends quadlet's Exec= parsing (it and every later word vanish), and a lone ``;`` comes out
    bare in ExecStart=, where systemd reads it as a command separator.
    """
    skip = len(ctx.spec.engine.subcommand)
    bad = [
        (
            f"engine.args[{i - skip}]" if i >= skip else f"engine.subcommand[{i}]",
            f"{word!r}: quadlet drops an empty argument and everything after it"
            if word == ""
            else "a lone ';' becomes a systemd command separator in ExecStart=",
        )
        for i, word in enumerate(plan.command)
        if word in ("", ";")
    ]
    return cannot_express("quadlet", [(f, f"{why}; use --target podman") for f, why in bad])


def _raw_value_problems(plan: RunPlan) -> list[tuple[str, str]]:
    """Values quadlet takes raw (Image=, Entrypoint=, Volume=: no quoting, no escapes) that would not reach
    podman as one literal value; the others go through systemd_word."""
    raw = [("engine.image", plan.image), ("engine.executable", plan.entrypoint)]
    for hfld, host, cfld, cont in mount_fields(plan):
        raw += [(hfld, host), (cfld, cont)]
    return line_value_problems(raw)


#: What the quadlet target cannot express.
CHECKS: tuple[Check, ...] = (
    runs_container("quadlet"),
    _version_problems,
    _arg_problems,
    expressed("quadlet", _raw_value_problems, volume_problems, entrypoint_problems),
)


def render(plan: RunPlan, ctx: RenderContext) -> list[Artifact]:
    """``quadlet/NAME.container``."""
    refuse(plan, ctx, CHECKS)
    text = _version_text(ctx)
    version = parse_version(text)
    assert version is not None  # refused by _version_problems
    t = timings(plan)
    secrets = (
        [
            "Secrets are podman secrets: podman secret create NAME FILE for "
            f"{', '.join(dict.fromkeys(plan.secret_source(k) for k in plan.secret_env))}."
        ]
        if plan.secret_env
        else []
    )
    header = [
        f"For podman {text} (spec podman_version or --podman-version): "
        "keys newer than that go in PodmanArgs=.",
        f"Install: cp {plan.name}.container /etc/containers/systemd/ && systemctl daemon-reload "
        f"&& systemctl start {plan.name}",
        (
            f"Stop timeouts nest: vLLM {t.shutdown}s < container {t.container_stop}s "
            f"< TimeoutStopSec {t.systemd_stop}s."
            if t.shutdown is not None
            else f"Stop timeouts nest: container {t.container_stop}s < TimeoutStopSec {t.systemd_stop}s "
            "(the recipe sets no vLLM --shutdown-timeout)."
        ),
        # Seen under systemd 257 + podman 5.4.2: podman kills at the stop timeout, conmon exits 137 and the
        # unit ends failed. Kept a failure on purpose: SuccessExitStatus=137 would also make an OOM kill
        # while serving a clean exit, which Restart=on-failure then never restarts.
        f"An engine still running {t.container_stop}s after SIGTERM gets SIGKILL and the unit ends failed "
        "(exit 137): vLLM did not drain in time.",
        *secrets,
    ]
    body = tpl.render(
        "systemd/unit-file.j2",
        banner=banner(ctx.command, plan.spec_path),
        header=header,
        sections=sections(entries(plan, version)),
    )
    return [Artifact(ctx.out / "quadlet" / f"{plan.name}.container", body)]
