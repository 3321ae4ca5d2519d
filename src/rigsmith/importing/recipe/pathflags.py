"""Every path a vLLM flag names, as the model argument is: a secondary Hub model, a read-only mount, or a
refusal naming the flag — never dropped. Which flags name paths, and where in their value, is one column of
vLLM's flag table (:data:`rigsmith.importing.vllmflags.Paths`).

The rule that tells a local path from a Hub id (:func:`is_local`, the main model's rule too): a word that
starts with ``/``, ``~``, ``./`` or ``../``, or holds no ``/`` or more than one, is a local path;
``owner/name`` is a Hub repo id. vLLM itself tries a local directory of that name first, so an
``owner/name`` read as a Hub id is said in the notes, with how to write it as a directory instead.

Where the path is depends on who runs vLLM:

- a recipe that runs vLLM on its host (``vllm serve``, ``python -m vllm…``): an absolute path is mounted
  read-only at the same path in the container (the argv stays the recipe's, byte for byte); a path
  relative to where the recipe ran, or to a home (``./x``, ``x/y``, ``~/x``), is refused naming the flag
  (rigsmith cannot know that directory: write the absolute path);
- a recipe that runs its own container (``docker run``, compose): the path is inside that container — held
  by one of the recipe's volumes (imported with them) or by the image, which the notes say.

A word that is a placeholder or shell syntax is the user's to fill: the notes say the mount it will need.
Pure.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any, Literal

from rigsmith import spec as specmod
from rigsmith.importing import vllmflags
from rigsmith.importing.recipe.launch import Launch
from rigsmith.importing.recipe.tables import _REPO_RE

#: The rule, as the notes and refusals state it.
RULE = "a word starting with /, ~, ./ or ../, or with no '/' or more than one, is a local path"
#: Characters only an inline chat template holds (vLLM's own test: ``JINJA_CHARS`` in
#: vllm/entrypoints/chat_utils.py ``load_chat_template``).
_TEMPLATE_CHARS = frozenset("{}\n")


@dataclass(frozen=True)
class FlagPath:
    """One path (or Hub id) a flag's value names."""

    arg: int  # index in the argv of the word that holds it
    flag: str  # canonical flag name
    label: str  # how messages name the place: "--lora-modules sql", "--speculative-config's model"
    value: str
    kind: Literal["dir", "file"]
    #: The secondary-model role when it may be a Hub repo; None: only ever a local path.
    role: vllmflags.ModelRef | None = None
    name: str | None = None  # a LoRA adapter's name
    readonly: bool = True


def is_local(word: str) -> bool:
    """Whether ``word`` is a local path by :data:`RULE` (else an ``owner/name`` Hub repo id)."""
    return word.startswith(("/", "~", "./", "../")) or not _REPO_RE.match(word)


def flag_paths(args: Sequence[str]) -> Iterator[FlagPath]:
    """Every path the argv's flags name (vllmflags ``paths``), in argv order."""
    i = 0
    while i < len(args):
        flag = vllmflags.lookup(args[i])
        end = vllmflags.span(args, i) if vllmflags.is_option(args[i]) else i + 1
        if flag is not None and flag.paths is not None:
            joined = args[i].startswith("--") and "=" in args[i]
            values = [(i, args[i].split("=", 1)[1])] if joined else [(k, args[k]) for k in range(i + 1, end)]
            for k, v in values:
                yield from _in_value(flag, k, v)
        i = end


def _in_value(flag: vllmflags.Flag, arg: int, value: str) -> Iterator[FlagPath]:
    name = flag.name
    if flag.paths == "file":
        if name != "--chat-template" or not _TEMPLATE_CHARS & set(value):
            yield FlagPath(arg, name, name, value, "file")
    elif flag.paths == "dir":
        yield FlagPath(arg, name, name, value, "dir")
    elif flag.paths == "json":
        yield from _json_paths(name, arg, _json(value))
    elif flag.model_ref == "lora":
        lora, path = lora_module(value)
        if path is not None:
            yield FlagPath(arg, name, f"{name} {lora}", path, "dir", "lora", lora)
    elif flag.kind == "json":
        conf = _json(value)
        if isinstance(conf, dict) and isinstance(conf.get("model"), str):
            yield FlagPath(arg, name, f"{name}'s model", conf["model"], "dir", flag.model_ref)
    elif not value.startswith("["):  # `--speculative-model [ngram]`: a method, not a model
        yield FlagPath(arg, name, name, value, "dir", flag.model_ref)


def _json(value: str) -> Any:
    try:
        return json.loads(value)
    except ValueError:
        return None  # refused by the JSON check (flags._json_problems), or the legacy k=v form


def _json_paths(flag: str, arg: int, data: Any, keys: tuple[str, ...] = ()) -> Iterator[FlagPath]:
    """String values of a JSON flag that are paths: under a key that says so, or written like one. A
    directory there is where a KV connector stores, so it is mounted writable; a file is read."""
    if isinstance(data, dict):
        for k, v in data.items():
            yield from _json_paths(flag, arg, v, (*keys, str(k)))
    elif isinstance(data, list):
        for idx, v in enumerate(data):
            yield from _json_paths(flag, arg, v, (*keys, str(idx)))
    elif isinstance(data, str) and keys:
        key = keys[-1].lower()
        if key.endswith(("path", "file", "dir", "directory")) or data.startswith(("/", "~/", "./", "../")):
            kind: Literal["dir", "file"] = "file" if key.endswith("file") else "dir"
            label = f"{flag}'s {'.'.join(keys)}"
            yield FlagPath(arg, flag, label, data, kind, readonly=kind == "file")


def lora_module(value: str) -> tuple[str | None, str | None]:
    """``NAME=PATH`` or the JSON form ``{"name": …, "path": …}`` of one ``--lora-modules`` value."""
    if value.lstrip().startswith("{"):
        data = _json(value)
        if isinstance(data, dict) and isinstance(data.get("path"), str):
            name = data.get("name")
            return (name if isinstance(name, str) else None), data["path"]
        return None, None
    name, eq, path = value.partition("=")
    return (name, path) if eq else (None, None)


@dataclass
class Placed:
    """What the flags' paths became: secondary Hub models (spec dicts), mounts, notes and refusals."""

    secondary: list[dict[str, Any]]
    mounts: list[specmod.Mount]


def place(launch: Launch, model_arg: int, notes: list[str], problems: list[str]) -> Placed:
    """Each path the flags name (other than the model argument at ``model_arg``) as a secondary Hub model,
    a mount, a note (a container recipe's own path, a value still to fill) or a refusal in ``problems``."""
    out = Placed([], [])
    for fp in flag_paths(launch.args):
        if fp.arg == model_arg or fp.value in launch.documentation:
            continue  # the model is read elsewhere; a documentation word's note is docwords'
        if fp.flag == "--config":
            notes.append(
                f"args[{fp.arg}] --config {fp.value}: vLLM reads more flags from that file, which rigsmith "
                "does not read (the GPUs, ports and model the spec holds come from the command); move any "
                "that matter into the command"
            )
        expands = fp.arg < len(launch.arg_expands) and launch.arg_expands[fp.arg]
        if expands or specmod.PLACEHOLDER_RE.search(fp.value):
            what = "a Hub repo id or a path" if fp.role else "a path"
            notes.append(
                f"args[{fp.arg}] {fp.label} {fp.value!r} is a value you fill ({what}); filled with an "
                "absolute path, every target mounts it at that same path"
            )
        elif fp.role is not None and not is_local(fp.value):
            out.secondary.append({"role": fp.role, "repo": fp.value, "name": fp.name, "arg": fp.arg})
            notes.append(
                f"args[{fp.arg}] {fp.label} {fp.value} is a Hub repo id by rigsmith's rule ({RULE}); for a "
                f"directory of that name write ./{fp.value}"
            )
        elif launch.image is not None:
            notes.append(_in_container(launch, fp))
        elif fp.value.startswith("/"):
            out.mounts.append(_mount(fp))
        else:
            rule = f" ({RULE})" if fp.role else ""
            problems.append(
                f"args[{fp.arg}]: {fp.label} names {fp.value!r}, a path relative to "
                f"{'a home' if fp.value.startswith('~') else 'where the recipe ran'}{rule}; rigsmith "
                "mounts a flag's path read-only at the same path in the container, so write its absolute "
                "path" + (" (or the Hub repo id owner/name)" if fp.role else "")
            )
    if out.secondary:
        notes.append(
            "secondary_models lists the Hub models the engine loads besides the main one "
            f"({', '.join(s['repo'] for s in out.secondary)}); pin and fetch-model lock and fetch each into "
            "its own directory, and every target mounts it read-only and points the argument at it"
        )
    return out


def _mount(fp: FlagPath) -> specmod.Mount:
    host = fp.value.rstrip("/") or "/"
    mode = "read-only" if fp.readonly else "writable (a KV connector stores there)"
    return specmod.Mount(
        host=host,
        container=host,
        readonly=fp.readonly,
        kind=fp.kind,
        note=f"{fp.label} (args[{fp.arg}]): the recipe's path, mounted {mode} at the same path",
    )


def _in_container(launch: Launch, fp: FlagPath) -> str:
    """A container recipe's path: under one of its volumes, or the image's."""
    path = PurePosixPath(fp.value)
    if path.is_absolute():
        held = [m for m in launch.mounts if path.is_relative_to(m.container)]
        if held:
            m = max(held, key=lambda m: len(PurePosixPath(m.container).parts))
            return f"args[{fp.arg}] {fp.label} {fp.value} is in the recipe's volume {m.host}:{m.container}"
        return (
            f"args[{fp.arg}] {fp.label} {fp.value} is under none of the recipe's volumes: the image must "
            "hold it (else add the volume that does: mounts)"
        )
    return (
        f"args[{fp.arg}] {fp.label} {fp.value} is relative to the image's working directory, which must hold "
        "it (vllm/vllm-openai's /vllm-workspace holds examples/); else mount it and write its absolute path"
    )
