"""The deployment spec: validation with field paths, round trip, schema, seed deployments."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from rigsmith import spec as specmod
from rigsmith import yamldoc
from rigsmith.errors import SpecError
from tests.support.common import REPO

SEEDS = sorted((REPO / "deployments").glob("*.yaml"))


@pytest.mark.parametrize("path", SEEDS, ids=lambda p: p.stem)
def test_seed_deployment_round_trips(path: Path) -> None:
    spec = specmod.load(path)
    assert specmod.loads(specmod.dump(spec)) == spec
    # as import-recipe writes it (tests/importing/test_shipped_examples.py regenerates it)
    assert specmod.MODELINE + specmod.dump(spec) == path.read_text(), "shipped file is not in canonical form"


def test_seed_003_carries_the_recipe_completely() -> None:
    s = specmod.load(REPO / "deployments/flash-next-merlin-4x3090.yaml")
    assert s.engine.recipe_executable == "./venv-v2.5/bin/vllm"
    assert s.engine.args[s.engine.model_arg or 0] == "~/models/Flash-Next-Merlin"
    assert s.model.config_patches[0].key == "text_config.ple_embedding_dtype"
    assert s.model.config_patches[0].value == "float8_e4m3fn"
    assert s.readiness.kv_cache_tokens == 924993
    assert s.resources.shm_size == "8g" and s.resources.memlock == "unlimited"
    assert s.resources.stop_grace_seconds == 70 and s.shutdown_timeout == 60
    optin = {e.name for e in s.env if e.opt_in}
    assert optin == {"AUTO_TOPO", "COUNTERS", "HOST"} and not any(e.enabled for e in s.env if e.opt_in)
    assert set(s.placeholders) == {"<repo>", "<vllm tree>"}
    assert s.provenance is not None and len(s.provenance.sha256) == 64


def test_seed_000_prose_flags_as_argv() -> None:
    s = specmod.load(REPO / "deployments/flash-next-int4-3x3090.yaml")
    assert s.model.pinned and s.model.revision == "1703ff595285561b141648609291377d3faf3b64"
    assert s.engine.flag_value("--pipeline-parallel-size") == "3"
    assert s.engine.flag_value("--kv-cache-memory") == "550000000"
    assert json.loads(s.engine.flag_value("--compilation-config") or "") == {
        "cudagraph_mode": "FULL_DECODE_ONLY",
        "cudagraph_capture_sizes": [1, 2, 4],
    }
    assert "--no-enable-prefix-caching" in s.engine.args
    (ple,) = s.mounts
    assert ple.kind == "file" and ple.sparse_size == 102400491520
    assert [b.tokens_per_second for b in s.benchmarks] == [67.4, 73.1]


def _seed_data() -> dict:
    return yaml.safe_load((REPO / "deployments/flash-next-merlin-4x3090.yaml").read_text())


def test_validation_collects_every_problem_with_field_paths() -> None:
    data = _seed_data()
    data["engine"]["argz"] = []
    data["resources"]["shm_size"] = "lots"
    data["resources"]["gpus"]["cdi_devices"] = ["gpu0"]
    data["env"][0]["name"] = "1BAD"
    data["network"] = {"port": 70000}
    with pytest.raises(SpecError) as err:
        specmod.from_data(data, "deployments/x.yaml")
    paths = [p for p, _ in err.value.problems]
    assert paths == [
        "engine.argz",
        "env[0].name",
        "resources.gpus.cdi_devices",
        "resources.shm_size",
        "network.port",
    ]
    text = str(err.value)
    assert text.startswith("deployments/x.yaml: 5 problem(s) in the deployment spec")
    assert "engine.argz: Extra inputs are not permitted (unknown field" in text
    assert "write vendor.com/class=name, e.g. nvidia.com/gpu=0" in text


def test_model_arg_out_of_range_is_named() -> None:
    data = _seed_data()
    data["engine"]["model_arg"] = 999
    with pytest.raises(SpecError, match=r"engine: .*model_arg 999 is outside args"):
        specmod.from_data(data)


def _local_data() -> dict:
    data = _seed_data()
    data["model"] = {"repo": None, "local_dir": "/srv/models/Flash-Next-Merlin", "container_path": "/model"}
    return data


def test_local_model_needs_no_repo_and_round_trips_with_an_explicit_null() -> None:
    data = _local_data()
    del data["model"]["repo"]
    s = specmod.from_data(data)
    assert s.model.repo is None and s.model.local
    text = specmod.dump(s)
    assert "model:\n  repo: null\n  local_dir: /srv/models/Flash-Next-Merlin\n" in text
    assert specmod.loads(text) == s


def test_hub_only_model_fields_on_a_local_model_are_each_named() -> None:
    data = _local_data()
    data["model"] |= {"revision": "main", "allow_patterns": ["*.json"], "ignore_patterns": ["*.bin"]}
    with pytest.raises(SpecError) as err:
        specmod.from_data(data, "deployments/x.yaml")
    assert [p for p, _ in err.value.problems] == [
        "model.revision",
        "model.allow_patterns",
        "model.ignore_patterns",
    ]
    assert "model.revision: needs a Hub repo, but model.repo is null" in str(err.value)
    assert "remove ignore_patterns or set repo to owner/name" in str(err.value)


def test_a_bad_repo_is_not_mistaken_for_a_local_model() -> None:
    data = _seed_data()
    data["model"] |= {"repo": "not a repo", "revision": "main"}
    with pytest.raises(SpecError) as err:
        specmod.from_data(data)
    assert [p for p, _ in err.value.problems] == ["model.repo"]
    assert "or null for a checkpoint already in local_dir" in str(err.value)


def test_spec_is_frozen() -> None:
    s = specmod.from_data(_seed_data())
    with pytest.raises(Exception, match="frozen"):
        s.name = "other"  # type: ignore[misc]


def test_file_name_must_match_spec_name(tmp_path: Path) -> None:
    p = tmp_path / "other.yaml"
    p.write_text((REPO / "deployments/flash-next-merlin-4x3090.yaml").read_text())
    with pytest.raises(SpecError, match=r"name: is 'flash-next-merlin-4x3090' but the file is other\.yaml"):
        specmod.load(p)


def test_yaml_errors_and_non_mapping_are_spec_errors(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="not valid YAML"):
        specmod.loads("a: [1, 2", "x.yaml")
    with pytest.raises(SpecError, match="must be a mapping"):
        specmod.loads("- 1\n- 2\n", "x.yaml")


def test_unfilled_placeholders_are_listed() -> None:
    data = _seed_data()
    data["placeholders"] = {"<repo>": None, "<vllm tree>": "/opt/tree"}
    s = specmod.from_data(data)
    assert s.unfilled_placeholders() == ["<repo>"]
    assert s.fill("<vllm tree>/x") == "/opt/tree/x"


def test_committed_json_schema_is_current() -> None:
    committed = json.loads((REPO / "schema/deployment.schema.json").read_text())
    assert committed == specmod.json_schema(), "run: invoke schema"


@pytest.mark.parametrize(
    ("text", "size"),
    [("8g", 8 * 1024**3), ("512m", 512 * 1024**2), ("1GB", 1024**3), ("102400491520", 102400491520)],
)
def test_parse_size(text: str, size: int) -> None:
    assert specmod.parse_size(text) == size


def test_identifiers_with_a_trailing_newline_are_refused_at_the_spec() -> None:
    data = _seed_data()
    data["env"][0]["name"] = "TREE\n"
    data["resources"]["gpus"]["cdi_devices"][0] = "nvidia.com/gpu=0\n"
    data["resources"]["shm_size"] = "8g\n"
    with pytest.raises(SpecError) as err:
        specmod.from_data(data)
    assert [p for p, _ in err.value.problems] == [
        "env[0].name",
        "resources.gpus.cdi_devices",
        "resources.shm_size",
    ]


def _refuses_depth(_text: str, **_kw: object) -> object:
    raise yaml.YAMLError("while parsing a flow node: nesting depth exceeded (a later PyYAML's own words)")


def _recurses(_text: str, **_kw: object) -> object:
    raise RecursionError("maximum recursion depth exceeded")


DEEP_FLOW = "name: t\nx: " + "[" * 5000 + "]" * 5000 + "\n"
DEEP_BLOCK = "".join("  " * i + "k:\n" for i in range(3000))


@pytest.mark.parametrize(
    "library", [None, _refuses_depth, _recurses], ids=["as-installed", "refuses", "recurses"]
)
@pytest.mark.parametrize("text", [DEEP_FLOW, DEEP_BLOCK], ids=["flow", "block"])
def test_a_deep_spec_is_one_problem_in_rigsmiths_words_whatever_the_yaml_library_does(
    monkeypatch: pytest.MonkeyPatch, library: object, text: str
) -> None:
    if library is not None:
        monkeypatch.setattr(yamldoc.yaml, "load", library)
    with pytest.raises(SpecError) as err:
        specmod.loads(text, "deployments/t.yaml")
    assert err.value.problems == [("(file)", f"is nested more than {yamldoc.MAX_DEPTH} levels deep")]


def test_a_shallow_spec_the_library_refuses_keeps_the_librarys_reason(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(yamldoc.yaml, "load", _refuses_depth)
    with pytest.raises(SpecError) as err:
        specmod.loads("name: t\nx: [1, [2]]\n", "deployments/t.yaml")
    [(field, message)] = err.value.problems
    assert field == "(file)" and message.startswith("not valid YAML: ")
