"""The engine process: its pipes, one request and one answer at a time, bounded lines, and
what is said when it fails (docs/wire-protocol.md, "What fails a test").

Reads use ``poll`` in short slices, so a call interrupted by ``--kv-timeout`` (``AdapterTimeout``
raised by the alarm in the main thread, or delivered asynchronously by the watchdog to another
thread) is interrupted within a slice. Whatever interrupts a call, the process is then killed:
an answer may still be on its way, and the next test must start on a fresh process.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Sequence
from typing import Final, NoReturn, TypedDict

import msgspec

from kvcheck.conformance.call_limit import AdapterTimeout
from kvcheck.wire import MAX_LINE_BYTES
from kvcheck.wire.errors import EngineProcessError

__all__ = ["EngineProcess", "EngineProcessError", "exit_text"]

#: Lines of the engine's standard error kept for messages.
STDERR_LINES: Final = 20
#: Seconds a process is given to exit after ``shutdown`` / SIGTERM before the next step.
EXIT_WAIT_S: Final = 2.0
#: Seconds one poll waits before looking again (how fast an interruption is noticed).
_POLL_SLICE_MS: Final = 200
_READ_CHUNK: Final = 1 << 16
#: Requests ``call_many`` writes before reading their answers: about 20 KiB of requests and
#: fewer of answers, well inside a pipe's 64 KiB buffer each way.
PIPELINE: Final = 256
_MIB: Final = MAX_LINE_BYTES >> 20
_MAIN_THREAD: Final = threading.main_thread().ident


class _RequestHead(TypedDict):
    id: int
    method: str


class _Request(_RequestHead, total=False):
    """One request line (docs/wire-protocol.md): its keys in the order they are written."""

    handle: int | None
    params: dict[str, object]


def exit_text(returncode: int | None) -> str:
    """``exited with status 3`` / ``was killed by SIGKILL`` / ``is still running``."""
    if returncode is None:
        return "is still running"
    if returncode < 0:
        try:
            return f"was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return f"exited with status {returncode}"


class EngineProcess:
    """One running engine. ``call`` sends a request and returns the answer object; any
    failure kills the process (``alive`` becomes False) and raises ``EngineProcessError`` (or
    re-raises the interruption, with the engine's stderr added to an ``AdapterTimeout``).

    ``transcript`` keeps the last ``transcript_lines`` lines exchanged, each ``(tag, sent,
    line)``: ``tag`` is the handle the call concerns (so an object's own lines can be picked
    out), ``sent`` True for kvcheck's lines; ``transcript_of`` renders them.
    """

    def __init__(self, argv: Sequence[str], label: str, *, transcript_lines: int = 10_000,
                 cwd: str | None = None) -> None:
        self.argv = list(argv)
        self.label = label
        self.stderr: deque[str] = deque(maxlen=STDERR_LINES)
        # (tag, True for kvcheck's line, the line): decoded only when asked for (transcript_of)
        self.transcript: deque[tuple[int | None, bool, bytes]] = deque(maxlen=transcript_lines)
        self.next_id = 1
        self.killed = False  # set by kill(): no further call is made on this process
        self.head: list[tuple[int | None, bool, bytes]] = []  # the init exchange, kept apart
        self._buffer = bytearray()
        self._encoder = msgspec.json.Encoder()
        self._decoder = msgspec.json.Decoder()
        try:
            self.proc = subprocess.Popen(
                self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, bufsize=0, cwd=cwd, start_new_session=True)
        except OSError as exc:
            raise EngineProcessError(
                f"{label}: cannot start {self.argv!r}: {exc.strerror or exc}\n  Fix: check the "
                "command after exec: (a program path relative to the current folder, or on "
                "PATH, and executable)") from None
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self._stdin = self.proc.stdin
        self._stdout_fd = self.proc.stdout.fileno()
        self._poll = select.poll()
        self._poll.register(self._stdout_fd, select.POLLIN | select.POLLHUP | select.POLLERR)
        threading.Thread(target=self._drain_stderr, daemon=True,
                         name=f"kvcheck-wire-stderr-{self.proc.pid}").start()

    # ------------------------------------------------------------------ state
    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def transcript_of(self, tag: int) -> list[str]:
        """The ``head`` (the init exchange) then the lines about ``tag``, oldest first:
        ``"> "`` kvcheck's, ``"< "`` the engine's."""
        lines = self.head + [entry for entry in self.transcript if entry[0] == tag]
        return [("> " if sent else "< ") + line.decode("utf-8", "replace")
                for _, sent, line in lines]

    def retag_last(self, count: int, tag: int) -> None:
        """Give the last ``count`` lines ``tag`` (a factory call's lines belong to the object
        it made, whose handle is known only from the answer)."""
        for i in range(1, min(count, len(self.transcript)) + 1):
            _, sent, line = self.transcript[-i]
            self.transcript[-i] = (tag, sent, line)

    def _drain_stderr(self) -> None:
        stream = self.proc.stderr
        assert stream is not None
        for raw in iter(stream.readline, b""):
            self.stderr.append(raw.decode("utf-8", "replace").rstrip("\n")[:500])

    def stderr_tail(self) -> str:
        """The last lines of the engine's standard error, indented, or a note that it wrote
        none (read after a short wait, so a dying engine's last words are in)."""
        time.sleep(0.05)
        if not self.stderr:
            return "  (the engine wrote nothing on standard error)"
        return "  last lines of its standard error:\n" + "\n".join(
            f"    {line}" for line in self.stderr)

    # ------------------------------------------------------------------ calls
    def call(self, method: str, params: dict[str, object], *, handle: int | None = None,
             what: str) -> dict[str, object]:
        """Send one request and read its answer (a dict with ``result`` or ``error``).

        ``what`` names the call in messages (``rustkv.allocate_slots``).

        Raises:
            EngineProcessError: the process is gone, or answered something that is not one
                JSON object with this request's id and exactly one of ``result``/``error``.
            AdapterTimeout: ``--kv-timeout`` interrupted the call (the engine's stderr added).
        """
        request: _Request = {"id": self.next_id, "method": method}
        if handle is not None:
            request["handle"] = handle
        request["params"] = params
        return self._exchange([request], handle, what)[0]

    def call_many(self, method: str, params: list[dict[str, object]], *, handle: int | None,
                  what: str) -> list[dict[str, object]]:
        """``call`` for many requests of one method, written ``PIPELINE`` at a time before
        their answers are read (the engine still reads, answers and reads on, one line at a
        time; a chunk's requests and answers fit the pipes' buffers, so neither side blocks
        the other). The answers, in order."""
        answers: list[dict[str, object]] = []
        for start in range(0, len(params), PIPELINE):
            requests: list[_Request] = [
                {"id": self.next_id + i, "method": method, "handle": handle, "params": p}
                for i, p in enumerate(params[start:start + PIPELINE])]
            answers += self._exchange(requests, handle, what)
        return answers

    def _exchange(self, requests: list[_Request], handle: int | None,
                  what: str) -> list[dict[str, object]]:
        """Write ``requests`` (numbered from ``next_id``) and read one checked answer each.
        The transcript gets each request beside its answer (a failed exchange: the requests);
        any failure or interruption kills the process first."""
        self.next_id += len(requests)
        lines = [self._encoder.encode(r) for r in requests]
        try:
            try:
                self._stdin.write(b"".join(line + b"\n" for line in lines))
            except (BrokenPipeError, ConnectionResetError, ValueError):
                self._fail(what, "could not be sent: the engine closed its standard input")
            got = [self._read_line(what) for _ in lines]
        except BaseException as exc:
            self.transcript.extend((handle, True, line) for line in lines)
            self.kill()
            if isinstance(exc, AdapterTimeout):
                raise AdapterTimeout(f"{exc}\n  the engine (pid {self.pid}) was killed\n"
                                     f"{self.stderr_tail()}") from None
            raise
        for sent, answer in zip(lines, got, strict=True):
            self.transcript.append((handle, True, sent))
            self.transcript.append((handle, False, answer))
        return [self._check_answer(answer, request["id"], what)
                for request, answer in zip(requests, got, strict=True)]

    def _read_line(self, what: str) -> bytes:
        buffer = self._buffer
        while True:
            end = buffer.find(b"\n")
            if end >= 0:
                line = bytes(buffer[:end])
                del buffer[:end + 1]
                if len(line) > MAX_LINE_BYTES:
                    self._fail(what, f"answered a line of {len(line)} bytes (a line is at most "
                               f"{_MIB} MiB)")
                return line
            if len(buffer) > MAX_LINE_BYTES:
                self._fail(what, f"wrote more than {_MIB} MiB without ending the line (a line "
                           f"is at most {_MIB} MiB)")
            # The main thread blocks in read (SIGALRM interrupts it); another thread polls in
            # slices, so the watchdog's asynchronous exception is seen between them.
            if threading.get_ident() != _MAIN_THREAD and not self._poll.poll(_POLL_SLICE_MS):
                continue
            chunk = os.read(self._stdout_fd, _READ_CHUNK)
            if not chunk:
                partial = (f" after a partial line ({len(buffer)} bytes: "
                           f"{bytes(buffer[:60])!r})" if buffer else "")
                self._wait_exit()
                self._fail(what, f"got no answer: the engine closed its standard output"
                           f"{partial}")
            buffer += chunk

    def _check_answer(self, line: bytes, request_id: int, what: str) -> dict[str, object]:
        try:
            answer = self._decoder.decode(line)
        except msgspec.DecodeError as exc:
            kind = "not UTF-8" if b"\xff" in line or _not_utf8(line) else "not JSON"
            self._fail(what, f"answered a line that is {kind} ({exc}): {line[:120]!r} "
                       "(logs go to standard error, never standard output)")
        if not isinstance(answer, dict):
            self._fail(what, f"answered {line[:120]!r}, not a JSON object")
        if answer.get("id") != request_id:
            self._fail(what, f"answered with id {answer.get('id')!r} to the request with id "
                       f"{request_id} (one answer per request, in order, with its id)")
        if ("result" in answer) == ("error" in answer):
            self._fail(what, f"answered {line[:120]!r}: an answer has exactly one of "
                       "'result' and 'error'")
        return answer

    def _fail(self, what: str, problem: str) -> NoReturn:
        self.kill()
        raise EngineProcessError(
            f"{what}: the engine {problem}; the engine process (pid {self.pid}) "
            f"{exit_text(self.proc.returncode)}\n{self.stderr_tail()}")

    # ------------------------------------------------------------------ ending
    def _wait_exit(self) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(EXIT_WAIT_S)

    def kill(self) -> None:
        """End the process now: SIGTERM, then SIGKILL if it is still running shortly after
        (an engine that ignores SIGTERM never holds the session)."""
        self.killed = True
        if self.proc.poll() is None:
            for sig, wait in ((signal.SIGTERM, 0.3), (signal.SIGKILL, EXIT_WAIT_S)):
                try:
                    os.killpg(self.proc.pid, sig)
                except (ProcessLookupError, PermissionError):
                    self.proc.send_signal(sig)
                try:
                    self.proc.wait(wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        self._close_pipes()

    def close(self) -> None:
        """End the session politely: close standard input (end of input means exit), wait,
        then ``kill``."""
        with contextlib.suppress(OSError):
            self._stdin.close()
        self._wait_exit()
        self.kill()

    def _close_pipes(self) -> None:
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass


def _not_utf8(line: bytes) -> bool:
    try:
        line.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False
