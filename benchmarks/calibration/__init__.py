"""Fitting the emulated regime to the paper's section 3 measurements (``python -m benchmarks.calibrate``)."""
