"""``demo_changes``: a generated change stream written through the engine.

The end-to-end demo's first step; later steps (Spark ingestion, flush, merge,
GC, checks) grow around the same table.
"""


import time

from dagster import AssetExecutionContext, Config, MaterializeResult, MetadataValue, asset
from pydantic import Field

from resources.table_resource import LsmTableResource
from resources.lsm.changegen import ChangeStreamSpec, generate_changes


class DemoChangesConfig(Config):
    num_keys: int = Field(default=20_000, description="Distinct keys in the stream.")
    num_batches: int = Field(default=10, description="Change batches to write.")
    batch_size: int = Field(default=5_000, description="Rows per batch.")
    seed: int = Field(default=7, description="Random seed (same seed, same stream).")


@asset(group_name="ingestion", kinds={"lance", "python"})
def demo_changes(context: AssetExecutionContext, config: DemoChangesConfig,
                 lsm_table: LsmTableResource) -> MaterializeResult:
    """Write a generated stream of upserts, deletes and re-inserts into the LSM table.

    Every batch is durable in the shard WALs when written; the writers are
    closed at the end, flushing each MemTable into a new generation.
    """
    spec = ChangeStreamSpec(num_keys=config.num_keys, num_batches=config.num_batches,
                            batch_size=config.batch_size, seed=config.seed)
    started = time.monotonic()
    upserts = deletes = 0
    with lsm_table.open() as table:
        for number, batch in enumerate(generate_changes(spec), start=1):
            result = table.write(batch)
            upserts, deletes = upserts + result.upserts, deletes + result.deletes
            context.log.info(f"batch {number}/{spec.num_batches}: {result.upserts} upserts, "
                             f"{result.deletes} deletes durable")
    elapsed = time.monotonic() - started
    shards = table.shards()
    for shard in shards:
        context.log.info(f"shard {shard.bucket} ({shard.shard_id}): generations "
                         f"{[g for g, _ in shard.pending_generations]}, epoch {shard.writer_epoch}")
    live_rows = table.count()
    context.log.info(f"merged view: {live_rows} live keys after {upserts} upserts and {deletes} deletes")
    return MaterializeResult(metadata={
        "rows_written": upserts + deletes,
        "upserts": upserts,
        "deletes": deletes,
        "live_rows": live_rows,
        "elapsed_s": round(elapsed, 3),
        "rows_per_s": round((upserts + deletes) / elapsed, 1) if elapsed else 0.0,
        "pending_generations": sum(len(s.pending_generations) for s in shards),
        "table_uri": MetadataValue.path(table.uri),
    })
