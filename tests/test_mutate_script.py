"""``scripts/mutate.py`` leaves argument checks alone: a block that ends by raising, or by
calling a ``_raise*`` helper, and the helpers themselves, are not mutated; the rest is. A
documented equivalent explains only the change its row was written for."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "mutate.py"


def _mutate_module():
    spec = importlib.util.spec_from_file_location("kvcheck_mutate_script", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


SOURCE = '''
def allocate(n, free):
    if n < 0:
        _raise_negative(n)
    if n > free:
        raise ValueError(n)
    return n + 1


def _raise_negative(n):
    detail = n * 2
    raise ValueError(detail)
'''


def test_raise_helpers_and_checks_are_not_mutated():
    mutate = _mutate_module()
    mutants = mutate.find_mutants("m", SOURCE, frozenset(mutate.OPERATORS))
    lines = {m.line for m in mutants}
    assert mutants, "the return's arithmetic must still be mutated"
    assert lines == {7}, [(m.line, m.change) for m in mutants]
    assert not any(m.qualname == "_raise_negative" for m in mutants)


def test_a_call_that_does_not_raise_is_still_mutated():
    mutate = _mutate_module()
    source = SOURCE.replace("_raise_negative(n)\n", "_record_negative(n)\n", 1)
    mutants = mutate.find_mutants("m", source, frozenset(mutate.OPERATORS))
    assert any(m.line in (3, 4) for m in mutants), [(m.line, m.change) for m in mutants]


def test_a_mutant_never_runs_the_last_ones_bytecode(tmp_path):
    """Bytecode is cached between mutant runs, so ``Workspace.install`` must drop the replaced
    module's .pyc: the next mutant of that module may have the same size and be written within
    the same second (the stamp a .pyc is checked against), and would then run the last one."""
    mutate = _mutate_module()
    ws = mutate.Workspace(tmp_path / "ws", mutate.snapshot())
    probe = [sys.executable, "-c", f"from {mutate.PACKAGE}.probe import VALUE; print(VALUE)"]
    env = ws.env()
    assert "PYTHONDONTWRITEBYTECODE" not in env  # cached: the hazard is real

    ws.install("probe", "VALUE = 1\n")
    first = subprocess.run(probe, env=env, capture_output=True, text=True, check=True)
    source = ws.package / "probe.py"
    stamp = source.stat().st_mtime_ns
    assert first.stdout == "1\n" and (ws.package / "__pycache__").is_dir()

    ws.install("probe", "VALUE = 2\n")          # same size
    os.utime(source, ns=(stamp, stamp))         # and the same stamp, as within one second
    second = subprocess.run(probe, env=env, capture_output=True, text=True, check=True)
    assert second.stdout == "2\n"


def test_a_row_written_for_another_change_explains_nothing(tmp_path):
    """Keys number a function's mutation points in source order: an edit above a point hands
    its key to another change. The table's row then no longer explains the mutant at that
    key, and the summary says the row is stale."""
    mutate = _mutate_module()
    (mutant,) = [m for m in mutate.find_mutants("m", SOURCE, frozenset(mutate.OPERATORS))
                 if m.operator == "arith"]
    assert mutant.change == "+ <-> - (`n + 1`) in `return n + 1`"
    doc = tmp_path / "mutation.md"
    table = ("## Equivalent mutants\n\n| mutant | change | why it is equivalent |\n|---|---|---|\n"
             f"| `{mutant.key}` | {{change}} | a reason |\n")
    outcome = mutate.Outcome("survived", "", "", 1.0)
    for change, explained in ((mutant.change, True),
                              ("+ <-> - (`n + 1`) in `return n + 1...`", True),  # truncated
                              ("+ <-> - (`n + 2`) in `return n + 2`", False),
                              ("the return's addition", False)):
        doc.write_text(table.format(change=change.replace("|", "\\|")), encoding="utf-8")
        equivalents = mutate.documented_equivalents(doc)
        assert (mutate.equivalent_reason(mutant, equivalents) == "a reason") is explained
        lines, unexplained = mutate.summarize([(mutant, outcome)], [], equivalents)
        assert unexplained == (0 if explained else 1)
        assert any("written for another change" in line for line in lines) is not explained
