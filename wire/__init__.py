"""Implementations in any language, in their own process (docs/wire-protocol.md).

``--kv-impl=exec:COMMAND`` and ``--kv-indexer=exec:COMMAND`` start COMMAND and speak the kvcheck
wire protocol to it: JSON Lines on its standard input and output, one request and one answer at
a time, an ``init`` handshake carrying what ``IMPL_INFO`` carries, objects (managers, block
pools, indexes) named by handles.

* ``methods``: every protocol call, its parameter names and types, read from the Protocol
  classes of ``kvcheck.conformance`` (never written twice);
* ``values``: Python values to JSON and back (bytes as hex, dataclasses as objects);
* ``engine``: the child process, its pipes, bounded lines, deadlines and stderr;
* ``client``: the module an ``exec:`` target loads as (``exec_module``), proxies included;
* ``serve``: ``python -m kvcheck.wire.serve``: any Python implementation served over the wire.
"""

from __future__ import annotations

#: The protocol version this kvcheck speaks (``init``'s ``protocol``).
PROTOCOL_VERSION = 1
#: Longest line either side may send, in bytes (the newline excluded).
MAX_LINE_BYTES = 16 << 20

__all__ = ["MAX_LINE_BYTES", "PROTOCOL_VERSION"]
