"""``pin`` (model part) and ``fetch-model``: a locked commit, downloaded, verified, patched.

The flow (converge, act, re-check):

1. :func:`pin_model` resolves the spec's branch/tag once into ``rigsmith.lock`` (commit + every file's
   size and Hub hash). Afterwards the locked commit is used until the spec changes or ``--repin``.
2. :func:`fetch_model` takes a per-directory file lock, removes stale partial downloads, and sorts the
   wanted files into *verified earlier* (the verified-file record vouches for the file as it is on disk:
   same size, mtime, ctime, inode and device as when it was hashed; no hashing, no network), *to check*
   (hash the file on disk) and *to download*. It checks disk space for what is left, then downloads in
   parallel: huggingface_hub moves the bytes into ``.rigsmith/partial/<hash>.incomplete`` (a killed run
   resumes from there with a range request), one hash pass checks them, and a file reaches its real path
   only once its hash matches the lock (:mod:`~rigsmith.resolving.download`).
3. Config patches are applied to a copy: the Hub's bytes stay in ``.rigsmith/original/<file>``, the
   patched file takes the real path, and the lock records both sha256s.

A local checkpoint (``model.repo: null``) skips 1 and 2: nothing is pinned or downloaded, the task reports
what the directory holds, and config patches are applied the same way (original kept) but not locked — the
lock records Hub facts only.
"""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from rigsmith.errors import ConsentError, RigsmithError, SpecError
from rigsmith.modeldir import check_model_dir
from rigsmith.project import Project
from rigsmith.resolving import lock as lockmod
from rigsmith.resolving.download import FetchContext, check_file, download_all, run_all
from rigsmith.resolving.download import FetchInterrupted as FetchInterrupted
from rigsmith.resolving.localmodel import dir_lock, fetch_local, patched, real_home
from rigsmith.resolving.lock import LockedModel
from rigsmith.resolving.modelfiles import (
    HF_DOWNLOAD_DIR,
    ORIGINAL_DIR,
    PARTIAL_DIR,
    STATE_DIR,
    STATE_FILE,
    WORKERS,
    FetchReport,
    Want,
    check_disk,
    check_patch_files,
    describe_repin,
    dump_state,
    expand_dir,
    locked_model,
    locked_patches,
    parse_workers,
    patches_by_file,
    read_state,
    seen_at,
    select,
    sha256_bytes,
    stale_partials,
    user_home,
    vouches,
    wants,
)
from rigsmith.spec import Deployment
from rigsmith.writer import write_one

if TYPE_CHECKING:
    from rigsmith.resolving.hub import Hub

Echo = Callable[[str], None]
HubFactory = Callable[[], "Hub"]
#: Asks the user a yes/no question (None: no terminal, so nothing may be asked and the answer is no).
Confirm = Callable[[str], bool]

#: Entries of a non-empty model dir looked at before deciding it holds something else.
SCAN_LIMIT = 10_000
#: The flags that give consent (named in the refusals).
ADOPT_FLAG = "--adopt-dir"
OVERWRITE_FLAG = "--overwrite-edited"


def _lazy(hub: Hub | HubFactory | None) -> Callable[[], Hub]:
    """Build the Hub client only when the network is really needed (a warm run makes no requests)."""
    cache: list[Hub] = []

    def get() -> Hub:
        if not cache:
            if hub is None:
                from rigsmith.resolving.hub import HfHub  # huggingface_hub: imported only when needed

                cache.append(HfHub.from_env())
            elif callable(hub) and not hasattr(hub, "download"):
                cache.append(hub())
            else:
                cache.append(hub)  # type: ignore[arg-type]
        return cache[0]

    return get


def _up_to_date(entry: LockedModel | None, spec: Deployment) -> bool:
    m = spec.model
    return (
        entry is not None
        and entry.repo == m.repo
        and entry.requested == m.revision
        and bool(entry.files)
        and (not m.pinned or entry.commit == m.revision)
    )


def pin_model(
    project: Project,
    spec: Deployment,
    *,
    repin: bool = False,
    echo: Echo = print,
    hub: Hub | HubFactory | None = None,
    slot: lockmod.Slot | None = None,
) -> LockedModel | None:
    """Resolve the spec's model revision into ``rigsmith.lock`` once; re-resolve only when asked.

    Args:
        spec: ``spec.model.repo`` and ``revision`` (None means ``main``) are resolved.
        repin: resolve the branch/tag again even when the lock already has a commit; prints what changed.
        hub: a Hub (or a factory for one); default: huggingface_hub with HF_ENDPOINT / HF_TOKEN.
        slot: where the entry lives in the lock (default: ``models[spec.name]``; a secondary model's is
            ``secondary[NAME][REPO]``, its ``spec`` a copy whose ``model`` is the secondary one).

    Returns:
        The lock entry: repo, requested revision, commit, every file's hashes; None for a local checkpoint
        (``model.repo: null``), which has nothing to pin.

    Raises:
        AdapterError: the Hub said no (not found, gated, bad revision) or stayed unreachable.
    """
    get_hub = _lazy(hub)
    slot = slot or lockmod.Slot(spec.name)
    old = slot.get(lockmod.read(project.lock_path))
    m = spec.model
    if m.repo is None:
        echo(
            f"{spec.name}: model skipped — model.repo is null (a local checkpoint in {m.local_dir}); "
            "nothing to pin"
        )
        if old is not None:
            # The lock must not claim a Hub commit for a checkpoint rigsmith no longer fetches.
            with lockmod.locked(project.lock_path) as lock:
                slot.put(lock, None)
            echo(
                f"{spec.name}: dropped the lock's {old.repo}@{old.commit[:12]} (the spec no longer names "
                "a repo)"
            )
        return None
    if _up_to_date(old, spec) and not repin:
        assert old is not None
        return old
    repo = m.repo
    commit = get_hub().resolve(repo, m.revision or "main")
    if old is not None and _up_to_date(old, spec) and old.commit == commit:
        echo(describe_repin(old, old)[0])
        return old
    new = locked_model(repo, m.revision, commit, get_hub().tree(repo, commit))
    with lockmod.locked(project.lock_path) as lock:
        current = slot.get(lock)
        if not repin and _up_to_date(current, spec):
            assert current is not None
            return current  # a concurrent pin got there first; keep its commit
        if current is not None and current.commit == new.commit:
            new = new.model_copy(update={"patches": current.patches})
        slot.put(lock, new)
    for line in describe_repin(old, new):
        echo(line)
    return new


def _clean(root: Path, wanted: Sequence[Want]) -> list[str]:
    """Remove partial downloads nothing can resume from, and huggingface_hub's own orphaned temp files."""
    removed = []
    pdir = root / STATE_DIR / PARTIAL_DIR
    if pdir.is_dir():
        names = [p.name for p in pdir.iterdir() if p.is_file()]
        for name in stale_partials(names, wanted):
            (pdir / name).unlink(missing_ok=True)
            removed.append(f"{STATE_DIR}/{PARTIAL_DIR}/{name}")
    hf = root / HF_DOWNLOAD_DIR
    if hf.is_dir():
        for p in sorted(hf.rglob("*.incomplete")):
            p.unlink(missing_ok=True)
            removed.append(str(p.relative_to(root)))
    return removed


def free_bytes(path: Path) -> int:
    """Free space on the filesystem that holds ``path`` (host fact; tests pass their own)."""
    for p in (path, *path.parents):
        if p.exists():
            return shutil.disk_usage(p).free
    return shutil.disk_usage("/").free


def _patch(
    ctx: FetchContext, verify: bool, confirm: Confirm | None, overwrite_edited: bool
) -> dict[str, tuple[str, str]]:
    """Apply the spec's config patches from the kept originals; idempotent.

    A patched file whose bytes are neither the patch rigsmith wrote last (the lock's ``patched_sha256``)
    nor the one it would write now was edited by hand: it is replaced only with consent (asked, or
    :data:`OVERWRITE_FLAG`); without a terminal the fetch stops, naming the file.
    """
    spec_patches = [p.model_dump(mode="json", exclude={"note"}) for p in ctx.spec.model.config_patches]
    recorded = {p.file: p for p in ctx.entry.patches}
    applied: dict[str, tuple[str, str]] = {}
    for file, plist in patches_by_file(ctx.spec.model.config_patches).items():
        target = ctx.root / file
        rec = recorded.get(file)
        if (
            not verify
            and rec is not None
            and ctx.state.patches == spec_patches
            and vouches(ctx.state.files.get(file), seen_at(target), "sha256", rec.patched_sha256)
        ):
            applied[file] = (rec.original_sha256, rec.patched_sha256)
            continue
        original = (ctx.root / STATE_DIR / ORIGINAL_DIR / file).read_bytes()
        new = patched(original, plist, file)
        a, b = sha256_bytes(original), sha256_bytes(new)
        ctx.hashed(len(original))
        current = target.read_bytes() if target.is_file() else None
        have = sha256_bytes(current) if current is not None else None
        if (
            rec is not None
            and have is not None
            and have not in (rec.patched_sha256, b, a)
            and not overwrite_edited
        ):
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
        if current is None or have != b:
            target = ctx.inside(file)
            write_one(target, new.decode("utf-8"))
            ctx.report.patched.append(file)
        ctx.record(file, "sha256", b)
        applied[file] = (a, b)
    ctx.state.patches = spec_patches
    return applied


# Over 80 lines: fetch-model's order (resolve, plan, disk space, download, verify, lock) is the function.
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
    """Download the locked model revision into its local dir, verify every file, apply config patches.

    Args:
        dest: directory to fetch into instead of ``spec.model.local_dir``.
        verify: hash every file again even where the verified-file record vouches for it.
        hub: Hub adapter (or factory); built only when a request is needed.
        disk_free: bytes free at a path (host fact).
        workers: files downloaded (or hashed) at once, 1 to ``MAX_WORKERS`` (64).
        progress: show a rich progress bar (default: when stderr is a terminal).
        confirm: asks the user yes/no; None when there is no terminal (then every question is a no).
        adopt_dir: fetch into a non-empty directory that does not hold this model yet, without asking.
        overwrite_edited: replace a hand-edited patched file (config.json) without asking.
        home: the user's home directory (default: ``$HOME``), for the model-dir check.
        slot, where: the model's lock entry (see :func:`pin_model`) and spec field (``secondary_models[0]``).

    Raises:
        RigsmithError: a bad spec field, the Hub refusing, a hash mismatch, too little disk space.
    """
    parse_workers(workers)
    home = home if home is not None else user_home()
    if spec.model.repo is None:
        return fetch_local(spec, dest, echo, home)
    field = "--dest" if dest is not None else f"{where}.local_dir"
    written = str(dest) if dest is not None else spec.model.local_dir
    check_model_dir(written, home, field)
    get_hub = _lazy(hub)
    slot = slot or lockmod.Slot(spec.name)
    entry = pin_model(project, spec, repin=repin, echo=echo, hub=get_hub, slot=slot)
    assert entry is not None
    m = spec.model
    root = dest.absolute() if dest is not None else expand_dir(m.local_dir, {"HOME": home})
    files = select(entry.files, m.allow_patterns, m.ignore_patterns)
    if not files:
        why = f"no file of {entry.repo}@{entry.commit[:12]} matches the allow/ignore patterns"
        raise SpecError(where, [(f"{where}.allow_patterns", why)])
    check_patch_files(m.config_patches, files)
    by_file = patches_by_file(m.config_patches)
    wanted = wants(files, by_file)
    guard_dir(root, field, home, entry, wanted, confirm, adopt_dir)

    try:
        (root / STATE_DIR).mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise RigsmithError(
            f"cannot create {root}: {err.strerror}", hint="pass --dest DIR you can write to"
        ) from None
    report = FetchReport(commit=entry.commit, local_dir=str(root), files=len(wanted))
    with dir_lock(root / STATE_DIR / "fetch.lock", echo):
        state = read_state(root / STATE_DIR / STATE_FILE)
        state.repo, state.commit = entry.repo, entry.commit
        ctx = FetchContext(spec, entry, root, state, report, threading.Lock(), get_hub, threading.Event())
        report.cleaned = _clean(root, wanted)

        to_check = [
            w
            for w in wanted
            if verify
            or not vouches(state.files.get(w.disk_path), seen_at(root / w.disk_path), w.kind, w.digest)
        ]
        report.cached = len(wanted) - len(to_check)
        try:
            checked = run_all(lambda w: check_file(ctx, w), to_check, workers, ctx.stop)
        except KeyboardInterrupt:
            raise FetchInterrupted(
                "stopped while verifying the files on disk (those verified so far are remembered); run "
                "`invoke fetch-model` again to continue"
            ) from None
        for _w, res in checked:
            if isinstance(res, BaseException):
                raise res
        todo = [w for w, ok in checked if ok is not True]

        if todo:
            pdir = root / STATE_DIR / PARTIAL_DIR
            have = {w.repo_path: _size(pdir / w.partial_name) for w in todo}
            check_disk(sum(max(w.size - have[w.repo_path], 0) for w in todo), disk_free(root), root)
            for w in todo:
                if verify and (root / w.disk_path).exists():
                    echo(f"{w.repo_path}: does not match the lock; downloading it again")
            try:
                download_all(ctx, todo, workers, progress)
            except KeyboardInterrupt:
                raise FetchInterrupted(
                    f"queued files cancelled; partial downloads kept in {root / STATE_DIR / PARTIAL_DIR}; "
                    "run `invoke fetch-model` again to resume"
                ) from None

        applied = _patch(ctx, verify, confirm, overwrite_edited)
        with ctx.mu:
            write_one(ctx.state_path, dump_state(state))

    new_patches = locked_patches(applied)
    if new_patches != entry.patches:
        with lockmod.locked(project.lock_path) as lock:
            cur = slot.get(lock)
            if cur is not None and cur.commit == entry.commit:
                slot.put(lock, cur.model_copy(update={"patches": new_patches}))
    return report


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

    The directory may be missing or empty, hold rigsmith's verified-file record (a model dir rigsmith
    made), or hold only files of the locked snapshot (an earlier ``hf download``). Anything else is
    someone's directory: ask, showing what would be written over, or (no terminal) refuse naming the
    directory and :data:`ADOPT_FLAG`. Files that are not part of the snapshot are never touched either
    way: rigsmith writes only the snapshot's paths and its own ``.rigsmith/``.
    """
    real = root.resolve()
    if real != root:
        check_model_dir(str(real), real_home(home), f"{field} (resolved through symlinks)")
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
    shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
    replaced = ", ".join(present[:10]) + (f" and {len(present) - 10} more" if len(present) > 10 else "")
    what = (
        f"{root} is not empty and does not hold {entry.repo} (not in the snapshot: {shown}); "
        f"fetch-model writes {len(wanted)} file(s) there"
        + (f", replacing any that differ from the snapshot: {replaced}" if present else "")
    )
    if confirm is not None and confirm(f"{what}. Files not in the snapshot are left alone. Fetch into it?"):
        return
    raise ConsentError(
        what,
        hint=f"point {field} at an empty directory of its own, or re-run with {ADOPT_FLAG} to fetch into "
        f"{root} anyway (files not in the snapshot are never touched)",
    )


def _foreign_files(root: Path, entry: LockedModel) -> list[str]:
    """Paths under ``root`` that are not files of the locked snapshot (book-keeping dirs aside)."""
    foreign: list[str] = []
    seen = 0
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = Path(dirpath).relative_to(root)
        if rel_dir == Path():
            dirnames[:] = [d for d in dirnames if d not in (STATE_DIR, ".cache")]
        for name in (*filenames, *(d for d in dirnames if Path(dirpath, d).is_symlink())):
            seen += 1
            rel = (rel_dir / name).as_posix()
            if rel not in entry.files:
                foreign.append(rel)
            if seen >= SCAN_LIMIT or len(foreign) >= 100:
                return sorted(foreign)
    return sorted(foreign)


def _size(p: Path) -> int:
    try:
        return p.stat().st_size
    except FileNotFoundError:
        return 0
