"""The JavaScript index ``js_index.mjs`` behind ``--kv-indexer=js_indexer`` (Node.js, through
``kvcheck.adapters.subprocess_indexer``): an index in another language, checked like any."""

from pathlib import Path

from kvcheck.adapters.subprocess_indexer import command_indexer

IMPL_INFO, make_indexer = command_indexer(
    ["node", str(Path(__file__).with_name("js_index.mjs"))], name="js-index",
    capabilities={"int_hashes", "bytes_hashes", "decoded_events", "replay", "lora",
                  "kv_cache_groups"})
