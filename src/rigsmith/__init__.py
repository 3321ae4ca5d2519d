"""rigsmith: a published vLLM recipe, applied to a homelab rig, pinned and verified."""

__version__ = "0.1.0"
