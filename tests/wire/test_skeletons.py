"""The wire-protocol shim skeletons (plugin/wire_templates/, `kvcheck new-adapter --lang
rust|cpp|js NAME`): each renders, builds with its own toolchain, and speaks
docs/wire-protocol.md as a newcomer's starting point must.

The engine is driven the way kvcheck drives one: one request line, then exactly one answer
line read before the next request (an engine that does not flush after each answer times
out here). `init` answers protocol 1 and an `impl_info` kvcheck's loader accepts, the factory
answers a handle, every manager method of the doc's table answers an `internal` error naming
itself, an unknown method an `internal` error naming it, `shutdown` null and exit 0.

A language is skipped only when its toolchain (cargo, g++, node) is not on PATH. The name
has underscores, so the templates are checked to render cleanly with them.
"""

from __future__ import annotations

import json
import os
import re
import select
import shutil
import subprocess
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import pytest

ROOT = Path(__file__).resolve().parents[2]
TEMPLATES = ROOT / "plugin" / "wire_templates"
WIRE_DOC = ROOT / "docs" / "wire-protocol.md"
NAME = "skel_engine"
#: Language -> the toolchain its skeleton needs on PATH.
TOOLCHAINS = {"rust": "cargo", "cpp": "g++", "js": "node"}
#: Language -> its template files.
TEMPLATE_FILES = {
    "rust": ("rust/Cargo.toml.tmpl", "rust/main.rs.tmpl"),
    "cpp": ("cpp/main.cpp.tmpl",),
    "js": ("js/main.mjs.tmpl",),
}
BUILD_TIMEOUT = 600
ANSWER_TIMEOUT = 30.0

SPEC = {"num_blocks": 16, "block_size": 4, "enable_caching": True, "hash_algo": "sha256",
        "pythonhashseed": "0", "enable_kv_cache_events": False, "max_model_len": None,
        "profile": "generic"}
REQUEST = {"request_id": "r\u00e9\"1\\", "prompt_token_ids": [1, 2, 3, 4, 5],
           "output_token_ids": [], "num_computed_tokens": 0,
           "lora": ["adapter \u2603", 1, "loras/l\u00f6ra"],
           "mm_features": [["img\U0001F600", 0, 2]], "cache_salt": None,
           "skip_reading_prefix_cache": False}
#: Sample values for the manager methods' parameters (any other parameter: 1), so the stubs
#: get requests shaped as kvcheck sends them (nested objects, escapes, floats, nulls).
SAMPLE_PARAMS: dict[str, Any] = {
    "request": REQUEST, "request_id": REQUEST["request_id"], "new_computed_block_ids": [],
    "ts": 1.5e9, "block_tables": [[0, 1], [2]], "num_computed_tokens": [0, 4],
    "num_scheduled_tokens": [4, 1], "seq_lens": [5, 1], "block_id": 0,
}


def render(relative: str, name: str = NAME) -> str:
    return (TEMPLATES / relative).read_text(encoding="utf-8").replace(
        "{{NAME}}", name).replace("{{PROFILE}}", "generic")


def doc_manager_methods() -> dict[str, list[str]]:
    """The manager table of docs/wire-protocol.md: method -> its parameter names."""
    text = WIRE_DOC.read_text(encoding="utf-8")
    table = text.split("<!-- wire-methods: manager -->", 1)[1].split("\n\n", 1)[0]
    methods = {}
    for row in table.splitlines():
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        match = re.fullmatch(r"`(\w+)`", cells[0])
        if match:
            methods[match.group(1)] = re.findall(r"`(\w+)`", cells[1])
    assert "num_free_blocks" in methods and "allocate_slots" in methods, table
    return methods


def build(lang: str, folder: Path) -> list[str]:
    """Render ``lang``'s skeleton into ``folder``, build it, and return its command."""
    if lang == "rust":
        project = folder / NAME
        (project / "src").mkdir(parents=True)
        (project / "Cargo.toml").write_text(render("rust/Cargo.toml.tmpl"), encoding="utf-8")
        (project / "src" / "main.rs").write_text(render("rust/main.rs.tmpl"), encoding="utf-8")
        target = folder / "target"
        proc = subprocess.run(
            ["cargo", "build", "--offline", "--release"], cwd=project,
            env={**os.environ, "CARGO_TARGET_DIR": str(target)},
            capture_output=True, text=True, timeout=BUILD_TIMEOUT, check=False)
        assert proc.returncode == 0, proc.stderr[-5000:]
        return [str(target / "release" / NAME)]
    if lang == "cpp":
        (folder / f"{NAME}.cpp").write_text(render("cpp/main.cpp.tmpl"), encoding="utf-8")
        proc = subprocess.run(
            ["g++", "-std=c++17", "-O2", "-o", NAME, f"{NAME}.cpp"], cwd=folder,
            capture_output=True, text=True, timeout=BUILD_TIMEOUT, check=False)
        assert proc.returncode == 0, proc.stderr[-5000:]
        return [str(folder / NAME)]
    script = folder / f"{NAME}.mjs"
    script.write_text(render("js/main.mjs.tmpl"), encoding="utf-8")
    return ["node", str(script)]


@pytest.fixture(scope="module", params=sorted(TOOLCHAINS))
def engine_command(request: pytest.FixtureRequest,
                   tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """The built skeleton of one language (built once per module)."""
    lang = request.param
    tool = TOOLCHAINS[lang]
    if shutil.which(tool) is None:
        pytest.skip(f"{tool} is not on PATH: the {lang} skeleton cannot be built here")
    return build(lang, tmp_path_factory.mktemp(f"skeleton-{lang}"))


class Engine:
    """One engine process, driven as kvcheck drives it: a request line, then one answer line
    read before the next request."""

    def __init__(self, command: list[str], stderr: BinaryIO) -> None:
        self.stderr = stderr
        self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.stderr, bufsize=0)
        self.next_id = 1
        self.pending = b""

    def logs(self) -> str:
        self.stderr.seek(0)
        return self.stderr.read().decode("utf-8", "replace")[-3000:]

    def send_line(self, line: str) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode("utf-8") + b"\n")
        self.proc.stdin.flush()
        answer = json.loads(self._read_line())
        assert isinstance(answer, dict), answer
        assert ("result" in answer) != ("error" in answer), answer
        assert set(answer) <= {"id", "result", "error"}, answer
        assert not self.pending, f"more than one answer line: {self.pending!r}"
        return answer

    def call(self, method: str, params: dict[str, Any] | None = None,
             handle: int | None = None) -> dict[str, Any]:
        message: dict[str, Any] = {"id": self.next_id, "method": method}
        if handle is not None:
            message["handle"] = handle
        message["params"] = {} if params is None else params
        answer = self.send_line(json.dumps(message))  # ensure_ascii: \uXXXX escapes
        assert answer["id"] == self.next_id, answer
        self.next_id += 1
        return answer

    def init(self) -> dict[str, Any]:
        return self.call("init", {"protocol": 1, "kvcheck_version": "0.6.0"})

    def _read_line(self) -> bytes:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + ANSWER_TIMEOUT
        while b"\n" not in self.pending:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise AssertionError(f"no answer line within {ANSWER_TIMEOUT}s (not flushed?)"
                                     f"\nstderr:\n{self.logs()}")
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise AssertionError(f"the engine closed its output (exit {self.proc.wait()})"
                                     f"\nstderr:\n{self.logs()}")
            self.pending += chunk
        line, _, self.pending = self.pending.partition(b"\n")
        return line

    def finish(self, *, close_input: bool) -> tuple[int, bytes]:
        """Exit status and what came on stdout after the last answer."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        if close_input:
            self.proc.stdin.close()
        try:
            status = self.proc.wait(timeout=ANSWER_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError(f"the engine did not exit\nstderr:\n{self.logs()}") from None
        rest = self.pending + self.proc.stdout.read()
        return status, rest

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None and not stream.closed:
                stream.close()


@pytest.fixture
def engine(engine_command: list[str], tmp_path: Path) -> Iterator[Engine]:
    with (tmp_path / "engine.stderr").open("w+b") as stderr:
        running = Engine(engine_command, stderr)
        try:
            yield running
        finally:
            running.close()


def assert_internal(answer: dict[str, Any], *fragments: str) -> str:
    assert "error" in answer, answer
    error = answer["error"]
    assert error["code"] == "internal", answer
    for fragment in fragments:
        assert fragment in error["message"], (fragment, error["message"])
    return str(error["message"])


# ------------------------------------------------------------------------------ the templates


@pytest.mark.parametrize("lang", sorted(TEMPLATE_FILES))
def test_templates_render_cleanly(lang: str) -> None:
    """{{NAME}} and {{PROFILE}} are the only placeholders (C++'s brace initialisers aside:
    render by plain replacement, never str.format), a name with underscores leaves none
    behind, and every
    manager method of the doc's table has its stub (no toolchain needed)."""
    for relative in TEMPLATE_FILES[lang]:
        raw = (TEMPLATES / relative).read_text(encoding="utf-8")
        assert "NAME" in set(re.findall(r"\{\{\s*(\w*)\s*\}\}", raw)) <= {"NAME", "PROFILE"}, \
            relative
        text = render(relative)
        assert "{{NAME}}" not in text and not re.search(r"\{\{\s*\w*\s*\}\}", text), relative
        assert NAME in text, relative
    source = render(TEMPLATE_FILES[lang][-1])
    for method in doc_manager_methods():
        assert f'"{method}"' in source, f"{lang}: no stub for {method}"
    if lang == "rust":
        assert f'name = "{NAME}"' in render("rust/Cargo.toml.tmpl")


# ------------------------------------------------------------------------------ the built engines


def test_init_and_factory(engine: Engine) -> None:
    """init: protocol 1 and an impl_info kvcheck's loader accepts; the factory: a handle per
    manager, each new."""
    from kvcheck.conformance.loader import _impl_info

    answer = engine.init()
    result = answer["result"]
    assert result["protocol"] == 1, answer
    info = result["impl_info"]
    assert info["name"] == NAME and info["version"] == "0.1.0", info
    assert info["profile"] == "generic" and info["hash_algos"] == [], info
    assert sorted(info["capabilities"]) == ["manager", "prefix_caching"], info
    module = types.ModuleType(NAME)  # checked as a Python module's IMPL_INFO is
    module.IMPL_INFO = info  # type: ignore[attr-defined]
    checked = _impl_info(f"exec:{NAME}", module)
    assert checked.name == NAME and checked.capabilities == {"manager", "prefix_caching"}

    first = engine.call("make_kv_cache_manager", {"spec": SPEC})["result"]
    second = engine.call("make_kv_cache_manager", {"spec": {**SPEC, "block_size": 16}})
    assert isinstance(first["handle"], int), first
    assert isinstance(second["result"]["handle"], int), second
    assert second["result"]["handle"] != first["handle"], (first, second)


def test_num_free_blocks_is_the_first_stub(engine: Engine) -> None:
    engine.init()
    handle = engine.call("make_kv_cache_manager", {"spec": SPEC})["result"]["handle"]
    assert_internal(engine.call("num_free_blocks", handle=handle),
                    f"{NAME}: num_free_blocks is not written yet: ")


def test_every_manager_method_names_itself(engine: Engine) -> None:
    """Each method of the doc's manager table answers internal, naming the method to write,
    given parameters shaped as kvcheck sends them."""
    engine.init()
    handle = engine.call("make_kv_cache_manager", {"spec": SPEC})["result"]["handle"]
    for method, names in doc_manager_methods().items():
        params = {name: SAMPLE_PARAMS.get(name, 1) for name in names}
        message = assert_internal(engine.call(method, params, handle=handle),
                                  f"{NAME}: {method} is not written yet: ")
        assert len(message) > len(f"{NAME}: {method} is not written yet: ") + 10, message


def test_shutdown_answers_null_and_exits_0(engine: Engine) -> None:
    engine.init()
    handle = engine.call("make_kv_cache_manager", {"spec": SPEC})["result"]["handle"]
    assert_internal(engine.call("num_free_blocks", handle=handle), "num_free_blocks")
    assert engine.call("shutdown") == {"id": 4, "result": None}
    status, rest = engine.finish(close_input=False)  # it exits without waiting for EOF
    assert (status, rest) == (0, b""), (status, rest, engine.logs())


def test_end_of_input_exits_0(engine: Engine) -> None:
    engine.init()
    engine.call("make_kv_cache_manager", {"spec": SPEC})
    status, rest = engine.finish(close_input=True)
    assert (status, rest) == (0, b""), (status, rest, engine.logs())


def test_unknown_method_is_an_internal_error_naming_it(engine: Engine) -> None:
    engine.init()
    assert_internal(engine.call("frobnicate", {"x": [1.5, -2, None, True, {}]}), "frobnicate")
    # Escapes both ways: the name arrives as \u escapes (a surrogate pair included) and comes
    # back in the message, which must still be one JSON line.
    odd = "fr\u00f6b\U0001F600 \"quoted\" back\\slash\nnew\tline"
    assert_internal(engine.call(odd), odd)
    assert_internal(engine.call("make_block_pool", {"spec": SPEC}), "make_block_pool")
    assert engine.call("shutdown")["result"] is None


def test_unknown_and_released_handles_are_internal_errors(engine: Engine) -> None:
    engine.init()
    handle = engine.call("make_kv_cache_manager", {"spec": SPEC})["result"]["handle"]
    assert_internal(engine.call("num_free_blocks", handle=handle + 100), "num_free_blocks")
    assert engine.call("release", {"handles": [handle]})["result"] is None
    assert_internal(engine.call("get_block_ids", {"request_id": "r"}, handle=handle),
                    "get_block_ids")
    assert engine.call("shutdown")["result"] is None
