"""The shared trainer base: extra state written atomically, and refused on resume when missing or corrupt (SORT's
buffer here; MInTRL's state in test_mintrl_trainer.py)."""

import json
import os
import re

import pytest
from conftest import assert_resume_refuses, digit_count_reward

from trl_mintrl.sort import SORTConfig, SORTTrainer
from trl_mintrl.sort.buffer import BUFFER_FILE
from trl_mintrl.trainer_base import read_extra_state, write_json_atomically


def test_atomic_write_replaces_whole_file_and_leaves_no_temp_file(tmp_path):
    path = tmp_path / "state.json"
    write_json_atomically(str(path), {"a": 1})
    write_json_atomically(str(path), {"a": 2, "text": "é"})
    assert json.loads(path.read_text(encoding="utf-8")) == {"a": 2, "text": "é"}
    assert os.listdir(tmp_path) == ["state.json"]


def test_atomic_write_removes_temp_files_of_a_writer_killed_midway(tmp_path):
    (tmp_path / ".state.json.k1ll3d.tmp").write_text('{"step": ')  # what a SIGKILL during the write leaves
    (tmp_path / ".other.json.x.tmp").write_text("{")  # another file's temporary is not ours to remove
    write_json_atomically(str(tmp_path / "state.json"), {"step": 2})
    assert sorted(os.listdir(tmp_path)) == [".other.json.x.tmp", "state.json"]


def test_atomic_write_that_fails_midway_keeps_the_old_file(tmp_path):
    path = tmp_path / "state.json"
    write_json_atomically(str(path), {"step": 1})
    # the second value fails to serialise after part of the JSON was written to the temporary file
    with pytest.raises(TypeError):
        write_json_atomically(str(path), {"step": 2, "bad": object()})
    assert json.loads(path.read_text()) == {"step": 1}
    assert os.listdir(tmp_path) == ["state.json"]


@pytest.mark.parametrize(
    "content,reason",
    [(None, "is missing"), ('{"a": ', "not valid JSON"), ('{"a": 1}', r"lacks the keys \['b'\]"), ("3", "not a JSON")],
)
def test_read_extra_state_refuses_naming_the_file(tmp_path, content, reason):
    path = tmp_path / "state.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises((ValueError, FileNotFoundError), match=rf"(?s){re.escape(str(path))}.*{reason}"):
        read_extra_state(str(path), expected_keys={"a", "b"})


def test_sort_resume_refuses_a_missing_or_corrupt_buffer(tiny_model_path, cpu_args, toy_dataset, tmp_path):
    """Before, a checkpoint without sort_buffer.json resumed with an empty buffer after a warning."""

    def make(max_steps):
        settings = {"per_device_train_batch_size": 8, "max_plan_tokens": 8, "max_steps": max_steps, "save_steps": 1}
        args = SORTConfig(**{**cpu_args, **settings, "output_dir": str(tmp_path / "run"), "save_strategy": "steps"})
        return SORTTrainer(tiny_model_path, reward_funcs=digit_count_reward, args=args, train_dataset=toy_dataset)

    first = make(1)
    first.repair.buffer.add(toy_dataset[0]["prompt"], toy_dataset[0]["solution"])
    first.train()
    checkpoint = tmp_path / "run" / "checkpoint-1"
    assert json.loads((checkpoint / BUFFER_FILE).read_text()) == first.repair.buffer.state_dict()
    assert not [p.name for p in checkpoint.iterdir() if p.name.startswith(".") or p.suffix == ".tmp"]
    state = first.repair.buffer.state_dict()
    cases = {
        "missing": (None, "is missing"),
        "cut_short": (json.dumps(state)[:15], "not valid JSON"),
        "no_items": (json.dumps({k: v for k, v in state.items() if k != "items"}), "items"),
        "old_version": (json.dumps({**state, "version": 0}), "malformed.*version"),
    }
    assert_resume_refuses(lambda: make(2), checkpoint, BUFFER_FILE, cases, tmp_path)
