"""The package's version: part of every run's cache key and of a run's environment record."""

__version__ = "0.1.0"
