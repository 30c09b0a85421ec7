"""core.environment: truth strings, env flags/choices, patch/clear/purge helpers."""

from __future__ import annotations

import os
import unittest

import pytest

from hasten.core.environment import (
    clear_environment,
    parse_choice_from_env,
    parse_flag_from_env,
    patch_environment,
    purge_accelerate_environment,
    str_to_bool,
)


@pytest.mark.parametrize("text", ["y", "YES", "t", "True", "on", "1", " true "])
def test_str_to_bool_true_spellings(text: str) -> None:
    assert str_to_bool(text) == 1
    assert str_to_bool(text, to_bool=True) is True


@pytest.mark.parametrize("text", ["n", "No", "f", "FALSE", "off", "0"])
def test_str_to_bool_false_spellings(text: str) -> None:
    assert str_to_bool(text) == 0
    assert str_to_bool(text, to_bool=True) is False


def test_str_to_bool_rejects_other_values() -> None:
    with pytest.raises(ValueError, match=r"invalid truth value 'maybe'.*'true'"):
        str_to_bool("maybe")


def test_parse_flag_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HASTEN_T_FLAG", raising=False)
    assert parse_flag_from_env("HASTEN_T_FLAG") is False
    assert parse_flag_from_env("HASTEN_T_FLAG", default=True) is True
    monkeypatch.setenv("HASTEN_T_FLAG", "yes")
    assert parse_flag_from_env("HASTEN_T_FLAG") is True
    monkeypatch.setenv("HASTEN_T_FLAG", "0")
    assert parse_flag_from_env("HASTEN_T_FLAG", default=True) is False


def test_parse_flag_from_env_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HASTEN_T_FLAG", "sure")
    with pytest.raises(ValueError, match=r"HASTEN_T_FLAG='sure' is not a boolean"):
        parse_flag_from_env("HASTEN_T_FLAG")


def test_parse_choice_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HASTEN_T_CHOICE", raising=False)
    assert parse_choice_from_env("HASTEN_T_CHOICE") == "no"
    assert parse_choice_from_env("HASTEN_T_CHOICE", default=3) == "3"  # type: ignore[arg-type]
    monkeypatch.setenv("HASTEN_T_CHOICE", "bf16")
    assert parse_choice_from_env("HASTEN_T_CHOICE") == "bf16"


def test_patch_environment_sets_uppercases_and_restores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HASTEN_T_OLD", "before")
    monkeypatch.delenv("HASTEN_T_NEW", raising=False)
    with patch_environment(hasten_t_old=1, HASTEN_T_NEW=2.5):
        assert os.environ["HASTEN_T_OLD"] == "1"
        assert os.environ["HASTEN_T_NEW"] == "2.5"
    assert os.environ["HASTEN_T_OLD"] == "before"
    assert "HASTEN_T_NEW" not in os.environ


def test_patch_environment_restores_after_an_exception() -> None:
    with pytest.raises(RuntimeError), patch_environment(HASTEN_T_BOOM="1"):
        raise RuntimeError("boom")
    assert "HASTEN_T_BOOM" not in os.environ


def test_patch_environment_as_decorator_is_reusable() -> None:
    seen: list[str] = []

    @patch_environment(hasten_t_deco="x")
    def read() -> None:
        seen.append(os.environ["HASTEN_T_DECO"])

    read()
    read()
    assert seen == ["x", "x"]
    assert "HASTEN_T_DECO" not in os.environ


def test_clear_environment_empties_and_restores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HASTEN_T_KEEP", "bar")
    before = dict(os.environ)
    with clear_environment():
        assert len(os.environ) == 0
        os.environ["HASTEN_T_KEEP"] = "new"
        os.environ["HASTEN_T_ADDED"] = "1"
    assert dict(os.environ) == before


def test_purge_on_function_removes_added_and_restores_changed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ACCELERATE_T_KEEP", "old")
    monkeypatch.setenv("ACCELERATE_T_GONE", "here")

    @purge_accelerate_environment
    def dirty() -> str:
        os.environ["ACCELERATE_T_NEW"] = "1"
        os.environ["ACCELERATE_T_KEEP"] = "changed"
        del os.environ["ACCELERATE_T_GONE"]
        os.environ["HASTEN_T_OTHER"] = "stays"
        return "result"

    assert dirty() == "result"
    assert "ACCELERATE_T_NEW" not in os.environ
    assert os.environ["ACCELERATE_T_KEEP"] == "old"
    assert os.environ["ACCELERATE_T_GONE"] == "here"
    assert os.environ["HASTEN_T_OTHER"] == "stays"  # only ACCELERATE_* are purged


@purge_accelerate_environment
class _PlainTests:
    def test_sets(self) -> None:
        os.environ["ACCELERATE_T_PLAIN"] = "1"

    def helper(self) -> None:
        os.environ["ACCELERATE_T_HELPER"] = "1"


class _ChildTests(_PlainTests):
    def test_child(self) -> None:
        os.environ["ACCELERATE_T_CHILD"] = "1"


def test_purge_on_plain_class_and_subclass() -> None:
    _PlainTests().test_sets()
    assert "ACCELERATE_T_PLAIN" not in os.environ
    _ChildTests().test_child()
    _ChildTests().test_sets()
    assert "ACCELERATE_T_CHILD" not in os.environ
    _PlainTests().helper()  # not a test method: not wrapped
    assert os.environ.pop("ACCELERATE_T_HELPER") == "1"


def test_purge_on_unittest_testcase() -> None:
    @purge_accelerate_environment
    class Case(unittest.TestCase):
        def test_a(self) -> None:
            os.environ["ACCELERATE_T_UNITTEST"] = "1"

    result = unittest.TextTestRunner(stream=open(os.devnull, "w")).run(Case("test_a"))  # noqa: SIM115
    assert result.wasSuccessful()
    assert "ACCELERATE_T_UNITTEST" not in os.environ


def test_purge_keeps_a_parent_init_subclass_hook() -> None:
    seen: list[str] = []

    class Base:
        def __init_subclass__(cls, **kwargs: object) -> None:
            super().__init_subclass__(**kwargs)
            seen.append(cls.__name__)

    @purge_accelerate_environment
    class Middle(Base):
        pass

    class Leaf(Middle):
        def test_x(self) -> None:
            os.environ["ACCELERATE_T_LEAF"] = "1"

    assert seen == ["Middle", "Leaf"]
    Leaf().test_x()
    assert "ACCELERATE_T_LEAF" not in os.environ


def test_purge_rejects_non_callables() -> None:
    with pytest.raises(TypeError, match=r"expects a function or a class, got 42"):
        purge_accelerate_environment(42)


def test_purge_keeps_the_decorated_class_own_init_subclass_hook() -> None:
    seen: list[str] = []

    @purge_accelerate_environment
    class Base:
        def __init_subclass__(cls, **kwargs: object) -> None:
            super().__init_subclass__(**kwargs)
            seen.append(cls.__name__)

    class Leaf(Base):
        def test_y(self) -> None:
            os.environ["ACCELERATE_T_OWN_HOOK"] = "1"

    assert seen == ["Leaf"]
    Leaf().test_y()
    assert "ACCELERATE_T_OWN_HOOK" not in os.environ


def test_get_int_from_env_takes_the_first_non_negative(monkeypatch: pytest.MonkeyPatch) -> None:
    from hasten.core.environment import get_int_from_env

    monkeypatch.delenv("HASTEN_T_A", raising=False)
    monkeypatch.setenv("HASTEN_T_B", "-1")
    monkeypatch.setenv("HASTEN_T_C", "3")
    assert get_int_from_env(["HASTEN_T_A", "HASTEN_T_B", "HASTEN_T_C"], 7) == 3
    assert get_int_from_env(["HASTEN_T_A", "HASTEN_T_B"], 7) == 7
    monkeypatch.setenv("HASTEN_T_A", "x")
    with pytest.raises(ValueError, match=r"HASTEN_T_A='x' is not an integer"):
        get_int_from_env(["HASTEN_T_A"], 0)


def test_convert_dict_to_env_variables_skips_unsafe_entries(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from hasten.core.environment import convert_dict_to_env_variables

    lines = convert_dict_to_env_variables(
        {"ACCELERATE_DEBUG_MODE": "1", "BAD": "<mything", "EMPTY": "", "OTHER_ENV": "2"}
    )
    assert lines == ["ACCELERATE_DEBUG_MODE=1\n", "OTHER_ENV=2\n"]
    # Accelerate's sentence, on the logger Accelerate names (accelerate.utils.environment)
    assert "WARNING: Skipping BAD=<mything as it contains forbidden characters" in caplog.text
    assert {r.name for r in caplog.records} == {"hasten.utils.environment"}


def test_are_libraries_initialized() -> None:
    from hasten.core.environment import are_libraries_initialized

    assert are_libraries_initialized("os", "hasten_not_imported_lib") == ["os"]
