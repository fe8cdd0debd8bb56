"""The findings' view of the event tree (opscope.findings.tree): the children index, by hand."""

from __future__ import annotations

from types import SimpleNamespace

from opscope.findings.tree import Children, descendants


def test_children_are_each_events_direct_children_in_trace_order():
    #      0          5
    #    / | \        |
    #   1  3  4       6
    #   |
    #   2
    parent = [-1, 0, 1, 0, 0, -1, 5]
    kids = Children(parent)
    assert len(kids) == 7
    assert [list(kids[i]) for i in range(7)] == [[1, 3, 4], [2], [], [], [], [6], []]
    ctx = SimpleNamespace(events={"parent": parent}, cache={})
    assert descendants(ctx, 0) == [1, 2, 3, 4]  # depth first, in trace order
    assert descendants(ctx, 5) == [6] and descendants(ctx, 2) == []
    assert len(Children([])) == 0
