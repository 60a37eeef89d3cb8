"""The imperative shell of the reconcile pipeline and its only writer: the Reader, the controller
loops of each kind, the action dispatcher and its KV updater. Decisions are controller.reconcile's.
"""
