"""A wire engine that misbehaves on purpose, for the tests of what kvcheck does then.

    python hostile_engine.py MODE [METHOD [N]]

Serves kvcheck's reference correctly (``kvcheck.wire.serve.Server``) except at the ``N``-th
request (default 1) of ``METHOD`` (default ``init``), where it does ``MODE``:

``hang``           never answers; ``hang_ignore_term`` also ignores SIGTERM
``wrong_id``       answers with another id
``partial_exit``   writes half an answer, then exits 0
``non_utf8``       answers a line that is not UTF-8
``huge_line``      writes 100 MB without a newline
``log_stdout``     prints a log line on standard output before the answer
``exit``           says goodbye on stderr and exits with status 3
``sigkill``        kills itself with SIGKILL
``both``           answers with both ``result`` and ``error``
``bad_protocol``   (init) announces protocol 2
``no_impl_info``   (init) answers ``{"protocol": 1}``
``kernels``        (init) declares capability ``kernels``
``offload``        (init) declares capability ``offload``
``error:CODE``     answers an error with that code

With ``HOSTILE_ONCE=PATH`` in the environment it misbehaves only if PATH does not exist yet
(and creates it): once per test session, whatever the restarts.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

from kvcheck.conformance.loader import load_impl
from kvcheck.wire.serve import Server


def main() -> None:
    mode = sys.argv[1]
    method = sys.argv[2] if len(sys.argv) > 2 else "init"
    nth = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    once = os.environ.get("HOSTILE_ONCE")
    server = Server(load_impl("reference", call_timeout=0))
    out = sys.stdout.buffer
    seen = 0
    for line in sys.stdin.buffer:
        request = json.loads(line)
        answer = server.answer(request) if request.get("method") != "shutdown" else \
            {"id": request["id"], "result": None}
        if request.get("method") == method:
            seen += 1
            if seen == nth and (once is None or not os.path.exists(once)):
                if once is not None:
                    open(once, "w").close()
                answer = misbehave(mode, request, answer)
        out.write(json.dumps(answer).encode() + b"\n")
        out.flush()
        if request.get("method") == "shutdown":
            return


def misbehave(mode: str, request: dict, answer: dict) -> dict:
    out = sys.stdout.buffer
    rid = request["id"]
    if mode.startswith("hang"):
        if mode == "hang_ignore_term":
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        while True:
            time.sleep(60)
    if mode == "wrong_id":
        return {**answer, "id": rid + 1000}
    if mode == "partial_exit":
        out.write(b'{"id": %d, "res' % rid)
        out.flush()
        sys.exit(0)
    if mode == "non_utf8":
        out.write(b'{"id": %d, "result": "\xff\xfe"}\n' % rid)
        out.flush()
        return answer  # never read: kvcheck has given up on this process
    if mode == "huge_line":
        chunk = b"x" * (1 << 20)
        try:
            for _ in range(100):
                out.write(chunk)
            out.flush()
        except BrokenPipeError:
            sys.exit(0)
        return answer
    if mode == "log_stdout":
        out.write(b"allocating 3 blocks for request r1\n")
        return answer
    if mode == "exit":
        print("engine: cannot go on, giving up", file=sys.stderr, flush=True)
        sys.exit(3)
    if mode == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "both":
        return {"id": rid, "result": None, "error": {"code": "internal", "message": "x"}}
    if mode == "bad_protocol":
        return {"id": rid, "result": {**answer["result"], "protocol": 2}}
    if mode == "no_impl_info":
        return {"id": rid, "result": {"protocol": 1}}
    if mode in ("kernels", "offload"):
        info = dict(answer["result"]["impl_info"])
        info["capabilities"] = [*info["capabilities"], mode]
        return {"id": rid, "result": {"protocol": 1, "impl_info": info}}
    if mode.startswith("error:"):
        return {"id": rid, "error": {"code": mode[6:], "message": f"refused by mode {mode}"}}
    raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
