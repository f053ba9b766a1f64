"""Trace replay and evaluation tools (trace readers, replayer, evaluate)."""
