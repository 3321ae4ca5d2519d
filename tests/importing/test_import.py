"""import_recipe end to end: consent, identical, dry run, hostile values, refusals (golden), the real CLI."""

from __future__ import annotations

import contextlib
import json
import shlex
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rigsmith import spec as specmod
from rigsmith.errors import ConsentError, RecipeError, RigsmithError
from rigsmith.importing import importer, recipe
from rigsmith.importing.recipe.compose.form import SERVICE_KEYS
from rigsmith.project import Project
from tests.support.common import GOLDEN, REPO, compare_tree
from tests.support.recipes import SEED_RECIPE, corpus, task_cli
from tests.support.recipes import import_cli as _cli

NAME = "merlin"


class Echo:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def __call__(self, msg: str) -> None:
        self.lines.append(str(msg))

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


def _recipe_file(tmp_path: Path, **fields: object) -> Path:
    data = json.loads(SEED_RECIPE.read_text(encoding="utf-8"))
    data.update(fields)
    p = tmp_path / "recipe.json"
    p.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    return p


# -- consent -----------------------------------------------------------------------------------------


def test_same_recipe_again_is_identical(empty_project: Project) -> None:
    importer.import_recipe(empty_project, str(SEED_RECIPE), name=NAME, echo=Echo())
    echo = Echo()
    importer.import_recipe(empty_project, str(SEED_RECIPE), name=NAME, echo=echo)
    # The same recipe bytes as the last import and no flag: nothing to do, nothing written (issue 24).
    assert "has not changed since the last import" in echo.text and "nothing written" in echo.text


def _edit_spec(path: Path, edit: object) -> str:
    import yaml

    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    edit(data)  # type: ignore[operator]
    path.write_text(specmod.dump(specmod.from_data(data)), encoding="utf-8")
    return path.read_text(encoding="utf-8")


def _user_edits(data: dict) -> None:  # type: ignore[type-arg]
    """What a user does after the first import of seed 003 (issue 12's journey)."""
    data["placeholders"]["<repo>"] = "/opt/merlin"
    data["placeholders"]["<vllm tree>"] = "/opt/merlin/vllm-v2.5"
    data["engine"].pop("build", None)  # the proposed source image, replaced by the user's own
    data["engine"]["image"] = "localhost/vllm-merlin:mine"
    data["mounts"] = [
        *data.get("mounts", []),
        {"host": "/opt/merlin", "container": "/opt/merlin", "readonly": True},
    ]
    for e in data["env"]:
        if e.get("opt_in"):
            e["enabled"] = True
            break


def _upstream(tmp_path: Path, seqs: str = "16", shm: str = "16g") -> Path:
    data = json.loads(SEED_RECIPE.read_text(encoding="utf-8"))
    data["command"] = data["command"].replace("--max-num-seqs 8", f"--max-num-seqs {seqs}")
    assert f"--max-num-seqs {seqs}" in data["command"]
    data["notes"] = data["notes"].replace("shm_size 8g", f"shm_size {shm}")
    p = tmp_path / "recipe-v2.json"
    p.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    return p


def test_reimport_of_the_same_recipe_keeps_every_user_edit_byte_for_byte(empty_project: Project) -> None:
    importer.import_recipe(empty_project, str(SEED_RECIPE), name=NAME, echo=Echo())
    path = empty_project.spec_path(NAME)
    edited = _edit_spec(path, _user_edits) + "# my note\n"
    path.write_text(edited, encoding="utf-8")
    echo = Echo()
    importer.import_recipe(empty_project, str(SEED_RECIPE), name=NAME, echo=echo, confirm=None)
    # The same recipe bytes as the last import and no flag: nothing to do, nothing written (issue 24).
    assert "has not changed since the last import" in echo.text and "nothing written" in echo.text
    assert path.read_text(encoding="utf-8") == edited


def test_reimport_with_upstream_changes_needs_consent_then_keeps_user_edits(
    empty_project: Project, tmp_path: Path
) -> None:
    importer.import_recipe(empty_project, str(SEED_RECIPE), name=NAME, echo=Echo())
    path = empty_project.spec_path(NAME)
    edited = _edit_spec(path, _user_edits)
    v2 = _upstream(tmp_path)
    echo = Echo()
    with pytest.raises(ConsentError) as err:  # no terminal, no --yes: the diff is shown, nothing written
        importer.import_recipe(empty_project, str(v2), name=NAME, echo=echo, confirm=None)
    assert "nothing was written" in str(err.value) and "--yes" in str(err.value)
    assert "-  - '8'\n+  - '16'" in echo.text
    assert "-  <repo>: /opt/merlin" not in echo.text  # the user's values are not reverted by the diff
    assert path.read_text(encoding="utf-8") == edited
    importer.import_recipe(empty_project, str(v2), name=NAME, echo=Echo(), yes=True)
    dep = specmod.load(path)
    assert dep.engine.args[dep.engine.args.index("--max-num-seqs") + 1] == "16"
    assert dep.resources.shm_size == "16g"
    assert dep.placeholders["<repo>"] == "/opt/merlin" and dep.engine.image == "localhost/vllm-merlin:mine"
    assert any(m.container == "/opt/merlin" for m in dep.mounts)
    assert any(e.opt_in and e.enabled for e in dep.env)


def test_reimport_conflict_is_named_and_nothing_written_until_a_side_is_chosen(
    empty_project: Project, tmp_path: Path
) -> None:
    importer.import_recipe(empty_project, str(SEED_RECIPE), name=NAME, echo=Echo())
    path = empty_project.spec_path(NAME)

    def mine(data: dict) -> None:  # type: ignore[type-arg]
        _user_edits(data)
        data["resources"]["shm_size"] = "12g"

    edited = _edit_spec(path, mine)
    v2 = _upstream(tmp_path)
    with pytest.raises(ConsentError) as err:
        importer.import_recipe(empty_project, str(v2), name=NAME, echo=Echo(), yes=True)
    assert "resources.shm_size: yours '12g', upstream '16g' (was '8g')" in str(err.value)
    assert "--ours" in str(err.value) and "--theirs" in str(err.value)
    assert path.read_text(encoding="utf-8") == edited
    importer.import_recipe(empty_project, str(v2), name=NAME, echo=Echo(), yes=True, resolve="ours")
    dep = specmod.load(path)
    assert (
        dep.resources.shm_size == "12g"
        and dep.engine.args[dep.engine.args.index("--max-num-seqs") + 1] == "16"
    )
    importer.import_recipe(empty_project, str(v2), name=NAME, echo=Echo(), yes=True, resolve="theirs")
    assert specmod.load(path).resources.shm_size == "12g"  # base is now v2: the user's 12g is their edit
    asked: list[str] = []

    def take(q: str) -> bool:
        asked.append(q)
        return True

    importer.import_recipe(
        empty_project, str(_upstream(tmp_path, shm="20g")), name=NAME, echo=Echo(), confirm=take
    )
    # one line per conflict: the field, yours, upstream's, what it was, the question
    assert asked[0] == (
        "conflict resources.shm_size: yours '12g', upstream '20g' (was '16g') — take upstream's value?"
    )
    assert specmod.load(path).resources.shm_size == "20g"


def test_reimport_never_writes_a_secret_value_into_the_spec(empty_project: Project, tmp_path: Path) -> None:
    importer.import_recipe(empty_project, str(SEED_RECIPE), name=NAME, echo=Echo())
    path = empty_project.spec_path(NAME)

    def secret(data: dict) -> None:  # type: ignore[type-arg]
        data["env"].append({"name": "HF_TOKEN", "value": "hf_leak", "secret": True})

    _edit_spec(path, secret)
    importer.import_recipe(empty_project, str(_upstream(tmp_path)), name=NAME, echo=Echo(), yes=True)
    assert "hf_leak" not in path.read_text(encoding="utf-8")


def test_a_broken_user_file_is_reported_with_how_to_start_afresh(empty_project: Project) -> None:
    importer.import_recipe(empty_project, str(SEED_RECIPE), name=NAME, echo=Echo())
    path = empty_project.spec_path(NAME)
    path.write_text("version: 1\n", encoding="utf-8")
    with pytest.raises(RigsmithError, match="to import afresh"):
        importer.import_recipe(empty_project, str(SEED_RECIPE), name=NAME, yes=True, echo=Echo())
    assert path.read_text(encoding="utf-8") == "version: 1\n"


def test_dry_run_writes_nothing(empty_project: Project) -> None:
    echo = Echo()
    dep = importer.import_recipe(empty_project, str(SEED_RECIPE), name=NAME, dry_run=True, echo=echo)
    assert list(empty_project.deployments.iterdir()) == []
    assert "create  deployments/merlin.yaml  (dry run: nothing written)" in echo.text
    assert specmod.dump(dep) in echo.text
    importer.import_recipe(empty_project, str(SEED_RECIPE), name=NAME, echo=Echo())
    path = empty_project.spec_path(NAME)
    before = path.read_text(encoding="utf-8")
    echo = Echo()
    importer.import_recipe(
        empty_project, str(SEED_RECIPE), name=NAME, image="localhost/x:1", dry_run=True, echo=echo
    )
    assert "+  image: localhost/x:1" in echo.text
    assert path.read_text(encoding="utf-8") == before


def test_a_refused_recipe_writes_nothing(empty_project: Project, tmp_path: Path) -> None:
    src = tmp_path / "cmd.sh"
    src.write_text("vllm serve '<model dir>' --port 8000\n", encoding="utf-8")
    with pytest.raises(RecipeError):
        importer.import_recipe(empty_project, str(src), echo=Echo())
    assert list(empty_project.deployments.iterdir()) == []


# -- hostile values ----------------------------------------------------------------------------------

HOSTILE_ARGS = [
    "--served-model-name",
    "a;b && rm -rf / #",
    "--response-role",
    "$(curl http://127.0.0.1:9/x | sh)",
    "--tool-call-parser",
    "`reboot`",
    "--reasoning-parser",
    'it\'s "quoted" \\ back',
    "--root-path",
    "line1\nline2\n",
    "--override-generation-config",
    json.dumps({"stop": ["$(id)", "`x`", "'\"\n"]}),
    "--lora-modules",
    "x=<not a placeholder>",
    "--prefix",
    "",
    "--glob",
    "*.json [a-z]? ~root",
]


def test_hostile_flag_and_env_values_survive_import_literally(empty_project: Project, tmp_path: Path) -> None:
    command = shlex.join(["vllm", "serve", "org/model", *HOSTILE_ARGS])
    env = "A=$(id) B=`whoami` C=x;y|z | D='q\"' (note with $(x) and `y`)"
    src = _recipe_file(
        tmp_path, command=command, env=env, notes="nothing structured; $(id) `id`", id="hostile"
    )
    dep = importer.import_recipe(empty_project, str(src), name="hostile", echo=Echo())
    assert list(dep.engine.args) == ["org/model", *HOSTILE_ARGS]
    assert [(e.name, e.value) for e in dep.env] == [
        ("A", "$(id)"),
        ("B", "`whoami`"),
        ("C", "x;y|z"),
        ("D", "'q\"'"),
    ]
    assert dep.env[3].note == "note with $(x) and `y`"
    assert dep.notes[0] == "nothing structured; $(id) `id`"
    assert dep.placeholders == {"<not a placeholder>": None}
    on_disk = specmod.load(empty_project.spec_path("hostile"))
    assert on_disk == dep
    assert on_disk.engine.args == dep.engine.args


def test_bad_json_flag_value_is_refused_naming_the_flag_and_value(
    empty_project: Project, tmp_path: Path
) -> None:
    src = _recipe_file(tmp_path, command="vllm serve org/m --speculative-config '{\"method\": mtp}'")
    with pytest.raises(RecipeError) as err:
        importer.import_recipe(empty_project, str(src), echo=Echo())
    assert "--speculative-config takes JSON" in str(err.value)
    assert '{"method": mtp}' in str(err.value)


@given(st.text(max_size=300))
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_any_text_imports_or_is_refused_never_a_traceback(text: str) -> None:
    with contextlib.suppress(RigsmithError):
        recipe.parse(text, source="fuzz", sha256="0" * 64)


_RAWS = [c["raw"] for c in corpus()] + [SEED_RECIPE.read_text(encoding="utf-8")]


@given(st.sampled_from(_RAWS), st.integers(0, 10_000), st.integers(0, 10_000), st.text(max_size=8))
@settings(max_examples=300, deadline=None)
def test_mangled_corpus_text_imports_or_is_refused_never_a_traceback(
    raw: str, a: int, b: int, ins: str
) -> None:
    i, j = sorted((a % (len(raw) + 1), b % (len(raw) + 1)))
    with contextlib.suppress(RigsmithError):
        recipe.parse(raw[:i] + ins + raw[j:], source="fuzz", sha256="0" * 64)


# -- golden refusal messages -------------------------------------------------------------------------

_GOLDEN_CASES = [
    "mistral-docs-mixtral-docker-comment-breaks-continuation",
    "vllm-issue-5704-docker-comment-after-backslash",
    "recipes-deepseek-v31-tool-template-no-continuations",
    "qwen3vl-issue-1776-compose-space-in-list-item",
]


def test_refusal_messages_match_golden(update_golden: bool) -> None:
    cases = {c["id"]: c for c in corpus()}
    actual: dict[str, str] = {}
    for cid in _GOLDEN_CASES:
        with pytest.raises(RecipeError) as err:
            recipe.parse(cases[cid]["raw"], source=f"corpus/{cid}", sha256="0" * 64)
        actual[f"{cid}.txt"] = f"error: {err.value}\n"
    with pytest.raises(RecipeError) as err:
        recipe.parse('{"command": 7, "env": ["x"]}', source="bad.json", sha256="0" * 64)
    actual["bad-recipe-json.txt"] = f"error: {err.value}\n"
    compare_tree(actual, GOLDEN / "recipes" / "refusals", update_golden)


# -- the real CLI ------------------------------------------------------------------------------------


def test_cli_import_recipe_exit_codes_and_messages(tmp_path: Path) -> None:
    root = tmp_path / "proj"
    (root / "deployments").mkdir(parents=True)
    spec_path = root / "deployments" / "merlin.yaml"

    r = _cli(root, str(SEED_RECIPE), "--name", "merlin", "--dry-run")
    assert r.returncode == 0, r.stderr
    assert "dry run: nothing written" in r.stdout and not spec_path.exists()

    r = _cli(root, str(SEED_RECIPE), "--name", "merlin")
    assert r.returncode == 0, r.stderr
    assert "create  deployments/merlin.yaml" in r.stdout
    assert "fill in before deploy" not in r.stdout  # the tree is in the proposed image: they point there
    assert "placeholders set to it (<repo>: /opt/src, <vllm tree>: /opt/src/vllm-v2.5" in r.stdout
    assert "engine image proposed from the recipe's notes: images/merlin/image.yaml" in r.stdout
    assert "create  images/merlin/image.yaml" in r.stdout

    r = _cli(root, str(SEED_RECIPE), "--name", "merlin")
    assert r.returncode == 0 and "has not changed since the last import" in r.stdout

    r = _cli(root, str(SEED_RECIPE), "--name", "merlin", "--image", "localhost/vllm-merlin:v2.5.1")
    before = spec_path.read_text(encoding="utf-8")
    assert r.returncode == 1
    assert (
        "error: would change existing file(s): deployments/merlin.yaml (update); nothing was written"
        in r.stderr
    )
    assert "re-run with --yes" in r.stderr
    assert "+  image: localhost/vllm-merlin:v2.5.1" in r.stdout
    assert "Traceback" not in r.stderr + r.stdout
    assert spec_path.read_text(encoding="utf-8") == before

    r = _cli(root, str(SEED_RECIPE), "--name", "merlin", "--image", "localhost/vllm-merlin:v2.5.1", "--yes")
    assert r.returncode == 0 and "update  deployments/merlin.yaml" in r.stdout
    assert specmod.load(spec_path).engine.image == "localhost/vllm-merlin:v2.5.1"

    bad = tmp_path / "bad.sh"
    bad.write_text("docker run --gpus all \\  # all gpus\n  vllm/vllm-openai org/m\n", encoding="utf-8")
    r = _cli(root, str(bad))
    assert r.returncode == 1
    assert r.stderr.startswith(f"error: {bad}: cannot import this recipe")
    assert "escapes the space, not the newline" in r.stderr and "Traceback" not in r.stderr

    r = _cli(root, str(tmp_path / "missing.json"))
    assert r.returncode == 1 and "no such file" in r.stderr and "Traceback" not in r.stderr


_LEAF = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 10**6),
    st.text(max_size=20),
    st.sampled_from(
        [
            "vllm serve x/y",
            "--model",
            "a/b",
            "nvidia.com/gpu=all",
            "8g",
            "-1",
            "70s",
            "/a:/b:ro",
            "K=V",
            "${X:-1}",
            "$$x",
            "bash",
            "-c",
            "vllm/vllm-openai:1",
        ]
    ),
)
_VALUE = st.recursive(
    _LEAF,
    lambda ch: st.one_of(
        st.lists(ch, max_size=4),
        st.dictionaries(
            st.sampled_from(
                [
                    "soft",
                    "resources",
                    "reservations",
                    "devices",
                    "driver",
                    "count",
                    "device_ids",
                    "memlock",
                    "x",
                ]
            ),
            ch,
            max_size=3,
        ),
    ),
    max_leaves=8,
)
_SERVICE = st.dictionaries(
    st.sampled_from([*SERVICE_KEYS, "ports"]),
    _VALUE,
    max_size=8,
)


@given(st.dictionaries(st.sampled_from(["vllm", "other"]), _SERVICE, min_size=1, max_size=2))
@settings(max_examples=150, deadline=None)
def test_any_compose_structure_imports_or_is_refused_never_a_traceback(services: dict[str, object]) -> None:
    import yaml

    with contextlib.suppress(RigsmithError):
        recipe.parse(yaml.safe_dump({"services": services}), source="fuzz", sha256="0" * 64)


@given(
    st.dictionaries(st.sampled_from(["id", "title", "command", "env", "notes", "extra"]), _VALUE, max_size=6)
)
@settings(max_examples=300, deadline=None)
def test_any_recipe_json_imports_or_is_refused_never_a_traceback(data: dict[str, object]) -> None:
    with contextlib.suppress(RigsmithError):
        recipe.parse(json.dumps(data), source="fuzz", sha256="0" * 64)


@pytest.mark.parametrize(
    ("options", "count", "cdi"),
    [
        ("--gpus all", 2, ["nvidia.com/gpu=0", "nvidia.com/gpu=1"]),
        ("--gpus 3", 3, ["nvidia.com/gpu=0", "nvidia.com/gpu=1", "nvidia.com/gpu=2"]),
        ("--gpus '\"device=2,3\"'", 2, ["nvidia.com/gpu=2", "nvidia.com/gpu=3"]),
        ("--device nvidia.com/gpu=1 --device nvidia.com/gpu=3", 2, ["nvidia.com/gpu=1", "nvidia.com/gpu=3"]),
        ("--device example.com/gpu=all", 2, ["example.com/gpu=0", "example.com/gpu=1"]),
    ],
)
def test_docker_gpu_requests_become_pinned_cdi_devices(options: str, count: int, cdi: list[str]) -> None:
    text = (
        f"docker run {options} --shm-size 16g --ulimit memlock=-1:-1 --stop-timeout 90 img/vllm:1 org/m -tp 2"
    )
    dep = recipe.parse(text, source="t", sha256="0" * 64)
    assert dep.resources.gpus.count == count
    assert list(dep.resources.gpus.cdi_devices) == cdi
    assert (dep.resources.shm_size, dep.resources.memlock, dep.resources.stop_grace_seconds) == (
        "16g",
        "unlimited",
        90,
    )


# -- local checkpoints (no Hub repo) -------------------------------------------------------------------


def _parse(text: str) -> specmod.Deployment:
    return recipe.parse(text, source="local.sh", sha256="0" * 64)


@pytest.mark.parametrize(
    ("model", "local_dir"),
    [
        ("/srv/models/Qwen3-8B", "/srv/models/Qwen3-8B"),
        ("~/models/Qwen3-8B", "~/models/Qwen3-8B"),
        ("./Qwen3-8B", "./Qwen3-8B"),
        # vLLM opens a directory of that name in its cwd before it asks the Hub: a relative local dir.
        ("Qwen3-8B", "./Qwen3-8B"),
    ],
)
def test_a_host_path_model_imports_as_a_local_checkpoint(model: str, local_dir: str) -> None:
    dep = _parse(f"vllm serve {shlex.quote(model)} --max-model-len 4096\n")
    assert dep.model.repo is None
    assert dep.model.local_dir == local_dir
    assert dep.model.container_path == "/models/Qwen3-8B"
    assert dep.engine.model_arg == 0 and dep.engine.args[0] == model
    assert dep.engine.container_argv(dep.model) == ["serve", "/models/Qwen3-8B", "--max-model-len", "4096"]
    assert "model.repo is null" in "\n".join(dep.notes)
    assert specmod.loads(specmod.dump(dep)) == dep


def test_a_docker_model_path_maps_through_its_volume_to_the_host_dir() -> None:
    dep = _parse(
        "docker run --gpus all -v /data/llm:/workspace/llm:ro -v /data/cache:/root/.cache "
        "vllm/vllm-openai:v0.10.1 --model=/workspace/llm/ft/ckpt-7/ --port 8001\n"
    )
    assert (dep.model.repo, dep.model.local_dir, dep.model.container_path) == (
        None,
        "/data/llm/ft/ckpt-7",
        "/models/ckpt-7",
    )
    assert dep.engine.container_argv(dep.model) == ["serve", "--model=/models/ckpt-7", "--port", "8001"]
    assert "'/workspace/llm/ft/ckpt-7/' is the container path of '/data/llm/ft/ckpt-7'" in "\n".join(
        dep.notes
    )


def test_a_docker_mount_of_the_current_directory_gives_a_relative_local_dir() -> None:
    dep = _parse("docker run -v $(pwd):/workspace vllm/vllm-openai --model /workspace/m/x\n")
    assert dep.model.repo is None and dep.model.local_dir == "./m/x"
    assert "set model.local_dir to the checkpoint's absolute path" in importer.next_steps(dep)[0]


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("vllm serve '<model dir>'\n", "the model is the placeholder '<model dir>'"),
        ("vllm serve ~bob/m\n", "~user is not expanded"),
        (
            "docker run vllm/vllm-openai --model /models/m\n",
            "the container path '/models/m' and no volume of the recipe mounts it from the host",
        ),
        (
            "docker run -v $MODELS:/m vllm/vllm-openai --model /m/x\n",
            "inside the volume <MODELS>:/m whose host side is shell syntax or a placeholder",
        ),
        ("docker run -v /a:/m vllm/vllm-openai --model m/../x\n", "a path relative to the container's"),
    ],
)
def test_ambiguous_local_models_are_refused_with_their_reason(text: str, reason: str) -> None:
    with pytest.raises(RecipeError) as err:
        _parse(text)
    assert reason in str(err.value)


def test_cli_imports_a_local_path_recipe(tmp_path: Path) -> None:
    root = tmp_path / "proj"
    (root / "deployments").mkdir(parents=True)
    src = tmp_path / "serve.sh"
    src.write_text("vllm serve /srv/models/My-Finetune --tensor-parallel-size 2\n", encoding="utf-8")
    r = _cli(root, str(src), "--image", "localhost/vllm:1")
    assert r.returncode == 0, r.stderr
    assert "create  deployments/my-finetune.yaml" in r.stdout
    assert "local model: the checkpoint must already be in /srv/models/My-Finetune" in r.stdout
    text = (root / "deployments" / "my-finetune.yaml").read_text(encoding="utf-8")
    assert "model:\n  repo: null\n  local_dir: /srv/models/My-Finetune\n" in text
    spec = specmod.load(root / "deployments" / "my-finetune.yaml")
    assert spec.resources.gpus.cdi_devices == ("nvidia.com/gpu=0", "nvidia.com/gpu=1")


def test_bare_commands_act_on_the_newest_import_until_invoke_yaml_names_another(tmp_path: Path) -> None:
    """A checkout whose invoke.yaml names the shipped example: after `import-recipe`, bare `next` acts on
    what was just imported (and import says so); invoke.yaml changed afterwards is the user's later choice."""
    root = tmp_path / "rig"
    shutil.copytree(REPO / "deployments", root / "deployments")
    shutil.copy(REPO / "invoke.yaml", root / "invoke.yaml")
    shipped = "flash-next-merlin-4x3090"
    assert f"{shipped}:" in task_cli(root, "next").stdout
    imp = _cli(root, str(SEED_RECIPE))
    assert imp.returncode == 0, imp.stderr
    new = "qwen3-8-flash-next-w4a16-merlin"
    assert f"now act on {new}, the newest import (instead of invoke.yaml's {shipped})" in imp.stdout
    nxt = task_cli(root, "next")
    assert nxt.returncode == 0 and nxt.stdout.startswith(f"{new}:"), nxt.stdout + nxt.stderr
    assert f"--deployment {new}" in nxt.stdout
    # RIGSMITH_DEPLOYMENT still wins; invoke.yaml edited to another deployment wins from then on
    assert task_cli(root, "next", RIGSMITH_DEPLOYMENT=shipped).stdout.startswith(f"{shipped}:")
    (root / "invoke.yaml").write_text("rigsmith:\n  deployment: flash-next-int4-3x3090\n")
    assert task_cli(root, "next").stdout.startswith("flash-next-int4-3x3090:")
