#!/usr/bin/env python3
"""Benchmark: `invoke build` (rigsmith → docker-py → Podman API) vs plain `podman build`, same Dockerfile.

Run on demand from the repository root:  python3 bench/bench_build.py [--runs N]

It starts its own registry and Podman API service (test settings, shared/ENVIRONMENT.md), pushes a busybox
base, pins it, and times, on one storage, alternating:
  full   — build from clean storage (every image removed; the base is pulled from the registry again)
  no-op  — the same build again (every step from the cache)
for rigsmith's build and for `podman build` of the very context rigsmith rendered (build/images/bench/).
Then the whole commands a user types, process start included: a no-op `invoke build --image bench` vs a
no-op `podman build` CLI of the same context on the same storage (`--checkout DIR` runs the invoke side in
another checkout, e.g. `git archive main | tar -x -C DIR`, to compare before/after in one run).
Then a source image (a tree from git daemon on 127.0.0.1 plus a release asset from a local HTTP server,
pinned once): its no-op `invoke build` — which re-reads the locked commit from the cache, re-verifies the
asset and re-renders the context — against a no-op `podman build` of the same rendered context.
Prints medians and the ratios rigsmith / podman measured in this run. Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "src"), str(REPO)]

from tests.support import services  # noqa: E402
from tests.support.sources import asset_server, git_daemon, serve_release, source_image  # noqa: E402

from rigsmith.project import Project  # noqa: E402
from rigsmith.resolving.image import build as buildmod  # noqa: E402
from rigsmith.resolving.image import engine as enginemod  # noqa: E402
from rigsmith.resolving.image import registry as registrymod  # noqa: E402
from rigsmith.resolving.image import sources as sourcesmod  # noqa: E402

#: A build with real work in it: a patch, an extra file, and a step that writes and hashes 64 MiB.
IMAGE_YAML = """\
version: 1
base: {{name: {name}, tag: "{tag}"}}
files:
  - {{src: greet.txt, dest: /opt/src/greet.txt}}
patches:
  - {{slot: greet, file: patches/greet.patch, target: path, path: /opt/src}}
smoke: ["/bin/sh", "-c", "dd if=/dev/zero of=/opt/blob bs=1M count=64 2>/dev/null && sha256sum /opt/blob"]
"""
PATCH = "--- a/greet.txt\n+++ b/greet.txt\n@@ -1 +1 @@\n-hello\n+hello patched\n"


def _time(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="repetitions of each measurement (median shown)")
    parser.add_argument("--checkout", type=Path, default=REPO, help="checkout whose `invoke build` is timed")
    parser.add_argument("--against", type=Path, help="another checkout whose `invoke build` is timed too")
    args = parser.parse_args()
    missing = services.missing_binaries(["podman", "runc", "docker-registry", "busybox"])
    if missing:
        print(f"missing: {', '.join(missing)}", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="rigsmith-bench-") as tmp:
        base = Path(tmp)
        with (
            services.registry(base / "registry") as reg,
            services.podman_service(base / "podman", [reg.host]) as svc,
        ):
            base_ref = services.push_base(svc, reg, base / "base")
            name, _, tag = base_ref.rpartition(":")
            project = Project(base / "project")
            home = project.images / "bench"
            (home / "patches").mkdir(parents=True)
            (project.root / "deployments").mkdir()
            (home / "image.yaml").write_text(IMAGE_YAML.format(name=name, tag=tag))
            (home / "greet.txt").write_text("hello\n")
            (home / "patches" / "greet.patch").write_text(PATCH)
            resolver = registrymod.Registry({})
            buildmod.pin_images(project, resolver, echo=lambda _: None)
            eng = enginemod.connect("podman", {"CONTAINER_HOST": svc.url})
            context = buildmod.context_dir(project, "bench")

            def clean() -> None:
                svc.cli("rmi", "--all", "--force")

            def rigsmith() -> None:
                buildmod.build_image(project, eng, image="bench", echo=lambda _: None)

            def plain(*extra: str) -> Callable[[], object]:
                dockerfile = str(context / "Dockerfile")
                argv = [
                    "build",
                    "-q",
                    *extra,
                    "-t",
                    "localhost/plain/bench:1",
                    "-f",
                    dockerfile,
                    str(context),
                ]
                return lambda: svc.cli(*argv)

            # The same settings rigsmith asks the API for: fixed timestamp, OCI format.
            plain_pinned = plain("--timestamp", "0", "--format", "oci")

            rigsmith()  # renders the context the plain build uses, and warms both code paths
            keys = (
                "rs_full",
                "rs_noop",
                "pm_full",
                "pm_noop",
                "pt_full",
                "pt_noop",
                "cli_rs",
                "cli_pm",
                "cli_old",
            )
            results: dict[str, list[float]] = {k: [] for k in keys}
            for _ in range(args.runs):
                clean()
                results["rs_full"].append(_time(rigsmith))
                results["rs_noop"].append(_time(rigsmith))
                clean()
                results["pm_full"].append(_time(plain()))
                results["pm_noop"].append(_time(plain()))
                clean()
                results["pt_full"].append(_time(plain_pinned))
                results["pt_noop"].append(_time(plain_pinned))
            # Whole commands, process start included (bytecode cached, as an installed checkout has it).
            invoke = shutil.which("invoke") or "invoke"
            env = {k: v for k, v in os.environ.items() if k not in ("DOCKER_HOST", "PYTHONDONTWRITEBYTECODE")}
            env.update(
                CONTAINER_HOST=svc.url,
                RIGSMITH_ROOT=str(project.root),
                PYTHONPATH=f"{args.checkout / 'src'}:{args.checkout}",
                PYTHONPYCACHEPREFIX=str(base / "pycache"),
            )

            def cli_build(checkout: Path, *first: str) -> Callable[[], object]:
                argv = [invoke, *first, "-r", str(checkout), "build", "--image", "bench"]
                argv += ["--engine", "podman"]
                paths = f"{checkout / 'src'}:{checkout}"
                return lambda: subprocess.run(
                    argv, env={**env, "PYTHONPATH": paths}, check=True, capture_output=True
                )

            # The image and the lock are current. Invoke turns bytecode writing off before it loads tasks.py:
            # the warm-up writes it (--write-pyc), so no timed run compiles rigsmith or its libraries.
            cli_build(args.checkout, "--write-pyc")()
            plain()()
            if args.against is not None:
                cli_build(args.against, "--write-pyc")()
            for _ in range(args.runs):
                results["cli_rs"].append(_time(cli_build(args.checkout)))
                results["cli_pm"].append(_time(plain()))
                if args.against is not None:
                    results["cli_old"].append(_time(cli_build(args.against)))
            results.update(_source_noop(base, base_ref, svc, eng, args.runs))
            eng.close()
            resolver.close()
    med = {k: statistics.median(v) for k, v in results.items() if v}
    podman_version = subprocess.run(["podman", "--version"], capture_output=True, text=True).stdout.strip()
    print(f"image build benchmark ({podman_version}, {args.runs} runs each, median seconds)")
    print(f"  full build   rigsmith {med['rs_full']:7.3f}   podman build {med['pm_full']:7.3f}   "
          f"ratio {med['rs_full'] / med['pm_full']:.2f}")  # fmt: skip
    print(f"  no-op build  rigsmith {med['rs_noop']:7.3f}   podman build {med['pm_noop']:7.3f}   "
          f"ratio {med['rs_noop'] / med['pm_noop']:.2f}")  # fmt: skip
    print(f"  with podman build --timestamp 0 --format oci (rigsmith's settings) as the baseline: "
          f"full {med['rs_full'] / med['pt_full']:.2f}, no-op {med['rs_noop'] / med['pt_noop']:.2f} "
          f"(podman {med['pt_full']:.3f} / {med['pt_noop']:.3f})")  # fmt: skip
    print(f"  no-op, whole command: invoke build {med['cli_rs']:7.3f}   podman build {med['cli_pm']:7.3f}   "
          f"ratio {med['cli_rs'] / med['cli_pm']:.2f}   (goal <= 1.5; checkout {args.checkout})")  # fmt: skip
    if "cli_old" in med:
        print(f"  no-op, whole command, --against {args.against}: invoke build {med['cli_old']:7.3f}   "
              f"ratio {med['cli_old'] / med['cli_pm']:.2f}")  # fmt: skip
    rs, pm = med["rs_noop"] / med["rs_full"], med["pm_noop"] / med["pm_full"]
    print(f"  no-op / full: rigsmith {rs:.2f}, podman {pm:.2f}")
    print(f"  source image ({TREE_FILES} tree files + 1 asset), no-op: rigsmith {med['src_rs_noop']:7.3f}   "
          f"podman build --timestamp 0 --format oci {med['src_pt_noop']:7.3f}   "
          f"ratio {med['src_rs_noop'] / med['src_pt_noop']:.2f}")  # fmt: skip
    return 0


#: Files added to the source tree (4 KiB each), so reading the commit and rendering the context show.
TREE_FILES = 400


def _source_noop(
    base: Path, base_ref: str, svc: services.PodmanService, eng: enginemod.DockerPyEngine, runs: int
) -> dict[str, list[float]]:
    """No-op build of a pinned source image: rigsmith vs `podman build` of the same rendered context."""
    out: dict[str, list[float]] = {"src_rs_noop": [], "src_pt_noop": []}
    with git_daemon(base / "git") as upstream, asset_server() as assets:
        upstream.commit({f"pkg/m{i:04d}.py": f"# {i}\n" + "x" * 4096 for i in range(TREE_FILES)}, "bulk")
        root = base / "source-project"
        urls = serve_release(assets)
        source_image(root, base_ref, upstream.url, "main", {"compiled-ops": urls["compiled-ops"]})
        project = Project(root)
        resolver = registrymod.Registry({})
        src = sourcesmod.Sources(base / "cache")
        try:
            buildmod.pin_images(project, resolver, echo=lambda _: None)
            sourcesmod.pin_sources(project, src, sourcesmod.check_filled(project), echo=lambda _: None)

            def rigsmith() -> None:
                buildmod.build_image(project, eng, image="merlin", echo=lambda _: None, sources=src)

            context = buildmod.context_dir(project, "merlin")

            def plain() -> None:
                svc.cli("build", "-q", "--timestamp", "0", "--format", "oci", "-t", "localhost/plain/src:1",
                        "-f", str(context / "Dockerfile"), str(context))  # fmt: skip

            rigsmith()
            plain()
            for _ in range(runs):
                out["src_rs_noop"].append(_time(rigsmith))
                out["src_pt_noop"].append(_time(plain))
        finally:
            src.close()
            resolver.close()
    return out


if __name__ == "__main__":
    raise SystemExit(main())
