"""The paper's experiments on the emulated cluster (issue #8), each a command:

    .venv/bin/python -m benchmarks.experiments {all|elastic|pd-sweep|ratio|ablation|sensitivity|reconfig} [--quick]

Every experiment is a list of replays (``benchmarks.harness.replay``) run in parallel
processes, cached per configuration under ``benchmarks/results/<experiment>/runs/`` so an
interrupted suite resumes, then summarized as JSON, a Markdown table and PNG plots.
"""
