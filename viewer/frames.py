"""Rows (viewer.rows) as pandas DataFrames: the one place pandas is imported, and only when called,
so the command line does not pay for it unless it writes a table."""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    import pandas as pd

    from qprof.viewer.rows import Row


def frame(rows: Sequence[Row], columns: Sequence[str]) -> pd.DataFrame:
    """A DataFrame with exactly `columns`, in that order, also when there are no rows."""
    import pandas as pd

    return pd.DataFrame.from_records(rows, columns=list(columns))
