"""A crafted bundle places nothing outside what unbundle may place (issue 23).

The regression: a manifest member ``artifacts//ABS/PATH/profile.d/evil.sh`` joined to the checkout was
``/ABS/PATH/...`` — written, executable, without ``--yes``. Now every member is sorted into an allow-listed
kind before anything is placed; the rest of the bundle is refused in one paragraph naming the member.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
import tarfile
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rigsmith.errors import RigsmithError
from rigsmith.operating.bundle import unbundle as unbundlemod
from rigsmith.operating.bundle.manifest import MANIFEST, Io
from tests.support import audit
from tests.support.bundle import NAME, Source, invoke, offline_project
from tests.support.podman import Podman


def carried(source: Source, dest: Path) -> Path:
    shutil.copytree(source.bundle, dest, ignore=shutil.ignore_patterns(".rigsmith"))
    return dest


def add_member(bundle: Path, member: str, data: bytes) -> None:
    """List ``member`` in the manifest with its true size and hash, and put its bytes where a naive join
    of the name would find them."""
    manifest = json.loads((bundle / MANIFEST).read_text())
    manifest["members"][member] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (bundle / MANIFEST).write_text(json.dumps(manifest))
    where = Path(os.path.normpath(f"{bundle}/{member}"))
    if where.is_relative_to(bundle):
        where.parent.mkdir(parents=True, exist_ok=True)
        where.write_bytes(data)


def as_tar(bundle: Path, tar: Path) -> Path:
    """The bundle as one tar, members named exactly as the manifest names them."""
    manifest = json.loads((bundle / MANIFEST).read_text())
    with tarfile.open(tar, "w") as tf:
        tf.add(bundle / MANIFEST, arcname=MANIFEST)
        for member in manifest["members"]:
            data = Path(os.path.normpath(f"{bundle}/{member}")).read_bytes()
            info = tarfile.TarInfo(member)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return tar


EVIL = b"#!/bin/sh\necho owned > /tmp/owned\n"


@pytest.mark.parametrize("yes", [False, True], ids=["no-consent", "with-yes"])
@pytest.mark.parametrize("form", ["dir", "tar"])
def test_an_absolute_artifact_member_writes_nothing_outside(
    source: Source, offline_podman: Podman, tmp_path: Path, form: str, yes: bool
) -> None:
    outside = tmp_path / "etc" / "profile.d" / "evil.sh"
    bundle = carried(source, tmp_path / "carried")
    member = f"artifacts/{outside}"  # artifacts//tmp/.../etc/profile.d/evil.sh
    add_member(bundle, member, EVIL)
    path = as_tar(bundle, tmp_path / "b.tar") if form == "tar" else bundle
    project = offline_project(tmp_path)

    proc = invoke(project, offline_podman, "unbundle", str(path), *(["--yes"] if yes else []))

    assert proc.returncode == 1, proc.stdout
    assert "Traceback" not in proc.stderr
    assert member in proc.stderr and "nothing was" in proc.stderr, proc.stderr
    assert not (tmp_path / "etc").exists()
    assert list((project.root / "deployments").iterdir()) == []
    assert not project.lock_path.exists()


@pytest.mark.parametrize(
    "member",
    ["artifacts/tasks/evil.py", "artifacts/conftest.py", "images/other/image.yaml", "deployments/other.yaml",
     "artifacts/podman/airgap/../../tasks/x.py", "model/../tasks/x.py", "secondary/acme/evil/x.json",
     "sources/airgap/0123.bundle", ".rigsmith/state.json"],
)  # fmt: skip
def test_a_member_of_no_known_kind_is_refused_before_anything_is_placed(
    source: Source, offline_podman: Podman, tmp_path: Path, member: str
) -> None:
    bundle = carried(source, tmp_path / "carried")
    add_member(bundle, member, EVIL)
    project = offline_project(tmp_path)
    proc = invoke(project, offline_podman, "unbundle", str(bundle), "--yes")
    assert proc.returncode == 1, proc.stdout
    assert "Traceback" not in proc.stderr and member in proc.stderr, proc.stderr
    assert sorted(p.name for p in project.root.iterdir()) == ["deployments"]
    assert list((project.root / "deployments").iterdir()) == []


def test_a_member_that_is_a_symlink_is_not_read_through(
    source: Source, offline_podman: Podman, tmp_path: Path
) -> None:
    """Same bytes, same hash — but a link: unbundle reads only regular files inside the bundle."""
    bundle = carried(source, tmp_path / "carried")
    spec = bundle / "deployments" / f"{NAME}.yaml"
    outside = tmp_path / "elsewhere.yaml"
    shutil.move(spec, outside)
    spec.symlink_to(outside)
    proc = invoke(offline_project(tmp_path), offline_podman, "unbundle", str(bundle))
    assert proc.returncode == 1 and "symlink" in proc.stderr and "airgap.yaml" in proc.stderr, proc.stderr


def test_a_fifo_member_is_refused_without_blocking(
    source: Source, offline_podman: Podman, tmp_path: Path
) -> None:
    bundle = carried(source, tmp_path / "carried")
    lock = bundle / "rigsmith.lock"
    lock.unlink()
    os.mkfifo(lock)
    proc = invoke(offline_project(tmp_path), offline_podman, "unbundle", str(bundle))
    assert proc.returncode == 1 and "not a regular file" in proc.stderr, proc.stderr


# -- the property: hostile names, recorded writes ---------------------------------------------------------

PIECES = [
    "/", "//", "\\", ".", "..", "\0", "\x01", "\n", "\x7f", "a", "x.sh", "artifacts/", "model/", "images/",
    "podman/", "\u2024", "\u2025", "\uff0f", "\uff0e", "\u2215", "e\u0301", "\u202e", "~", "$HOME", " ",
]  # fmt: skip
NAMES = st.one_of(
    st.lists(st.sampled_from(PIECES), min_size=1, max_size=10).map("".join),
    st.integers(min_value=250, max_value=5000).map(lambda n: "artifacts/" + "a" * n),
)


@pytest.fixture
def hostile_bundle(source: Source, tmp_path: Path) -> Path:
    return carried(source, tmp_path / "carried")


def _never(argv: object) -> object:
    raise AssertionError(f"a refused bundle reached the engine: {argv}")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=NAMES, planted=st.booleans())
def test_no_hostile_member_name_writes_outside_the_project(
    hostile_bundle: Path, tmp_path: Path, name: str, planted: bool
) -> None:
    """Any member name from a hostile alphabet, with or without a symlink planted in the checkout: unbundle
    refuses in one paragraph, and every write it made (recorded through audit hooks) is in the project."""
    pristine = (hostile_bundle / MANIFEST).read_text()
    project_root = tmp_path / "offline-project"
    shutil.rmtree(project_root, ignore_errors=True)
    project = offline_project(tmp_path)
    if planted:
        (project.root / "podman").symlink_to(tmp_path / "outside", target_is_directory=True)
    with contextlib.suppress(ValueError, OSError):  # a name the OS cannot hold: the manifest still lists it
        add_member(hostile_bundle, name, EVIL)
    io_ = Io(echo=lambda _m: None, progress=False, run=_never, disk_free=lambda _p: 1 << 50)  # type: ignore[arg-type]
    try:
        with audit.recording() as rec, pytest.raises(RigsmithError) as err:
            unbundlemod.unbundle(project, hostile_bundle, into=tmp_path / "model", io=io_)
    finally:
        (hostile_bundle / MANIFEST).write_text(pristine)
    assert "Traceback" not in str(err.value)
    assert not (tmp_path / "outside").exists()
    assert [w for w in rec.writes_outside(project.root) if not _scratch(w[1])] == []


def _scratch(path: str) -> bool:
    """The render's scratch checkout (``$TMPDIR/rigsmith-unbundle-*``) and Jinja's compiled templates."""
    tmp = os.path.realpath(tempfile.gettempdir())
    rel = path.removeprefix(tmp + "/")
    return rel != path and (rel.startswith("rigsmith-unbundle-") or rel.startswith("_jinja2-cache-"))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(names=st.lists(NAMES, min_size=1, max_size=3))
def test_no_hostile_tar_member_is_unpacked_outside_the_work_dir(tmp_path: Path, names: list[str]) -> None:
    """A bundle tar with hostile member names: refused before the first byte, or unpacked under unbundle's
    work dir only (recorded writes)."""
    tar = tmp_path / "b.tar"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for n in names:
            info = tarfile.TarInfo(n)
            info.size = len(EVIL)
            tf.addfile(info, io.BytesIO(EVIL))
    tar.write_bytes(buf.getvalue())
    root = tmp_path / "proj"
    shutil.rmtree(root, ignore_errors=True)
    project = offline_project(root)
    work = project.root / ".rigsmith"
    with audit.recording() as rec:
        try:
            unbundlemod.unpacked(
                project, tar, Io(echo=lambda _m: None, progress=False, disk_free=lambda _p: 1 << 50)
            )
        except RigsmithError as err:
            assert "\n  hint" in str(err) or "\n" not in str(err)
    assert rec.writes_outside(work) == []


def test_a_model_dir_holding_someone_elses_files_is_not_filled_without_consent(
    source: Source, offline_podman: Podman, tmp_path: Path
) -> None:
    """The bundle's spec (or --into) names the model dir; as fetch-model does, unbundle never replaces files
    in a directory that is not this model's without --yes."""
    into = tmp_path / "www"
    into.mkdir()
    (into / "index.html").write_text("mine")
    (into / "config.json").write_text("my own config")
    bundle = carried(source, tmp_path / "carried")
    project = offline_project(tmp_path)
    proc = invoke(project, offline_podman, "unbundle", str(bundle), "--into", str(into))
    assert proc.returncode == 1, proc.stdout
    msg = proc.stderr
    assert "is not empty" in msg and "--into DIR" in msg and "--yes" in msg, msg
    assert (into / "config.json").read_text() == "my own config"
    assert sorted(p.name for p in into.iterdir()) == ["config.json", "index.html"]
    assert list((project.root / "deployments").iterdir()) == []


# -- the kinds issue 29 added: secondary models, source trees, assets (red team, rt2) ---------------------

#: Lock values a crafted bundle could carry for a source-built image: each would be a file name in the
#: asset cache, a bundle member's name or a git refspec if it were read as given.
HOSTILE_SOURCES = {
    "asset-path": {"commit": "c" * 40, "sha256": "sha256:../../../../victim"},
    "asset-bare-path": {"commit": "c" * 40, "sha256": "../../../../victim"},
    "commit-refspec": {"commit": "x:refs/heads/evil", "sha256": "sha256:" + "b" * 64},
    "commit-option": {"commit": "--upload-pack=touch /tmp/x", "sha256": "sha256:" + "b" * 64},
    "commit-short": {"commit": "c" * 7, "sha256": "sha256:" + "b" * 64},
}


def _with_sources(bundle: Path, commit: str, sha256: str) -> None:
    """The bundle's lock with a source tree entry for image ``x`` (manifest re-hashed to match)."""
    lock = json.loads((bundle / "rigsmith.lock").read_text())
    lock["sources"] = {
        "x": {"repo": "https://git.example/x", "ref": "v1", "commit": commit,
              "assets": {"ops": {"url": "https://example.com/ops", "sha256": sha256, "size": 3}}},
    }  # fmt: skip
    data = json.dumps(lock).encode()
    (bundle / "rigsmith.lock").write_bytes(data)
    manifest = json.loads((bundle / MANIFEST).read_text())
    digest = hashlib.sha256(data).hexdigest()
    manifest["members"]["rigsmith.lock"] = {"size": len(data), "sha256": digest}
    manifest["lock_sha256"] = digest
    (bundle / MANIFEST).write_text(json.dumps(manifest))


@pytest.mark.parametrize("case", sorted(HOSTILE_SOURCES))
def test_a_lock_source_entry_that_is_a_path_or_refspec_is_refused_before_anything(
    source: Source, tmp_path: Path, case: str
) -> None:
    """An asset "hash" ``sha256:../../victim`` once reached ``Sources.cached``, which reads that path and
    removes it when its bytes do not hash to the "hash"; a commit ``x:refs/heads/evil`` became a refspec."""
    bundle = carried(source, tmp_path / "carried")
    _with_sources(bundle, **HOSTILE_SOURCES[case])
    victim = tmp_path / "victim"
    victim.write_text("keep me\n")
    project = offline_project(tmp_path)
    io_ = Io(echo=lambda _m: None, progress=False, run=_never, disk_free=lambda _p: 1 << 50)  # type: ignore[arg-type]
    with audit.recording() as rec, pytest.raises(RigsmithError) as err:
        unbundlemod.unbundle(project, bundle, into=tmp_path / "model", io=io_)
    field = "sources.x.assets.ops.sha256" if case.startswith("asset") else "sources.x.commit"
    assert field in err.value.message and "nothing was placed" in err.value.message, err.value.message
    assert victim.read_text() == "keep me\n"
    assert [w for w in rec.writes_outside(project.root) if not _scratch(w[1])] == []
    assert list(project.deployments.iterdir()) == []


@pytest.mark.parametrize("bad", ["sha256:../../victim", "../victim", "sha256:" + "B" * 64, ""])
def test_the_asset_cache_refuses_a_hash_that_is_a_path_and_removes_nothing(tmp_path: Path, bad: str) -> None:
    from rigsmith.resolving.image.sources import Sources

    (tmp_path / "cache").mkdir()
    victim = tmp_path / "victim"
    victim.write_text("keep me\n")
    with audit.recording() as rec, pytest.raises(RigsmithError) as err:
        Sources(tmp_path / "cache").cached(bad)
    assert "sha256:<64 hex digits>" in err.value.message and err.value.hint
    assert victim.exists() and rec.writes == []


@pytest.mark.parametrize("build", ["../../../outside", "x/../../y", "/abs", "Merlin:1", "a b", ".hidden"])
def test_a_bundled_spec_whose_engine_build_is_a_path_is_refused_before_anything(
    source: Source, tmp_path: Path, build: str
) -> None:
    """engine.build names images/BUILD/ and the sources/BUILD/ members: only an image definition's name."""
    import yaml

    bundle = carried(source, tmp_path / "carried")
    member = f"deployments/{NAME}.yaml"
    data = yaml.safe_load((bundle / member).read_text())
    data["engine"].pop("image", None)
    data["engine"]["build"] = build
    add_member(bundle, member, yaml.safe_dump(data, sort_keys=False).encode())
    project = offline_project(tmp_path)
    io_ = Io(echo=lambda _m: None, progress=False, run=_never, disk_free=lambda _p: 1 << 50)  # type: ignore[arg-type]
    with audit.recording() as rec, pytest.raises(RigsmithError) as err:
        unbundlemod.unbundle(project, bundle, into=tmp_path / "model", io=io_)
    assert "engine.build" in err.value.message and "image definition" in err.value.message, err.value.message
    assert [w for w in rec.writes_outside(project.root) if not _scratch(w[1])] == []
    assert list(project.deployments.iterdir()) == []


def test_a_tree_bundle_with_extra_refs_adds_only_the_locked_commit_s_ref_to_the_cache(tmp_path: Path) -> None:
    """A crafted ``sources/BUILD/COMMIT.bundle`` carrying branches, tags and a HEAD of its own: the cache
    gains the locked commit under rigsmith's one ref and nothing else (no branch, tag, hook or config)."""
    from rigsmith.resolving.image.sources import Sources
    from tests.support.sources import git

    work = tmp_path / "work"
    work.mkdir()
    git("init", "-q", "-b", "main", cwd=work)
    (work / "a").write_text("locked\n")
    git("add", "-A", cwd=work)
    git("commit", "-q", "-m", "locked", cwd=work)
    locked = git("rev-parse", "HEAD", cwd=work)
    (work / "a").write_text("evil\n")
    git("commit", "-q", "-am", "evil", cwd=work)
    git("update-ref", f"refs/rigsmith/{locked}", locked, cwd=work)
    git("tag", "v9", cwd=work)
    git("update-ref", "refs/remotes/origin/evil", "HEAD", cwd=work)
    bundle = tmp_path / "tree.bundle"
    git("bundle", "create", "-q", str(bundle), "--all", cwd=work)
    cache = Sources(tmp_path / "cache")
    url = "https://git.example/x"

    with audit.recording() as rec:
        assert cache.add_tree(url, locked, bundle)
    assert cache.has_commit(url, locked)
    mirror = cache.mirror_path(url)
    refs = git("--git-dir", str(mirror), "for-each-ref", "--format=%(refname)", cwd=tmp_path).split()
    assert refs == [f"refs/rigsmith/{locked}"]
    assert [h.name for h in (mirror / "hooks").iterdir() if not h.name.endswith(".sample")] == []
    assert rec.writes_outside(tmp_path / "cache") == []


@pytest.mark.parametrize(
    "name",
    [
        "secondary/acme/draft/config.json",
        f"sources/merlin/{'c' * 40}.bundle",
        f"sources/merlin/assets/{'b' * 64}",
    ],
)
@pytest.mark.parametrize("kind", [tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.FIFOTYPE, tarfile.CHRTYPE])
def test_a_tar_member_of_the_new_kinds_that_is_not_a_regular_file_unpacks_nothing(
    tmp_path: Path, name: str, kind: bytes
) -> None:
    tar = tmp_path / "b.tar"
    with tarfile.open(tar, "w") as tf:
        info = tarfile.TarInfo(name)
        info.type, info.linkname = kind, "/etc/passwd"
        tf.addfile(info)
    project = offline_project(tmp_path)
    with audit.recording() as rec, pytest.raises(RigsmithError) as err:
        unbundlemod.unpacked(
            project, tar, Io(echo=lambda _m: None, progress=False, disk_free=lambda _p: 1 << 50)
        )
    assert name in err.value.message and "not a regular file" in err.value.message
    assert rec.writes == []


@pytest.mark.parametrize("name", ["../../x", "x\x1b[2J\ry", "/abs", "", "other"])
def test_a_manifest_naming_a_deployment_it_does_not_carry_is_refused_and_shown_escaped(
    source: Source, tmp_path: Path, name: str
) -> None:
    bundle = carried(source, tmp_path / "carried")
    manifest = json.loads((bundle / MANIFEST).read_text())
    manifest["deployment"] = name
    (bundle / MANIFEST).write_text(json.dumps(manifest))
    project = offline_project(tmp_path)
    io_ = Io(echo=lambda _m: None, progress=False, run=_never, disk_free=lambda _p: 1 << 50)  # type: ignore[arg-type]
    with audit.recording() as rec, pytest.raises(RigsmithError) as err:
        unbundlemod.unbundle(project, bundle, into=tmp_path / "model", io=io_)
    assert not any(c in str(err.value) for c in "\x1b\r"), str(err.value)
    assert [w for w in rec.writes_outside(project.root) if not _scratch(w[1])] == []
    assert list(project.deployments.iterdir()) == []
