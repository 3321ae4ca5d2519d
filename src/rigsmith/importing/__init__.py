"""Importing: a published recipe (recipe JSON, a pasted command or script, a compose file, vLLM's YAML
recipes) becomes ``deployments/NAME.yaml`` — ``invoke import-recipe``, :func:`.importer.import_recipe`.

- :mod:`.importer` loads the source and writes the spec, merging three ways into the user's edits
  (:mod:`.reimport` says who owns what; :mod:`.answers` and :mod:`.prompts` are the questions and a pasted
  terminal's prompts);
- :mod:`.recipe` reads each form (``command``, ``compose``, ``record``, ``vllmrecipes``) into one launch;
- a script is run by GNU bash itself in a jail to learn the argv it launches: :mod:`.bashjail` (the entry),
  :mod:`.jailrun` (one run), :mod:`.jailread` (what bash did), :mod:`.tracewords` (its ``set -x`` words),
  :mod:`.blanks` and :mod:`.unknown` (the placeholders a user fills); :mod:`.shellwords` splits a plain
  command without running anything; :mod:`.multinode` makes several launches one cluster;
- :mod:`.vllmflags` is vLLM's flags as data; :mod:`.proposal` proposes the image a recipe's notes describe.
"""
