"""invoke next: where a deployment stands, computed from the spec, the lock, the disk and podman, and the
command for the next step — walked stage by stage with the real commands (issue 27)."""

from __future__ import annotations

from pathlib import Path

import yaml

from rigsmith.operating.bench import bench
from rigsmith.operating.host import LocalHost
from rigsmith.operating.lifecycle import lifecycle
from rigsmith.operating.lifecycle import nextcommand as nextstep
from rigsmith.operating.lifecycle.lifecycle import Ops
from rigsmith.project import Project
from rigsmith.rendering import deploy
from rigsmith.spec import loads
from tests.support.common import invoke_cli, standin_deployment, write_project
from tests.support.ops import ops_data
from tests.support.podman import Podman
from tests.support.standin import Standin, StandinConfig


def _where(project: Project, host: LocalHost) -> tuple[str, str | None]:
    found = nextstep.stages(project, "walk", "podman", host)
    last = found[-1]
    return (last.name if not last.done else "done"), last.command


def test_next_walks_from_import_to_qualified_naming_each_command(
    tmp_path: Path, podman: Podman, fake_cdi: Path, ops_image: str
) -> None:
    data = ops_data(tmp_path, "walk", benchmarks=[{"name": "decode_1stream", "tokens_per_second": 150.0}])
    data["resources"]["memlock"] = "host"  # this machine cannot raise memlock; no --memlock override
    project = write_project(tmp_path, data)
    host = LocalHost(podman.env)

    out = invoke_cli(project.root, "next", env=podman.env)
    assert out.returncode == 0, out.stderr
    assert "NEXT  pinned" in out.stdout and "fetched    not checked yet" in out.stdout
    assert out.stdout.rstrip().endswith("where: imported; next: invoke pin --deployment walk")

    # a local checkpoint: nothing to pin, and "fetched" is the files being there
    data["model"]["repo"] = None  # type: ignore[index]
    data["model"].pop("revision", None)  # type: ignore[union-attr]
    data["model"].pop("config_patches", None)  # type: ignore[union-attr]
    project.spec_path("walk").write_text(yaml.safe_dump(data, sort_keys=False))
    model_dir = Path(str(data["model"]["local_dir"]))  # type: ignore[index]
    assert _where(project, host) == ("fetched", f"copy the checkpoint to {model_dir}")
    (model_dir / "config.json").write_text("{}")
    assert _where(project, host) == ("deployed", "invoke deploy --target podman --deployment walk")

    deploy.deploy(project, "podman", deployment="walk", echo=lambda _m: None)
    assert _where(project, host) == ("up", "invoke up --target podman --deployment walk")
    port = data["network"]["port"]  # type: ignore[index]
    try:
        lifecycle.up(Ops(project, env=podman.env, echo=lambda _m: None))
        assert _where(project, host) == (
            "qualified",
            "invoke wait --deployment walk, then invoke bench --compare --deployment walk",
        )
        with Standin(StandinConfig(model_names=("flash-next-v2",), rate=150.0, ttft=0.01), port=port):
            bench.bench_deployment(project, "walk", max_tokens=16, prompt_words=8, echo=lambda _m: None)
        assert _where(project, host) == ("done", None)
        lines = nextstep.report(nextstep.stages(project, "walk", "podman", host))
        assert lines[-1] == "where: qualified — every stage is done"
    finally:
        podman.run("rm", "--force", "--time", "0", "walk", check=False)
    assert _where(project, host) == ("up", "invoke up --target podman --deployment walk")


def test_after_import_lists_the_commands_in_order(tmp_path: Path) -> None:
    spec = loads(yaml.safe_dump(standin_deployment(tmp_path, name="x")))
    lines = nextstep.after_import(spec, Project(tmp_path), None)
    steps = [ln.split(". ", 1)[1] for ln in lines if ln.startswith("  ")]
    assert steps == [
        "invoke pin --deployment x",
        "invoke fetch-model --deployment x",
        "invoke doctor --deployment x",
        "invoke deploy --target podman --deployment x",
        "invoke up --deployment x",
        "invoke wait --deployment x",
        "invoke bench --compare --deployment x",
    ]
    assert lines[-1] == "`invoke next --deployment x` says where it stands at any time"
