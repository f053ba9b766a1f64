"""Emulated switches and hosts that stand in for hardware in tests and the demo."""
