"""doctor's fit row on the 3×3090 rig of seed 000, captured while a ComfyUI container held 256 MiB on GPU0.

What is synthetic: seed 000's checkpoint (Minachist/Qwen3.8-Flash-Next-INT4-Mixed-AutoRound) is not
available here, so ``seed000_checkpoint`` writes a header-only stand-in (no weight bytes exist): 48 layers of
attention + 64 fused experts whose declared sizes make the heaviest of the three PP stages load 21.55 GiB,
the figure seed 000 published ("Weights load 21.55 GiB/rank"). The GPU facts (totals, used memory, the
256 MiB PID 48213) are the real capture tests/operating/data/3x3090-squatter; the argv is seed 000's.
"""

from __future__ import annotations

import json
from pathlib import Path

from rigsmith.operating.doctor import doctor
from rigsmith.operating.fit import observed
from rigsmith.operating.fit import report as fitreport
from rigsmith.operating.host import gather
from rigsmith.project import Project
from rigsmith.resolving.fit import checkpoint, fit
from rigsmith.resolving.fit.checkpoint import open_checkpoint
from rigsmith.resolving.lock.lock import Lock
from rigsmith.spec import Deployment, dump, from_data, to_data
from tests.support.checkpoints import header_only
from tests.support.common import REPO
from tests.support.replay import ReplayHost

OFFLINE = {"HF_HUB_OFFLINE": "1"}
H, HEADS, KV, HD, VOCAB, LAYERS, EXPERTS = 2048, 16, 2, 128, 151936, 48, 64
#: Fused-expert intermediate size chosen so the last stage (16 layers + LM head + norm) is 21.55 GiB.
INTER = 1765


def estimate_for(spec: Deployment, lock: Lock, env: dict[str, str], **how: bool) -> fit.Estimate:
    """Open the checkpoint as `invoke fit` does (``local_only`` as doctor does), then estimate."""
    return checkpoint.estimate_for(spec, open_checkpoint(spec, lock, env, **how))


def seed000_checkpoint(root: Path) -> Path:
    root.mkdir(parents=True)
    cfg = {
        "architectures": ["Qwen3MoeForCausalLM"],
        "num_hidden_layers": LAYERS,
        "hidden_size": H,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV,
        "head_dim": HD,
        "vocab_size": VOCAB,
        "num_experts": EXPERTS,
        "num_experts_per_tok": 8,
        "moe_intermediate_size": INTER,
        "torch_dtype": "bfloat16",
        "synthetic": "header-only stand-in for seed 000 (tests/operating/test_fit_doctor.py)",
    }
    (root / "config.json").write_text(json.dumps(cfg), encoding="utf-8")
    for k in range(3):
        t: list[tuple[str, str, tuple[int, ...]]] = []
        if k == 0:
            t.append(("model.embed_tokens.weight", "BF16", (VOCAB, H)))
        for i in range(16 * k, 16 * (k + 1)):
            p = f"model.layers.{i}."
            t += [
                (p + "input_layernorm.weight", "BF16", (H,)),
                (p + "self_attn.q_proj.weight", "BF16", (HEADS * HD, H)),
                (p + "self_attn.k_proj.weight", "BF16", (KV * HD, H)),
                (p + "self_attn.v_proj.weight", "BF16", (KV * HD, H)),
                (p + "self_attn.o_proj.weight", "BF16", (H, HEADS * HD)),
                (p + "post_attention_layernorm.weight", "BF16", (H,)),
                (p + "mlp.gate.weight", "BF16", (EXPERTS, H)),
                (p + "mlp.experts.gate_up_proj", "BF16", (EXPERTS, 2 * INTER, H)),
                (p + "mlp.experts.down_proj", "BF16", (EXPERTS, H, INTER)),
            ]
        if k == 2:
            t += [("model.norm.weight", "BF16", (H,)), ("lm_head.weight", "BF16", (VOCAB, H))]
        data, _ = header_only(t)
        (root / f"model-{k + 1:05d}-of-00003.safetensors").write_bytes(data)
    return root


def seed000(tmp_path: Path) -> Deployment:
    data = to_data(Project(REPO).load("flash-next-int4-3x3090"))
    data["model"]["local_dir"] = str(seed000_checkpoint(tmp_path / "ckpt"))
    return from_data(data)


def test_squatter_capture_is_no_go_on_gpu0_naming_the_256_mib_process(tmp_path: Path) -> None:
    spec = seed000(tmp_path)
    facts = gather(ReplayHost("3x3090-squatter"), model_dir=spec.model.local_dir)
    est = estimate_for(spec, Lock(), OFFLINE, local_only=True)
    assert (est.params.pp, est.params.tp, est.params.kv_cache_memory) == (3, 1, 550_000_000)
    fits = fitreport.fit_gpus(est, spec, facts)
    assert [f.gpu for f in fits] == [0, 1, 2]
    assert [f.verdict for f in fits] == ["no-go", "warn", "warn"]
    gpu0 = fits[0]
    assert gpu0.squat_bytes == 256 * fit.MiB
    assert "PID 48213 /opt/ComfyUI/venv/bin/python (container comfyui) holds 256 MiB" in gpu0.why
    # The squatter is what tips it: without its 256 MiB GPU0 would have the headroom GPU1 and GPU2 have.
    assert gpu0.headroom < 0 <= gpu0.headroom + gpu0.squat_bytes
    assert "vLLM refuses to start" in gpu0.why and "0.97" in gpu0.why
    assert fits[1].headroom == fits[2].headroom > 0 and not fits[1].squatters
    # 550 MB of KV over 16 full-attention layers a stage is 33,568 tokens: stock vLLM would refuse a
    # 262,144-token --max-model-len (seed 000's patched engine offloads KV to host RAM), so warn, not no-go.
    assert "the KV pool holds 33,568 tokens, less than one --max-model-len 262,144" in fits[1].why
    # The weights match the published per-rank figure by construction of the synthetic checkpoint.
    (weights,) = fitreport.published(est, spec, fits)
    assert weights.published == 21.55 and abs(weights.ratio - 1) < 0.001


def test_doctor_table_carries_the_fit_row(tmp_path: Path) -> None:
    spec = seed000(tmp_path)
    facts = gather(ReplayHost("3x3090-squatter"), model_dir=spec.model.local_dir)
    row = fitreport.fit_check(spec, Lock(), facts, OFFLINE)
    checks = doctor.evaluate(spec, facts, "podman", row)
    assert checks[-1] is row and row.name == "fit" and row.verdict == "no-go"
    assert row.detail.startswith("GPU0 PP0/TP0: needs ") and "PID 48213" in row.detail
    assert "256 MiB" in row.detail and "GPU1" not in row.detail
    assert row.hint is not None and "kill PID" in row.hint and "`invoke fit --propose`" in row.hint
    text = doctor.render(checks, "doctor")
    assert "fit" in text and "NO-GO" in text
    # Without the squatter (4x3090-idle has no compute process), no GPU is no-go.
    idle = gather(ReplayHost("4x3090-idle"), model_dir=spec.model.local_dir)
    assert fitreport.fit_check(spec, Lock(), idle, OFFLINE).verdict != "no-go"


def test_doctor_row_is_a_warn_not_a_request_when_the_checkpoint_is_elsewhere(tmp_path: Path) -> None:
    data = to_data(Project(REPO).load("flash-next-int4-3x3090"))
    data["model"]["local_dir"] = str(tmp_path / "empty")
    spec = from_data(data)
    facts = gather(ReplayHost("3x3090-squatter"), model_dir=spec.model.local_dir)
    row = fitreport.fit_check(spec, Lock(), facts, {"HF_ENDPOINT": "http://127.0.0.1:9"})
    assert row.verdict == "warn" and "is not in" in row.detail
    assert row.hint is not None and "invoke fit --deployment flash-next-int4-3x3090" in row.hint


def test_invoke_doctor_diagnosis_carries_the_fit_row(tmp_path: Path) -> None:
    spec = seed000(tmp_path)
    root = tmp_path / "proj"
    (root / "deployments").mkdir(parents=True)
    (root / "deployments" / f"{spec.name}.yaml").write_text(dump(spec), encoding="utf-8")
    name, checks = doctor.diagnose(
        Project(root), spec.name, target="podman", host=ReplayHost("3x3090-squatter")
    )
    row = next(c for c in checks if c.name == "fit")
    assert name == spec.name and row.verdict == "no-go" and "GPU0" in row.detail and "PID 48213" in row.detail


def test_the_engines_own_kv_number_from_a_boot_is_shown_beside_the_estimate(tmp_path: Path) -> None:
    spec = seed000(tmp_path)
    facts = gather(ReplayHost("3x3090-squatter"), model_dir=spec.model.local_dir)
    est = estimate_for(spec, Lock(), OFFLINE, local_only=True)
    fits = fitreport.fit_gpus(est, spec, facts)
    root = tmp_path / "proj"
    assert observed.last(root, spec, Lock()) is None
    observed.record(root, spec, Lock(), 30_000)
    other = spec.model_copy(
        update={"engine": spec.engine.model_copy(update={"args": (*spec.engine.args, "-x")})}
    )
    observed.record(root, other, Lock(), 1)  # other argv: a number that does not apply to this spec
    with (root / observed.RECORD).open("a") as f:
        f.write("not json\n")
    seen = observed.last(root, spec, Lock())
    assert seen is not None and seen.kv_cache_tokens == 30_000
    comps = {c.what: c for c in fitreport.published(est, spec, fits, seen.kv_cache_tokens)}
    boot = comps["GPU KV cache size, last boot here"]
    assert boot.published == 30_000 and boot.estimate == est.kv_tokens([f.total for f in fits])
