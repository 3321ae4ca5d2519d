"""Post-start assertion: did the running container really get what the plan asked for?

Compose front-ends have been seen starting a container WITHOUT its CDI devices and saying nothing
(seeds/000 pitfall 1; podman-compose drops ``deploy.resources.reservations.devices`` with
``driver: cdi``), and podman-compose never passes ``stop_grace_period`` to podman. This check inspects
the running container and names every difference. The probe is a command plus a pure parser:
``inspect_argv`` + ``container_problems``.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from rigsmith.errors import CommandError, PreflightError
from rigsmith.plan import RunPlan

CDI_DIRS = (Path("/etc/cdi"), Path("/var/run/cdi"))


def inspect_argv(name: str) -> list[str]:
    """The probe command."""
    return ["podman", "container", "inspect", name]


def cdi_nodes(spec_texts: Iterable[str]) -> dict[str, list[str]]:
    """``vendor/class=name`` → container device paths it injects, from CDI spec files (JSON or YAML)."""
    out: dict[str, list[str]] = {}
    for text in spec_texts:
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError:
            continue
        if not isinstance(data, dict) or "kind" not in data:
            continue
        common = [n.get("path") for n in (data.get("containerEdits") or {}).get("deviceNodes") or []]
        for dev in data.get("devices") or []:
            nodes = [n.get("path") for n in (dev.get("containerEdits") or {}).get("deviceNodes") or []]
            out[f"{data['kind']}={dev.get('name')}"] = [p for p in [*nodes, *common] if isinstance(p, str)]
    return out


def container_problems(info: Mapping[str, Any], plan: RunPlan, cdi: Mapping[str, list[str]]) -> list[str]:
    """Every way the running container differs from the plan in devices, shm and stop timeout."""
    problems = []
    state = info.get("State") or {}
    if not state.get("Running"):
        problems.append(f"container {plan.name} is not running (status {state.get('Status', 'unknown')})")
    host = info.get("HostConfig") or {}
    arrived = {d.get("PathInContainer") for d in host.get("Devices") or []}
    if plan.devices and not arrived:
        problems.append(
            f"container {plan.name} has NO devices, but the plan asks for {', '.join(plan.devices)}: "
            "the front-end "
            "dropped them (compose `deploy.resources.reservations.devices` with `driver: cdi` is ignored "
            "silently; list them under `devices:`)"
        )
    else:
        for dev in plan.devices:
            nodes = cdi.get(dev)
            if nodes is None:
                problems.append(
                    f"no CDI spec on this host provides {dev} (nvidia-ctk cdi generate, then retry)"
                )
                continue
            missing = [n for n in nodes if n not in arrived]
            if missing:
                problems.append(f"CDI device {dev} did not arrive: {', '.join(missing)} not in the container")
    shm = host.get("ShmSize")
    if shm is not None and shm != plan.shm_bytes:
        problems.append(f"/dev/shm is {shm} bytes, not {plan.shm_bytes} ({plan.shm_size})")
    stop = (info.get("Config") or {}).get("StopTimeout")
    if stop is not None and stop != plan.stop_timeout:
        problems.append(
            f"stop timeout is {stop}s, not {plan.stop_timeout}s: vLLM would be killed mid-drain "
            "(podman-compose "
            f"ignores stop_grace_period; start it with --podman-run-args=--stop-timeout={plan.stop_timeout})"
        )
    return problems


def read_cdi_specs(dirs: Iterable[Path] = CDI_DIRS) -> list[str]:
    """Texts of the CDI spec files podman reads."""
    texts = []
    for d in dirs:
        for p in sorted([*d.glob("*.json"), *d.glob("*.yaml")]) if d.is_dir() else []:
            texts.append(p.read_text(encoding="utf-8", errors="replace"))
    return texts


def check_container(
    plan: RunPlan,
    *,
    name: str | None = None,
    run: Callable[[list[str]], subprocess.CompletedProcess[str]] | None = None,
    cdi_texts: Iterable[str] | None = None,
) -> None:
    """Inspect the running container; raise PreflightError naming every problem."""
    argv = inspect_argv(name or plan.name)
    runner = run or (lambda a: subprocess.run(a, capture_output=True, text=True, check=False))
    proc = runner(argv)
    if proc.returncode != 0:
        raise CommandError(argv, proc.returncode, proc.stderr, hint="is it started? podman ps -a")
    data = json.loads(proc.stdout)
    info = data[0] if isinstance(data, list) and data else {}
    problems = container_problems(info, plan, cdi_nodes(read_cdi_specs() if cdi_texts is None else cdi_texts))
    if problems:
        raise PreflightError(
            f"container {name or plan.name} does not match deployment {plan.name}:\n"
            + "\n".join(f"  - {p}" for p in problems),
            hint="stop it, fix the cause named above, start it again",
        )
