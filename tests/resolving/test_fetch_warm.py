"""A warm `invoke fetch-model` re-run: zero requests, no network library loaded, no mark; the verified-file
record vouches for each file only while it looks as it did when hashed (size, mtime, ctime, inode, device),
so any change — a file removed, rewritten (even under the same size and mtime) or touched, a partial
download appearing, the spec, ``--dest`` — is seen."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rigsmith import spec as specmod
from rigsmith.resolving.model.verified import read_state
from tests.support.models import REPO, cli_env, overwrite_in_place, tiny_files

#: What a warm run must not load: the Hub client and everything under it, the byte-moving code, the
#: progress display.
HEAVY = (
    *("huggingface_hub", "httpx", "httpx2", "hf_xet", "rich", "tenacity", "http.client"),
    *("rigsmith.resolving.model.hub", "ctypes"),
)
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
    """A run that changes nothing: no request, nothing heavy loaded, every file verified earlier."""
    hub.reset()
    said, heavy = _fetch(hub, project)
    assert heavy == [] and hub.count() == 0
    assert said.endswith("0 downloaded (0.0 MiB); 0 hashed; 7 verified earlier"), said
    return said


@pytest.fixture
def fetched(hub, make_project):
    sha = hub.repo("acme/warm").add_commit(tiny_files("acme/warm", shards=2, shard_size=64 << 10))
    project, spec = make_project(repo="acme/warm", revision=sha, config_patches=PATCH)
    said, _ = _fetch(hub, project)
    assert "0 downloaded" not in said
    return project, Path(spec.model.local_dir)


def test_a_warm_rerun_makes_no_request_loads_no_network_library_and_leaves_no_mark(hub, fetched):
    project, root = fetched
    record = (root / ".rigsmith" / "state.json").read_bytes()
    _warm(hub, project)
    assert not (project.root / ".rigsmith" / "fetched").exists()
    assert (root / ".rigsmith" / "state.json").read_bytes() == record


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
    assert "1 hashed" in said and "0 downloaded" in said and not heavy


def test_bytes_changed_under_the_same_size_and_mtime_are_not_vouched_for(hub, fetched):
    """The record holds ctime, inode and device too: a rewrite that puts size and mtime back is still seen,
    hashed, found wrong and downloaded again."""
    project, root = fetched
    readme = root / "README.md"
    good = readme.read_bytes()
    overwrite_in_place(readme, 0, good.upper())
    said, _heavy = _fetch(hub, project)
    assert "1 downloaded" in said and "1 hashed" in said, said
    assert readme.read_bytes() == good
    _warm(hub, project)


def test_a_file_replaced_by_another_inode_is_hashed_again(hub, fetched):
    """Same bytes, same size and mtime, another inode (a copy moved over it): hashed, kept, recorded anew."""
    project, root = fetched
    readme = root / "README.md"
    st = readme.stat()
    copy = root / "README.copy"
    copy.write_bytes(readme.read_bytes())
    os.utime(copy, ns=(st.st_atime_ns, st.st_mtime_ns))
    copy.replace(readme)
    said, _heavy = _fetch(hub, project)
    assert "0 downloaded" in said and "1 hashed" in said, said
    assert read_state(root / ".rigsmith" / "state.json").files["README.md"].ino == readme.stat().st_ino
    _warm(hub, project)


def test_a_stale_partial_download_is_removed(hub, fetched):
    project, root = fetched
    _warm(hub, project)
    (root / ".rigsmith" / "partial" / ("0" * 64 + ".incomplete")).write_bytes(b"x")
    said, heavy = _fetch(hub, project)
    assert "1 stale partial(s) removed" in said and not heavy


def test_a_changed_spec_or_dest_is_followed(hub, fetched, tmp_path):
    project, _root = fetched
    path = project.spec_path("t")
    data = specmod.to_data(specmod.load(path))
    data["model"]["ignore_patterns"] = ["README.md"]
    path.write_text(specmod.dump(specmod.from_data(data)), encoding="utf-8")
    said, _heavy = _fetch(hub, project)
    assert said.startswith("6 files at")
    said, heavy = _fetch(hub, project, "--dest", str(tmp_path / "elsewhere"))
    assert "6 downloaded" in said and heavy


def test_verify_always_hashes(hub, fetched):
    project, _root = fetched
    hub.reset()
    said, _heavy = _fetch(hub, project, "--verify")
    assert said.endswith("0 verified earlier") and "8 hashed" in said, said
    assert hub.count() == 0
