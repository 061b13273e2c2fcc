"""Tests of attnzoo.runtime."""
