"""benchmarks.kernel.sustained on a CPU: the --builds grammar, the sustained window's figures and the defines a
measurement build adds to the backend's (the timing itself needs a GPU and NVML)."""

from __future__ import annotations

import pytest

from benchmarks.kernel import harness, sustained


def test_builds_parse_names_and_integer_defines():
    assert harness.parse_named_defines("default; q1:K8_QPARTS=1,K8_VSTAGES=2", "--builds") == {
        "default": {}, "q1": {"K8_QPARTS": 1, "K8_VSTAGES": 2}}
    assert harness.parse_named_defines("", "--reduce-variants", allow_none=True) == {}


@pytest.mark.parametrize("text, named", [("", "none given"), ("a;a", "'a' empty or repeated"),
                                         ("q1:K8_QPARTS", "'K8_QPARTS'"), ("q1:K8_QPARTS=x", "'K8_QPARTS=x'"),
                                         (":K8=1", "'' empty")])
def test_bad_builds_name_the_value_and_what_is_allowed(text, named):
    with pytest.raises(ValueError, match="--builds") as exc:
        harness.parse_named_defines(text, "--builds")
    assert named in str(exc.value) and "allowed" in str(exc.value)


def test_a_bad_build_is_a_usage_error_before_any_gpu_work(capsys):
    with pytest.raises(SystemExit) as exc:
        sustained.main(["--builds", "q1:K8_QPARTS=x"])
    assert exc.value.code == 2 and "'K8_QPARTS=x'" in capsys.readouterr().err


def test_the_window_counts_every_call_and_the_capped_samples():
    blocks = [dict(us_per_call=100.0, sm_mhz=1980, reasons=0), dict(us_per_call=110.0, sm_mhz=1500, reasons=0x4),
              dict(us_per_call=112.0, sm_mhz=1480, reasons=0x4 | 0x1)]
    s = sustained.summarize(blocks, calls_per_block=8, energy_mj=(5_000, 5_000 + 24 * 70))
    assert s == dict(sustained_us=110.0, sm_mhz=1500, power_capped_share=2 / 3, mj_per_call=70.0, calls=24)


def test_a_measurement_build_adds_its_defines_to_the_backends_own():
    from vattn.hopper.backend import main_build

    own = main_build(256, 16, 16, False, 1, True)
    patched = sustained._with_defines(own, {"K8_QPARTS": 1})
    assert patched["extra_defines"] == own["extra_defines"] | {"K8_QPARTS": 1}
    assert {k: v for k, v in patched.items() if k != "extra_defines"} == {
        k: v for k, v in own.items() if k != "extra_defines"}
    assert "K8_QPARTS" not in own["extra_defines"]  # the backend's own build untouched


def test_the_cli_refuses_bad_numbers_before_touching_a_gpu(capsys):
    with pytest.raises(SystemExit):
        sustained.main(["--seconds", "0"])
    assert "--seconds: got 0.0; allowed: a positive number" in capsys.readouterr().err
