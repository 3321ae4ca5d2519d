"""How vLLM sizes its memory, by engine version: the part of fit's per-rank count that is vLLM's own rules
rather than the checkpoint's bytes. Pure.

Held against published boot logs (tests/resolving/data/bootlogs/, docs/fit.md). Six things differ from a
"weights + a fixed allowance" count, and some of them by version:

1. **The context.** With no ``--max-model-len`` vLLM serves the model config's ``max_position_embeddings``
   and refuses to start when the KV pool holds less than one request of that length.
2. **The profile run.** The activation peak vLLM subtracts is that of ``max_num_batched_tokens`` tokens
   (V0 without chunked prefill: the whole context, at least 2,048; V0 turns chunked prefill on by itself
   above 32K and then profiles 512; V1 always chunks: 2,048, or 8,192 with 1,024 sequences on cards of
   70 GiB and more that are not A100s) and the sampler's fp32 ``[max_num_seqs, vocab]`` buffers on the last
   pipeline stage. V1 runs the sampler after the forward pass has given its activations back, so its peak
   is the larger of the two, the sampler's next to the forward's output hidden states (the v0.19 boots log
   the torch peak: CodeLlama's 0.77 GiB is its forward pass, Llama 3.1's 1.89 GiB its sampler). How large
   the sampler's is depends on its top-k/top-p filter: PyTorch's sort of the whole vocabulary until the
   Triton filter (vllm#33538) is the default, 9.5 buffers (the bf16 logits, their fp32 copy, the sorted
   values, int64 indices, the radix sort's index input and its double buffer); from v0.19 3.75 (the logs'
   1.89 and 2.21 GiB over 1,024 × 128,256 and 1,024 × 152,064).
3. **Memory outside PyTorch** (cuBLAS workspaces, NCCL) measured in the profile comes off the pool; in V1
   that includes NCCL's NVLS buffers for a TP group on an NVSwitch board.
4. **The total** vLLM multiplies by the utilisation is PyTorch's (``cudaMemGetInfo``), which is less than
   nvidia-smi's by what the driver keeps (23.58 GiB on a 24 GiB RTX 3090).
5. **CUDA graphs** are captured after the pool is allocated until v0.21, so they must fit in what the
   utilisation leaves free, next to the CUDA context: a high utilisation can run out of memory there even
   though an eager engine would fit. From v0.21 their estimate is taken off the pool instead.
6. **Sliding-window layers** hold the window (plus a block), not the whole context, from v0.10 (the hybrid
   KV cache manager); before, every attention layer held the whole context.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

GiB = 1024**3
MiB = 1024**2

#: What the driver keeps of a card's nvidia-smi total: PyTorch reports 23.58 GiB for a 24,576 MiB RTX 3090
#: and 79.22 GiB for an 81,559 MiB H100 (boot logs in tests/resolving/data/bootlogs/).
DRIVER_RESERVE = 430 * MiB
#: A card this large (and not an A100) gets V1's large scheduler defaults (vllm/engine/arg_utils.py).
BIG_CARD = 70 * GiB


@dataclass(frozen=True)
class EngineEra:
    """How one range of vLLM versions sizes memory (see the module docstring for each point)."""

    since: tuple[int, int]
    name: str
    v1: bool  # V1 engine: chunked prefill always on
    chunk_tokens: int  # default max_num_batched_tokens with chunked prefill
    big_tokens: int  # ... on a card of BIG_CARD or more that is not an A100
    big_seqs: int  # default max_num_seqs there (256 elsewhere)
    sampler_buffers: float  # fp32 [max_num_seqs, vocab] buffers at the sampler's peak (logits, filter, probs)
    sampler_after_forward: bool  # the sampler runs once the forward pass gave its activations back (V1)
    non_torch: int  # memory outside PyTorch that the profile measures and takes off the pool
    graphs_in_pool: bool  # CUDA-graph memory estimated before the pool is sized (else captured after it)
    window_kv: bool  # sliding-window layers hold a window, not the whole context
    context_in_budget: bool  # the CUDA context counts inside the budget (V0 measured total − free)


#: Memory outside PyTorch: V0 logs it with the CUDA context in (0.03–0.35 GiB on consumer cards, 1.79 GiB
#: on an H100); V1 measures the increase after its start-up snapshot ("non-torch forward increase memory:
#: 0.25GiB" in the v0.19 H100 logs at TP1, 0.07 GiB at PP2).
_V0_NT, _V1_NT = 300 * MiB, 256 * MiB  # memory outside PyTorch, as above
ERAS: tuple[EngineEra, ...] = (
    EngineEra((0, 0), "V0", False, 512, 512, 256, 2, False, _V0_NT, False, False, True),
    EngineEra((0, 8), "V1", True, 2048, 8192, 1024, 9.5, True, _V1_NT, False, False, False),
    EngineEra((0, 10), "V1, hybrid KV", True, 2048, 8192, 1024, 9.5, True, _V1_NT, False, True, False),
    EngineEra((0, 19), "V1, no-sort sampler", True, 2048, 8192, 1024, 3.75, True, _V1_NT, False, True, False),
    EngineEra((0, 21), "V1, graphs profiled", True, 2048, 8192, 1024, 3.75, True, _V1_NT, True, True, False),
)
#: The rules fit applies when the engine's version is not known: the newest.
LATEST = ERAS[-1]

_VERSION = re.compile(r"(?:^|[-_])v?(\d+)\.(\d+)(?:\.\d+)?")


def parse_version(text: str | None) -> tuple[int, int] | None:
    """(major, minor) of a vLLM version ("0.10.1+gptoss", "v0.6.4.post1") or of the tag of an image that
    names one ("vllm/vllm-openai:v0.11.2", "…:cu128-0.10.1"); None for anything else (no tag, "latest", a
    digest, a version in the image's name rather than its tag)."""
    if not text:
        return None
    ref = text.split("@", 1)[0]
    last = ref.rsplit("/", 1)[-1]
    if ":" in last:
        tag = last.split(":", 1)[1]
    elif "/" in ref:
        return None
    else:
        tag = ref
    m = _VERSION.search(tag)
    return (int(m.group(1)), int(m.group(2))) if m else None


def era(version: tuple[int, int] | None) -> EngineEra:
    """The rules of the engine ``version``; the newest when unknown."""
    if version is None:
        return LATEST
    return [e for e in ERAS if e.since <= version][-1]


def torch_total(total: int) -> int:
    """What PyTorch reports as the total of a card whose nvidia-smi total is ``total`` bytes (point 4)."""
    return total - DRIVER_RESERVE if total > 4 * DRIVER_RESERVE else total


#: NCCL's NVLink SHARP (NVLS) buffers on an NVSwitch board (SXM H100/H200/B200): a TP group's communicator
#: allocates them outside PyTorch once vLLM has taken its start-up snapshot, so a V1 engine takes them off the
#: pool. llm-d's v0.19.0 sweep on SXM H100s logs 2.06-2.13 GiB of memory outside PyTorch for TP2 and TP4
#: where TP1 has 0.24-0.25 (Llama 3.1 8B, Qwen2.5 7B; docs/fit.md): 1.85 GiB more. PCIe cards have no
#: NVSwitch and no such buffers.
NVLS_BUFFERS = 1894 * MiB
_NVSWITCH = re.compile(r"H100 80GB HBM3|H100 SXM|H800|H200(?! NVL)|B200|GB200|B300", re.IGNORECASE)


def nvswitch_card(name: str) -> bool:
    """An SXM card on an NVSwitch board (nvidia-smi's name), where NCCL sets up NVLS for a TP group."""
    return bool(_NVSWITCH.search(name))


def big_card(total: int, name: str = "") -> bool:
    """V1 gives cards of 70 GiB and more, A100s apart, 8,192 batched tokens and 1,024 sequences."""
    return total >= BIG_CARD and "a100" not in name.lower()


def profile_shape(
    era_: EngineEra, context: int, batched: int | None, seqs: int | None, big: bool
) -> tuple[int, int]:
    """(tokens, sequences) of vLLM's profile run: the recipe's values where it sets them, else the
    engine's defaults for this context and card (point 2)."""
    if era_.v1:
        tokens = batched or (era_.big_tokens if big else era_.chunk_tokens)
        return tokens, seqs or (era_.big_seqs if big else 256)
    if batched:
        return batched, seqs or 256
    # V0 turns chunked prefill on by itself above 32K (and then profiles 512 tokens); without it one
    # prefill of the whole context must fit a step.
    return (era_.chunk_tokens if context > 32768 else max(context, 2048)), seqs or 256


def _up(n: int, m: int) -> int:
    return -(-n // m) * m


def mxfp4_loaded(param: str, nbytes: int, hidden: int, inter: int) -> int:
    """Bytes an MXFP4 expert tensor of ``nbytes`` in the checkpoint takes once vLLM has repacked it: the
    Marlin MoE kernel wants the intermediate size a multiple of 128 and the hidden size of 256 (gpt-oss:
    2,880 → 2,944 and 3,072; vllm/model_executor/layers/quantization/mxfp4.py), so the 120b's experts load
    9 % larger than they are stored (65.97 GiB logged on an H100 for 60.77 GiB of checkpoint)."""
    if not hidden or not inter:
        return nbytes
    h, i = _up(hidden, 256), _up(inter, 128)
    if param.endswith(("_blocks", "_scales")):
        return nbytes * h * i // (hidden * inter)
    if param == "gate_up_proj_bias":
        return nbytes * i // inter
    if param == "down_proj_bias":
        return nbytes * h // hidden
    return nbytes
