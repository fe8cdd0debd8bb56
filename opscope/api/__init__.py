"""opscope's public Python API (the lead's opscope.api replaces this placeholder; explain_op is in
opscope.api.explain)."""
