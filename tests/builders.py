"""Object factories shared by the tests."""

from __future__ import annotations

from store import models


def spu(
    spu_id: int,
    resolution: str = "Online",
    rack: str | None = None,
    name: str | None = None,
    spu_type: str = "Custom",
    host: str = "127.0.0.1",
) -> models.Spu:
    return models.Spu.model_validate(
        {
            "name": name or f"spu-{spu_id}",
            "spec": {
                "id": spu_id,
                "spuType": spu_type,
                "rack": rack,
                "publicEndpoint": {"host": host, "port": 9005},
                "privateEndpoint": {"host": host, "port": 9006},
            },
            "status": {"resolution": resolution},
        }
    )
