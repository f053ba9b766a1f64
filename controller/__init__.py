"""Lightrail controller: planning core, phase coordinator, reconciler, store and services."""
