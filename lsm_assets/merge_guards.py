"""The merge guards for op jobs.

``merge_job`` and ``demo_job`` merge every shard in one op, outside a
partitioned asset run, so Dagster does not run the blocking checks of
``merge_shard_job`` for them. :func:`check_merge_guards` runs the same checks
first, records them as check evaluations of ``flushed_generations`` (they show
in the UI like any other) and fails the run, before anything is merged, when
one fails.
"""

from dagster import AssetCheckEvaluation, Failure, In, Nothing, OpExecutionContext, op

from resources.gx_resource import GreatExpectationsResource
from resources.table_resource import LsmTableResource

from .checks import evaluate_merge_guards
from .maintenance import flushed_generations


@op(ins={"after": In(Nothing)},
    description="Run the blocking merge guards (base keys unique and non-null, shards recoverable); "
                "a failure stops the run before the merge.")
def check_merge_guards(context: OpExecutionContext, lsm_table: LsmTableResource,
                       gx: GreatExpectationsResource) -> None:
    results = evaluate_merge_guards(lsm_table.open(), gx)
    for name, result in results.items():
        context.log_event(AssetCheckEvaluation(asset_key=flushed_generations.key, check_name=name,
                                               passed=result.passed, metadata=result.metadata,
                                               severity=result.severity, blocking=True))
    failed = sorted(name for name, result in results.items() if not result.passed)
    if failed:
        raise Failure(description=f"merge guards failed: {', '.join(failed)}; nothing was merged "
                                  "(see the check evaluations on flushed_generations)")
