"""NativeLibrary: the cached build's name follows its source and the headers it includes."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from omnistage.native_library import NativeLibrary


def test_an_edited_header_names_a_new_build(tmp_path: Path) -> None:
    compiler = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if compiler is None:
        pytest.skip("no C compiler")
    source, header = tmp_path / "k.c", tmp_path / "k.h"
    source.write_text('#include "k.h"\nint f(void) { return VALUE; }\n')
    header.write_text("#define VALUE 1\n")
    library = NativeLibrary(source, ("-O2", "-fPIC"), lambda lib: None, "none", headers=(header,))
    first = library.library_path(compiler)
    assert library.library_path(compiler) == first
    header.write_text("#define VALUE 2\n")
    assert library.library_path(compiler) != first
    source.write_text('#include "k.h"\nint f(void) { return VALUE + 1; }\n')
    assert NativeLibrary(source, ("-O2", "-fPIC"), lambda lib: None, "none").library_path(compiler) != first
