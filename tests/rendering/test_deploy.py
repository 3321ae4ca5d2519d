"""invoke deploy: pure rendering, refusals, consent, drift; the CLI itself, run for real."""

from __future__ import annotations

from pathlib import Path

import pytest

from rigsmith.errors import ConsentError, DriftError, LockError, RigsmithError, SpecError
from rigsmith.project import Project
from rigsmith.rendering import deploy, targets
from tests.support.common import GOLDEN_BUILD_DIGEST, REPO, invoke_cli, standin_deployment, write_project
from tests.support.targets import SEEDS


def _quiet(_m: str) -> None:
    pass


@pytest.mark.parametrize("target", sorted(targets.renderers()))
def test_deploy_writes_exactly_the_rendered_artifacts(
    seed_project: Project, tmp_path: Path, target: str
) -> None:
    """What deploy writes is what it renders (the golden comparison itself is in test_golden.py)."""
    out = tmp_path / "out"
    deploy.deploy(seed_project, target, deployment=SEEDS[1], out=out, echo=_quiet)
    _, files = deploy.artifacts(seed_project, target, deployment=SEEDS[1], out=out)
    written = {p: p.read_text(encoding="utf-8") for p in sorted(out.resolve().rglob("*")) if p.is_file()}
    assert written == {a.path: a.content for a in files}


def test_rendering_is_deterministic(seed_project: Project) -> None:
    _, a = deploy.artifacts(seed_project, "podman", deployment=SEEDS[0])
    _, b = deploy.artifacts(seed_project, "podman", deployment=SEEDS[0])
    assert [(x.path, x.content) for x in a] == [(x.path, x.content) for x in b]


def test_generated_script_asks_for_unlimited_memlock_and_the_seed_settings(seed_project: Project) -> None:
    plan, files = deploy.artifacts(seed_project, "podman", deployment="flash-next-merlin-4x3090")
    run = next(f for f in files if f.path.name == "run.sh").content
    assert "--ulimit memlock=-1:-1 \\" in run
    assert "--shm-size 8g \\" in run and "--stop-timeout 70 \\" in run
    for i in range(4):
        assert f"--device nvidia.com/gpu={i} \\" in run
    assert plan.shutdown_timeout == 60 < plan.stop_timeout


def test_seed_000_uses_the_locked_build_digest(seed_project: Project) -> None:
    plan, files = deploy.artifacts(seed_project, "podman", deployment="flash-next-int4-3x3090")
    assert plan.image == f"127.0.0.1:5000/vllm-3x3090@{GOLDEN_BUILD_DIGEST}" and plan.image_pinned
    assert f"IMAGE=127.0.0.1:5000/vllm-3x3090@{GOLDEN_BUILD_DIGEST}\n" in files[0].content


def test_missing_build_pin_is_refused_with_the_fixing_command(tmp_path: Path) -> None:
    project = Project(tmp_path)
    (tmp_path / "deployments").mkdir()
    (tmp_path / "deployments/flash-next-int4-3x3090.yaml").write_text(
        (REPO / "deployments/flash-next-int4-3x3090.yaml").read_text()
    )
    with pytest.raises(LockError, match="invoke build --deployment flash-next-int4-3x3090"):
        deploy.artifacts(project, "podman")


def test_no_image_is_refused_with_how_to_set_one(tmp_path: Path) -> None:
    data = standin_deployment(tmp_path, name="noimage")
    data["engine"].pop("image")  # type: ignore[attr-defined]
    project = write_project(tmp_path, data)
    with pytest.raises(RigsmithError, match="names no container image") as err:
        deploy.artifacts(project, "podman")
    assert "--image REF" in str(err.value) and "invoke build" in str(err.value)
    assert "the recipe ran vLLM outside a container" in str(err.value)
    _, files = deploy.artifacts(project, "podman", image="localhost/x@sha256:" + "a" * 64)
    assert "IMAGE=localhost/x@sha256:" in files[0].content
    # A record whose image import left out (seed 000: a truncated digest) says that, not "a venv".
    left = {"item": "pinned by image digest sha256:43f1…47bb96", "why": "the digest is truncated"}
    data["not_taken"] = [left]
    project = write_project(tmp_path / "record", data)
    with pytest.raises(RigsmithError, match="names no container image") as err:
        deploy.artifacts(project, "podman")
    said = str(err.value)
    assert "sha256:43f1…47bb96: the digest is truncated" in said and "vLLM outside" not in said


def test_unfilled_placeholders_are_refused_naming_each(tmp_path: Path) -> None:
    data = standin_deployment(tmp_path, name="holes", placeholders={"<repo>": None, "<vllm tree>": None})
    project = write_project(tmp_path, data)
    with pytest.raises(SpecError) as err:
        deploy.artifacts(project, "podman")
    assert [p for p, _ in err.value.problems] == ["placeholders", "placeholders"]
    assert "'<repo>' has no value" in str(err.value) and "'<vllm tree>' has no value" in str(err.value)


def test_grace_shorter_than_vllm_drain_is_refused(tmp_path: Path) -> None:
    data = standin_deployment(tmp_path, name="grace", resources={"stop_grace_seconds": 30})
    project = write_project(tmp_path, data)
    with pytest.raises(
        SpecError, match=r"resources.stop_grace_seconds: is 30s but vLLM --shutdown-timeout is 60s"
    ):
        deploy.artifacts(project, "podman")


def test_deploy_asks_before_overwriting_and_check_detects_drift(tmp_path: Path) -> None:
    data = standin_deployment(tmp_path, name="consent")
    project = write_project(tmp_path, data)
    out = tmp_path / "out"
    deploy.deploy(project, "podman", out=out, echo=_quiet)
    deploy.deploy(project, "podman", out=out, check=True, echo=_quiet)
    run = out / "podman/consent/run.sh"
    run.write_text(run.read_text() + "# my edit\n")
    with pytest.raises(DriftError):
        deploy.deploy(project, "podman", out=out, check=True, echo=_quiet)
    with pytest.raises(ConsentError):
        deploy.deploy(project, "podman", out=out, echo=_quiet)
    assert run.read_text().endswith("# my edit\n")
    deploy.deploy(project, "podman", out=out, yes=True, echo=_quiet)
    assert not run.read_text().endswith("# my edit\n")


def test_cli_deploy_refuses_without_terminal_then_accepts_yes(tmp_path: Path) -> None:
    data = standin_deployment(tmp_path, name="cli")
    project = write_project(tmp_path, data)
    first = invoke_cli(project.root, "deploy", "--target", "podman")
    assert first.returncode == 0, first.stderr
    assert "create  podman/cli/run.sh" in first.stdout
    run = project.root / "podman/cli/run.sh"
    run.write_text("# mine\n")
    second = invoke_cli(project.root, "deploy", "--target", "podman", "--deployment", "cli")
    assert second.returncode == 1
    assert "would change existing file(s): podman/cli/run.sh (conflict)" in second.stderr
    assert "Traceback" not in second.stderr and run.read_text() == "# mine\n"
    third = invoke_cli(project.root, "deploy", "--target", "podman", "--yes")
    assert third.returncode == 0 and "conflict  podman/cli/run.sh" in third.stdout
    assert run.read_text().startswith("#!/usr/bin/env bash\n# Generated by rigsmith")


def test_cli_unknown_target_and_deployment_are_clear(tmp_path: Path) -> None:
    project = write_project(tmp_path, standin_deployment(tmp_path, name="one"))
    bad = invoke_cli(project.root, "deploy", "--target", "swarm")
    assert bad.returncode == 1 and "unknown target 'swarm'" in bad.stderr
    missing = invoke_cli(project.root, "deploy", "--target", "podman", "--deployment", "nope")
    assert (
        missing.returncode == 1
        and "no deployment 'nope'" in missing.stderr
        and "known: one" in missing.stderr
    )


@pytest.mark.parametrize(
    ("extra", "var"),
    [(["--api-key", "sk-live-123"], "VLLM_API_KEY"), (["--api-key=sk-live-123"], "VLLM_API_KEY"),
     (["--hf-token", "hf_abc"], "HF_TOKEN")],
)  # fmt: skip
def test_a_secret_flag_value_in_the_args_is_refused_for_every_target(
    tmp_path: Path, extra: list[str], var: str
) -> None:
    data = standin_deployment(tmp_path, name="keyed", placeholders={})
    args = [*data["engine"]["args"], *extra]  # type: ignore[index]
    data["engine"] = {**data["engine"], "args": args}  # type: ignore[dict-item]
    project = write_project(tmp_path, data)
    for target in targets.renderers():
        with pytest.raises(SpecError) as err:
            deploy.artifacts(project, target, out=tmp_path / "out")
        assert err.value.problems[0][0] == f"engine.args[{len(args) - len(extra)}]"
        assert f"add env {var} with secret: true" in str(err.value)
        assert "sk-live-123" not in str(err.value) and "hf_abc" not in str(err.value)


def test_hf_token_without_a_value_is_not_a_secret(tmp_path: Path) -> None:
    data = standin_deployment(tmp_path, name="keyless", placeholders={})
    data["engine"] = {**data["engine"], "args": [*data["engine"]["args"], "--hf-token"]}  # type: ignore[index,dict-item]
    deploy.artifacts(write_project(tmp_path, data), "podman", out=tmp_path / "out")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["deploy", "--target", "lxc", "--vmid", "abc"], "--vmid 'abc' is not a whole number"),
        # the hint is an example --memlock takes (issue 27: it used to say "e.g. --memlock 509")
        (["deploy", "--target", "podman", "--memlock", "lots"], "--memlock 'lots' is not unlimited, host"),
        (
            ["deploy", "--target", "podman", "--memlock", "0"],
            "--memlock '0' is not unlimited, host or a byte",
        ),
        (["check-container", "--memlock", "x"], "--memlock 'x' is not unlimited, host or a byte count"),
        (["wait", "--timeout", "soon"], "--timeout 'soon' is not a number of seconds"),
        (["bench", "--max-tokens", "many"], "--max-tokens 'many' is not a whole number"),
        (["bench", "--prompt-words", "long"], "--prompt-words 'long' is not a whole number"),
    ],
)
def test_cli_bad_numbers_are_one_paragraph_errors_not_tracebacks(
    tmp_path: Path, argv: list[str], message: str
) -> None:
    project = write_project(tmp_path, standin_deployment(tmp_path, name="one"))
    proc = invoke_cli(project.root, *argv)
    assert proc.returncode == 1, proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_an_image_reference_that_is_not_one_is_refused_naming_where_it_came_from(tmp_path: Path) -> None:
    data = standin_deployment(tmp_path, name="img", placeholders={})
    data["engine"] = {**data["engine"], "image": "localhost/x:1\nExecStartPre=/bin/id"}  # type: ignore[dict-item]
    project = write_project(tmp_path, data)
    for target in targets.renderers():
        with pytest.raises(SpecError) as err:
            deploy.artifacts(project, target, out=tmp_path / "out")
        assert err.value.problems[0][0] == "engine.image" and "not a valid repository name" in str(err.value)
        with pytest.raises(SpecError) as err:
            deploy.artifacts(project, target, out=tmp_path / "out", image="BAD REF")
        assert err.value.problems[0][0] == "--image" and "image reference 'BAD REF'" in str(err.value)


@pytest.mark.parametrize("host", ["./cache", "$(pwd)", "hf_cache", "models/x", "~user/x"])
def test_a_relative_host_path_is_refused_for_every_target(tmp_path: Path, host: str) -> None:
    data = standin_deployment(
        tmp_path, name="rel", placeholders={}, mounts=[{"host": host, "container": "/workspace"}]
    )
    data["model"] = {**data["model"], "local_dir": host}  # type: ignore[dict-item]
    project = write_project(tmp_path, data)
    for target in targets.renderers():
        with pytest.raises(SpecError) as err:
            deploy.artifacts(project, target, out=tmp_path / "out")
        # The spec's own problems come first; the one pass adds what the target cannot express.
        assert [p for p, _ in err.value.problems][:2] == ["model.local_dir", "mounts[0].host"], target
        assert "is relative (to where the recipe ran)" in str(err.value)


def test_identifiers_with_a_trailing_newline_never_reach_a_target(tmp_path: Path) -> None:
    # The spec's patterns are anchored with \Z (a `$` anchor accepts a trailing newline, and the lxc target
    # then dropped the GPU's device node); the spec refuses them before any target renders.
    data = standin_deployment(tmp_path, name="nl", placeholders={}, env=[{"name": "A\n", "value": "1"}])
    data["resources"]["shm_size"] = "8g\n"  # type: ignore[index]
    data["resources"]["gpus"]["cdi_devices"] = ["nvidia.com/gpu=0\n"]  # type: ignore[index]
    project = write_project(tmp_path, data)
    for target in targets.renderers():
        with pytest.raises(SpecError) as err:
            deploy.artifacts(project, target, deployment="nl", out=tmp_path / "out")
        fields = [p for p, _ in err.value.problems]
        assert fields == ["env[0].name", "resources.gpus.cdi_devices", "resources.shm_size"], (
            target,
            fields,
        )


@pytest.mark.parametrize("target", sorted(targets.renderers()))
def test_next_steps_point_into_the_out_directory(seed_project: Project, tmp_path: Path, target: str) -> None:
    said: list[str] = []
    out = tmp_path / "my out"
    deploy.deploy(seed_project, target, deployment=SEEDS[1], out=out, echo=said.append)
    steps = said[said.index(next(s for s in said if not s.lstrip().startswith(("create", "image:")))) :]
    where = {
        "podman": f"start: '{out}/podman/{SEEDS[1]}/run.sh'",
        "quadlet": f"install: cp '{out}/quadlet/{SEEDS[1]}.container' /etc/containers/systemd/",
        "compose": f"'{out}/compose/{SEEDS[1]}/compose.yaml'",
        "lxc": f"merge '{out}/lxc/{SEEDS[1]}'/*.conf into /etc/pve/lxc/",
        "kube": f"kubectl apply -f '{out}/kube/{SEEDS[1]}.yaml'",
    }[target]
    assert any(where in s for s in steps), steps
    said.clear()
    deploy.deploy(seed_project, target, deployment=SEEDS[1], echo=said.append, yes=True)
    assert str(tmp_path) not in "\n".join(said)  # in the checkout: relative paths, as before


def test_a_local_build_is_pinned_by_its_image_id_and_kube_refuses_it(seed_project: Project) -> None:
    """A build never pushed runs by the image ID the lock records (content-addressed: pinned) on this
    host's targets; a kube manifest would name an image no cluster node can pull, so kube refuses with the
    push step."""
    from rigsmith.resolving.lock import lock as lockmod

    lock = lockmod.read(seed_project.lock_path)
    local = lock.builds["vllm-3x3090"].model_copy(update={"digest": None})
    lock = lock.model_copy(update={"builds": {"vllm-3x3090": local}})
    seed_project.lock_path.write_text(lockmod.dumps(lock))
    said: list[str] = []
    plan, _files = deploy.artifacts(seed_project, "podman", deployment=SEEDS[0])
    assert plan.image == local.image_id and plan.image_pinned
    assert "the local build's image ID from rigsmith.lock" in deploy.image_line(plan.image, plan.image_pinned)
    with pytest.raises(SpecError) as err:
        deploy.deploy(seed_project, "kube", deployment=SEEDS[0], echo=said.append)
    assert "no cluster node can pull it" in str(err.value)
    assert f"invoke build --push REGISTRY --deployment {SEEDS[0]}" in str(err.value)
