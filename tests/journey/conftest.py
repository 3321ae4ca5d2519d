"""The journey reuses the Hub stand-in and the vLLM-like image of the models and ops areas."""

from tests.models.conftest import hub_server  # noqa: F401  (fixture)
from tests.ops.conftest import ops_image  # noqa: F401  (fixture)
