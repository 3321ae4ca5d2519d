"""The CT's systemd service for ``engine.runtime: venv``: the venv's vllm + the recipe argv, run by systemd.

provision.sh (lxc target) writes it into the CT; laid out by templates/systemd/unit-file.j2. Pure.
"""

from __future__ import annotations

import posixpath

from rigsmith import render as tpl
from rigsmith.render import banner
from rigsmith.rendering.plan import RunPlan
from rigsmith.rendering.targets import ini
from rigsmith.rendering.targets.context import RenderContext
from rigsmith.rendering.targets.timing import RESTART_SEC, timings

#: Where provision.sh writes a venv service's secret env file (0600), read by its EnvironmentFile=.
SECRETS_DIR = "/etc/rigsmith"


def venv_argv(plan: RunPlan) -> list[str]:
    """What the CT's service runs: the venv's vllm + the recipe argv, the model word at its CT path.

    The model directory is bind-mounted at its host path (an ``mpN`` line), so that is where it is in the CT;
    the plan's words name it already (``~/`` written out: rigsmith.userhome).
    """
    return [venv_program(plan), *plan.command]


def venv_program(plan: RunPlan) -> str:
    """The venv's program the service runs: its python for a ``python -m vllm.entrypoints…`` recipe (the
    subcommand carries ``-m …``), else its vllm."""
    name = posixpath.basename(plan.entrypoint)
    return f"{plan.venv}/bin/{'python' if name.startswith('python') else 'vllm'}"


def venv_workdir(venv: str, recipe_executable: str) -> str:
    """The directory the recipe ran from, where its relative paths (seed 003: ``TREE=./vllm-v2.5``) resolve.

    A recipe that ran ``./venv-v2.5/bin/vllm`` ran it from the directory holding ``venv-v2.5``: the venv with
    that relative part taken off. Otherwise the venv's parent, where such a tree sits beside it.
    """
    rel = posixpath.normpath(recipe_executable)
    parts = rel.split("/")
    if not rel.startswith("/") and parts[-2:] == ["bin", "vllm"] and len(parts) > 2:
        tail = "/" + "/".join(parts[:-2])
        if venv.rstrip("/").endswith(tail):
            return venv.rstrip("/")[: -len(tail)] or "/"
    return posixpath.dirname(venv.rstrip("/")) or "/"


def service_entries(plan: RunPlan, ctx: RenderContext) -> list[ini.Entry]:
    """The CT's systemd unit for a venv engine, as ordered (section, key, value) entries."""
    t = timings(plan)
    svc = "Service"
    out: list[ini.Entry] = [
        ("Unit", "Description", f"rigsmith: {plan.name} (vLLM from {plan.venv})"),
        ("Unit", "Wants", "network-online.target"),
        ("Unit", "After", "network-online.target"),
        (svc, "Type", "exec"),
        (svc, "WorkingDirectory", venv_workdir(plan.venv or "/", ctx.spec.engine.recipe_executable)),
    ]
    out += [(svc, "Environment", ini.systemd_word(f"{k}={v}")) for k, v in plan.env]
    if plan.secret_env:
        out.append((svc, "EnvironmentFile", f"{SECRETS_DIR}/{plan.name}.env"))
    out.append((svc, "ExecStart", ini.systemd_words(venv_argv(plan))))
    if plan.memlock != "host":
        out.append((svc, "LimitMEMLOCK", "infinity" if plan.memlock == "unlimited" else str(plan.memlock)))
    out += [
        # vLLM drains on SIGTERM for its --shutdown-timeout; systemd waits longer, PVE's down= longer still.
        # KillMode=mixed: SIGTERM to vLLM's main process only, which then stops its engine and workers; the
        # default (control-group) signals every process at once, so the drain's children die mid-drain (seen
        # under systemd 257: stop took 0.02 s instead of the 1 s drain). SIGKILL still reaches them all.
        (svc, "KillMode", "mixed"),
        (svc, "KillSignal", "SIGTERM"),
        (svc, "TimeoutStopSec", str(t.systemd_stop)),
        (svc, "Restart", "on-failure"),
        (svc, "RestartSec", str(RESTART_SEC)),
        ("Install", "WantedBy", "multi-user.target"),
    ]
    return out


def unit_text(plan: RunPlan, ctx: RenderContext) -> str:
    """The CT's ``NAME.service`` (laid out by the systemd unit-file template, as quadlet's .container)."""
    t = timings(plan)
    return tpl.render(
        "systemd/unit-file.j2",
        banner=banner(ctx.command, plan.spec_path),
        header=[
            f"Written by provision.sh inside CT {ctx.lxc.vmid}. Stop timeouts nest: vLLM --shutdown-timeout "
            f"{t.shutdown or 0}s < TimeoutStopSec {t.systemd_stop}s < PVE startup down={t.pve_down}s."
        ],
        sections=ini.sections(service_entries(plan, ctx)),
    )
