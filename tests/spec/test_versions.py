"""The tested version range: parsing, the preflight warning, and that pyproject.toml agrees."""

import pathlib
import re

import pytest

from launcher import versions
from launcher.versions import TESTED_JAX, TESTED_PYTHON, outside_tested, parse_version

REPO = pathlib.Path(__file__).resolve().parent.parent.parent


@pytest.mark.parametrize("text, want", [
    ("0.12.0.1", (0, 12, 0, 1)),
    ("0.10.2", (0, 10, 2)),
    ("0.9", (0, 9)),
    ("0.9.0", (0, 9)),
    ("3.11.7", (3, 11, 7)),
    ("3.13.0", (3, 13)),
    ("3.11.7+", (3, 11, 7)),
    ("0.10.2.dev20260101", (0, 10, 2)),
    ("0.13.0rc1", (0, 13)),
    (" 0.8.1", (0, 8, 1)),
    ("v0.8.1", (0, 8, 1)),
    ("1!2.0", None),
    ("abc", None),
    ("", None),
    (None, None),
    (10, None),
])
def test_parse_version(text, want):
    assert parse_version(text) == want


def test_parse_version_orders_releases():
    order = ["0.6.2", "0.8.3", "0.9.0", "0.9.0.1", "0.10.0", "0.10.2", "0.12.0", "0.12.0.1", "0.13"]
    assert sorted(order, key=parse_version) == order


def test_ends_are_ordered_and_parse():
    assert parse_version(TESTED_JAX[0]) < parse_version(TESTED_JAX[1])
    assert parse_version(TESTED_PYTHON[0]) < parse_version(TESTED_PYTHON[1])


@pytest.mark.parametrize("jax", [TESTED_JAX[0], TESTED_JAX[1], "0.9", "0.10.2", "0.11.1", "0.12.0"])
def test_inside_the_range_gives_no_warning(jax):
    assert outside_tested(jax) is None
    assert outside_tested(jax, "3.11.7") is None
    assert outside_tested(jax, "3.13.0") is None
    assert outside_tested(jax, "3.12.1") is None


def test_not_installed_is_left_to_preflight():
    assert outside_tested(None) is None


def test_older_jax_says_which_range_and_what_to_do():
    text = outside_tested("0.8.3")
    assert text.startswith(f"jax 0.8.3 is older than podlaunch's tested range (jax {TESTED_JAX[0]} "
                           f"to {TESTED_JAX[1]})")
    assert f"install jax and jaxlib {TESTED_JAX[0]} or newer on every host" in text
    assert "\n" not in text


def test_newer_jax_is_a_warning_not_a_refusal():
    text = outside_tested("0.13.0")
    assert text.startswith("jax 0.13.0 is newer than podlaunch's tested range")
    assert "may well work" in text
    assert outside_tested("0.12.1") is not None  # past the newest tested patch release


def test_unreadable_jax_version_is_named():
    assert outside_tested("nightly").startswith("jax version 'nightly' is not a version number")


def test_python_outside_the_range_is_named_beside_jax():
    assert outside_tested(TESTED_JAX[1], "3.10.12") == (
        f"Python 3.10.12 is older than podlaunch's tested range (Python {TESTED_PYTHON[0]} to "
        f"{TESTED_PYTHON[1]})")
    assert "Python 3.14.0 is newer" in outside_tested(TESTED_JAX[1], "3.14.0")
    both = outside_tested("0.8.0", "3.10.12")
    assert both.startswith("jax 0.8.0 is older") and "; Python 3.10.12 is older" in both


def test_python_is_compared_by_minor_version():
    assert outside_tested(TESTED_JAX[0], TESTED_PYTHON[0] + ".0") is None
    assert outside_tested(TESTED_JAX[0], TESTED_PYTHON[1] + ".99") is None


def _pyproject():
    return (REPO / "pyproject.toml").read_text()


def _range(name, text):
    match = re.search(rf'"{name}>=([\d.]+),<([\d.]+)"', text)
    assert match, f"pyproject.toml has no {name}>=X,<Y"
    return match.group(1), match.group(2)


@pytest.mark.parametrize("name", ["jax", "jaxlib"])
def test_pyproject_range_is_the_tested_range(name):
    low, below = _range(name, _pyproject())
    assert parse_version(low) == parse_version(TESTED_JAX[0])
    # the cap admits the newest tested release and no further minor release
    assert parse_version(TESTED_JAX[1]) < parse_version(below)
    assert parse_version(below)[:2] == (parse_version(TESTED_JAX[1])[0],
                                        parse_version(TESTED_JAX[1])[1] + 1)


def test_every_jax_install_the_docs_show_keeps_the_supported_range():
    """Issue 70: the GPU quick start's ``pip install -U 'jax[cuda12]'`` installed the newest
    jax, past the supported range; every ``jax[...]`` install in the README and docs/ names
    pyproject.toml's bounds."""
    want = _range("jax", _pyproject())
    installs = [(path.name, spec) for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
                for spec in re.findall(r"'(jax\[[a-z0-9_]+\][^']*)'", path.read_text())]
    assert {name for name, _ in installs} >= {"README.md", "gpu.md", "tpu.md"}, installs
    for name, spec in installs:
        assert re.fullmatch(r"jax\[\w+\]>=([\d.]+),<([\d.]+)", spec), (name, spec)
        assert re.fullmatch(r"jax\[\w+\]>=([\d.]+),<([\d.]+)", spec).groups() == want, (name, spec)


def test_requires_python_is_the_oldest_tested():
    match = re.search(r'requires-python = ">=([\d.]+)"', _pyproject())
    assert match and match.group(1) == TESTED_PYTHON[0]


def test_module_is_stdlib_only():
    source = pathlib.Path(versions.__file__).read_text()
    imports = set(re.findall(r"^(?:from|import) (\w+)", source, re.M))
    assert imports <= {"__future__", "re"}, imports
