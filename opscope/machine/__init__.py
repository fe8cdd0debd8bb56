"""Machine ceilings: peak bandwidth and FLOP/s (spec table, calibration, overrides) and how busy the machine was."""
