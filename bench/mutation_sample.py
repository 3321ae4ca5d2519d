#!/usr/bin/env python3
"""A seeded mutation sample: how many single-point faults in a module its own tests catch.

Run on demand from the repository root (not part of the suite):

    python3 bench/mutation_sample.py --seed 1 -n 35 \\
        src/rigsmith/confine.py=tests/test_confine.py \\
        src/rigsmith/errors.py=tests/test_errors.py,tests/importing/test_refusal_escapes.py ...

Each argument is ``MODULE=TEST[,TEST…]``. The script lists every mutation site of the modules with
Python's ``ast`` — a comparison flipped (``<``↔``<=``, ``>``↔``>=``, ``==``↔``!=``, ``in``↔``not in``,
``is``↔``is not``), an integer constant ±1, ``and``↔``or``, a ``not`` dropped, a bool constant flipped, a
``raise`` replaced by ``pass``, an ``if``'s condition made ``False`` (its branch removed), a short string
constant emptied, two strings a function returns (its error words) swapped — and draws ``-n`` of them with
``--seed`` (every module at least two, the rest in proportion to its sites). Each mutant is written into a
copy of the tree in a temporary directory (the working tree is never written), and the module's test files
run against it with ``pytest -x -q -p no:cacheprovider -n 0``: a failure (or a run past the time limit)
kills it. The report lists every mutant and the diff of each survivor.

A mutant that cannot change behaviour is equivalent: read it, then record it in
``bench/mutation_equivalents.json`` (key → why); it is then reported as equivalent and left out of the
rate. mutmut 3 (the maintained tool, in the package lists) was not installed or tried: by its documentation it
mutates every function of the configured paths through its own ``mutants/`` copy and trampolines and has no
seeded subset of a few dozen mutants, which is more than two shared cores allow per run here.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EQUIVALENTS = Path(__file__).with_name("mutation_equivalents.json")
FLIP: dict[type[ast.cmpop], type[ast.cmpop]] = {
    ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq, ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot, ast.IsNot: ast.Is,
}  # fmt: skip
SHORT_STRING = 12


@dataclass(frozen=True)
class Mutant:
    module: str  # path relative to the repository root
    function: str  # the enclosing function ("<module>" at top level)
    kind: str
    start: int  # byte offsets of the replaced text in the module
    end: int
    replacement: str
    nth: int = 0  # how many mutants before it in the module make the same change in the same function

    def apply(self, source: bytes) -> bytes:
        return source[: self.start] + self.replacement.encode() + source[self.end :]

    def original(self, source: bytes) -> str:
        return source[self.start : self.end].decode()

    def key(self, source: bytes) -> str:
        """Stable across edits elsewhere in the module: where, what kind, the text before and after."""
        digest = hashlib.sha1(f"{self.original(source)}\0{self.replacement}".encode()).hexdigest()[:10]
        return f"{self.module}::{self.function}::{self.kind}::{digest}#{self.nth}"

    def diff(self, source: bytes) -> str:
        old = source.decode().splitlines(keepends=True)
        new = self.apply(source).decode().splitlines(keepends=True)
        return "".join(difflib.unified_diff(old, new, self.module, f"{self.module} (mutant)", n=1))


def _skipped(tree: ast.Module) -> set[int]:
    """ids of nodes no mutation touches: docstrings, annotations, f-string parts (their offsets are not
    the text's), and everything under them."""
    out: set[int] = set()
    roots: list[ast.AST] = []
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and body:
            first = body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                roots.append(first)
        if isinstance(node, ast.arg | ast.AnnAssign) and node.annotation is not None:
            roots.append(node.annotation)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.returns is not None:
            roots.append(node.returns)
        if isinstance(node, ast.JoinedStr):
            roots.append(node)
    for root in roots:
        out.update(id(n) for n in ast.walk(root))
    return out


def sites(module: str, source: bytes) -> list[Mutant]:
    """Every mutant of one module, in source order."""
    tree = ast.parse(source)
    skip = _skipped(tree)
    starts = [0]
    for line in source.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    out: list[Mutant] = []

    def span(node: ast.AST) -> tuple[int, int]:
        return (
            starts[node.lineno - 1] + node.col_offset,  # type: ignore[attr-defined]
            starts[node.end_lineno - 1] + node.end_col_offset,  # type: ignore[attr-defined]
        )

    def visit(node: ast.AST, function: str) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            function = node.name
            returned = [
                r.value
                for r in ast.walk(node)
                if isinstance(r, ast.Return)
                and isinstance(r.value, ast.Constant)
                and isinstance(r.value.value, str)
            ]
            words = sorted({str(c.value) for c in returned})
            for c in returned if len(words) > 1 else []:
                other = words[(words.index(str(c.value)) + 1) % len(words)]
                out.append(Mutant(module, function, "swap-words", *span(c), repr(other)))
        if id(node) not in skip and hasattr(node, "end_col_offset"):
            out.extend(_at(node, module, function, span))
        for child in ast.iter_child_nodes(node):
            visit(child, function)

    visit(tree, "<module>")
    seen: dict[tuple[str, str, bytes, str], int] = {}
    numbered = []
    for m in out:
        same = (m.function, m.kind, source[m.start : m.end], m.replacement)
        numbered.append(replace(m, nth=seen.get(same, 0)))
        seen[same] = seen.get(same, 0) + 1
    return numbered


def _at(
    node: ast.AST, module: str, function: str, span: Callable[[ast.AST], tuple[int, int]]
) -> list[Mutant]:
    s, e = span(node)
    unparse = ast.unparse
    if isinstance(node, ast.Compare):
        out = []
        for i, op in enumerate(node.ops):
            if type(op) in FLIP:
                ops = [*node.ops]
                ops[i] = FLIP[type(op)]()
                new = ast.Compare(node.left, ops, node.comparators)
                out.append(Mutant(module, function, "compare", s, e, f"({unparse(new)})"))
        return out
    if isinstance(node, ast.BoolOp):
        new_op: ast.boolop = ast.Or() if isinstance(node.op, ast.And) else ast.And()
        return [Mutant(module, function, "and-or", s, e, f"({unparse(ast.BoolOp(new_op, node.values))})")]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return [Mutant(module, function, "drop-not", s, e, f"({unparse(node.operand)})")]
    if isinstance(node, ast.Constant) and isinstance(node.value, bool):
        return [Mutant(module, function, "bool", s, e, repr(not node.value))]
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return [Mutant(module, function, "int", s, e, f"({node.value + d})") for d in (1, -1)]
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and len(node.value) <= SHORT_STRING:
        return [Mutant(module, function, "string", s, e, repr("" if node.value else "x"))]
    if isinstance(node, ast.Raise):
        return [Mutant(module, function, "drop-raise", s, e, "pass")]
    if isinstance(node, ast.If):
        ts, te = span(node.test)
        return [Mutant(module, function, "drop-branch", ts, te, "False")]
    return []


def sample(mutants: dict[str, list[Mutant]], n: int, seed: int) -> list[Mutant]:
    """``n`` mutants: two of every module (where it has two), the rest drawn from all that are left."""
    rng = random.Random(seed)
    chosen: list[Mutant] = []
    rest: list[Mutant] = []
    for module in sorted(mutants):
        pool = list(mutants[module])
        rng.shuffle(pool)
        chosen += pool[:2]
        rest += pool[2:]
    chosen += rng.sample(rest, max(0, min(n - len(chosen), len(rest))))
    return chosen


def copy_tree(dest: Path) -> None:
    """The files git tracks or would track (no caches, no .git) under ``dest``."""
    listed = (
        subprocess.run(
            ["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True, check=True
        )
        .stdout.decode()
        .split("\0")
    )
    for rel in filter(None, listed):
        src = ROOT / rel
        if src.is_file() and not src.is_symlink():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)


def run_tests(tree: Path, tests: list[str], timeout: float) -> tuple[int | None, float, str]:
    """(exit code or None for a timeout, seconds, output tail) of the tests in ``tree``."""
    env = {**os.environ, "PYTHONPATH": f"{tree / 'src'}:{tree}", "PYTHONDONTWRITEBYTECODE": "1"}
    argv = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-n", "0", *tests]
    began = time.monotonic()
    # a session of its own, so a mutant that hangs is ended with every process its tests started
    with subprocess.Popen(
        argv, cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    ) as proc:
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            return None, time.monotonic() - began, ""
    return proc.returncode, time.monotonic() - began, out.decode(errors="replace")[-2000:]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("targets", nargs="+", metavar="MODULE=TEST[,TEST...]")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("-n", type=int, default=35, help="mutants in the sample")
    parser.add_argument("--list", action="store_true", help="only count the sites of each module")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    tests: dict[str, list[str]] = {}
    for target in args.targets:
        module, _, files = target.partition("=")
        tests[module] = [f for f in files.split(",") if f]
    sources = {m: (ROOT / m).read_bytes() for m in tests}
    every = {m: sites(m, sources[m]) for m in tests}
    for m, found in every.items():
        print(f"{m}: {len(found)} mutation sites")
    if args.list:
        return 0
    equivalent: dict[str, str] = json.loads(EQUIVALENTS.read_text()) if EQUIVALENTS.exists() else {}
    chosen = sample(every, args.n, args.seed)
    results: list[dict[str, str | int | None]] = []
    with tempfile.TemporaryDirectory(prefix="rigsmith-mutants-") as tmp:
        tree = Path(tmp)
        tree.chmod(0o755)  # the bash jail drops root: its binds must be readable by another user
        copy_tree(tree)
        limits: dict[str, float] = {}
        for m, files in tests.items():
            code, took, tail = run_tests(tree, files, timeout=900)
            if code != 0:
                print(f"{m}: its tests fail before any mutation (exit {code}):\n{tail}")
                return 1
            limits[m] = 5 * took + 30
        for i, mutant in enumerate(chosen, 1):
            source = sources[mutant.module]
            key = mutant.key(source)
            target = tree / mutant.module
            target.write_bytes(mutant.apply(source))
            try:
                ast.parse(mutant.apply(source))
                code, took, tail = run_tests(tree, tests[mutant.module], limits[mutant.module])
            finally:
                target.write_bytes(source)
            if key in equivalent:
                outcome = "equivalent"
            elif code is None:
                outcome = "killed (timeout)"
            elif code in (4, 5):
                print(f"pytest could not run {tests[mutant.module]} (exit {code}):\n{tail}")
                return 1
            else:
                outcome = "killed" if code else "SURVIVED"
            line = source[: mutant.start].count(b"\n") + 1
            print(
                f"[{i:2}/{len(chosen)}] {outcome:16} {mutant.module}:{line} {mutant.function} {mutant.kind}: "
                f"{mutant.original(source)[:60]!r} -> {mutant.replacement[:60]!r}  ({took:.1f} s)"
            )
            results.append(
                {
                    "key": key,
                    "line": line,
                    "outcome": outcome,
                    "diff": mutant.diff(source),
                    "why_equivalent": equivalent.get(key),
                }
            )
    counted = [r for r in results if r["outcome"] != "equivalent"]
    killed = sum(1 for r in counted if str(r["outcome"]).startswith("killed"))
    for r in results:
        if r["outcome"] == "SURVIVED":
            print(f"\nsurvivor {r['key']}\n{r['diff']}")
        elif r["outcome"] == "equivalent":
            print(f"\nequivalent {r['key']}: {r['why_equivalent']}\n{r['diff']}")
    rate = 100 * killed / len(counted) if counted else 100.0
    print(
        f"\nseed {args.seed}: {killed} of {len(counted)} killed ({rate:.0f} %), "
        f"{len(results) - len(counted)} equivalent left out"
    )
    if args.json:
        args.json.write_text(
            json.dumps(
                {"seed": args.seed, "killed": killed, "counted": len(counted), "results": results}, indent=1
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
