"""Import keeps a container recipe's exposure (issue 24): its port publishes decide network.listen, which
every target turns into vLLM's --host under host networking. The real-network check is
tests/rendering/test_exposure_real.py; the five targets' argv, tests/rendering/test_parity.py."""

from __future__ import annotations

import pytest

from rigsmith.errors import RecipeError
from rigsmith.importing import recipe
from rigsmith.project import Project
from rigsmith.rendering import plan as planmod
from rigsmith.resolving.lock import lock as lockmod

IMAGE = "vllm/vllm-openai:v0.11.0"


@pytest.mark.parametrize(
    ("options", "args", "listen"),
    [
        ("-p 127.0.0.1:8000:8000", "--host 0.0.0.0", "127.0.0.1"),
        ("-p localhost:8000:8000", "", "127.0.0.1"),
        ("-p '[::1]:8000:8000'", "", "::1"),
        ("-p 192.168.1.5:8000:8000/tcp", "", "192.168.1.5"),
        ("-p 127.0.0.1:9000:9000", "--port 9000", "127.0.0.1"),
        ("", "--host 0.0.0.0", "127.0.0.1"),  # no publish: only this machine reached it
        ("--network none", "", "127.0.0.1"),
        ("-p 127.0.0.1:9999:9999", "", "127.0.0.1"),  # publishes another port, not the API's
        ("-p 8000:8000", "--host 0.0.0.0", None),
        ("-p 0.0.0.0:8000:8000", "", None),
        ("-P", "", None),
        ("-dP", "", None),
        ("--network host", "--host 0.0.0.0", None),
        ("--net=host -p 127.0.0.1:8000:8000", "", None),
        ("-p 127.0.0.1:8000-8010:8000-8010", "", "127.0.0.1"),
    ],
)
def test_docker_publishes_decide_the_listen_address(options: str, args: str, listen: str | None) -> None:
    dep = recipe.parse(
        f"docker run --gpus 1 {options} {IMAGE} --model Qwen/Qwen3-8B {args}", source="t", sha256="0" * 64
    )
    assert dep.network.listen == listen
    decision = [n for n in dep.notes if n.startswith("decision: the recipe publishes")]
    assert len(decision) == (listen is not None)
    if listen is not None:
        assert dep.network.host == listen


def test_a_rewritten_host_reaches_the_plan_and_the_health_probe() -> None:
    dep = recipe.parse(
        f"docker run --gpus 1 -p '[::1]:8000:8000' {IMAGE} --model Qwen/Qwen3-8B --host=0.0.0.0",
        source="t",
        sha256="0" * 64,
    )
    plan = planmod.build(dep, (IMAGE, False), spec_path="deployments/x.yaml", lock=lockmod.Lock())
    assert "--host=::1" in plan.command and "--host=0.0.0.0" not in plan.command
    assert plan.health_url == "http://[::1]:8000/health"


def test_vllm_serve_without_a_container_keeps_its_args_deciding() -> None:
    dep = recipe.parse("vllm serve Qwen/Qwen3-8B --host 0.0.0.0", source="t", sha256="0" * 64)
    assert dep.network.listen is None and dep.network.host == "0.0.0.0"


def test_a_different_host_port_is_noted() -> None:
    dep = recipe.parse(
        f"docker run --gpus 1 -p 127.0.0.1:5010:8000 {IMAGE} --model Qwen/Qwen3-8B",
        source="t",
        sha256="0" * 64,
    )
    assert dep.network.listen == "127.0.0.1"
    assert any("host port 5010" in n and "--port 5010" in n for n in dep.notes)


def test_publishes_on_several_addresses_are_refused_naming_them() -> None:
    with pytest.raises(RecipeError) as err:
        recipe.parse(
            f"docker run --gpus 1 -p 127.0.0.1:8000:8000 -p 10.0.0.2:8000:8000 {IMAGE} --model Qwen/Qwen3-8B",
            source="t",
            sha256="0" * 64,
        )
    assert "10.0.0.2, 127.0.0.1" in str(err.value) and "several addresses" in str(err.value)


@pytest.mark.parametrize(
    ("service", "listen"),
    [
        ('    ports: ["127.0.0.1:8000:8000"]\n', "127.0.0.1"),
        (
            "    ports:\n      - target: 8000\n        published: 8000\n        host_ip: 127.0.0.1\n",
            "127.0.0.1",
        ),
        ('    ports: ["8000:8000"]\n', None),
        ("    network_mode: host\n", None),
        ("", "127.0.0.1"),
    ],
)
def test_compose_ports_decide_the_listen_address(service: str, listen: str | None) -> None:
    text = (
        "services:\n  vllm:\n    image: vllm/vllm-openai:v0.11.0\n"
        '    command: ["--model", "Qwen/Qwen3-8B", "--host", "0.0.0.0"]\n' + service
    )
    dep = recipe.parse(text, source="t", sha256="0" * 64)
    assert dep.network.listen == listen


def test_cli_import_of_a_loopback_recipe_records_the_decision(empty_project: Project) -> None:
    from tests.support.recipes import import_cli

    src = empty_project.root / "r.sh"
    src.write_text(
        f"docker run --gpus 1 -p 127.0.0.1:8000:8000 {IMAGE} --model Qwen/Qwen3-8B --host 0.0.0.0\n"
    )
    proc = import_cli(empty_project.root, str(src), "--name", "loop")
    assert proc.returncode == 0, proc.stderr
    text = (empty_project.root / "deployments/loop.yaml").read_text()
    assert "listen: 127.0.0.1" in text and "decision: the recipe publishes its API only on 127.0.0.1" in text
