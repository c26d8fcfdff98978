"""Triton kernels compiled for sm_90 on a machine without a GPU, as JITFunction.run would compile them for these
arguments (its binder's specialisation: dtypes, 16-byte alignment, ints equal to 1 and None made constexprs), so
that vattn.launcher.native_params can be checked against the PTX Triton really emits.

Run as a script (`python tests/vattn/sm90_compile.py`), it compiles vattn's three Triton kernels with the
arguments vattn binds them with and prints, per kernel, the parameters native_params packs and the PTX's
parameter widths, as JSON (a pointer frozen at bind time as "frozen"). A subprocess, because the kernels must be
JITFunctions: under TRITON_INTERPRET=1 (set by other tests before vattn.kernel's import) they are not.
"""

from __future__ import annotations

import json
import sys


def compile_as_jit(fn, args: tuple, kwargs: dict):
    """The CompiledKernel JITFunction.run would build for fn(*args, **kwargs) on an sm_90 GPU (Triton 3.9's
    binder and packing, without a driver)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature

    target = GPUTarget("cuda", 90, 32)
    backend = make_backend(target)
    bound, spec, options = create_function_from_signature(fn.signature, fn.params, backend)(*args, **kwargs)
    options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound, spec, options)
    return triton.compile(ASTSource(fn, signature, constexprs, attrs), target=target, options=options.__dict__)


def full_args(fn, args: tuple, kwargs: dict) -> tuple:
    """Every parameter in order, constexprs from kwargs or their defaults (as vattn.launcher.Kernel.full_args)."""
    it = iter(args)
    return tuple((kwargs.get(p.name, p.default) if p.is_constexpr else next(it)) for p in fn.params)


def packed(fn, args: tuple, kwargs: dict, live: tuple) -> dict:
    """native_params of fn compiled for these arguments, with the PTX's parameter widths."""
    from vattn import launcher

    compiled = compile_as_jit(fn, args, kwargs)
    runtime = [i for i, p in enumerate(fn.params) if not p.is_constexpr]
    full = full_args(fn, args, kwargs)
    params = launcher.native_params(compiled, full, [runtime[i] for i in live])
    frozen = {a.data_ptr() for i, a in enumerate(args) if i not in live and hasattr(a, "data_ptr")}
    return dict(params=None if params is None else [
        ["u64", "frozen"] if kind == "u64" and rest[0] in frozen else [kind, *rest] for kind, *rest in params],
        ptx=launcher.ptx_param_bytes(compiled.asm["ptx"], compiled.metadata.name),
        live=[runtime[i] for i in live])


def vattns_kernels() -> dict:
    """Each of vattn's Triton kernels, packed for arguments of the shapes vattn binds (CPU tensors)."""
    import torch

    from vattn import kernel as K
    from vattn.planner import PLAN_LIVE, _plan_kernel, plan_launch_args

    i32 = dict(dtype=torch.int32)
    batch, width = 4, 32
    plan = {f: torch.zeros(width, **i32) for f in ("work_seq", "work_start", "work_end", "work_part", "work_order")}
    plan["seq_part_start"], plan["num_items"] = torch.zeros(batch + 1, **i32), torch.zeros(1, **i32)
    lens, cu = torch.zeros(batch, **i32), torch.zeros(batch + 1, **i32)
    out = {}
    args, kwargs = plan_launch_args(lens, cu, plan, num_kv_heads=1, slots=264, mode="balanced", let_next_launch=True)
    out["plan"] = packed(_plan_kernel(), args, kwargs, PLAN_LIVE)
    o_part, lse_part = torch.zeros(width, 1, 64, 256, dtype=torch.bfloat16), torch.zeros(width, 1, 64)
    q = torch.zeros(16, 16, 256, dtype=torch.bfloat16)
    _, args, kwargs = K.reduce_launch_args(o_part, lse_part, plan["seq_part_start"], cu, torch.zeros_like(q), gqa=16,
                                           max_q_len=4, skip_whole=True)
    out["reduce"] = packed(K._reduce_kernel, args, kwargs, K.REDUCE_LIVE)
    fp8 = torch.float8_e4m3fn
    k_cache, v_cache = torch.zeros(100, 16, 1, 256, dtype=fp8), torch.zeros(100, 16, 1, 256, dtype=fp8)
    args, kwargs = K.main_launch_args(q, k_cache, v_cache, torch.zeros(batch, 25, **i32), lens, cu, torch.ones(1),
                                      torch.ones(1), 0.0625, plan, o_part.float(), lse_part, gqa=16, max_q_len=4,
                                      config=K.default_config(256, 64, True))
    out["main"] = packed(K._attn_main_kernel, args, kwargs, K.MAIN_LIVE)
    return out


if __name__ == "__main__":
    json.dump(vattns_kernels(), sys.stdout)
