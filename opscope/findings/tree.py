"""The event table as the findings read it: which events count, the op call tree, and the ops.csv row
of each event. Everything derived from the table is computed once per run and kept in `Context.cache`.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from typing import Any

from opscope.findings.base import Context, cached
from opscope.sources import HARNESS
from opscope.table import INDEX, Table, grouped, indexable, records

# Views and wrappers that never move data (skipped when looking for "the next op").
VIEW_FAMILIES = frozenset({"view", "composite"})


# Per-event results are typed (a float array, a byte per flag): a list held a pointer an event, and a
# float object each, whose freed blocks then stayed spread over the heap through the what-if.


def user_mask(ctx: Context) -> bytearray:
    """Events inside a profiled step that the user's code issued: not opscope's harness (loss,
    backward seed, optimizer), not outside the ProfilerStep annotations. 1 or 0 per event."""
    def build() -> bytearray:
        return bytearray(step >= 0 and loc != HARNESS
                         for step, loc in zip(col(ctx, "step"), col(ctx, "source_location"), strict=True))
    return cached(ctx, "user_mask", build)


def names(ctx: Context) -> list[str]:
    return ctx.events["name"]


def col(ctx: Context, column: str) -> list[Any]:
    """A column of the event table (a list: the table's own, not a copy)."""
    return ctx.events[column]


def ops_rows(ctx: Context) -> list[dict[str, Any]]:
    """ops.csv rows as dicts, built once: rules read rows one by one."""
    return cached(ctx, "ops_rows", lambda: records(ctx.ops))


def subtree_sum(ctx: Context, column: str) -> array[float]:
    """Per event: `column` summed over the event and everything nested in it (NaN counts as 0)."""
    def build() -> array[float]:
        acc = array("d", (0.0 if v != v else float(v) for v in col(ctx, column)))
        parent, depth = indexable(col(ctx, "parent")), col(ctx, "depth")
        by_depth: dict[int, list[int]] = {}
        for i, d in enumerate(depth):
            if d > 0:
                by_depth.setdefault(d, []).append(i)
        # Deepest level first, each level in event order: every event's total is final before its parent
        # adds it, and the additions come in the order np.add.at made them (same floats).
        for d in sorted(by_depth, reverse=True):
            for i in by_depth[d]:
                acc[parent[i]] += acc[i]
        return acc
    return cached(ctx, f"subtree:{column}", build)


class Children:
    """Direct children of each event, in trace order: `children[i]`. Two typed arrays (CSR by parent): a
    list per event, most of them empty, took 64 bytes an event."""

    def __init__(self, parent: Sequence[int]) -> None:
        self.start, self.kids = grouped(parent, len(parent))

    def __getitem__(self, i: int) -> array[int]:
        return self.kids[self.start[i]:self.start[i + 1]]

    def __len__(self) -> int:
        return len(self.start) - 1


def children(ctx: Context) -> Children:
    """Direct children of each event (any event type), in trace order."""
    return cached(ctx, "children", lambda: Children(col(ctx, "parent")))


def descendants(ctx: Context, i: int) -> list[int]:
    kids = children(ctx)
    out: list[int] = []
    stack = list(reversed(kids[i]))
    while stack:
        j = stack.pop()
        out.append(j)
        stack.extend(reversed(kids[j]))
    return out


def is_worker(ctx: Context) -> bytearray:
    """Per event: a row op that does work of its own, i.e. neither a view, a composite wrapper, nor an
    op the cost model does not know that has row ops beneath it (an unknown wrapper). 1 or 0."""
    def build() -> bytearray:
        fam = col(ctx, "family")
        is_row = col(ctx, "is_row")
        has_row_child = bytearray(len(fam))
        for p in col(ctx, "row_parent"):
            if p >= 0:
                has_row_child[p] = 1
        out = bytearray()
        for f, row, kids in zip(fam, is_row, has_row_child, strict=True):
            f = f if isinstance(f, str) else ""
            out.append(bool(row) and f not in VIEW_FAMILIES and not (f == "" and kids))
        return out
    return cached(ctx, "is_worker", build)


def inside_worker(ctx: Context, i: int) -> bool:
    """Event i runs inside another row op that does work (e.g. fill_ initializing sum's output, copy_
    writing addmm's bias): part of that op's implementation."""
    return bool(inside_worker_flags(ctx)[i])


def inside_worker_flags(ctx: Context) -> bytearray:
    """inside_worker() for every event: 1 or 0."""
    return cached(ctx, "inside_worker", lambda: _inside_worker_all(ctx))


UNKNOWN = 2  # _inside_worker_all: not resolved yet


def _inside_worker_all(ctx: Context) -> bytearray:
    work = is_worker(ctx)
    rp = col(ctx, "row_parent")
    memo = bytearray([UNKNOWN]) * len(rp)
    for start in range(len(rp)):
        i = start
        chain = []
        while memo[i] == UNKNOWN:
            a = rp[i]
            if a < 0:
                memo[i] = 0
                break
            if work[a]:
                memo[i] = 1
                break
            chain.append(i)
            i = a
        value = memo[i]
        for k in chain:
            memo[k] = value
    return memo


def row_ancestors(ctx: Context, i: int) -> list[int]:
    """Row (ns::op) ancestors of event i, innermost first (not including i)."""
    rp = col(ctx, "row_parent")
    out = []
    a = rp[i]
    while a >= 0:
        out.append(a)
        a = rp[a]
    return out


def ops_row_of_events(ctx: Context) -> array[int]:
    """Per event: index of its ops.csv row in ctx.ops (-1 for non-row events)."""
    return cached(ctx, "ops_row", lambda: ops_rows_for_events(ctx.ops, ctx.events))


ROW_KEY = ("op", "input_dims", "input_dtypes", "input_strides", "concrete_inputs", "source_location", "module")


def ops_rows_for_events(ops: Table, ev: Table) -> array[int]:
    """Per event of the event table `ev`: index of its row in the ops table `ops` (-1 for non-row events);
    a typed array (a list held a pointer per event through the rules: 20 MiB on a 2.6M-event trace)."""
    lookup = {key: k for k, key in enumerate(zip(*(ops[c] for c in ROW_KEY), strict=True))}
    keys = zip(ev["name"], *(ev[c] for c in ROW_KEY[1:]), strict=True)
    get = lookup.get
    return array(INDEX, (get(key, -1) if is_row else -1 for key, is_row in zip(keys, ev["is_row"], strict=True)))


def event_bound(ctx: Context) -> list[str]:
    """Per event: the `bound` of its ops.csv row ('' for non-row events)."""
    def build() -> list[str]:
        bounds = ctx.ops["bound"]
        return [bounds[r] if r >= 0 else "" for r in ops_row_of_events(ctx)]
    return cached(ctx, "event_bound", build)


def events_by_ops_row(ctx: Context) -> dict[int, array[int]]:
    """ops.csv row index -> the user events (see user_mask) grouped into it, in trace order (typed arrays:
    a list held an int object and a pointer per event)."""
    def build() -> dict[int, array[int]]:
        out: dict[int, array[int]] = {}
        for i, (r, user) in enumerate(zip(ops_row_of_events(ctx), user_mask(ctx), strict=True)):
            if r >= 0 and user:
                if r not in out:
                    out[r] = array(INDEX)
                out[r].append(i)
        return out
    return cached(ctx, "events_by_row", build)
