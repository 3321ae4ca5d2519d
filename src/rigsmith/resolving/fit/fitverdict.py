"""One rank's verdict on its card: the one computation that plain ``invoke fit`` shows per GPU
(``operating.fit.report``) and that ``fit --propose`` ranks layouts by (``resolving.fit.propose``), so a
proposal that "fits" is a layout plain fit says GO on, and ``--apply`` then ``fit`` agree. Pure.

go: the rank keeps ``margin`` free (fit's warn margin, 512 MiB, unless a proposal was asked for another) and
its pool holds one request of the served context; warn: it runs closer than the margin, or its pool is
shorter than one request and the recipe offloads KV to host memory (not modelled); no-go: vLLM refuses to
start or the rank's peak does not fit next to what the card holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rigsmith.resolving.fit.fit import WARN_HEADROOM, Estimate, GiB, MiB, RankNeed
from rigsmith.resolving.fit.fitengine import torch_total

Verdict = Literal["go", "warn", "no-go"]


@dataclass(frozen=True)
class RankVerdict:
    """One rank on a card, by fit's count: its pool, its need, what is left, and the verdict in words."""

    kv: int
    needs: int
    has: int
    headroom: int
    tokens: int | None  # KV tokens of this rank's pool (None: no attention layer)
    verdict: Verdict
    why: str


def rank_verdict(
    est: Estimate,
    r: RankNeed,
    total: int,
    others: int = 0,
    *,
    margin: int = WARN_HEADROOM,
    offload: str | None = None,
    context: int | None = None,
) -> RankVerdict:
    """Rank ``r`` of ``est`` on a card of ``total`` bytes of which others hold ``others``. ``offload``: the
    recipe's host KV offload in words (None: none); ``context``: the served context one request of which
    the pool must hold (default: ``est.context``, the --max-model-len or the model config's maximum)."""
    p = est.params
    kv, inside, needs = est.usage(r, total)
    pt_total = torch_total(total)  # what vLLM multiplies by the utilisation: PyTorch's, not nvidia-smi's
    budget = int(pt_total * p.gpu_memory_utilization)
    has = total - others
    headroom = has - needs
    verdict: Verdict = "go"
    why = ""
    if p.kv_cache_memory is None and kv == 0:
        verdict = "no-go"
        why = (
            f"weights + activations + graphs + memory outside PyTorch "
            f"({_gib(r.weights + r.activation + r.cuda_graphs + r.non_torch)}) leave no KV cache inside "
            f"--gpu-memory-utilization {p.gpu_memory_utilization:g} × {_gib(pt_total)} (PyTorch's total)"
        )
    elif headroom < 0:
        verdict = "no-go"
        if inside <= budget:
            why = (
                f"vLLM refuses to start: after its runtime ({_mib(r.runtime)}, est.) it wants "
                f"--gpu-memory-utilization {p.gpu_memory_utilization:g} × {_gib(pt_total)} = {_gib(budget)} "
                "free"
            )
        else:
            why = (
                f"the rank's peak ({_gib(inside)}: weights, KV, graphs, activations) does not fit next to "
                "what the card holds"
            )
    elif headroom < margin:
        # with --kv-cache-memory the pool is fixed and the utilisation only the start check's ceiling:
        # a rank using more than utilisation × total is what vLLM does, not a warning
        verdict = "warn"
        why = f"within {_mib(margin)} of the limit: the estimates are not finer than that"
    block = r.kv_bytes_per_token * p.block_size
    tokens = kv // block * p.block_size if block else None
    ctx = context or est.context
    if verdict != "no-go" and tokens is not None and ctx and kv < est.request_bytes(r, ctx):
        one = (
            f"--max-model-len {ctx:,} sequence"
            if context or p.max_model_len
            else f"{ctx:,}-token sequence (no --max-model-len: the model config's maximum)"
        )
        short = f"the KV pool holds {tokens:,} tokens, less than one {one}: vLLM refuses to start"
        verdict = "no-go"
        if offload:
            verdict = "warn"
            short = (
                f"{short} unless the recipe's host KV offload ({offload}) admits it; fit does not model "
                "that offload"
            )
        why = f"{why}; {short}" if why else short
    return RankVerdict(kv, needs, has, headroom, tokens, verdict, why)


def _mib(n: int) -> str:
    return f"{n / MiB:,.0f} MiB"


def _gib(n: int) -> str:
    return f"{n / GiB:.2f} GiB"
