"""Column tables without pandas: the analysis' working format.

A table is a plain dict of column name -> Python list, every list the same length. Values are Python
objects only (never numpy scalars): floats with NaN for "missing", ints, bools, and str ("" for none).
`opscope analyze` imports neither pandas nor numpy (their import costs more than analyzing a few
thousand events); pandas is imported lazily, by `to_frame`, for the commands that read runs back.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

Table = dict[str, list]
NAN = math.nan


def nrows(table: Table) -> int:
    """Rows of a table (0 for a table without columns)."""
    for values in table.values():
        return len(values)
    return 0


def empty(columns: Iterable[str]) -> Table:
    return {c: [] for c in columns}


def take(table: Table, index: Sequence[int]) -> Table:
    """The rows at `index`, in that order."""
    return {c: [v[i] for i in index] for c, v in table.items()}


def where(table: Table, mask: Sequence[bool]) -> Table:
    """The rows where `mask` is true."""
    return take(table, [i for i, m in enumerate(mask) if m])


def records(table: Table, columns: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """One dict per row (column order kept)."""
    cols = list(columns) if columns is not None else list(table)
    return [dict(zip(cols, row, strict=True)) for row in zip(*(table[c] for c in cols), strict=True)] \
        if cols else []


def from_records(rows: Sequence[dict[str, Any]], columns: Sequence[str], fill: Any = "") -> Table:
    """A table of `columns` from row dicts (a missing key: `fill`)."""
    return {c: [r.get(c, fill) for r in rows] for c in columns}


def concat(tables: Sequence[Table], columns: Sequence[str], fill: Callable[[str], Any] = lambda c: "") -> Table:
    """Rows of each table in turn; a column a table lacks is `fill(column)` there."""
    out: Table = {c: [] for c in columns}
    for t in tables:
        n = nrows(t)
        for c in columns:
            out[c].extend(t[c] if c in t else [fill(c)] * n)
    return out


def factorize(values: Iterable[Any]) -> tuple[list[int], list[Any]]:
    """Codes numbered in order of first appearance, and the distinct values (as pandas.factorize; NaN is
    a value like any other here)."""
    seen: dict[Any, int] = {}
    codes = [seen.setdefault(v, len(seen)) for v in values]
    return codes, list(seen)


def group_codes(columns: Sequence[Sequence[Any]]) -> list[int]:
    """Group number of each row by the values of `columns`, numbered in order of first appearance."""
    if not columns:
        return []
    return factorize(zip(*columns, strict=True))[0]


def isnan(x: Any) -> bool:
    return x != x


def from_frame(frame: pd.DataFrame) -> Table:
    """A pandas DataFrame as a table (numpy scalars become Python objects)."""
    return {str(c): frame[c].tolist() for c in frame.columns}


def to_frame(table: Table, columns: Sequence[str] | None = None) -> pd.DataFrame:
    """The table as a pandas DataFrame (imports pandas). Text columns are object columns, as the
    DataFrames opscope built before it had tables."""
    import pandas as pd

    cols = list(columns) if columns is not None else list(table)
    data = {}
    for c in cols:
        values = table[c]
        if values and all(type(v) is str for v in values):
            data[c] = pd.Series(values, dtype=object)
        else:
            data[c] = values
    return pd.DataFrame(data, columns=cols)


def pairwise_sum(values: Iterable[float]) -> float:
    """The float sum of `values` (NaN counts as 0) in numpy's order: pairwise over blocks of 128 with
    8 accumulators, as `np.sum` and pandas' `Series.sum()` add a float64 column. Keeps outputs that
    were a pandas sum byte-identical (a sequential `sum()` differs in the last bits)."""
    a = [0.0 if v != v else float(v) for v in values]
    return _pairwise(a, 0, len(a)) if a else 0.0


def _pairwise(a: list[float], lo: int, n: int) -> float:
    # numpy/_core/src/umath/loops_utils.h.src: <type>_pairwise_sum
    if n < 8:
        res = -0.0
        for i in range(lo, lo + n):
            res += a[i]
        return res
    if n <= 128:
        r = a[lo:lo + 8]
        i = 8
        while i < n - n % 8:
            base = lo + i
            for j in range(8):
                r[j] += a[base + j]
            i += 8
        res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]))
        for k in range(lo + i, lo + n):
            res += a[k]
        return res
    half = n // 2
    half -= half % 8
    return _pairwise(a, lo, half) + _pairwise(a, lo + half, n - half)
