"""The run directory: the Run, writing it atomically, reading it back, comparing two runs."""
