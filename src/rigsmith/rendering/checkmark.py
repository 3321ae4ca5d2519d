"""``deploy --check`` answered from stat calls when nothing it follows from changed (stdlib only).

Rendering is a pure function of the spec, the lock, the flags, rigsmith's code and templates and the
libraries that render (Jinja, pydantic, PyYAML); ``--check`` compares its result with the files on disk. A
check that passed leaves a mark (``<checkout>/.rigsmith/checked/<target>-<name>.json``): a key over all of
those inputs (file bytes for the spec and the lock; ``stat`` of every file of rigsmith's package, of the
templates and of the libraries' entry modules) and the ``stat`` of each generated file and its directory.
A later check with the same key and stats prints what that check printed, without loading the spec's
models or Jinja. ``--lxc-config`` (another input file) always runs the full check.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import rigsmith
from rigsmith import marks

#: Bumped whenever what a check decides from the same inputs could change.
FORMAT = 1
MARKS = Path(".rigsmith") / "checked"
PACKAGE = Path(rigsmith.__file__).resolve().parent
#: render.TEMPLATES (tests/rendering/test_checkmark.py checks they agree; render imports Jinja).
TEMPLATES = PACKAGE.parents[1] / "templates"
LIBRARIES = ("jinja2", "pydantic", "pydantic_core", "yaml")


def mark_path(checkout: Path, target: str, name: str) -> Path:
    return checkout / MARKS / f"{target}-{name}.json"


def _code() -> list[object]:
    """The stat of every file that decides how a spec renders: rigsmith's package, the templates, and the
    rendering libraries' entry modules (an upgrade replaces them)."""
    seen: list[object] = [sys.version]
    for top in (PACKAGE, TEMPLATES):
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            seen += [[f"{dirpath}/{f}", marks.stat(Path(dirpath, f))] for f in sorted(filenames)]
    for lib in LIBRARIES:
        found = importlib.util.find_spec(lib)
        origin = found.origin if found is not None else None
        seen.append([lib, origin, marks.stat(Path(origin)) if origin else None])
    return seen


def key(checkout: Path, target: str, name: str, options: dict[str, object]) -> str:
    """What a check's answer follows from, besides the generated files."""
    files = (checkout / "deployments" / f"{name}.yaml", checkout / "rigsmith.lock")
    return marks.digest([FORMAT, str(checkout), target, name, options, _code()], files)


def _observe(paths: list[str]) -> list[object]:
    return [[p, marks.stat(Path(p)), marks.stat(Path(p).parent)] for p in paths]


def record(checkout: Path, target: str, name: str, digest: str, paths: list[str], said: list[str]) -> None:
    """Leave the mark of a check that passed, having printed ``said`` about the files at ``paths``."""
    mark = {"key": digest, "said": said, "files": _observe(sorted(paths))}
    marks.write(mark_path(checkout, target, name), mark)


def recall(checkout: Path, target: str, name: str, digest: str) -> list[str] | None:
    """What the last passing check printed, when nothing it followed from has changed since; else None."""
    mark = marks.read(mark_path(checkout, target, name))
    if mark is None or mark.get("key") != digest:
        return None
    files, said = mark.get("files"), mark.get("said")
    if not isinstance(files, list) or not isinstance(said, list) or not files:
        return None
    paths = [f[0] for f in files if isinstance(f, list) and f and isinstance(f[0], str)]
    if len(paths) != len(files) or _observe(paths) != files:
        return None
    return [str(line) for line in said]
