"""``python -m rigsmith …``: the rigsmith command without its console script (rigsmith/cli/program.py)."""

from rigsmith.cli.program import main

main()
