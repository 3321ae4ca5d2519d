"""The recipe's parallel layout and memory flags, as ``rigsmith.resolving.fit.fit`` reads them: the vLLM argv
and env that decide memory (TP, PP, EP, utilisation, KV cache, CUDA graphs), the pipeline stage split and
the expert owner map. Pure.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rigsmith.errors import RigsmithError

#: vLLM's defaults where the recipe sets nothing (engine/arg_utils.py; v1 online serving on a non-H100).
DEFAULTS = {
    "gpu_memory_utilization": 0.9,
    "block_size": 16,
    "max_num_seqs": 256,
    "max_num_batched_tokens": 2048,
}


class FitError(RigsmithError):
    """The checkpoint, its config or the recipe's parallel flags cannot be estimated as they stand."""


@dataclass(frozen=True)
class EngineParams:
    """The vLLM flags and env that decide memory, parsed from the recipe's argv."""

    tp: int = 1
    pp: int = 1
    gpu_memory_utilization: float = DEFAULTS["gpu_memory_utilization"]
    kv_cache_memory: int | None = None
    max_model_len: int | None = None
    kv_cache_dtype: str = "auto"
    block_size: int = int(DEFAULTS["block_size"])
    max_num_seqs: int = int(DEFAULTS["max_num_seqs"])
    max_num_batched_tokens: int = int(DEFAULTS["max_num_batched_tokens"])
    expert_parallel: bool = False
    mtp: bool = False
    draft_model: str | None = None
    cuda_graphs: bool = True
    language_model_only: bool = False
    pp_partition: tuple[int, ...] | None = None
    #: ``--quantization``: ``fp8`` on a 16-bit checkpoint quantises its linear layers as they load (one byte
    #: an element, ``Placement.add``); other methods name the checkpoint's own format
    quantization: str | None = None
    #: the recipe offloads KV to host memory (``operating.fit.report.host_kv_offload``; not an argv flag
    #: this parser reads): a pool shorter than one sequence is then not fit's to refuse
    host_kv_offload: bool = False
    #: the scheduler flags the recipe itself sets ("max_num_batched_tokens", "max_num_seqs"); the others take
    #: the engine's defaults for its version and card (``fitengine.profile_shape``)
    given: frozenset[str] = frozenset()
    vllm_version: tuple[int, int] | None = None  # the engine's (major, minor); None: the newest rules
    big_card: bool = False  # cards of 70 GiB and more, not A100s: V1's larger scheduler defaults
    nvswitch: bool = False  # SXM cards on an NVSwitch board: NCCL NVLS buffers for TP (fitengine)

    @property
    def world(self) -> int:
        return self.tp * self.pp


_HUMAN = re.compile(r"^(\d+(?:\.\d+)?)\s*([kKmMgGtT]?)(i?[bB]?)$")


def parse_bytes(flag: str, text: str) -> int:
    """vLLM's ``human_readable_int``: plain bytes, or k/m/g/t (×1000ⁿ) and K/M/G/T or ``Gi`` (×1024ⁿ)."""
    m = _HUMAN.match(text.strip())
    if not m:
        raise FitError(f"{flag} {text!r} is not a byte count", hint=f"e.g. {flag} 4100000000 or {flag} 4G")
    num, unit, bin_ = m.groups()
    power = "kmgt".find(unit.lower()) + 1 if unit else 0
    base = 1024 if unit.isupper() or bin_.lower().startswith("i") else 1000
    return int(float(num) * base**power)


def _dashed(arg: str) -> str:
    """vLLM's parser takes ``--tensor_parallel_size`` for ``--tensor-parallel-size``: the flag's name with
    dashes (a value after ``=`` is left alone)."""
    if not arg.startswith("--"):
        return arg
    name, eq, value = arg.partition("=")
    return name.replace("_", "-") + eq + value


def _flag(args: Sequence[str], *names: str) -> str | None:
    found: str | None = None
    for i, raw in enumerate(args):
        a = _dashed(raw)
        for n in names:
            if a == n and i + 1 < len(args):
                found = args[i + 1]
            elif a.startswith(n + "="):
                found = a.split("=", 1)[1]
    return found


def _switch(args: Sequence[str], name: str) -> bool:
    on = False
    for raw in args:
        a = _dashed(raw)
        if a == name:
            on = True
        elif a == "--no-" + name.removeprefix("--"):
            on = False
    return on


_SCHEDULER = (("max_num_batched_tokens", "--max-num-batched-tokens"), ("max_num_seqs", "--max-num-seqs"))


def engine_params(args: Sequence[str], env: Mapping[str, str]) -> EngineParams:
    """Parse the recipe argv (after ``serve``) and env into EngineParams; bad values are a FitError."""

    def num(kind: type[int] | type[float], *names: str) -> Any:
        v = _flag(args, *names)
        if v is None:
            return None
        try:
            return kind(v)
        except ValueError:
            raise FitError(f"engine.args: {names[0]} {v!r} is not a number") from None

    spec_cfg = _flag(args, "--speculative-config", "--speculative_config")
    spec: dict[str, Any] = {}
    if spec_cfg:
        try:
            loaded = json.loads(spec_cfg)
        except json.JSONDecodeError as err:
            raise FitError(f"engine.args: --speculative-config is not JSON: {err}") from None
        spec = loaded if isinstance(loaded, dict) else {}
    method = str(spec.get("method", ""))
    comp = _flag(args, "--compilation-config", "-O")
    graphs = not _switch(args, "--enforce-eager")
    if comp and comp.startswith("{"):
        try:
            mode = json.loads(comp).get("cudagraph_mode")
        except (json.JSONDecodeError, AttributeError):
            mode = None
        graphs = graphs and str(mode).upper() != "NONE"
    partition = None
    if env.get("VLLM_PP_LAYER_PARTITION"):
        try:
            partition = tuple(int(p) for p in env["VLLM_PP_LAYER_PARTITION"].split(","))
        except ValueError:
            raise FitError(
                f"env VLLM_PP_LAYER_PARTITION={env['VLLM_PP_LAYER_PARTITION']!r} is not a list of layer "
                "counts",
                hint="write one count per pipeline stage, e.g. 25,23",
            ) from None
    kvm = _flag(args, "--kv-cache-memory", "--kv-cache-memory-bytes")
    d = EngineParams()
    return EngineParams(
        tp=num(int, "--tensor-parallel-size", "-tp") or 1,
        pp=num(int, "--pipeline-parallel-size", "-pp") or 1,
        gpu_memory_utilization=num(float, "--gpu-memory-utilization") or d.gpu_memory_utilization,
        kv_cache_memory=parse_bytes("--kv-cache-memory", kvm) if kvm else None,
        max_model_len=parse_bytes("--max-model-len", v) if (v := _flag(args, "--max-model-len")) else None,
        kv_cache_dtype=_flag(args, "--kv-cache-dtype") or "auto",
        block_size=num(int, "--block-size") or d.block_size,
        max_num_seqs=num(int, "--max-num-seqs") or d.max_num_seqs,
        max_num_batched_tokens=num(int, "--max-num-batched-tokens") or d.max_num_batched_tokens,
        expert_parallel=_switch(args, "--enable-expert-parallel"),
        mtp="mtp" in method,
        draft_model=str(spec["model"]) if spec.get("model") and "mtp" not in method else None,
        cuda_graphs=graphs,
        language_model_only=_switch(args, "--language-model-only"),
        quantization=_flag(args, "--quantization", "-q"),
        pp_partition=partition,
        given=frozenset(k for k, flag in _SCHEDULER if _flag(args, flag) is not None),
    )


def pp_partition(num_layers: int, pp: int, override: tuple[int, ...] | None = None) -> list[tuple[int, int]]:
    """[start, end) of each stage's decoder layers, as ``vllm.distributed.utils.get_pp_indices``."""
    if override is not None:
        if len(override) != pp or sum(override) != num_layers:
            raise FitError(
                f"VLLM_PP_LAYER_PARTITION={','.join(map(str, override))} gives {len(override)} stage(s) and "
                f"{sum(override)} layer(s); the recipe has {pp} stage(s) and the checkpoint {num_layers} "
                "layers",
                hint="vLLM refuses this too: make the counts one per stage and sum to the layer count",
            )
        parts = list(override)
    else:
        parts = [num_layers // pp] * pp
        for i in range(2, num_layers % pp + 2):  # the remainder goes to the stages before the last
            parts[-i] += 1
    out, start = [], 0
    for p in parts:
        out.append((start, start + p))
        start += p
    return out


def expert_owner(num_experts: int, ep: int) -> list[int]:
    """EP rank of each expert under vLLM's linear placement (``determine_expert_map``)."""
    base, rem = divmod(num_experts, ep)
    owner = []
    for r in range(ep):
        owner += [r] * (base + (1 if r < rem else 0))
    return owner
