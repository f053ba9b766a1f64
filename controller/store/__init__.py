"""Durable state in etcd: the store, leader election, coalescing writer, job records."""
