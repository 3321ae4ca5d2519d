"""vLLM's command-line flags as data: what each takes, which name a model, which multiply the GPUs.

The table follows vLLM's own parser (``vllm/engine/arg_utils.py`` ``EngineArgs.add_cli_args`` and
``vllm/entrypoints/openai/cli_args.py``) and its parallel config (``vllm/config/parallel.py``):

- ``world_size = tensor_parallel_size × pipeline_parallel_size × prefill_context_parallel_size`` GPUs
  per engine, and one engine per data-parallel rank on this node (``--data-parallel-size-local``, else
  ``--data-parallel-size``). ``--decode-context-parallel-size`` shards the KV cache *inside* the tensor
  parallel group (it must divide TP) and ``--enable-expert-parallel`` reuses the TP × DP ranks, so neither
  adds GPUs.
- Flags not in the table take one value unless the next word is another option; the boolean flags
  (``store_true`` and ``BooleanOptionalAction``, with their ``--no-`` form) take none, and ``nargs='+'``
  flags take every word up to the next option, as argparse does. That is what finds a model positional
  written after options (``vllm serve --host 0.0.0.0 Qwen/Qwen3-0.6B``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from rigsmith.digits import ascii_digits

Kind = Literal["value", "bool", "multi", "json"]
ModelRef = Literal["model", "tokenizer", "speculative", "lora"]
#: How a flag's value names local paths (``importing/recipe/pathflags``): ``model`` a model directory or a
#: Hub id (the value; ``--speculative-config``'s "model"; ``--lora-modules`` NAME=PATH or its JSON "path");
#: ``dir``/``file`` a local directory/file (``--chat-template``: unless the value is the template itself);
#: ``json`` the JSON's strings that are paths (a key ending in path/file/dir, or a value starting like one).
Paths = Literal["model", "dir", "file", "json"]


@dataclass(frozen=True)
class Flag:
    """One vLLM flag: its canonical ``--name``, short aliases, what it takes and what it means here."""

    name: str
    kind: Kind = "value"
    aliases: tuple[str, ...] = ()
    #: Part of the product of sizes that gives the GPUs one node runs (see the module docstring).
    multiplies_gpus: bool = False
    #: Whether rigsmith reads the value as a whole number (refused in non-ASCII digits).
    number: bool = False
    #: The value names a model (the main one, or a secondary Hub model that must be fetched too).
    model_ref: ModelRef | None = None
    #: The value names local paths the container must see (see ``Paths``).
    paths: Paths | None = None


def _flags(kind: Kind, names: str) -> list[Flag]:
    return [Flag(n, kind) for n in names.split()]


_TABLE: list[Flag] = [
    Flag("--model", model_ref="model"),
    Flag("--tokenizer", model_ref="tokenizer", paths="model"),
    Flag("--speculative-config", "json", model_ref="speculative", paths="model"),
    Flag("--speculative-model", model_ref="speculative", paths="model"),
    Flag("--lora-modules", "multi", model_ref="lora", paths="model"),
    Flag("--chat-template", paths="file"),
    Flag("--config", paths="file"),
    Flag("--kv-transfer-config", "json", paths="json"),
    Flag("--allowed-local-media-path", paths="dir"),
    Flag("--ssl-keyfile", paths="file"),
    Flag("--ssl-certfile", paths="file"),
    Flag("--ssl-ca-certs", paths="file"),
    Flag("--tensor-parallel-size", aliases=("-tp",), multiplies_gpus=True, number=True),
    Flag("--pipeline-parallel-size", aliases=("-pp",), multiplies_gpus=True, number=True),
    Flag("--prefill-context-parallel-size", aliases=("-pcp",), multiplies_gpus=True, number=True),
    Flag("--data-parallel-size", aliases=("-dp",), multiplies_gpus=True, number=True),
    Flag("--data-parallel-size-local", aliases=("-dpl",), multiplies_gpus=True, number=True),
    Flag("--decode-context-parallel-size", aliases=("-dcp",), number=True),
    Flag("--data-parallel-start-rank", aliases=("-dpr",), number=True),
    Flag("--data-parallel-address", aliases=("-dpa",)),
    Flag("--data-parallel-rpc-port", aliases=("-dpp",), number=True),
    Flag("--port", number=True),
    Flag("--shutdown-timeout", number=True),
    Flag("--quantization", aliases=("-q",)),
    Flag("--revision"),
    Flag("--host"),
    *_flags(
        "json",
        """
        --compilation-config --hf-overrides --kv-events-config --limit-mm-per-prompt
        --mm-processor-kwargs --override-generation-config --default-chat-template-kwargs --rope-scaling
        --override-pooler-config --additional-config --structured-outputs-config
        --model-loader-extra-config --media-io-kwargs --pooler-config --ec-transfer-config
        """,
    ),
    *_flags(
        "multi",
        "--served-model-name --cuda-graph-sizes --prompt-adapters",
    ),
    *_flags(
        "bool",
        """
        --trust-remote-code --enforce-eager --skip-tokenizer-init --disable-custom-all-reduce
        --enable-prefix-caching --enable-chunked-prefill --enable-expert-parallel --enable-eplb --enable-dbo
        --enable-lora --enable-lora-bias --fully-sharded-loras --enable-prompt-embeds --disable-sliding-window
        --disable-cascade-attn --disable-log-stats --disable-log-requests --enable-log-requests
        --async-scheduling --enable-sleep-mode --disable-chunked-mm-input --disable-async-output-proc
        --kv-sharing-fast-prefill --calculate-kv-scales --enable-multimodal-encoder-data-parallel
        --use-tqdm-on-load --disable-hybrid-kv-cache-manager --data-parallel-hybrid-lb
        --data-parallel-external-lb --ray-workers-use-nsight --enable-elastic-ep
        --enable-return-routed-experts --disable-mm-preprocessor-cache --interleave-mm-strings
        --skip-mm-profiling --enable-mm-embeds --disable-nccl-for-dp-synchronization --headless
        --enable-auto-tool-choice --enable-prompt-tokens-details --enable-server-load-tracking
        --enable-force-include-usage --enable-tokenizer-info-endpoint --enable-log-outputs
        --enable-request-id-headers --disable-frontend-multiprocessing --return-tokens-as-token-ids
        --enable-ssl-refresh --trust-request-chat-template --exclude-tools-when-tool-choice-none
        --disable-uvicorn-access-log --disable-fastapi-docs --allow-credentials --enable-offline-docs
        --log-error-stack --tokens-only --disable-log-stats --use-v2-block-manager --enable-chunked-prefill
        --disable-custom-all-reduce --enable-layerwise-nvtx-tracing --enable-flashinfer-autotune
        --enable-reasoning --worker-use-ray --engine-use-ray --enable-prompt-adapter
        --disable-logprobs-during-spec-decoding --multi-step-stream-outputs --enable-mfu-metrics
        """,
    ),
]

FLAGS: Mapping[str, Flag] = {f.name: f for f in _TABLE}
_BY_SPELLING: Mapping[str, Flag] = {s: f for f in _TABLE for s in (f.name, *f.aliases)}

#: The flags whose sizes multiply into the GPUs one node runs (canonical names).
GPU_MULTIPLIERS = tuple(f.name for f in _TABLE if f.multiplies_gpus)
#: Flags whose value is JSON.
JSON_FLAGS = frozenset(f.name for f in _TABLE if f.kind == "json")
#: Flags whose value rigsmith reads as a whole number.
NUMBER_FLAGS = tuple(f.name for f in _TABLE if f.number)
#: Flags whose value names local paths (canonical names).
PATH_FLAGS = tuple(f.name for f in _TABLE if f.paths)


def lookup(token: str) -> Flag | None:
    """The flag ``token`` (``--x``, ``--x=v``, ``--x_y``, ``-tp``, ``--no-x``) spells, or None.

    Argparse prefix abbreviations are resolved for the ``*parallel*`` flags only (vLLM has hundreds of
    flags; an abbreviation of anything else cannot be told from a flag this table does not list).
    """
    if not token.startswith("-"):
        return None
    name = token.split("=", 1)[0]
    if name.startswith("--"):
        name = name.replace("_", "-")
    hit = _BY_SPELLING.get(name)
    if hit is not None:
        return hit
    if name.startswith("--no-") and (pos := FLAGS.get("--" + name[5:])) is not None and pos.kind == "bool":
        return pos
    if name.startswith("--") and "parallel" in name:
        matches = [f for f in _TABLE if f.name.startswith(name)]
        if len(matches) == 1:
            return matches[0]
    return None


def is_option(word: str) -> bool:
    """An option word as argparse sees it (a negative number is a value)."""
    return word.startswith("-") and len(word) > 1 and not ascii_digits(word[1:2])


def span(args: Sequence[str], i: int) -> int:
    """The index after the option at ``args[i]`` and its value(s)."""
    word = args[i]
    flag = lookup(word)
    if ("=" in word and word.startswith("--")) or (word.startswith("-O") and len(word) > 2):
        return i + 1
    if flag is not None and flag.kind == "bool":
        # Older releases parse booleans with an optional value (StoreBoolean, nargs="?"): `--x True`.
        nxt = args[i + 1].lower() if i + 1 < len(args) else ""
        return i + 2 if nxt in ("true", "false") else i + 1
    j = i + 1
    if flag is not None and flag.kind == "multi":
        while j < len(args) and not is_option(args[j]):
            j += 1
        return j
    return j + 1 if j < len(args) and not is_option(args[j]) else j


def positionals(args: Sequence[str]) -> list[int]:
    """Indexes of the words that are positionals (not an option or an option's value)."""
    out: list[int] = []
    i = 0
    while i < len(args):
        if args[i] == "--":
            out += range(i + 1, len(args))
            break
        if is_option(args[i]):
            i = span(args, i)
        else:
            out.append(i)
            i += 1
    return out
