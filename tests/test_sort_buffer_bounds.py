"""SORT's buffer is bounded and drains: capacity with the oldest evicted (counted), buffered prompts that are solved
when sampled again leave it (counted), enough repairs per step to drain a full buffer, the settings' defaults and
checks, and the state round trip (an old state without the new keys still loads)."""

import json

import pytest
from test_sort_buffer import CASES, G, _row, accuracy, format_reward, make_trainer

from trl_mintrl.sort import RepairBuffer, RepairItem, SORTConfig
from trl_mintrl.sort.config import repair_buffer_bounds


def test_capacity_evicts_the_oldest_and_counts():
    buffer = RepairBuffer(capacity=3)
    for i in range(5):
        assert buffer.add(f"q{i}", f"r{i}", deferred_at=i)
    assert [item.prompt for item in buffer.items] == ["q2", "q3", "q4"]
    assert buffer.counters["evictions"] == 2
    assert buffer.add("q0", "r0")  # an evicted prompt may be deferred again


def test_solved_removal_drops_only_held_prompts_and_counts():
    buffer = RepairBuffer()
    buffer.add("q1", "r1")
    buffer.add([{"role": "user", "content": "q2"}], "r2")
    assert buffer.remove_solved([{"content": "q2", "role": "user"}])  # same prompt, other key order
    assert not buffer.remove_solved("q3")
    assert [item.prompt for item in buffer.items] == ["q1"] and buffer.counters["solved_removed"] == 1


def test_a_buffered_prompt_sampled_again_and_solved_leaves_the_buffer(tiny_model_path, tmp_path):
    """CASES (test_sort_buffer.py): 0 and 2 all-wrong, 1 solved by one rollout, 3 unscorable, 4 all-right. Buffered
    1 and 4 leave (solved), 3 stays (unscorable is not solved), 0 and 2 are deferred."""
    trainer = make_trainer(tiny_model_path, str(tmp_path), [accuracy, format_reward])
    for case in (1, 3, 4):
        trainer.repair.buffer.add(_row(case)["prompt"], _row(case)["solution"])
    trainer.state.global_step = 5
    trainer._generate_and_score_completions([_row(c) for c in range(len(CASES)) for _ in range(G)])
    buffer = trainer.repair.buffer
    assert [item.reference for item in buffer.items] == ["3+1=4", "0+1=1", "2+1=3"]
    assert [item.deferred_at for item in buffer.items] == [0, 5, 5]
    assert buffer.counters["solved_removed"] == 2
    assert set(trainer.repair._prepared) <= {item.reference for item in buffer.items}


def test_defaults_drain_a_full_buffer_and_bad_values_name_the_field(cpu_args):
    args = SORTConfig(**cpu_args, repair_batch_size=16)
    assert (args.repair_buffer_size, args.max_repairs_per_step, args.repair_optimizer) == (None, None, "own")
    assert repair_buffer_bounds(args) == (64, 4)
    assert repair_buffer_bounds(SORTConfig(**cpu_args, repair_batch_size=16, repair_buffer_size=40)) == (40, 3)
    for field, value, match in [
        ("repair_buffer_size", 8, "`repair_buffer_size` .*below `repair_batch_size`"),
        ("max_repairs_per_step", 0, "`max_repairs_per_step` must be at least 1"),
        ("repair_optimizer", "adam", "`repair_optimizer` must be one of \\['own', 'shared'\\]"),
    ]:
        with pytest.raises(ValueError, match=match):
            SORTConfig(**{**cpu_args, "repair_batch_size": 16, field: value})


def test_due_repairs_drain_a_full_buffer_up_to_the_limit(tiny_model_path, tmp_path):
    trainer = make_trainer(tiny_model_path, str(tmp_path), [accuracy], repair_buffer_size=7)  # batch 3: 3 repairs
    for i in range(8):
        trainer.repair.buffer.add(f"q{i}", f"r{i}")
    assert len(trainer.repair.buffer) == 7 and trainer.repair.buffer.counters["evictions"] == 1
    repairs = trainer.repair._due_repairs()
    assert [[item.prompt for item in items] for items in repairs] == [["q1", "q2", "q3"], ["q4", "q5", "q6"]]
    assert [item.prompt for item in trainer.repair.buffer.items] == ["q7"]

    limited = make_trainer(tiny_model_path, str(tmp_path), [accuracy], max_repairs_per_step=1)
    for i in range(7):
        limited.repair.buffer.add(f"q{i}", f"r{i}")
    assert len(limited.repair._due_repairs()) == 1 and len(limited.repair.buffer) == 4


def test_state_round_trip_with_ages_and_new_counters_and_an_old_state_loads():
    buffer = RepairBuffer(capacity=4)
    buffer.add([{"role": "user", "content": "Compute 2+2 ="}], "2+2=4", deferred_at=3)
    buffer.add("plain", "\\boxed{1}", deferred_at=5)
    buffer.counters.update(evictions=2, solved_removed=1)
    saved = json.loads(json.dumps(buffer.state_dict()))
    restored = RepairBuffer(capacity=4)
    restored.load_state_dict(saved)
    assert restored.items == buffer.items and restored.counters == buffer.counters

    old = {"version": 1, "items": [{"prompt": f"q{i}", "reference": f"r{i}"} for i in range(3)]}
    old["counters"] = {"repairs": 2, "empty_references": 0, "truncated_references": 0, "failed_plans": 0}
    smaller = RepairBuffer(capacity=2)  # a run resumed with a smaller buffer: the oldest go, counted
    smaller.load_state_dict(old)
    assert smaller.items == [RepairItem("q1", "r1", 0), RepairItem("q2", "r2", 0)]
    assert smaller.counters == {**dict.fromkeys(RepairBuffer.COUNTERS, 0), "repairs": 2, "evictions": 1}
