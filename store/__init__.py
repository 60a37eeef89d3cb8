"""Cluster objects, the KV store interface and its backends, embedded etcd, the local store."""

import os

# Before anything imports gRPC (store.etcd does): gRPC's fork support restarts its poller in a
# forked child, where it crashes before `exec` once subprocess.Popen has closed the inherited
# descriptors (grpc/grpc#43055, grpcio 1.81 and later). The SC forks only to exec (embedded etcd,
# `sc demo`'s processes, Spark's JVM) and never uses gRPC in a child, so it needs none of it.
# An operator's own setting is kept.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
