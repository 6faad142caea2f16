"""The limits model's refusals (model/limits.py): each malformed limits entry is refused
with a ConfigError naming its path, value and reason, as the engine's parser refuses it
(INV-LIM-7: a configuration is parsed whole or not at all), and an operation the model
cannot make (a job enqueued twice, a poll by a dead worker) raises PreconditionError.
Also a batch claim's stop at the stamp its last spend wrote [INV-LIM-5, INV-LIM-6]."""

from __future__ import annotations

import pytest

from model.errors import ConfigError, PreconditionError
from model.limits import (
    LimitsModel,
    parse_key_limits,
    parse_limits,
    parse_rate_entries,
    partition_key,
    render_period,
)


def partition_key_of(family):
    """``partition_key`` of ``family``, of the value it is given."""
    return lambda value: partition_key(family, value)


@pytest.mark.parametrize(("parse", "value", "message"), [
    (render_period, 0, "seconds=0: a period must be a whole number of seconds >= 1"),
    (parse_rate_entries, [], "rate=[]: must be one {limit, per, burst} mapping or a non-empty list"),
    (parse_rate_entries, "1/s", "rate='1/s': must be one {limit, per, burst} mapping or a non-empty list"),
    (parse_rate_entries, [5], "rate[0]=5: must be a mapping with limit and per"),
    (parse_rate_entries, {"limit": 1, "per": 1, "every": 2},
     "rate[0]={'limit': 1, 'per': 1, 'every': 2}: unknown fields ['every']"),
    (parse_rate_entries, {"limit": 1}, "rate[0]={'limit': 1}: limit and per are required"),
    (parse_key_limits, 3, "limits=3: must be a mapping with concurrency and/or rate"),
    (parse_key_limits, {"concurrency": 1, "burst": 2},
     "limits={'concurrency': 1, 'burst': 2}: unknown fields ['burst']"),
    (parse_key_limits, {}, "limits={}: declares neither concurrency nor rate"),
    (parse_limits, {" ": {"concurrency": 1}}, "limits=' ': a limit key must be a non-blank string"),
    # key families (semantics §5.1, model only: issue 34): the entry's own path, under limits.<family>
    (parse_limits, {"v": {"per_partition": {"concurrency": 2}, "rate": {"limit": 1, "per": 1}}},
     "limits.v.rate={'limit': 1, 'per': 1}: a rate over a whole family is not supported: "
     "give each partition its rate under per_partition"),
    (parse_limits, {"v": {"per_partition": {"concurrency": 2}, "burst": 1}},
     "limits.v={'per_partition': {'concurrency': 2}, 'burst': 1}: unknown fields ['burst']"),
    (parse_limits, {"v": {"per_partition": {"concurrency": 2}, "concurrency": 0}},
     "limits.v.concurrency=0: must be an integer >= 1"),
    (parse_limits, {"v[": {"per_partition": {"concurrency": 1}}},
     "limits.v[='v[': a key family must be a non-blank string without '['"),
    (parse_limits, {"v": {"per_partition": {"concurrency": 1}}, 'v["a"]': {"concurrency": 1}},
     "limits='v[\"a\"]': a static key may not be a partition of family 'v'"),
    (parse_limits, {"k ": {"concurrency": 1}}, "limits='k ': a limit key may not have whitespace around it"),
    (parse_limits, {"\tk": {"per_partition": {"concurrency": 1}}},
     "limits='\\tk': a limit key may not have whitespace around it"),
    (partition_key_of("k\xa0"), 1, "limit_by='k\\xa0': a key family may not have whitespace around it"),
])
def test_a_malformed_limits_entry_is_refused_naming_its_path(parse, value, message):
    with pytest.raises(ConfigError) as refused:
        parse(value)
    assert str(refused.value) == message


@pytest.mark.parametrize(("family", "value", "message"), [
    ("v[", 1, "limit_by='v[': a key family must be a non-blank string without '['"),
    (" ", 1, "limit_by=' ': a key family must be a non-blank string without '['"),
    (7, 1, "limit_by=7: a key family must be a non-blank string without '['"),
    ("v", True, "limit_by=True: a partition value must be a string or an integer"),
    ("v", None, "limit_by=None: a partition value must be a string or an integer"),
    ("v", "\ud800", "limit_by='\\ud800': a partition value must be valid Unicode (no lone surrogate)"),
    ("v", "x" * 251, f"limit_by='{'x' * 251}': the rendered key has 256 characters, more than 255"),
])
def test_a_partition_that_cannot_be_rendered_or_stored_is_refused_naming_limit_by(family, value, message):
    """A family that is blank, not a string or holds a '[', a value of another type, with a
    lone surrogate or rendering past the 255 characters a key column holds: each refused
    under ``limit_by`` (the option that names the partition), with its value and reason."""
    with pytest.raises(ConfigError) as refused:
        partition_key(family, value)
    assert str(refused.value) == message


def test_a_job_enqueued_twice_and_a_dead_workers_poll_are_refused():
    model = LimitsModel({"k": {"concurrency": 1}})
    model.enqueue(1, "k", 0)
    with pytest.raises(PreconditionError, match=r"^job 1 already exists$"):
        model.enqueue(1, None, 0)
    assert model.claim("w", 0) == 1
    assert [(c.job_id, c.key, c.worker, c.at_us) for c in model.claims] == [(1, "k", "w", 0)]
    model.crash_worker("w", 0)
    with pytest.raises(PreconditionError, match=r"^worker 'w' is dead and cannot poll$"):
        model.claim("w", 0)


def test_a_keyed_batch_stops_at_the_stamp_its_last_spend_wrote():
    """Three jobs of k (2 a second, burst 2): at 1 s its bucket holds two tokens, so a
    batch of up to 3 claims two; the second spend left the bucket short and stamped k, so
    the third poll is not made (no trace of it) [INV-LIM-5, INV-LIM-6]."""
    model = LimitsModel({"k": {"rate": {"limit": 2, "per": 1, "burst": 2}}})
    for job in (1, 2, 3):
        model.enqueue(job, "k", 0)
    assert model.claim_batch("w", 0, limit=3, keyed_limit=3) == []  # the bucket is created empty
    polls = len(model.polls)
    assert model.claim_batch("w", 1_000_000, limit=3, keyed_limit=3) == [1, 2]
    assert len(model.polls) == polls + 2
    assert model.stamps["k"] == 1_500_000
    assert model.jobs[3].state == "pending"
