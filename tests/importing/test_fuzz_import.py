"""A fuzzer over the corpus: mutated published recipes go through import and deploy planning, mutated
imported specs (deployments/NAME.yaml) through spec loading and planning, and nothing but a
RigsmithError may come out.

Mutations insert hostile characters (NUL, line separators, unicode digits, shell and YAML syntax),
duplicate or delete words, swap numbers for huge or non-ASCII ones, and splice in secret flags and
dangerous mounts. The budget is fixed and the run derandomised, so CI spends the same time on the same
examples every run; set RIGSMITH_FUZZ_EXAMPLES to search longer (and with fresh randomness) locally.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from rigsmith import spec as specmod
from rigsmith.errors import RigsmithError
from rigsmith.importing import recipe
from rigsmith.rendering import plan
from rigsmith.resolving.lock.lock import Lock
from tests.support.recipes import HERE, corpus

CASES = [
    *corpus(),
    # issue 25: scripts, compose files with interpolation and the seed texts, as published
    *json.loads((HERE / "data" / "shell-scripts.json").read_text(encoding="utf-8")),
    *json.loads((HERE / "data" / "compose-files.json").read_text(encoding="utf-8")),
    *(
        {"id": p.stem, "raw": p.read_text(encoding="utf-8")}
        for p in sorted((HERE / "data").glob("seed-*.txt"))
    ),
]
CASES = [c for c in CASES if "raw" in c]
EXAMPLES = int(os.environ.get("RIGSMITH_FUZZ_EXAMPLES", "400"))

HOSTILE = [
    "\x00",
    "²",
    "٣",
    "\u2028",
    "\u2029",
    "\u0085",
    "\r",
    "\n",
    "\t",
    "\ufeff",
    "$(id)",
    "`id`",
    "${X:-y}",
    "'",
    '"',
    "\\",
    "\\\n",
    "{",
    "}",
    "[",
    "]",
    "&a ",
    "*a",
    ": ",
    "- ",
    "#",
    ";",
    "|",
    "&&",
    "<placeholder>",
    "~",
    "=",
    "..",
    # the shell subset (issue 25)
    "$X",
    "${X:?e}",
    "${X:+a b}",
    '"$@"',
    "X=1 ",
    "\nexport X=$Y\n",
    '\nif [ "$X" = 1 ]; then\n',
    "\nelse\n",
    "\nfi\n",
    "nohup ",
    " > log 2>&1 &",
    " | tee log",
    "bash -c '",
    "(",
    ")",
    "$ ",
    "(venv) $ ",
    "\n> ",
    "case x in",
    "$((1+1))",
]
SPLICES = [
    "--api_key sk-fuzz",
    "--api-ke=sk-fuzz",
    "--hf_token hf_fuzz",
    "--api sk",
    "-v /:/host",
    "-v /run/podman/podman.sock:/s",
    "--gpus 3000000",
    "--gpus ²",
    "-tp 3000000",
    "-tp ²",
    "--port ٨٠",
    "--shutdown-timeout ²",
    "--model /",
    "--model ~",
    "--served-model-name a\u2028b: c",
    "-e HF_TOKEN=hf_env",
    "--kv-transfer-config {",
    "--device nvidia.com/gpu=all",
]
NUMBERS = ["0", "-1", "3000000", "²", "٣", "1e5", "0x10", "99999999999999999999"]


@st.composite
def mutated(draw: st.DrawFn) -> str:
    case = draw(st.sampled_from(CASES))
    text: str = case["raw"]
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["insert", "duplicate", "delete", "number", "splice"]))
        words = text.split(" ")
        if op == "insert":
            at = draw(st.integers(0, len(text)))
            text = text[:at] + draw(st.sampled_from(HOSTILE)) + text[at:]
        elif op == "duplicate" and words:
            i = draw(st.integers(0, len(words) - 1))
            text = " ".join([*words[: i + 1], words[i], *words[i + 1 :]])
        elif op == "delete" and len(words) > 1:
            i = draw(st.integers(0, len(words) - 1))
            text = " ".join(words[:i] + words[i + 1 :])
        elif op == "number":
            runs = list(re.finditer(r"\d+", text))
            if runs:
                m = draw(st.sampled_from(runs))
                text = text[: m.start()] + draw(st.sampled_from(NUMBERS)) + text[m.end() :]
        else:
            i = draw(st.integers(1, max(1, len(words))))
            text = " ".join([*words[:i], draw(st.sampled_from(SPLICES)), *words[i:]])
    if draw(st.booleans()):
        fields: dict[str, Any] = {"id": case["id"], "command": text}
        if case.get("notes"):
            fields["notes"] = case["notes"]
        if case.get("env"):
            fields["env"] = case["env"]
        return json.dumps(fields, ensure_ascii=draw(st.booleans()))
    return text


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize="RIGSMITH_FUZZ_EXAMPLES" not in os.environ,  # a longer local search explores anew
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(mutated())
# A superscript two passes str.isdigit() and fails int() (exposure read it as a port range): rigsmith.digits.
@example("docker run -tp ² --gpus all -p 8000:8000 --ipc=host vllm/vllm-openai Qwen/Qwen3-8B -tp 8")
@example("docker run -p ²:8000 --gpus all vllm/vllm-openai Qwen/Qwen3-8B")
def test_mutated_corpus_raises_nothing_but_rigsmith_errors(text: str) -> None:
    sha = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
    try:
        dep = recipe.parse(text, source="fuzz", sha256=sha)
    except RigsmithError as err:
        assert "Traceback" not in str(err)
        return
    assert specmod.loads(specmod.dump(dep)) == dep
    try:
        plan.make(dep, Lock(), spec_path=f"deployments/{dep.name}.yaml", image="localhost/vllm:1")
    except RigsmithError as err:
        # Import lifts every secret flag it can see; deploy refusing one means import let it through.
        assert "carries a secret" not in str(err)


def _imported_specs() -> list[str]:
    out = []
    for case in CASES:
        try:
            dep = recipe.parse(case["raw"], source=case["id"], sha256="0" * 64)
        except RigsmithError:
            continue
        out.append(specmod.dump(dep))
    return out


SPECS = _imported_specs()
YAML_HOSTILE = [
    *HOSTILE,
    "!!binary ",
    "!!set ",
    "!!python/object:os.system ",
    "!!float ",
    "2001-13-14",
    "&x ",
    "*x",
    "? ",
    "<<: ",
    "%YAML 1.1\n---\n",
    "\n---\n",
    "'\\0'",
    '"\\0"',
    '"\\x85"',
    "[" * 200,
]


@st.composite
def mutated_spec(draw: st.DrawFn) -> str:
    text: str = draw(st.sampled_from(SPECS))
    for _ in range(draw(st.integers(1, 4))):
        lines = text.split("\n")
        op = draw(st.sampled_from(["insert", "duplicate", "delete", "number"]))
        if op == "insert":
            at = draw(st.integers(0, len(text)))
            text = text[:at] + draw(st.sampled_from(YAML_HOSTILE)) + text[at:]
        elif op == "duplicate":
            i = draw(st.integers(0, len(lines) - 1))
            text = "\n".join([*lines[: i + 1], lines[i], *lines[i + 1 :]])
        elif op == "delete" and len(lines) > 1:
            i = draw(st.integers(0, len(lines) - 1))
            text = "\n".join(lines[:i] + lines[i + 1 :])
        else:
            runs = list(re.finditer(r"\d+", text))
            if runs:
                m = draw(st.sampled_from(runs))
                text = text[: m.start()] + draw(st.sampled_from(NUMBERS)) + text[m.end() :]
    return text


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize="RIGSMITH_FUZZ_EXAMPLES" not in os.environ,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(mutated_spec())
def test_mutated_specs_raise_nothing_but_rigsmith_errors(text: str) -> None:
    try:
        dep = specmod.loads(text, "deployments/fuzz.yaml")
    except RigsmithError as err:
        assert "Traceback" not in str(err)
        return
    with contextlib.suppress(RigsmithError):
        plan.make(dep, Lock(), spec_path="deployments/fuzz.yaml", image="localhost/vllm:1")
