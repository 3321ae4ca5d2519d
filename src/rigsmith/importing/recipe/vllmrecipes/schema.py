"""The shape of a vLLM recipes YAML: the fields each level may hold and the type of each value the command
synthesis reads (:mod:`.synth` trusts it). Every unknown field and every value of the wrong type is one
problem naming its path, so a recipe is refused whole, never half-read.

The fields are CONTRIBUTING.md's "YAML schema (authoritative)" and CLAUDE.md's schema notes of
https://github.com/vllm-project/recipes at commit 8959cf64189c71d36e11c6a30335f923f261b1f7, plus the keys
the recipes there use (``kv_offload_support``, ``hardware_notes``, ``meta.platforms``…).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

from rigsmith import spec as specmod
from rigsmith.importing.recipe.tables import _words

#: The fields each level may hold: CONTRIBUTING.md's "YAML schema (authoritative)", CLAUDE.md's schema
#: notes, and the keys the recipes at the pinned commit use (``kv_offload_support``, ``hardware_notes``…).
_FIELDS: dict[str, frozenset[str]] = {
    "": _words(
        """
        meta model dependencies features opt_in_features variants compatible_strategies hardware_overrides
        strategy_overrides guide kv_offload_support omni default_strategy strategy_hardware strategy_min_gpus
        hardware_opt_in_features hardware_notes kv_cache_strategy_hardware
        """
    ),
    "meta": _words(
        """
        title slug provider description date_added date_updated difficulty tasks performance_headline
        related_recipes default_hardware hardware platforms
        """
    ),
    "model": _words(
        """
        model_id min_vllm_version architecture parameter_count active_parameters context_length base_args
        base_env nightly_required docker_image install docker_source supports_dcp flashinfer_autotune
        """
    ),
    "variant": _words(
        """
        precision vram_minimum_gb description model_id min_vllm_version nightly_required tp extra_args label
        extra_env supported_hardware default_modes precision_hardware docker_image hardware_overrides
        """
    ),
    "feature": _words(
        "description args label hardware default_mode modes hardware_overrides strategies companion"
    ),
    "mode": _words("label description args variants hardware_overrides hardware"),
    "hardware override": _words("extra_args extra_env install_note docker_image"),
}


def _scalar(v: Any) -> bool:
    return isinstance(v, str | int | float)  # bool is an int


def _number(v: Any) -> bool:
    # NaN compares false with everything: a NaN vram_minimum_gb would pick a strategy by accident.
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _mapping(v: Any) -> bool:
    return isinstance(v, dict)


def _names(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


def _args(v: Any) -> bool:
    return isinstance(v, list) and all(x is None or _scalar(x) for x in v)


def _env(v: Any) -> bool:
    return isinstance(v, dict) and all(_scalar(x) for x in v.values())


def _text(v: Any) -> bool:
    return isinstance(v, str)


def _words_map(v: Any) -> bool:
    return isinstance(v, dict) and all(isinstance(x, str) for x in v.values())


def _tp(v: Any) -> bool:
    return _number(v) or (isinstance(v, dict) and all(_number(x) for x in v.values()))


def _floors(v: Any) -> bool:
    return _number(v) or (isinstance(v, dict) and all(_tp(x) for x in v.values()))


def _image(v: Any) -> bool:
    return isinstance(v, str) or (
        isinstance(v, dict) and all(isinstance(x, str) or _words_map(x) for x in v.values())
    )


def _steps(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, dict) for x in v)


#: What each kind of value must be: (check, how the message says it).
_KINDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "map": (_mapping, "a mapping"),
    "names": (_names, "a list of names"),
    "args": (_args, "a list of flags and values"),
    "env": (_env, "a mapping of variable names to values"),
    "text": (_text, "text"),
    "number": (_number, "a finite number"),
    "words": (_words_map, "a mapping of names to words (e.g. verified, unsupported, a mode)"),
    "tp": (_tp, "a finite number, or a mapping of hardware keys to finite numbers"),
    "floors": (_floors, "a finite number, or a mapping of strategies or GPU ids to finite numbers"),
    "image": (_image, "an image reference or a mapping of them"),
    "steps": (_steps, "a list of install steps (command, note)"),
}

#: Each path the command synthesis reads (``*``: any key) and its kind; a value that is null counts as
#: absent. ``@`` stands for a hardware-override table (of the recipe, a variant, a strategy override).
_TYPES_TEXT = """
meta.tasks names                                      meta.hardware words
meta.default_hardware text                            model.model_id text
model.docker_image image                              model.base_args args
model.base_env env                                    variants.*.model_id text
variants.*.docker_image image                         variants.*.precision text
variants.*.vram_minimum_gb number                     variants.*.tp tp
variants.*.supported_hardware names                   variants.*.default_modes words
variants.*.precision_hardware words                   variants.*.extra_args args
variants.*.extra_env env                              variants.*.hardware_overrides @
hardware_overrides @                                  features map
features.* map                                        features.*.args args
features.*.strategies names                           features.*.default_mode text
features.*.hardware_overrides map                     features.*.hardware_overrides.* map
opt_in_features names                                 features.*.hardware_overrides.*.args args
compatible_strategies names                           features.*.modes map
features.*.modes.* map                                features.*.modes.*.args args
features.*.modes.*.variants names                     features.*.modes.*.hardware words
default_strategy text                                 features.*.modes.*.hardware_overrides map
features.*.modes.*.hardware_overrides.* map           features.*.modes.*.hardware_overrides.*.args args
strategy_hardware map                                 hardware_opt_in_features map
hardware_opt_in_features.* names                      strategy_hardware.* words
strategy_min_gpus floors                              strategy_overrides map
strategy_overrides.* map                              strategy_overrides.*.tp tp
strategy_overrides.*.extra_args args                  strategy_overrides.*.vllm_args args
strategy_overrides.*.env env                          strategy_overrides.*.extra_env env
dependencies steps                                    strategy_overrides.*.hardware_overrides @
"""
_OVERRIDE_KINDS = {
    "": "map",
    ".*": "map",
    ".*.extra_args": "args",
    ".*.extra_env": "env",
    ".*.docker_image": "text",
}


def _types() -> dict[str, str]:
    words = _TYPES_TEXT.split()
    out: dict[str, str] = {}
    for path, kind in zip(words[::2], words[1::2], strict=True):
        out |= {path + k: v for k, v in _OVERRIDE_KINDS.items()} if kind == "@" else {path: kind}
    return out


_TYPES = _types()


def _values(data: Any, pattern: list[str], path: str = "") -> Iterator[tuple[str, Any]]:
    """Every (path, value) of ``data`` that ``pattern`` (dotted keys, ``*`` any key) reaches."""
    if not pattern:
        yield path, data
        return
    if not isinstance(data, dict):
        return
    head, rest = pattern[0], pattern[1:]
    for key in data if head == "*" else [head] if head in data else []:
        yield from _values(data[key], rest, f"{path}.{key}" if path else str(key))


def _unknown(block: Any, level: str, path: str) -> list[str]:
    if not isinstance(block, dict):
        return []
    where = f"{path}." if path else ""
    return [
        f"{where}{k}: not a field of a vLLM recipe's {level or 'top level'} (the recipes schema has "
        f"{', '.join(sorted(_FIELDS[level]))}); remove it or check its spelling"
        for k in block
        if str(k) not in _FIELDS[level]
    ]


def _override_fields(data: dict[str, Any]) -> list[str]:
    tables = [("hardware_overrides", data.get("hardware_overrides"))]
    tables += [
        (f"variants.{k}.hardware_overrides", v.get("hardware_overrides")) for k, v in _dicts(data, "variants")
    ]
    return [
        p
        for path, table in tables
        for key, block in (table.items() if isinstance(table, dict) else [])
        for p in _unknown(block, "hardware override", f"{path}.{key}")
    ]


def _dicts(data: dict[str, Any], key: str) -> list[tuple[str, dict[str, Any]]]:
    table = data.get(key)
    return [(str(k), v) for k, v in table.items() if isinstance(v, dict)] if isinstance(table, dict) else []


def problems(data: dict[str, Any]) -> list[str]:
    """Every unknown field and every value of the wrong type, by path (empty: the synthesis may read it)."""
    out = _unknown(data, "", "") + _unknown(data.get("meta"), "meta", "meta")
    out += _unknown(data.get("model"), "model", "model")
    for name in ("meta", "model"):
        if not isinstance(data.get(name), dict):
            out.append(f"{name}: must be a mapping")
    variants = data.get("variants")
    if not isinstance(variants, dict) or not variants:
        out.append("variants: must map each variant name to its settings (the recipes schema needs default)")
    else:
        out += [
            f"variants.{k}: must be a mapping of the variant's settings"
            for k, v in variants.items()
            if not isinstance(v, dict)
        ]
    for key, v in _dicts(data, "variants"):
        out += _unknown(v, "variant", f"variants.{key}")
    for key, f in _dicts(data, "features"):
        out += _unknown(f, "feature", f"features.{key}")
        out += [p for mk, m in _dicts(f, "modes") for p in _unknown(m, "mode", f"features.{key}.modes.{mk}")]
    out += _override_fields(data)
    for pattern, kind in _TYPES.items():
        check, what = _KINDS[kind]
        for path, value in _values(data, pattern.split(".")):
            if value is not None and not check(value):
                out.append(f"{path}: must be {what}, got {type(value).__name__}")
    model_id = data["model"].get("model_id") if isinstance(data.get("model"), dict) else None
    if not isinstance(model_id, str):
        out.append("model.model_id: must be the Hub id owner/name of the model")
    ids = [*_values(data, ["model", "model_id"]), *_values(data, ["variants", "*", "model_id"])]
    out += [
        f"{path}: {v!r} is not a Hugging Face repo id (owner/name: letters, digits, '.', '_', '-'); the "
        "site serves it as the Hub model of that id"
        for path, v in ids
        if isinstance(v, str) and not specmod.hub_repo_id(v)
    ]
    return list(dict.fromkeys(_key_problems(data) + out))


def _key_problems(data: Any, path: str = "") -> list[str]:
    """Every mapping key that is not text, by path: YAML reads ``1:``, ``~:`` and ``true:`` as a number,
    null and a boolean, which the site's JavaScript would turn into other words than Python does."""
    if isinstance(data, list):
        return [p for i, v in enumerate(data) for p in _key_problems(v, f"{path}[{i}]")]
    if not isinstance(data, dict):
        return []
    out = [
        f'{path or "the top level"}: the key {k!r} is not text; quote it ("{k}") or remove it'
        for k in data
        if not isinstance(k, str)
    ]
    return out + [p for k, v in data.items() for p in _key_problems(v, f"{path}.{k}" if path else str(k))]
