"""The node's pure parsing: Kubernetes quantities and ``$(VAR)`` expansion in env values, commands and args."""

from __future__ import annotations

import pytest

from atlas_cluster.node.environment import expand
from atlas_cluster.node.quantities import quantity


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("500m", 0.5),
        ("2", 2.0),
        (3, 3.0),
        ("1.5", 1.5),
        ("1e3", 1000.0),
        ("2k", 2000.0),
        ("64Gi", 64 * 2**30),
        ("100Mi", 100 * 2**20),
        ("1G", 1e9),
        (" 8 ", 8.0),
    ],
)
def test_quantities_are_numbers(text, value):
    assert quantity(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["", "Gi", "2 Gi", "2gi", "two", "1.5X"])
def test_what_is_not_a_quantity_is_refused(text):
    with pytest.raises(ValueError, match="not a quantity"):
        quantity(text)


def test_a_defined_variable_is_replaced_an_undefined_one_left_as_written():
    env = {"MASTER": "job-master-0", "PORT": "23456"}
    assert expand("--rdzv=$(MASTER):$(PORT)", env) == "--rdzv=job-master-0:23456"
    assert expand("$(MISSING)/x", env) == "$(MISSING)/x"


def test_a_doubled_dollar_is_one_dollar_and_escapes_a_reference():
    assert expand("cost $$5", {}) == "cost $5"
    assert expand("$$(PORT)", {"PORT": "1"}) == "$(PORT)"


def test_names_with_dots_and_dashes_expand_and_expansion_is_not_recursive():
    env = {"a.b-c": "x", "OUTER": "$(INNER)", "INNER": "no"}
    assert expand("$(a.b-c)", env) == "x"
    assert expand("$(OUTER)", env) == "$(INNER)"
    assert expand("$(1BAD) $(", env) == "$(1BAD) $("
