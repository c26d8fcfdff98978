"""Outputs that can be compared: two emulator arms with an exact kernel answer word for word alike, and
EMULATOR_PERTURB_NUMERICS (the emulated vattn kernel's numerics moved) makes them diverge, which the
report's accuracy section shows with the first differing word. Real servers, real accuracy client."""
from __future__ import annotations

import pytest
from emu_harness import MODEL, REPO, TOKENIZER

from analysis.accuracy import accuracy_md
from pipeline.accuracy.stage import run_accuracy
from pipeline.config.accuracy import AccuracySpec
from pipeline.emulator.arm import PERTURB_ENV, Arm
from pipeline.emulator.tokens import OutputWords
from pipeline.paths import ArmPaths

FLAGS = ("--tokenizer", str(TOKENIZER), "--time-scale", "0.02", "--max-context-tokens", "8192")
SPEC = AccuracySpec(tasks=[{"name": "gsm8k", "data": REPO / "recipes/data/accuracy/gsm8k_synthetic.jsonl",
                            "limit": 8, "max_tokens": 48, "concurrency": 4}])


def _answers(emulator, tmp_path, name: str, env: dict) -> ArmPaths:
    emu = emulator(*FLAGS, env=env, name=name)
    arm = ArmPaths(tmp_path / "arms" / name)
    run_accuracy(SPEC, url=emu.url, model=MODEL, out_dir=arm.accuracy_dir)
    return arm


def test_exact_kernel_answers_identically_and_a_perturbed_one_diverges(emulator, tmp_path):
    off = _answers(emulator, tmp_path, "off", {"VATTN": "0", PERTURB_ENV: "0.05"})   # off ignores it
    on = _answers(emulator, tmp_path, "on", {"VATTN": "1"})
    md = "\n".join(accuracy_md(off, on, "off", "on", "emulator"))
    assert ("Outputs, gsm8k (off vs on): identical in 8/8 answers (100%): identical by construction unless numerics "
            "are perturbed (EMULATOR_PERTURB_NUMERICS): it tests the plumbing, not the kernel.") in md
    assert "outputs differ 0/8" in md
    # the records keep each answer's tokens and their logprobs, and an exact kernel moves none of them
    assert "Chosen-token logprobs, gsm8k (off vs on), over the 384 tokens the answers share: identical." in md

    bad = _answers(emulator, tmp_path, "on_perturbed", {"VATTN": "1", PERTURB_ENV: "0.05"})
    md = "\n".join(accuracy_md(off, bad, "off", "on", "emulator"))
    # 48 words at 5% each: an answer stays identical with probability 0.95^48 = 8.5%.
    line = next(x for x in md.splitlines() if x.startswith("Outputs, gsm8k"))
    assert "identical in 8/8" not in line and "first differ at word" in line, md
    assert "first differs at word" in md
    # before each answer's first changed word, the perturbed numerics moved the chosen words' logprobs
    drift = next(x for x in md.splitlines() if x.startswith("Chosen-token logprobs, gsm8k"))
    assert ": identical." not in drift and "moved" in drift and "largest change" in drift, drift


def _stream(prompt_hash: int, n: int = 200, flip_rate: float = 0.0) -> list[int]:
    w = OutputWords(prompt_hash, 50, flip_rate)
    return [w.next() for _ in range(n)]


def test_output_words_depend_on_the_prompt_and_flips_persist():
    assert _stream(123) == _stream(123)                   # the same prompt: the same answer, any process
    assert _stream(123) != _stream(124)
    exact, pert = _stream(123), _stream(123, flip_rate=0.2)
    k = next(i for i, (x, y) in enumerate(zip(exact, pert)) if x != y)
    # After the first flip the streams stay apart (chance agreement 1/50 per word), as greedy decoding
    # does after one changed token.
    assert sum(x == y for x, y in zip(exact[k:], pert[k:])) < 0.1 * (200 - k)


@pytest.mark.parametrize("value, rate", [("", 0.0), ("0.02", 0.02)])
def test_perturb_env_reaches_only_the_vattn_arm(value, rate):
    assert Arm.from_env({"VATTN": "1", PERTURB_ENV: value}).flip_rate == rate
    assert Arm.from_env({"VATTN": "0", PERTURB_ENV: value}).flip_rate == 0.0


@pytest.mark.parametrize("value", ["1.5", "lots", "-0.1"])
def test_perturb_env_error_names_the_variable_and_the_range(value):
    from pipeline.config.emulator import ConfigError

    with pytest.raises(ConfigError, match=rf"EMULATOR_PERTURB_NUMERICS: got '{value}'; allowed: a probability "
                                          r"per output word in \[0, 1\)"):
        Arm.from_env({"VATTN": "1", PERTURB_ENV: value})
