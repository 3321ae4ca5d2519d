"""`invoke fit` on the whole rig, through the CLI: the rig is what nvidia-smi says (a stand-in `nvidia-smi`
on PATH answering from the suite's captures or from cards written here), every card and every subset of
them; odd and mixed rigs; one verdict; the recipe's pins kept unless `--allow`; `--apply` moving every field
the layout decides; fit before any pin.

Checkpoints are header-only (shapes and dtypes, no data); the independent count of each card's weights is
``checkpoints.expected`` (the arrays sliced as the test states vLLM loads them), never rigsmith's.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from rigsmith import spec as specmod
from rigsmith.project import Project
from rigsmith.resolving.fit import checkpoint, fit
from rigsmith.resolving.fit.checkpoint import LocalCheckpoint
from rigsmith.resolving.lock import lock
from tests.support import checkpoints as ck
from tests.support.common import REPO
from tests.support.hubserver import HubServer
from tests.support.models import run_cli
from tests.support.recipes import import_cli, task_cli
from tests.support.replay import stand_in

GiB = fit.GiB
DATA = REPO / "tests" / "operating" / "data"
RTX3090, RTX3060, A6000 = (
    ("NVIDIA GeForce RTX 3090", 24576),
    ("NVIDIA GeForce RTX 3060", 12288),
    (
        "NVIDIA RTX A6000",
        49140,
    ),
)


def big_dense(layers: int, inter: int = 23552) -> ck.Arch:
    """Qwen2.5-32B-like dense model (hidden 5120, 40 heads over 8 KV heads of 128, 16-bit): 64 layers are
    53.5 GiB of weights."""
    return ck.dense(layers, (5120, 40, 8, 128, 152064), inter, lazy=True, max_pos=32768)


def imported(tmp: Path, a: ck.Arch, flags: str, prefix: str = "") -> tuple[Path, Path, Path]:
    """A checkout with `vllm serve MODEL FLAGS` imported as deployments/m.yaml: (root, spec path, recipe)."""
    model = a.headers(tmp / "models" / "M")
    recipe = tmp / "serve.sh"
    recipe.write_text(f"{prefix}vllm serve {model} {flags}\n", encoding="utf-8")
    root = tmp / "proj"
    (root / "deployments").mkdir(parents=True)
    r = import_cli(root, str(recipe), "--name", "m", "--image", "localhost/vllm:1")
    assert r.returncode == 0, r.stderr
    return root, root / "deployments" / "m.yaml", recipe


def fit_cli(root: Path, path: str, *args: str) -> subprocess.CompletedProcess[str]:
    out = task_cli(root, "fit", *args, HF_HUB_OFFLINE="1", PATH=path)
    assert "Traceback" not in out.stderr, out.stderr
    return out


def applied(spec_path: Path, a: ck.Arch) -> tuple[fit.EngineParams, specmod.Deployment, list[int]]:
    """The spec's engine flags, the spec, and its per-rank weights as fit counts them (checked against the
    independent count)."""
    spec = specmod.load(spec_path)
    p = fit.engine_inputs(spec)
    est = checkpoint.estimate_for(spec, LocalCheckpoint(Path(spec.model.local_dir)))
    n = a.config["num_hidden_layers"]
    parts = [b - s for s, b in fit.pp_partition(n, p.pp, p.pp_partition)]
    stage_of = [k for k, m in enumerate(parts) for _ in range(m)]
    weights = [r.weights for r in est.ranks]
    assert weights == ck.expected(a, p.tp, stage_of)
    return p, spec, weights


def flat(out: str) -> str:
    """The output with the terminal's line wrapping undone."""
    return " ".join(out.split())


def column(out: str, label: str, n: int = 1) -> str:
    """Proposal ``n``'s cell in the row ``label`` of the --propose table."""
    row = next(line for line in out.splitlines() if line.startswith(f"│ {label}"))
    return row.split("│")[2 + n].strip()


def test_a_one_card_recipe_is_spread_over_the_rigs_three_cards_then_fit_says_go(tmp_path: Path) -> None:
    a = big_dense(64)
    root, path, recipe = imported(tmp_path, a, "--max-model-len 16384 --gpu-memory-utilization 0.9")
    smi = stand_in(tmp_path, cards=[RTX3090] * 3)
    r = fit_cli(root, smi)
    assert r.returncode == 1 and "fit: NO-GO on 1 GPU(s)" in r.stdout
    r = fit_cli(root, smi, "--propose")
    assert r.returncode == 0, r.stderr
    assert column(r.stdout, "layout") == "TP1×PP3 KV auto" and column(r.stdout, "GPUs") == "GPU0,GPU1,GPU2"
    assert "proposal 1 wins: " in flat(r.stdout) and "the tightest card is GPU" in flat(r.stdout)
    assert "keep the recipe's --max-model-len 16,384" in flat(r.stdout)
    r = fit_cli(root, smi, "--apply", "1")
    assert r.returncode == 0, r.stderr
    p, spec, weights = applied(path, a)
    assert (p.tp, p.pp, p.max_model_len, p.gpu_memory_utilization) == (1, 3, 16384, 0.9)
    assert spec.resources.gpus.cdi_devices == tuple(f"nvidia.com/gpu={i}" for i in range(3))
    assert sum(weights) > 53 * GiB and max(weights) < 19 * GiB
    r = fit_cli(root, smi)
    assert r.returncode == 0 and r.stdout.rstrip().endswith("fit: GO"), r.stdout
    # the same rig planned without it: one size per card
    assert fit_cli(root, "/usr/bin:/bin", "--vram-gib", "24,24,24").stdout.rstrip().endswith("fit: GO")
    text = path.read_text(encoding="utf-8")
    r = import_cli(root, str(recipe), "--name", "m", "--image", "localhost/vllm:1")
    assert r.returncode == 0, r.stderr
    assert path.read_text(encoding="utf-8") == text  # a re-import keeps the applied layout


def test_a_two_card_recipe_takes_all_four_cards_and_names_the_tp_pairs_that_cross_the_bridge(
    tmp_path: Path,
) -> None:
    a = big_dense(40)
    root, path, _ = imported(tmp_path, a, "-tp 2 --max-model-len 16384", prefix="CUDA_VISIBLE_DEVICES=0,1 ")
    smi = stand_in(tmp_path, "4x3090-idle")
    r = fit_cli(root, smi, "--propose")
    assert r.returncode == 0, r.stderr
    assert column(r.stdout, "GPUs") == "GPU0,GPU1,GPU2,GPU3"
    recipe_kv = int(column(r.stdout, "KV tokens", 0).replace(",", ""))
    assert int(column(r.stdout, "KV tokens").replace(",", "")) > recipe_kv
    # memory first (the objective): TP2×PP2 holds as much KV as TP4 (a V1 engine samples on every TP rank, so
    # TP4's four samplers cost what the TP2×PP2 last stage's LM head does) and keeps TP inside the PIX pairs;
    # TP4 comes second and says that its four TP pairs cross the host bridge between the P2P pairs
    assert column(r.stdout, "layout") == "TP2×PP2 KV auto"
    assert column(r.stdout, "cross-bridge") == "0 TP / 1 PP"
    assert "0 TP pair(s) and 1 stage boundary(ies) cross a PCIe host bridge without P2P" in flat(r.stdout)
    assert "TP2 inside P2P groups (GPU0+GPU1, GPU2+GPU3)" in flat(r.stdout)
    assert (
        column(r.stdout, "layout", 2) == "TP4×PP1 KV auto"
        and column(r.stdout, "cross-bridge", 2) == "4 TP / 0 PP"
    )
    assert "TP4 with 4 GPU pair(s) without P2P (GPU0+GPU1+GPU2+GPU3)" in flat(r.stdout)
    assert fit_cli(root, smi, "--apply", "2").returncode == 0
    p, spec, _ = applied(path, a)
    assert (p.tp, p.pp) == (4, 1) and len(spec.resources.gpus.cdi_devices) == 4
    assert fit_cli(root, smi).stdout.rstrip().endswith("fit: GO")


def test_a_four_card_recipe_on_three_cards_gets_a_split_of_64_layers_that_works(tmp_path: Path) -> None:
    a = big_dense(64)
    root, path, _ = imported(tmp_path, a, "-tp 4 --max-model-len 8192")
    smi = stand_in(tmp_path, "3x3090-squatter")
    r = fit_cli(root, smi)
    assert r.returncode == 1 and "no GPU for rank 3" in r.stdout
    r = fit_cli(root, smi, "--propose")
    assert column(r.stdout, "layout", 0) == "needs more GPUs than the rig has"
    parts = [int(n) for n in column(r.stdout, "layers per stage").split(",")]
    assert column(r.stdout, "layout") == "TP1×PP3 KV auto" and sum(parts) == 64 and len(parts) == 3
    assert fit_cli(root, smi, "--apply", "1").returncode == 0
    p, _, _ = applied(path, a)
    assert (p.tp, p.pp) == (1, 3) and sum(fit.pp_partition(64, 3, p.pp_partition)[-1]) > 0
    r = fit_cli(root, smi)
    assert r.returncode == 0 and "PID 48213 /opt/ComfyUI/venv/bin/python" in r.stdout  # named, not fatal
    assert r.stdout.rstrip().endswith("fit: GO")


def test_a_squatter_on_one_card_gives_that_card_fewer_layers(tmp_path: Path) -> None:
    a = big_dense(64)
    root, path, _ = imported(tmp_path, a, "--max-model-len 8192 --kv-cache-memory 2G")
    smi = stand_in(tmp_path, cards=[RTX3090] * 3, held={0: 3072})
    r = fit_cli(root, smi, "--propose")
    assert r.returncode == 0, r.stderr
    parts = [int(n) for n in column(r.stdout, "layers per stage").split(",")]
    assert parts[0] < min(parts[1:]), parts
    assert "GPU 0 holds a 3072 MiB process" in flat(r.stdout)
    assert "--kv-cache-memory 2147483648 kept" in flat(r.stdout)
    assert fit_cli(root, smi, "--apply", "1").returncode == 0
    p, spec, _ = applied(path, a)
    assert p.pp_partition == tuple(parts) and p.kv_cache_memory == 2 * GiB
    assert any(e.name == "VLLM_PP_LAYER_PARTITION" for e in spec.env)
    r = fit_cli(root, smi)
    assert r.stdout.rstrip().endswith("fit: GO") and "PID 4000 /opt/ComfyUI" in r.stdout


def test_a_3090_beside_a_3060_splits_the_layers_by_free_memory_and_never_tp(tmp_path: Path) -> None:
    # 23 GiB of weights: more than one 3090 holds beside vLLM's default 256 sequences' sampler buffers
    a = big_dense(24)
    root, path, _ = imported(tmp_path, a, "--max-model-len 8192")
    smi = stand_in(tmp_path, cards=[RTX3090, RTX3060])
    r = fit_cli(root, smi, "--propose")
    assert r.returncode == 0, r.stderr
    assert column(r.stdout, "layout") == "TP1×PP2 KV auto" and "TP2" not in r.stdout
    parts = [int(n) for n in column(r.stdout, "layers per stage").split(",")]
    assert parts[0] > 2 * parts[1], parts  # the 24 GiB card takes the larger share
    # and the words say so: the smaller card is why, not the LM head its stage also holds
    assert "GPU1 has 12.00 GiB free where the largest card has 24.00" in flat(r.stdout)
    assert fit_cli(root, smi, "--apply", "1").returncode == 0
    p, spec, weights = applied(path, a)
    assert p.pp_partition == tuple(parts) and weights[0] > 2 * weights[1]
    env = {e.name: e.value for e in spec.env}
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID" and spec.resources.gpus.vram_gib == 12.0
    assert fit_cli(root, smi).stdout.rstrip().endswith("fit: GO")
    # the same rig planned by size
    r = fit_cli(root, "/usr/bin:/bin", "--vram-gib", "24,12")
    assert r.stdout.rstrip().endswith("fit: GO"), r.stdout


def test_a_48_gib_card_among_24s_takes_the_most_layers(tmp_path: Path) -> None:
    a = big_dense(64)
    root, path, _ = imported(tmp_path, a, "--max-model-len 16384")
    smi = stand_in(tmp_path, cards=[RTX3090, A6000, RTX3090])
    r = fit_cli(root, smi, "--propose")
    assert r.returncode == 0, r.stderr
    parts = [int(n) for n in column(r.stdout, "layers per stage").split(",")]
    assert column(r.stdout, "GPUs") == "GPU0,GPU1,GPU2" and parts[1] > max(parts[0], parts[2]), parts
    assert fit_cli(root, smi, "--apply", "1").returncode == 0
    p, _, weights = applied(path, a)
    assert p.pp_partition == tuple(parts) and weights[1] == max(weights)
    assert fit_cli(root, smi).stdout.rstrip().endswith("fit: GO")


def test_a_rig_file_plans_a_rig_you_do_not_have(tmp_path: Path) -> None:
    a = big_dense(32)
    root, _, _ = imported(tmp_path, a, "--max-model-len 8192")
    rig = tmp_path / "rig.yaml"
    rig.write_text(
        "cards:\n  - {name: RTX 3090, total_gib: 24, free_gib: 21, held_by: a desktop}\n"
        "  - {name: RTX 3090, total_gib: 24}\n  - {name: RTX 3060, total_gib: 12}\nlinks: [[0, 1]]\n"
    )
    r = fit_cli(root, "/usr/bin:/bin", "--propose", "--rig", str(rig))
    assert r.returncode == 0, r.stderr
    assert column(r.stdout, "layout") == "TP1×PP3 KV auto" and column(r.stdout, "GPUs") == "GPU0,GPU1,GPU2"
    assert "GPU0 RTX 3090 (21.00 of 24.00 GiB free; a desktop holds 3.00 GiB)" in flat(r.stdout)
    assert "GPU2 RTX 3060 (12.00 of 12.00 GiB free)" in flat(r.stdout)
    rig.write_text('cards: [{name: "RTX\\e[2J 3090", total_gib: 24, free_gib: 20, held_by: "x\\ry"}]\n')
    r = fit_cli(root, "/usr/bin:/bin", "--propose", "--rig", str(rig))
    assert (
        "\x1b" not in r.stdout and "RTX\\x1b[2J 3090" in r.stdout and "x\\ry holds 4.00 GiB" in flat(r.stdout)
    )
    for bad, words in (
        ("cards: []\n", "cards: List should have at least 1 item"),
        ("cards: [{name: x, total_gib: 8, free_gib: 9}]\n", "free_gib 9 is more than total_gib 8"),
        ("cards: [{name: x, total_gib: 8}]\nlinks: [[0, 3]]\n", "links: [0, 3] is not a pair"),
        ("cards: [{name: x, total_gib: -1}]\n", "cards.0.total_gib"),
        (
            "cards: [{name: x, total_gib: 8, nvlink: true}]\n",
            "cards.0.nvlink: Extra inputs are not permitted",
        ),
        ("- a list\n", "(file): Input should be a valid dictionary"),
        ("{", "not YAML"),
    ):
        rig.write_text(bad)
        r = fit_cli(root, "/usr/bin:/bin", "--rig", str(rig))
        assert r.returncode == 1 and words in r.stderr and f"--rig {rig}" in r.stderr, r.stderr
    for flags, words in (
        (("--vram-gib", "24,x"), "'x' is not a number"),
        (("--vram-gib", "24,0"), "'0' is not a size > 0"),
        (("--gpus", "3", "--vram-gib", "24,24"), "disagree"),
        (("--allow", "max-model-len,quality"), "quality is not a value a proposal can change"),
        (("--gpus", "2"), "--gpus 2: no card size known"),
        (("--gpus", "two"), "--gpus 'two' is not a number"),
    ):
        r = fit_cli(root, "/usr/bin:/bin", "--propose", *flags)
        assert r.returncode == 1 and words in r.stderr, r.stderr


# -- the seeds: one verdict, pins kept, apply coherent ------------------------------------------------------


def _seeds(tmp: Path) -> tuple[Path, dict[str, ck.Arch]]:
    root = tmp / "proj"
    root.mkdir()
    shutil.copytree(REPO / "deployments", root / "deployments")
    shutil.copytree(REPO / "images", root / "images")
    archs = {"flash-next-int4-3x3090": ck.seed000_like(), "flash-next-merlin-4x3090": ck.seed003_like()}
    for name, a in archs.items():
        path = root / "deployments" / f"{name}.yaml"
        data = specmod.to_data(specmod.load(path))
        data["model"]["local_dir"] = str(a.headers(tmp / "models" / name))
        path.write_text(specmod.MODELINE + specmod.dump(specmod.from_data(data)), encoding="utf-8")
    return root, archs


def test_seed000_says_no_go_where_its_rows_do_and_no_verdict_without_a_size(tmp_path: Path) -> None:
    root, _ = _seeds(tmp_path)
    nopath = "/usr/bin:/bin"
    dep = ("--deployment", "flash-next-int4-3x3090")
    r = fit_cli(root, nopath, *dep, "--vram-gib", "24")
    # every row: the 550 MB pool holds less than one 262,144-token sequence; the recipe's host KV offload
    # (VLLM_QSA_KV_OFFLOAD=1) is named as not modelled, and the answer is not GO
    assert r.stdout.count("VLLM_QSA_KV_OFFLOAD=1") >= 3 and "fit: GO" not in r.stdout
    assert "fit: WARN on 3 GPU(s), not a GO" in r.stdout
    path = root / "deployments" / "flash-next-int4-3x3090.yaml"
    data = specmod.to_data(specmod.load(path))
    data["resources"]["gpus"].pop("vram_gib")
    data["env"] = [e for e in data["env"] if "KV_OFFLOAD" not in e["name"]]
    path.write_text(specmod.dump(specmod.from_data(data)), encoding="utf-8")
    r = fit_cli(root, nopath, *dep)
    assert r.returncode == 1 and "fit: no verdict: no GPU size known" in r.stderr + r.stdout
    assert "fit: GO" not in r.stdout
    r = fit_cli(root, nopath, *dep, "--propose")
    assert r.returncode == 1 and "no verdict: no GPU size known" in r.stderr
    # without the offload, a pool shorter than one sequence is vLLM refusing to start: NO-GO
    r = fit_cli(root, nopath, *dep, "--vram-gib", "24")
    assert r.returncode == 1 and "fit: NO-GO on 3 GPU(s)" in r.stdout
    assert r.stdout.count("refuses") >= 3 and "OFFLOAD" not in r.stdout  # one per row, in the table


def test_seed003_keeps_its_pins_unless_allowed_and_apply_moves_readiness_and_records_why(
    tmp_path: Path,
) -> None:
    root, archs = _seeds(tmp_path)
    smi = stand_in(tmp_path, "4x3090-idle")
    dep = ("--deployment", "flash-next-merlin-4x3090")
    path = root / "deployments" / "flash-next-merlin-4x3090.yaml"
    before = specmod.load(path)
    with lock.locked(root / "rigsmith.lock"):
        pass  # a lock, so the history has somewhere to be
    # the recipe runs 366 MiB from the limit on its first stage (fit's warn margin is 512 MiB; the driver's
    # reserve and the memory outside PyTorch counted): its own verdict is WARN
    assert (
        fit_cli(root, smi, *dep)
        .stdout.rstrip()
        .endswith("fit: WARN on 4 GPU(s), not a GO (reasons in the table)")
    )
    # on these four idle cards TP4 keeps the recipe's 4.1 GB pool with the margin on every rank (the search
    # and plain fit judge each rank with one computation); shrinking the pool is listed apart
    text = path.read_text(encoding="utf-8")
    r = fit_cli(root, smi, *dep, "--propose")
    assert r.returncode == 0 and "plain fit: WARN: below the asked headroom, not a GO" in flat(r.stdout)
    assert column(r.stdout, "layout", 1) == "TP4×PP1 EP KV fp8_e4m3"
    assert "listed apart, with --allow kv-cache-memory:" in flat(r.stdout)
    # a rig with one card 256 MiB smaller has no layout keeping the pool that is a GO: --apply refuses, naming
    # the --allow that gives one, and writes nothing
    r = fit_cli(root, "/usr/bin:/bin", *dep, "--vram-gib", "24,24,24,23.75", "--apply", "1")
    assert r.returncode == 1 and "with --allow kv-cache-memory one fits" in flat(r.stderr), r.stderr
    assert path.read_text(encoding="utf-8") == text

    # allowed, the pool is the largest every rank holds with fit's 512 MiB left: smaller than the seed's
    r = fit_cli(root, smi, *dep, "--apply", "1", "--allow", "kv-cache-memory")
    assert r.returncode == 0, r.stderr
    grown = specmod.load(path)
    assert grown.engine.args != before.engine.args and path.read_text(encoding="utf-8").startswith(
        specmod.MODELINE
    )
    g = fit.engine_inputs(grown)
    assert g.kv_cache_memory is not None and g.kv_cache_memory < 4_100_000_000
    assert (g.max_model_len, g.kv_cache_dtype) == (262_144, "fp8_e4m3")
    # readiness.kv_cache_tokens moves with the pool: the recipe's figure scaled by fit's exact count of both
    p = fit.engine_inputs(before)
    shape = fit.ModelShape.from_config(archs["flash-next-merlin-4x3090"].config)
    heads = checkpoint.rows(LocalCheckpoint(Path(grown.model.local_dir)))
    rows_ = list(heads)
    old = fit.estimate(shape, p, rows_).kv_tokens([0] * 4)
    new = fit.estimate(shape, g, rows_).kv_tokens([0] * 4)
    assert old and new and grown.readiness.kv_cache_tokens == round(924_993 * new / old)
    assert any("readiness.kv_cache_tokens 924,993 → " in n for n in grown.notes)
    # --apply then plain fit: GO, every rank with fit's margin
    r = fit_cli(root, smi, *dep)
    assert r.returncode == 0 and r.stdout.rstrip().endswith("fit: GO"), r.stdout
    index = (root / ".rigsmith" / "locks" / "index.jsonl").read_text().splitlines()
    last: dict[str, Any] = json.loads(index[-1])
    assert "fit" in last["command"] and "--allow kv-cache-memory" in last["command"]
    assert last["reason"].startswith("flash-next-merlin-4x3090.yaml: proposal 1, TP2×PP2 EP KV fp8_e4m3")


def test_seed000_apply_then_plain_fit_is_go_on_the_rig_it_was_planned_for(tmp_path: Path) -> None:
    root, _ = _seeds(tmp_path)
    nopath = "/usr/bin:/bin"
    dep = ("--deployment", "flash-next-int4-3x3090", "--vram-gib", "24")
    path = root / "deployments" / "flash-next-int4-3x3090.yaml"
    with lock.locked(root / "rigsmith.lock"):
        pass
    # its 550 MB pool holds less than one 262,144-token request: only the host KV offload (not modelled)
    # admits it, so no layout keeping the pins is a GO, and --apply writes none
    r = fit_cli(root, nopath, *dep, "--apply", "1")
    assert r.returncode == 1 and "this rig has 0 proposal(s) that fit" in r.stderr
    r = fit_cli(root, nopath, *dep, "--propose")
    assert "WARN: pool < one request" in r.stdout and "listed apart, with --allow" in flat(r.stdout)
    allow = ("--allow", "max-model-len,kv-cache-memory,kv-cache-dtype")
    r = fit_cli(root, nopath, *dep, "--apply", "1", *allow)
    assert r.returncode == 0, r.stderr
    p = fit.engine_inputs(specmod.load(path))
    assert p.max_model_len is not None and p.max_model_len < 262_144 and p.kv_cache_dtype == "fp8"
    r = fit_cli(root, nopath, *dep)
    assert r.returncode == 0 and r.stdout.rstrip().endswith("fit: GO"), r.stdout


def test_fit_needs_only_the_model_on_a_build_route_with_nothing_pinned(
    hub: HubServer, make_project: Any
) -> None:
    sha = hub.repo("acme/rig-fit").add_commit(ck.dense().files())
    project, _ = make_project("built", repo="acme/rig-fit")
    shutil.copytree(REPO / "images", project.root / "images")
    path = project.spec_path("built")
    data = specmod.to_data(specmod.load(path))
    args = ["/m", "-tp", "2", "--max-model-len", "2048"]
    data["engine"] = {"build": "flash-next-merlin-4x3090", "args": args, "model_arg": 0}
    data["env"] = []
    path.write_text(specmod.dump(specmod.from_data(data)), encoding="utf-8")
    r = run_cli(hub, project, "fit", "--deployment", "built", "--vram-gib", "24")
    assert r.returncode == 0, r.stderr + r.stdout
    assert "fit: GO" in r.stdout and "invoke pin" not in r.stderr
    assert not Project(project.root).lock_path.exists()  # nothing pinned, nothing written
    assert any(
        "/api/models/acme/rig-fit/revision/main" in q.path or sha in q.path for q in hub.hub_requests()
    )


@pytest.mark.parametrize("flags", [("--gpus", "2"), ("--gpus", "2", "--vram-gib", "24")])
def test_gpus_n_plans_that_many_cards_of_the_size(tmp_path: Path, flags: tuple[str, ...]) -> None:
    a = big_dense(32)
    root, path, _ = imported(tmp_path, a, "--max-model-len 8192")
    data = specmod.to_data(specmod.load(path))
    data["resources"]["gpus"]["vram_gib"] = 24.0
    path.write_text(specmod.dump(specmod.from_data(data)), encoding="utf-8")
    r = fit_cli(root, "/usr/bin:/bin", "--propose", *flags)
    assert r.returncode == 0, r.stderr
    assert (
        "on every choice of the rig's 2 GPU(s)" in flat(r.stdout) and column(r.stdout, "GPUs") == "GPU0,GPU1"
    )


def test_the_fields_the_layout_decides_move_with_it(tmp_path: Path) -> None:
    """with_gpus / with_readiness, as --apply uses them: the CDI list, the visible devices renumbered, the
    device order on mixed cards; the published KV size set or dropped with words; start-up grown only."""
    from rigsmith.resolving.fit.applylayout import with_gpus, with_readiness

    spec = ck.make_spec(tmp_path, [], {"CUDA_VISIBLE_DEVICES": "0,1,2,3"})
    assert spec.readiness.kv_cache_tokens == 924_993 and spec.readiness.startup_seconds == 360
    moved = with_gpus(spec, [1, 3], [24.0, 12.0], mixed=True)
    g = moved.resources.gpus
    assert g.cdi_devices == ("nvidia.com/gpu=1", "nvidia.com/gpu=3") and (g.count, g.vram_gib) == (2, 12.0)
    env = {e.name: e.value for e in moved.env}
    assert env == {"CUDA_VISIBLE_DEVICES": "0,1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert "CUDA_DEVICE_ORDER" not in {e.name for e in with_gpus(spec, [0, 1], [24.0, 24.0], False).env}
    dropped, words = with_readiness(spec, None, 1.5)
    r = dropped.readiness
    assert r.kv_cache_tokens is None and (r.startup_seconds, r.warm_startup_seconds) == (540, 270)
    assert "924,993 dropped" in words[0] and "360 → 540" in words[1]
    same, words = with_readiness(spec, 924_993, 0.5)  # a lighter rank does not shrink the budget
    assert same == spec and words == []
    scaled, words = with_readiness(spec, 1_000_000, 1.0)
    assert scaled.readiness.kv_cache_tokens == 1_000_000 and words == [
        "readiness.kv_cache_tokens 924,993 → 1,000,000 (the recipe's figure scaled by the new pool's tokens)"
    ]
