"""Red team of how rigsmith reaches cluster nodes (issue 30): ``cluster.nodes[].ssh``, ``ssh_options`` and
``cluster.node_dir`` are untrusted spec input that ends up in an ssh argv and in remote shell lines.

Each bad value is refused when the spec loads, in one paragraph naming the field, before any ssh runs. What
the spec accepts is read back through the real ssh's own parser (``ssh -G``, which resolves the options and
connects nowhere): no accepted value turns into a command ssh would run locally.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rigsmith import spec as specmod
from rigsmith.errors import SpecError
from rigsmith.operating.cluster.noderun import RemoteHost, ssh_host
from rigsmith.operating.host import LocalHost
from tests.support import cluster as fixtures
from tests.support.common import invoke_cli, write_project

#: ssh_config keywords that make ssh run something on this machine or read more config.
_LOCAL_EXEC = ("proxycommand", "localcommand", "knownhostscommand", "pkcs11provider", "securitykeyprovider")


def _load(ssh: str | None = None, options: dict[str, str] | None = None, node_dir: str | None = None) -> None:
    data = fixtures.ray_data()
    if ssh is not None:
        data["cluster"]["nodes"][1]["ssh"] = ssh
    if options is not None:
        data["cluster"]["nodes"][1]["ssh_options"] = options
    if node_dir is not None:
        data["cluster"]["node_dir"] = node_dir
    specmod.from_data(data)


@pytest.mark.parametrize(
    "bad",
    ["-oProxyCommand=touch /tmp/p", "-oProxyCommand=x", "root@-oProxyCommand=x", "-l", "a\x00b",
     "root@box\tb", "box;id", "$(id)", "`id`", "root@box b", "root@box\r", "ro ot@box", "root@@box", "@box",
     "root@", "x" * 300],
)  # fmt: skip
def test_a_destination_that_could_be_an_option_or_two_words_is_refused(bad: str) -> None:
    with pytest.raises(SpecError) as err:
        _load(ssh=bad)
    said = str(err.value)
    assert "cluster.nodes[1].ssh:" in said and ("no leading '-'" in said or "NUL character" in said), said


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"IdentityFile": "/k/x -oProxyCommand=touch"}, "IdentityFile: "),
        ({"IdentityFile": "/k/x\t-oProxyCommand=touch"}, "IdentityFile: "),
        ({"IdentityFile": "/k/x=ProxyCommand=touch"}, "IdentityFile: "),
        ({"IdentityFile": '/k/"x'}, "IdentityFile: "),
        ({"IdentityFile": "%d/.ssh/id"}, "IdentityFile: "),
        ({"IdentityFile": "${HOME}/id"}, "IdentityFile: "),
        ({"IdentityFile": "id_rsa"}, "IdentityFile: "),
        ({"UserKnownHostsFile": "/a /b"}, "UserKnownHostsFile: "),
        ({"User": "$(touch${IFS}/tmp/p)"}, "User: "),  # expanded by a user's own ProxyCommand %r
        ({"User": "-oProxyCommand=x"}, "User: "),
        ({"HostKeyAlias": "a;touch${IFS}/tmp/p"}, "HostKeyAlias: "),  # ... or KnownHostsCommand %k
        ({"Port": "22 -oProxyCommand=x"}, "Port: "),
        ({"Port": "0"}, "Port: "),
        ({"Port": "65536"}, "Port: "),
        ({"Port": ""}, "Port: "),
        ({"ConnectTimeout": "5s"}, "ConnectTimeout: "),
        ({"StrictHostKeyChecking": "no\n"}, "StrictHostKeyChecking: "),
        ({"IdentitiesOnly": "yes,ProxyCommand"}, "IdentitiesOnly: "),
        *[({key: "x"}, f"{key!r} is not one of the ssh options")
          for key in ("proxycommand", "ProxyCommand", "PROXYCOMMAND", "Include", "Match",
                      "KnownHostsCommand", "PKCS11Provider", "SecurityKeyProvider", "LocalForward",
                      "RemoteForward", "DynamicForward", "PermitLocalCommand", "LocalCommand", "ProxyJump",
                      "identityfile", "IdentityFile=x", "IdentityFile -oProxyCommand", "BatchMode",
                      "ControlPath", "SendEnv")],
    ],
)  # fmt: skip
def test_an_ssh_option_that_smuggles_a_command_or_a_second_option_is_refused(
    options: dict[str, str], says: str
) -> None:
    with pytest.raises(SpecError) as err:
        _load(options=options)
    assert "cluster.nodes[1].ssh_options" in str(err.value) and says in str(err.value), str(err.value)


@pytest.mark.parametrize(
    "bad",
    ["/", "//", "var/lib/rigsmith", "", "/srv/../etc", "/srv/./x", "/srv//x", "/srv/x/", "/srv/.ssh", "/a b",
     "/a;touch /tmp/p", "/$(id)", "/`id`", "/a\nb", "/a'b", '/a"b', "/a\\b", "/a/" + "b" * 300,
     # system trees and shared top-level directories (the files would land among the system's own)
     "/etc/x", "/etc", "/usr/local/bin", "/var/lib", "/var/log/x", "/boot/efi", "/lib64/x", "/proc/1", "/tmp",
     "/home", "/opt"],
)  # fmt: skip
def test_a_node_dir_that_is_not_a_plain_dedicated_absolute_path_is_refused(bad: str) -> None:
    with pytest.raises(SpecError) as err:
        _load(node_dir=bad)
    assert "cluster.node_dir" in str(err.value) and "dedicated absolute directory" in str(err.value)


@pytest.mark.parametrize("good", ["/var/lib/rigsmith", "/var/opt/rs", "/srv/rigsmith", "/opt/rigsmith/nodes",
                                  "/home/ops/rigsmith", "/tmp/pytest-1/node-dir", "/data/llm"])  # fmt: skip
def test_a_dedicated_node_dir_is_taken(good: str) -> None:
    _load(node_dir=good)


_SSH = shutil.which("ssh")


def _resolved(argv: list[str]) -> dict[str, str]:
    """What ssh makes of an argv: ``ssh -G`` prints the resolved config and connects nowhere; -F /dev/null
    keeps this machine's config out of it."""
    assert _SSH is not None and argv[0] == "ssh"
    at = argv.index("--")
    argv = [_SSH, "-G", "-F", "/dev/null", *argv[1:at], *argv[at:-1]]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    return {k: v for k, _, v in (ln.partition(" ") for ln in proc.stdout.splitlines())}


_ALPHABET = st.sampled_from([*"aZ09/~._-+@,=;$`'\"\\%{}()| \t\n#!*?", "\x00", "-oProxyCommand=", "${HOME}"])
_VALUES = st.lists(_ALPHABET, min_size=1, max_size=12).map("".join)


@pytest.mark.skipif(_SSH is None, reason="openssh-client is installed by scripts/setup.sh")
@settings(max_examples=150, deadline=None)
@given(key=st.sampled_from(specmod.SSH_OPTION_KEYS), value=_VALUES)
def test_every_option_value_the_spec_accepts_is_one_harmless_ssh_setting(key: str, value: str) -> None:
    try:
        _load(ssh="root@box-b", options={key: value})
    except SpecError as err:
        assert "cluster.nodes[1].ssh_options" in str(err)
        return
    conf = _resolved(ssh_host("root@box-b", LocalHost(), {key: value}).argv(["true"]))
    assert conf["batchmode"] == "yes" and conf["permitlocalcommand"] == "no", conf
    plain = _resolved(ssh_host("root@box-b", LocalHost()).argv(["true"]))
    assert {k: conf.get(k) for k in _LOCAL_EXEC} == {k: plain.get(k) for k in _LOCAL_EXEC}, conf
    assert "proxycommand" not in conf and "localcommand" not in conf, conf
    assert conf["hostname"] == "box-b" and conf["user"] == (value if key == "User" else "root")


@pytest.mark.skipif(_SSH is None, reason="openssh-client is installed by scripts/setup.sh")
def test_the_options_the_ssh_suite_uses_read_back_as_written(tmp_path: Path) -> None:
    opts = {"IdentityFile": str(tmp_path / "id_ed25519"), "IdentitiesOnly": "yes", "Port": "2222",
            "UserKnownHostsFile": str(tmp_path / "known_hosts"), "StrictHostKeyChecking": "yes",
            "ConnectTimeout": "5", "HostKeyAlias": "box-b.lan", "User": "ops"}  # fmt: skip
    _load(ssh="root@10.231.0.2", options=opts)
    conf = _resolved(ssh_host("root@10.231.0.2", LocalHost(), opts).argv(["true"]))
    assert conf["identityfile"] == opts["IdentityFile"] and conf["port"] == "2222"
    assert conf["hostkeyalias"] == "box-b.lan" and conf["connecttimeout"] == "5"


def test_up_with_a_hostile_node_refuses_at_spec_load_and_never_runs_ssh(tmp_path: Path) -> None:
    """The CLI: one paragraph naming the field; an ``ssh`` first on PATH records any call, and sees none."""
    data = fixtures.ray_data()
    data["cluster"]["nodes"][1].update(ssh="root@box-b", ssh_options={"User": "$(touch${IFS}/tmp/p)"})
    project = write_project(tmp_path, data)
    bin_dir, calls = tmp_path / "bin", tmp_path / "ssh-calls"
    bin_dir.mkdir()
    (bin_dir / "ssh").write_text(f'#!/bin/sh\necho "$@" >> {calls}\nexit 255\n')
    (bin_dir / "ssh").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    for task in ("up", "status", "down", "doctor"):
        res = invoke_cli(project.root, task, "--deployment", fixtures.RAY_NAME, env=env)
        out = res.stdout + res.stderr
        assert res.returncode != 0 and "Traceback" not in out, out
        assert "cluster.nodes[1].ssh_options" in out and "User: " in out, out
    assert not calls.exists()


def test_a_node_path_that_looks_like_a_find_action_is_a_path_there(tmp_path: Path) -> None:
    """``find`` takes no ``--``: a relative path such as ``-delete`` is made ``./-delete``, so a node's file
    listing (run through the node's prefix, here ``env -C DIR``) lists it and deletes nothing."""
    (tmp_path / "-delete").mkdir()
    (tmp_path / "-delete" / "w.bin").write_bytes(b"xyz")
    (tmp_path / "keep").write_text("keep\n")
    node = RemoteHost(("env", "-C", str(tmp_path)), "test node", LocalHost())
    assert set(node.files("-delete")) == {"w.bin"}
    assert (tmp_path / "keep").exists() and (tmp_path / "-delete" / "w.bin").exists()
