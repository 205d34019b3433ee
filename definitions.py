"""The code location: one ``Definitions`` object, loaded by workspace.yaml.

Importing it loads Dagster and this project's definitions only: Lance,
Arrow, Spark and Great Expectations are imported by the steps that use them
(``tests/test_definitions.py`` keeps it so).
"""

from dagster import Definitions, in_process_executor, load_assets_from_modules

import lsm_assets.ingestion
import lsm_assets.maintenance
import lsm_assets.reports
from jobs import all_jobs
from lsm_assets.checks import all_checks
from resources.gx_resource import GreatExpectationsResource
from resources.io_manager import LsmTableIOManager
from resources.region_writer import RegionWriterResource
from resources.spark import SparkResource
from resources.table_resource import LsmTableResource
from sensors import all_schedules, all_sensors

defs = Definitions(
    assets=load_assets_from_modules([lsm_assets.ingestion, lsm_assets.maintenance, lsm_assets.reports]),
    asset_checks=all_checks,
    jobs=all_jobs,
    sensors=all_sensors,
    schedules=all_schedules,
    executor=in_process_executor,
    resources={
        "lsm_table": LsmTableResource(),
        "region_writers": RegionWriterResource(lsm_table=LsmTableResource()),
        "spark": SparkResource(),
        "gx": GreatExpectationsResource(),
        "lsm_io_manager": LsmTableIOManager(),
    },
)
