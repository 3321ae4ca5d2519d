"""What a target refuses to render: the plan's fields it cannot express, each named with the reason, all
found before anything is written (``rendering.validate`` lists them; each renderer raises them). Pure.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rigsmith.errors import SpecError
from rigsmith.render import breaks_line
from rigsmith.rendering.plan import RunPlan
from rigsmith.rendering.targets.context import Checker, RenderContext

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
