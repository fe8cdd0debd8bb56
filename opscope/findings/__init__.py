"""Findings: one small rule per module, registered in one place (this import list)."""

from opscope.findings.base import RULES, Context, Finding, rule, run_rules

__all__ = ["RULES", "Context", "Finding", "rule", "run_rules"]
