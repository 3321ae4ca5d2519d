"""A spec file as text and data: load and dump (YAML hardened by ``yamldoc``), every validation problem as
(field path, message with a hint), and the JSON Schema for editors."""

from __future__ import annotations

import difflib
import json
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from rigsmith.errors import SpecError
from rigsmith.spec.deployment import Deployment
from rigsmith.spec.fields import SPEC_VERSION
from rigsmith.yamldoc import MAX_DEPTH, load_yaml, nul_paths, tree_problem, yaml_problem

#: First line of a spec file import-recipe writes: editors with the YAML language server validate and
#: complete it against the schema (``invoke schema``). A comment, so the model never sees it.
MODELINE = "# yaml-language-server: $schema=../schema/deployment.schema.json\n"


_HINTS = {
    "extra_forbidden": "unknown field; check the spelling against schema/deployment.schema.json",
    "missing": "required field; add it",
}


def _loc(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in ("function-after", "function-before") or "[" in str(part):
            continue
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


def _fields_at(model: type[BaseModel], loc: tuple[int | str, ...]) -> list[str]:
    """The field names (aliases where set) of the model found at ``loc`` below ``model``; [] when the path
    leads to no model (a dict of free keys, a scalar)."""
    current: type[BaseModel] | None = model
    for part in loc:
        if isinstance(part, int):
            continue
        field = current.model_fields.get(part) if current is not None else None
        if field is None:
            return []
        current = _model_in(field.annotation)
    return [f.alias or n for n, f in current.model_fields.items()] if current is not None else []


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The BaseModel inside an annotation (``X``, ``X | None``, ``tuple[X, ...]``, ``list[X]``)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def problems_from(err: ValidationError, model: type[BaseModel] | None = None) -> list[tuple[str, str]]:
    """Turn a pydantic error into (field path, message with hint) pairs, all of them. ``model``: the model
    validated, so an unknown field gets the nearest known one ("did you mean")."""
    out = []
    for e in err.errors():
        msg = e["msg"].removeprefix("Value error, ")
        hint = _HINTS.get(e["type"])
        loc = tuple(e["loc"])
        if e["type"] == "extra_forbidden" and model is not None and loc and isinstance(loc[-1], str):
            near = difflib.get_close_matches(loc[-1], _fields_at(model, loc[:-1]), n=1, cutoff=0.6)
            if near:
                hint = f"unknown field; did you mean {near[0]!r}?"
        out.append((_loc(loc), f"{msg} ({hint})" if hint else msg))
    return out


def from_data(data: Any, source: str = "<spec>") -> Deployment:
    """Validate plain data into a Deployment; every problem in one SpecError."""
    if not isinstance(data, dict):
        raise SpecError(source, [("(top level)", "must be a mapping (YAML object)")])
    nul = nul_paths(data)
    if nul:
        raise SpecError(
            source, [(p, "holds a NUL character, which no target can carry; remove it") for p in nul]
        )
    try:
        return Deployment.model_validate(data)
    except ValidationError as err:
        raise SpecError(source, problems_from(err, Deployment)) from None


def to_data(spec: Deployment, defaults: bool = False) -> dict[str, Any]:
    """Plain data for YAML, defaults left out so the user's file stays short (``defaults``: spelled out)."""
    data: dict[str, Any] = json.loads(spec.model_dump_json(exclude_defaults=not defaults))
    for e, item in zip(spec.env, data.get("env", ()), strict=True):
        if e.opt_in:  # an opt-in's state is written out: `enabled: true` is the user's explicit choice
            item["enabled"] = e.enabled
    if spec.model.repo is None:
        # Written out although it is the default: `repo: null` tells the reader nothing is downloaded.
        data["model"] = {"repo": None, **data["model"]}
    data = {"version": SPEC_VERSION, **data}
    return data


class _Dumper(yaml.SafeDumper):
    pass


def _str_presenter(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    # Double quotes for anything YAML would fold or normalise (control chars, NEL, U+2028/9, BOM,
    # trailing blanks); literal blocks only for plain multi-line text.
    style: str | None = None
    if any(not (c.isprintable() or c == "\n") or c == "\ufeff" for c in value):
        style = '"'
    elif "\n" in value:
        plain_lines = all(line == line.strip(" \t") or not line.strip() for line in value.split("\n"))
        style = "|" if plain_lines and not value.startswith((" ", "\n")) else '"'
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str_presenter)


def dump(spec: Deployment) -> str:
    """The spec as YAML text (stable key order, unicode kept)."""
    return yaml.dump(to_data(spec), Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=100)


def loads(text: str, source: str = "<spec>") -> Deployment:
    """Parse YAML text into a Deployment."""
    if "\x00" in text:
        line = text.count("\n", 0, text.index("\x00")) + 1
        raise SpecError(source, [("(file)", f"holds a NUL character (line {line}); a spec is YAML text")])
    try:
        data = load_yaml(text)
    except yaml.YAMLError as err:
        raise SpecError(source, [("(file)", yaml_problem(err))]) from None
    except RecursionError:
        raise SpecError(source, [("(file)", f"is nested more than {MAX_DEPTH} levels deep")]) from None
    problem = tree_problem(data)
    if problem:
        raise SpecError(source, [("(file)", problem)])
    return from_data(data, source)


def load(path: Path) -> Deployment:
    """Read and validate ``deployments/NAME.yaml``."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise SpecError(str(path), [("(file)", f"cannot read: {err.strerror}")]) from None
    except UnicodeDecodeError as err:
        raise SpecError(
            str(path), [("(file)", f"not UTF-8 text (at byte {err.start}); save the spec as UTF-8")]
        ) from None
    spec = loads(text, str(path))
    if spec.name != path.stem:
        raise SpecError(
            str(path), [("name", f"is {spec.name!r} but the file is {path.name}; make them match")]
        )
    return spec


def json_schema() -> dict[str, Any]:
    """JSON Schema of the spec, for editors."""
    schema = Deployment.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "rigsmith deployment"
    return schema
