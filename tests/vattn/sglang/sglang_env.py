"""A real sglang attention-backend environment without a server, for sglang 0.5.17 and 0.5.23:
published runtime context, real ReqToTokenPool / MHATokenToKVPool / RadixAttention (and, on 0.5.23,
KVIndexTranslator / KVLocPlan), and a stand-in ModelRunner carrying the fields the vattn wrapper
and the Triton base read.

Requests get page-aligned, shuffled pages (sglang's paged-allocator invariant: position p of a
request sits at slot page[p // P] * P + p % P), so a wrong block table reads the wrong KV.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from types import SimpleNamespace


def import_sglang():
    """Import sglang. torchvision is only reached through sglang's multimodal helpers, never on an
    attention path, so two awkward installs are bridged here:
    - a CPU-only torch with PyPI's CUDA-built torchvision: its ops library cannot load, and its
      import dies registering fake kernels for torchvision::nms; declaring the two op schemas lets
      the pure-Python rest of torchvision import;
    - no torchvision at all (a GPU box given only sglang's wheel): stand-in modules of MagicMocks."""
    try:
        import torchvision  # noqa: F401
    except ModuleNotFoundError:
        _stub_package("torchvision")
    except RuntimeError as exc:
        if "torchvision::nms" not in str(exc):
            raise
        import torch

        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]
        lib = torch.library.Library("torchvision", "DEF")
        lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        import_sglang._lib = lib  # the definitions live as long as the library object
        import torchvision  # noqa: F401
    import sglang  # noqa: F401


def require_sglang() -> None:
    """import_sglang, or skip the calling test module: CI installs sglang, a bare checkout may lack it."""
    import pytest

    try:
        import_sglang()
    except ImportError as exc:
        pytest.skip(f"sglang is not importable: {exc}", allow_module_level=True)


def _stub_package(root: str, fixed: dict | None = None) -> None:
    """Make `root` and its submodules importable as MagicMock namespaces (fixed: module -> attrs)."""
    import importlib.abc
    import importlib.machinery
    from unittest.mock import MagicMock

    class Loader(importlib.abc.Loader):
        def create_module(self, spec):
            return None

        def exec_module(self, module):
            for attr, value in (fixed or {}).get(module.__name__, {}).items():
                setattr(module, attr, value)
            module.__getattr__ = lambda name: MagicMock(name=f"{module.__name__}.{name}")

    class Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname, path, target=None):
            if fullname == root or fullname.startswith(root + "."):
                return importlib.machinery.ModuleSpec(fullname, Loader(), is_package=True)
            return None

    sys.meta_path.insert(0, Finder())


def stub_missing_sgl_kernel() -> bool:
    """On a CUDA machine without sglang's compiled kernel package (sglang-kernel, ~370 MB), stand
    in for it as sglang's own tests do (sglang.test.test_utils.maybe_stub_sgl_kernel): its names
    become MagicMocks, except PDL support, reported off so sglang's Triton kernels launch plainly.
    The paths these tests exercise run Triton kernels and torch ops; the GPU tests also check that
    the KV write really landed in the pool, so a mocked op cannot pass for a real one.
    Returns True when the stand-in was installed."""
    try:
        import sgl_kernel  # noqa: F401
        return False
    except (ImportError, OSError):
        pass
    _stub_package("sgl_kernel", {"sgl_kernel.utils": {"is_arch_support_pdl": lambda *a, **k: False}})
    return True


def sglang_version() -> str:
    from importlib.metadata import version

    return version("sglang")


def publish(**fields):
    """Publish sglang's process-wide runtime context for a one-rank test topology."""
    from sglang.srt import runtime_context as rc
    from sglang.srt.server_args import ServerArgs

    rc.reset_context()
    args = dict(model_path="dummy", device="cpu", speculative_algorithm="EAGLE", speculative_num_steps=3,
                speculative_eagle_topk=1, speculative_num_draft_tokens=4, page_size=16)
    args.update(fields)
    server_args = ServerArgs(**args)
    if hasattr(rc, "SpawnRanks"):  # 0.5.23: ranks are published with the args
        rc.publish(server_args, role="test", ranks=rc.SpawnRanks(world_rank=0, dp_rank=None))
    else:  # 0.5.17: ranks are read from torch.distributed unless overridden
        rc.publish(server_args, role="test")
        rc.get_parallel()._overrides.update(
            {name: (name == "dcp_enabled" and False) or (1 if name.endswith("_size") else 0)
             for name in rc._PARALLEL_FIELDS if not name.endswith("_group")})
    return server_args


@dataclass
class Env:
    runner: SimpleNamespace
    req_to_token_pool: object
    kv_pool: object
    translator: object        # None on sglang 0.5.17 (no KVIndexTranslator)
    page_size: int
    pages: dict  # request row -> list of page ids


def build_env(*, device: str, page_size: int = 16, kv_dtype=None, q_heads: int = 16, kv_heads: int = 1,
              head_dim: int = 256, num_pages: int = 64, rows: int = 8, context_len: int = 1024,
              layers: int = 2, draft_tokens: int = 4, seed: int = 0) -> Env:
    import torch
    import transformers
    from sglang.srt.configs.model_config import AttentionArch
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool

    kv_dtype = kv_dtype or torch.bfloat16
    r2t = ReqToTokenPool(size=rows, max_context_len=context_len, device=device, enable_memory_saver=False)
    pool = MHATokenToKVPool(size=num_pages * page_size, page_size=page_size, dtype=kv_dtype, head_num=kv_heads,
                            head_dim=head_dim, layer_num=layers, device=device, enable_memory_saver=False,
                            enable_alt_stream=False)
    gen = torch.Generator().manual_seed(seed)
    for layer in range(layers):  # random KV everywhere: a misread page shows up in the output
        for buf in (pool.k_buffer[layer], pool.v_buffer[layer]):
            buf.view(kv_dtype).copy_(torch.randn(buf.shape, generator=gen).to(kv_dtype))
    translator = None
    try:
        from sglang.srt.mem_cache.kv_index_translator import KVIndexTranslator
    except ImportError:  # sglang 0.5.17
        pass
    else:
        translator = KVIndexTranslator(req_to_token=r2t.req_to_token, token_to_kv_pool_allocator=None,
                                       token_to_kv_pool=pool, page_size=page_size, device=device)
    model_config = SimpleNamespace(
        attention_arch=AttentionArch.MHA, hf_config=transformers.PretrainedConfig(architectures=["LlamaForCausalLM"]),
        get_num_kv_heads=lambda tp, dcp=1: kv_heads, get_max_num_attention_heads=lambda: q_heads,
        v_head_dim=head_dim, swa_v_head_dim=head_dim, head_dim=head_dim, context_len=context_len,
        is_encoder_decoder=False, linear_attn_registry_result=None, has_asymmetric_kv=False,
        has_attention_sinks=False, is_local_attention_model=False,
        hf_text_config=SimpleNamespace(num_attention_heads=q_heads, num_key_value_heads=kv_heads))
    from sglang.srt.runtime_context import get_server_args

    runner = SimpleNamespace(
        server_args=get_server_args(), use_mla_backend=False, tp_rank=0, init_new_workspace=False,
        # read by FA3's backend (the GPU test's fa3 base)
        attention_chunk_size=None, ps=SimpleNamespace(attn_cp_size=1, tp_size=1),
        kv_cache_dtype_str="fp8_e4m3" if kv_dtype == torch.float8_e4m3fn else "auto",
        req_to_token_pool=r2t, token_to_kv_pool=pool, token_to_kv_pool_allocator=None, page_size=page_size,
        kv_index_translator=translator, sliding_window_size=None, decode_num_tokens_per_req=lambda: draft_tokens,
        model_config=model_config, is_draft_worker=False, spec_algorithm=None, device=device, gpu_id=0,
        kv_cache_dtype=kv_dtype, dtype=torch.bfloat16)
    return Env(runner, r2t, pool, translator, page_size, {})


def place(env: Env, row: int, length: int, seed: int = 0) -> None:
    """Give request `row` `length` positions on shuffled whole pages, as sglang's allocator would."""
    import torch

    p = env.page_size
    used = {pg for pages in env.pages.values() for pg in pages}
    free = [pg for pg in torch.randperm(env.kv_pool.size // p, generator=torch.Generator().manual_seed(seed + row))
            .tolist() if pg not in used and pg != 0]  # slot 0 is sglang's padding sink
    need = -(-length // p)
    pages = free[:need]
    env.pages[row] = pages
    pos = torch.arange(length)
    slots = torch.tensor(pages)[pos // p] * p + pos % p
    env.req_to_token_pool.req_to_token[row, :length] = slots.to(env.req_to_token_pool.req_to_token.device,
                                                                torch.int32)


def forward_batch(env: Env, mode, rows, seq_lens, q_len: int, *, spec_info=None):
    """A ForwardBatch stand-in with the fields the Triton backend reads; on 0.5.23 bound to a real
    KVLocPlan (which sets out_cache_loc), on 0.5.17 given out_cache_loc directly.

    seq_lens: sglang's convention per mode (verify: committed prefix; draft extend / decode:
    post-write length); the new tokens' slots are req_to_token[row, L - q_len : L]."""
    import torch

    dev = env.req_to_token_pool.req_to_token.device
    r2t = env.req_to_token_pool.req_to_token
    lens = torch.tensor(seq_lens, dtype=torch.int64, device=dev)
    full = [s + q_len if mode.is_target_verify() else s for s in seq_lens]
    write = torch.cat([r2t[r, f - q_len: f].long() for r, f in zip(rows, full)])
    idx = torch.tensor(rows, dtype=torch.int64, device=dev)
    n = len(rows)
    prefix = [f - q_len for f in full]
    # the new tokens' positions; FA3's graph capture sizes its buffers by positions.numel()
    positions = torch.cat([torch.arange(f - q_len, f) for f in full]).to(dev)
    fb = SimpleNamespace(
        forward_mode=mode, batch_size=n, req_pool_indices=idx, seq_lens=lens, seq_lens_sum=sum(full),
        seq_lens_cpu=lens.cpu(), spec_info=spec_info, encoder_lens=None, mha_one_shot=False,
        attn_attend_prefix_cache=False, positions=positions, dcp_kv_mask=None,
        extend_prefix_lens=torch.tensor(prefix, dtype=torch.int32, device=dev), extend_prefix_lens_cpu=prefix,
        extend_seq_lens=torch.tensor([q_len] * n, dtype=torch.int32, device=dev), extend_seq_lens_cpu=[q_len] * n)
    if env.translator is None:  # 0.5.17
        fb.out_cache_loc = write
        return fb
    from sglang.srt.mem_cache.kv_loc_plan import KVLocPlan

    plan = KVLocPlan(source=env.translator, req_pool_indices=idx, seq_lens=lens, seq_lens_cpu=None,
                     write_virtual=write)
    plan.bind(fb, env.translator)
    return fb


def verify_spec(q_len: int):
    """The EAGLE verify input fields the Triton backend reads (topk 1: a causal chain, no mask);
    `num_tokens_per_req` is 0.5.23's name, `draft_token_num` 0.5.17's."""
    return SimpleNamespace(num_tokens_per_req=q_len, draft_token_num=q_len, custom_mask=None, kv_indptr=None,
                           kv_indices=None)
