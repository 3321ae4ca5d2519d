"""bundle / unbundle for real: Hub stand-in, local registry, podman storage, kill -9, a small tmpfs.

The connected side (tests/bundle/conftest.py `source`) pins, fetches and bundles once with the Hub
stand-in and the registry running; both are stopped before any test here runs the offline side.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from rigsmith.operating.bundle.manifest import IMAGE_MEMBER, MANIFEST, Manifest
from rigsmith.operating.doctor import doctor
from rigsmith.operating.host import LocalHost
from rigsmith.project import Project
from rigsmith.resolving.lock import lock as lockmod
from rigsmith.resolving.model.modelfiles import STATE_DIR
from rigsmith.spec import load
from tests.support.bundle import (
    BIG,
    NAME,
    REPO,
    Source,
    built_project,
    cli_env,
    invoke,
    must,
    offline_project,
)
from tests.support.common import HOST_MEMLOCK
from tests.support.ops import OPS_IMAGE
from tests.support.podman import Podman
from tests.support.standin import Standin, StandinConfig

SHARD = "model-00001-of-00002.safetensors"


def manifest(bundle: Path) -> Manifest:
    return Manifest.model_validate_json((bundle / MANIFEST).read_bytes())


def copy_bundle(src: Path, dest: Path) -> Path:
    """A real copy (no hard links shared with the source), as a USB disk would carry it."""
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns(".rigsmith"))
    return dest


def flip_byte(path: Path, offset: int) -> None:
    with path.open("r+b") as fh:
        fh.seek(offset)
        b = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([b[0] ^ 0xFF]))


def images(podman: Podman) -> list[str]:
    return podman.run("images", "--quiet").stdout.split()


# -- the connected side -----------------------------------------------------------------------------------


def test_bundle_hard_links_the_model_and_keeps_the_registry_digest(source: Source) -> None:
    m = manifest(source.bundle)
    lock_bytes = source.project.lock_path.read_bytes()
    assert m.lock_sha256 == hashlib.sha256(lock_bytes).hexdigest()
    assert (source.bundle / "rigsmith.lock").read_bytes() == lock_bytes
    # Model members are the fetched files themselves (same inode), never a copy; the patched config.json
    # travels as the Hub's bytes (the kept original), and unbundle patches it again.
    for path, data in source.files.items():
        member = source.bundle / "model" / path
        disk = source.model_dir / (f"{STATE_DIR}/original/{path}" if path == "config.json" else path)
        assert member.samefile(disk), path
        assert member.read_bytes() == data
        assert m.members[f"model/{path}"].sha256 == hashlib.sha256(data).hexdigest()
    # Every member is listed with its real size and hash.
    for member, e in m.members.items():
        p = source.bundle / member
        assert p.stat().st_size == e.size, member
        assert hashlib.sha256(p.read_bytes()).hexdigest() == e.sha256, member
    assert {"artifacts/podman/airgap/run.sh", f"deployments/{NAME}.yaml"} <= set(m.members)
    assert any(k.startswith("artifacts/quadlet/") for k in m.members)
    # The archive's manifest is the registry's: same digest the lock pins.
    assert m.image is not None and m.image.digest == source.digest
    index = subprocess.run(
        ["tar", "-xOf", str(source.bundle / IMAGE_MEMBER), "index.json"], capture_output=True, check=True
    ).stdout
    assert json.loads(index)["manifests"][0]["digest"] == source.digest
    assert f"lock sha256 {m.lock_sha256}" in source.bundle_stdout


def test_rerunning_bundle_on_an_unchanged_deployment_does_nothing(source: Source, podman: Podman) -> None:
    before = {p: p.stat().st_mtime_ns for p in source.bundle.rglob("*") if p.is_file()}
    out = must(
        invoke(source.project, podman, "bundle", "--out", str(source.bundle), "--targets", "podman,quadlet")
    )
    assert "up to date, nothing to do" in out, out
    after = {p: p.stat().st_mtime_ns for p in source.bundle.rglob("*") if p.is_file()}
    assert after == before


# -- the offline side -------------------------------------------------------------------------------------


def test_round_trip_offline_then_fetch_model_makes_no_request_and_up_wait_down_run(
    source: Source, offline_podman: Podman, fake_cdi: Path, tmp_path: Path
) -> None:
    # The offline machine has neither the model nor the image; Hub stand-in and registry are stopped.
    away = source.model_dir.with_name(source.model_dir.name + ".connected")
    source.model_dir.rename(away)
    project = offline_project(tmp_path)
    try:
        assert images(offline_podman) == []
        proc = invoke(project, offline_podman, "unbundle", str(source.bundle))
        out = must(proc)
        assert f"image {source.pinned} loaded" in out, out
        assert f"lock sha256 {manifest(source.bundle).lock_sha256}" in out
        assert "hard-linked" in out
        info = offline_podman.inspect(source.pinned)
        assert info["Digest"] == source.digest
        # The model is where the spec wants it, patched like fetch-model patches, verified in its cache.
        for path, data in source.files.items():
            if path != "config.json":
                assert (source.model_dir / path).read_bytes() == data
        patched = json.loads((source.model_dir / "config.json").read_text())
        assert patched["text_config"]["ple_embedding_dtype"] == "float16"
        assert (project.root / f"deployments/{NAME}.yaml").is_file()
        assert lockmod.read(project.lock_path).images[source.image_ref].digest == source.digest
        assert (project.root / "podman" / NAME / "run.sh").is_file()

        # fetch-model afterwards: HF_ENDPOINT is a closed port, so any request would fail the command.
        fetch = must(invoke(project, offline_podman, "fetch-model"))
        assert (
            "0 downloaded" in fetch
            and "0 hashed" in fetch
            and f"{len(source.files)} verified earlier" in fetch
        )

        # doctor's drift rows, with full hashes: the model dir and the image are what the lock pins.
        _name, checks = doctor.diagnose(
            project, NAME, target="podman", host=LocalHost(offline_podman.env), verify=True
        )
        rows = {ch.name: ch for ch in checks}
        assert rows["image"].verdict == "go" and source.pinned in rows["image"].detail, rows["image"]
        assert rows["model files"].verdict == "go", rows["model files"]
        assert "full hashes" in rows["model files"].detail

        # up / wait / down as the user runs them, with the stand-in engine, from the offline storage only.
        port = load(project.spec_path(NAME)).network.port
        try:
            # This machine cannot raise memlock (ENVIRONMENT.md): the bundled run.sh asks for unlimited, so
            # the override re-renders it, with consent.
            up = must(invoke(project, offline_podman, "up", "--memlock", HOST_MEMLOCK, "--yes"))
            assert "verified airgap: running" in up, up
            assert offline_podman.inspect(NAME)["ImageDigest"] == source.digest  # type: ignore[index]
            with Standin(StandinConfig(model_names=("flash-next-v2",)), port=port):
                waited = must(invoke(project, offline_podman, "wait", "--timeout", "60"))
            assert "924,993 ok" in waited, waited
        finally:
            must(invoke(project, offline_podman, "down"))
        assert offline_podman.run("ps", "-aq").stdout.strip() == ""
    finally:
        shutil.rmtree(source.model_dir, ignore_errors=True)
        away.rename(source.model_dir)


@pytest.mark.parametrize(
    ("member", "offset"),
    [(f"model/{SHARD}", 1234), (IMAGE_MEMBER, -5000), ("rigsmith.lock", 40)],
    ids=["model-file", "image-archive", "lock"],
)
def test_a_tampered_bundle_is_refused_naming_the_member_before_anything_is_placed(
    source: Source, offline_podman: Podman, tmp_path: Path, member: str, offset: int
) -> None:
    bundle = copy_bundle(source.bundle, tmp_path / "carried")
    target = bundle / member
    before = hashlib.sha256(target.read_bytes()).hexdigest()
    flip_byte(target, offset if offset >= 0 else target.stat().st_size + offset)
    after = hashlib.sha256(target.read_bytes()).hexdigest()
    project = offline_project(tmp_path)
    into = tmp_path / "model-here"

    proc = invoke(project, offline_podman, "unbundle", str(bundle), "--into", str(into))

    assert proc.returncode == 1, proc.stdout
    msg = proc.stderr
    assert "Traceback" not in msg
    assert member in msg and before in msg and after in msg, msg
    assert not into.exists(), "nothing may be placed from a refused bundle"
    assert list((project.root / "deployments").iterdir()) == []
    assert not project.lock_path.exists()
    assert images(offline_podman) == []


def test_an_incomplete_bundle_is_refused_naming_the_missing_member(
    source: Source, offline_podman: Podman, tmp_path: Path
) -> None:
    bundle = copy_bundle(source.bundle, tmp_path / "carried")
    (bundle / "model" / BIG).unlink()
    proc = invoke(
        offline_project(tmp_path), offline_podman, "unbundle", str(bundle), "--into", str(tmp_path / "m")
    )
    assert proc.returncode == 1
    assert "incomplete" in proc.stderr and f"model/{BIG}" in proc.stderr


def test_kill_9_during_unbundle_then_the_next_run_resumes_and_ends_verified(
    source: Source, offline_podman: Podman, tmp_path: Path, other_disk: Path
) -> None:
    """Killed once it says it placed (copied) a model file; the next run places only what is left."""
    bundle = copy_bundle(source.bundle, tmp_path / "carried")
    project = offline_project(tmp_path)
    into = other_disk / "model-here"  # another filesystem: every model file is copied, one line each
    proc = subprocess.Popen(
        [shutil.which("invoke") or "invoke", "-r", str(REPO), "unbundle",
         str(bundle), "--into", str(into)],
        env=cli_env(project, offline_podman), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    said = []
    for line in proc.stdout:  # the event: unbundle reports a model file placed and recorded
        said.append(line)
        if line.startswith("unbundle: copied model/"):
            proc.send_signal(signal.SIGKILL)
            break
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, f"the run ended before it could be killed: {said}"
    assert not (bundle / ".rigsmith").exists(), "unbundle writes nothing into the bundle"

    out = must(invoke(project, offline_podman, "unbundle", str(bundle), "--into", str(into)))
    already = int(out.split(" already in place")[0].rsplit(", ", 1)[1])
    assert already >= 1, out  # files the killed run placed are neither hashed nor placed again
    for path, data in source.files.items():
        if path != "config.json":
            assert (into / path).read_bytes() == data
    assert not [p for p in into.rglob("*") if p.name.endswith((".rigsmith-tmp", ".rigsmith-link"))]
    assert offline_podman.inspect(source.pinned)["Digest"] == source.digest
    fetch = must(invoke(project, offline_podman, "fetch-model"))
    assert "0 downloaded" in fetch and f"{len(source.files)} verified earlier" in fetch
    # --into moved the model: the placed spec says where.
    assert load(project.spec_path(NAME)).model.local_dir == str(into)


def test_a_full_disk_is_refused_before_the_first_byte(
    source: Source, offline_podman: Podman, tmp_path: Path, small_disk: Path
) -> None:
    project = offline_project(tmp_path)
    proc = invoke(
        project, offline_podman, "unbundle", str(source.bundle), "--into", str(small_disk / "model")
    )
    assert proc.returncode == 1
    assert "not enough disk space in" in proc.stderr and str(small_disk) in proc.stderr, proc.stderr
    assert "nothing was written" in proc.stderr
    assert list(small_disk.iterdir()) == []
    assert list((project.root / "deployments").iterdir()) == []
    assert images(offline_podman) == []


def test_bundle_onto_a_full_disk_is_refused_before_the_first_byte(
    source: Source, podman: Podman, small_disk: Path
) -> None:
    proc = invoke(source.project, podman, "bundle", "--out", str(small_disk / "b"))
    assert proc.returncode == 1
    assert "not enough disk space in" in proc.stderr, proc.stderr
    assert list(small_disk.iterdir()) == []


def test_tar_bundle_streams_and_unbundles_from_the_tar_file(
    source: Source, podman: Podman, offline_podman: Podman, tmp_path: Path
) -> None:
    tar = tmp_path / "airgap.tar"
    must(invoke(source.project, podman, "bundle", "--out", str(source.bundle), "--tar", str(tar)))
    names = subprocess.run(
        ["tar", "-tf", str(tar)], capture_output=True, text=True, check=True
    ).stdout.split()
    assert names[0] == MANIFEST and f"model/{BIG}" in names and ".rigsmith/state.json" not in names
    # --tar - streams the same tar to stdout (status lines go to stderr).
    streamed = subprocess.run(
        [shutil.which("invoke") or "invoke", "-r", str(REPO), "bundle",
         "--out", str(source.bundle), "--tar", "-"],
        env=cli_env(source.project, podman), capture_output=True, check=True,
    ).stdout  # fmt: skip
    assert streamed == tar.read_bytes()
    project = offline_project(tmp_path)
    out = must(invoke(project, offline_podman, "unbundle", str(tar), "--into", str(tmp_path / "m")))
    assert "loaded" in out
    assert (tmp_path / "m" / BIG).read_bytes() == source.files[BIG]
    assert not (tmp_path / "m" / BIG).samefile(source.bundle / "model" / BIG)


def test_a_local_build_travels_by_image_id_with_its_definition(
    source: Source, podman: Podman, offline_podman: Podman, tmp_path: Path
) -> None:
    """A build that was never pushed is pinned by its image ID alone (what `invoke build` locks)."""
    project = built_project(source, tmp_path / "built-project", "tiny")
    (project.images / "tiny" / "patches").mkdir(parents=True)
    (project.images / "tiny" / "image.yaml").write_text("version: 1\n")
    (project.images / "tiny" / "patches" / "x.patch").write_text("--- a\n+++ b\n")
    (project.images / "tiny" / "blob.bin").write_bytes(bytes(range(256)))  # a file: entry need not be text
    image_id = "sha256:" + podman.inspect(OPS_IMAGE)["Id"].removeprefix("sha256:")  # type: ignore[union-attr]
    inputs = "sha256:" + "7" * 64
    podman.run("tag", OPS_IMAGE, f"localhost/rigsmith/tiny:{'7' * 16}")
    lock = lockmod.read(source.project.lock_path)
    lock.builds["tiny"] = lockmod.LockedBuild(
        ref="localhost/rigsmith/tiny", image_id=image_id, base="x@sha256:" + "1" * 64, inputs_sha256=inputs
    )
    project.lock_path.write_text(lockmod.dumps(lock))

    must(invoke(project, podman, "bundle", "--out", str(tmp_path / "b")))
    m = manifest(tmp_path / "b")
    assert m.image is not None and m.image.image_id == image_id and m.image.digest is None
    assert {"images/tiny/image.yaml", "images/tiny/patches/x.patch"} <= set(m.members)

    offline = offline_project(tmp_path)
    out = must(
        invoke(offline, offline_podman, "unbundle", str(tmp_path / "b"), "--into", str(tmp_path / "m"))
    )
    assert f"image {image_id} loaded" in out, out
    info = offline_podman.inspect(image_id)
    assert "localhost/rigsmith/tiny:" + "7" * 16 in info["RepoTags"]  # type: ignore[operator]
    assert (offline.images / "tiny" / "patches" / "x.patch").read_text() == "--- a\n+++ b\n"
    assert (offline.images / "tiny" / "blob.bin").read_bytes() == bytes(range(256))
    assert lockmod.read(offline.lock_path).builds["tiny"].image_id == image_id


def test_bundle_refuses_a_model_file_changed_since_fetch_model_verified_it(
    source: Source, podman: Podman, tmp_path: Path
) -> None:
    import yaml

    project = Project(tmp_path / "p")
    shutil.copytree(source.project.root / "deployments", project.deployments)
    shutil.copy2(source.project.lock_path, project.lock_path)
    model = tmp_path / "model"
    shutil.copytree(source.model_dir, model)  # copy2 keeps mtimes: fetch-model's cache still vouches
    data = yaml.safe_load(project.spec_path(NAME).read_text())
    data["model"]["local_dir"] = str(model)
    project.spec_path(NAME).write_text(yaml.safe_dump(data, sort_keys=False))
    flip_byte(model / SHARD, 99)  # a new mtime: the cache no longer vouches, so bundle hashes it

    proc = invoke(project, podman, "bundle", "--out", str(tmp_path / "b"))

    assert proc.returncode == 1
    want = hashlib.sha256(source.files[SHARD]).hexdigest()
    got = hashlib.sha256((model / SHARD).read_bytes()).hexdigest()
    assert str(model / SHARD) in proc.stderr and want in proc.stderr and got in proc.stderr, proc.stderr
    assert "fetch-model --verify" in proc.stderr
    assert not (tmp_path / "b" / MANIFEST).exists()


def test_unbundle_asks_before_replacing_a_different_spec_and_places_nothing_without_consent(
    source: Source, offline_podman: Podman, tmp_path: Path
) -> None:
    project = offline_project(tmp_path)
    mine = "# my own spec\nname: airgap\n"
    project.spec_path(NAME).write_text(mine)
    into = tmp_path / "m"
    proc = invoke(project, offline_podman, "unbundle", str(source.bundle), "--into", str(into))
    assert proc.returncode == 1
    assert "deployments/airgap.yaml" in proc.stderr and "--yes" in proc.stderr, proc.stderr
    assert project.spec_path(NAME).read_text() == mine
    assert not into.exists() and images(offline_podman) == []
    must(invoke(project, offline_podman, "unbundle", str(source.bundle), "--into", str(into), "--yes"))
    assert (into / BIG).read_bytes() == source.files[BIG]


def test_bundle_onto_another_filesystem_says_it_copies_and_a_rerun_hashes_nothing(
    source: Source, podman: Podman, offline_podman: Podman, other_disk: Path, tmp_path: Path
) -> None:
    out = other_disk / "b"
    said = must(invoke(source.project, podman, "bundle", "--out", str(out)))

    assert "on another filesystem" in said and "copying" in said, said
    assert (out / "model" / BIG).read_bytes() == source.files[BIG]
    assert not (out / "model" / BIG).samefile(source.model_dir / BIG)
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}
    again = must(invoke(source.project, podman, "bundle", "--out", str(out)))
    assert "nothing to do" in again, again
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()} == before
    # A copy changed on disk is no longer vouched for by the record: it is copied again.
    flip_byte(out / "model" / BIG, 7)
    fixed = must(invoke(source.project, podman, "bundle", "--out", str(out)))
    assert "1 copied" in fixed and (out / "model" / BIG).read_bytes() == source.files[BIG], fixed
    unbundled = must(
        invoke(offline_project(tmp_path), offline_podman, "unbundle", str(out), "--into", str(tmp_path / "m"))
    )
    # ... and back across filesystems on the offline side: every model file copied (hashed), none linked.
    assert f"0 hard-linked, {len(source.files)} copied" in unbundled, unbundled


def test_rerunning_bundle_tar_on_an_unchanged_deployment_leaves_the_tar_alone(
    source: Source, podman: Podman, tmp_path: Path
) -> None:
    """Issue 26: a re-run on an unchanged deployment touches nothing, tar included; a tar cut short is
    written again."""
    tar = tmp_path / "again.tar"
    args = ("bundle", "--out", str(source.bundle), "--targets", "podman,quadlet", "--tar", str(tar))
    must(invoke(source.project, podman, *args))
    first = tar.stat()
    out = must(invoke(source.project, podman, *args))
    assert "up to date, not rewritten" in out, out
    assert (tar.stat().st_ino, tar.stat().st_mtime_ns) == (first.st_ino, first.st_mtime_ns)
    with tar.open("r+b") as fh:  # the last member loses its tail, every header still there
        fh.truncate(first.st_size - 10240 - 4096)
    out = must(invoke(source.project, podman, *args))
    assert "not rewritten" not in out, out
    assert tar.stat().st_size == first.st_size
