"""Which model a recipe serves (a Hub repo, GGUF ``repo:QUANT`` too, a local checkpoint, a mount) and the
secondary Hub models it names."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePosixPath

from rigsmith import spec as specmod
from rigsmith.importing import vllmflags
from rigsmith.importing.recipe.flags import flag_values
from rigsmith.importing.recipe.launch import Launch
from rigsmith.importing.recipe.notes import NoteFacts
from rigsmith.importing.recipe.tables import (
    _REPO_RE,
)


def _expands(launch: Launch, idx: int) -> bool:
    """Whether a shell would expand part of args[idx] (compose lists never do: interpolation is refused)."""
    return idx < len(launch.arg_expands) and launch.arg_expands[idx]


@dataclass(frozen=True)
class _Model:
    """Where the model comes from: a Hub repo (downloaded) or a checkpoint already on disk (repo None)."""

    repo: str | None
    local_dir: str
    arg: int
    note: str | None = None
    #: Hub file patterns to fetch (a GGUF quantization); empty: the whole repo.
    allow_patterns: tuple[str, ...] = ()
    #: The container path when the model word is exactly a volume's container path.
    container_path: str | None = None


#: A bind mount's host side that is the directory the recipe ran in.
_GGUF_REF_RE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*):([A-Za-z0-9_.-]+)$")
_CWD_RE = re.compile(r"^(\$\(pwd\)|`pwd`|\$PWD|\$\{PWD\}|\.)(?=/|$)")


def _model_arg(launch: Launch, problems: list[str]) -> tuple[int, str] | None:
    """Where the model stands in the argv (--model, else vLLM's MODEL positional) and its value; None
    with the reason in problems when the command names none."""
    args = launch.args
    picks = flag_values(args, "--model")
    if picks:
        idx, value = picks[-1]
    elif launch.first_arg_positional_ok and (pos := vllmflags.positionals(args)):
        # vLLM's MODEL positional may follow options (`vllm serve --host 0.0.0.0 M`).
        idx, value = pos[0], args[pos[0]]
    else:
        guessed = [
            a
            for i, a in enumerate(args[:-1])
            if vllmflags.lookup(a) is None
            and vllmflags.is_option(a)
            and "=" not in a
            and not vllmflags.is_option(args[i + 1])
        ]
        why = (
            f" ({guessed[-1]} is a flag rigsmith does not know, so the word after it was read as its value; "
            "if that word is the model, write it right after the subcommand)"
            if guessed and launch.first_arg_positional_ok
            else ""
        )
        if "--config" in args[:-1] and not why:
            why = (
                f" (vLLM may read it from --config {args[args.index('--config') + 1]}, a file the text does "
                "not hold: rigsmith cannot see what it sets — write the model and the flags into the command)"
            )
        problems.append(f"the command names no model (no positional MODEL and no --model){why}; add one")
        return None
    return idx, value


def _unusable(launch: Launch, idx: int, value: str) -> str | None:
    """Why the model argument cannot be imported as written (a placeholder the text wrote, a shell
    expansion), or None. A documentation word (``/path/to/…``, ``...``) is already a made placeholder
    (:mod:`.docwords`)."""
    if specmod.PLACEHOLDER_RE.fullmatch(value) and value not in launch.made_placeholders:
        return (
            f"the model is the placeholder {value!r}; replace it with a Hub repo id (owner/name) or the "
            "checkpoint's directory"
        )
    if _expands(launch, idx):
        return (
            f"the model is {value!r}, which a shell would expand from a variable; rigsmith cannot know the "
            "value — write the Hub repo id (owner/name) or the checkpoint's directory instead"
        )
    return None


def _model(launch: Launch, facts: NoteFacts, problems: list[str]) -> _Model | None:
    """The model argument as a Hub repo or a local checkpoint, or None with the reason in problems."""
    found = _model_arg(launch, problems)
    if found is None:
        return None
    idx, value = found
    unusable = _unusable(launch, idx, value)
    if unusable:
        problems.append(unusable)
        return None
    if value in launch.documentation:
        return _Model(value, f"~/models/{value}", idx)  # docwords' note says what the word was and to fill
    if value in launch.made_placeholders:
        # A variable the text never sets ($MODEL, ${MODEL:?set MODEL}): the spec's model is the token until
        # the user fills it (spec.Deployment: placeholders gives the repo; pin and deploy refuse until then).
        return _Model(
            value,
            f"~/models/{value}",
            idx,
            f"the model is the placeholder {value} (the text gives the model no value: a variable it never "
            f"sets, or leaves blank); fill it before pin: placeholders: {{'{value}': OWNER/NAME}} in the "
            "spec (the Hub repo id, or the absolute directory of a checkpoint on disk; model.local_dir and "
            "model.container_path then use its name)",
        )
    gguf = _GGUF_REF_RE.match(value)
    if gguf and not value.startswith(("/", "~", ".")):
        # vLLM reads `owner/repo:QUANT` as the Hub repo and the GGUF file of that quantization.
        repo_id, quant = gguf.group(1), gguf.group(2)
        return _Model(
            repo_id,
            f"~/models/{PurePosixPath(repo_id).name}",
            idx,
            f"the model {value!r} is the Hub repo {repo_id} with the GGUF quantization {quant} "
            f"(only the files matching *{quant}*.gguf are fetched); vLLM loads a GGUF file, so the "
            "container runs the one .gguf file of that quantization under model.container_path, found in "
            "rigsmith.lock (run `invoke pin` before deploy)",
            allow_patterns=(f"*{quant}*.gguf", f"*{quant}*/*.gguf"),
        )
    is_path = value.startswith(("/", "~", "./", "../")) or not _REPO_RE.match(value)
    if not is_path:
        if facts.repo == value and facts.local_dir:
            return _Model(value, facts.local_dir, idx)
        return _Model(value, f"~/models/{PurePosixPath(value).name}", idx)
    if facts.repo and (facts.local_dir is None or facts.local_dir.rstrip("/") == value.rstrip("/")):
        return _Model(facts.repo, value, idx)
    if facts.repo and facts.local_dir and value.startswith("/"):
        # The notes' download names the repo, revision and host directory; the served path is where the
        # engine sees it (a container path), so that is where the download is mounted.
        return _Model(
            facts.repo,
            facts.local_dir,
            idx,
            f"the notes download {facts.repo} to {facts.local_dir} and the command serves {value}: "
            f"model.local_dir is the download, mounted at model.container_path {value}",
            container_path=value.rstrip("/"),
        )
    return _local_model(launch, value, idx, problems)


def _local_model(launch: Launch, value: str, idx: int, problems: list[str]) -> _Model | None:
    """A model path with no Hub repo: a checkpoint already on disk, mounted but never fetched."""
    if launch.image is None:
        if value.startswith("~") and not (value == "~" or value.startswith("~/")):
            problems.append(f"the model is {value!r}; write ~/… or an absolute path (~user is not expanded)")
            return None
        if value.startswith(("/", "~")):
            return _Model(None, value, idx)
        # vLLM loads a local directory of that name (relative to its cwd) before it asks the Hub.
        rel = value if value.startswith(("./", "../")) else "./" + value
        return _Model(
            None,
            rel,
            idx,
            f"the model {value!r} is a directory relative to where the recipe ran; model.local_dir is "
            f"{rel!r} until you set its absolute path (deploy refuses a relative one)",
        )
    # A container recipe: the path is inside the container; a bind mount says where it is on the host.
    path = PurePosixPath(value)
    if not path.is_absolute():
        problems.append(
            f"the model is {value!r}, a path relative to the container's working directory; write an "
            "absolute path under a mounted volume"
        )
        return None
    covering = [m for m in launch.mounts if path.is_relative_to(m.container)]
    if not covering:
        problems.append(
            f"the model is the container path {value!r} and no volume of the recipe mounts it from the host; "
            "add the bind mount (-v HOSTDIR:CONTAINERDIR) that holds the checkpoint"
        )
        return None
    mount = max(covering, key=lambda m: len(PurePosixPath(m.container).parts))
    host = _CWD_RE.sub(".", mount.host)
    if "$" in host or "`" in host or specmod.PLACEHOLDER_RE.search(host):
        problems.append(
            f"the model is {value!r}, inside the volume {mount.host}:{mount.container} whose host side is "
            "shell syntax or a placeholder; write the host directory instead"
        )
        return None
    rest = path.relative_to(mount.container).as_posix()
    exact = value.rstrip("/") if rest == "." else None
    local = host.rstrip("/") + ("/" + rest if rest != "." else "") if host != "/" else "/" + rest
    note = (
        f"the model {value!r} is the container path of {local!r} (volume {mount.host}:{mount.container}); "
        "model.local_dir is that host directory"
    )
    if not local.startswith(("/", "~")):
        note += (
            ", relative to where the recipe ran, until you set its absolute path (deploy refuses a "
            "relative one)"
        )
    return _Model(None, local, idx, note, container_path=exact)
