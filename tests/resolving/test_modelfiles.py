"""The pure core of fetch-model, checked against real tools (git, sha256sum) and real exceptions."""

from __future__ import annotations

import io
import json
import subprocess
from pathlib import Path

import httpx2
import pytest
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    LocalEntryNotFoundError,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from hypothesis import assume, given
from hypothesis import strategies as st

from rigsmith.errors import PreflightError, RigsmithError, SpecError
from rigsmith.resolving.lock.lock import LockedFile
from rigsmith.resolving.model.hub import ShortBody, is_retryable
from rigsmith.resolving.model.modelfiles import (
    Hasher,
    Want,
    check_disk,
    expand_dir,
    hash_file,
    hash_stream,
    patch_json,
    safe_relpath,
    select,
    stale_partials,
    token_from,
    wants,
)
from rigsmith.resolving.model.verified import read_state, seen, seen_at, verified, vouches
from rigsmith.spec import ConfigPatch
from tests.support.models import overwrite_in_place


@pytest.mark.parametrize("data", [b"", b"{}\n", bytes(range(256)) * 1000], ids=["empty", "json", "256k"])
def test_git_blob_sha1_matches_git_hash_object(tmp_path, data):
    f = tmp_path / "blob"
    f.write_bytes(data)
    want = subprocess.run(
        ["git", "hash-object", str(f)], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert hash_file(f, "git_sha1", len(data)) == want


def test_sha256_matches_sha256sum(tmp_path):
    f = tmp_path / "shard"
    f.write_bytes(bytes(range(256)) * 40_000)
    want = subprocess.run(["sha256sum", str(f)], capture_output=True, text=True, check=True).stdout.split()[0]
    assert hash_file(f, "sha256", f.stat().st_size) == want


@given(st.binary(max_size=5000), st.integers(min_value=0, max_value=5000))
def test_resumed_hash_equals_whole_hash(data, cut):
    """Hashing a prefix from disk and streaming the rest gives the same digest as one pass."""
    cut = min(cut, len(data))
    h = hash_stream("sha256", len(data), io.BytesIO(data), limit=cut)
    h.update(data[cut:])
    whole = Hasher("sha256", len(data))
    whole.update(data)
    assert h.hexdigest() == whole.hexdigest()


def _patch(*patches: tuple[str, object]) -> list[tuple[int, ConfigPatch]]:
    return [(i, ConfigPatch(key=k, value=v)) for i, (k, v) in enumerate(patches)]


@given(
    st.dictionaries(st.text(min_size=1, max_size=5), st.integers() | st.text(max_size=5), max_size=5),
    st.lists(st.from_regex(r"[a-z]{1,3}(\.[a-z]{1,3}){0,2}", fullmatch=True), min_size=1, max_size=3),
    st.integers() | st.text(max_size=8) | st.booleans(),
)
def test_patch_is_idempotent_and_sets_the_value(base, keys, value):
    # Keys that nest inside one another (a.b then a) overwrite each other by design; leave them out.
    assume(not any(a != b and (b + ".").startswith(a + ".") for a in keys for b in keys))
    text = json.dumps(base).encode()
    patches = _patch(*[(k, value) for k in keys])
    try:
        once = patch_json(text, patches, "config.json")
    except SpecError as err:
        assert all(path.startswith("model.config_patches[") for path, _ in err.problems)
        return
    assert patch_json(once, patches, "config.json") == once
    node = json.loads(once)
    for part in keys[-1].split("."):
        node = node[part]
    assert node == value


def test_patch_seed_003_key_and_report_bad_paths():
    cfg = json.dumps({"text_config": {"ple_embedding_dtype": "bfloat16"}, "arch": ["x"]}).encode()
    out = json.loads(
        patch_json(cfg, _patch(("text_config.ple_embedding_dtype", "float8_e4m3fn")), "config.json")
    )
    assert out == {"text_config": {"ple_embedding_dtype": "float8_e4m3fn"}, "arch": ["x"]}
    with pytest.raises(SpecError) as err:
        patch_json(
            cfg, _patch(("ok.new", 1), ("arch.x", 1), ("text_config.ple_embedding_dtype.y", 2)), "c.json"
        )
    assert err.value.problems == [
        ("model.config_patches[1].key", "arch in c.json is not an object"),
        ("model.config_patches[2].key", "text_config.ple_embedding_dtype in c.json is not an object"),
    ]
    with pytest.raises(SpecError) as err:
        patch_json(b"not json", _patch(("a", 1)), "c.json")
    assert err.value.problems[0][0] == "model.config_patches[0].file"


def test_select_uses_huggingface_hub_pattern_semantics():
    files = {
        p: LockedFile(size=1, git_sha1="0" * 40) for p in ("a.json", "sub/b.json", "w.safetensors", "x.bin")
    }
    assert list(select(files, (), ())) == sorted(files)
    assert list(select(files, ("*.json",), ())) == ["a.json", "sub/b.json"]
    assert list(select(files, (), ("*.bin", "sub/*"))) == ["a.json", "w.safetensors"]


def test_wants_put_patched_originals_aside_and_refuse_unsafe_paths():
    files = {
        "config.json": LockedFile(size=3, git_sha1="a" * 40),
        "m.safetensors": LockedFile(size=9, sha256="b" * 64),
    }
    assert wants(files, {"config.json"}) == [
        Want("config.json", ".rigsmith/original/config.json", 3, "git_sha1", "a" * 40),
        Want("m.safetensors", "m.safetensors", 9, "sha256", "b" * 64),
    ]
    for bad in ("../etc/passwd", "/abs", ".rigsmith/state.json", ".cache/huggingface/x", ""):
        with pytest.raises(RigsmithError):
            safe_relpath(bad)


def test_stale_partials_keep_only_resumable_ones():
    w = Want("m", "m", 9, "sha256", "b" * 64)
    assert stale_partials([w.partial_name, f"{'b' * 64}.incomplete", "x"], [w]) == [
        f"{'b' * 64}.incomplete",
        "x",
    ]


def test_disk_check_names_sizes_and_the_fix():
    check_disk(10, 10, Path("/m"))
    with pytest.raises(PreflightError) as err:
        check_disk(176093659136, 50 * 2**30, Path("/srv/models"))
    assert str(err.value) == (
        "not enough disk space in /srv/models: the download needs 164.00 GiB more, 50.00 GiB is free\n"
        "  hint: free some space, or pass --dest DIR on a bigger disk"
    )


def test_token_sources_in_order(tmp_path):
    (tmp_path / "token").write_text("from-file\n")

    def read(p: Path) -> str | None:
        return p.read_text() if p.exists() else None

    home = {"HF_HOME": str(tmp_path)}
    assert token_from({**home, "HF_TOKEN": "env", "HUGGING_FACE_HUB_TOKEN": "old"}, read) == "env"
    assert token_from({**home, "HUGGING_FACE_HUB_TOKEN": "old"}, read) == "old"
    assert token_from(home, read) == "from-file"
    assert token_from({"HF_TOKEN_PATH": str(tmp_path / "none")}, read) is None


def test_expand_dir_expands_home_at_the_edge():
    assert expand_dir("~/models/x", {"HOME": "/home/u"}) == Path("/home/u/models/x")
    assert expand_dir("/srv/m", {"HOME": "/home/u"}) == Path("/srv/m")


def _http_error(cls: type[HfHubHTTPError], status: int) -> HfHubHTTPError:
    req = httpx2.Request("GET", "http://127.0.0.1/x")
    return cls("boom", response=httpx2.Response(status, request=req))


def test_retry_classification_follows_the_exception_tree():
    assert not is_retryable(_http_error(GatedRepoError, 403))  # a RepositoryNotFoundError subclass
    assert not is_retryable(_http_error(RepositoryNotFoundError, 401))
    assert not is_retryable(_http_error(RevisionNotFoundError, 404))
    assert not is_retryable(_http_error(RemoteEntryNotFoundError, 404))
    assert not is_retryable(_http_error(HfHubHTTPError, 403))
    assert is_retryable(_http_error(HfHubHTTPError, 503))
    assert is_retryable(httpx2.ReadError("reset"))
    assert is_retryable(httpx2.ConnectError("refused"))
    cached = LocalEntryNotFoundError("offline")
    assert not is_retryable(cached)
    cached.__cause__ = httpx2.ConnectError("refused")
    assert is_retryable(cached)
    assert is_retryable(ShortBody("the body ended at byte 1 of 3"))
    assert not is_retryable(OSError("disk full"))


def test_the_record_vouches_only_for_the_file_as_it_was_hashed(tmp_path):
    """size, mtime, ctime, inode and device: a rewrite that puts size and mtime back is not vouched for,
    nor a same-bytes copy moved over the file; a record without the strict fields never vouches."""
    f = tmp_path / "w.bin"
    f.write_bytes(b"abcd")
    rec = verified(seen(f.stat()), "sha256", "d" * 64)
    assert vouches(rec, seen_at(f), "sha256", "d" * 64)
    assert not vouches(rec, seen_at(f), "sha256", "e" * 64) and not vouches(rec, None, "sha256", "d" * 64)
    overwrite_in_place(f, 0, b"x")
    assert not vouches(rec, seen_at(f), "sha256", "d" * 64)
    old = {"size": 4, "mtime_ns": f.stat().st_mtime_ns, "kind": "sha256", "digest": "d" * 64}
    (tmp_path / "state.json").write_text(json.dumps({"files": {"w.bin": old}}))
    assert read_state(tmp_path / "state.json").files == {}  # an old record (size + mtime only) is dropped
