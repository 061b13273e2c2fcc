"""Tests of attnzoo.training."""
