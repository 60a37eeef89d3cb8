"""Pure decisions, one module per kind: ``decide(snapshot, inputs) -> list[Action]``.

Purely computational, no I/O: what to write is returned as actions, applied by ``controller.pipeline``.
"""
