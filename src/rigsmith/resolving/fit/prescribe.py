"""The cheapest fix when the recipe's own layout does not run on this rig: evict the squatter, lower the
context or the KV dtype, add a stage, else the best proposal. Pure (``propose`` sizes each step).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from rigsmith.resolving.fit.fitparams import EngineParams
from rigsmith.resolving.fit.layout import Summary
from rigsmith.resolving.fit.propose import Proposal, Rig, kv_dtypes, recipe_row
from rigsmith.resolving.fit.proposewhy import kv_bytes


def _without_squatters(rig: Rig) -> Rig:
    cards = tuple(
        replace(c, others=max(c.others - sum(b for _, b in c.squatters), 0), squatters=()) for c in rig.cards
    )
    return replace(rig, cards=cards)


def prescribe(s: Summary, base: EngineParams, rig: Rig, ranked: Sequence[Proposal]) -> list[str]:
    """When the recipe's layout does not run (a rank short of memory, or a pool shorter than one
    --max-model-len sequence): the cheapest fixes, in this order, each taken only if it is needed: evict
    the named process, lower --max-model-len to what the pool holds (or switch the KV dtype), add a
    pipeline stage; else the best proposal. Empty when it runs."""
    if base.world > len(rig.cards):
        return _best(ranked, f"the recipe's layout needs {base.world} GPUs, the rig has {len(rig.cards)}")
    own = recipe_row(s, base, rig, 0)
    if own.runs:
        return []
    steps: list[str] = []
    short = [r.card for r in own.ranks if r.headroom < 0 and r.card.squatters]
    if short:
        clean = _without_squatters(rig)
        if all(r.headroom >= 0 for r in recipe_row(s, base, clean, 0).ranks):
            who = "; ".join(f"{w} on GPU {c.index}" for c in short for w, _ in c.squatters)
            steps.append(f"evict {who} (`kill PID`, `podman stop NAME`): the memory is then there")
            rig, own = clean, recipe_row(s, base, clean, 0)
    if all(r.headroom >= 0 and r.kv > 0 for r in own.ranks):
        tokens, mml = own.kv_tokens, base.max_model_len or s.shape.max_position_embeddings or 0
        if own.runs:
            return steps
        if tokens >= base.block_size:
            step = (
                f"lower --max-model-len to {tokens}: the KV pool holds {tokens:,} tokens, less than one "
                f"{mml:,}-token sequence"
            )
            for d in kv_dtypes(rig.arch, base.kv_cache_dtype)[1:]:
                if kv_bytes(d, s) < kv_bytes(base.kv_cache_dtype, s):
                    alt = recipe_row(s, replace(base, kv_cache_dtype=d), rig, 0)
                    step += f" (or switch --kv-cache-dtype {d}: {alt.kv_tokens:,} tokens)"
            return [*steps, step]
    more = replace(base, pp=base.pp + 1, pp_partition=None)
    if more.world <= len(rig.cards) and more.pp <= s.shape.num_layers and recipe_row(s, more, rig, 0).runs:
        return [*steps, f"add a stage: --pipeline-parallel-size {more.pp} (vLLM's even split)"]
    return _best(ranked, "")


def _best(ranked: Sequence[Proposal], why: str) -> list[str]:
    best = next((p for p in ranked if p.fits), None)
    if best is None:
        return [
            f"{why + ', and ' if why else ''}no layout fits with that headroom: free GPU memory or add GPUs"
        ]
    return [f"{why + ': ' if why else ''}take proposal 1, {best.layout.label()} (`invoke fit --apply 1`)"]
