"""The bundle's pure checks and its file placement, on real files (no engine, no Hub)."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest

from rigsmith.errors import LockError, PreflightError
from rigsmith.operating.bundle import ociarchive
from rigsmith.operating.bundle.manifest import (
    BundleError,
    Manifest,
    Member,
    check_space,
    contents,
    member_path,
    place,
    read_manifest,
)
from rigsmith.operating.bundle.unbundle import check_against_lock
from rigsmith.resolving.lock import lock as lockmod
from rigsmith.spec import Deployment, from_data, load, to_data

REPO = Path(__file__).resolve().parents[3]
COMMIT = "a" * 40
DIGEST = "sha256:" + "d" * 64


def spec(**engine: object) -> Deployment:
    data = to_data(load(REPO / "deployments" / "flash-next-merlin-4x3090.yaml"))
    data["name"] = "u"
    data["model"] = {"repo": "acme/u", "revision": COMMIT, "local_dir": "/models/u", "config_patches": []}
    data["engine"].pop("build", None)
    data["engine"].update({"image": "127.0.0.1:5000/vllm:1", **engine})
    return from_data(data)


def lock() -> lockmod.Lock:
    return lockmod.Lock(
        models={
            "u": lockmod.LockedModel(
                repo="acme/u",
                requested=COMMIT,
                commit=COMMIT,
                files={
                    "config.json": lockmod.LockedFile(size=3, git_sha1="1" * 40),
                    "w.safetensors": lockmod.LockedFile(size=5, sha256="5" * 64),
                },
            )
        },
        images={"127.0.0.1:5000/vllm:1": lockmod.LockedImage(digest=DIGEST)},
    )


def good_manifest() -> Manifest:
    return Manifest(
        deployment="u",
        lock_sha256="0" * 64,
        image=None,
        members={
            "model/config.json": Member(size=3, sha256="c" * 64),
            "model/w.safetensors": Member(size=5, sha256="5" * 64),
        },
    )


def test_image_pin_of_a_pinned_tag_a_digest_ref_and_a_local_build() -> None:
    pin = ociarchive.image_pin(spec(), lock())
    assert pin is not None
    assert (pin.name, pin.tag, pin.digest, pin.pinned_ref) == (
        "127.0.0.1:5000/vllm", "1", DIGEST, f"127.0.0.1:5000/vllm@{DIGEST}"
    )  # fmt: skip
    by_digest = ociarchive.image_pin(spec(image=f"127.0.0.1:5000/vllm@{DIGEST}"), lockmod.Lock())
    assert by_digest is not None and by_digest.pinned_ref == f"127.0.0.1:5000/vllm@{DIGEST}"
    built = lockmod.Lock(
        builds={
            "b": lockmod.LockedBuild(
                ref="localhost/rigsmith/b", image_id="sha256:" + "e" * 64, base="x@sha256:" + "f" * 64,
                inputs_sha256="sha256:" + "9" * 64,
            )
        }
    )  # fmt: skip
    local = ociarchive.image_pin(spec(image=None, build="b"), built)
    assert local is not None and local.pinned_ref == "sha256:" + "e" * 64 and local.digest is None
    assert local.sources == ("localhost/rigsmith/b:" + "9" * 16, "sha256:" + "e" * 64)


def test_an_unpinned_image_or_an_unfetched_model_cannot_be_bundled() -> None:
    with pytest.raises(LockError, match="invoke pin"):
        ociarchive.image_pin(spec(), lockmod.Lock())
    with pytest.raises(LockError, match="fetch-model"):
        contents(spec(), lockmod.Lock(images=lock().images))


def test_manifest_agrees_with_its_lock() -> None:
    assert check_against_lock(good_manifest(), contents(spec(), lock())) == [
        "image/engine.oci.tar: the lock pins 127.0.0.1:5000/vllm@" + DIGEST + ", the manifest no image"
    ]


def test_a_manifest_that_swapped_a_model_hash_or_dropped_a_file_is_named_with_both_hashes() -> None:
    m = good_manifest()
    swapped = m.model_copy(
        update={"members": {**m.members, "model/w.safetensors": Member(size=5, sha256="6" * 64)}}
    )
    problems = check_against_lock(swapped, contents(spec(), lock()))
    assert any("model/w.safetensors" in p and "6" * 64 in p and "5" * 64 in p for p in problems), problems
    dropped = m.model_copy(update={"members": {"model/w.safetensors": m.members["model/w.safetensors"]}})
    problems = check_against_lock(dropped, contents(spec(), lock()))
    assert any("model/config.json: locked" in p for p in problems), problems


@pytest.mark.parametrize("name", ["../etc/passwd", "/abs", ".rigsmith/state.json"])
def test_member_names_outside_the_bundle_are_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(BundleError, match="not a path inside"):
        member_path(tmp_path, name)


def test_a_bundle_without_its_manifest_is_incomplete(tmp_path: Path) -> None:
    with pytest.raises(BundleError, match=r"manifest\.json is missing"):
        read_manifest(tmp_path)


def _oci_tar(path: Path, manifest: bytes, named: str | None = None) -> str:
    digest = named or "sha256:" + hashlib.sha256(manifest).hexdigest()
    index = json.dumps({"schemaVersion": 2, "manifests": [{"digest": digest}]}).encode()
    with tarfile.open(path, "w") as tf:
        for name, data in (("index.json", index), ("blobs/sha256/" + digest[7:], manifest)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return digest


def test_archive_facts_reads_the_manifest_digest_and_checks_its_hash(tmp_path: Path) -> None:
    manifest = json.dumps({"config": {"digest": "sha256:" + "c" * 64}}).encode()
    digest = _oci_tar(tmp_path / "a.tar", manifest)
    facts = ociarchive.archive_facts(tmp_path / "a.tar")
    assert facts == ociarchive.ArchiveFacts(digest, "sha256:" + "c" * 64)
    _oci_tar(tmp_path / "b.tar", manifest, named="sha256:" + "0" * 64)
    with pytest.raises(ociarchive.ImageMismatch, match="the manifest hashes to"):
        ociarchive.archive_facts(tmp_path / "b.tar")


def test_place_hard_links_on_one_filesystem(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.write_bytes(b"hello")
    seen: list[int] = []
    linked = place(
        src, tmp_path / "d" / "dst", "sha256", hashlib.sha256(b"hello").hexdigest(), 5, seen.append
    )
    assert linked and (tmp_path / "d" / "dst").samefile(src) and sum(seen) == 5


def test_place_copies_across_filesystems_hashing_on_the_way(tmp_path: Path, small_disk: Path) -> None:
    data = bytes(range(256)) * 4096  # 1 MiB
    src = tmp_path / "src"
    src.write_bytes(data)
    linked = place(
        src, small_disk / "dst", "sha256", hashlib.sha256(data).hexdigest(), len(data), lambda n: None
    )
    assert not linked and (small_disk / "dst").read_bytes() == data
    assert sorted(p.name for p in small_disk.iterdir()) == ["dst"]


def test_place_discards_a_copy_that_does_not_hash_right(tmp_path: Path, small_disk: Path) -> None:
    data = b"x" * 100_000
    src = tmp_path / "src"
    src.write_bytes(data)
    with pytest.raises(BundleError, match="copied bytes hash to"):
        place(
            src, small_disk / "dst", "sha256", hashlib.sha256(b"other").hexdigest(), len(data), lambda n: None
        )
    assert list(small_disk.iterdir()) == []


def test_check_space_sums_what_lands_on_one_filesystem(tmp_path: Path) -> None:
    needs = {tmp_path / "a": 600, tmp_path / "b": 600}
    check_space({tmp_path / "a": 600}, lambda p: 1000, "x", "h")
    with pytest.raises(PreflightError, match=r"needs 0\.0 MiB, 0\.0 MiB is free; nothing was written"):
        check_space(needs, lambda p: 1000, "x", "h")


def test_a_multi_platform_index_pin_is_refused_with_the_way_out() -> None:
    multi = lock()
    multi.images["127.0.0.1:5000/vllm:1"] = lockmod.LockedImage(
        digest=DIGEST, media_type="application/vnd.oci.image.index.v1+json"
    )
    with pytest.raises(LockError, match="multi-platform index") as err:
        ociarchive.image_pin(spec(), multi)
    assert "skopeo inspect --raw docker://127.0.0.1:5000/vllm@" + DIGEST in str(err.value)


def test_a_foreign_manifest_is_one_paragraph(tmp_path: Path) -> None:
    (tmp_path / "manifest.json").write_text(json.dumps({"format": 1, "members": [1, 2], "x": {"y": None}}))
    with pytest.raises(BundleError) as err:
        read_manifest(tmp_path)
    text = str(err.value)
    assert "not a rigsmith bundle manifest" in text and "problem(s); first:" in text
    assert text.count("\n") == 1 and "https://" not in text  # the message and its hint, no pydantic URL
