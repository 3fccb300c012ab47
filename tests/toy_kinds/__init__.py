"""Drafter kinds defined outside the package, as a user would add one (tests/test_engine.py)."""
