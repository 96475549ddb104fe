"""Bug: ``cache_salt`` enters the extra keys of every block, not only of the first.

vLLM puts ``("cache_salt", salt)`` on the block starting at token 0 only; chaining carries it
into every later hash. Salting every block still isolates tenants but gives hashes no vLLM
replica computes (peer-systems §4 #21: a silent hash-scheme change, llm-d-kv-cache#138 /
vllm#23673, makes external routers miss everything).
"""

from _mutant_base import build

from kvcheck.reference_impl.block_hasher import RequestBlockHasher


class SaltEveryBlockHasher(RequestBlockHasher):
    def __call__(self, request):
        self._request = request
        return super().__call__(request)

    def _with_lookahead(self, extra_keys, token_ids, end):
        salt = self._request.cache_salt
        if salt and end > self.block_size:  # BUG: blocks after the first get the salt too
            key = ("cache_salt", salt) if self.profile.extra_key_format == "tagged" else salt
            extra_keys = (*(extra_keys or ()), key)
        return super()._with_lookahead(extra_keys, token_ids, end)


IMPL_INFO, make_kv_cache_manager, make_block_pool = build(
    "mut_salt_every_block", hasher_cls=SaltEveryBlockHasher)
