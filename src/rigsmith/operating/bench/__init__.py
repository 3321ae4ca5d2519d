"""``invoke bench``: measure a running deployment the way the recipes publish their numbers, and keep them.

Entry points: ``bench.bench_deployment`` (N concurrent OpenAI streams: TTFT, decode and prefill tok/s,
recorded in ``.rigsmith/bench.jsonl`` under the lock they ran on), ``gate.why_not`` (when ``--compare`` may
hold a run against the recipe's published numbers, and why not otherwise) and ``history.points`` /
``history.terminal`` / ``history.write_chart`` (``bench --history``: one deployment's numbers per lock over
time, upgrades and rollbacks marked).
"""
