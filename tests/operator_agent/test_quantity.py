"""``contract.quantity``: the one reader of Kubernetes quantities (the operator's storage report and the
emulator's scheduler both use it), strict where ``kubernetes.utils.parse_quantity`` alone is lenient."""

import decimal

import pytest

from contract.quantity import parse_quantity, quantity_decimal, same_quantity
from demo import emulator
from operator_agent.reporters import storage

BAD = [
    "", "Gi", "ten", "1GiB", "1 Gi", True,  # as the storage report has always refused
    "NaN", "Infinity", "-Infinity", "1_000", "١٢", "１２",  # decimal.Decimal alone takes these
    "1e99999999999",  # the client parser would build the number digit by digit
    "1e101", "1e-101",
    "9" * 65,  # a huge mantissa
    " ",
    None, [], {}, float("nan"), float("inf"),
]


@pytest.mark.parametrize("bad", BAD)
def test_what_is_not_a_quantity_is_refused_with_a_value_error(bad):
    with pytest.raises(ValueError, match="not a quantity"):
        parse_quantity(bad)
    with pytest.raises(ValueError, match="not a quantity"):
        quantity_decimal(bad)


@pytest.mark.parametrize(("text", "value"), [
    ("1643124Mi", 1643124 * 2**20), ("12e6", 12_000_000), ("1e100", 10**100), ("1500m", 2), ("0.5", 1),
    ("+.5", 1), ("5.", 5), ("1E", 10**18), ("-1Ki", -1024), (" 2 ", 2), (4096, 4096), (2.5, 3), ("1Gi ", 2**30),
])
def test_quantities_are_read_as_apimachinery_reads_them(text, value):
    assert parse_quantity(text) == value


def test_the_storage_report_and_the_emulator_share_the_reader():
    assert storage.parse_quantity is parse_quantity
    assert emulator.parse_quantity is parse_quantity


def test_exact_values_and_equality():
    assert quantity_decimal("500m") == decimal.Decimal("0.5")
    assert same_quantity("1Gi", "1073741824") and same_quantity("1", 1)
    assert not same_quantity("1Gi", "1G") and not same_quantity("lots", "lots")
