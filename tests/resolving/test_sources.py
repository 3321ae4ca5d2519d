"""`invoke pin` of source trees for real: git daemon and an asset server on 127.0.0.1, the cache on disk."""

from __future__ import annotations

import hashlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from rigsmith.errors import LockError, RigsmithError, SpecError
from rigsmith.project import Project
from rigsmith.resolving.image import build as buildmod
from rigsmith.resolving.image import sources as sourcesmod
from rigsmith.resolving.image.sources import AssetHashError, Sources
from rigsmith.resolving.lock import lock as lockmod
from tests.support.common import REPO
from tests.support.images import cli_env, invoke_bin
from tests.support.sources import (
    OPS,
    OPS_TAR,
    SCALES,
    AssetServer,
    Upstream,
    asset_server,
    git,
    git_daemon,
    serve_release,
    source_image,
)

BASE = "127.0.0.1:5999/tinybase:1"
DIGEST = "sha256:" + "ab" * 32


@pytest.fixture
def upstream(tmp_path: Path) -> Iterator[Upstream]:
    with git_daemon(tmp_path / "git") as up:
        yield up


@pytest.fixture
def assets() -> Iterator[AssetServer]:
    with asset_server() as srv:
        yield srv


def _project(
    tmp_path: Path, upstream: Upstream, assets: AssetServer, ref: str = "v2.5.1", **kw: object
) -> Project:
    root = tmp_path / "project"
    # The base is pinned in image.yaml: only the tree is under test here.
    source_image(root, BASE, upstream.url, ref, serve_release(assets), digest=DIGEST, **kw)  # type: ignore[arg-type]
    return Project(root)


def _pin(project: Project, cache: Path, *, repin: bool = False) -> list[str]:
    lines: list[str] = []
    src = Sources(cache)
    try:
        sourcesmod.pin_sources(project, src, sourcesmod.check_filled(project), repin=repin, echo=lines.append)
    finally:
        src.close()
    return lines


def _invoke(project: Project, cache: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [invoke_bin(), *args],
        cwd=REPO,
        env=cli_env(project, RIGSMITH_CACHE=str(cache)),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_pin_locks_the_tag_commit_and_every_asset_hash(
    tmp_path: Path, upstream: Upstream, assets: AssetServer
) -> None:
    project = _project(tmp_path, upstream, assets)
    proc = _invoke(project, tmp_path / "cache", "pin")
    assert proc.returncode == 0, proc.stderr
    entry = lockmod.read(project.lock_path).sources["merlin"]
    commit = git("rev-parse", "v2.5.1^{commit}", cwd=upstream.work)
    assert (entry.repo, entry.ref, entry.commit) == (upstream.url, "v2.5.1", commit)
    assert entry.assets["compiled-ops"].sha256 == "sha256:" + hashlib.sha256(OPS_TAR).hexdigest()
    assert entry.assets["compiled-ops"].size == len(OPS_TAR)
    assert f"pinned  images/merlin tree {upstream.url} @ v2.5.1 -> {commit}" in proc.stdout
    assert "pinned  images/merlin asset compiled-ops -> sha256:" in proc.stdout


def test_a_short_sha_is_locked_as_the_full_commit(
    tmp_path: Path, upstream: Upstream, assets: AssetServer
) -> None:
    commit = git("rev-parse", "HEAD", cwd=upstream.work)
    project = _project(tmp_path, upstream, assets, ref=commit[:7])
    _pin(project, tmp_path / "cache")
    assert lockmod.read(project.lock_path).sources["merlin"].commit == commit


def test_a_moved_branch_changes_nothing_until_repin_which_shows_both_commits(
    tmp_path: Path, upstream: Upstream, assets: AssetServer
) -> None:
    project = _project(tmp_path, upstream, assets, ref="main")
    cache = tmp_path / "cache"
    _pin(project, cache)
    old = lockmod.read(project.lock_path).sources["merlin"].commit
    new = upstream.commit({"README.md": "moved\n"}, "upstream moves main")
    assert new != old
    again = _pin(project, cache)
    assert lockmod.read(project.lock_path).sources["merlin"].commit == old
    assert any(line.startswith("unchanged  images/merlin tree") for line in again)
    repinned = _pin(project, cache, repin=True)
    assert lockmod.read(project.lock_path).sources["merlin"].commit == new
    assert f"  updated  images/merlin tree {upstream.url} @ main -> {old} -> {new}" in repinned


def test_an_unknown_ref_is_one_paragraph_naming_the_refs_there_are(
    tmp_path: Path, upstream: Upstream, assets: AssetServer
) -> None:
    project = _project(tmp_path, upstream, assets, ref="v9.9.9")
    proc = _invoke(project, tmp_path / "cache", "pin")
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert "ref 'v9.9.9' is not a branch, tag or commit of " + upstream.url in proc.stderr
    assert "branches: main; tags: v2.5.1" in proc.stderr
    assert "write an existing branch, tag or commit sha in tree.ref" in proc.stderr
    assert "sources" not in lockmod.read(project.lock_path).model_dump(exclude_defaults=True)


def test_wrong_asset_bytes_are_refused_naming_the_asset_and_both_hashes(
    tmp_path: Path, upstream: Upstream, assets: AssetServer
) -> None:
    declared = "sha256:" + "0" * 64
    project = _project(tmp_path, upstream, assets)
    data = (project.images / "merlin" / "image.yaml").read_text()
    data = data.replace("  - name: compiled-ops\n", f"  - name: compiled-ops\n    sha256: '{declared}'\n")
    (project.images / "merlin" / "image.yaml").write_text(data)
    with pytest.raises(AssetHashError) as err:
        _pin(project, tmp_path / "cache")
    served = "sha256:" + hashlib.sha256(OPS_TAR).hexdigest()
    msg = str(err.value)
    assert "asset 'compiled-ops'" in msg and served in msg and declared in msg
    assert not list((tmp_path / "cache" / "assets" / "sha256").glob(served.removeprefix("sha256:")))


def test_a_republished_asset_is_refused_at_build_after_pin(
    tmp_path: Path, upstream: Upstream, assets: AssetServer
) -> None:
    """The lock's hash is checked again when the cache is gone and the URL now serves other bytes."""
    project = _project(tmp_path, upstream, assets)
    _pin(project, tmp_path / "cache")
    locked = lockmod.read(project.lock_path).sources["merlin"].assets["compiled-ops"].sha256
    assets.files["/releases/v2.2.0/ops.tar.gz"] = b"tampered"
    src = Sources(tmp_path / "fresh-cache")
    try:
        with pytest.raises(AssetHashError) as err:
            buildmod.prepare(project, "merlin", src)
    finally:
        src.close()
    assert locked in str(err.value) and "sha256:" + hashlib.sha256(b"tampered").hexdigest() in str(err.value)


def test_offline_after_pin_the_cached_verified_tree_and_assets_render(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    with git_daemon(tmp_path / "git") as upstream, asset_server() as assets:
        project = _project(tmp_path, upstream, assets)
        _pin(project, cache)
    # Both servers are gone now.
    src = Sources(cache)
    try:
        _, ctx = buildmod.prepare(project, "merlin", src)
    finally:
        src.close()
    entry = lockmod.read(project.lock_path).sources["merlin"]
    assert f"tree/{SCALES}" in ctx.files and f"tree/{OPS}" in ctx.files
    assert ctx.files["tree/scripts/serve-v2.5.sh"].mode == 0o755
    assert ctx.files["tree/latest"].link == "scales"
    assert not [p for p in ctx.files if p.startswith("tree/.git")]
    assert ctx.labels["io.rigsmith.tree.commit"] == entry.commit
    assert (
        'COPY ["tree/", "/opt/merlin/"]\nENV PYTHONPATH="/opt/merlin/vllm-v2.5"\nWORKDIR /opt/merlin\n'
    ) in ctx.dockerfile


def test_pin_refuses_fields_still_to_fill_all_at_once(
    tmp_path: Path, upstream: Upstream, assets: AssetServer
) -> None:
    root = tmp_path / "project"
    source_image(root, BASE, None, "v2.5.1", {"source-bundle": None, "compiled-ops": None})
    with pytest.raises(SpecError) as err:
        _pin(Project(root), tmp_path / "cache")
    fields = [p for p, _ in err.value.problems]
    assert fields == ["tree.repo", "tree.assets[0].url", "tree.assets[1].url"]
    assert "asset 'compiled-ops' has no URL" in str(err.value)


def test_build_refuses_an_unlocked_tree_before_any_download(
    tmp_path: Path, upstream: Upstream, assets: AssetServer
) -> None:
    project = _project(tmp_path, upstream, assets)
    with pytest.raises(LockError) as err:
        buildmod.prepare(project, "merlin", Sources(tmp_path / "cache"))
    assert "is not locked" in str(err.value) and "invoke pin" in str(err.value)
    assert assets.hits == []


def test_a_changed_ref_in_image_yaml_is_stale_until_pin(
    tmp_path: Path, upstream: Upstream, assets: AssetServer
) -> None:
    project = _project(tmp_path, upstream, assets)
    _pin(project, tmp_path / "cache")
    path = project.images / "merlin" / "image.yaml"
    path.write_text(path.read_text().replace("ref: v2.5.1", "ref: main"))
    with pytest.raises(RigsmithError, match=r"tree.ref is 'main' in image.yaml but 'v2.5.1' in the lock"):
        buildmod.prepare(project, "merlin", Sources(tmp_path / "cache"))


def test_an_asset_larger_than_the_limit_is_refused_and_not_cached(
    tmp_path: Path, upstream: Upstream, assets: AssetServer
) -> None:
    project = _project(tmp_path, upstream, assets)
    src = Sources(tmp_path / "cache", max_bytes=64)
    try:
        with pytest.raises(
            RigsmithError, match=r"asset 'source-bundle': .* sent more than 64 bytes; refused"
        ):
            sourcesmod.pin_sources(project, src, sourcesmod.check_filled(project), echo=lambda _: None)
    finally:
        src.close()
    assert list((tmp_path / "cache" / "assets" / "sha256").glob("*")) == []
    assert not project.lock_path.exists()


@pytest.mark.parametrize(
    "location",
    ["http://example.invalid/ops.tar.gz", "http://user:secret@127.0.0.1/ops.tar.gz", "file:///etc/hostname"],
    ids=["plain-http-elsewhere", "credentials", "file-scheme"],
)
def test_a_redirect_to_a_refused_url_is_never_requested(
    assets: AssetServer, tmp_path: Path, location: str
) -> None:
    """Each hop is checked before the request (issue 23): the refused URL is named, nothing is cached."""
    assets.redirects["/moved"] = location
    src = Sources(tmp_path / "cache")
    try:
        with pytest.raises(RigsmithError, match="redirects to a refused URL") as err:
            src.download("ops", assets.url + "/moved", None, "images/x/image.yaml tree")
    finally:
        src.close()
    assert "asset 'ops'" in str(err.value)
    assert assets.hits == ["/moved"]
    assert list((tmp_path / "cache" / "assets").rglob("sha256/*")) == []


def test_redirects_inside_the_allowed_urls_are_followed_hop_by_hop(
    assets: AssetServer, tmp_path: Path
) -> None:
    assets.files["/final"] = b"bytes"
    assets.redirects["/a"] = "/b"
    assets.redirects["/b"] = assets.url + "/final"
    src = Sources(tmp_path / "cache")
    try:
        got, size = src.download("ops", assets.url + "/a", None, "here")
    finally:
        src.close()
    assert (got, size) == ("sha256:" + hashlib.sha256(b"bytes").hexdigest(), 5)
    assert assets.hits == ["/a", "/b", "/final"]


def test_a_redirect_loop_stops_after_a_bounded_number_of_hops(assets: AssetServer, tmp_path: Path) -> None:
    assets.redirects["/loop"] = "/loop"
    src = Sources(tmp_path / "cache")
    try:
        with pytest.raises(RigsmithError, match="more than 5 redirects"):
            src.download("ops", assets.url + "/loop", None, "here")
    finally:
        src.close()
    assert len(assets.hits) == 6
