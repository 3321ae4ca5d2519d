"""`python -m tasks …`: the rigsmith command without its console script (tasks/program.py)."""

from tasks.program import main

main()
