"""The epoch a dataset shares with its DataLoader workers, and the saved positions."""

from __future__ import annotations

import copy
import pickle

import pytest

from recordkit.reader.plan import PlanOptions
from recordkit.reader.position import (
    STATE_VERSION,
    EpochCell,
    check_state,
    check_worker,
    pass_key,
    saved_state,
)


def test_the_epoch_advances_when_every_worker_of_the_pass_finished():
    cell = EpochCell(3)
    key = pass_key(base_seed=1234, passes=1, epoch=3)
    cell.finish(0, 3, key, 3)
    cell.finish(2, 3, key, 3)
    assert cell.get() == 3  # worker 1 still reads epoch 3
    cell.finish(1, 3, key, 3)
    assert cell.get() == 4


def test_marks_of_another_pass_do_not_count():
    cell = EpochCell(0)
    old = pass_key(1, 1, 0)
    cell.finish(0, 2, old, 0)  # a pass left early: worker 0 had finished
    new = pass_key(2, 1, 0)
    cell.finish(1, 2, new, 0)
    assert cell.get() == 0  # worker 0 of the new pass has not finished
    cell.finish(0, 2, new, 0)
    assert cell.get() == 1


def test_an_epoch_set_meanwhile_is_kept():
    cell = EpochCell(5)
    key = pass_key(7, 1, 5)
    cell.finish(0, 1, key, 5)
    assert cell.get() == 6
    cell.set(2)  # set_epoch(2) by the training process
    cell.finish(0, 1, key, 5)  # a late mark of the old pass
    assert cell.get() == 2


def test_pass_keys_differ_per_pass_and_are_never_zero():
    keys = {pass_key(s, p, e) for s in range(20) for p in range(1, 4) for e in range(3)}
    assert len(keys) == 180 and 0 not in keys
    assert all(0 < k < 2**63 for k in keys)


def test_a_copy_outside_a_worker_start_gets_a_cell_of_its_own():
    cell = EpochCell(4)
    for twin in (copy.deepcopy(cell), pickle.loads(pickle.dumps(cell))):
        assert twin.get() == 4
        twin.set(9)
        assert cell.get() == 4


def test_saved_state_and_its_checks():
    options = PlanOptions(shuffle=True, seed=3, batch_size=8)
    state = saved_state(
        epoch=2,
        consumed=None,
        worker={"id": 1, "num_workers": 2, "next": 9},
        options=options,
        world_size=2,
        fingerprint="abc",
        shard_paths=None,
    )
    assert state["version"] == STATE_VERSION and state["global_batch"] == 16
    check_state(state, dict(state), ("seed", "global_batch"))
    with pytest.raises(ValueError, match="seed was 3 when saved, is 4 now"):
        check_state(state, {**state, "seed": 4}, ("seed",))
    with pytest.raises(ValueError, match="older version"):
        check_state({**state, "version": 1}, state, ())
    check_worker(state["worker"], (1, 2))
    with pytest.raises(ValueError, match="loaded into worker 0 of 2"):
        check_worker(state["worker"], (0, 2))
    with pytest.raises(ValueError, match="resumes only in that worker"):
        check_worker(state["worker"], None)
