"""The intermediate launch model every recipe form parses into (argv, env, mounts, devices); errors."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from rigsmith import spec as specmod
from rigsmith import yamldoc
from rigsmith.errors import RecipeError, listed, shown

# -- intermediate ------------------------------------------------------------------------------------


@dataclass
class Launch:
    """What one launch command says, before it becomes a Deployment. Problems collect refusals."""

    recipe_executable: str = "vllm"
    executable: str = "vllm"
    subcommand: tuple[str, ...] = ("serve",)
    args: list[str] = field(default_factory=list)
    arg_expands: list[bool] = field(default_factory=list)
    first_arg_positional_ok: bool = True
    env: list[specmod.EnvVar] = field(default_factory=list)
    image: str | None = None
    #: The image word holds shell syntax (``$IMAGE``): its value is unknown.
    image_expands: bool = False
    gpu_indices: list[str] | None = None
    gpu_cdi: list[str] | None = None
    #: The GPU vendor the launch itself shows (ROCm's /dev/kfd), ahead of the env's hints.
    gpu_vendor: str | None = None
    gpu_count: int | None = None
    #: How the recipe gave its container every GPU (``--gpus all``, ``nvidia.com/gpu=all``), or None.
    gpus_all: str | None = None
    shm_size: str | None = None
    memlock: str | int | None = None
    stop_grace: int | None = None
    mounts: list[specmod.Mount] = field(default_factory=list)
    #: Secret values taken out of the args and env; scrubbed from every other field (comments, notes).
    secrets: list[str] = field(default_factory=list)
    #: Host variables known to hold a secret whatever their name (compose interpolation found the value of
    #: a secret in them): ``X=${NAME}`` is a secret passed from the host's NAME at run time.
    secret_refs: set[str] = field(default_factory=set)
    #: A container recipe's port publishes (``-p``, compose ``ports:``; ``""`` is ``-P``); None: not a
    #: container recipe, or one whose publishes were not read.
    published: list[str] | None = None
    #: A container recipe's network (``--network``, compose ``network_mode``); None: the engine's default.
    network: str | None = None
    #: Container paths of the mounts the recipe marked ``:rw`` (it says it writes there).
    writable: set[str] = field(default_factory=set)
    notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    #: Placeholder tokens the import wrote for variables the text uses with no value (``$MODEL`` unset →
    #: ``<MODEL>``): the user fills each; the model may be one (the spec's model.repo is then the token).
    made_placeholders: list[str] = field(default_factory=list)
    #: The made placeholders that stand for a word the published text left to replace (``/path/to/m``,
    #: ``...``): token → that word (importing/recipe/docwords.py, which notes each).
    documentation: dict[str, str] = field(default_factory=dict)
    #: One argv per node (after ``vllm serve``, head first) when the block is a multi-node group.
    node_args: list[list[str]] = field(default_factory=list)
    #: One entry per node of a Ray cluster recipe (importing/recipe/raycluster.py), head first.
    ray_nodes: list[dict[str, Any]] = field(default_factory=list)
    #: That cluster's Ray port (the head's ray start --port).
    ray_port: int | None = None


@dataclass(frozen=True)
class Meta:
    """What the recipe says besides its command."""

    title: str | None = None
    recipe_id: str | None = None
    env_text: str | None = None
    env_map: Mapping[str, str | None] | None = None
    notes_text: str | None = None
    provenance: specmod.Provenance | None = None


@dataclass(frozen=True)
class Asked:
    """What the user asked for on the command line, over what the recipe says."""

    name: str | None = None  # the deployment name
    image: str | None = None  # the container image


def _provenance(source: str, sha256: str, meta: Meta) -> specmod.Provenance:
    return specmod.Provenance(source=source, sha256=sha256, title=meta.title, recipe_id=meta.recipe_id)


def _refuse(source: str, problems: Sequence[str]) -> RecipeError:
    lines = [f"{source}: cannot import this recipe ({len(problems)} problem(s))"]
    # One line per problem: a recipe's line break inside a quoted value is escaped with the rest.
    lines += listed([f"  - {shown(p)}" for p in problems])
    return RecipeError(
        "\n".join(lines),
        hint="fix the recipe text (a local copy is fine: `invoke import-recipe PATH`) and import again",
    )


def read_tree(read: Callable[[str], Any], text: str, source: str, what: str, hint: str) -> Any:
    """``read(text)`` (``json.loads``, ``yamldoc.load_yaml``) as plain data, or one RecipeError saying
    where ``what`` (``the recipe JSON``) breaks: its syntax, its depth, or a value no target carries."""
    problem: str | None
    try:
        data = read(text)
    except json.JSONDecodeError as err:
        problem = f"is not valid JSON: {err.msg} at line {err.lineno} column {err.colno}"
    except ValueError as err:
        # json.loads turns a number into int(text), which refuses more than sys.get_int_max_str_digits()
        # digits (CVE-2020-10735) with a bare ValueError.
        problem = f"is not valid JSON: {' '.join(str(err).split(';')[0].split())}"
    except yaml.YAMLError as err:
        problem = "is " + yamldoc.yaml_problem(err)
    except RecursionError:
        problem = f"is nested more than {yamldoc.MAX_DEPTH} levels deep"
    else:
        problem = yamldoc.tree_problem(data)
        if problem is None:
            return data
    raise RecipeError(f"{source}: {what} {problem}", hint=hint)
