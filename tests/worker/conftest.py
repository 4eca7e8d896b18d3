"""Fixtures of the Ray cluster tests."""
import pytest

from tests.worker._ray import start_ray


@pytest.fixture(scope="module")
def ray_module():
    """A local Ray cluster for the test module that asks for it (:func:`~tests.worker._ray.start_ray`), shut down
    after the module's last test."""
    ray = start_ray()
    yield ray
    ray.shutdown()
