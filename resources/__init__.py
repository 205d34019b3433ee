"""Dagster resources (the engine itself lives in ``resources.lsm`` and never imports Dagster)."""

from .table_resource import LsmTableResource

__all__ = ["LsmTableResource"]
