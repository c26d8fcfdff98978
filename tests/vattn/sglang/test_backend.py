"""The wrapper's construction-time decisions (vattn/sglang/backend.py) against the installed sglang
(0.5.17 or 0.5.23), in-process on a CPU: the model-level refusal, how loudly it is logged, and the
flags it reports in place of the base's. Forward routing runs in drive_cpu.py (test_contract.py)."""
from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import sglang_env as E  # noqa: E402

E.require_sglang()


@pytest.fixture
def runner(monkeypatch):
    """A stand-in ModelRunner over sglang's real pools, with VATTN=1 (a test may override it)."""
    from vattn.sglang import counters

    E.publish()
    monkeypatch.setenv("VATTN", "1")
    # private counters: the process's own would start a reporter that logs at exit, after pytest
    # has closed its streams
    monkeypatch.setattr(counters, "process_counters", lambda base=None, publisher=True: counters.PathCounters(base))
    return E.build_env(device="cpu").runner


def _wrap(runner):
    from vattn.sglang import backend

    return backend.VattnAttnBackend(object(), runner, "triton")


def test_a_plain_nhd_pool_is_served(runner):
    assert _wrap(runner).vattn_reason is None


@pytest.mark.parametrize("layout", ["vectorized_5d", "page_major_layer_major"])
def test_a_non_nhd_kv_layout_is_refused_by_name(runner, layout):
    """sglang 0.5.23 labels its pool's physical layout; on ROCm with SGLANG_AITER_KV_CACHE_LAYOUT=
    vectorized_5d, use_hnd stays False while the buffers are 5D, which vattn would misread as NHD pages."""
    runner.token_to_kv_pool.use_hnd = False
    runner.token_to_kv_pool.kv_cache_layout = layout
    assert _wrap(runner).vattn_reason == f"KV cache layout {layout!r} (served: 'nhd')"


def test_an_hnd_pool_is_refused(runner):
    runner.token_to_kv_pool.use_hnd = True
    if hasattr(runner.token_to_kv_pool, "kv_cache_layout"):  # 0.5.23 labels it too
        runner.token_to_kv_pool.kv_cache_layout = "hnd"
    assert "HND" in _wrap(runner).vattn_reason.upper()


def _backend_records(caplog, runner):
    with caplog.at_level(logging.INFO, logger="vattn.sglang.backend"):
        _wrap(runner)
    return [r for r in caplog.records if r.getMessage().startswith("vattn backend:")]


def test_a_refused_model_with_vattn_on_warns(runner, caplog):
    """The on arm silently serving everything with the base would make an A/B an A/A."""
    runner.sliding_window_size = 4096
    (record,) = _backend_records(caplog, runner)
    assert record.levelno == logging.WARNING, record.levelname
    assert "off (sliding-window" in record.getMessage()


def test_an_accepted_model_and_vattn_off_log_at_info(runner, caplog, monkeypatch):
    (record,) = _backend_records(caplog, runner)
    assert record.levelno == logging.INFO and "on (plan" in record.getMessage()
    caplog.clear()
    monkeypatch.setenv("VATTN", "0")
    (record,) = _backend_records(caplog, runner)
    assert record.levelno == logging.INFO and "off (VATTN=0)" in record.getMessage()


class _RaggedBase:
    supports_ragged_verify_graph = True  # as sglang's FA3 backend says


@pytest.mark.parametrize("switch, refused, reported", [("1", False, False), ("0", False, True), ("1", True, True)])
def test_ragged_verify_graphs_are_refused_while_vattn_serves(runner, monkeypatch, switch, refused, reported):
    """sglang (SGLANG_RAGGED_VERIFY_MODE=compact) replays token-bucket verify graphs only if the
    backend says so; vattn records its plan at capture for uniform rows and does not rebuild it per
    replay, so while vattn may serve the model the wrapper says no. Otherwise the base's flag holds."""
    from vattn.sglang import backend

    monkeypatch.setenv("VATTN", switch)
    if refused:
        runner.sliding_window_size = 4096
    wrapper = backend.VattnAttnBackend(_RaggedBase(), runner, "fa3")
    assert wrapper.supports_ragged_verify_graph is reported
