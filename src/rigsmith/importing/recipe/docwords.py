"""Words a published recipe leaves for its reader to replace — a documentation path (``/path/to/…``) as the
model, as any path a vLLM flag names or as a volume's host side, the model word ``...`` / ``…``, and a flag's
path relative to where the recipe ran (``--chat-template tool_chat.jinja``) — made into placeholders the user
fills (issue 35). One rule for every form (script, plain command, compose, recipe JSON/YAML): it is applied
to the launch before the model and the flags' paths are read (:func:`.assemble.build`).

The model becomes ``<MODEL>``; a flag's path the placeholder named after the flag (``--chat-template`` →
``<CHAT_TEMPLATE>``), in place inside its word (``--lora-modules sql=<LORA_MODULES>``, a JSON value's
string); a volume's host side the placeholder named after its container directory. Each is a made
placeholder (``Launch.made_placeholders``): the spec lists it, and pin and deploy refuse until it is
filled. One note each quotes the word and says what to fill. Pure.
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath

from rigsmith import spec as specmod
from rigsmith.errors import shown
from rigsmith.importing.recipe.launch import Launch
from rigsmith.importing.recipe.model import _expands, _model_arg
from rigsmith.importing.recipe.pathflags import RULE, FlagPath, flag_paths, is_local

#: A documentation path: a ``path/to`` component pair (``/path/to/model``, ``path/to/your/model``).
DOC_PATH_RE = re.compile(r"(^|/)path/to(/|$)")
#: The model word of a text that elides it.
_ELIDED_RE = re.compile(r"\.{3,}|…")


def is_documentation(word: str) -> bool:
    """Whether ``word`` is a documentation path, never a real one."""
    return DOC_PATH_RE.search(word) is not None


def _fresh(name: str, taken: set[str]) -> str:
    token, n = f"<{name}>", 1
    while token in taken:
        n += 1
        token = f"<{name}_{n}>"
    taken.add(token)
    return token


def fill(launch: Launch) -> None:
    """Each documentation word of ``launch.args`` replaced by a made placeholder, with its note."""
    taken = {t for a in launch.args for t in specmod.PLACEHOLDER_RE.findall(a)} | set(
        launch.made_placeholders
    )
    found = _model_arg(launch, [])
    model_at = found[0] if found else None
    if found is not None and (is_documentation(found[1]) or _ELIDED_RE.fullmatch(found[1])):
        idx, word = found
        token = _fresh("MODEL", taken)
        _replace(launch, idx, word, token)
        launch.notes.append(
            f"args[{idx}]: the model '{shown(word)}' is a word the published text leaves for you to replace; "
            f"it is the placeholder {token}: fill it before pin (placeholders: {{'{token}': OWNER/NAME}} in "
            "the spec, the Hub repo id, or the absolute directory of a checkpoint on disk)"
        )
    for i, mount in enumerate(launch.mounts):
        if is_documentation(mount.host):
            stem = re.sub(r"[^A-Za-z0-9]+", "_", PurePosixPath(mount.container).name).strip("_").upper()
            token = _fresh(stem or "VOLUME", taken)
            launch.mounts[i] = mount.model_copy(update={"host": token})
            launch.made_placeholders.append(token)
            launch.documentation[token] = mount.host
            launch.notes.append(
                f"the volume '{shown(mount.host)}':{shown(mount.container)} has a documentation path the "
                f"published text leaves for you to replace as its host side; it is the placeholder {token}: "
                "fill it with the host directory before deploy"
            )
    for fp in list(flag_paths(launch.args)):
        if fp.arg == model_at:
            continue
        if is_documentation(fp.value):
            what = "a documentation path the published text leaves for you to replace"
        elif _relative_on_host(launch, fp):
            what = f"a path relative to {'a home' if fp.value.startswith('~') else 'where the recipe ran'}"
        else:
            continue
        token = _fresh(fp.flag.lstrip("-").upper().replace("-", "_"), taken)
        _replace(launch, fp.arg, fp.value, token)
        launch.notes.append(
            f"args[{fp.arg}]: {fp.label} names '{shown(fp.value)}', {what}; it is the placeholder {token}: "
            "fill it before deploy with the real absolute path, which every target mounts at that same path"
            + (f", or the Hub repo id (owner/name; {RULE})" if fp.role else "")
        )


def _relative_on_host(launch: Launch, fp: FlagPath) -> bool:
    """Whether ``fp`` is a local path relative to a directory only the recipe's author knew (``x.jinja``,
    ``./adapters/sql``, ``~/loras``) in a recipe that runs vLLM on its host: rigsmith mounts a flag's path at
    the same absolute path, so the user names it. ``--config``'s file is left to :func:`.pathflags.place`
    (it holds flags rigsmith does not read); a recipe's own container resolves its paths itself."""
    return (
        launch.image is None
        and fp.flag != "--config"
        and not _expands(launch, fp.arg)
        and not specmod.PLACEHOLDER_RE.search(fp.value)
        and not fp.value.startswith("/")
        and (fp.role is None or is_local(fp.value))  # a flag that takes only a path, or not owner/name
    )


def _replace(launch: Launch, idx: int, word: str, token: str) -> None:
    """``word`` inside ``launch.args[idx]`` (all of it, a ``--flag=`` value, a ``NAME=`` or a JSON string)
    written as ``token``, which becomes one of the launch's made placeholders."""
    arg = launch.args[idx]
    at = arg.rfind(word) if arg.endswith(word) else arg.find(word)
    launch.args[idx] = arg[:at] + token + arg[at + len(word) :]
    launch.made_placeholders.append(token)
    launch.documentation[token] = word
