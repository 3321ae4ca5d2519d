"""`invoke fit --propose` and `invoke fit --apply N` through the CLI, and the applied layout surviving a
re-import of the recipe (`invoke import-recipe` with the same source: the three-way merge keeps it).

The recipe is raw command text serving a local header-only checkpoint (no Hub); this machine has no GPU,
so the rig is `--vram-gib 24` idle cards (the captured rigs are tested in test_propose.py).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from rigsmith import spec as specmod
from rigsmith.errors import ConsentError
from rigsmith.importing.importer import merge_user_change
from rigsmith.resolving.fit import fit
from rigsmith.resolving.fit.applylayout import NOTE_PREFIX, layout_args, set_flag, set_switch
from rigsmith.resolving.fit.layout import Layout
from tests.support import checkpoints as ck
from tests.support.recipes import import_cli, task_cli


def fit_cli(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`invoke fit ARGS` offline (the checkpoint is local)."""
    return task_cli(root, "fit", *args, HF_HUB_OFFLINE="1")


def test_propose_apply_and_a_reimport_that_keeps_the_applied_layout(tmp_path: Path) -> None:
    # experts 1650 wide: ~20.2 GiB on the heaviest of three stages, room beside it for the sampler's buffers
    # of vLLM's default 256 sequences but not for the recipe's 2 GiB pool
    ckpt = ck.seed000_roomy(1650).headers(tmp_path / "models" / "Seed0-Like")
    recipe = tmp_path / "serve.sh"
    recipe.write_text(
        f"CUDA_VISIBLE_DEVICES=0,1,2 vllm serve {ckpt} --tensor-parallel-size 2 --max-model-len 65536 "
        "--kv-cache-memory 2G\n",
        encoding="utf-8",
    )
    root = tmp_path / "proj"
    (root / "deployments").mkdir(parents=True)
    r = import_cli(root, str(recipe), "--name", "seed0", "--image", "localhost/vllm:1")
    assert r.returncode == 0, r.stderr
    path = root / "deployments" / "seed0.yaml"
    imported = path.read_text(encoding="utf-8")

    # the recipe's TP=2 does not hold 64 GiB of weights on two 24 GiB cards: NO-GO, pointing at --propose
    r = fit_cli(root, "--vram-gib", "24")
    assert r.returncode == 1 and "`invoke fit --propose` ranks the layouts" in r.stderr

    # the recipe's 2 GiB pool is its choice: three stages cannot hold it beside 20.2 GiB of weights, so the
    # layout that needs a smaller pool is listed apart, offered with --allow kv-cache-memory
    r = fit_cli(root, "--propose", "--vram-gib", "24", "--max-model-len", "32768")
    assert r.returncode == 0, r.stderr
    assert "no layout fits this rig while keeping the recipe's pinned values" in r.stdout
    assert "listed apart, with --allow kv-cache-memory:" in r.stdout
    assert "--kv-cache-memory 2147483648 (a fixed pool on every rank)" in r.stdout
    r = fit_cli(root, "--apply", "1", "--vram-gib", "24", "--max-model-len", "32768")
    assert r.returncode == 1 and "--apply 1: this rig has 0 proposal(s) that fit" in r.stderr

    allow = ("--allow", "kv-cache-memory")
    r = fit_cli(root, "--propose", "--vram-gib", "24", "--max-model-len", "32768", *allow)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "proposal 1" in out and "TP1×PP3 KV auto" in out and "searched " in out
    assert "the recipe's layout does not run as it stands" in out and "Traceback" not in r.stderr
    assert path.read_text(encoding="utf-8") == imported  # --propose writes nothing

    r = fit_cli(root, "--apply", "1", "--vram-gib", "24", "--max-model-len", "32768", *allow)
    assert r.returncode == 0, r.stderr
    assert "update  deployments/seed0.yaml" in r.stdout
    assert path.read_text(encoding="utf-8").startswith("# yaml-language-server:")  # the header line kept
    spec = specmod.load(path)
    p = fit.engine_inputs(spec)
    assert (p.tp, p.pp, p.max_model_len) == (1, 3, 32768) and p.kv_cache_memory is not None
    assert p.kv_cache_memory < 2 * fit.GiB
    assert spec.resources.gpus.cdi_devices == ("nvidia.com/gpu=0", "nvidia.com/gpu=1", "nvidia.com/gpu=2")
    assert spec.engine.args[0] == str(ckpt) and "--tensor-parallel-size" in spec.engine.args
    assert any(n.startswith(f"{NOTE_PREFIX} TP1×PP3") for n in spec.notes)
    # fit's own verdict on what was written: every GPU fits
    r = fit_cli(root, "--vram-gib", "24")
    assert r.returncode == 0, r.stderr + r.stdout
    assert "fit: GO" in r.stdout

    applied = path.read_text(encoding="utf-8")
    r = import_cli(root, str(recipe), "--name", "seed0", "--image", "localhost/vllm:1")
    assert r.returncode == 0, r.stderr
    assert "the recipe has not changed since the last import" in r.stdout
    assert path.read_text(encoding="utf-8") == applied

    r = fit_cli(root, "--apply", "7", "--vram-gib", "24")
    assert r.returncode == 1 and "--apply 7: this rig has" in r.stderr and "Traceback" not in r.stderr
    for bad, why in (("x", "is not a number"), ("nan", "is not a finite number"), ("-1", "≥ 0")):
        r = fit_cli(root, "--propose", "--headroom-gib", bad, "--vram-gib", "24")
        assert r.returncode == 1 and f"--headroom-gib {bad!r}" in r.stderr and why in r.stderr
        assert "Traceback" not in r.stderr


def test_layout_flags_are_edited_in_place_and_appended_only_when_they_change() -> None:
    args = [
        "/m",
        "--tensor-parallel-size=4",
        "--max-model-len",
        "8192",
        "--enable-expert-parallel",
        "-tp",
        "4",
    ]
    assert set_flag(args, ("--tensor-parallel-size", "-tp"), "2") == [
        "/m", "--tensor-parallel-size=2", "--max-model-len", "8192", "--enable-expert-parallel",
    ]  # fmt: skip
    assert set_flag(["/m"], ("--kv-cache-memory",), None) == ["/m"]
    assert set_switch(args, "--enable-expert-parallel", False) == [a for a in args if "expert" not in a]
    assert set_switch(["/m", "--no-enable-expert-parallel"], "--enable-expert-parallel", True) == [
        "/m", "--enable-expert-parallel",
    ]  # fmt: skip
    params = fit.engine_params([], {})
    lay = Layout(tp=1, pp=2, partition=(3, 1))
    sized = fit.EngineParams(gpu_memory_utilization=0.931, kv_cache_memory=123, max_model_len=4096)
    out = layout_args(["/m", "--served-model-name", "x"], {}, lay, sized)
    assert out == [
        "/m", "--served-model-name", "x", "--pipeline-parallel-size", "2", "--gpu-memory-utilization",
        "0.931", "--kv-cache-memory", "123", "--max-model-len", "4096",
    ]  # fmt: skip
    assert params.tp == 1  # TP=1 is vLLM's default: not written


def test_apply_merges_into_the_file_as_it_is_now_and_refuses_a_clash(tmp_path: Path) -> None:
    path = tmp_path / "deployments" / "t.yaml"
    path.parent.mkdir()
    spec = ck.make_spec(tmp_path, ["-tp", "2"])
    read = specmod.dump(spec)
    path.write_text(read, encoding="utf-8")
    changed = spec.model_copy(update={"engine": spec.engine.model_copy(update={"args": ("/m", "-pp", "2")})})
    # the user edited another field meanwhile: both stay
    path.write_text(specmod.dump(spec.model_copy(update={"description": "mine"})), encoding="utf-8")
    merged = merge_user_change(path, read, changed)
    assert merged.description == "mine" and merged.engine.args == ("/m", "-pp", "2")
    # the user edited the same field: nothing is decided for them
    other = spec.engine.model_copy(update={"args": ("/m", "-tp", "4")})
    path.write_text(specmod.dump(spec.model_copy(update={"engine": other})), encoding="utf-8")
    with pytest.raises(ConsentError, match="changed while rigsmith was working on it"):
        merge_user_change(path, read, changed)


def test_propose_reads_the_last_boots_kv_size_and_the_bench_history_of_this_checkout(tmp_path: Path) -> None:
    """`invoke fit --propose` finds `wait`'s record and `bench`'s rows under the checkout's .rigsmith/."""
    import dataclasses
    import json

    from rigsmith.operating.bench import bench
    from rigsmith.operating.fit import observed
    from rigsmith.project import Project
    from rigsmith.resolving.fit.checkpoint import LocalCheckpoint, rows
    from rigsmith.resolving.fit.layout import of_params
    from rigsmith.resolving.lock import lock

    # experts 1650 wide: ~20.2 GiB on the heaviest of three stages, room beside it for the sampler's buffers
    # of vLLM's default 256 sequences but not for the recipe's 2 GiB pool
    ckpt = ck.seed000_roomy(1650).headers(tmp_path / "models" / "Seed0-Like")
    recipe = tmp_path / "serve.sh"
    recipe.write_text(
        f"vllm serve {ckpt} --pipeline-parallel-size 3 --max-model-len 16384 --gpu-memory-utilization 0.95\n",
        encoding="utf-8",
    )
    root = tmp_path / "proj"
    (root / "deployments").mkdir(parents=True)
    r = import_cli(root, str(recipe), "--name", "seed0", "--image", "localhost/vllm:1")
    assert r.returncode == 0, r.stderr
    project = Project(root)
    spec = project.load("seed0")
    base = fit.engine_inputs(spec)
    est = fit.estimate(
        fit.ModelShape.from_config(LocalCheckpoint(ckpt).config()), base, rows(LocalCheckpoint(ckpt))
    )
    estimated = est.kv_tokens([24 * fit.GiB] * 3)
    assert estimated is not None and estimated > 64 * base.block_size
    observed.record(root, spec, lock.read(project.lock_path), estimated - 64 * base.block_size)
    when = json.loads((root / observed.RECORD).read_text().splitlines()[-1])["time"]
    for lay, tps in ((of_params(base), 30.0), (dataclasses.replace(of_params(base), kv_dtype="fp8"), 33.0)):
        run = {"streams": 1, "mean_stream_decode_tps": tps, "ttft_mean_s": 0.2}
        row = {"time": when, "deployment": "seed0", "runs": [run], "layout": dataclasses.asdict(lay)}
        bench.append(bench.results_path(root), row)

    r = fit_cli(root, "--propose", "--vram-gib", "24")
    assert r.returncode == 0, r.stderr
    assert f"calibrated from the boot of {when}: allowances +0." in r.stdout
    assert "TP1×PP3 KV fp8" in r.stdout and "was measured faster: decode 33.0 vs 30.0 tok/s" in r.stdout
