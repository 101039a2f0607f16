"""An MLflow run id's shape (``services.run_ids``), checked before any import or tracking server is asked.

``uedp generate``, ``uedp attack`` and ``uedp report --parent`` take run ids; a mistyped one is refused in
a fraction of a second, naming the value, instead of after MLflow has started and searched its store.
"""

from __future__ import annotations

import uuid

import pytest

from uedp.errors import UedpError
from uedp.services.run_ids import RUN_ID_SHAPE, is_run_id, not_a_run_id, require_run_ids


def test_mlflows_own_ids_have_the_shape() -> None:
    assert all(is_run_id(uuid.uuid4().hex) for _ in range(20))


@pytest.mark.parametrize("text", ["", "nope", "a" * 31, "a" * 33, "A" * 32, "g" * 32, f" {'a' * 32}",
                                  f"{'a' * 32}\n", "4b3f4636-4fca-4027-b763-8082ed85d9b7"])  # a uuid with its dashes
def test_anything_else_is_not_a_run_id(text: str) -> None:
    assert not is_run_id(text)


def test_the_first_bad_value_is_named_and_missing_ones_are_skipped() -> None:
    good = uuid.uuid4().hex
    require_run_ids(None, good, None)  # nothing raised: every given value is an id
    with pytest.raises(UedpError) as raised:
        require_run_ids(good, None, "dpsgd-eps8-s0", "also-bad")
    assert str(raised.value) == not_a_run_id("dpsgd-eps8-s0") == f"'dpsgd-eps8-s0' is not an MLflow run id ({RUN_ID_SHAPE})"
