"""doctor's per-target rows: what a Proxmox VE host must have for --target lxc (and not the CT's own CDI and
memlock), and "not pinned yet" instead of go for a model the lock does not pin."""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml

from rigsmith.operating.doctor import doctor, targetrows
from rigsmith.operating.host import LocalHost
from rigsmith.project import Project
from rigsmith.spec import loads
from tests.support.common import prepare_host_dirs, standin_deployment, write_project

#: /proc/devices of a PVE 8 host with the NVIDIA driver loaded (nvidia-uvm's major is dynamic).
PVE_PROC_DEVICES = """Character devices:
  1 mem
  4 tty
 10 misc
195 nvidia-frontend
226 drm
508 nvidia-uvm
509 nvidia-caps

Block devices:
  8 sd
259 blkext
"""


def _nvidia_spec(tmp_path: Path, name: str, count: int = 2) -> tuple[Path, dict[str, object]]:
    data = standin_deployment(tmp_path, name=name)
    data["resources"]["gpus"].update(count=count, cdi_devices=["nvidia.com/gpu=all"])  # type: ignore[index]
    prepare_host_dirs(data)
    return write_project(tmp_path, data).root, data


def test_lxc_doctor_checks_the_pve_host_not_the_cts_cdi_and_memlock(tmp_path: Path) -> None:
    root, _data = _nvidia_spec(tmp_path, "ct")
    _n, checks = doctor.diagnose(Project(root), "ct", target="lxc", host=LocalHost())
    rows = {c.name: c for c in checks}
    assert "CDI devices" not in rows and "memlock" not in rows, list(rows)
    if shutil.which("pct") is None:  # this machine is no PVE host, and doctor says so
        assert rows["pct"].verdict == "no-go" and "not a Proxmox VE host" in rows["pct"].detail
    if not Path("/dev/nvidiactl").exists():
        assert rows["device nodes"].verdict == "no-go"
        assert "no nvidia major in /proc/devices" in rows["device nodes"].detail


def test_pve_host_device_nodes_row_names_the_uvm_major(tmp_path: Path) -> None:
    majors = targetrows.parse_proc_devices(PVE_PROC_DEVICES)
    assert majors["nvidia-frontend"] == 195 and majors["nvidia-uvm"] == 508 and "sd" not in majors
    nodes = ["nvidia0", "nvidia1", "nvidia-caps", "nvidia-uvm", "nvidiactl"]
    _root, data = _nvidia_spec(tmp_path, "ct")
    spec = loads(yaml.safe_dump(data), "ct.yaml")
    pct, row = targetrows.rows(spec, targetrows.TargetFacts(majors=majors, dev_nodes=nodes, pct=True), "lxc")
    assert pct.verdict == "go"
    assert row.verdict == "go" and "`--uvm-major 508` for PVE < 8.1" in row.detail
    short = targetrows.rows(spec, targetrows.TargetFacts(majors=majors, dev_nodes=["nvidia0"]), "lxc")[1]
    assert short.verdict == "no-go" and "missing nvidiactl, nvidia-uvm" in short.detail


def test_doctor_says_not_pinned_yet_rather_than_go(tmp_path: Path) -> None:
    root, _data = _nvidia_spec(tmp_path, "fresh")
    _n, checks = doctor.diagnose(Project(root), "fresh", target="podman", host=LocalHost())
    row = next(c for c in checks if c.name == "model files")
    assert row.verdict == "warn" and row.detail.startswith("not pinned yet: rigsmith.lock has no commit for")
    assert row.hint == "`invoke pin --deployment fresh`, then `invoke fetch-model --deployment fresh`"
