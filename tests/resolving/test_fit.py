"""`invoke fit`: per-rank weights from safetensors headers read by range requests, placed as vLLM places them.

The checkpoints are real safetensors files (tests/support/checkpoints.py) served by the Hub stand-in; the
expected bytes of each rank come from slicing their arrays the way the test states vLLM loads them.
"""

from __future__ import annotations

import json
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from rigsmith import spec as specmod
from rigsmith.operating.fit import report as fitreport
from rigsmith.resolving.fit import checkpoint, fit, fitengine
from rigsmith.resolving.fit.checkpoint import HubCheckpoint, LocalCheckpoint, open_checkpoint, rows
from rigsmith.resolving.lock.lock import Lock, LockedFile, LockedModel
from rigsmith.spec import Deployment
from tests.support import checkpoints as ck
from tests.support.hubserver import HubServer
from tests.support.models import run_cli

REPO_ID = "acme/fit-test"


def estimate_for(spec: Deployment, lock: Lock, env: dict[str, str], **how: bool) -> fit.Estimate:
    """Open the checkpoint as `invoke fit` does (``local_only`` as doctor does), then estimate."""
    return checkpoint.estimate_for(spec, open_checkpoint(spec, lock, env, **how))


def serve(hub: HubServer, files: dict[str, bytes]) -> str:
    return hub.repo(REPO_ID).add_commit(files)


def settled(hub: HubServer) -> dict[str, int]:
    """Bytes sent per file once the server has finished answering (the client can be done first)."""
    deadline = time.monotonic() + 120
    while not all(r.ended is not None for r in hub.hub_requests()) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert all(r.ended is not None for r in hub.hub_requests()), "the server still answers a request"
    return dict(hub.bytes_sent)


MTP = '{"method":"mtp","num_speculative_tokens":3}'

#: (architecture, argv, env, TP, stage of each of the 4 decoder layers, EP, MTP loaded, vision loaded)
CASES = [
    ("dense", [], {}, 1, [0, 0, 0, 0], False, False, True),
    ("dense", ["-tp", "2"], {}, 2, [0, 0, 0, 0], False, False, True),
    ("dense", ["--tensor-parallel-size", "4"], {}, 4, [0, 0, 0, 0], False, False, True),  # 2 KV heads < TP
    ("dense", ["--pipeline-parallel-size", "3"], {}, 1, [0, 1, 1, 2], False, False, True),  # remainder: PP1
    (
        "dense",
        ["--tensor-parallel-size=2", "-pp", "2"],
        {"VLLM_PP_LAYER_PARTITION": "3,1"},
        2,
        [0, 0, 0, 1],
        False,
        False,
        True,
    ),
    ("moe", ["-tp", "2"], {}, 2, [0, 0, 0, 0], False, False, True),
    ("moe", ["-tp", "2", "-pp", "2", "--enable-expert-parallel"], {}, 2, [0, 0, 1, 1], True, False, True),
    ("hybrid", ["-tp", "2", "-pp", "2", "--speculative-config", MTP], {}, 2, [0, 0, 1, 1], False, True, True),
    ("hybrid", ["-pp", "2", "--language-model-only"], {}, 1, [0, 0, 1, 1], False, False, False),
    (
        "hybrid",
        ["-tp", "2", "--enable-expert-parallel", "--speculative-config", '{"method":"qwen3_next_mtp"}'],
        {},
        2,
        [0, 0, 0, 0],
        True,
        True,
        True,
    ),
]
ARCHS = {"dense": ck.dense, "moe": ck.moe, "hybrid": ck.hybrid_mtp}


@pytest.mark.parametrize(("arch", "args", "env", "tp", "stage_of", "ep", "mtp", "vision"), CASES)
def test_each_rank_gets_exactly_the_bytes_it_loads_read_from_headers_by_range_requests(
    hub: HubServer,
    tmp_path: Path,
    arch: str,
    args: list[str],
    env: dict[str, str],
    tp: int,
    stage_of: list[int],
    ep: bool,
    mtp: bool,
    vision: bool,
) -> None:
    a = ARCHS[arch]()
    files = a.files()
    sha = serve(hub, files)
    spec = ck.make_spec(tmp_path, args, env, repo=REPO_ID, revision=sha)
    est = estimate_for(spec, Lock(), {"HF_ENDPOINT": hub.url})
    want = ck.expected(a, tp, stage_of, ep=ep, mtp=mtp, vision=vision)
    assert [r.weights for r in est.ranks] == want
    assert [(r.pp_rank, r.tp_rank) for r in est.ranks] == [divmod(i, tp) for i in range(len(want))]
    assert est.tensors == len(a.tensors)
    # Only headers crossed the wire: every request for a weight file is a ranged GET, and what was sent of
    # each is the first 100 kB (the header is inside it), far from the whole file.
    weight_reqs = [r for r in hub.hub_requests() if r.path.endswith(".safetensors")]
    shards = sorted(p for p in files if p.endswith(".safetensors"))
    assert sorted({r.path.rsplit("/", 1)[1] for r in weight_reqs}) == shards
    assert all(r.method == "GET" and r.range == "bytes=0-100000" for r in weight_reqs), weight_reqs
    sent = settled(hub)
    for shard in shards:
        assert sent[shard] == 100001 < len(files[shard])


def test_tp_split_without_ep_and_with_ep_put_experts_on_different_ranks(
    hub: HubServer, tmp_path: Path
) -> None:
    a = ck.moe()
    sha = serve(hub, a.files())
    env = {"HF_ENDPOINT": hub.url}
    sharded = estimate_for(ck.make_spec(tmp_path, ["-tp", "2"], repo=REPO_ID, revision=sha), Lock(), env)
    ep = estimate_for(
        ck.make_spec(tmp_path, ["-tp", "2", "--enable-expert-parallel"], repo=REPO_ID, revision=sha),
        Lock(),
        env,
    )
    experts = sum(t.array.nbytes for t in a.tensors if t.expert >= 0)
    # Both halve the experts over two ranks, by different cuts: TP slices every expert, EP gives whole ones.
    assert [r.by_category["experts"] for r in sharded.ranks] == [experts // 2] * 2
    assert [r.by_category["experts"] for r in ep.ranks] == [experts // 2] * 2
    assert sharded.ranks[0].weights == ep.ranks[0].weights


def test_mtp_module_is_counted_only_when_the_recipe_enables_it(hub: HubServer, tmp_path: Path) -> None:
    a = ck.hybrid_mtp()
    sha = serve(hub, a.files())
    env = {"HF_ENDPOINT": hub.url}
    off = estimate_for(ck.make_spec(tmp_path, ["-pp", "2"], repo=REPO_ID, revision=sha), Lock(), env)
    on = estimate_for(
        ck.make_spec(tmp_path, ["-pp", "2", "--speculative-config", MTP], repo=REPO_ID, revision=sha),
        Lock(),
        env,
    )
    mtp_bytes = sum(t.array.nbytes for t in a.tensors if t.where == "mtp")
    assert on.ranks[1].weights - off.ranks[1].weights == mtp_bytes
    assert on.ranks[0].weights == off.ranks[0].weights
    assert off.skipped == {"MTP module (no --speculative-config method mtp)": mtp_bytes}
    # Layers 1 and 3 are full attention; the MTP layer adds its own KV on the last stage.
    assert off.shape.attention_layers == (1, 3)
    assert on.ranks[1].kv_bytes_per_token == 2 * off.ranks[1].kv_bytes_per_token


def test_local_checkpoint_headers_come_from_disk_with_no_request(hub: HubServer, tmp_path: Path) -> None:
    a = ck.dense()
    local = tmp_path / "ckpt"
    local.mkdir()
    for name, data in a.files().items():
        (local / name).write_bytes(data)
    spec = ck.make_spec(tmp_path, ["-tp", "2"], local_dir=str(local))
    ckpt = open_checkpoint(spec, Lock(), {"HF_ENDPOINT": hub.url})
    assert isinstance(ckpt, LocalCheckpoint)
    est = estimate_for(spec, Lock(), {"HF_ENDPOINT": hub.url})
    assert [r.weights for r in est.ranks] == ck.expected(a, 2, [0, 0, 0, 0])
    assert hub.hub_requests() == []


def test_a_complete_download_of_the_locked_commit_is_read_offline(hub: HubServer, tmp_path: Path) -> None:
    a = ck.moe()
    files = a.files()
    sha = serve(hub, files)
    local = tmp_path / "dl"
    local.mkdir()
    for name, data in files.items():
        (local / name).write_bytes(data)
    spec = ck.make_spec(tmp_path, ["-tp", "2"], repo=REPO_ID, revision="main", local_dir=str(local))
    lock = Lock(
        models={
            spec.name: LockedModel(
                repo=REPO_ID, commit=sha, files={p: LockedFile(size=len(d)) for p, d in files.items()}
            )
        }
    )
    assert isinstance(open_checkpoint(spec, lock, {"HF_ENDPOINT": hub.url}), LocalCheckpoint)
    est = estimate_for(spec, lock, {"HF_ENDPOINT": hub.url, "HF_HUB_OFFLINE": "1"})
    assert [r.weights for r in est.ranks] == ck.expected(a, 2, [0, 0, 0, 0])
    assert hub.hub_requests() == []
    # One shard missing: not complete, so the Hub is asked (online), and offline it is an error saying so.
    (local / "model-00002-of-00002.safetensors").unlink()
    assert isinstance(open_checkpoint(spec, lock, {"HF_ENDPOINT": hub.url}), HubCheckpoint)
    (local / "config.json").unlink()
    with pytest.raises(fit.FitError, match=r"HF_HUB_OFFLINE is set and .* does not hold acme/fit-test@"):
        open_checkpoint(spec, lock, {"HF_ENDPOINT": hub.url, "HF_HUB_OFFLINE": "1"})


def test_an_unpinned_unlocked_model_is_read_at_the_hubs_branch_head_without_pin(
    hub: HubServer, tmp_path: Path
) -> None:
    """fit needs only the model: no lock entry and no pinned commit is the branch as the Hub resolves it
    now (read-only; nothing is locked), not a request to run `invoke pin`."""
    sha = serve(hub, ck.dense().files())
    spec = ck.make_spec(tmp_path, ["-tp", "2"], repo=REPO_ID, revision="main")
    ckpt = open_checkpoint(spec, Lock(), {"HF_ENDPOINT": hub.url})
    assert isinstance(ckpt, HubCheckpoint) and ckpt.where.endswith(f"{REPO_ID}@{sha}")
    weights = [r.weights for r in checkpoint.estimate_for(spec, ckpt).ranks]
    assert weights == ck.expected(ck.dense(), 2, [0] * 4)
    offline = {"HF_ENDPOINT": hub.url, "HF_HUB_OFFLINE": "1"}
    with pytest.raises(fit.FitError, match="does not hold acme/fit-test@main"):
        open_checkpoint(spec, Lock(), offline)


def test_kv_tokens_are_whole_blocks_of_the_explicit_pool(hub: HubServer, tmp_path: Path) -> None:
    sha = serve(hub, ck.dense().files())
    env = {"HF_ENDPOINT": hub.url}
    base = ["-tp", "2", "--kv-cache-memory", "1000000", "--block-size", "16"]
    est = estimate_for(ck.make_spec(tmp_path, base, repo=REPO_ID, revision=sha), Lock(), env)
    # 4 layers × K and V × 1 KV head per rank (2 over TP 2) × head_dim 32 × 2 bytes = 512 B per token
    assert [r.kv_bytes_per_token for r in est.ranks] == [512, 512]
    assert est.kv_tokens([24 * fit.GiB] * 2) == 1000000 // (512 * 16) * 16
    fp8 = estimate_for(
        ck.make_spec(tmp_path, [*base, "--kv-cache-dtype", "fp8_e4m3"], repo=REPO_ID, revision=sha),
        Lock(),
        env,
    )
    assert fp8.kv_tokens([24 * fit.GiB] * 2) == 1000000 // (256 * 16) * 16


def test_pp_split_follows_vllm_get_pp_indices() -> None:
    assert fit.pp_partition(48, 3) == [(0, 16), (16, 32), (32, 48)]
    assert fit.pp_partition(49, 4) == [(0, 12), (12, 24), (24, 37), (37, 49)]  # remainder before the last
    assert fit.pp_partition(50, 4) == [(0, 12), (12, 25), (25, 38), (38, 50)]
    assert fit.pp_partition(48, 2, (25, 23)) == [(0, 25), (25, 48)]  # seed 003's VLLM_PP_LAYER_PARTITION
    with pytest.raises(fit.FitError, match=r"25,22 gives 2 stage\(s\) and 47 layer\(s\).*48 layers"):
        fit.pp_partition(48, 2, (25, 22))


def test_engine_flags_parse_like_vllm_argparse() -> None:
    p = fit.engine_params(
        [
            "m",
            "-tp",
            "2",
            "--pipeline-parallel-size=2",
            "--kv-cache-memory",
            "4G",
            "--gpu-memory-utilization",
            "0.96",
            "--enable-expert-parallel",
            "--enforce-eager",
            "--max-model-len",
            "262144",
        ],
        {"VLLM_PP_LAYER_PARTITION": "25,23"},
    )
    assert (p.tp, p.pp, p.kv_cache_memory, p.gpu_memory_utilization) == (2, 2, 4 * 1024**3, 0.96)
    assert p.expert_parallel and not p.cuda_graphs and p.pp_partition == (25, 23)
    assert fit.parse_bytes("--kv-cache-memory", "550000000") == 550_000_000
    assert fit.parse_bytes("--kv-cache-memory", "4g") == 4 * 10**9
    with pytest.raises(fit.FitError, match="'lots' is not a byte count"):
        fit.engine_params(["--kv-cache-memory", "lots"], {})


def test_config_without_layer_count_is_one_paragraph_error() -> None:
    with pytest.raises(fit.FitError) as err:
        fit.ModelShape.from_config({"hidden_size": 8}, "x/config.json")
    assert "x/config.json: no num_hidden_layers, num_attention_heads, vocab_size" in str(err.value)


# -- a large checkpoint: headers only ----------------------------------------------------------------------


def _peak(hub: HubServer, tmp_path: Path, shards: int) -> tuple[int, int, fit.Estimate, dict[str, bytes]]:
    files, declared = ck.large_header_only(shards)
    sha = hub.repo(f"acme/large-{shards}").add_commit(files)
    spec = ck.make_spec(tmp_path, [], repo=f"acme/large-{shards}", revision=sha)
    ckpt = open_checkpoint(spec, Lock(), {"HF_ENDPOINT": hub.url})
    shape = fit.ModelShape.from_config(ckpt.config())
    tracemalloc.start()
    try:
        est = fit.estimate(shape, fit.engine_inputs(spec), rows(ckpt))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak, declared, est, files


def _all_headers_parsed(files: dict[str, bytes]) -> int:
    """What holding every header of ``files`` at once costs, parsed (the failure this guards against)."""
    tracemalloc.start()
    try:
        held = [json.loads(b[8:]) for name, b in files.items() if name.endswith(".safetensors")]
        cost, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    del held
    return cost


class _Counted(list[Any]):
    """A header's rows that count themselves while alive (CPython frees them as the last reference goes)."""

    alive = 0

    def __init__(self, rows: list[Any]) -> None:
        super().__init__(rows)
        _Counted.alive += 1

    def __del__(self) -> None:
        _Counted.alive -= 1


class _SlowFirstCheckpoint:
    """Every header but the first returns at once, so a reader that does not bound its window runs ahead."""

    where = "counted"

    def __init__(self, files: int, first_done: threading.Event) -> None:
        self._files = [f"f{k}.safetensors" for k in range(files)]
        self._first_done = first_done

    def config(self) -> dict[str, Any]:
        return {}

    def weight_files(self) -> list[str]:
        return self._files

    def header(self, file: str) -> list[Any]:
        if file == self._files[0]:
            self._first_done.wait()
        return _Counted([(file, 1, (1,))])


def test_rows_holds_at_most_window_plus_one_headers_whatever_the_scheduling() -> None:
    first = threading.Event()
    ckpt = _SlowFirstCheckpoint(40, first)
    seen: list[int] = []
    it = rows(ckpt, window=4)
    first.set()
    for row in it:
        seen.append(_Counted.alive)
        assert row[1] == 1
    assert len(seen) == 40 and max(seen) <= 4 + 1, seen
    assert _Counted.alive == 0


def test_hundreds_of_gib_of_headers_are_read_with_flat_memory(hub: HubServer, tmp_path: Path) -> None:
    peak, declared, est, files = _peak(hub, tmp_path, 24)
    assert declared > 250 * fit.GiB  # what the headers declare (281 GiB)
    assert est.ranks[0].weights == declared
    # Holding all 24 parsed headers would cost about 24 MB; a bounded window holds a few of them (the index
    # and the stand-in Hub's own buffers share the process). Half of it-all separates the two by 2x or more.
    assert peak < _all_headers_parsed(files) // 2, peak
    # Each header is over 100 kB, so huggingface_hub asked for the rest of it in a second ranged GET;
    # nothing past a header was sent (there is nothing past it).
    reqs = [r for r in hub.hub_requests("acme/large-24/") if r.path.endswith(".safetensors")]
    assert len(reqs) == 2 * 24 and {r.range.split("-")[0] for r in reqs if r.range} == {"bytes=0", "bytes=8"}


# -- the verdict and the CLI -------------------------------------------------------------------------------


def test_fit_cli_prints_the_per_gpu_table_and_fails_on_cards_too_small(
    hub: HubServer, make_project: Any
) -> None:
    a = ck.dense()
    sha = serve(hub, a.files())
    project, _ = make_project("fitcli", repo=REPO_ID, revision=sha)
    spec_path = project.spec_path("fitcli")
    data = specmod.to_data(specmod.load(spec_path))
    data["engine"]["args"] = [
        "/m",
        "-tp",
        "2",
        "--kv-cache-memory",
        "100M",
        "--max-num-batched-tokens",
        "256",
    ]
    data["engine"]["model_arg"] = 0
    data["env"] = []
    spec_path.write_text(specmod.dump(specmod.from_data(data)), encoding="utf-8")
    ok = run_cli(hub, project, "fit", "--deployment", "fitcli", "--vram-gib", "24")
    assert ok.returncode == 0, ok.stderr
    assert "GPU0" in ok.stdout and "GPU1" in ok.stdout and "PP0/TP1" in ok.stdout and "fit: GO" in ok.stdout
    assert "est." in ok.stdout and "Traceback" not in ok.stderr
    small = run_cli(hub, project, "fit", "--deployment", "fitcli", "--vram-gib", "0.5")
    assert small.returncode == 1 and "fit: NO-GO on 2 GPU(s)" in small.stderr
    assert "Traceback" not in small.stderr


def test_headroom_verdicts_on_idle_cards(tmp_path: Path) -> None:
    shape = fit.ModelShape(
        num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=4, head_dim=16, vocab_size=128
    )
    params = fit.engine_params(["-tp", "2", "--gpu-memory-utilization", "0.9"], {})
    gib = 2 * fit.GiB
    est = fit.estimate(shape, params, [("model.layers.0.mlp.down_proj.weight", gib, (64, gib // 128))])
    spec = ck.make_spec(tmp_path, ["-tp", "2"], repo=REPO_ID, revision="a" * 40)
    fits = fitreport.fit_gpus(est, spec, None, vram_gib=24.0)
    # 1 GiB of weights per rank inside 0.9 × PyTorch's total (24 GiB less what the driver keeps): KV takes
    # the rest after the profile's activations, memory outside PyTorch and (newest engine) CUDA graphs;
    # 528 MiB of runtime comes before it.
    assert [f.verdict for f in fits] == ["go", "go"]
    torch_total = 24 * fit.GiB - fitengine.DRIVER_RESERVE
    r0 = est.ranks[0]
    assert fits[0].needs == (
        fitengine.DRIVER_RESERVE + int(0.9 * torch_total) + fit.CUDA_CONTEXT + fit.NCCL_BUFFERS
    )
    assert fits[0].kv == int(0.9 * torch_total) - fit.GiB - r0.activation - r0.non_torch - fit.CUDA_GRAPHS
    # At 0.98 the 2 % left (491 MiB) is less than the runtime vLLM allocates before its free-memory check.
    tight = fit.estimate(shape, fit.engine_params(["-tp", "2", "--gpu-memory-utilization", "0.98"], {}),
                         [("model.layers.0.mlp.down_proj.weight", gib, (64, gib // 128))])  # fmt: skip
    refused = fitreport.fit_gpus(tight, spec, None, vram_gib=24.0)
    assert [f.verdict for f in refused] == ["no-go", "no-go"] and "vLLM refuses to start" in refused[0].why
    tiny = fitreport.fit_gpus(est, spec, None, vram_gib=1.0)
    assert [f.verdict for f in tiny] == ["no-go", "no-go"] and "leave no KV cache" in tiny[0].why


def test_a_duplicate_consolidated_file_is_left_out_by_the_index(hub: HubServer, tmp_path: Path) -> None:
    a = ck.dense()
    files = a.files()
    # Mistral-style repos ship every tensor twice; vLLM loads only what the index maps to, and so does fit.
    files["consolidated.safetensors"] = files["model-00001-of-00002.safetensors"]
    sha = serve(hub, files)
    est = estimate_for(
        ck.make_spec(tmp_path, ["-tp", "2"], repo=REPO_ID, revision=sha), Lock(), {"HF_ENDPOINT": hub.url}
    )
    assert [r.weights for r in est.ranks] == ck.expected(a, 2, [0, 0, 0, 0])
    assert not hub.hub_requests("consolidated.safetensors")
    assert len(hub.hub_requests("model.safetensors.index.json")) == 1


def test_fused_experts_split_over_tp_or_by_expert_and_tied_embeddings_copy_to_the_last_stage() -> None:
    shape = fit.ModelShape(
        num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16, vocab_size=128,
        num_experts=6, tie_word_embeddings=True,
    )  # fmt: skip
    fused = [
        ("model.layers.0.mlp.experts.gate_up_proj", 6 * 32 * 64 * 2, (6, 32, 64)),
        ("model.layers.1.mlp.experts.down_proj", 6 * 64 * 16 * 2, (6, 64, 16)),
        ("model.embed_tokens.weight", 128 * 64 * 2, (128, 64)),
    ]
    tp = fit.estimate(shape, fit.engine_params(["-tp", "2", "-pp", "2"], {}), fused)
    assert [r.by_category["experts"] for r in tp.ranks] == [
        6 * 32 * 64,
        6 * 32 * 64,
        6 * 64 * 16,
        6 * 64 * 16,
    ]
    # the last stage holds its own (vocab-parallel) copy of the tied embedding as LM head
    assert [r.by_category["embed"] + r.by_category["head"] for r in tp.ranks] == [64 * 64 * 2] * 4
    ep = fit.estimate(shape, fit.engine_params(["-tp", "4", "--enable-expert-parallel"], {}), fused)
    # 6 experts over 4 EP ranks: 2, 2, 1, 1 (vLLM's linear placement gives the remainder to the first ranks)
    per_expert = 32 * 64 * 2 + 64 * 16 * 2
    assert [r.by_category["experts"] for r in ep.ranks] == [
        2 * per_expert,
        2 * per_expert,
        per_expert,
        per_expert,
    ]
