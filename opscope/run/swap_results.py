"""swap.json: the swap results of a run (format in README.md, "Run directory format"). Torch-free: the
renderers read it through `read_swap`, which keeps only well-formed results and never raises."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

FORMAT_VERSION = 1
STATUSES = ("passed", "failed", "not-applicable", "error")


def result_doc(*, label: str, source: str, kernels: list[str], status: str, message: str = "",
               mechanisms: list[dict[str, Any]] | None = None, notes: list[str] | None = None,
               verification: Any = None, op_level: list[dict[str, Any]] | None = None,
               end_to_end: dict[str, Any] | None = None) -> dict[str, Any]:
    """One entry of swap.json's "results"."""
    assert status in STATUSES, status
    doc: dict[str, Any] = {"label": label, "source": source, "kernels": kernels, "status": status, "message": message,
                           "mechanisms": mechanisms or [], "notes": notes or [], "calls": None, "sites": [],
                           "verification": None, "max_abs_err": None, "max_rel_err": None,
                           "out_of_tolerance": None, "op_level": op_level or [], "end_to_end": end_to_end}
    if verification is not None:
        checks = [c.to_json() for c in verification.checks]
        compared = [c for c in checks if c["max_abs_err"] is not None]
        if source != "compile":  # compile has no call sites: it replaces the whole forward
            doc["calls"] = {"swapped": verification.swapped_calls, "fallback": verification.fallback_calls}
            doc["sites"] = verification.sites
        doc["verification"] = {"passed": verification.passed, "tolerance": verification.tolerance, "checks": checks}
        if compared:
            doc["max_abs_err"] = max(c["max_abs_err"] for c in compared)
            doc["max_rel_err"] = max(c["max_rel_err"] for c in compared)
            doc["out_of_tolerance"] = max(c["out_of_tolerance"] or 0.0 for c in compared)
    return doc


def swap_doc(meta: dict[str, Any], results: list[dict[str, Any]], method: dict[str, Any]) -> dict[str, Any]:
    return {"format_version": FORMAT_VERSION, "opscope_version": meta.get("opscope_version"),
            "created": meta.get("created"), "target": meta.get("target"), "device": meta.get("device"),
            "dtype": meta.get("dtype"), "mode": meta.get("mode"), "threads": meta.get("threads"),
            "method": method, "results": results}


def dumps(doc: dict[str, Any]) -> str:
    from opscope.run.write import dumps as run_dumps

    return run_dumps(doc)


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _well_formed(r: Any) -> bool:
    return (isinstance(r, dict) and isinstance(r.get("label"), str) and r.get("status") in STATUSES
            and isinstance(r.get("message", ""), str))


def read_swap(path: Path) -> dict[str, Any] | None:
    """swap.json with only its well-formed results (label text, a known status), or None when the file
    is missing, unreadable, not an object with a results list, or holds no such result."""
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("results"), list):
        return None
    results = [r for r in doc["results"] if _well_formed(r)]
    if not results:
        return None
    return {**doc, "results": results}


def failed(doc: dict[str, Any] | None) -> list[dict[str, Any]]:
    return [r for r in (doc or {}).get("results", []) if r.get("status") == "failed"]


def num(v: Any) -> float | None:
    return float(v) if _is_num(v) else None
