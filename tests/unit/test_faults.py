"""The fault-checkpoint switch's refusals (ductwork/faults.py): a malformed
``DUCTWORK_FAULT`` names its bad part, disarming one checkpoint leaves the others armed,
and a ``wait`` fault without its release file raises instead of hanging."""

from __future__ import annotations

import pytest

from ductwork import faults
from ductwork.errors import FaultInjection

POINT = faults.CHECKPOINTS[0]


@pytest.fixture(autouse=True)
def _disarmed():  # type: ignore[no-untyped-def]
    faults.disarm()
    yield
    faults.disarm()


@pytest.mark.parametrize(("spec", "message"), [
    (f"{POINT}", "is not name:action"),
    ("no_such_point:raise", "unknown checkpoint 'no_such_point'"),
    (f"{POINT}:explode", "unknown action 'explode'"),
])
def test_a_malformed_spec_names_its_bad_part(spec, message):
    with pytest.raises(ValueError, match=message):
        faults.parse(spec)


def test_disarming_one_checkpoint_leaves_the_others_armed():
    other = faults.CHECKPOINTS[1]
    faults.arm(POINT, "raise")
    faults.arm(other, "raise")
    faults.disarm(POINT)
    faults.hit(POINT)
    with pytest.raises(FaultInjection):
        faults.hit(other)
    assert (faults.fired(POINT), faults.fired(other)) == (0, 1)


def test_a_wait_without_its_release_file_raises(monkeypatch, tmp_path):
    faults.arm(POINT, "wait")
    monkeypatch.delenv("DUCTWORK_FAULT_RELEASE", raising=False)
    with pytest.raises(FaultInjection, match="wait armed without DUCTWORK_FAULT_RELEASE"):
        faults.hit(POINT)
    monkeypatch.setenv("DUCTWORK_FAULT_RELEASE", str(tmp_path / "never"))
    monkeypatch.setenv("DUCTWORK_FAULT_WAIT_MAX", "-1")  # the deadline has passed already
    with pytest.raises(FaultInjection, match="never appeared"):
        faults.hit(POINT)
