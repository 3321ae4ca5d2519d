"""What a prose record's words mean, as data (read by :mod:`.form`): section headings, the labels of
its bullets, exposure words, the shorthand a record uses for environment variables and compilation settings.

Every entry names its source: a rule is applied with a note saying which rule; a guess is asked at the
terminal (or taken from ``--answers``), and without an answer left as a placeholder. Pure data.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

#: Section headings (their first word, lowercase) whose paragraph is flag shorthand (``PP=3 / TP=1, …``).
CONFIG_HEADINGS = frozenset({"config", "configuration", "flags", "settings", "serving"})
#: Section headings whose list items are problems met and their fixes.
PITFALL_HEADINGS = frozenset({"pitfalls", "gotchas", "problems", "issues", "caveats", "lessons"})
#: Bullet labels of operations (how the record's author started, stopped, watched, measured it): rigsmith
#: renders and runs its own, so each is listed as not taken, naming the command that replaces it.
OPS_LABELS: Mapping[str, str] = {
    "start": "`invoke deploy --target podman` renders the run script and `invoke up` starts it",
    "run": "`invoke deploy --target podman` renders the run script and `invoke up` starts it",
    "logs": "`invoke logs` follows the container's log",
    "stop": "`invoke down` stops and removes the container",
    "restart": "`invoke down` then `invoke up`",
    "bench": "`invoke bench` measures the deployment against its benchmarks",
    "health": "`invoke wait` polls the health path until the API answers",
}

#: Words that say only this machine (or a proxy on it) calls the API: ``network.listen: 127.0.0.1``.
LOOPBACK_RE = re.compile(
    r"\bon (?:localhost|loopback|127\.0\.0\.1|::1)\b|\blocalhost[- ]only\b"
    r"|\bbound to (?:localhost|127\.0\.0\.1)\b"
    r"|\bbehind (?:a |the )?[\w.-]*\s*proxy\b|\bbehind [\w.-]+-proxy\b",
    re.IGNORECASE,
)
#: Words that say the API is reachable from other machines: ``network.listen: 0.0.0.0``.
WIDE_RE = re.compile(
    r"\bon (?:0\.0\.0\.0|all interfaces|the LAN|the network)\b|\bexposed to (?:the )?(?:LAN|network)\b",
    re.IGNORECASE,
)
#: A proxy the record serves behind: its name, its port (``:12434``), its family, who manages the backend.
PROXY_RE = re.compile(
    r"\bbehind (?P<name>[\w.-]*proxy[\w.-]*)\s*(?:on\s*)?:(?P<port>\d{2,5})\b", re.IGNORECASE
)
PROXY_PORT_RE = re.compile(r"(?:\bon\s*|\s):(?P<port>\d{2,5})\b")
FAMILY_RE = re.compile(r"\bfamily\s+(?P<family>[A-Za-z0-9][\w.-]*)")
MANAGED_RE = re.compile(r"\bbackend_managed\s*=\s*(?P<v>true|false)\b", re.IGNORECASE)

#: Measured throughput: ``67.4 tok/s 1-stream``, ``73.1 tok/s 2-stream aggregate``, ``40 tok/s single-stream``
#: (another engine's figure in the same line is a comparison, not a benchmark).
BENCH_RE = re.compile(
    r"(?P<tps>\d+(?:\.\d+)?)\s*tok/s\s+(?P<n>\d+|single|one)[- ]streams?(?P<agg>\s+aggregate)?",
    re.IGNORECASE,
)
TOKS_RE = re.compile(r"\d+(?:\.\d+)?\s*tok/s")

#: The record's host: ``3x RTX 3090``, ``(72 GB VRAM)``, ``125 GB RAM``.
GPU_RE = re.compile(
    r"(?P<count>\d+)\s*[x×]\s*(?P<model>RTX (?:PRO )?A?\d{4}(?: Ti)?|[AHBL]\d{2,3}|MI\d{3}X?)"
    r"(?:\s*\((?P<vram>\d+(?:\.\d+)?)\s*G(?:i)?B VRAM\))?"
)
RAM_RE = re.compile(r"(?P<gb>\d+(?:\.\d+)?)\s*G(?:i)?B (?:host )?RAM\b")
#: ``Model: owner/name @ rev SHA (164 GiB, …)``.
MODEL_RE = re.compile(
    r"(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?:\s*@\s*(?:rev(?:ision)?\s*)?(?P<rev>[0-9a-f]{7,40}))?"
    r"(?:\s*\((?P<size>\d+(?:\.\d+)?)\s*(?P<unit>[KMGT]i?B)\b(?P<rest>[^)]*)\))?"
)
SIZE_UNITS: Mapping[str, int] = {
    "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
    "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40,
}  # fmt: skip
PODMAN_RE = re.compile(r"\bpodman (?P<version>\d+\.\d+(?:\.\d+)?)\b")
#: An image pinned by a digest the record shortened (``sha256:43f13b4c…47bb96``): it cannot be checked.
DIGEST_RE = re.compile(r"\bpinned by (?:image )?digest (?P<digest>sha256:[0-9a-f]+(?:…|\.\.\.)?[0-9a-f]*)")
UPSTREAM_RE = re.compile(r"\bupstream (?P<upstream>[\w.-]+/[\w.-]+)(?:\s*\((?P<parts>[^)]*)\))?")
ENGINE_VERSION_RE = re.compile(r"\bvLLM (?P<version>\d+\.\d+\S*)")

#: A pitfall that makes a file mount: the engine needs the file to exist at an exact size.
FILE_PITFALL_RE = re.compile(r"pre-existing file|exact size|must (?:pre-)?exist|0-byte file", re.IGNORECASE)
#: A pitfall about other processes holding the GPUs.
SQUATTER_RE = re.compile(
    r"squatter|other process(?:es)? on the GPU|stop everything on the GPU", re.IGNORECASE
)
#: A pitfall about a compose tool dropping the GPU devices.
CDI_DROP_RE = re.compile(r"(?:podman-compose|docker[- ]compose).{0,60}?\bdrops? CDI\b", re.IGNORECASE)
FIRST_BOOT_RE = re.compile(r"first boot ~?(?P<lo>\d+)(?:-(?P<hi>\d+))? min", re.IGNORECASE)
#: A path the publisher generalized: an upper-case first component (``WORKSTATION/ngram_table.bin``).
GENERALIZED_RE = re.compile(r"^(?P<token>[A-Z][A-Z0-9_]{2,})/(?P<rest>\S+)$")

#: Flag shorthand: how records shorten vLLM flag names.
FLAG_SHORTHANDS: Mapping[str, str] = {
    "gpu-mem-util": "--gpu-memory-utilization",
    "gpu-memory-util": "--gpu-memory-utilization",
    "gpu-util": "--gpu-memory-utilization",
    "mem-util": "--gpu-memory-utilization",
    "tp": "--tensor-parallel-size",
    "pp": "--pipeline-parallel-size",
    "dp": "--data-parallel-size",
    "ctx": "--max-model-len",
    "context": "--max-model-len",
}
#: vLLM flags that take one value, as a record names them without dashes (``max-num-seqs 4``).
VALUE_FLAGS = frozenset(
    """
    --max-model-len --max-num-seqs --max-num-batched-tokens --gpu-memory-utilization --kv-cache-memory
    --kv-cache-dtype --block-size --swap-space --cpu-offload-gb --max-cudagraph-capture-size
    --num-speculative-tokens --dtype --seed --quantization
    """.split()  # noqa: SIM905 (a table as text, like tables.DOCKER_VALUE_OPTS)
)
#: Phrases for a boolean flag switched on or off.
PHRASES = (
    (re.compile(r"^prefix[ -]caching (?:OFF|off|disabled)$"), "--no-enable-prefix-caching"),
    (re.compile(r"^prefix[ -]caching (?:ON|on|enabled)$"), "--enable-prefix-caching"),
    (re.compile(r"^(?:enforce[ -]eager|eager mode|CUDA graphs (?:OFF|off|disabled))$"), "--enforce-eager"),
    (re.compile(r"^(?:EP|expert[ -]parallel(?:ism)?)(?: ON| on)?$"), "--enable-expert-parallel"),
)
#: ``--compilation-config`` keys as records write them (``cudagraph_mode=FULL_DECODE_ONLY sizes [1,2,4]``):
#: record word → vLLM CompilationConfig field.
COMPILATION_KEYS: Mapping[str, str] = {
    "cudagraph_mode": "cudagraph_mode",
    "cudagraph-mode": "cudagraph_mode",
    "sizes": "cudagraph_capture_sizes",
    "capture sizes": "cudagraph_capture_sizes",
    "capture_sizes": "cudagraph_capture_sizes",
    "cudagraph_capture_sizes": "cudagraph_capture_sizes",
    "max_capture_size": "max_cudagraph_capture_size",
}


@dataclass(frozen=True)
class EnvRule:
    """A record's word for environment variables: what it expands to, and on what authority.

    ``names``: (NAME, value) pairs; a value of None takes the record's own value (``BREAKABLE_CUDAGRAPH=0``).
    ``guess``: True when nothing states the expansion (then it is asked, and left a placeholder unanswered).
    """

    word: str
    names: tuple[tuple[str, str | None], ...]
    source: str
    guess: bool = False


_SEED_003 = "the name seed 003's serve script (the same vllm-patch family) spells out"
ENV_RULES: tuple[EnvRule, ...] = (
    EnvRule(
        "expandable_segments",
        (("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"),),
        "PyTorch's CUDA caching-allocator option, set through PYTORCH_CUDA_ALLOC_CONF",
    ),
    EnvRule("BREAKABLE_CUDAGRAPH", (("VLLM_USE_BREAKABLE_CUDAGRAPH", None),), _SEED_003),
    EnvRule("ESTIMATE_CUDAGRAPHS", (("VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS", None),), _SEED_003),
    EnvRule("HOST_EMBED_TABLE", (("VLLM_HOST_EMBED_TABLE", None),), _SEED_003),
    EnvRule(
        "PLE mmap",
        (("VLLM_PLE_MMAP", "1"),),
        "a guess: no record or script states the variable behind 'PLE mmap'",
        guess=True,
    ),
)
#: Prefixes a full variable name already has: written as the record states it.
KNOWN_PREFIXES = ("VLLM_", "PYTORCH_", "CUDA_", "NCCL_", "HF_", "TORCH_", "OMP_", "HIP_", "ROCR_", "GLOO_")
#: A patched-vLLM variable named without its prefix is guessed to carry this one (asked).
GUESSED_PREFIX = "VLLM_"
