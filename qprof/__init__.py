"""qprof: profile QUIC endpoints and attribute their CPU time by category.

The top-level folders of the repository form the sub-packages:
probes -> collectors -> attribution (+ mappings) -> viewer. This package holds
the command line and the public API only.
"""

__version__ = "0.1.0"
