"""
Fixtures of the Agent tests: ``store`` (each checkpointer backend, in turn) and ``persistent_store`` (the backends
that keep threads across processes), from :mod:`workers.harness`.
"""

from __future__ import annotations

from workers.harness import persistent_store, store

__all__ = ["persistent_store", "store"]
