"""Checkpoints for `invoke fit` tests: real safetensors files (written with the `safetensors` package) with
the tensor names and shapes of three architectures, and header-only synthetic ones.

Every tensor carries how vLLM loads it, as the test author states it (``split``: rep, col, row, vocab, kv,
expert-col, expert-row; ``where``: first/last stage, a decoder layer, the MTP module, the vision tower), so
the expected per-rank bytes are computed by slicing the real arrays, independently of
rigsmith.resolving.fit.fit.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import save

from rigsmith import spec as specmod
from tests.support.common import REPO

DTYPE_BYTES = {"F16": 2, "BF16": 2, "F32": 4, "I32": 4, "U8": 1, "I64": 8, "F8_E4M3": 1}


@dataclass
class T:
    name: str
    array: np.ndarray
    split: str  # rep | col | row | vocab | kv | expert-col | expert-row
    where: str  # first | last | layer | mtp | vision
    layer: int = -1
    expert: int = -1


@dataclass
class Arch:
    config: dict[str, Any]
    tensors: list[T] = field(default_factory=list)
    #: header-only: each array is a zero-stride view (shape and nbytes, no memory), written by ``headers``
    lazy: bool = False

    def add(
        self, name: str, shape: tuple[int, ...], split: str, where: str, layer: int = -1, expert: int = -1
    ) -> None:
        if self.lazy:
            arr = np.broadcast_to(np.float16(0), shape)
        else:
            rng = np.random.default_rng(len(self.tensors))
            arr = rng.standard_normal(shape).astype(np.float16)
        self.tensors.append(T(name, arr, split, where, layer, expert))

    def headers(self, root: Path, shards: int = 4) -> Path:
        """config.json and header-only shards (data declared by offsets, none written) under ``root``."""
        root.mkdir(parents=True, exist_ok=True)
        (root / "config.json").write_text(json.dumps(self.config), encoding="utf-8")
        per = -(-len(self.tensors) // shards)
        for k in range(shards):
            chunk = self.tensors[k * per : (k + 1) * per]
            data, _ = header_only([(t.name, "F16", tuple(t.array.shape)) for t in chunk])
            (root / f"model-{k + 1:05d}-of-{shards:05d}.safetensors").write_bytes(data)
        return root

    def files(self, shards: int = 2) -> dict[str, bytes]:
        """config.json, model-0000k-of-0000n.safetensors shards and their index."""
        per = -(-len(self.tensors) // shards)
        out: dict[str, bytes] = {"config.json": json.dumps(self.config, indent=2).encode()}
        weight_map = {}
        for k in range(shards):
            name = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
            chunk = self.tensors[k * per : (k + 1) * per]
            out[name] = save({t.name: t.array for t in chunk}, metadata={"format": "pt"})
            weight_map.update(dict.fromkeys((t.name for t in chunk), name))
        total = sum(t.array.nbytes for t in self.tensors)
        out["model.safetensors.index.json"] = json.dumps(
            {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2
        ).encode()
        return out


def _cfg(layers: int, h: int, heads: int, kv: int, hd: int, vocab: int, **extra: Any) -> dict[str, Any]:
    """The text-model fields of a transformers config.json."""
    return {
        "num_hidden_layers": layers,
        "hidden_size": h,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "head_dim": hd,
        "vocab_size": vocab,
        **extra,
    }


def _attn(a: Arch, prefix: str, where: str, i: int, dims: tuple[int, int, int, int], gate: int = 1) -> None:
    h, heads, kv, hd = dims
    p = prefix + "self_attn."
    a.add(p + "q_proj.weight", (heads * hd * gate, h), "col", where, i)
    a.add(p + "k_proj.weight", (kv * hd, h), "kv", where, i)
    a.add(p + "v_proj.weight", (kv * hd, h), "kv", where, i)
    a.add(p + "o_proj.weight", (h, heads * hd), "row", where, i)


def dense(
    layers: int = 4,
    dims: tuple[int, int, int, int, int] = (256, 8, 2, 32, 1024),
    inter: int = 512,
    *,
    lazy: bool = False,
    max_pos: int = 4096,
) -> Arch:
    """Llama-like with an untied LM head; ``dims`` = hidden, heads, KV heads, head dim, vocab. The defaults:
    4 layers, GQA 8/2 heads."""
    h, heads, kv, hd, vocab = dims
    a = Arch(
        {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            **_cfg(layers, h, heads, kv, hd, vocab, intermediate_size=inter, torch_dtype="float16"),
            "tie_word_embeddings": False,
            "max_position_embeddings": max_pos,
        },
        lazy=lazy,
    )
    a.add("model.embed_tokens.weight", (vocab, h), "vocab", "first")
    for i in range(layers):
        a.add(f"model.layers.{i}.input_layernorm.weight", (h,), "rep", "layer", i)
        _attn(a, f"model.layers.{i}.", "layer", i, (h, heads, kv, hd))
        a.add(f"model.layers.{i}.post_attention_layernorm.weight", (h,), "rep", "layer", i)
        for proj in ("gate_proj", "up_proj"):
            a.add(f"model.layers.{i}.mlp.{proj}.weight", (inter, h), "col", "layer", i)
        a.add(f"model.layers.{i}.mlp.down_proj.weight", (h, inter), "row", "layer", i)
    a.add("model.norm.weight", (h,), "rep", "last")
    a.add("lm_head.weight", (vocab, h), "vocab", "last")
    return a


def _moe(a: Arch, prefix: str, where: str, i: int, h: int, experts: int, inter: int) -> None:
    a.add(f"{prefix}mlp.gate.weight", (experts, h), "rep", where, i)
    for e in range(experts):
        for proj in ("gate_proj", "up_proj"):
            a.add(f"{prefix}mlp.experts.{e}.{proj}.weight", (inter, h), "expert-col", where, i, e)
        a.add(f"{prefix}mlp.experts.{e}.down_proj.weight", (h, inter), "expert-row", where, i, e)


def moe(
    layers: int = 4,
    dims: tuple[int, int, int, int, int] = (128, 4, 2, 32, 512),
    experts: int = 8,
    inter: int = 64,
    *,
    lazy: bool = False,
) -> Arch:
    """Qwen3-MoE-like: attention with q/k norms and routed experts (top 2); ``dims`` = hidden, heads, KV
    heads, head dim, vocab. The defaults: 4 layers, 8 experts."""
    h, heads, kv, hd, vocab = dims
    a = Arch(
        {
            "architectures": ["Qwen3MoeForCausalLM"],
            "model_type": "qwen3_moe",
            **_cfg(layers, h, heads, kv, hd, vocab, intermediate_size=256, moe_intermediate_size=inter),
            "num_experts": experts,
            "num_experts_per_tok": 2,
            "torch_dtype": "bfloat16",
            "tie_word_embeddings": False,
        },
        lazy=lazy,
    )
    a.add("model.embed_tokens.weight", (vocab, h), "vocab", "first")
    for i in range(layers):
        p = f"model.layers.{i}."
        a.add(p + "input_layernorm.weight", (h,), "rep", "layer", i)
        _attn(a, p, "layer", i, (h, heads, kv, hd))
        a.add(p + "self_attn.q_norm.weight", (hd,), "rep", "layer", i)
        a.add(p + "self_attn.k_norm.weight", (hd,), "rep", "layer", i)
        a.add(p + "post_attention_layernorm.weight", (h,), "rep", "layer", i)
        _moe(a, p, "layer", i, h, experts, inter)
    a.add("model.norm.weight", (h,), "rep", "last")
    a.add("lm_head.weight", (vocab, h), "vocab", "last")
    return a


def hybrid_mtp(
    layers: int = 4,
    dims: tuple[int, int, int, int, int] = (128, 4, 2, 32, 512),
    experts: int = 4,
    inter: int = 64,
    *,
    interval: int = 2,
    lazy: bool = False,
) -> Arch:
    """Qwen3-Next-like: linear-attention (gated delta net) layers, full attention every ``interval``-th
    layer, MoE with a shared expert, one MTP layer under ``mtp.``, and a small vision tower. ``dims`` =
    hidden, heads, KV heads, head dim, vocab."""
    h, heads, kv, hd, vocab = dims
    nk, nv, dk, dv = 2, 4, 32, 32
    a = Arch(
        {
            "architectures": ["Qwen3NextForCausalLM"],
            "model_type": "qwen3_next",
            "text_config": {
                **_cfg(layers, h, heads, kv, hd, vocab, intermediate_size=256),
                "moe_intermediate_size": inter,
                "shared_expert_intermediate_size": 128,
                "num_experts": experts,
                "num_experts_per_tok": 2,
                "full_attention_interval": interval,
                "linear_num_key_heads": nk,
                "linear_num_value_heads": nv,
                "num_nextn_predict_layers": 1,
                "torch_dtype": "bfloat16",
            },
        },
        lazy=lazy,
    )
    a.add("model.visual.patch_embed.proj.weight", (h, 588), "rep", "vision")
    a.add("model.visual.merger.mlp.0.weight", (h, 4 * h), "rep", "vision")
    a.add("model.embed_tokens.weight", (vocab, h), "vocab", "first")

    def block(prefix: str, where: str, i: int, full: bool) -> None:
        a.add(prefix + "input_layernorm.weight", (h,), "rep", where, i)
        if full:
            _attn(a, prefix, where, i, (h, heads, kv, hd), gate=2)  # Qwen3-Next's q_proj carries the gate
            a.add(prefix + "self_attn.q_norm.weight", (hd,), "rep", where, i)
            a.add(prefix + "self_attn.k_norm.weight", (hd,), "rep", where, i)
        else:
            p = prefix + "linear_attn."
            a.add(p + "in_proj_qkvz.weight", (2 * nk * dk + 2 * nv * dv, h), "col", where, i)
            a.add(p + "in_proj_ba.weight", (2 * nv, h), "col", where, i)
            a.add(p + "conv1d.weight", (2 * nk * dk + nv * dv, 1, 4), "col", where, i)
            a.add(p + "A_log", (nv,), "col", where, i)
            a.add(p + "dt_bias", (nv,), "col", where, i)
            a.add(p + "norm.weight", (dv,), "rep", where, i)
            a.add(p + "out_proj.weight", (h, nv * dv), "row", where, i)
        a.add(prefix + "post_attention_layernorm.weight", (h,), "rep", where, i)
        _moe(a, prefix, where, i, h, experts, inter)
        a.add(prefix + "mlp.shared_expert.gate_proj.weight", (128, h), "col", where, i)
        a.add(prefix + "mlp.shared_expert.up_proj.weight", (128, h), "col", where, i)
        a.add(prefix + "mlp.shared_expert.down_proj.weight", (h, 128), "row", where, i)
        a.add(prefix + "mlp.shared_expert_gate.weight", (1, h), "rep", where, i)

    for i in range(layers):
        block(f"model.layers.{i}.", "layer", i, full=(i + 1) % interval == 0)
    a.add("model.norm.weight", (h,), "rep", "last")
    a.add("lm_head.weight", (vocab, h), "vocab", "last")
    a.add("mtp.fc.weight", (h, 2 * h), "col", "mtp")
    a.add("mtp.pre_fc_norm_embedding.weight", (h,), "rep", "mtp")
    a.add("mtp.pre_fc_norm_hidden.weight", (h,), "rep", "mtp")
    block("mtp.layers.0.", "mtp", -1, full=True)
    a.add("mtp.norm.weight", (h,), "rep", "mtp")
    return a


def loaded_bytes(t: T, r: int, tp: int, *, ep: bool, kv_heads: int, head_dim: int, experts: int) -> int:
    """Bytes of ``t`` that TP rank ``r`` of its stage loads, by slicing the array."""
    arr = t.array
    split = t.split
    if split.startswith("expert-"):
        if ep:
            per = experts // tp
            return arr.nbytes if t.expert // per == r else 0
        split = split.removeprefix("expert-")
    if split == "rep" or tp == 1:
        return arr.nbytes
    if split == "kv" and tp > kv_heads:
        head = r * kv_heads // tp
        return arr[head * head_dim : (head + 1) * head_dim].nbytes
    if split in ("col", "kv", "vocab"):
        n = arr.shape[0] // tp
        return arr[r * n : (r + 1) * n].nbytes
    if split == "row":
        n = arr.shape[1] // tp
        return arr[:, r * n : (r + 1) * n].nbytes
    raise AssertionError(split)


def expected(
    a: Arch, tp: int, stage_of: list[int], *, ep: bool = False, mtp: bool = False, vision: bool = True
) -> list[int]:
    """Per global rank (stage × tp + tp rank): the bytes it loads; ``stage_of[i]``: layer i's stage."""
    pp = max(stage_of) + 1
    text = {**a.config, **a.config.get("text_config", {})}
    kw = {"ep": ep, "kv_heads": text["num_key_value_heads"], "head_dim": text["head_dim"]}
    out = [0] * (tp * pp)
    for t in a.tensors:
        if (t.where == "mtp" and not mtp) or (t.where == "vision" and not vision):
            continue
        stage = {"first": 0, "vision": 0, "last": pp - 1, "mtp": pp - 1}.get(t.where)
        if stage is None:
            stage = stage_of[t.layer]
        for r in range(tp):
            out[stage * tp + r] += loaded_bytes(t, r, tp, experts=text.get("num_experts", 0), **kw)
    return out


# -- header-only synthetic checkpoints ---------------------------------------------------------------------


def header_only(tensors: list[tuple[str, str, tuple[int, ...]]]) -> tuple[bytes, int]:
    """A safetensors file that is all header: offsets declare the data, none of it is there.
    Returns (file bytes, declared data bytes)."""
    hdr: dict[str, Any] = {"__metadata__": {"format": "pt", "synthetic": "header-only"}}
    off = 0
    for name, dtype, shape in tensors:
        n = DTYPE_BYTES[dtype] * int(np.prod(shape, dtype=np.int64))
        hdr[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    text = json.dumps(hdr, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text, off


def large_header_only(shards: int, per_shard: int = 1500) -> tuple[dict[str, bytes], int]:
    """A MoE-shaped checkpoint whose headers declare 16 GiB per shard; no weight byte exists."""
    files: dict[str, bytes] = {}
    weight_map: dict[str, str] = {}
    declared = 0
    for k in range(shards):
        name = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        tensors = [
            (f"model.layers.{k}.mlp.experts.{e}.{p}.weight", "BF16", (2048, 2048))
            for e in range(per_shard // 3)
            for p in ("gate_proj", "up_proj", "down_proj")
        ]
        files[name], n = header_only(tensors)
        declared += n
        weight_map.update(dict.fromkeys((t[0] for t in tensors), name))
    cfg = {
        "num_hidden_layers": shards,
        "hidden_size": 2048,
        "num_attention_heads": 16,
        "num_key_value_heads": 4,
        "vocab_size": 151936,
        "num_experts": per_shard // 3,
        "moe_intermediate_size": 2048,
    }
    files["config.json"] = json.dumps(cfg).encode()
    files["model.safetensors.index.json"] = json.dumps({"weight_map": weight_map}).encode()
    return files, declared


# -- a deployment around a test checkpoint ---------------------------------------------------------------


def make_spec(
    tmp_path: Path, args: list[str], env: dict[str, str] | None = None, **model: Any
) -> specmod.Deployment:
    """Seed 003's spec with the model and the recipe's argv and env replaced."""
    data = specmod.to_data(specmod.load(REPO / "deployments" / "flash-next-merlin-4x3090.yaml"))
    data["name"] = "fit-t"
    data["model"] = {"local_dir": str(tmp_path / "models" / "fit-t"), **model}
    data["engine"]["args"] = ["/models/fit-t", *args]
    data["engine"]["model_arg"] = 0
    data["env"] = [{"name": k, "value": v} for k, v in (env or {}).items()]
    return specmod.from_data(data)


# -- stand-ins for the seeds' models (header-only, shapes from their notes) --------------------------------


def seed000_like() -> Arch:
    """Seed 000's model as fit sees it with vision and MTP off: 48 MoE layers (64 experts, top 8) whose
    declared sizes make the heaviest of three PP stages load 21.55 GiB, the published "Weights load 21.55
    GiB/rank". Hidden 2048, 16 heads over 2 KV heads of 128, vocab 151936."""
    return moe(48, (2048, 16, 2, 128, 151936), experts=64, inter=1765, lazy=True)


def seed003_like() -> Arch:
    """Seed 003's Qwen3-Next-style hybrid: 48 layers, full attention every 4th (16 heads over 2 KV heads
    of 256), 32 routed experts and a shared expert per layer, one MTP layer, a vision tower; vocab 151936.
    Expert sizes make TP2×PP2 with ``VLLM_PP_LAYER_PARTITION=25,23`` and MTP load ~18.4 GiB on the heavier
    stage, so seed 003's 4.1 GB KV pool fits a 24 GiB card as it did on the seed's rig."""
    return hybrid_mtp(48, (2048, 16, 2, 256, 151936), experts=32, inter=3904, interval=4, lazy=True)


def seed000_roomy(inter: int = 1600) -> Arch:
    """``seed000_like`` with narrower experts (~19.6 GiB on the heaviest of three stages): room on a 24 GiB
    card for what a recipe that keeps vLLM's default 256 sequences needs beside the weights (the sampler's
    fp32 buffers on the last stage), which seed 000 itself avoids with --max-num-seqs 4."""
    return moe(48, (2048, 16, 2, 128, 151936), experts=64, inter=inter, lazy=True)
