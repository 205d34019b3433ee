"""The code location: one ``Definitions`` object, loaded by workspace.yaml."""

from dagster import Definitions

from jobs import all_jobs
from lsm_assets.demo import demo_changes
from resources.table_resource import LsmTableResource
from sensors import all_schedules, all_sensors

defs = Definitions(
    assets=[demo_changes],
    jobs=all_jobs,
    sensors=all_sensors,
    schedules=all_schedules,
    resources={"lsm_table": LsmTableResource()},
)
