"""doctor's parsers and verdicts on outputs captured from a real NVIDIA host (scripts/capture-gpu-host.sh).

The written cases beside these come from documentation; these come from a lent H200 host and keep the bytes
nvidia-smi really prints, ANSI escapes included (tests/operating/data/h200-*/case.yaml says how they were
taken).
"""

from __future__ import annotations

from rigsmith.operating import probes
from rigsmith.operating.doctor import doctor
from rigsmith.operating.host import gather, probe
from rigsmith.project import Project
from rigsmith.spec import Deployment, from_data, to_data
from tests.support.common import REPO
from tests.support.replay import DATA, ReplayHost

H200_UUID = "GPU-94fc5287-2a99-b669-ad05-4a3b2fc821a9"


def _cmd(case: str, name: str) -> str:
    """What doctor's parsers get: the captured output through the one probe route (escapes stripped)."""
    host = ReplayHost(case)
    return probe(host, probes.COMMANDS[name]).stdout


def _raw(case: str, name: str) -> str:
    return (DATA / case / "cmd" / f"{name}.txt").read_text()


def test_real_topo_header_with_ansi_underline_parses_to_the_gpu_row() -> None:
    assert "\x1b[4m" in _raw("h200-1gpu-idle", "topo")  # the capture really carries the escape
    topo = probes.parse_topo(_cmd("h200-1gpu-idle", "topo"))
    assert topo.gpus == ("GPU0",)
    assert topo.links == {("GPU0", "GPU0"): "X"}
    assert probes.parse_p2p(_cmd("h200-1gpu-idle", "p2p")) == {}


def test_nvlink_pair_with_ansi_header_reads_nv18_and_p2p_ok() -> None:
    topo = probes.parse_topo(_cmd("2xh200-nvlink-ansi", "topo"))
    assert topo.gpus == ("GPU0", "GPU1")
    assert topo.links[("GPU0", "GPU1")] == "NV18" and topo.links[("GPU1", "GPU0")] == "NV18"
    p2p = probes.parse_p2p(_cmd("2xh200-nvlink-ansi", "p2p"))
    assert p2p[("GPU0", "GPU1")] == "OK" and p2p[("GPU1", "GPU0")] == "OK"


def test_real_gpu_query_and_driver_version() -> None:
    (gpu,) = probes.parse_gpus(_cmd("h200-1gpu-idle", "gpus"))
    assert (gpu.index, gpu.uuid, gpu.name) == (0, H200_UUID, "NVIDIA H200")
    assert gpu.memory_total_mib == 143771 and gpu.driver_version == "580.159.04"
    assert probes.parse_gpu_list(_cmd("h200-1gpu-idle", "gpu_list")) == [(0, "NVIDIA H200", H200_UUID)]
    version = (DATA / "h200-1gpu-idle/files/proc/driver/nvidia/version").read_text()
    assert probes.parse_driver_version(version) == "580.159.04"
    assert probes.parse_apps(_cmd("h200-1gpu-idle", "apps")) == []


def test_real_vram_holder_is_named_by_doctor() -> None:
    assert probes.parse_apps(_cmd("h200-1gpu-holding", "apps")) == [
        probes.GpuApp(492, "python3", H200_UUID, 2566)
    ]
    spec = Project(REPO).load("flash-next-merlin-4x3090")
    checks = doctor.evaluate(spec, gather(ReplayHost("h200-1gpu-holding"), model_dir=spec.model.local_dir))
    rows = {c.name: c for c in checks}
    assert rows["VRAM holders"].verdict == "no-go"
    assert "GPU0: PID 492 python3 2566 MiB" in rows["VRAM holders"].detail
    assert rows["GPUs"].verdict == "no-go"  # one H200 where the recipe needs four GPUs
    assert rows["memlock"].verdict == "go"  # root on that host raises RLIMIT_MEMLOCK (raise-ok)
    idle = doctor.evaluate(spec, gather(ReplayHost("h200-1gpu-idle"), model_dir=spec.model.local_dir))
    assert {c.name: c.verdict for c in idle}["VRAM holders"] == "go"


def _two_gpu_spec() -> Deployment:
    """Seed 003's spec asking for the two GPUs of the captured NVLink host."""
    data = to_data(Project(REPO).load("flash-next-merlin-4x3090"))
    data["resources"]["gpus"].update(count=2, cdi_devices=["nvidia.com/gpu=0", "nvidia.com/gpu=1"])
    return from_data(data)


def _rows(spec: Deployment, case: str) -> dict[str, doctor.Check]:
    return {c.name: c for c in doctor.evaluate(spec, gather(ReplayHost(case), model_dir="/x"))}


def test_real_nvlink_pair_reads_nv18_and_p2p_ok_and_doctor_says_go() -> None:
    topo = probes.parse_topo(_cmd("h200x2-nvlink-idle", "topo"))
    assert "\x1b[4m" in _raw("h200x2-nvlink-idle", "topo")
    assert topo.gpus == ("GPU0", "GPU1")
    assert topo.links[("GPU0", "GPU1")] == "NV18" == topo.links[("GPU1", "GPU0")]
    p2p = probes.parse_p2p(_cmd("h200x2-nvlink-idle", "p2p"))
    assert p2p == {("GPU0", "GPU1"): "OK", ("GPU1", "GPU0"): "OK"}
    spec = _two_gpu_spec()
    rows = {
        c.name: c for c in doctor.evaluate(spec, gather(ReplayHost("h200x2-nvlink-idle"), model_dir="/x"))
    }
    assert rows["PCIe P2P"].verdict == "go" and "links NV18" in rows["PCIe P2P"].detail
    assert rows["VRAM holders"].verdict == "go"
    # the right count, the wrong card: the spec (seed 003) asks for RTX 3090s
    assert rows["GPUs"].verdict == "no-go" and "GPU1 is NVIDIA H200" in rows["GPUs"].detail


def test_real_holder_of_both_gpus_is_named_on_each() -> None:
    apps = probes.parse_apps(_cmd("h200x2-nvlink-holding", "apps"))
    assert [(a.pid, a.name, a.used_mib) for a in apps] == [(660, "python3", 2566)] * 2
    spec = _two_gpu_spec()
    rows = {
        c.name: c for c in doctor.evaluate(spec, gather(ReplayHost("h200x2-nvlink-holding"), model_dir="/x"))
    }
    holder = rows["VRAM holders"]
    assert holder.verdict == "no-go"
    assert (
        "GPU0: PID 660 python3 2566 MiB" in holder.detail
        and "GPU1: PID 660 python3 2566 MiB" in holder.detail
    )
