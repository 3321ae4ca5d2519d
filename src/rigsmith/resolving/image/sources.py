"""Source trees of engine images: git (a cached bare repository, via the git CLI) and release assets (httpx,
a content-addressed cache). The adapter behind ``tree:`` in ``images/<name>/image.yaml``.

``invoke pin`` resolves each tree's ref to a commit and each asset URL to a sha256 in ``rigsmith.lock``
(``sources``), downloading into the cache; ``invoke build`` then reads the locked commit with
``git archive`` and the assets from the cache, each re-verified, and touches the network only for what
the cache lacks. A branch that moved upstream changes nothing until ``pin --repin``.

Cache layout (``$RIGSMITH_CACHE``, else ``$XDG_CACHE_HOME/rigsmith``, else ``~/.cache/rigsmith``):
``git/<sha256(url)[:24]>.git`` bare repositories, ``assets/sha256/<hex>`` verified asset bytes.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rigsmith.errors import AdapterError, CommandError, RigsmithError, SpecError
from rigsmith.importing.proposal import check_asset_url, check_git_url
from rigsmith.project import Project
from rigsmith.resolving.image import archive, engineroute, imagedef
from rigsmith.resolving.image import image as imagemod
from rigsmith.resolving.lock import lock as lockmod

if TYPE_CHECKING:
    import httpx

Echo = Callable[[str], None]

_HEX_RE = re.compile(r"^[0-9a-f]{4,40}$")
_CHUNK = 1 << 20
#: Redirect hops an asset download follows (release pages redirect once or twice to their storage).
MAX_REDIRECTS = 5


def cache_root(env: Mapping[str, str] | None = None) -> Path:
    """``$RIGSMITH_CACHE``, else ``$XDG_CACHE_HOME/rigsmith``, else ``~/.cache/rigsmith``."""
    env = os.environ if env is None else env
    if env.get("RIGSMITH_CACHE"):
        return Path(env["RIGSMITH_CACHE"])
    xdg = env.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "rigsmith"


class AssetHashError(AdapterError):
    """An asset's bytes are not the ones declared or locked."""


class Sources:
    """The git and asset cache. ``client`` is an httpx client (made here when not given)."""

    def __init__(
        self,
        cache: Path,
        client: httpx.Client | None = None,
        timeout: float = 600,
        max_bytes: int = archive.MAX_UNPACKED,
    ) -> None:
        self.cache = cache
        self.timeout = timeout
        self.max_bytes = max_bytes
        self._client = client
        self._own = client is None

    def close(self) -> None:
        """Close the HTTP client made here."""
        if self._own and self._client is not None:
            self._client.close()

    # -- git ------------------------------------------------------------------------------------------------

    def _git(self, *args: str, repo: Path | None = None, hint: str | None = None) -> bytes:
        argv = ["git", *(("--git-dir", str(repo)) if repo else ()), *args]
        env = {**os.environ, "GIT_TERMINAL_PROMPT": "0", "GIT_ASKPASS": "true", "LC_ALL": "C"}
        try:
            proc = subprocess.run(argv, capture_output=True, env=env, timeout=self.timeout, check=False)
        except FileNotFoundError:
            raise AdapterError("git is not installed", hint="install git (scripts/setup.sh)") from None
        except subprocess.TimeoutExpired:
            raise AdapterError(f"git {args[0]} took over {self.timeout:.0f}s", hint=hint) from None
        if proc.returncode != 0:
            raise CommandError(argv, proc.returncode, proc.stderr.decode(errors="replace"), hint=hint)
        return proc.stdout

    def mirror_path(self, url: str) -> Path:
        """The cached bare repository of ``url``."""
        return self.cache / "git" / (hashlib.sha256(url.encode()).hexdigest()[:24] + ".git")

    def fetch(self, url: str, where: str) -> Path:
        """Fetch every branch and tag of ``url`` into its cached bare repository (created on first use)."""
        check_git_url(url)
        path = self.mirror_path(url)
        if not (path / "HEAD").is_file():
            path.parent.mkdir(parents=True, exist_ok=True)
            self._git("init", "--quiet", "--bare", str(path))
        self._git(
            "-c", "protocol.ext.allow=never", "-c", "protocol.fd.allow=never",
            "--git-dir", str(path), "fetch", "--quiet", "--prune", "--force", "--no-tags", "--",
            url, "+refs/heads/*:refs/heads/*", "+refs/tags/*:refs/tags/*",
            hint=f"check {where} (the URL, that the server is up) and re-run; the cache is {path}",
        )  # fmt: skip
        return path

    def _rev(self, path: Path, name: str) -> str | None:
        try:
            out = self._git("rev-parse", "--verify", "--quiet", f"{name}^{{commit}}", repo=path)
        except CommandError:
            return None
        return out.decode().strip() or None

    def _refs(self, path: Path, kind: str) -> list[str]:
        out = self._git("for-each-ref", "--format=%(refname:lstrip=2)", f"refs/{kind}", repo=path)
        return out.decode().split()

    def resolve(self, url: str, ref: str, where: str) -> str:
        """The full commit ``ref`` names in ``url`` (tag, then branch, then an unambiguous commit sha)."""
        path = self.fetch(url, where)
        for name in (f"refs/tags/{ref}", f"refs/heads/{ref}"):
            commit = self._rev(path, name)
            if commit:
                return commit
        if _HEX_RE.match(ref):
            commit = self._rev(path, ref)
            if commit:
                return commit
        branches, tags = self._refs(path, "heads"), self._refs(path, "tags")

        def some(xs: list[str]) -> str:
            return ", ".join(xs[:8]) + (f", … ({len(xs)} in all)" if len(xs) > 8 else "") if xs else "none"

        raise RigsmithError(
            f"{where}: ref {ref!r} is not a branch, tag or commit of {url} (branches: {some(branches)}; "
            f"tags: {some(tags)})",
            hint="write an existing branch, tag or commit sha in tree.ref and re-run `invoke pin`",
        )

    def has_commit(self, url: str, commit: str) -> bool:
        """True when the cached repository holds ``commit`` (no network)."""
        path = self.mirror_path(url)
        return (path / "HEAD").is_file() and self._rev(path, commit) == commit

    def bundle_tree(self, url: str, commit: str, dest: Path, where: str) -> None:
        """Write a git bundle of ``commit`` (with its history) from the cache to ``dest``; no network."""
        if not self.has_commit(url, commit):
            raise AdapterError(
                f"{where}: the source cache {self.mirror_path(url)} lacks the locked commit {commit}",
                hint="run `invoke build` on this machine first (it fills the cache), then bundle again",
            )
        path, ref = self.mirror_path(url), f"refs/rigsmith/{commit}"
        self._git("update-ref", ref, commit, repo=path)
        self._git("bundle", "create", "--quiet", str(dest), ref, repo=path)

    def add_tree(self, url: str, commit: str, bundle: Path) -> bool:
        """Fetch ``commit`` from a git bundle file into the cache (git checks every object's hash on the
        way); True when the cache now holds that very commit. No network."""
        path, ref = self.mirror_path(url), f"refs/rigsmith/{commit}"
        if not (path / "HEAD").is_file():
            path.parent.mkdir(parents=True, exist_ok=True)
            self._git("init", "--quiet", "--bare", str(path))
        try:
            self._git("fetch", "--quiet", "--", str(bundle), ref, repo=path)  # objects only, no ref yet
        except CommandError:
            return False
        if not self.has_commit(url, commit):
            return False
        self._git("update-ref", ref, commit, repo=path)  # keeps the commit reachable in the cache
        return True

    def archive(self, url: str, commit: str, where: str) -> bytes:
        """The commit's files as a tar (``git archive``: no .git), fetching only when the cache lacks it."""
        if not self.has_commit(url, commit):
            path = self.fetch(url, where)
            if self._rev(path, commit) != commit:
                raise AdapterError(
                    f"{where}: the locked commit {commit} is no longer on any branch or tag of {url}",
                    hint="run `invoke pin --repin` to lock a commit the repository still serves",
                )
        return self._git("archive", "--format=tar", commit, repo=self.mirror_path(url))

    # -- assets ---------------------------------------------------------------------------------------------

    def asset_path(self, sha256: str) -> Path:
        """Where verified bytes with this hash are cached; a "hash" that is not one is refused (it would be
        a path: ``cached`` removes a file whose bytes do not match)."""
        hexd = sha256.removeprefix("sha256:")
        if not re.fullmatch(r"[0-9a-f]{64}", hexd):
            raise AdapterError(
                f"asset hash {sha256[:80]!r} is not sha256:<64 hex digits>",
                hint="the lock's sources.*.assets.*.sha256 was edited or mangled; restore rigsmith.lock "
                "from git or run `invoke pin --repin`",
            )
        return self.cache / "assets" / "sha256" / hexd

    def cached(self, sha256: str) -> bytes | None:
        """The cached bytes of ``sha256``, re-verified; None when absent (a corrupt entry is dropped)."""
        path = self.asset_path(sha256)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        if imagemod.sha256(data) != sha256:
            path.unlink(missing_ok=True)
            return None
        return data

    def download(self, name: str, url: str, want: str | None, where: str) -> tuple[str, int]:
        """Download ``url`` into the cache; refuse bytes whose hash is not ``want`` (when given)."""
        import httpx  # 66 ms (-X importtime) a run with every asset in the cache skips

        check_asset_url(url)
        client = self._client
        if client is None:
            client = self._client = httpx.Client(timeout=self.timeout, follow_redirects=False)
        tmp_dir = self.cache / "assets" / "tmp"
        tmp_dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=tmp_dir)
        digest, size = hashlib.sha256(), 0
        deadline = time.monotonic() + self.timeout
        try:
            with os.fdopen(fd, "wb") as out:
                try:
                    with self._follow(client, name, url, where, deadline) as resp:
                        for chunk in resp.iter_bytes(_CHUNK):
                            digest.update(chunk)
                            size += len(chunk)
                            if size > self.max_bytes:
                                raise AdapterError(
                                    f"{where}: asset {name!r}: {url} sent more than {self.max_bytes} bytes; "
                                    "refused",
                                    hint="check that the URL names the asset you meant",
                                )
                            if time.monotonic() > deadline:
                                raise AdapterError(
                                    f"{where}: asset {name!r}: {url} took over {self.timeout:.0f} s in all; "
                                    "stopped",
                                    hint="re-run on a faster link (nothing was kept)",
                                )
                            out.write(chunk)
                except httpx.HTTPError as err:
                    raise AdapterError(
                        f"{where}: asset {name!r}: cannot download {url}: {err}",
                        hint="check the URL and the network, then re-run",
                    ) from None
            got = "sha256:" + digest.hexdigest()
            if want is not None and got != want:
                raise AssetHashError(
                    f"{where}: asset {name!r} from {url} has sha256 {got}, but {want} is declared or locked; "
                    "the bytes were not used",
                    hint="if the release was re-published on purpose, fix tree.assets[].sha256 or run "
                    "`invoke pin --repin`; otherwise do not trust this URL",
                )
            dest = self.asset_path(got)
            dest.parent.mkdir(parents=True, exist_ok=True)
            Path(tmp).replace(dest)
            return got, size
        finally:
            Path(tmp).unlink(missing_ok=True)

    @contextmanager
    def _follow(
        self, client: httpx.Client, name: str, url: str, where: str, deadline: float
    ) -> Iterator[httpx.Response]:
        """GET ``url``, following redirects by hand: every hop's URL is checked (https, or http to
        loopback; no credentials) before a request is made to it, at most :data:`MAX_REDIRECTS` hops."""
        for _hop in range(MAX_REDIRECTS + 1):
            if time.monotonic() > deadline:
                break
            with client.stream("GET", url) as resp:
                location = resp.headers.get("location")
                if resp.is_redirect and location:
                    nxt = str(resp.url.join(location))
                    try:
                        check_asset_url(nxt)
                    except ValueError as err:
                        raise AdapterError(
                            f"{where}: asset {name!r}: {url} redirects to a refused URL ({err})",
                            hint="use the URL the asset really lives at, over https",
                        ) from None
                    url = nxt
                    continue
                if resp.status_code != 200:
                    raise AdapterError(
                        f"{where}: asset {name!r}: GET {url} answered HTTP {resp.status_code}",
                        hint="check the URL in tree.assets and re-run",
                    )
                yield resp
                return
        raise AdapterError(
            f"{where}: asset {name!r}: more than {MAX_REDIRECTS} redirects, or over {self.timeout:.0f} s, "
            f"before {url} answered",
            hint="use the asset's final URL in tree.assets",
        )

    def asset(self, name: str, locked: lockmod.LockedAsset, where: str) -> bytes:
        """The locked asset's bytes: from the cache when there (verified), else downloaded and verified."""
        data = self.cached(locked.sha256)
        if data is None:
            self.download(name, locked.url, locked.sha256, where)
            data = self.cached(locked.sha256)
            assert data is not None
        return data


# -- pin ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PinnedTree:
    """One image's tree after pin: the commit before and now."""

    image: str
    repo: str
    ref: str
    commit: str
    previous: str | None
    assets: Mapping[str, tuple[str | None, str]]  # name → (previous sha256, sha256)


def _images_for(project: Project, deployment: str | None) -> list[str]:
    """What pin locks trees of: a deployment's images (engine.build, else its filled proposed build), or
    every definition but the proposed builds still to fill (``pin_all`` names those)."""
    if deployment is not None:
        return engineroute.images_of(project, project.load(deployment))
    return engineroute.pinnable(project)


def check_filled(project: Project, deployment: str | None = None) -> dict[str, imagedef.ImageDef]:
    """The definitions with a tree that pin resolves; refuses every field still to fill, all at once, before
    anything touches the network."""
    definitions = {n: imagedef.load(project.images, n) for n in _images_for(project, deployment)}
    definitions = {n: d for n, d in definitions.items() if d.tree is not None}
    for name, d in definitions.items():
        unfilled = d.tree.unfilled() if d.tree else []
        if unfilled:
            raise SpecError(
                f"images/{name}/image.yaml",
                [(f, f"{msg}, then re-run `invoke pin`") for f, msg in unfilled],
                what="image definition",
            )
    return definitions


def pin_sources(
    project: Project,
    sources: Sources,
    definitions: Mapping[str, imagedef.ImageDef],
    *,
    repin: bool = False,
    echo: Echo = print,
) -> list[PinnedTree]:
    """Lock the commit and asset hashes of every tree of ``definitions`` (``check_filled``'s answer, so
    every field still to fill was refused first) in ``rigsmith.lock`` ``sources``.

    A locked tree whose repo and ref are unchanged keeps its commit unless ``repin``. Everything resolves
    before the lock is written.
    """
    current = lockmod.read(project.lock_path)
    out: list[PinnedTree] = []
    entries: dict[str, lockmod.LockedSource] = {}
    for name, d in definitions.items():
        tree = d.tree
        assert tree is not None and tree.repo is not None
        where = f"images/{name}/image.yaml tree"
        old = current.sources.get(name)
        same = old is not None and old.repo == tree.repo and old.ref == tree.ref
        if same and not repin and old is not None:
            commit = old.commit
            if not sources.has_commit(tree.repo, commit):
                sources.archive(tree.repo, commit, where)  # fills the cache for an offline build
        else:
            commit = sources.resolve(tree.repo, tree.ref, where)
        if tree.commit and not commit.startswith(tree.commit):
            raise RigsmithError(
                f"images/{name}/image.yaml tree.ref: {tree.ref!r} of {tree.repo} is commit {commit}, but "
                f"tree.commit says {tree.commit} (the commit the recipe names); nothing was locked",
                hint="if the ref moved on purpose, update or remove tree.commit; otherwise point tree.ref at "
                f"{tree.commit}",
            )
        assets: dict[str, tuple[str | None, str]] = {}
        locked_assets: dict[str, lockmod.LockedAsset] = {}
        for i, a in enumerate(tree.assets):
            assert a.url is not None
            prev = old.assets.get(a.name) if old else None
            keep = prev is not None and prev.url == a.url and (a.sha256 in (None, prev.sha256)) and not repin
            if keep and prev is not None and sources.cached(prev.sha256) is not None:
                sha, size = prev.sha256, prev.size
            else:
                want = a.sha256 or (prev.sha256 if keep and prev is not None else None)
                sha, size = sources.download(
                    a.name, a.url, want, f"images/{name}/image.yaml tree.assets[{i}]"
                )
            assets[a.name] = (prev.sha256 if prev else None, sha)
            locked_assets[a.name] = lockmod.LockedAsset(url=a.url, sha256=sha, size=size)
        entries[name] = lockmod.LockedSource(
            repo=tree.repo, ref=tree.ref, commit=commit, assets=locked_assets
        )
        out.append(PinnedTree(name, tree.repo, tree.ref, commit, old.commit if old else None, assets))
    if entries:
        with lockmod.locked(project.lock_path) as lock:
            lock.sources.update(entries)
    for p in out:
        if p.previous is None:
            state = "pinned"
        elif p.previous != p.commit:
            state = "updated"
        else:
            state = "unchanged"
        moved = f"{p.previous} -> {p.commit}" if state == "updated" else p.commit
        echo(f"{state:>9}  images/{p.image} tree {p.repo} @ {p.ref} -> {moved}")
        for asset, (before, now) in sorted(p.assets.items()):
            a_state = "pinned" if before is None else ("unchanged" if before == now else "updated")
            change = f"{before} -> {now}" if a_state == "updated" else now
            echo(f"{a_state:>9}  images/{p.image} asset {asset} -> {change}")
    return out


# -- build --------------------------------------------------------------------------------------------------


def tree_files(
    project: Project, sources: Sources, name: str, definition: imagedef.ImageDef
) -> dict[str, imagemod.ContextFile]:
    """The locked commit's files plus the locked assets (each verified), tree-relative."""
    lock = lockmod.read(project.lock_path)
    entry = imagemod.locked_source(definition, lock, name)
    tree = definition.tree
    assert tree is not None
    where = f"images/{name}/image.yaml tree"
    files = archive.unpack_tar(sources.archive(entry.repo, entry.commit, where), f"{where} @ {entry.commit}")
    assets: dict[str, dict[str, imagemod.ContextFile]] = {}
    for a in tree.assets:
        data = sources.asset(a.name, entry.assets[a.name], f"{where}.assets ({a.name})")
        if a.unpack is not None:
            assets[a.name] = archive.unpack_tar(data, f"asset {a.name!r}", a.unpack)
        else:
            assert a.dest is not None
            assets[a.name] = {a.dest: imagemod.ContextFile(data)}
    return archive.merge_tree(files, assets)
