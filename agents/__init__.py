"""Lightrail agents: the per-host agent, the job-side library and trace replay."""
