"""Knowledge tables of the importer: docker/podman option grammar, launchers, GPU names, note facts."""

from __future__ import annotations

import re
from collections.abc import Mapping

from rigsmith.importing import vllmflags

# -- knowledge tables ---------------------------------------------------------------------------------


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


#: vLLM flags whose value is JSON (argparse ``type=json.loads``-like); a bad value is refused.
JSON_FLAGS = vllmflags.JSON_FLAGS

#: ``docker run`` / ``podman run`` options that take a value (so the image is found correctly): docker's
#: full ``docker run --help`` list plus podman's own. Short forms combine (``-itd``, ``-dp8000:8000``).
DOCKER_VALUE_OPTS = _words(
    """
    --gpus --device -p --publish -v --volume -e --env --env-file --name --ipc --shm-size --ulimit
    --runtime --restart --network --net -w --workdir --entrypoint --mount --security-opt --cap-add
    --cap-drop -u --user -l --label --hostname --platform --pull -m --memory --cpus --pid --log-opt
    --log-driver --add-host --group-add --stop-timeout --stop-signal --health-cmd --tmpfs --cgroupns
    --userns --uts
    -a --attach --annotation --blkio-weight --blkio-weight-device --cgroup-parent --cidfile --cpu-period
    --cpu-quota --cpu-rt-period --cpu-rt-runtime -c --cpu-shares --cpuset-cpus --cpuset-mems
    --device-cgroup-rule --device-read-bps --device-read-iops --device-write-bps --device-write-iops
    --detach-keys --dns --dns-option --dns-search --domainname --expose --health-interval --health-retries
    --health-start-period --health-start-interval --health-timeout -h --ip --ip6 --isolation
    --kernel-memory --label-file --link --link-local-ip --mac-address --memory-reservation --memory-swap
    --memory-swappiness --network-alias --oom-score-adj --pids-limit --storage-opt --sysctl
    --volume-driver --volumes-from
    --arch --authfile --cgroups --cgroup-conf --chrootdirs --conmon-pidfile --decryption-key --gidmap
    --hooks-dir --init-path --os --passwd-entry --personality --pidfile --pod --pod-id-file
    --preserve-fds --rdt-class --requires --retry --retry-delay --sdnotify --seccomp-policy --secret
    --subgidname --subuidname --systemd --timeout --uidmap --umask --variant --image-volume
    """
)
DOCKER_BOOL_OPTS = _words(
    """
    -d --detach --rm -i --interactive -t --tty -it -ti -dit --privileged --init --read-only
    -P --publish-all -q --quiet --disable-content-trust --no-healthcheck --oom-kill-disable --sig-proxy
    --use-api-socket --env-host --http-proxy --no-hosts --passwd --read-only-tmpfs --replace --rmi
    --rootfs --tls-verify
    """
)
#: Options rigsmith decides per target; importing drops them and says so.
DOCKER_DROPPED = _words(
    """
    --name --restart --rm -d --detach -i -t -it -ti -dit --interactive --tty --runtime --network
    --net -p --publish -P --publish-all --privileged --init --pull --platform --log-opt --log-driver
    --hostname
    """
)

#: Launchers: executable basename → (executable inside the container, subcommand it needs).
LAUNCHERS: Mapping[str, tuple[str, tuple[str, ...]]] = {
    "vllm": ("vllm", ("serve",)),
    "python": ("python3", ("-m", "vllm.entrypoints.openai.api_server")),
    "python3": ("python3", ("-m", "vllm.entrypoints.openai.api_server")),
}
_PYTHON_RE = re.compile(r"^python3?(\.\d+)?$")

#: The vLLM images' entrypoint (vllm/vllm-openai runs ``vllm serve`` with the container command as args).
IMAGE_ENTRYPOINT = ("vllm", ("serve",))

#: Commands that start a shell instead of a server (``docker run -it IMAGE /bin/bash``).
_SHELLS = _words("bash sh zsh ash dash fish")

SHELL_KEYWORDS = _words(
    """
    if then else elif fi for while until do done case esac function select { }
    """
)

#: GPU name → (VRAM GiB per card, CUDA arch).
GPUS: Mapping[str, tuple[float, str]] = {
    "RTX 3090": (24.0, "sm_86"),
    "RTX 3090 Ti": (24.0, "sm_86"),
    "RTX 4090": (24.0, "sm_89"),
    "RTX 5090": (32.0, "sm_120"),
    "RTX 5060 Ti": (16.0, "sm_120"),
    "RTX 5070 Ti": (16.0, "sm_120"),
    "RTX A6000": (48.0, "sm_86"),
    "H100": (80.0, "sm_90"),
    "H200": (141.0, "sm_90"),
}

#: Env names that mark the vendor of the GPUs (CDI vendor/class).
GPU_VENDOR_HINTS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"^(HIP_VISIBLE_DEVICES|ROCR_VISIBLE_DEVICES|VLLM_ROCM_\w+|MIOPEN_\w+)$"), "amd.com/gpu"),
)
DEFAULT_GPU_VENDOR = "nvidia.com/gpu"

_ASSIGN_RE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.DOTALL)
_REPO_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
_SELF_REF_RE = re.compile(r"^\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?$")
#: A Kubernetes manifest (``apiVersion:`` with ``kind:``) or a kubectl/helm call, anywhere in the text.
_KUBE_RE = re.compile(
    r"(?m)^[ \t]*(?:(?:sudo[ \t]+)?(?P<tool>kubectl|helm|oc)[ \t]+\w"
    r"|apiVersion:[ \t]*\S+[ \t]*\n(?:.*\n)*?[ \t]*kind:)"
)
_SERVICES_RE = re.compile(r"^services:[ \t]*(#.*)?$", re.MULTILINE)
_COMPOSE_VAR_RE = re.compile(r"(?<!\$)\$(\{[^}]*\}?|[A-Za-z_][A-Za-z0-9_]*)")

#: Facts the recipe notes state in prose: (fact, pattern). The named groups are read by ``_note_facts``.
NOTE_FACTS: tuple[tuple[str, re.Pattern[str]], ...] = (
    (
        "download",
        re.compile(
            r"(?:hf|huggingface-cli) download (?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)"
            r"(?: --revision (?P<rev>\S+))? --local-dir (?P<dir>[^\s,;)]+)"
            r"(?: --revision (?P<rev2>[^\s,;)]+))?"
            r"(?: \((?P<size>\d+(?:\.\d+)?) ?(?P<unit>[KMGT]i?B)\))?"
        ),
    ),
    (
        "gpus",
        re.compile(
            r"(?P<count>\d+)\s*[x×]\s*(?P<model>RTX (?:PRO )?A?\d{4}(?: Ti)?|[AHBL]\d{2,3}|MI\d{3}X?)"
            r"(?:\s*\((?P<arch>sm_\d+)\))?"
        ),
    ),
    ("p2p", re.compile(r"\bP2P (?P<p2p>required|recommended)", re.IGNORECASE)),
    ("no_nvlink", re.compile(r"\bno NVLink\b", re.IGNORECASE)),
    ("host_ram", re.compile(r"(?P<gb>\d+(?:\.\d+)?) ?GB host RAM")),
    ("disk", re.compile(r"~?(?P<gb>\d+(?:\.\d+)?) ?GB disk")),
    ("shm", re.compile(r"\bshm_size (?P<size>\d+(?:\.\d+)?[kmgtKMGT]?)\b")),
    ("memlock", re.compile(r"\bmemlock (?P<memlock>-1|unlimited|\d+)")),
    ("stop_grace", re.compile(r"\bstop_grace_period (?P<seconds>\d+)s\b")),
    ("ready", re.compile(r"ready when the log shows (?P<lines>'[^']+'(?:(?:,\s*|,?\s+and\s+)'[^']+')*)")),
    ("kv_tokens", re.compile(r"GPU KV cache size: (?P<tokens>\d[\d,]*) tokens")),
    ("startup", re.compile(r"Startup ~?(?P<lo>\d+)(?:-(?P<hi>\d+))? min\w* first boot", re.IGNORECASE)),
    ("warm", re.compile(r"first boot[^,]*, ~?(?P<lo>\d+)(?:-(?P<hi>\d+))? min\w* after")),
    (
        "patch",
        re.compile(
            r"(?P<key>[A-Za-z_]\w*): (?P<value>[^\s,;]+) inside (?P<parent>[A-Za-z_][\w.]*)"
            r"(?: \((?P<note>[^)]*)\))?"
        ),
    ),
)

_SIZE_UNITS = {"KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}
_SIZE_UNITS["TIB"] = 2**40
