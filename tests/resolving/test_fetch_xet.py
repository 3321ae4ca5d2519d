"""fetch-model's route for a file the Hub keeps on Xet: hf_xet moves it, rigsmith still verifies it.

Against the Hub stand-in on 127.0.0.1 through the real adapter; the Xet threshold is shrunk so that a
megabyte file is asked about.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rigsmith.errors import AdapterError
from rigsmith.resolving import download
from rigsmith.resolving.modelfetch import fetch_model
from tests.support.models import MiB, tiny_files

SHARD = "model-00001-of-00001.safetensors"


def test_a_repo_on_xet_goes_through_hf_xet_and_nothing_unverified_lands(
    hub, client, make_project, monkeypatch
):
    """As far as a stand-in allows: it says the file is on Xet (HEAD headers) but has no Xet token route or
    CAS, so hf_xet's route is taken and fails cleanly. With hf_xet turned off the same repo downloads over
    HTTP, and only the large file was ever asked about."""
    import huggingface_hub.constants

    monkeypatch.setattr(download, "XET_MIN", MiB)
    files = tiny_files("onxet", shards=1, shard_size=2 * MiB)
    sha = hub.repo("acme/onxet", xet=True).add_commit(files, refs=())
    project, spec = make_project(repo="acme/onxet", revision=sha)
    root = Path(spec.model.local_dir)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_DISABLE_XET", False)

    with pytest.raises(AdapterError, match="HTTP 404"):
        fetch_model(project, spec, hub=client, workers=4, echo=lambda _m: None)

    assert [r.method for r in hub.hub_requests(f"/resolve/{sha}/{SHARD}")] == ["HEAD"]
    assert hub.count("/xet-read-token/") >= 1  # hf_xet's route asked for its token
    assert all(SHARD in r.path for r in hub.hub_requests() if r.method == "HEAD")  # small files: no HEAD
    assert not (root / SHARD).exists()

    hub.reset()
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_DISABLE_XET", True)
    fetch_model(project, spec, hub=client, workers=4, echo=lambda _m: None)
    for path, data in files.items():
        assert (root / path).read_bytes() == data, path
    assert all(r.method == "GET" for r in hub.hub_requests("/resolve/"))
    assert not list((root / ".rigsmith/partial").iterdir())
