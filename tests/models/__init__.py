"""Tests of attnzoo.models."""
