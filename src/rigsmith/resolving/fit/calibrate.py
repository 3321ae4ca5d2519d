"""Calibrate fit's allowances from what the engine itself reported on this rig.

vLLM sizes a utilisation-based KV pool as utilisation × total minus what its profile run measured (weights,
activation peak, CUDA graphs, non-torch memory), and logs the result as "GPU KV cache size: N tokens": whole
blocks, the smallest rank decides. fit estimates the same pool with named allowances; the tokens the engine
reported for a layout say how far those allowances were off on this rig. With ``--kv-cache-memory`` the pool
is the flag's own size, so the reported tokens say nothing about the allowances.

The correction is one number of bytes per GPU, added to every rank's allowance for memory outside PyTorch
of every layout (the part of the allowances that vLLM's profile run measures and that stays for the
engine's life, so it shrinks a fixed ``--kv-cache-memory`` pool too). Pure: an ``Estimate`` and numbers in.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from rigsmith.resolving.fit.fit import Estimate


def allowance_delta(est: Estimate, totals: Sequence[int], observed_tokens: int) -> int | None:
    """Bytes per GPU the allowances were short (negative: over) for the boot of ``est``'s layout on cards of
    ``totals`` bytes that reported ``observed_tokens``; None where the boot says nothing about them (an
    explicit ``--kv-cache-memory``, no attention layer, no tokens).

    For every rank, budget − delta ≥ tokens × bytes per token, with equality on the rank that decides, so
    delta is the least of budget − tokens × bytes per token. The engine rounds down to whole blocks: a
    difference under one block of the deciding rank is no difference."""
    if est.params.kv_cache_memory is not None or observed_tokens <= 0:
        return None
    gaps = [
        (est.kv_budget(r, total) - observed_tokens * r.kv_bytes_per_token, r.kv_bytes_per_token)
        for r, total in zip(est.ranks, totals, strict=False)
        if r.kv_bytes_per_token
    ]
    if not gaps:
        return None
    delta, per_token = min(gaps)
    return 0 if 0 <= delta < per_token * est.params.block_size else delta


def calibrated(est: Estimate, delta: int) -> Estimate:
    """``est`` with ``delta`` bytes more allowance outside PyTorch on every rank; a negative ``delta`` takes
    at most that, the activations and CUDA graphs together (what vLLM's profile run measures) to nothing."""
    if not delta:
        return est
    ranks = tuple(
        replace(r, non_torch=max(-r.cuda_graphs - r.activation, r.non_torch + delta)) for r in est.ranks
    )
    return replace(est, ranks=ranks)
