"""Issue 36: the shipped deployments are generated — ``invoke import-recipe`` of the seed texts under
examples/ with their answers files writes deployments/flash-next-int4-3x3090.yaml and
flash-next-merlin-4x3090.yaml byte for byte; seed 000's record is read item by item (every load-bearing
item in a field, a note or ``not_taken``); the generated spec deploys to all five targets."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from rigsmith import spec as specmod
from rigsmith.errors import RecipeError
from rigsmith.importing import answers as answersmod
from rigsmith.importing import importer, recipe
from rigsmith.importing.recipe.record import form as recordform
from rigsmith.project import Project
from rigsmith.rendering import deploy
from tests.support.common import REPO, invoke_cli

RECORD = "examples/records/flash-next-int4-3x3090.txt"
MERLIN = "examples/recipes/qwen3-8-flash-next-w4a16-merlin-on-4x-rtx-3090-tp2xpp2-ep-mtp3-f.json"
EXAMPLES = {
    "flash-next-int4-3x3090": (RECORD, "examples/flash-next-int4-3x3090.answers.yaml"),
    "flash-next-merlin-4x3090": (MERLIN, "examples/flash-next-merlin-4x3090.answers.yaml"),
}


def _project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    (root / "deployments").mkdir(parents=True)
    shutil.copytree(REPO / "images", root / "images")
    return root


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_import_recipe_with_the_answers_file_writes_the_shipped_spec(tmp_path: Path, name: str) -> None:
    root = _project(tmp_path)
    source, answers = EXAMPLES[name]
    proc = invoke_cli(root, "import-recipe", source, "--yes", "--answers", answers)
    assert proc.returncode == 0, proc.stderr
    generated = (root / "deployments" / f"{name}.yaml").read_text()
    shipped = (REPO / "deployments" / f"{name}.yaml").read_text()
    assert generated == shipped, f"regenerate: invoke import-recipe {source} --yes --answers {answers}"


def _int4() -> specmod.Deployment:
    return specmod.load(REPO / "deployments" / "flash-next-int4-3x3090.yaml")


def _said(dep: specmod.Deployment) -> str:
    """Everything the spec says in words: notes, env notes and notes of variables, not_taken."""
    words = [*dep.notes, *dep.env_notes, *(e.note or "" for e in dep.env)]
    words += [f"{n.item} {n.why}" for n in dep.not_taken]
    return "\n".join(words)


def test_every_load_bearing_item_of_seed_000_is_a_field_or_named() -> None:
    dep = _int4()
    args = dep.engine.args
    # the Config paragraph, flag by flag, in the record's order
    assert dep.engine.flag_value("--pipeline-parallel-size") == "3"
    assert dep.engine.flag_value("--tensor-parallel-size") == "1"
    assert "--language-model-only" in args and "--no-enable-prefix-caching" in args
    assert dep.engine.flag_value("--engram-config") == '{"cpu_offload":true}'
    assert dep.engine.flag_value("--max-model-len") == "262144"
    assert dep.engine.flag_value("--max-num-seqs") == "4"
    assert dep.engine.flag_value("--max-num-batched-tokens") == "512"
    assert dep.engine.flag_value("--gpu-memory-utilization") == "0.97"
    assert dep.engine.flag_value("--kv-cache-memory") == "550000000"
    assert dep.engine.flag_value("--compilation-config") == (
        '{"cudagraph_mode":"FULL_DECODE_ONLY","cudagraph_capture_sizes":[1,2,4]}'
    )
    assert "do NOT round up" in _said(dep)
    # the Env: list, every shorthand mapped (and each mapping a note)
    env = {e.name: e.value for e in dep.env}
    assert env == {
        "VLLM_PLE_MMAP": "1",
        "VLLM_PLE_MMAP_PATH": "/workstation/ngram_table.bin",
        "VLLM_USE_BREAKABLE_CUDAGRAPH": "0",
        "VLLM_QSA_KV_OFFLOAD": "1",
        "VLLM_QSA_KV_OFFLOAD_MAX_GIB": "56",
        "VLLM_QSA_KV_OFFLOAD_ARENA": "100663296",
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
        "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS": "0",
    }
    assert all(e.note and e.note.startswith("record: ") for e in dep.env)
    # pitfall 2: the sparse file at its exact size
    (ple,) = dep.mounts
    assert (ple.kind, ple.sparse_size, ple.container) == (
        "file",
        102400491520,
        "/workstation/ngram_table.bin",
    )
    # "container on localhost": loopback only
    assert dep.network.listen == "127.0.0.1" and dep.engine.flag_value("--host") == "127.0.0.1"
    # the measured numbers, the proxy, the host
    assert [(b.name, b.streams, b.tokens_per_second) for b in dep.benchmarks] == [
        ("decode_1stream", 1, 67.4),
        ("decode_2stream_aggregate", 2, 73.1),
    ]
    assert dep.proxy is not None and (dep.proxy.family, dep.proxy.port) == ("flashnext-int4-vllm-262k", 12434)
    assert dep.proxy.backend_managed is False
    gpus = dep.resources.gpus
    assert (gpus.count, gpus.model, gpus.vram_gib, dep.resources.host_ram_gib) == (3, "RTX 3090", 24.0, 125.0)
    assert dep.podman_version == "4.9.3" and dep.engine.build == "vllm-3x3090"
    assert dep.model.size_bytes == 164 * 2**30
    # pitfalls 1, 3, 4 kept with what they became; what was not taken is named with its reason
    said = _said(dep)
    for pitfall in (
        "Pitfall 1: podman-compose 1.0.6",
        "Pitfall 3: GPU squatters",
        "Pitfall 4: Patched image",
    ):
        assert pitfall in said
    assert "VRAM holders" in said and "deploy --target podman" in said
    not_taken = {n.item: n.why for n in dep.not_taken}
    assert "truncated" in not_taken["pinned by image digest sha256:43f13b4c…47bb96"]
    assert "Stop: sudo podman rm -f flash-next" in not_taken
    assert "2.2x the best llama.cpp UD-Q4_K_XL config (31.1 tok/s)" in not_taken


def test_nothing_of_the_record_disappears() -> None:
    """Every line of the record (but the headings, and the title: the description) is in the spec's words."""
    dep = _int4()
    said = " ".join(_said(dep).split())
    title, items, empty = recordform.blocks((REPO / RECORD).read_text())
    assert dep.description == title
    for block in items:
        # an ops bullet is listed command by command; a Config paragraph's Env: list is the env notes'
        parts = block.text.split("; ") if block.label == "Start" else re.split(r"\.\s+Env:", block.text)
        for part in parts:
            assert " ".join(part.split()).strip(" .") in said, part
    for heading in empty:
        assert heading in said


VARIED = """\
Tensor parallel on two cards

What we tried

A quick check of TP=2 for a mid-size model.

Notebook

- Host: 2x RTX 4090, 64 GB RAM, Debian 12
- Model: someorg/Mid-Model-AWQ @ revision 0123456789abcdef0123456789abcdef01234567 (20 GB, AWQ)
- Serving: the API on all interfaces for the LAN
- Result: 91.5 tok/s single-stream, 150 tok/s 4-stream aggregate

Flags

TP=2, max-model-len 32768, gpu-util 0.9, enforce eager, swap-space 4, frobnicate 7. \
Env: expandable_segments, \
VLLM_ATTENTION_BACKEND=FLASHINFER, FOO_BAR=3.

Gotchas

1. The cache file must pre-exist: fallocate -l 1G /data/cache.bin before starting.
2. Another process on the GPU made it OOM.
"""


def test_the_rules_are_about_record_forms_not_seed_000s_strings() -> None:
    dep = recipe.parse(VARIED, source="varied.txt", sha256="0" * 64, accept=True)
    assert dep.description == "Tensor parallel on two cards"
    assert list(dep.engine.args) == [
        "someorg/Mid-Model-AWQ",
        "--host",
        "0.0.0.0",
        "--port",
        "8000",
        "--tensor-parallel-size",
        "2",
        "--max-model-len",
        "32768",
        "--gpu-memory-utilization",
        "0.9",
        "--enforce-eager",
        "--swap-space",
        "4",
    ]
    assert dep.network.listen == "0.0.0.0"
    assert (
        dep.model.revision == "0123456789abcdef0123456789abcdef01234567"
        and dep.model.size_bytes == 20 * 10**9
    )
    assert (dep.resources.gpus.count, dep.resources.gpus.model, dep.resources.host_ram_gib) == (
        2,
        "RTX 4090",
        64.0,
    )
    assert [(b.name, b.streams, b.tokens_per_second) for b in dep.benchmarks] == [
        ("decode_1stream", 1, 91.5),
        ("decode_4stream_aggregate", 4, 150.0),
    ]
    (cache,) = dep.mounts
    assert (cache.host, cache.container, cache.kind, cache.sparse_size) == (
        "/data/cache.bin",
        "/data/cache.bin",
        "file",
        2**30,
    )
    env = {e.name: e.value for e in dep.env}
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert env["VLLM_ATTENTION_BACKEND"] == "FLASHINFER"  # a full name: as stated
    # FOO_BAR=3 is a guess (VLLM_FOO_BAR): unanswered, a placeholder deploy refuses until filled
    assert env["VLLM_FOO_BAR"] == "<FOO_BAR>" and dep.placeholders["<FOO_BAR>"] is None
    assert dep.unfilled_placeholders() == ["<FOO_BAR>"]
    assert {n.item for n in dep.not_taken} == {"frobnicate 7"}
    assert "VRAM holders" in _said(dep)


def test_a_guess_is_asked_and_an_answer_replaces_the_placeholder() -> None:
    given = answersmod.Answers(answers={"env.FOO_BAR": "MY_FOO=3", "network.port": "9001"})
    dep = recipe.parse(VARIED, source="varied.txt", sha256="0" * 64, accept=True, answer=given.answer)
    env = {e.name: e.value for e in dep.env}
    assert env["MY_FOO"] == "3" and "VLLM_FOO_BAR" not in env and dep.placeholders == {}
    assert dep.network.port == 9001


def test_seed_000_unanswered_leaves_placeholders_and_deploy_refuses(empty_project: Project) -> None:
    dep = importer.import_recipe(empty_project, str(REPO / RECORD), yes=True, echo=lambda _m: None)
    assert dep.mounts[0].host == "<WORKSTATION>/ngram_table.bin"
    assert set(dep.unfilled_placeholders()) == {
        "<WORKSTATION>",
        "<PLE mmap>",
        "<QSA_KV_OFFLOAD>",
        "<QSA_KV_OFFLOAD MAX_GIB>",
        "<QSA_KV_OFFLOAD ARENA>",
    }
    assert dep.engine.build is None
    assert any(n.item == "engine.build" for n in dep.not_taken)
    with pytest.raises(Exception) as err:
        deploy.deploy(
            empty_project, "podman", deployment=dep.name, out=empty_project.root / "out", echo=lambda _m: None
        )
    assert "<WORKSTATION>" in str(err.value)


def test_an_answer_to_no_question_is_refused(tmp_path: Path, empty_project: Project) -> None:
    bad = tmp_path / "a.yaml"
    bad.write_text("answers:\n  network.prot: 8001\n")
    with pytest.raises(RecipeError) as err:
        importer.import_recipe(
            empty_project, str(REPO / RECORD), yes=True, answers_file=str(bad), echo=lambda _m: None
        )
    assert "network.prot" in err.value.message and "network.port" in err.value.message
    assert not list((empty_project.root / "deployments").glob("*.yaml"))
    bad.write_text("answer:\n  network.port: 8001\n")
    with pytest.raises(RecipeError) as err:
        importer.import_recipe(
            empty_project, str(REPO / RECORD), yes=True, answers_file=str(bad), echo=lambda _m: None
        )
    assert "answer" in err.value.message


@pytest.mark.parametrize("target", ["podman", "quadlet", "compose", "lxc", "kube"])
def test_the_generated_spec_deploys_to_every_target(tmp_path: Path, target: str) -> None:
    root = _project(tmp_path)
    shutil.copy(REPO / "deployments" / "flash-next-int4-3x3090.yaml", root / "deployments")
    project = Project(root)
    out = tmp_path / "out"
    deploy.deploy(
        project,
        target,
        deployment="flash-next-int4-3x3090",
        out=out,
        image="localhost/vllm-3x3090:test",
        echo=lambda _m: None,
    )
    text = "\n".join(p.read_text() for p in out.rglob("*") if p.is_file())
    assert "/srv/flash-next/ngram_table.bin" in text
    # "container on localhost": the engine's own argv binds loopback (every target runs it on the host's
    # network, so that argv is the whole exposure), and nothing publishes a port wider
    argv = _engine_argv(target, out)
    assert argv.count("--host") == 1 and argv[argv.index("--host") + 1] == "127.0.0.1"
    if target in ("podman", "compose", "lxc"):  # the targets that check or create the file before a start
        assert "102400491520" in text


def _engine_argv(target: str, out: Path) -> list[str]:
    """The engine's argv as each target's artifact holds it (parsed as its consumer reads it)."""
    import shlex

    import yaml

    name = "flash-next-int4-3x3090"
    if target == "compose":
        svc = yaml.safe_load((out / "compose" / name / "compose.yaml").read_text())["services"][name]
        assert svc["network_mode"] == "host" and "ports" not in svc
        return [str(w) for w in svc["command"]]
    if target == "kube":
        pod = next(d for d in yaml.safe_load_all((out / "kube" / f"{name}.yaml").read_text()) if d)
        spec = pod["spec"]["template"]["spec"] if "template" in pod["spec"] else pod["spec"]
        assert spec["hostNetwork"] is True and "ports" not in spec["containers"][0]
        return [str(w) for w in spec["containers"][0]["args"]]
    if target == "quadlet":
        unit = (out / "quadlet" / f"{name}.container").read_text()
        assert "Network=host" in unit and "PublishPort=" not in unit
        return shlex.split(next(ln for ln in unit.splitlines() if ln.startswith("Exec=")).split("=", 1)[1])
    script = out / "podman" / name / "run.sh" if target == "podman" else out / "lxc" / name / "provision.sh"
    text = script.read_text().replace("\\\n", " ")
    run = shlex.split(next(ln for ln in text.splitlines() if "--network host" in ln and "--host" in ln))
    assert not {"-p", "--publish", "-P", "--publish-all"} & set(run)
    return run


def test_the_same_answers_typed_at_the_terminal_write_the_same_spec(tmp_path: Path) -> None:
    """The answers file stands in for the terminal: typed on a real pty (Enter takes a default or a guess),
    the same values give the shipped spec byte for byte."""
    import os
    import subprocess
    import sys

    root = _project(tmp_path)
    typed = [
        "/srv/models/Qwen3.8-Flash-Next-INT4-Mixed-AutoRound",  # model.local_dir
        "/srv/flash-next",  # placeholders.<WORKSTATION>
        "",  # engine.build: Enter takes vllm-3x3090
        "8001",  # network.port
        "VLLM_PLE_MMAP=1 VLLM_PLE_MMAP_PATH=/workstation/ngram_table.bin",  # env.PLE mmap
        "",  # env.QSA_KV_OFFLOAD: Enter takes the VLLM_ guess
    ]
    master, slave = os.openpty()
    env = {**os.environ, "RIGSMITH_ROOT": str(root), "PYTHONPATH": f"{REPO / 'src'}:{REPO}"}
    argv = [sys.executable, "-m", "invoke", "-r", str(REPO), "import-recipe", RECORD, "--yes"]
    with subprocess.Popen(
        [*argv, "--name", "flash-next-int4-3x3090"],
        cwd=REPO,
        env=env,
        stdin=slave,
        stdout=slave,
        stderr=slave,
    ) as proc:
        os.close(slave)
        os.write(master, "".join(f"{line}\n" for line in typed).encode())
        out = b""
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the command exited and closed the terminal
                break
            if not chunk:
                break
            out += chunk
        assert proc.wait(timeout=120) == 0, out.decode()
    os.close(master)
    text = out.decode()
    for key in (
        "(model.local_dir)",
        "(placeholders.<WORKSTATION>)",
        "[vllm-3x3090] (engine.build)",
        "(network.port)",
    ):
        assert key in text
    generated = (root / "deployments" / "flash-next-int4-3x3090.yaml").read_text()
    assert generated == (REPO / "deployments" / "flash-next-int4-3x3090.yaml").read_text()


def test_a_record_that_says_nothing_of_exposure_listens_on_loopback() -> None:
    text = (
        "One card, short context\n\nSetup\n\n* Model: org/Small-Model\n* Host: 1x RTX 3090\n\nFlags\n\n"
        "max-model-len 8192, max-num-seqs 2\n\nEnv: VLLM_LOGGING_LEVEL=DEBUG\n"
    )
    dep = recipe.parse(text, source="small.txt", sha256="0" * 64, accept=True)
    assert dep.name == "small-model"
    assert dep.network.listen == "127.0.0.1" and dep.engine.flag_value("--host") == "127.0.0.1"
    assert {e.name: e.value for e in dep.env} == {"VLLM_LOGGING_LEVEL": "DEBUG"}
    assert any(
        n.startswith("(the record says nothing of where it served) → network.listen 127.0.0.1")
        for n in dep.notes
    )
