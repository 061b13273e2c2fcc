"""Tests of attnzoo.benchmarks."""
