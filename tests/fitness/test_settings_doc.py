"""docs/settings.md's settings table is the code's: every row rendered from the sections'
``setting(default, check=, doc=)`` fields (``launcher.commands.settings_doc``), so the table
and the doc texts cannot drift apart (a hand-written row once said ``checkpoint.every_steps:
0`` saves the last step; the code saves none)."""

from __future__ import annotations

import dataclasses
import os
import types

from launcher import backends
from launcher.commands import settings_doc
from worker.contract import sections

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _committed() -> str:
    with open(os.path.join(REPO, "docs", "settings.md"), encoding="utf-8") as f:
        return f.read()


def test_the_committed_table_is_the_one_the_code_renders():
    found = settings_doc.differences(_committed())
    assert not found, ("docs/settings.md's table differs from the code's doc= texts; edit the "
                       "doc= text, then run python -m launcher.commands.settings_doc:\n"
                       + "\n".join(found))


def test_every_setting_has_a_row_with_its_default_type_and_doc():
    rows = dict(settings_doc.rows())
    assert rows["checkpoint.every_steps"].startswith(
        "| `checkpoint.every_steps` | `1000` | integer >= 0 | ")
    assert "(0 = never)" in rows["checkpoint.every_steps"]
    assert rows["train.num_steps"].startswith("| `train.num_steps` | required | integer > 0 | ")
    assert rows["train.steps_per_call"].startswith(
        "| `train.steps_per_call` | `auto` | integer 1 to 100000 or `auto` | ")
    assert rows["data.last_batch"].startswith("| `data.last_batch` | `drop` | `drop` or `pad` | ")
    names = [f"`{name}`" for name in backends.names()]  # every one the registry has
    assert rows["cluster.backend"].startswith(
        f"| `cluster.backend` | `local` | {', '.join(names[:-1])} or {names[-1]} | ")
    assert rows["restarts.max_restarts"].startswith(
        "| `restarts.max_restarts` | `null` | integer 0 to 10000 or null | ")
    assert "[recovery.md](recovery.md#failure-classes-and-their-budgets)" in rows[
        "restarts.program_errors"]
    assert rows["program"] == ("| `program` | none | mapping | run your own program instead of "
                               "the trainer: [programs.md](programs.md) |")


def test_a_doc_text_changed_in_the_code_names_its_key_and_both_texts(monkeypatch):
    field = {f.name: f for f in dataclasses.fields(sections.Checkpoint)}["every_steps"]
    doc = field.metadata["doc"]
    monkeypatch.setattr(field, "metadata", types.MappingProxyType(
        {**field.metadata, "doc": doc.replace("(0 = never)", "(0 = only the last)")}))
    found = settings_doc.differences(_committed())
    assert len(found) == 1, found
    assert found[0].startswith("checkpoint.every_steps: docs/settings.md says:")
    assert "(0 = never)" in found[0] and "(0 = only the last)" in found[0]


def test_a_row_edited_by_hand_missing_or_unknown_is_named():
    text = _committed()
    edited = text.replace("| `checkpoint.keep` | `3` |", "| `checkpoint.keep` | `5` |")
    assert [f.split(":")[0] for f in settings_doc.differences(edited)] == ["checkpoint.keep"]
    row = dict(settings_doc.rows())["data.shuffle_seed"]
    missing = text.replace(row + "\n", "")
    assert settings_doc.differences(missing)[0].startswith(
        "data.shuffle_seed: missing from docs/settings.md")
    unknown = text.replace(row, row + "\n| `data.shuffle_sed` | `0` | integer | its seed |")
    assert settings_doc.differences(unknown)[0].startswith(
        "data.shuffle_sed: the code has no such setting")


def test_rendering_keeps_the_prose_around_the_table():
    text = _committed()
    before, after = text.split(settings_doc.BEGIN)[0], text.split(settings_doc.END)[1]
    doctored = text.replace("| `checkpoint.keep` | `3` |", "| `checkpoint.keep` | `5` |")
    assert settings_doc.rendered(doctored) == text
    assert "Input rules, checked at load" in before and "are derived, never typed twice" in after
