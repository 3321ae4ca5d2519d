"""fetch-model and pin_model against a real Hub-compatible server on 127.0.0.1 (real huggingface_hub)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from rigsmith.errors import AdapterError, PreflightError, RigsmithError, SpecError
from rigsmith.resolving.lock import lock as lockmod
from rigsmith.resolving.model.hub import HfHub
from rigsmith.resolving.model.modelfetch import fetch_model, pin_model
from rigsmith.resolving.model.modelfiles import HashMismatch
from rigsmith.resolving.model.verified import read_state
from tests.support.hubserver import Fault, HubServer, random_bytes
from tests.support.models import FAST, MiB, digest, overwrite_in_place, partial_name, tiny_files


def _assert_tree(root: Path, files: dict[str, bytes], *, patched: tuple[str, ...] = ()) -> None:
    for path, data in files.items():
        if path in patched:
            assert (root / ".rigsmith/original" / path).read_bytes() == data
        else:
            assert (root / path).read_bytes() == data, path


def test_pinned_download_verifies_every_file_and_locks_hashes(hub, client, make_project):
    files = tiny_files("pinned")
    sha = hub.repo("acme/pinned").add_commit(files, refs=())
    project, spec = make_project(repo="acme/pinned", revision=sha)

    report = fetch_model(project, spec, hub=client, echo=lambda _m: None)

    root = Path(spec.model.local_dir)
    _assert_tree(root, files)
    entry = lockmod.read(project.lock_path).models["t"]
    assert entry.commit == sha and entry.requested == sha and entry.repo == "acme/pinned"
    for path, data in files.items():
        f = entry.files[path]
        assert f.size == len(data)
        if path.endswith(".safetensors"):
            assert f.sha256 == digest("sha256", data) and f.git_sha1 is None
        else:
            assert f.git_sha1 == digest("git_sha1", data) and f.sha256 is None
    assert sorted(report.downloaded) == sorted(files)
    # A pinned sha skips revision resolution; one tree listing, one GET per file, no HEADs.
    reqs = hub.hub_requests()
    assert [r.path for r in reqs if "/api/" in r.path] == [
        f"/api/models/acme/pinned/tree/{sha}?recursive=true&expand=false"
    ]
    assert sorted(r.path for r in reqs if "/resolve/" in r.path) == sorted(
        f"/acme/pinned/resolve/{sha}/{p}" for p in files
    )
    assert all(r.method == "GET" for r in reqs)
    assert not list((root / ".rigsmith/partial").iterdir())


def test_two_files_with_the_same_bytes_both_land_verified(hub, client, make_project):
    # Same bytes, same hash: each still downloads into a partial file of its own.
    files = {**tiny_files("twins"), "tokenizer.json": b"{}\n", "generation_config.json": b"{}\n"}
    sha = hub.repo("acme/twins").add_commit(files, refs=())
    project, spec = make_project(repo="acme/twins", revision=sha)

    report = fetch_model(project, spec, hub=client, workers=8, echo=lambda _m: None)

    _assert_tree(Path(spec.model.local_dir), files)
    assert sorted(report.downloaded) == sorted(files)


def test_warm_rerun_makes_zero_requests_and_hashes_nothing(hub, client, make_project):
    files = tiny_files("warm")
    hub.repo("acme/warm").add_commit(files)
    project, spec = make_project(
        repo="acme/warm",
        config_patches=[{"key": "text_config.ple_embedding_dtype", "value": "float8_e4m3fn"}],
    )
    fetch_model(project, spec, hub=client, echo=lambda _m: None)
    lock_before = project.lock_path.read_bytes()
    hub.reset()

    report = fetch_model(project, spec, echo=lambda _m: None)  # default adapter from the env: never built

    assert hub.requests == []
    assert report.hashed_bytes == 0 and report.hashed_files == 0
    assert report.downloaded == [] and report.cached == len(files)
    assert project.lock_path.read_bytes() == lock_before

    again = fetch_model(project, spec, verify=True, echo=lambda _m: None)
    assert hub.requests == []
    assert again.hashed_files == len(files) + 1  # every file, plus the patched file's original re-derived
    assert again.downloaded == [] and again.patched == []


def test_branch_pin_resolves_once_and_moves_only_on_repin(hub, client, make_project):
    repo = hub.repo("acme/moving")
    v1 = tiny_files("v1")
    c1 = repo.add_commit(v1, refs=("main", "v1.0"))
    project, spec = make_project(repo="acme/moving", revision="main")
    fetch_model(project, spec, hub=client, echo=lambda _m: None)
    assert lockmod.read(project.lock_path).models["t"].commit == c1

    v2 = dict(v1)
    v2["model-00002-of-00002.safetensors"] = random_bytes("v2", 2 * MiB)
    v2["added.json"] = b"{}"
    del v2["README.md"]
    c2 = repo.add_commit(v2, refs=("main",))
    hub.reset()

    # The branch moved, but the lock holds: no request, same commit on disk.
    report = fetch_model(project, spec, hub=client, echo=lambda _m: None)
    assert hub.requests == [] and report.commit == c1

    lines: list[str] = []
    entry = pin_model(project, spec, repin=True, hub=client, echo=lines.append)
    assert entry.commit == c2
    assert lines == [
        f"re-pinned acme/moving@main: {c1} -> {c2}",
        "  - README.md",
        "  + added.json (2 bytes)",
        f"  ~ model-00002-of-00002.safetensors ({len(v1['model-00002-of-00002.safetensors'])} -> {2 * MiB}"
        " bytes)",
    ]
    hub.reset()
    report = fetch_model(project, spec, hub=client, echo=lambda _m: None)
    assert sorted(report.downloaded) == ["added.json", "model-00002-of-00002.safetensors"]
    _assert_tree(Path(spec.model.local_dir), v2)

    lines.clear()
    assert pin_model(project, spec, repin=True, hub=client, echo=lines.append).commit == c2
    assert lines == [f"acme/moving@main still at {c2}: nothing changed"]

    # A tag resolves to its own commit, and the spec naming it re-pins without --repin.
    project2, tagged = make_project(name="tagged", repo="acme/moving", revision="v1.0")
    assert pin_model(project2, tagged, hub=client, echo=lambda _m: None).commit == c1


def test_transient_faults_are_retried_and_files_still_verified(hub, client, make_project):
    files = tiny_files("flaky", shards=3)
    sha = hub.repo("acme/flaky").add_commit(files)
    project, spec = make_project(repo="acme/flaky", revision=sha)
    hub.fault(
        Fault("503", "/tree/"),
        Fault("500", "model-00001-of-00003.safetensors"),
        Fault("reset", "model-00002-of-00003.safetensors"),
        Fault("truncate", "model-00003-of-00003.safetensors"),
        Fault("500", "/config.json", times=2),
    )
    fetch_model(project, spec, hub=client, echo=lambda _m: None)

    _assert_tree(Path(spec.model.local_dir), files)
    assert all(f.times == 0 for f in hub.faults)
    assert hub.count("/tree/") == 2
    assert hub.count("model-00001-of-00003.safetensors") == 2
    assert hub.count("model-00002-of-00003.safetensors") == 2
    # The cut body is resumed from the bytes that arrived, not from a 10 MiB boundary (i.e. from 0 here).
    truncated = files["model-00003-of-00003.safetensors"]
    first, resumed = hub.hub_requests("model-00003-of-00003.safetensors")
    assert first.range is None and first.sent == len(truncated) // 2
    assert resumed.range is not None
    at = int(resumed.range.removeprefix("bytes=").removesuffix("-"))
    assert 0 < at <= len(truncated) // 2 and resumed.sent == len(truncated) - at
    assert hub.count("/config.json") == 3


def test_persistent_server_error_fails_with_a_clear_message(hub, client, make_project):
    sha = hub.repo("acme/down").add_commit(tiny_files("down"))
    project, spec = make_project(repo="acme/down", revision=sha)
    hub.fault(Fault("500", "README.md", times=100))
    with pytest.raises(AdapterError) as err:
        fetch_model(project, spec, hub=client, echo=lambda _m: None)
    assert str(err.value).startswith(f"download: acme/down@{sha}/README.md: HTTP 500 from {hub.url}")
    assert hub.count("README.md") == FAST.attempts
    # Everything else is verified and kept; the re-run fetches only the missing file.
    hub.reset()
    report = fetch_model(project, spec, hub=client, echo=lambda _m: None)
    assert report.downloaded == ["README.md"]


def test_wrong_bytes_are_detected_and_refused(hub, client, make_project):
    files = tiny_files("wrong")
    sha = hub.repo("acme/wrong").add_commit(files)
    project, spec = make_project(repo="acme/wrong", revision=sha)
    root = Path(spec.model.local_dir)
    shard = "model-00001-of-00002.safetensors"
    hub.fault(Fault("wrong", shard, times=2))

    with pytest.raises(HashMismatch) as err:
        fetch_model(project, spec, hub=client, echo=lambda _m: None)

    bad = bytes([files[shard][0] ^ 0xFF]) + files[shard][1:]
    assert str(err.value).startswith(
        f"{shard}: the Hub sent bytes that do not match the lock "
        f"(sha256 {hashlib.sha256(bad).hexdigest()} != {hashlib.sha256(files[shard]).hexdigest()}"
    )
    assert not (root / shard).exists()
    assert not list((root / ".rigsmith/partial").iterdir())
    assert shard not in read_state(root / ".rigsmith/state.json").files
    _assert_tree(root, {p: d for p, d in files.items() if p != shard})

    # Corrupt once: the second attempt is good and the file lands.
    hub.reset()
    hub.fault(Fault("wrong", shard, times=1))
    report = fetch_model(project, spec, hub=client, echo=lambda _m: None)
    assert report.downloaded == [shard]
    assert (root / shard).read_bytes() == files[shard]


def test_files_download_concurrently_up_to_the_worker_count(hub, client, make_project, tmp_path):
    files = tiny_files("parallel", shards=4, shard_size=MiB)
    sha = hub.repo("acme/parallel").add_commit(files, refs=())
    project, spec = make_project(repo="acme/parallel", revision=sha)
    shards = sorted(p for p in files if p.endswith(".safetensors"))
    # Each shard's body takes 0.2 s or more on the wire, so shards in flight together overlap at the server.
    hub.fault(*(Fault("slow", p, delay=0.05) for p in shards))

    fetch_model(project, spec, hub=client, workers=3, echo=lambda _m: None)

    _assert_tree(Path(spec.model.local_dir), files)
    assert hub.peak_in_flight() == 3
    assert hub.peak_in_flight(".safetensors") >= 2
    assert all(hub.count(f"/resolve/{sha}/{p}") == 1 for p in files)

    hub.reset()
    hub.fault(*(Fault("slow", p, delay=0.05) for p in shards))
    fetch_model(project, spec, dest=tmp_path / "one", hub=client, workers=1, echo=lambda _m: None)
    _assert_tree(tmp_path / "one", files)
    assert hub.peak_in_flight() == 1 and hub.count("/resolve/") == len(files)

    with pytest.raises(RigsmithError, match=r"--workers '0': must be a whole number from 1 to 64"):
        fetch_model(project, spec, hub=client, workers=0, echo=lambda _m: None)


def test_a_file_failing_verification_fails_the_fetch_while_the_others_complete(hub, client, make_project):
    files = tiny_files("mixed", shards=3, shard_size=MiB)
    sha = hub.repo("acme/mixed").add_commit(files, refs=())
    project, spec = make_project(repo="acme/mixed", revision=sha)
    root = Path(spec.model.local_dir)
    bad, slow = "model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors"
    hub.fault(Fault("wrong", bad, times=2), Fault("slow", slow, delay=0.1))

    with pytest.raises(HashMismatch) as err:
        fetch_model(project, spec, hub=client, echo=lambda _m: None)

    assert str(err.value).startswith(f"{bad}: the Hub sent bytes that do not match the lock")
    # Both tries of the bad file were over while the slow file was still on the wire, and it finished.
    tries = hub.hub_requests(bad)
    (slow_req,) = hub.hub_requests(slow)
    assert len(tries) == 2 and all(r.ended is not None for r in tries)
    assert slow_req.ended is not None and max(r.ended or 0 for r in tries) < slow_req.ended
    assert slow_req.sent == len(files[slow])
    assert not (root / bad).exists()
    assert not list((root / ".rigsmith/partial").iterdir())
    state = read_state(root / ".rigsmith/state.json").files
    assert bad not in state and sorted(state) == sorted(p for p in files if p != bad)
    _assert_tree(root, {p: d for p, d in files.items() if p != bad})


def test_edited_or_corrupted_files_are_caught(hub, client, make_project):
    files = tiny_files("edited")
    sha = hub.repo("acme/edited").add_commit(files)
    project, spec = make_project(repo="acme/edited", revision=sha)
    fetch_model(project, spec, hub=client, echo=lambda _m: None)
    root = Path(spec.model.local_dir)
    shard = root / "model-00002-of-00002.safetensors"

    # Same size, same mtime, different bytes: the write changed ctime, so the record no longer vouches; the
    # file is hashed, found wrong and downloaded again, without --verify.
    overwrite_in_place(shard, 100, b"\0\0\0\0")
    hub.reset()
    report = fetch_model(project, spec, hub=client, echo=lambda _m: None)
    assert report.downloaded == ["model-00002-of-00002.safetensors"] and report.hashed_files == 1
    assert shard.read_bytes() == files[shard.name]

    # --verify hashes every file; one changed on disk is named, then downloaded again.
    with shard.open("r+b") as fh:
        fh.write(b"\0\0\0\0")
    msgs: list[str] = []
    report = fetch_model(project, spec, hub=client, verify=True, echo=msgs.append)
    assert report.downloaded == ["model-00002-of-00002.safetensors"]
    assert msgs == ["model-00002-of-00002.safetensors: does not match the lock; downloading it again"]
    assert shard.read_bytes() == files[shard.name]

    # A changed mtime makes the file suspect: it is hashed (not downloaded) and adopted when it matches.
    st = shard.stat()
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))
    hub.reset()
    report = fetch_model(project, spec, hub=client, echo=lambda _m: None)
    assert report.downloaded == [] and report.hashed_files == 1 and hub.requests == []


def test_stale_partials_are_cleaned_and_a_matching_partial_resumes(hub, client, make_project):
    files = tiny_files("stale")
    sha = hub.repo("acme/stale").add_commit(files)
    project, spec = make_project(repo="acme/stale", revision=sha)
    root = Path(spec.model.local_dir)
    shard = "model-00001-of-00002.safetensors"
    data = files[shard]
    (root / ".rigsmith/partial").mkdir(parents=True)
    (root / ".rigsmith/partial" / f"{'0' * 64}.incomplete").write_bytes(b"old commit")
    (root / ".rigsmith/partial" / partial_name(shard, data)).write_bytes(data[: 1 * MiB])
    hfdir = root / ".cache/huggingface/download"
    hfdir.mkdir(parents=True)
    (hfdir / "Y29uZmln.abcd.1234abcd.incomplete").write_bytes(b"x" * 10)

    report = fetch_model(project, spec, hub=client, echo=lambda _m: None)

    assert report.cleaned == [
        f".rigsmith/partial/{'0' * 64}.incomplete",
        ".cache/huggingface/download/Y29uZmln.abcd.1234abcd.incomplete",
    ]
    assert report.resumed_bytes == 1 * MiB
    assert [r.range for r in hub.hub_requests(shard)] == [f"bytes={MiB}-"]
    assert hub.bytes_sent[shard] == len(data) - MiB
    _assert_tree(root, files)


def test_a_server_ignoring_range_restarts_the_file_cleanly(hub, client, make_project):
    files = tiny_files("norange")
    sha = hub.repo("acme/norange").add_commit(files)
    project, spec = make_project(repo="acme/norange", revision=sha)
    root = Path(spec.model.local_dir)
    shard = "model-00002-of-00002.safetensors"
    (root / ".rigsmith/partial").mkdir(parents=True)
    part = root / ".rigsmith/partial" / partial_name(shard, files[shard])
    part.write_bytes(files[shard][:MiB])
    hub.fault(Fault("norange", shard))

    fetch_model(project, spec, hub=client, echo=lambda _m: None)

    (req,) = hub.hub_requests(shard)
    assert req.range == f"bytes={MiB}-" and req.sent == len(files[shard])  # answered 200, whole body
    _assert_tree(root, files)


def test_disk_space_is_checked_before_the_first_byte(hub, client, make_project):
    files = tiny_files("disk")
    hub.repo("acme/disk").add_commit(files)
    project, spec = make_project(repo="acme/disk")
    with pytest.raises(PreflightError) as err:
        fetch_model(project, spec, hub=client, disk_free=lambda _p: 2 * MiB, echo=lambda _m: None)
    need = sum(len(d) for d in files.values())
    assert f"the download needs {need / MiB:.1f} MiB more, 2.0 MiB is free" in str(err.value)
    assert "--dest" in str(err.value)
    assert hub.count("/resolve/") == 0


@pytest.mark.parametrize(
    ("setup", "revision", "expected"),
    [
        ("missing", None, "resolve revision: repo acme/nope not found at {url} (without a token, HTTP 401)"),
        (
            "gated",
            None,
            "resolve revision: acme/gated is a gated repo and this token has no access (HTTP 403)",
        ),
        (
            "private",
            None,
            "resolve revision: repo acme/private not found at {url} (without a token, HTTP 401)",
        ),
        ("plain", "no-such-branch", "resolve revision: revision 'no-such-branch' not found in acme/plain"),
    ],
)
def test_not_found_and_gated_fail_fast_with_clear_messages(
    hub, client, make_project, setup, revision, expected
):
    repos = {
        "gated": hub.repo("acme/gated", gated=True),
        "private": hub.repo("acme/private", token="hf_s3cret"),
    }
    repos["plain"] = hub.repo("acme/plain")
    for r in repos.values():
        r.add_commit(tiny_files("err", shards=1, shard_size=1024))
    repo_id = {"missing": "acme/nope"}.get(setup, f"acme/{setup}")
    project, spec = make_project(repo=repo_id, revision=revision)
    with pytest.raises(AdapterError) as err:
        fetch_model(project, spec, hub=client, echo=lambda _m: None)
    assert str(err.value).splitlines()[0] == expected.format(url=hub.url)
    assert "hint:" in str(err.value)
    assert len(hub.hub_requests()) == 1  # not retried
    assert not project.lock_path.exists()


def test_token_from_env_reaches_a_private_repo(hub, make_project, monkeypatch):
    files = tiny_files("private", shards=1, shard_size=1024)
    hub.repo("acme/secret", token="hf_s3cret").add_commit(files)
    project, spec = make_project(repo="acme/secret")
    monkeypatch.setenv("HF_TOKEN", "hf_s3cret")
    client = HfHub.from_env(retry=FAST)
    assert "hf_s3cret" not in repr(client)
    fetch_model(project, spec, hub=client, echo=lambda _m: None)
    _assert_tree(Path(spec.model.local_dir), files)
    assert all(r.authorization for r in hub.hub_requests())


def test_token_file_is_used_when_env_is_unset(hub, make_project, tmp_path):
    files = tiny_files("tokfile", shards=1, shard_size=1024)
    hub.repo("acme/tokfile", token="hf_f1le").add_commit(files)
    project, spec = make_project(repo="acme/tokfile")
    (tmp_path / "hf-home").mkdir(exist_ok=True)
    (tmp_path / "hf-home" / "token").write_text("hf_f1le\n")
    fetch_model(project, spec, hub=HfHub.from_env(retry=FAST), echo=lambda _m: None)
    _assert_tree(Path(spec.model.local_dir), files)


def test_allow_and_ignore_patterns_select_files(hub, client, make_project):
    files = tiny_files("patterns")
    hub.repo("acme/patterns").add_commit(files)
    project, spec = make_project(
        repo="acme/patterns", allow_patterns=["*.json", "*.safetensors"], ignore_patterns=["model-00002-*"]
    )
    report = fetch_model(project, spec, hub=client, echo=lambda _m: None)
    assert sorted(report.downloaded) == [
        "config.json",
        "generation_config.json",
        "model-00001-of-00002.safetensors",
        "model.safetensors.index.json",
        "tokenizer/tokenizer.json",  # huggingface_hub's fnmatch: * also matches /
    ]
    # The lock still lists the whole commit: patterns are applied at fetch time.
    assert len(lockmod.read(project.lock_path).models["t"].files) == len(files)

    _, none = make_project(name="none", repo="acme/patterns", allow_patterns=["*.gguf"])
    with pytest.raises(SpecError) as err:
        fetch_model(project, none, hub=client, echo=lambda _m: None)
    assert "model.allow_patterns: no file of acme/patterns@" in str(err.value)


def test_config_patch_is_idempotent_keeps_the_original_and_locks_both_hashes(
    hub, client, make_project, golden
):
    files = tiny_files("patch")
    hub.repo("acme/patch").add_commit(files)
    patches = [
        {"key": "text_config.ple_embedding_dtype", "value": "float8_e4m3fn"},
        {"key": "quantization_config.bits", "value": 4},
    ]
    project, spec = make_project(repo="acme/patch", config_patches=patches)
    root = Path(spec.model.local_dir)
    report = fetch_model(project, spec, hub=client, echo=lambda _m: None)
    assert report.patched == ["config.json"]

    patched = (root / "config.json").read_bytes()
    golden("patched-config.json", patched.decode())
    assert (root / ".rigsmith/original/config.json").read_bytes() == files["config.json"]
    entry = lockmod.read(project.lock_path).models["t"]
    assert [p.model_dump() for p in entry.patches] == [
        {
            "file": "config.json",
            "original_sha256": hashlib.sha256(files["config.json"]).hexdigest(),
            "patched_sha256": hashlib.sha256(patched).hexdigest(),
        }
    ]
    assert entry.files["config.json"].git_sha1 == digest("git_sha1", files["config.json"])

    mtime = (root / "config.json").stat().st_mtime_ns
    hub.reset()
    for verify in (False, True):
        again = fetch_model(project, spec, hub=client, verify=verify, echo=lambda _m: None)
        assert again.patched == [] and again.downloaded == []
    assert (root / "config.json").stat().st_mtime_ns == mtime
    assert hub.requests == []

    # Dropping the patch from the spec restores the Hub's bytes from the kept original, no download.
    _, unpatched = make_project(repo="acme/patch", config_patches=[])
    report = fetch_model(project, unpatched, hub=client, echo=lambda _m: None)
    assert report.downloaded == [] and hub.requests == []
    assert (root / "config.json").read_bytes() == files["config.json"]
    assert lockmod.read(project.lock_path).models["t"].patches == []


def test_a_patch_that_cannot_apply_names_the_field(hub, client, make_project):
    hub.repo("acme/badpatch").add_commit(tiny_files("badpatch", shards=1, shard_size=1024))
    project, spec = make_project(
        repo="acme/badpatch",
        config_patches=[
            {"key": "architectures.first", "value": 1},
            {"file": "tokenizer/missing.json", "key": "a", "value": 1},
        ],
    )
    with pytest.raises(SpecError) as err:
        fetch_model(project, spec, hub=client, echo=lambda _m: None)
    assert err.value.problems == [
        (
            "model.config_patches[1].file",
            "tokenizer/missing.json is not among the files fetched from the repo",
        )
    ]
    _, spec = make_project(repo="acme/badpatch", config_patches=[{"key": "architectures.first", "value": 1}])
    with pytest.raises(SpecError) as err:
        fetch_model(project, spec, hub=client, echo=lambda _m: None)
    assert err.value.problems == [
        ("model.config_patches[0].key", "architectures in config.json is not an object")
    ]
    # The download itself is complete and verified; only the patch was refused.
    assert (Path(spec.model.local_dir) / ".rigsmith/original/config.json").is_file()


def test_seed_deployments_fetch_against_stand_in_repos(hub, client, tmp_path, golden):
    """Both shipped specs, unchanged, against stand-in repos with their repo ids and layout."""
    from rigsmith import spec as specmod
    from rigsmith.project import Project
    from tests.support.common import REPO as ROOT

    project = Project(tmp_path / "checkout")
    (project.root / "deployments").mkdir(parents=True)
    for p in (ROOT / "deployments").glob("*.yaml"):
        (project.root / "deployments" / p.name).write_bytes(p.read_bytes())
    int4 = specmod.load(project.spec_path("flash-next-int4-3x3090"))
    merlin = specmod.load(project.spec_path("flash-next-merlin-4x3090"))
    assert int4.model.revision is not None and int4.model.pinned and merlin.model.revision is None

    hub.repo(int4.model.repo).add_commit(
        tiny_files("int4", shards=3, shard_size=MiB), sha=int4.model.revision, refs=()
    )
    merlin_files = tiny_files("merlin", shards=4, shard_size=MiB)
    hub.repo(merlin.model.repo).add_commit(merlin_files)

    for spec in (int4, merlin):
        dest = tmp_path / "dest" / spec.name
        report = fetch_model(project, spec, dest=dest, hub=client, echo=lambda _m: None)
        assert report.local_dir == str(dest)
        listing = sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file())
        golden(f"{spec.name}.files.txt", "\n".join(listing) + "\n")
        assert sorted(read_state(dest / ".rigsmith/state.json").files) == [
            p for p in listing if not p.startswith(".rigsmith/") or p.startswith(".rigsmith/original/")
        ]
    golden("seed-deployments.rigsmith.lock", project.lock_path.read_text())
    cfg = json.loads((tmp_path / "dest" / merlin.name / "config.json").read_text())
    assert cfg["text_config"]["ple_embedding_dtype"] == "float8_e4m3fn"


def test_pin_model_writes_the_lock_without_downloading(hub, client, make_project):
    files = tiny_files("pinonly")
    sha = hub.repo("acme/pinonly").add_commit(files)
    project, spec = make_project(repo="acme/pinonly")
    msgs: list[str] = []
    entry = pin_model(project, spec, hub=client, echo=msgs.append)
    assert entry.commit == sha and msgs == [f"pinned acme/pinonly@main -> {sha} ({len(files)} files)"]
    assert hub.count("/resolve/") == 0
    assert lockmod.read(project.lock_path).models["t"] == entry
    # Already pinned: no request at all.
    hub.reset()
    assert pin_model(project, spec, hub=client, echo=msgs.append) == entry
    assert hub.requests == []


def test_server_is_the_real_thing(hub: HubServer) -> None:
    """The stand-in answers the huggingface_hub client's own metadata calls (model_info with blobs)."""
    from huggingface_hub import HfApi

    files = tiny_files("api", shards=1, shard_size=2048)
    sha = hub.repo("acme/api").add_commit(files)
    info = HfApi(endpoint=hub.url, token=False).model_info("acme/api", revision="main", files_metadata=True)
    assert info.sha == sha
    lfs = {s.rfilename: s.lfs for s in info.siblings or []}
    assert lfs["model-00001-of-00001.safetensors"].sha256 == digest(
        "sha256", files["model-00001-of-00001.safetensors"]
    )


def test_golden_file_set_is_exact() -> None:
    """Every golden file here is produced by a test above, and nothing else lies around."""
    from tests.support.models import GOLDEN

    assert sorted(p.name for p in GOLDEN.iterdir()) == [
        "cli-errors.txt.golden",
        "flash-next-int4-3x3090.files.txt.golden",
        "flash-next-merlin-4x3090.files.txt.golden",
        "patched-config.json.golden",
        "seed-deployments.rigsmith.lock.golden",
    ]


def test_a_repo_on_xet_goes_through_hf_xet_and_nothing_unverified_lands(
    hub, client, make_project, monkeypatch
):
    """As far as a stand-in allows: it says the file is on Xet (HEAD headers) but has no Xet token route or
    CAS, so hf_xet's route is taken and fails cleanly. With hf_xet turned off the same repo downloads by
    huggingface_hub's HTTP path."""
    import huggingface_hub.constants

    files = tiny_files("onxet", shards=1, shard_size=5 * MiB)
    sha = hub.repo("acme/onxet", xet=True).add_commit(files, refs=())
    project, spec = make_project(repo="acme/onxet", revision=sha)
    root, shard = Path(spec.model.local_dir), "model-00001-of-00001.safetensors"
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_DISABLE_XET", False)

    with pytest.raises(AdapterError, match="HTTP 404"):
        fetch_model(project, spec, hub=client, workers=4, echo=lambda _m: None)

    assert [r.method for r in hub.hub_requests(f"/resolve/{sha}/{shard}")] == ["HEAD"]
    assert hub.count("/xet-read-token/") >= 1  # hf_xet's route asked for its token
    assert not (root / shard).exists()

    hub.reset()
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_DISABLE_XET", True)
    fetch_model(project, spec, hub=client, workers=4, echo=lambda _m: None)
    _assert_tree(root, files)
    assert all(r.method == "GET" for r in hub.hub_requests(shard))
