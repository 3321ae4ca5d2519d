"""Who owns what in a re-import (issue 24): the recipe's side of the three-way merge is what the recipe alone
says; values the user gave (``--image``, answers to prompts) are the user's side.

The base (``deployments/.base/NAME.yaml``) records the recipe alone, so a flag value is never mistaken
for upstream's: imported once with ``--image A`` and edited to ``B``, the unchanged recipe re-imported
without ``--image`` keeps ``B`` with no conflict; ``--image C`` on a re-import is the user's new choice and
wins the same way. The flags an import was given are recorded beside the base (``.base/NAME.flags.json``):
the same ``--image A`` given again (the same command line re-run) after the user edited the spec to ``B``
is not a new statement, so ``B`` stays and a change upstream made elsewhere merges without a conflict.
An unchanged recipe (the same bytes as the last import) re-imported with no flag (and no
``--yes``) writes nothing and exits 0.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from rigsmith import spec as specmod
from rigsmith.errors import RecipeError
from rigsmith.importing import recipe as recipemod
from rigsmith.writer import write_one


def recipe_own(
    text: str, *, source: str, sha256: str, upstream: specmod.Deployment, image: str | None, **how: Any
) -> specmod.Deployment:
    """The spec the recipe gives without ``--image`` (``upstream`` is the one with it), parsed the same
    way otherwise (``how``: the parse options); a recipe that cannot be imported without ``--image`` (its
    image is a shell variable) names no image of its own."""
    if image is None:
        return upstream
    try:
        return recipemod.parse(text, source=source, sha256=sha256, name=upstream.name, image=None, **how)
    except RecipeError:
        return upstream.model_copy(update={"engine": upstream.engine.model_copy(update={"image": None})})


def with_consents(dep: specmod.Deployment, given: specmod.Deployment) -> specmod.Deployment:
    """``dep`` with the mount consents recorded in ``given`` (the user's answers), by host path."""
    consents = {m.host: m.consent for m in given.mounts if m.consent}
    mounts = tuple(
        m.model_copy(update={"consent": consents[m.host]}) if m.host in consents and not m.consent else m
        for m in dep.mounts
    )
    return dep.model_copy(update={"mounts": mounts})


def flags(image: str | None) -> dict[str, Any]:
    """The fields the user set with flags on this import, by dotted path (the user's side of the merge)."""
    return {"engine.image": image} if image is not None else {}


def flags_path(base_path: Path) -> Path:
    """Where the flags of the imports so far are recorded, beside the base (``.base/NAME.flags.json``)."""
    return base_path.with_name(base_path.stem + ".flags.json")


def recorded_flags(base_path: Path) -> dict[str, Any]:
    """The flag values the earlier imports gave (dotted path → value); none when there is no readable
    record (then every flag given now counts as new, as before the record existed)."""
    try:
        data = json.loads(flags_path(base_path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return {}
    return {k: v for k, v in data.items() if isinstance(k, str)} if isinstance(data, dict) else {}


def new_flags(given: Mapping[str, Any], recorded: Mapping[str, Any]) -> dict[str, Any]:
    """The flags of this import that say something new: a value the last import's flag did not give. A flag
    repeated with the value it had (the same command line run again) is not a new statement, so the user's
    later edit of that field in the spec stays; a new value is the user's new choice and is applied."""
    return {k: v for k, v in given.items() if k not in recorded or recorded[k] != v}


def user_flags(image: str | None, base_path: Path, exists: bool) -> tuple[dict[str, Any], str | None]:
    """This import's flags as the user's side of the merge (all of them for a new spec, else the new ones:
    :func:`new_flags`), and the flag record to keep after it (None: no flag given, ever)."""
    given, recorded = flags(image), recorded_flags(base_path)
    record = {**recorded, **given}
    text = json.dumps(record, indent=2, sort_keys=True) + "\n" if record else None
    return (new_flags(given, recorded) if exists else given), text


def write_base(base_path: Path, own: specmod.Deployment, flags_record: str | None) -> None:
    """Record what the import said: the recipe alone (the base) and the flags given so far."""
    write_one(base_path, specmod.dump(own))
    if flags_record is not None:
        write_one(flags_path(base_path), flags_record)


def overlay(data: Any, mine: Mapping[str, Any]) -> Any:
    """Spec data with the user's flag values set (``engine.image`` → data["engine"]["image"])."""
    if not mine or not isinstance(data, dict):
        return data
    out = dict(data)
    for dotted, value in mine.items():
        node = out
        *parents, last = dotted.split(".")
        for key in parents:
            child = node.get(key)
            node[key] = dict(child) if isinstance(child, dict) else {}
            node = node[key]
        node[last] = value
    return out


def same_recipe(
    base_path: Path,
    upstream: specmod.Deployment,
    mine: Mapping[str, Any],
    allow_mount: Sequence[str],
    source_repo: str | None,
) -> bool:
    """Whether the last import (the recorded base) was of exactly these recipe bytes, read the same way (the
    same title and recipe id: a vLLM recipe's variant and hardware are in both), and this import gives no
    new flag of the user's side (``mine``: a new ``--image``; ``--allow-mount``, ``--source-repo``): then
    nothing changes."""
    if mine or allow_mount or source_repo is not None:
        return False
    try:
        data = yaml.safe_load(base_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return False
    provenance = data.get("provenance") if isinstance(data, dict) else None
    now = upstream.provenance
    return (
        isinstance(provenance, dict)
        and now is not None
        and (provenance.get("sha256"), provenance.get("title"), provenance.get("recipe_id"))
        == (now.sha256, now.title, now.recipe_id)
    )


def args_indexes_kept(merged: Any, *sides: Any) -> Any:
    """``merged`` spec data with ``engine.model_arg`` and ``secondary_models[].arg`` pointing at the same
    words as on the side they came from, after ``engine.args`` was merged flag by flag (a flag added or
    dropped before ``--model X`` moves X). An index whose word is found once in the merged args is moved
    there; otherwise it is left for the spec's own checks."""
    if not isinstance(merged, dict) or not isinstance(merged.get("engine"), dict):
        return merged
    args = merged["engine"].get("args")
    if not isinstance(args, list):
        return merged
    out = dict(merged)
    out["engine"] = dict(
        merged["engine"],
        model_arg=_word_index(
            merged["engine"].get("model_arg"), args, [_word(side, "engine", "model_arg") for side in sides]
        ),
    )
    models = merged.get("secondary_models")
    if isinstance(models, list):
        out["secondary_models"] = [
            dict(m, arg=_word_index(m.get("arg"), args, [_secondary_word(side, m) for side in sides]))
            if isinstance(m, dict)
            else m
            for m in models
        ]
    return out


def _word(side: Any, section: str, field: str) -> str | None:
    block = side.get(section) if isinstance(side, dict) else None
    return _at(side, block.get(field)) if isinstance(block, dict) else None


def _secondary_word(side: Any, model: dict[str, Any]) -> str | None:
    models = side.get("secondary_models") if isinstance(side, dict) else None
    for m in models if isinstance(models, list) else ():
        if isinstance(m, dict) and m.get("repo") == model.get("repo") and m.get("role") == model.get("role"):
            return _at(side, m.get("arg"))
    return None


def _at(side: Any, index: Any) -> str | None:
    engine = side.get("engine") if isinstance(side, dict) else None
    args = engine.get("args") if isinstance(engine, dict) else None
    if isinstance(index, int) and isinstance(args, list) and 0 <= index < len(args):
        word = args[index]
        return word if isinstance(word, str) else None
    return None


def _word_index(index: Any, args: list[Any], words: list[str | None]) -> Any:
    wanted = {w for w in words if w is not None}
    if not isinstance(index, int) or not wanted or (0 <= index < len(args) and args[index] in wanted):
        return index
    hits = [i for i, w in enumerate(args) if w in wanted]
    return hits[0] if len(hits) == 1 else index
