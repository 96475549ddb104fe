"""kvcheck.adapters: adapters that put third-party KV-cache managers behind kvcheck's protocol.

* ``kvcheck.adapters.vllm`` (alias ``--kv-impl=vllm``): the installed vLLM's own
  ``KVCacheManager``, ``BlockPool``, request block hasher and ``BlockTable``. It needs vLLM
  importable (``scripts/vllm-cpu-env.sh`` builds a CPU-only environment); without it,
  importing the module raises ``ImportError`` naming that script.

Nothing here is imported by the rest of kvcheck.
"""
