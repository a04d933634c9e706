"""Marks every test with its kind, from the module it is in, so that one kind
runs alone: `pytest tests -m unit` (seconds), `pytest tests -m "not softroce"`
(no VMs). A module not listed in KINDS is integration: most tests spawn ranks.
The Soft-RoCE VMs boot in the background as the session starts, and their
tests run last (tests/test_softroce.py says why).
"""
import pytest

DESCRIPTIONS = {
    "unit": "no spawned ranks: the C++ unit tests of the torch-free core, the parsers' fuzz runs, the layer check, "
            "the test device",
    "integration": "ranks spawned on this machine (shared memory, TCP, simulated machines), the doctor, "
                   "the examples and benchmarks as users launch them",
    "sanitizers": "the extension rebuilt under ASan/UBSan and TSan, one workload each",
    "scale": "the torch-free scale harness against the world size",
    "softroce": "the verbs transport over rxe in emulated VMs",
}
KINDS = {
    "unit": {"test_unit_cpp", "test_layers", "test_testdev", "test_fuzz"},
    "sanitizers": {"test_sanitizers"},
    "scale": {"test_scale"},
    "softroce": {"test_softroce", "test_softroce_doctor"},
}


def kind_of(module_name):
    name = module_name.rsplit(".", 1)[-1]
    return next((kind for kind, modules in KINDS.items() if name in modules), "integration")


def pytest_configure(config):
    for kind, text in DESCRIPTIONS.items():
        config.addinivalue_line("markers", f"{kind}: {text}")


def pytest_collection_modifyitems(config, items):
    for item in items:
        item.add_marker(getattr(pytest.mark, kind_of(item.module.__name__)))
    # The VM suites last: their boots run in the background from the start
    # (pytest_collection_finish), and every host test runs meanwhile.
    items.sort(key=lambda item: kind_of(item.module.__name__) == "softroce")


def pytest_collection_finish(session):
    if session.config.option.collectonly:
        return
    fixtures = {name for item in session.items if kind_of(item.module.__name__) == "softroce"
                for name in getattr(item, "fixturenames", ())}
    if fixtures:
        from tests import test_softroce

        test_softroce.start_boots(fixtures)


def pytest_sessionfinish(session):
    import sys

    if "tests.test_softroce" in sys.modules:
        sys.modules["tests.test_softroce"].stop_boots()
