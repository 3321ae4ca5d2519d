"""Which GPUs a recipe uses: explicit device ids, the visible-devices variables, a count in the notes, or
the product of the flags that multiply GPUs."""

from __future__ import annotations

import re
from collections.abc import Sequence

from rigsmith import spec as specmod
from rigsmith.importing import vllmflags
from rigsmith.importing.recipe.flags import flag_values
from rigsmith.importing.recipe.launch import Launch
from rigsmith.importing.recipe.notes import NoteFacts
from rigsmith.importing.recipe.tables import (
    DEFAULT_GPU_VENDOR,
    GPU_VENDOR_HINTS,
    GPUS,
)


def parallel_gpus(launch: Launch) -> int:
    """One engine of TP × PP × PCP GPUs per data-parallel rank on this node (vllmflags.GPU_MULTIPLIERS)."""

    def size(canon: str) -> int:
        vals = flag_values(launch.args, canon)
        n = specmod.ascii_int(vals[-1][1]) if vals else None
        return 1 if n is None else n

    dp_local = bool(flag_values(launch.args, "--data-parallel-size-local"))
    parallel = 1
    for canon in vllmflags.GPU_MULTIPLIERS:
        if canon != ("--data-parallel-size" if dp_local else "--data-parallel-size-local"):
            parallel *= size(canon)
    return parallel


def _gpus(launch: Launch, facts: NoteFacts, vendor: str, problems: list[str]) -> specmod.GpuSpec | None:
    """The GPU request, or None with the reason in problems (more GPUs than one node has)."""
    parallel = parallel_gpus(launch)
    pin_all = bool(launch.gpu_cdi) and any(c.endswith("=all") for c in launch.gpu_cdi or [])
    explicit = None if pin_all else launch.gpu_cdi or launch.gpu_indices
    count = len(explicit) if explicit else facts.gpu_count or launch.gpu_count or parallel
    if count > specmod.MAX_GPUS:
        # Checked before any CDI name is made: a count from the notes or -tp can be any size.
        problems.append(
            f"the recipe asks for {count} GPUs (from {_gpu_count_source(launch, facts, parallel)}); one node "
            f"gives a container at most {specmod.MAX_GPUS}: fix the number in the recipe"
        )
        return None
    if launch.gpu_cdi and not pin_all:
        cdi = tuple(launch.gpu_cdi)
    elif launch.gpu_cdi:
        # "=all" is pinned to 0..N-1 so every target carries the same explicit devices.
        vendor = launch.gpu_cdi[0].split("=", 1)[0]
        cdi = tuple(f"{vendor}={i}" for i in range(count))
    elif launch.gpu_indices:
        cdi = tuple(f"{vendor}={i}" for i in launch.gpu_indices)
    else:
        cdi = tuple(f"{vendor}={i}" for i in range(count))
    vram = GPUS.get(facts.gpu_model or "", (None, None))[0]
    return specmod.GpuSpec(
        count=count,
        model=facts.gpu_model,
        arch=facts.gpu_arch,
        vram_gib=vram,
        cdi_devices=cdi,
        p2p=facts.p2p or "unknown",
        nvlink=facts.nvlink,
    )


#: Variables that select GPUs by the host's numbering: CUDA's, ROCm's HIP/ROCR, and the NVIDIA container
#: runtime's (``docker run --runtime nvidia -e NVIDIA_VISIBLE_DEVICES=0,1``).
_VISIBLE_DEVICES = (
    "CUDA_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "NVIDIA_VISIBLE_DEVICES",
)
#: Values that select no particular devices (every GPU, or none).
_NO_SELECTION = frozenset({"all", "none", "void", "-1", "NoDevFiles"})
_DEVICE_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]*")


def _visible_devices(
    env: Sequence[specmod.EnvVar], launch: Launch, problems: list[str]
) -> list[specmod.EnvVar]:
    """``CUDA_VISIBLE_DEVICES=2,3`` on a host (or in a container that sees every GPU) picks GPUs 2 and 3:
    they become the CDI devices, and inside the container, which sees only those two as 0 and 1, the
    variable is renumbered ``0,1`` (left as ``2,3`` CUDA finds no device)."""
    out = list(env)
    if launch.gpu_indices or (launch.gpu_cdi and not all(c.endswith("=all") for c in launch.gpu_cdi)):
        return out  # the devices are chosen already; the variable counts in the container's numbering
    picked: list[str] | None = None
    for k, e in enumerate(out):
        if e.name not in _VISIBLE_DEVICES or e.secret or "$" in e.value or "<" in e.value:
            continue
        ids = [x.strip() for x in e.value.split(",")]
        if not all(_DEVICE_ID_RE.fullmatch(x) for x in ids) or _NO_SELECTION & set(ids):
            continue
        if picked is not None and picked != ids:
            problems.append(
                f"env: {e.name}={e.value} selects other GPUs than {','.join(picked)} chosen by another "
                "*_VISIBLE_DEVICES variable; keep one selection"
            )
            continue
        picked = ids
        renumbered = ",".join(str(i) for i in range(len(ids)))
        out[k] = e.model_copy(update={"value": renumbered})
        if renumbered != e.value:
            launch.notes.append(
                f"{e.name}={e.value} selects the host's GPUs {e.value}: they are the CDI devices, and inside "
                f"the container (which sees them as 0..{len(ids) - 1}) the variable is {renumbered}"
            )
    if picked is not None:
        launch.gpu_indices = picked
        launch.gpu_cdi = None
    return out


def _gpu_count_source(launch: Launch, facts: NoteFacts, parallel: int) -> str:
    if launch.gpu_cdi or launch.gpu_indices:
        return "its device list"
    if facts.gpu_count:
        return "the notes"
    if launch.gpu_count:
        return "--gpus or the compose device count"
    return f"the parallel sizes, {parallel} in all"


def _vendor(env: Sequence[specmod.EnvVar], image: str | None = None) -> str:
    """The GPU vendor the env (ROCm's variables) or the image (a ROCm build) shows; NVIDIA otherwise."""
    for e in env:
        for pattern, vendor in GPU_VENDOR_HINTS:
            if pattern.match(e.name):
                return vendor
    if image is not None and _ROCM_IMAGE_RE.search(image):
        return "amd.com/gpu"
    return DEFAULT_GPU_VENDOR


#: vLLM ``--device`` values (and image names) of platforms rigsmith does not deploy, and what each is.
#: rigsmith passes GPUs as CDI devices of NVIDIA's or AMD's kind; ``cuda``/``auto`` is either of them.
FOREIGN_DEVICES = {
    "xpu": "Intel GPUs (XPU)",
    "cpu": "the CPU, with no GPU",
    "tpu": "Google TPUs",
    "hpu": "Intel Gaudi accelerators (HPU)",
    "gaudi": "Intel Gaudi accelerators (HPU)",
    "neuron": "AWS Neuron accelerators",
}
_FOREIGN_IMAGE_RE = re.compile(
    r"(?:^|[/_.:-])(" + "|".join(FOREIGN_DEVICES) + r")(?=$|[/_.:-])", re.IGNORECASE
)
_ROCM_IMAGE_RE = re.compile(r"rocm", re.IGNORECASE)
#: GPUs one box usually has: more from a lone serve command suggests a multi-node recipe.
ONE_BOX_GPUS = 8


def device_problems(launch: Launch, image: str | None, problems: list[str]) -> None:
    """Refuse a recipe for a platform rigsmith does not deploy (vLLM's ``--device xpu``/``cpu``/…, or an
    ``image`` built for one: the one that will run), naming it: its GPUs would otherwise become NVIDIA CDI
    devices."""
    for i, a in enumerate(launch.args):
        if a == "--device" and i + 1 < len(launch.args):
            value = launch.args[i + 1]
        elif a.startswith("--device="):
            value = a.split("=", 1)[1]
        else:
            continue
        what = FOREIGN_DEVICES.get(value.lower())
        if what is not None:
            problems.append(
                f"args[{i}]: --device {value}: the recipe runs vLLM on {what}; rigsmith deploys on NVIDIA "
                "and AMD GPUs (CDI nvidia.com/gpu, amd.com/gpu) only, so this recipe cannot be imported as "
                "written: import the CUDA or ROCm recipe of this model"
            )
    found = _FOREIGN_IMAGE_RE.search(image) if image is not None else None
    if found is not None:
        problems.append(
            f"engine.image: {image} is a vLLM build for {FOREIGN_DEVICES[found.group(1).lower()]}; rigsmith "
            "deploys on NVIDIA and AMD GPUs only: import the CUDA or ROCm recipe (or pass --image with "
            "such a build)"
        )


def device_notes(launch: Launch, gpus: specmod.GpuSpec, parallel: int, notes: list[str]) -> None:
    """Say what import chose for GPUs the recipe left open (``--gpus all``, ``=all``), and that a lone
    serve asking for more GPUs than one box usually has may be a multi-node recipe."""
    first = ", ".join(gpus.cdi_devices[:4]) + (", …" if gpus.count > 4 else "")
    every = launch.gpus_all or next((c for c in launch.gpu_cdi or () if c.endswith("=all")), None)
    if every and not launch.gpu_indices and gpus.count:
        many = gpus.count > 1
        notes.append(
            f"the recipe's container saw every GPU ({every}); its parallel sizes use {gpus.count}, "
            f"so GPU{'s' if many else ''} {first} {'were' if many else 'was'} chosen: set "
            "resources.gpus.cdi_devices to use others"
        )
    if launch.node_args or launch.ray_nodes:
        return
    if max(parallel, gpus.count) > ONE_BOX_GPUS:
        notes.append(
            f"this may be a multi-node recipe: it asks for {max(parallel, gpus.count)} GPUs (TP × PP × DP of "
            f"the flags: {parallel}) and one box usually has at most {ONE_BOX_GPUS}; as imported it is one "
            "host with them all. If it runs on several machines, describe them in the spec's cluster section "
            "(README: multi-node), one node per machine"
        )
