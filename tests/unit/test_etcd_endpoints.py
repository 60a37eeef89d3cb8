"""How etcd endpoints given by a user become one gRPC target (pure: no connection is made)."""

from __future__ import annotations

import pytest

from store import etcd


@pytest.mark.parametrize(
    ("endpoints", "target"),
    [
        (["127.0.0.1:2379"], "ipv4:127.0.0.1:2379"),
        (["localhost:2379"], "ipv4:127.0.0.1:2379"),
        (["http://10.0.0.1:2379/", "10.0.0.2:2379"], "ipv4:10.0.0.1:2379,10.0.0.2:2379"),
        (["[::1]:2379", "[fd00::2]:2379"], "ipv6:[::1]:2379,[fd00::2]:2379"),
        (["etcd.sc.svc:2379"], "dns:///etcd.sc.svc:2379"),
        ("10.0.0.1:2379,10.0.0.2:2379", "ipv4:10.0.0.1:2379,10.0.0.2:2379"),
    ],
)
def test_endpoints_to_grpc_target(endpoints: list[str] | str, target: str) -> None:
    assert etcd.grpc_target(endpoints) == target


@pytest.mark.parametrize(
    ("endpoints", "message"),
    [
        ([], "no etcd endpoints given"),
        (["127.0.0.1"], "'127.0.0.1' is not host:port"),
        (["127.0.0.1:port"], "'127.0.0.1:port' is not host:port"),
        (["https://10.0.0.1:2379"], "TLS is not supported yet"),
        (["etcd-0:2379", "etcd-1:2379"], "several endpoints must be IP addresses"),
        (["10.0.0.1:2379", "[::1]:2379"], "do not mix IPv4 and IPv6"),
    ],
)
def test_unusable_endpoints_are_refused_with_the_value(endpoints: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        etcd.grpc_target(endpoints)
