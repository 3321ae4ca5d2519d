"""Recipe form (a): the recipe JSON (``id``/``title``/``command``/``env``/``notes``)."""

from __future__ import annotations

import json
from typing import Any

from rigsmith.errors import RecipeError
from rigsmith.importing.recipe.command.script import from_script
from rigsmith.importing.recipe.launch import Launch, Meta, _refuse, read_tree

# -- format (a): recipe JSON -------------------------------------------------------------------------

_JSON_FIELDS = ("id", "title", "command", "env", "notes")


def _not_json(word: str) -> Any:
    raise ValueError(f"{word} is not a JSON value (JSON has no NaN or infinity: write the number or text)")


def _strict_json(text: str) -> Any:
    """``json.loads`` without Python's extensions: ``NaN``/``Infinity`` literals are refused, as every
    other JSON reader (the recipes site's ``JSON.parse``) refuses them."""
    return json.loads(text, parse_constant=_not_json)


def load_json(text: str, source: str) -> Any:
    """The JSON text as plain data, or one RecipeError saying where it breaks."""
    return read_tree(
        _strict_json,
        text,
        source,
        "the recipe JSON",
        'a recipe JSON is a flat object with a "command" string',
    )


def _from_json(text: str, source: str, accept: bool = False) -> tuple[Launch, Meta]:
    data = load_json(text, source)
    if not isinstance(data, dict):
        raise RecipeError(f'{source}: the recipe JSON must be an object with a "command" string')
    problems = []
    for key in ("id", "title", "command", "notes"):
        if key in data and data[key] is not None and not isinstance(data[key], str):
            problems.append(f"{key}: must be a string, got {type(data[key]).__name__}")
    command = data.get("command")
    if command is None or (isinstance(command, str) and not command.strip()):
        problems.append("command: missing or empty; the recipe must give the vLLM command as a string")
    env = data.get("env")
    env_text: str | None = None
    env_map: dict[str, str | None] | None = None
    if isinstance(env, str):
        env_text = env
    elif isinstance(env, dict):
        env_map = {}
        for k, v in env.items():
            if not isinstance(v, str | int | float) and v is not None:
                problems.append(f"env.{k}: must be a string, got {type(v).__name__}")
            else:
                env_map[str(k)] = None if v is None else str(v)
    elif env is not None:
        problems.append(f"env: must be a string or an object, got {type(env).__name__}")
    if problems:
        raise _refuse(source, problems)
    launch = from_script(data["command"], f"{source}: command", accept)
    extra = sorted(set(data) - set(_JSON_FIELDS))
    for key in extra:
        launch.notes.append(f"recipe field {key!r} not imported: {json.dumps(data[key], ensure_ascii=False)}")
    meta = Meta(
        title=data.get("title"),
        recipe_id=data.get("id"),
        env_text=env_text,
        env_map=env_map,
        notes_text=data.get("notes"),
    )
    return launch, meta
