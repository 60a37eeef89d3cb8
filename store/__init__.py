"""Cluster objects, the KV store interface and its backends, embedded etcd, the local store."""
