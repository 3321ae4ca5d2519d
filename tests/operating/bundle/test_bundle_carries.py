"""Issue 29: a bundle carries everything a deployment needs offline — its secondary models (draft, tokenizer,
LoRA), and the source tree and release assets of a source-built image — each verified against the lock
before it is placed, each placed where rigsmith decides (never a member's name joined to a directory)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from rigsmith import spec as specmod
from rigsmith.errors import RigsmithError
from rigsmith.importing import recipe
from rigsmith.operating.bundle import bundle as bundlemod
from rigsmith.operating.bundle import unbundle as unbundlemod
from rigsmith.operating.bundle.manifest import MANIFEST, Io, Manifest
from rigsmith.operating.doctor import drift
from rigsmith.project import Project
from rigsmith.resolving.image import build as buildmod
from rigsmith.resolving.image import sources as sourcesmod
from rigsmith.resolving.lock import lock as lockmod
from rigsmith.resolving.model.secondaryfetch import fetch_models, pin_models
from tests.support.bundle import Source, built_project, invoke, must, offline_project
from tests.support.models import tiny_files
from tests.support.ops import OPS_IMAGE
from tests.support.podman import Podman
from tests.support.sources import OPS, SCALES, asset_server, git, git_daemon, serve_release, source_image

QUIET = Io(echo=lambda _m: None, progress=False)
RECIPE = (
    "vllm serve acme/main --speculative-config "
    '\'{"model": "acme/draft", "num_speculative_tokens": 3, "method": "draft_model"}\' '
    "--tokenizer acme/tok --enable-lora --lora-modules a=acme/lora"
)


def _venv_project(tmp_path: Path) -> tuple[Project, specmod.Deployment]:
    """The recipe's deployment on a venv engine (no image to carry), model dirs under tmp/models."""
    dep = recipe.parse(RECIPE, source="t", sha256="0" * 64)
    model = dep.model.model_copy(update={"local_dir": str(tmp_path / "models" / "main")})
    engine = dep.engine.model_copy(update={"runtime": "venv", "venv": "/opt/venv", "image": None})
    dep = specmod.loads(specmod.dump(dep.model_copy(update={"model": model, "engine": engine})))
    project = Project(tmp_path / "connected")
    project.deployments.mkdir(parents=True)
    project.spec_path(dep.name).write_text(specmod.dump(dep), encoding="utf-8")
    return project, dep


@pytest.fixture
def carried_secondaries(
    hub, client, tmp_path: Path
) -> tuple[Path, specmod.Deployment, dict[str, dict[str, bytes]]]:  # type: ignore[no-untyped-def]
    """Pinned, fetched and bundled with the Hub stand-in; then the connected model dirs are moved away, so
    the same paths on "the offline machine" start empty."""
    project, dep = _venv_project(tmp_path)
    repos = {}
    for repo in ("acme/main", "acme/draft", "acme/tok", "acme/lora"):
        repos[repo] = tiny_files(repo, shards=1, shard_size=1 << 16)
        hub.repo(repo).add_commit(repos[repo])
    pin_models(project, dep, hub=client, echo=lambda _m: None)
    fetch_models(project, dep, hub=client, echo=lambda _m: None)
    bundlemod.bundle(project, dep.name, tmp_path / "bundle", targets=(), io=QUIET)
    (tmp_path / "models").rename(tmp_path / "models.connected")
    return tmp_path / "bundle", dep, repos


def test_secondary_models_travel_and_up_s_drift_check_finds_them_verified(
    carried_secondaries: tuple[Path, specmod.Deployment, dict[str, dict[str, bytes]]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    bundle, dep, repos = carried_secondaries
    members = Manifest.model_validate_json((bundle / MANIFEST).read_bytes()).members
    assert {m.split("/", 3)[1] + "/" + m.split("/", 3)[2] for m in members if m.startswith("secondary/")} == {
        "acme/draft", "acme/tok", "acme/lora"
    }  # fmt: skip
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing answers: offline is offline
    offline = offline_project(tmp_path)

    report = unbundlemod.unbundle(offline, bundle, io=QUIET)

    assert "acme/draft: " in report.fetch_summary and "0 downloaded" in report.fetch_summary
    models = tmp_path / "models"
    for repo, name in (("acme/draft", "draft"), ("acme/lora", "lora")):
        for path, data in repos[repo].items():
            assert (models / name / path).read_bytes() == data
    assert not list((models / "tok").glob("*.safetensors"))  # a tokenizer repo: tokenizer files only
    lock = lockmod.read(offline.lock_path)
    assert set(lock.secondary[dep.name]) == {"acme/draft", "acme/tok", "acme/lora"}
    placed = offline.load(dep.name)
    # up's drift gate from the verified-file records (no hashing), then doctor's full hashes: all present.
    for verify in (False, True):
        facts = drift.model_facts(placed, lock, verify=verify)
        assert facts.problems == () and facts.unpinned == () and facts.note is None, facts
        drift.gate(dep.name, facts, None)
    # fetch-model afterwards makes no request: every file of every model is vouched for by its record.
    again = fetch_models(offline, placed, hub=unbundlemod.no_hub, echo=lambda _m: None)
    for r in (again, *(sub for _repo, sub in again.secondary)):
        assert (r.downloaded, r.hashed_files, r.cached) == ([], 0, r.files)


def test_a_tampered_secondary_model_file_is_refused_before_anything_is_placed(
    carried_secondaries: tuple[Path, specmod.Deployment, dict[str, dict[str, bytes]]], tmp_path: Path
) -> None:
    bundle, _dep, repos = carried_secondaries
    weights = next(p for p in repos["acme/lora"] if p.endswith(".safetensors"))
    member = bundle / "secondary" / "acme" / "lora" / weights
    data = bytearray(member.read_bytes())
    data[100] ^= 0xFF
    member.unlink()  # a hard link to the connected file: write a new one
    member.write_bytes(bytes(data))
    offline = offline_project(tmp_path)

    with pytest.raises(RigsmithError) as err:
        unbundlemod.unbundle(offline, bundle, io=QUIET)

    text = str(err.value)
    assert f"secondary/acme/lora/{weights}" in text, text
    assert hashlib.sha256(repos["acme/lora"][weights]).hexdigest() in text
    assert not (tmp_path / "models").exists() and not offline.lock_path.exists()
    assert list(offline.deployments.iterdir()) == []


def test_a_source_built_image_travels_with_its_tree_and_assets_and_renders_offline(
    source: Source, podman: Podman, offline_podman: Podman, tmp_path: Path
) -> None:
    """`invoke build` reads the locked commit from the source cache and the assets from the asset cache: on
    the offline machine both come from the bundle, verified, with the git and asset servers gone."""
    project = built_project(source, tmp_path / "built-project", "merlin")
    cache = tmp_path / "connected-cache"
    with git_daemon(tmp_path / "git") as upstream, asset_server() as assets:
        source_image(project.root, "127.0.0.1:5000/tinybase:1", upstream.url, "v2.5.1", serve_release(assets),
                     digest="sha256:" + "1" * 64)  # fmt: skip
        src = sourcesmod.Sources(cache)
        try:
            sourcesmod.pin_sources(project, src, sourcesmod.check_filled(project), echo=lambda _m: None)
        finally:
            src.close()
        commit = git("rev-parse", "v2.5.1^{commit}", cwd=upstream.work)
    connected = buildmod.prepare(project, "merlin", sourcesmod.Sources(cache))[1]
    image_id = "sha256:" + podman.inspect(OPS_IMAGE)["Id"].removeprefix("sha256:")  # type: ignore[union-attr]
    podman.run("tag", OPS_IMAGE, f"localhost/rigsmith/merlin:{connected.inputs_sha256[7:23]}")
    lock = lockmod.read(source.project.lock_path)
    lock.sources = lockmod.read(project.lock_path).sources
    lock.builds["merlin"] = lockmod.LockedBuild(
        ref="localhost/rigsmith/merlin", image_id=image_id, base=connected.base,
        inputs_sha256=connected.inputs_sha256,
    )  # fmt: skip
    project.lock_path.write_text(lockmod.dumps(lock))

    must(invoke(project, podman, "bundle", "--out", str(tmp_path / "b"), RIGSMITH_CACHE=str(cache)))
    members = Manifest.model_validate_json((tmp_path / "b" / MANIFEST).read_bytes()).members
    assert f"sources/merlin/{commit}.bundle" in members
    assert sum(m.startswith("sources/merlin/assets/") for m in members) == 2

    offline, fresh = offline_project(tmp_path), tmp_path / "offline-cache"
    out = must(invoke(offline, offline_podman, "unbundle", str(tmp_path / "b"), "--into", str(tmp_path / "m"),
                      RIGSMITH_CACHE=str(fresh)))  # fmt: skip
    assert "loaded" in out, out
    cached = sourcesmod.Sources(fresh)
    assert cached.has_commit(upstream.url, commit)
    # The offline build context: the same inputs as on the connected machine, nothing fetched.
    offline_ctx = buildmod.prepare(offline, "merlin", cached)[1]
    assert offline_ctx.inputs_sha256 == connected.inputs_sha256
    assert {f"tree/{SCALES}", f"tree/{OPS}"} <= set(offline_ctx.files)
    assert lockmod.read(offline.lock_path).sources["merlin"].commit == commit

    # A tree member swapped for another commit's git bundle (manifest re-hashed to match) is refused before
    # anything is placed: git checks the objects, rigsmith checks the locked commit is among them.
    elsewhere, other = tmp_path / "elsewhere", tmp_path / "other.bundle"
    elsewhere.mkdir()
    git("init", "-q", cwd=elsewhere)
    (elsewhere / "README.md").write_text("not the locked tree\n")
    git("add", "-A", cwd=elsewhere)
    git("commit", "-q", "-m", "unrelated", cwd=elsewhere)
    git("update-ref", f"refs/rigsmith/{commit}", "HEAD", cwd=elsewhere)  # the locked name, another commit
    git("bundle", "create", "-q", str(other), f"refs/rigsmith/{commit}", cwd=elsewhere)
    swapped = tmp_path / "swapped"
    shutil.copytree(tmp_path / "b", swapped, ignore=shutil.ignore_patterns(".rigsmith"))
    member = f"sources/merlin/{commit}.bundle"
    shutil.copyfile(other, swapped / member)
    manifest = json.loads((swapped / MANIFEST).read_text())
    manifest["members"][member] = {
        "size": other.stat().st_size,
        "sha256": hashlib.sha256(other.read_bytes()).hexdigest(),
    }
    (swapped / MANIFEST).write_text(json.dumps(manifest))
    third = Project(tmp_path / "third")
    third.deployments.mkdir(parents=True)
    proc = invoke(third, offline_podman, "unbundle", str(swapped), "--into", str(tmp_path / "m3"),
                  RIGSMITH_CACHE=str(tmp_path / "third-cache"))  # fmt: skip
    assert proc.returncode == 1 and member in proc.stderr and "locked commit" in proc.stderr, proc.stderr
    assert list(third.deployments.iterdir()) == [] and not (tmp_path / "m3").exists()
