"""Untrusted recipes (issue 10, import side): secrets in any spelling vLLM accepts, dangerous mounts,
resource bombs, slow servers, non-ASCII numbers, NUL, deep or self-referencing documents.

Every case is refused with one paragraph naming the field, or imported without the secret; none raises
anything but a RigsmithError.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rigsmith import policy
from rigsmith import spec as specmod
from rigsmith.errors import AdapterError, ConsentError, RecipeError, SpecError
from rigsmith.importing import importer, recipe
from rigsmith.importing.importer import HttpOptions
from rigsmith.project import Project
from rigsmith.rendering import plan
from rigsmith.resolving.lock.lock import Lock
from tests.support.recipes import SEED_RECIPE, refusal
from tests.support.recipes import import_cli as _cli

SHA = "0" * 64
SECRET = "sk-SECRET-4f1c"


def _parse(text: str) -> specmod.Deployment:
    return recipe.parse(text, source="hostile", sha256=SHA)


def _refused(text: str) -> str:
    return refusal(text, "hostile")


def _quiet(_: str) -> None:
    pass


# -- High 3: secret flags under every spelling vLLM's parser accepts ----------------------------------


@pytest.mark.parametrize(
    ("words", "var"),
    [
        (f"--api_key {SECRET}", "VLLM_API_KEY"),
        (f"--api_key={SECRET}", "VLLM_API_KEY"),
        (f"--api-key={SECRET}", "VLLM_API_KEY"),
        (f"--api-ke {SECRET} {SECRET}2", "VLLM_API_KEY"),
        (f"--api-k={SECRET}", "VLLM_API_KEY"),
        (f"--api_ke {SECRET}", "VLLM_API_KEY"),
        (f"--api-key.extra {SECRET}", "VLLM_API_KEY"),
        (f"--hf_token {SECRET}", "HF_TOKEN"),
        (f"--hf-to={SECRET}", "HF_TOKEN"),
        (f"--hf_t {SECRET}", "HF_TOKEN"),
    ],
)
def test_secret_flag_in_any_spelling_is_lifted_out_of_the_spec(words: str, var: str) -> None:
    dep = _parse(f"vllm serve org/model {words} --port 8001")
    text = specmod.dump(dep)
    assert SECRET not in text
    assert dep.engine.args == ("org/model", "--port", "8001")
    lifted = [e for e in dep.env if e.name == var]
    assert lifted and lifted[0].secret and lifted[0].value == ""


def test_lifted_secrets_and_token_shapes_are_scrubbed_from_comments_and_notes() -> None:
    hf = "hf_" + "a1B2" * 9
    text = json.dumps(
        {
            "title": f"served with {hf}",
            "command": f"vllm serve org/model --api-key {SECRET} --tokenizer org/tok  # key: {SECRET}",
            "notes": f"export HF_TOKEN={hf}; the key is {SECRET}",
            "env": "MY_TOKEN=tok-9876 (was tok-9876) | A=1",
        }
    )
    dumped = specmod.dump(_parse(text))
    for secret in (SECRET, hf, "tok-9876"):
        assert secret not in dumped
    assert "--tokenizer" in dumped and "org/tok" in dumped  # the argv is never rewritten
    assert "key: <redacted>" in dumped


@pytest.mark.parametrize("flag", ["--api", "--api-", "--hf", "--a", "--h"])
def test_ambiguous_abbreviation_of_a_secret_flag_is_refused(flag: str) -> None:
    message = _refused(f"vllm serve org/model {flag} {SECRET}")
    assert f"{flag} abbreviates" in message and "ambiguous" in message
    assert SECRET not in message


def test_secret_flag_in_a_compose_entrypoint_is_refused_at_import_and_deploy() -> None:
    text = (
        "services:\n  vllm:\n    image: vllm/vllm-openai:v1\n"
        f"    entrypoint: [python3, -m, vllm.entrypoints.openai.api_server, --api_key, {SECRET}]\n"
        "    command: [--model, org/m]\n"
    )
    message = _refused(text)
    assert "the entrypoint holds --api_key (--api-key)" in message and SECRET not in message
    dep = _parse("vllm serve org/model")
    edited = dep.model_copy(
        update={"engine": dep.engine.model_copy(update={"subcommand": ("serve", f"--api-key={SECRET}")})}
    )
    with pytest.raises(SpecError) as err:
        plan.make(edited, Lock(), spec_path="deployments/x.yaml", image="localhost/vllm:1")
    assert "engine.subcommand[1]" in str(err.value)


def test_non_secret_neighbours_are_kept() -> None:
    dep = _parse("vllm serve org/model --api-server-count 2 --hf-overrides {} --host 0.0.0.0 --hf-token")
    assert dep.engine.args == (
        "org/model",
        "--api-server-count",
        "2",
        "--hf-overrides",
        "{}",
        "--host",
        "0.0.0.0",
        "--hf-token",
    )


@pytest.mark.parametrize(
    "word",
    [
        f"--api_key={SECRET}",
        f"--api-ke={SECRET}",
        f"--hf_token={SECRET}",
        f"--api-key.x={SECRET}",
    ],
)
def test_deploy_refuses_secret_flag_in_any_spelling(word: str) -> None:
    dep = _parse("vllm serve org/model --port 8001")
    edited = dep.model_copy(
        update={"engine": dep.engine.model_copy(update={"args": (*dep.engine.args, word)})}
    )
    with pytest.raises(SpecError) as err:
        plan.make(edited, Lock(), spec_path="deployments/x.yaml", image="localhost/vllm:1")
    assert "engine.args[3]" in str(err.value) and "secret" in str(err.value)


def test_lifting_repeats_until_no_secret_is_left() -> None:
    # Found by the fuzzer: removing the second flag and its value handed the first one a value.
    dep = _parse(f"vllm serve org/model --hf_token --hf_token {SECRET} {SECRET}2 --port 8001")
    assert SECRET not in specmod.dump(dep)
    assert dep.engine.args == ("org/model", "--port", "8001")


def test_one_matcher_serves_import_and_deploy() -> None:
    assert policy.secret_flag("--api_ke=x") == policy.SecretFlag("--api-key")
    assert policy.secret_flag("--hf-token") == policy.SecretFlag("--hf-token")
    assert policy.secret_flag("--host") is None
    assert policy.secret_flag("--api-server-count") is None
    assert policy.secret_flag("-tp") is None
    assert policy.secret_flag("--api") == policy.SecretFlag("--api-key", ("--api-server-count",))


# -- High 4: dangerous mounts need recorded consent -------------------------------------------------


DANGEROUS = [
    "/",
    "/etc/..",
    "//",
    "~",
    "$HOME",
    "~/.ssh",
    "/home/me",
    "/home/me/.config/containers",
    "/root",
    "/etc",
    "/run/podman/podman.sock",
    "/var/run/docker.sock",
    "/run/docker.sock",
    "/srv/engine/api.sock",
    "/dev",
    "/dev/sda",
    "/dev/nvidia0/../sda",
    "/proc",
    "/sys",
    "/boot",
    "/var/lib/containers/storage",
    "/var/lib/docker",
    "/opt/app/.git",
]


@pytest.mark.parametrize("host", DANGEROUS)
def test_dangerous_host_paths_are_named(host: str) -> None:
    host = "~" if host == "$HOME" else host
    assert policy.dangerous_host_path(host), host


@pytest.mark.parametrize(
    "host",
    [
        "~/.cache/huggingface",
        "/home/me/.cache/huggingface/hub",
        "~/models/qwen",
        "/data/models",
        "/home/me/models",
        "/srv/vllm-cache",
        "./cache",
        "/dev/nvidia0",
        "/dev/nvidiactl",
        "/dev/dri/renderD128",
        "/dev/kfd",
    ],
)
def test_ordinary_data_directories_are_not_dangerous(host: str) -> None:
    assert policy.dangerous_host_path(host) is None


def _docker_recipe(tmp_path: Path, volume: str) -> Path:
    p = tmp_path / "recipe.sh"
    p.write_text(
        f"docker run --gpus all -v {volume} -v /data/models:/models vllm/vllm-openai:v1 "
        "/models/qwen --port 8001\n",
        encoding="utf-8",
    )
    return p


@pytest.mark.parametrize("host", DANGEROUS)
def test_import_without_a_terminal_refuses_a_dangerous_mount_and_writes_nothing(
    empty_project: Project, tmp_path: Path, host: str
) -> None:
    src = _docker_recipe(tmp_path, f"{host}:/hostile")
    with pytest.raises(ConsentError) as err:
        importer.import_recipe(empty_project, str(src), name="x", echo=_quiet, confirm=None)
    message = str(err.value)
    assert "--allow-mount" in message and "mounts[N].consent" in message and "nothing was written" in message
    assert not list((empty_project.root / "deployments").iterdir())


def test_dry_run_names_the_consent_a_dangerous_mount_needs_and_asks_nothing(
    empty_project: Project, tmp_path: Path
) -> None:
    src = _docker_recipe(tmp_path, "/:/host")
    lines: list[str] = []

    def never(question: str) -> bool:
        raise AssertionError(f"a dry run asked: {question}")

    importer.import_recipe(empty_project, str(src), name="x", echo=lines.append, confirm=never, dry_run=True)
    assert any(line.startswith("consent needed (dry run): refused: the recipe mounts '/'") for line in lines)
    assert not list((empty_project.root / "deployments").iterdir())


def test_allow_mount_records_consent_and_deploy_accepts_it(empty_project: Project, tmp_path: Path) -> None:
    src = _docker_recipe(tmp_path, "/run/podman/podman.sock:/run/podman/podman.sock")
    dep = importer.import_recipe(
        empty_project,
        str(src),
        name="x",
        echo=_quiet,
        allow_mount=["/run/podman/podman.sock"],
    )
    sock = next(m for m in dep.mounts if m.host.endswith(".sock"))
    assert sock.consent == "allowed with --allow-mount at import"
    loaded = specmod.load(empty_project.spec_path("x"))
    assert "consent: allowed with --allow-mount at import" in specmod.dump(loaded)
    plan.make(loaded, Lock(), spec_path="deployments/x.yaml")  # no refusal


def test_prompt_consent_is_per_mount(empty_project: Project, tmp_path: Path) -> None:
    src = tmp_path / "r.sh"
    src.write_text(
        "docker run -v ~/.ssh:/root/.ssh -v /:/host -v /data/models:/models vllm/vllm-openai:v1 /models/q\n",
        encoding="utf-8",
    )
    asked: list[str] = []

    def answer(question: str) -> bool:
        asked.append(question)
        return "'~/.ssh'" in question

    with pytest.raises(ConsentError) as err:
        importer.import_recipe(empty_project, str(src), name="x", echo=_quiet, confirm=answer)
    assert len(asked) == 2 and "'/'" in str(err.value) and ".ssh" not in str(err.value)


def test_deploy_refuses_a_dangerous_mount_without_consent() -> None:
    dep = _parse("docker run -v /:/host -v /data/m:/m vllm/vllm-openai:v1 /m/q")
    with pytest.raises(SpecError) as err:
        plan.make(dep, Lock(), spec_path="deployments/x.yaml")
    assert "mounts[0].consent" in str(err.value) and "'/'" in str(err.value)


@pytest.mark.parametrize("model", ["/", "~", "/etc", "~/.ssh", "/home/me"])
def test_model_directory_that_is_the_host_is_refused(
    empty_project: Project, tmp_path: Path, model: str
) -> None:
    src = tmp_path / "r.sh"
    src.write_text(f"vllm serve {model}\n", encoding="utf-8")
    with pytest.raises(RecipeError) as err:
        importer.import_recipe(empty_project, str(src), name="x", echo=_quiet, image="localhost/v:1")
    assert "model.local_dir" in str(err.value)
    dep = _parse("vllm serve ~/models/q")
    edited = dep.model_copy(update={"model": dep.model.model_copy(update={"local_dir": model})})
    with pytest.raises(SpecError) as serr:
        plan.make(edited, Lock(), spec_path="deployments/x.yaml", image="localhost/v:1")
    assert "model.local_dir" in str(serr.value)


def test_model_and_hub_cache_volumes_are_read_only_unless_the_recipe_writes_rw() -> None:
    dep = _parse(
        "docker run -v /data/models:/models -v ~/.cache/huggingface:/root/.cache/huggingface "
        "-v /srv/logs:/logs vllm/vllm-openai:v1 /models/qwen"
    )
    assert [(m.host, m.readonly) for m in dep.mounts] == [
        ("/data/models", True),
        ("~/.cache/huggingface", True),
        ("/srv/logs", False),
    ]
    assert any("mounts[1].readonly: false" in n for n in dep.notes)
    said_rw = _parse(
        "docker run -v /data/models:/models:rw -v ~/.cache/huggingface:/root/.cache/huggingface:rw "
        "vllm/vllm-openai:v1 /models/qwen"
    )
    assert [m.readonly for m in said_rw.mounts] == [False, False]


# -- Medium 5: secrets in the seed-format env string -------------------------------------------------


def test_env_string_secret_values_are_dropped_and_opt_in_secrets_marked(tmp_path: Path) -> None:
    data = json.loads(SEED_RECIPE.read_text(encoding="utf-8"))
    data["env"] = (
        f"HF_TOKEN=hf_{SECRET} | CUDA_VISIBLE_DEVICES=0 | A=1. Opt-in: MY_API_KEY={SECRET} the key; "
        "DB_PASSWORD=<your password> db; COUNTERS=1 counters"
    )
    dep = _parse(json.dumps(data))
    assert SECRET not in specmod.dump(dep)
    env = {e.name: e for e in dep.env}
    assert env["HF_TOKEN"].secret and env["HF_TOKEN"].value == ""
    assert env["MY_API_KEY"].secret and env["MY_API_KEY"].opt_in and not env["MY_API_KEY"].enabled
    assert env["DB_PASSWORD"].secret and "<your password>" not in dep.placeholders
    assert not env["COUNTERS"].secret and env["COUNTERS"].value == "1"


# -- Medium 9: resource bombs -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "vllm serve org/m -tp 3000000",
        "vllm serve org/m -tp 1000 -pp 1000",
        "docker run --gpus 3000000 vllm/vllm-openai:v1 org/m",
        json.dumps({"command": "vllm serve org/m", "notes": "3000000x RTX 3090"}),
    ],
)
def test_gpu_counts_beyond_one_node_are_refused_quickly(text: str) -> None:
    start = time.monotonic()
    message = _refused(text)
    assert f"at most {specmod.MAX_GPUS}" in message
    assert time.monotonic() - start < 2


ALIAS_BOMB = """services:
  vllm:
    image: vllm/vllm-openai:v1
    command: ["org/m"]
    labels:
      a: &a ["x","x","x","x","x","x","x","x","x"]
      b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
      c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
      d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
      e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
      f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
      g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
      h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
      i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
"""


def test_yaml_alias_bomb_in_compose_is_refused_quickly() -> None:
    start = time.monotonic()
    message = _refused(ALIAS_BOMB)
    assert "alias" in message
    assert time.monotonic() - start < 5


def test_self_referencing_and_deep_compose_is_refused() -> None:
    selfref = "services:\n  vllm:\n    image: vllm/vllm-openai:v1\n    command: &a [org/m, *a]\n"
    assert "contains itself" in _refused(selfref)
    deep = "services:\n  vllm:\n    image: vllm\n    x: " + "[" * 5000 + "]" * 5000 + "\n"
    assert "levels deep" in _refused(deep)


_COMPOSE = "services:\n  vllm:\n    image: vllm/vllm-openai:v1\n    command: [org/m]\n"


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        ("    x: 2001-13-14\n", None),  # a timestamp stays text, as compose reads it
        ('    x: !!binary "@@"\n', "binary values are not accepted"),
        ("    x: !!set {a}\n", "set values are not accepted"),
        ("    x: !!float .nanx\n", "ValueError"),
        ("    x: [\n", "not valid YAML"),
    ],
)
def test_compose_and_spec_yaml_that_python_cannot_construct_is_one_paragraph(
    extra: str, fragment: str | None
) -> None:
    if fragment is None:
        dep = _parse(_COMPOSE + extra)
        assert "2001-13-14" in " ".join(dep.notes)
    else:
        assert fragment in _refused(_COMPOSE + extra)
    with pytest.raises(SpecError):
        specmod.loads(_COMPOSE + extra)


def test_deep_recipe_json_is_refused() -> None:
    deep = '{"command": "vllm serve org/m", "x": ' + "[" * 100_000 + "]" * 100_000 + "}"
    assert "levels deep" in _refused(deep)


# -- Medium 10: a server that never finishes --------------------------------------------------------


@pytest.fixture
def dribbler() -> Iterator[tuple[str, threading.Event]]:
    """A real server on 127.0.0.1 that answers /body with headers then one byte every 0.05 s, and /head
    with its status line one byte at a time; it stops when the test ends (bounded: 20 s at most)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    srv.settimeout(0.2)
    done = threading.Event()

    def serve(conn: socket.socket) -> None:
        with conn:
            request = conn.recv(4096)
            if b"/head" in request:
                payload = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n" + b"X-Slow: y\r\n" * 400
            else:
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 100000\r\n\r\n")
                payload = b"v" * 100_000
            deadline = time.monotonic() + 20
            for byte in payload:
                if done.is_set() or time.monotonic() > deadline:
                    return
                try:
                    conn.sendall(bytes([byte]))
                except OSError:
                    return
                time.sleep(0.05)

    def accept() -> None:
        while not done.is_set():
            try:
                conn, _ = srv.accept()
            except TimeoutError:
                continue
            except OSError:  # closed at teardown
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.getsockname()[1]}", done
    finally:
        done.set()
        srv.close()


@pytest.mark.parametrize("path", ["/body", "/head"])
def test_slow_server_hits_the_overall_deadline(dribbler: tuple[str, threading.Event], path: str) -> None:
    base, _ = dribbler
    start = time.monotonic()
    with pytest.raises(AdapterError) as err:
        importer.fetch_url(base + path, HttpOptions(timeout=5.0, deadline=1.5, wait_max=0.0))
    took = time.monotonic() - start
    assert "within 1.5 s" in str(err.value)
    assert took < 4, took


# -- Low 11: numbers in other scripts' digits, undecodable or deep spec files ------------------------


@pytest.mark.parametrize(
    ("text", "flag"),
    [
        ("vllm serve org/m -tp ²", "--tensor-parallel-size"),
        ("vllm serve org/m --port ²", "--port"),
        ("vllm serve org/m --port=٨٠٠٠", "--port"),
        ("vllm serve org/m --shutdown-timeout ²", "--shutdown-timeout"),
        ("vllm serve org/m --shutdown_timeout=٣", "--shutdown-timeout"),
        ("docker run --gpus ² vllm/vllm-openai:v1 org/m", "--gpus"),
        ("docker run --stop-timeout ³ vllm/vllm-openai:v1 org/m", "--stop-timeout"),
    ],
)
def test_non_ascii_numbers_are_refused_naming_the_flag(text: str, flag: str) -> None:
    assert flag in _refused(text)


def test_deploy_of_a_hand_edited_unicode_shutdown_timeout_does_not_crash() -> None:
    dep = _parse("vllm serve org/m --shutdown-timeout 30")
    edited = dep.model_copy(
        update={"engine": dep.engine.model_copy(update={"args": ("org/m", "--shutdown-timeout", "²")})}
    )
    assert edited.shutdown_timeout is None
    plan.make(edited, Lock(), spec_path="deployments/x.yaml", image="localhost/v:1")


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (b"name: x\n\xff\xfe\n", "not UTF-8"),
        (b"a: " + b"[" * 5000 + b"]" * 5000 + b"\n", "levels deep"),
        (ALIAS_BOMB.replace("services:", "x:").encode(), "alias"),
        (b"a: &a [*a]\n", "contains itself"),
        (b"name: x\x00\n", "NUL"),
        (b'name: x\nengine: {args: ["a\\0b"]}\n', "engine.args[0]: holds a NUL"),
    ],
    ids=["non-utf8", "deep", "alias-bomb", "self-reference", "nul", "nul-escape"],
)
def test_spec_files_that_are_not_plain_yaml_are_refused(
    tmp_path: Path, content: bytes, fragment: str
) -> None:
    path = tmp_path / "x.yaml"
    path.write_bytes(content)
    with pytest.raises(SpecError) as err:
        specmod.load(path)
    assert fragment in str(err.value)


@pytest.mark.parametrize("encoding", ["utf-16", "latin-1", "cp1252"])
def test_recipe_text_in_other_encodings_is_one_paragraph(
    empty_project: Project, tmp_path: Path, encoding: str
) -> None:
    src = tmp_path / "r.sh"
    src.write_bytes("vllm serve org/m --served-model-name café-ÿ\n".encode(encoding))
    with pytest.raises(RecipeError) as err:
        importer.import_recipe(empty_project, str(src), name="x", echo=_quiet)
    assert "not UTF-8 text" in str(err.value)


# -- Low 12: NUL -------------------------------------------------------------------------------------


def test_nul_in_recipe_text_is_refused_naming_the_line() -> None:
    assert "line 2 column 21: a NUL" in _refused("# x\nvllm serve org/m --x\x00y\n")


@pytest.mark.parametrize(
    ("data", "where"),
    [
        ({"command": "vllm serve org/m --served-model-name a\x00b"}, "engine.args[2]"),
        ({"command": "vllm serve org/m", "env": {"A": "x\x00"}}, "env[0].value"),
        ({"command": "vllm serve org/m", "title": "t\x00"}, "description"),
    ],
)
def test_nul_escaped_in_recipe_json_is_refused_naming_the_field(data: dict[str, object], where: str) -> None:
    text = json.dumps(data)  # NUL written as the escape \u0000: the text itself holds none
    assert "\x00" not in text
    assert f"{where}: holds a NUL" in _refused(text)


def test_nul_escaped_in_compose_is_refused() -> None:
    text = 'services:\n  vllm:\n    image: vllm/vllm-openai:v1\n    command: ["org/m", "--x", "a\\0b"]\n'
    assert "engine.args[2]: holds a NUL" in _refused(text)


# -- the real CLI: consent flag --------------------------------------------------------------------


def test_cli_refuses_a_dangerous_mount_without_a_terminal_and_takes_allow_mount(tmp_path: Path) -> None:
    root = tmp_path / "proj"
    (root / "deployments").mkdir(parents=True)
    src = _docker_recipe(tmp_path, "/var/run/docker.sock:/var/run/docker.sock")
    r = _cli(root, str(src), "--name", "x")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.startswith("error: refused: the recipe mounts '/var/run/docker.sock'")
    assert "--allow-mount HOST" in r.stderr and not (root / "deployments" / "x.yaml").exists()
    r = _cli(root, str(src), "--name", "x", "--allow-mount", "/var/run/docker.sock")
    assert r.returncode == 0, r.stderr
    spec = specmod.load(root / "deployments" / "x.yaml")
    assert [m.consent for m in spec.mounts if m.host.endswith(".sock")] == [
        "allowed with --allow-mount at import"
    ]


@pytest.mark.parametrize("key", ["devices", "volumes"])
@pytest.mark.parametrize("value", ["true", "/dev/kfd", "{a: 1}"])
def test_compose_devices_or_volumes_that_are_not_a_list_are_one_paragraph(key: str, value: str) -> None:
    text = f"services:\n  vllm:\n    image: vllm/vllm-openai:v1\n    command: [org/m]\n    {key}: {value}\n"
    message = _refused(text)
    assert f"services.vllm.{key}: " in message and "is not a list" in message and "Traceback" not in message
