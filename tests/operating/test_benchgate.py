"""bench --compare holds a run against the recipe's published numbers only for this deployment, running from
this lock, at the recipe's workload; otherwise it says why not (issue 27).
Real podman, the stand-in server."""

from __future__ import annotations

from pathlib import Path

from rigsmith.operating.bench import bench
from rigsmith.operating.bench import gate as benchgate
from rigsmith.operating.host import LocalHost
from rigsmith.operating.lifecycle import lifecycle
from rigsmith.operating.lifecycle.lifecycle import Ops
from rigsmith.resolving.lock import lock as lockmod
from tests.support.common import HOST_MEMLOCK, write_project
from tests.support.ops import ops_data
from tests.support.podman import Podman
from tests.support.standin import Standin, StandinConfig


def test_published_numbers_are_compared_only_with_the_running_locked_deployment(
    tmp_path: Path, podman: Podman, fake_cdi: Path, ops_image: str
) -> None:
    data = ops_data(
        tmp_path,
        "gated",
        benchmarks=[{"name": "decode_1stream", "tokens_per_second": 150.0, "tolerance": 0.5}],
    )
    project = write_project(tmp_path, data)
    host = LocalHost(podman.env)
    defaults = {"url": None, "max_tokens": 256, "prompt_words": 512}

    reasons = benchgate.why_not(project, "gated", host, **defaults)  # type: ignore[arg-type]
    assert any("rigsmith.lock pins no model for gated" in r for r in reasons)
    assert any("gated is not running (`invoke up --deployment gated`)" in r for r in reasons)

    repo = data["model"]["repo"]  # type: ignore[index]
    lock = lockmod.Lock(models={"gated": lockmod.LockedModel(repo=repo, commit="a" * 40)})
    project.lock_path.write_text(lockmod.dumps(lock))
    ops = Ops(project, env=podman.env, echo=lambda _l: None)
    port = data["network"]["port"]  # type: ignore[index]
    try:
        lifecycle.up(ops, memlock=HOST_MEMLOCK, ignore_drift=True)  # a lock with no files: a pin, not a fetch
        assert benchgate.why_not(project, "gated", host, **defaults) == []  # type: ignore[arg-type]
        small = benchgate.why_not(
            project, "gated", host, url="http://127.0.0.1:1", max_tokens=64, prompt_words=512
        )
        assert len(small) == 2 and "--url http://127.0.0.1:1" in small[0] and "--max-tokens 64" in small[1]

        with Standin(StandinConfig(model_names=("flash-next-v2",), rate=150.0, ttft=0.01), port=port):
            _s, comparisons = bench.bench_deployment(
                project, "gated", max_tokens=64, prompt_words=20, show_compare=False, echo=lambda _l: None
            )
        refused = benchgate.lines(comparisons, small)
        assert not any("PASS" in ln or "BELOW" in ln or "published" in ln for ln in refused[:-1])
        assert refused[-1].startswith("not compared with the recipe's published numbers: --url")
        passed = benchgate.lines(comparisons, [])
        assert any(ln.startswith("published decode_1stream") and ln.endswith("PASS") for ln in passed)
    finally:
        podman.run("rm", "--force", "--time", "0", "gated", check=False)
    gone = benchgate.why_not(project, "gated", host, **defaults)  # type: ignore[arg-type]
    assert gone == ["gated is not running (`invoke up --deployment gated`)"]
