"""Helpers shared by test suites (real servers the tests start and stop themselves)."""
