"""tierfs: a GCS bucket as a local directory, with RAM and SSD tiers in front."""

__version__ = "0.1.0"
