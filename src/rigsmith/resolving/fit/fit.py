# Over 500 lines: the checkpoint shape, tensor placement and the per-rank estimate are one count.
"""Fit before you fetch: what each vLLM rank of a recipe needs in GPU memory, from checkpoint metadata alone.

Pure: the checkpoint's config.json (a dict), its safetensors headers (tensor name + byte size, one file at a
time), the recipe's argv and env, and doctor's HostFacts go in; per-rank numbers and per-GPU verdicts come
out. Reading headers is ``rigsmith.resolving.fit.checkpoint``'s job.

What is exact and what is an estimate:

- **Weights** are exact byte counts from the headers (``data_offsets`` end − begin), placed the way vLLM
  places them: decoder layers split over pipeline stages like ``vllm.distributed.utils.get_pp_indices``
  (even split, the remainder on the stages before the last; ``VLLM_PP_LAYER_PARTITION`` overrides);
  embeddings on the first stage, final norm and LM head on the last; column-/row-parallel linear weights
  and vocab-parallel embeddings split over TP (vocab padded to 64 as ``pad_vocab_size`` does; K/V heads
  replicated when TP exceeds them); norms, routers and row-parallel biases replicated; experts either
  TP-sharded or, with ``--enable-expert-parallel``, whole on the rank vLLM's linear expert map gives them;
  MTP modules on the last stage only when ``--speculative-config`` asks for MTP; vision towers on the
  first stage unless ``--language-model-only``.
- **KV cache**: ``--kv-cache-memory`` when given (vLLM then ignores the utilisation for the KV pool),
  else what ``--gpu-memory-utilization`` × PyTorch's total leaves after weights, the profile's activations,
  memory outside PyTorch and (engines from v0.21) CUDA graphs, by the rules of the engine's version
  (``rigsmith.resolving.fit.fitengine``, docs/fit.md, held against published boot logs).
  Tokens = whole blocks of ``--block-size`` over the attention layers of the rank, min over ranks, as
  vLLM reports "GPU KV cache size". Linear-attention / Mamba state is not modelled.
- **Estimates**, named in the table: the activation peak of vLLM's profile run, CUDA-graph memory, memory
  outside PyTorch, and the runtime (CUDA context + NCCL buffers) allocated before vLLM takes its memory
  snapshot. vLLM refuses to start when free memory after that runtime is below utilisation × total ("Free
  memory on device … is less than desired GPU memory utilization"): that is how a 256 MiB squatter breaks
  rank 0 at 0.97 (seed 000); and when the pool holds less than one request of the context (``outcome``).
"""

from __future__ import annotations

import bisect
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from rigsmith.resolving.fit import fitengine
from rigsmith.resolving.fit.fitparams import DEFAULTS as DEFAULTS
from rigsmith.resolving.fit.fitparams import EngineParams as EngineParams
from rigsmith.resolving.fit.fitparams import FitError as FitError
from rigsmith.resolving.fit.fitparams import engine_params as engine_params
from rigsmith.resolving.fit.fitparams import expert_owner as expert_owner
from rigsmith.resolving.fit.fitparams import parse_bytes as parse_bytes
from rigsmith.resolving.fit.fitparams import pp_partition as pp_partition
from rigsmith.spec import Deployment

GiB = 1024**3
MiB = 1024**2

#: Estimates (each shows in the table as "est."). Sources: CUDA 12 + PyTorch context on Ampere/Hopper is
#: 300-500 MiB (cuBLAS workspaces and kernel images included); NCCL's buffers for a TP/PP communicator are
#: ~100-200 MiB; vLLM logs CUDA-graph capture at a few hundred MiB for its default capture sizes.
CUDA_CONTEXT = 400 * MiB
NCCL_BUFFERS = 128 * MiB
CUDA_GRAPHS = 256 * MiB
#: A rank closer than this to the card's limit is "warn": the estimates above are not better than that.
WARN_HEADROOM = 512 * MiB

VOCAB_PAD = 64  # vllm/model_executor/layers/vocab_parallel_embedding.py DEFAULT_VOCAB_PADDING_SIZE

KV_DTYPE_BYTES = {
    "auto": None,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "fp8_inc": 1,
    "bfloat16": 2,
    "float16": 2,
}
TORCH_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "float": 4, "half": 2}

# Which linear layers vLLM builds as column-parallel (output split), row-parallel (input split) or
# replicated, by module name (vllm/model_executor/models/{llama,qwen3_moe,qwen3_next,deepseek_v2}.py).
COLUMN = frozenset(
    {
        "q_proj",
        "k_proj",
        "v_proj",
        "qkv_proj",
        "query_key_value",
        "gate_proj",
        "up_proj",
        "gate_up_proj",
        "w1",
    }
    | {"w3", "c_fc", "fc1", "q_b_proj", "kv_b_proj", "in_proj", "in_proj_qkvz", "in_proj_ba", "in_proj_qkv"}
    | {"conv1d", "fc"}  # fc: Qwen3-Next MTP's ColumnParallelLinear(2h → h, gather_output=True)
)
ROW = frozenset(["o_proj", "down_proj", "out_proj", "w2", "dense", "c_proj", "fc2"])
#: What vLLM's online fp8 quantises (``--quantization fp8``); the embedding and the LM head stay 16-bit.
LINEAR = (COLUMN | ROW) - {"conv1d"}
HEAD_PARAMS = frozenset({"A_log", "dt_bias"})  # per-head parameters of linear attention: split by heads
EMBED = frozenset({"embed_tokens", "wte", "word_embeddings", "tok_embeddings"})
_VISION = re.compile(
    r"(?:^|\.)(?:visual\.|vision_tower\.|vision_model\.|multi_modal_projector\.|mm_projector\.|vision_)"
)
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")
_EXPERT = re.compile(r"\.experts\.(\d+)\.")
_FINAL_NORM = re.compile(r"^(?:model\.)?(?:language_model\.)?(?:model\.)?(?:norm|final_layernorm|ln_f)\.")

#: Reasons a tensor is left off the GPU (keys of ``Estimate.skipped``).
SKIP_VISION = "vision tower (--language-model-only)"
SKIP_MTP = "MTP module (no --speculative-config method mtp)"

Category = Literal["embed", "layers", "experts", "head", "mtp", "vision", "other"]
CATEGORIES: tuple[Category, ...] = ("embed", "layers", "experts", "head", "mtp", "vision", "other")


# -- the checkpoint's shape ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelShape:
    """What config.json says about the language model (``text_config`` wins for multimodal checkpoints)."""

    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    intermediate_size: int = 0
    num_experts: int = 0
    moe_intermediate_size: int = 0
    experts_per_token: int = 0
    mtp_layers: int = 0
    attention_layers: tuple[int, ...] = ()  # layers with a KV cache (full or sliding attention)
    sliding_layers: tuple[int, ...] = ()  # those of them that attend to a window only
    sliding_window: int = 0
    kv_lora_rank: int = 0  # MLA (DeepSeek): latent KV per token instead of K and V heads
    rope_head_dim: int = 0
    tie_word_embeddings: bool = False
    dtype_bytes: int = 2
    max_position_embeddings: int | None = None
    quantization: str | None = None

    @classmethod
    def from_config(cls, config: Mapping[str, Any], where: str = "config.json") -> ModelShape:
        """Read the fields vLLM reads. A config.json comes from the Hub repo, so every value is checked: a
        missing essential field, a value of the wrong type or out of range is one FitError naming the key."""
        nested = next((k for k in ("text_config", "language_config") if config.get(k) is not None), None)
        sub = config.get(nested) if nested else {}
        if not isinstance(sub, Mapping):
            raise FitError(f"{where}: {nested} is {type(sub).__name__}, not an object", hint=_CONFIG_HINT)
        text = {**config, **sub}

        def first(*keys: str, default: Any = None) -> tuple[str, Any]:
            for k in keys:
                if text.get(k) is not None:
                    return k, text[k]
            return keys[0], default

        def num(*keys: str, lo: int = 0, hi: int = 1 << 24, default: int | None = None) -> int:
            key, v = first(*keys, default=default)
            if v is None:
                raise FitError(f"{where}: no {keys[0]} (also looked in text_config)", hint=_CONFIG_HINT)
            if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
                raise FitError(
                    f"{where}: {key} is {v!r}, not a whole number from {lo} to {hi}", hint=_CONFIG_HINT
                )
            return v

        essential = (("num_hidden_layers", "n_layer", "num_layers"), ("hidden_size", "d_model", "n_embd"),
                     ("num_attention_heads", "n_head"), ("vocab_size",))  # fmt: skip
        missing = [keys[0] for keys in essential if first(*keys)[1] is None]
        if missing:
            raise FitError(
                f"{where}: no {', '.join(missing)} (also looked in text_config)", hint=_CONFIG_HINT
            )
        layers = num("num_hidden_layers", "n_layer", "num_layers", lo=1, hi=MAX_LAYERS)
        hidden = num("hidden_size", "d_model", "n_embd", lo=1)
        heads = num("num_attention_heads", "n_head", lo=1, hi=1 << 16)
        vocab = num("vocab_size", lo=1, hi=1 << 28)
        kv = num("num_key_value_heads", "multi_query_group_num", lo=1, hi=heads, default=heads)
        _, types = first("layer_types")
        interval = num("full_attention_interval", default=0, hi=MAX_LAYERS)
        sliding: tuple[int, ...] = ()
        if isinstance(types, list) and len(types) >= layers:
            attn = tuple(
                i for i, t in enumerate(types[:layers]) if "attention" in str(t) and "linear" not in str(t)
            )
            sliding = tuple(i for i in attn if "sliding" in str(types[i]))
        elif interval > 0:
            attn = tuple(i for i in range(layers) if (i + 1) % interval == 0)
        else:
            attn = tuple(range(layers))
        quant = config.get("quantization_config") or text.get("quantization_config") or {}
        experts = num("num_experts", "num_local_experts", "n_routed_experts", default=0, hi=1 << 16)
        _, max_pos = first("max_position_embeddings")
        _, dtype = first("torch_dtype", "dtype", default="bfloat16")
        return cls(
            num_layers=layers,
            hidden_size=hidden,
            num_heads=heads,
            num_kv_heads=kv,
            head_dim=num("head_dim", lo=1, hi=1 << 16, default=max(1, hidden // heads)),
            vocab_size=vocab,
            intermediate_size=num("intermediate_size", "ffn_hidden_size", default=0),
            num_experts=experts,
            moe_intermediate_size=num("moe_intermediate_size", default=0),
            experts_per_token=num("num_experts_per_tok", "moe_topk", default=0, hi=max(experts, 1 << 10)),
            mtp_layers=num("num_nextn_predict_layers", "mtp_num_hidden_layers", default=0, hi=64),
            attention_layers=attn,
            sliding_layers=sliding,
            sliding_window=num("sliding_window", default=0, hi=1 << 30) if sliding else 0,
            kv_lora_rank=num("kv_lora_rank", default=0),
            rope_head_dim=num("qk_rope_head_dim", default=0, hi=1 << 16),
            tie_word_embeddings=first("tie_word_embeddings", default=False)[1] is True,
            dtype_bytes=TORCH_DTYPE_BYTES.get(str(dtype), 2),
            max_position_embeddings=num("max_position_embeddings", lo=1, hi=1 << 40)
            if max_pos is not None
            else None,
            quantization=str(quant.get("quant_method")) if isinstance(quant, dict) and quant else None,
        )


#: The most layers a config.json may declare (the largest published models have ~128): a hostile value
#: must not make fit build a trillion-entry tuple.
MAX_LAYERS = 4096
_CONFIG_HINT = "fit needs the checkpoint's config.json as transformers writes it; check the repo"


# -- placing tensors on ranks -----------------------------------------------------------------------------


@dataclass
class Placement:
    """Per-rank weight bytes by category, accumulated one tensor at a time (memory stays flat)."""

    shape: ModelShape
    params: EngineParams
    bytes: list[dict[str, int]] = field(default_factory=list)
    tensors: int = 0
    skipped: dict[str, int] = field(default_factory=dict)  # reason → bytes left off the GPU
    unknown: list[str] = field(default_factory=list)  # names placed by the fallback rule (first few)
    _stages: list[tuple[int, int]] = field(default_factory=list)
    _owner: list[int] = field(default_factory=list)
    lm_head_seen: bool = False
    embed_rank_bytes: int = 0

    def __post_init__(self) -> None:
        p, s = self.params, self.shape
        self.bytes = [dict.fromkeys(CATEGORIES, 0) for _ in range(p.world)]
        self._stages = pp_partition(s.num_layers, p.pp, p.pp_partition)
        if s.num_experts and p.expert_parallel:
            self._owner = expert_owner(s.num_experts, p.tp)

    def stage_of(self, layer: int) -> int:
        # a binary search: the layout search places with one stage per layer (resolving/fit/layout.py)
        i = bisect.bisect_right(self._stages, layer, key=lambda st: st[0]) - 1
        return i if 0 <= i < len(self._stages) and layer < self._stages[i][1] else self.params.pp - 1

    def _put(self, stage: int, cat: Category, per_tp: Sequence[int]) -> None:
        for t, n in enumerate(per_tp):
            self.bytes[stage * self.params.tp + t][cat] += n

    def add(self, name: str, nbytes: int, shape: Sequence[int]) -> None:
        """Account one tensor of the checkpoint."""
        self.tensors += 1
        p, s = self.params, self.shape
        tp, last = p.tp, p.pp - 1
        parts = name.split(".")
        module = parts[-2] if len(parts) > 1 else ""
        param = parts[-1]
        if s.quantization == "mxfp4" and module == "experts":
            inter = s.moe_intermediate_size or s.intermediate_size
            nbytes = fitengine.mxfp4_loaded(param, nbytes, s.hidden_size, inter)
        elif p.quantization == "fp8" and s.quantization is None and param == "weight" and module in LINEAR:
            nbytes = math.prod(shape)  # --quantization fp8 of a 16-bit checkpoint: e4m3, a byte an element
        if _VISION.search(name):
            if p.language_model_only:
                why = SKIP_VISION
                self.skipped[why] = self.skipped.get(why, 0) + nbytes
                return
            self._put(0, "vision", [nbytes] * tp)
            return
        m = _LAYER.search(name)
        stage: int | None = None
        cat: Category = "layers"
        if name.startswith("mtp.") or ".mtp." in name or (m is not None and int(m.group(1)) >= s.num_layers):
            if not p.mtp:
                why = SKIP_MTP
                self.skipped[why] = self.skipped.get(why, 0) + nbytes
                return
            stage, cat = last, "mtp"
        elif m is not None:
            stage, cat = self.stage_of(int(m.group(1))), "experts" if ".experts." in name else "layers"
        if stage is not None:
            e = _EXPERT.search(name)
            if e is not None and self._owner:
                idx = int(e.group(1))
                owner = self._owner[idx] if idx < len(self._owner) else 0
                self._put(stage, cat, [nbytes if t == owner else 0 for t in range(tp)])
            elif ".experts." in name and self._owner and shape and shape[0] == s.num_experts:
                row = nbytes // s.num_experts  # fused expert tensor [E, …]: each EP rank holds its experts
                self._put(stage, cat, [row * self._owner.count(t) for t in range(tp)])
            else:
                # a fused expert tensor (`experts.gate_up_proj`) is named after its projection
                mod = param if module == "experts" else module
                self._put(stage, cat, self._tp_split(mod, param, nbytes, shape))
            return
        if module in EMBED:
            self.embed_rank_bytes = self._vocab_split(nbytes, shape)
            self._put(0, "embed", [self.embed_rank_bytes] * tp)
            if s.tie_word_embeddings and p.pp > 1:
                self._put(last, "head", [self.embed_rank_bytes] * tp)  # the last stage's own lm_head copy
            return
        if module == "lm_head" or (module == "head" and "shared_head" not in name):
            self.lm_head_seen = True
            if s.tie_word_embeddings:
                return  # vLLM ties it to the embedding (counted there) and skips the checkpoint's copy
            self._put(last, "head", [self._vocab_split(nbytes, shape)] * tp)
            return
        if _FINAL_NORM.match(name):
            self._put(last, "head", [nbytes] * tp)
            return
        if len(self.unknown) < 8:
            self.unknown.append(name)
        self._put(0, "other", [nbytes] * tp)

    def _vocab_split(self, nbytes: int, shape: Sequence[int]) -> int:
        """One TP rank's rows of a vocab-parallel table, vocab padded to a multiple of 64 as vLLM pads it."""
        rows = shape[0] if shape else 1
        per_row = nbytes // rows if rows else nbytes
        padded = -(-rows // VOCAB_PAD) * VOCAB_PAD
        return per_row * (padded // self.params.tp)

    def _tp_split(self, module: str, param: str, nbytes: int, shape: Sequence[int]) -> list[int]:
        tp, s = self.params.tp, self.shape
        numel = math.prod(shape) if shape else 1
        if tp == 1:
            return [nbytes]
        if numel <= 1 or param == "weight_shape":
            return [nbytes] * tp
        if param in HEAD_PARAMS or module == "conv1d":
            return [nbytes // tp] * tp
        if module in COLUMN:
            rows = shape[0] if shape else 0
            kvh = s.num_kv_heads
            if module in ("k_proj", "v_proj") and tp > kvh and rows == kvh * s.head_dim:
                return [nbytes // kvh] * tp  # one replicated K/V head per rank
            if module == "qkv_proj" and tp > kvh and rows == (s.num_heads + 2 * kvh) * s.head_dim:
                per_row = nbytes // rows
                return [per_row * (s.num_heads // tp + 2) * s.head_dim] * tp
            return [nbytes // tp] * tp
        if module in ROW:
            if param == "bias" or (len(shape) >= 2 and shape[-1] == 1):
                return [nbytes] * tp  # row-parallel bias and per-output-channel scales are whole on each rank
            return [nbytes // tp] * tp
        return [nbytes] * tp  # norms, routers, replicated linears

    def weights(self, rank: int) -> int:
        return sum(self.bytes[rank].values())


# -- the per-rank estimate ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class RankNeed:
    """What one rank (pp stage × tp shard) needs, in bytes."""

    rank: int
    pp_rank: int
    tp_rank: int
    weights: int
    by_category: dict[str, int]
    kv_bytes_per_token: int
    activation: int  # estimate
    cuda_graphs: int  # estimate
    runtime: int  # estimate: CUDA context + NCCL, allocated before vLLM's memory snapshot
    non_torch: int = 0  # estimate: memory outside PyTorch the profile measures (cuBLAS, NCCL): off the pool
    window_bytes_per_token: int = 0  # the part of kv_bytes_per_token on layers that hold only a window


@dataclass(frozen=True)
class Estimate:
    """Per-rank needs of one recipe on one checkpoint, before any GPU is looked at."""

    shape: ModelShape
    params: EngineParams
    ranks: tuple[RankNeed, ...]
    stages: tuple[tuple[int, int], ...]
    tensors: int
    skipped: dict[str, int]
    unknown: tuple[str, ...]
    notes: tuple[str, ...] = ()

    @property
    def era(self) -> fitengine.EngineEra:
        return fitengine.era(self.params.vllm_version)

    @property
    def context(self) -> int | None:
        """The longest request vLLM serves: --max-model-len, else the model config's maximum."""
        return self.params.max_model_len or self.shape.max_position_embeddings

    def for_card(self, total: int, name: str = "") -> Estimate:
        """This estimate on cards like the first of a rig (``total`` bytes, nvidia-smi ``name``): V1 gives
        cards of 70 GiB and more (A100s apart) 8,192 batched tokens and 1,024 sequences where the recipe
        sets neither, and the profile's activation peak grows with them (fitengine.profile_shape); on an
        NVSwitch board a TP group's NCCL buffers come off the pool too (``_non_torch``)."""
        big, nvs = fitengine.big_card(total, name), fitengine.nvswitch_card(name)
        if (big, nvs) == (self.params.big_card, self.params.nvswitch):
            return self
        params = replace(self.params, big_card=big, nvswitch=nvs)
        ranks = tuple(
            replace(r, activation=_activation(self.shape, params, r.pp_rank == params.pp - 1),
                    non_torch=_non_torch(params))
            for r in self.ranks
        )  # fmt: skip
        return replace(self, params=params, ranks=ranks)

    def _graphs_in_pool(self, r: RankNeed) -> int:
        return r.cuda_graphs if self.era.graphs_in_pool else 0

    def _runtime_outside(self, r: RankNeed) -> int:
        """The runtime vLLM allocates before its memory snapshot: outside the budget (V1); V0 measured its
        peak as total − free, so the CUDA context is part of the memory outside PyTorch there."""
        return 0 if self.era.context_in_budget else r.runtime

    def kv_budget(self, r: RankNeed, total: int) -> int:
        """KV pool of one rank on a card of nvidia-smi ``total`` bytes (explicit, or what the utilisation of
        PyTorch's total leaves after weights, the profile's activation peak and memory outside PyTorch)."""
        if self.params.kv_cache_memory is not None:
            return self.params.kv_cache_memory
        budget = int(fitengine.torch_total(total) * self.params.gpu_memory_utilization)
        left = budget - r.weights - r.activation - r.non_torch - self._graphs_in_pool(r)
        return max(left, 0)

    def usage(self, r: RankNeed, total: int) -> tuple[int, int, int]:
        """(KV pool, the rank's peak inside its budget, needs) on a card of ``total`` bytes.

        The peak is the larger of the profile run (weights, memory outside PyTorch, activations) and the
        engine once its pool and CUDA graphs are in (the profile's activations are given back first: graphs
        captured after the pool, before v0.21, use that room). needs = what the driver keeps + the runtime +
        the larger of utilisation × PyTorch's total (vLLM wants it free at start) and that peak."""
        kv = self.kv_budget(r, total)
        inside = r.weights + r.non_torch + max(r.activation, kv + r.cuda_graphs)
        tt = fitengine.torch_total(total)
        budget = int(tt * self.params.gpu_memory_utilization)
        return kv, inside, total - tt + self._runtime_outside(r) + max(budget, inside)

    def outside_pool(self, r: RankNeed, total: int) -> int:
        """Bytes rank ``r`` takes on a card of ``total`` bytes next to a fixed (``--kv-cache-memory``) pool:
        what the driver keeps, the runtime, weights, memory outside PyTorch and CUDA graphs. The profile's
        activation peak comes and goes before the pool is allocated (``usage``)."""
        kept = total - fitengine.torch_total(total)
        return kept + self._runtime_outside(r) + r.weights + r.non_torch + r.cuda_graphs

    def free_at_start(self, r: RankNeed, total: int) -> int:
        """Of a card of ``total`` bytes, what can be free for the utilisation: all but what the driver keeps
        and the runtime."""
        return fitengine.torch_total(total) - self._runtime_outside(r)

    def request_bytes(self, r: RankNeed, tokens: int) -> int:
        """KV bytes one request of ``tokens`` tokens takes on rank ``r``: whole blocks, a sliding-window
        layer only its window and a block where the engine keeps a window (point 6)."""
        block = self.params.block_size
        whole = -(-tokens // block) * block
        window = self.shape.sliding_window + block if r.window_bytes_per_token else whole
        held = -(-min(whole, window) // block) * block
        return (r.kv_bytes_per_token - r.window_bytes_per_token) * whole + r.window_bytes_per_token * held

    def outcome(self, totals: Sequence[int]) -> tuple[str, str]:
        """What vLLM does at boot on idle cards of ``totals`` bytes: ("starts", "") or ("refuses" or "oom",
        why). The checks vLLM makes, in its order: a KV pool at all, one request of the context in it,
        then the engine's peak (CUDA graphs captured after the pool included) on the card."""
        for r, total in zip(self.ranks, totals, strict=True):
            kv, _, needs = self.usage(r, total)
            if r.kv_bytes_per_token and kv <= 0:
                return "refuses", f"rank {r.rank}: no memory left for the KV cache"
            ctx = self.context
            if ctx and r.kv_bytes_per_token and kv < self.request_bytes(r, ctx):
                return "refuses", f"rank {r.rank}: the KV pool holds less than one {ctx:,}-token request"
            if needs > total:
                return "oom", f"rank {r.rank}: needs {needs / GiB:.2f} GiB of a {total / GiB:.2f} GiB card"
        return "starts", ""

    def kv_tokens(self, totals: Sequence[int]) -> int | None:
        """vLLM's "GPU KV cache size: N tokens": whole blocks per rank, the smallest rank decides."""
        out = None
        for r, total in zip(self.ranks, totals, strict=True):
            if r.kv_bytes_per_token == 0:
                continue
            block = r.kv_bytes_per_token * self.params.block_size
            tokens = self.kv_budget(r, total) // block * self.params.block_size
            out = tokens if out is None else min(out, tokens)
        return out


def _kv_per_token(shape: ModelShape, params: EngineParams, layers: Iterable[int], extra_layers: int) -> int:
    b = KV_DTYPE_BYTES.get(params.kv_cache_dtype) or (1 if params.kv_cache_dtype.startswith("fp8") else None)
    b = b or (shape.dtype_bytes if shape.dtype_bytes <= 2 else 2)
    n = sum(1 for _ in layers) + extra_layers
    if shape.kv_lora_rank:
        return n * (shape.kv_lora_rank + shape.rope_head_dim) * b  # MLA: one latent, not split over TP
    heads = max(1, shape.num_kv_heads // params.tp)
    return n * 2 * heads * shape.head_dim * b


def _non_torch(params: EngineParams) -> int:
    """Memory outside PyTorch the profile takes off the pool: the engine's (fitengine.EngineEra), and in V1
    NCCL's NVLS buffers for a TP group on an NVSwitch board (fitengine.NVLS_BUFFERS)."""
    era = fitengine.era(params.vllm_version)
    nvls = fitengine.NVLS_BUFFERS if era.v1 and params.tp > 1 and params.nvswitch else 0
    return era.non_torch + nvls


def _activation(shape: ModelShape, params: EngineParams, last_stage: bool) -> int:
    """Estimate of vLLM's profile-run peak: T tokens through one layer (hidden states, residual, QKV, the MLP
    or the routed experts' intermediate) at 16 bits, and on the last stage the sampler's fp32 [sequences,
    vocab] buffers: added to the forward pass (V0), or after it, next to its output hidden states, the larger
    of the two (V1); T and the sequences as the engine of ``params.vllm_version`` picks them (fitengine)."""
    era = fitengine.era(params.vllm_version)
    batched = params.max_num_batched_tokens if "max_num_batched_tokens" in params.given else None
    seqs = params.max_num_seqs if "max_num_seqs" in params.given else None
    context = params.max_model_len or shape.max_position_embeddings or 2048
    t, seqs = fitengine.profile_shape(era, context, batched, seqs, params.big_card)
    ffn = max(shape.intermediate_size, shape.experts_per_token * shape.moe_intermediate_size)
    qkv = (shape.num_heads + 2 * shape.num_kv_heads) * shape.head_dim
    per_token = 4 * shape.hidden_size + (qkv + 2 * ffn) // params.tp
    if shape.num_experts:
        per_token += shape.experts_per_token * shape.hidden_size  # the fused MoE's [T, top-k, hidden] output
    forward = t * per_token * 2
    if not last_stage:
        return forward
    vocab = shape.vocab_size if era.v1 else shape.vocab_size // params.tp  # V0 gathers to one rank
    sampler = int(era.sampler_buffers * min(seqs, t) * vocab * 4)
    if era.sampler_after_forward:
        return max(forward, sampler + t * shape.hidden_size * 2)
    return forward + sampler


def estimate(
    shape: ModelShape, params: EngineParams, headers: Iterable[tuple[str, int, Sequence[int]]]
) -> Estimate:
    """Place every (name, nbytes, shape) of the checkpoint and add the named allowances. ``headers`` is
    consumed once, lazily: pass a generator over the files and memory stays a few files' headers."""
    if params.tp < 1 or params.pp < 1:
        raise FitError(f"tensor/pipeline parallel sizes must be ≥ 1 (got TP={params.tp}, PP={params.pp})")
    if params.pp > shape.num_layers:
        raise FitError(
            f"PP={params.pp} stages for {shape.num_layers} layers", hint="lower --pipeline-parallel-size"
        )
    place = Placement(shape, params)
    for name, nbytes, tshape in headers:
        place.add(name, nbytes, tshape)
    placed = Placed(place.bytes, place.tensors, place.skipped, tuple(place.unknown), place.lm_head_seen)
    return from_placed(shape, params, placed)


@dataclass(frozen=True)
class Placed:
    """Where the checkpoint's bytes went: per global rank, by category (``Placement.bytes``)."""

    bytes: list[dict[str, int]]
    tensors: int
    skipped: dict[str, int]
    unknown: tuple[str, ...]
    lm_head_seen: bool


def from_placed(shape: ModelShape, params: EngineParams, placed: Placed) -> Estimate:
    """The per-rank estimate of placed weights: the named allowances added rank by rank. ``estimate`` and
    the layout search (``resolving.fit.layout``) both end here, so their per-rank figures are one count."""
    if placed.tensors == 0:
        raise FitError(
            "the checkpoint has no safetensors tensors", hint="fit reads .safetensors headers only"
        )
    notes = []
    if shape.tie_word_embeddings and params.pp > 1 and not placed.lm_head_seen:
        notes.append("tied embeddings: the last stage holds its own copy of the embedding as LM head")
    if params.draft_model:
        notes.append(
            f"draft model {params.draft_model} is not counted (only MTP modules of this checkpoint are)"
        )
    if len(shape.attention_layers) < shape.num_layers:
        notes.append(
            f"{shape.num_layers - len(shape.attention_layers)} linear-attention/Mamba layers: their "
            "per-sequence state is not in the KV estimate"
        )
    stages = pp_partition(shape.num_layers, params.pp, params.pp_partition)
    era = fitengine.era(params.vllm_version)
    ranks = []
    for rank in range(params.world):
        pp_rank, tp_rank = divmod(rank, params.tp)
        a, b = stages[pp_rank]
        last = pp_rank == params.pp - 1
        attn = [i for i in shape.attention_layers if a <= i < b]
        mtp = shape.mtp_layers if (last and params.mtp) else 0
        window = [i for i in shape.sliding_layers if a <= i < b] if era.window_kv else []
        ranks.append(
            RankNeed(
                rank=rank,
                pp_rank=pp_rank,
                tp_rank=tp_rank,
                weights=sum(placed.bytes[rank].values()),
                by_category=dict(placed.bytes[rank]),
                kv_bytes_per_token=_kv_per_token(shape, params, attn, mtp),
                activation=_activation(shape, params, last),
                cuda_graphs=CUDA_GRAPHS if params.cuda_graphs else 0,
                runtime=CUDA_CONTEXT + (NCCL_BUFFERS if params.world > 1 else 0),
                non_torch=_non_torch(params),
                window_bytes_per_token=_kv_per_token(shape, params, window, 0),
            )
        )
    return Estimate(
        shape, params, tuple(ranks), tuple(stages), placed.tensors, dict(placed.skipped), placed.unknown,
        tuple(notes),
    )  # fmt: skip


def engine_inputs(spec: Deployment) -> EngineParams:
    """EngineParams of a deployment spec: its argv, its enabled env and the engine version its image tag
    names (``vllm/vllm-openai:v0.10.1``; none named: the newest engine's rules)."""
    params = engine_params(spec.engine.args, {e.name: e.value for e in spec.active_env()})
    return replace(params, vllm_version=fitengine.parse_version(spec.engine.image))
