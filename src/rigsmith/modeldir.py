"""Is a path fit to be a model directory? A pure check, for the importer, the spec and fetch-model.

A model dir is a *dedicated* directory: fetch-model writes the recipe's files into it and replaces
files there. A recipe comes from the internet, and its notes can say ``hf download REPO --local-dir ~/.ssh``
(issue 10). So ``/``, a home directory itself, system directories, shared top-level directories and any
path through a dot-directory are refused, by their text, before anything touches the disk.

The standard Hugging Face cache (``~/.cache/huggingface/hub``) is refused like every other dot-directory:
it is huggingface_hub's own content-addressed store (``blobs/`` plus ``snapshots/<commit>/`` symlinks);
real files written into a snapshot folder would break ``hf cache scan``/``delete`` and be shared with
every other tool using that cache. rigsmith's model dir is a plain directory with its own verification.

What the text cannot tell (a non-empty directory that holds something else, a symlink pointing into
``/etc``) is checked by fetch-model on the disk itself.
"""

from __future__ import annotations

import posixpath
from collections.abc import Sequence

from rigsmith.errors import PreflightError, SpecError

#: First path components under which nothing is a model dir (the FHS system trees).
SYSTEM_TOPS = frozenset(
    {"bin", "boot", "dev", "etc", "lib", "lib32", "lib64", "libx32"}
    | {"proc", "run", "sbin", "sys", "usr", "var"}
)
#: Top-level directories that hold many things; a model dir may be *below* them, never one of them.
SHARED_TOPS = frozenset({"home", "media", "mnt", "opt", "srv", "tmp"})
#: Home directories of every user live one level below these.
HOME_PARENTS = ("/home",)

HINT = "use a directory of its own for the model, e.g. ~/models/NAME or /srv/models/NAME"


def model_dir_problem(path: str, home: str) -> str | None:
    """Why ``path`` may not be a model directory, or None when its text is fine.

    Args:
        path: the directory as written (``model.local_dir``, ``--dest``, ``--local-dir`` of a recipe);
            ``~`` and ``~/…`` are read against ``home``; a relative path is judged by its parts.
        home: the home directory of the user running rigsmith (an input, so the check stays pure).

    Returns:
        A short reason (``"/etc/cron.d is inside /etc, a system directory"``), or None.
    """
    if not path:
        return "it is empty"
    if "\0" in path:
        return "it contains a NUL byte"
    if any(ord(c) < 32 or ord(c) == 127 for c in path):
        return f"{path!r} holds a control character (a line break, tab or escape), which no target writes"
    text = path
    if text == "~" or text.startswith("~/"):
        if not home:
            # Unknown home (a pure check of a spec): the ``~/`` part cannot be normalised against it.
            if posixpath.normpath(text[2:] or ".") == ".":
                return f"{path} is your home directory"
            if ".." in text.split("/"):
                return f"{path} climbs out of your home directory (..)"
        text = home.rstrip("/") + text[1:] if home else text
    elif text.startswith("~"):
        return f"{path} is another user's home directory (write the absolute path of a directory of its own)"
    norm = posixpath.normpath(text)
    if norm.startswith("//"):
        norm = "/" + norm.lstrip("/")
    parts = [p for p in norm.split("/") if p]
    if not posixpath.isabs(norm):
        if ".." in parts:
            return f"{path} climbs out of its directory (..)"
        dots = [p for p in parts if p.startswith(".") and p != "."]
        return f"{path} is inside the hidden directory {dots[0]}" if dots else None
    dots = [p for p in parts if p.startswith(".")]
    if dots:
        return f"{path} is inside the hidden directory {dots[0]} (dot-directories hold settings and keys)"
    if norm == "/":
        return f"{path} is the root directory"
    home_norm = posixpath.normpath(home) if home else ""
    if home_norm not in ("", "/"):
        if norm == home_norm:
            return f"{path} is the home directory {home_norm}"
        if norm.startswith(home_norm + "/"):
            return None  # a subdirectory of one's own home that is not hidden
    if posixpath.dirname(norm) in HOME_PARENTS or norm == "/root":
        return f"{path} is the home directory of a user ({norm})"
    why = not_its_own(parts)
    return f"{path} is {why}" if why else None


def not_its_own(parts: Sequence[str]) -> str | None:
    """Why the path ``/PARTS…`` (normalised, not ``/``) is no directory of its own: inside a system tree, or
    a shared top-level directory itself; None otherwise. Also ``cluster.node_dir``'s rule."""
    if parts[0] in SYSTEM_TOPS or parts[0].startswith("lib"):
        return f"inside /{parts[0]}, a system directory"
    if len(parts) == 1 and parts[0] in SHARED_TOPS:
        return f"the shared directory /{parts[0]}, not one of its own"
    return None


def check_model_dir(path: str, home: str, field: str = "model.local_dir") -> None:
    """Raise a :class:`SpecError` naming ``field`` when :func:`model_dir_problem` finds a reason.

    Args:
        path: the directory as written.
        home: the home directory of the user running rigsmith.
        field: the spec field (or CLI flag, ``--dest``) the path came from, for the message.

    Raises:
        SpecError: for a spec field; PreflightError for a CLI flag.
    """
    why = model_dir_problem(path, home)
    if why is None:
        return
    if field.startswith("--"):
        raise PreflightError(f"{field}: {why}; a model dir must be a dedicated directory", hint=HINT)
    raise SpecError(field, [(field, f"{why}; a model dir must be a dedicated directory — {HINT}")])
