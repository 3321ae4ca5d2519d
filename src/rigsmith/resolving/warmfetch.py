"""What ``fetch-model`` settles before it loads the spec's models and the Hub client: ``--workers``, and the
warm re-run, answered with stat calls only.

A fetch that found every file verified earlier and changed nothing leaves a *mark*,
``<checkout>/.rigsmith/fetched/<deployment>.json``: a key over everything that run's answer followed from
(the spec's and the lock's bytes, ``--dest``, ``$HOME``, the model dir's real path) and the ``stat`` of every
file its verified-state cache (``<local_dir>/.rigsmith/state.json``) vouches for, of that cache itself, and
of the book-keeping directories it looked into. A later run whose key and stats are all the same would
decide the same, file for file, so it prints that run's answer without reading a byte of the model or
importing pydantic, huggingface_hub or httpx. Anything different (a file touched, replaced, removed; a
partial download appearing; the spec, the lock or the flags changed) and the full fetch runs, as before.

Stats compare size, mtime, ctime, inode and device: stricter than the verified-state cache itself (size and
mtime), so the mark never vouches for a file the full run would look at again. Stdlib only, on purpose.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from rigsmith import marks, userhome
from rigsmith.errors import RigsmithError

#: How many files download and hash at once, like ``hf download`` (hashlib releases the GIL on large
#: buffers, so the threads really overlap).
WORKERS = 8
MAX_WORKERS = 64
#: Bumped whenever what a fetch decides from the same inputs could change, so older marks stop matching.
FORMAT = 1
MARKS = Path(".rigsmith") / "fetched"
#: rigsmith's own book-keeping inside a model dir, and huggingface_hub's (modelfiles uses the same names).
STATE_DIR = ".rigsmith"
STATE_FILE = "state.json"
PARTIAL_DIR = "partial"
HF_DOWNLOAD_DIR = ".cache/huggingface/download"


def parse_workers(text: object) -> int:
    """``--workers`` as given on the command line: a whole number from 1 to :data:`MAX_WORKERS`.

    Raises:
        RigsmithError: naming the flag and the range.
    """
    raw = str(text).strip()
    if not (raw.isascii() and raw.isdigit()) or not 1 <= int(raw) <= MAX_WORKERS:
        shown = raw if len(raw) <= 20 else raw[:20] + "…"
        raise RigsmithError(
            f"--workers {shown!r}: must be a whole number from 1 to {MAX_WORKERS}",
            hint=f"the default, {WORKERS}, matches `hf download`",
        )
    return int(raw)


def user_home() -> str:
    """The user's home directory, as the model-dir check judges ``model.local_dir`` against it (the invoking
    user's, SUDO_USER's under sudo: rigsmith.userhome)."""
    return userhome.invoking_home()


def mark_path(checkout: Path, name: str) -> Path:
    return checkout / MARKS / f"{name}.json"


def key(checkout: Path, name: str, dest: Path | None, home: str) -> str:
    """What a fetch's answer follows from, besides the model dir: the spec, the lock, the flags, the home."""
    files = (checkout / "deployments" / f"{name}.yaml", checkout / "rigsmith.lock")
    return marks.digest([FORMAT, str(dest) if dest else None, home], files)


def _hf_leftovers(root: Path) -> bool:
    """Whether huggingface_hub left temp files that a full fetch would remove (and report)."""
    hf = root / HF_DOWNLOAD_DIR
    if not hf.is_dir():
        return False
    return any(n.endswith(".incomplete") for _d, _s, names in os.walk(hf) for n in names)


def _observe(root: Path, files: list[str]) -> dict[str, object]:
    """The stats a full fetch's decisions rest on, for the files the verified-state cache names."""
    state = root / STATE_DIR
    return {
        "real": os.path.realpath(root),
        "dirs": [marks.stat(p, follow=False) for p in (root, state, root / ".cache", state / PARTIAL_DIR)],
        "state": marks.stat(state / STATE_FILE),
        "files": {f: marks.stat(root / f) for f in files},
    }


def record(checkout: Path, name: str, dest: Path | None, home: str, root: Path, said: str) -> None:
    """Leave the mark of a fetch that changed nothing and printed ``said`` (best effort: only a cache)."""
    try:
        cached = json.loads((root / STATE_DIR / STATE_FILE).read_bytes())
        files = sorted(cached["files"])
    except (OSError, ValueError, KeyError, TypeError):
        return
    if not _hf_leftovers(root):
        mark = {"key": key(checkout, name, dest, home), "root": str(root), "said": said}
        marks.write(mark_path(checkout, name), {**mark, **_observe(root, files)})


def forget(checkout: Path, name: str) -> None:
    """Drop the mark (a fetch that did something: its answer is not the one a re-run gives)."""
    marks.forget(mark_path(checkout, name))


def recall(checkout: Path, name: str, dest: Path | None, home: str) -> str | None:
    """What the last no-op fetch printed, when nothing it followed from has changed since; else None."""
    mark = marks.read(mark_path(checkout, name))
    if mark is None or mark.get("key") != key(checkout, name, dest, home):
        return None
    try:
        root = Path(mark["root"])
        seen = _observe(root, sorted(mark["files"]))
    except (KeyError, TypeError):
        return None
    said = mark.get("said")
    same = all(seen[k] == mark.get(k) for k in seen)
    return said if same and isinstance(said, str) and not _hf_leftovers(root) else None
