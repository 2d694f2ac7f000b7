"""One-off measurements, each runnable as `python -m benchmarks.<name>` from the repository root (README.md here
lists them). Not part of the installed package: they time kernels, links and hosts, or rerun faults, and their
results live in reports/."""
