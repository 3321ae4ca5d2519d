"""The hostile-value matrix (issue 10): value classes × every field that reaches an artifact × all five
targets, executed by each artifact's real consumer.

- podman: run.sh under bash with a recording fake podman (the real podman run is test_podman_real's);
- lxc: provision.sh the same way, and pct.conf's lines read back;
- quadlet: podman 5.4.2's own generator, its ExecStart= split the way systemd splits it;
- compose: podman-compose 1.6.0 starts the file on real podman, the stand-in engine records argv and env;
- kube: `podman kube play` on real podman, the same recording.

One spec per target carries every value class at once (args, env, placeholders, mount paths); a target that
cannot express a value must refuse it with a RigsmithError naming the field and the target, and is then
rendered again without it. Whatever is rendered must arrive byte for byte, and no value may ever run on the
host (a marker file). Single-value fields (entrypoint, name, CLI options, served model names) are checked
per value.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from rigsmith import spec as specmod
from rigsmith.errors import RigsmithError, SpecError
from rigsmith.operating.lifecycle import proxy
from rigsmith.render import LINE_BREAKS, line_breaks
from rigsmith.rendering import deploy
from rigsmith.rendering.plan import RunPlan
from rigsmith.rendering.targets import LxcOptions
from rigsmith.rendering.targets.kube import k8s_literal
from tests.rendering.test_shell_property import FAKE_PODMAN
from tests.rendering.test_units import _k8s_expand
from tests.support.common import HOST_MEMLOCK, standin_deployment, write_project
from tests.support.facts import exec_start, podman_facts, split_systemd
from tests.support.podman import Podman, parse_recording
from tests.support.targets import compose_up as _up
from tests.support.targets import run_quadlet

MARK = "PWNED"
VALUES: dict[str, str] = {
    "subst": f"$(touch {MARK})",
    "backtick": f"`touch {MARK}`",
    "semicolon": f";touch {MARK};",
    "quotes": "'\"'\"",
    "ddash-subst": f"--$(touch {MARK})",
    "lead-dash": "-x",
    "newline": f"a\ntouch {MARK}",
    "cr": f"a\rtouch {MARK}",
    **{f"break-{ord(c):x}": f"a{c}b" for c in LINE_BREAKS if c not in "\n\r"},
    "yaml-exp": "1e5",
    "yaml-float": "1.0e3",
    "yaml-oct": "0o17",
    "yaml-hex": "0x1F",
    "yaml-inf": ".inf",
    "yaml-yes": "yes",
    "yaml-on": "on",
    "yaml-y": "y",
    "yaml-tilde": "~",
    "yaml-null": "null",
    "yaml-under": "1_000",
    "yaml-sexa": "12:30:00",
    "percent": "%h %n %% %",
    "dollar": "$HOME ${HOME} $$",
    "kube-var": "$(HOME)",
    "long": "x" * 4000,
    "empty": "",
    "spaces": " a ",
    "backslash": "a\\",
    "tab": "a\tb",
    "unicode": "模型 ✓",
    "hash": "#x",
    "glob": "*?[a]",
}
#: Values a file name can hold (no NUL, no '/', at most 255 bytes, not empty).
PATH_VALUES = {k: v for k, v in VALUES.items() if k not in ("long", "empty")}
TARGETS = ("podman", "lxc", "quadlet", "compose", "kube")


# -- one spec per target, with every value class in every multi-value field -----------------------


def _data(base: Path, name: str, drop: set[tuple[str, str]]) -> dict[str, Any]:
    data = standin_deployment(base, name=name)
    seed_args = list(data["engine"]["args"])  # type: ignore[index]
    args = [*seed_args, "--literal"]
    placeholders = dict(data.get("placeholders") or {})  # type: ignore[call-overload]
    for cls, v in VALUES.items():
        if ("args", cls) not in drop:
            args.append(v)
        if ("placeholder", cls) not in drop and v:  # an empty value means "not filled in yet"
            tok = f"<ph_{cls.replace('-', '_')}>"
            args.append(tok)
            placeholders[tok] = v
    data["engine"]["args"] = args  # type: ignore[index]
    data["placeholders"] = placeholders
    data["env"] = [{"name": _env(cls), "value": v} for cls, v in VALUES.items() if ("env", cls) not in drop]
    data["mounts"] = [
        {"host": f"{base}/h/{i}{v}", "container": f"/c/{i}{v}", "readonly": True}
        for i, (cls, v) in enumerate(PATH_VALUES.items())
        if ("mount", cls) not in drop
    ]
    data["resources"]["host_ram_gib"] = 16  # type: ignore[index]
    return data


def _env(cls: str) -> str:
    return "H_" + re.sub(r"\W", "_", cls)


def _classify(data: dict[str, Any], fld: str) -> tuple[str, str]:
    """(field kind, value class) of a problem's field path in the packed spec."""
    m = re.fullmatch(r"engine\.args\[(\d+)\]", fld)
    if m:
        word = data["engine"]["args"][int(m.group(1))]
        for cls in VALUES:
            if word == f"<ph_{cls.replace('-', '_')}>":
                return ("placeholder", cls)
        return ("args", next(c for c, v in VALUES.items() if v == word))
    m = re.fullmatch(r"env\.(H_\w+)", fld)
    if m:
        return ("env", next(c for c in VALUES if _env(c) == m.group(1)))
    m = re.fullmatch(r"mounts\[(\d+)\]\.(host|container)", fld)
    if m:
        host = data["mounts"][int(m.group(1))]["host"]
        return ("mount", next(c for i, (c, v) in enumerate(PATH_VALUES.items()) if host.endswith(f"/{i}{v}")))
    raise AssertionError(f"a refusal names {fld!r}, which is not a field of the spec")


#: What a target may refuse (and why it cannot do better); anything else must arrive literally.
MAY_REFUSE: dict[str, set[tuple[str, str]]] = {
    # quadlet drops an empty Exec= word and everything after it; Volume= is raw: no line breaks, trimmed.
    "quadlet": {("args", "empty"), ("placeholder", "empty")}
    | {("mount", c) for c in PATH_VALUES if c in ("yaml-sexa", "spaces", "backslash", "tab", "quotes")}
    | {("mount", c) for c in PATH_VALUES if c in ("newline", "cr") or c.startswith("break-")},
    # pct.conf: one line per value, no control characters, PVE splits mount options on ',', '=' and blanks.
    "lxc": {("env", c) for c in VALUES if c in ("newline", "cr", "spaces", "tab") or c.startswith("break-")}
    | {("mount", c) for c in PATH_VALUES},
    # the host:container[:ro] syntax (podman -v, compose volumes) splits on ':'.
    "podman": {("mount", "yaml-sexa")},
    "compose": {("mount", "yaml-sexa")},
    "kube": {("mount", "yaml-sexa")},  # podman kube play binds hostPath volumes as host:container
}


def _render_packed(base: Path, target: str, name: str, venv: bool = False) -> tuple[Any, ...]:
    """(data, plan, artifacts, refused, base), re-rendering without what the target refused."""
    drop: set[tuple[str, str]] = set()
    for _ in range(10):
        data = _data(base, name, drop)
        if target == "lxc":  # the fake CDI vendor has no device-node table (lxc's GPU part: test_lxc)
            data["resources"]["gpus"] = {"count": 0, "cdi_devices": []}
        if venv:
            data["engine"] = {**data["engine"], "runtime": "venv", "venv": VENV, "image": None}
        project = write_project(base, data)
        try:
            plan, files = deploy.artifacts(
                project,
                target,
                deployment=name,
                out=base / "out",
                memlock=HOST_MEMLOCK,
                podman_version="5.4.2",
            )
            break
        except SpecError as err:
            for fld, why in err.problems:
                assert f"the {target} target cannot express this" in why, (fld, why)
                drop.add(_classify(data, fld))
    else:
        raise AssertionError(f"{target}: refusals did not converge: {drop}")
    assert drop <= MAY_REFUSE[target], sorted(drop - MAY_REFUSE[target])
    for m in data["mounts"]:
        Path(m["host"]).mkdir(parents=True, exist_ok=True)
    Path(data["model"]["local_dir"]).mkdir(parents=True, exist_ok=True)
    return data, plan, files, drop, base


VENV = "/opt/vllm/venv"


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Any, ...]]:
    """Per target: the packed spec rendered (see _render_packed)."""
    return {t: _render_packed(tmp_path_factory.mktemp(f"matrix-{t}"), t, f"matrix-{t}") for t in TARGETS}


def _values_in(plan: RunPlan) -> None:
    """Nothing was changed on the way to the plan (placeholders filled, exact words)."""
    for v in VALUES.values():
        assert v in plan.command or v == "", v


def _fake_run(script: str, base: Path) -> list[str]:
    """Run a generated script under bash with a recording podman, in an empty directory; podman's argv."""
    base.mkdir(parents=True, exist_ok=True)
    (base / "bin").mkdir(exist_ok=True)
    (base / "bin/podman").write_text(FAKE_PODMAN)
    (base / "bin/podman").chmod(0o755)
    cwd = base / "cwd"
    cwd.mkdir(exist_ok=True)
    (base / "cdi").mkdir(exist_ok=True)
    (base / "cdi/fake.yaml").write_text(
        'kind: "example.com/gpu"\n' + "".join(f'name: "{n}"\n' for n in ("0", "1", "2", "3", "all"))
    )
    path = base / "script.sh"
    path.write_text(script)
    env = {
        **os.environ,
        "PATH": f"{base / 'bin'}:{os.environ['PATH']}",
        "CDI_SPEC_DIRS": str(base / "cdi"),
        "FAKE_PODMAN_OUT": str(base / "argv"),
        "RIGSMITH_ALLOW_GPU_PROCS": "1",
    }
    proc = subprocess.run(["bash", str(path)], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
    assert not list(cwd.iterdir()), "a value ran on the host"
    assert proc.returncode == 0, proc.stderr
    return (base / "argv").read_bytes().decode().split("\0")[:-1]


def _expected_argv(plan: RunPlan) -> list[str]:
    vols = []
    for m in plan.mounts:
        vols += ["-v", f"{m.host}:{m.container}{':ro' if m.readonly else ''}"]
    return ["run", "--detach", *plan.podman_options(), *vols, plan.image, *plan.command]


def _no_marker(base: Path) -> None:
    assert not [p for p in base.rglob(MARK) if p.name == MARK], "a value ran on the host"


def test_podman_run_sh_carries_every_value_literally(packed) -> None:
    _d, plan, files, _drop, base = packed["podman"]
    _values_in(plan)
    (run,) = [a for a in files if a.path.name == "run.sh"]
    assert _fake_run(run.content, base) == _expected_argv(plan)
    _no_marker(base)


def test_lxc_provision_and_pct_conf_carry_every_value_literally(packed) -> None:
    _d, plan, files, _drop, base = packed["lxc"]
    _values_in(plan)
    conf, script = files
    # the stand-in spec's CDI vendor has no device-node table: the GPU part is checked elsewhere
    assert _fake_run(script.content, base) == _expected_argv(plan)
    env = dict(
        ln.split(": ", 1)[1].split("=", 1)
        for ln in conf.content.splitlines()
        if ln.startswith("lxc.environment")
    )
    assert env == dict(plan.env)
    assert line_breaks(conf.content.replace("\n", "")) == []
    _no_marker(base)


def test_lxc_venv_provision_installs_a_unit_running_every_value_literally(tmp_path: Path) -> None:
    _d, plan, files, _drop, base = _render_packed(tmp_path, "lxc", "matrix-venv", venv=True)
    _values_in(plan)
    root = base / "root"
    exe = root / VENV.lstrip("/") / "bin/vllm"
    exe.parent.mkdir(parents=True)
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    (script,) = [a for a in files if a.path.name == "provision.sh"]
    path = base / "provision.sh"
    path.write_text(script.content)
    (base / "cwd").mkdir()
    env = {**os.environ, "RIGSMITH_ROOT": str(root), "RIGSMITH_SYSTEMCTL": "true"}
    proc = subprocess.run(["bash", str(path)], cwd=base / "cwd", env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert not list((base / "cwd").iterdir()), "a value ran on the host"
    text = (root / "etc/systemd/system/matrix-venv.service").read_text()
    assert line_breaks(text.replace("\n", "")) == [], "a value put a line break into the unit"
    keys: dict[str, list[str]] = {}
    for line in text.split("\n"):
        if "=" in line and not line.startswith("#"):
            k, _, v = line.partition("=")
            keys.setdefault(k, []).append(v)
    (start,) = keys["ExecStart"]
    assert split_systemd(start) == [f"{VENV}/bin/vllm", *plan.command]
    assert [split_systemd(e) for e in keys["Environment"]] == [[f"{k}={v}"] for k, v in plan.env]
    _no_marker(base)


def test_quadlet_generator_produces_the_exact_podman_argv(packed, quadlet_bin: Path) -> None:
    _d, plan, files, _drop, base = packed["quadlet"]
    _values_in(plan)
    (unit,) = files
    assert line_breaks(unit.content.replace("\n", "")) == [], "a value put a line break into the unit"
    path = base / unit.path.name
    path.write_text(unit.content)
    proc = run_quadlet(quadlet_bin, path, base / "q")
    assert proc.returncode == 0, proc.stderr
    got = podman_facts(split_systemd(exec_start(proc.stdout), home="/root"))
    assert got.command == list(plan.command)
    assert {k: got.env.get(k) for k, _ in plan.env} == dict(plan.env)
    assert sorted(got.mounts) == sorted((m.host, m.container, m.readonly) for m in plan.mounts)
    assert got.image == plan.image and got.entrypoint == plan.entrypoint


@pytest.fixture
def compose_up(
    packed, podman: Podman, fake_cdi: Path, standin_image: str, compose_bins: dict[str, list[str]]
) -> Iterator[tuple[Any, ...]]:
    data, plan, files, _drop, base = packed["compose"]
    (art,) = files
    path = base / "compose.yaml"
    path.write_text(art.content)
    try:  # run from base: _no_marker looks there for anything a value ran
        proc = _up(
            compose_bins["1.6.0"], path, podman, [f"--podman-run-args=--stop-timeout={plan.stop_timeout}"]
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        yield data, plan, base
    finally:
        podman.run("rm", "--force", "--time", "0", plan.name, check=False)
        podman.run("pod", "rm", "--force", f"pod_{plan.name}", check=False)


def test_compose_engine_receives_every_value_literally(compose_up, podman: Podman) -> None:
    _d, plan, base = compose_up
    _values_in(plan)
    rec = parse_recording(podman.logs_until(plan.name, "Application startup complete"))
    assert rec.argv == list(plan.command)
    assert {k: rec.env.get(k) for k, _ in plan.env} == dict(plan.env)
    mounts = {(m["Source"], m["Destination"]) for m in podman.inspect(plan.name)["Mounts"]}  # type: ignore[union-attr]
    assert {(m.host, m.container) for m in plan.mounts} <= mounts
    _no_marker(base)


@pytest.fixture
def kube_played(packed, podman: Podman, standin_image: str) -> Iterator[tuple[Any, ...]]:
    data, plan, files, _drop, base = packed["kube"]
    (art,) = files
    path = base / "kube.yaml"
    path.write_text(art.content)
    try:
        proc = podman.run("kube", "play", str(path), check=False, timeout=180)
        assert proc.returncode == 0, proc.stderr
        yield data, plan, base, yaml.safe_load_all(art.content)
    finally:
        podman.run("kube", "down", str(path), check=False)
        podman.run("volume", "rm", "--force", f"{plan.name}-shm", check=False)


def test_kube_engine_receives_every_value_literally(kube_played, podman: Podman) -> None:
    _d, plan, base, _docs = kube_played
    _values_in(plan)
    listing = podman.run("ps", "-a", "--format", "{{.Names}}").stdout.split()
    (name,) = [n for n in listing if n.endswith(f"-{plan.name}")]
    rec = parse_recording(podman.logs_until(name, "Application startup complete"))
    # podman 4.3's kube play expands nothing, so it passes the manifest's words on; Kubernetes (and podman
    # >= 4.7) expand $(VAR) and $$, and the manifest is written so that gives back the recipe's word.
    assert rec.argv == [k8s_literal(a) for a in plan.command]
    assert [_k8s_expand(a, {"HOME": "/EXPANDED"}) for a in rec.argv] == list(plan.command)
    assert {k: rec.env.get(k) for k, _ in plan.env} == {k: k8s_literal(v) for k, v in plan.env}
    mounts = {(m["Source"], m["Destination"]) for m in podman.inspect(name)["Mounts"]}  # type: ignore[union-attr]
    assert {(m.host, m.container) for m in plan.mounts} <= mounts
    _no_marker(base)


# -- NUL: refused in every field by every target, naming the field ----------------------------------


NUL_FIELDS = {
    "engine.args": lambda d, b: d["engine"].update(args=[*d["engine"]["args"], "a\0b"]),
    "engine.executable": lambda d, b: d["engine"].update(executable="vl\0lm"),
    "env": lambda d, b: d.update(env=[{"name": "X", "value": "a\0b"}]),
    "mounts[0].host": lambda d, b: d.update(mounts=[{"host": f"{b}/a\0b", "container": "/x"}]),
    "mounts[0].container": lambda d, b: d.update(mounts=[{"host": f"{b}/a", "container": "/x\0"}]),
    "model.local_dir": lambda d, b: d["model"].update(local_dir=f"{b}/m\0"),
    "placeholders": lambda d, b: d["placeholders"].update({"<repo>": "r\0"}),
    "readiness.health_path": lambda d, b: d.update(readiness={"health_path": "/h\0"}),
}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("field", sorted(NUL_FIELDS))
def test_a_nul_is_refused_naming_the_field(tmp_path: Path, target: str, field: str) -> None:
    data = standin_deployment(tmp_path, name="nul")
    data["resources"]["host_ram_gib"] = 16  # type: ignore[index]
    NUL_FIELDS[field](data, tmp_path)
    project = write_project(tmp_path, data)
    with pytest.raises(RigsmithError) as err:
        deploy.artifacts(project, target, deployment="nul", out=tmp_path / "out")
    assert field in str(err.value) and "NUL" in str(err.value), str(err.value)


# -- single-value fields, per value class -----------------------------------------------------------


@pytest.fixture(scope="module")
def one(tmp_path_factory: pytest.TempPathFactory):
    base = tmp_path_factory.mktemp("matrix-one")

    def render(target: str, change: dict[str, Any] | None = None, **options: Any) -> list[Any]:
        data = standin_deployment(base, name="one")
        data["resources"]["host_ram_gib"] = 16  # type: ignore[index]
        if target == "lxc":
            data["resources"]["gpus"] = {"count": 0, "cdi_devices": []}  # type: ignore[index]
        for key, value in (change or {}).items():
            data[key] = {**data[key], **value} if isinstance(data.get(key), dict) else value
        project = write_project(base, data)
        return deploy.artifacts(project, target, deployment="one", out=base / "out", **options)[1]

    return base, render


@pytest.mark.parametrize("cls", sorted(VALUES))
def test_entrypoint_reaches_every_target_literally_or_is_refused_by_name(
    one, quadlet_bin: Path, cls: str
) -> None:
    base, render = one
    value = VALUES[cls]
    for target in TARGETS:
        try:
            files = render(target, {"engine": {"executable": value}}, podman_version="5.4.2")
        except RigsmithError as err:
            msg = str(err)
            assert "engine.executable" in msg and (target in msg or "deployment spec" in msg), msg
            continue
        if target in ("podman", "lxc"):
            (script,) = [a for a in files if a.path.name in ("run.sh", "provision.sh")]
            for m in (base / "models",):
                Path(m, "one").mkdir(parents=True, exist_ok=True)
            (base / "host/src/merlin").mkdir(parents=True, exist_ok=True)
            argv = _fake_run(script.content, base / target)
            assert argv[argv.index("--entrypoint") + 1] == value
        elif target == "quadlet":
            assert line_breaks(files[0].content.replace("\n", "")) == []
            path = base / "one.container"
            path.write_text(files[0].content)
            proc = run_quadlet(quadlet_bin, path, base / "q")
            assert proc.returncode == 0, proc.stderr
            assert podman_facts(split_systemd(exec_start(proc.stdout))).entrypoint == value
        elif target == "compose":
            svc = yaml.safe_load(files[0].content)["services"]["one"]  # podman-compose's own parser
            assert [e.replace("$$", "$") for e in svc["entrypoint"]] == [value]
        else:
            docs = [d for d in yaml.safe_load_all(files[0].content) if d]
            (cmd,) = docs[0]["spec"]["template"]["spec"]["containers"][0]["command"]
            assert _k8s_expand(cmd, {"HOME": "/EXPANDED"}) == value
    _no_marker(base)


@pytest.mark.parametrize("cls", sorted(VALUES))
def test_a_hostile_name_is_refused_naming_the_field(tmp_path: Path, cls: str) -> None:
    data = standin_deployment(tmp_path, name="ok")
    data["name"] = VALUES[cls]
    if specmod.NAME_RE.match(VALUES[cls]):  # 1e5, yes, y, null: names the YAML emitter quotes
        assert specmod.from_data(data).name == VALUES[cls]
        return
    with pytest.raises(RigsmithError) as err:
        specmod.from_data(data)
    assert "name" in str(err.value)


@pytest.mark.parametrize("cls", sorted(VALUES))
def test_cli_values_reaching_files_are_checked(one, cls: str) -> None:
    _base, render = one
    value = VALUES[cls] or "\r[Service]"
    if re.fullmatch(r"[0-9A-Za-z.+~_-]*", value):  # a version suffix as distributions write them
        (unit,) = render("quadlet", podman_version=f"5.4.2-{value}")
        assert f"# For podman 5.4.2-{value} " in unit.content
        return
    with pytest.raises(SpecError) as err:
        render("quadlet", podman_version=f"5.4.2-{value}")
    assert "podman_version" in str(err.value)
    with pytest.raises(SpecError) as err:
        render("lxc", lxc=LxcOptions(pve_version=f"8.2-{value}"))
    assert "--pve-version" in str(err.value)


@pytest.mark.parametrize("vmid", [-5, 0, 99, 1_000_000_000])
def test_a_vmid_outside_proxmox_range_is_refused(one, vmid: int) -> None:
    _base, render = one
    with pytest.raises(SpecError) as err:
        render("lxc", lxc=LxcOptions(vmid=vmid))
    assert "--vmid" in str(err.value) and "100 to 999999999" in str(err.value)


@pytest.mark.parametrize("cls", sorted(VALUES))
def test_served_model_names_and_description_stay_in_the_llama_swap_yaml(tmp_path: Path, cls: str) -> None:
    value = VALUES[cls]
    if "\0" in value:
        return
    data = standin_deployment(tmp_path, name="swap", description=value or None)
    data["engine"]["args"] = [  # type: ignore[index]
        *data["engine"]["args"],
        "--served-model-name",
        "first",
        value,
        f"x{value}",
    ]
    spec = specmod.loads(specmod.dump(specmod.from_data(data)))
    text = proxy.render(spec)["llama-swap.yaml"]
    assert line_breaks(text.replace("\n", "")) == [], "a value put a line break into the file"
    loaded = yaml.safe_load(text)
    assert loaded == proxy.llama_swap_entry(spec)  # every value literal after a YAML reader's folding
    assert list(loaded["models"]) == proxy.served_names(spec)[:1]
    assert next(ln for ln in text.splitlines() if not ln.startswith("#")) == "models:"
