"""A warm `invoke fetch-model` re-run answers from stat calls (no spec models, no Hub client, no request),
and the full fetch runs again whenever anything it followed from changed: a file removed, rewritten or
touched, a partial download appearing, the spec, the lock, ``--dest``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rigsmith import spec as specmod
from rigsmith.resolving import lock as lockmod
from tests.support.models import REPO, cli_env, tiny_files

#: What the warm path must not load (the full fetch loads all of them).
HEAVY = ("pydantic", "huggingface_hub", "httpx", "filelock", "rigsmith.spec", "rigsmith.resolving.modelfetch")
PATCH = [{"key": "text_config.ple_embedding_dtype", "value": "float8_e4m3fn"}]


def _fetch(hub, project, *args: str) -> tuple[str, list[str]]:
    """`invoke fetch-model ARGS` in a fresh interpreter: what it printed, and the heavy modules it loaded."""
    code = (
        "import json, sys\nfrom invoke.main import program\n"
        f"program.run(['invoke', '-r', {str(REPO)!r}, 'fetch-model', *{list(args)!r}], exit=False)\n"
        "print('MODULES', json.dumps(sorted(sys.modules)))\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", code], env=cli_env(hub, project), capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0, res.stderr
    *said, mods = res.stdout.splitlines()
    loaded = json.loads(mods.removeprefix("MODULES "))
    return "\n".join(said), [m for m in loaded if any(m == h or m.startswith(h + ".") for h in HEAVY)]


def _warm(hub, project) -> str:
    """A run that changes nothing (full, or already from the mark), then one answered from its mark."""
    full, _ = _fetch(hub, project)
    hub.reset()
    fast, heavy = _fetch(hub, project)
    assert (fast, heavy) == (full.splitlines()[-1], [])
    assert hub.count() == 0
    return fast


@pytest.fixture
def fetched(hub, make_project):
    sha = hub.repo("acme/warm").add_commit(tiny_files("acme/warm", shards=2, shard_size=64 << 10))
    project, spec = make_project(repo="acme/warm", revision=sha, config_patches=PATCH)
    said, _ = _fetch(hub, project)
    assert "0 downloaded" not in said
    return project, Path(spec.model.local_dir)


def test_a_warm_rerun_loads_no_spec_models_and_no_network_library(hub, fetched):
    project, _root = fetched
    said = _warm(hub, project)
    assert said.endswith("0 downloaded (0.0 MiB); 0 hashed; 7 verified earlier")
    assert (project.root / ".rigsmith" / "fetched" / "t.json").is_file()


def test_a_changed_file_is_downloaded_again(hub, fetched):
    project, root = fetched
    _warm(hub, project)
    shard = next(root.glob("model-00001-*.safetensors"))
    shard.write_bytes(b"not the weights")
    said, heavy = _fetch(hub, project)
    assert "1 downloaded" in said and heavy
    _warm(hub, project)
    (root / "README.md").unlink()
    said, heavy = _fetch(hub, project)
    assert "1 downloaded" in said and (root / "README.md").is_file()


def test_a_touched_file_is_hashed_again(hub, fetched):
    project, root = fetched
    _warm(hub, project)
    os.utime(root / "README.md", ns=(1, 1))
    said, heavy = _fetch(hub, project)
    assert "1 hashed" in said and heavy


def test_bytes_changed_under_the_same_size_and_mtime_are_not_vouched_for(hub, fetched):
    # The verified-state cache trusts size and mtime; the mark also compares ctime and inode, so the
    # full fetch decides (and says what its cache says).
    project, root = fetched
    _warm(hub, project)
    readme = root / "README.md"
    st = readme.stat()
    readme.write_bytes(readme.read_bytes().upper())
    os.utime(readme, ns=(st.st_atime_ns, st.st_mtime_ns))
    _said, heavy = _fetch(hub, project)
    assert heavy


def test_a_stale_partial_download_is_removed(hub, fetched):
    project, root = fetched
    _warm(hub, project)
    (root / ".rigsmith" / "partial" / ("0" * 64 + ".incomplete")).write_bytes(b"x")
    said, heavy = _fetch(hub, project)
    assert "1 stale partial(s) removed" in said and heavy


def test_a_changed_spec_or_lock_or_dest_runs_the_full_fetch(hub, fetched, tmp_path):
    project, _root = fetched
    _warm(hub, project)
    path = project.spec_path("t")
    data = specmod.to_data(specmod.load(path))
    data["model"]["ignore_patterns"] = ["README.md"]
    path.write_text(specmod.dump(specmod.from_data(data)), encoding="utf-8")
    said, heavy = _fetch(hub, project)
    assert said.startswith("6 files at") and heavy

    _warm(hub, project)
    lock = lockmod.read(project.lock_path)
    lock.models.pop("t")
    project.lock_path.write_text(lockmod.dumps(lock), encoding="utf-8")
    hub.reset()
    said, heavy = _fetch(hub, project)
    assert hub.count() > 0 and heavy  # pinned again: the lock lost the commit

    _warm(hub, project)
    said, heavy = _fetch(hub, project, "--dest", str(tmp_path / "elsewhere"))
    assert "6 downloaded" in said and heavy


def test_verify_always_hashes(hub, fetched):
    project, _root = fetched
    _warm(hub, project)
    said, heavy = _fetch(hub, project, "--verify")
    assert said.endswith("0 verified earlier") and heavy
    assert not (project.root / ".rigsmith" / "fetched" / "t.json").exists()
