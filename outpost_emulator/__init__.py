"""Polar side of Outpost, runnable locally."""
