"""When things run on their own: the maintenance sensors over every table, and each table's schedules."""

from .maintenance import maintenance_sensors, table_schedules

__all__ = ["maintenance_sensors", "table_schedules"]
