"""Fixes as changes to the step's graph (opscope.analysis.replay.Change): a user's `--op-speedup`, and
each finding's fix, defined per rule in one table (FIXES).

A finding points at rows of the event table: its op at its source line, inside its module. Its fix:

- "roofline" (any rule without an entry): those rows at their achievable time, max(FLOPs / peak FLOP/s,
  bytes / peak bandwidth) at the run's peaks (their kernels on a GPU, their self time on a CPU); no change
  for rows without a cost model or peak;
- "remove-copies": the copies removed: the rows when the op is a copy (or a compiled kernel that only
  moves data), else the copy ops called inside them;
- "remove-gaps": the host work CUDA graphs would replay removed (launch-bound, overhead);
- "no-wait": the host waits inside the rows no longer wait for the GPU (host-sync: the value kept on the
  device); the calls' own time stays;
- "fuse-chain" (fusion): the chain as one op that moves only the fused bytes at the chain's achieved
  bandwidth: the memory-bound rows at the chain's lines (the finding's "lines", else its line) in its
  module scaled together to the time one op moving the fused bytes (the chain's bytes less the
  intermediates the rule counts as skipped) takes at the measured bandwidth ceiling, as the roofline fix
  puts an op; never slower than the rule's own estimate (est_savings_us less time);
- "measured-saving" (channels-last): the finding's rows take the rule's saving less time, where that saving
  is a measurement (channels-last: the layout probe timed the op in both layouts on this machine).

Beside the findings, a swap that passed verification (swap.json) is a fix of its own (`measured_swap`): the
op rows its kernel replaces take swap's measured op-level saving less time.
"""

from __future__ import annotations

import hashlib
import re
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from opscope.analysis.replay import Change
from opscope.errors import OpscopeError
from opscope.findings.copies import COPY_OPS
from opscope.machine.peaks import Peaks, ceiling_key
from opscope.table import INDEX, Table, indexable, nrows

FIXES: dict[str, str] = {
    "implicit-copy": "remove-copies",
    "contiguous-call": "remove-copies",
    "kernel-copy": "remove-copies",
    "compile-copy": "remove-copies",
    "launch-bound": "remove-gaps",
    "overhead": "remove-gaps",
    "host-sync": "no-wait",
    "fusion": "fuse-chain",
    "channels-last": "measured-saving",
}
# Op families a fused element-wise chain does not absorb (the fusion rule's chains are memory-bound ops)
_NOT_FUSED = frozenset({"matmul", "conv", "attention"})
MODULE_PREFIX = "module:"
_SPEEDUP_RE = re.compile(r"^(?P<target>.+)=(?P<factor>[0-9]*\.?[0-9]+(?:[eE][-+]?\d+)?)x?$")


def finding_id(f: dict[str, Any]) -> str:
    """`<rule>-<8 hex digits>`: a hash of the rule, op, source line and module, the same in every run of the
    same code."""
    key = "|".join(str(f.get(k) or "") for k in ("rule", "op", "source_location", "module"))
    return f"{f.get('rule')}-{hashlib.sha1(key.encode()).hexdigest()[:8]}"


def assign_ids(findings: list[dict[str, Any]]) -> None:
    """Adds "id" to each finding; a repeated id gets -2, -3, ... in the findings' order."""
    seen: dict[str, int] = {}
    for f in findings:
        base = finding_id(f)
        seen[base] = seen.get(base, 0) + 1
        f["id"] = base if seen[base] == 1 else f"{base}-{seen[base]}"


@dataclass(frozen=True)
class OpSpeedup:
    target: str  # an op name, or module:<qualified name>
    factor: float  # > 0: durations divided by it

    @property
    def text(self) -> str:
        return f"{self.target}={self.factor:g}x"


def parse_op_speedup(text: str) -> OpSpeedup:
    """'aten::gelu=2x' or 'module:encoder.layer.3=1.5x'; an OpscopeError for anything else (no target,
    no number, a factor that is not positive and finite)."""
    m = _SPEEDUP_RE.match(text.strip())
    if not m or not m.group("target").strip() or m.group("target").strip() == MODULE_PREFIX:
        raise OpscopeError(f"--op-speedup {text!r}: expected OP=FACTORx, e.g. 'aten::gelu=2x' or "
                           "'module:encoder.layer.3=1.5x'")
    factor = float(m.group("factor"))
    if not factor > 0 or factor == float("inf"):
        raise OpscopeError(f"--op-speedup {text!r}: the factor must be a positive number (2x halves the time)")
    return OpSpeedup(m.group("target").strip(), factor)


def _in_module(module: str, path: str) -> bool:
    return not path or module == path or module.startswith(path + ".")


class Fixer:
    """Turns fixes into changes on one run's events and kernels (indexed once: a change costs its rows)."""

    def __init__(self, ev: Table, kernels: Table, peaks: Peaks, gpu: bool) -> None:
        self.ev, self.peaks, self.gpu = ev, peaks, gpu
        # typed arrays: a list of row numbers held an int object and a pointer per row event
        self.rows_by_name: dict[str, array[int]] = {}
        for i, (r, name) in enumerate(zip(ev["is_row"], ev["name"], strict=True)):
            if r:
                if name not in self.rows_by_name:
                    self.rows_by_name[name] = array(INDEX)
                self.rows_by_name[name].append(i)
        self.kernels_of: dict[int, array[int]] = {}
        if nrows(kernels) and "op" in kernels:
            for k, op in enumerate(kernels["op"]):
                if op >= 0:
                    if op not in self.kernels_of:
                        self.kernels_of[op] = array(INDEX)
                    self.kernels_of[op].append(k)

    def rows_change(self, rows: Iterable[int], factor: float, *, cpu: bool = True, gpu: bool = True) -> Change:
        change = Change()
        for i in rows:
            if cpu:
                change.cpu[i] = factor
            if gpu:
                for k in self.kernels_of.get(i, ()):
                    change.kernels[k] = factor
        return change

    def speedup(self, s: OpSpeedup) -> Change:
        """Every row of the op (or inside the module): its self time and its kernels' time divided by the
        factor."""
        ev = self.ev
        rows: Sequence[int]
        if s.target.startswith(MODULE_PREFIX):
            path = s.target[len(MODULE_PREFIX):]
            rows = [i for i, (r, m) in enumerate(zip(ev["is_row"], ev["module"], strict=True))
                    if r and _in_module(m, path)]
        else:
            rows = self.rows_by_name.get(s.target, array(INDEX))
        return self.rows_change(rows, 1.0 / s.factor)

    def rows(self, f: dict[str, Any]) -> list[int]:
        """The row events a finding points at: its op at its source line (any line when it names none),
        inside its module (anywhere when it has none)."""
        op, loc, module = f.get("op") or "", f.get("source_location") or "", f.get("module") or ""
        where, mod = self.ev["source_location"], self.ev["module"]
        return [i for i in self.rows_by_name.get(op, []) if (not loc or where[i] == loc) and _in_module(mod[i], module)]

    def finding(self, f: dict[str, Any]) -> Change:
        """The change that fixes a finding (FIXES)."""
        kind = FIXES.get(str(f.get("rule")), "roofline")
        if kind == "remove-gaps":
            return Change(remove_gaps=True)
        rows = self.rows(f)
        if kind == "no-wait":
            return Change(unblocked=frozenset(self._below(rows)))
        if kind == "remove-copies":
            return self.rows_change(self._copies(rows, f), 0.0)
        if kind == "fuse-chain":
            return self._fused(f)
        if kind == "measured-saving":  # the op's whole time: a composite's (aten::convolution's) is in its children
            return self._less_by_saving(self._below(rows), f.get("est_savings_us"))
        change = Change()
        for i in rows:
            factor = self._achievable_factor(i)
            if factor is not None:
                change = change.combined(self.rows_change([i], factor, cpu=not self.gpu, gpu=self.gpu))
        return change

    def _fused(self, f: dict[str, Any]) -> Change:
        """The fusion finding's chain (its lines' memory-bound rows) as one op moving the fused bytes."""
        ev = self.ev
        lines = set(f.get("lines") or [f.get("source_location") or ""]) - {""}
        module = f.get("module") or ""
        if not lines:
            return Change()
        rows = [i for i, (r, where, mod, family) in enumerate(zip(ev["is_row"], ev["source_location"], ev["module"],
                                                                 ev["family"], strict=True))
                if r and where in lines and _in_module(mod, module) and family not in _NOT_FUSED]
        return self._less_by_saving(rows, f.get("est_savings_us"), fused_at_ceiling=True)

    def measured_swap(self, keys: Iterable[tuple[str, ...]], saving_us: float) -> Change:
        """A bundled kernel in place of the op rows with these ops.csv keys (ops_table.KEY: op, input dims,
        dtypes, strides, concrete inputs, source line, module): their time less `saving_us` (over all
        profiled steps: swap's measured op-level saving; negative for a kernel that loses)."""
        ev = self.ev
        wanted = set(keys)
        rows = [i for i, key in enumerate(zip(ev["name"], ev["input_dims"], ev["input_dtypes"], ev["input_strides"],
                                               ev["concrete_inputs"], ev["source_location"], ev["module"],
                                               strict=True))
                if ev["is_row"][i] and key in wanted]
        return self._less_by_saving(rows, saving_us)

    def _less_by_saving(self, rows: list[int], saving: Any, *, fused_at_ceiling: bool = False) -> Change:
        """`rows` scaled together so that they take `saving` (µs over all profiled steps, as their times are)
        less time (more, for a negative saving); no change without a saving. `fused_at_ceiling` (a fused
        chain): at most the time one op moving the fused bytes (the rows' bytes less the intermediates the
        saving stands for) takes at the measured bandwidth ceiling, as the roofline fix puts any op."""
        if not isinstance(saving, (int, float)) or saving == 0 or saving != saving:
            return Change()
        time = self.ev["device_us"] if self.gpu else self.ev["self_us"]
        total = sum(float(time[i]) for i in rows)
        if total <= 0:
            return Change()
        target = total - float(saving)
        bw = self.peaks.memory_bandwidth_gbps
        if fused_at_ceiling and bw and bw > 0:
            nbytes = sum(float(b) for b in (self.ev["bytes"][i] for i in rows) if b == b)
            if nbytes > 0:
                target = min(target, nbytes * max(0.0, 1.0 - float(saving) / total) / (bw * 1e3))
        return self.rows_change(rows, max(target, 0.0) / total, cpu=not self.gpu, gpu=self.gpu)

    def _below(self, rows: list[int]) -> list[int]:
        """The rows and every row below them."""
        inside = set(rows)
        row_parent = indexable(self.ev["row_parent"])
        out = list(rows)
        for i, r in enumerate(self.ev["is_row"]):
            if r and i not in inside:
                p = row_parent[i]
                while p >= 0 and p not in inside:
                    p = row_parent[p]
                if p >= 0:
                    out.append(i)
        return out

    def _copies(self, rows: list[int], f: dict[str, Any]) -> list[int]:
        """The copies a copy finding points at: the copy ops below its rows, and its rows themselves when
        its op is a copy (aten::contiguous's own time and its clone/copy_ children's) or a compiled kernel."""
        ev = self.ev
        names = ev["name"]
        below = [i for i in self._below(rows)[len(rows):] if names[i] in COPY_OPS]
        if (f.get("op") or "") in COPY_OPS or any(ev["row_kind"][i] == "kernel" for i in rows):
            return rows + below
        return below

    def _achievable_factor(self, i: int) -> float | None:
        """The row's roofline time over its measured time (at most 1); None when not known."""
        ev, peaks, gpu = self.ev, self.peaks, self.gpu
        flops, nbytes = float(ev["flops"][i]), float(ev["bytes"][i])
        bw = peaks.memory_bandwidth_gbps
        if nbytes != nbytes or not bw or bw <= 0:
            return None
        family = ev["family"][i]
        key = ceiling_key(family, ev["dtype"][i] or None, ev["kernels"][i] if gpu else "") if family else ""
        peak = peaks.flops_for(key) if key else None
        comp = flops / (peak * 1e3) if peak and flops == flops and flops > 0 else 0.0
        ideal = max(nbytes / (bw * 1e3), comp)
        measured = float(ev["device_us"][i] if gpu else ev["self_us"][i])
        if measured <= 0:
            return None
        return min(ideal / measured, 1.0)
