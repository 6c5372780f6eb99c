"""qprof's version, in a leaf module: the run archive's writer records it without importing the API."""

__version__ = "0.1.0"
