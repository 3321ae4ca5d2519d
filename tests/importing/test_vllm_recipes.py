"""vLLM recipes' structured YAML (vllm-project/recipes ``models/<org>/<repo>.yaml``) imports as the command
the recipes site and its JSON API synthesise for the chosen variant and hardware profile.

The YAMLs under data/vllm-recipes/ are verbatim copies of the recipes at vllm-project/recipes commit
8959cf64189c71d36e11c6a30335f923f261b1f7 (Apache-2.0; see data/vllm-recipes/README.md for their URLs).
Every expectation in data/vllm-recipes/expected.json was copied from the JSON API that commit's own
``node scripts/build-recipes-api.mjs`` wrote (its ``src/lib/command-synthesis.js``): each entry names the
API file (``public/<hf_id>/hw/<hardware>.json``) its argv, env, image and strategy come from.
"""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rigsmith import spec as specmod
from rigsmith.errors import ConsentError, RecipeError
from rigsmith.importing import importer, recipe
from rigsmith.project import Project
from tests.support.common import invoke_cli
from tests.support.recipes import RecipeServer

DATA = Path(__file__).parent / "data" / "vllm-recipes"
EXPECTED: list[dict[str, Any]] = json.loads((DATA / "expected.json").read_text())["renderings"]


def _parse(name: str, variant: str | None, text: str | None = None) -> specmod.Deployment:
    body = (DATA / name).read_text() if text is None else text
    return recipe.parse(body, source=name, sha256=hashlib.sha256(body.encode()).hexdigest(), variant=variant)


def _argv(dep: specmod.Deployment) -> list[str]:
    return [dep.engine.executable, *dep.engine.subcommand, *dep.engine.args]


def _env(dep: specmod.Deployment) -> dict[str, str]:
    return {e.name: e.value for e in dep.env}


def _refusal(name: str, variant: str | None, text: str | None = None) -> str:
    with pytest.raises(RecipeError) as err:
        _parse(name, variant, text)
    return f"{err.value}\n{err.value.hint or ''}"


@pytest.mark.parametrize(
    "case", EXPECTED, ids=[f"{c['file'][:-5]}-{c['variant']}@{c['hardware']}" for c in EXPECTED]
)
def test_variant_at_hardware_imports_the_json_apis_command(case: dict[str, Any]) -> None:
    dep = _parse(case["file"], f"{case['variant']}@{case['hardware']}")
    assert _argv(dep) == [str(a) for a in case["argv"]], case["api"]
    assert _env(dep) == {k: str(v) for k, v in case["env"].items()}, case["api"]
    assert dep.engine.image == case["docker_image"], case["api"]
    assert f"as {case['strategy']};" in dep.notes[0]
    tp = dep.engine.args[dep.engine.args.index("--tensor-parallel-size") + 1]
    assert dep.resources.gpus.count == int(tp)


@pytest.mark.parametrize("case", [c for c in EXPECTED if c["recommended"]], ids=lambda c: c["api"])
def test_variant_alone_imports_the_recommended_command_on_the_sites_default_hardware(
    case: dict[str, Any],
) -> None:
    """``recommended_command`` of /<hf_id>.json: the hardware the site opens on for that variant."""
    dep = _parse(case["file"], case["variant"])
    assert _argv(dep) == [str(a) for a in case["argv"]]
    assert _env(dep) == {k: str(v) for k, v in case["env"].items()}
    assert f"hardware profile {case['hardware']} " in dep.notes[0]


def test_a_recipe_with_one_variant_needs_no_variant_flag() -> None:
    dep = _parse("Qwen_Qwen3-8B.yaml", None)
    assert dep.model.repo == "Qwen/Qwen3-8B"
    assert dep.model.revision is None  # the recipe YAML pins no revision: `pin` resolves one
    assert dep.name == "qwen-qwen3-8b"
    assert dep.provenance is not None and dep.provenance.recipe_id == "Qwen/Qwen3-8B"
    notes = "\n".join(dep.notes)
    assert "not imported: the recipe's guide" in notes
    assert "the recipe needs vLLM >= " in notes


def test_several_variants_and_no_variant_flag_is_refused_listing_them() -> None:
    message = _refusal("meta-llama_Llama-3.1-8B-Instruct.yaml", None)
    assert "5 variants (default, w8a8_int8, awq_int4, nvfp4, nvidia_fp8)" in message
    assert "--variant NAME" in message


def test_opt_in_features_stay_off_and_are_listed_in_the_notes() -> None:
    data = yaml.safe_load((DATA / "Qwen_Qwen3.8-27B.yaml").read_text())
    opt_in = data["opt_in_features"]
    dep = _parse("Qwen_Qwen3.8-27B.yaml", "default@h200")
    notes = "\n".join(dep.notes)
    for key in opt_in:
        assert f"opt-in feature {key} not enabled" in notes
    assert "--speculative-config" not in dep.engine.args


@pytest.mark.parametrize(
    ("variant", "said"),
    [
        (
            "fp8",
            "the recipe has no variant 'fp8' (variants: default, w8a8_int8, awq_int4, nvfp4, nvidia_fp8)",
        ),
        ("default@rtx_3090", "'rtx_3090' is not a recipes-site hardware profile"),
        ("nvfp4@h200", "does not offer h200 for this variant: its precision needs NVIDIA blackwell GPUs"),
        ("default@rtx_5090", "rtx_5090 is a restricted profile the recipe does not declare in meta.hardware"),
    ],
)
def test_a_variant_or_hardware_the_recipe_does_not_offer_is_refused_by_name(variant: str, said: str) -> None:
    assert said in _refusal("meta-llama_Llama-3.1-8B-Instruct.yaml", variant)


def test_unknown_fields_are_refused_by_their_path() -> None:
    text = (DATA / "Qwen_Qwen3-8B.yaml").read_text()
    data = yaml.safe_load(text)
    data["variants"]["default"]["extra_arg"] = ["--enforce-eager"]
    data["servers"] = 2
    data["hardware_overrides"]["cpu"]["extra_envs"] = {}
    message = _refusal("edited.yaml", None, yaml.safe_dump(data))
    assert "variants.default.extra_arg: not a field of a vLLM recipe's variant" in message
    assert "servers: not a field of a vLLM recipe's top level" in message
    assert "hardware_overrides.cpu.extra_envs: not a field of a vLLM recipe's hardware override" in message


def test_a_recipe_the_site_serves_on_several_nodes_there_is_refused() -> None:
    data = yaml.safe_load((DATA / "Qwen_Qwen3-8B.yaml").read_text())
    data["variants"]["default"]["vram_minimum_gb"] = 2000  # more than one H200 node: the site goes multi-node
    message = _refusal("edited.yaml", "default@h200", yaml.safe_dump(data))
    assert "serves it as multi_node_tp" in message


def test_a_variant_too_big_for_a_workstation_profile_is_refused_naming_the_one_that_fits() -> None:
    message = _refusal("Qwen_Qwen3.8-27B.yaml", "default@rtx_5090")
    assert "variant default needs 67 GB and rtx_5090 has 32 GB" in message
    assert "import --variant nvfp4@rtx_5090" in message


def test_a_non_gpu_hardware_profile_is_refused() -> None:
    assert "rigsmith deploys on NVIDIA or AMD GPUs" in _refusal("Qwen_Qwen3-8B.yaml", "default@xeon6")


def test_variant_flag_on_another_form_is_refused() -> None:
    assert "--variant fp8 picks a variant of a vLLM recipes YAML" in _refusal(
        "cmd.sh", "fp8", "vllm serve Qwen/Qwen3-8B --tensor-parallel-size 1\n"
    )


def test_import_recipe_cli_writes_the_variant_and_refuses_without_one(tmp_path: Path) -> None:
    src = tmp_path / "Llama-3.1-8B-Instruct.yaml"
    src.write_bytes((DATA / "meta-llama_Llama-3.1-8B-Instruct.yaml").read_bytes())
    (tmp_path / "deployments").mkdir()
    refused = invoke_cli(tmp_path, "import-recipe", str(src))
    assert refused.returncode != 0
    assert "Traceback" not in refused.stderr
    assert (
        "--variant NAME (one of default, w8a8_int8, awq_int4, nvfp4, nvidia_fp8)"
        in refused.stderr + refused.stdout
    )
    assert list((tmp_path / "deployments").iterdir()) == []
    done = invoke_cli(tmp_path, "import-recipe", str(src), "--variant", "nvidia_fp8@mi300x", "--yes")
    assert done.returncode == 0, done.stderr
    [case] = [c for c in EXPECTED if c["variant"] == "nvidia_fp8" and c["hardware"] == "mi300x"]
    [written] = (tmp_path / "deployments").glob("*.yaml")
    dep = specmod.load(written)
    assert _argv(dep) == case["argv"]
    assert dep.engine.image == case["docker_image"]
    assert dep.resources.gpus.cdi_devices[0].startswith("amd.com/gpu=")
    assert dep.provenance is not None
    assert dep.provenance.sha256 == hashlib.sha256(src.read_bytes()).hexdigest()


def _paths(data: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if isinstance(data, dict):
        return [at, *(p for k, v in data.items() if k != "guide" for p in _paths(v, (*at, k)))]
    if isinstance(data, list):
        return [at, *(p for i, v in enumerate(data) for p in _paths(v, (*at, i)))]
    return [at]


_RECIPES = {f.name: yaml.safe_load(f.read_text()) for f in sorted(DATA.glob("*.yaml"))}
_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 10_000),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
    st.lists(
        st.one_of(st.text(max_size=6), st.integers(), st.dictionaries(st.text(max_size=3), st.integers())),
        max_size=3,
    ),
    st.dictionaries(
        st.text(max_size=6), st.one_of(st.text(max_size=6), st.integers(), st.none()), max_size=3
    ),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_any_value_anywhere_in_a_recipe_is_imported_or_refused_never_a_traceback(data: st.DataObject) -> None:
    """One field of a real recipe replaced by a value of any JSON type: a Deployment or one RecipeError."""
    name = data.draw(st.sampled_from(sorted(_RECIPES)))
    recipe_data = copy.deepcopy(_RECIPES[name])
    path = data.draw(st.sampled_from([p for p in _paths(recipe_data) if p]))
    at = recipe_data
    for key in path[:-1]:
        at = at[key]
    at[path[-1]] = data.draw(_VALUES)
    variant = data.draw(
        st.sampled_from([None, "default", "default@h200", "fp8@b200", "nvfp4", "default@mi300x"])
    )
    text = yaml.safe_dump(recipe_data)
    try:
        dep = recipe.parse(text, source=name, sha256="0" * 64, variant=variant)
    except RecipeError as err:
        assert "Traceback" not in str(err)
    else:
        assert dep.engine.executable == "vllm"


def test_a_recipe_url_imports_with_the_url_and_the_bytes_hash_as_provenance(
    empty_project: Project, recipe_server: RecipeServer
) -> None:
    """The raw URL of a recipe at a commit (as raw.githubusercontent.com serves it) names file and commit."""
    body = (DATA / "openai_gpt-oss-20b.yaml").read_bytes()
    path = "/vllm-project/recipes/8959cf64189c71d36e11c6a30335f923f261b1f7/models/openai/gpt-oss-20b.yaml"
    url = recipe_server.route(path, (200, body))
    dep = importer.import_recipe(empty_project, url, variant="default@b200", echo=lambda _line: None)
    [case] = [c for c in EXPECTED if c["file"] == "openai_gpt-oss-20b.yaml" and c["hardware"] == "b200"]
    assert _argv(dep) == case["argv"] and _env(dep) == case["env"]
    assert dep.provenance is not None
    assert (dep.provenance.source, dep.provenance.sha256) == (url, hashlib.sha256(body).hexdigest())
    assert specmod.load(empty_project.spec_path(dep.name)) == dep


def test_reimporting_the_same_file_for_other_hardware_updates_the_spec(empty_project: Project) -> None:
    """The same bytes with another --variant are another recipe: never 'unchanged'."""
    src = empty_project.root / "Qwen3.6-27B.yaml"
    src.write_bytes((DATA / "Qwen_Qwen3.6-27B.yaml").read_bytes())
    said: list[str] = []
    first = importer.import_recipe(empty_project, str(src), variant="default@h200", echo=said.append)
    again = importer.import_recipe(empty_project, str(src), variant="default@h200", echo=said.append)
    assert again == first and any("has not changed" in line for line in said)
    said.clear()
    with pytest.raises(ConsentError):  # a change to the spec, asked for (no terminal here): not "unchanged"
        importer.import_recipe(empty_project, str(src), variant="default@mi300x", echo=said.append)
    assert not any("has not changed" in line for line in said)
    other = importer.import_recipe(
        empty_project, str(src), variant="default@mi300x", echo=said.append, yes=True
    )
    [case] = [c for c in EXPECTED if c["file"] == "Qwen_Qwen3.6-27B.yaml" and c["variant"] == "default"
              and c["hardware"] == "mi300x"]  # fmt: skip
    assert other.name == first.name
    assert _argv(specmod.load(empty_project.spec_path(other.name))) == case["argv"]


API = DATA / "api"


@pytest.mark.parametrize(
    ("api", "yaml_file", "variant"),
    [
        ("Qwen_Qwen3-8B.json", "Qwen_Qwen3-8B.yaml", None),
        (
            "meta-llama_Llama-3.1-8B-Instruct_hw_mi300x.json",
            "meta-llama_Llama-3.1-8B-Instruct.yaml",
            "default@mi300x",
        ),
    ],
)
def test_a_json_api_file_imports_as_the_same_command_as_its_yaml(
    api: str, yaml_file: str, variant: str
) -> None:
    """The JSON API's own rendering (argv, env, image as the file gives them) and rigsmith's synthesis from
    the YAML for the same variant and hardware give one spec command."""
    from_api = _parse(f"api/{api}", None)
    from_yaml = _parse(yaml_file, variant)
    assert _argv(from_api) == _argv(from_yaml)
    assert _env(from_api) == _env(from_yaml)
    assert from_api.engine.image == from_yaml.engine.image
    assert from_api.model == from_yaml.model
    assert from_api.resources.gpus == from_yaml.resources.gpus


def test_a_json_api_rendering_for_several_nodes_or_with_variant_is_refused() -> None:
    message = _refusal("api/Qwen_Qwen3-Coder-480B-A35B-Instruct_hw_h200.json", None)
    assert "deploy_type: 'multi_node'; rigsmith imports one node's rendering" in message
    assert "a JSON API file holds the rendering the site chose" in _refusal(
        "api/Qwen_Qwen3-8B.json", "default"
    )


@pytest.mark.parametrize(
    ("name", "variant"),
    [("Qwen_Qwen3-8B.yaml", None), ("meta-llama_Llama-3.1-8B-Instruct.yaml", "nvidia_fp8@mi300x")],
)
def test_an_imported_recipe_renders_the_podman_target_with_the_sites_argv(
    tmp_path: Path, name: str, variant: str | None
) -> None:
    """deploy (no pin needed to render): the container runs the site's argv, the model word mapped to the
    mounted copy and the recipe's name kept as --served-model-name, on the recipe's GPUs."""
    from rigsmith.rendering import deploy

    dep = _parse(name, variant)
    project = Project(tmp_path)
    project.spec_path(dep.name).parent.mkdir()
    project.spec_path(dep.name).write_text(specmod.dump(dep), encoding="utf-8")
    plan, files = deploy.artifacts(project, "podman", deployment=dep.name)
    site = _argv(dep)[2:]
    want = (*dep.engine.subcommand, dep.model.container_path, *site[1:], "--served-model-name", site[0])
    assert plan.command == want
    assert plan.devices == dep.resources.gpus.cdi_devices
    assert files


def test_an_omni_recipe_is_refused_as_what_it_is() -> None:
    data = yaml.safe_load((DATA / "Qwen_Qwen3-8B.yaml").read_text())
    data["meta"]["tasks"] = ["omni"]
    message = _refusal("edited.yaml", None, yaml.safe_dump(data))
    assert "meta.tasks holds omni: this recipe is served by vllm-omni" in message
