"""The Hopper main kernel (vattn/hopper): its generated source compiles for sm_90a wherever nvcc is, and on an
sm_90 GPU its partials, merged by vattn's reduce, match vattn.reference on ragged batches."""

import shutil

import pytest

from vattn.hopper import build


def test_source_has_both_wgmma_wrappers_with_full_operand_lists():
    src = build.source(HEAD_DIM=256, GQA=16, PAGE=16)
    assert "@WGMMA_WRAPPERS@" not in src
    # m64n64 writes 32 accumulators, m64n256 128; the A fragments and descriptors follow them
    assert "m64n64k16.f32.f16.f16 {%0, %1," in src and "%31}, %32, %33, p, 1, 1, 0, 0" in src
    assert "m64n256k16.f32.f16.f16 {%0," in src and "%127}, {%128, %129, %130, %131}, %132, p, 1, 1, 1" in src


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_compiles_for_sm90a_without_spills(tmp_path, monkeypatch):
    monkeypatch.setattr(build, "CACHE", tmp_path)
    cubin = build.compile_cubin(dict(HEAD_DIM=256, GQA=16, PAGE=16))
    assert cubin.stat().st_size > 0


def _hopper_gpu():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 GPU")
    if shutil.which("nvcc") is None:
        pytest.skip("needs nvcc")
    return torch


CASES = {
    # seq_lens, q_lens: partial last tiles, sequences shorter than one tile or one page, ragged q (rows of
    # absent tokens must stay neutral), one long sequence split into many pieces among short ones
    "ragged": ([1, 15, 63, 64, 65, 1000, 4500, 35000], [1, 2, 3, 4, 4, 2, 1, 4]),
    "long-among-short": ([100000] + [300] * 15, [4] * 16),
    "uniform-q4": ([8192] * 8, [4] * 8),
}


@pytest.mark.gpu
@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_reference(case):
    torch = _hopper_gpu()
    import vattn
    from vattn import kernel as K
    from vattn.planner import plan_python

    seq_lens, q_lens = CASES[case]
    gen = torch.Generator(device="cuda").manual_seed(0)
    page, hq, d = 16, 16, 256
    pages = [-(-n // page) for n in seq_lens]
    pool = sum(pages) + 7
    k = (torch.randn(pool, page, 1, d, device="cuda", generator=gen)).to(torch.float8_e4m3fn)
    v = (torch.randn(pool, page, 1, d, device="cuda", generator=gen)).to(torch.float8_e4m3fn)
    perm = torch.randperm(pool, device="cuda", generator=gen).to(torch.int32)
    tables = torch.zeros(len(seq_lens), max(pages), dtype=torch.int32, device="cuda")
    first = 0
    for b, n in enumerate(pages):
        tables[b, :n] = perm[first:first + n]
        first += n
    cu = [0]
    for n in q_lens:
        cu.append(cu[-1] + n)
    q = torch.randn(cu[-1], hq, d, device="cuda", generator=gen).to(torch.bfloat16)
    sl = torch.tensor(seq_lens, dtype=torch.int32, device="cuda")
    cu_t = torch.tensor(cu, dtype=torch.int32, device="cuda")
    kd, vd = torch.tensor([0.9], device="cuda"), torch.tensor([1.1], device="cuda")
    scale = d ** -0.5

    lists = plan_python(seq_lens, q_lens, num_kv_heads=1, slots=132, mode="balanced")
    plan = {f: torch.tensor(getattr(lists, f), dtype=torch.int32, device="cuda")
            for f in ("work_seq", "work_start", "work_end", "work_part", "work_order", "seq_part_start")}
    width = plan["work_seq"].shape[0]
    o_part = torch.full((width, 1, 64, d), float("nan"), device="cuda")
    lse_part = torch.full((width, 1, 64), float("nan"), device="cuda")
    kern = build.MainSm90(head_dim=d, gqa=hq, page=page)
    kern.launch(q, k, v, tables, sl, cu_t, kd, vd, scale, plan, o_part, lse_part)
    out = torch.empty_like(q)
    K.launch_reduce(o_part, lse_part, plan["seq_part_start"], cu_t, out, gqa=hq, max_q_len=4)
    ref = vattn.reference(q, k, v, tables, sl, cu_t, kd, vd, scale)
    torch.cuda.synchronize()
    assert not torch.isnan(out).any()
    rel = ((out.float() - ref).norm() / ref.norm()).item()
    assert rel < 5e-3, f"{case}: rel_err {rel:.2e}"
