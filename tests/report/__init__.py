"""Tests of attnzoo.report."""
