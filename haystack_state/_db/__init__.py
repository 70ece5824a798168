"""
The one database layer of the package, shared by the checkpointers (:mod:`haystack_state.persistence`), the
long-term stores (:mod:`haystack_state.store`) and the server's own tables (``haystack_state.server._database``):

- :mod:`haystack_state._db.sqlite`: SQLite connections and their pool, the per-file write lock, transactions, and
  the inline-on-the-event-loop operations that fall back to a thread when the file is locked (:class:`WouldBlock`);
- :mod:`haystack_state._db.postgres`: psycopg pools, the per-event-loop async connections, and statement scripts run
  by the package's one driver of flows (:mod:`haystack_state._driver`);
- :mod:`haystack_state._db.migrations`: the append-only schema migrations of every table set, on both databases;
- :mod:`haystack_state._db.errors`: how a driver's error (``sqlite3``, ``psycopg``) becomes one of ours, its cause
  chained.

It sits beside ``persistence/`` in the layers and imports nothing above :mod:`haystack_state.errors`.
"""
