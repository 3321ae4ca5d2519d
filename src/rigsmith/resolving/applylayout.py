"""A proposed layout written into a spec: the vLLM flags and env that carry it, edited in place. Pure.

Only the flags that decide the layout and its memory change (TP, PP, DP, EP, KV dtype, max-model-len, KV
pool, utilisation) and the ``VLLM_PP_LAYER_PARTITION`` entry; every other argv word keeps its place and
spelling (a flag written ``--flag=value`` stays so), and a flag the recipe did not write is appended only
when its value differs from vLLM's default. The choice is recorded in the spec's notes (what the recipe
said, what runs now, on which rig), as DESIGN.md asks of any difference from the recipe.
"""

from __future__ import annotations

from collections.abc import Sequence

from rigsmith.resolving.fitparams import EngineParams, engine_params
from rigsmith.resolving.layout import Layout
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
