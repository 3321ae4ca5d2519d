"""The rig against the lock: is the model dir what ``fetch-model`` verified, is the locked image here?

``doctor`` shows the answers as rows; ``up`` refuses to start on any difference (``--ignore-drift``
starts anyway). The fast model check trusts the verified-file record ``fetch-model`` keeps in
``<local_dir>/.rigsmith/state.json`` only where it vouches for the file as it is now (same size, mtime,
ctime, inode and device as when it was hashed: :func:`~rigsmith.resolving.model.verified.vouches`); ``verify``
hashes every file, as ``fetch-model --verify`` does, without downloading anything.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from rigsmith.errors import LockDriftError
from rigsmith.operating.probes import ImageFacts, ModelFacts
from rigsmith.resolving.lock import lock as lockmod
from rigsmith.resolving.model.modelfiles import expand_dir, hash_file, patches_by_file, select, wants
from rigsmith.resolving.model.verified import (
    STATE_DIR,
    STATE_FILE,
    DirState,
    HashKind,
    Seen,
    read_state,
    seen_at,
    vouches,
)
from rigsmith.secondary import placements, view
from rigsmith.spec import Deployment, ModelSpec

#: At most this many files are named one by one; the rest are counted.
SHOWN = 8


#: How a file of the model dir looks (:data:`~rigsmith.resolving.model.verified.Seen`) by its path relative to
#: the dir; None when missing.
Stat = Callable[[str], "Seen | None"]


def model_facts(
    spec: Deployment,
    lock: lockmod.Lock,
    *,
    verify: bool = False,
    listing: tuple[Mapping[str, Seen], str | None] | None = None,
) -> ModelFacts:
    """Compare ``model.local_dir`` with the deployment's model entry in the lock.

    ``listing``: another machine's model dir instead of this one's, as (relative path → how it looks there,
    the text of its verified-file record or None); sizes and the record only, no hashes.
    """
    m = spec.model
    if m.repo is None:
        return ModelFacts(
            m.local_dir, 0, verify, note="local checkpoint (model.repo is null): no lock to compare"
        )
    entry = lock.models.get(spec.name)
    if entry is None:
        return ModelFacts(
            m.local_dir,
            0,
            verify,
            note="rigsmith.lock pins no model for it yet: `invoke pin` then `fetch-model`",
            unpinned=(m.repo,),
        )
    count, problems = _compare(m, entry, verify, listing)
    unpinned = []
    # Another node's listing covers its main model dir only; its secondaries are checked there (--node).
    for p in placements(spec) if listing is None else ():
        sub = lock.secondary.get(spec.name, {}).get(p.repo)
        if sub is None:  # like a model with no entry: nothing pinned, so nothing to drift from
            unpinned.append(p.repo)
            continue
        n, found = _compare(view(spec, p).model, sub, verify)
        count += n
        problems += [f"secondary model {p.repo} ({p.local_dir}): {f}" for f in found]
    if len(problems) > SHOWN:
        problems[SHOWN:] = [f"and {len(problems) - SHOWN} more"]
    note = (
        f"rigsmith.lock pins no secondary model {', '.join(unpinned)} yet: `invoke pin` then `fetch-model`"
        if unpinned
        else None
    )
    return ModelFacts(m.local_dir, count, verify, tuple(problems), note=note, unpinned=tuple(unpinned))


def _compare(
    m: ModelSpec,
    entry: lockmod.LockedModel,
    verify: bool,
    listing: tuple[Mapping[str, Seen], str | None] | None = None,
) -> tuple[int, list[str]]:
    """(files compared, differences) of one model dir against its lock entry."""
    root = expand_dir(m.local_dir)
    if listing is None:
        state = read_state(root / STATE_DIR / STATE_FILE)
        stat: Stat = lambda rel: seen_at(root / rel)  # noqa: E731
    else:
        files_there, state_text = listing
        state, stat = _state(state_text), files_there.get
        verify = False
    problems: list[str] = []
    if state.commit and state.commit != entry.commit:
        problems.append(f"the dir holds commit {state.commit[:12]}, the lock {entry.commit[:12]}")
    files = select(entry.files, m.allow_patterns, m.ignore_patterns)
    by_file = patches_by_file(m.config_patches)
    # (path in the dir, size the lock gives or None, hash kind, digest): the Hub's files (a patched file's
    # pristine copy under .rigsmith/original), then each patched file as fetch-model wrote it.
    expected: list[tuple[str, int | None, HashKind, str]] = [
        (w.disk_path, w.size, w.kind, w.digest) for w in wants(files, by_file)
    ]
    recorded = {p.file: p for p in entry.patches}
    for file in by_file:
        rec = recorded.get(file)
        if rec is None:
            problems.append(f"{file}: config patch not applied")
        else:
            expected.append((file, None, "sha256", rec.patched_sha256))
    for rel, size, kind, digest in expected:
        st = stat(rel)
        if st is None:
            problems.append(f"{rel}: missing")
            continue
        if size is not None and st[0] != size:
            problems.append(f"{rel}: {st[0]} bytes, the lock says {size}")
        elif verify:
            if hash_file(root / rel, kind, st[0]) != digest:
                problems.append(f"{rel}: content differs from the lock ({kind})")
        elif not vouches(state.files.get(rel), st, kind, digest):
            problems.append(f"{rel}: changed since fetch-model verified it")
    return len(expected), problems


def _state(text: str | None) -> DirState:
    try:
        return DirState.model_validate_json(text or "")
    except ValueError:  # pydantic's ValidationError is a ValueError
        return DirState()


def image_fix(ref: str) -> str:
    """The command that brings the locked image into local storage."""
    if ref.startswith("sha256:"):  # a local build's image ID: no registry has it
        return "`invoke build` (it records the new image in rigsmith.lock)"
    if "@" not in ref:
        return f"`invoke build` (it records the new image in rigsmith.lock), or `podman pull {ref}`"
    return f"`podman pull {ref}`, or `invoke build` when rigsmith builds it"


def gate(name: str, model: ModelFacts | None, image: ImageFacts | None) -> None:
    """Refuse (LockDriftError naming each difference and its fix) when the rig differs from the lock.

    Only what the lock pins can drift: an unpinned image or a model with no lock entry passes here (deploy
    and doctor warn about those).
    """
    problems: list[str] = []
    fixes: list[str] = []
    if model is not None and model.problems:
        problems += [f"model {model.local_dir}: {p}" for p in model.problems]
        fixes.append(f"`invoke fetch-model --deployment {name} --verify`")
    if image is not None and image.pinned and not image.present:
        problems.append(f"image {image.ref} (pinned in rigsmith.lock) is not in local storage")
        fixes.append(image_fix(image.ref))
    if problems:
        raise LockDriftError(
            f"{name} differs from rigsmith.lock; not starting it:\n"
            + "\n".join(f"  - {p}" for p in problems),
            hint="; ".join(fixes) + ". `--ignore-drift` starts it anyway",
        )
