"""The CI gate (`opscope baseline save`, `opscope gate`): baselines of run samples (baseline, samples), the
tests (stats), the verdicts (verdict) and the formats CI systems read (formats). It reads run directories
only, as the renderers do."""
