"""check_int: the one integer validator every entry point uses."""

import numpy as np
import pytest

from loaderlib._checks import check_int


def test_accepts_python_and_numpy_integers():
    assert check_int(3, "n") == 3
    assert type(check_int(np.int64(7), "n")) is int
    assert check_int(None, "n", allow_none=True) is None


@pytest.mark.parametrize("value", [True, 1.0, "2", None])
def test_rejects_non_integers(value):
    with pytest.raises(ValueError, match=r"n must be a non-negative integer, got"):
        check_int(value, "n")


def test_bounds_are_named():
    with pytest.raises(ValueError, match=r"batch_size must be a positive integer, got 0"):
        check_int(0, "batch_size", minimum=1)
    with pytest.raises(ValueError, match=r"k must be an integer >= 2, got 1"):
        check_int(1, "k", minimum=2)
    with pytest.raises(ValueError, match=r"k must be a positive integer <= 4, got 5"):
        check_int(5, "k", minimum=1, maximum=4)
