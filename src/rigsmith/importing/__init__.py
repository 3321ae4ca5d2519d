"""Importing: a published recipe (JSON, command text, compose) → deployments/NAME.yaml."""
