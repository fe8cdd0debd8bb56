"""swap.json: the swap results of a run (format: opscope.run.schema.SwapFile). Torch-free: the
renderers read it through `read_swap`, which keeps only well-formed results and never raises."""

from __future__ import annotations

import json
import typing
from pathlib import Path
from typing import Any

from opscope.run.schema import FORMAT_VERSION, SwapStatus, valid_swap_result

STATUSES = typing.get_args(SwapStatus)


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




def read_swap(path: Path) -> dict[str, Any] | None:
    """swap.json with only its results that follow the format (opscope.run.schema.SwapResult), or None
    when the file is missing, unreadable, not an object with a results list, or holds no such result."""
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("results"), list):
        return None
    results = [r for r in doc["results"] if valid_swap_result(r)]
    if not results:
        return None
    return {**doc, "results": results}


