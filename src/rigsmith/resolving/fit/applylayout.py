"""A proposed layout written into a spec: the vLLM flags and env that carry it, edited in place. Pure.

Only the flags that decide the layout and its memory change (TP, PP, DP, EP, KV dtype, max-model-len, KV
pool, utilisation) and the ``VLLM_PP_LAYER_PARTITION`` entry, and the fields derived from the layout move
with it (``with_gpus``: the CDI list; ``with_readiness``: the KV size the engine reports, the start-up
budget); every other argv word keeps its place and spelling (a flag written ``--flag=value`` stays so),
and a flag the recipe did not write is appended only when its value differs from vLLM's default. The
choice is recorded in the spec's notes (what the recipe said, what runs now, on which rig), as DESIGN.md
asks of any difference from the recipe.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from rigsmith.resolving.fit.fitparams import EngineParams, engine_params
from rigsmith.resolving.fit.layout import Layout
from rigsmith.spec import Deployment, EnvVar

PARTITION_ENV = "VLLM_PP_LAYER_PARTITION"
#: The first line of the note ``fit --apply`` writes (an earlier one is replaced, not stacked).
NOTE_PREFIX = "fit --apply:"


def set_flag(args: Sequence[str], names: Sequence[str], value: str | None) -> list[str]:
    """``args`` with the flag (any of ``names``) set to ``value`` where it first appears, later repeats
    dropped; appended when absent; removed when ``value`` is None."""
    out: list[str] = []
    placed = False
    i = 0
    while i < len(args):
        a = args[i]
        eq = next((n for n in names if a.startswith(n + "=")), None)
        if a in names or eq:
            i += 1 if eq else 2
            if value is not None and not placed:
                out += [f"{eq}={value}"] if eq else [a, value]
            placed = True
            continue
        out.append(a)
        i += 1
    if value is not None and not placed:
        out += [names[0], value]
    return out


def set_switch(args: Sequence[str], name: str, on: bool) -> list[str]:
    """``args`` with the boolean flag on (written once, where it first was) or off (``--name`` and
    ``--no-name`` both removed: off is vLLM's default for the switches set here)."""
    neg = "--no-" + name.removeprefix("--")
    if on and name in args and neg not in args:
        return list(args)
    out = [a for a in args if a not in (name, neg)]
    return [*out, name] if on else out


def layout_args(args: Sequence[str], env: dict[str, str], lay: Layout, p: EngineParams) -> list[str]:
    """The argv after ``serve`` with ``lay`` and ``p``'s KV flags in place."""
    now = engine_params(args, env)
    out = list(args)
    rows: list[tuple[tuple[str, ...], str | None, bool]] = [
        (("--tensor-parallel-size", "-tp"), str(lay.tp), now.tp != lay.tp),
        (("--pipeline-parallel-size", "-pp"), str(lay.pp), now.pp != lay.pp),
        (("--data-parallel-size", "-dp"), str(lay.dp), lay.dp > 1),
        (("--kv-cache-dtype",), lay.kv_dtype, now.kv_cache_dtype != lay.kv_dtype),
        (("--gpu-memory-utilization",), f"{p.gpu_memory_utilization:g}", True),
        (("--kv-cache-memory", "--kv-cache-memory-bytes"), _opt(p.kv_cache_memory), True),
        (("--max-model-len",), _opt(p.max_model_len), p.max_model_len is not None),
    ]
    for names, value, change in rows:
        if change or any(a in names or a.split("=", 1)[0] in names for a in out):
            out = set_flag(out, names, value)
    if lay.dp == 1:
        out = set_flag(out, ("--data-parallel-size", "-dp"), None)
    return set_switch(out, "--enable-expert-parallel", lay.ep)


def _opt(v: int | None) -> str | None:
    return None if v is None else str(v)


def with_layout(spec: Deployment, lay: Layout, p: EngineParams, why: str) -> Deployment:
    """``spec`` running ``lay`` with ``p``'s KV flags, and a note saying so (``why``: the rig and reasons)."""
    env = {e.name: e.value for e in spec.active_env()}
    args = layout_args(spec.engine.args, env, lay, p)
    entries = [e for e in spec.env if e.name != PARTITION_ENV]
    if lay.partition is not None:
        value = ",".join(map(str, lay.partition))
        old = next((e for e in spec.env if e.name == PARTITION_ENV), None)
        entry = (
            old.model_copy(update={"value": value, "enabled": True})
            if old
            else EnvVar(name=PARTITION_ENV, value=value, note=f"{NOTE_PREFIX} the stage split")
        )
        at = next((i for i, e in enumerate(spec.env) if e.name == PARTITION_ENV), len(entries))
        entries.insert(at, entry)
    before = _describe(spec.engine.args, env)
    note = f"{NOTE_PREFIX} {lay.label()} replaces the recipe's {before}, chosen for this rig: {why}"
    notes = (*(n for n in spec.notes if not n.startswith(NOTE_PREFIX)), note)
    engine = spec.engine.model_copy(update={"args": tuple(args)})
    return spec.model_copy(update={"engine": engine, "env": tuple(entries), "notes": notes})


def _describe(args: Sequence[str], env: dict[str, str]) -> str:
    p = engine_params(args, env)
    split = f" split {','.join(map(str, p.pp_partition))}" if p.pp_partition else ""
    return f"TP{p.tp}×PP{p.pp}{' EP' if p.expert_parallel else ''}{split} KV {p.kv_cache_dtype}"


def with_gpus(spec: Deployment, gpus: Sequence[int], sizes_gib: Sequence[float], mixed: bool) -> Deployment:
    """``spec`` running on the cards ``gpus`` (nvidia-smi indices, in the order vLLM numbers its ranks):
    the CDI list, the count and size, ``CUDA_VISIBLE_DEVICES`` where the recipe sets it (the container sees
    only these cards, numbered from 0), and on mixed cards ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` so CUDA numbers
    them in nvidia-smi's order (its default puts the fastest first) and each rank lands on the card it was
    sized for."""
    gpu = spec.resources.gpus.model_copy(
        update={
            "cdi_devices": tuple(f"nvidia.com/gpu={i}" for i in gpus),
            "count": len(gpus),
            "vram_gib": round(min(sizes_gib), 2),
        }
    )
    resources = spec.resources.model_copy(update={"gpus": gpu})
    entries = list(spec.env)
    for i, e in enumerate(entries):
        if e.name == "CUDA_VISIBLE_DEVICES":
            entries[i] = e.model_copy(update={"value": ",".join(str(n) for n in range(len(gpus)))})
    if mixed and not any(e.name == "CUDA_DEVICE_ORDER" for e in entries):
        why = f"{NOTE_PREFIX} mixed cards: ranks follow nvidia-smi's order"
        entries.append(EnvVar(name="CUDA_DEVICE_ORDER", value="PCI_BUS_ID", note=why))
    return spec.model_copy(update={"resources": resources, "env": tuple(entries)})


def with_readiness(
    spec: Deployment, tokens: int | None, startup_scale: float
) -> tuple[Deployment, list[str]]:
    """``spec`` with the fields the layout decides moved with it: ``readiness.kv_cache_tokens`` set to
    ``tokens`` (None: dropped, where no exact figure is known) and the start-up budgets scaled by
    ``startup_scale`` where it is above 1 (the heaviest rank loads more). The words that say what moved."""
    r = spec.readiness
    upd: dict[str, object] = {}
    words = []
    if r.kv_cache_tokens is not None and tokens != r.kv_cache_tokens:
        upd["kv_cache_tokens"] = tokens
        words.append(
            f"readiness.kv_cache_tokens {r.kv_cache_tokens:,} → {tokens:,} (the recipe's figure scaled by "
            "the new pool's tokens)"
            if tokens is not None
            else f"readiness.kv_cache_tokens {r.kv_cache_tokens:,} dropped: the pool now follows the "
            "utilisation, so no exact figure is known (`invoke wait` reads the engine's own)"
        )
    if startup_scale > 1:
        upd["startup_seconds"] = math.ceil(r.startup_seconds * startup_scale)
        if r.warm_startup_seconds is not None:
            upd["warm_startup_seconds"] = math.ceil(r.warm_startup_seconds * startup_scale)
        words.append(
            f"readiness.startup_seconds {r.startup_seconds} → {upd['startup_seconds']} (the heaviest rank "
            f"loads {startup_scale:.2f}× the recipe's)"
        )
    if not upd:
        return spec, words
    return spec.model_copy(update={"readiness": r.model_copy(update=upd)}), words
