"""The rig against the lock: a model dir fetched for real (Hub stand-in on 127.0.0.1), then changed the way
users change it; the locked image in real podman storage. ``doctor`` shows it, ``up`` refuses to start."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from rigsmith.errors import LockDriftError
from rigsmith.operating.doctor import doctor, drift
from rigsmith.operating.host import LocalHost, image_facts
from rigsmith.operating.lifecycle import lifecycle
from rigsmith.project import Project
from rigsmith.resolving.lock import lock as lockmod
from rigsmith.resolving.model.hub import HfHub
from rigsmith.resolving.model.modelfetch import fetch_model
from rigsmith.spec import Deployment
from tests.support.hubserver import HubServer
from tests.support.models import overwrite_in_place, tiny_files
from tests.support.podman import Podman

PATCH = [{"key": "text_config.ple_embedding_dtype", "value": "float8_e4m3fn"}]


@pytest.fixture
def fetched(
    hub: HubServer, client: HfHub, make_project: Callable[..., tuple[Project, Deployment]]
) -> tuple[Project, Deployment, Path]:
    sha = hub.repo("acme/drift").add_commit(tiny_files("drift", shards=2, shard_size=64 * 1024), refs=())
    project, spec = make_project(name="drifty", repo="acme/drift", revision=sha, config_patches=PATCH)
    fetch_model(project, spec, hub=client, echo=lambda _m: None)
    return project, spec, Path(spec.model.local_dir)


def _lock(project: Project) -> lockmod.Lock:
    return lockmod.read(project.lock_path)


def test_a_freshly_fetched_model_dir_matches_the_lock_fast_and_hashed(fetched) -> None:
    project, spec, _root = fetched
    fast = drift.model_facts(spec, _lock(project))
    assert fast.problems == () and fast.checked == 8 and not fast.hashed  # 7 files + the patched config
    assert drift.model_facts(spec, _lock(project), verify=True).problems == ()
    drift.gate(spec.name, fast, None)  # nothing to refuse


def test_a_model_file_edited_after_fetch_is_named_with_the_fix(fetched) -> None:
    project, spec, root = fetched
    shard = root / "model-00001-of-00002.safetensors"
    data = bytearray(shard.read_bytes())
    data[100] ^= 0xFF  # same size, other bytes: only the cache (mtime) or a full hash can tell
    shard.write_bytes(bytes(data))
    (root / "tokenizer/tokenizer.json").unlink()
    (root / "README.md").write_text("# mine\n")
    fast = drift.model_facts(spec, _lock(project))
    assert sorted(fast.problems) == [
        "README.md: 7 bytes, the lock says 8",
        "model-00001-of-00002.safetensors: changed since fetch-model verified it",
        "tokenizer/tokenizer.json: missing",
    ]
    hashed = drift.model_facts(spec, _lock(project), verify=True)
    assert "model-00001-of-00002.safetensors: content differs from the lock (sha256)" in hashed.problems
    with pytest.raises(LockDriftError) as err:
        drift.gate(spec.name, fast, None)
    msg = str(err.value)
    assert "drifty differs from rigsmith.lock; not starting it" in msg
    assert "tokenizer/tokenizer.json: missing" in msg
    assert "`invoke fetch-model --deployment drifty --verify`" in msg and "`--ignore-drift`" in msg


def test_a_touched_but_identical_file_passes_the_hash_check_not_the_fast_one(fetched) -> None:
    project, spec, root = fetched
    cfg = root / "generation_config.json"
    st = cfg.stat()
    os.utime(cfg, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert drift.model_facts(spec, _lock(project)).problems == (
        "generation_config.json: changed since fetch-model verified it",
    )
    assert drift.model_facts(spec, _lock(project), verify=True).problems == ()


def test_bytes_changed_under_the_same_size_and_mtime_are_drift(fetched) -> None:
    """The verified-file record holds ctime, inode and device: putting size and mtime back hides nothing."""
    project, spec, root = fetched
    shard = root / "model-00002-of-00002.safetensors"
    overwrite_in_place(shard, 7, b"\0\1\2")
    assert drift.model_facts(spec, _lock(project)).problems == (
        "model-00002-of-00002.safetensors: changed since fetch-model verified it",
    )


def test_a_hand_edited_patched_config_is_drift(fetched) -> None:
    project, spec, root = fetched
    cfg = root / "config.json"
    data = json.loads(cfg.read_text())
    data["text_config"]["ple_embedding_dtype"] = "bfloat16"
    cfg.write_text(json.dumps(data))
    problems = drift.model_facts(spec, _lock(project), verify=True).problems
    assert problems == ("config.json: content differs from the lock (sha256)",)


def test_doctor_shows_model_drift_as_a_no_go_row(fetched) -> None:
    project, _spec, root = fetched
    (root / "README.md").unlink()
    name, checks = doctor.diagnose(project, "drifty", target="lxc", host=LocalHost())
    row = next(c for c in checks if c.name == "model files")
    assert name == "drifty" and row.verdict == "no-go" and "README.md: missing" in row.detail
    assert row.hint == "`invoke fetch-model --verify` re-checks every file and downloads what differs"


def test_image_probe_finds_the_image_by_ref_and_id_and_not_a_missing_digest(
    podman: Podman, ops_image: str
) -> None:
    host = LocalHost(podman.env)
    here = image_facts(host, ops_image, False)
    assert here.present and here.image_id
    assert image_facts(host, here.image_id, True).present
    gone = image_facts(host, "127.0.0.1:5999/none@sha256:" + "0" * 64, True)
    assert not gone.present and gone.error
    with pytest.raises(LockDriftError) as err:
        drift.gate("x", None, gone)
    assert f"`podman pull {gone.ref}`" in str(err.value)


def test_up_refuses_a_drifted_model_dir_unless_told_to_ignore_it(
    fetched, podman: Podman, ops_image: str
) -> None:
    project, _spec, root = fetched
    (root / "README.md").write_text("# DRIFT\n")  # same size, other bytes, newer mtime
    ops = lifecycle.Ops(project, env=podman.env, echo=lambda _m: None)
    with pytest.raises(LockDriftError) as err:
        lifecycle.up(ops, image=ops_image, memlock="host", dry_run=True)
    assert "README.md" in str(err.value)
    assert not (project.root / "podman").exists()  # refused before writing anything
    said: list[str] = []
    ops = lifecycle.Ops(project, env=podman.env, echo=said.append)
    lifecycle.up(ops, image=ops_image, memlock="host", dry_run=True, ignore_drift=True)
    assert any(s.startswith("warning (--ignore-drift): drifty differs from rigsmith.lock") for s in said)
