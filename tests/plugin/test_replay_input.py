"""`kvcheck replay` on bad input: the whole trace is checked before anything runs; every problem
is exit 2 with a message naming the file, the op and the problem (never blamed on the
implementation). Also: repro trace names that sanitise alike do not overwrite each other, and
replay runs under the per-call limit."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from kv_helpers import reference_capabilities_source

from kvcheck.conformance.differential import safe_name, write_trace
from kvcheck.conformance.ops import add, decode, free, schedule
from kvcheck.conformance.protocol import KVCacheSpec
from kvcheck.plugin.cli import main

SPEC = {"num_blocks": 8, "block_size": 4}
GOOD_OPS = [add("a", range(10)), schedule("a"), decode("a", 2), free("a")]


def trace(spec: dict[str, Any] | None = None, ops: list[Any] | None = None,
          **top: Any) -> str:
    body = {"trace_version": 1, "impl": "reference", "spec": SPEC if spec is None else spec,
            "ops": GOOD_OPS if ops is None else ops}
    body.update(top)
    return json.dumps(body)


def replay(tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | bytes,
           *args: str) -> tuple[int, str, str]:
    path = tmp_path / "t.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    code = main(["replay", str(path), *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_a_good_trace_replays(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = replay(tmp_path, capsys, trace())
    assert code == 0 and "4 ops on reference (compared with reference): no divergence" in out


def test_a_trace_with_lookahead_replays(tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    """Random workloads write lookahead into schedule and decode ops; replay takes them."""
    ops = [add("a", list(range(10))), {"op": "schedule", "rid": "a", "lookahead": 2},
           {"op": "decode", "rid": "a", "num_tokens": 1, "lookahead": 3}]
    code, out, err = replay(tmp_path, capsys, trace(ops=ops))
    assert code == 0 and "3 ops on reference" in out and "no divergence" in out, err


@pytest.mark.parametrize(("content", "message"), [
    (trace(ops=[{"op": "explode", "rid": "a"}]),
     ("ops[0] (op #1): unknown op 'explode' (known: ['add', 'cache', 'decode', 'evict', "
      "'free', 'lookup', 'reset', 'schedule'])")),
    (trace(ops=[add("a", [1, 2]), schedule("ghost")]),
     "ops[1] (op #2): 'schedule' names request 'ghost', which no earlier 'add' op added"),
    (trace(ops=[free("ghost")]), "'free' names request 'ghost', which no earlier 'add'"),
    (trace(ops=[{"op": "add", "rid": "a"}]), "ops[0] (op #1): field 'prompt' must be a list"),
    (trace(ops=[{"op": "schedule"}]), "field 'rid' must be a non-empty string, got None"),
    (trace(ops=[add("a", [1]), {"op": "schedule", "rid": "a", "num_tokens": "5"}]),
     "ops[1] (op #2): num_tokens='5': must be an int in [0, 1048576] or null"),
    (trace(ops=[add("a", [1]), decode("a", -1)]),
     "num_tokens=-1: must be an int in [0, 1048576]"),
    (trace(ops=[add("a", [1]), {"op": "schedule", "rid": "a", "lookahead": -2}]),
     "ops[1] (op #2): lookahead=-2: must be an int in [0, 1048576]"),
    (trace(ops=[add("a", [1]), {"op": "decode", "rid": "a", "num_tokens": 1,
                                "lookahead": "3"}]),
     "lookahead='3': must be an int in [0, 1048576]"),
    (trace(ops=[add("a", [1]), decode("a", 1 << 20), decode("a", 1)]),
     "ops[2] (op #3): the schedule and decode ops of request 'a' ask for 1048577 tokens"),
    (trace(ops=[{"op": "add", "rid": "a", "prompt": [1], "ride": 1}]),
     "'add' op has unknown fields ['ride']"),
    (trace(ops=[add("a", [1, -5])]), "token id -5 in 'prompt'"),
    (trace(ops=[add("a", [1, True])]), "token id True in 'prompt'"),
    (trace(ops=[add("a", [1, 2], mm=[("img", 1, 5)])]), "multimodal item ['img', 1, 5]"),
    (trace(ops=[add("a", [1], lora=("x", -1, "p"))]), "field 'lora'=['x', -1, 'p']"),
    (trace(ops=["schedule"]), "ops[0] (op #1): an op is an object, got str"),
    (trace(ops={"op": "reset"}), "field 'ops' missing or not a list"),
    (trace(spec={"num_blocks": 1 << 21, "block_size": 4}),
     "spec.num_blocks=2097152: must be an int in [1, 1048576]"),
    (trace(spec={"num_blocks": -3, "block_size": 4}),
     "spec.num_blocks=-3: must be an int in [1, 1048576]"),
    (trace(spec={"num_blocks": True, "block_size": 4}),
     "spec.num_blocks=True: must be an int in [1, 1048576]"),
    (trace(spec={"num_blocks": 8, "block_size": 1 << 17}),
     "spec.block_size=131072: must be an int in [1, 65536]"),
    (trace(spec={**SPEC, "hash_algo": "md5"}),
     ("spec.hash_algo='md5': unknown hash algorithm (known: ['sha256', 'sha256_cbor', "
      "'xxhash', 'xxhash_cbor'])")),
    (trace(spec={**SPEC, "profile": "vllm-0.99"}), "spec.profile='vllm-0.99': unknown profile"),
    (trace(spec={**SPEC, "max_model_len": -1}), "spec.max_model_len=-1"),
    (trace(spec={**SPEC, "enable_caching": "yes"}), "spec.enable_caching='yes'"),
    (trace(spec={"num_blocks": 8}), "field 'spec' is not a KVCacheSpec: block_size is missing"),
    (trace(impl=["reference"]), "field 'impl' must be a module name"),
    (trace(trace_version=0), "field 'trace_version' must be an int <= 1 (and >= 1), got 0"),
    (b"\xff\xfe{}", "not a JSON trace (not UTF-8 text: byte 0)"),
    ('{"trace_version": 1, "spec": {"num_blocks": ' + "9" * 5000 + "}}",
     "not a usable JSON trace (ValueError"),
    ("[" * 100_000 + "]" * 100_000, "not a usable JSON trace (RecursionError"),
])
def test_bad_trace_is_an_input_error(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                     content: str | bytes, message: str) -> None:
    code, out, err = replay(tmp_path, capsys, content)
    assert code == 2, out + err
    assert err.startswith(f"kvcheck replay: {tmp_path / 't.json'}")
    assert message in err and "Traceback" not in err
    assert "diverges" not in out  # never blamed on the implementation


def test_missing_file_and_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", str(tmp_path / "nope.json")]) == 2
    assert "cannot read trace" in capsys.readouterr().err
    assert main(["replay", str(tmp_path)]) == 2
    assert "cannot read trace" in capsys.readouterr().err


def test_bad_timeout_option(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = replay(tmp_path, capsys, trace(), "--kv-timeout=-1")
    assert code == 2 and "--kv-timeout=-1.0: must be a finite number of seconds >= 0" in err


def test_unloadable_impl_is_an_input_error(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = replay(tmp_path, capsys, trace(), "--kv-impl=no_such_module_xyz")
    assert code == 2 and "--kv-impl=no_such_module_xyz: cannot import" in err


_CAPS = reference_capabilities_source("_R.capabilities", drop={"block_pool"})
PICKY = f"""
from kvcheck.adapters.reference import IMPL_INFO as _R, make_kv_cache_manager
from kvcheck.conformance.protocol import ImplInfo
IMPL_INFO = ImplInfo("picky", "0", {_CAPS}, block_sizes=(16,))
"""
HANGS = f"""
import time
from kvcheck.adapters.reference import IMPL_INFO as _R, ReferenceManager
from kvcheck.conformance.protocol import ImplInfo
IMPL_INFO = ImplInfo("hangs", "0", {_CAPS})
class M(ReferenceManager):
    def allocate_slots(self, request, *args):
        time.sleep(3600)
def make_kv_cache_manager(spec):
    return M(spec)
"""




def test_spec_outside_declared_sizes_is_an_input_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], impl_module: Any) -> None:
    target = impl_module("picky_replay_impl", PICKY)
    code, _, err = replay(tmp_path, capsys, trace(impl=target))
    assert code == 2 and "is outside what picky declares (block_sizes=(16,)" in err


def test_replay_hang_fails_with_the_call_under_the_limit(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], impl_module: Any) -> None:
    target = impl_module("hangs_replay_impl", HANGS)
    code, out, _ = replay(tmp_path, capsys, trace(impl=target), "--kv-timeout=0.3")
    assert code == 1
    assert ("after op #2 {'op': 'schedule', 'rid': 'a', 'num_tokens': None}: timeout: "
            "hangs.allocate_slots(RequestView('a', 10 tokens, num_computed_tokens=0), 10, 0, "
            "[]) did not return within 0.3 s") in out


def test_trace_names_that_sanitise_alike_do_not_collide(tmp_path: Path) -> None:
    spec = KVCacheSpec(num_blocks=8, block_size=4)
    one = write_trace("test_x[a b]", "a b", spec, GOOD_OPS, directory=tmp_path)
    two = write_trace("test_x[a/b]", "a/b", spec, GOOD_OPS, directory=tmp_path)
    # Both sanitise to test_x_a_b_; each keeps that readable part plus its own hash.
    assert one != two
    assert one.name.startswith("test_x_a_b_-") and two.name.startswith("test_x_a_b_-")
    assert json.loads(one.read_text())["impl"] == "a b"
    assert json.loads(two.read_text())["impl"] == "a/b"
    # Names already safe stay as they are; the hash is stable across processes.
    assert safe_name("test_plain") == "test_plain"
    assert safe_name("a/b c") == safe_name("a/b c") != safe_name("a_b_c")
    long_a, long_b = "t" * 130 + "a", "t" * 130 + "b"
    assert safe_name(long_a) != safe_name(long_b) and len(safe_name(long_a)) <= 120
