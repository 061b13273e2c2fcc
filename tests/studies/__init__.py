"""Tests of the studies in research/ (run as ``python -m research.<name>``)."""
