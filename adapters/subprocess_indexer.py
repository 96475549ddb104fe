"""An indexer in another process, in any language: the indexer protocol as JSON Lines over the
child's stdin and stdout (docs/indexers.md, "An index in another language").

An indexer module of two lines puts a command behind ``--kv-indexer``::

    from kvcheck.adapters.subprocess_indexer import command_indexer
    IMPL_INFO, make_indexer = command_indexer(["./my-router-index"], name="myindex",
                                              capabilities={"int_hashes", "decoded_events"})

One child serves the whole session: ``make_indexer`` sends ``init`` (which must empty the
index), every protocol call is one request line and one answer line:

=====================  ===========================================================
request                answer
=====================  ===========================================================
``init``               ``{"ok": true}``; ``config``: the ``IndexerConfig`` fields
``apply``              ``{"ok": true}``, or ``{"error": "..."}`` to refuse the batch;
                       ``worker``, ``seq``, ``replay`` and ``payload`` (hex of the wire
                       bytes) or, with ``decoded_events``, ``batch``
``match``              ``{"result": {"w0": 3, ...}}``; ``tokens``, ``context``
``remove_worker``      ``{"ok": true}``; ``worker``
=====================  ===========================================================

Every request is an object with ``"op"``. In a decoded batch every hash (``block_hashes``,
``parent_block_hash``) is a lowercase hex string, whatever the form (an int hash is its 8
big-endian bytes), so no 64-bit integer meets a JSON number's 53-bit limit. The child writes
nothing else on stdout (logs go to stderr, passed through). A child that exits, answers
garbage or is stopped by ``--kv-timeout`` fails that call (``IndexerProcessError``, with the
last lines of its stderr) and is started afresh by the next ``make_indexer``.
"""

from __future__ import annotations

import atexit
import json
import subprocess
import threading
from collections import deque
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import asdict
from typing import Any, Final

from kvcheck import __version__
from kvcheck.conformance.indexer_protocol import IndexerConfig, MatchContext
from kvcheck.conformance.protocol import ImplInfo
from kvcheck.errors import KVCheckError

__all__ = ["IndexerProcessError", "ProcessIndexer", "command_indexer"]

#: Lines of the child's stderr kept for error messages.
_STDERR_LINES: Final = 20
#: Longest answer line read (a match answer names every worker once).
_MAX_LINE: Final = 1 << 24


class IndexerProcessError(KVCheckError):
    """The child did not answer a call as the protocol says (it exited, wrote something
    that is not one JSON answer, or refused a batch: the message names which)."""


class _Child:
    """The running child and the last lines of its stderr."""

    def __init__(self, command: Sequence[str]) -> None:
        self.command = list(command)
        self.stderr: deque[str] = deque(maxlen=_STDERR_LINES)
        # True from a request until its answer is read: a call interrupted in between (by
        # --kv-timeout) leaves an answer in flight, so the child is not reused.
        self.in_call = False
        try:
            self.proc = subprocess.Popen(
                self.command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, text=True, encoding="utf-8", bufsize=1)
        except OSError as exc:
            raise IndexerProcessError(f"cannot start {self.command}: {exc}") from None
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr.append(line.rstrip("\n"))

    def alive(self) -> bool:
        return self.proc.poll() is None

    def usable(self) -> bool:
        return not self.in_call and self.alive()

    def stop(self) -> None:
        if self.alive():
            self.proc.kill()
        self.proc.wait()

    def call(self, request: Mapping[str, Any]) -> dict[str, Any]:
        """Send one request line, read one answer line (a JSON object)."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.in_call = True
        try:
            self.proc.stdin.write(json.dumps(request, separators=(",", ":")) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline(_MAX_LINE)
        except (OSError, ValueError):
            line = ""
        if not line:
            try:  # an exiting child closes its stdout a moment before its status is known
                self.proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                raise self.error(request, "closed its stdout") from None
            raise self.error(request, f"exited (status {self.proc.returncode})")
        try:
            answer = json.loads(line)
        except ValueError:
            raise self.error(request, f"wrote {line[:120]!r}, not one JSON answer") from None
        if not isinstance(answer, dict):
            raise self.error(request, f"answered {line[:120]!r}, not a JSON object")
        self.in_call = False
        return answer

    def error(self, request: Mapping[str, Any], what: str) -> IndexerProcessError:
        self.stop()  # its state is unknown: the next make_indexer starts a fresh one
        tail = "\n".join(f"    {line}" for line in self.stderr) or "    (nothing)"
        return IndexerProcessError(f"{self.command} {what} on the {request.get('op')!r} "
                                   f"request; its last stderr lines:\n{tail}")


def _hex_hash(value: object) -> object:
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).hex()
    if isinstance(value, int) and not isinstance(value, bool):
        return value.to_bytes(8, "big").hex()
    return value


def _jsonable_batch(batch: Mapping[str, Any]) -> dict[str, Any]:
    events = []
    for event in batch["events"]:
        out = dict(event)
        if "block_hashes" in out:
            out["block_hashes"] = [_hex_hash(h) for h in out["block_hashes"]]
        if "parent_block_hash" in out:
            out["parent_block_hash"] = _hex_hash(out["parent_block_hash"])
        if out.get("extra_keys") is not None:
            out["extra_keys"] = [None if k is None else list(k) for k in out["extra_keys"]]
        events.append(out)
    return {**batch, "events": events}


class ProcessIndexer:
    """The indexer protocol, each call forwarded to the child."""

    def __init__(self, child: _Child, config: IndexerConfig) -> None:
        self._child = child
        self._ok(child.call({"op": "init", "config": asdict(config)}), "init")

    def _ok(self, answer: dict[str, Any], op: str) -> None:
        if "error" in answer:
            raise IndexerProcessError(f"{self._child.command} refused {op}: {answer['error']}")
        if answer.get("ok") is not True:
            raise self._child.error({"op": op}, f"answered {answer!r}, not {{\"ok\": true}}")

    def apply_batch(self, worker_id: str, seq: int, payload: bytes,
                    replay: bool = False) -> None:
        self._ok(self._child.call({"op": "apply", "worker": worker_id, "seq": seq,
                                   "replay": replay, "payload": payload.hex()}), "apply")

    def apply_events(self, worker_id: str, seq: int, batch: Mapping[str, Any],
                     replay: bool = False) -> None:
        self._ok(self._child.call({"op": "apply", "worker": worker_id, "seq": seq,
                                   "replay": replay, "batch": _jsonable_batch(batch)}), "apply")

    def match(self, token_ids: Sequence[int], context: MatchContext) -> Any:
        answer = self._child.call({"op": "match", "tokens": list(token_ids),
                                   "context": asdict(context)})
        if "result" not in answer:
            raise self._child.error({"op": "match"}, f"answered {answer!r}, no \"result\"")
        return answer["result"]  # checked by the guard like any indexer's answer

    def remove_worker(self, worker_id: str) -> None:
        self._ok(self._child.call({"op": "remove_worker", "worker": worker_id}),
                 "remove_worker")


def command_indexer(command: Sequence[str], *, name: str, capabilities: Collection[str],
                    version: str = __version__, profile: str = "vllm-0.33",
                    hash_algos: Sequence[str] = ()) -> tuple[
                        ImplInfo, Callable[[IndexerConfig], ProcessIndexer]]:
    """``(IMPL_INFO, make_indexer)`` for an index run as ``command`` (see the module doc);
    ``capabilities`` beyond ``indexer``, which is implied."""
    info = ImplInfo(name=name, version=version, profile=profile,
                    capabilities=frozenset({"indexer", *capabilities}),
                    hash_algos=tuple(hash_algos))
    children: list[_Child] = []

    def make_indexer(config: IndexerConfig) -> ProcessIndexer:
        if not children or not children[0].usable():
            if children:
                children[0].stop()
            children[:] = [_Child(command)]
            atexit.register(children[0].stop)
        return ProcessIndexer(children[0], config)

    return info, make_indexer
