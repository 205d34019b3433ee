"""What the platform produces: ingestion, maintenance and quality assets."""
