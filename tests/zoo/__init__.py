"""Tests of attnzoo.zoo, the shipped models."""
