"""Dagster resources, one module each; the engine lives in ``resources.lsm``.

Nothing is imported here, so ``import resources.lsm`` (e.g. on a Spark
executor) never loads Dagster.
"""
