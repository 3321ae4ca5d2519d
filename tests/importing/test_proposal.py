"""import-recipe proposes the engine image a recipe's notes build (seed 003: a git clone + release assets)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from rigsmith import spec as specmod
from rigsmith.errors import ConsentError, RecipeError
from rigsmith.importing import importer
from rigsmith.project import Project
from rigsmith.resolving.image import imagedef
from tests.support.common import GOLDEN, REPO, compare_tree

RECIPE = REPO / "examples/recipes/qwen3-8-flash-next-w4a16-merlin-on-4x-rtx-3090-tp2xpp2-ep-mtp3-f.json"


def _project(tmp_path: Path) -> Project:
    (tmp_path / "deployments").mkdir(parents=True)
    return Project(tmp_path)


def _recipe(tmp_path: Path, notes: str) -> str:
    data = json.loads(RECIPE.read_text())
    data["notes"] = notes
    path = tmp_path / "recipe.json"
    path.write_text(json.dumps(data))
    return str(path)


def _import(project: Project, source: str, **kw: object) -> specmod.Deployment:
    lines: list[str] = []
    return importer.import_recipe(project, source, name="merlin", echo=lines.append, **kw)  # type: ignore[arg-type]


def test_seed_003_notes_become_a_source_image_linked_as_engine_build(tmp_path: Path) -> None:
    project = _project(tmp_path)
    dep = _import(project, str(RECIPE))
    assert dep.engine.build == "merlin" and dep.engine.image is None
    d = imagedef.load(project.images, "merlin")
    assert d.tree is not None
    assert (d.tree.repo, d.tree.ref, d.tree.commit) == (None, "v2.5.1", "28cbb72")
    assert (d.tree.dest, d.tree.install, d.tree.pythonpath) == ("/opt/src", "pythonpath", "vllm-v2.5")
    assert [(a.name, a.url, a.unpack) for a in d.tree.assets] == [
        ("source-bundle", None, "."),
        ("compiled-ops", None, "."),
    ]
    assert d.tree.unfilled() == [
        ("tree.repo", "is empty; write the git URL of the source repository"),
        ("tree.assets[0].url", "asset 'source-bundle' has no URL; write its download URL"),
        ("tree.assets[1].url", "asset 'compiled-ops' has no URL; write its download URL"),
    ]
    # The placeholders point into the image's tree (the user's to change; deploy checks they reach it).
    assert dep.placeholders == {"<repo>": "/opt/src", "<vllm tree>": "/opt/src/vllm-v2.5"}
    assert specmod.load(project.spec_path("merlin")).engine.build == "merlin"


def test_the_proposed_image_file_matches_golden(
    tmp_path: Path, update_golden: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = _project(tmp_path)
    monkeypatch.chdir(REPO)  # the header names the recipe as given: a path relative to the checkout
    _import(
        project, "examples/recipes/" + RECIPE.name, source_repo="https://git.example.com/halt95/merlin.git"
    )
    text = (project.images / "merlin" / "image.yaml").read_text()
    compare_tree({"image.yaml": text}, GOLDEN / "recipes" / "proposed" / "seed-003", update_golden)


def test_source_repo_flag_fills_the_repo_and_names_the_tree_dir(tmp_path: Path) -> None:
    project = _project(tmp_path)
    dep = _import(project, str(RECIPE), source_repo="https://git.example.com/halt95/merlin.git")
    d = imagedef.load(project.images, "merlin")
    assert d.tree is not None and d.tree.repo == "https://git.example.com/halt95/merlin.git"
    assert d.tree.dest == "/opt/merlin" and dep.engine.build == "merlin"


def test_a_re_import_puts_the_tree_where_the_user_pointed_repo_and_leaves_a_user_image_alone(
    tmp_path: Path,
) -> None:
    project = _project(tmp_path)
    _import(project, str(RECIPE))
    spec = project.spec_path("merlin")
    data = yaml.safe_load(spec.read_text())
    data["placeholders"] = {"<repo>": "/srv/merlin", "<vllm tree>": "/srv/merlin/vllm-v2.5"}
    spec.write_text(yaml.safe_dump(data, sort_keys=False))
    _import(project, str(RECIPE), yes=True)
    d = imagedef.load(project.images, "merlin")
    assert d.tree is not None and d.tree.dest == "/srv/merlin"
    data = yaml.safe_load(spec.read_text())
    del data["engine"]["build"]
    data["engine"]["image"] = "localhost/mine:1"
    spec.write_text(yaml.safe_dump(data, sort_keys=False))
    before = (project.images / "merlin" / "image.yaml").read_text()
    dep = _import(project, str(RECIPE), yes=True)
    assert dep.engine.image == "localhost/mine:1" and dep.engine.build is None
    assert (project.images / "merlin" / "image.yaml").read_text() == before


def test_a_changed_image_file_is_not_overwritten_without_consent(tmp_path: Path) -> None:
    project = _project(tmp_path)
    home = project.images / "merlin"
    home.mkdir(parents=True)
    mine = "version: 1\nbase: {name: mine/vllm, tag: '1'}\n"
    (home / "image.yaml").write_text(mine)
    with pytest.raises(ConsentError, match=r"would change existing file\(s\): images/merlin/image.yaml"):
        _import(project, str(RECIPE))
    assert (home / "image.yaml").read_text() == mine
    assert not project.spec_path("merlin").exists()  # all or nothing
    _import(project, str(RECIPE), yes=True)
    d = imagedef.load(project.images, "merlin")
    assert d.base.name == "mine/vllm" and d.tree is not None  # the user's base kept, the tree proposed


def test_a_re_import_keeps_what_the_user_filled_in_the_image_file(tmp_path: Path) -> None:
    project = _project(tmp_path)
    _import(project, str(RECIPE))
    path = project.images / "merlin" / "image.yaml"
    data = yaml.safe_load(path.read_text())
    data["tree"]["repo"] = "git://127.0.0.1:9/merlin"
    data["tree"]["assets"][1]["url"] = "https://example.com/ops.tar.gz"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    before = path.read_text()
    _import(project, str(RECIPE))  # no consent needed: nothing of the user's would change
    assert path.read_text() == before


def test_an_image_given_on_the_command_line_proposes_nothing(tmp_path: Path) -> None:
    project = _project(tmp_path)
    dep = _import(project, str(RECIPE), image="localhost/vllm:1")
    assert dep.engine.image == "localhost/vllm:1" and dep.engine.build is None
    assert not project.images.exists()


@pytest.mark.parametrize(
    "notes",
    [
        "git clone --branch ../../etc (repo @ 28cbb72x)",  # no valid ref, no sha
        "pip install vllm==0.9 and run it",  # no clone at all
    ],
)
def test_notes_without_a_usable_clone_propose_nothing(tmp_path: Path, notes: str) -> None:
    project = _project(tmp_path)
    dep = _import(project, _recipe(tmp_path, notes))
    assert dep.engine.build is None and not project.images.exists()


def test_a_url_the_notes_clone_is_taken_but_a_hostile_one_is_refused(tmp_path: Path) -> None:
    project = _project(tmp_path)
    notes = "git clone -b main https://git.example.com/a/merlin.git, then run it"
    _import(project, _recipe(tmp_path, notes))
    d = imagedef.load(project.images, "merlin")
    assert (
        d.tree is not None and d.tree.repo == "https://git.example.com/a/merlin.git" and d.tree.ref == "main"
    )
    with pytest.raises(RecipeError, match="--source-repo: 'ext::sh -c id'"):
        _import(_project(tmp_path / "other"), str(RECIPE), source_repo="ext::sh -c id")
