"""`invoke fit --propose` through the CLI.

The recipe is raw command text serving a local header-only checkpoint (no Hub); this machine has no GPU,
so the rig is `--vram-gib 24` idle cards (the captured rigs are tested in test_propose.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support import checkpoints as ck
from tests.support.common import REPO
from tests.support.recipes import import_cli


def fit_cli(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "RIGSMITH_ROOT": str(root), "PYTHONPATH": f"{REPO / 'src'}:{REPO}"}
    env = {k: v for k, v in env.items() if not k.startswith("HF_")} | {"HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, "-m", "invoke", "fit", *args],
        cwd=REPO,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_propose_shows_the_recipe_beside_the_proposals_and_writes_nothing(tmp_path: Path) -> None:
    ckpt = ck.seed000_like().headers(tmp_path / "models" / "Seed0-Like")
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

    r = fit_cli(root, "--propose", "--vram-gib", "24", "--max-model-len", "32768")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "proposal 1" in out and "TP1×PP3 KV auto" in out and "searched " in out
    assert "the recipe's layout does not run as it stands" in out and "Traceback" not in r.stderr
    assert path.read_text(encoding="utf-8") == imported  # --propose writes nothing

    r = fit_cli(root, "--propose", "--headroom-gib", "x", "--vram-gib", "24")
    assert r.returncode == 1 and "--headroom-gib 'x' is not a number" in r.stderr
