"""``pin`` (model part) and ``fetch-model``: a locked commit, downloaded, verified, patched.

:func:`pin_model` resolves the spec's branch/tag once into ``rigsmith.lock``. :func:`fetch_model` sorts the
wanted files into *verified earlier* (the verified-file record vouches for them: no hashing, no network),
*to check* (hashed on disk) and *to download* (:mod:`~rigsmith.resolving.model.download`), then applies config
patches to a copy: the Hub's bytes stay in ``.rigsmith/original/<file>`` and the lock records both sha256s.
A local checkpoint (``model.repo: null``) is neither pinned nor downloaded; its patches are applied the
same way but not locked (the lock records Hub facts only).
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Callable, Sequence
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, TypeGuard

from filelock import FileLock, Timeout

from rigsmith import userhome
from rigsmith.errors import ConsentError, RigsmithError, SpecError
from rigsmith.modeldir import check_model_dir
from rigsmith.project import Project
from rigsmith.resolving.lock import lock as lockmod
from rigsmith.resolving.lock.lock import LockedModel, LockedPatch
from rigsmith.resolving.model.download import FetchContext, check_file, download_all, run_all
from rigsmith.resolving.model.modelfiles import (
    HF_DOWNLOAD_DIR,
    ORIGINAL_DIR,
    PARTIAL_DIR,
    WORKERS,
    FetchReport,
    Want,
    check_disk,
    check_patch_files,
    describe_repin,
    expand_dir,
    parse_workers,
    patch_json,
    patches_by_file,
    select,
    stale_partials,
    wants,
)
from rigsmith.resolving.model.verified import STATE_DIR, STATE_FILE, read_state, seen_at, vouches
from rigsmith.spec import ConfigPatch, Deployment, ModelSpec
from rigsmith.writer import write_one

if TYPE_CHECKING:
    from rigsmith.resolving.model.hub import Hub

Echo = Callable[[str], None]
HubFactory = Callable[[], "Hub"]
#: Asks the user a yes/no question (None: no terminal, so nothing may be asked and the answer is no).
Confirm = Callable[[str], bool]

#: Entries of a non-empty model dir looked at before deciding it holds something else.
SCAN_LIMIT = 10_000
#: The flags that give consent (named in the refusals).
ADOPT_FLAG = "--adopt-dir"
OVERWRITE_FLAG = "--overwrite-edited"
#: File suffixes that hold weights, for a local checkpoint's report.
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


def _lazy(hub: Hub | HubFactory | None) -> Callable[[], Hub]:
    """Build the Hub client only when the network is really needed (a warm run makes no requests)."""

    @cache
    def get() -> Hub:
        if hub is None:
            from rigsmith.resolving.model.hub import (
                HfHub,  # huggingface_hub: 212 ms (-X importtime) a warm run skips
            )

            return HfHub.from_env()
        return hub() if callable(hub) and not hasattr(hub, "download") else hub  # type: ignore[return-value]

    return get


def _up_to_date(entry: LockedModel | None, spec: Deployment) -> TypeGuard[LockedModel]:
    m = spec.model
    if entry is None or not entry.files or (entry.repo, entry.requested) != (m.repo, m.revision):
        return False
    return not m.pinned or entry.commit == m.revision


def pin_model(
    project: Project,
    spec: Deployment,
    *,
    repin: bool = False,
    echo: Echo = print,
    hub: Hub | HubFactory | None = None,
    slot: lockmod.Slot | None = None,
) -> LockedModel | None:
    """Resolve the spec's model revision into ``rigsmith.lock`` once (again with ``repin``, saying what
    changed); None for a local checkpoint. ``hub``: a Hub or a factory (default: huggingface_hub from the
    environment); ``slot``: the entry's place in the lock (default ``models[spec.name]``)."""
    get_hub = _lazy(hub)
    slot = slot or lockmod.Slot(spec.name)
    old = slot.get(lockmod.read(project.lock_path))
    m = spec.model
    if m.repo is None:
        here = f"(a local checkpoint in {m.local_dir})"
        echo(f"{spec.name}: model skipped — model.repo is null {here}; nothing to pin")
        if old is not None:
            # The lock must not claim a Hub commit for a checkpoint rigsmith no longer fetches.
            with lockmod.locked(project.lock_path) as lock:
                slot.put(lock, None)
            gone = f"{old.repo}@{old.commit[:12]}"
            echo(f"{spec.name}: dropped the lock's {gone} (the spec no longer names a repo)")
        return None
    if not repin and _up_to_date(old, spec):
        return old
    commit = get_hub().resolve(m.repo, m.revision or "main")
    if _up_to_date(old, spec) and old.commit == commit:
        echo(describe_repin(old, old)[0])
        return old
    files = dict(sorted(get_hub().tree(m.repo, commit).items()))
    new = LockedModel(repo=m.repo, requested=m.revision, commit=commit, files=files)
    with lockmod.locked(project.lock_path) as lock:
        current = slot.get(lock)
        if not repin and _up_to_date(current, spec):
            return current  # a concurrent pin got there first; keep its commit
        if current is not None and current.commit == new.commit:
            new = new.model_copy(update={"patches": current.patches})
        slot.put(lock, new)
    for line in describe_repin(old, new):
        echo(line)
    return new


def _clean(root: Path, wanted: Sequence[Want]) -> list[str]:
    """Remove partial downloads nothing can resume from, and huggingface_hub's own orphaned temp files."""
    pdir = root / STATE_DIR / PARTIAL_DIR
    names = [p.name for p in pdir.iterdir() if p.is_file()] if pdir.is_dir() else []
    stale = [pdir / name for name in stale_partials(names, wanted)]
    stale += sorted((root / HF_DOWNLOAD_DIR).rglob("*.incomplete"))
    for p in stale:
        p.unlink(missing_ok=True)
    return [str(p.relative_to(root)) for p in stale]


def free_bytes(path: Path) -> int:
    """Free space on the filesystem that holds ``path`` (host fact; tests pass their own)."""
    return shutil.disk_usage(next((p for p in (path, *path.parents) if p.exists()), Path("/"))).free


def _patch(
    ctx: FetchContext, patches: Sequence[ConfigPatch], verify: bool, confirm: Confirm | None, overwrite: bool
) -> list[LockedPatch]:
    """Apply the spec's config patches from the kept originals; idempotent. A patched file that is neither
    the patch rigsmith wrote last (the lock's ``patched_sha256``) nor the one it would write now was edited
    by hand: it is replaced only with consent (asked, or :data:`OVERWRITE_FLAG`)."""
    spec_patches = [p.model_dump(mode="json", exclude={"note"}) for p in patches]
    recorded = {p.file: p for p in ctx.entry.patches}
    applied: list[LockedPatch] = []
    for file, plist in patches_by_file(patches).items():
        target, rec = ctx.root / file, recorded.get(file)
        if (
            not verify
            and rec is not None
            and ctx.state.patches == spec_patches
            and vouches(ctx.state.files.get(file), seen_at(target), "sha256", rec.patched_sha256)
        ):
            applied.append(rec)
            continue
        original = (ctx.root / STATE_DIR / ORIGINAL_DIR / file).read_bytes()
        new = patch_json(original, plist, file)
        a, b = hashlib.sha256(original).hexdigest(), hashlib.sha256(new).hexdigest()
        ctx.count(hashed_files=1, hashed_bytes=len(original))
        have = hashlib.sha256(target.read_bytes()).hexdigest() if target.is_file() else ""
        if rec is not None and have not in ("", rec.patched_sha256, b, a) and not overwrite:
            question = (
                f"{target} was edited since fetch-model patched it (sha256 {have[:12]}, rigsmith wrote "
                f"{rec.patched_sha256[:12]}); replace your edit with the patched file?"
            )
            if confirm is None or not confirm(question):
                raise ConsentError(
                    f"{target} was changed by hand since fetch-model patched it; not replacing your edit",
                    hint=f"to keep the change, put it in model.config_patches of the spec; to discard it, "
                    f"re-run with {OVERWRITE_FLAG}",
                )
        if have != b:
            write_one(ctx.inside(file), new.decode("utf-8"))
            ctx.report.patched.append(file)
        ctx.record(file, "sha256", b)
        applied.append(LockedPatch(file=file, original_sha256=a, patched_sha256=b))
    ctx.state.patches = spec_patches
    return sorted(applied, key=lambda p: p.file)


def fetch_model(
    project: Project,
    spec: Deployment,
    *,
    dest: Path | None = None,
    verify: bool = False,
    repin: bool = False,
    echo: Echo = print,
    hub: Hub | HubFactory | None = None,
    disk_free: Callable[[Path], int] = free_bytes,
    workers: int = WORKERS,
    progress: bool | None = None,
    confirm: Confirm | None = None,
    adopt_dir: bool = False,
    overwrite_edited: bool = False,
    home: str | None = None,
    slot: lockmod.Slot | None = None,
    where: str = "model",
) -> FetchReport:
    """Download the locked revision into the model dir (or ``dest``), verify every file (all of them again
    with ``verify``), apply config patches. ``confirm`` asks yes/no (None: no terminal, the answer is no);
    ``adopt_dir`` / ``overwrite_edited`` consent in advance; ``home`` is for the model-dir check.

    In order: resolve (pin), plan the files, guard the dir, then under the dir's lock check what is there,
    download the rest (disk space first), patch, and record the patches in the lock."""
    parse_workers(workers)
    home = home if home is not None else userhome.invoking_home()
    if spec.model.repo is None:
        return fetch_local(spec, dest, echo, home)
    field = "--dest" if dest is not None else f"{where}.local_dir"
    check_model_dir(str(dest) if dest is not None else spec.model.local_dir, home, field)
    get_hub = _lazy(hub)
    slot = slot or lockmod.Slot(spec.name)
    entry = pin_model(project, spec, repin=repin, echo=echo, hub=get_hub, slot=slot)
    assert entry is not None
    m = spec.model
    root = dest.absolute() if dest is not None else expand_dir(m.local_dir, {"HOME": home})
    wanted = _wanted(entry, m, where)
    guard_dir(root, field, home, entry, wanted, confirm, adopt_dir)
    _make_state_dir(root)
    report = FetchReport(commit=entry.commit, local_dir=str(root), files=len(wanted))
    with dir_lock(root / STATE_DIR / "fetch.lock", echo):
        state = read_state(root / STATE_DIR / STATE_FILE)
        state.repo, state.commit = entry.repo, entry.commit
        ctx = FetchContext(entry, root, state, report, get_hub)
        report.cleaned = _clean(root, wanted)
        todo = _not_on_disk(ctx, wanted, verify, workers)
        if todo:
            _download(
                ctx, todo, verify=verify, workers=workers, progress=progress, disk_free=disk_free, echo=echo
            )
        patches = _patch(ctx, m.config_patches, verify, confirm, overwrite_edited)
        ctx.save()
    if patches != entry.patches:
        _record_patches(project, slot, entry, patches)
    return report


def _wanted(entry: LockedModel, m: ModelSpec, where: str) -> list[Want]:
    """The locked files the model's allow/ignore patterns select, each where it lands and what vouches for
    it; refused when the patterns select nothing or a config patch names a file not fetched."""
    files = select(entry.files, m.allow_patterns, m.ignore_patterns)
    if not files:
        why = f"no file of {entry.repo}@{entry.commit[:12]} matches the allow/ignore patterns"
        raise SpecError(where, [(f"{where}.allow_patterns", why)])
    check_patch_files(m.config_patches, files.__contains__, "among the files fetched from the repo")
    return wants(files, patches_by_file(m.config_patches))


def _make_state_dir(root: Path) -> None:
    try:
        (root / STATE_DIR).mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise RigsmithError(
            f"cannot create {root}: {err.strerror}", hint="pass --dest DIR you can write to"
        ) from None


def _not_on_disk(ctx: FetchContext, wanted: Sequence[Want], verify: bool, workers: int) -> list[Want]:
    """The wanted files not on disk as the lock says: those the dir's state does not vouch for (every one
    with ``verify``) are hashed, and those that do not match are returned."""
    to_check = [
        w
        for w in wanted
        if verify
        or not vouches(ctx.state.files.get(w.disk_path), seen_at(ctx.root / w.disk_path), w.kind, w.digest)
    ]
    ctx.report.cached = len(wanted) - len(to_check)
    stopped = (
        "stopped while verifying the files on disk (those verified so far are remembered); run "
        "`invoke fetch-model` again to continue"
    )
    checked = run_all(lambda w: check_file(ctx, w), to_check, workers, ctx.stop, stopped)
    if errors := [r for r in checked if isinstance(r, BaseException)]:
        raise errors[0]
    return [w for w, ok in zip(to_check, checked, strict=True) if ok is not True]


def _download(
    ctx: FetchContext,
    todo: Sequence[Want],
    *,
    verify: bool,
    workers: int,
    progress: bool | None,
    disk_free: Callable[[Path], int],
    echo: Echo,
) -> None:
    """Download ``todo`` once the disk has room for what its partial downloads still lack."""
    root = ctx.root
    pdir = root / STATE_DIR / PARTIAL_DIR
    have = {p.name: p.stat().st_size for p in pdir.iterdir() if p.is_file()} if pdir.is_dir() else {}
    check_disk(sum(max(w.size - have.get(w.partial_name, 0), 0) for w in todo), disk_free(root), root)
    for w in todo:
        if verify and (root / w.disk_path).exists():
            echo(f"{w.repo_path}: does not match the lock; downloading it again")
    download_all(ctx, todo, workers, progress)


def _record_patches(
    project: Project, slot: lockmod.Slot, entry: LockedModel, patches: list[LockedPatch]
) -> None:
    """The patches applied, into the lock entry fetched (unless a pin moved it to another commit since)."""
    with lockmod.locked(project.lock_path) as lock:
        cur = slot.get(lock)
        if cur is not None and cur.commit == entry.commit:
            slot.put(lock, cur.model_copy(update={"patches": patches}))


def _check_real(root: Path, field: str, home: str) -> None:
    """The model-dir check on ``root`` through its symlinks, against the home directory through its own
    (``/home`` is ``/var/home`` on Fedora Atomic: a model dir under it is not something in ``/var``)."""
    real_home = str(Path(home).resolve()) if home else home
    check_model_dir(str(root.resolve()), real_home, f"{field} (resolved through symlinks)")


def guard_dir(
    root: Path,
    field: str,
    home: str,
    entry: LockedModel,
    wanted: Sequence[Want],
    confirm: Confirm | None,
    adopt: bool,
) -> None:
    """Refuse a model dir that is not dedicated to this model, on the disk (the text was checked before).
    It may be missing or empty, hold rigsmith's verified-file record, or hold only files of the locked
    snapshot (an earlier ``hf download``); anything else is someone's directory: ask, or (no terminal)
    refuse naming :data:`ADOPT_FLAG`. Files not in the snapshot are never touched either way."""
    if root.resolve() != root:
        _check_real(root, field, home)
    if not root.exists():
        return
    if not root.is_dir():
        raise RigsmithError(
            f"{root} is not a directory", hint=f"point {field} at a directory of its own for the model"
        )
    for book in (STATE_DIR, ".cache"):
        if (root / book).is_symlink():
            raise RigsmithError(
                f"{root / book} is a symlink; rigsmith keeps its book-keeping (and deletes stale partial "
                "files) there, so it must be a plain directory inside the model dir",
                hint=f"remove the symlink {root / book}",
            )
    if (root / STATE_DIR / STATE_FILE).is_file():
        return
    foreign = _foreign_files(root, entry)
    if not foreign or adopt:
        return
    present = sorted(w.repo_path for w in wanted if (root / w.repo_path).exists())
    what = (
        f"{root} is not empty and does not hold {entry.repo} (not in the snapshot: {_some(foreign, 5)}); "
        f"fetch-model writes {len(wanted)} file(s) there"
        + (f", replacing any that differ from the snapshot: {_some(present, 10)}" if present else "")
    )
    if confirm is not None and confirm(f"{what}. Files not in the snapshot are left alone. Fetch into it?"):
        return
    raise ConsentError(
        what,
        hint=f"point {field} at an empty directory of its own, or re-run with {ADOPT_FLAG} to fetch into "
        f"{root} anyway (files not in the snapshot are never touched)",
    )


def _some(names: Sequence[str], n: int) -> str:
    return ", ".join(names[:n]) + (f" and {len(names) - n} more" if len(names) > n else "")


def _foreign_files(root: Path, entry: LockedModel) -> list[str]:
    """Paths under ``root`` that are not files of the locked snapshot (book-keeping dirs aside), up to 100
    of the first :data:`SCAN_LIMIT` entries."""
    foreign: list[str] = []
    seen = 0
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = Path(dirpath).relative_to(root)
        if rel_dir == Path():
            dirnames[:] = [d for d in dirnames if d not in (STATE_DIR, ".cache")]
        for name in (*filenames, *(d for d in dirnames if Path(dirpath, d).is_symlink())):
            seen += 1
            if (rel := (rel_dir / name).as_posix()) not in entry.files:
                foreign.append(rel)
            if seen >= SCAN_LIMIT or len(foreign) >= 100:
                return sorted(foreign)
    return sorted(foreign)


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
        _check_real(root, "model.local_dir", home)
        with dir_lock(root / STATE_DIR / "fetch.lock", echo):
            _patch_local(m.config_patches, root, report, echo)
    return report


def _patch_local(patches: Sequence[ConfigPatch], root: Path, report: FetchReport, echo: Echo) -> None:
    """Config patches on a local checkpoint, the first-seen bytes kept as the original; a file that is
    neither the original nor its patched form was replaced outside rigsmith and becomes the new original."""
    originals = root / STATE_DIR / ORIGINAL_DIR
    where = f"in the local checkpoint {root}"
    check_patch_files(patches, lambda f: (root / f).is_file() or (originals / f).is_file(), where)
    for file, plist in patches_by_file(patches).items():
        target, kept = root / file, originals / file
        current = target.read_bytes() if target.is_file() else None
        original = kept.read_bytes() if kept.is_file() else current
        assert original is not None
        new = patch_json(original, plist, file)
        if current is not None and current not in (original, new):
            echo(f"{file}: changed outside rigsmith since it was patched; keeping it as the new original")
            original, new = current, patch_json(current, plist, file)
        if not kept.is_file() or kept.read_bytes() != original:
            write_one(kept, original.decode("utf-8"))
        if current != new:
            write_one(target, new.decode("utf-8"))
            report.patched.append(file)
