"""When things run on their own: sensors and schedules."""

from .maintenance import flush_sensor, gc_schedule, merge_sensor, quality_schedule

all_sensors = [flush_sensor, merge_sensor]
all_schedules = [gc_schedule, quality_schedule]
