"""vattn.sass on a CPU: the main kernel compiles for sm_90a and hoist_rows removes page-16 address work."""

from __future__ import annotations

import pytest

pytest.importorskip("triton")


def test_hoisted_row_offsets_shrink_the_page16_kernel_to_the_page1_size():
    from vattn import sass
    from vattn.bench import _config

    try:
        plain, hoisted, page1 = (sass.assemble(sass.ptx(page, _config(64, 4, 2, 2, 1, 0, hoist)))
                                 for page, hoist in ((16, 0), (16, 1), (1, 0)))
    except SystemExit as exc:  # no ptxas/cuobjdump anywhere
        pytest.skip(str(exc))
    for r in (plain, hoisted, page1):
        assert r["registers"] <= 255 and r["spill_bytes"] == 0, r
    assert hoisted["sass_integer"] < 0.8 * plain["sass_integer"], (hoisted, plain)
    assert hoisted["sass"] <= 1.02 * page1["sass"], (hoisted, page1)
