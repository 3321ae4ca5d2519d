"""Issue 13 item 6: secondary Hub models (draft, tokenizer, LoRA) are locked, fetched, verified and mounted
like the main model; a GGUF reference runs its .gguf file. Real huggingface_hub against the local Hub
stand-in; real targets rendered from the imported spec."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rigsmith import secondary
from rigsmith import spec as specmod
from rigsmith.errors import LockDriftError, LockError, SpecError
from rigsmith.importing import recipe
from rigsmith.operating.doctor import drift
from rigsmith.project import Project
from rigsmith.rendering import deploy
from rigsmith.resolving.lock import lock as lockmod
from rigsmith.resolving.model.secondaryfetch import fetch_models, pin_models
from tests.support.models import digest, tiny_files

RECIPE = (
    "vllm serve acme/main --speculative-config "
    '\'{"model": "acme/draft", "num_speculative_tokens": 3, "method": "draft_model"}\' '
    "--tokenizer acme/tok --enable-lora --lora-modules a=acme/lora"
)
TARGETS = ("podman", "quadlet", "compose", "lxc", "kube")


def _imported(tmp_path: Path, text: str = RECIPE) -> tuple[Project, specmod.Deployment]:
    """The recipe imported, its model dir under tmp, written as a project's only deployment."""
    dep = recipe.parse(text, source="t", sha256="0" * 64)
    model = dep.model.model_copy(update={"local_dir": str(tmp_path / "models" / "main")})
    engine = dep.engine.model_copy(update={"image": "localhost/vllm:1"})
    dep = specmod.loads(specmod.dump(dep.model_copy(update={"model": model, "engine": engine})))
    project = Project(tmp_path / "proj")
    project.spec_path(dep.name).parent.mkdir(parents=True)
    project.spec_path(dep.name).write_text(specmod.dump(dep), encoding="utf-8")
    return project, dep


def _hub_repos(hub) -> dict[str, tuple[str, dict[str, bytes]]]:
    out = {}
    for repo in ("acme/main", "acme/draft", "acme/tok", "acme/lora"):
        files = tiny_files(repo, shards=1, shard_size=1 << 16)
        out[repo] = (hub.repo(repo).add_commit(files), files)
    return out


def test_secondary_models_are_locked_fetched_verified_and_mounted(hub, client, tmp_path: Path) -> None:
    project, dep = _imported(tmp_path)
    assert [(m.role, m.repo) for m in dep.secondary_models] == [
        ("speculative", "acme/draft"),
        ("tokenizer", "acme/tok"),
        ("lora", "acme/lora"),
    ]
    repos = _hub_repos(hub)

    pin_models(project, dep, hub=client, echo=lambda _m: None)
    lock = lockmod.read(project.lock_path)
    assert json.loads(project.lock_path.read_text())["version"] == 2
    assert lock.models[dep.name].commit == repos["acme/main"][0]
    for repo in ("acme/draft", "acme/tok", "acme/lora"):
        entry = lock.secondary[dep.name][repo]
        sha, files = repos[repo]
        assert entry.commit == sha and sorted(entry.files) == sorted(files)
        for path, data in files.items():
            kind = "sha256" if path.endswith(".safetensors") else "git_sha1"
            assert getattr(entry.files[path], kind) == digest(kind, data), (repo, path)

    # Secondaries not pinned yet are no drift (nothing pinned to differ from): the note names them.
    bare = lockmod.read(project.lock_path)
    bare.secondary.clear()
    fresh = drift.model_facts(dep, bare)
    assert fresh.note is not None and "acme/draft" in fresh.note
    assert not [p for p in fresh.problems if "secondary" in p]

    report = fetch_models(project, dep, hub=client, echo=lambda _m: None)
    models = tmp_path / "models"
    for repo, name in (("acme/draft", "draft"), ("acme/lora", "lora")):
        for path, data in repos[repo][1].items():
            assert (models / name / path).read_bytes() == data
    # A tokenizer repo gives its tokenizer and config files, not its weights.
    tok = repos["acme/tok"][1]
    assert (models / "tok/tokenizer/tokenizer.json").read_bytes() == tok["tokenizer/tokenizer.json"]
    assert not list((models / "tok").glob("*.safetensors"))
    assert [r for r, _ in report.secondary] == ["acme/draft", "acme/tok", "acme/lora"]
    assert "acme/draft: " in report.summary()

    # The drift check (doctor, up, verify) hashes the secondary dirs too and names a corrupted file.
    weights = next(p for p in repos["acme/draft"][1] if p.endswith(".safetensors"))
    target = models / "draft" / weights
    target.write_bytes(b"\0" + target.read_bytes()[1:])
    facts = drift.model_facts(dep, lockmod.read(project.lock_path), verify=True)
    assert any("acme/draft" in p and weights in p for p in facts.problems), facts.problems
    with pytest.raises(LockDriftError, match=weights):
        drift.gate(dep.name, facts, None)
    # fetch-model --verify finds it too, says so and restores the Hub's bytes.
    said: list[str] = []
    fetch_models(project, dep, verify=True, hub=client, echo=said.append)
    assert any(weights in s for s in said), said
    assert target.read_bytes() == repos["acme/draft"][1][weights]
    assert not drift.model_facts(dep, lockmod.read(project.lock_path), verify=True).problems


@pytest.mark.parametrize("target", TARGETS)
def test_every_target_mounts_the_secondaries_and_rewrites_their_words(target: str, tmp_path: Path) -> None:
    project, dep = _imported(tmp_path)
    plan, files = deploy.artifacts(project, target, deployment=dep.name, out=tmp_path / "out")
    models = tmp_path / "models"
    mounts = {(m.host, m.container, m.readonly, m.role) for m in plan.mounts}
    for name in ("draft", "tok", "lora"):
        assert (str(models / name), f"/models/{name}", True, "secondary") in mounts
    args = list(plan.command)
    spec_conf = json.loads(args[args.index("--speculative-config") + 1])
    assert spec_conf == {"model": "/models/draft", "num_speculative_tokens": 3, "method": "draft_model"}
    assert args[args.index("--tokenizer") + 1] == "/models/tok"
    assert args[args.index("--lora-modules") + 1] == "a=/models/lora"
    text = "\n".join(f.content if isinstance(f.content, str) else f.content.decode() for f in files)
    for name in ("draft", "tok", "lora"):
        assert str(models / name) in text and f"/models/{name}" in text, name
    for repo in ("acme/draft", "acme/tok", "acme/lora"):
        assert repo not in text, f"{target} still names {repo}"


def test_json_lora_module_and_flag_equals_forms_are_rewritten(tmp_path: Path) -> None:
    project, dep = _imported(
        tmp_path,
        "vllm serve acme/main --tokenizer=acme/tok --enable-lora "
        '--lora-modules \'{"name": "b", "path": "acme/lora", "base_model_name": "acme/main"}\'',
    )
    plan, _ = deploy.artifacts(project, "podman", deployment=dep.name, out=tmp_path / "out")
    assert "--tokenizer=/models/tok" in plan.command
    conf = json.loads(plan.command[plan.command.index("--lora-modules") + 1])
    assert conf == {"name": "b", "path": "/models/lora", "base_model_name": "acme/main"}


def test_secondary_placement_is_overridable_and_checked(tmp_path: Path) -> None:
    _project, dep = _imported(tmp_path)
    data = specmod.to_data(dep)
    data["secondary_models"][0]["local_dir"] = str(tmp_path / "elsewhere" / "d")
    data["secondary_models"][0]["container_path"] = "/drafts/d"
    moved = specmod.from_data(data)
    placed = {(p.local_dir, p.container_path) for p in secondary.placements(moved)}
    assert (str(tmp_path / "elsewhere" / "d"), "/drafts/d") in placed
    data["secondary_models"][1]["container_path"] = dep.model.container_path
    with pytest.raises(SpecError, match=r"secondary_models\[1\]\.container_path"):
        specmod.from_data(data)
    data = specmod.to_data(dep)
    data["secondary_models"][1]["arg"] = 0
    with pytest.raises(SpecError, match=r"secondary_models\[1\]\.arg 0: engine\.args\[0\] does not name"):
        specmod.from_data(data)


def test_a_lock_without_secondaries_reads_and_writes_back_as_version_1(tmp_path: Path) -> None:
    path = tmp_path / "rigsmith.lock"
    old = lockmod.dumps(lockmod.Lock())
    assert json.loads(old)["version"] == 1 and "secondary" not in old
    path.write_text(old)
    with lockmod.locked(path):
        pass
    assert path.read_text() == old
    path.write_text('{"version": 3}\n')
    with pytest.raises(LockError, match="version 3"):
        lockmod.read(path)


GGUF = {
    "Qwen3-0.6B-Q4_K_M.gguf": b"GGUF" + b"4" * 4096,
    "Qwen3-0.6B-Q8_0.gguf": b"GGUF" + b"8" * 4096,
    "README.md": b"# gguf\n",
}


@pytest.mark.parametrize("target", TARGETS)
def test_gguf_reference_runs_the_locked_gguf_file(target: str, hub, client, tmp_path: Path) -> None:
    project, dep = _imported(tmp_path, "vllm serve acme/Qwen3-0.6B-GGUF:Q4_K_M --tokenizer acme/tok")
    # Without the lock, which file REPO:QUANT means is unknown: deploy says to pin, it does not guess.
    with pytest.raises(LockError) as err:
        deploy.artifacts(project, target, deployment=dep.name, out=tmp_path / "out")
    assert "invoke pin" in str(err.value)
    hub.repo("acme/Qwen3-0.6B-GGUF").add_commit(GGUF)
    hub.repo("acme/tok").add_commit(tiny_files("tok", shards=1, shard_size=1 << 12))
    pin_models(project, dep, hub=client, echo=lambda _m: None)
    plan, _ = deploy.artifacts(project, target, deployment=dep.name, out=tmp_path / "out")
    word = plan.command[len(dep.engine.subcommand) + (dep.engine.model_arg or 0)]
    assert word == f"{dep.model.container_path}/Qwen3-0.6B-Q4_K_M.gguf"
    assert "/models/tok" in plan.command


def test_a_venv_engine_names_the_secondary_host_dirs_in_the_ct(tmp_path: Path) -> None:
    _project, dep = _imported(tmp_path)
    model = dep.model.model_copy(update={"local_dir": "~/models/main"})
    engine = dep.engine.model_copy(update={"runtime": "venv", "venv": "/opt/venv", "image": None})
    dep = specmod.loads(specmod.dump(dep.model_copy(update={"model": model, "engine": engine})))
    project = Project(tmp_path / "venv-proj")
    project.spec_path(dep.name).parent.mkdir(parents=True)
    project.spec_path(dep.name).write_text(specmod.dump(dep), encoding="utf-8")
    dep_plan, files = deploy.artifacts(
        project, "lxc", deployment=dep.name, out=tmp_path / "out", home="/root"
    )
    assert "a=/root/models/lora" in dep_plan.command  # ~ is one home, written out (issue 24)
    text = "\n".join(f.content if isinstance(f.content, str) else f.content.decode() for f in files)
    assert "--tokenizer /root/models/tok --enable-lora --lora-modules a=/root/models/lora" in text
    assert '"{\\"model\\": \\"/root/models/draft\\", ' in text  # systemd-quoted JSON in ExecStart=
    for i, name in enumerate(("draft", "tok", "lora"), start=1):
        assert f"mp{i}: /root/models/{name},mp=/root/models/{name},ro=1" in text


def test_each_data_parallel_node_names_the_mounted_secondary(tmp_path: Path) -> None:
    from tests.support.cluster import DP_NAME, dp_data

    data = dp_data()
    draft = '{"model": "acme/draft", "num_speculative_tokens": 2}'
    data["engine"]["args"] += ["--speculative-config", draft]
    node1 = data["cluster"]["nodes"][1]
    node1["args"] = [*node1["args"], "--speculative-config", draft]
    data["secondary_models"] = [
        {"role": "speculative", "repo": "acme/draft", "arg": len(data["engine"]["args"]) - 1}
    ]
    project = Project(tmp_path / "dp")
    project.spec_path(DP_NAME).parent.mkdir(parents=True)
    project.spec_path(DP_NAME).write_text(specmod.dump(specmod.from_data(data)), encoding="utf-8")
    _plan, files = deploy.artifacts(project, "podman", deployment=DP_NAME, out=tmp_path / "out")
    scripts = [f for f in files if f.path.name == "run.sh"]
    assert len(scripts) == 2
    for f in scripts:
        text = str(f.content)
        assert "acme/draft" not in text and "/models/draft" in text, f.path
        assert "/models/draft:ro" in text, f.path
    # A node whose own argv does not name the draft as engine.args does is refused, naming the node.
    node1["args"] = node1["args"][:-2]
    project.spec_path(DP_NAME).write_text(specmod.dump(specmod.from_data(data)), encoding="utf-8")
    with pytest.raises(SpecError, match=r"cluster\.nodes\[1\]\.args: must name acme/draft"):
        deploy.artifacts(project, "podman", deployment=DP_NAME, out=tmp_path / "out")
