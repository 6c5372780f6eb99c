"""qprof: profile QUIC endpoints and attribute their CPU time by category.

The top-level folders of the repository form the sub-packages:
probes -> collectors -> attribution (+ mappings) -> viewer. This package holds
the command line and the public API: `qprof.load(RUN)` returns a run's data as
pandas DataFrames (qprof.api; pandas is imported only when it is called).
The API is imported at its first use: every probe loader and helper qprof starts
imports this package, and the API's imports were ~13 ms of each start.
"""

from typing import TYPE_CHECKING

from qprof.version import __version__

if TYPE_CHECKING:
    from qprof.api import RunData, load

__all__ = ["RunData", "__version__", "load"]


def __getattr__(name: str) -> object:
    if name in ("RunData", "load"):
        from qprof import api

        return getattr(api, name)
    raise AttributeError(f"module 'qprof' has no attribute {name!r}")
