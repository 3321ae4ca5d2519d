"""vLLM recipes' command synthesis for one single-node deployment: recipe YAML + variant + hardware profile
→ the ``vllm serve`` argv, the env and the image the recipes site (and its JSON API) shows.

A port of the single-node path of ``src/lib/command-synthesis.js`` (``resolveCommand``, ``dedupeArgs``,
``computeDockerMeta``) and of the recommended-strategy choice in ``scripts/build-recipes-api.mjs``
(``buildVariantRendering``), https://github.com/vllm-project/recipes at commit
8959cf64189c71d36e11c6a30335f923f261b1f7 (Apache-2.0). Each function names the JS function it follows;
the order of the argument sources is theirs, because their last-wins dedupe makes order meaningful.
The input is already shape-checked (:mod:`.yamlform`); this module is pure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from rigsmith.importing.recipe.vllmrecipes.taxonomy import (
    DEFAULT_IMAGES,
    HARDWARE,
    PRECISION_CONSTRAINTS,
    SINGLE_NODE,
    Hardware,
)

Recipe = dict[str, Any]


@dataclass
class Synth:
    """One rendering: what the site's command block shows for (variant, hardware)."""

    variant: str
    hardware: str
    strategy: str
    argv: list[str]
    env: dict[str, str]
    image: str
    features: list[str] = field(default_factory=list)


class Unsynthesizable(Exception):
    """The (variant, hardware) pair renders no single-node command; the message says why and what to do."""


def js_str(value: Any) -> str:
    """JavaScript's ``String(value)`` for the scalars a YAML value can be (the site's argv and env)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, int) and abs(value) > 2**53:
        # The site's YAML reader makes every number a JavaScript double.
        try:
            value = float(value)
        except OverflowError:
            value = math.inf if value > 0 else -math.inf
    if isinstance(value, float):
        return _js_number(value)
    return str(value)


def _js_number(x: float) -> str:
    """ECMAScript's Number::toString(x): the same shortest round-trip digits as Python's ``repr``, laid
    out by its own rule (plain notation from 1e-6 up to 1e21, ``1e-7`` / ``1e+21`` beyond)."""
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "Infinity" if x > 0 else "-Infinity"
    if x == 0:
        return "0"
    sign, (digits, exp) = "-" if x < 0 else "", _digits(abs(x))
    k, n = len(digits), len(digits) + exp  # n: where the decimal point goes
    if k <= n <= 21:
        return sign + digits + "0" * (n - k)
    if 0 < n <= 21:
        return sign + digits[:n] + "." + digits[n:]
    if -6 < n <= 0:
        return sign + "0." + "0" * -n + digits
    e = n - 1
    mantissa = digits if k == 1 else digits[0] + "." + digits[1:]
    return f"{sign}{mantissa}e{'+' if e >= 0 else '-'}{abs(e)}"


def _digits(x: float) -> tuple[str, int]:
    """The shortest digits that round-trip ``x`` (> 0) and their exponent: ``x == int(digits) * 10**exp``."""
    mantissa, _, exp = repr(x).partition("e")
    whole, _, frac = mantissa.partition(".")
    digits = (whole + frac).lstrip("0")
    stripped = digits.rstrip("0")
    return stripped, int(exp or 0) - len(frac) + len(digits) - len(stripped)


def _d(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _l(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _hw_keyed(table: Any, hw: Hardware, hw_id: str) -> Any:
    """``hardwareKeyedValue``: exact GPU id > generation > brand (lowercase) > ``default``."""
    t = _d(table)
    for key in (hw_id, hw.generation, hw.brand.lower(), "default"):
        if t.get(key) is not None:
            return t[key]
    return None


def _gen_block(table: Any, hw: Hardware) -> dict[str, Any] | None:
    """A generation-keyed override block, with the brand-wide ``nvidia`` fallback on NVIDIA GPUs."""
    t = _d(table)
    block = t.get(hw.generation) or (t.get("nvidia") if hw.brand == "NVIDIA" else None)
    return block if isinstance(block, dict) and block else None


# -- hardware and strategy choice --------------------------------------------------------------------


def _constraint(variant: dict[str, Any]) -> dict[str, str] | None:
    c = variant.get("precision_hardware") or PRECISION_CONSTRAINTS.get(variant.get("precision") or "")
    return c if isinstance(c, dict) else None


def hardware_problem(recipe: Recipe, variant: dict[str, Any], hw_id: str) -> str | None:
    """Why ``hw_id`` is not offered for the variant (``listCompatibleHardware`` + the picker's
    restricted-profile rule), or None."""
    hw = HARDWARE[hw_id]
    c = _constraint(variant) or {}
    if (c.get("brand") and hw.brand != c["brand"]) or (
        c.get("generation") and hw.generation != c["generation"]
    ):
        return f"its precision needs {c.get('brand', '')} {c.get('generation', '')} GPUs".replace("  ", " ")
    if _d(_d(recipe.get("meta")).get("hardware")).get(hw_id) == "unsupported":
        return f"the recipe marks {hw_id} unsupported (meta.hardware)"
    supported = variant.get("supported_hardware")
    if isinstance(supported, list) and supported and hw_id not in supported:
        return f"the variant lists only {', '.join(map(str, supported))} (supported_hardware)"
    if hw.restricted and hw_id not in _d(_d(recipe.get("meta")).get("hardware")):
        return f"{hw_id} is a restricted profile the recipe does not declare in meta.hardware"
    return None


def default_hardware(recipe: Recipe, variant: dict[str, Any]) -> str:
    """``pickDefaultHardware``: the recipe's ``meta.default_hardware`` if offered, B200/GB200 for a
    Blackwell-only precision, else H200, else NVIDIA first then alphabetical."""
    offered = [h for h in HARDWARE if hardware_problem(recipe, variant, h) is None]
    authored = _d(recipe.get("meta")).get("default_hardware")
    if authored in offered:
        return str(authored)
    if (_constraint(variant) or {}).get("generation") == "blackwell":
        for pick in ("b200", "gb200"):
            if pick in offered:
                return pick
    if "h200" in offered:
        return "h200"
    order = {"NVIDIA": 0, "AMD": 1}
    offered.sort(key=lambda h: (order.get(HARDWARE[h].brand, 9), h))
    return offered[0] if offered else "h200"


def _compatible(recipe: Recipe) -> list[str]:
    """``effectiveCompatibleStrategies``: the listed strategies plus those granted ``supported``."""
    listed = [str(s) for s in _l(recipe.get("compatible_strategies"))]
    grants = [
        str(s)
        for s, m in _d(recipe.get("strategy_hardware")).items()
        if s not in listed and isinstance(m, dict) and "supported" in m.values()
    ]
    return listed + grants


def _min_gpus(recipe: Recipe, key: str, hw_id: str) -> int:
    """``minGpusForStrategy``."""
    cfg = recipe.get("strategy_min_gpus")
    if cfg is None:
        return 0
    if isinstance(cfg, int | float):
        return int(cfg)

    def block(b: Any) -> int:
        if isinstance(b, int | float) and not isinstance(b, bool):
            return int(b)
        b = _d(b)
        for k in (key, f"multi_node_{key}", f"single_node_{key}"):
            if b.get(k) is not None:
                return int(b[k])
        return 0

    return max(block(cfg), block(_d(cfg).get(hw_id)))


def _offered(recipe: Recipe, s: str, hw: Hardware, hw_id: str) -> bool:
    """``isStrategySupportedOnHardware`` and ``isStrategyReachable`` and the non-scalable rule."""
    gate = _hw_keyed(_d(recipe.get("strategy_hardware")).get(s), hw, hw_id)
    supported = gate != "unsupported" if gate is not None else s in _l(recipe.get("compatible_strategies"))
    if not supported:
        return False
    scales_out = s.startswith("multi_node_") or s == "pd_cluster"
    if (16 if scales_out else 1) * (hw.gpu_count or 8) < _min_gpus(recipe, s, hw_id):
        return False
    return hw.scalable or not scales_out


def strategy(recipe: Recipe, variant: dict[str, Any], hw_id: str) -> str:
    """The strategy of the JSON API's recommended rendering (``buildVariantRendering`` +
    ``recommendStrategy``), or Unsynthesizable when it is not one node."""
    hw = HARDWARE[hw_id]
    compatible = [s for s in _compatible(recipe) if _offered(recipe, s, hw, hw_id)]
    fits = not (variant.get("vram_minimum_gb") or 0) > hw.vram_gb > 0
    nodes = 2 if not fits and hw.scalable and any(s.startswith("multi_node_") for s in compatible) else 1
    pick = _recommend(recipe, nodes)
    if pick not in compatible:
        pick = next((s for s in compatible if s != "pd_cluster"), compatible[0] if compatible else pick)
    if pick not in SINGLE_NODE:
        raise Unsynthesizable(
            f"on {hw_id} ({hw.gpu_count} GPUs, {hw.vram_gb} GB) the recipes site serves it as {pick}, "
            "which this import does not build (one node only); pick a hardware profile on which the site "
            "serves it on one node"
        )
    return pick


def _recommend(recipe: Recipe, nodes: int) -> str:
    """``recommendStrategy``."""
    compatible = _compatible(recipe)
    explicit = recipe.get("default_strategy")
    if explicit and explicit in compatible:
        sibling = str(explicit).replace("single_node_", "multi_node_", 1)
        if nodes <= 1 or not str(explicit).startswith("single_node_"):
            return str(explicit)
        if sibling in compatible:
            return sibling
    if nodes > 1:
        for s in ("multi_node_tp", "multi_node_dep", "multi_node_tep"):
            if s in compatible:
                return s
    if "single_node_tp" in compatible:
        return "single_node_tp"
    return compatible[0] if compatible else "single_node_tp"


def _fitting_variant(recipe: Recipe, hw_id: str) -> str | None:
    """``pickFittingVariant``: on a profile that cannot add nodes, the largest variant that fits it."""
    hw = HARDWARE[hw_id]
    fitting = [
        (k, v)
        for k, v in _d(recipe.get("variants")).items()
        if hardware_problem(recipe, _d(v), hw_id) is None
        and not (_d(v).get("vram_minimum_gb") or 0) > hw.vram_gb > 0
    ]
    fitting.sort(key=lambda kv: -(_d(kv[1]).get("vram_minimum_gb") or 0))
    return str(fitting[0][0]) if fitting else None


# -- the command -------------------------------------------------------------------------------------


def single_node_tp(recipe: Recipe, variant: dict[str, Any], hw_id: str, name: str) -> int:
    """``resolveSingleNodeTp``: the variant's ``tp``, else ``strategy_overrides.single_node_tp.tp``, else
    1 when the weights fit one GPU and the whole node when not (TEP/DEP: the whole node)."""
    hw = HARDWARE[hw_id]
    if name != "single_node_tp":
        return hw.gpu_count
    for raw in (variant.get("tp"), _d(_d(recipe.get("strategy_overrides")).get(name)).get("tp")):
        tp = (
            raw
            if isinstance(raw, int | float) and not isinstance(raw, bool)
            else _hw_keyed(raw, HARDWARE[hw_id], hw_id)
        )
        if isinstance(tp, int | float) and not isinstance(tp, bool) and tp > 0:
            return int(tp) if hw.generation == "cpu" else int(min(tp, hw.gpu_count))
    per_gpu = hw.vram_gb / hw.gpu_count if hw.vram_gb and hw.gpu_count else 0
    need = variant.get("vram_minimum_gb") or 0
    if not need or per_gpu <= 0:
        return hw.gpu_count
    return 1 if need <= per_gpu else hw.gpu_count


def default_features(recipe: Recipe, hw_id: str, variant_key: str) -> list[str]:
    """``defaultFeaturesFor`` (build-recipes-api.mjs): every feature but the opt-in ones, plus those a
    variant's ``default_modes`` turns on."""
    opt_in = set(map(str, _l(recipe.get("opt_in_features"))))
    opt_in |= set(map(str, _l(_d(recipe.get("hardware_opt_in_features")).get(hw_id))))
    forced = set(_d(_d(_d(recipe.get("variants")).get(variant_key)).get("default_modes")))
    return [str(f) for f in _d(recipe.get("features")) if f in forced or f not in opt_in]


def _mode_args(
    feature: dict[str, Any], key: str, variant: dict[str, Any], vkey: str, hw_id: str
) -> list[Any]:
    """``resolveModeKey`` then the mode's args (its hardware override's args when it has one)."""
    hw = HARDWARE[hw_id]
    modes = _d(feature.get("modes"))

    def allowed(m: dict[str, Any]) -> bool:
        only = m.get("variants")
        gate = _d(m.get("hardware"))
        return (not isinstance(only, list) or not only or vkey in only) and "unsupported" not in (
            gate.get(hw.generation),
            gate.get(hw_id),
        )

    keys = [k for k, m in modes.items() if allowed(_d(m))]
    if not keys:
        return []
    pick = next(
        (c for c in (_d(variant.get("default_modes")).get(key), feature.get("default_mode")) if c in keys),
        keys[0],
    )
    mode = _d(modes[pick])
    ho = _hw_keyed(mode.get("hardware_overrides"), hw, hw_id)
    return _l(_d(ho).get("args") if isinstance(ho, dict) and "args" in ho else mode.get("args"))


def _args(recipe: Recipe, vkey: str, hw_id: str, name: str, features: list[str]) -> list[Any]:
    """``resolveCommand``'s ``buildArgs`` for one node: base, variant, strategy + parallel size, strategy
    override, hardware overrides, features — in that order (the dedupe keeps the last of each flag)."""
    hw, variant = HARDWARE[hw_id], _d(_d(recipe.get("variants")).get(vkey))
    so = _d(_d(recipe.get("strategy_overrides")).get(name))
    args: list[Any] = [*_l(_d(recipe.get("model")).get("base_args")), *_l(variant.get("extra_args"))]
    args += _l(_d(_d(variant.get("hardware_overrides")).get(hw_id)).get("extra_args"))
    strat = SINGLE_NODE[name]
    args += [*strat.vllm_args, strat.parallel_flag, str(single_node_tp(recipe, variant, hw_id, name))]
    args += [*_l(so.get("extra_args")), *_l(so.get("vllm_args"))]
    strategy_ho = _gen_block(so.get("hardware_overrides"), hw)
    if strategy_ho is not None:
        args += _l(strategy_ho.get("extra_args"))
    else:
        args += _l(_d(_gen_block(recipe.get("hardware_overrides"), hw)).get("extra_args"))
        args += _l(_d(_gen_block(variant.get("hardware_overrides"), hw)).get("extra_args"))
    args += _l(_d(_d(so.get("hardware_overrides")).get(hw_id)).get("extra_args"))
    for key in features:
        feat = _d(_d(recipe.get("features")).get(key))
        only = feat.get("strategies")
        if isinstance(only, list) and only and name not in only:
            continue
        if isinstance(feat.get("modes"), dict):
            args += _mode_args(feat, key, variant, vkey, hw_id)
            continue
        ho = _gen_block(feat.get("hardware_overrides"), hw)
        args += _l(ho["args"] if ho is not None and "args" in ho else feat.get("args"))
    return args


def _env(recipe: Recipe, vkey: str, hw_id: str, name: str) -> dict[str, Any]:
    """``resolveCommand``'s ``buildEnv`` for one node (single-node strategies set no env of their own)."""
    hw, variant = HARDWARE[hw_id], _d(_d(recipe.get("variants")).get(vkey))
    so = _d(_d(recipe.get("strategy_overrides")).get(name))
    env: dict[str, Any] = dict(_d(_d(recipe.get("model")).get("base_env")))
    env |= _d(variant.get("extra_env"))
    env |= _d(_d(_d(variant.get("hardware_overrides")).get(hw_id)).get("extra_env"))
    env |= _d(so.get("env")) | _d(so.get("extra_env"))
    strategy_ho = _gen_block(so.get("hardware_overrides"), hw)
    if strategy_ho is not None:
        env |= _d(strategy_ho.get("extra_env"))
    else:
        env |= _d(_d(_gen_block(recipe.get("hardware_overrides"), hw)).get("extra_env"))
        env |= _d(_d(_gen_block(variant.get("hardware_overrides"), hw)).get("extra_env"))
    return env | _d(_d(_d(so.get("hardware_overrides")).get(hw_id)).get("extra_env"))


def dedupe(args: list[Any]) -> list[Any]:
    """``dedupeArgs``: ``--flag value`` pairs and bare flags, the last of each flag kept in its place."""
    units: list[tuple[str | None, list[Any]]] = []
    i = 0
    while i < len(args):
        cur = args[i]
        if isinstance(cur, str) and cur.startswith("-"):
            nxt = args[i + 1] if i + 1 < len(args) else None
            if nxt is not None and not (isinstance(nxt, str) and nxt.startswith("-")):
                units.append((cur, [cur, nxt]))
                i += 2
                continue
            units.append((cur, [cur]))
        else:
            units.append((None, [cur]))
        i += 1
    last = {flag: n for n, (flag, _) in enumerate(units) if flag is not None}
    return [w for n, (flag, words) in enumerate(units) if flag is None or last[flag] == n for w in words]


def _image(recipe: Recipe, variant: dict[str, Any], hw_id: str) -> str:
    """``computeDockerMeta``'s image for an NVIDIA or AMD profile."""
    brand = "amd" if HARDWARE[hw_id].brand == "AMD" else "nvidia"
    exact = _d(_d(variant.get("hardware_overrides")).get(hw_id)).get("docker_image")
    if isinstance(exact, str):
        return exact
    for override in (variant.get("docker_image"), _d(recipe.get("model")).get("docker_image")):
        if isinstance(override, str) and override and brand == "nvidia":
            return override
        if isinstance(override, dict) and override:
            value = override.get(brand) if {"nvidia", "amd", "tpu", "intel"} & set(override) else override
            if isinstance(value, str):
                return value
            if brand == "nvidia" and isinstance(value, dict) and {"cu129", "cu130"} & set(value):
                return str(value.get("cu130") or value.get("cu129"))
    return DEFAULT_IMAGES[_d(recipe.get("model")).get("nightly_required") is True][brand]


def synthesize(recipe: Recipe, vkey: str, hw_id: str | None) -> Synth:
    """The site's recommended single-node command for variant ``vkey`` on ``hw_id`` (None: the
    hardware the site opens on for that variant)."""
    variant = _d(_d(recipe.get("variants")).get(vkey))
    hw_id = hw_id or default_hardware(recipe, variant)
    hw = HARDWARE[hw_id]
    if not hw.scalable and (variant.get("vram_minimum_gb") or 0) > hw.vram_gb > 0:
        fit = _fitting_variant(recipe, hw_id)
        raise Unsynthesizable(
            f"variant {vkey} needs {variant.get('vram_minimum_gb')} GB and {hw_id} has {hw.vram_gb} GB"
            + (
                f"; the recipes site serves variant {fit} there: import --variant {fit}@{hw_id}"
                if fit
                else ""
            )
        )
    name = strategy(recipe, variant, hw_id)
    features = default_features(recipe, hw_id, vkey)
    args = dedupe([a for a in _args(recipe, vkey, hw_id, name, features) if a not in (None, False, "", 0)])
    model_id = variant.get("model_id") or _d(recipe.get("model")).get("model_id") or "unknown"
    env = {str(k): js_str(v) for k, v in _env(recipe, vkey, hw_id, name).items()}
    argv = ["vllm", "serve", js_str(model_id), *map(js_str, args)]
    return Synth(vkey, hw_id, name, argv, env, _image(recipe, variant, hw_id), features)
