"""When things run on their own: sensors and schedules (none yet)."""

all_sensors: list = []
all_schedules: list = []
