"""Operator definitions: the retry job and the daily dead-letter report."""
