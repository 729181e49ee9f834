"""The version of skassoc (one place, read by setup.py and the package)."""

__version__ = "0.1.0"
