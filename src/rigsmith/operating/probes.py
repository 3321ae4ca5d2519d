"""Host probes: each is a command (argv) or a file read plus a pure parser of its output.

Nothing here decides go/no-go (that is ``doctor.evaluate``); nothing here runs anything by itself (a
``Host`` does). Parsers take text and return data, so they are tested on captured outputs
(tests/ops/data/) of real rigs: 3×3090 with a ComfyUI squatter, 4×3090 idle, and a host with no driver.
"""

from __future__ import annotations

import json
import re
import tomllib
from dataclasses import dataclass, field

import yaml

from rigsmith.digits import ascii_digits

# -- commands -----------------------------------------------------------------------------------------

NVSMI = "nvidia-smi"
GPU_FIELDS = ("index", "uuid", "name", "memory.total", "memory.used", "driver_version", "pci.bus_id")
APP_FIELDS = ("pid", "process_name", "gpu_uuid", "used_memory")

#: argv of every command probe, by name (the captured-output fixtures use the same names).
COMMANDS: dict[str, tuple[str, ...]] = {
    "gpu_list": (NVSMI, "-L"),
    "gpus": (NVSMI, f"--query-gpu={','.join(GPU_FIELDS)}", "--format=csv,noheader,nounits"),
    "apps": (NVSMI, f"--query-compute-apps={','.join(APP_FIELDS)}", "--format=csv,noheader,nounits"),
    "topo": (NVSMI, "topo", "-m"),
    "p2p": (NVSMI, "topo", "-p2p", "r"),
    # Can this process raise RLIMIT_MEMLOCK to unlimited? (containers inherit the runtime's limits and
    # `--ulimit memlock=-1:-1` fails where this fails: runtime-facts §2.)
    "memlock": ("sh", "-c", "ulimit -H -l; (ulimit -l unlimited && echo raise-ok) 2>&1 || echo raise-failed"),
    "podman_version": ("podman", "--version"),
    "compose_version": ("podman-compose", "--version"),  # the compose target's front-end
    "pct": ("sh", "-c", "command -v pct"),  # a Proxmox VE host (doctor --target lxc runs there)
    "containers": ("podman", "ps", "--all", "--no-trunc", "--format", "json"),
    # OCI runtime and conmon as podman resolves them (it fails here when it finds neither).
    "podman_info": ("podman", "info", "--format", "json"),
    # The containers.conf files podman reads, in its order (CONTAINERS_CONF replaces them all), each after
    # a "### PATH" line: init_path lives there and nowhere in `podman info`.
    "containers_conf": (
        "sh",
        "-c",
        'if [ -n "${CONTAINERS_CONF:-}" ]; then set -- "$CONTAINERS_CONF"; else set -- '
        "/usr/share/containers/containers.conf /etc/containers/containers.conf "
        "/etc/containers/containers.conf.d/*.conf; fi; "
        'for f; do if [ -f "$f" ]; then printf "### %s\\n" "$f"; cat "$f"; echo; fi; done; true',
    ),
}

#: ``--init`` runs this when containers.conf sets no init_path (podman ≤ 5: containers/common's
#: DefaultInitPath; the error seen without it: "container-init binary not found on the host: stat
#: /usr/libexec/podman/catatonit").
DEFAULT_INIT_PATH = "/usr/libexec/podman/catatonit"
#: Where podman looks for helper binaries (helper_binaries_dir default) before $PATH: `kube play` builds its
#: pause image from the catatonit found there ("finding pause binary: exec: \"catatonit\"").
HELPER_DIRS = ("/usr/local/libexec/podman", "/usr/local/lib/podman", "/usr/libexec/podman", "/usr/lib/podman")
#: Where podman packages put the quadlet systemd generator (Debian/Fedora; Arch/SUSE).
QUADLET_GENERATORS = ("/usr/libexec/podman/quadlet", "/usr/lib/podman/quadlet")
PATH_DIRS = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
#: Debian package that ships each helper binary (the NO-GO row names it).
PACKAGES = {"catatonit": "catatonit", "tini": "tini", "runc": "runc", "crun": "crun", "conmon": "conmon"}

#: Files read as probes.
FILES = {
    "meminfo": "/proc/meminfo",
    "driver": "/proc/driver/nvidia/version",
}

#: Where podman (≤ 5.4) reads CDI specs; later directories win (runtime-facts §2.1).
CDI_DIRS = ("/etc/cdi", "/var/run/cdi")


# -- output hygiene -----------------------------------------------------------------------------------

#: CSI sequences (ESC [ … final byte) and two-byte escapes. nvidia-smi 580 underlines the header line of
#: `topo -m` and `topo -p2p r` with ESC[4m … ESC[0m even when stdout is not a terminal.
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")


def strip_ansi(text: str) -> str:
    """``text`` without terminal escape sequences (every probe output passes through here before parsing)."""
    return _ANSI.sub("", text)


# -- GPUs ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Gpu:
    """One GPU as ``nvidia-smi --query-gpu`` reports it."""

    index: int
    uuid: str
    name: str
    memory_total_mib: int
    memory_used_mib: int
    driver_version: str
    bus_id: str


@dataclass(frozen=True)
class GpuApp:
    """A compute process holding VRAM."""

    pid: int
    name: str
    gpu_uuid: str
    used_mib: int | None


class NoDriver(Exception):
    """nvidia-smi is missing or cannot talk to the driver."""


_NO_DRIVER = re.compile(
    r"couldn't communicate with the NVIDIA driver|NVIDIA-SMI has failed|No devices were found"
)


def check_nvsmi(code: int, stdout: str, stderr: str) -> None:
    """Raise NoDriver when an nvidia-smi run says the driver is not there."""
    text = stdout + stderr
    if code == 127:
        raise NoDriver("nvidia-smi is not installed")
    if code != 0 or _NO_DRIVER.search(text):
        first = next((ln.strip() for ln in text.splitlines() if ln.strip()), f"exit {code}")
        raise NoDriver(first)


def _csv(text: str) -> list[list[str]]:
    return [[c.strip() for c in line.split(",")] for line in text.splitlines() if line.strip()]


def _int(text: str) -> int | None:
    text = text.strip().removesuffix("MiB").strip()
    return int(text) if ascii_digits(text) else None


def parse_gpu_list(text: str) -> list[tuple[int, str, str]]:
    """``nvidia-smi -L`` → (index, name, uuid)."""
    out = []
    for m in re.finditer(r"^GPU (\d+): (.+?) \(UUID: (GPU-[0-9a-fA-F-]+)\)", text, re.MULTILINE):
        out.append((int(m.group(1)), m.group(2), m.group(3)))
    return out


def parse_gpus(text: str) -> list[Gpu]:
    """``--query-gpu=index,uuid,name,memory.total,memory.used,driver_version,pci.bus_id`` (csv, nounits)."""
    out = []
    for row in _csv(text):
        if len(row) != len(GPU_FIELDS) or not ascii_digits(row[0]):
            continue
        out.append(Gpu(int(row[0]), row[1], row[2], _int(row[3]) or 0, _int(row[4]) or 0, row[5], row[6]))
    return out


def parse_apps(text: str) -> list[GpuApp]:
    """``--query-compute-apps=pid,process_name,gpu_uuid,used_memory`` (csv, nounits).

    Process names may contain commas; the fields around them do not, so split from both ends.
    """
    out = []
    for line in text.splitlines():
        if not line.strip() or line.startswith("No running"):
            continue
        head, _, rest = line.partition(",")
        if not ascii_digits(head.strip()):
            continue
        name, uuid, used = (p.strip() for p in rest.rsplit(",", 2))
        out.append(GpuApp(int(head.strip()), name, uuid, _int(used)))
    return out


@dataclass(frozen=True)
class Topology:
    """``nvidia-smi topo -m``: link type between each pair of GPUs."""

    gpus: tuple[str, ...]
    links: dict[tuple[str, str], str]

    def pairs(self) -> list[tuple[str, str, str]]:
        """(gpu a, gpu b, link) for a < b."""
        return [
            (a, b, self.links[(a, b)])
            for i, a in enumerate(self.gpus)
            for b in self.gpus[i + 1 :]
            if (a, b) in self.links
        ]


def parse_topo(text: str) -> Topology:
    """The GPU×GPU block of ``nvidia-smi topo -m`` (NIC columns and the legend are ignored)."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        return Topology((), {})
    header = [h.strip() for h in re.split(r"\t+| {2,}", lines[0].strip()) if h.strip()]
    gpus = tuple(h for h in header if re.fullmatch(r"GPU\d+", h))
    links: dict[tuple[str, str], str] = {}
    for line in lines[1:]:
        cells = line.split()
        if not cells or not re.fullmatch(r"GPU\d+", cells[0]):
            continue
        for j, col in enumerate(gpus):
            if j + 1 < len(cells):
                links[(cells[0], col)] = cells[j + 1]
    return Topology(gpus, links)


#: topo -m link types through which consumer (GeForce) cards can do PCIe P2P at all. NV# is NVLink.
#: PHB/NODE/SYS cross a host bridge or the CPU; P2P there is off on GeForce drivers (p2p matrix "CNS"/"NS").
P2P_LINKS = re.compile(r"^(NV\d+|PIX|PXB)$")


def parse_p2p(text: str) -> dict[tuple[str, str], str]:
    """``nvidia-smi topo -p2p r``: GPU pair → status (OK, CNS, GNS, NS, TNS, …)."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        return {}
    gpus = [h for h in lines[0].split() if re.fullmatch(r"GPU\d+", h)]
    out: dict[tuple[str, str], str] = {}
    for line in lines[1:]:
        cells = line.split()
        if cells and re.fullmatch(r"GPU\d+", cells[0]):
            for j, col in enumerate(gpus):
                if j + 1 < len(cells) and col != cells[0]:
                    out[(cells[0], col)] = cells[j + 1]
    return out


def parse_driver_version(text: str) -> str | None:
    """``/proc/driver/nvidia/version`` → the loaded kernel module's version."""
    m = re.search(r"Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)", text)
    return m.group(1) if m else None


# -- containers ---------------------------------------------------------------------------------------

_CGROUP_ID = re.compile(r"(?:libpod-(?:conmon-)?|docker[-/])([0-9a-f]{64})")


def parse_cgroup(text: str) -> str | None:
    """``/proc/PID/cgroup`` → the container id (podman or docker) the process runs in, if any."""
    m = _CGROUP_ID.search(text)
    return m.group(1) if m else None


def parse_containers(text: str) -> dict[str, str]:
    """``podman ps --all --no-trunc --format json`` → container id → name."""
    try:
        data = json.loads(text or "[]")
    except json.JSONDecodeError:
        return {}
    out = {}
    for c in data if isinstance(data, list) else []:
        names = c.get("Names") or []
        out[str(c.get("Id", ""))] = names[0] if names else str(c.get("Id", ""))[:12]
    return out


# -- host limits --------------------------------------------------------------------------------------


def parse_meminfo(text: str) -> dict[str, int]:
    """``/proc/meminfo`` → field → bytes."""
    out = {}
    for m in re.finditer(r"^(\w+):\s+(\d+)(?: kB)?$", text, re.MULTILINE):
        out[m.group(1)] = int(m.group(2)) * 1024
    return out


@dataclass(frozen=True)
class Memlock:
    """RLIMIT_MEMLOCK of the probing process: hard limit in bytes (None = unlimited), can it be raised."""

    hard_bytes: int | None
    raisable: bool


def parse_memlock(text: str) -> Memlock:
    """Output of the ``memlock`` probe: ``ulimit -H -l`` (KiB or 'unlimited'), then raise-ok/failed."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if not lines:
        raise ValueError("empty memlock probe output")
    first = lines[0]
    hard = None if first == "unlimited" else int(first) * 1024
    return Memlock(hard, "raise-ok" in lines[1:])


def parse_podman_version(text: str) -> str | None:
    """``podman --version`` → '4.3.1'."""
    m = re.search(r"version (\d+\.\d+\.\d+)", text)
    return m.group(1) if m else None


@dataclass(frozen=True)
class PodmanInfo:
    """What ``podman info`` says about the helpers it runs containers with."""

    runtime: str | None = None  # OCI runtime name (runc, crun)
    runtime_path: str | None = None
    conmon_path: str | None = None
    error: str | None = None  # podman info failed: its first error line


def parse_podman_info(code: int, stdout: str, stderr: str) -> PodmanInfo:
    """``podman info --format json`` → OCI runtime and conmon; a failure keeps podman's own words."""
    if code != 0:
        first = next((ln.strip() for ln in (stderr + stdout).splitlines() if ln.strip()), f"exit {code}")
        return PodmanInfo(error=first)
    try:
        host = json.loads(stdout).get("host") or {}
    except (json.JSONDecodeError, AttributeError):
        return PodmanInfo(error="podman info printed no JSON")
    rt = host.get("ociRuntime") or {}
    conmon = host.get("conmon") or {}
    return PodmanInfo(rt.get("name") or None, rt.get("path") or None, conmon.get("path") or None)


def parse_containers_conf(text: str) -> str | None:
    """Output of the ``containers_conf`` probe → the init_path podman uses (later files win), None if unset.

    A file that is not valid TOML is skipped, as podman would refuse to start anyway and say why.
    """
    init: str | None = None
    for chunk in re.split(r"^### .*$", text, flags=re.MULTILINE):
        try:
            data = tomllib.loads(chunk)
        except tomllib.TOMLDecodeError:
            continue
        value = (data.get("containers") or {}).get("init_path")
        if isinstance(value, str) and value:
            init = value
    return init


# -- CDI ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CdiSpec:
    """One CDI spec file, as far as doctor needs it."""

    path: str
    cdi_version: str
    kind: str
    devices: tuple[str, ...]
    driver_version: str | None = None  # from the versioned driver libraries it mounts (NVIDIA specs)
    error: str | None = None
    #: device name → (container device node paths, "K=V" env) its edits inject, common edits included
    edits: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = field(default_factory=dict)

    @property
    def directory(self) -> str:
        return self.path.rsplit("/", 1)[0]

    def qualified(self) -> list[str]:
        """Fully qualified device names: vendor/class=name."""
        return [f"{self.kind}={d}" for d in self.devices]


_LIB_VERSION = re.compile(r"lib(?:cuda|nvidia-ml|nvidia-ptxjitcompiler)\.so\.(\d+\.\d+(?:\.\d+)?)")


def parse_cdi(path: str, text: str) -> CdiSpec:
    """A CDI spec (YAML or JSON; JSON is YAML) → kind, version, device names, driver version."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        return CdiSpec(path, "", "", (), error=f"not valid YAML/JSON: {err}")
    if not isinstance(data, dict):
        return CdiSpec(path, "", "", (), error="not a mapping")
    devs = [d for d in data.get("devices") or [] if isinstance(d, dict)]
    common_nodes, common_env = _edits(data.get("containerEdits"))
    edits = {}
    for d in devs:
        nodes, env = _edits(d.get("containerEdits"))
        edits[str(d.get("name"))] = (nodes + common_nodes, env + common_env)
    m = _LIB_VERSION.search(text)
    return CdiSpec(
        path,
        str(data.get("cdiVersion", "")),
        str(data.get("kind", "")),
        tuple(edits),
        m.group(1) if m else None,
        None if data.get("cdiVersion") and data.get("kind") else "missing cdiVersion or kind",
        edits,
    )


def _edits(ce: object) -> tuple[tuple[str, ...], tuple[str, ...]]:
    if not isinstance(ce, dict):
        return (), ()
    nodes = tuple(str(n["path"]) for n in ce.get("deviceNodes") or [] if isinstance(n, dict) and "path" in n)
    env = tuple(str(e) for e in ce.get("env") or [])
    return nodes, env


# -- results ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CmdResult:
    """What running one probe command gave."""

    code: int
    stdout: str
    stderr: str = ""


@dataclass(frozen=True)
class DiskFacts:
    """Free space where the model goes, and what is already there."""

    path: str
    free_bytes: int
    present_bytes: int


@dataclass
class HostFacts:
    """Everything doctor looks at, as data. Built by ``gather``; evaluated by ``doctor.evaluate``."""

    gpus: list[Gpu] = field(default_factory=list)
    gpu_error: str | None = None
    apps: list[GpuApp] = field(default_factory=list)
    topo: Topology | None = None
    p2p: dict[tuple[str, str], str] = field(default_factory=dict)
    driver_version: str | None = None
    meminfo: dict[str, int] = field(default_factory=dict)
    memlock: Memlock | None = None
    shm_bytes: int | None = None
    disk: DiskFacts | None = None
    podman_version: str | None = None
    cdi: list[CdiSpec] = field(default_factory=list)
    containers: dict[int, str] = field(default_factory=dict)  # pid → container name
    podman_info: PodmanInfo | None = None
    init_path: str | None = None  # containers.conf init_path (None: podman's default)
    #: every helper-binary path looked at → whether it is there
    binaries: dict[str, bool] = field(default_factory=dict)
    #: sparse bind files: host path → (size the spec wants, size on disk or None when missing)
    sparse: dict[str, tuple[int, int | None]] = field(default_factory=dict)
    image: ImageFacts | None = None
    model: ModelFacts | None = None


@dataclass(frozen=True)
class ImageFacts:
    """The image the plan runs, and whether local storage holds it (``podman image inspect``)."""

    ref: str
    pinned: bool  # the lock pins it (by digest or image ID)
    present: bool
    image_id: str | None = None
    error: str | None = None


def image_inspect_argv(ref: str) -> tuple[str, ...]:
    """The probe of one image in local storage."""
    return ("podman", "image", "inspect", "--format", "json", ref)


def parse_image_inspect(code: int, stdout: str) -> str | None:
    """``podman image inspect --format json REF`` → the image ID, None when storage does not hold it."""
    if code != 0:
        return None
    try:
        data = json.loads(stdout)
    except json.JSONDecodeError:
        return None
    if isinstance(data, list) and data and isinstance(data[0], dict):
        return str(data[0].get("Id") or "") or None
    return None


@dataclass(frozen=True)
class ModelFacts:
    """The model dir against the lock (``rigsmith.operating.doctor.drift.model_facts``)."""

    local_dir: str
    checked: int  # files compared
    hashed: bool  # full hashes (--verify) rather than the verified-file record
    problems: tuple[str, ...] = ()
    note: str | None = None  # why nothing could be compared (no lock entry, local checkpoint)
    unpinned: tuple[str, ...] = ()  # repos (the model, secondaries) rigsmith.lock has no commit for yet
