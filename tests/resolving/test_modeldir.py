"""A model dir must be a dedicated directory (issue 10, critical 2): the pure check, fetch-model's guard."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest

from rigsmith.errors import ConsentError, PreflightError, RigsmithError, SpecError
from rigsmith.modeldir import check_model_dir, model_dir_problem
from rigsmith.resolving.lock import lock as lockmod
from rigsmith.resolving.model.modelfetch import fetch_model
from tests.support.models import cli_env, invoke_argv, run_cli, tiny_files

HOME = "/home/u"


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("/", "root directory"),
        ("//", "root directory"),
        ("~", "home directory /home/u"),
        ("~/", "home directory /home/u"),
        ("/home/u/", "home directory /home/u"),
        ("/home/bob", "home directory of a user"),
        ("/root", "home directory of a user"),
        ("~/.ssh", "hidden directory .ssh"),
        ("~/.config/autostart", "hidden directory .config"),
        ("~/.cache/huggingface/hub/models--a--b/snapshots/x", "hidden directory .cache"),
        ("/srv/models/.hidden/m", "hidden directory .hidden"),
        ("/etc", "/etc, a system directory"),
        ("/etc/cron.d", "/etc, a system directory"),
        ("/srv/../etc/cron.d", "/etc, a system directory"),
        ("/usr/local/models", "/usr, a system directory"),
        ("/var/lib/containers", "/var, a system directory"),
        ("/lib64", "/lib64, a system directory"),
        ("/proc/self", "/proc, a system directory"),
        ("/boot", "/boot, a system directory"),
        ("/tmp", "shared directory /tmp"),
        ("/srv", "shared directory /srv"),
        ("~bob/models", "another user's home"),
        ("../models", "climbs out"),
        ("models/\0x", "NUL"),
        ("", "empty"),
    ],
)
def test_model_dir_check_refuses_root_home_system_and_dot_dirs(path, why):
    problem = model_dir_problem(path, HOME)
    assert problem is not None and why in problem
    with pytest.raises(SpecError) as err:
        check_model_dir(path, HOME)
    assert "model.local_dir" in str(err.value) and "dedicated directory" in str(err.value)


@pytest.mark.parametrize(
    "path", ["~/models/qwen", "/home/u/models/x", "/srv/models/qwen", "/opt/models/q", "/tmp/m", "models/q"]
)
def test_model_dir_check_accepts_dedicated_dirs(path):
    assert model_dir_problem(path, HOME) is None
    check_model_dir(path, HOME)


def test_a_cli_flag_is_named_as_a_flag():
    with pytest.raises(PreflightError) as err:
        check_model_dir("/etc/cron.d", HOME, "--dest")
    assert str(err.value).startswith("--dest: /etc/cron.d is inside /etc")


def _recorder(asked: list[str]):
    def no(question: str) -> bool:
        asked.append(question)
        return False

    return no


def _repo(hub, name: str) -> tuple[str, dict[str, bytes]]:
    files = tiny_files(name, shards=1, shard_size=4096)
    return hub.repo(name).add_commit(files, refs=()), files


def test_fetch_refuses_a_dot_dir_before_any_request(hub, client, make_project, tmp_path):
    sha, _files = _repo(hub, "acme/dotdir")
    home = tmp_path / "home"
    ssh = home / ".ssh"
    ssh.mkdir(parents=True)
    (ssh / "authorized_keys").write_text("ssh-ed25519 AAAA mine\n")
    project, spec = make_project(repo="acme/dotdir", revision=sha, local_dir="~/.ssh")
    with pytest.raises(SpecError) as err:
        fetch_model(project, spec, hub=client, echo=lambda _m: None, home=str(home))
    assert "hidden directory .ssh" in str(err.value)
    assert (ssh / "authorized_keys").read_text() == "ssh-ed25519 AAAA mine\n"
    assert sorted(p.name for p in ssh.iterdir()) == ["authorized_keys"]
    assert hub.hub_requests() == []


def test_fetch_refuses_a_symlink_into_a_system_dir(hub, client, make_project, tmp_path):
    sha, _files = _repo(hub, "acme/linked")
    link = tmp_path / "models-link"
    link.symlink_to("/etc")
    project, spec = make_project(repo="acme/linked", revision=sha, local_dir=str(link))
    with pytest.raises(SpecError) as err:
        fetch_model(project, spec, hub=client, echo=lambda _m: None)
    assert "resolved through symlinks" in str(err.value) and "/etc, a system directory" in str(err.value)


def test_a_foreign_non_empty_dir_is_refused_without_a_terminal(hub, client, make_project, tmp_path):
    sha, files = _repo(hub, "acme/foreign")
    root = tmp_path / "models" / "t"
    root.mkdir(parents=True)
    (root / "notes.txt").write_text("mine\n")
    (root / "config.json").write_text('{"mine": true}\n')
    project, spec = make_project(repo="acme/foreign", revision=sha)
    with pytest.raises(ConsentError) as err:
        fetch_model(project, spec, hub=client, echo=lambda _m: None, confirm=None)
    msg = str(err.value)
    assert str(root) in msg and "notes.txt" in msg and "--adopt-dir" in msg
    assert "replacing any that differ from the snapshot: config.json" in msg
    assert (root / "config.json").read_text() == '{"mine": true}\n'
    assert not (root / ".rigsmith").exists()

    asked: list[str] = []
    with pytest.raises(ConsentError):
        fetch_model(project, spec, hub=client, echo=lambda _m: None, confirm=_recorder(asked))
    assert len(asked) == 1 and "notes.txt" in asked[0] and "config.json" in asked[0]

    fetch_model(project, spec, hub=client, echo=lambda _m: None, confirm=lambda _q: True)
    assert (root / "notes.txt").read_text() == "mine\n"  # never touched: not part of the snapshot
    for path, data in files.items():
        assert (root / path).read_bytes() == data
    # Now it holds the model: the next run asks nothing.
    fetch_model(project, spec, hub=client, echo=lambda _m: None, confirm=None)


def test_adopt_dir_flag_fetches_into_a_foreign_dir_through_the_cli(hub, make_project, tmp_path):
    sha, files = _repo(hub, "acme/adopt")
    project, spec = make_project(repo="acme/adopt", revision=sha)
    root = Path(spec.model.local_dir)
    root.mkdir(parents=True)
    (root / "keep.me").write_text("x\n")
    refused = run_cli(hub, project, "fetch-model")
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert "--adopt-dir" in refused.stderr and str(root) in refused.stderr
    done = run_cli(hub, project, "fetch-model", "--adopt-dir")
    assert done.returncode == 0, done.stderr
    assert (root / "keep.me").read_text() == "x\n"
    assert (root / "README.md").read_bytes() == files["README.md"]


def test_a_dir_holding_only_snapshot_files_is_this_model(hub, client, make_project):
    sha, files = _repo(hub, "acme/predownloaded")
    project, spec = make_project(repo="acme/predownloaded", revision=sha)
    root = Path(spec.model.local_dir)
    (root / "tokenizer").mkdir(parents=True)
    for p in ("config.json", "tokenizer/tokenizer.json"):
        (root / p).write_bytes(files[p])
    report = fetch_model(project, spec, hub=client, echo=lambda _m: None, confirm=None)
    assert sorted(report.downloaded) == sorted(set(files) - {"config.json", "tokenizer/tokenizer.json"})


def test_a_symlinked_subdir_cannot_lead_writes_out_of_the_model_dir(hub, client, make_project, tmp_path):
    files = {**tiny_files("escape", shards=1, shard_size=4096), "tokenizer/deeper/extra.json": b"{}\n"}
    sha = hub.repo("acme/escape").add_commit(files, refs=())
    outside = tmp_path / "outside"
    outside.mkdir()
    project, spec = make_project(repo="acme/escape", revision=sha)
    root = Path(spec.model.local_dir)
    root.mkdir(parents=True)
    (root / "tokenizer").symlink_to(outside)
    with pytest.raises(RigsmithError) as err:
        fetch_model(project, spec, hub=client, echo=lambda _m: None, adopt_dir=True)
    assert "symlink out of the model dir" in str(err.value)
    assert list(outside.iterdir()) == []


def test_a_hand_edited_patched_config_is_not_reverted_silently(hub, client, make_project):
    sha, files = _repo(hub, "acme/edited")
    patches = [{"key": "text_config.hidden_size", "value": 128}]
    project, spec = make_project(repo="acme/edited", revision=sha, config_patches=patches)
    root = Path(spec.model.local_dir)
    fetch_model(project, spec, hub=client, echo=lambda _m: None)
    patched = (root / "config.json").read_text()
    mine = json.dumps({**json.loads(patched), "max_position_embeddings": 4096}) + "\n"
    (root / "config.json").write_text(mine)

    with pytest.raises(ConsentError) as err:
        fetch_model(project, spec, hub=client, echo=lambda _m: None, confirm=None)
    assert str(root / "config.json") in str(err.value) and "--overwrite-edited" in str(err.value)
    assert (root / "config.json").read_text() == mine

    asked: list[str] = []
    with pytest.raises(ConsentError):
        fetch_model(project, spec, hub=client, echo=lambda _m: None, confirm=_recorder(asked))
    assert len(asked) == 1 and "edited" in asked[0]
    assert (root / "config.json").read_text() == mine

    report = fetch_model(project, spec, hub=client, echo=lambda _m: None, overwrite_edited=True)
    assert report.patched == ["config.json"]
    assert (root / "config.json").read_text() == patched
    assert lockmod.read(project.lock_path).models["t"].patches[0].file == "config.json"
    assert files["config.json"] == (root / ".rigsmith/original/config.json").read_bytes()


def test_a_home_reached_through_a_symlink_is_still_home(hub, client, make_project, tmp_path):
    # Fedora Atomic: /home -> /var/home. A model dir under the real home is not "inside /var".
    real_home = Path(tempfile.mkdtemp(prefix="rigsmith-home-", dir="/var/tmp"))
    try:
        link = tmp_path / "home-link"
        link.symlink_to(real_home)
        sha, files = _repo(hub, "acme/var-home")
        project, spec = make_project(repo="acme/var-home", revision=sha, local_dir="~/models/t")
        fetch_model(project, spec, hub=client, echo=lambda _m: None, home=str(link))
        assert (real_home / "models/t/README.md").read_bytes() == files["README.md"]
    finally:
        shutil.rmtree(real_home)


def _foreign_dir(hub, make_project, name: str) -> tuple[Any, Path, dict[str, bytes]]:
    """A project whose model dir already holds someone's mine.txt (not a file of the snapshot)."""
    sha, files = _repo(hub, name)
    project, spec = make_project(repo=name, revision=sha)
    root = Path(spec.model.local_dir)
    root.mkdir(parents=True)
    (root / "mine.txt").write_text("x\n")
    return project, root, files


def test_with_stdin_closed_a_foreign_dir_is_refused_not_a_traceback(hub, make_project):
    project, _root, _files = _foreign_dir(hub, make_project, "acme/closed-stdin")
    res = subprocess.run(
        invoke_argv("fetch-model"),
        env=cli_env(hub, project),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=lambda: os.close(0),
    )
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
    assert "--adopt-dir" in res.stderr


@pytest.mark.parametrize("book", [".rigsmith", ".cache"])
def test_symlinked_book_keeping_dirs_are_refused(hub, client, make_project, tmp_path, book):
    sha, _files = _repo(hub, f"acme/book{book}")
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "huggingface/download").mkdir(parents=True)
    (elsewhere / "huggingface/download/precious.incomplete").write_text("not rigsmith's\n")
    (elsewhere / "state.json").write_text("{}")
    project, spec = make_project(repo=f"acme/book{book}", revision=sha)
    root = Path(spec.model.local_dir)
    root.mkdir(parents=True)
    (root / book).symlink_to(elsewhere)
    with pytest.raises(RigsmithError) as err:
        fetch_model(project, spec, hub=client, echo=lambda _m: None, adopt_dir=True)
    assert f"{root / book} is a symlink" in str(err.value)
    assert sorted(p.name for p in elsewhere.rglob("*")) == [
        "download",
        "huggingface",
        "precious.incomplete",
        "state.json",
    ]


def _cli_on_a_terminal(hub, project, answer: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``invoke fetch-model`` with stdin on a real pseudo-terminal that answers ``answer``."""
    master, slave = os.openpty()
    try:
        os.write(master, answer.encode() + b"\n")
        return subprocess.run(
            invoke_argv("fetch-model", *args),
            env=cli_env(hub, project),
            stdin=slave,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        os.close(slave)
        os.close(master)


def test_on_a_terminal_the_user_is_asked_and_no_means_no(hub, make_project):
    project, root, files = _foreign_dir(hub, make_project, "acme/asked")
    (root / "README.md").write_text("my readme\n")

    no = _cli_on_a_terminal(hub, project, "n")
    assert no.returncode == 1 and "Traceback" not in no.stderr
    question = no.stderr.split("[y/N]")[0]
    assert "mine.txt" in question and "README.md" in question and "Fetch into it?" in question
    assert (root / "README.md").read_text() == "my readme\n"

    yes = _cli_on_a_terminal(hub, project, "y")
    assert yes.returncode == 0, yes.stderr
    assert (root / "README.md").read_bytes() == files["README.md"]  # a snapshot path: replaced, as asked
    assert (root / "mine.txt").read_text() == "x\n"


def test_a_hand_edited_config_through_the_cli(hub, make_project):
    sha, _files = _repo(hub, "acme/edited-cli")
    patches = [{"key": "text_config.hidden_size", "value": 128}]
    project, spec = make_project(repo="acme/edited-cli", revision=sha, config_patches=patches)
    assert run_cli(hub, project, "fetch-model").returncode == 0
    config = Path(spec.model.local_dir) / "config.json"
    patched = config.read_text()
    config.write_text(patched.replace("128", "256"))
    refused = run_cli(hub, project, "fetch-model")
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert f"{config} was changed by hand" in refused.stderr and "--overwrite-edited" in refused.stderr
    asked = _cli_on_a_terminal(hub, project, "n")
    assert asked.returncode == 1 and "replace your edit with the patched file? [y/N]" in asked.stderr
    assert "256" in config.read_text()
    done = run_cli(hub, project, "fetch-model", "--overwrite-edited")
    assert done.returncode == 0, done.stderr
    assert config.read_text() == patched
