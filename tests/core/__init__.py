"""Tests of the attnzoo package's own modules (CLI, data, preprocessing, signals) and of the project as a
whole (docs, layers, packaging, bad input across the commands)."""
