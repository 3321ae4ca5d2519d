"""Devices follow the recipe's vendor (issue 24): a platform rigsmith does not deploy is refused naming it,
ROCm recipes get AMD's CDI devices, GPUs the recipe left open are noted, and a lone serve asking for more
GPUs than one box has says it may be multi-node."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rigsmith.errors import RecipeError
from rigsmith.importing import recipe
from rigsmith.project import Project
from rigsmith.spec import Deployment
from tests.support.recipes import import_cli


def _parse(text: str, image: str | None = None) -> Deployment:
    return recipe.parse(text, source="t", sha256="0" * 64, image=image)


@pytest.mark.parametrize(
    ("text", "named"),
    [
        (
            "vllm serve Qwen/Qwen3-8B --device xpu -tp 8 -pp 2",
            "--device xpu: the recipe runs vLLM on Intel GPUs",
        ),
        ("vllm serve Qwen/Qwen3-8B --device=cpu", "--device cpu: the recipe runs vLLM on the CPU"),
        ("vllm serve Qwen/Qwen3-8B --device hpu", "Intel Gaudi"),
        (
            "docker run --gpus all intel/vllm:xpu --model Qwen/Qwen3-8B",
            "intel/vllm:xpu is a vLLM build for Intel",
        ),
        (
            "docker run public.ecr.aws/q9t5s3a7/vllm-cpu-release-repo:v0.9 --model Qwen/Qwen3-8B",
            "for the CPU",
        ),
    ],
)
def test_a_platform_rigsmith_does_not_deploy_is_refused_naming_it(text: str, named: str) -> None:
    with pytest.raises(RecipeError) as err:
        _parse(text)
    assert named in str(err.value)
    assert "NVIDIA and AMD GPUs" in str(err.value)


def test_another_image_given_with_image_replaces_the_foreign_one() -> None:
    dep = _parse("docker run --gpus 1 intel/vllm:xpu --model Qwen/Qwen3-8B", image="vllm/vllm-openai:v0.11.0")
    assert dep.resources.gpus.cdi_devices == ("nvidia.com/gpu=0",)


@pytest.mark.parametrize(
    "text",
    [
        "docker run --gpus all rocm/vllm:latest --model Qwen/Qwen3-8B -tp 2",
        "docker run --device /dev/kfd --device /dev/dri vllm/vllm-openai:v0.11.0 --model Qwen/Qwen3-8B -tp 2",
        "HIP_VISIBLE_DEVICES=0,1 vllm serve Qwen/Qwen3-8B -tp 2",
        "vllm serve Qwen/Qwen3-8B -tp 2 --device cuda",
    ],
)
def test_rocm_forms_import_as_amd_devices_and_cuda_as_nvidia(text: str) -> None:
    vendor = "nvidia.com/gpu" if "cuda" in text else "amd.com/gpu"
    assert _parse(text).resources.gpus.cdi_devices == (f"{vendor}=0", f"{vendor}=1")


def test_gpus_all_with_tp_1_notes_that_gpu_0_was_chosen() -> None:
    dep = _parse("docker run --gpus all vllm/vllm-openai:v0.11.0 --model Qwen/Qwen3-8B")
    assert dep.resources.gpus.cdi_devices == ("nvidia.com/gpu=0",)
    assert any(
        "saw every GPU (docker run --gpus all)" in n and "nvidia.com/gpu=0 was chosen" in n for n in dep.notes
    )


def test_explicit_gpus_get_no_chosen_note() -> None:
    dep = _parse("docker run --gpus device=2 vllm/vllm-openai:v0.11.0 --model Qwen/Qwen3-8B")
    assert not any("saw every GPU" in n for n in dep.notes)


def test_a_lone_serve_of_more_than_one_box_says_it_may_be_multi_node() -> None:
    dep = _parse("vllm serve Qwen/Qwen3-8B -tp 8 -pp 2")
    assert any(n.startswith("this may be a multi-node recipe") and "cluster section" in n for n in dep.notes)
    assert not any("multi-node" in n for n in _parse("vllm serve Qwen/Qwen3-8B -tp 8").notes)


def test_cli_refuses_an_xpu_recipe_and_writes_nothing(empty_project: Project, tmp_path: Path) -> None:
    src = tmp_path / "xpu.sh"
    src.write_text(
        "vllm serve Qwen/Qwen3-8B --device xpu --tensor-parallel-size 8 --pipeline-parallel-size 2\n"
    )
    proc = import_cli(empty_project.root, str(src), "--name", "xpu")
    assert proc.returncode != 0
    assert "--device xpu" in proc.stderr and "Traceback" not in proc.stderr
    assert not (empty_project.root / "deployments/xpu.yaml").exists()


def test_cli_import_of_a_16_gpu_serve_notes_the_cluster_section(
    empty_project: Project, tmp_path: Path
) -> None:
    src = tmp_path / "big.sh"
    src.write_text("vllm serve Qwen/Qwen3-8B --tensor-parallel-size 8 --pipeline-parallel-size 2\n")
    proc = import_cli(empty_project.root, str(src), "--name", "big")
    assert proc.returncode == 0, proc.stderr
    spec = yaml.safe_load((empty_project.root / "deployments/big.yaml").read_text())
    assert any("this may be a multi-node recipe" in n for n in spec["notes"])
