"""Test helpers: constants, builders and harness classes. Tests and conftest files import them from here;
conftest files hold only fixtures and hooks."""
