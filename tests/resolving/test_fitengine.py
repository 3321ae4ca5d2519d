"""vLLM's memory rules by engine version (rigsmith.resolving.fit.fitengine): which version an image names,
which rules it gets, and what its profile run and MXFP4 repack come to."""

from __future__ import annotations

from dataclasses import replace

import pytest

from rigsmith.resolving.fit import fit, fitengine

GiB = fit.GiB


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("0.10.1+gptoss", (0, 10)),
        ("v0.6.4.post1", (0, 6)),
        ("0.15.2rc1.dev93", (0, 15)),
        ("docker.io/vllm/vllm-openai:v0.11.2", (0, 11)),
        ("vllm/vllm-openai:cu128-0.10.1", (0, 10)),
        ("vllm/vllm-openai:v0.9.2@sha256:" + "a" * 64, (0, 9)),
        ("localhost:5000/vllm/vllm-openai:v0.9.2", (0, 9)),  # a registry's port is not the tag
        ("registry.example:443/vllm-openai:0.10.1", (0, 10)),
        ("vllm/vllm-openai:latest", None),
        ("vllm/vllm-openai:gptoss", None),
        ("localhost/llama-3.1-server", None),  # a version in the name, none in the tag
        ("localhost/llama-3.1-server:1", None),
        ("vllm/vllm-openai@sha256:" + "b" * 64, None),
        ("", None),
        (None, None),
    ],
)
def test_the_engine_version_comes_from_the_tag_or_the_version_string(
    text: str | None, want: tuple[int, int] | None
) -> None:
    assert fitengine.parse_version(text) == want


def test_each_version_gets_its_engines_rules_and_no_version_the_newest() -> None:
    assert fitengine.era((0, 6)).name == "V0" and fitengine.era((0, 6)).context_in_budget
    assert fitengine.era((0, 8)).v1 and not fitengine.era((0, 9)).window_kv
    assert fitengine.era((0, 10)).window_kv and not fitengine.era((0, 20)).graphs_in_pool
    assert fitengine.era((0, 21)).graphs_in_pool and fitengine.era(None) is fitengine.LATEST
    assert fitengine.era((2, 5)) is fitengine.LATEST


@pytest.mark.parametrize("version", [(0, 6), (0, 8), (0, 9), (0, 10), (0, 20)])
def test_cuda_graphs_are_captured_after_the_pool_until_v0_21(version: tuple[int, int]) -> None:
    assert not fitengine.era(version).graphs_in_pool
    assert fitengine.era((0, 21)).graphs_in_pool and fitengine.era((1, 0)).graphs_in_pool


def test_each_engine_era_changes_only_the_rules_the_docstring_names_for_it() -> None:
    """0.8 brings V1 (points 2 and 3), 0.10 the hybrid KV manager (point 6), 0.19 the sampler without a sort
    (3.75 buffers where there were 9.5, point 2), 0.21 graphs profiled inside the pool (point 5): every other
    number is carried over from the era before."""
    _v0, v1, hybrid, lighter, graphs = fitengine.ERAS
    assert [e.since for e in fitengine.ERAS] == [(0, 0), (0, 8), (0, 10), (0, 19), (0, 21)]
    assert replace(v1, since=(0, 10), name=hybrid.name, window_kv=True) == hybrid
    assert replace(hybrid, since=(0, 19), name=lighter.name, sampler_buffers=3.75) == lighter
    assert replace(lighter, since=(0, 21), name=graphs.name, graphs_in_pool=True) == graphs
    assert hybrid.sampler_buffers == 9.5 and v1.sampler_after_forward and not _v0.sampler_after_forward
    # fit's report names the era whose rules it used: each has a name of its own
    names = [e.name for e in fitengine.ERAS]
    assert all(names) and len(set(names)) == len(names)


@pytest.mark.parametrize("version", [(0, 8), (0, 9), (0, 10), (0, 21), None])
def test_every_v1_engine_profiles_2048_tokens_or_8192_on_a_big_card(version: tuple[int, int] | None) -> None:
    v1 = fitengine.era(version)
    assert fitengine.profile_shape(v1, 4096, None, None, False) == (2048, 256)
    assert fitengine.profile_shape(v1, 4096, None, None, True) == (8192, 1024)


def test_v0_profiles_the_recipes_own_batch_when_it_sets_one() -> None:
    v0 = fitengine.era((0, 6))
    assert fitengine.profile_shape(v0, 131072, 4096, None, False) == (4096, 256)
    assert fitengine.profile_shape(v0, 8192, 16384, 8, True) == (16384, 8)


def test_the_profile_run_takes_the_tokens_each_engine_picks() -> None:
    v0, v1 = fitengine.era((0, 6)), fitengine.era((0, 10))
    # V0 without chunked prefill profiles one prefill of the whole context, at least 2,048 tokens
    assert fitengine.profile_shape(v0, 20000, None, None, False) == (20000, 256)
    assert fitengine.profile_shape(v0, 1024, None, None, False) == (2048, 256)
    # above 32K V0 turns chunked prefill on by itself: 512 tokens
    assert fitengine.profile_shape(v0, 35000, None, None, False) == (512, 256)
    # V1 always chunks: 2,048 × 256, or 8,192 × 1,024 on a big card; the recipe's own values win
    assert fitengine.profile_shape(v1, 131072, None, None, False) == (2048, 256)
    assert fitengine.profile_shape(v1, 131072, None, None, True) == (8192, 1024)
    assert fitengine.profile_shape(v1, 131072, 1024, 4, True) == (1024, 4)
    assert fitengine.big_card(81559 * fit.MiB, "NVIDIA H100 80GB HBM3")
    assert not fitengine.big_card(81920 * fit.MiB, "NVIDIA A100-SXM4-80GB")
    assert not fitengine.big_card(24576 * fit.MiB, "NVIDIA GeForce RTX 3090")


def test_pytorch_sees_the_card_less_what_the_driver_keeps() -> None:
    # an RTX 3090's 24,576 MiB are 23.58 GiB to PyTorch (the V0 boot log's total_gpu_memory)
    assert round(fitengine.torch_total(24576 * fit.MiB) / GiB, 2) == 23.58
    assert fitengine.torch_total(512 * fit.MiB) == 512 * fit.MiB  # a tiny card keeps its size
    # the exact boundary: a card of up to four times what the driver keeps is counted whole
    edge = 4 * fitengine.DRIVER_RESERVE
    assert fitengine.torch_total(edge) == edge
    assert fitengine.torch_total(edge + 1) == edge + 1 - fitengine.DRIVER_RESERVE


def test_a_big_card_starts_at_exactly_70_gib() -> None:
    assert fitengine.big_card(70 * GiB, "NVIDIA H100 NVL")
    assert not fitengine.big_card(70 * GiB - 1, "NVIDIA H100 NVL")
    assert not fitengine.big_card(80 * GiB, "NVIDIA A100 80GB PCIe")


def test_mxfp4_experts_are_counted_as_marlin_repacks_them() -> None:
    # gpt-oss: hidden 2,880 → 3,072, expert width 2,880 → 2,944
    blocks = 32 * (2 * 2880) * (2880 // 32) * 16  # [experts, 2 × width, hidden / 32, 16 bytes]
    assert fitengine.mxfp4_loaded("gate_up_proj_blocks", blocks, 2880, 2880) == 32 * (2 * 2944) * 96 * 16
    assert fitengine.mxfp4_loaded("down_proj_scales", 32 * 2880 * 90, 2880, 2880) == 32 * 3072 * 92
    assert fitengine.mxfp4_loaded("gate_up_proj_bias", 32 * 5760 * 2, 2880, 2880) == 32 * 5888 * 2
    assert fitengine.mxfp4_loaded("down_proj_bias", 32 * 2880 * 2, 2880, 2880) == 32 * 3072 * 2
    assert fitengine.mxfp4_loaded("router_weight", 1000, 2880, 2880) == 1000
    assert fitengine.mxfp4_loaded("gate_up_proj_blocks", 1000, 0, 0) == 1000
    # a config that gives only one of the two sizes: the experts are counted as stored
    assert fitengine.mxfp4_loaded("gate_up_proj_blocks", 1000, 0, 2880) == 1000
    assert fitengine.mxfp4_loaded("down_proj_scales", 1000, 2880, 0) == 1000


def test_a_sliding_window_layer_holds_its_window_from_the_hybrid_kv_engines_on() -> None:
    cfg = {
        "num_hidden_layers": 4, "hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 64, "vocab_size": 1000, "max_position_embeddings": 131072, "sliding_window": 128,
        "layer_types": ["sliding_attention", "full_attention"] * 2,
    }  # fmt: skip
    shape = fit.ModelShape.from_config(cfg)
    assert shape.sliding_layers == (0, 2) and shape.sliding_window == 128
    heads = [("model.layers.0.mlp.down_proj.weight", 1024, (256, 2))]
    per_layer = 2 * 2 * 64 * 2  # K and V, 2 heads of 64, 16-bit
    for version, window in (((0, 9), False), ((0, 10), True)):
        est = fit.estimate(shape, replace(fit.engine_params([], {}), vllm_version=version), heads)
        r = est.ranks[0]
        assert r.kv_bytes_per_token == 4 * per_layer
        full = 2 * per_layer * 131072
        held = 2 * per_layer * (128 + 16) if window else 2 * per_layer * 131072
        assert est.request_bytes(r, 131072) == full + held


def test_a_big_card_gets_v1s_larger_profile_unless_the_recipe_sets_its_own() -> None:
    cfg = {
        "num_hidden_layers": 2, "hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2,
        "vocab_size": 151936, "max_position_embeddings": 32768, "intermediate_size": 512,
    }  # fmt: skip
    shape = fit.ModelShape.from_config(cfg)
    heads = [("model.layers.0.mlp.down_proj.weight", 1024, (256, 2))]
    est = fit.estimate(shape, replace(fit.engine_params([], {}), vllm_version=(0, 10)), heads)
    h100 = est.for_card(81559 * fit.MiB, "NVIDIA H100 80GB HBM3")
    a100 = est.for_card(81920 * fit.MiB, "NVIDIA A100-SXM4-80GB")
    assert a100 is est and h100.params.big_card
    # 1,024 sequences' sampler buffers where 256 were: four times the vocabulary term
    sampler = fitengine.era((0, 10)).sampler_buffers * 151936 * 4
    assert h100.ranks[0].activation - est.ranks[0].activation >= (1024 - 256) * sampler
    own = fit.estimate(
        shape,
        replace(fit.engine_params(["--max-num-seqs", "8", "--max-num-batched-tokens", "512"], {}),
                vllm_version=(0, 10)),
        heads,
    )  # fmt: skip
    assert own.for_card(81559 * fit.MiB, "H100").ranks[0].activation == own.ranks[0].activation


@pytest.mark.parametrize(("vocab", "sampler_wins"), [(32016, False), (128256, True)])
def test_v1s_profile_peak_is_the_larger_of_the_forward_pass_and_the_sampler(
    vocab: int, sampler_wins: bool
) -> None:
    """V1 samples after the forward pass gave its activations back (the v0.19 H100 boots: CodeLlama's 0.77 GiB
    torch peak is its 8,192-token forward pass, Llama 3.1's 1.89 GiB its sampler over 1,024 × 128,256); V0
    counts the two together."""
    cfg = {
        "num_hidden_layers": 2, "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
        "vocab_size": vocab, "max_position_embeddings": 8192, "intermediate_size": 14336,
    }  # fmt: skip
    shape = fit.ModelShape.from_config(cfg)
    heads = [("model.layers.0.mlp.down_proj.weight", 1024, (256, 2))]
    forward = 8192 * (4 * 4096 + (32 + 16) * 128 + 2 * 14336) * 2
    for version in ((0, 10), (0, 19), (0, 6)):
        era = fitengine.era(version)
        params = replace(fit.engine_params(["--max-model-len", "8192"], {}), vllm_version=version)
        est = fit.estimate(shape, params, heads).for_card(81559 * fit.MiB, "NVIDIA H100 80GB HBM3")
        t, seqs = fitengine.profile_shape(era, 8192, None, None, True)
        sampler = int(era.sampler_buffers * min(seqs, t) * vocab * 4)
        fwd = t * (4 * 4096 + (32 + 16) * 128 + 2 * 14336) * 2
        want = max(fwd, sampler + t * 4096 * 2) if era.v1 else fwd + sampler
        assert est.ranks[0].activation == want
        if version == (0, 19):  # as the v0.19 boots logged it: CodeLlama's forward pass, else the sampler
            assert (want == forward) is not sampler_wins


def test_quantization_fp8_of_a_16_bit_checkpoint_stores_its_linear_layers_at_a_byte_an_element() -> None:
    """vLLM's online fp8 (``--quantization fp8`` on a 16-bit checkpoint) quantises the linear layers as they
    load; the embedding, the LM head and the norms stay 16-bit (the v0.19 H100 boot: 8.49 GiB where the
    checkpoint holds 14.96). A checkpoint that is quantised already is counted as stored."""
    cfg = {
        "num_hidden_layers": 1, "hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2,
        "vocab_size": 1000, "intermediate_size": 512,
    }  # fmt: skip
    heads = [
        ("model.embed_tokens.weight", 1000 * 256 * 2, (1000, 256)),
        ("model.layers.0.input_layernorm.weight", 256 * 2, (256,)),
        ("model.layers.0.self_attn.q_proj.weight", 256 * 256 * 2, (256, 256)),
        ("model.layers.0.mlp.down_proj.weight", 256 * 512 * 2, (256, 512)),
        ("lm_head.weight", 1000 * 256 * 2, (1000, 256)),
    ]
    stored = fit.estimate(fit.ModelShape.from_config(cfg), fit.engine_params([], {}), heads).ranks[0]
    assert stored.by_category["layers"] == 256 * 2 + (256 * 256 + 256 * 512) * 2
    for flag in (["--quantization", "fp8"], ["-q", "fp8"]):
        params = fit.engine_params(flag, {})
        assert params.quantization == "fp8"
        r = fit.estimate(fit.ModelShape.from_config(cfg), params, heads).ranks[0]
        assert r.by_category["layers"] == 256 * 2 + 256 * 256 + 256 * 512  # the norm stays 16-bit
        assert (r.by_category["embed"], r.by_category["head"]) == (
            stored.by_category["embed"], stored.by_category["head"]
        )  # fmt: skip
    quantised = {**cfg, "quantization_config": {"quant_method": "fp8"}}
    already = fit.estimate(fit.ModelShape.from_config(quantised), fit.engine_params(["-q", "fp8"], {}), heads)
    assert already.ranks[0].by_category == stored.by_category
    # another method names the checkpoint's own format: nothing is re-counted
    awq = fit.estimate(fit.ModelShape.from_config(cfg), fit.engine_params(["-q", "awq_marlin"], {}), heads)
    assert awq.ranks[0].by_category == stored.by_category
