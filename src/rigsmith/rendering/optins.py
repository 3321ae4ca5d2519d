"""What enabling an opt-in means beyond its env line. Pure.

Seed 003 publishes "Opt-in: AUTO_TOPO=1 topology selector; COUNTERS=1 logging-only counters; HOST=0.0.0.0
then set VLLM_API_KEY". Its serve script turns HOST into ``--host``; a container runs ``vllm serve``
directly, so rigsmith makes that change itself (:data:`EFFECTS`) and requires the key the note asks for.
Switches only the recipe's script reads (``EnvVar.read_by``) reach the engine only when it runs that script.
"""

from __future__ import annotations

from dataclasses import dataclass

from rigsmith import spec as specmod


@dataclass(frozen=True)
class Effect:
    """An opt-in's change set: the argv flag its value replaces, and the secret env it requires."""

    flag: str
    requires_secret: str | None = None
    why: str = ""


#: Opt-ins the recipe's own script translates into engine flags (knowledge as data).
EFFECTS: dict[str, Effect] = {
    "HOST": Effect(
        "--host", "VLLM_API_KEY", "a server on a non-loopback address must refuse requests without a key"
    ),
}
_LOOPBACK = ("127.0.0.1", "localhost", "::1")


@dataclass(frozen=True)
class Applied:
    """The argv after the opt-ins' rewrites, the env names not passed, and the problems found."""

    args: tuple[str, ...]
    not_passed: tuple[str, ...]
    problems: tuple[tuple[str, str], ...]


def _set_flag(args: list[str], flag: str, value: str) -> bool:
    hit = False
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            args[i + 1] = value
            hit = True
        elif a.startswith(flag + "="):
            args[i] = f"{flag}={value}"
            hit = True
    return hit


def with_flag(args: tuple[str, ...], flag: str, value: str) -> tuple[str, ...]:
    """``args`` with every ``flag`` given ``value`` (``--f V`` and ``--f=V`` forms), or ``flag value``
    appended when it is not there: argparse keeps the last one, so every earlier one agrees."""
    out = list(args)
    if not _set_flag(out, flag, value):
        out += [flag, value]
    return tuple(out)


def runs_script(spec: specmod.Deployment, script: str) -> bool:
    """True when the engine's executable is ``script`` (``scripts/x.sh`` matches ``/opt/t/scripts/x.sh``)."""
    exe = spec.engine.executable
    return exe == script or exe.endswith("/" + script.removeprefix("./"))


def apply(spec: specmod.Deployment, args: tuple[str, ...]) -> Applied:
    """Rewrite ``args`` (the recipe's argv after the subcommand) for the enabled opt-ins with an effect;
    list the switches not passed (an effect's own variable, a script's switch without its script)."""
    out, skipped, problems = list(args), [], []
    secrets = {e.name for e in spec.env if e.secret}
    for e in spec.env:
        if not e.active:
            continue
        effect = EFFECTS.get(e.name) if e.opt_in else None
        if effect is not None:
            value = spec.fill(e.value)
            out = list(with_flag(tuple(out), effect.flag, value))
            skipped.append(e.name)
            need = effect.requires_secret
            if need and need not in secrets and value not in _LOOPBACK:
                problems.append(
                    (
                        f"env.{e.name}",
                        f"{e.name}={value} rewrites {effect.flag} to {value}, and {effect.why}: add "
                        f"`{{name: {need}, value: '', secret: true}}` to env (its value is read at run time, "
                        f"never written), or disable {e.name}"
                        + (f" (the recipe: {e.note})" if e.note else ""),
                    )
                )
        elif e.read_by and not runs_script(spec, e.read_by):
            skipped.append(e.name)
    return Applied(tuple(out), tuple(skipped), tuple(problems))
