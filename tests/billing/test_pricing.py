"""billing.pricing: prices per GPU model with the default row and the setting as fallbacks, shares, window costs."""

from decimal import Decimal

import pytest

from billing import pricing
from billing.models import Price


@pytest.mark.django_db
def test_price_for_model_falls_back_to_the_default_row_then_the_setting(settings, django_assert_num_queries):
    settings.GSHARE_BILLING_DEFAULT_PRICE = Decimal("0.75")
    assert pricing.price_for_model("NVIDIA H100 80GB HBM3") == Decimal("0.75")
    Price.objects.create(gpu_model="", credits_per_gpu_hour=Decimal("1.5"))
    Price.objects.create(gpu_model="NVIDIA H100 80GB HBM3", credits_per_gpu_hour=Decimal("2.5"))
    with django_assert_num_queries(1):
        prices = pricing.prices_by_model()
    assert prices == {"": Decimal("1.5"), "NVIDIA H100 80GB HBM3": Decimal("2.5")}
    with django_assert_num_queries(0):
        assert pricing.price_for_model("NVIDIA H100 80GB HBM3", prices) == Decimal("2.5")
        assert pricing.price_for_model("Tesla T4", prices) == Decimal("1.5")
        assert pricing.price_for_model("", prices) == Decimal("1.5")
    assert pricing.price_for_model("nvidia h100 80gb hbm3") == Decimal("1.5")  # the model as inventory spells it


@pytest.mark.parametrize(
    ("device", "memory", "cores", "share"),
    [
        (81559, None, None, "1"),  # whole GPU
        (81559, 20000, None, "1"),  # no cores named: HAMi-core sets no SM limit, so all of them
        (81559, 20000, 1, "0.245221"),  # 20000 / 81559 = 0.2452212508...
        (81559, 20000, 10, "0.245221"),  # memory share is the larger
        (81559, 4096, 25, "0.25"),  # cores share is the larger
        (15360, 20000, None, "1"),  # more than the device: capped
        (81559, None, 1, "1"),  # no memory named: HAMi gives (and placement reserves) the whole memory
        (None, None, 30, "1"),  # the same on a device not known
        (None, 4096, None, "1"),  # memory on an unknown device: the most it can be
        (258787, 4096, 1, "0.015828"),  # H20 as HAMi registers it (deviceMemoryScaling 1.8): 0.01582768...
    ],
)
def test_gpu_share(device, memory, cores, share):
    assert pricing.gpu_share(device_memory_mib=device, gpu_memory_mib=memory, gpu_cores=cores) == Decimal(share)


def test_gpu_share_rounds_half_even_to_six_places():
    # 200,001 / 2,000,000 = 0.1000005 exactly: a half, rounded to the even neighbour 0.100000 ...
    assert pricing.gpu_share(device_memory_mib=2_000_000, gpu_memory_mib=200_001, gpu_cores=10) == Decimal("0.100000")
    # ... and 200,003 / 2,000,000 = 0.1000015 to 0.100002.
    assert pricing.gpu_share(device_memory_mib=2_000_000, gpu_memory_mib=200_003, gpu_cores=10) == Decimal("0.100002")


@pytest.mark.parametrize(
    ("cores", "split", "reserved"),
    [(None, 10, 100), (None, 1, 100), (1, 10, 10), (10, 10, 10), (11, 10, 11), (1, 3, 34), (1, 1, 100), (50, 7, 50), (1, 100, 1),
     (1, 1000, 1)],
)
def test_share_cores_is_all_of_them_when_left_out_and_at_least_one_split_slot(cores, split, reserved):
    assert pricing.share_cores(gpu_cores=cores, split_count=split) == reserved


def test_window_cost_is_exact_and_rounds_up():
    # 2.5 credits/h × 0.245221 × 60 s / 3600 = 0.010217541666... -> 0.010218
    assert pricing.window_cost(price=Decimal("2.5"), share=Decimal("0.245221"), seconds=60) == Decimal("0.010218")
    # 3.6 credits/h: cost = seconds / 1000. Up, never to nearest: half a quantum (or less) is not free.
    assert pricing.window_cost(price=Decimal("3.6"), share=Decimal(1), seconds=Decimal("0.0005")) == Decimal("0.000001")
    assert pricing.window_cost(price=Decimal("3.6"), share=Decimal("0.1"), seconds=Decimal("0.000001")) == Decimal("0.000001")
    assert pricing.window_cost(price=Decimal("3.6"), share=Decimal(1), seconds=Decimal("0.0015")) == Decimal("0.000002")
    assert pricing.window_cost(price=Decimal("3.6"), share=Decimal(1), seconds=Decimal("0.0025")) == Decimal("0.000003")
    assert pricing.window_cost(price=Decimal("3.6"), share=Decimal(1), seconds=Decimal("0.002")) == Decimal("0.000002")  # exact: as is
    assert pricing.window_cost(price=Decimal("3.6"), share=Decimal(1), seconds=0) == Decimal("0.000000")
    # Microseconds are kept: 59.999999 s of a whole GPU at 1 credit/h.
    assert pricing.window_cost(price=Decimal(1), share=Decimal(1), seconds=Decimal("59.999999")) == Decimal("0.016667")
    # Large prices stay exact (no float anywhere).
    assert pricing.window_cost(price=Decimal("999999999999.999999"), share=Decimal(1), seconds=3600) == Decimal("999999999999.999999")


def test_hourly_cost():
    # 2.5 × 0.245221 = 0.6130525: a half, to the even neighbour (ROUND_HALF_UP would give 0.613053).
    assert pricing.hourly_cost(price=Decimal("2.5"), share=Decimal("0.245221")) == Decimal("0.613052")


@pytest.mark.parametrize(
    ("price", "device", "memory", "cores", "share", "cost"),
    [
        ("2.5", 81559, None, None, "1", "0.041667"),
        ("2.5", 81559, 20000, 10, "0.245221", "0.010218"),
        ("1.2", 32768, 20000, 10, "0.610352", "0.012208"),
        ("1.2", 258787, 4096, 10, "0.1", "0.002000"),  # 1 % asked, raised to one of 10 split slots by placement
        ("1.2", 258787, 4096, None, "1", "0.020000"),
        ("2.5", 81559, None, 1, "1", "0.041667"),
    ],
)
def test_the_worked_example_of_docs_billing(price, device, memory, cores, share, cost):
    got = pricing.gpu_share(device_memory_mib=device, gpu_memory_mib=memory, gpu_cores=cores)
    assert got == Decimal(share)
    assert pricing.window_cost(price=Decimal(price), share=got, seconds=60) == Decimal(cost)
    if share == "0.245221":
        assert 10 * pricing.window_cost(price=Decimal(price), share=got, seconds=60) == Decimal("0.102180")
