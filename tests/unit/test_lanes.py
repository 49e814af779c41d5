"""The serial lane (tests/conftest.py): the tests make test runs one after another on one xdist worker."""

from __future__ import annotations

import pytest

from tests.conftest import TESTS, marked_serial, work_unit


@pytest.mark.parametrize(
    ("source", "serial"),
    [
        ("import pytest\n\npytestmark = pytest.mark.serial\n", True),
        ("import pytest\n\npytestmark = [pytest.mark.serial, pytest.mark.timeout(300)]  # timed\n", True),
        ("import pytest\n\npytestmark = pytest.mark.slow\n", False),
        ("import pytest\n\n\n@pytest.mark.serial\ndef test_one():\n    pass\n", False),  # a mark on one test
        ("def test_one():\n    pass\n", False),
    ],
)
def test_a_module_is_serial_by_its_own_pytestmark(tmp_path, source, serial):
    module = tmp_path / "test_module.py"
    module.write_text(source)
    assert marked_serial(module) is serial


def test_the_kube_tier_and_the_marked_modules_are_one_unit_every_other_module_its_own():
    kube = next((TESTS / "kube").glob("test_*.py")).relative_to(TESTS.parent).as_posix()
    assert work_unit(f"{kube}::test_x") == "serial"
    assert work_unit("tests/training/test_watchdog.py::test_x[a]") == "serial"
    assert work_unit("tests/unit/test_lanes.py::test_x") == "tests/unit/test_lanes.py"
