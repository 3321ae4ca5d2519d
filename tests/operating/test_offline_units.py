"""up --offline's preflight for an image built from a source tree: with the image gone, the tree's locked
commit and each asset must be in the build cache, else each is named with the command that caches it."""

from __future__ import annotations

from pathlib import Path

import pytest

from rigsmith import spec as specmod
from rigsmith.operating.bundle import offline
from rigsmith.project import Project
from rigsmith.resolving.lock import lock as lockmod
from tests.support.ops import ops_data

TREE = lockmod.LockedSource(
    repo="https://example.invalid/vllm.git",
    ref="v2.5.1",
    commit="28cbb72" + "0" * 33,
    assets={
        "ops.tar.gz": lockmod.LockedAsset(
            url="https://example.invalid/ops.tar.gz", sha256="sha256:" + "ab" * 32, size=3
        )
    },
)


@pytest.fixture
def built(tmp_path: Path) -> tuple[Project, specmod.Deployment]:
    data = ops_data(tmp_path, "src-built")
    data["engine"].pop("image")  # type: ignore[attr-defined]
    data["engine"]["build"] = "vllm-src"  # type: ignore[index]
    project = Project(tmp_path / "project")
    project.root.mkdir()
    with lockmod.locked(project.lock_path) as lk:
        lk.sources["images/vllm-src"] = TREE
    return project, specmod.from_data(data)


def test_an_uncached_tree_and_asset_are_named_with_pin(
    built: tuple[Project, specmod.Deployment], tmp_path: Path
) -> None:
    project, spec = built
    gone = offline._tree_missing(project, spec, {"RIGSMITH_CACHE": str(tmp_path / "empty-cache")})
    assert [m.what.partition(": not in the cache")[0] for m in gone] == [
        f"source tree {TREE.repo} @ 28cbb7200000 (images/vllm-src)",
        f"source asset ops.tar.gz of images/vllm-src ({TREE.assets['ops.tar.gz'].url})",
    ]
    assert all(m.fix.startswith("`invoke pin --deployment src-built`") for m in gone)


def test_a_cached_asset_is_not_named(built: tuple[Project, specmod.Deployment], tmp_path: Path) -> None:
    project, spec = built
    cache = tmp_path / "cache"
    asset = cache / "assets" / "sha256" / ("ab" * 32)
    asset.parent.mkdir(parents=True)
    asset.write_bytes(b"abc")
    gone = offline._tree_missing(project, spec, {"RIGSMITH_CACHE": str(cache)})
    assert [m.what.split(" ")[1] for m in gone] == ["tree"]


def test_an_image_from_the_registry_has_no_tree_to_check(tmp_path: Path) -> None:
    project = Project(tmp_path)
    spec = specmod.from_data(ops_data(tmp_path, "pulled"))
    assert offline._tree_missing(project, spec, {"RIGSMITH_CACHE": str(tmp_path / "c")}) == []


def test_the_hint_says_what_each_known_host_is_and_what_carries_the_rest() -> None:
    hint = offline.why_reached(
        ["cdn-lfs.hf.co:443", "stats.vllm.ai:443/udp", "evil-huggingface.co.example:443", "x.y (DNS lookup)"],
        "d",
    )
    assert hint.count("it reached ") == 2
    assert "the Hugging Face Hub: set HF_HUB_OFFLINE=1" in hint and "VLLM_NO_USAGE_STATS=1" in hint
    assert hint.endswith(
        "`invoke bundle --deployment d --out DIR` carries the model, the secondary models and the image"
    )
    assert offline.why_reached(["203.0.113.9:8080"], "d").startswith("`invoke bundle")
