"""The one exception type users see: a message that fits on one line.

Every layer raises QprofError for bad input or a missing facility; the CLI
prints it as `qprof: error: ...` and exits non-zero, without a traceback.
"""


class QprofError(Exception):
    """A user-facing failure: the message names what is wrong and how to fix it."""
