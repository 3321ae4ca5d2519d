"""Rendering: spec + lock → RunPlan → per-target artifacts (pure; the writer puts them on disk)."""
