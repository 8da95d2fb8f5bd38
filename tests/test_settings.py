"""The settings: groups read from ARRCOC_<GROUP>__<FIELD>, list fields from commas or JSON, the old
flat names refused by name, overrides validated group by group."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from arrcoc.settings import MOVED, Settings, default_settings, env_name, get_settings, settings_env


def test_a_nested_variable_sets_its_groups_field(monkeypatch):
    monkeypatch.setenv("ARRCOC_BATCHING__MAX_SIZE", "4")
    monkeypatch.setenv("ARRCOC_LIMITS__MAX_IMAGE_BYTES", "1000")
    monkeypatch.setenv("ARRCOC_ACCESS__API_TOKEN", "t" * 20)
    s = Settings()
    assert s.batching.max_size == 4 and s.limits.max_image_bytes == 1000 and s.access.api_token == "t" * 20
    assert s.batching.max_delay_ms == 5.0  # the group's other fields keep their defaults
    assert s.batching.model_fields_set == {"max_size"} and not s.engine.model_fields_set


@pytest.mark.parametrize("value", ["eager,onnx", " eager , onnx ", '["eager", "onnx"]'])
def test_a_list_field_reads_commas_or_json_from_its_nested_variable(monkeypatch, value):
    monkeypatch.setenv("ARRCOC_ENGINE__BACKENDS", value)
    monkeypatch.setenv("ARRCOC_ACCESS__TOKEN_SCOPE", "bench")
    s = Settings()
    assert s.engine.backends == ("eager", "onnx") and s.access.token_scope == ("bench",)


def test_an_old_flat_name_is_refused_naming_the_new_one(monkeypatch):
    monkeypatch.setenv("ARRCOC_API_TOKEN", "t" * 20)  # a security setting is never silently ignored
    monkeypatch.setenv("ARRCOC_BATCH_MAX_SIZE", "4")
    with pytest.raises(ValidationError) as e:
        Settings()
    message = str(e.value)
    assert "ARRCOC_API_TOKEN -> ARRCOC_ACCESS__API_TOKEN" in message
    assert "ARRCOC_BATCH_MAX_SIZE -> ARRCOC_BATCHING__MAX_SIZE" in message


def test_every_old_name_maps_to_a_field_and_every_field_has_one():
    fields = {f"{g}.{n}" for g, info in Settings.model_fields.items() for n in info.annotation.model_fields}
    assert set(MOVED.values()) == fields
    assert env_name("engine.processes") == "ARRCOC_ENGINE__PROCESSES"


def test_a_misspelt_field_in_a_group_is_an_error(monkeypatch):
    monkeypatch.setenv("ARRCOC_BATCHING__MAX_SIZ", "4")
    with pytest.raises(ValidationError, match=r"batching\.max_siz"):
        Settings()


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("ARRCOC_ENGINE__DTYPE", "half", "ARRCOC_ENGINE__DTYPE must be one of auto, float32, bfloat16"),
        ("ARRCOC_ENGINE__BACKEND", "tensorrt", "ARRCOC_ENGINE__BACKEND must be one of eager"),
        ("ARRCOC_ENGINE__BACKENDS", "eager,tensorrt", "ARRCOC_ENGINE__BACKENDS must name some of"),
        ("ARRCOC_ENGINE__BUCKETS", "0,2", "ARRCOC_ENGINE__BUCKETS must be positive batch sizes"),
        ("ARRCOC_ENGINE__DEVICES", "gpu0", "ARRCOC_ENGINE__DEVICES must be all, or devices"),
        ("ARRCOC_ACCESS__TOKEN_SCOPE", "infer", "ARRCOC_ACCESS__TOKEN_SCOPE must name some of batch, bench"),
        ("ARRCOC_ACCESS__TRUSTED_PROXIES", "the proxy", "ARRCOC_ACCESS__TRUSTED_PROXIES: 'the proxy'"),
        ("ARRCOC_ACCESS__API_TOKEN", "short", "ARRCOC_ACCESS__API_TOKEN must be at least 16 characters"),
    ],
)
def test_validators_name_the_variable_to_fix(monkeypatch, variable, value, message):
    monkeypatch.setenv(variable, value)
    with pytest.raises(ValidationError, match=message):
        Settings()


def test_overrides_merge_into_their_group_validated_and_frozen():
    base = get_settings()
    s = default_settings(batching={"max_size": 4}, engine={"backends": "eager,onnx", "dtype": "bf16"})
    assert s.batching.max_size == 4 and s.batching.max_delay_ms == base.batching.max_delay_ms
    assert s.engine.backends == ("eager", "onnx") and s.engine.dtype == "bfloat16"
    assert s.limits is base.limits  # groups not named are shared, not copied
    assert "max_size" in s.batching.model_fields_set and "max_delay_ms" not in s.batching.model_fields_set
    with pytest.raises(ValidationError, match="ARRCOC_ENGINE__BACKEND must be one of"):
        default_settings(engine={"backend": "tensorrt"})
    with pytest.raises(ValidationError, match="max_siz"):
        default_settings(batching={"max_siz": 4})
    with pytest.raises(TypeError, match="no settings group 'batch'"):
        default_settings(batch={"max_size": 4})
    with pytest.raises(ValidationError, match="frozen"):
        s.batching.max_size = 8  # type: ignore[misc]


def test_settings_env_round_trips_through_the_environment(monkeypatch):
    groups = {"engine": {"buckets": (1, 4), "device": "cpu"}, "jobs": {"ttl_s": 60}}
    env = settings_env(**groups)
    assert env == {
        "ARRCOC_ENGINE__BUCKETS": "1,4",
        "ARRCOC_ENGINE__DEVICE": "cpu",
        "ARRCOC_JOBS__TTL_S": "60",
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    s = Settings()
    assert (s.engine.buckets, s.engine.device, s.jobs.ttl_s) == ((1, 4), "cpu", 60)
    with pytest.raises(KeyError):
        settings_env(jobs={"job_ttl_s": 60})


def test_docs_settings_lists_every_setting_with_its_variable_and_default():
    from pathlib import Path

    table = (Path(__file__).resolve().parents[1] / "docs" / "settings.md").read_text()
    for group, info in Settings.model_fields.items():
        for name in info.annotation.model_fields:
            assert f"| `{group}.{name}` | `{env_name(f'{group}.{name}')}` |" in table, f"{group}.{name}"


def test_the_cli_says_which_variable_to_rename_in_one_line(monkeypatch, capsys):
    from arrcoc.cli import main

    monkeypatch.setenv("ARRCOC_BROKER_URL", "redis://127.0.0.1:1/0")
    get_settings.cache_clear()
    try:
        assert main(["job", "status", "batch-0123456789abcdef"]) == 2
    finally:
        get_settings.cache_clear()
    err = capsys.readouterr().err
    assert err.startswith("arrcoc: error:") and "ARRCOC_BROKER_URL -> ARRCOC_SERVICE__BROKER_URL" in err
    assert "Traceback" not in err


def test_a_celery_process_has_the_threads_to_fill_a_batch_size_that_is_set(monkeypatch):
    """A one-process worker's batches gather from its own task threads: a batch size set larger
    than the default thread count gets the threads to fill it; an explicit thread count wins."""
    from arrcoc.tuning import WORKER_THREADS
    from worker.config import worker_threads

    for name in ("ARRCOC_BATCHING__MAX_SIZE", "ARRCOC_ENGINE__WORKER_THREADS"):
        monkeypatch.delenv(name, raising=False)
    assert worker_threads(Settings()) == WORKER_THREADS
    monkeypatch.setenv("ARRCOC_BATCHING__MAX_SIZE", "64")
    assert worker_threads(Settings()) == 68
    monkeypatch.setenv("ARRCOC_ENGINE__WORKER_THREADS", "3")
    assert worker_threads(Settings()) == 3
