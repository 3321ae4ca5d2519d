"""Recipe form (c): a compose file with one vLLM service (:mod:`.form`), read after compose's own
interpolation rules (:mod:`.env`: ``${VAR:-d}``, ``.env`` files, unset names as placeholders). Entry point:
``form._from_compose`` (via ``recipe.parse``).
"""
