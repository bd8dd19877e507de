"""CEL device selectors as kube-scheduler evaluates them (hami_sim.scheduler.dra.selector): the `device`
variable, the driver's default domain, unknown domains, the Kubernetes quantity and semver functions,
and the error messages."""

from __future__ import annotations

from fractions import Fraction

import pytest

from hami_api import dra
from hami_sim.scheduler.dra.selector import (
    DeviceView,
    SelectorCache,
    SelectorError,
    compile_selector,
    parse_semver,
)

GIB = 2**30


def gpu_view(**attributes: dict[str, object]) -> DeviceView:
    return DeviceView(
        dra.DRIVER,
        {
            "type": {"string": dra.DEVICE_TYPE},
            "uuid": {"string": "GPU-1"},
            "minor": {"int": 3},
            "productName": {"string": "NVIDIA-A100-SXM4-80GB"},
            "driverVersion": {"version": "550.54.15"},
            "example.com/rack": {"string": "r7"},
            **attributes,
        },
        {"memory": Fraction(80 * GIB), "cores": Fraction(100)},
        True,
    )


def check(expression: str, device: DeviceView | None = None) -> bool:
    return compile_selector(expression).matches(device or gpu_view())


def test_hami_dra_device_class_selector_matches_a_hami_gpu() -> None:
    assert check(dra.DEVICE_CLASS_SELECTOR)
    assert not check(dra.DEVICE_CLASS_SELECTOR, gpu_view(type={"string": "nvidia-gpu"}))


def test_unqualified_names_live_in_the_driver_domain_and_qualified_ones_in_theirs() -> None:
    assert check(f"device.attributes['{dra.DRIVER}'].minor == 3")
    assert check("device.attributes['example.com'].rack == 'r7'")
    assert check(f"device.capacity['{dra.DRIVER}'].cores == quantity('100')")
    assert check(f"device.driver == '{dra.DRIVER}' && device.allowMultipleAllocations")


def test_an_unknown_domain_is_an_empty_map_so_a_field_of_it_is_a_no_such_key_error() -> None:
    assert check("size(device.attributes['other.example.com']) == 0")
    with pytest.raises(SelectorError, match=r"^CEL runtime error: no such key: model$"):
        check("device.attributes['other.example.com'].model == 'x'")
    assert not check("'other.example.com' in device.attributes")


def test_an_unknown_attribute_of_a_known_domain_is_a_runtime_error() -> None:
    with pytest.raises(SelectorError, match="no such key: pcieBusID"):
        check(f"device.attributes['{dra.DRIVER}'].pcieBusID == 'x'")


def test_quantities_compare_by_value_whatever_their_suffix() -> None:
    mem = f"device.capacity['{dra.DRIVER}'].memory"
    assert check(f"{mem} == quantity('80Gi')")
    assert check(f"{mem} == quantity('81920Mi')")
    assert check(f"{mem}.compareTo(quantity('10Gi')) > 0")
    assert check(f"{mem}.compareTo(quantity('85899345920')) == 0")
    assert check(f"{mem}.isGreaterThan(quantity('79Gi')) && {mem}.isLessThan(quantity('81Gi'))")
    assert check(f"{mem}.asInteger() == 85899345920 && {mem}.isInteger()")
    assert check("quantity('1.5').isInteger() == false && quantity('1500m') == quantity('1.5')")
    assert check(
        "quantity('1Gi').add(quantity('1Gi')) == quantity('2Gi') && quantity('2').sub(1) == quantity('1')"
    )
    assert check("isQuantity('10Gi') && !isQuantity('ten') && quantity('-1').sign() == -1")


def test_a_bad_quantity_literal_is_a_runtime_error() -> None:
    with pytest.raises(SelectorError, match="runtime error"):
        check("quantity('ten') == quantity('1')")


def test_version_attributes_are_semvers_with_kube_precedence() -> None:
    version = f"device.attributes['{dra.DRIVER}'].driverVersion"
    assert check(f"{version}.major() == 550 && {version}.minor() == 54 && {version}.patch() == 15")
    assert check(f"{version}.isGreaterThan(semver('550.0.0')) && {version}.isLessThan(semver('560.1.0'))")
    assert check(f"{version}.compareTo(semver('550.54.15')) == 0 && {version} == semver('550.54.15+build.7')")
    assert check("semver('1.0.0-rc.1').isLessThan(semver('1.0.0'))")
    assert check("semver('1.0.0-alpha.2').isLessThan(semver('1.0.0-alpha.10'))")
    assert check("semver('v1.2', true) == semver('1.2.0') && isSemver('01.2.3', true) && !isSemver('01.2.3')")


def test_an_invalid_version_attribute_fails_the_evaluation_naming_the_attribute() -> None:
    device = gpu_view(driverVersion={"version": "550.54"})
    with pytest.raises(SelectorError, match="attribute driverVersion: parse semantic version"):
        check("true", device)


def test_strings_lists_and_the_extensions_kube_has() -> None:
    product = f"device.attributes['{dra.DRIVER}'].productName"
    assert check(f"{product}.startsWith('NVIDIA-A100') && {product}.endsWith('80GB')")
    assert check(f"{product}.contains('SXM4') && {product}.matches('^NVIDIA-A[0-9]+')")
    assert check(f"{product} in ['NVIDIA-H100', 'NVIDIA-A100-SXM4-80GB']")
    assert check(f"{product}.lowerAscii().split('-')[0] == 'nvidia'")
    assert check(f"device.attributes['{dra.DRIVER}'].uuid != 'GPU-2'")


def test_a_result_that_is_not_a_bool_is_an_error_in_kube_words() -> None:
    with pytest.raises(SelectorError) as err:
        check(f"device.attributes['{dra.DRIVER}'].minor")
    assert str(err.value) == "CEL runtime error: CEL result of type int could not be converted to bool"


def test_a_syntax_error_is_a_compile_error() -> None:
    with pytest.raises(SelectorError, match=r"^CEL compile error: compilation failed: "):
        check("device.attributes[")


def test_the_cache_compiles_each_expression_once() -> None:
    cache = SelectorCache(size=2)
    first = cache.get("true")
    assert cache.get("true") is first
    cache.get("false")
    cache.get("1 == 1")
    assert cache.compiled == 3
    assert cache.get("true") is not first  # evicted, compiled again
    assert cache.compiled == 4


def test_semver_parsing_is_strict_unless_normalized() -> None:
    assert str(parse_semver("1.2.3-rc.1+b")) == "1.2.3-rc.1"
    for bad in ("1.2", "v1.2.3", "01.2.3", "1.2.3-01"):
        with pytest.raises(ValueError, match="invalid semantic version"):
            parse_semver(bad)
    assert str(parse_semver("v1.02", normalize=True)) == "1.2.0"
