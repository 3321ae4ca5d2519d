"""Resolving and pinning: Hub, registry, model files, image definitions, builds, the lock."""
