"""A checkpoint's config.json and safetensors headers, without its weights (the adapter under ``invoke fit``).

From the Hub: huggingface_hub's ``parse_safetensors_file_metadata`` reads each header with range requests
(the first 100 kB, then the rest of the header if it is longer); config.json is a small plain download, and
so is the shard index when the shard files alone do not say which to load. From a directory (a local
checkpoint, or a complete download): the first 8 bytes of each file are the header length, then the JSON
header (``parse_local_safetensors_file_metadata``). Either way a bounded window of headers (``rows``) is in
memory at a time, whatever the checkpoint's size.
"""

from __future__ import annotations

import io
import json
import os
import re
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from itertools import islice
from pathlib import Path
from typing import Any, Protocol

from huggingface_hub import HfApi, parse_local_safetensors_file_metadata
from huggingface_hub.errors import SafetensorsParsingError
from huggingface_hub.utils._safetensors import SafetensorsFileMetadata

from rigsmith.errors import AdapterError, LockError
from rigsmith.resolving.fit import Estimate, FitError, ModelShape, engine_inputs, estimate
from rigsmith.resolving.hub import DEFAULT_ENDPOINT, HfHub, RetryPolicy
from rigsmith.resolving.lock import Lock
from rigsmith.resolving.modelfiles import read_text_or_none, token_from
from rigsmith.spec import Deployment

CONFIG = "config.json"
INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"

HeaderRow = tuple[str, int, tuple[int, ...]]


class Checkpoint(Protocol):
    """What fit reads from a checkpoint."""

    where: str

    def config(self) -> dict[str, Any]: ...
    def weight_files(self) -> list[str]: ...
    def header(self, file: str) -> list[HeaderRow]: ...


def rows(ckpt: Checkpoint, window: int = 4) -> Iterator[HeaderRow]:
    """Every tensor of every weight file, in file order. Up to ``window`` headers are fetched at once (a
    Hub round trip per header dominates), so at most ``window`` + 1 headers are in memory."""
    files = iter(ckpt.weight_files())
    pool = ThreadPoolExecutor(max_workers=window, thread_name_prefix="fit-header")
    try:
        pending = deque(pool.submit(ckpt.header, f) for f in islice(files, window))
        while pending:
            done = pending.popleft().result()
            nxt = next(files, None)
            if nxt is not None:
                pending.append(pool.submit(ckpt.header, nxt))
            yield from done
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _rows(meta: SafetensorsFileMetadata) -> list[HeaderRow]:
    # The byte size is the file's own (end − begin): exact for packed and sub-byte dtypes too.
    return [(n, t.data_offsets[1] - t.data_offsets[0], tuple(t.shape)) for n, t in meta.tensors.items()]


_SHARD = re.compile(r"^(.+)-(\d{5})-of-(\d{5})\.safetensors$")


def _pick(paths: list[str], index: Callable[[], Mapping[str, Any] | None]) -> list[str]:
    """The weight files vLLM loads: those the index maps to (vLLM's ``filter_duplicate_safetensors_files``),
    else model.safetensors, else every top-level one. A complete ``*-0000k-of-0000n`` family alone at the
    top level is taken as it is: its index maps every tensor name, so reading it would cost memory and a
    download in proportion to the whole checkpoint, for the same answer."""
    top = sorted(p for p in paths if p.endswith(".safetensors") and "/" not in p)
    shards = [m for p in top if (m := _SHARD.match(p))]
    family = top and len(shards) == len(top) and len({(m[1], m[3]) for m in shards}) == 1
    if family and sorted(int(m[2]) for m in shards) == list(range(1, int(shards[0][3]) + 1)):
        return top
    idx = index()
    if idx is not None:
        return sorted(set(map(str, (idx.get("weight_map") or {}).values())))
    if SINGLE in paths:
        return [SINGLE]
    return top


def _json(where: str, text: bytes | str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise FitError(f"{where} is not JSON: {err}") from None
    if not isinstance(data, dict):
        raise FitError(f"{where} is not a JSON object")
    return data


class LocalCheckpoint:
    """A checkpoint directory on this machine."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.where = str(root)

    def config(self) -> dict[str, Any]:
        path = self.root / CONFIG
        text = read_text_or_none(path)
        if text is None:
            raise FitError(f"no {CONFIG} in {self.root}", hint="fit needs the checkpoint's config.json")
        return _json(str(path), text)

    def weight_files(self) -> list[str]:
        def index() -> dict[str, Any] | None:
            text = read_text_or_none(self.root / INDEX)
            return _json(str(self.root / INDEX), text) if text is not None else None

        return _pick(sorted(p.name for p in self.root.glob("*.safetensors")), index)

    def header(self, file: str) -> list[HeaderRow]:
        path = self.root / file
        try:
            return _rows(parse_local_safetensors_file_metadata(path))
        except SafetensorsParsingError as err:
            raise FitError(f"{path}: not a readable safetensors header: {err}") from None
        except OSError as err:
            raise FitError(
                f"{path}: {err.strerror or err}", hint="the index names a shard the directory lacks"
            ) from None


class HubCheckpoint:
    """A repo at one commit on the Hub (or a Hub-compatible endpoint); nothing is written to disk."""

    def __init__(self, hub: HfHub, api: HfApi, repo: str, commit: str, files: Mapping[str, int]) -> None:
        self.hub, self.api, self.repo, self.commit, self.files = hub, api, repo, commit, dict(files)
        self.where = f"{hub.endpoint}/{repo}@{commit}"
        self._retry = RetryPolicy(attempts=3)

    def _small(self, path: str) -> bytes:
        if path not in self.files:
            raise FitError(f"{self.where} has no {path}", hint="fit needs the checkpoint's config.json")
        buf = io.BytesIO()
        self.hub.download(self.repo, self.commit, path, buf, offset=0, size=self.files[path])
        return buf.getvalue()

    def config(self) -> dict[str, Any]:
        return _json(f"{self.where}/{CONFIG}", self._small(CONFIG))

    def weight_files(self) -> list[str]:
        def index() -> dict[str, Any] | None:
            return _json(f"{self.where}/{INDEX}", self._small(INDEX)) if INDEX in self.files else None

        return _pick(sorted(self.files), index)

    def header(self, file: str) -> list[HeaderRow]:
        what = f"read the safetensors header of {self.where}/{file}"
        try:
            for attempt in self._retry.retrying(what):
                with attempt:
                    return _rows(
                        self.api.parse_safetensors_file_metadata(self.repo, file, revision=self.commit)
                    )
        except SafetensorsParsingError as err:
            raise FitError(f"{self.where}/{file}: not a readable safetensors header: {err}") from None
        except Exception as err:
            status = getattr(getattr(err, "response", None), "status_code", None)
            raise AdapterError(
                f"{what}: {type(err).__name__}" + (f" (HTTP {status})" if status else f": {err}"),
                hint="check the network, HF_ENDPOINT and HF_TOKEN; only the headers are read",
            ) from None
        raise AssertionError("unreachable")  # pragma: no cover


def _complete(local: Path, files: Mapping[str, int]) -> bool:
    """The directory holds config.json and every .safetensors file at its locked size."""
    want = [p for p in files if p == CONFIG or p.endswith(".safetensors")]
    if CONFIG not in want:
        return False
    for p in want:
        try:
            if (local / p).stat().st_size != files[p]:
                return False
        except OSError:
            return False
    return True


def open_checkpoint(
    spec: Deployment,
    lock: Lock,
    env: Mapping[str, str] = os.environ,
    hub: HfHub | None = None,
    *,
    local_only: bool = False,
) -> Checkpoint:
    """The cheapest faithful source: a local checkpoint; a complete download of the locked commit; or the
    Hub's headers for the locked (or pinned) commit. Offline (HF_HUB_OFFLINE, or ``local_only`` as doctor
    asks: a preflight makes no network request), only the directory."""
    local = Path(spec.model.local_dir).expanduser()
    if spec.model.repo is None:
        if not (local / CONFIG).is_file():
            raise FitError(
                f"local checkpoint (model.repo is null): no {CONFIG} in {local}",
                hint="copy the checkpoint there or point model.local_dir at it",
            )
        return LocalCheckpoint(local)
    locked = lock.models.get(spec.name)
    files: dict[str, int] | None = None
    if locked is not None and locked.repo == spec.model.repo:
        commit, files = locked.commit, {p: f.size for p, f in locked.files.items()}
    elif spec.model.pinned and spec.model.revision:
        commit = spec.model.revision
    else:
        raise LockError(
            f"{spec.name}: {spec.model.repo} has no locked commit and the spec pins none",
            hint=f"run `invoke pin --deployment {spec.name}` (fit reads the headers of that exact commit)",
        )
    offline = env.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")
    if (files and _complete(local, files)) or ((offline or local_only) and (local / CONFIG).is_file()):
        return LocalCheckpoint(local)
    if local_only:
        raise FitError(
            f"{spec.model.repo}@{commit[:12]} is not in {local} yet",
            hint=f"`invoke fit --deployment {spec.name}` reads its headers from the Hub (range requests)",
        )
    if offline:
        raise FitError(
            f"HF_HUB_OFFLINE is set and {local} does not hold {spec.model.repo}@{commit[:12]}",
            hint="unset HF_HUB_OFFLINE (fit reads only headers), or `invoke fetch-model` first",
        )
    hub = hub or HfHub.from_env(env)
    if files is None:
        files = {f.path: f.size for f in hub.tree(spec.model.repo, commit)}
    token = token_from(env, read_text_or_none)
    api = HfApi(
        endpoint=env.get("HF_ENDPOINT") or DEFAULT_ENDPOINT, token=token or False, library_name="rigsmith"
    )
    return HubCheckpoint(hub, api, spec.model.repo, commit, files)


def estimate_for(spec: Deployment, ckpt: Checkpoint) -> Estimate:
    """The per-rank estimate of a deployment, from its checkpoint's config.json and headers."""
    shape = ModelShape.from_config(ckpt.config(), f"{ckpt.where}/{CONFIG}")
    return estimate(shape, engine_inputs(spec), rows(ckpt))
