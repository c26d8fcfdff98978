"""benchmarks.kernel.hopper_proto's choice of the best Hopper time: timing-only builds and wrong outputs never count."""

from benchmarks.kernel.hopper_proto import _variants, best_main_us


def _rec(**variants):
    """name -> (main us, rel_err, nan) as run_shape records them for the descriptor 8192:1024."""
    rec = {}
    for name, (us, err, nan) in variants.items():
        rec |= {f"hopper_main_us_{name}": us, f"rel_err_{name}_v8192_1024": err, f"nan_{name}_v8192_1024": nan}
    return rec


def test_variants_parse_names_and_defines():
    assert _variants("serial:;overlap:OVERLAP=1;noload:PROFILE_NO_LOAD=1,OVERLAP=1") == {
        "serial": {}, "overlap": {"OVERLAP": "1"}, "noload": {"PROFILE_NO_LOAD": "1", "OVERLAP": "1"}}


def test_best_skips_profile_builds_and_out_of_tolerance_outputs():
    variants = _variants("serial:;overlap:OVERLAP=1;noload:PROFILE_NO_LOAD=1;bad:OVERLAP=2;nan:OVERLAP=3")
    rec = _rec(serial=(130.0, 1.7e-3, False), overlap=(118.0, 1.7e-3, False), noload=(70.0, 0.9, False),
               bad=(60.0, 0.5, False), nan=(50.0, 1e-3, True))
    assert best_main_us(rec, variants, (8192, 1024), "fp8") == 118.0


def test_best_is_none_when_nothing_counts():
    variants = _variants("noload:PROFILE_NO_LOAD=1")
    assert best_main_us(_rec(noload=(70.0, 1e-3, False)), variants, (8192, 1024), "fp8") is None
