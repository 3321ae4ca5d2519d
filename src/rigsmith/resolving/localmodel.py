"""A local checkpoint (``model.repo: null``): nothing is pinned or downloaded; ``fetch-model`` reports what
the directory holds and applies the config patches to a copy, keeping the original. Also the JSON patch
itself, which Hub models share.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from rigsmith.errors import RigsmithError, SpecError
from rigsmith.modeldir import check_model_dir
from rigsmith.resolving.modelfiles import (
    ORIGINAL_DIR,
    STATE_DIR,
    FetchReport,
    expand_dir,
    patch_json,
    patches_by_file,
)
from rigsmith.spec import Deployment
from rigsmith.writer import write_one

Echo = Callable[[str], None]

#: File suffixes that hold weights, for the report.
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


def real_home(home: str) -> str:
    """The home directory through its symlinks (``/home`` is ``/var/home`` on Fedora Atomic), so a model
    dir under it is judged as a subdirectory of home, not as something in ``/var``."""
    return str(Path(home).resolve()) if home else home


def dir_lock(path: Path, echo: Echo) -> FileLock:
    lock = FileLock(str(path), timeout=-1)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        echo(f"waiting for another fetch into {path.parent.parent} to finish …")
        lock.acquire()
    return lock


def fetch_local(spec: Deployment, dest: Path | None, echo: Echo, home: str) -> FetchReport:
    """A checkpoint already on disk: report what is there and apply the config patches; download nothing."""
    m = spec.model
    if dest is None and not m.local_dir.startswith(("/", "~")):
        why = f"{m.local_dir!r} is relative (to where the recipe ran); set the checkpoint's absolute path"
        raise SpecError("model.local_dir", [("model.local_dir", why)])
    root = dest.absolute() if dest is not None else expand_dir(m.local_dir, {"HOME": home})
    if not root.is_dir():
        raise RigsmithError(
            f"{spec.name}: model.repo is null, so the checkpoint is local and there is nothing to download "
            f"— but {root} is not a directory",
            hint="copy the checkpoint there, point model.local_dir at it, or set model.repo to owner/name to "
            "download it",
        )
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.relative_to(root).parts[0] != STATE_DIR)
    report = FetchReport(
        local_dir=str(root),
        files=len(files),
        local=True,
        local_bytes=sum(p.stat().st_size for p in files),
        weight_files=sum(p.name.endswith(_WEIGHT_SUFFIXES) for p in files),
        has_config=(root / "config.json").is_file(),
    )
    if m.config_patches:
        # Patching writes into the checkpoint dir: the same refusals as a download.
        check_model_dir(
            str(dest) if dest is not None else m.local_dir, home, "--dest" if dest else "model.local_dir"
        )
        check_model_dir(str(root.resolve()), real_home(home), "model.local_dir (resolved through symlinks)")
        with dir_lock(root / STATE_DIR / "fetch.lock", echo):
            _patch_local(spec, root, report, echo)
    return report


def _patch_local(spec: Deployment, root: Path, report: FetchReport, echo: Echo) -> None:
    """Config patches on a local checkpoint: the first-seen bytes are kept as the original, as for the Hub.

    A file that matches neither the kept original nor its patched form was replaced outside rigsmith (a new
    checkpoint copied in); it becomes the new original, and rigsmith says so.
    """
    missing = [
        (f"model.config_patches[{i}].file", f"{p.file} is not in the local checkpoint {root}")
        for i, p in enumerate(spec.model.config_patches)
        if not (root / p.file).is_file() and not (root / STATE_DIR / ORIGINAL_DIR / p.file).is_file()
    ]
    if missing:
        raise SpecError("model.config_patches", missing)
    for file, plist in patches_by_file(spec.model.config_patches).items():
        target, kept = root / file, root / STATE_DIR / ORIGINAL_DIR / file
        current = target.read_bytes() if target.is_file() else None
        original = kept.read_bytes() if kept.is_file() else current
        assert original is not None
        new = patched(original, plist, file)
        if current is not None and current not in (original, new):
            echo(f"{file}: changed outside rigsmith since it was patched; keeping it as the new original")
            original = current
            new = patched(original, plist, file)
        if not kept.is_file() or kept.read_bytes() != original:
            kept.parent.mkdir(parents=True, exist_ok=True)
            write_one(kept, original.decode("utf-8"))
        if current != new:
            write_one(target, new.decode("utf-8"))
            report.patched.append(file)


def patched(original: bytes, plist: Sequence[tuple[int, Any]], file: str) -> bytes:
    try:
        text = original.decode("utf-8")
    except UnicodeDecodeError:
        raise SpecError(
            "model.config_patches",
            [(f"model.config_patches[{plist[0][0]}].file", f"{file} is not UTF-8 text")],
        ) from None
    return patch_json(text, plist, file).encode("utf-8")
