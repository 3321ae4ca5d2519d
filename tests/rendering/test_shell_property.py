"""Any text in any spec field that reaches a shell script (podman/NAME/run.sh, lxc/NAME/provision.sh) is
either refused with a RigsmithError naming the field, or reaches podman's argv literally — executed under
bash with a recording fake podman, and nothing the text says is ever run (issue 10, item 1).

The original run-line writer left a value unquoted when it started with ``--``; ``engine.executable:
'--$(touch PWNED)'`` ran ``touch`` on the host. This test fails on that code for that field.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from rigsmith import spec as specmod
from rigsmith.errors import RigsmithError
from rigsmith.rendering import plan as planmod
from rigsmith.rendering.targets import LxcOptions, RenderContext, lxc, lxcservice, podman
from rigsmith.resolving.lock import lock as lockmod
from tests.support.common import REPO
from tests.support.facts import split_systemd

MARK = "PWNED"
#: Shell syntax of every kind around a relative `touch PWNED` (run in an empty working directory), and
#: values other readers type or expand.
HOSTILE = [
    f"$(touch {MARK})",
    f"`touch {MARK}`",
    f";touch {MARK}",
    f"&& touch {MARK}",
    f"| touch {MARK}",
    f"--$(touch {MARK})",
    f"-$(touch {MARK})",
    f"\ntouch {MARK}\n",
    f"\rtouch {MARK}\r",
    f"'$(touch {MARK})'",
    f'"$(touch {MARK})"',
    f"$'\\x41'$(touch {MARK})",
    f"${{IFS}}$(touch {MARK})",
    f"\u2028$(touch {MARK})\u2029",
    f"\x85touch {MARK}\x0b\x0c\x1c\x1d\x1e",
    f">{MARK}",
    f"<(touch {MARK})",
    "%h %n $HOME $(VAR) $$ ${X}",
    "1e5",
    "yes",
    "~",
    "-",
    "--",
    "",
    " ",
    "\\",
    "a\\",
    "'",
    '"',
    "*",
    "[!a]",
    "#x",
    "{a,b}",
    "x\x00y",
    "x" * 300,
]
WORD = st.text(st.characters(blacklist_categories=("Cs",)), max_size=24)
VALUE = st.one_of(
    st.sampled_from(HOSTILE),
    WORD,
    st.tuples(WORD, st.sampled_from(HOSTILE), WORD).map("".join),
)

FAKE_PODMAN = """#!/bin/bash
case "$1 $2" in
  "image exists") exit 0 ;;
  "container exists") exit 1 ;;
esac
if [ "$1" = run ]; then printf '%s\\0' "$@" > "$FAKE_PODMAN_OUT"; exit 0; fi
exit 3
"""

SEED = specmod.to_data(specmod.load(REPO / "deployments/flash-next-merlin-4x3090.yaml"))


def _data(base: Path) -> dict[str, Any]:
    """Seed 003 without GPUs (provision.sh would check real char devices) or mounts, image by tag."""
    data: dict[str, Any] = {**SEED, "name": "prop", "placeholders": {}, "mounts": [], "env": []}
    data["engine"] = {**SEED["engine"], "image": "localhost/img:1", "build": None, "model_arg": None}
    data["engine"]["args"] = ["--port", "8000"]
    data["model"] = {**SEED["model"], "local_dir": str(base / "model")}
    data["network"] = dict(SEED.get("network", {}))
    data["readiness"] = dict(SEED.get("readiness", {}))
    data["resources"] = {**SEED["resources"], "gpus": {"count": 0, "cdi_devices": []}, "host_ram_gib": 8}
    return data


def _set(path: str, value: object) -> Callable[[dict[str, Any], Path], None]:
    def apply(data: dict[str, Any], base: Path) -> None:
        keys = path.split(".")
        node = data
        for k in keys[:-1]:
            node = node[k]
        node[keys[-1]] = value(base) if callable(value) else value

    return apply


def _field(v: str) -> dict[str, tuple[Callable[[dict[str, Any], Path], None], tuple[str, ...]]]:
    """Field → (how to put ``v`` there, names an error about it may use)."""
    return {
        "entrypoint": (_set("engine.executable", v), ("engine.executable",)),
        "subcommand": (_set("engine.subcommand", [v]), ("engine.subcommand",)),
        "args": (_set("engine.args", ["--x", v, v]), ("engine.args",)),
        "env name": (_set("env", [{"name": v, "value": "1"}]), ("env",)),
        "env value": (_set("env", [{"name": "ANY", "value": v}]), ("env",)),
        "mount host": (
            _set("mounts", lambda b: [{"host": f"{b}/h/{v}", "container": "/data"}]),
            ("mounts[0].host", "mounts[0].consent"),
        ),
        "mount container": (
            _set("mounts", lambda b: [{"host": f"{b}/h", "container": f"/d/{v}"}]),
            ("mounts[0].container", "mounts"),
        ),
        "model dir": (_set("model.local_dir", lambda b: f"{b}/m/{v}"), ("model.local_dir",)),
        "model container path": (_set("model.container_path", f"/m/{v}"), ("model.container_path", "mounts")),
        "image": (_set("engine.image", f"{v}.io/img"), ("engine.image",)),
        "image raw": (_set("engine.image", v), ("engine.image",)),
        "name": (_set("name", v), ("name",)),
        "placeholder": (
            lambda d, b: (_set("engine.args", ["<tok>"])(d, b), _set("placeholders", {"<tok>": v})(d, b)),
            ("placeholders", "engine.args"),
        ),
        "sparse file": (
            _set(
                "mounts",
                lambda b: [{"host": f"{b}/f/{v}", "container": "/f", "kind": "file", "sparse_size": 4096}],
            ),
            ("mounts[0].host", "mounts[0]: host", "mounts[0].consent"),
        ),
        "health path": (_set("readiness.health_path", f"/{v}"), ("readiness.health_path",)),
        "network host": (_set("network.host", v), ("network.host",)),
    }


FIELDS = sorted(_field(""))


def _script(artifacts: list[Any], name: str, where: Path) -> Path:
    (art,) = [a for a in artifacts if a.path.name == name]
    path = where / name
    path.write_text(art.content)
    return path


def _run(script: Path, base: Path) -> tuple[subprocess.CompletedProcess[str], list[str] | None]:
    out = base / "argv"
    out.unlink(missing_ok=True)
    env = {
        **os.environ,
        "PATH": f"{base / 'bin'}:{os.environ['PATH']}",
        "HOME": str(base / "home"),
        "CDI_SPEC_DIRS": str(base / "cdi"),
        "FAKE_PODMAN_OUT": str(out),
        "RIGSMITH_LIB_DIRS": str(base / "lib"),
    }
    proc = subprocess.run(
        ["bash", str(script)], cwd=base / "cwd", env=env, capture_output=True, text=True, timeout=30
    )
    argv = out.read_bytes().decode().split("\0")[:-1] if out.exists() else None
    return proc, argv


def _expected(plan: planmod.RunPlan) -> list[str]:
    vols = []
    for m in plan.mounts:
        vols += ["-v", f"{m.host}:{m.container}{':ro' if m.readonly else ''}"]
    return ["run", "--detach", *plan.podman_options(), *vols, plan.image, *plan.command]


def _prepare(plan: planmod.RunPlan, base: Path) -> None:
    for m in plan.mounts:
        host = Path(m.host)
        if m.kind == "dir":
            host.mkdir(parents=True, exist_ok=True)
        else:  # provision.sh wants the file made on the PVE host; run.sh makes it sparse itself
            host.parent.mkdir(parents=True, exist_ok=True)
            host.touch()
            os.truncate(host, m.sparse_size or 0)


#: One hypothesis budget for every field (each example runs bash once or twice).
PER_FIELD = settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def _container_scripts(field: str, value: str) -> None:
    """run.sh and provision.sh (engine.runtime container) carry the value to podman's argv, or refuse it."""
    with tempfile.TemporaryDirectory(prefix="rs-prop-") as tmp:
        base = Path(tmp)
        for d in ("bin", "cwd", "home", "cdi", "out"):
            (base / d).mkdir()
        (base / "bin/podman").write_text(FAKE_PODMAN)
        (base / "bin/podman").chmod(0o755)
        data = _data(base)
        apply, names = _field(value)[field]
        apply(data, base)
        try:
            spec = specmod.loads(specmod.dump(specmod.from_data(data)))
            plan = planmod.make(
                spec, lockmod.Lock(), spec_path="deployments/prop.yaml", home=str(base / "home")
            )
        except RigsmithError as err:
            assert any(n in str(err) for n in names), str(err)
            return
        for target, render, script in (
            ("podman", podman.render, "run.sh"),
            ("lxc", lxc.render, "provision.sh"),
        ):
            ctx = RenderContext(
                spec=spec, out=base / "out", command=f"invoke deploy --target {target}", lxc=LxcOptions()
            )
            try:
                artifacts = render(plan, ctx)
            except RigsmithError as err:
                assert any(n in str(err) for n in names), f"{target}: {err}"
                assert f"{target} target" in str(err), str(err)
                continue
            try:
                _prepare(plan, base)
            except OSError:  # a name the filesystem refuses (too long): nothing to run
                assume(False)
            proc, argv = _run(_script(artifacts, script, base), base)
            assert not (base / "cwd" / MARK).exists() and not list((base / "cwd").iterdir()), target
            assert proc.returncode == 0, f"{target}: {proc.stderr}"
            assert argv == _expected(plan), target


VENV_FIELDS = ["args", "env value", "model dir", "placeholder", "subcommand", "venv"]


def _venv_unit(field: str, value: str) -> None:
    """engine.runtime venv: provision.sh writes a systemd unit through a quoted heredoc; its ExecStart= and
    Environment= must split back to the exact argv and env, and nothing may run."""
    with tempfile.TemporaryDirectory(prefix="rs-prop-") as tmp:
        base = Path(tmp)
        for d in ("cwd", "out", "root/opt/v/bin"):
            (base / d).mkdir(parents=True)
        (base / "root/opt/v/bin/vllm").write_text("#!/bin/sh\n")
        (base / "root/opt/v/bin/vllm").chmod(0o755)
        data = _data(base)
        data["engine"] = {**data["engine"], "runtime": "venv", "venv": "/opt/v", "image": None}
        fields = {**_field(value), "venv": (_set("engine.venv", f"/opt/v{value}"), ("engine.venv",))}
        apply, names = fields[field]
        apply(data, base)
        try:
            spec = specmod.loads(specmod.dump(specmod.from_data(data)))
            plan = planmod.make(
                spec, lockmod.Lock(), spec_path="deployments/prop.yaml", home=str(base / "home")
            )
            ctx = RenderContext(spec=spec, out=base / "out", command="invoke deploy --target lxc")
            artifacts = lxc.render(plan, ctx)
        except RigsmithError as err:
            assert any(n in str(err) for n in names), str(err)
            return
        venv = base / "root" / str(plan.venv).lstrip("/") / "bin"
        try:
            venv.mkdir(parents=True, exist_ok=True)
            (venv / "vllm").write_text("#!/bin/sh\n")
            _prepare(plan, base)
        except OSError:
            assume(False)
        (venv / "vllm").chmod(0o755)
        env = {**os.environ, "RIGSMITH_ROOT": str(base / "root"), "RIGSMITH_SYSTEMCTL": "true"}
        proc = subprocess.run(
            ["bash", str(_script(artifacts, "provision.sh", base))],
            cwd=base / "cwd",
            env={**env, "HOME": str(base / "home")},
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert not list((base / "cwd").iterdir()), "a value ran on the host"
        assert proc.returncode == 0, proc.stderr
        text = (base / f"root/etc/systemd/system/{plan.name}.service").read_text()
        assert text == lxcservice.unit_text(plan, ctx)  # the heredoc carried the unit byte for byte
        keys: dict[str, list[str]] = {}
        for line in text.split("\n"):
            if "=" in line and not line.startswith("#"):
                k, _, v = line.partition("=")
                keys.setdefault(k, []).append(v)
        assert split_systemd(keys["ExecStart"][0]) == lxcservice.venv_argv(plan)
        assert [split_systemd(e) for e in keys.get("Environment", [])] == [[f"{k}={v}"] for k, v in plan.env]


CASES = [("container", f) for f in FIELDS] + [("venv", f) for f in VENV_FIELDS]


@pytest.mark.parametrize(("runtime", "field"), CASES, ids=[f"{r}-{f}" for r, f in CASES])
@PER_FIELD
@given(value=VALUE)
@example(value=".")  # once a sparse file at <dir>/. reached run.sh, whose mkdir then failed on the file
def test_any_text_in_any_script_field_is_refused_by_name_or_reaches_the_engine_literally(
    runtime: str, field: str, value: str
) -> None:
    assume(".." not in value)  # path traversal is the import side's business; this is about the shell
    (_container_scripts if runtime == "container" else _venv_unit)(field, value)


def test_a_double_dash_entrypoint_is_quoted_in_both_scripts(tmp_path: Path) -> None:
    """The reported case, by hand: `--$(cmd)` as the entrypoint is one quoted word."""
    data = _data(tmp_path)
    data["engine"]["executable"] = f"--$(touch {MARK})"
    spec = specmod.from_data(data)
    plan = planmod.make(spec, lockmod.Lock(), spec_path="deployments/prop.yaml")
    ctx = RenderContext(spec=spec, out=tmp_path / "out", command="invoke deploy")
    for art in [*podman.render(plan, ctx), *lxc.render(plan, ctx)]:
        if art.path.name in ("run.sh", "provision.sh"):
            assert f"  --entrypoint '--$(touch {MARK})' \\\n" in art.content, art.path
