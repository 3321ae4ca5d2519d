"""Issue 35: every local path a vLLM flag names is a read-only mount, a secondary Hub model or a refusal
naming the flag — never dropped (importing/recipe/pathflags, driven by vllmflags' ``paths`` column). The
headline case runs on real podman: import-recipe and deploy through the CLI, then the LoRA adapter, the
draft model and the chat template are read inside the stand-in engine's container at the recipe's paths."""

from __future__ import annotations

import hashlib
import json
import shlex
from pathlib import Path

import pytest
import yaml

from rigsmith import spec as specmod
from rigsmith.errors import RecipeError
from rigsmith.importing import recipe, vllmflags
from tests.support.common import FAKE_VENDOR, HOST_MEMLOCK, invoke_cli, run_script
from tests.support.podman import Podman, parse_recording

KV = {"kv_connector": "SharedStorageConnector", "kv_role": "kv_both"}
#: (the flag's words with PATH for the local path, the mount's kind, read-only) — one row per path flag.
MOUNTED = {
    "--lora-modules": ("--enable-lora --lora-modules sql=PATH", "dir", True),
    "--speculative-config": ('--speculative-config {"model":"PATH","num_speculative_tokens":3}', "dir", True),
    "--speculative-model": ("--speculative-model PATH", "dir", True),
    "--tokenizer": ("--tokenizer PATH", "dir", True),
    "--chat-template": ("--chat-template PATH", "file", True),
    "--config": ("--config PATH", "file", True),
    "--kv-transfer-config": (
        "--kv-transfer-config "
        + json.dumps(
            {**KV, "kv_connector_extra_config": {"shared_storage_path": "PATH"}}, separators=(",", ":")
        ),
        "dir",
        False,
    ),
    "--allowed-local-media-path": ("--allowed-local-media-path PATH", "dir", True),
    "--ssl-keyfile": ("--ssl-keyfile PATH", "file", True),
    "--ssl-certfile": ("--ssl-certfile PATH", "file", True),
    "--ssl-ca-certs": ("--ssl-ca-certs PATH", "file", True),
}


def _words(template: str, path: str) -> list[str]:
    flag, _, value = template.rpartition(" ")
    return [*flag.split(), value.replace("PATH", path)]


def _parse(argv: list[str], image: str | None = "v:1") -> specmod.Deployment:
    text = shlex.join(argv)
    return recipe.parse(text, source="r.sh", sha256=hashlib.sha256(text.encode()).hexdigest(), image=image)


def _refusal(argv: list[str]) -> str:
    with pytest.raises(RecipeError) as err:
        _parse(argv)
    return str(err.value)


def test_the_table_of_path_flags_is_what_these_tests_cover() -> None:
    assert set(vllmflags.PATH_FLAGS) == set(MOUNTED)


@pytest.mark.parametrize("flag", list(MOUNTED))
def test_an_absolute_path_in_a_flag_is_mounted_at_the_same_path_and_the_argv_kept(flag: str) -> None:
    template, kind, readonly = MOUNTED[flag]
    words = _words(template, "/srv/rig/thing")
    dep = _parse(["vllm", "serve", "Qwen/Qwen3-0.6B", *words])
    assert list(dep.engine.args) == ["Qwen/Qwen3-0.6B", *words]
    (mount,) = dep.mounts
    assert (mount.host, mount.container, mount.kind, mount.readonly) == (
        "/srv/rig/thing",
        "/srv/rig/thing",
        kind,
        readonly,
    )
    assert flag in (mount.note or "")
    assert dep.secondary_models == ()
    if flag == "--config":
        assert any("vLLM reads more flags from that file" in n for n in dep.notes)


@pytest.mark.parametrize("flag", list(MOUNTED))
@pytest.mark.parametrize("path", ["./adapters/a", "adapters/a/b", "~/adapters/a", "bare"])
def test_a_relative_path_in_a_flag_is_a_placeholder_to_fill_and_configs_file_is_refused(
    flag: str, path: str
) -> None:
    """A directory only the recipe's author knew: the user names it (``--config``'s file holds flags
    rigsmith does not read, so it stays a refusal)."""
    template, _, _ = MOUNTED[flag]
    argv = ["vllm", "serve", "Qwen/Qwen3-0.6B", *_words(template, path)]
    if flag == "--config":
        message = _refusal(argv)
        assert flag in message and repr(path) in message and "write its absolute path" in message
        return
    dep = _parse(argv)
    token = "<" + flag.lstrip("-").upper().replace("-", "_") + ">"
    assert dep.unfilled_placeholders() == [token]
    assert not any(path in a for a in dep.engine.args)
    assert any(f"names {path!r}" in n and f"placeholder {token}" in n for n in dep.notes), dep.notes


@pytest.mark.parametrize(
    ("words", "role", "name"),
    [
        (["--enable-lora", "--lora-modules", "sql=org/sql-lora"], "lora", "sql"),
        (["--lora-modules", json.dumps({"name": "sql", "path": "org/sql-lora"})], "lora", "sql"),
        (
            ["--speculative-config", json.dumps({"model": "org/sql-lora", "num_speculative_tokens": 3})],
            "speculative",
            None,
        ),
        (["--tokenizer", "org/sql-lora"], "tokenizer", None),
    ],
)
def test_an_owner_name_in_a_model_flag_is_a_secondary_hub_model_and_the_rule_is_noted(
    words: list[str], role: str, name: str | None
) -> None:
    dep = _parse(["vllm", "serve", "Qwen/Qwen3-0.6B", *words])
    (sm,) = dep.secondary_models
    assert (sm.role, sm.repo, sm.name, sm.arg) == (role, "org/sql-lora", name, len(words))
    assert dep.mounts == ()
    assert any("org/sql-lora is a Hub repo id by rigsmith's rule" in n for n in dep.notes)


def test_the_model_word_owner_name_is_a_hub_id_and_the_rule_is_noted() -> None:
    dep = _parse(["vllm", "serve", "--model", "models/Qwen3-8B"])
    assert dep.model.repo == "models/Qwen3-8B"
    assert any("for a directory of that name write ./models/Qwen3-8B" in n for n in dep.notes)
    local = _parse(["vllm", "serve", "--model", "./models/Qwen3-8B"])
    assert local.model.repo is None and local.model.local_dir == "./models/Qwen3-8B"


def test_an_inline_chat_template_and_a_speculative_method_name_no_path() -> None:
    dep = _parse(
        [
            "vllm",
            "serve",
            "Qwen/Qwen3-0.6B",
            "--chat-template",
            "{% for m in messages %}{{ m }}{% endfor %}",
            "--speculative-model",
            "[ngram]",
        ]
    )
    assert dep.mounts == () and dep.secondary_models == ()


def test_a_path_left_to_fill_is_noted_with_the_mount_it_will_need() -> None:
    dep = _parse(["vllm", "serve", "Qwen/Qwen3-0.6B", "--lora-modules", "sql=<LORA_DIR>"])
    assert dep.placeholders == {"<LORA_DIR>": None}
    assert any(
        "--lora-modules sql '<LORA_DIR>' is a value you fill" in n and "mounts" in n for n in dep.notes
    )


def test_a_container_recipes_path_is_its_volumes_or_the_images_and_noted() -> None:
    dep = _parse(
        [
            "docker",
            "run",
            "--gpus",
            "all",
            "-v",
            "/srv/loras:/loras",
            "vllm/vllm-openai:v0.11.0",
            "Qwen/Qwen3-0.6B",
            "--lora-modules",
            "a=/loras/a",
            "--chat-template",
            "examples/t.jinja",
            "--tokenizer",
            "/opt/tok",
        ],
        image=None,
    )
    assert [(m.host, m.container) for m in dep.mounts] == [("/srv/loras", "/loras")]
    notes = "\n".join(dep.notes)
    assert "--lora-modules a /loras/a is in the recipe's volume /srv/loras:/loras" in notes
    assert "--chat-template examples/t.jinja is relative to the image's working directory" in notes
    assert "--tokenizer /opt/tok is under none of the recipe's volumes: the image must hold it" in notes


def test_two_flags_naming_one_directory_mount_it_once_and_a_clash_with_the_model_is_refused() -> None:
    dep = _parse(
        ["vllm", "serve", "Qwen/Qwen3-0.6B", "--tokenizer", "/srv/d", "--speculative-model", "/srv/d/"]
    )
    assert [m.container for m in dep.mounts] == ["/srv/d"]
    message = _refusal(["vllm", "serve", "/srv/m/Qwen3", "--tokenizer", "/models/Qwen3"])
    assert (
        "--tokenizer (args[2])" in message
        and "/models/Qwen3 is already where /srv/m/Qwen3 is mounted" in message
    )


def test_a_dangerous_flag_path_needs_consent_like_any_mount(tmp_path: Path) -> None:
    (tmp_path / "deployments").mkdir()
    source = tmp_path / "r.sh"
    source.write_text("vllm serve Qwen/Qwen3-0.6B --chat-template /etc/passwd", encoding="utf-8")
    proc = invoke_cli(tmp_path, "import-recipe", str(source), "--name", "p", "--image", "v:1")
    assert proc.returncode == 1 and "'/etc/passwd'" in proc.stderr and "--allow-mount" in proc.stderr
    assert list((tmp_path / "deployments").iterdir()) == []


# -- on real podman --------------------------------------------------------------------------------


def _data(tmp_path: Path) -> tuple[Path, Path, Path, Path]:
    """A model, a LoRA adapter, a draft model (each a directory with a marker) and a chat template."""
    data = tmp_path / "data"
    model, lora, draft = data / "models" / "Qwen3-0.6B", data / "loras" / "sql", data / "drafts" / "eagle"
    for d, marker in ((model, "config.json"), (lora, "adapter_config.json"), (draft, "config.json")):
        d.mkdir(parents=True)
        (d / marker).write_text(json.dumps({"which": d.name}), encoding="utf-8")
    template = data / "templates" / "chat.jinja"
    template.parent.mkdir()
    template.write_text("{{ messages }}", encoding="utf-8")
    return model, lora, draft, template


def _import(tmp_path: Path, text: str, image: str) -> tuple[Path, dict]:
    """``text`` imported through the CLI as deployment ``paths``: the project root and the spec."""
    root = tmp_path / "project"
    (root / "deployments").mkdir(parents=True)
    source = tmp_path / "serve.sh"
    source.write_text(text, encoding="utf-8")
    proc = invoke_cli(root, "import-recipe", str(source), "--name", "paths", "--image", image)
    assert proc.returncode == 0, proc.stderr
    return root, yaml.safe_load((root / "deployments" / "paths.yaml").read_text(encoding="utf-8"))


def _deployed_run(
    tmp_path: Path, podman: Podman, root: Path, spec: dict, paths: tuple[Path, ...]
) -> list[str]:
    """``spec`` (on this machine's fake GPU) deployed to podman and run, its LoRA, draft and template
    ``paths`` checked readable and read-only inside while it runs. The argv the engine got."""
    spec["resources"]["gpus"]["cdi_devices"] = [f"{FAKE_VENDOR}=0"]
    (root / "deployments" / "paths.yaml").write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    out = tmp_path / "out"
    argv = ["deploy", "--target", "podman", "--deployment", "paths", "--out", str(out)]
    proc = invoke_cli(root, *argv, "--memlock", HOST_MEMLOCK)
    assert proc.returncode == 0, proc.stderr
    run = run_script(out / "podman" / "paths" / "run.sh", podman.env)
    try:
        assert run.returncode == 0, run.stderr
        rec = parse_recording(podman.logs_until("paths", "Application startup complete"))
        _readable_read_only(podman, *paths)
        return rec.argv
    finally:
        podman.run("rm", "--force", "--time", "0", "paths", check=False)


def _readable_read_only(podman: Podman, lora: Path, draft: Path, template: Path) -> None:
    for path, marker in ((lora, "adapter_config.json"), (draft, "config.json")):
        seen = podman.run("exec", "paths", "cat", str(path / marker))
        assert json.loads(seen.stdout) == {"which": path.name}
    assert podman.run("exec", "paths", "cat", str(template)).stdout == "{{ messages }}"
    wrote = podman.run("exec", "paths", "sh", "-c", f"echo x > {lora}/new", check=False)
    assert wrote.returncode != 0 and not (lora / "new").exists()  # mounted read-only


def test_lora_draft_and_template_paths_are_read_inside_the_container_through_import_and_deploy(
    tmp_path: Path, podman: Podman, fake_cdi: Path, standin_image: str
) -> None:
    model, lora, draft, template = _data(tmp_path)
    spec_conf = json.dumps({"model": str(draft), "num_speculative_tokens": 3})
    argv = ["vllm", "serve", str(model), "--enable-lora", "--lora-modules", f"sql={lora}"]
    argv += ["--speculative-config", spec_conf, "--chat-template", str(template)]
    root, spec = _import(tmp_path, shlex.join(argv) + "\n", standin_image)
    assert {(m["host"], m["container"], m.get("readonly"), m.get("kind", "dir")) for m in spec["mounts"]} == {
        (str(lora), str(lora), True, "dir"),
        (str(draft), str(draft), True, "dir"),
        (str(template), str(template), True, "file"),
    }
    got = _deployed_run(tmp_path, podman, root, spec, (lora, draft, template))
    # the recipe's argv, byte for byte, but the model word mapped to its mount (and served by its name)
    assert got == ["serve", "/models/Qwen3-0.6B", *argv[3:], "--served-model-name", str(model)]


def test_relative_paths_filled_with_absolute_ones_are_mounted_at_them_by_deploy(
    tmp_path: Path, podman: Podman, fake_cdi: Path, standin_image: str
) -> None:
    # a published script names its files where it ran, and a draft through a variable it never sets
    model, lora, draft, template = _data(tmp_path)
    text = (
        f"vllm serve {model} --enable-lora --lora-modules sql=./loras/sql --chat-template chat.jinja \\\n"
        '  --speculative-config "{\\"model\\": \\"$DRAFT\\", \\"num_speculative_tokens\\": 3}"\n'
    )
    root, spec = _import(tmp_path, text, standin_image)
    assert spec.get("mounts", []) == []
    assert spec["placeholders"] == {"<LORA_MODULES>": None, "<CHAT_TEMPLATE>": None, "<DRAFT>": None}
    spec["placeholders"] = {
        "<LORA_MODULES>": str(lora),
        "<CHAT_TEMPLATE>": str(template),
        "<DRAFT>": str(draft),
    }
    got = _deployed_run(tmp_path, podman, root, spec, (lora, draft, template))
    assert got[got.index("--lora-modules") + 1] == f"sql={lora}"
    assert got[got.index("--chat-template") + 1] == str(template)
    assert json.loads(got[got.index("--speculative-config") + 1])["model"] == str(draft)
