"""Re-import (issue 24): values from flags are the user's side of the three-way merge, conflict labels name
the right sides, an unchanged recipe re-imported is exit 0 and writes nothing (the proposed image.yaml
included), and the user's explicit `enabled: true` on an opt-in survives a merge."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import yaml

from rigsmith.project import Project
from tests.support.common import REPO
from tests.support.recipes import import_cli

SEED003 = REPO / "examples/recipes/qwen3-8-flash-next-w4a16-merlin-on-4x-rtx-3090-tp2xpp2-ep-mtp3-f.json"


def _spec(project: Project, name: str) -> dict[str, object]:
    data = yaml.safe_load((project.root / "deployments" / f"{name}.yaml").read_text())
    assert isinstance(data, dict)
    return data


def _set_image(project: Project, name: str, image: str) -> None:
    path = project.root / "deployments" / f"{name}.yaml"
    data = yaml.safe_load(path.read_text())
    data["engine"]["image"] = image
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def _snapshot(root: Path) -> dict[str, tuple[bytes, int]]:
    return {
        str(p.relative_to(root)): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in root.rglob("*")
        if p.is_file()
    }


def test_an_image_flag_is_the_users_side_not_upstreams(empty_project: Project, tmp_path: Path) -> None:
    recipe = tmp_path / "r.sh"
    recipe.write_text("vllm serve Qwen/Qwen3-8B --port 8000\n")
    assert (
        import_cli(empty_project.root, str(recipe), "--name", "q", "--image", "a.example/a:1").returncode == 0
    )
    base = yaml.safe_load((empty_project.root / "deployments/.base/q.yaml").read_text())
    assert base["engine"].get("image") is None, "the flag value was recorded as the recipe's"
    _set_image(empty_project, "q", "b.example/b:1")
    recipe.write_text("vllm serve Qwen/Qwen3-8B --port 8001\n")  # upstream changes something else
    proc = import_cli(empty_project.root, str(recipe), "--name", "q", "--yes")
    assert proc.returncode == 0, proc.stderr
    spec = _spec(empty_project, "q")
    assert spec["engine"]["image"] == "b.example/b:1" and "8001" in spec["engine"]["args"]  # type: ignore[index]
    # A flag on a re-import is the user's new choice: it wins without a conflict.
    proc = import_cli(empty_project.root, str(recipe), "--name", "q", "--image", "c.example/c:1", "--yes")
    assert proc.returncode == 0, proc.stderr
    assert _spec(empty_project, "q")["engine"]["image"] == "c.example/c:1"  # type: ignore[index]


def test_a_conflict_names_yours_upstream_and_was_right(empty_project: Project, tmp_path: Path) -> None:
    recipe = tmp_path / "r.sh"
    recipe.write_text("docker run --gpus 1 r.example/vllm:1 --model Qwen/Qwen3-8B\n")
    assert import_cli(empty_project.root, str(recipe), "--name", "c").returncode == 0
    _set_image(empty_project, "c", "mine.example/vllm:1")
    recipe.write_text("docker run --gpus 1 r.example/vllm:2 --model Qwen/Qwen3-8B\n")
    proc = import_cli(empty_project.root, str(recipe), "--name", "c", "--yes")
    assert proc.returncode == 1
    assert (
        "engine.image: yours 'mine.example/vllm:1', upstream 'r.example/vllm:2' (was 'r.example/vllm:1')"
        in (proc.stderr.replace("\n", " "))
    )


def test_an_unchanged_recipe_reimported_exits_0_and_writes_nothing(empty_project: Project) -> None:
    recipe = empty_project.root / "seed003.json"
    shutil.copy(SEED003, recipe)
    proc = import_cli(empty_project.root, str(recipe), "--name", "s3", "--yes")
    assert proc.returncode == 0, proc.stderr
    images = list((empty_project.root / "images").rglob("image.yaml"))
    assert images, "seed 003's notes propose an image"
    # The user moves the proposed tree in image.yaml (what a re-proposal would want to move back).
    data = yaml.safe_load(images[0].read_text())
    data["tree"]["dest"] = "/opt/elsewhere"
    images[0].write_text(yaml.safe_dump(data, sort_keys=False))
    before = _snapshot(empty_project.root)
    proc = import_cli(empty_project.root, str(recipe), "--name", "s3")
    assert proc.returncode == 0, proc.stderr
    assert "has not changed since the last import" in proc.stdout
    assert _snapshot(empty_project.root) == before


def test_an_explicit_enabled_true_survives_a_merge(empty_project: Project, tmp_path: Path) -> None:
    recipe = tmp_path / "seed003.json"
    shutil.copy(SEED003, recipe)
    assert import_cli(empty_project.root, str(recipe), "--name", "s3", "--yes").returncode == 0
    path = empty_project.root / "deployments/s3.yaml"
    data = yaml.safe_load(path.read_text())
    opt = next(e for e in data["env"] if e.get("opt_in"))
    opt["enabled"] = True
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    changed = json.loads(SEED003.read_text())
    changed["title"] += " (revised)"
    recipe.write_text(json.dumps(changed))
    proc = import_cli(empty_project.root, str(recipe), "--name", "s3", "--yes")
    assert proc.returncode == 0, proc.stderr
    after = yaml.safe_load(path.read_text())
    entry = next(e for e in after["env"] if e["name"] == opt["name"])
    assert entry["enabled"] is True and after["description"].endswith("(revised)")


def _seed003_with(tmp_path: Path, **moves: str) -> Path:
    """Seed 003 with ``--flag old`` replaced by ``--flag new`` for each move (flag → "old new")."""
    data = json.loads(SEED003.read_text())
    for flag, change in moves.items():
        old, new = change.split()
        assert f"{flag} {old} " in data["command"]
        data["command"] = data["command"].replace(f"{flag} {old} ", f"{flag} {new} ")
    path = tmp_path / "seed003.json"
    path.write_text(json.dumps(data))
    return path


def _set_flag(project: Project, name: str, flag: str, value: str) -> None:
    path = project.root / "deployments" / f"{name}.yaml"
    data = yaml.safe_load(path.read_text())
    args = data["engine"]["args"]
    args[args.index(flag) + 1] = value
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def _flag(project: Project, name: str, flag: str) -> str:
    args = _spec(project, name)["engine"]["args"]  # type: ignore[index]
    return str(args[args.index(flag) + 1])


def test_an_argv_conflict_is_one_flag_and_flags_one_side_moved_merge(
    empty_project: Project, tmp_path: Path
) -> None:
    recipe = _seed003_with(tmp_path)
    assert import_cli(empty_project.root, str(recipe), "--name", "s3", "--yes").returncode == 0
    _set_flag(empty_project, "s3", "--max-num-seqs", "6")
    _set_flag(empty_project, "s3", "--gpu-memory-utilization", "0.9")
    # upstream moves --max-num-seqs too (a conflict) and --max-num-batched-tokens (only upstream: merged)
    _seed003_with(tmp_path, **{"--max-num-seqs": "8 16", "--max-num-batched-tokens": "1024 2048"})
    proc = import_cli(empty_project.root, str(recipe), "--name", "s3", "--yes")
    assert proc.returncode == 1
    err = " ".join(proc.stderr.split())
    assert "engine.args --max-num-seqs: yours 6 · upstream 16 · was 8" in err, proc.stderr
    assert "engine.args:" not in err and "['" not in err  # no whole argv printed
    assert "--gpu-memory-utilization" not in err and "--max-num-batched-tokens" not in err
    assert _flag(empty_project, "s3", "--max-num-seqs") == "6"  # nothing written
    proc = import_cli(empty_project.root, str(recipe), "--name", "s3", "--yes", "--ours")
    assert proc.returncode == 0, proc.stderr
    assert _flag(empty_project, "s3", "--max-num-seqs") == "6"
    assert _flag(empty_project, "s3", "--gpu-memory-utilization") == "0.9"  # the user's edit kept
    assert _flag(empty_project, "s3", "--max-num-batched-tokens") == "2048"  # upstream's change taken
    model = _spec(empty_project, "s3")["engine"]
    assert model["args"][model["model_arg"]] == "~/models/Flash-Next-Merlin"  # type: ignore[index]


def test_a_flag_merged_in_before_the_model_word_moves_model_arg_with_it() -> None:
    from rigsmith.importing import reimport
    from rigsmith.merge import merge3

    base = {"engine": {"args": ["--port", "1", "--model", "Q/M"], "model_arg": 3}}
    ours = {"engine": {"args": ["--port", "2", "--model", "Q/M"], "model_arg": 3}}  # the user's port
    # upstream adds --dtype before --port: its model_arg becomes 5, the merged argv puts --dtype last
    theirs = {"engine": {"args": ["--dtype", "half", "--port", "1", "--model", "Q/M"], "model_arg": 5}}
    merged = merge3(base, ours, theirs, argv=("engine.args",))
    assert merged.conflicts == ()
    assert merged.value["engine"] == {
        "args": ["--port", "2", "--model", "Q/M", "--dtype", "half"],
        "model_arg": 5,
    }
    fixed = reimport.args_indexes_kept(merged.value, ours, theirs)["engine"]
    assert fixed["model_arg"] == 3 and fixed["args"][3] == "Q/M"


FLAG = ("--image", "localhost/vllm-stand-in:1")


def _imported_with_an_image_then_edited(project: Project, tmp_path: Path) -> Path:
    """Seed 003 imported with ``--image``, then the spec's image edited by the user; the recipe file."""
    recipe = _seed003_with(tmp_path)
    assert import_cli(project.root, str(recipe), "--name", "s3", *FLAG, "--yes").returncode == 0
    _set_image(project, "s3", "localhost/mine:2")
    return recipe


def test_the_same_image_flag_again_keeps_the_users_edited_image_and_upstreams_flag_merges(
    empty_project: Project, tmp_path: Path
) -> None:
    # issue 38: imported with --image, the image edited in the spec, the same command line re-run on a
    # recipe whose only change is one flag: no conflict, the edit stays, upstream's flag comes in.
    recipe = _imported_with_an_image_then_edited(empty_project, tmp_path)
    recorded = json.loads((empty_project.root / "deployments/.base/s3.flags.json").read_text())
    assert recorded == {"engine.image": "localhost/vllm-stand-in:1"}
    _seed003_with(tmp_path, **{"--max-num-seqs": "8 6"})
    proc = import_cli(empty_project.root, str(recipe), "--name", "s3", *FLAG, "--yes")
    assert proc.returncode == 0, proc.stderr
    assert _spec(empty_project, "s3")["engine"]["image"] == "localhost/mine:2"  # type: ignore[index]
    assert _flag(empty_project, "s3", "--max-num-seqs") == "6"
    # without the flag the same holds: the edit is the user's, the recipe never named an image
    _seed003_with(tmp_path, **{"--max-num-seqs": "8 5"})  # from the original: 8 → 5
    proc = import_cli(empty_project.root, str(recipe), "--name", "s3", "--yes")
    assert proc.returncode == 0, proc.stderr
    assert _spec(empty_project, "s3")["engine"]["image"] == "localhost/mine:2"  # type: ignore[index]
    assert _flag(empty_project, "s3", "--max-num-seqs") == "5"


def test_a_real_conflict_after_an_image_flag_is_one_line_per_flag_with_the_right_labels(
    empty_project: Project, tmp_path: Path
) -> None:
    recipe = _imported_with_an_image_then_edited(empty_project, tmp_path)
    _set_flag(empty_project, "s3", "--max-num-seqs", "4")
    _set_flag(empty_project, "s3", "--max-num-batched-tokens", "512")
    before = (empty_project.root / "deployments/s3.yaml").read_bytes()
    _seed003_with(tmp_path, **{"--max-num-seqs": "8 6", "--max-num-batched-tokens": "1024 2048"})
    proc = import_cli(empty_project.root, str(recipe), "--name", "s3", *FLAG, "--yes")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert "  - engine.args --max-num-seqs: yours 4 · upstream 6 · was 8" in lines, proc.stderr
    assert "  - engine.args --max-num-batched-tokens: yours 512 · upstream 2048 · was 1024" in lines
    assert "engine.image" not in proc.stderr  # nothing upstream touched the image
    assert (empty_project.root / "deployments/s3.yaml").read_bytes() == before  # nothing written
    proc = import_cli(empty_project.root, str(recipe), "--name", "s3", *FLAG, "--yes", "--theirs")
    assert proc.returncode == 0, proc.stderr
    assert _flag(empty_project, "s3", "--max-num-seqs") == "6"
    assert _spec(empty_project, "s3")["engine"]["image"] == "localhost/mine:2"  # type: ignore[index]
