"""benchmarks.kernel.cost_check: the cost model against a kernel-in-the-loop run's logged cycles."""
import json

import pytest

from benchmarks.kernel.cost_check import check_cycles, main
from pipeline.paths import HARDWARE_PROFILES_DIR
from vattn.cost import load_profile, predict_attention_us

H200 = load_profile("h200", HARDWARE_PROFILES_DIR)


def predict(lens, q_len, shape):
    return predict_attention_us(lens, [q_len] * len(lens), impl="vattn", planner="balanced", profile=H200, **shape)


def test_check_cycles_on_a_tiny_run(tmp_path, capsys):
    arm = tmp_path / "arms" / "on"
    arm.mkdir(parents=True)
    shape = dict(num_kv_heads=1, head_dim=256, gqa=8, kv_dtype="fp8_e4m3", page_size=16)
    (arm / "server_info.json").write_text(json.dumps(
        {"config": shape, "arm": {"planner": "balanced"}, "hardware": {"slots_per_sm": 2}}))
    kw = dict(shape, kv_dtype="fp8")
    exact = predict([40_000], 4, kw)
    cycles = [dict(batch=0, measured_attention_layer_us=0.0),  # prefill only: skipped
              dict(batch=1, attn_kv_tokens=40_000, max_kv=40_000, q_len=4, planner="balanced",
                   predicted_attention_layer_us=exact / 2, measured_attention_layer_us=exact),
              dict(batch=3, attn_kv_tokens=60_000, max_kv=40_000, q_len=4, planner="balanced",
                   predicted_attention_layer_us=50.0, measured_attention_layer_us=2 * predict([40_000, 10_000, 10_000], 4, kw))]
    (arm / "emulator_cycles.jsonl").write_text("\n".join(json.dumps(c) for c in cycles))
    [row] = check_cycles(str(tmp_path))
    assert row["arm"] == "on" and row["cycles"] == 2 and row["logged_within"] == 0
    assert row["now_within"] == 0.5 and row["now_median"] == pytest.approx(0.75)
    assert row["exact_cycles"] == 1 and row["exact_within"] == 1.0  # batch 1: the log pins it down
    main(["--check-cycles", str(tmp_path)])
    assert "on       balanced" in capsys.readouterr().out
    with pytest.raises(ValueError, match=r"run_dir: got '.*'; it has no arms/ folder with arm runs"):
        check_cycles(str(tmp_path / "arms"))
