"""The fp32 oracle against a naive per-token, per-head loop on tiny paged shapes (CPU)."""
import math

import pytest
import torch

from vattn.reference import reference


def make_batch(seq_lens, q_lens, *, hq, hkv, d, page_size, kv_dtype, seed=0):
    """Random q and a paged cache whose pages are scattered (permuted block tables)."""
    gen = torch.Generator().manual_seed(seed)
    pages_per_seq = [-(-L // page_size) for L in seq_lens]
    num_pages = sum(pages_per_seq) + 3  # spare pages nobody reads
    max_pages = max(pages_per_seq + [1])
    perm = torch.randperm(num_pages, generator=gen)
    tables = torch.full((len(seq_lens), max_pages), -1, dtype=torch.int32)
    used = 0
    for b, n in enumerate(pages_per_seq):
        tables[b, :n] = perm[used:used + n]
        used += n
    k = torch.randn(num_pages, page_size, hkv, d, generator=gen) * 2
    v = torch.randn(num_pages, page_size, hkv, d, generator=gen) * 2
    q = torch.randn(sum(q_lens), hq, d, generator=gen)
    cu = torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0)), dtype=torch.int32)
    return q, k.to(kv_dtype), v.to(kv_dtype), tables, torch.tensor(seq_lens, dtype=torch.int32), cu


def naive(q, k_cache, v_cache, tables, seq_lens, cu, k_descale, v_descale, scale):
    page_size, hkv = k_cache.shape[1], k_cache.shape[2]
    group = q.shape[1] // hkv
    out = torch.zeros(q.shape, dtype=torch.float64)
    for b in range(len(seq_lens)):
        L, first, n = int(seq_lens[b]), int(cu[b]), int(cu[b + 1] - cu[b])
        for j in range(n):
            for h in range(q.shape[1]):
                kvh = h // group
                logits, values = [], []
                for pos in range(0, L - n + j + 1):
                    page, slot = int(tables[b, pos // page_size]), pos % page_size
                    kk = k_cache[page, slot, kvh].double() * k_descale
                    logits.append(float(q[first + j, h].double() @ kk) * scale)
                    values.append(v_cache[page, slot, kvh].double() * v_descale)
                if not logits:
                    continue
                top = max(logits)
                w = [math.exp(x - top) for x in logits]
                out[first + j, h] = sum(wi * vi for wi, vi in zip(w, values)) / sum(w)
    return out


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("hq,hkv", [(2, 2), (8, 2)])
@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.float8_e4m3fn])
def test_matches_naive(page_size, hq, hkv, kv_dtype):
    # ragged q_len incl. 0 (absent), L = 0, q_len > L (first tokens fully masked), odd lengths
    seq_lens, q_lens = [37, 5, 0, 17, 3, 54], [4, 1, 2, 0, 4, 3]
    q, k, v, tables, lens, cu = make_batch(seq_lens, q_lens, hq=hq, hkv=hkv, d=16, page_size=page_size,
                                           kv_dtype=kv_dtype)
    kd, vd = (torch.tensor([0.5]), torch.tensor([1.5])) if kv_dtype != torch.float32 else (None, None)
    got = reference(q, k, v, tables, lens, cu, kd, vd, 0.25)
    want = naive(q, k, v, tables, lens, cu, float(kd) if kd is not None else 1.0,
                 float(vd) if vd is not None else 1.0, 0.25)
    assert got.dtype == torch.float32 and got.shape == q.shape
    assert not torch.isnan(got).any()
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    # L = 0 sequence (tokens 5..6) is zero; so is the first token of the q_len 4 > L = 3 sequence
    assert got[5:7].abs().max() == 0
    assert got[7].abs().max() == 0 and got[8].abs().max() > 0


def test_descale_is_applied():
    q, k, v, tables, lens, cu = make_batch([40], [2], hq=4, hkv=1, d=8, page_size=16, kv_dtype=torch.float32)
    base = reference(q, k, v, tables, lens, cu, None, None, 0.3)
    # doubling K's descale while halving the softmax scale leaves logits unchanged; V's descale scales O
    got = reference(q, k, v, tables, lens, cu, torch.tensor(2.0), torch.tensor(3.0), 0.15)
    torch.testing.assert_close(got, base * 3.0)


def test_all_empty_gives_zeros():
    q, k, v, tables, lens, cu = make_batch([0, 0], [3, 1], hq=2, hkv=1, d=8, page_size=16, kv_dtype=torch.float32)
    got = reference(q, k, v, tables, lens, cu, None, None, 1.0)
    assert got.shape == (4, 2, 8) and got.abs().max() == 0


def test_errors():
    q, k, v, tables, lens, cu = make_batch([20], [2], hq=4, hkv=2, d=8, page_size=16, kv_dtype=torch.float32)
    with pytest.raises(ValueError, match=r"q: got shape \(2, 3, 8\); expected \[T, Hq, 8\] with Hq a multiple"):
        reference(q[:, :3], k, v, tables, lens, cu, None, None, 1.0)
    with pytest.raises(ValueError, match=r"cu_seqlens_q\[-1\]: got 2; expected T=1"):
        reference(q[:1], k, v, tables, lens, cu, None, None, 1.0)
    with pytest.raises(ValueError, match=r"block_tables: got shape \(2, 2\); expected \[B=1, max_pages\]"):
        reference(q, k, v, tables.repeat(2, 1), lens, cu, None, None, 1.0)
    with pytest.raises(ValueError, match=r"k_cache/v_cache: got shapes"):
        reference(q, k, v[:, :8], tables, lens, cu, None, None, 1.0)
    with pytest.raises(ValueError, match=r"seq_lens\[0\]: got 40; needs more pages than block_tables holds"):
        reference(q, k, v, tables, torch.tensor([40], dtype=torch.int32), cu, None, None, 1.0)


def test_reference_takes_attentions_arguments():
    """reference(**kwargs) with the keyword arguments of vattn.attention: softmax_scale defaults to 1/sqrt(D) (None
    too), plan and debug are accepted and ignored, out= is written and returned."""
    q, k, v, tables, lens, cu = make_batch([37, 5], [3, 1], hq=4, hkv=2, d=16, page_size=16, kv_dtype=torch.float16)
    q = q.half()
    want = reference(q, k, v, tables, lens, cu, None, None, 1 / math.sqrt(16))
    kwargs = dict(q=q, k_cache=k, v_cache=v, block_tables=tables, seq_lens=lens, cu_seqlens_q=cu)
    assert torch.equal(reference(**kwargs), want)
    assert torch.equal(reference(**kwargs, k_descale=None, v_descale=None, softmax_scale=None), want)
    out = torch.full_like(q, float("nan"))
    got = reference(**kwargs, plan=object(), out=out, debug=True)
    assert got is out and torch.allclose(out.float(), want, atol=1e-3, rtol=1e-3)
    with pytest.raises(ValueError, match=r"^out: got shape \(3, 4, 16\); expected q's \(4, 4, 16\)$"):
        reference(**kwargs, out=out[:3])
