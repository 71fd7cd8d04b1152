"""Chaos run with a history checker: a real stack under a seeded nemesis (see README.md)."""
