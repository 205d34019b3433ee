"""The code location: one ``Definitions`` object, loaded by workspace.yaml."""

from dagster import Definitions, load_assets_from_modules

import lsm_assets.ingestion
import lsm_assets.maintenance
import lsm_assets.reports
from jobs import all_jobs
from jobs.quality import quality_jobs
from lsm_assets.checks import all_checks
from resources.gx_resource import GreatExpectationsResource
from resources.io_manager import LsmTableIOManager
from resources.region_writer import RegionWriterResource
from resources.spark import lsm_pyspark_resource
from resources.table_resource import LsmTableResource
from sensors import all_schedules, all_sensors

defs = Definitions(
    assets=load_assets_from_modules([lsm_assets.ingestion, lsm_assets.maintenance, lsm_assets.reports]),
    asset_checks=all_checks,
    jobs=[*all_jobs, *quality_jobs],
    sensors=all_sensors,
    schedules=all_schedules,
    resources={
        "lsm_table": LsmTableResource(),
        "region_writers": RegionWriterResource(lsm_table=LsmTableResource()),
        "pyspark": lsm_pyspark_resource(),
        "gx": GreatExpectationsResource(),
        "lsm_io_manager": LsmTableIOManager(),
    },
)
