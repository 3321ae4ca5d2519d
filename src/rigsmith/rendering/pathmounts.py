"""A path a vLLM flag names through a placeholder (``--chat-template <CHAT_TEMPLATE>``, made at import from
a path relative to where the recipe ran, or ``--lora-modules sql=$ADAPTERS/sql`` with a variable the text
never sets): once the user fills it with an absolute path, every target mounts that path at the same place
in the container — read-only unless the flag writes there — as the import does for a path the recipe
wrote absolute (issue 35). A path already inside a mount (the model's directory, a volume) is left to it;
a filled Hub repo id is no path. Pure."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Literal

from rigsmith import spec as specmod
from rigsmith.importing.recipe.pathflags import flag_paths


@dataclass(frozen=True)
class FilledPath:
    """A flag's filled path and how to mount it."""

    path: str
    readonly: bool
    kind: Literal["dir", "file"]


def filled_paths(spec: specmod.Deployment, mounted: Iterable[str]) -> list[FilledPath]:
    """Each absolute path a filled placeholder gives a flag of ``spec.engine.args`` that no container path
    of ``mounted`` (nor an earlier one of these) holds."""
    held = [PurePosixPath(m) for m in mounted]
    out: list[FilledPath] = []
    for fp in flag_paths(spec.engine.args):
        if not specmod.PLACEHOLDER_RE.search(fp.value):
            continue
        path = PurePosixPath(spec.fill(fp.value))
        if not path.is_absolute() or any(path.is_relative_to(h) for h in held):
            continue
        held.append(path)
        out.append(FilledPath(str(path), fp.readonly, fp.kind))
    return out
