"""The worker protocol: one client for SGLang workers (the data path's ``/generate`` and
the control plane's engine calls) with one error hierarchy. The router and the control
plane both build on it; it imports neither."""
