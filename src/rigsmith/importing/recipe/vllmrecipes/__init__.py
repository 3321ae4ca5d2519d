"""Recipe forms (d) and (e): vLLM's own recipes — a recipes YAML (:mod:`.yamlform`, checked against
:mod:`.schema`, its command made by :mod:`.synth` from the hardware profiles and strategies in
:mod:`.taxonomy`) and a file of the recipes JSON API (:mod:`.apiform`).
Entry points: ``yamlform.load`` / ``yamlform.from_recipe`` and ``apiform.from_api``.
"""
