"""One environment variable from a recipe (every form: shell text, compose, JSON, the env string): a secret
lifted out of the spec with a note, a host reference kept and explained, repeats merged as the shell does."""

from __future__ import annotations

import re
from collections.abc import Sequence

from rigsmith import spec as specmod
from rigsmith.importing.recipe.launch import Launch
from rigsmith.importing.recipe.tables import _SELF_REF_RE
from rigsmith.secretenv import is_secret_name

#: The placeholder of a secret-named variable a recipe reads but never sets (``<HF_TOKEN>``).
_SECRET_PLACEHOLDER_RE = re.compile(r"^<([A-Za-z_][A-Za-z0-9_]*)>$")


def secret_var(
    name: str, value: str, note: str | None, where: str, **flags: bool
) -> tuple[specmod.EnvVar, str] | None:
    """A variable whose name says it holds a secret, with its value dropped (never stored in the spec),
    and the note that says so; None for any other variable. Every env source goes through here."""
    if not is_secret_name(name) or "$" in value or not value:
        return None
    if specmod.PLACEHOLDER_RE.fullmatch(value):
        return specmod.EnvVar(name=name, value="", note=note, secret=True, **flags), (
            f"{where}: {name} is a secret (placeholder {value} dropped); it is read from the host "
            "environment at run time"
        )
    return specmod.EnvVar(name=name, value="", note=note, secret=True, **flags), (
        f"{where}: the value of {name} was dropped (a secret is never stored in the spec); it is read from "
        "the host environment at run time"
    )


def secret_ref(name: str, value: str, known: frozenset[str] | set[str] = frozenset()) -> str | None:
    """The host variable ``NAME=value`` reads a secret from, when it does: ``$OTHER``/``${OTHER}`` where
    NAME or OTHER holds a secret (by its name, or ``known``: found holding a secret's value), or the
    placeholder ``<OTHER>`` of a secret-named OTHER that the text read but never set. Its value is then that
    reference, never the secret; every target passes it from the host at run time."""
    m = _SELF_REF_RE.match(value)
    if (
        m
        and m.group(1) != name
        and (is_secret_name(name) or is_secret_name(m.group(1)) or m.group(1) in known)
    ):
        return m.group(1)
    p = _SECRET_PLACEHOLDER_RE.match(value)
    if p and not is_secret_name(name) and is_secret_name(p.group(1)):
        return p.group(1)
    return None


def mapped_secret(
    name: str, other: str, note: str | None, where: str, notes: list[str], **flags: bool
) -> specmod.EnvVar:
    """``NAME=$OTHER`` for a secret: the container's NAME is the host's OTHER (the value keeps it)."""
    notes.append(
        f"{where}: {name}=${other} passes the secret {other} as {name}: env[].value keeps that reference, "
        f"never the value, and every target reads {other} on the host at run time: export {other} (or "
        f"create the podman secret {other}) before starting"
    )
    return specmod.EnvVar(
        name=name, value=f"${other}", note=note or f"from the host's {other}", secret=True, **flags
    )


def env_var(name: str, value: str, note: str | None, launch: Launch, where: str) -> specmod.EnvVar:
    secret = is_secret_name(name)
    if secret and value in launch.made_placeholders and value[1:-1].isidentifier():
        # A secret set from a variable the text never sets: the host's variable at run time, never a value
        value = f"${value[1:-1]}"
    m = _SELF_REF_RE.match(value)
    if m and m.group(1) == name:
        launch.notes.append(f"{where}: {name}={value} is read from the host environment at run time")
        return specmod.EnvVar(name=name, value=value, note=note, secret=True)
    other = secret_ref(name, value, launch.secret_refs)
    if other is not None:
        return mapped_secret(name, other, note, where, launch.notes)
    lifted = secret_var(name, value, note, where)
    if lifted is not None:
        launch.notes.append(lifted[1])
        if not specmod.PLACEHOLDER_RE.fullmatch(value):  # a <placeholder> is no secret to scrub
            launch.secrets.append(value)
        return lifted[0]
    if "$" in value or "`" in value:
        launch.notes.append(
            f"{where}: {name}={value} holds shell syntax that a shell would expand; kept literally, "
            "replace it with the value you mean"
        )
    return specmod.EnvVar(name=name, value=value, note=note, secret=secret)


def passthrough(name: str, launch: Launch, where: str) -> specmod.EnvVar:
    launch.notes.append(f"{where}: {name} is passed through from the host environment at run time")
    return specmod.EnvVar(name=name, value="", secret=True, note="passed through from the host environment")


def merge_env(env: Sequence[specmod.EnvVar], launch: Launch) -> list[specmod.EnvVar]:
    """Later settings of a name win (a prefix beats an export), as in the shell; repeats are noted."""
    out: dict[str, specmod.EnvVar] = {}
    for e in env:
        old = out.get(e.name)
        if old is not None:
            same = (
                "with the same value" if old.value == e.value else f"({old.value!r} → {e.value!r}, last wins)"
            )
            launch.notes.append(f"env {e.name} is set twice {same}")
            if e.note is None and old.note is not None:
                e = e.model_copy(update={"note": old.note})
        out[e.name] = e
    return list(out.values())
