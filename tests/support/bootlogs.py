"""Published vLLM boot logs (tests/resolving/data/bootlogs/) and the checkpoints behind them, rebuilt.

Each log names a model whose config.json is kept next to it (``configs/``); its checkpoint is rebuilt from
that config as header-only safetensors shards (``checkpoints.header_only``: names, dtypes and shapes of the
published checkpoint, no weight byte written), in the layout of its format: plain 16-bit, GPTQ int4, AWQ int4,
bitsandbytes nf4 with double quantisation, FP8 with 128×128 block scales, or gpt-oss's MXFP4 experts. fit
reads them through ``LocalCheckpoint`` as it reads a real download.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from rigsmith.resolving.fit import fit, fitengine
from rigsmith.resolving.fit.checkpoint import LocalCheckpoint, rows
from tests.support.checkpoints import header_only
from tests.support.common import REPO

DATA = REPO / "tests" / "resolving" / "data" / "bootlogs"
GiB = fit.GiB
MiB = fit.MiB

Tensor = tuple[str, str, tuple[int, ...]]  # name, safetensors dtype, shape
#: formats whose unquantised tensors (norms, biases, embeddings, LM head) are float16
SIXTEEN = ("f16", "gptq", "awq")


@dataclass(frozen=True)
class Boot:
    """One published boot: what ran, on what, and what the engine logged."""

    id: str
    source: str
    model: str
    config: str
    checkpoint: str  # bf16 | f16 | gptq | awq | bnb4 | fp8-block | mxfp4
    vllm: str
    gpus: tuple[tuple[str, int], ...]  # (name, nvidia-smi MiB) per rank, in rank order
    argv: tuple[str, ...]
    env: dict[str, str]
    logged: dict[str, Any]
    excerpt: str
    unmatched: dict[str, str] = field(default_factory=dict)
    note: str = ""

    @property
    def totals(self) -> list[int]:
        return [mib * MiB for _, mib in self.gpus]


def boots() -> list[Boot]:
    out = []
    for path in sorted(DATA.glob("*.yaml")):
        d = yaml.safe_load(path.read_text(encoding="utf-8"))
        gpus = tuple((g["name"], int(g["mib"])) for g in d["gpus"])
        out.append(
            Boot(
                id=path.stem, source=d["source"], model=d["model"], config=d["config"],
                checkpoint=d["checkpoint"], vllm=str(d["vllm"]), gpus=gpus,
                argv=tuple(str(a) for a in d.get("argv", [])), env=dict(d.get("env", {})),
                logged=dict(d["logged"]), excerpt=d["excerpt"], unmatched=dict(d.get("unmatched", {})),
                note=d.get("note", ""),
            )
        )  # fmt: skip
    return out


def config(boot: Boot) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((DATA / "configs" / boot.config).read_text(encoding="utf-8"))
    return data


# -- the checkpoint of each format --------------------------------------------------------------------------


def _linear(kind: str, name: str, out: int, inp: int, bias: bool) -> Iterator[Tensor]:
    """One linear layer's tensors as the format stores them."""
    if kind in ("bf16", "f16"):
        dt = "BF16" if kind == "bf16" else "F16"
        yield name + ".weight", dt, (out, inp)
    elif kind == "gptq":  # 4-bit, group 128, no act-order: AutoGPTQ's packing
        yield name + ".qweight", "I32", (inp // 8, out)
        yield name + ".qzeros", "I32", (inp // 128, out // 8)
        yield name + ".scales", "F16", (inp // 128, out)
        yield name + ".g_idx", "I32", (inp,)
    elif kind == "awq":  # 4-bit GEMM, group 128, zero point: AutoAWQ's packing (in, out / 8)
        yield name + ".qweight", "I32", (inp, out // 8)
        yield name + ".qzeros", "I32", (inp // 128, out // 8)
        yield name + ".scales", "F16", (inp // 128, out)
    elif kind == "bnb4":  # nf4, blocks of 64, double quantisation (blocks of 256 absmax)
        n = out * inp
        yield name + ".weight", "U8", (n // 2, 1)
        yield name + ".weight.absmax", "U8", (n // 64,)
        yield name + ".weight.nested_absmax", "F32", (math.ceil(n / 64 / 256),)
        yield name + ".weight.nested_quant_map", "F32", (256,)
        yield name + ".weight.quant_map", "F32", (16,)
        yield name + ".weight.quant_state.bitsandbytes__nf4", "U8", (117,)
    elif kind == "fp8-block":
        yield name + ".weight", "F8_E4M3", (out, inp)
        yield name + ".weight_scale_inv", "F32", (math.ceil(out / 128), math.ceil(inp / 128))
    else:
        raise AssertionError(kind)
    if bias:
        yield name + ".bias", "F16" if kind in SIXTEEN else "BF16", (out,)


def _dense_layer(kind: str, c: dict[str, Any], i: int, qkv_bias: bool) -> Iterator[Tensor]:
    h, heads, kv = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]
    hd = c.get("head_dim") or h // heads
    norm = "F16" if kind in SIXTEEN else "BF16"
    p = f"model.layers.{i}."
    yield p + "input_layernorm.weight", norm, (h,)
    yield p + "post_attention_layernorm.weight", norm, (h,)
    if c["model_type"] == "qwen3":  # per-head RMS norms on Q and K
        yield p + "self_attn.q_norm.weight", norm, (hd,)
        yield p + "self_attn.k_norm.weight", norm, (hd,)
    for proj, out in (("q_proj", heads * hd), ("k_proj", kv * hd), ("v_proj", kv * hd)):
        yield from _linear(kind, p + "self_attn." + proj, out, h, qkv_bias)
    yield from _linear(kind, p + "self_attn.o_proj", h, heads * hd, False)
    inter = c["intermediate_size"]
    for proj in ("gate_proj", "up_proj"):
        yield from _linear(kind, p + "mlp." + proj, inter, h, False)
    yield from _linear(kind, p + "mlp.down_proj", h, inter, False)


def _qwen3_moe_layer(kind: str, c: dict[str, Any], i: int) -> Iterator[Tensor]:
    h, heads, kv, hd = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    p = f"model.layers.{i}."
    yield p + "input_layernorm.weight", "BF16", (h,)
    yield p + "post_attention_layernorm.weight", "BF16", (h,)
    yield p + "self_attn.q_norm.weight", "BF16", (hd,)
    yield p + "self_attn.k_norm.weight", "BF16", (hd,)
    for proj, out in (("q_proj", heads * hd), ("k_proj", kv * hd), ("v_proj", kv * hd)):
        yield from _linear(kind, p + "self_attn." + proj, out, h, False)
    yield from _linear(kind, p + "self_attn.o_proj", h, heads * hd, False)
    experts, inter = c["num_experts"], c["moe_intermediate_size"]
    yield p + "mlp.gate.weight", "BF16", (experts, h)  # the router stays 16-bit
    for e in range(experts):
        for proj in ("gate_proj", "up_proj"):
            yield from _linear(kind, f"{p}mlp.experts.{e}.{proj}", inter, h, False)
        yield from _linear(kind, f"{p}mlp.experts.{e}.down_proj", h, inter, False)


def _gpt_oss_layer(c: dict[str, Any], i: int) -> Iterator[Tensor]:
    h, heads, kv, hd = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    experts, inter = c["num_local_experts"], c["intermediate_size"]
    p = f"model.layers.{i}."
    yield p + "input_layernorm.weight", "BF16", (h,)
    yield p + "post_attention_layernorm.weight", "BF16", (h,)
    for proj, out in (("q_proj", heads * hd), ("k_proj", kv * hd), ("v_proj", kv * hd)):
        yield from _linear("bf16", p + "self_attn." + proj, out, h, True)
    yield from _linear("bf16", p + "self_attn.o_proj", h, heads * hd, True)
    yield p + "self_attn.sinks", "BF16", (heads,)
    yield p + "mlp.router.weight", "BF16", (experts, h)
    yield p + "mlp.router.bias", "BF16", (experts,)
    # MXFP4: 32 values a block, 16 bytes of e2m1 pairs and one e8m0 scale per block
    for proj, out, inp in (("gate_up_proj", 2 * inter, h), ("down_proj", h, inter)):
        yield f"{p}mlp.experts.{proj}_blocks", "U8", (experts, out, inp // 32, 16)
        yield f"{p}mlp.experts.{proj}_scales", "U8", (experts, out, inp // 32)
        yield f"{p}mlp.experts.{proj}_bias", "BF16", (experts, out)


def tensors(kind: str, c: dict[str, Any]) -> Iterator[Tensor]:
    """Every tensor of the checkpoint of config ``c`` in format ``kind``."""
    h, vocab = c["hidden_size"], c["vocab_size"]
    edt = "F16" if kind in SIXTEEN else "BF16"  # embeddings and LM head stay 16-bit
    yield "model.embed_tokens.weight", edt, (vocab, h)
    for i in range(c["num_hidden_layers"]):
        if c["model_type"] == "gpt_oss":
            yield from _gpt_oss_layer(c, i)
        elif c["model_type"] == "qwen3_moe":
            yield from _qwen3_moe_layer(kind, c, i)
        else:
            yield from _dense_layer(kind, c, i, qkv_bias=c["model_type"] == "qwen2")
    yield "model.norm.weight", edt, (h,)
    if not c.get("tie_word_embeddings"):
        yield "lm_head.weight", edt, (vocab, h)


def write_checkpoint(boot: Boot, root: Path, per_shard: int = 4000) -> Path:
    """config.json, header-only shards and their index under ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    c = config(boot)
    (root / "config.json").write_text(json.dumps(c), encoding="utf-8")
    all_t = list(tensors(boot.checkpoint, c))
    n = -(-len(all_t) // per_shard)
    weight_map: dict[str, str] = {}
    for k in range(n):
        name = f"model-{k + 1:05d}-of-{n:05d}.safetensors"
        chunk = all_t[k * per_shard : (k + 1) * per_shard]
        data, _ = header_only(chunk)
        (root / name).write_bytes(data)
        weight_map.update(dict.fromkeys((t[0] for t in chunk), name))
    (root / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": weight_map}), encoding="utf-8"
    )
    return root


# -- fit on the boot's rig ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Held:
    """fit's numbers for one boot, next to the logged ones."""

    boot: Boot
    est: fit.Estimate
    weights: int  # the heaviest rank's
    kv: int  # the pool of the rank the log reports (rank 0 unless ``logged.kv_rank``)
    kv_raw: int  # the same before clamping at 0 (negative: vLLM logs a negative pool)
    tokens: int | None
    outcome: str
    why: str


def held(boot: Boot, root: Path) -> Held:
    ckpt = LocalCheckpoint(write_checkpoint(boot, root))
    shape = fit.ModelShape.from_config(ckpt.config())
    params = fit.engine_params(list(boot.argv), boot.env)
    params = replace(params, vllm_version=fitengine.parse_version(boot.vllm))
    totals = boot.totals
    # as `invoke fit` does: the estimate from the headers, then on the rig's first card
    est = fit.estimate(shape, params, rows(ckpt)).for_card(totals[0], boot.gpus[0][0])
    r = est.ranks[int(boot.logged.get("kv_rank", 0))]
    total = totals[r.rank]
    budget = int(fitengine.torch_total(total) * params.gpu_memory_utilization)
    graphs = r.cuda_graphs if est.era.graphs_in_pool else 0
    raw = budget - r.weights - r.activation - r.non_torch - graphs
    outcome, why = est.outcome(totals)
    return Held(
        boot, est, max(x.weights for x in est.ranks), est.kv_budget(r, total), raw,
        est.kv_tokens(totals), outcome, why,
    )  # fmt: skip


def error(fit_value: float, logged: float) -> float:
    """Relative error of fit's number against the logged one."""
    return (fit_value - logged) / abs(logged)


#: The errors the docs state: weights per rank within 2 %, the KV pool (GiB and tokens) and the memory in use
#: within 10 %; the outcome exactly.
TOLERANCE = {"weights": 0.02, "kv": 0.10, "tokens": 0.10, "used": 0.10}


@dataclass(frozen=True)
class Check:
    what: str  # weights | kv | tokens | used | outcome
    fit: str
    logged: str
    error: float | None  # relative; None for the outcome
    ok: bool


def checks(h: Held) -> list[Check]:
    """Every number the log gives, next to fit's, with whether it is within the stated error."""
    lg, out = h.boot.logged, []
    if "weights_gib" in lg:
        e = error(h.weights / GiB, lg["weights_gib"])
        ok = abs(e) <= TOLERANCE["weights"]
        out.append(Check("weights", f"{h.weights / GiB:.2f}", f"{lg['weights_gib']:.2f}", e, ok))
    if "kv_gib" in lg:
        kv = (h.kv_raw if lg["kv_gib"] < 0 else h.kv) / GiB
        e = error(kv, lg["kv_gib"])
        out.append(Check("kv", f"{kv:.2f}", f"{lg['kv_gib']:.2f}", e, abs(e) <= TOLERANCE["kv"]))
    if "kv_tokens" in lg:
        t = h.tokens or 0
        e = error(t, lg["kv_tokens"])
        out.append(Check("tokens", f"{t:,}", f"{lg['kv_tokens']:,}", e, abs(e) <= TOLERANCE["tokens"]))
    if "used_mib" in lg:
        r = h.est.ranks[0]
        needs = h.est.usage(r, h.boot.totals[0])[2] / MiB
        e = error(needs, lg["used_mib"])
        out.append(
            Check("used", f"{needs:,.0f} MiB", f"{lg['used_mib']:,} MiB", e, abs(e) <= TOLERANCE["used"])
        )
    if "outcome" in lg:
        ok = (h.outcome == "starts") == (lg["outcome"] == "starts")
        out.append(Check("outcome", h.outcome, lg["outcome"], None, ok))
    return out


def _cell(c: Check | None) -> str:
    if c is None:
        return "–"
    if c.error is None:
        return f"{c.logged} / {c.fit}"
    mark = "" if c.ok else " ✗"
    return f"{c.logged} / {c.fit} ({c.error:+.1%}){mark}"


def table(rows: list[Held]) -> str:
    """The docs' table of errors: one row per published boot, logged / fit (error)."""
    head = (
        "| boot | model | GPUs | layout | vLLM | weights GiB/rank | KV pool GiB | KV tokens | "
        "outcome |\n|---|---|---|---|---|---|---|---|---|\n"
    )
    lines = []
    for h in rows:
        b, p = h.boot, h.est.params
        by = {c.what: c for c in checks(h)}
        gpus = " + ".join(sorted({f"{sum(1 for x in b.gpus if x[0] == n)}× {n}" for n, _ in b.gpus}))
        layout = f"TP{p.tp}" + (f" PP{p.pp}" if p.pp > 1 else "")
        kv = _cell(by.get("kv")) if "kv" in by else _cell(by.get("used"))
        lines.append(
            f"| [{b.id}]({b.source}) | {b.model} ({b.checkpoint}) | {gpus} | {layout} | {b.vllm} | "
            f"{_cell(by.get('weights'))} | {kv} | {_cell(by.get('tokens'))} | {_cell(by.get('outcome'))} |"
        )
    return head + "\n".join(lines) + "\n"


def main() -> None:
    """Print the docs' table (``PYTHONPATH=src:. python3 -m tests.support.bootlogs``)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        print(table([held(b, Path(tmp) / b.id) for b in boots()]), end="")


if __name__ == "__main__":
    main()
