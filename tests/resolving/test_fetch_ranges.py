"""fetch-model's ranged route: a large file as several ranges at once, resumed exactly, every byte verified.

Against the Hub stand-in on 127.0.0.1 through the real adapter; the range size is shrunk so that
megabyte files take the route meant for gigabyte shards.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from rigsmith.errors import AdapterError
from rigsmith.resolving import parts
from rigsmith.resolving.modelfetch import fetch_model
from rigsmith.resolving.modelfiles import HashMismatch, read_state
from tests.support.hubserver import Fault
from tests.support.models import MiB, tiny_files

SHARD = "model-00001-of-00001.safetensors"


@pytest.fixture
def small_ranges(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(parts, "PART_BYTES", MiB)
    monkeypatch.setattr(parts, "RECORD_STEP", 1)  # the record follows every block


def _ranges(spans: list[tuple[int, int]]) -> list[str]:
    return sorted(f"bytes={a}-{b - 1}" for a, b in spans)


def _setup(hub, make_project, seed: str, size: int = 5 * MiB):
    files = tiny_files(seed, shards=1, shard_size=size)
    sha = hub.repo(f"acme/{seed}").add_commit(files, refs=())
    project, spec = make_project(repo=f"acme/{seed}", revision=sha)
    root = Path(spec.model.local_dir)
    data = files[SHARD]
    partial = root / ".rigsmith/partial" / f"{hashlib.sha256(data).hexdigest()}.incomplete"
    return files, project, spec, root, data, partial


def _assert_done(root: Path, files: dict[str, bytes]) -> None:
    for path, data in files.items():
        assert (root / path).read_bytes() == data, path
    assert not list((root / ".rigsmith/partial").iterdir())


def test_a_large_file_comes_as_ranges_in_flight_together(hub, client, make_project, small_ranges):
    files, project, spec, root, data, _partial = _setup(hub, make_project, "ranged")
    # Each range's body is paced, so ranges of the one file are on the wire at the same moment.
    hub.fault(Fault("slow", SHARD, delay=0.02, times=100))

    report = fetch_model(project, spec, hub=client, workers=4, echo=lambda _m: None)

    _assert_done(root, files)
    assert SHARD in report.downloaded
    reqs = hub.hub_requests(SHARD)
    assert sorted(r.range or "" for r in reqs) == _ranges(parts.missing([], len(data), MiB))
    assert hub.bytes_sent[SHARD] == len(data)  # every byte once
    assert hub.peak_in_flight(SHARD) >= 2


def test_resume_after_an_interrupted_ranged_download_asks_for_exactly_what_is_missing(
    hub, client, make_project, small_ranges
):
    files, project, spec, root, data, partial = _setup(hub, make_project, "resumed")
    # The range at 3 MiB is always cut off by a reset: the fetch fails, what the others wrote is kept.
    hub.fault(Fault("reset", SHARD, start=3 * MiB, times=1000))
    with pytest.raises(AdapterError):
        fetch_model(project, spec, hub=client, workers=4, echo=lambda _m: None)

    assert not (root / SHARD).exists()
    spans = parts.read_record(partial, len(data))
    assert spans and spans != [(0, len(data))]
    held = partial.read_bytes()
    assert all(held[a:b] == data[a:b] for a, b in spans)  # the record never claims an unwritten byte
    have = sum(b - a for a, b in spans)

    hub.reset()
    report = fetch_model(project, spec, hub=client, workers=4, echo=lambda _m: None)

    assert sorted(r.range or "" for r in hub.hub_requests(SHARD)) == _ranges(
        parts.missing(spans, len(data), MiB)
    )
    assert hub.bytes_sent[SHARD] == len(data) - have
    assert report.resumed_bytes == have
    _assert_done(root, files)


def test_a_corrupted_byte_in_any_range_is_caught_before_the_final_name(
    hub, client, make_project, small_ranges
):
    files, project, spec, root, data, _partial = _setup(hub, make_project, "corrupt")
    hub.fault(Fault("wrong", SHARD, start=2 * MiB, times=2))  # the range at 2 MiB, on both tries

    with pytest.raises(HashMismatch) as err:
        fetch_model(project, spec, hub=client, workers=4, echo=lambda _m: None)

    bad = data[: 2 * MiB] + bytes([data[2 * MiB] ^ 0xFF]) + data[2 * MiB + 1 :]
    assert f"sha256 {hashlib.sha256(bad).hexdigest()} != {hashlib.sha256(data).hexdigest()}" in str(err.value)
    assert not (root / SHARD).exists()
    assert not list((root / ".rigsmith/partial").iterdir())  # neither the partial nor its record
    assert SHARD not in read_state(root / ".rigsmith/state.json").files

    hub.reset()
    hub.fault(Fault("wrong", SHARD, start=2 * MiB, times=1))  # once: the second try is good
    assert fetch_model(project, spec, hub=client, workers=4, echo=lambda _m: None).downloaded == [SHARD]
    _assert_done(root, files)


def test_a_server_without_range_support_still_works(hub, client, make_project, small_ranges):
    files, project, spec, root, data, partial = _setup(hub, make_project, "plain")
    hub.fault(Fault("norange", SHARD, times=1000))

    fetch_model(project, spec, hub=client, workers=4, echo=lambda _m: None)

    _assert_done(root, files)
    assert any(r.range is None and r.sent == len(data) for r in hub.hub_requests(SHARD))

    # A ranged partial left by an earlier run, then a server that stops honouring Range: the file is
    # fetched whole and still verified.
    (root / SHARD).unlink()
    (root / ".rigsmith/state.json").unlink()
    hub.reset()
    hub.fault(Fault("reset", SHARD, start=3 * MiB, times=1000))
    with pytest.raises(AdapterError):
        fetch_model(project, spec, hub=client, workers=4, echo=lambda _m: None)
    assert parts.record_path(partial).exists()
    hub.reset()
    hub.fault(Fault("norange", SHARD, times=1000))
    fetch_model(project, spec, hub=client, workers=4, echo=lambda _m: None)
    _assert_done(root, files)


def test_the_record_is_read_defensively(tmp_path):
    partial = tmp_path / "x.incomplete"
    assert parts.read_record(partial, 10) == []
    partial.write_bytes(b"abc")
    assert parts.read_record(partial, 10) == [(0, 3)]  # a sequential partial: its length
    partial.write_bytes(bytes(10))
    for bad in ('{"size": 11, "done": [[0, 4]]}', '{"size": 10, "done": [[0, 11]]}', "[", '{"size": 10}'):
        parts.record_path(partial).write_text(bad)
        assert parts.read_record(partial, 10) == [], bad
    parts.record_path(partial).write_text('{"size": 10, "done": [[6, 8], [0, 2], [2, 4]]}')
    assert parts.read_record(partial, 10) == [(0, 4), (6, 8)]
    assert parts.missing([(0, 4), (6, 8)], 10, part=1) == [(4, 5), (5, 6), (8, 9), (9, 10)]


def test_large_files_that_others_keep_company_go_as_one_range_each_resumed_exactly(
    hub, client, make_project, small_ranges
):
    files = tiny_files("whole", shards=2, shard_size=3 * MiB)
    sha = hub.repo("acme/whole").add_commit(files, refs=())
    project, spec = make_project(repo="acme/whole", revision=sha)
    root = Path(spec.model.local_dir)
    first, last = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
    (root / ".rigsmith/partial").mkdir(parents=True)
    (root / ".rigsmith/partial" / f"{hashlib.sha256(files[first]).hexdigest()}.incomplete").write_bytes(
        files[first][:MiB]
    )

    report = fetch_model(project, spec, hub=client, workers=1, echo=lambda _m: None)

    _assert_done(root, files)
    # The first shard starts while the other waits: one range, from the byte its partial ends at.
    assert [r.range for r in hub.hub_requests(first)] == [f"bytes={MiB}-{len(files[first]) - 1}"]
    assert hub.bytes_sent[first] == len(files[first]) - MiB and report.resumed_bytes == MiB
    # The last large file to start goes as several ranges.
    assert sorted(r.range or "" for r in hub.hub_requests(last)) == _ranges(
        parts.missing([], len(files[last]), MiB)
    )


def test_a_repo_on_xet_goes_through_hf_xet_and_nothing_unverified_lands(
    hub, client, make_project, small_ranges, monkeypatch
):
    """As far as a stand-in allows: it says the file is on Xet (HEAD headers) but has no Xet token route or
    CAS, so hf_xet's route is taken and fails cleanly. With hf_xet turned off the same repo downloads by
    ranges."""
    import huggingface_hub.constants

    files, project, spec, root, _data, _partial = _setup(hub, make_project, "onxet")
    hub.repos["acme/onxet"].xet = True
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_DISABLE_XET", False)

    with pytest.raises(AdapterError, match="HTTP 404"):
        fetch_model(project, spec, hub=client, workers=4, echo=lambda _m: None)

    assert [r.method for r in hub.hub_requests(f"/resolve/{spec.model.revision}/{SHARD}")] == ["HEAD"]
    assert hub.count("/xet-read-token/") >= 1  # hf_xet's route asked for its token
    assert not (root / SHARD).exists()

    hub.reset()
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_DISABLE_XET", True)
    fetch_model(project, spec, hub=client, workers=4, echo=lambda _m: None)
    _assert_done(root, files)
    assert all(r.method == "GET" for r in hub.hub_requests(SHARD))
