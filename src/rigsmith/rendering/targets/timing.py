"""The timeouts every target writes and the health probe, derived the same way from a RunPlan. Pure.

The nesting rule (shared/DESIGN.md): vLLM ``--shutdown-timeout`` < container stop timeout < systemd
``TimeoutStopSec`` < Proxmox ``startup: down=``. Each outer layer adds a fixed margin so a slow ``podman rm``
or a systemd unit stop is never cut short by the layer around it.
"""

from __future__ import annotations

from dataclasses import dataclass

from rigsmith.rendering.plan import RunPlan

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


def health_argv(plan: RunPlan) -> list[str]:
    """The health check command, run inside the container.

    vLLM images always carry python3 but not always curl, so the probe is a python one-liner that exits
    non-zero unless the server answers 2xx.
    """
    code = f"import urllib.request as u; u.urlopen({plan.health_url!r}, timeout={HEALTH_TIMEOUT - 2})"
    return ["python3", "-c", code]
