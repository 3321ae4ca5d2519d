"""Seed 003: the recipe JSON imports from a file and from an http URL into the shipped spec."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
import yaml

from rigsmith import spec as specmod
from rigsmith.errors import AdapterError, RecipeError, SpecError
from rigsmith.importing import importer, recipe
from rigsmith.importing.importer import HttpOptions
from rigsmith.importing.proposal import mark_script_switches
from rigsmith.project import Project
from rigsmith.rendering.plan import make
from rigsmith.resolving.lock.lock import Lock
from rigsmith.spec import Mount
from tests.support.common import REPO
from tests.support.recipes import SEED_RECIPE, RecipeServer

SHIPPED = REPO / "deployments" / "flash-next-merlin-4x3090.yaml"
NAME = "flash-next-merlin-4x3090"
SEED_BYTES = SEED_RECIPE.read_bytes()


def _without_user_fields(dep: specmod.Deployment) -> dict[str, Any]:
    """Spec data minus what a user fills in after import (image, placeholder values, mounts) and
    provenance.source (the shipped spec was imported from the site's URL); engine.build is the image
    import proposes from the notes, which the shipped spec replaced with its own image."""
    data = specmod.to_data(dep)
    data["engine"].pop("image", None)
    data["engine"].pop("build", None)
    data.pop("mounts", None)
    data["placeholders"] = dict.fromkeys(data.get("placeholders", {}))
    data["provenance"].pop("source")
    return data


def _quiet(_: str) -> None:
    pass


def test_seed_recipe_file_import_equals_shipped_spec_except_user_filled_fields(
    empty_project: Project,
) -> None:
    dep = importer.import_recipe(empty_project, str(SEED_RECIPE), name=NAME, echo=_quiet)
    shipped = specmod.load(SHIPPED)
    assert _without_user_fields(dep) == _without_user_fields(shipped)
    # and exactly those fields differ
    assert shipped.engine.image is not None and dep.engine.image is None
    assert dep.engine.build == NAME and (empty_project.images / NAME / "image.yaml").is_file()
    # the proposed image holds the tree: the placeholders are set to its place there (the user may change)
    assert dep.placeholders == {"<repo>": "/opt/src", "<vllm tree>": "/opt/src/vllm-v2.5"}
    assert shipped.placeholders == {"<repo>": "/opt/merlin", "<vllm tree>": "/opt/merlin/vllm-v2.5"}
    # the compile cache the env puts into the image's tree is kept on the host (else cold at every start)
    cache = Mount(
        host=f"~/models/rigsmith-cache/{NAME}/vllm_cache_root",
        container="/opt/src/.vllm-cache-v2.5",
        note="VLLM_CACHE_ROOT: kept on the host (in the image it would start empty in every new container)",
    )
    assert dep.mounts == (cache,) and shipped.mounts != ()
    assert dep.provenance is not None and dep.provenance.source == str(SEED_RECIPE)
    assert dep.provenance.sha256 == hashlib.sha256(SEED_BYTES).hexdigest() == shipped.provenance.sha256  # type: ignore[union-attr]
    # the file on disk is the spec, and it loads back to the same thing
    assert specmod.load(empty_project.spec_path(NAME)) == dep


def test_seed_recipe_http_import_equals_file_import(
    empty_project: Project, recipe_server: RecipeServer
) -> None:
    url = recipe_server.route("/api/v1/recipes/seed003.json", (200, SEED_BYTES))
    dep = importer.import_recipe(empty_project, url, name=NAME, echo=_quiet)
    from_file = mark_script_switches(  # the importer marks the serve script's own switches
        recipe.parse(
            SEED_BYTES.decode(),
            source=str(SEED_RECIPE),
            sha256=hashlib.sha256(SEED_BYTES).hexdigest(),
            name=NAME,
        )
    )
    assert dep.provenance is not None and dep.provenance.source == url
    assert _without_user_fields(dep) == _without_user_fields(from_file)
    proposed = from_file.engine.model_copy(update={"build": NAME})  # the image proposed from the notes
    in_image = {"<repo>": "/opt/src", "<vllm tree>": "/opt/src/vllm-v2.5"}  # the tree's place in it
    assert dep.model_copy(update={"provenance": from_file.provenance}) == from_file.model_copy(
        update={"engine": proposed, "placeholders": in_image, "mounts": dep.mounts}
    )
    assert [m.container for m in dep.mounts] == ["/opt/src/.vllm-cache-v2.5"]


def test_seed_import_keeps_the_argv_byte_for_byte() -> None:
    import json
    import shlex

    command = json.loads(SEED_BYTES)["command"]
    dep = recipe.parse(SEED_BYTES.decode(), source="seed", sha256="0" * 64)
    assert [dep.engine.recipe_executable, *dep.engine.subcommand, *dep.engine.args] == shlex.split(command)
    assert dep.engine.model_arg == 0 and dep.engine.args[0] == "~/models/Flash-Next-Merlin"
    assert dep.model.container_path == "/models/Flash-Next-Merlin"


def test_env_string_grammar() -> None:
    env, notes, problems = recipe.parse_env_text(
        "A=1 B=<x y>/z | C=2 (needed — really) | D=3 E=4 (two vars, so a note). "
        "Opt-in: F=1 turns on f; G=0.0.0.0 then set KEY."
    )
    assert problems == []
    assert [(e.name, e.value, e.note, e.opt_in, e.enabled) for e in env] == [
        ("A", "1", None, False, True),
        ("B", "<x y>/z", None, False, True),
        ("C", "2", "needed — really", False, True),
        ("D", "3", None, False, True),
        ("E", "4", None, False, True),
        ("F", "1", "turns on f", True, False),
        ("G", "0.0.0.0", "then set KEY", True, False),
    ]
    assert notes == ["two vars, so a note"]


def test_env_string_garbage_is_refused_naming_the_segment() -> None:
    _, _, problems = recipe.parse_env_text("A=1 | not an assignment | B=2")
    assert problems == [
        "env segment 2 ('not an assignment'): cannot read 'not an assignment'; write NAME=value"
    ]


def test_note_facts_from_seed_notes() -> None:
    import json

    facts = recipe.note_facts(json.loads(SEED_BYTES)["notes"])
    assert (facts.repo, facts.local_dir, facts.size_bytes) == (
        "halt95/Qwen3.8-Flash-Next-W4A16-Merlin",
        "~/models/Flash-Next-Merlin",
        115 * 2**30,
    )
    assert (facts.gpu_count, facts.gpu_model, facts.gpu_arch, facts.p2p, facts.nvlink) == (
        4,
        "RTX 3090",
        "sm_86",
        "recommended",
        False,
    )
    assert (facts.host_ram_gib, facts.disk_gib) == (96.0, 250.0)
    assert (facts.shm_size, facts.memlock, facts.stop_grace) == ("8g", "unlimited", 70)
    assert facts.log_lines == ["Application startup complete", "GPU KV cache size: 924,993 tokens"]
    assert (facts.kv_tokens, facts.startup, facts.warm) == (924993, 360, 180)
    assert [(p.file, p.key, p.value, p.note) for p in facts.patches] == [
        ("config.json", "text_config.ple_embedding_dtype", "float8_e4m3fn", "present in HF since 2026-09-18")
    ]


def test_deploy_refuses_an_empty_placeholder_then_the_unbuilt_image(
    empty_project: Project,
) -> None:
    dep = importer.import_recipe(empty_project, str(SEED_RECIPE), name=NAME, echo=_quiet)
    emptied = dep.model_copy(update={"placeholders": {"<repo>": None, "<vllm tree>": None}})
    with pytest.raises(SpecError) as err:
        make(emptied, Lock(), spec_path=f"deployments/{NAME}.yaml")
    assert "'<repo>' has no value" in str(err.value) and "'<vllm tree>' has no value" in str(err.value)
    # as imported, the placeholders point into the proposed image; the image (engine.build) is not built yet
    with pytest.raises(Exception) as err2:
        make(dep, Lock(), spec_path=f"deployments/{NAME}.yaml")
    assert f"runs image build {NAME!r}, which has no entry in rigsmith.lock" in str(err2.value)
    assert "--image REF" in str(err2.value)
    filled = dep.model_copy(update={"placeholders": {"<repo>": "/opt/m", "<vllm tree>": "/opt/m/v"}})
    # an image rigsmith cannot see into provides none of the paths the env names through <repo>
    with pytest.raises(SpecError) as err3:
        make(filled, Lock(), spec_path=f"deployments/{NAME}.yaml", image="localhost/vllm:1").check_env_paths()
    assert [p for p, _ in err3.value.problems] == [
        "env.VLLM_QSA_KV_SCALES",
        "env.VLLM_CACHE_ROOT",
        "env.PYTHONPATH",
    ]
    assert "(required — without it FP8 KV runs at scale 1.0)" in str(err3.value)
    mounted = filled.model_copy(update={"mounts": (Mount(host="/srv/m", container="/opt/m"),)})
    plan = make(mounted, Lock(), spec_path=f"deployments/{NAME}.yaml", image="localhost/vllm:1")
    assert plan.command[:2] == ("serve", "/models/Flash-Next-Merlin")
    assert {(p.name, p.provider, p.by) for p in plan.env_paths} == {
        ("VLLM_QSA_KV_SCALES", "mount", "/opt/m"),
        ("VLLM_CACHE_ROOT", "mount", "/opt/m"),
        ("PYTHONPATH", "mount", "/opt/m"),
    }


def test_image_flag_sets_the_engine_image(empty_project: Project) -> None:
    dep = importer.import_recipe(
        empty_project, str(SEED_RECIPE), name=NAME, image="localhost/vllm-merlin:v2.5.1", echo=_quiet
    )
    assert dep.engine.image == "localhost/vllm-merlin:v2.5.1"


def test_default_name_is_the_recipe_id_cut_short_at_a_word(empty_project: Project, tmp_path: Path) -> None:
    said: list[str] = []
    dep = importer.import_recipe(empty_project, str(SEED_RECIPE), echo=said.append)
    assert dep.name == "qwen3-8-flash-next-w4a16-merlin"  # typed and repeated in every hint: short
    assert empty_project.spec_path(dep.name).is_file()
    # the same source again merges into its own file; another recipe under the same short name does not
    again = importer.import_recipe(empty_project, str(SEED_RECIPE), echo=said.append)
    assert again.name == dep.name
    other = tmp_path / "elsewhere.json"
    other.write_bytes(SEED_BYTES)
    second = importer.import_recipe(empty_project, str(other), echo=said.append)
    assert second.name == "qwen3-8-flash-next-w4a16-merlin-2"
    assert specmod.load(empty_project.spec_path(dep.name)).provenance.source == str(SEED_RECIPE)  # type: ignore[union-attr]
    assert any("holds another recipe's deployment: importing as qwen3-8-flash-next-w4a16-merlin-2" in s
               for s in said)  # fmt: skip


def test_slug_cuts_at_a_word_boundary() -> None:
    assert recipe.slug("a" * 40) == "a" * 32
    assert recipe.slug("Qwen3.8-Flash Next INT4 (mixed) AutoRound") == "qwen3.8-flash-next-int4-mixed"
    assert recipe.slug("---") == "recipe"


@pytest.mark.parametrize("bad", ["Bad Name", "-x", "a" * 64])
def test_bad_name_is_refused(empty_project: Project, bad: str) -> None:
    with pytest.raises(RecipeError, match="--name"):
        importer.import_recipe(empty_project, str(SEED_RECIPE), name=bad, echo=_quiet)
    assert list(empty_project.deployments.iterdir()) == []


def test_http_404_is_not_retried(recipe_server: RecipeServer, empty_project: Project) -> None:
    url = recipe_server.route("/gone.json", (404, b"no"))
    with pytest.raises(AdapterError, match="HTTP 404"):
        importer.import_recipe(empty_project, url, echo=_quiet, http=HttpOptions(wait_max=0.0))
    assert recipe_server.routes["/gone.json"].hits == 1


def test_http_503_then_200_is_retried(recipe_server: RecipeServer, empty_project: Project) -> None:
    url = recipe_server.route("/flaky.json", (503, b"busy"), (429, b"slow down"), (200, SEED_BYTES))
    dep = importer.import_recipe(empty_project, url, name=NAME, echo=_quiet, http=HttpOptions(wait_max=0.0))
    assert recipe_server.routes["/flaky.json"].hits == 3
    assert dep.provenance is not None and dep.provenance.sha256 == hashlib.sha256(SEED_BYTES).hexdigest()


def test_http_5xx_gives_up_after_the_attempts(recipe_server: RecipeServer, empty_project: Project) -> None:
    url = recipe_server.route("/down.json", (500, b"down"))
    with pytest.raises(AdapterError, match="HTTP 500 after 3 attempt"):
        importer.import_recipe(empty_project, url, echo=_quiet, http=HttpOptions(attempts=3, wait_max=0.0))
    assert recipe_server.routes["/down.json"].hits == 3
    assert list(empty_project.deployments.iterdir()) == []


def test_oversize_recipe_is_refused_streamed_and_declared(recipe_server: RecipeServer) -> None:
    big = b"x" * (importer.MAX_BYTES + 1)
    url = recipe_server.route("/big.json", (200, big))
    with pytest.raises(RecipeError, match="larger than 1048576 bytes"):
        importer.fetch_url(url, HttpOptions(wait_max=0.0))
    # a body without a declared length is counted while streaming and cut off
    url2 = recipe_server.route("/nolength.json", (200, b"x" * 300), declare_length=-1)
    with pytest.raises(RecipeError, match="it sent more"):
        importer.fetch_url(url2, HttpOptions(max_bytes=250, wait_max=0.0))
    assert recipe_server.routes["/nolength.json"].hits == 1


def test_timeout_is_retried_then_reported(recipe_server: RecipeServer) -> None:
    url = recipe_server.route("/slow.json", (200, SEED_BYTES), delay=1.5)
    with pytest.raises(AdapterError, match="timed out after 2 attempt"):
        importer.fetch_url(url, HttpOptions(timeout=0.3, attempts=2, wait_max=0.0))
    assert recipe_server.routes["/slow.json"].hits == 2


def test_connection_refused_is_retried_then_reported() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(AdapterError, match="after 2 attempt"):
        importer.fetch_url(f"http://127.0.0.1:{port}/x.json", HttpOptions(attempts=2, wait_max=0.0))


@pytest.mark.parametrize(
    ("source", "fragment"),
    [
        ("http://[::1", "not a valid URL"),
        ("http://", "UnsupportedProtocol"),
        ("ftp://127.0.0.1/x.json", "unsupported scheme 'ftp'"),
        ("/nonexistent/recipe.json", "no such file"),
        ("/", "not a file"),
    ],
)
def test_bad_sources_are_clear_errors(empty_project: Project, source: str, fragment: str) -> None:
    with pytest.raises((RecipeError, AdapterError)) as err:
        importer.import_recipe(empty_project, source, echo=_quiet, http=HttpOptions(attempts=1, wait_max=0.0))
    assert fragment in str(err.value)


def test_non_utf8_recipe_is_refused(empty_project: Project, tmp_path: Path) -> None:
    src = tmp_path / "latin1.txt"
    src.write_bytes("vllm serve org/m --served-model-name caf\xe9".encode("latin-1"))
    with pytest.raises(RecipeError, match="not UTF-8 text"):
        importer.import_recipe(empty_project, str(src), echo=_quiet)


def test_the_shipped_engine_image_is_what_import_proposes_for_the_shipped_placeholders(
    empty_project: Project,
) -> None:
    # The main job ships images/NAME/image.yaml beside its spec (the built route; issue 27): the image an
    # import proposes once <repo> points where the shipped spec puts the tree (a re-import with --yes
    # re-derives it from the filled placeholders), the repository and asset URLs left to fill.
    importer.import_recipe(empty_project, str(SEED_RECIPE), name=NAME, echo=_quiet)
    path = empty_project.spec_path(NAME)
    data = specmod.to_data(specmod.load(path))
    data["placeholders"] = dict(specmod.load(SHIPPED).placeholders)
    path.write_text(specmod.dump(specmod.from_data(data)))
    importer.import_recipe(empty_project, str(SEED_RECIPE), name=NAME, yes=True, echo=_quiet)
    proposed = yaml.safe_load((empty_project.images / NAME / "image.yaml").read_text())
    shipped = yaml.safe_load((REPO / "images" / NAME / "image.yaml").read_text())
    assert proposed == shipped
    assert shipped["tree"]["repo"] is None and shipped["tree"]["dest"] == "/opt/merlin"
