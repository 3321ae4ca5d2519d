"""Issue 13: what the importer *understands* of real published commands, item by item.

Each test imports the published form through :func:`rigsmith.importing.recipe.parse` and, where the item is
about the deployment that results, renders the real targets from the imported spec.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from rigsmith import spec as specmod
from rigsmith.importing import recipe, vllmflags
from rigsmith.project import Project
from rigsmith.rendering import deploy
from rigsmith.spec import Deployment
from tests.support.recipes import refusal


def _parse(text: str, **kw: str) -> Deployment:
    return recipe.parse(text, source="t", sha256="0" * 64, **kw)


def _refusal(text: str) -> str:
    return refusal(text)


def _render(dep: Deployment, target: str, tmp_path: Path, **updates: object) -> tuple[str, list[str]]:
    """Every file ``target`` renders for ``dep`` (given an image), joined; and the warnings."""
    engine = dep.engine.model_copy(update={"image": dep.engine.image or "localhost/vllm:1", **updates})
    dep = dep.model_copy(update={"engine": engine})
    project = Project(tmp_path)
    project.spec_path(dep.name).parent.mkdir(parents=True, exist_ok=True)
    project.spec_path(dep.name).write_text(specmod.dump(dep), encoding="utf-8")
    warnings: list[str] = []
    _, files = deploy.artifacts(
        project, target, deployment=dep.name, out=tmp_path / "out", warn=warnings.append
    )
    texts = [f.content if isinstance(f.content, str) else f.content.decode() for f in files]
    return "\n".join(texts), warnings


# -- 1. GPU selection --------------------------------------------------------------------------------


@pytest.mark.parametrize("target", ["podman", "quadlet", "compose", "lxc"])
def test_visible_devices_pick_the_cdi_devices_and_are_renumbered_in_every_target(
    target: str, tmp_path: Path
) -> None:
    dep = _parse("CUDA_VISIBLE_DEVICES=2,3 vllm serve Qwen/Qwen3-0.6B -tp 2")
    assert dep.resources.gpus.cdi_devices == ("nvidia.com/gpu=2", "nvidia.com/gpu=3")
    assert [(e.name, e.value) for e in dep.env] == [("CUDA_VISIBLE_DEVICES", "0,1")]
    text, _ = _render(dep, target, tmp_path)
    assert "nvidia.com/gpu=2" in text and "nvidia.com/gpu=3" in text
    assert "nvidia.com/gpu=0" not in text
    assert "CUDA_VISIBLE_DEVICES=0,1" in text and "CUDA_VISIBLE_DEVICES=2,3" not in text


def test_kube_refuses_fixed_host_gpus_naming_the_field(tmp_path: Path) -> None:
    dep = _parse("CUDA_VISIBLE_DEVICES=2,3 vllm serve Qwen/Qwen3-0.6B -tp 2")
    from rigsmith.errors import SpecError

    with pytest.raises(SpecError, match=r"resources\.gpus\.cdi_devices"):
        _render(dep, "kube", tmp_path)


@pytest.mark.parametrize(
    ("text", "cdi", "var"),
    [
        (
            "HIP_VISIBLE_DEVICES=4,5,6,7 vllm serve Qwen/Qwen3-235B-A22B -tp 4",
            [f"amd.com/gpu={i}" for i in (4, 5, 6, 7)],
            ("HIP_VISIBLE_DEVICES", "0,1,2,3"),
        ),
        (
            "docker run --gpus all -e CUDA_VISIBLE_DEVICES=1 vllm/vllm-openai:v0.11.0 Qwen/Qwen3-0.6B",
            ["nvidia.com/gpu=1"],
            ("CUDA_VISIBLE_DEVICES", "0"),
        ),
        (
            # The devices are picked by --gpus: the variable counts in the container's numbering already.
            "docker run --gpus '\"device=2,3\"' -e CUDA_VISIBLE_DEVICES=0,1 vllm/vllm-openai:v0.11.0 "
            "Qwen/Qwen3-0.6B -tp 2",
            ["nvidia.com/gpu=2", "nvidia.com/gpu=3"],
            ("CUDA_VISIBLE_DEVICES", "0,1"),
        ),
        (
            # The NVIDIA container runtime's own selection variable, host numbering.
            "docker run --runtime nvidia -e NVIDIA_VISIBLE_DEVICES=2,3 vllm/vllm-openai:v0.11.0 "
            "Qwen/Qwen3-0.6B -tp 2",
            ["nvidia.com/gpu=2", "nvidia.com/gpu=3"],
            ("NVIDIA_VISIBLE_DEVICES", "0,1"),
        ),
        (
            "docker run --gpus all -e NVIDIA_VISIBLE_DEVICES=all vllm/vllm-openai:v0.11.0 "
            "Qwen/Qwen3-0.6B -tp 2",
            ["nvidia.com/gpu=0", "nvidia.com/gpu=1"],
            ("NVIDIA_VISIBLE_DEVICES", "all"),
        ),
    ],
)
def test_gpu_selection_forms(text: str, cdi: list[str], var: tuple[str, str]) -> None:
    dep = _parse(text)
    assert list(dep.resources.gpus.cdi_devices) == cdi
    assert (var[0], var[1]) in [(e.name, e.value) for e in dep.env]


@pytest.mark.parametrize(
    "text",
    [
        "docker run -it --network=host --group-add=video --ipc=host --cap-add=SYS_PTRACE "
        "--security-opt seccomp=unconfined --device /dev/kfd --device /dev/dri rocm/vllm:latest "
        "vllm serve Qwen/Qwen3-8B -tp 2",
        "services:\n  vllm:\n    image: rocm/vllm:latest\n    devices:\n      - /dev/kfd\n      - /dev/dri\n"
        "    command: [vllm, serve, Qwen/Qwen3-8B, -tp, '2']\n",
    ],
)
def test_rocm_device_nodes_mean_amd_gpus(text: str) -> None:
    assert _parse(text).resources.gpus.cdi_devices == ("amd.com/gpu=0", "amd.com/gpu=1")


# -- 2. GPU count from every flag that multiplies GPUs ----------------------------------------------


@pytest.mark.parametrize(
    ("flags", "count"),
    [
        ("--prefill-context-parallel-size 4", 4),
        ("-tp 2 -pcp 2", 4),
        ("-tp 2 -pp 2 --prefill-context-parallel-size=2", 8),
        ("-tp 2 -dp 2", 4),
        ("-tp 2 --data-parallel-size 4 --data-parallel-size-local 2", 4),
        ("-tp 4 --decode-context-parallel-size 2", 4),  # DCP shards the KV cache inside TP
        ("-tp 2 --enable-expert-parallel", 2),  # EP reuses the TP × DP ranks
        ("--tensor_parallel_size 2 --pipeline-parallel 2", 4),
    ],
)
def test_gpu_count_is_the_product_of_the_multiplying_flags(flags: str, count: int) -> None:
    dep = _parse(f"vllm serve Qwen/Qwen3-0.6B {flags}")
    assert dep.resources.gpus.count == count
    assert len(dep.resources.gpus.cdi_devices) == count


def test_the_flag_table_names_the_gpu_multipliers() -> None:
    assert set(vllmflags.GPU_MULTIPLIERS) == {
        "--tensor-parallel-size",
        "--pipeline-parallel-size",
        "--prefill-context-parallel-size",
        "--data-parallel-size",
        "--data-parallel-size-local",
    }
    assert (
        vllmflags.lookup("-dcp") is not None
        and not vllmflags.FLAGS["--decode-context-parallel-size"].multiplies_gpus
    )
    assert vllmflags.lookup("--no-enable-prefix-caching") is vllmflags.FLAGS["--enable-prefix-caching"]


# -- 3. GGUF Hub references -------------------------------------------------------------------------


def test_gguf_repo_quant_is_a_hub_repo_with_a_file_pattern() -> None:
    dep = _parse("vllm serve unsloth/Qwen3-0.6B-GGUF:Q4_K_M --tokenizer Qwen/Qwen3-0.6B")
    assert dep.model.repo == "unsloth/Qwen3-0.6B-GGUF"
    assert dep.model.local_dir == "~/models/Qwen3-0.6B-GGUF"
    assert "*Q4_K_M*.gguf" in dep.model.allow_patterns
    assert any("GGUF quantization Q4_K_M" in n for n in dep.notes)


# -- 4. docker -v as the model mount ----------------------------------------------------------------


def test_docker_volume_that_is_the_model_imports_as_a_local_model(tmp_path: Path) -> None:
    dep = _parse(
        "docker run --gpus all -v /srv/models/qwen:/models/qwen:ro -p 8000:8000 vllm/vllm-openai:v0.11.0 "
        "--model /models/qwen --max-model-len 8192"
    )
    assert dep.model.repo is None
    assert (dep.model.local_dir, dep.model.container_path) == ("/srv/models/qwen", "/models/qwen")
    assert dep.mounts == ()
    assert dep.engine.container_argv(dep.model)[1:3] == ["--model", "/models/qwen"]
    text, _ = _render(dep, "podman", tmp_path)
    assert "/srv/models/qwen:/models/qwen:ro" in text


# -- 5. notes that say where the model comes from ---------------------------------------------------


def test_notes_download_names_repo_revision_and_host_dir() -> None:
    sha = "0123456789abcdef0123456789abcdef01234567"
    raw = json.dumps(
        {
            "title": "tiny",
            "command": "vllm serve /models/tiny --port 8000",
            "notes": f"Get it: hf download acme/tiny --revision {sha} --local-dir /srv/m/tiny (1.2 GB)",
        }
    )
    dep = _parse(raw)
    assert (dep.model.repo, dep.model.revision, dep.model.local_dir) == ("acme/tiny", sha, "/srv/m/tiny")
    assert dep.model.container_path == "/models/tiny"
    assert dep.engine.container_argv(dep.model)[1] == "/models/tiny"


# -- 6. secondary Hub models ------------------------------------------------------------------------


def test_secondary_hub_models_are_recorded() -> None:
    dep = _parse(
        "vllm serve meta-llama/Llama-3.1-8B-Instruct --speculative-config "
        '\'{"model": "yuhuili/EAGLE-LLaMA3.1-Instruct-8B", "num_speculative_tokens": 5}\' '
        "--tokenizer meta-llama/Llama-3.1-8B-Instruct --enable-lora "
        '--lora-modules sql=org/sql-lora \'{"name": "tldr", "path": "org/tldr-lora"}\' /srv/x=/a'
    )
    got = [(m.role, m.repo, m.name, dep.engine.args[m.arg]) for m in dep.secondary_models]
    assert got == [
        ("speculative", "yuhuili/EAGLE-LLaMA3.1-Instruct-8B", None, dep.engine.args[2]),
        ("tokenizer", "meta-llama/Llama-3.1-8B-Instruct", None, "meta-llama/Llama-3.1-8B-Instruct"),
        ("lora", "org/sql-lora", "sql", "sql=org/sql-lora"),
        ("lora", "org/tldr-lora", "tldr", '{"name": "tldr", "path": "org/tldr-lora"}'),
    ]
    again = specmod.loads(specmod.dump(dep))
    assert again.secondary_models == dep.secondary_models


# -- 7. python -m on a venv -------------------------------------------------------------------------


def test_python_module_recipe_on_a_venv_runs_the_venvs_python(tmp_path: Path) -> None:
    dep = _parse("python -m vllm.entrypoints.openai.api_server --model Qwen/Qwen3-0.6B --port 8000")
    dep = dep.model_copy(update={"resources": dep.resources.model_copy(update={"host_ram_gib": 16.0})})
    text, _ = _render(dep, "lxc", tmp_path, runtime="venv", venv="/opt/venv", image=None)
    exec_start = next(ln for ln in text.splitlines() if "ExecStart=" in ln)
    assert "/opt/venv/bin/python -m vllm.entrypoints.openai.api_server --model" in exec_start
    assert "/bin/vllm" not in text
    assert '[ -x "$ROOT$VENV/bin/python" ]' in text


# -- 8. compose project name ------------------------------------------------------------------------


def test_compose_project_name_follows_the_compose_spec(tmp_path: Path) -> None:
    import yaml

    dep = _parse("vllm serve Qwen/Qwen2.5-7B-Instruct", name="qwen2.5-7b")
    text, _ = _render(dep, "compose", tmp_path)
    doc = yaml.safe_load(text[text.index("name:") :])
    assert re.fullmatch(r"[a-z0-9][a-z0-9_-]*", doc["name"]), doc["name"]
    assert doc["name"] == "qwen2-5-7b"


# -- 9-12. wrong refusals ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "model", "idx"),
    [
        ("vllm serve --host 0.0.0.0 Qwen/Qwen3-0.6B", "Qwen/Qwen3-0.6B", 2),
        ("vllm serve --task transcription openai/whisper-small", "openai/whisper-small", 2),
        (
            "vllm serve --trust-remote-code --served-model-name a b --port 8000 Qwen/Qwen3-0.6B",
            "Qwen/Qwen3-0.6B",
            6,
        ),
        ("vllm serve --served-model-name a Qwen/Qwen3-0.6B", None, None),
        ("vllm serve --enable-chunked-prefill True --enforce_eager Qwen/Qwen3-0.6B", "Qwen/Qwen3-0.6B", 3),
        ("vllm serve --enable-prefix-caching Qwen/Qwen3-0.6B --max-model-len 4096", "Qwen/Qwen3-0.6B", 1),
    ],
)
def test_model_positional_after_options(text: str, model: str | None, idx: int | None) -> None:
    if model is None:
        # nargs='+' takes every word up to the next option, as argparse does: no positional left.
        assert "names no model" in _refusal(text)
        return
    dep = _parse(text)
    assert dep.model.repo == model and dep.engine.model_arg == idx


@pytest.mark.parametrize(
    "cluster",
    [
        "-itd",
        "-td",
        "-dit",
        "-itp8000:8000",
        "-it -d",
        "-itdP --cpuset-cpus 0-7 --sig-proxy=false --memory-swap 64g --pids-limit 4096",
        "--rm --dns 1.1.1.1 --volumes-from data --replace --secret hf,type=env",
    ],
)
def test_combined_docker_short_flags(cluster: str) -> None:
    dep = _parse(f"docker run {cluster} --gpus all --ipc=host vllm/vllm-openai:v0.11.0 Qwen/Qwen3-0.6B")
    assert dep.engine.image == "vllm/vllm-openai:v0.11.0"
    assert dep.engine.args == ("Qwen/Qwen3-0.6B",)


def test_standalone_comment_ending_in_backslash_after_the_command() -> None:
    dep = _parse("vllm serve Qwen/Qwen3-0.6B\n# --max-model-len 4096 \\\n")
    assert dep.engine.args == ("Qwen/Qwen3-0.6B",)
    # On the command itself it still swallows the continuation.
    assert "swallows the line continuation" in _refusal("vllm serve Qwen/Qwen3-0.6B \\\n  # x \\\n  --port 1")
    # where a command follows the comment too (bash runs it on its own)
    assert "swallows the line continuation" in _refusal("vllm serve Qwen/Qwen3-0.6B \\\n  # x \\\necho up\n")


def test_a_comment_ending_in_backslash_that_ends_the_last_command_breaks_nothing() -> None:
    """Only comments follow it: the command ends there, as its author left it (bash's argv, no refusal)."""
    text = "vllm serve Qwen/Qwen3-0.6B \\\n  --port 8000 \\\n  # --max-model-len 131072 \\\n  # --seed 1\n\n"
    assert _parse(text).engine.args == ("Qwen/Qwen3-0.6B", "--port", "8000")


@pytest.mark.parametrize(
    "wrapper", ["exec", "sudo", "sudo -u vllm", "uv run", "uv run --with vllm --python 3.12"]
)
def test_wrappers_before_the_launcher_are_dropped(wrapper: str) -> None:
    dep = _parse(f"{wrapper} vllm serve Qwen/Qwen3-0.6B --port 8001")
    assert dep.engine.args == ("Qwen/Qwen3-0.6B", "--port", "8001")
    assert any(f"'{wrapper}' dropped" in n for n in dep.notes)


def test_documentation_prompt_is_not_a_command() -> None:
    dep = _parse("$ # a comment\n$ vllm serve --host 0.0.0.0 Qwen/Qwen3-0.6B")
    assert dep.engine.args == ("--host", "0.0.0.0", "Qwen/Qwen3-0.6B")
    assert any("the shell prompt '$ '" in n for n in dep.notes)


def test_legacy_key_value_json_flag_passes_through_with_a_note() -> None:
    dep = _parse("vllm serve Qwen/Qwen2.5-VL-7B-Instruct --limit-mm-per-prompt image=5,video=5")
    assert dep.engine.args[-1] == "image=5,video=5"
    assert any('{"image": 5, "video": 5}' in n for n in dep.notes)
    assert "not valid JSON" in _refusal("vllm serve Qwen/Qwen3-0.6B --hf-overrides '{bad'")


# -- misleading or noisy refusals -------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "podman run -it --device nvidia.com/gpu=all vllm/vllm-openai:v0.11.0 /bin/bash",
        "docker run -it --gpus all --entrypoint /bin/bash vllm/vllm-openai:v0.11.0",
        "kubectl apply -f - <<EOF\napiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: vllm\n"
        "spec:\n  template:\n    spec:\n      containers:\n      - name: vllm\n"
        "        args: [--model, Qwen/Qwen3-0.6B]\nEOF\n",
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: vllm\nspec:\n  containers:\n  - name: vllm\n"
        "    image: vllm/vllm-openai:v0.11.0\n    command: [vllm, serve, Qwen/Qwen3-0.6B]\n",
    ],
)
def test_not_a_serving_command_is_one_paragraph(text: str) -> None:
    message = _refusal(text)
    assert "this is not a serving command" in message
    assert "(1 problem(s))" in message


def test_image_from_a_shell_variable_is_refused_at_import() -> None:
    message = _refusal("docker run --gpus all $IMAGE Qwen/Qwen3-0.6B")
    assert "engine.image" in message and "--image" in message
    dep = _parse("docker run --gpus all $IMAGE Qwen/Qwen3-0.6B", image="vllm/vllm-openai:v0.11.0")
    assert dep.engine.image == "vllm/vllm-openai:v0.11.0"


@pytest.mark.parametrize("form", ["HF_TOKEN: ${HF_TOKEN}", "HF_TOKEN: $HF_TOKEN", "- HF_TOKEN=${HF_TOKEN}"])
def test_compose_secret_reference_is_a_pass_through_like_the_shell_form(form: str) -> None:
    text = (
        "services:\n  vllm:\n    image: vllm/vllm-openai:v0.11.0\n    environment:\n"
        f"      {form}\n    command: Qwen/Qwen3-0.6B\n"
    )
    dep = _parse(text)
    (env,) = dep.env
    assert env.name == "HF_TOKEN" and env.secret
    shell = _parse("docker run -e HF_TOKEN=$HF_TOKEN vllm/vllm-openai:v0.11.0 Qwen/Qwen3-0.6B")
    assert shell.env[0].secret and shell.env[0].name == "HF_TOKEN"


def test_compose_secret_interpolated_elsewhere_is_refused_without_asking_to_write_it_down() -> None:
    text = (
        "services:\n  vllm:\n    image: vllm/vllm-openai:v0.11.0\n"
        "    command: --model Qwen/Qwen3-0.6B --hf-token ${HF_TOKEN:-x}\n"
    )
    from rigsmith.errors import RecipeError

    with pytest.raises(RecipeError) as err:
        recipe.parse(
            text, source="t", sha256="0" * 64, compose_env=recipe.ComposeEnv(process={"HF_TOKEN": "hf_abc"})
        )
    assert "would write the secret HF_TOKEN into the spec" in str(err.value)
    assert "hf_abc" not in str(err.value)


def test_secret_env_mapping_is_kept() -> None:
    dep = _parse(
        'docker run --gpus all --env "HUGGING_FACE_HUB_TOKEN=$HF_TOKEN" '
        "vllm/vllm-openai:v0.11.0 Qwen/Qwen3-0.6B"
    )
    (env,) = dep.env
    assert (env.name, env.value, env.secret) == ("HUGGING_FACE_HUB_TOKEN", "$HF_TOKEN", True)
    assert any("every target reads HF_TOKEN on the host at run time: export HF_TOKEN" in n for n in dep.notes)
    assert not any("replace it with the value you mean" in n for n in dep.notes)


def test_lxc_without_host_ram_derives_it_from_the_model_size(tmp_path: Path) -> None:
    def memory(text: str) -> int:
        return int(re.search(r"^memory: (\d+)$", text, re.MULTILINE).group(1))  # type: ignore[union-attr]

    dep = _parse("vllm serve Qwen/Qwen3-8B --port 8000")
    shm_mib = 8 * 1024  # the default /dev/shm is charged to the CT too
    text, warnings = _render(dep, "lxc", tmp_path)
    assert memory(text) == 32 * 1024 + shm_mib
    assert any("resources.host_ram_gib is not set" in w and "32 GiB" in w for w in warnings)
    sized = dep.model_copy(update={"model": dep.model.model_copy(update={"size_bytes": 16 * 2**30})})
    text, warnings = _render(sized, "lxc", tmp_path / "b")
    assert memory(text) == 28 * 1024 + shm_mib  # 1.25 × 16 + 8 GiB
    assert any("from the model's size, 16.0 GiB" in w for w in warnings)
    assert not any("cannot express this: is needed" in w for w in warnings)


def test_every_problem_is_reported_at_once() -> None:
    message = _refusal("vllm serve '<model dir>' --port 8000\n  --enable-auto-tool-choice\n")
    assert "line 2 starts with the option" in message and "the model is the placeholder" in message
