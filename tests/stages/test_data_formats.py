"""TRL's conversational (OpenAI tool calls, tool messages) and preference (chosen/rejected, shared prompt) formats,
from JSONL and from a `datasets` folder written by save_to_disk, beside agentrl's own JSONL."""

from __future__ import annotations

import json

import pytest

from agentrl import cli
from agentrl.core import parse_tool_calls
from agentrl.stages.data import DataError, PreferencePair, load_conversations

CALC = {"type": "function", "function": {"name": "calc", "arguments": {"expression": "3*4+5"}}}
ANSWER_STR = {"type": "function", "function": {"name": "answer", "arguments": '{"value": 17}'}}  # OpenAI: a JSON string
TRL_CONV = {"messages": [
    {"role": "user", "content": "Compute 3*4+5."},
    {"role": "assistant", "content": None, "tool_calls": [CALC]},
    {"role": "tool", "tool_call_id": "c1", "name": "calc", "content": "17"},
    {"role": "assistant", "content": "Submitting.", "tool_calls": [ANSWER_STR]},
]}
CALC_TEXT = '<tool_call>{"name": "calc", "arguments": {"expression": "3*4+5"}}</tool_call>'
ANSWER_TEXT = '<tool_call>{"name": "answer", "arguments": {"value": 17}}</tool_call>'


def write(tmp_path, *rows, name="data.jsonl"):
    f = tmp_path / name
    f.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return f


def test_trl_tool_calls_become_the_action_text_the_policy_writes(tmp_path):
    ((n, conv),) = load_conversations(write(tmp_path, TRL_CONV))
    assert n == 1
    assert [(m.role, m.content) for m in conv.messages] == [
        ("user", "Compute 3*4+5."), ("assistant", CALC_TEXT), ("tool", "17"),
        ("assistant", "Submitting." + ANSWER_TEXT)]
    calls = parse_tool_calls(conv.messages[3].content)  # what an env would parse out of it
    assert [(c.name, c.arguments, c.error) for c in calls] == [("answer", {"value": 17}, None)]


def test_parallel_calls_results_are_one_observation(tmp_path):
    two = {"messages": [
        {"role": "user", "content": "Read both clues."},
        {"role": "assistant", "content": None, "tool_calls": [
            {"type": "function", "function": {"name": "clue", "arguments": {"lock": 1}}},
            {"type": "function", "function": {"name": "clue", "arguments": {"lock": 2}}}]},
        {"role": "tool", "tool_call_id": "a", "content": "lock 1: 3 + 4"},
        {"role": "tool", "tool_call_id": "b", "content": "lock 2: 1 + 1"},
        {"role": "assistant", "content": "done"}],
        "tools": json.dumps([{"type": "function", "function": {"name": "clue", "description": "d", "parameters": {}}}])}
    ((_, conv),) = load_conversations(write(tmp_path, two))
    assert [m.role for m in conv.messages] == ["user", "assistant", "tool", "assistant"]
    assert conv.messages[2].content == "lock 1: 3 + 4\nlock 2: 1 + 1"  # as an env joins its tools' outputs
    assert conv.messages[1].content.count("<tool_call>") == 2
    assert conv.tools[0]["function"]["name"] == "clue"  # tools given as a JSON string


@pytest.mark.parametrize("bad, message", [
    ({"role": "user", "content": "x", "tool_calls": [CALC]}, "only an assistant message may carry tool_calls"),
    ({"role": "assistant", "content": None,
      "tool_calls": [{"type": "function", "function": {"name": "calc", "arguments": "{oops"}}]},
     r"tool_calls\[0\].function.arguments is not valid JSON"),
    ({"role": "assistant", "content": None, "tool_calls": [{"type": "function", "function": {"arguments": {}}}]},
     'needs a "function" with a string "name"'),
    ({"role": "assistant", "content": None}, "neither content nor tool_calls"),
    ({"role": "assistant", "content": "x", "tool_calls": [], "weight": 1}, r"unknown keys \['weight'\]"),
])
def test_malformed_trl_rows_are_named_by_file_and_line(tmp_path, bad, message):
    good = TRL_CONV
    row = {"messages": [{"role": "user", "content": "task"}, bad]}
    with pytest.raises(DataError, match=rf"data.jsonl:2: .*{message}"):
        load_conversations(write(tmp_path, good, row))


def test_preference_rows_in_trls_shapes():
    prompt = [{"role": "user", "content": "Compute 3*4+5."}]
    chosen = [{"role": "assistant", "content": None, "tool_calls": [CALC]}]
    rejected = [{"role": "assistant", "content": "<tool_call>{\"name\": \"answer\", \"arguments\": {\"value\": 9}}"
                                                 "</tool_call>"}]
    shared = PreferencePair.model_validate({"prompt": prompt, "chosen": chosen, "rejected": rejected})
    assert [(m.role, m.content) for m in shared.chosen.messages] == [("user", "Compute 3*4+5."),
                                                                     ("assistant", CALC_TEXT)]
    assert shared.rejected.messages[0].content == "Compute 3*4+5."
    implicit = PreferencePair.model_validate({"chosen": prompt + chosen, "rejected": prompt + rejected})
    assert implicit.chosen.messages == shared.chosen.messages  # the prompt inside each side: the same pair
    standard = PreferencePair.model_validate({"prompt": "Compute 3*4+5.", "chosen": CALC_TEXT, "rejected": "17?"})
    assert [(m.role, m.content) for m in standard.rejected.messages] == [("user", "Compute 3*4+5."),
                                                                         ("assistant", "17?")]
    ours = PreferencePair.model_validate({"prompt": prompt, "chosen": {"messages": chosen, "reward": 1.0},
                                          "rejected": {"messages": rejected}})
    assert ours.chosen.reward == 1.0 and ours.chosen.messages == shared.chosen.messages


def test_a_string_side_without_a_prompt_is_refused_with_its_line(tmp_path):
    from agentrl.stages.data import load_pairs

    with pytest.raises(DataError, match=r"pairs.jsonl:1: .*chosen is a string, which needs a prompt"):
        load_pairs(write(tmp_path, {"chosen": "a", "rejected": "b"}, name="pairs.jsonl"), chat=None)


# -- datasets.load_from_disk ----------------------------------------------------------------------------


def as_dataset_row(conv):
    """How a user stores TRL rows in a datasets dataset: arguments as JSON strings (Arrow would otherwise merge
    every row's argument keys into one struct and fill the missing ones with null)."""
    row = json.loads(json.dumps(conv))
    for m in row["messages"]:
        for c in m.get("tool_calls") or []:
            if not isinstance(c["function"]["arguments"], str):
                c["function"]["arguments"] = json.dumps(c["function"]["arguments"])
    return row


def test_a_saved_dataset_reads_as_its_jsonl_does(tmp_path):
    datasets = pytest.importorskip("datasets", reason="datasets is not installed (pip install 'agentrl[datasets]')")
    plain = {"messages": [{"role": "user", "content": "Compute 2*9+4."},
                          {"role": "assistant", "content": ANSWER_TEXT.replace("17", "22")}], "reward": 1.0}
    rows = [dict(as_dataset_row(TRL_CONV), reward=0.5), plain]
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "ds"))
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows)}).save_to_disk(str(tmp_path / "dd"))
    from_jsonl = load_conversations(write(tmp_path, *rows), system="S", tools=[])
    from_disk = load_conversations(tmp_path / "ds", system="S", tools=[])
    from_dict = load_conversations(tmp_path / "dd", system="S", tools=[])
    assert [(n, c.messages, c.reward, c.system) for n, c in from_disk] == \
           [(n, c.messages, c.reward, c.system) for n, c in from_jsonl]
    assert [c.messages for _, c in from_dict] == [c.messages for _, c in from_jsonl]
    assert from_disk[0][1].messages[3].content == "Submitting." + ANSWER_TEXT


def test_a_saved_preference_dataset_and_its_bad_row(tmp_path):
    datasets = pytest.importorskip("datasets", reason="datasets is not installed (pip install 'agentrl[datasets]')")
    from agentrl.stages.data import _lines

    good = {"prompt": "Compute 3*4+5.", "chosen": CALC_TEXT, "rejected": "17?"}
    datasets.Dataset.from_list([good, good]).save_to_disk(str(tmp_path / "pairs"))
    rows = _lines(tmp_path / "pairs")
    assert [n for n, _ in rows] == [1, 2]
    assert PreferencePair.model_validate(rows[1][1]).chosen.messages[1].content == CALC_TEXT
    bad = [{"messages": [{"role": "user", "content": "t"}, {"role": "assistant", "content": "a"}]},
           {"messages": [{"role": "user", "content": "t"}, {"role": "tool", "content": "a"}]}]
    datasets.Dataset.from_list(bad).save_to_disk(str(tmp_path / "bad"))
    with pytest.raises(DataError, match=r"bad\[row 2\]: .*expected 'assistant'"):
        load_conversations(tmp_path / "bad")


def test_sft_names_the_bad_row_of_a_saved_dataset(tmp_path, capsys):
    datasets = pytest.importorskip("datasets", reason="datasets is not installed (pip install 'agentrl[datasets]')")
    bad = [as_dataset_row(TRL_CONV),
           {"messages": [{"role": "user", "content": "t", "tool_calls": None},
                         {"role": "assistant", "content": None, "tool_calls": None}]}]
    datasets.Dataset.from_list(bad).save_to_disk(str(tmp_path / "demos"))
    code = cli.main(["sft", "--data", str(tmp_path / "demos"), "--env.id", "agentrl/Vault-v0", "--out",
                     str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and "demos[row 2]" in err and "neither content nor tool_calls" in err


def test_a_folder_that_is_not_a_dataset_is_named(tmp_path):
    pytest.importorskip("datasets", reason="datasets is not installed (pip install 'agentrl[datasets]')")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match=r"empty: not a dataset saved with save_to_disk"):
        load_conversations(tmp_path / "empty")
