"""Tests of attnzoo.studies."""
