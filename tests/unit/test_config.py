"""Loading ``ductwork.yml``: defaults, ``0`` honoured, environments and merge keys (the
seed's example verbatim), unknown keys, and hostile documents.

Checks: INV-LIM-7 (limits are validated at boot: a bad entry anywhere in the file fails
the load with a ConfigError naming its path), INV-EXE-4 (retry and crash budgets,
including 0 and per-pipeline/per-step overrides, are read as written).
"""

from __future__ import annotations

import dataclasses
import re
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from ductwork.config import (
    Config,
    JobWorkerConfig,
    PipelineAdvancerConfig,
    SupervisorConfig,
)
from ductwork.config_file import config_from_mapping, load_config
from ductwork.errors import ConfigError, DuplicatePeriodError, EmptyLimitError, InvalidPeriodError
from ductwork.limit_entries import LimitEntry, RateEntry

NO_ENV: dict[str, str] = {}

SEED_YAML = """\
default: &default
  job_worker:
    limits:
      vendor_api:
        concurrency: 5
        rate:
          - limit: 1
            per: 1s
          - limit: 2000
            per: 1h
            burst: 50
      report_export:
        concurrency: 2
      bulk_import:
        rate:
          limit: 100
          per: 1m

production:
  <<: *default

staging:
  <<: *default
  job_worker:
    limits:
      vendor_api:
        concurrency: 1
"""


def section(**settings) -> Config:
    return config_from_mapping({"default": settings}, environ=NO_ENV)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "ductwork.yml"
    path.write_text(text)
    return path


# ---------------------------------------------------------------- defaults and 0


def test_defaults():
    config = Config()
    from_none = config_from_mapping(None, environ=NO_ENV)
    assert from_none == dataclasses.replace(config, source="<mapping>")
    assert (config.env, config.role, config.database_url, config.pipelines, config.limits) == (
        "default", "all", None, (), {})
    jw = config.job_worker
    assert (jw.count, jw.processes, jw.max_retry, jw.max_crash) == (5, 1, 3, 10)
    assert (jw.polling_timeout, jw.shutdown_timeout, jw.retry_delay) == (1.0, 20.0, 10.0)
    pa = config.pipeline_advancer
    assert (pa.count, pa.max_retry, pa.max_crash, pa.expand_batch) == (3, 10, 10, 1000)
    assert (pa.polling_timeout, pa.shutdown_timeout) == (1.0, 20.0)
    sv = config.supervisor
    assert (sv.polling_timeout, sv.reaper_timeout, sv.shutdown_timeout,
            sv.heartbeat_interval) == (1.0, 300.0, 30.0, 5.0)
    assert (sv.forget_idle_after, sv.forget_batch) == (3600.0, 100)


def test_no_file_means_defaults(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = load_config(environ={"DUCTWORK_ENV": "production"})
    assert config.env == "production"
    assert config.job_worker == JobWorkerConfig()


def test_default_file_in_cwd_is_read(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "default:\n  job_worker:\n    count: 2\n")
    assert load_config(environ=NO_ENV).job_worker.count == 2


def test_explicit_missing_file_raises(tmp_path):
    with pytest.raises(ConfigError, match="no such file") as info:
        load_config(tmp_path / "nope.yml", environ=NO_ENV)
    assert info.value.path.endswith("nope.yml")


def test_zero_is_a_value_not_unset():
    config = section(
        job_worker={"max_retry": 0, "max_crash": 0},
        pipeline_advancer={"max_retry": 0, "max_crash": 0},
    )
    assert (config.job_worker.max_retry, config.job_worker.max_crash) == (0, 0)
    assert (config.pipeline_advancer.max_retry, config.pipeline_advancer.max_crash) == (0, 0)
    assert config.job_worker.max_retry_for("a:P", "a:S") == 0


@pytest.mark.parametrize(
    ("settings", "path"),
    [
        ({"job_worker": {"count": 0}}, "job_worker.count"),
        ({"job_worker": {"processes": 0}}, "job_worker.processes"),
        ({"pipeline_advancer": {"expand_batch": 0}}, "pipeline_advancer.expand_batch"),
        ({"job_worker": {"max_retry": -1}}, "job_worker.max_retry"),
        ({"job_worker": {"count": None}}, "job_worker.count"),
        ({"job_worker": {"count": "5"}}, "job_worker.count"),
        ({"job_worker": {"count": 2**40}}, "job_worker.count"),
        ({"job_worker": {"polling_timeout": 0}}, "job_worker.polling_timeout"),
        ({"job_worker": {"polling_timeout": "1mo"}}, "job_worker.polling_timeout"),
        ({"job_worker": {"polling_timeout": 1e305}}, "job_worker.polling_timeout"),
        ({"job_worker": {"polling_timeout": "9" * 5000}}, "job_worker.polling_timeout"),
        ({"supervisor": {"reaper_timeout": 10**12}}, "supervisor.reaper_timeout"),
        ({"supervisor": {"heartbeat_interval": True}}, "supervisor.heartbeat_interval"),
        ({"supervisor": {"forget_idle_after": 0}}, "supervisor.forget_idle_after"),
        ({"supervisor": {"forget_idle_after": "1mo"}}, "supervisor.forget_idle_after"),
        ({"supervisor": {"forget_batch": 0}}, "supervisor.forget_batch"),
        ({"supervisor": {"forget_batch": "100"}}, "supervisor.forget_batch"),
        ({"role": "boss"}, "role"),
        ({"role": None}, "role"),
        ({"pipelines": ["SyncOrders"]}, "pipelines[0]"),
        ({"pipelines": [5]}, "pipelines[0]"),
        ({"pipeline_advancer": {"inline_linear": "yes"}}, "pipeline_advancer.inline_linear"),
        ({"job_worker": {"hand_off": 1}}, "job_worker.hand_off"),
        ({"pipelines": ["*", "a:B"]}, "pipelines"),
        ({"pipelines": {"a": "b"}}, "pipelines"),
        ({"imports": ["not a module"]}, "imports[0]"),
        ({"database": {"url": ""}}, "database.url"),
        ({"database": "sqlite://"}, "database"),
        ({"job_worker": {"max_retry": {"default": -1}}}, "job_worker.max_retry.default"),
        ({"job_worker": {"max_retry": {"Sync": {"Push": "x"}}}}, "job_worker.max_retry.Sync.Push"),
        ({"job_worker": {"max_crash": {"not a name": 1}}}, "job_worker.max_crash.not a name"),
        ({"job_worker": {"max_crash": {"Sync": {"Push": {"x": 1}}}}},
         "job_worker.max_crash.Sync.Push"),
    ],
)
def test_bad_values_name_the_path(settings, path):
    with pytest.raises(ConfigError) as info:
        config_from_mapping({"default": settings}, environ=NO_ENV)
    assert info.value.path == path


def test_time_values_are_float_seconds():
    config = section(job_worker={"polling_timeout": 0.25, "shutdown_timeout": "1m",
                                 "retry_delay": 3},
                     supervisor={"reaper_timeout": "1h30m"})
    assert config.job_worker.polling_timeout == 0.25
    assert config.job_worker.shutdown_timeout == 60.0
    assert config.job_worker.retry_delay == 3.0
    assert config.supervisor.reaper_timeout == 5400.0


def test_the_sweep_of_idle_partitions_is_configured():
    supervisor = section(supervisor={"forget_idle_after": "10m", "forget_batch": 1}).supervisor
    assert (supervisor.forget_idle_after, supervisor.forget_batch) == (600.0, 1)
    assert section(supervisor={"forget_idle_after": 0.5}).supervisor.forget_idle_after == 0.5


@pytest.mark.parametrize(("key", "value", "message"), [
    ("forget_idle_after", 0, "supervisor.forget_idle_after=0: must be positive"),
    ("forget_idle_after", -60, "supervisor.forget_idle_after=-60: must be positive"),
    ("forget_idle_after", "an hour", "supervisor.forget_idle_after='an hour': expected whole seconds or <int><unit> "
                                     "groups in the order w d h m s (e.g. '90', '1m', '1h30m')"),
    ("forget_idle_after", True, "supervisor.forget_idle_after=True: expected seconds, a timedelta or a duration "
                                "string, got bool"),
    ("forget_idle_after", None, "supervisor.forget_idle_after=None: expected seconds, a timedelta or a duration "
                                "string, got NoneType"),
    ("forget_idle_after", 10**12, "supervisor.forget_idle_after=1000000000000: must be at most 100 years"),
    ("forget_batch", 0, "supervisor.forget_batch=0: must be at least 1"),
    ("forget_batch", -5, "supervisor.forget_batch=-5: must be at least 1"),
    ("forget_batch", 1.5, "supervisor.forget_batch=1.5: expected an integer >= 1, got float"),
    ("forget_batch", "100", "supervisor.forget_batch='100': expected an integer >= 1, got str"),
    ("forget_batch", True, "supervisor.forget_batch=True: expected an integer >= 1, got bool"),
    ("forget_batch", None, "supervisor.forget_batch=None: expected an integer >= 1, got NoneType"),
    ("forget_batch", 2**31, "supervisor.forget_batch=2147483648: must be at most 2147483647"),
])
def test_bad_sweep_settings_name_the_setting_and_the_value(key, value, message):
    with pytest.raises(ConfigError) as info:
        section(supervisor={key: value})
    assert (info.value.path, str(info.value)) == (f"supervisor.{key}", message)


def test_pipelines_and_imports():
    assert section(pipelines="*", imports=["app.pipelines"]).pipelines == ("*",)
    config = section(pipelines=["app.pipelines:SyncOrders", "app.other:Outer.Inner"])
    assert config.pipelines == ("app.pipelines:SyncOrders", "app.other:Outer.Inner")
    assert section(imports=["app.pipelines", "app.more"]).imports == ("app.pipelines", "app.more")


def test_database_url():
    assert section(database={"url": "sqlite:///x.db"}).database_url == "sqlite:///x.db"


# ---------------------------------------------------------------- max_retry / max_crash


def test_nested_budgets_match_full_and_bare_names():
    jw = section(job_worker={
        "max_retry": {"default": 2, "SyncOrders": {"default": 5, "PushOrder": 0},
                      "app.b:Other": 7},
        "max_crash": {"Outer.Inner": 1},
    }).job_worker
    assert jw.max_retry == 2
    assert jw.max_retry_for("app.p:SyncOrders", "app.s:PushOrder") == 0
    assert jw.max_retry_for("app.p:SyncOrders", "app.s:Other") == 5
    assert jw.max_retry_for("app.b:Other", "x:Y") == 7
    assert jw.max_retry_for("app.c:Other", "x:Y") == 2
    assert jw.max_crash_for("m:Outer.Inner", "x:Y") == 1
    assert jw.max_crash_for("m:Inner", "x:Y") == 10


def test_nested_budget_without_default_keeps_builtin():
    jw = section(job_worker={"max_retry": {"Sync": 1}}).job_worker
    assert (jw.max_retry, jw.max_retry_for("a:Sync", "a:S"), jw.max_retry_for("a:X", "a:S")) == (
        3, 1, 3)
    # a pipeline's own steps without a default: its other steps keep the section's
    jw = section(job_worker={"max_retry": {"default": 2, "Sync": {"Push": 1}}}).job_worker
    assert (jw.max_retry_for("a:Sync", "a:Push"), jw.max_retry_for("a:Sync", "a:Pull")) == (1, 2)


# ---------------------------------------------------------------- environments


def test_seed_example_environments(tmp_path):
    path = write(tmp_path, SEED_YAML)
    default = load_config(path, "default", environ=NO_ENV)
    assert default.limits["vendor_api"] == LimitEntry(
        "vendor_api", 5, (RateEntry(1, 1, 1), RateEntry(2000, 3600, 50)))
    assert default.limits["report_export"] == LimitEntry("report_export", 2, ())
    assert default.limits["bulk_import"].rates == (RateEntry(100, 60, 1),)
    production = load_config(path, "production", environ=NO_ENV)
    assert production.limits == default.limits
    assert production.env == "production"
    # `<<` is shallow: staging's job_worker replaces default's, so only vendor_api remains
    staging = load_config(path, "staging", environ=NO_ENV)
    assert staging.limits == {"vendor_api": LimitEntry("vendor_api", 1, ())}
    assert staging.source == str(path)


def test_env_from_environment_variable(tmp_path):
    path = write(tmp_path, SEED_YAML)
    assert load_config(path, environ={"DUCTWORK_ENV": "staging"}).env == "staging"
    assert load_config(path, environ={"DUCTWORK_ENV": ""}).env == "default"
    assert load_config(path, "production", environ={"DUCTWORK_ENV": "staging"}).env == "production"


def test_missing_environment_names_it_and_the_defined_ones(tmp_path):
    path = write(tmp_path, SEED_YAML)
    with pytest.raises(ConfigError) as info:
        load_config(path, "qa", environ=NO_ENV)
    message = str(info.value)
    assert "'qa'" in message
    assert "default, production, staging" in message
    assert info.value.path == str(path)


def test_settings_without_environment_level_get_a_hint():
    with pytest.raises(ConfigError, match="under an environment name"):
        config_from_mapping({"job_worker": {"count": 1}}, environ=NO_ENV)


def test_role_override_from_environment():
    doc = {"default": {"role": "worker"}}
    assert config_from_mapping(doc, environ=NO_ENV).role == "worker"
    assert config_from_mapping(doc, environ={"DUCTWORK_ROLE": "advancer"}).role == "advancer"
    with pytest.raises(ConfigError) as info:
        config_from_mapping(doc, environ={"DUCTWORK_ROLE": "boss"})
    assert info.value.path == "DUCTWORK_ROLE"


def test_from_section_and_variants():
    config = Config.from_section({"job_worker": {"count": 2}}, environ=NO_ENV)
    assert config.job_worker.count == 2
    limits = {"k": LimitEntry("k", 1, ())}
    assert config.with_limits(limits).limits == limits
    assert config.limits == {}
    assert dataclasses.replace(config, role="worker").role == "worker"
    assert Config.from_section(None, environ=NO_ENV).job_worker == JobWorkerConfig()
    assert (PipelineAdvancerConfig(), SupervisorConfig()) == (
        config.pipeline_advancer, config.supervisor)


def test_null_sections_are_empty():
    config = config_from_mapping({"default": {"job_worker": None, "supervisor": None}},
                                 environ=NO_ENV)
    assert config.job_worker == JobWorkerConfig()
    assert config.limits == {}
    assert config_from_mapping({"default": None}, environ=NO_ENV).role == "all"


# ---------------------------------------------------------------- unknown keys, YAML errors


@pytest.mark.parametrize(
    ("settings", "path"),
    [
        ({"pipeline": ["a:B"]}, "pipeline"),
        ({"job_worker": {"cuont": 1}}, "job_worker.cuont"),
        ({"pipeline_advancer": {"limits": {}}}, "pipeline_advancer.limits"),
        ({"supervisor": {"reaper": 1}}, "supervisor.reaper"),
        ({"database": {"uri": "x"}}, "database.uri"),
        ({"job_worker": {"limits": {"api": {"concurency": 1}}}},
         "job_worker.limits.api.concurency"),
        ({"ünïcode": 1}, "ünïcode"),
        ({7: 1}, "[7]"),
    ],
)
def test_unknown_keys_fail_listing_valid_ones(settings, path):
    with pytest.raises(ConfigError, match="unknown key; valid keys: ") as info:
        config_from_mapping({"default": settings}, environ=NO_ENV)
    assert info.value.path == path


@pytest.mark.parametrize(
    ("limits", "error"),
    [
        ({"api": {}}, EmptyLimitError),
        ({"api": {"rate": [{"limit": 1, "per": 1}, {"limit": 2, "per": "1s"}]}},
         DuplicatePeriodError),
        ({"api": {"rate": {"limit": 1, "per": "1y"}}}, InvalidPeriodError),
    ],
)
def test_limit_errors_surface_through_config(limits, error):
    with pytest.raises(error) as info:
        section(job_worker={"limits": limits})
    assert info.value.path.startswith("job_worker.limits.api")


@pytest.mark.parametrize(
    ("document", "says"),
    [
        pytest.param("default:\n  job_worker:\n    count: 1\n   bad: [2\n", r"line 4", id="syntax error"),
        pytest.param("default:\n  job_worker:\n    count: 2020-02-30\n", r"line 3, column 12: invalid .*timestamp",
                     id="bad value"),
        pytest.param("default:\n  role: \x07\n", r"invalid YAML: unacceptable character #x0007",
                     id="control character"),
    ],
)
def test_invalid_yaml_is_a_config_error_naming_the_file_and_where(tmp_path, document, says):
    path = write(tmp_path, document)
    with pytest.raises(ConfigError, match=says) as info:
        load_config(path, environ=NO_ENV)
    assert info.value.path == str(path)


def test_a_key_that_cannot_be_built_names_its_line_and_why(tmp_path):
    """The duplicate-key check builds each key first; one that fails is reported by the
    document's construction with its own error (not as a "recursive node")."""
    path = write(tmp_path, "default:\n  job_worker:\n    !!int many: 1\n")
    with pytest.raises(ConfigError) as info:
        load_config(path, environ=NO_ENV)
    assert str(info.value).endswith("invalid YAML at line 3, column 5: invalid tag:yaml.org,2002:int value: "
                                    "invalid literal for int() with base 10: 'many'"), info.value
    assert info.value.path == str(path)


def test_unreadable_file_is_a_config_error(tmp_path):
    path = tmp_path / "ductwork.yml"
    path.write_bytes(b"default:\n  role: \xff\xfe\n")
    with pytest.raises(ConfigError):
        load_config(path, environ=NO_ENV)
    with pytest.raises(ConfigError):
        load_config(tmp_path, environ=NO_ENV)


# ---------------------------------------------------------------- hostile documents

KNOWN_KEYS = [
    "default", "pipelines", "imports", "role", "database", "url", "job_worker", "pipeline_advancer",
    "supervisor", "count", "processes", "max_retry", "max_crash", "polling_timeout",
    "shutdown_timeout", "retry_delay", "expand_batch", "reaper_timeout", "heartbeat_interval",
    "forget_idle_after", "forget_batch",
    "limits", "vendor_api", "concurrency", "rate", "limit", "per", "burst", "SyncOrders", "*",
]
scalars = (
    st.none() | st.booleans() | st.integers() | st.integers(-(2**70), 2**70) | st.floats()
    | st.text(max_size=8) | st.sampled_from(["1s", "1h30m", "1mo", "0", "all", "a:B", "*",
                                            "9" * 5000, "-5s", "1.5h"])
)
keys = st.sampled_from(KNOWN_KEYS) | st.text(max_size=6) | st.integers(-3, 3) | st.none()
trees = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=5),
    max_leaves=30,
)


def shaped(schema):
    """Documents with the right skeleton and hostile leaves, so deep checks are reached."""
    if isinstance(schema, dict):
        return st.fixed_dictionaries({}, optional={k: shaped(v) | trees for k, v in schema.items()})
    if isinstance(schema, list):
        return st.lists(shaped(schema[0]), max_size=3) | shaped(schema[0])
    if isinstance(schema, tuple):  # a mapping with free keys
        names = keys | st.sampled_from(["api", "SyncOrders", "a:B", "api ", " api", "api\t", "a[b", "a[1] "])
        return st.dictionaries(names, shaped(schema[0]), max_size=3)
    return st.integers(0, 5) | st.sampled_from(["1s", "1m", "all", "a:B", "x.y", "*"]) | scalars


RATE = {"limit": None, "per": None, "burst": None}
LIMITS = ({"concurrency": None, "rate": [RATE]},)
SECTION = {
    "pipelines": [None], "imports": [None], "role": None, "database": {"url": None},
    "job_worker": {"count": None, "processes": None, "polling_timeout": None, "retry_delay": None,
                   "max_retry": ((None,),), "max_crash": ((None,),),
                   "limits": LIMITS},
    "pipeline_advancer": {"count": None, "max_retry": None, "expand_batch": None},
    "supervisor": {"reaper_timeout": None, "heartbeat_interval": None, "forget_idle_after": None,
                   "forget_batch": None},
}
documents = (
    trees
    | st.fixed_dictionaries({"default": shaped(SECTION)})
    | st.fixed_dictionaries({"default": shaped({"job_worker": {"limits": LIMITS}})})
) | st.dictionaries(st.sampled_from(["default", "production"]) | keys, trees,
                                    max_size=3)


def _valid_or_config_error(load):
    try:
        config = load()
    except ConfigError as exc:  # either outcome is right; an error must name its path
        assert isinstance(exc.path, str)  # noqa: PT017
        assert exc.path  # noqa: PT017
    else:
        assert isinstance(config, Config)


@given(documents)
def test_hostile_documents_raise_only_config_errors(doc):
    _valid_or_config_error(lambda: config_from_mapping(doc, environ=NO_ENV))


@given(trees)
def test_hostile_sections_raise_only_config_errors(section_doc):
    _valid_or_config_error(lambda: Config.from_section(section_doc, environ=NO_ENV))


yaml_texts = st.text(st.sampled_from(list("default:job_worker limits\n -[]{}&*<>!|'\"#%@`,?1s\t")),
                     max_size=80)


bad_scalars = st.sampled_from([
    "default:\n  role: 2020-02-30\n", "default:\n  role: !!int x\n", "a: " + "9" * 5000,
    "a: !!binary '@@@'\n", "a: !!python/object:os.system x\n", "[" * 5000, "a: &x [*x]\n",
])


@given(yaml_texts | bad_scalars | documents.map(lambda d: yaml.safe_dump(d, allow_unicode=True)))
def test_hostile_yaml_files_raise_only_config_errors(text):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "ductwork.yml"
        path.write_text(text, encoding="utf-8")
        _valid_or_config_error(lambda: load_config(path, environ=NO_ENV))


def test_a_lease_that_cannot_hold_is_rejected():
    """reaper_timeout = 3 x heartbeat_interval leaves a lease of one interval, which every
    runner outlives before its next heartbeat lands: 4 x (a lease of two) is the least."""
    from ductwork.config import Config
    from ductwork.errors import ConfigError
    from ductwork.fleet.supervisor import lease_margin

    with pytest.raises(ConfigError, match=r"supervisor.reaper_timeout=6.0: must be at least 4 x "
                                          r"supervisor.heartbeat_interval \(2.0\)"):
        Config.from_section({"supervisor": {"reaper_timeout": 6, "heartbeat_interval": 2}})
    supervisor = Config.from_section({"supervisor": {"reaper_timeout": 8, "heartbeat_interval": 2}}).supervisor
    lease = supervisor.reaper_timeout - lease_margin(supervisor.reaper_timeout, supervisor.heartbeat_interval)
    assert lease == 2 * supervisor.heartbeat_interval


@pytest.mark.parametrize(("reaper_timeout", "heartbeat_interval"), [
    (300, 5.0), (50, 5.0), (30, 3.0), (10, 1.0), (3, 0.3), ("1h", 5.0),
])
def test_heartbeat_interval_is_derived_when_only_reaper_timeout_is_set(reaper_timeout, heartbeat_interval):
    from ductwork.config import Config
    from ductwork.fleet.supervisor import lease_margin

    supervisor = Config.from_section({"supervisor": {"reaper_timeout": reaper_timeout}}).supervisor
    assert supervisor.heartbeat_interval == pytest.approx(heartbeat_interval)
    lease = supervisor.reaper_timeout - lease_margin(supervisor.reaper_timeout, supervisor.heartbeat_interval)
    assert lease >= 8 * supervisor.heartbeat_interval - 1e-9  # several heartbeats may be missed


def test_an_explicit_heartbeat_interval_is_kept_and_checked():
    from ductwork.config import Config
    from ductwork.errors import ConfigError

    assert Config.from_section({"supervisor": {"reaper_timeout": 10, "heartbeat_interval": 2.5}}
                               ).supervisor.heartbeat_interval == 2.5
    assert Config.from_section({"supervisor": {"heartbeat_interval": 1}}).supervisor.reaper_timeout == 300
    with pytest.raises(ConfigError, match=r"supervisor.reaper_timeout=300.0: must be at least 4 x"):
        Config.from_section({"supervisor": {"heartbeat_interval": 100}})


# --------------------------------------------------------------------------- what a new adopter hit


def test_a_duplicated_key_is_rejected_naming_its_path_and_both_lines(tmp_path):
    from ductwork.errors import DuplicateKeyError

    path = write(tmp_path, "default:\n  job_worker:\n    count: 2\n  role: all\n  job_worker:\n    max_retry: 0\n")
    with pytest.raises(DuplicateKeyError) as info:
        load_config(path, environ=NO_ENV)
    assert str(info.value) == (f"{path}: default.job_worker: key 'job_worker' appears twice, at lines 2 and 5 "
                               "(YAML keeps only the last; merge the two)")
    assert isinstance(info.value, ConfigError)
    assert info.value.path == "default.job_worker"


@pytest.mark.parametrize(("text", "where"), [
    ("default:\n  job_worker:\n    limits:\n      api: {concurrency: 1}\n      api: {concurrency: 2}\n",
     "default.job_worker.limits.api: key 'api' appears twice, at lines 4 and 5"),
    ("default: {}\ndefault: {role: worker}\n", "default: key 'default' appears twice, at lines 1 and 2"),
    ("default:\n  job_worker:\n    limits:\n      api:\n        rate:\n          - {limit: 1, per: 1s, per: 2s}\n",
     "default.job_worker.limits.api.rate[0].per: key 'per' appears twice, at lines 6 and 6"),
    ("default:\n  job_worker:\n    max_retry:\n      1: 2\n      1: 3\n", "default.job_worker.max_retry[1]: key 1"),
])
def test_duplicate_keys_are_found_at_any_depth(tmp_path, text, where):
    from ductwork.errors import DuplicateKeyError

    with pytest.raises(DuplicateKeyError, match=re.escape(where)):
        load_config(write(tmp_path, text), environ=NO_ENV)


def test_a_key_overriding_a_merge_is_not_a_duplicate(tmp_path):
    path = write(tmp_path, "default: &d\n  job_worker: {count: 2}\n  role: worker\n"
                           "staging:\n  <<: *d\n  job_worker: {count: 3}\n")
    staging = load_config(path, "staging", environ=NO_ENV)
    assert (staging.job_worker.count, staging.role) == (3, "worker")


def test_star_without_imports_is_an_error():
    with pytest.raises(ConfigError) as info:
        section(pipelines=["*"])
    assert info.value.path == "pipelines"
    assert "'*' loads the pipelines of the modules listed in imports, and imports lists none" in str(info.value)


def test_star_finding_no_pipeline_in_the_imports_is_an_error():
    from ductwork.fleet.boot import load_pipelines

    with pytest.raises(ConfigError, match=r"no Pipeline subclass is defined in the imports \(json\)"):
        load_pipelines(section(pipelines=["*"], imports=["json"]))


def test_star_loads_the_defined_pipelines_of_the_imports_in_name_order():
    from ductwork.fleet.boot import load_pipelines
    from tests.workloads import processes

    loaded = load_pipelines(section(pipelines=["*"], imports=["tests.workloads.processes"]))
    assert processes.SlowKeyedPipeline in loaded
    assert {cls.__module__ for cls in loaded} == {"tests.workloads.processes"}
    assert all(cls.definition is not None for cls in loaded)
    assert [cls.__qualname__ for cls in loaded] == sorted(cls.__qualname__ for cls in loaded)


def test_a_listed_pipeline_without_a_definition_references_no_limit_key():
    """A base class named in ``pipelines`` (it defines no graph) is loaded, and the boot
    check's key references come from the pipelines that define one."""
    from ductwork import Pipeline
    from ductwork.fleet.boot import limit_references
    from tests.workloads.processes import SlowKeyedPipeline

    class Base(Pipeline):
        pass

    assert Base.definition is None
    assert limit_references([Base, SlowKeyedPipeline]) == {"slow_key": {SlowKeyedPipeline.definition.pipeline}}


def test_ductwork_config_names_the_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "default:\n  job_worker:\n    count: 2\n")
    other = tmp_path / "other.yml"
    other.write_text("default:\n  job_worker:\n    count: 3\n")
    assert load_config(environ={"DUCTWORK_CONFIG": str(other)}).job_worker.count == 3
    assert load_config(environ={"DUCTWORK_CONFIG": ""}).job_worker.count == 2
    assert load_config("ductwork.yml", environ={"DUCTWORK_CONFIG": str(other)}).job_worker.count == 2
    with pytest.raises(ConfigError) as info:
        load_config(environ={"DUCTWORK_CONFIG": "missing.yml"})
    assert str(info.value) == "DUCTWORK_CONFIG='missing.yml': no such file"
