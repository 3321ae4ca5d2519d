"""Untrusted-input policy shared by import and deploy: which argv words carry secrets, which host paths
would hand a container the host. Pure; one definition so import-time lifting and deploy-time refusal agree.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass

from rigsmith import spec as specmod
from rigsmith.modeldir import HINT as MODEL_DIR_HINT
from rigsmith.modeldir import model_dir_problem

#: vLLM flags whose value is a secret, and the environment variable vLLM reads it from instead.
SECRET_FLAGS: dict[str, str] = {"--api-key": "VLLM_API_KEY", "--hf-token": "HF_TOKEN"}
#: vLLM's own flags that begin like a secret flag (vllm/entrypoints/openai/cli_args.py,
#: vllm/engine/arg_utils.py). argparse accepts any unambiguous prefix of a flag (allow_abbrev), so these
#: decide which abbreviations name a secret flag: ``--api-k`` is ``--api-key``; ``--api`` matches
#: ``--api-server-count`` too, which vLLM refuses as ambiguous.
SECRET_FLAG_NEIGHBOURS = frozenset(
    {"--api-server-count", "--allowed-origins", "--hf-overrides", "--hf-config-path", "--host", "--headless"}
)


@dataclass(frozen=True)
class SecretFlag:
    """A word of the argv that vLLM's parser reads as a secret flag."""

    flag: str
    #: Other vLLM flags the abbreviation also names: vLLM refuses it, and it may hold a secret.
    ambiguous: tuple[str, ...] = ()

    @property
    def variable(self) -> str:
        return SECRET_FLAGS[self.flag]


def vllm_flag_name(word: str) -> str | None:
    """The flag name vLLM's FlexibleArgumentParser reads from ``word``, or None for a non-flag word.

    As vllm/utils/argparse_utils.py does: ``--x_y=v`` and ``--x_y`` are ``--x-y`` (underscores become
    dashes up to the first ``.``; ``--x.k v`` is the JSON flag ``--x``).
    """
    if not word.startswith("--") or word == "--":
        return None
    name = word.split("=", 1)[0].split(".", 1)[0]
    return name.replace("_", "-")


def secret_flag(word: str) -> SecretFlag | None:
    """The secret flag ``word`` spells as vLLM's parser reads it: exact, underscored, ``=``-joined, or an
    argparse abbreviation (unambiguous, or ambiguous and so refused by vLLM but still secret-shaped)."""
    name = vllm_flag_name(word)
    if name is None or len(name) < 3:
        return None
    if name in SECRET_FLAGS:
        return SecretFlag(name)
    if name in SECRET_FLAG_NEIGHBOURS:
        return None
    hits = sorted(f for f in SECRET_FLAGS if f.startswith(name))
    if not hits:
        return None
    others = sorted(f for f in (*SECRET_FLAG_NEIGHBOURS, *hits[1:]) if f.startswith(name))
    return SecretFlag(hits[0], tuple(others))


def secret_flag_span(args: tuple[str, ...] | list[str], i: int) -> int:
    """Index after the values of the secret flag at ``args[i]``: ``--api-key`` takes one or more
    values (nargs='+'), ``--hf-token`` at most one (nargs='?': alone it means the stored login)."""
    match = secret_flag(args[i])
    if match is None or "=" in args[i]:
        return i + 1
    j = i + 1
    while j < len(args) and not args[j].startswith("-"):
        j += 1
        if match.flag != "--api-key":
            break
    return j


#: Host paths a container must not see without the user's recorded consent: (path, why). A mount of the
#: path itself or of anything under it is dangerous; ``/`` and home directories only as themselves
#: (``/home/me/models`` is an ordinary data directory).
_DANGEROUS_TREES: tuple[tuple[str, str], ...] = (
    ("/etc", "the host's configuration"),
    ("/proc", "the host's kernel and process interface"),
    ("/sys", "the host's kernel and device interface"),
    ("/boot", "the host's kernel and boot loader"),
    ("/dev", "the host's devices (rigsmith passes the GPUs as CDI devices)"),
    ("/root", "root's home directory"),
    ("/run", "the host's runtime state, including the podman and docker sockets"),
    ("/var/run", "the host's runtime state, including the podman and docker sockets"),
    ("/var/lib/containers", "the container engine's storage"),
    ("/var/lib/docker", "the container engine's storage"),
    ("/var/lib/lxc", "the container engine's storage"),
    ("/var/lib/kubelet", "the container engine's storage"),
    ("/usr", "the host's programs"),
    ("/bin", "the host's programs"),
    ("/sbin", "the host's programs"),
    ("/lib", "the host's libraries"),
    ("/lib64", "the host's libraries"),
)
_DANGEROUS_EXACT = {"/": "the host's whole file system", "~": "your home directory", "/home": "every home"}
#: The GPU device nodes (NVIDIA, DRM render nodes, AMD's KFD): what a GPU container is given anyway.
_GPU_NODE_RE = re.compile(r"^/dev/(nvidia[a-z0-9-]*|nvidia-caps(/.*)?|dri(/.*)?|kfd)\Z")
#: Dot-directories that are caches vLLM and the Hub client read and fill, not a user's private state.
_CACHE_DIRS = frozenset({"huggingface", "vllm", "torch", "triton", "flashinfer"})


def dangerous_host_path(host: str) -> str | None:
    """Why mounting ``host`` into a recipe's container endangers the host, or None when it does not.

    Judged on the normalised path (``//``, ``.`` and ``..`` resolved as the kernel would), so
    ``/etc/../`` is ``/``. ``~`` is the home directory; ``~/.cache/huggingface`` (and the other caches in
    ``_CACHE_DIRS``) are not private state, every other dot-directory is (``~/.ssh``, ``~/.config``,
    ``~/.local/share/containers``).
    """
    home = host == "~" or host.startswith("~/")
    rest = host[1:] if home else host
    norm = posixpath.normpath(rest) if rest else "/"
    if norm.startswith("//"):
        norm = "/" + norm.lstrip("/")
    if home:
        norm = "~" if norm in ("/", ".") else "~" + norm
    if norm in _DANGEROUS_EXACT:
        return _DANGEROUS_EXACT[norm]
    if re.fullmatch(r"/home/[^/]+", norm):
        return "a home directory"
    if _GPU_NODE_RE.match(norm):
        return None
    if norm.endswith(".sock") or "/.sock" in norm:
        return "a socket (a container engine's socket gives root on the host)"
    for tree, why in _DANGEROUS_TREES:
        if norm == tree or norm.startswith(tree + "/"):
            return why
    parts = norm.split("/")
    for i, part in enumerate(parts):
        if part.startswith(".") and part not in (".", ".."):
            if part == ".cache" and i + 1 < len(parts) and parts[i + 1] in _CACHE_DIRS:
                continue
            return f"a dot-directory ({part}: private state such as keys, credentials or engine storage)"
    return None


def dangerous_mounts(spec: specmod.Deployment) -> list[tuple[str, str]]:
    """Problems for host paths that would hand the container the host: the model directory is never one
    (it must be a dedicated directory), an extra mount only with ``consent`` recorded in the spec."""
    out = []
    local = spec.model.local_dir
    why = dangerous_host_path(local)
    # The text rules fetch-model applies too (modeldir): system trees, shared tops, dot-directories.
    # Home is unknown here (pure): ``~/…`` is judged by its parts; fetch-model re-checks it resolved.
    written_absolute = local.startswith("/") or local == "~" or local.startswith("~/")  # else: "relative"
    problem = model_dir_problem(local, "") if written_absolute and not why else None
    if problem:
        out.append(("model.local_dir", f"{problem}; {MODEL_DIR_HINT}"))
    if why:
        out.append(
            (
                "model.local_dir",
                f"{local!r} is {why}, which would be mounted into the container; a model directory holds "
                "only the checkpoint: set model.local_dir to a dedicated directory (e.g. ~/models/NAME)",
            )
        )
    for i, m in enumerate(spec.mounts):
        why = dangerous_host_path(m.host)
        if why and not (m.consent or "").strip():
            mode = "read-only" if m.readonly else "read-write"
            out.append(
                (
                    f"mounts[{i}].consent",
                    f"the host path {m.host!r} is {why}, mounted {mode} at {m.container}; remove the mount, "
                    f"or record why you accept it: set mounts[{i}].consent to your reason (import-recipe "
                    f"asks, or takes --allow-mount {m.host})",
                )
            )
    return out
