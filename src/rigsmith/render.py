"""The one Jinja environment, the quoting filters and the YAML writer of generated files. Templates hold
layout; decisions live in Python."""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import shlex
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

import jinja2
import jinja2.bccache
import yaml

from rigsmith.writer import BANNER_MARK

TEMPLATES = Path(__file__).resolve().parents[2] / "templates"

#: Every character that ends a line for some reader of a generated file: exactly the ones Python's
#: ``str.splitlines`` splits on (YAML also breaks at NEL, U+2028 and U+2029; systemd and bash at LF/CR).
LINE_BREAKS = "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029"


def line_breaks(text: str) -> list[str]:
    """The line-break characters in ``text`` (``repr``-able, in order of appearance), empty when none.

    The one test for "would this value end a comment or a ``Key=value`` line"; every target and every
    comment writer asks it.
    """
    return [c for c in text if c in LINE_BREAKS]


def breaks_line(text: str) -> bool:
    """Whether ``text`` holds a line break of any kind or another control character (C0 or DEL).

    The one rule for values written raw into one line of a file (a unit key, a pct.conf line, a venv
    path in ExecStart=): every target asks it here rather than keeping its own pattern.
    """
    return bool(line_breaks(text)) or any(c < " " or c == "\x7f" for c in text)


def escape_line_breaks(text: str) -> str:
    """``text`` with each line-break character written as a ``\\uXXXX`` escape (valid in JSON and YAML
    double-quoted strings), so the value stays on one line wherever it is shown."""
    return "".join(f"\\u{ord(c):04x}" if c in LINE_BREAKS else c for c in text)


def shquote(value: object) -> str:
    """POSIX-shell quote one word; safe for any bytes the recipe holds."""
    return shlex.quote(str(value))


def shpath(path: str) -> str:
    """Quote a host path, letting a leading ``~/`` expand to $HOME (and nothing else expand)."""
    if path == "~":
        return '"${HOME}"'
    if path.startswith("~/"):
        return '"${HOME}"/' + shlex.quote(path[2:])
    return shlex.quote(path)


def banner(command: str, spec_path: str, comment: str = "#") -> str:
    """The first lines of every generated file: who made it, from what, do not edit.

    A line break in the command (a value the user passed) is escaped: it would end the comment.
    """
    command, spec_path = escape_line_breaks(command), escape_line_breaks(spec_path)
    return f"{comment} {BANNER_MARK} — do not edit; edit {spec_path} and re-run:\n{comment}   {command}\n"


class _Compiled(jinja2.FileSystemBytecodeCache):
    """Compiled templates kept between runs, in Jinja's per-user directory (created 0700 and checked):
    compiling the templates cost more than rendering them. Jinja reloads one only when the template's
    source checksum, Jinja's bytecode version and Python's version all match. Only a cache: a directory
    that cannot be written is passed over."""

    def dump_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        with contextlib.suppress(OSError):
            super().dump_bytecode(bucket)


def _compiled(env: jinja2.Environment) -> jinja2.BytecodeCache | None:
    """The cache for ``env``'s templates, named by the settings their compiled code depends on."""
    settings = [jinja2.__version__, env.trim_blocks, env.lstrip_blocks, env.keep_trailing_newline]
    settings += [env.newline_sequence, env.autoescape, env.block_start_string, env.variable_start_string]
    settings += [env.comment_start_string, env.line_statement_prefix, env.line_comment_prefix]
    tag = hashlib.sha256(repr(settings).encode()).hexdigest()[:12]
    try:
        return _Compiled(pattern=f"rigsmith-{tag}-%s.cache")
    except (OSError, RuntimeError):  # no private temp directory: compile every time, as before
        return None


@cache
def environment(root: Path = TEMPLATES, overlay: Path | None = None) -> jinja2.Environment:
    """StrictUndefined, no autoescape, trailing newline kept; quoting filters registered.

    ``overlay`` is a second search directory after ``root`` (e.g. images/<name>/), for templates that
    ``{% extends %}`` a shipped one and override its blocks.
    """
    search = [str(root)] + ([str(overlay)] if overlay else [])
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(search),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.bytecode_cache = _compiled(env)
    env.filters["shquote"] = shquote
    env.filters["shpath"] = shpath
    env.filters["dockerquote"] = dockerquote
    env.filters["tojson_compact"] = lambda v: json.dumps(v, separators=(",", ":"))
    return env


def dockerquote(value: object) -> str:
    """A Dockerfile double-quoted word: no ``$`` expansion; backslash and quote escaped."""
    text = str(value)
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$") + '"'


def render(template: str, /, **context: Any) -> str:
    """Render ``templates/<template>`` with the context."""
    return environment().get_template(template).render(**context)


def render_in(template: str, overlay: Path | None, context: Mapping[str, Any]) -> str:
    """Render ``template`` found in templates/ or else in ``overlay`` (a per-image override that
    ``{% extends %}`` a shipped template)."""
    return environment(TEMPLATES, overlay).get_template(template).render(**context)


class _NoAliasDumper(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:
        return True


#: Plain scalars that some YAML reader types as non-string: YAML 1.2 core (``1e5``, ``0o17``, ``.inf``),
#: YAML 1.1 (``yes``/``on``/``y``, ``1_000``, sexagesimal ``12:30:00``, ``0b101``, ``017``) and Go's
#: yaml/strconv (podman kube play, Kubernetes: ``0x1F``, underscores, ``+1``). PyYAML's own resolver (YAML
#: 1.1) misses the 1.2 and Go forms, so a string matching this is emitted quoted. ``\Z``: ``$`` would
#: accept a trailing newline.
_TYPED_PLAIN = re.compile(
    r"""(?:
      ~|null|Null|NULL
    | y|Y|yes|Yes|YES|n|N|no|No|NO|true|True|TRUE|false|False|FALSE|on|On|ON|off|Off|OFF
    | [-+]?(?:0[bB][01_]*|0[oO][0-7_]*|0[xX][0-9a-fA-F_]*)
    | [-+]?[0-9][0-9_]*(?::[0-5]?[0-9])*(?:\.[0-9_]*)?(?:[eE][-+]?[0-9]+)?
    | [-+]?\.[0-9][0-9_]*(?:[eE][-+]?[0-9]+)?
    | [-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN)
    )\Z""",
    re.VERBOSE,
)
_TYPED_TAG = "tag:rigsmith,2026:typed-plain"
_NoAliasDumper.add_implicit_resolver(_TYPED_TAG, _TYPED_PLAIN, None)


def _str_scalar(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    # Double quotes whenever a character would be folded or dropped in any other style: a line break of
    # any class (single quotes fold NEL/U+2028/U+2029 into a space) or anything unprintable; the
    # double-quoted style escapes them (\N, \L, \P, \x00).
    literal = not line_breaks(value) and value.isprintable() and "\ufeff" not in value
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=None if literal else '"')


_NoAliasDumper.add_representer(str, _str_scalar)


def yaml_text(*docs: Any, explicit_start: bool = False) -> str:
    """YAML for generated files: key order kept, no anchors/aliases, unicode kept, no line folding."""
    return yaml.dump_all(
        docs,
        Dumper=_NoAliasDumper,
        sort_keys=False,
        allow_unicode=True,
        width=10_000,
        explicit_start=explicit_start,
    )
