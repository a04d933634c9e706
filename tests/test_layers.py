"""The layers of docs/ARCHITECTURE.md hold in csrc/ (scripts/check_layers.py),
and the check catches each kind of break when one is planted in a copy."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHECK = ROOT / "scripts" / "check_layers.py"


def _check(root):
    return subprocess.run([sys.executable, str(CHECK), "--root", str(root)], capture_output=True, text=True,
                          timeout=60)


def test_csrc_includes_follow_the_documented_layers():
    p = _check(ROOT)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "follow the" in p.stdout


@pytest.fixture
def tree(tmp_path):
    shutil.copytree(ROOT / "csrc", tmp_path / "csrc")
    (tmp_path / "docs").mkdir()
    shutil.copy(ROOT / "docs" / "ARCHITECTURE.md", tmp_path / "docs")
    assert _check(tmp_path).returncode == 0
    return tmp_path


def _append(path, line):
    with open(path, "a") as f:
        f.write(line + "\n")


@pytest.mark.parametrize("source, include, expect", [
    # up: the runtime naming a transport (the cycle the service registry removed)
    ("runtime/process_runtime.cpp", '#include "../transport/tcp/tcp_mux.hpp"', "a layer above it"),
    # up: the communicator naming the group builder
    ("comm/communicator.cpp", '#include "../group/join.hpp"', "a layer above it"),
    # sideways: one transport naming another
    ("transport/shm/doorbell.cpp", '#include "../tcp/tcp_mux.hpp"', "side by side"),
    # torch outside the adapter
    ("comm/wait_loop.cpp", "#include <torch/torch.h>", "only csrc/torch/"),
    # a path that does not resolve
    ("common/error.hpp", '#include "gone.hpp"', "does not exist"),
    # a transport bringing in the names of a layer above it
    ("transport/tcp/tcp_mux.hpp", "using namespace roce::comm;", "must not bring in csrc/comm, a layer above it"),
])
def test_each_kind_of_break_is_reported_with_its_file_and_line(tree, source, include, expect):
    path = tree / "csrc" / source
    _append(path, include)
    p = _check(tree)
    assert p.returncode == 1, p.stdout
    line = len(path.read_text().splitlines())
    assert f"csrc/{source}:{line}:" in p.stdout and expect in p.stdout, p.stdout


def test_code_outside_its_layers_namespace_is_reported(tree):
    """A forward declaration may name another layer's namespace; code may not."""
    path = tree / "csrc" / "comm" / "wait_loop.cpp"
    _append(path, "namespace roce::transport {\nclass Transport;\n}")
    assert _check(tree).returncode == 0
    _append(path, "namespace roce {\nint strayCounter = 0;\n}")
    p = _check(tree)
    line = len(path.read_text().splitlines()) - 2
    assert p.returncode == 1, p.stdout
    assert f"csrc/comm/wait_loop.cpp:{line}: opens namespace roce with code in it" in p.stdout, p.stdout
    assert "lives in roce::comm" in p.stdout, p.stdout


def test_a_folder_missing_from_the_layers_block_fails(tree):
    (tree / "csrc" / "newlayer").mkdir()
    (tree / "csrc" / "newlayer" / "x.hpp").write_text('#pragma once\n#include "../common/error.hpp"\n')
    p = _check(tree)
    assert p.returncode == 1 and "csrc/newlayer is not in the layers block" in p.stdout, p.stdout


def test_each_setting_is_declared_in_a_layer_of_the_block():
    """Config::read declares the layer that reads each setting: a folder of
    the layers block (a misspelt or moved folder fails here)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from check_layers import read_layers
    finally:
        sys.path.pop(0)
    from roce_pg._settings_table import DECLARATIONS

    levels, _ = read_layers(ROOT / "docs" / "ARCHITECTURE.md")
    assert len(DECLARATIONS) > 50
    for name, (layer, _, _) in DECLARATIONS.items():
        assert layer in levels, (name, layer)
