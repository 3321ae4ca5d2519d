"""A YAML or JSON document from the internet as a plain tree, or one clear reason it is not one.

Parsing (safe, libyaml's when present, timestamps kept as text, ``!!binary``/``!!set`` refused) and the
limits every later step relies on: nesting depth, values once aliases are expanded, self-reference, NUL
characters. Used by the spec (``spec.loads``) and by the recipe forms (compose, JSON). Pure.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

import yaml

#: Deepest nesting accepted in a spec or recipe document; real ones are under 10 levels.
MAX_DEPTH = 64


#: Most values (scalars, lists, mappings, each alias expansion counted again) a document may hold once
#: expanded. A spec or recipe holds a few hundred; a 453-byte YAML alias bomb expands to billions.
MAX_NODES = 100_000


def tree_problem(data: Any) -> str | None:
    """Why ``data`` (parsed JSON or YAML) is not a plain tree a person wrote, or None.

    Walks the value as every later step would, with aliases expanded, and stops early: more than
    ``MAX_NODES`` values, deeper than ``MAX_DEPTH``, or a value that contains itself (``&a [*a]``).
    """
    seen = 0
    ancestors: set[int] = set()

    def walk(value: Any, depth: int) -> str | None:
        nonlocal seen
        seen += 1
        if seen > MAX_NODES:
            return (
                f"holds more than {MAX_NODES} values once YAML aliases are expanded (an alias bomb?); "
                "write the values out"
            )
        if depth > MAX_DEPTH:
            return f"is nested more than {MAX_DEPTH} levels deep"
        if not isinstance(value, list | dict):
            return None
        if id(value) in ancestors:
            return "contains itself (a YAML alias to an enclosing value); write the values out"
        ancestors.add(id(value))
        children = [*value.keys(), *value.values()] if isinstance(value, dict) else value
        for child in children:
            problem = walk(child, depth + 1)
            if problem:
                return problem
        ancestors.discard(id(value))
        return None

    return walk(data, 0)


class _YamlLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """A safe loader (libyaml's when present) that yields only JSON-like values: a timestamp stays the
    text it was (compose and YAML 1.2 readers see a string), ``!!binary`` and ``!!set`` are refused, and
    a key written twice in one mapping is refused (PyYAML keeps the last silently while a reader sees the
    first; YAML says keys are unique, and compose refuses them)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, yaml.Node] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                continue  # a merge key (<<) may override what it merges; a non-scalar key fails below
            key = self.construct_object(key_node)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    f"the first {key!r} is",
                    seen[key].start_mark,
                    f"found duplicate key {key!r}; write each key once",
                    key_node.start_mark,
                )
            seen[key] = key_node
        return dict(super().construct_mapping(node, deep=deep))


def _as_text(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> str:
    return str(loader.construct_scalar(node))


def _refuse_tag(loader: yaml.SafeLoader, node: yaml.Node) -> None:
    raise yaml.constructor.ConstructorError(
        None, None, f"{node.tag} values are not accepted (write plain text)", node.start_mark
    )


_YamlLoader.add_constructor("tag:yaml.org,2002:timestamp", _as_text)
_YamlLoader.add_constructor("tag:yaml.org,2002:binary", _refuse_tag)
_YamlLoader.add_constructor("tag:yaml.org,2002:set", _refuse_tag)


class _Yaml12Loader(_YamlLoader):
    """The YAML 1.2 core schema, as js-yaml (the vLLM recipes site's reader) and compose's yaml.v3 resolve
    plain scalars: ``yes``/``on``/``off`` and ``12:30`` stay text, ``1e5``, ``0o17`` and ``0b11`` are
    numbers, ``017`` is seventeen. PyYAML's YAML 1.1 reads each of these another way, so a recipe's argv
    would differ from the one the site shows."""

    yaml_implicit_resolvers: ClassVar[dict[Any, Any]] = {}  # none of YAML 1.1's: only the core's below


_CORE_RESOLVERS = (
    ("tag:yaml.org,2002:bool", r"^(?:true|True|TRUE|false|False|FALSE)$", "tTfF"),
    ("tag:yaml.org,2002:null", r"^(?:~|null|Null|NULL|)$", ["~", "n", "N", ""]),
    (
        "tag:yaml.org,2002:int",
        r"^(?:[-+]?[0-9]+|[-+]?0x[0-9a-fA-F]+|[-+]?0o[0-7]+|[-+]?0b[01]+)$",
        "-+0123456789",
    ),
    (
        "tag:yaml.org,2002:float",
        r"^(?:[-+]?[0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?|\.[0-9]+(?:[eE][-+]?[0-9]+)?"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$",
        "-+0123456789.",
    ),
    ("tag:yaml.org,2002:merge", r"^<<$", "<"),
)
for _tag, _pattern, _first in _CORE_RESOLVERS:
    _Yaml12Loader.add_implicit_resolver(_tag, re.compile(_pattern), list(_first))


def _core_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
    text = str(loader.construct_scalar(node))
    sign, digits = (-1 if text[0] == "-" else 1), text.lstrip("+-")
    base = {"0x": 16, "0o": 8, "0b": 2}.get(digits[:2], 10)
    return sign * int(digits[2:] if base != 10 else digits, base)


def _core_float(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> float:
    text = str(loader.construct_scalar(node)).lower()
    return float(text.replace(".inf", "inf").replace(".nan", "nan"))


_Yaml12Loader.add_constructor("tag:yaml.org,2002:int", _core_int)
_Yaml12Loader.add_constructor("tag:yaml.org,2002:float", _core_float)


def yaml_problem(err: yaml.YAMLError) -> str:
    """A YAML error in the user's words: where (line, column) and what, without PyYAML's
    ``in "<unicode string>"`` (the caller names the file)."""
    if isinstance(err, yaml.MarkedYAMLError) and err.problem_mark is not None:
        mark = err.problem_mark
        what = f"not valid YAML at line {mark.line + 1}, column {mark.column + 1}: {err.problem or 'error'}"
        if err.context:
            where = err.context_mark
            since = f" at line {where.line + 1}, column {where.column + 1}" if where is not None else ""
            what += f" ({err.context}{since})"
        return what
    return "not valid YAML: " + " ".join(str(err).split())


def load_yaml_12(text: str) -> Any:
    """:func:`load_yaml` with the YAML 1.2 core schema (:class:`_Yaml12Loader`): a document written for a
    YAML 1.2 reader (a vLLM recipe, read by js-yaml on the recipes site)."""
    return load_yaml(text, _Yaml12Loader)


def load_yaml(text: str, loader: type[yaml.SafeLoader] = _YamlLoader) -> Any:
    """YAML text as plain data. Every way it can fail is a ``yaml.YAMLError`` (the constructors raise
    ValueError/OverflowError for scalars such as ``2001-13-14`` or ``.nanx``), except RecursionError for a
    document nested deeper than ``MAX_DEPTH``, which callers report as such: whether the parser recursed
    too deep, refused the depth itself (its words differ between PyYAML versions) or returned the tree
    (``tree_problem`` then says it)."""
    try:
        return yaml.load(text, Loader=loader)
    except (ValueError, TypeError, OverflowError) as err:
        raise yaml.YAMLError(f"{type(err).__name__}: {err}") from None
    except yaml.YAMLError:
        if _nesting(text) > MAX_DEPTH:
            raise RecursionError(f"nested more than {MAX_DEPTH} levels deep") from None
        raise


def _nesting(text: str) -> int:
    """How deep ``text`` nests, roughly, as YAML: flow brackets outside quotes, or block indentation
    levels, whichever is deeper. Asked only of text the parser refused, to tell "too deep" apart."""
    flow = deepest = 0
    quote = ""
    for ch in text:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "[{":
            flow += 1
            deepest = max(deepest, flow)
        elif ch in "]}":
            flow = max(flow - 1, 0)
    indents: list[int] = []
    for line in text.splitlines():
        body = line.lstrip(" ")
        if not body or body.startswith("#"):
            continue
        indent = len(line) - len(body)
        while indents and indents[-1] >= indent:
            indents.pop()
        indents.append(indent)
        deepest = max(deepest, len(indents))
    return deepest


def nul_paths(value: Any, path: str = "") -> list[str]:
    """Field paths of the strings in ``value`` that hold a NUL (no shell, unit file or YAML line carries
    one: run.sh would drop it, quadlet drops the whole line)."""
    if isinstance(value, str):
        return [path or "(top level)"] if "\x00" in value else []
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in nul_paths(v, f"{path}.{k}" if path else str(k))]
    if isinstance(value, list | tuple):
        return [p for i, v in enumerate(value) for p in nul_paths(v, f"{path}[{i}]")]
    return []
