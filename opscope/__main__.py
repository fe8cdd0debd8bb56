import os
import sys

# `python -m opscope` puts the working directory first on sys.path: a file there named like a
# standard-library module (json.py, tempfile.py, ...) would shadow it for opscope itself. opscope is
# imported by now, and its submodules resolve through the package, so the entry can go.
if sys.path and sys.path[0] in ("", os.getcwd()):
    sys.path.pop(0)

from opscope.cli.app import main  # noqa: E402

main()
