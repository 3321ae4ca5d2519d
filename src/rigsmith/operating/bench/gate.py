"""When ``bench --compare`` may hold a run against the recipe's published numbers, and why not otherwise.

A PASS is a claim about a deployment: this spec, this lock, running, measured with the workload the recipe's
numbers are compared at. Anything else answering on the port (a stale container, another server, a run with
a 64-token workload, a checkout with no lock) gives a number that says nothing about the recipe, so the
published rows are left out and the reasons printed instead. Earlier runs of this checkout are still shown:
they carry no verdict.
"""

from __future__ import annotations

from collections.abc import Sequence

from rigsmith.errors import RigsmithError
from rigsmith.operating.bench.bench import DEFAULT_PROMPT_WORDS, Comparison, comparison_lines
from rigsmith.operating.host import Host
from rigsmith.operating.lifecycle.verify import SPEC_LABEL, inspect_argv, parse_inspect
from rigsmith.project import Project
from rigsmith.rendering import plan as planmod
from rigsmith.resolving.lock import lock as lockmod

#: Tokens generated per request when the recipe's published numbers are compared (bench's default).
PUBLISHED_MAX_TOKENS = 256


def why_not(
    project: Project,
    name: str,
    host: Host,
    *,
    url: str | None,
    max_tokens: int,
    prompt_words: int,
) -> list[str]:
    """Every reason the published numbers may not be compared (empty: they may)."""
    spec = project.load(name)
    out = []
    lock = lockmod.read(project.lock_path)
    if spec.model.repo is not None and name not in lock.models:
        out.append(f"rigsmith.lock pins no model for {name} (`invoke pin --deployment {name}`)")
    if url is not None:
        out.append(f"--url {url} is not the deployment's own API; leave --url out")
    if (max_tokens, prompt_words) != (PUBLISHED_MAX_TOKENS, DEFAULT_PROMPT_WORDS):
        out.append(
            f"the workload is --max-tokens {max_tokens} --prompt-words {prompt_words}; the recipe's numbers "
            f"are compared at --max-tokens {PUBLISHED_MAX_TOKENS} --prompt-words {DEFAULT_PROMPT_WORDS} "
            "(leave both out)"
        )
    out += _running_problems(project, name, host, lock)
    return out


def _running_problems(project: Project, name: str, host: Host, lock: lockmod.Lock) -> list[str]:
    res = host.run(inspect_argv(name))
    info = parse_inspect(res.stdout) if res.code == 0 else None
    if not info or not (info.get("State") or {}).get("Running"):
        return [f"{name} is not running (`invoke up --deployment {name}`)"]
    try:
        plan = planmod.make(project.load(name), lock, spec_path=f"deployments/{name}.yaml")
    except RigsmithError as err:
        return [f"cannot tell what {name} should run: {err.message}"]
    out = []
    labels = (info.get("Config") or {}).get("Labels") or {}
    if labels.get(SPEC_LABEL) != dict(plan.labels).get(SPEC_LABEL):
        out.append(
            f"{name} runs from another spec than deployments/{name}.yaml "
            f"(`invoke down --deployment {name}`, then `invoke up --deployment {name}`)"
        )
    image_id = str(info.get("Image") or "")
    if plan.image not in (info.get("ImageName"), image_id) and not image_id.startswith(
        plan.image.removeprefix("sha256:")
    ):
        out.append(f"{name} runs {info.get('ImageName') or image_id}, not the locked {plan.image}")
    return out


def lines(comparisons: Sequence[Comparison], reasons: Sequence[str]) -> list[str]:
    """--compare's output: earlier runs always; the published numbers only when nothing stands against."""
    if not reasons:
        return comparison_lines(comparisons)
    shown = comparison_lines([c for c in comparisons if c.tolerance is None])
    return [
        *shown,
        "not compared with the recipe's published numbers: " + "; ".join(reasons),
    ]
