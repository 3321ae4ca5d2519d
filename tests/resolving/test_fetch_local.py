"""fetch-model and pin with a local checkpoint (``model.repo: null``): nothing is downloaded or pinned.

The checkpoint dir is reported as found; config patches are still applied with the original kept, as for a
Hub download. The Hub stand-in runs and is pointed at, so "no request" is observed, not assumed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rigsmith.errors import RigsmithError, SpecError
from rigsmith.resolving.lock import lock as lockmod
from rigsmith.resolving.lock.lock import LockedModel
from rigsmith.resolving.model.modelfetch import fetch_model, pin_model
from tests.support.models import run_cli, tiny_files

PATCH = {"file": "config.json", "key": "text_config.ple_embedding_dtype", "value": "float8_e4m3fn"}


def _checkpoint(root: Path) -> dict[str, bytes]:
    files = tiny_files("local/ckpt", shards=2, shard_size=4096)
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return files


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_fetch_reports_a_local_checkpoint_and_touches_nothing(hub, make_project):
    project, spec = make_project(repo=None)
    root = Path(spec.model.local_dir)
    files = _checkpoint(root)
    report = fetch_model(project, spec, echo=lambda _m: None)
    assert hub.count() == 0
    assert _tree(root) == files, "no state dir, no file changed"
    assert not project.lock_path.exists()
    assert (report.files, report.weight_files, report.has_config) == (len(files), 2, True)
    assert report.local_bytes == sum(len(b) for b in files.values())
    assert report.summary().startswith(
        f"local checkpoint (model.repo is null): nothing downloaded or verified; {len(files)} files ("
    )
    assert f"in {root}; 2 weight file(s); config.json present" in report.summary()


def test_fetch_refuses_a_missing_local_checkpoint_dir(hub, make_project):
    project, spec = make_project(repo=None)
    with pytest.raises(RigsmithError) as err:
        fetch_model(project, spec, echo=lambda _m: None)
    text = str(err.value)
    assert "model.repo is null, so the checkpoint is local and there is nothing to download" in text
    assert f"{spec.model.local_dir} is not a directory" in text
    assert "copy the checkpoint there, point model.local_dir at it" in text
    assert hub.count() == 0


def test_fetch_refuses_a_relative_local_dir(make_project):
    project, spec = make_project(repo=None, local_dir="./vllm-models/vllm-0")
    with pytest.raises(SpecError, match=r"model.local_dir: './vllm-models/vllm-0' is relative"):
        fetch_model(project, spec, echo=lambda _m: None)


def test_config_patches_on_a_local_checkpoint_keep_the_original(hub, make_project):
    project, spec = make_project(repo=None, config_patches=[PATCH])
    root = Path(spec.model.local_dir)
    original = _checkpoint(root)["config.json"]

    report = fetch_model(project, spec, echo=lambda _m: None)
    assert report.patched == ["config.json"]
    assert "patched config.json (original kept in .rigsmith/original/)" in report.summary()
    assert (root / ".rigsmith/original/config.json").read_bytes() == original
    patched = (root / "config.json").read_bytes()
    assert json.loads(patched)["text_config"]["ple_embedding_dtype"] == "float8_e4m3fn"

    again = fetch_model(project, spec, echo=lambda _m: None)
    assert again.patched == [] and (root / "config.json").read_bytes() == patched

    # A new checkpoint copied over the dir: its config is the new original, and rigsmith says so.
    fresh = json.dumps({"text_config": {"ple_embedding_dtype": "bfloat16", "hidden_size": 128}}).encode()
    (root / "config.json").write_bytes(fresh)
    lines: list[str] = []
    third = fetch_model(project, spec, echo=lines.append)
    assert third.patched == ["config.json"]
    assert lines == [
        "config.json: changed outside rigsmith since it was patched; keeping it as the new original"
    ]
    assert (root / ".rigsmith/original/config.json").read_bytes() == fresh
    assert json.loads((root / "config.json").read_bytes())["text_config"] == {
        "ple_embedding_dtype": "float8_e4m3fn",
        "hidden_size": 128,
    }
    assert hub.count() == 0 and not project.lock_path.exists()


def test_a_patch_of_a_file_the_local_checkpoint_lacks_is_named(make_project):
    project, spec = make_project(repo=None, config_patches=[{**PATCH, "file": "text/config.json"}])
    _checkpoint(Path(spec.model.local_dir))
    with pytest.raises(SpecError) as err:
        fetch_model(project, spec, echo=lambda _m: None)
    assert err.value.problems[0][0] == "model.config_patches[0].file"
    assert "text/config.json is not in the local checkpoint" in err.value.problems[0][1]


def test_pin_skips_a_local_model_and_drops_a_stale_lock_entry(hub, make_project):
    project, spec = make_project(repo=None)
    with lockmod.locked(project.lock_path) as lock:
        lock.models[spec.name] = LockedModel(repo="acme/was-a-repo", commit="a" * 40, files={})
    lines: list[str] = []
    assert pin_model(project, spec, echo=lines.append) is None
    assert lines == [
        f"t: model skipped — model.repo is null (a local checkpoint in {spec.model.local_dir}); "
        "nothing to pin",
        "t: dropped the lock's acme/was-a-repo@aaaaaaaaaaaa (the spec no longer names a repo)",
    ]
    assert spec.name not in lockmod.read(project.lock_path).models
    assert hub.count() == 0


def test_cli_fetch_model_and_pin_with_a_local_model(hub, make_project):
    project, spec = make_project(repo=None)
    root = Path(spec.model.local_dir)

    missing = run_cli(hub, project, "fetch-model")
    assert missing.returncode == 1
    assert missing.stderr.startswith("error: t: model.repo is null, so the checkpoint is local")
    assert "Traceback" not in missing.stderr

    files = _checkpoint(root)
    done = run_cli(hub, project, "fetch-model")
    assert done.returncode == 0, done.stderr
    assert f"local checkpoint (model.repo is null): nothing downloaded or verified; {len(files)} files" in (
        done.stdout
    )

    pinned = run_cli(hub, project, "pin")
    assert pinned.returncode == 0, pinned.stderr
    assert "t: model skipped — model.repo is null" in pinned.stdout
    assert hub.count() == 0
