"""The attention backends' registry: their dispatch order and the ones that failed. vattn.api dispatches each
call through it (its portable Triton path, vattn.api.TRITON, is the last entry and takes every call), and
vattn.workspace reads it to plan for the backend that will serve a workspace's calls. Pure Python."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Backend:
    """An implementation of attention() behind the same API (the dispatch point).

    supports(workspace, q, k_cache) -> bool: host-only decision (no value reads).
    run(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, k_descale, v_descale,
        softmax_scale, plan, out) -> None: writes out [T, Hq, D].
    bind_main(same arguments but out) -> launch(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q,
        k_descale, v_descale, out), optional: its main kernel alone (the workspace's partials) bound for calls
        of one signature. attention() then runs it and vattn's bound reduce; a benchmark times it apart.
    slots_per_sm(workspace) -> int | None: the CTAs per SM its main kernel keeps resident on the calls it
        would serve with this workspace, or None (it would serve none). A workspace plans for the first
        registered backend that answers, as the split must fill that kernel's slots.
    writes_whole: its main kernel writes out's rows of every sequence that is one piece of the plan, and
        vattn's reduce skips those (launch_reduce's skip_whole); else it writes partials only.
    piece_overhead_tiles: its main kernel's fixed cost per piece, in 64-token tiles of streaming, by which the
        balanced planner weighs pieces, or a function of the workspace giving it (None:
        vattn.planner.PIECE_OVERHEAD_TILES, the Triton kernel's).
    kv_heads_per_program: KV heads one program of its main kernel reads together (a function of the workspace, or
        None: one). A workspace then plans Hkv / that many programs a piece, and its partials hold a program's
        query heads' rows (Workspace.partials).
    programs_per_kv_head: programs of its main kernel that share one KV head, each taking an equal part of its query
        heads (a function of the workspace, or None: one). A workspace then plans Hkv x that many programs a piece,
        and its partials hold a program's part of the rows (Workspace.partials).
    partial_dtype: the torch dtype its main kernel stores the partials' O in (a function of the workspace), or
        None: fp32. A workspace gives it those partials in that dtype (Workspace.partials), in the memory of its
        fp32 ones; vattn's reduce reads either.
    pdl: its main kernel goes as a programmatic dependent of the kernel before it (Hopper's griddepcontrol: vattn's
        plan lets it launch at once, and it waits for that kernel after its prologue), and lets the next kernel
        launch before it ends: vattn's reduce then goes as its programmatic dependent where that pays
        (launch_reduce's pdl).
    bind_reduce(plan, cu_seqlens_q, out) -> reduce(cu_seqlens_q, out) | None, optional: its own reduce of the
        partials its main kernel wrote, bound for calls of one signature, merging as launch_reduce with
        skip_whole=writes_whole and pdl would; None where vattn's (Triton) reduce takes the call.
    """

    name: str
    supports: Callable
    run: Callable
    bind_main: Callable | None = None
    slots_per_sm: Callable = lambda ws: None
    writes_whole: bool = False
    piece_overhead_tiles: int | Callable | None = None
    kv_heads_per_program: Callable | None = None
    programs_per_kv_head: Callable | None = None
    partial_dtype: Callable | None = None
    pdl: bool = False
    bind_reduce: Callable | None = None


BACKENDS: list[Backend] = []  # dispatch order
FAILED: set[str] = set()  # names of the backends that raised once: every later call skips them
REGISTRATIONS = [0]  # part of every call signature: a call bound before a registration is dispatched again


def register_backend(backend: Backend) -> None:
    """Put a backend ahead of the others (the portable Triton path stays last)."""
    BACKENDS.insert(0, backend)
    REGISTRATIONS[0] += 1


def planned_backend(ws) -> tuple[Backend, int] | None:
    """(backend, CTAs per SM) of the first registered backend that would serve this workspace's calls and
    names its slots; None: the Triton kernel's own occupancy and piece overhead plan the workspace's calls."""
    for b in BACKENDS:
        if b.name not in FAILED:
            spm = b.slots_per_sm(ws)
            if spm:
                return b, spm
    return None
