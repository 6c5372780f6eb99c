"""qprof: profile QUIC endpoints and attribute their CPU time by category.

The top-level folders of the repository form the sub-packages:
probes -> collectors -> attribution (+ mappings) -> viewer. This package holds
the command line and the public API: `qprof.load(RUN)` returns a run's data as
pandas DataFrames (qprof.api; pandas is imported only when it is called).
"""

from qprof.api import RunData, load
from qprof.version import __version__

__all__ = ["RunData", "__version__", "load"]
