"""doctor: parsers on captured outputs of real rigs, the go/no-go verdicts, and doctor on this machine."""

from __future__ import annotations

import dataclasses
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rigsmith.operating import probes
from rigsmith.operating.doctor import doctor
from rigsmith.operating.host import LocalHost, gather
from rigsmith.project import Project
from rigsmith.spec import Deployment, loads
from tests.support.common import GOLDEN, REPO, compare_tree, standin_deployment
from tests.support.podman import Podman
from tests.support.replay import DATA, ReplayHost

SEED000 = "flash-next-int4-3x3090"
SEED003 = "flash-next-merlin-4x3090"


def seed(name: str) -> Deployment:
    return Project(REPO).load(name)


def verdicts(checks: list[doctor.Check]) -> dict[str, str]:
    return {c.name: c.verdict for c in checks}


def facts(case: str, spec: Deployment) -> probes.HostFacts:
    return gather(ReplayHost(case), model_dir=spec.model.local_dir)


# -- parsers ------------------------------------------------------------------------------------------


def test_gpu_list_and_query_parse_the_3090_rig() -> None:
    d = DATA / "3x3090-squatter" / "cmd"
    listed = probes.parse_gpu_list((d / "gpu_list.txt").read_text())
    assert [(i, n) for i, n, _ in listed] == [(i, "NVIDIA GeForce RTX 3090") for i in range(3)]
    gpus = probes.parse_gpus((d / "gpus.txt").read_text())
    assert [g.index for g in gpus] == [0, 1, 2]
    assert [g.uuid for g in gpus] == [u for _, _, u in listed]
    assert gpus[0].memory_total_mib == 24576 and gpus[0].memory_used_mib == 262
    assert {g.driver_version for g in gpus} == {"570.133.07"}
    assert gpus[2].bus_id == "00000000:4A:00.0"


def test_compute_apps_parse_names_with_commas() -> None:
    apps = probes.parse_apps((DATA / "3x3090-squatter/cmd/apps.txt").read_text())
    assert apps == [
        probes.GpuApp(48213, "/opt/ComfyUI/venv/bin/python", "GPU-1f0e6c7a-3b52-9d84-e1a7-5c2b90d4f613", 256)
    ]
    odd = probes.parse_apps("7, python, -c, x, GPU-abc, [N/A]\n")
    assert odd == [probes.GpuApp(7, "python, -c, x", "GPU-abc", None)]
    assert probes.parse_apps("") == []


def test_topology_matrix_parses_gpu_links_and_ignores_legend() -> None:
    topo = probes.parse_topo((DATA / "4x3090-idle/cmd/topo.txt").read_text())
    assert topo.gpus == ("GPU0", "GPU1", "GPU2", "GPU3")
    assert topo.links[("GPU0", "GPU1")] == "PIX" and topo.links[("GPU1", "GPU2")] == "NODE"
    assert topo.links[("GPU3", "GPU3")] == "X"
    three = probes.parse_topo((DATA / "3x3090-squatter/cmd/topo.txt").read_text())
    assert {lk for _, _, lk in three.pairs()} == {"PHB"}
    p2p = probes.parse_p2p((DATA / "3x3090-squatter/cmd/p2p.txt").read_text())
    assert p2p[("GPU0", "GPU2")] == "CNS" and ("GPU0", "GPU0") not in p2p


def test_driver_version_parses_proprietary_and_open_module() -> None:
    assert (
        probes.parse_driver_version((DATA / "3x3090-squatter/files/proc/driver/nvidia/version").read_text())
        == "570.133.07"
    )
    assert (
        probes.parse_driver_version((DATA / "4x3090-idle/files/proc/driver/nvidia/version").read_text())
        == "575.64.05"
    )
    assert probes.parse_driver_version("garbage") is None


def test_cdi_specs_parse_kind_version_devices_and_driver() -> None:
    y = probes.parse_cdi("nvidia.yaml", (DATA / "3x3090-squatter/files/etc/cdi/nvidia.yaml").read_text())
    assert (y.kind, y.cdi_version, y.driver_version) == ("nvidia.com/gpu", "0.6.0", "570.133.07")
    assert y.error is None
    assert "nvidia.com/gpu=all" in y.qualified() and "nvidia.com/gpu=2" in y.qualified()
    j = probes.parse_cdi("nvidia.json", (DATA / "4x3090-idle/files/var/run/cdi/nvidia.json").read_text())
    assert (j.cdi_version, j.driver_version, len(j.devices)) == ("0.8.0", "575.64.05", 5)
    assert probes.parse_cdi("x.yaml", "{{{").error is not None
    assert probes.parse_cdi("x.yaml", "devices: []").error == "missing cdiVersion or kind"


def test_cgroup_maps_process_to_podman_or_docker_container() -> None:
    cid = "9c1f4e2b7a8d3c6e5f0a1b2c3d4e5f60718293a4b5c6d7e8f9a0b1c2d3e4f5a6"
    assert probes.parse_cgroup((DATA / "3x3090-squatter/files/proc/48213/cgroup").read_text()) == cid
    assert probes.parse_cgroup(f"4:memory:/libpod_parent/libpod-{cid}\n") == cid
    assert probes.parse_cgroup(f"0::/system.slice/docker-{cid}.scope\n") == cid
    assert probes.parse_cgroup("0::/user.slice/user-1000.slice/session-3.scope\n") is None
    names = probes.parse_containers((DATA / "3x3090-squatter/cmd/containers.txt").read_text())
    assert names == {cid: "comfyui"}


def test_memlock_probe_output_unlimited_vs_fixed() -> None:
    assert probes.parse_memlock("unlimited\nraise-ok\n") == probes.Memlock(None, True)
    assert probes.parse_memlock((DATA / "no-driver/cmd/memlock.txt").read_text()) == probes.Memlock(
        8192 * 1024, False
    )


def test_meminfo_and_podman_version() -> None:
    mi = probes.parse_meminfo((DATA / "3x3090-squatter/files/proc/meminfo").read_text())
    assert mi["MemTotal"] == 131605828 * 1024 and mi["HugePages_Total"] == 0
    assert probes.parse_podman_version("podman version 4.3.1\n") == "4.3.1"
    assert probes.parse_podman_version("") is None


def test_no_driver_is_recognised_from_exit_and_message() -> None:
    with pytest.raises(probes.NoDriver, match="couldn't communicate"):
        probes.check_nvsmi(
            9, "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.", ""
        )
    with pytest.raises(probes.NoDriver, match="not installed"):
        probes.check_nvsmi(127, "", "")
    probes.check_nvsmi(0, "0, GPU-x, NVIDIA GeForce RTX 3090, 24576, 1, 570.133.07, 0:1:0.0", "")


# -- verdicts on captured rigs ------------------------------------------------------------------------


def test_seed000_rig_with_comfyui_squatter_is_no_go_naming_pid_and_container() -> None:
    spec = seed(SEED000)
    checks = doctor.evaluate(spec, facts("3x3090-squatter", spec))
    v = verdicts(checks)
    assert not doctor.go(checks)
    assert v["VRAM holders"] == "no-go"
    holder = next(c for c in checks if c.name == "VRAM holders")
    assert "GPU0: PID 48213 /opt/ComfyUI/venv/bin/python 256 MiB (container comfyui)" in holder.detail
    assert holder.hint and "kill PID" in holder.hint
    assert v["GPUs"] == "go" and v["CDI devices"] == "go" and v["memlock"] == "go"
    p2p = next(c for c in checks if c.name == "PCIe P2P")
    assert p2p.verdict == "warn" and "CNS" in p2p.detail and "NCCL_P2P_DISABLE=1" in (p2p.hint or "")
    # the spec was written for podman 4.9.3, which the rig runs
    assert v["podman"] == "go"
    assert [c.name for c in checks if c.verdict == "no-go"] == ["VRAM holders"]


def test_seed003_on_idle_4x3090_is_go() -> None:
    spec = seed(SEED003)
    checks = doctor.evaluate(spec, facts("4x3090-idle", spec))
    assert doctor.go(checks), doctor.render(checks, "x")
    v = verdicts(checks)
    assert v["memlock"] == "go"  # the "unlimited" capture
    assert v["PCIe P2P"] == "go" and v["disk"] == "go"
    disk = next(c for c in checks if c.name == "disk")
    assert "115.0 GiB present" in disk.detail


def test_no_driver_host_is_no_go_for_gpus_cdi_memlock_ram_and_disk() -> None:
    spec = seed(SEED003)
    checks = doctor.evaluate(spec, facts("no-driver", spec))
    v = verdicts(checks)
    assert v["GPUs"] == "no-go" and "no driver" in next(c for c in checks if c.name == "GPUs").detail
    assert v["CDI devices"] == "no-go"
    cdi = next(c for c in checks if c.name == "CDI devices")
    assert "no CDI spec provides nvidia.com/gpu=0" in cdi.detail
    assert "nvidia-ctk cdi generate" in (cdi.hint or "")
    assert v["memlock"] == "no-go" and v["host RAM"] == "no-go" and v["disk"] == "no-go"
    assert all(c.hint for c in checks if c.verdict == "no-go"), "every failure needs a hint"


def test_a_local_checkpoint_is_checked_for_presence_not_free_space() -> None:
    spec = seed(SEED003)
    local = spec.model_copy(update={"model": spec.model.model_copy(update={"repo": None})})
    f = facts("4x3090-idle", local)
    disk = next(c for c in doctor.evaluate(local, f) if c.name == "disk")
    assert (disk.verdict, disk.detail) == (
        "go",
        f"local checkpoint: 115.0 GiB present at {local.model.local_dir}",
    )
    assert f.disk is not None
    f.disk = dataclasses.replace(f.disk, present_bytes=0, free_bytes=10**15)
    disk = next(c for c in doctor.evaluate(local, f) if c.name == "disk")
    assert disk.verdict == "no-go"
    assert disk.detail == f"local checkpoint (model.repo is null): nothing at {local.model.local_dir}"
    assert "fetch-model downloads nothing" in (disk.hint or "")


def test_stale_cdi_spec_after_driver_update_is_no_go() -> None:
    spec = seed(SEED000)
    f = facts("3x3090-squatter", spec)
    f.driver_version = "570.153.02"  # driver updated, spec not regenerated (anchors pain point 2)
    cdi = next(c for c in doctor.evaluate(spec, f) if c.name == "CDI devices")
    assert cdi.verdict == "no-go" and "generated for driver 570.133.07" in cdi.detail
    assert "after every driver update" in (cdi.hint or "")


def test_cdi_version_newer_than_podman_reads_is_no_go() -> None:
    spec = seed(SEED003)
    f = facts("4x3090-idle", spec)
    f.podman_version = "4.9.3"  # reads CDI ≤ 0.6.0; the spec is 0.8.0 and would be skipped silently
    checks = doctor.evaluate(spec, f)
    cdi = next(c for c in checks if c.name == "CDI devices")
    assert cdi.verdict == "no-go" and "reads ≤ 0.6.0 and skips it silently" in cdi.detail
    assert doctor.max_cdi_version("4.3.1") == "0.5.0" and doctor.max_cdi_version("4.0.0") is None
    quad = next(
        c
        for c in doctor.evaluate(spec, dataclasses.replace(f, podman_version="4.3.1"), "quadlet")
        if c.name == "podman"
    )
    assert quad.verdict == "no-go" and "quadlet needs ≥ 4.4.0" in quad.detail


def test_same_device_in_two_specs_of_one_directory_is_no_go() -> None:
    spec = seed(SEED000)
    f = facts("3x3090-squatter", spec)
    copy = dataclasses.replace(f.cdi[0], path="/etc/cdi/nvidia-old.yaml")
    f.cdi.append(copy)
    cdi = next(c for c in doctor.evaluate(spec, f) if c.name == "CDI devices")
    assert cdi.verdict == "no-go" and "defined twice" in cdi.detail and "podman refuses both" in cdi.detail
    f.cdi[-1] = dataclasses.replace(copy, path="/var/run/cdi/nvidia.yaml")  # other dir: later one wins
    assert next(c for c in doctor.evaluate(spec, f) if c.name == "CDI devices").verdict == "go"


def test_cdi_edits_list_nodes_and_env_per_device_with_common_edits() -> None:
    y = probes.parse_cdi(
        "/etc/cdi/nvidia.yaml", (DATA / "3x3090-squatter/files/etc/cdi/nvidia.yaml").read_text()
    )
    nodes, env = y.edits["1"]
    assert nodes[0] == "/dev/nvidia1" and "/dev/nvidiactl" in nodes
    assert env == ("NVIDIA_VISIBLE_DEVICES=void",)
    assert y.directory == "/etc/cdi"


@pytest.mark.parametrize("held", [True, False])
def test_doctor_cli_on_seed_000_names_the_256_mib_squatter(tmp_path: Path, held: bool) -> None:
    """`invoke doctor` on seed 000's shipped spec (generated from the record), with an nvidia-smi stand-in
    on PATH printing the 3×3090 rig's captures (ComfyUI holding 256 MiB on GPU0, seed 000 pitfall 3): the
    VRAM-holders row is no-go and names the process; the same rig with the GPUs free is go there. Every
    `invoke …` it prints parses against the real tasks."""
    from tests.support.common import invoke_cli
    from tests.support.replay import stand_in
    from tests.test_hints import commands_in, problem

    root = tmp_path / "rig"
    (root / "deployments").mkdir(parents=True)
    shutil.copy(REPO / "deployments" / f"{SEED000}.yaml", root / "deployments")
    if held:
        path = stand_in(tmp_path, "3x3090-squatter")
    else:
        path = stand_in(tmp_path, cards=[("NVIDIA GeForce RTX 3090", 24576)] * 3)
    env = {"PATH": path, "COLUMNS": "300", "HOME": str(tmp_path / "home")}
    r = invoke_cli(root, "doctor", "--deployment", SEED000, env=env)
    said = r.stdout + r.stderr
    assert r.returncode == 1 and "Traceback" not in said, said  # this machine: no CDI, little RAM
    [row] = [ln for ln in r.stdout.splitlines() if ln.startswith("│ VRAM holders")]
    cells = [c.strip() for c in row.split("│")]
    if held:
        assert cells[2] == "no-go" and cells[3] == "GPU0: PID 48213 /opt/ComfyUI/venv/bin/python 256 MiB"
        assert "VRAM holders" in r.stderr.splitlines()[-1]  # the verdict names it
    else:
        assert cells[2] == "go"
    for hint in commands_in(said):
        assert problem(hint, root) is None, hint


def test_doctor_tables_match_golden(update_golden: bool) -> None:
    out = {}
    for case, name in (("3x3090-squatter", SEED000), ("4x3090-idle", SEED003), ("no-driver", SEED003)):
        spec = seed(name)
        checks = doctor.evaluate(spec, facts(case, spec))
        out[f"{case}.txt"] = doctor.render(checks, f"doctor: {name} on {case}")
    compare_tree(out, GOLDEN / "ops" / "doctor", update_golden)


# -- this machine -------------------------------------------------------------------------------------


def _this_machine(podman: Podman) -> tuple[int | None, bool, str, bool]:
    """What this machine says, asked without rigsmith: the RLIMIT_MEMLOCK hard limit (None: unlimited),
    whether a child may raise it to unlimited, ``podman --version``'s output, whether nvidia-smi exists."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    inf = "resource.RLIM_INFINITY"
    code = f"import resource; resource.setrlimit(resource.RLIMIT_MEMLOCK, ({inf}, {inf}))"
    raise_ok = subprocess.run([sys.executable, "-c", code], capture_output=True, check=False).returncode == 0
    version = subprocess.run(
        ["podman", "--version"], env=podman.env, capture_output=True, text=True, check=True
    ).stdout
    gpu_tool = shutil.which("nvidia-smi", path=podman.env.get("PATH")) is not None
    return (None if hard == resource.RLIM_INFINITY else hard), raise_ok, version, gpu_tool


def test_doctor_on_this_machine_tells_the_truth(tmp_path: Path, podman: Podman, fake_cdi: Path) -> None:
    """doctor's facts and verdicts agree with what this machine says when asked directly (on the
    development machines: no GPU driver and a fixed 8 MiB memlock hard limit, both no-go)."""
    spec = loads(__import__("json").dumps(standin_deployment(tmp_path, name="standin-doctor")))
    f = gather(LocalHost(podman.env), model_dir=spec.model.local_dir)
    checks = doctor.evaluate(spec, f)
    v = verdicts(checks)
    hard, raise_ok, version, gpu_tool = _this_machine(podman)
    assert f.memlock is not None and (f.memlock.hard_bytes, f.memlock.raisable) == (hard, raise_ok)
    assert spec.resources.memlock == "unlimited"
    assert v["memlock"] == ("go" if hard is None or raise_ok else "no-go"), doctor.render(checks, "here")
    assert f.podman_version is not None and f"version {f.podman_version}" in version, version
    assert v["podman"] in ("go", "warn")
    if not gpu_tool:
        assert f.gpu_error and v["GPUs"] == "no-go" and not doctor.go(checks)
    assert v["CDI devices"] == "go", doctor.render(checks, "here")
    assert v["shm"] == "go" and f.shm_bytes and f.shm_bytes > 0
    # setup.sh installs catatonit, runc and conmon by name; the test containers.conf sets runtime = "runc"
    assert f.podman_info is not None and f.podman_info.runtime == "runc", f.podman_info
    assert v["init binary"] == v["OCI runtime"] == v["conmon"] == "go", doctor.render(checks, "here")


@given(
    pid=st.integers(min_value=1, max_value=4_194_304),
    name=st.text(st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp")), min_size=1, max_size=60)
    .map(str.strip)
    .filter(bool),
    used=st.one_of(st.none(), st.integers(min_value=0, max_value=49_152)),
)
def test_compute_apps_round_trip_any_process_name(pid: int, name: str, used: int | None) -> None:
    line = f"{pid}, {name}, GPU-1f0e6c7a-3b52-9d84-e1a7-5c2b90d4f613, {'[N/A]' if used is None else used}\n"
    assert probes.parse_apps(line) == [
        probes.GpuApp(pid, name, "GPU-1f0e6c7a-3b52-9d84-e1a7-5c2b90d4f613", used)
    ]


def test_nvlink_bridge_counts_as_p2p_without_a_p2p_matrix() -> None:
    """2x RTX 3090 with an NVLink bridge: `topo -m` says NV4; no `-p2p r` capture needed."""
    topo = probes.parse_topo(
        "\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
        "GPU0\t X \tNV4\t0-15\t0\t\tN/A\nGPU1\tNV4\t X \t0-15\t0\t\tN/A\n"
    )
    spec = seed(SEED003).model_copy(
        update={
            "resources": seed(SEED003).resources.model_copy(
                update={
                    "gpus": seed(SEED003).resources.gpus.model_copy(
                        update={"cdi_devices": ("nvidia.com/gpu=0", "nvidia.com/gpu=1"), "count": 2}
                    )
                }
            )
        }
    )
    f = facts("4x3090-idle", spec)
    f.topo, f.p2p = topo, {}
    p2p = next(c for c in doctor.evaluate(spec, f) if c.name == "PCIe P2P")
    assert p2p.verdict == "go" and "links NV4" in p2p.detail


# -- terminal escapes (issue 11: nvidia-smi 580 underlines topo headers even into a pipe) ---------------


def two_gpu(spec: Deployment) -> Deployment:
    gpus = spec.resources.gpus.model_copy(
        update={"cdi_devices": ("nvidia.com/gpu=0", "nvidia.com/gpu=1"), "count": 2, "model": None}
    )
    return spec.model_copy(update={"resources": spec.resources.model_copy(update={"gpus": gpus})})


def test_underlined_topo_and_p2p_headers_still_name_every_gpu() -> None:
    spec = two_gpu(seed(SEED003))
    f = facts("2xh200-nvlink-ansi", spec)
    assert f.topo is not None and f.topo.gpus == ("GPU0", "GPU1")
    assert f.topo.links[("GPU0", "GPU1")] == "NV18" and f.topo.links[("GPU1", "GPU1")] == "X"
    assert f.p2p == {("GPU0", "GPU1"): "OK", ("GPU1", "GPU0"): "OK"}
    p2p = next(c for c in doctor.evaluate(spec, f) if c.name == "PCIe P2P")
    assert (p2p.verdict, p2p.detail) == ("go", "P2P between all 2 GPUs (links NV18)")


class _OneOutput:
    """A host whose every command prints ``text`` (the other probes find nothing)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def run(self, argv: object) -> probes.CmdResult:
        return probes.CmdResult(0, self.text)


@pytest.mark.parametrize(
    "header",
    [
        "\x1b[4m\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m",
        "\t\x1b[4mGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m",
        "\t\x1b[4mGPU0\x1b[0m\t\x1b[4mGPU1\x1b[0m\t\x1b[1;4mCPU Affinity\x1b[m",
    ],
)
def test_every_probe_output_loses_its_escapes_before_parsing(header: str) -> None:
    from rigsmith.operating.host import probe

    text = header + "\nGPU0\t X \tNV18\t0-63\t0\t\tN/A\nGPU1\tNV18\t X \t0-63\t0\t\tN/A\n"
    res = probe(_OneOutput(text), probes.COMMANDS["topo"])  # type: ignore[arg-type]
    assert "\x1b" not in res.stdout
    assert probes.parse_topo(res.stdout).pairs() == [("GPU0", "GPU1", "NV18")]


# -- what the rendered artifacts need from podman (issue 11: catatonit was only a Recommends) -----------


def check(checks: list[doctor.Check], name: str) -> doctor.Check:
    return next(c for c in checks if c.name == name)


def test_host_without_catatonit_is_no_go_naming_the_init_binary_and_package() -> None:
    spec = seed(SEED003)
    f = facts("no-driver", spec)
    init = check(doctor.evaluate(spec, f), "init binary")
    assert init.verdict == "no-go"
    assert "/usr/libexec/podman/catatonit (podman's default init_path) is missing" in init.detail
    assert init.hint is not None and init.hint.startswith("apt-get install catatonit")
    for target in ("quadlet", "compose"):
        assert check(doctor.evaluate(spec, f, target), "init binary").verdict == "no-go"
    kube = check(doctor.evaluate(spec, f, "kube"), "init binary")
    assert kube.verdict == "no-go" and "pause binary" in kube.detail and "catatonit" in (kube.hint or "")
    # lxc runs no podman here: none of podman's rows
    names = [c.name for c in doctor.evaluate(spec, facts("no-driver", spec), "lxc")]
    assert "init binary" not in names and "OCI runtime" not in names


def test_configured_init_path_is_the_binary_checked() -> None:
    spec = seed(SEED000)
    f = facts("3x3090-squatter", spec)
    assert f.init_path == "/usr/bin/tini"  # /etc/containers/containers.conf wins over /usr/share
    assert check(doctor.evaluate(spec, f), "init binary").detail == (
        "--init runs /usr/bin/tini (containers.conf init_path)"
    )
    f.binaries["/usr/bin/tini"] = False
    init = check(doctor.evaluate(spec, f), "init binary")
    assert init.verdict == "no-go" and init.hint == "apt-get install tini (podman only Recommends it)"
    # kube play needs catatonit whatever init_path says; this rig has none
    assert check(doctor.evaluate(spec, f, "kube"), "init binary").verdict == "no-go"
    assert (
        check(
            doctor.evaluate(seed(SEED003), facts("4x3090-idle", seed(SEED003)), "kube"), "init binary"
        ).verdict
        == "go"
    )


def test_containers_conf_later_files_win_and_broken_ones_are_skipped() -> None:
    text = (
        '### /usr/share/containers/containers.conf\n[containers]\ninit_path = "/a"\n'
        "### /etc/containers/containers.conf\n[containers\nbroken\n"
        '### /etc/containers/containers.conf.d/x.conf\n[engine]\nruntime = "runc"\n'
    )
    assert probes.parse_containers_conf(text) == "/a"
    assert probes.parse_containers_conf("") is None


def test_missing_runtime_or_conmon_or_failing_podman_info_is_no_go() -> None:
    spec = seed(SEED003)
    f = facts("4x3090-idle", spec)
    checks = doctor.evaluate(spec, f)
    assert check(checks, "OCI runtime").detail == "crun at /usr/bin/crun"
    assert check(checks, "conmon").verdict == "go"
    f.binaries["/usr/bin/conmon"] = False
    conmon = check(doctor.evaluate(spec, f), "conmon")
    assert conmon.verdict == "no-go" and conmon.hint == "apt-get install conmon"
    f.podman_info = probes.parse_podman_info(
        125, "", 'Error: default OCI runtime "crun" not found: invalid argument\n'
    )
    rt = check(doctor.evaluate(spec, f), "OCI runtime")
    assert rt.verdict == "no-go" and 'default OCI runtime "crun" not found' in rt.detail


def test_quadlet_needs_the_generator_binary_not_only_the_version() -> None:
    spec = seed(SEED003)
    f = facts("4x3090-idle", spec)  # podman 5.4.2, generator captured in sizes
    assert check(doctor.evaluate(spec, f, "quadlet"), "podman").verdict == "go"
    f.binaries["/usr/libexec/podman/quadlet"] = False
    quad = check(doctor.evaluate(spec, f, "quadlet"), "podman")
    assert quad.verdict == "no-go" and "no quadlet generator (/usr/libexec/podman/quadlet" in quad.detail
    assert check(doctor.evaluate(spec, f, "podman"), "podman").verdict == "go"


def test_sparse_files_must_be_at_their_size() -> None:
    spec = seed(SEED000)
    f = facts("3x3090-squatter", spec)
    f.sparse = {"/srv/ple.bin": (4096, 4096)}
    assert check(doctor.evaluate(spec, f), "sparse files").verdict == "go"
    f.sparse = {"/srv/ple.bin": (4096, 10)}
    wrong = check(doctor.evaluate(spec, f), "sparse files")
    assert wrong.verdict == "no-go" and wrong.detail == "/srv/ple.bin is 10 bytes, wants 4096"
    f.sparse = {"/srv/ple.bin": (4096, None)}
    # Every target but kube creates it before the container starts (run.sh, ExecStartPre, files.sh, the hook).
    for target in ("podman", "quadlet", "compose", "lxc"):
        made = check(doctor.evaluate(spec, f, target), "sparse files")
        assert made.verdict == "go" and "creates each sparse" in made.detail, target
    kube = check(doctor.evaluate(spec, f, "kube"), "sparse files")
    assert kube.verdict == "no-go" and kube.hint == "truncate -s 4096 /srv/ple.bin"


def test_image_missing_from_local_storage_is_no_go_with_the_command_that_fixes_it() -> None:
    spec = seed(SEED003)
    f = facts("4x3090-idle", spec)
    f.image = probes.ImageFacts("reg.example/vllm@sha256:" + "a" * 64, True, False, error="image not known")
    img = check(doctor.evaluate(spec, f), "image")
    assert img.verdict == "no-go" and "is not in local storage (image not known)" in img.detail
    assert (
        img.hint
        == f"`podman pull reg.example/vllm@sha256:{'a' * 64}`, or `invoke build` when rigsmith builds it"
    )
    f.image = probes.ImageFacts("localhost/vllm-merlin:v2.5.1", False, True, "b" * 64)
    assert check(doctor.evaluate(spec, f), "image").detail == (
        f"localhost/vllm-merlin:v2.5.1 in local storage as {'b' * 64} (local-only name)"
    )
    f.image = probes.ImageFacts("docker.io/vllm/vllm-openai:v0.11.0", False, True, "c" * 64)
    assert check(doctor.evaluate(spec, f), "image").verdict == "warn"
