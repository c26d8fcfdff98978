"""The reusable workspace: plan tensors and partial buffers sized once per model config,
and SLOTS (resident main-kernel programs per SM x SMs) read off the device.

One workspace serves every layer and every CUDA-graph replay of batches up to
max_batch: buffers never move, so captured graphs stay valid. It holds one plan at
a time (vattn.plan() overwrites it; `live` is the Plan it returned last, and
vattn.attention() refuses any earlier one); use one workspace per live plan.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from vattn import switch
from vattn.backends import planned_backend
from vattn.contract import HEAD_DIMS, KV_DTYPES, MAX_GQA, MAX_Q_LEN, PAGE_SIZES, Q_DTYPES
from vattn.planner import PIECE_OVERHEAD_TILES, max_work_items

CPU_SLOTS = 16  # interpreter runs have no SMs; any positive count gives a valid plan


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _dtype_names():
    import torch

    return {getattr(torch, name): name for name in KV_DTYPES + Q_DTYPES}


def _listed(values) -> str:
    return ", ".join(map(str, values))


def _check_config(head_dim, num_q_heads, num_kv_heads, page_size, max_q_len, max_batch, kv_dtype, q_dtype):
    import torch

    def bad(arg, value, supported):
        raise ValueError(f"{arg}: got {value!r}; supported: {supported}")

    if head_dim not in HEAD_DIMS:
        bad("head_dim", head_dim, _listed(HEAD_DIMS))
    if page_size not in PAGE_SIZES:
        bad("page_size", page_size, _listed(PAGE_SIZES))
    if not isinstance(num_kv_heads, int) or num_kv_heads < 1:
        bad("num_kv_heads", num_kv_heads, "an int >= 1")
    if not isinstance(num_q_heads, int) or num_q_heads % num_kv_heads or not 1 <= num_q_heads // num_kv_heads <= MAX_GQA:
        bad("num_q_heads", num_q_heads, f"a multiple of num_kv_heads={num_kv_heads}, 1..{MAX_GQA} q heads per KV head")
    if not isinstance(max_q_len, int) or not 1 <= max_q_len <= MAX_Q_LEN:
        bad("max_q_len", max_q_len, f"1..{MAX_Q_LEN}")
    if not isinstance(max_batch, int) or max_batch < 1:
        bad("max_batch", max_batch, "an int >= 1")
    if kv_dtype not in [getattr(torch, name) for name in KV_DTYPES]:
        bad("kv_dtype", kv_dtype, _listed(f"torch.{name}" for name in KV_DTYPES))
    if q_dtype not in [getattr(torch, name) for name in Q_DTYPES]:
        bad("q_dtype", q_dtype, _listed(f"torch.{name}" for name in Q_DTYPES))


class Workspace:
    """Buffers and launch configuration for one model's attention layers.

    head_dim, num_q_heads, num_kv_heads, kv_dtype, q_dtype, page_size: the model's attention
    (fixed across layers). max_batch: the largest batch a plan may have. max_q_len: the
    largest q_len any call will see (1..8); the kernel packs max_q_len * G rows per tile.
    slots: override SLOTS (default: resident programs per SM x SMs, the occupancy of the main
    kernel that will serve this config, read at init: a registered faster backend's if it would
    serve it (vattn.backends.planned_backend), else the Triton kernel's). config: override the main kernel's
    compile-time config (vattn.kernel.MainConfig); one variant per workspace. qk: how the fp8-cache paths
    round Q for Q.K^T, "split" (accurate) or "e4m3" (lossy; vattn/switch.py's VATTN_QK while VATTN is on, read
    here when None); it picks the Hopper kernel's build and the default config (an explicit config's qk_fp8
    rules the Triton kernel). A bad value of the kernel switch that this reads (VATTN, VATTN_HOPPER, and
    VATTN_QK when qk is None) raises ValueError here.
    """

    def __init__(self, *, head_dim: int, num_q_heads: int, num_kv_heads: int, kv_dtype, q_dtype=None,
                 page_size: int = 16, max_q_len: int = MAX_Q_LEN, max_batch: int = 256, device=None,
                 slots: int | None = None, config=None, qk: str | None = None):
        import torch

        from vattn import kernel as K

        q_dtype = torch.bfloat16 if q_dtype is None else q_dtype
        _check_config(head_dim, num_q_heads, num_kv_heads, page_size, max_q_len, max_batch, kv_dtype, q_dtype)
        if device is None:
            device = "cpu" if interpreting() or not torch.cuda.is_available() else "cuda"
        self.device = torch.device(device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device: got {device!r}, but this torch sees no CUDA device; supported: a CUDA device "
                             f"torch can use (or cpu under TRITON_INTERPRET=1)")
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        if slots is not None and (not isinstance(slots, int) or slots < 1):
            raise ValueError(f"slots: got {slots!r}; supported: an int >= 1 (or None to read the device)")
        self.head_dim, self.num_q_heads, self.num_kv_heads = head_dim, num_q_heads, num_kv_heads
        self.gqa = num_q_heads // num_kv_heads
        self.kv_dtype, self.q_dtype, self.page_size = kv_dtype, q_dtype, page_size
        self.max_q_len, self.max_batch = max_q_len, max_batch
        self.programs_per_sm, self.kernel_info = None, {}
        switch.hopper()  # a bad VATTN / VATTN_HOPPER, which `import vattn` passed over, raises here
        self.qk = switch.qk_mode() if qk is None else switch.parse_qk(qk)
        self.config = config or K.default_config(head_dim, max_q_len * self.gqa, kv_dtype == _fp8(), self.qk)
        planned = planned_backend(self)
        # balanced weighs each piece by the fixed cost of the kernel that will run it
        overhead = planned and planned[0].piece_overhead_tiles
        self.piece_overhead = (overhead(self) if callable(overhead) else overhead) or PIECE_OVERHEAD_TILES
        # the plan lets that backend's main kernel launch at once, as its programmatic dependent (Backend.pdl)
        self.plan_lets_main_launch = bool(planned and planned[0].pdl)
        # programs that read several KV heads at once, or several programs a KV head (each a part of its query
        # heads): the plan splits for Hkv / p x s programs a piece
        pack = planned and planned[0].kv_heads_per_program
        self.kv_heads_per_program = (pack(self) if pack else None) or 1
        split = planned and planned[0].programs_per_kv_head
        self.programs_per_kv_head = (split(self) if split else None) or 1
        self.program_kv_heads = num_kv_heads // self.kv_heads_per_program * self.programs_per_kv_head
        # the dtype in which that backend's programs store the partials' O (Workspace.partials)
        dtype = planned and planned[0].partial_dtype
        self.program_partial_dtype = (dtype(self) if dtype else None) or torch.float32
        self.slots = slots if slots is not None else self._measure_slots(planned)
        self._alloc()
        # vattn.plan's Plan per (batch, mode): views of the buffers, so one object serves every call
        self.plans: dict = {}
        # vattn.plan's checked call signatures (see vattn.plans.plan_signature) -> the call's launch
        self.plan_calls: dict = {}
        self.live = None  # the Plan vattn.plan returned last: the one whose work items the buffers hold

    def _alloc(self) -> None:
        import torch

        width = max_work_items(self.max_batch, self.program_kv_heads, self.slots)
        i32 = dict(dtype=torch.int32, device=self.device)
        self.plan_buffers = {f: torch.full((width,), -1, **i32) for f in ("work_seq", "work_part", "work_order")}
        self.plan_buffers.update({f: torch.zeros(width, **i32) for f in ("work_start", "work_end")})
        self.plan_buffers["seq_part_start"] = torch.zeros(self.max_batch + 1, **i32)
        self.plan_buffers["num_items"] = torch.zeros(1, **i32)
        qrows = self.max_q_len * self.gqa
        f32 = dict(dtype=torch.float32, device=self.device)
        # O_part [W, Hkv, QROWS, D] fp32 (normalised), lse2_part [W, Hkv, QROWS] fp32: one KV head a program. A
        # backend whose programs read p KV heads (or s programs one), or store O in bf16, takes the same memory as
        # [W, Hkv / p x s, p / s x QROWS, D] of its dtype (partials)
        self.o_part = torch.empty(width, self.num_kv_heads, qrows, self.head_dim, **f32)
        self.lse_part = torch.empty(width, self.num_kv_heads, qrows, **f32)

    def partials(self, by_program: bool = False) -> tuple:
        """(o_part, lse_part, query heads a program): the partials as the Triton kernel writes them (one KV head a
        program, fp32), or by_program as the planned backend's programs write them (kv_heads_per_program heads or
        1 / programs_per_kv_head of one, O in program_partial_dtype). Views of the same memory."""
        p, s = (self.kv_heads_per_program, self.programs_per_kv_head) if by_program else (1, 1)
        dtype = self.program_partial_dtype if by_program else self.o_part.dtype
        if p == s == 1 and dtype == self.o_part.dtype:
            return self.o_part, self.lse_part, self.gqa
        width, gqa = self.o_part.shape[0], self.gqa * p // s
        o_part = self.o_part.view(-1).view(dtype)[:self.o_part.numel()]  # a narrower dtype: the first bytes
        heads, rows = self.num_kv_heads // p * s, self.max_q_len * gqa
        return (o_part.view(width, heads, rows, self.head_dim), self.lse_part.view(width, heads, rows), gqa)

    def _measure_slots(self, fast) -> int:
        if self.device.type != "cuda" or interpreting():
            return CPU_SLOTS
        import torch

        props = torch.cuda.get_device_properties(self.device)
        if fast:  # a faster backend will serve these calls: its kernel's slots, not Triton's
            self.kernel_info = {"backend": fast[0].name}
            self.programs_per_sm = fast[1]
            return fast[1] * props.multi_processor_count
        compiled = self._warmup()
        self.programs_per_sm = resident_programs_per_sm(compiled, props)
        self.kernel_info = {k: getattr(compiled, k, None) for k in ("n_regs", "n_spills")}
        self.kernel_info["shared"] = getattr(getattr(compiled, "metadata", None), "shared", None)
        return self.programs_per_sm * props.multi_processor_count

    def _warmup(self):
        """Compile (not launch) the main kernel for this config on tiny stand-in tensors."""
        import torch

        from vattn import kernel as K

        dev, d, hkv, max_q_len = self.device, self.head_dim, self.num_kv_heads, self.max_q_len
        q = torch.zeros(1, self.num_q_heads, d, dtype=self.q_dtype, device=dev)
        kv = torch.zeros(1, self.page_size, hkv, d, device=dev).to(self.kv_dtype)
        i32 = torch.zeros(2, dtype=torch.int32, device=dev)
        scale = torch.ones(1, dtype=torch.float32, device=dev)
        o = torch.zeros(1, hkv, max_q_len * self.gqa, d, dtype=torch.float32, device=dev)
        lse = torch.zeros(1, hkv, max_q_len * self.gqa, dtype=torch.float32, device=dev)
        plan = {f: i32 for f in ("work_seq", "work_start", "work_end", "work_part", "work_order")}
        descale = scale if self.kv_dtype == _fp8() else None
        args, kwargs = K.main_launch_args(q, kv, kv, i32.view(1, 2), i32, i32, descale, descale, 1.0, plan,
                                          o, lse, gqa=self.gqa, max_q_len=max_q_len,
                                          config=self.config)
        return K._attn_main_kernel.warmup(*args, grid=(hkv, 1), **kwargs)

    def describe(self) -> dict:
        return dict(head_dim=self.head_dim, num_q_heads=self.num_q_heads, num_kv_heads=self.num_kv_heads,
                    kv_dtype=_dtype_names()[self.kv_dtype], q_dtype=_dtype_names()[self.q_dtype],
                    page_size=self.page_size, max_q_len=self.max_q_len, max_batch=self.max_batch,
                    device=str(self.device), slots=self.slots, piece_overhead_tiles=self.piece_overhead,
                    kv_heads_per_program=self.kv_heads_per_program, programs_per_kv_head=self.programs_per_kv_head,
                    program_partial_dtype=str(self.program_partial_dtype).removeprefix("torch."),
                    config=self.config.__dict__)


@dataclass(frozen=True)
class Plan:
    """A batch's work list, living in its workspace's buffers (valid until the next plan()). vattn.plan
    returns the same object for the same workspace, batch size and mode: only the buffers' values change.
    The workspace remembers the plan its latest plan() returned (Workspace.live): attention() refuses any
    other, whose views now hold another batch's work items."""

    tensors: dict  # planner.FIELDS -> int32 tensors ([W] work_*, [B+1] seq_part_start, [1] num_items)
    batch: int
    num_work_items: int  # W for this batch size
    mode: str
    workspace: Workspace
    # attention()'s checked call signatures (_attention_signature) -> the call's launches, and the last
    # one used (a tuple compare is cheaper than hashing it: most calls repeat the previous signature)
    calls: dict = field(default_factory=dict, compare=False, repr=False)
    last: list = field(default_factory=lambda: [None, None, None], compare=False, repr=False)  # + its Shortcut
    single: list = field(default_factory=lambda: [False], compare=False, repr=False)  # set by each plan()
    # (query tokens, longest KV length of a sequence with queries) where plan() read the lengths on the host
    # (a CPU workspace), else None: attention() checks q and block_tables against them at no cost
    host: list = field(default_factory=lambda: [None], compare=False, repr=False)

    @property
    def single_pieces(self) -> bool:
        """The caller's max_seq_len showed that every sequence is one piece, so a backend that writes whole
        sequences itself needs no reduce: attention() then skips its launch (outside graph capture)."""
        return self.single[0]


def _fp8():
    import torch

    return torch.float8_e4m3fn


def resident_programs_per_sm(compiled, props) -> int:
    """Occupancy of one compiled Triton kernel: the tightest of registers, shared memory and
    warps per SM. Falls back to 1 (never over-subscribe) when the compiler's numbers are missing."""
    try:
        compiled._init_handles()
        n_regs, warps = int(compiled.n_regs), int(compiled.metadata.num_warps)
        shared = int(compiled.metadata.shared)
    except Exception:  # older/newer Triton without these fields: a safe, documented default
        return 1
    regs_per_sm = getattr(props, "regs_per_multiprocessor", 65536)
    smem_per_sm = getattr(props, "shared_memory_per_multiprocessor", 233472)
    threads_per_sm = getattr(props, "max_threads_per_multi_processor", 2048)
    regs_per_warp = -(-max(n_regs, 1) * 32 // 256) * 256  # allocated per warp in 256-register units
    by_regs = (regs_per_sm // regs_per_warp) // warps
    by_smem = smem_per_sm // (shared + 1024) if shared else 32  # 1 KB reserved per block
    by_threads = threads_per_sm // (32 * warps)
    return max(1, min(by_regs, by_smem, by_threads, 32))
