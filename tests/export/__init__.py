"""Tests of attnzoo.export."""
