"""Issue 35: a refusal quotes the recipe, and what it quotes reaches the terminal through
``rigsmith.errors.shown`` — a clipboard-writing OSC 52, a screen clear, a C1 CSI and a forged line break
are printed as their escapes, never acted on. Each case is a path that printed the recipe's bytes raw
before (a JSON flag's value, a record's proposed command, a vLLM recipe's variant names, a re-import
conflict), run through the CLI as a user runs it; nothing is written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rigsmith.errors import RecipeError, shown_lines
from tests.support.common import invoke_cli

#: OSC 52 (write "pwned" to the clipboard), clear the screen, a C1 CSI (bold), a bell.
PAYLOAD = "\x1b]52;c;cHduZWQ=\x07\x1b[2J\x9b1m"
#: What the terminal shows instead: the payload's escapes.
SHOWN = r"\x1b]52;c;cHduZWQ=\x07\x1b[2J\x9b1m"
RAW = ("\x1b", "\x07", "\x9b")

CASES = {
    "json-flag": ("r.sh", f"vllm serve Qwen/Qwen3-0.6B --compilation-config '{{bad{PAYLOAD}'", ()),
    "forged-line": (
        "r.json",
        json.dumps({"command": "vllm serve Qwen/Qwen3-0.6B --compilation-config '{x\nerror: forged}'"}),
        (),
    ),
    "record": (
        "notes.txt",
        "A record of a run\n\nThe question is whether it serves.\n\n"
        f"• Model: Qwen/Qwen3-0.6B\n\nConfig (upstream, verbatim)\n\n"
        f"max-model-len 4096, chat-template /t/x{PAYLOAD}.\n",
        (),
    ),
    "variants": (
        "Qwen_Qwen3-0.6B.yaml",
        'meta:\n  title: "x"\nmodel:\n  model_id: "Qwen/Qwen3-0.6B"\n  base_args: []\n'
        'variants:\n  "a\\e]52;c;cHduZWQ=\\a\\e[2J\\x9b1m":\n    precision: bf16\n'
        "  b:\n    precision: bf16\n",
        (),
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_refusal_shows_the_recipes_escape_sequences_as_text(case: str, tmp_path: Path) -> None:
    name, text, extra = CASES[case]
    (tmp_path / "deployments").mkdir()
    source = tmp_path / name
    source.write_text(text, encoding="utf-8")
    proc = invoke_cli(tmp_path, "import-recipe", str(source), "--name", "e", *extra)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert not any(c in out for c in RAW), out
    assert "Traceback" not in out
    if case == "forged-line":
        assert "\nerror: forged" not in out and r"\nerror: forged" in out
    else:
        assert SHOWN in out
    assert list((tmp_path / "deployments").iterdir()) == []


def test_a_re_import_conflict_shows_the_recipes_value_escaped(tmp_path: Path) -> None:
    (tmp_path / "deployments").mkdir()
    source = tmp_path / "r.sh"
    source.write_text("vllm serve Qwen/Qwen3-0.6B --max-num-seqs 8", encoding="utf-8")
    assert invoke_cli(tmp_path, "import-recipe", str(source), "--name", "e").returncode == 0
    spec = tmp_path / "deployments" / "e.yaml"
    spec.write_text(spec.read_text().replace("- '8'", "- '6'"), encoding="utf-8")
    source.write_text(f"vllm serve Qwen/Qwen3-0.6B --max-num-seqs '16{PAYLOAD}'", encoding="utf-8")
    before = spec.read_bytes()
    proc = invoke_cli(tmp_path, "import-recipe", str(source), "--name", "e")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "you and the recipe changed the same fields" in out, out
    assert not any(c in out for c in RAW) and SHOWN in out
    assert spec.read_bytes() == before


def test_every_recipe_error_is_printable_whichever_path_builds_it() -> None:
    err = RecipeError(f"x {PAYLOAD}\nsecond line", hint=f"h {PAYLOAD}")
    assert str(err) == f"x {SHOWN}\nsecond line\n  hint: h {SHOWN}"
    assert shown_lines("a\tb\nc") == "a\\tb\nc"


def test_a_dry_run_prints_what_it_would_write_with_the_recipes_escapes_as_text(tmp_path: Path) -> None:
    (tmp_path / "deployments").mkdir()
    source = tmp_path / "r.json"
    command = f"vllm serve Qwen/Qwen3-0.6B --served-model-name 'm{PAYLOAD}'"
    source.write_text(json.dumps({"command": command, "title": f"t{PAYLOAD}"}), encoding="utf-8")
    proc = invoke_cli(tmp_path, "import-recipe", str(source), "--name", "e", "--dry-run", "--image", "v:1")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "(dry run: nothing written)" in out and not any(c in out for c in RAW), out
    assert list((tmp_path / "deployments").iterdir()) == []
