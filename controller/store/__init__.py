"""Durable state in etcd: the store (etcd, with its watches in watch and its etcd v3 gRPC client
in client: every member, TLS, failover), leader election (election), coalescing writer (writer),
errors and value types (errors, types), job records (jobs), GPU failure records and host presence
(health), and the etcd server that tests and the embedded stack run (etcd_server)."""
