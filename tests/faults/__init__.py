"""Fault-injection suite: real worker processes, histories, two independent checkers."""
