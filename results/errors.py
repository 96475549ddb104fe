"""Every error the results layer raises (records, gates, output files), in one place; each
is also importable from the module that raises it. All are unusable input: the CLI ends with
exit status 2 and the message, which names the file, the field and the fix."""

from __future__ import annotations

from kvcheck.errors import KVCheckInputError

__all__ = ["GateInputError", "KindMismatchError", "OutputPathError", "RecordError"]


class RecordError(KVCheckInputError):
    """A record file or object that does not follow the schema; the message names the field."""



class OutputPathError(KVCheckInputError):
    """An output path that cannot (or must not) be written; the message names the fix."""



class GateInputError(KVCheckInputError):
    """Unusable gate configuration (threshold, floor, waiver); the message names the source."""



class KindMismatchError(KVCheckInputError):
    """The baseline holds no record of the kind the current records are (exit 2)."""

