"""kvcheck.adapters: adapters that put third-party KV-cache managers behind kvcheck's protocol.

* ``kvcheck.adapters.reference`` (alias ``--kv-impl=reference``): kvcheck's own reference
  (``kvcheck.reference_impl``) behind the protocol; the oracle of the differential tests.
* ``kvcheck.adapters.vllm`` (alias ``--kv-impl=vllm``): the installed vLLM's own
  ``KVCacheManager``, ``BlockPool``, request block hasher and ``BlockTable``. It needs vLLM
  importable (``scripts/vllm-cpu-env.sh`` builds a CPU-only environment); without it,
  importing the module raises ``ImportError`` naming that script.

Nothing below this package imports it: the loader (``kvcheck.conformance.loader``) finds
these modules by name, like any user's adapter.
"""
