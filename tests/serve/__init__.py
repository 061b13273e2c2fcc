"""Tests of attnzoo.serve."""
