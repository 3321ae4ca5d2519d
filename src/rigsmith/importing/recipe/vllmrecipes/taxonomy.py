"""vLLM recipes' controlled vocabulary, as data: the hardware profiles and single-node serving strategies
its command synthesis reads (the recipe YAML names them; it does not define them).

Copied from https://github.com/vllm-project/recipes (Apache-2.0) at commit
8959cf64189c71d36e11c6a30335f923f261b1f7: ``taxonomy.yaml`` (``hardware_profiles``: brand, generation,
gpu_count, vram_gb, scalable, restricted) and ``strategies/single_node_{tp,tep,dep}.yaml`` (``vllm_args``,
``parallel_flag``). A profile added upstream later is refused by name until it is added here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Hardware:
    """One ``taxonomy.yaml`` hardware profile."""

    brand: str
    generation: str
    gpu_count: int
    vram_gb: int
    scalable: bool = True
    restricted: bool = False


def _hw(
    brand: str, generation: str, gpus: int, vram: int, *, scalable: bool = True, restricted: bool = False
) -> Hardware:
    return Hardware(brand, generation, gpus, vram, scalable, restricted)


#: taxonomy.yaml ``hardware_profiles``, in the file's order (the site's fallback sort depends on it).
HARDWARE: dict[str, Hardware] = {
    "h100": _hw("NVIDIA", "hopper", 8, 640),
    "h200": _hw("NVIDIA", "hopper", 8, 1128),
    "b200": _hw("NVIDIA", "blackwell", 8, 1440),
    "gb200": _hw("NVIDIA", "blackwell", 4, 768),
    "b300": _hw("NVIDIA", "blackwell", 8, 2144),
    "gb300": _hw("NVIDIA", "blackwell", 4, 1152),
    "dgx_station_gb300": _hw("NVIDIA", "blackwell", 1, 252, scalable=False, restricted=True),
    "dgx_spark_gb10": _hw("NVIDIA", "blackwell", 1, 128, restricted=True),
    "rtx_pro_6000": _hw("NVIDIA", "blackwell", 1, 96, scalable=False, restricted=True),
    "rtx_pro_6000_2x": _hw("NVIDIA", "blackwell", 2, 192, scalable=False, restricted=True),
    "rtx_pro_5000": _hw("NVIDIA", "blackwell", 1, 72, scalable=False, restricted=True),
    "rtx_pro_5000_4x": _hw("NVIDIA", "blackwell", 4, 288, scalable=False, restricted=True),
    "rtx_pro_6000_8x": _hw("NVIDIA", "blackwell", 8, 768, scalable=False, restricted=True),
    "rtx_5090": _hw("NVIDIA", "blackwell", 1, 32, scalable=False, restricted=True),
    "rtx_4090_2x": _hw("NVIDIA", "ada", 2, 48, scalable=False, restricted=True),
    "rtx_5090_2x": _hw("NVIDIA", "blackwell", 2, 64, scalable=False, restricted=True),
    "mi300x": _hw("AMD", "amd", 8, 1536),
    "mi325x": _hw("AMD", "amd", 8, 2048),
    "mi355x": _hw("AMD", "amd", 8, 2304),
    "trillium": _hw("Google", "tpu", 8, 256, restricted=True),
    "ironwood": _hw("Google", "tpu", 1, 192, restricted=True),
    "xeon6": _hw("Intel", "cpu", 4, 1024, restricted=True),
    "xeon5": _hw("Intel", "cpu", 4, 1024, restricted=True),
    "arc_pro_b60": _hw("Intel", "xpu", 4, 96, restricted=True),
    "arc_pro_b70": _hw("Intel", "xpu", 4, 128, restricted=True),
    "ascend_950pr": _hw("Huawei", "npu", 1, 128, scalable=False, restricted=True),
}

#: The brands whose GPUs rigsmith passes as CDI devices (nvidia.com/gpu, amd.com/gpu).
GPU_BRANDS = frozenset({"NVIDIA", "AMD"})


@dataclass(frozen=True)
class Strategy:
    """One single-node ``strategies/*.yaml`` (the multi-node and disaggregated ones are not imported)."""

    vllm_args: tuple[str, ...]
    parallel_flag: str


SINGLE_NODE: dict[str, Strategy] = {
    "single_node_tp": Strategy((), "--tensor-parallel-size"),
    "single_node_tep": Strategy(("--enable-expert-parallel",), "--tensor-parallel-size"),
    "single_node_dep": Strategy(("--enable-expert-parallel",), "--data-parallel-size"),
}

#: Precisions whose checkpoints need a hardware generation (command-synthesis.js
#: ``PRECISION_HARDWARE_CONSTRAINTS``).
PRECISION_CONSTRAINTS: dict[str, dict[str, str]] = {
    "nvfp4": {"brand": "NVIDIA", "generation": "blackwell"},
    "fp4": {"brand": "NVIDIA", "generation": "blackwell"},
}

#: command-synthesis.js ``computeDockerMeta`` default images per brand (plain, and when
#: ``model.nightly_required``).
DEFAULT_IMAGES = {
    False: {"nvidia": "vllm/vllm-openai:latest", "amd": "vllm/vllm-openai-rocm:latest"},
    True: {"nvidia": "vllm/vllm-openai:nightly", "amd": "vllm/vllm-openai-rocm:nightly"},
}
