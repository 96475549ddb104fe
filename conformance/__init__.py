"""kvcheck.conformance: the conformance suite shipped to users.

Run it with ``pytest --kv-impl=some.module`` (or ``pytest --pyargs kvcheck.conformance
--kv-impl=...``). Test ids are public: users list them in xfail / skip files and result records
key outcomes by them, so renaming a test is a breaking change.
"""

SUITE_VERSION = "0.1.0"

__all__ = ["SUITE_VERSION"]
