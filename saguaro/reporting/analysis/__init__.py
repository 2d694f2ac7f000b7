"""Reading run folders back: per-variant tables, round statistics, and closed-form and simulated predictions."""

from saguaro.reporting.analysis.load import Run, load_run
from saguaro.reporting.analysis.variants import category_rows, error_rows, variant_rows

__all__ = ["Run", "category_rows", "error_rows", "load_run", "variant_rows"]
