"""Process-aware logger and tqdm, in one process (multi-process order: tests/distributed)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from hasten.config.enums import DistributedType
from hasten.logging import MultiProcessAdapter, get_logger, tqdm
from hasten.state import PartialState


@pytest.fixture(autouse=True)
def _restore_levels() -> Iterator[None]:
    root = logging.getLogger()
    before = root.level
    yield
    root.setLevel(before)
    logging.getLogger("hasten.test").setLevel(logging.NOTSET)


def as_process(index: int, num: int = 2) -> PartialState:
    state = PartialState()
    state.num_processes = num
    state.process_index = state.local_process_index = index
    state.distributed_type = DistributedType.MULTI_CPU
    return state


def test_logging_before_state_is_an_error() -> None:
    logger = get_logger("hasten.test", log_level="INFO")
    with pytest.raises(RuntimeError, match=r"create PartialState\(\) or Accelerator\(\)"):
        logger.info("too early")


def test_main_process_logs_with_caller_location(caplog: pytest.LogCaptureFixture) -> None:
    PartialState()
    logger = get_logger("hasten.test", log_level="INFO")
    with caplog.at_level(logging.INFO, logger="hasten.test"):
        logger.info("hello %s", "world")
    assert [r.getMessage() for r in caplog.records] == ["[RANK 0] hello world"]  # as Accelerate
    assert caplog.records[0].filename == "test_logging.py"


def test_other_processes_log_only_when_asked(caplog: pytest.LogCaptureFixture) -> None:
    as_process(1)
    logger = get_logger("hasten.test", log_level="INFO")
    with caplog.at_level(logging.INFO, logger="hasten.test"):
        logger.info("main only")
        logger.warning("everywhere", main_process_only=False)
        logger.info("in order", in_order=True)
    assert [r.getMessage() for r in caplog.records] == ["[RANK 1] everywhere", "[RANK 1] in order"]


def test_in_order_waits_once_per_process(caplog: pytest.LogCaptureFixture) -> None:
    state = as_process(0, num=3)
    barriers: list[int] = []
    state._barrier = lambda: barriers.append(1)
    logger = get_logger("hasten.test", log_level="INFO")
    with caplog.at_level(logging.INFO, logger="hasten.test"):
        logger.info("first", in_order=True)
    assert len(barriers) == 3 and len(caplog.records) == 1


def test_disabled_level_logs_nothing(caplog: pytest.LogCaptureFixture) -> None:
    PartialState()
    logger = get_logger("hasten.test", log_level="WARNING")
    with caplog.at_level(logging.WARNING, logger="hasten.test"):
        logger.info("quiet")
    assert caplog.records == []


def test_log_level_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCELERATE_LOG_LEVEL", "debug")
    logger = get_logger("hasten.test")
    assert isinstance(logger, MultiProcessAdapter)
    assert logger.logger.level == logging.DEBUG and logging.getLogger().level == logging.DEBUG


def test_no_level_leaves_loggers_alone() -> None:
    root_level = logging.getLogger().level
    get_logger("hasten.test")
    assert logging.getLogger("hasten.test").level == logging.NOTSET
    assert logging.getLogger().level == root_level


def test_warning_once(caplog: pytest.LogCaptureFixture) -> None:
    PartialState()
    logger = get_logger("hasten.test", log_level="INFO")
    with caplog.at_level(logging.INFO, logger="hasten.test"):
        logger.warning_once("careful")
        logger.warning_once("careful")
        logger.warning_once("other")
    assert [r.getMessage() for r in caplog.records] == ["[RANK 0] careful", "[RANK 0] other"]


def test_tqdm_shows_on_local_main_only() -> None:
    pytest.importorskip("tqdm", reason="hasten.utils.tqdm wraps the optional tqdm package")
    PartialState()
    assert not tqdm(range(3)).disable
    assert tqdm(range(3), disable=True).disable
    as_process(1)
    assert tqdm(range(3)).disable
    assert not tqdm(range(3), main_process_only=False).disable
    assert list(tqdm(range(3))) == [0, 1, 2]


def test_tqdm_rejects_positional_flag() -> None:
    pytest.importorskip("tqdm", reason="hasten.utils.tqdm wraps the optional tqdm package")
    with pytest.raises(ValueError, match=r"tqdm\(True, \.\.\.\).*main_process_only"):
        tqdm(True, range(3))


def test_tqdm_missing_names_the_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import hasten.core.imports as imports

    monkeypatch.setattr(imports, "is_package_available", lambda name, min_version=None: False)
    with pytest.raises(ImportError, match="pip install 'tqdm'"):
        tqdm(range(3))


def test_utils_tqdm_is_the_function_at_both_paths_in_any_import_order() -> None:
    # accelerate.utils.tqdm is a submodule *and* the function; importing the submodule
    # must not rebind hasten.utils.tqdm to the module.
    import importlib

    import hasten.utils
    import hasten.utils.tqdm  # noqa: F401  (binds the submodule, as the import system does)
    from hasten.utils import tqdm as from_package
    from hasten.utils.tqdm import tqdm as from_module

    assert from_package is from_module is tqdm
    assert hasten.utils.tqdm is tqdm
    assert importlib.import_module("hasten.utils.tqdm").tqdm is tqdm
    assert "tqdm" in importlib.import_module("hasten.utils.tqdm").__all__
