"""The GPU run's test order (tests/suite_order.py): the longest first, unknown tests before
them, ties as collected; and the recorded times it reads are there and name this tree's test files."""
from dataclasses import dataclass

from suite_order import GPU_TIMES, longest_first, read_times


@dataclass
class Item:
    nodeid: str


def test_the_longest_go_first_and_unknown_ones_before_them():
    items = [Item(n) for n in ("a", "b", "c", "d", "e", "f")]
    times = {"a": 1.0, "b": 40.0, "d": 1.0, "e": 7.5, "f": 0.0}
    order = [it.nodeid for it in longest_first(items, times)]
    assert order == ["c", "b", "e", "a", "d", "f"]


def test_setup_lines_add_to_their_test_and_odd_lines_are_skipped(tmp_path):
    p = tmp_path / "times.txt"
    p.write_text("1.50 passed setup t.py::x\n2.25 passed call t.py::x\n"
                 "0.10 passed call t.py::y[a b]\nnot a line\nx passed call t.py::z\n")
    assert read_times(p) == {"t.py::x": 3.75, "t.py::y[a b]": 0.10}
    assert read_times(tmp_path / "absent.txt") == {}


def test_the_recorded_times_exist_and_name_this_suites_files():
    """The pointer is to a file in the tree, and most of the test files it names are here (a
    test renamed since only goes first; a file of another suite would order nothing)."""
    times = read_times(GPU_TIMES)
    assert len(times) > 300
    files = {n.split("::")[0] for n in times}
    root = GPU_TIMES.parents[2]
    assert sum((root / f).exists() for f in files) >= 0.9 * len(files)
