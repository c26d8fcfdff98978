"""Measurements of the project, beside the code they measure: committed results (*.json, e2e/) and the
kernel benchmark tooling (benchmarks.kernel). Nothing in pipeline/, analysis/ or vattn/ imports it."""
