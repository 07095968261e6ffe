"""Deterministic simulation of the whole lease protocol (issue 15): see README.md."""
