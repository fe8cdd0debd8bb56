"""Column tables without pandas: opscope's one table type, from trace decoding to the renderers.

A table is a plain dict of column name -> Python list, every list the same length. Values are Python
objects only (never numpy scalars): floats with NaN for "missing", ints, bools, and str ("" for none).
An analysis compacts the columns of its trace and event tables once they are built (`compact`): a column
of few distinct values becomes a `Coded` one (a 1- or 2-byte code per row), one of distinct floats or ints
a `Packed` one (a typed array). Both read as the list they were (indexing, slicing, iterating, ==) and
refuse changes. A list's pointer per row, and a number object per row where values are distinct, were
most of analyze's memory.
No command imports pandas or numpy (their import costs more than analyzing a few thousand events);
`to_frame` imports pandas for users who want a DataFrame (Run.to_pandas).
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import islice, repeat
from typing import TYPE_CHECKING, Any, cast, overload

if TYPE_CHECKING:
    import pandas as pd

Table = dict[str, list[Any]]
NAN = math.nan
# Typecode of the typed arrays that hold row, event, node and edge numbers: 4-byte ints (half of "q"'s 8;
# 2**31 events would need hundreds of GB before they got there).
INDEX = "i"


# Coded columns: at most 2**16 distinct values (2-byte codes; 1-byte up to 2**8). A column whose first
# CODED_SAMPLE rows are more than half distinct (times, ids) is left a list without coding the rest.
CODED_MAX_VALUES = 1 << 16
CODED_SAMPLE = 4096


class Column(Sequence[Any]):
    """A read-only column that reads as the list it was made from: indexing, slicing (a list), iterating,
    len, == and + with lists. Changing it is a TypeError (a stage that changes a column in place copies
    it first)."""

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (list, Column)):
            return len(self) == len(other) and list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # equal to a list, like a list

    def __add__(self, other: Sequence[Any]) -> list[Any]:
        return list(self) + list(other)

    def __radd__(self, other: Sequence[Any]) -> list[Any]:
        return list(other) + list(self)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({list(self)!r})"


class Coded(Column):
    """A column of few distinct values: a 1- or 2-byte code per row into the list of its distinct values
    (none for a column of one value: every row's code is 0, `Zeros`)."""

    __slots__ = ("codes", "values")

    def __new__(cls, codes: array[int] | Zeros, values: list[Any]) -> Coded:
        # one value: no byte a row (a trace's event table has a dozen such columns: flags never set, ids
        # of one process)
        return object.__new__(_OneValue if cls is Coded and len(values) == 1 else cls)

    def __init__(self, codes: array[int] | Zeros, values: list[Any]) -> None:
        self.codes: array[int] | Zeros = Zeros(len(codes)) if len(values) == 1 else codes
        self.values = values

    def __getnewargs__(self) -> tuple[array[int] | Zeros, list[Any]]:
        return self.codes, self.values

    def __len__(self) -> int:
        return len(self.codes)

    @overload
    def __getitem__(self, i: int) -> Any: ...

    @overload
    def __getitem__(self, i: slice) -> list[Any]: ...

    def __getitem__(self, i: int | slice) -> Any:
        try:  # an index, the common case, without a type check first: it is a Python call per read
            return self.values[self.codes[i]]  # type: ignore[index]  # a slice's codes raise TypeError here
        except TypeError:  # a slice: a list indexed by an array of codes
            if not isinstance(i, slice):
                raise
            return [self.values[c] for c in self.codes[i]]

    def __iter__(self) -> Iterator[Any]:
        return map(self.values.__getitem__, self.codes)

    def __reversed__(self) -> Iterator[Any]:
        return map(self.values.__getitem__, reversed(self.codes))

    def __contains__(self, value: object) -> bool:
        return value in self.values  # every value is some row's


class _OneValue(Coded):
    """A Coded column of one value (Coded() makes it): read without its codes."""

    __slots__ = ()

    def __getitem__(self, i: int | slice) -> Any:
        n = len(self.codes)
        if isinstance(i, slice):
            return [self.values[0]] * len(range(n)[i])
        if -n <= i < n:
            return self.values[0]
        raise IndexError("list index out of range")

    def __iter__(self) -> Iterator[Any]:
        return repeat(self.values[0], len(self.codes))

    __reversed__ = __iter__


class Zeros(Sequence[int]):
    """`n` codes of 0, as an array("B") of them reads (a Coded column of one value's codes), without a byte
    a row."""

    __slots__ = ("n",)
    typecode = "B"
    itemsize = 1

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    @overload
    def __getitem__(self, i: int) -> int: ...

    @overload
    def __getitem__(self, i: slice) -> Zeros: ...

    def __getitem__(self, i: int | slice) -> int | Zeros:
        if isinstance(i, slice):
            return Zeros(len(range(self.n)[i]))
        if not -self.n <= i < self.n:
            raise IndexError("array index out of range")
        return 0

    def __iter__(self) -> Iterator[int]:
        return repeat(0, self.n)

    __reversed__ = __iter__

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Zeros):
            return self.n == other.n
        return isinstance(other, array) and len(other) == self.n and not any(other)

    __hash__ = None  # type: ignore[assignment]


class Packed(Column):
    """A column of floats, or of ints, each row's number in a typed array ("d"; ints "i" while they fit in 4
    bytes, else "q"): 4-8 bytes a row where a list holds a pointer and a number object of its own (32-36
    bytes: times, ids, a row's ancestor)."""

    __slots__ = ("numbers",)

    def __init__(self, numbers: array[Any]) -> None:
        self.numbers = numbers

    def __len__(self) -> int:
        return len(self.numbers)

    @overload
    def __getitem__(self, i: int) -> Any: ...

    @overload
    def __getitem__(self, i: slice) -> list[Any]: ...

    def __getitem__(self, i: int | slice) -> Any:
        if isinstance(i, slice):
            return self.numbers[i].tolist()
        return self.numbers[i]

    def __iter__(self) -> Iterator[Any]:
        return iter(self.numbers)

    def __reversed__(self) -> Iterator[Any]:
        return iter(self.numbers[::-1])


def packed(values: Sequence[Any]) -> Packed | None:
    """`values` as a Packed column when they are all floats ("d": each float exactly, NaN and -0.0 too) or all
    ints of 4 bytes ("i") or 8 ("q"), else None."""
    if not len(values) or isinstance(values, Column):
        return None
    types = set(map(type, values))
    if types == {float}:
        return Packed(array("d", values))
    if types == {int}:
        numbers = _ints(values)
        return None if numbers is None else Packed(numbers)
    return None


def _ints(values: Sequence[int], typecodes: tuple[str, ...] = (INDEX, "q")) -> array[int] | None:
    """`values` in an array of the first of `typecodes` they fit (4-byte ints "i", then 8-byte "q"); None
    when none fits."""
    for code in typecodes:
        try:
            return array(code, values)
        except OverflowError:
            continue
    return None


def _negative_zero(values: Sequence[Any]) -> bool:
    return any(v == 0.0 and type(v) is float and math.copysign(1.0, v) < 0 for v in values)


def _signed(v: Any) -> float:
    return math.copysign(1.0, v) if type(v) is float else 0.0


def coded(values: Sequence[Any]) -> Coded | None:
    """`values` as a Coded column, or None when they have too many distinct values or one that cannot be
    a dict key. Values are told apart by type and value, and floats by sign too (0 and 0.0, False, and
    0.0 and -0.0 each keep their own); each row reads back a value equal to its own and of its type."""
    n = len(values)
    if not n or isinstance(values, Column):
        return None
    try:
        types = set(map(type, values))
        # values are their own keys unless two of them are equal but tell apart: numbers of two types
        # (0, 0.0, False), or 0.0 and -0.0
        plain = len(types & {int, float, bool}) <= 1 and not (float in types and _negative_zero(values))

        def keys() -> Iterator[Any]:  # made as they are read: a tuple per row held at once would cost more
            if plain:
                return iter(values)
            if float in types:  # floats' signs: math.copysign itself when every value is a number
                signs = map(math.copysign, repeat(1.0), values) if types <= {float, int, bool} else map(_signed, values)
                return zip(map(type, values), values, signs, strict=False)  # repeat() is endless
            return zip(map(type, values), values, strict=True)

        rows = keys()
        seen = dict.fromkeys(islice(rows, CODED_SAMPLE))
        if len(seen) > 1 and len(seen) > min(n, CODED_SAMPLE) // 2:
            return None
        while chunk := dict.fromkeys(islice(rows, CODED_MAX_VALUES)):  # stops early on many distinct values
            seen.update(chunk)
            if len(seen) > CODED_MAX_VALUES:
                return None
    except TypeError:  # unhashable values (lists)
        return None
    code = {k: i for i, k in enumerate(seen)}
    codes = array("B" if len(seen) <= 1 << 8 else "H", map(code.__getitem__, keys()))
    return Coded(codes, _fresh([k if plain else k[1] for k in seen]))


def _fresh(values: list[Any]) -> list[Any]:
    """The same numbers as new objects when all are floats or all ints (else `values`). A column's distinct
    values are objects of its rows' list, a few in each of the small-object arenas the list's numbers
    filled: they held every such arena after the list was freed (about 10 MiB of the 20x scaling trace's
    event table). Made now, they take free space in arenas that stay anyway."""
    types = set(map(type, values))
    try:
        if types == {float}:
            # a NaN stays its own object: equal to itself only as that object (a list holding it compares
            # equal to another holding it, as a trace's tables read twice do)
            return [v if v == v else x for v, x in zip(array("d", values).tolist(), values, strict=True)]
        if types == {int}:
            return array("q", values).tolist()
    except OverflowError:  # an int past 8 bytes
        pass
    return values


def compact(table: Table) -> None:
    """Replaces each column of few distinct values with its Coded form, and each other column of floats or
    of ints with its Packed form (the same values, read-only). Such a column is typed as the list it reads
    as: tables keep one type; what would change it fails at run time (the whole suite runs on compacted
    tables)."""
    for name, values in list(table.items()):
        table[name] = compacted(values)


def compacted(values: Sequence[Any]) -> list[Any]:
    """`values` Coded or Packed (see `compact`), or as they are: a compacted column, a list (a list of them
    where they were in neither, a typed array of ints too wide)."""
    column: Column | None = coded(values) or packed(values)
    if column is not None:
        return cast(list[Any], column)
    return cast(list[Any], values) if isinstance(values, (list, Column)) else list(values)


class ColumnBuilder:
    """A column built a batch of rows at a time (`extend`) straight into the form `compact` would give it:
    Coded while its values are few and of one type (and no float is -0.0), else Packed while they are
    all floats or all ints of at most 8 bytes, else a list. A reader that kept lists until the end held a pointer
    per row, and a number object per row where values are distinct, at its peak (about 240 MiB of a
    2.6M-event trace's 300). Each batch costs a few passes at C speed."""

    __slots__ = ("codes", "keys", "kind", "numbers", "rows", "values")

    def __init__(self) -> None:
        self.keys: dict[Any, int] | None = {}  # coded while not None: value -> code
        self.codes: array[int] = array("B")
        self.kind: type | None = None  # the one type of a coded or packed column's values
        self.numbers: array[Any] | None = None  # packed while not None
        self.values: list[Any] | None = None  # a list while not None
        self.rows = 0

    def extend(self, batch: list[Any]) -> None:
        """Appends the rows of `batch` (which the caller may then clear)."""
        if not batch:
            return
        if self.values is None:
            types = set(map(type, batch))
            kind = self.kind
            if len(types) != 1 or (kind is not None and types != {kind}):
                self._to_list()
            else:
                if kind is None:
                    kind = self.kind = types.pop()
                # 0.0 and -0.0 are equal keys but written apart; an array("d") keeps them apart (0.0 in
                # batch: at C speed, before the signs are looked at)
                if kind is float and self.keys is not None and 0.0 in batch and _negative_zero(batch):
                    self._pack()
        added = self.keys is not None and self._code(batch)
        if not added and self.numbers is not None:
            added = self._pack_extend(batch)
        if not added:
            cast(list[Any], self.values).extend(batch)
        self.rows += len(batch)

    def _code(self, batch: list[Any]) -> bool:
        """Codes the batch; False when the column leaves coding instead (the batch not added)."""
        keys = cast(dict[Any, int], self.keys)
        try:
            for value in dict.fromkeys(batch):  # the batch's distinct values, new ones numbered
                if value not in keys:
                    keys[value] = len(keys)
        except TypeError:  # unhashable values (lists)
            self._to_list()
            return False
        rows = self.rows + len(batch)
        if len(keys) > CODED_MAX_VALUES or (rows >= CODED_SAMPLE and len(keys) > 1 and len(keys) > rows // 2):
            self._pack()  # too many values, or distinct ones (times, ids)
            return False
        if len(keys) > 1 << 8 and self.codes.typecode == "B":
            self.codes = array("H", self.codes)
        self.codes.extend(map(keys.__getitem__, batch))
        return True

    def _pack(self) -> None:
        """Leaves coding: a Packed column of the rows so far, or a list when they are not floats or ints of
        at most 8 bytes."""
        so_far = list(self._coded())
        self.keys, self.codes = None, array("B")
        if self.kind is float:
            self.numbers = array("d", so_far)
            return
        if self.kind is int:
            self.numbers = _ints(so_far)
            if self.numbers is not None:
                return
        self.values = so_far

    def _pack_extend(self, batch: list[Any]) -> bool:
        """Packs the batch; False when a number does not fit (the column a list from here on, the batch not added)."""
        numbers = cast("array[Any]", self.numbers)
        before = len(numbers)
        try:
            numbers.extend(batch)
        except OverflowError:
            del numbers[before:]  # what the batch added before the int that does not fit
            wider = _ints(numbers, ("q",)) if numbers.typecode == INDEX else None  # 4 bytes -> 8
            if wider is not None:
                self.numbers = wider
                return self._pack_extend(batch)
            self._to_list()
            return False
        return True

    def _coded(self) -> Coded:
        return Coded(self.codes, list(cast(dict[Any, int], self.keys)))

    def _to_list(self) -> None:
        if self.values is None:
            self.values = list(self.column())
            self.keys, self.numbers, self.codes = None, None, array("B")

    def column(self) -> list[Any]:
        """The rows so far: a Coded or Packed column (typed as the list it reads as, like `compact`'s), or
        a list."""
        if self.values is not None:
            return self.values
        if not self.rows:
            return []
        if self.keys is not None:
            return cast(list[Any], self._coded())
        return cast(list[Any], Packed(cast("array[Any]", self.numbers)))


def built(columns: Iterable[str]) -> dict[str, ColumnBuilder]:
    return {c: ColumnBuilder() for c in columns}


def flush(builders: dict[str, ColumnBuilder], table: Table) -> None:
    """Moves the rows of `table`'s lists into their builders, and empties the lists."""
    for name, values in table.items():
        builders[name].extend(values)
        values.clear()


def finished(builders: dict[str, ColumnBuilder]) -> Table:
    return {name: b.column() for name, b in builders.items()}


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


def take_compact(table: Table, index: Sequence[int]) -> Table:
    """take(), each column as compact as it was (a Coded column's codes, a Packed one's numbers; take() gives
    lists: a pointer, and a number object per distinct value, a row)."""
    out: Table = {}
    for name, values in table.items():
        if isinstance(values, Packed):
            out[name] = Packed(array(values.numbers.typecode, map(values.numbers.__getitem__, index)))
        elif isinstance(values, Coded):
            codes = values.codes
            out[name] = Coded(array(codes.typecode, map(codes.__getitem__, index)) if isinstance(codes, array)
                              else Zeros(sum(1 for _ in map(codes.__getitem__, index))), values.values)
        else:
            out[name] = [values[i] for i in index]
    return out


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


def sort_order(n: int, keys: Sequence[tuple[Sequence[Any], bool]]) -> Sequence[int]:
    """Indices 0..n-1 sorted by `keys`, most significant first, each (values, descending), ties in index
    order: what sorted(range(n), key=lambda i: (values[i] or -values[i], ...)) gives, without a tuple
    and a negated number per row. One stable sort per key, least significant first (Python's sort keeps
    equal items in order, reversed or not): on a trace's events, a quarter of the tuples' memory; rows
    already in order (a trace's events on one thread, as the profiler writes them) are range(n), with
    nothing allocated. The values must be totally ordered (no NaN)."""
    keys = [(_sortable(values), descending) for values, descending in keys]
    if _in_order(n, keys):
        return range(n)
    order = list(range(n))
    sort_rows(order, keys)
    return order


def sort_rows(rows: list[int], keys: Sequence[tuple[Sequence[Any], bool]]) -> None:
    """Sorts `rows` (row numbers) in place by `keys` as sort_order does: the order of sorting by a tuple of
    the rows' values, ties kept as they are, without a tuple per row (one stable sort per key)."""
    for values, descending in reversed(keys):
        rows.sort(key=_sortable(values).__getitem__, reverse=descending)


def sorted_rows(rows: array[int], keys: Sequence[tuple[Sequence[Any], bool]]) -> array[int]:
    """`rows` (row numbers, a typed array) in the order sort_rows gives them, by the values at those rows:
    `rows` itself when already in that order (a trace's events on one thread, as the profiler writes them),
    else a new array. A list of the rows held a pointer and an int object a row."""
    columns = [(_sortable(values), descending) for values, descending in keys]
    if _rows_in_order(rows, columns):
        return rows
    order = list(rows)
    sort_rows(order, columns)  # the columns as made for the check (a Coded one's list), not again
    return array(INDEX, order)


def _rows_in_order(rows: Sequence[int], keys: Sequence[tuple[Sequence[Any], bool]]) -> bool:
    for k in range(1, len(rows)):
        i, j = rows[k - 1], rows[k]
        for values, descending in keys:
            a, b = values[i], values[j]
            if a != b:
                if (a > b) != descending:
                    return False
                break
    return True


def _sortable(values: Sequence[Any]) -> Sequence[Any]:
    # a compacted column's values as a plain sequence (a Coded one as a list, for as long as the sort takes):
    # a Python call per row and comparison would cost more than the sorting
    return list(values) if isinstance(values, Coded) else indexable(values)


def indexable(values: Sequence[Any]) -> Sequence[Any]:
    """The column itself, or a Packed column's typed array: the same numbers, indexed without a Python call
    (for a loop that reads a column by index)."""
    return values.numbers if isinstance(values, Packed) else values


def _in_order(n: int, keys: Sequence[tuple[Sequence[Any], bool]]) -> bool:
    return _rows_in_order(range(n), keys)


def grouped(keys: Sequence[int], n_groups: int) -> tuple[array[int], array[int]]:
    """Positions grouped by key, as CSR: members[start[k]:start[k + 1]] are the positions i with keys[i] == k,
    in order (a key < 0 is in no group). A counting sort into two typed arrays: a list per group, or a
    sorted list of positions with their sort keys, held several times the memory on a trace's events."""
    start = array(INDEX, [0]) * (n_groups + 1)
    for k in keys:
        if k >= 0:
            start[k + 1] += 1
    for k in range(n_groups):
        start[k + 1] += start[k]
    at = array(INDEX, start)
    members = array(INDEX, [0]) * start[n_groups]
    for i, k in enumerate(keys):
        if k >= 0:
            members[at[k]] = i
            at[k] += 1
    return start, members


def group_codes(columns: Sequence[Sequence[Any]]) -> list[int]:
    """Group number of each row by the values of `columns`, numbered in order of first appearance."""
    if not columns:
        return []
    return factorize(zip(*columns, strict=True))[0]


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


def pairwise_sum(values: Sequence[float]) -> float:
    """Sum of floats exactly as pandas' Series.sum() gives it (NaN counts as 0): numpy's pairwise
    summation, so that tables summed here and DataFrames summed before agree to the last bit."""
    a = [0.0 if v != v else float(v) for v in values]
    return 0.0 + _pairwise(a, 0, len(a))  # numpy starts the reduction at 0.0 (so -0.0 sums to 0.0)


def _pairwise(a: list[float], lo: int, n: int) -> float:
    # numpy's pairwise_sum (loops_utils.h): sequential under 8 values, 8 accumulators up to 128, else halves
    if n < 8:
        res = 0.0
        for i in range(lo, lo + n):
            res += a[i]
        return res
    if n <= 128:
        r = a[lo:lo + 8]
        end = lo + n - n % 8
        for i in range(lo + 8, end, 8):
            for j in range(8):
                r[j] += a[i + j]
        res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]))
        for i in range(end, lo + n):
            res += a[i]
        return res
    n2 = n // 2
    n2 -= n2 % 8
    return _pairwise(a, lo, n2) + _pairwise(a, lo + n2, n - n2)


def mean(values: Sequence[float]) -> float:
    """pandas' Series.mean() of floats (NaN for missing): their pairwise sum (missing values as 0) over
    how many are not missing; NaN when none is."""
    n = sum(1 for v in values if v == v)
    return pairwise_sum(values) / n if n else NAN


def median(values: Sequence[float]) -> float:
    """pandas' Series.median() of floats (NaN for missing): the middle one of those not missing, or of
    two middle ones their numpy mean (their sum halved); NaN when none is."""
    present = sorted(v for v in values if v == v)
    n = len(present)
    if not n:
        return NAN
    return present[n // 2] if n % 2 else pairwise_sum(present[n // 2 - 1:n // 2 + 1]) / 2


def filled(values: Iterable[Any], fill: Any = "") -> list[Any]:
    """The values with each missing one (NaN, None) replaced by `fill` (pandas' fillna)."""
    return [fill if v is None or v != v else v for v in values]


def group_sums(keys: Sequence[Any], values: Sequence[float]) -> dict[Any, float]:
    """Sum of `values` per key, keys in sorted order, missing (NaN) keys dropped: the floats pandas'
    `groupby(key).sum()` gives (kept so the message's numbers do not move in the last digit). pandas
    adds a group by `np.add.reduceat` (first value + numpy's pairwise sum of the rest) when the rows come
    grouped in key order and hold no NaN, else with Kahan summation in row order."""
    present = [k for k in keys if k == k]
    order = {k: g for g, k in enumerate(sorted(set(present)))}
    codes = [order[k] if k == k else -1 for k in keys]
    sums: dict[Any, float] = {}
    if codes == sorted(codes) and all(v == v for v in values):
        start = 0
        for end in range(1, len(codes) + 1):
            if end == len(codes) or codes[end] != codes[start]:
                if codes[start] >= 0:
                    sums[keys[start]] = values[start] + pairwise_sum(values[start + 1:end]) \
                        if end - start > 1 else float(values[start])
                start = end
    else:
        total = [0.0] * len(order)
        comp = [0.0] * len(order)
        for g, v in zip(codes, values, strict=True):
            if g < 0 or v != v:
                continue
            y = v - comp[g]
            t = total[g] + y
            c = t - total[g] - y
            comp[g] = 0.0 if c != c else c  # an infinite value: keep the sum infinite, not NaN
            total[g] = t
        sums = {k: total[g] for k, g in order.items()}
    return dict(sorted(sums.items(), key=lambda kv: order[kv[0]]))


def largest_first(sums: dict[Any, float]) -> list[tuple[Any, float]]:
    """(key, sum) by decreasing sum; ties keep the keys' order (pandas' sort_values(ascending=False))."""
    return sorted(sums.items(), key=lambda kv: -kv[1])
