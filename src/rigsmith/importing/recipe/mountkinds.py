"""Which of a recipe's bind mounts are files (seed 000's pitfall 2: a missing file path becomes a directory,
and the engine rejects it). Pure; the importer adds the one host fact (the host path is a file here).

A mount is ``kind: file`` when the notes create its host path (``truncate -s N``, ``fallocate -l N``,
``dd of=``, ``touch``; the size becomes ``sparse_size``, so run.sh creates it sparse at exactly that size),
or when its name is a file's (a suffix such as ``.bin``, ``.json``, ``.gguf``). Either way no target makes a
directory there: run.sh and provision.sh refuse a missing file (or create the declared sparse one) and
refuse a directory in its place.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import PurePosixPath

from rigsmith import spec as specmod
from rigsmith.importing.recipe.notes import NoteFacts

#: Name suffixes of files a recipe bind-mounts (weights, tables, configs, templates, scripts, keys).
FILE_SUFFIXES = frozenset(
    {
        *(".bin", ".gguf", ".safetensors", ".pt", ".pth", ".npy", ".json", ".jsonl", ".yaml", ".yml"),
        *(".toml", ".ini", ".cfg", ".conf", ".txt", ".jinja", ".j2", ".py", ".sh", ".pem", ".crt", ".key"),
        *(".db", ".sqlite", ".img", ".so"),
    }
)


def _noted(m: specmod.Mount, facts: NoteFacts, mounts: Sequence[specmod.Mount]) -> str | None:
    """The path the notes create that is this mount's host file: the same path, or the same file name
    when the notes write its directory as a placeholder (seed 000: ``WORKSTATION/ngram_table.bin``) and no
    other mount has that name."""
    if m.host in facts.files:
        return m.host
    name = PurePosixPath(m.host).name
    if sum(PurePosixPath(o.host).name == name for o in mounts) != 1:
        return None
    return next((p for p in facts.files if PurePosixPath(p).name == name), None)


def file_mounts(mounts: Sequence[specmod.Mount], facts: NoteFacts, notes: list[str]) -> list[specmod.Mount]:
    """``mounts`` with the file ones as ``kind: file`` (and ``sparse_size`` from the notes); a note each."""
    out = []
    for i, m in enumerate(mounts):
        if m.kind == "file":
            out.append(m)
            continue
        noted = _noted(m, facts, mounts)
        suffix = PurePosixPath(m.host).suffix.lower() or PurePosixPath(m.container).suffix.lower()
        if noted is not None:
            size = facts.files[noted]
            change: dict[str, object] = {"kind": "file", "sparse_size": size}
            notes.append(
                f"decision: mounts[{i}] {m.host}:{m.container} is a file: the notes create it "
                f"(`{facts.file_commands[noted]}`), so kind: file"
                + (
                    f", sparse_size: {size} (run.sh creates it sparse at exactly that size when missing)"
                    if size
                    else " (it must exist before the start)"
                )
                + "; no target makes a directory there"
            )
        elif suffix in FILE_SUFFIXES:
            change = {"kind": "file"}
            notes.append(
                f"decision: mounts[{i}] {m.host}:{m.container} is taken as a file (its name ends in "
                f"{suffix}), so kind: file: no target makes a directory there and the start refuses a "
                "missing file; set kind: dir if it is a directory"
            )
        else:
            out.append(m)
            continue
        out.append(specmod.Mount.model_validate({**m.model_dump(), **change}))
    return out


def host_files(dep: specmod.Deployment, is_file: dict[str, bool]) -> specmod.Deployment:
    """``dep`` with each directory mount whose host path ``is_file`` says is a file on this host as
    ``kind: file`` (a noted decision)."""
    mounts, notes = list(dep.mounts), list(dep.notes)
    for i, m in enumerate(mounts):
        if m.kind == "dir" and is_file.get(m.host):
            mounts[i] = specmod.Mount.model_validate({**m.model_dump(), "kind": "file"})
            notes.append(
                f"decision: mounts[{i}] {m.host}:{m.container} is a file on this host, so kind: file (no "
                "target makes a directory there)"
            )
    if mounts == list(dep.mounts):
        return dep
    return dep.model_copy(update={"mounts": tuple(mounts), "notes": tuple(notes)})
