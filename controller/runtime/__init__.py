"""The async shell around the core: phase service, reconciler, failover, events, metrics."""
