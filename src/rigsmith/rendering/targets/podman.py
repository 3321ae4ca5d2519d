"""The podman target: plain ``podman run`` / stop scripts (no compose: compose front-ends have been seen
dropping CDI devices silently — seeds/000 pitfall 1)."""

from __future__ import annotations

import re

from rigsmith import render as tpl
from rigsmith.render import banner, shpath, shquote
from rigsmith.rendering.plan import PlanMount, RunPlan
from rigsmith.rendering.targets.context import RenderContext
from rigsmith.rendering.targets.filecheck import FILE_CHECK
from rigsmith.rendering.targets.refusals import (
    Check,
    entrypoint_problems,
    expressed,
    refuse,
    runs_container,
    volume_problems,
)
from rigsmith.writer import Artifact


def _ere(text: str) -> str:
    """Escape text for a grep -E pattern."""
    return re.sub(r"([.^$*+?()\[\]{}|\\/])", r"\\\1", text)


def mount_arg(m: PlanMount) -> str:
    """The shell word for ``-v host:container[:ro]``, with ~/ expanded and nothing else."""
    return shpath(m.host) + shquote(":" + m.container + (":ro" if m.readonly else ""))


def cdi_checks(plan: RunPlan) -> list[tuple[str, str, str]]:
    """(device, kind pattern, name pattern) for the CDI pre-check, already ERE-escaped."""
    out = []
    for dev in plan.devices:
        kind, name = dev.split("=", 1)
        out.append((dev, _ere(kind), _ere(name)))
    return out


#: The options of RunPlan.podman_options that take no value; every other one is followed by its value.
FLAGS_WITHOUT_VALUE = frozenset({"--init"})


def run_lines(plan: RunPlan) -> list[str]:
    """``podman run`` as shell words grouped one option per line (each line already quoted)."""
    opts = plan.podman_options()
    lines: list[str] = []
    i = 0
    # Layout only: an option and its value share a line, whatever the value looks like (a recipe's
    # entrypoint may well be `--$(cmd)`). Every word is quoted.
    while i < len(opts):
        if opts[i] in FLAGS_WITHOUT_VALUE:
            lines.append(shquote(opts[i]))
            i += 1
        else:
            lines.append(f"{shquote(opts[i])} {shquote(opts[i + 1])}")
            i += 2
    lines += [f"-v {mount_arg(m)}" for m in plan.mounts]
    lines.append('"$IMAGE"')
    lines += group_flags(plan.command)
    return lines


def group_flags(argv: tuple[str, ...] | list[str]) -> list[str]:
    """Quoted argv, one line per flag with its values (layout only: the words are unchanged)."""
    lines: list[list[str]] = []
    for a in argv:
        if not lines or a.startswith("-") or lines[-1][0].startswith("-") is False:
            lines.append([a])
        else:
            lines[-1].append(a)
    return [" ".join(shquote(a) for a in line) for line in lines]


def render_files(plan: RunPlan, ctx: RenderContext) -> dict[str, str]:
    """File name → text for podman/NAME/."""
    common = {
        "banner": banner(ctx.command, plan.spec_path),
        "plan": plan,
    }
    run = tpl.render(
        "podman/run.sh.j2",
        **common,
        run_lines=run_lines(plan),
        cdi=cdi_checks(plan),
        gpu_ids=shquote(",".join(plan.gpu_indices)) if "all" not in plan.gpu_indices else "",
        file_check=shquote(FILE_CHECK),
        files=[(shpath(m.host), m.sparse_size or 0) for m in plan.mounts if m.kind == "file"],
        dirs=[
            (shpath(m.host), m.role, ctx.dir_hints.get(m.container)) for m in plan.mounts if m.kind == "dir"
        ],
        image_hint=ctx.image_hint,
        secrets=plan.secret_env,
        secret_from=dict(plan.secret_from),
        deployment=ctx.spec.name,  # a node's plan.name is its container, not a deployment
    )
    stop = tpl.render("podman/stop.sh.j2", **common)
    return {"run.sh": run, "stop.sh": stop}


#: What the podman target cannot express.
CHECKS: tuple[Check, ...] = (
    runs_container("podman"),
    expressed("podman", volume_problems, entrypoint_problems),
)


def render(plan: RunPlan, ctx: RenderContext) -> list[Artifact]:
    """Artifacts of the podman target."""
    refuse(plan, ctx, CHECKS)
    base = ctx.out / "podman" / plan.name
    return [Artifact(base / n, text, 0o755) for n, text in render_files(plan, ctx).items()]
