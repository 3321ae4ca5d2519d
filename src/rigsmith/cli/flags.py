"""The flags several tasks take, each defined once as a row: its name, its help, and how the text typed
after it becomes the value the library takes (mkosi's settings as data).

A task lists the rows it takes, ``@task(help={**helps(DEPLOYMENT, MEMLOCK), "its_own": "…"})``; Invoke
makes the option itself from the task's parameter of that name; the body turns the text into the value
with the row (``MEMLOCK.value(memlock)``). A bad value is one RigsmithError naming the flag and an example.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

from rigsmith.digits import ascii_digits
from rigsmith.errors import RigsmithError
from rigsmith.project import TARGETS

T = TypeVar("T")

#: The end of every --deployment help line.
DEFAULT_DEP = (
    " (default: RIGSMITH_DEPLOYMENT, the newest import, invoke.yaml's rigsmith.deployment, or the only one)"
)

Memlock = Literal["unlimited", "host"] | int


def text(flag: str, value: str) -> str:
    return value


def whole(flag: str, value: str) -> int:
    """A whole number."""
    try:
        return int(value)
    except ValueError:
        raise RigsmithError(f"{flag} {value!r} is not a whole number", hint=f"e.g. {flag} 2") from None


def seconds(flag: str, value: str) -> float:
    """A number of seconds."""
    try:
        return float(value)
    except ValueError:
        raise RigsmithError(f"{flag} {value!r} is not a number of seconds", hint=f"e.g. {flag} 900") from None


def memlock(flag: str, value: str) -> Memlock:
    """unlimited (or -1), host, or a byte count above 0."""
    if value in ("unlimited", "-1", "host"):
        return "host" if value == "host" else "unlimited"
    n = int(value) if ascii_digits(value) else 0
    if n <= 0:
        raise RigsmithError(
            f"{flag} {value!r} is not unlimited, host or a byte count", hint=f"e.g. {flag} unlimited"
        )
    return n


def target(flag: str, value: str) -> str:
    """One of the five targets."""
    if value not in TARGETS:
        raise RigsmithError(f"unknown target {value!r}", hint=f"use one of: {', '.join(TARGETS)}")
    return value


@dataclass(frozen=True)
class Flag(Generic[T]):
    """One flag: the task parameter it fills, its help line, and its parser (flag, text) → value."""

    name: str
    help: str
    parse: Callable[[str, str], T]

    @property
    def cli(self) -> str:
        """How the user types it (``--dry-run`` for dry_run)."""
        return "--" + self.name.replace("_", "-")

    def of(self, given: str) -> T:
        """The value of the text given after the flag."""
        return self.parse(self.cli, given)

    def value(self, given: str | None) -> T | None:
        """The value of the text given after the flag, None when it was not given."""
        return None if given is None else self.of(given)


DEPLOYMENT = Flag("deployment", "deployments/NAME.yaml to act on" + DEFAULT_DEP, text)
TARGET = Flag("target", "podman | quadlet | compose | lxc | kube: the artifacts to render or check", target)
RUN_TARGET = Flag("target", "podman (plain podman run scripts) or quadlet (systemd unit)", target)
OUT = Flag("out", "where the target's artifacts live: DIR/<target>/… (default: the checkout)", text)
IMAGE = Flag("image", "container image reference, overriding the spec and the lock", text)
MEMLOCK = Flag(
    "memlock",
    "override memlock: unlimited, bytes, or host (set none; for hosts that cannot raise it)",
    memlock,
)
YES = Flag("yes", "change existing generated files without asking", text)


def helps(*rows: Flag[Any]) -> dict[str, str]:
    """The help lines of these rows, for ``@task(help={**helps(DEPLOYMENT, …), "own_flag": "…"})``."""
    return {row.name: row.help for row in rows}
