"""The evaluation layer: suites of tasks over seeds, zero-shot scoring, and their results."""
