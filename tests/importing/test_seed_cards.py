"""Issue 25: both seeds import as published — seed 003's card text (title, command, ``env:``, ``notes:``)
exactly like its JSON form, and seed 000's record (no command) through the proposal the user confirms.

The card is a copy of shared/seeds/003_278407e1a2961231.txt; the record is seed 000 as published, under
examples/records/."""

from __future__ import annotations

import hashlib
import shlex
from pathlib import Path

import pytest

from rigsmith import spec as specmod
from rigsmith.errors import RecipeError
from rigsmith.importing import importer, recipe
from rigsmith.project import Project
from tests.support.common import REPO
from tests.support.recipes import HERE, SEED_RECIPE

CARD = HERE / "data" / "seed-003-card.txt"
RECORD = REPO / "examples" / "records" / "flash-next-int4-3x3090.txt"
NAME = "flash-next-merlin-4x3090"


def _parse(path: Path, name: str | None = None, accept: bool = False) -> specmod.Deployment:
    data = path.read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    return recipe.parse(data.decode(), source=str(path), sha256=sha, name=name, accept=accept)


def test_seed_003_card_text_imports_like_its_json_form() -> None:
    card = specmod.to_data(_parse(CARD, name=NAME))
    json_form = specmod.to_data(_parse(SEED_RECIPE, name=NAME))
    card_notes = card.pop("notes")
    json_notes = json_form.pop("notes")
    for data in (card, json_form):
        data.pop("provenance")
    assert card == json_form
    assert set(json_notes) <= set(card_notes)
    extra = [n for n in card_notes if n not in json_notes]
    assert extra[0].startswith("read as a recipe card")
    assert "text after the card, not imported" in extra[1] and "curl -fsSL" in extra[1]


def test_seed_003_card_file_imports_through_the_cli_path(empty_project: Project) -> None:
    dep = importer.import_recipe(empty_project, str(CARD), name=NAME, echo=lambda _: None)
    assert dep.engine.flag_value("--max-model-len") == "262144"
    assert dep.resources.gpus.count == 4
    assert specmod.load(empty_project.spec_path(NAME)) == dep


PROPOSED = [
    "Minachist/Qwen3.8-Flash-Next-INT4-Mixed-AutoRound",
    "--served-model-name",
    "flashnext-int4-vllm-262k",
    "--host",
    "127.0.0.1",
    "--port",
    "8000",
    "--pipeline-parallel-size",
    "3",
    "--tensor-parallel-size",
    "1",
    "--language-model-only",
    "--engram-config",
    '{"cpu_offload":true}',
    "--max-model-len",
    "262144",
    "--max-num-seqs",
    "4",
    "--max-num-batched-tokens",
    "512",
    "--gpu-memory-utilization",
    "0.97",
    "--kv-cache-memory",
    "550000000",
    "--no-enable-prefix-caching",
    "--compilation-config",
    '{"cudagraph_mode":"FULL_DECODE_ONLY","cudagraph_capture_sizes":[1,2,4]}',
]


def test_seed_000_record_is_one_paragraph_with_the_proposed_command() -> None:
    with pytest.raises(RecipeError) as err:
        _parse(RECORD)
    message = err.value.message
    assert "this text has no launch command" in message
    assert "not a vLLM launch command" not in message  # one paragraph, not one line per prose line
    assert shlex.join(["vllm", "serve", *PROPOSED]) in message
    assert "--yes" in message and "--answers FILE" in message and "network.port" in message


def test_seed_000_record_imports_the_proposal_only_when_confirmed() -> None:
    dep = _parse(RECORD, accept=True)
    assert list(dep.engine.args) == PROPOSED  # unanswered: vLLM's default port
    assert dep.model.repo == "Minachist/Qwen3.8-Flash-Next-INT4-Mixed-AutoRound"
    assert dep.model.revision == "1703ff595285561b141648609291377d3faf3b64"
    assert dep.resources.gpus.count == 3  # PP 3 × TP 1
    assert dep.notes[0].startswith("read as a record with no launch command (imported with --yes)")
    # No image: the record's own (a truncated digest) was left out, and import's next steps say so and how.
    [no_image] = [s for s in importer.next_steps(dep) if s.startswith("no container image")]
    assert "pinned by image digest sha256:43f13b4c…47bb96: the digest is truncated" in no_image
    assert "set engine.build" in no_image and "outside a container" not in no_image


def test_a_record_without_a_model_says_so_in_one_paragraph() -> None:
    with pytest.raises(RecipeError) as err:
        recipe.parse(
            "Notes from the weekend\n\nThe server ran fine. Throughput was good.\n",
            source="t",
            sha256="0" * 64,
        )
    assert "no launch command" in err.value.message and "nor do its lines name a model" in err.value.message
