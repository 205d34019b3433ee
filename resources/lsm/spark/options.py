"""Object-store options as ``lance_lsm`` reader and writer options (``storage.<key>``).

Shared by the Spark source, its writer and the frame helpers, so neither
imports the other for them.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..format.storage import StorageOptions

STORAGE_OPTION_PREFIX = "storage."


def storage_options_of(options: Mapping[str, str]) -> StorageOptions | None:
    """The ``storage.<key>`` options as Lance storage options (``None`` if there are none)."""
    found = {
        key[len(STORAGE_OPTION_PREFIX) :]: value
        for key, value in options.items()
        if key.lower().startswith(STORAGE_OPTION_PREFIX)
    }
    return found or None


def spark_options_of(storage_options: StorageOptions | None) -> dict[str, str]:
    """Lance storage options as ``storage.<key>`` options for ``spark.read``/``df.write``."""
    return {f"{STORAGE_OPTION_PREFIX}{key}": value for key, value in (storage_options or {}).items()}
