"""``kvcheck new-adapter --lang rust|cpp|js NAME``: a wire shim skeleton in another language
(docs/wire-protocol.md, "Starting a shim") and a ``pytest.ini`` that runs the suite on it.

The skeletons (``plugin/wire_templates/``) read requests, answer ``init`` for the ``generic``
profile, make managers, and answer every manager method with an ``internal`` error naming the
method to write, so the first run fails on the first method, as the Python scaffold's does.
``{{NAME}}`` in a template becomes NAME, ``{{PROFILE}}`` the ``--profile`` (default
``generic``). Nothing is ever overwritten.

=========  =================================  ====================================
language   files                              build, then run
=========  =================================  ====================================
``rust``   NAME/Cargo.toml, NAME/src/main.rs  ``cargo build --release``; ``pytest -x``
``cpp``    NAME.cpp                           ``g++ -std=c++17 -O2 -o NAME NAME.cpp``
``js``     NAME.mjs                           none (Node.js 18 or newer)
=========  =================================  ====================================
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path
from typing import Final

from kvcheck.plugin.scaffold import ScaffoldError
from kvcheck.results.io import write_atomic

__all__ = ["LANGUAGES", "write_wire_skeleton"]

#: language -> ((template, path relative to the output folder), ...), the exec: command
#: (relative to the folder pytest.ini is in) and the build command ("" when none).
LANGUAGES: Final[dict[str, tuple[tuple[tuple[str, str], ...], str, str, str]]] = {
    "rust": ((("rust/Cargo.toml.tmpl", "{name}/Cargo.toml"),
              ("rust/main.rs.tmpl", "{name}/src/main.rs")),
             "{name}", "./target/release/{name}", "cargo build --release"),
    "cpp": ((("cpp/main.cpp.tmpl", "{name}.cpp"),), ".", "./{name}",
            "g++ -std=c++17 -O2 -o {name} {name}.cpp"),
    "js": ((("js/main.mjs.tmpl", "{name}.mjs"),), ".", "node {name}.mjs", ""),
}
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,99}")


def _template(path: str) -> str:
    return (resources.files("kvcheck.plugin") / "wire_templates" / path).read_text("utf-8")


def write_wire_skeleton(name: str, directory: str | Path, lang: str,
                        profile: str = "generic") -> tuple[list[Path], str]:
    """Write the ``lang`` skeleton of engine ``name`` (its ``impl_info`` claiming ``profile``)
    and its ``pytest.ini`` into ``directory``; returns the files written and the next step to
    print.

    Raises:
        ScaffoldError: an unknown language, a name that is not ``[A-Za-z][A-Za-z0-9_]*`` (it
            names a binary, a cargo package and the test ids), or a file that exists already
            (nothing is written then).
    """
    if lang not in LANGUAGES:
        raise ScaffoldError(f"--lang {lang!r}: no skeleton for that language\n  Fix: pass one "
                            f"of {', '.join(LANGUAGES)} (or no --lang for a Python adapter)")
    if not _NAME.fullmatch(name):
        raise ScaffoldError(
            f"{name!r} cannot name an engine (it becomes a binary, a package and test ids)\n"
            "  Fix: use a letter then letters, digits or underscores, at most 100, e.g. "
            "myengine")
    files, ini_dir, command, build = LANGUAGES[lang]
    root = Path(directory)
    out = {root / target.format(name=name):
           _template(template).replace("{{NAME}}", name).replace("{{PROFILE}}", profile)
           for template, target in files}
    ini = root / ini_dir.format(name=name) / "pytest.ini"
    out[ini] = ("[pytest]\n"
                f"# The suite on the {lang} engine over the wire (docs/wire-protocol.md).\n"
                f"addopts = --kv-impl='exec:{command.format(name=name)}'\n")
    existing = [str(p) for p in out if p.exists()]
    if existing:
        raise ScaffoldError(f"{', '.join(existing)} exist(s) already; nothing was written\n"
                            "  Fix: pick another NAME or --dir, or move the files away")
    written = []
    try:
        for path, text in out.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            written.append(write_atomic(path, text))
    except OSError as exc:
        raise ScaffoldError(f"cannot write into {root}: {exc.strerror or exc}\n  Fix: pass a "
                            "writable --dir") from None
    where = ini.parent
    steps = [f"cd {where}"] if str(where) != "." else []
    if build:
        steps.append(build.format(name=name))
    steps.append("pytest -x")
    return written, " && ".join(steps)
