"""Proxmox LXC: pct.conf keys against pct.conf(5), raw lxc.* lines applied by liblxc, merge into an existing
config, provision.sh executed with bash."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from rigsmith.errors import ConsentError, RigsmithError, SpecError
from rigsmith.project import Project
from rigsmith.rendering import deploy
from rigsmith.rendering.targets import LxcOptions, lxc, pvekeys
from rigsmith.rendering.targets.timing import timings
from tests.support.common import prepare_host_dirs, require, standin_deployment, write_project
from tests.support.liblxc import liblxc_config, lxc_execute
from tests.support.targets import CT_VENV, SEEDS, as_venv, conf_pairs, fake_ct, render_seed

PVE_VARIANTS = [LxcOptions(), LxcOptions(pve_version="7.4", uvm_major=509)]


def _conf(project: Project, seed: str, out: Path, opts: LxcOptions) -> str:
    files = render_seed(project, "lxc", seed, out, lxc=opts)
    return next(text for rel, text in files.items() if rel.endswith(".conf"))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("opts", PVE_VARIANTS, ids=["pve8.2-devN", "pve7.4-raw"])
def test_pve_keys_match_the_pct_conf_table(
    seed_project: Project, tmp_path: Path, seed: str, opts: LxcOptions
) -> None:
    pairs = conf_pairs(_conf(seed_project, seed, tmp_path, opts))
    pve = (int(opts.pve_version.split(".")[0]), int(opts.pve_version.split(".")[1]))
    assert pvekeys.check(pairs, pve) == []
    keys = [k for k, _ in pairs]
    assert ("dev0" in keys) == (pve >= (8, 1))
    assert any(k == "lxc.cgroup2.devices.allow" for k in keys) == (pve < (8, 1))
    assert dict(pairs)["lxc.prlimit.memlock"] == "unlimited"
    assert dict(pairs)["features"] == "keyctl=1,nesting=1"
    assert pvekeys.check([("bogus", "1"), ("lxc.rootfs.path", "dir:/x"), ("dev0", "/dev/x")], (7, 4)) == [
        "bogus: not a pct.conf key",
        "lxc.rootfs.path: not a raw key PVE passes to liblxc",
        "dev0: needs PVE 8.1",
    ]


@pytest.mark.parametrize("seed", SEEDS)
def test_startup_down_outlasts_every_stop_timeout_inside(
    seed_project: Project, tmp_path: Path, seed: str
) -> None:
    pairs = dict(conf_pairs(_conf(seed_project, seed, tmp_path, LxcOptions())))
    m = re.fullmatch(r"order=\d+,up=(\d+),down=(\d+)", pairs["startup"])
    assert m
    plan, _ = deploy.artifacts(seed_project, "lxc", deployment=seed, out=tmp_path)
    t = timings(plan)
    assert (plan.shutdown_timeout or 0) < plan.stop_timeout < t.systemd_stop < int(m.group(2))
    assert int(m.group(1)) == plan.startup_seconds


# -- liblxc -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seed", "opts"),
    [(SEEDS[0], PVE_VARIANTS[1]), (SEEDS[1], PVE_VARIANTS[0])],
    ids=["seed000-raw", "seed003-devN"],
)
def test_liblxc_applies_shm_env_devices_mounts_and_memlock(
    seed_project: Project, tmp_path: Path, busybox_rootfs: Path, seed: str, opts: LxcOptions
) -> None:
    require("lxc-execute")
    conf = _conf(seed_project, seed, tmp_path / "out", opts)
    plan, _ = deploy.artifacts(seed_project, "lxc", deployment=seed, out=tmp_path / "out", lxc=opts)
    # This machine cannot raise RLIMIT_MEMLOCK; lowering it proves liblxc applies the key we write.
    config, targets = liblxc_config(conf, busybox_rootfs, tmp_path / "fake", memlock="4096")
    probe = "df -k /dev/shm | tail -n 1; ulimit -l; env; ls -l /dev; ls -ld " + " ".join(
        "/" + h.lstrip("/") for h in targets if not h.startswith("/dev/")
    )
    proc = lxc_execute(tmp_path / "lxcpath", "rs-" + seed[:20], config, probe)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert re.search(r"tmpfs\s+8388608\s", out), out  # 8g /dev/shm
    assert "\n4\n" in out  # lxc.prlimit.memlock applied (4096 bytes = 4 KiB)
    for k, v in plan.env:
        assert f"\n{k}={v}\n" in out, k
    for i in range(plan.shm_bytes and len(plan.devices)):
        assert re.search(rf"^c\S+\s.*\snvidia{i}$", out, re.MULTILINE), out
    for node in ("nvidiactl", "nvidia-uvm"):
        assert re.search(rf"^c\S+\s.*\s{node}$", out, re.MULTILINE)
    for host in targets:
        if not host.startswith("/dev/"):
            assert "/" + host.lstrip("/") in out


def test_liblxc_rejects_an_unknown_key_and_parses_unlimited_memlock(
    tmp_path: Path, busybox_rootfs: Path, seed_project: Project
) -> None:
    conf = _conf(seed_project, SEEDS[1], tmp_path / "out", LxcOptions())
    config, _ = liblxc_config(conf, busybox_rootfs, tmp_path / "fake", memlock=None)
    proc = lxc_execute(tmp_path / "lxcpath", "rs-unlimited", config, "true")
    # Parsed (no parse error); only applying fails, because this machine cannot raise the hard limit.
    assert "Failed to parse config" not in proc.stderr
    assert proc.returncode == 0 or "Failed to setup resource limits" in proc.stderr, proc.stderr
    bad = lxc_execute(tmp_path / "lxcpath", "rs-bogus", config + "lxc.bogus.key = 1\n", "true")
    assert bad.returncode != 0 and "Failed to parse config" in bad.stderr


# -- merging an existing config -----------------------------------------------------------------------

USER_CONF = """\
#My inference box
arch: amd64
cores: 16
memory: 4096
hostname: gpu-box
mp0: /tank/datasets,mp=/data
net0: name=eth0,bridge=vmbr0,ip=dhcp
rootfs: local-zfs:subvol-100-disk-0,size=200G
lxc.mount.entry: /dev/dri dev/dri none bind,optional,create=dir
lxc.environment: TZ=Europe/Berlin

[snap1]
arch: amd64
cores: 4
memory: 2048
snaptime: 1700000000
"""

#: A real-looking PVE CT config with its own GPU passthrough in the raw form (issue 12's report).
PVE_CONF = """\
#LLM box%3A vLLM on 4x 3090
#managed by hand since 2025
arch: amd64
cores: 16
features: nesting=1
hostname: llm-box
memory: 131072
net0: name=eth0,bridge=vmbr0,firewall=1,hwaddr=BC:24:11:5E:7A:01,ip=dhcp,type=veth
onboot: 1
ostype: debian
rootfs: local-zfs:subvol-101-disk-0,size=200G
startup: order=2
swap: 512
unprivileged: 1
lxc.cgroup2.devices.allow: c 195:* rwm
lxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind,optional,create=file
lxc.mount.entry: /dev/nvidiactl dev/nvidiactl none bind,optional,create=file

[vzdump]
#vzdump backup snapshot
arch: amd64
cores: 16
hostname: llm-box
memory: 131072
rootfs: local-zfs:subvol-101-disk-0,size=200G
snapstate: prepare
snaptime: 1764547200
"""
PASSTHROUGH = [ln for ln in PVE_CONF.split("[vzdump]")[0].splitlines() if "nvidia" in ln or "195:" in ln]


def _merge_users(
    project: Project, tmp_path: Path, conf: Path, seed: str = SEEDS[1], **opts: object
) -> tuple[Path, list[str]]:
    messages: list[str] = []
    deploy.deploy(
        project,
        "lxc",
        deployment=seed,
        out=tmp_path / "out",
        yes=True,
        lxc=LxcOptions(vmid=int(conf.stem), config=conf, **opts),  # type: ignore[arg-type]
        echo=messages.append,
    )
    return tmp_path / "out" / "lxc" / seed / f"{conf.stem}.conf", messages


def test_a_handed_in_ct_config_is_never_written_and_its_own_passthrough_needs_consent(
    seed_project: Project, tmp_path: Path
) -> None:
    conf = tmp_path / "101.conf"
    conf.write_text(PVE_CONF)
    with pytest.raises(ConsentError) as err:
        _merge_users(seed_project, tmp_path, conf)
    for line in PASSTHROUGH:
        assert line in str(err.value)
    assert "--replace-gpu-passthrough" in str(err.value)
    assert conf.read_text() == PVE_CONF and not (tmp_path / "out").exists()


def test_merge_changes_only_rigsmiths_settings_and_keeps_every_user_line(
    seed_project: Project, tmp_path: Path, busybox_rootfs: Path
) -> None:
    conf = tmp_path / "101.conf"
    conf.write_text(PVE_CONF)
    out, messages = _merge_users(seed_project, tmp_path, conf, replace_passthrough=True)
    assert conf.read_text() == PVE_CONF  # the input is read, never written
    merged = out.read_text()
    main, snap = merged.split("\n[vzdump]\n")
    assert snap == PVE_CONF.split("[vzdump]\n")[1]  # snapshot section byte for byte
    kept = [ln for ln in PVE_CONF.split("\n[vzdump]")[0].splitlines() if ln not in PASSTHROUGH]
    changed = {"features: nesting=1", "startup: order=2"}
    lines = main.splitlines()
    assert [ln for ln in lines if ln in kept] == [ln for ln in kept if ln not in changed]  # same order
    assert not main.startswith("# Generated") and lines[:2] == PVE_CONF.splitlines()[:2]  # the CT's notes
    d = dict(conf_pairs(main))
    assert (d["cores"], d["memory"], d["hostname"], d["swap"]) == ("16", "131072", "llm-box", "512")
    assert d["rootfs"] == "local-zfs:subvol-101-disk-0,size=200G"
    assert d["features"] == "nesting=1,keyctl=1"
    assert re.fullmatch(r"order=2,up=\d+,down=\d+", d["startup"])
    assert main.count("/dev/nvidia0") == 1 and main.count("/dev/nvidiactl") == 1  # never passed twice
    assert "c 195:* rwm" not in main
    assert pvekeys.check([(k, v) for k, v in conf_pairs(main)], (8, 2), user_keys=True) == []
    assert any(str(conf) in m and "-lxc.cgroup2.devices.allow: c 195:* rwm" in m for m in messages)
    config, _ = liblxc_config(merged, busybox_rootfs, tmp_path / "fake", memlock="4096")
    proc = lxc_execute(tmp_path / "lxcpath", "rs-users-conf", config, "df -k /dev/shm | tail -n 1; ulimit -l")
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"tmpfs\s+8388608\s", proc.stdout) and "\n4\n" in proc.stdout + "\n"
    again, _ = _merge_users(seed_project, tmp_path, conf, replace_passthrough=True)
    assert again.read_text() == merged  # idempotent


def test_user_edits_to_owned_settings_survive_and_a_double_change_is_a_conflict(
    seed_project: Project, tmp_path: Path
) -> None:
    conf = tmp_path / "101.conf"
    conf.write_text(PVE_CONF)
    out, _ = _merge_users(seed_project, tmp_path, conf, replace_passthrough=True)
    # the user installs the merged config and edits one setting rigsmith owns
    conf.write_text(out.read_text().replace("lxc.prlimit.memlock: unlimited", "lxc.prlimit.memlock: 65536"))
    spec = seed_project.spec_path(SEEDS[1])
    spec.write_text(spec.read_text().replace("\nresources:\n", "\nresources:\n  shm_size: 16g\n", 1))
    out, _ = _merge_users(seed_project, tmp_path, conf)
    d = conf_pairs(out.read_text())
    assert ("lxc.prlimit.memlock", "65536") in d  # the user's edit kept
    assert any(k == "lxc.mount.entry" and "size=16777216k" in v for k, v in d)  # rigsmith's change taken
    # both change the shm entry: named, nothing written, until a side is chosen
    conf.write_text(out.read_text().replace("size=16777216k", "size=4194304k"))
    spec.write_text(spec.read_text().replace("shm_size: 16g", "shm_size: 12g"))
    before = out.read_text()
    with pytest.raises(ConsentError) as err:
        _merge_users(seed_project, tmp_path, conf)
    assert "lxc.mount.entry dev/shm" in str(err.value) and "--theirs" in str(err.value)
    assert out.read_text() == before
    out, _ = _merge_users(seed_project, tmp_path, conf, resolve="theirs")
    assert "size=12582912k" in out.read_text()


def test_a_ct_below_the_deployments_needs_is_warned_about_not_changed(
    seed_project: Project, tmp_path: Path
) -> None:
    conf = tmp_path / "100.conf"
    conf.write_text(USER_CONF)
    out, messages = _merge_users(seed_project, tmp_path, conf, seed=SEEDS[0])
    d = dict(conf_pairs(out.read_text()))
    assert d["cores"] == "16" and d["memory"] == "4096" and d["hostname"] == "gpu-box"
    assert any("memory: 4096" in m and "pct set 100 --memory" in m for m in messages)
    assert d["mp0"] == "/tank/datasets,mp=/data"
    assert d["mp1"].startswith("/srv/models/Qwen3.8-Flash-Next-INT4-Mixed-AutoRound,mp=")  # next free index
    assert "lxc.mount.entry: /dev/dri dev/dri none bind,optional,create=dir" in out.read_text()
    assert conf.read_text() == USER_CONF


def test_every_line_pve_reads_is_checked_against_pct_conf(
    seed_project: Project, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf = tmp_path / "100.conf"
    conf.write_text(USER_CONF.replace("\n[snap1]", "cmode: telnet\nbogus: 1\n\n[snap1]"))
    out, messages = _merge_users(seed_project, tmp_path, conf, seed=SEEDS[0])
    assert "cmode: telnet\nbogus: 1\n" in out.read_text()  # the user's lines are theirs: kept as written
    assert any("'cmode: telnet'" in m and "does not match pct.conf(5)" in m for m in messages)
    assert any("'bogus: 1'" in m and "not a pct.conf key" in m for m in messages)
    # a line of rigsmith's own that PVE would refuse stops the render, naming it
    real = lxc.lines
    monkeypatch.setattr(lxc, "lines", lambda plan, ctx: [*real(plan, ctx), lxc.Line("cores", "0")])
    with pytest.raises(RigsmithError, match=r"PVE 8\.2 would refuse: cores: '0' does not match"):
        render_seed(seed_project, "lxc", SEEDS[0], tmp_path / "again")


def test_merge_engine_runs_out_of_indexes_with_a_message() -> None:
    from rigsmith.rendering.targets import pctconf

    full = "".join(f"dev{i}: /dev/x{i}\n" for i in range(256))
    with pytest.raises(RigsmithError, match="uses every devN index"):
        pctconf.merge_conf(full, [("dev", "/dev/nvidia0")], None)


def test_what_lxc_cannot_express_is_refused_naming_target_and_field(
    seed_project: Project, tmp_path: Path
) -> None:
    data = standin_deployment(
        tmp_path, name="refuse-lxc", env=[{"name": "X", "value": "two\nlines"}], placeholders={}
    )
    project = write_project(tmp_path, data)
    with pytest.raises(SpecError) as err:
        deploy.artifacts(project, "lxc", deployment="refuse-lxc", out=tmp_path / "out")
    msg = str(err.value)
    assert "resources.gpus.cdi_devices" in msg and "example.com/gpu" in msg and "lxc target" in msg
    assert "env.X" in msg
    with pytest.raises(SpecError) as err:
        deploy.artifacts(
            seed_project, "lxc", deployment=SEEDS[0], out=tmp_path / "out", lxc=LxcOptions(pve_version="7.4")
        )
    assert "--uvm-major" in str(err.value) and "grep nvidia-uvm /proc/devices" in str(err.value)


# -- provision.sh -------------------------------------------------------------------------------------


def _provision(seed_project: Project, tmp_path: Path) -> Path:
    deploy.deploy(seed_project, "lxc", deployment=SEEDS[0], out=tmp_path / "out", echo=lambda _m: None)
    return tmp_path / "out" / "lxc" / SEEDS[0] / "provision.sh"


def test_provision_script_passes_shellcheck(seed_project: Project, tmp_path: Path) -> None:
    script = _provision(seed_project, tmp_path)
    proc = subprocess.run(
        [require("shellcheck"), "-S", "warning", str(script)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stdout


def _run(script: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(script)], env=env, capture_output=True, text=True, timeout=60, check=False
    )


def test_provision_refuses_without_nvidia_uvm_and_on_driver_mismatch(
    seed_project: Project, tmp_path: Path
) -> None:
    script = _provision(seed_project, tmp_path)
    proc = _run(script, fake_ct(tmp_path / "a", uvm=False))
    assert proc.returncode == 1 and "/dev/nvidia-uvm is missing inside the CT" in proc.stderr
    assert "nvidia-modprobe -u -c0" in proc.stderr
    proc = _run(script, fake_ct(tmp_path / "b", user="550.90.07"))
    assert proc.returncode == 1
    assert "driver mismatch: host kernel module 550.54.14, CT userspace 550.90.07" in proc.stderr


def test_provision_makes_cdi_and_runs_the_podman_targets_exact_argv(tmp_path: Path) -> None:
    data = standin_deployment(tmp_path, name="standin-lxc")
    data["resources"]["gpus"]["cdi_devices"] = [f"nvidia.com/gpu={i}" for i in range(4)]  # type: ignore[index]
    prepare_host_dirs(data)
    project = write_project(tmp_path, data)
    deploy.deploy(project, "lxc", deployment="standin-lxc", out=tmp_path / "out", echo=lambda _m: None)
    env = fake_ct(tmp_path)
    proc = _run(tmp_path / "out/lxc/standin-lxc/provision.sh", env)
    assert proc.returncode == 0, proc.stderr
    if not (Path("/etc/cdi/nvidia.yaml").exists() or Path("/var/run/cdi/nvidia.yaml").exists()):
        assert (
            "nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml" in Path(env["RIGSMITH_CALLS"]).read_text()
        )
    argv = Path(env["RIGSMITH_CALLS"] + ".podman").read_text().split("\0")[:-1]
    plan, _ = deploy.artifacts(project, "lxc", deployment="standin-lxc", out=tmp_path / "out")
    opts = plan.podman_options()
    assert argv[:2] == ["run", "--detach"] and argv[2 : 2 + len(opts)] == opts
    image_at = argv.index(plan.image)
    assert argv[image_at + 1 :] == list(plan.command)
    mounts = [argv[i + 1] for i, a in enumerate(argv[:image_at]) if a == "-v"]
    assert mounts == [f"{m.host}:{m.container}{':ro' if m.readonly else ''}" for m in plan.mounts]


def test_provision_never_runs_the_health_path(tmp_path: Path) -> None:
    pwned = tmp_path / "pwned"
    health = f"/health$(touch {pwned}-1)`touch {pwned}-2`;touch {pwned}-3 \"'"
    data = standin_deployment(tmp_path, name="standin-lxc", readiness={"health_path": health})
    data["resources"]["gpus"]["cdi_devices"] = [f"nvidia.com/gpu={i}" for i in range(4)]  # type: ignore[index]
    prepare_host_dirs(data)
    project = write_project(tmp_path, data)
    deploy.deploy(project, "lxc", deployment="standin-lxc", out=tmp_path / "out", echo=lambda _m: None)
    proc = _run(tmp_path / "out/lxc/standin-lxc/provision.sh", fake_ct(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert not list(tmp_path.glob("pwned*"))
    assert f"ready when http://127.0.0.1:8000{health} answers" in proc.stdout


@pytest.mark.parametrize(
    ("changes", "field", "why"),
    [
        ({"mounts": [{"host": "/srv/a=b", "container": "/data"}]}, "mounts[0].host", "',', '='"),
        (
            {"mounts": [{"host": "/srv/a\\040b", "container": "/w", "kind": "file"}]},
            "mounts[0].host",
            "no whitespace or backslash",
        ),
        ({"env": [{"name": "X", "value": "one\rtwo"}]}, "env.X", "control character"),
    ],
    ids=["equals-in-mp", "backslash-in-mount-entry", "carriage-return-in-env"],
)
def test_paths_pve_or_liblxc_would_reinterpret_are_refused(
    tmp_path: Path, changes: dict[str, object], field: str, why: str
) -> None:
    data = standin_deployment(tmp_path, name="reinterp-lxc", placeholders={}, **changes)
    data["resources"]["gpus"]["cdi_devices"] = ["nvidia.com/gpu=0"]  # type: ignore[index]
    project = write_project(tmp_path, data)
    with pytest.raises(SpecError) as err:
        deploy.artifacts(project, "lxc", deployment="reinterp-lxc", out=tmp_path / "out")
    msg = str(err.value)
    assert f"{field}: " in msg and "lxc target cannot express" in msg and why in msg, msg


# -- venv engine (engine.runtime: venv) ---------------------------------------------------------------


def _venv_ct(tmp_path: Path, *, vllm: bool = True) -> dict[str, str]:
    """A CT for a venv engine: the fake CT plus a temp root holding the venv, and a systemctl that records."""
    env = fake_ct(tmp_path)
    root = tmp_path / "ct/root"
    exe = root / CT_VENV.lstrip("/") / "bin/vllm"
    exe.parent.mkdir(parents=True)
    if vllm:
        exe.write_text("#!/bin/sh\nexit 0\n")
        exe.chmod(0o755)
    systemctl = tmp_path / "ct/bin/systemctl"
    systemctl.write_text('#!/bin/sh\nprintf "%s\\n" "$*" >> "$RIGSMITH_CALLS.systemctl"\n')
    systemctl.chmod(0o755)
    return {**env, "RIGSMITH_ROOT": str(root), "HF_TOKEN": "hf_it's_secret"}


def _venv_project(tmp_path: Path, name: str) -> Project:
    data = standin_deployment(
        tmp_path,
        name=name,
        engine={"runtime": "venv", "venv": CT_VENV, "image": None},
        env=[
            {"name": "PLAIN", "value": "a b"},
            {"name": "PCT", "value": "50%$HOME"},
            {"name": "HF_TOKEN", "value": "", "secret": True},
        ],
    )
    data["resources"]["gpus"]["cdi_devices"] = [f"nvidia.com/gpu={i}" for i in range(4)]  # type: ignore[index]
    prepare_host_dirs(data)
    return write_project(tmp_path, data)


def _unit(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            out.setdefault(key, []).append(value)
    return out


def test_venv_provision_installs_a_service_running_the_exact_recipe_argv(tmp_path: Path) -> None:
    from tests.support.facts import split_systemd

    project = _venv_project(tmp_path, "standin-venv")
    said: list[str] = []
    deploy.deploy(project, "lxc", deployment="standin-venv", out=tmp_path / "out", echo=said.append)
    assert not [m for m in said if "not pinned" in m or "check-container" in m], said
    assert "then inside the CT: systemctl status standin-venv.service" in said[-1]
    env = _venv_ct(tmp_path)
    env.pop("HF_TOKEN")
    proc = _run(tmp_path / "out/lxc/standin-venv/provision.sh", env)
    assert proc.returncode == 1 and "HF_TOKEN is not set" in proc.stderr
    env["HF_TOKEN"] = "hf_secret_value"
    proc = _run(tmp_path / "out/lxc/standin-venv/provision.sh", env)
    assert proc.returncode == 0, proc.stderr
    assert "ready when http://127.0.0.1:8000/health answers" in proc.stdout
    units = Path(env["RIGSMITH_ROOT"]) / "etc/systemd/system"
    assert [p.name for p in units.iterdir()] == ["standin-venv.service"]  # the temp file was renamed
    text = (units / "standin-venv.service").read_text()
    assert "hf_secret_value" not in text
    unit = _unit(text)
    plan, _ = deploy.artifacts(project, "lxc", deployment="standin-venv", out=tmp_path / "out")
    t = timings(plan)
    assert plan.runtime == "venv" and plan.image == ""
    (exec_start,) = unit["ExecStart"]
    assert split_systemd(exec_start) == [f"{CT_VENV}/bin/vllm", *plan.command]
    assert plan.command[plan.model_word or 0] == plan.mounts[0].host  # the model at its CT (= host) path
    assert [split_systemd(e) for e in unit["Environment"]] == [[f"{k}={v}"] for k, v in plan.env]
    assert ("PCT", "50%$HOME") in plan.env and ("PLAIN", "a b") in plan.env
    assert unit["EnvironmentFile"] == ["/etc/rigsmith/standin-venv.env"]
    assert unit["LimitMEMLOCK"] == ["infinity"]
    assert unit["KillSignal"] == ["SIGTERM"] and unit["Restart"] == ["on-failure"]
    assert (plan.shutdown_timeout or 0) < int(unit["TimeoutStopSec"][0]) == t.systemd_stop < t.pve_down
    secret = Path(env["RIGSMITH_ROOT"]) / "etc/rigsmith/standin-venv.env"
    assert secret.read_text() == "HF_TOKEN='hf_secret_value'\n"
    assert secret.stat().st_mode & 0o777 == 0o600
    calls = Path(env["RIGSMITH_CALLS"] + ".systemctl").read_text().splitlines()
    assert calls == ["daemon-reload", "enable --now standin-venv.service"]
    assert not Path(env["RIGSMITH_CALLS"] + ".podman").exists()


def test_venv_provision_refuses_a_missing_venv_and_writes_nothing(tmp_path: Path) -> None:
    project = _venv_project(tmp_path, "standin-novenv")
    deploy.deploy(project, "lxc", deployment="standin-novenv", out=tmp_path / "out", echo=lambda _m: None)
    env = _venv_ct(tmp_path, vllm=False)
    proc = _run(tmp_path / "out/lxc/standin-novenv/provision.sh", env)
    assert proc.returncode == 1
    assert f"{CT_VENV}/bin/vllm does not exist in the CT" in proc.stderr
    assert f"hint: create the venv in the CT: python3 -m venv {CT_VENV}" in proc.stderr
    assert not (Path(env["RIGSMITH_ROOT"]) / "etc").exists()
    assert not Path(env["RIGSMITH_CALLS"] + ".systemctl").exists()
    proc = _run(
        tmp_path / "out/lxc/standin-novenv/provision.sh", {**_venv_ct(tmp_path / "q"), "HF_TOKEN": "a'b"}
    )
    assert proc.returncode == 1 and "HF_TOKEN holds a single quote" in proc.stderr


def test_venv_provision_script_passes_shellcheck(seed_project: Project, tmp_path: Path) -> None:
    as_venv(seed_project, SEEDS[1])
    deploy.deploy(seed_project, "lxc", deployment=SEEDS[1], out=tmp_path / "out", echo=lambda _m: None)
    script = tmp_path / "out" / "lxc" / SEEDS[1] / "provision.sh"
    proc = subprocess.run(
        [require("shellcheck"), "-S", "warning", str(script)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stdout


def test_venv_pct_conf_carries_the_same_ct_facts_as_the_container_one(
    seed_project: Project, tmp_path: Path
) -> None:
    container = conf_pairs(_conf(seed_project, SEEDS[1], tmp_path / "c", LxcOptions()))
    venv = conf_pairs(_conf(as_venv(seed_project, SEEDS[1]), SEEDS[1], tmp_path / "v", LxcOptions()))
    assert venv == container  # GPU nodes, mounts, shm, memlock, env, startup down= alike
    assert pvekeys.check(venv, (8, 2)) == []


@pytest.mark.parametrize(
    ("engine", "field", "says"),
    [
        ({"runtime": "venv", "image": None}, "engine.venv", "no venv is set"),
        ({"runtime": "venv", "venv": "venv-v2.5", "image": None}, "engine.venv", "must be an absolute path"),
        ({"runtime": "venv", "venv": CT_VENV}, "engine.image", "runtime is venv, which runs no image"),
    ],
    ids=["no-venv", "relative-venv", "venv-and-image"],
)
def test_venv_plan_refuses_a_missing_or_relative_venv_and_an_image(
    tmp_path: Path, engine: dict[str, object], field: str, says: str
) -> None:
    project = write_project(tmp_path, standin_deployment(tmp_path, name="bad-venv", engine=engine))
    with pytest.raises(SpecError) as err:
        deploy.artifacts(project, "lxc", deployment="bad-venv", out=tmp_path / "out")
    assert [p for p in err.value.problems if p[0] == field and says in p[1]], err.value.problems


@pytest.mark.parametrize("target", ["podman", "quadlet", "compose", "kube"])
def test_container_targets_refuse_a_venv_plan_naming_target_and_runtime(
    seed_project: Project, tmp_path: Path, target: str
) -> None:
    as_venv(seed_project, SEEDS[1])
    with pytest.raises(SpecError) as err:
        deploy.artifacts(seed_project, target, deployment=SEEDS[1], out=tmp_path / "out")
    ((fld, msg),) = err.value.problems
    assert fld == "engine.runtime"
    assert f"the {target} target cannot express this" in msg
    assert "engine.image" in msg and "--target lxc" in msg


def _many_gpus(tmp_path: Path, count: int) -> Project:
    data = standin_deployment(tmp_path, name="many-gpus", placeholders={})
    data["resources"]["gpus"] = {"count": count, "cdi_devices": ["nvidia.com/gpu=all"]}  # type: ignore[index]
    data["resources"]["host_ram_gib"] = 64  # type: ignore[index]
    return write_project(tmp_path, data)


def test_a_gpu_count_beyond_any_host_is_refused_before_devn_lines_are_made(tmp_path: Path) -> None:
    """253 GPUs would need dev0..dev256 (issue 10 #11: StopIteration before): the spec caps the count first,
    naming the field; 64 GPUs render (and a full devN table is covered by the index test below)."""
    with pytest.raises(SpecError) as err:
        deploy.artifacts(_many_gpus(tmp_path, 253), "lxc", deployment="many-gpus", out=tmp_path / "out")
    assert "resources.gpus.count" in str(err.value), str(err.value)
    _plan, files = deploy.artifacts(
        _many_gpus(tmp_path / "fit", 64), "lxc", deployment="many-gpus", out=tmp_path / "out"
    )
    assert "dev63: /dev/nvidia63" in files[0].content


def test_a_pct_conf_with_no_free_dev_index_is_one_error(tmp_path: Path) -> None:
    user = "\n".join(f"dev{i}: /dev/user{i}" for i in range(256)) + "\n"
    with pytest.raises(RigsmithError) as err:
        lxc.merge(user, [lxc.Line("dev", "/dev/nvidia0")], [])
    assert "no free devN index" in str(err.value) and err.value.hint, str(err.value)
