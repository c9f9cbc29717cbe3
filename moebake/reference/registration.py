"""Taking a target out of the registries again: for a test that registers a toy target for its own tests.

:func:`moebake.convert.targets.base.register` puts a target in two places (the target in
:data:`~moebake.convert.targets.base.TARGETS`, its spec in :data:`~moebake.schema.targets.TARGET_SPECS`);
:func:`unregister` removes it from both, so the product's registry is the built-in targets again.
"""

from moebake.convert.targets.base import TARGETS
from moebake.schema.targets import TARGET_SPECS


def unregister(name: str) -> None:
    """Remove target ``name`` from :data:`TARGETS` and the schema (nothing if it is not registered)."""
    TARGETS.pop(name, None)
    TARGET_SPECS.pop(name, None)
