"""Red team of the vLLM recipes importer and the model placeholder fill (issue 25): hostile values in a
recipe from the internet, each refused as one paragraph naming its field (never a traceback, never a
spec that deploy then refuses), and what imports keeps the site's argv.

Every case here failed before its fix: a traceback, a silently chosen value, or a spec deploy refuses.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rigsmith import spec as specmod
from rigsmith.errors import RecipeError, SpecError, shown
from rigsmith.importing import recipe
from rigsmith.importing.recipe.vllmrecipes.synth import js_str
from rigsmith.project import Project
from rigsmith.rendering import deploy, plan
from tests.rendering.test_hostile_matrix import _fake_run
from tests.support.common import invoke_cli

DATA = Path(__file__).parent / "data" / "vllm-recipes"
BASE: dict[str, Any] = yaml.safe_load((DATA / "Qwen_Qwen3-8B.yaml").read_text())


def _parse(text: str, variant: str | None = "default@h200") -> specmod.Deployment:
    return recipe.parse(text, source="hostile.yaml", sha256="0" * 64, variant=variant)


def _refusal(text: str, variant: str | None = "default@h200") -> str:
    with pytest.raises(RecipeError) as err:
        _parse(text, variant)
    return f"{err.value}\n{err.value.hint or ''}"


def _edited(path: tuple[str, ...], value: Any) -> str:
    data = copy.deepcopy(BASE)
    at = data
    for key in path[:-1]:
        at = at[key]
    at[path[-1]] = value
    return yaml.safe_dump(data)


# -- JSON: a number Python will not turn into text ----------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        '{"hf_id": "a/b", "recommended_command": {"deploy_type": "single_node", "hardware": "h200", '
        '"docker_image": "vllm/vllm-openai:v0.11.0", "argv": ["vllm", "serve", "a/b", "--x", '
        + "9" * 5000
        + "]}}",
        '{"command": "vllm serve a/b", "size": ' + "9" * 5000 + "}",
    ],
    ids=["api", "recipe-json"],
)
def test_a_json_integer_too_long_for_python_is_one_paragraph(text: str) -> None:
    message = _refusal(text, None)
    assert "is not valid JSON" in message and "4300 digits" in message


# -- YAML: duplicate and non-text keys ----------------------------------------------------------------


def test_a_duplicate_key_is_refused_naming_its_line_not_last_one_wins() -> None:
    """PyYAML keeps the last of two equal keys; a reviewer reads the first. The compose spec and YAML say
    a key is unique."""
    text = (DATA / "Qwen_Qwen3-8B.yaml").read_text()
    hidden = text.replace(
        "variants:\n  default:\n", "variants:\n  default:\n    extra_args: ['--enforce-eager']\n  default:\n"
    )
    assert hidden != text
    message = _refusal(hidden)
    assert "line 46, column 3: found duplicate key 'default'" in message
    assert "the first 'default' is at line 44, column 3" in message


@pytest.mark.parametrize(
    ("path", "value", "said"),
    [
        (("model", "base_env"), {None: "x"}, "model.base_env: the key None is not text"),
        (("variants",), {1: {"precision": "bf16"}}, "variants: the key 1 is not text"),
        (("model", "base_env"), {True: "x"}, "model.base_env: the key True is not text"),
    ],
)
def test_a_key_that_is_not_text_is_refused_by_its_path(path: tuple[str, ...], value: Any, said: str) -> None:
    assert said in _refusal(_edited(path, value), None)


# -- numbers ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("field", ["vram_minimum_gb", "tp"])
def test_nan_and_infinity_are_not_numbers_of_a_recipe(field: str, value: float) -> None:
    message = _refusal(_edited(("variants", "default", field), value))
    assert f"variants.default.{field}: must be a finite number" in message


@pytest.mark.parametrize(
    ("value", "js"),
    [
        (1e-7, "1e-7"),
        (0.00001, "0.00001"),
        (0.000001, "0.000001"),
        (1.5e16, "15000000000000000"),
        (1e21, "1e+21"),
        (1.5e21, "1.5e+21"),
        (123.456, "123.456"),
        (-0.5, "-0.5"),
        (1.7976931348623157e308, "1.7976931348623157e+308"),
        (5e-324, "5e-324"),
        (-1e-7, "-1e-7"),
        (float("nan"), "NaN"),
        (float("inf"), "Infinity"),
        (float("-inf"), "-Infinity"),
        (True, "true"),
        (10**30, "1e+30"),
        (2**53 + 1, "9007199254740992"),
        (10**400, "Infinity"),
        (12, "12"),
    ],
)
def test_numbers_become_the_words_javascript_writes(value: Any, js: str) -> None:
    """The site builds argv and env with JavaScript's String(value) of a YAML value, every number a
    double (node printed each of these; 5,260 random and edge doubles matched node when this was written)."""
    assert js_str(value) == js


def test_a_small_float_argument_is_the_sites_word() -> None:
    dep = _parse(_edited(("variants", "default", "extra_args"), ["--x", 1.0e-07]))
    assert dep.engine.args[1:3] == ("--x", "1e-7")


# -- the model id and the image -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "model_id", ["-oFoo/x", "--help/x", "a b/c", "../../etc", "a/..", "a/b\n", "org/<x>"]
)
@pytest.mark.parametrize("where", [("model", "model_id"), ("variants", "default", "model_id")])
def test_a_model_id_that_is_not_a_hub_repo_id_is_refused_naming_the_field(
    where: tuple[str, ...], model_id: str
) -> None:
    message = _refusal(_edited(where, model_id))
    assert f"{'.'.join(where)}: {model_id!r} is not a Hugging Face repo id" in message


@pytest.mark.parametrize(
    "image", ["--privileged", "-v /:/host", "not a ref", "x;id", "a\nb", "UPPER/Case:1", "x@sha256:zz"]
)
def test_an_image_that_is_not_a_reference_is_refused_at_import(image: str) -> None:
    """deploy refuses it (plan), so import must not write a spec with it: the same check, at import."""
    message = _refusal(_edited(("model", "docker_image"), image))
    assert f"engine.image: image reference {image!r}" in message


def test_an_image_given_by_the_docker_run_form_is_checked_the_same_way() -> None:
    message = _refusal("docker run --gpus all --privileged=false 'Vllm/X' --model org/m\n", None)
    assert "engine.image: image reference 'Vllm/X'" in message


def test_a_hostile_recipe_that_imports_renders() -> None:
    """Shell metacharacters, newlines, '--' and quotes in argv and env import as words every target can
    render (deploy's checks find nothing to refuse)."""
    words = ["--x", "a;rm -rf /", "--y", "$(id)`id`", "--z", "'\"", "--", "-"]
    data = copy.deepcopy(BASE)
    data["variants"]["default"]["extra_args"] = words
    data["model"]["base_env"] = {"OK": "a b;c", "N": 7}
    dep = _parse(yaml.safe_dump(data))
    assert list(dep.engine.args[1 : 1 + len(words)]) == words
    assert plan.problems(dep) == []


# -- the model placeholder filled with a directory ----------------------------------------------------


def _placeholder_spec(value: str) -> dict[str, Any]:
    seed = Project(Path(__file__).parents[2]).load("flash-next-merlin-4x3090")
    data = seed.model_dump(mode="json")
    data["model"] = {**data["model"], "repo": "<MODEL>", "revision": None, "allow_patterns": []}
    data["model"]["ignore_patterns"] = []
    data["placeholders"] = {**data["placeholders"], "<MODEL>": value}
    return data


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("/", "the root directory"),
        ("//", "the root directory"),
        ("/etc", "inside /etc, a system directory"),
        ("/srv/../etc", "inside /etc, a system directory"),
        ("~/", "is your home directory"),
        ("~/../alice/m", "climbs out of your home directory"),
        ("~/.ssh", "hidden directory .ssh"),
        ("/srv", "the shared directory /srv"),
        ("/home/alice", "home directory of a user"),
        ("/srv/m\n", "control character"),
        ("/srv/m\r", "control character"),
    ],
)
def test_a_model_placeholder_filled_with_a_dangerous_directory_is_refused_naming_the_placeholder(
    value: str, said: str
) -> None:
    with pytest.raises(SpecError) as err:
        specmod.from_data(_placeholder_spec(value))
    text = str(err.value)
    assert "placeholders['<MODEL>']" in text and said in text


@pytest.mark.parametrize("value", ["a../b..", "a--b/c", "a/b--c", "a/b.git", "a/b.", "-a/b", "a/" + "b" * 97])
def test_a_model_placeholder_filled_with_what_the_hub_refuses_as_a_repo_id_is_refused(value: str) -> None:
    with pytest.raises(SpecError) as err:
        specmod.from_data(_placeholder_spec(value))
    assert "placeholders['<MODEL>']" in str(err.value)


@pytest.mark.parametrize("value", ["Qwen/Qwen3-8B", "/srv/models/qwen", "~/models/qwen", "/data/m/"])
def test_a_model_placeholder_filled_well_still_imports(value: str) -> None:
    spec = specmod.from_data(_placeholder_spec(value))
    assert spec.unfilled_placeholders() == []
    assert [f for f, _ in plan.problems(spec)] == []


# -- property: what imports renders, and bash reads back the site's argv -------------------------------

#: Shell metacharacters, quotes, line breaks of every kind, '--' tricks, YAML look-alikes, unicode.
_HOSTILE = (
    st.lists(
        st.sampled_from(
            [
                *"aZ09 -_=/.:,;|&$`'\"\\(){}[]*?!#~%^@+\t\n\r\x0b\x0c\x85\u2028\u2029\u202e模",
                *("yes", "on", "~", "null", "1e5", "0o17", "$(touch PWNED)", "--", "-x"),
            ]
        ),
        min_size=1,
        max_size=8,
    )
    .map(lambda w: "".join(w))
    .map(lambda s: s if not s.startswith("-") else "v" + s)
)


class _QuotedDumper(yaml.SafeDumper):
    """Every string double-quoted, with escapes: a recipe as a YAML 1.2 writer means it (PyYAML's own
    dumper leaves ``1e5`` plain, a number to YAML 1.2, and writes a raw U+0085 its reader folds)."""


_QuotedDumper.add_representer(str, lambda d, v: d.represent_scalar("tag:yaml.org,2002:str", v, style='"'))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=st.lists(_HOSTILE, min_size=1, max_size=4), env=_HOSTILE)
def test_a_recipe_with_hostile_words_imports_to_a_run_sh_bash_reads_back_as_the_sites_argv(
    tmp_path_factory: pytest.TempPathFactory, values: list[str], env: str
) -> None:
    """The site's argv for the variant is base args, the variant's extra_args, the strategy's parallel
    size, then the features; whatever words the recipe holds, run.sh hands podman exactly that argv (the
    model word mapped to the mount, the recipe's id kept as the served name) and the env value unchanged,
    and nothing runs on the host."""
    data = copy.deepcopy(BASE)
    extra = [w for i, v in enumerate(values) for w in (f"--rt-flag-{i}", v)]
    data["variants"]["default"]["extra_args"] = extra
    data["model"]["base_env"] = {"RT_VAR": env}
    dep = _parse(yaml.dump(data, Dumper=_QuotedDumper))
    site = [*extra, "--tensor-parallel-size", "1", "--reasoning-parser", "qwen3"]
    site += ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
    assert list(dep.engine.args) == ["Qwen/Qwen3-8B", *site]
    assert {e.name: e.value for e in dep.env} == {"RT_VAR": env}
    base = tmp_path_factory.mktemp("run")
    project = Project(base)
    project.spec_path(dep.name).parent.mkdir()
    project.spec_path(dep.name).write_text(specmod.dump(dep), encoding="utf-8")
    home = base / "home"  # what ~/ means for this render; run.sh's preflight needs the model dir there
    assert dep.model.local_dir.startswith("~/")
    (home / dep.model.local_dir.removeprefix("~/")).mkdir(parents=True)
    _plan, files = deploy.artifacts(project, "podman", deployment=dep.name, home=str(home))
    [run] = [a for a in files if a.path.name == "run.sh"]
    (base / "sh/cdi").mkdir(parents=True)
    (base / "sh/cdi/nvidia.yaml").write_text(
        'kind: "nvidia.com/gpu"\n' + "".join(f'name: "{n}"\n' for n in range(8))
    )
    argv = _fake_run(run.content, base / "sh")
    assert dep.engine.image is not None
    tail = argv[argv.index(dep.engine.image) + 1 :]
    assert tail == ["serve", dep.model.container_path, *site, "--served-model-name", "Qwen/Qwen3-8B"]
    assert f"RT_VAR={env}" in argv


def test_plain_scalars_are_read_as_the_sites_yaml_reader_reads_them() -> None:
    """js-yaml (the recipes site's reader, YAML 1.2 core schema: lib/type/{bool,int,float}.js) keeps
    ``yes``/``on``/``12:30`` as text and reads ``1e5``, ``0o17``, ``017``, ``0b11`` as numbers; PyYAML's
    YAML 1.1 reads each of them another way (True, '1e5', 15, 750…), which changed the argv."""
    text = (DATA / "Qwen_Qwen3-8B.yaml").read_text()
    values = ["yes", "on", "1e5", "0o17", "017", "12:30", "0b11", "1.0e+3", "True"]
    extra = ", ".join(f"--rt-{i}, {v}" for i, v in enumerate(values))
    text = text.replace("    precision: bf16\n", f"    precision: bf16\n    extra_args: [{extra}]\n", 1)
    dep = _parse(text)
    words = ["yes", "on", "100000", "15", "17", "12:30", "3", "1000", "true"]
    want = [w for i, v in enumerate(words) for w in (f"--rt-{i}", v)]
    assert list(dep.engine.args[1 : 1 + len(want)]) == want


@pytest.mark.parametrize("asked", ["default@", "@h200", "default\n@h200", "\x00", "default@h200@x"])
def test_a_variant_flag_that_names_nothing_offered_is_refused_naming_the_flag(asked: str) -> None:
    """``default@`` named no hardware and imported the site's default profile as if nothing were asked.
    What the flag says is quoted as the terminal will show it (``errors.shown``: a line break escaped)."""
    assert f"--variant {shown(asked)}:" in _refusal((DATA / "Qwen_Qwen3-8B.yaml").read_text(), asked)


_API_RENDERING = {
    "deploy_type": "single_node",
    "hardware": "h200",
    "docker_image": "vllm/vllm-openai:v0.11.0",
    "argv": ["vllm", "serve", "a/b", "--tensor-parallel-size", "1"],
}


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
@pytest.mark.parametrize("form", ["api", "recipe-json"])
def test_nan_and_infinity_literals_are_not_json(form: str, literal: str) -> None:
    """Python's json reads them; JSON (and the site's JSON.parse) does not: the argv held 'NaN'."""
    if form == "api":
        text = json.dumps({"hf_id": "a/b", "recommended_command": _API_RENDERING}).replace(
            '"1"]', literal + "]"
        )
    else:
        text = '{"command": "vllm serve a/b", "gpus": ' + literal + "}"
    assert f"is not valid JSON: {literal} is not a JSON value" in _refusal(text, None)


@pytest.mark.parametrize("hf_id", ["../../x", ["x"], "a/b c", 5])
def test_a_json_api_hf_id_that_is_not_a_repo_id_is_refused_naming_it(hf_id: Any) -> None:
    text = json.dumps({"hf_id": hf_id, "recommended_command": _API_RENDERING})
    assert f"hf_id: {hf_id!r} is not a Hugging Face repo id" in _refusal(text, None)


_HOSTILE_FILES = {
    "dup-key.yaml": (DATA / "Qwen_Qwen3-8B.yaml")
    .read_text()
    .replace("variants:\n  default:\n", "variants:\n  default:\n    tp: 1\n  default:\n"),
    "privileged.yaml": _edited(("model", "docker_image"), "--privileged"),
    "nan.json": json.dumps({"hf_id": "a/b", "recommended_command": _API_RENDERING}).replace('"1"]', "NaN]"),
    "none-key.yaml": _edited(("model", "base_env"), {None: "x"}),
}


@pytest.mark.parametrize("name", sorted(_HOSTILE_FILES))
def test_import_recipe_cli_refuses_a_hostile_recipe_in_one_paragraph_and_writes_nothing(
    tmp_path: Path, name: str
) -> None:
    src = tmp_path / name
    src.write_text(_HOSTILE_FILES[name])
    (tmp_path / "deployments").mkdir()
    variant = [] if name.endswith(".json") else ["--variant", "default@h200"]
    proc = invoke_cli(tmp_path, "import-recipe", str(src), *variant, "--yes")
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith("error: ") and "hint: " in proc.stderr, proc.stderr
    assert list((tmp_path / "deployments").iterdir()) == []


def test_next_names_the_placeholder_filled_with_a_system_directory(tmp_path: Path) -> None:
    """The model placeholder filled with /etc: every command that loads the spec says where it was
    written (placeholders), with the model-dir rule's reason, never a traceback."""
    src = tmp_path / "serve.sh"
    src.write_text("vllm serve $MODEL --tensor-parallel-size 2\n")
    (tmp_path / "deployments").mkdir()
    done = invoke_cli(tmp_path, "import-recipe", str(src), "--name", "v", "--image", "localhost/vllm:1")
    assert done.returncode == 0, done.stderr
    path = tmp_path / "deployments" / "v.yaml"
    path.write_text(path.read_text().replace("<MODEL>: null", "<MODEL>: /etc"))
    for argv in (["next", "--deployment", "v"], ["deploy", "--target", "podman", "--deployment", "v"]):
        proc = invoke_cli(tmp_path, *argv)
        assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
        assert "placeholders['<MODEL>']: '/etc' is the model's directory" in proc.stderr
        assert "inside /etc, a system directory" in proc.stderr
    assert not (tmp_path / "podman").exists()


_HEAD = "meta: {}\nmodel:\n  model_id: a/b\n"
_BOMB = "".join(
    f"{k}: &{k} [{', '.join([f'*{p}'] * 9) if p else ', '.join('x' * 9)}]\n"
    for p, k in zip(["", "a", "b", "c", "d", "e"], "abcdef", strict=True)
)


@pytest.mark.parametrize(
    ("text", "said"),
    [
        (_HEAD + _BOMB + "variants:\n  default: {extra_args: *f}\n", "an alias bomb?"),
        (_HEAD + "variants:\n  default: " + "[" * 5000 + "]" * 5000 + "\n", "nested more than 64 levels"),
        (_HEAD + "variants:\n  default: &x {extra_args: [*x]}\n", "contains itself"),
    ],
    ids=["alias-bomb", "deep", "self-reference"],
)
def test_a_recipe_yaml_that_is_no_plain_tree_is_refused_at_once(text: str, said: str) -> None:
    """The YAML 1.2 reader keeps the limits every YAML document has (yamldoc.tree_problem)."""
    assert said in _refusal(text)
