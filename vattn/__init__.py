"""vattn: paged few-query attention (verify / draft-extend / decode) with split planning.

Public API (KERNEL.md): Workspace, plan, attention, reference; Plan and Backend for callers
that keep plans or add a faster path behind the same API (see vattn.api's docstring).
Importing vattn is cheap: torch and triton load on first use.

Modules: contract (supported shapes, tolerances), planner (split planners), workspace, kernel
(Triton), launcher (cached Triton launches), backends (the dispatch registry), plans (vattn.plan), checks
(argument checks), api (vattn.attention), reference (fp32
oracle), cost (cost model), hopper (the sm_90a CUDA kernel, opt-in with VATTN_HOPPER=1), sglang (backend
plugin).
"""

from __future__ import annotations

from vattn.api import Backend, attention, register_backend
from vattn.plans import plan
from vattn.hopper import backend as _hopper
from vattn.reference import reference
from vattn.workspace import Plan, Workspace

try:
    _hopper_on = _hopper.enabled()  # opt-in (vattn.hopper.backend), while VATTN is on
except ValueError:  # a bad VATTN / VATTN_HOPPER: the first Workspace names it (importing vattn never fails on it)
    _hopper_on = False
if _hopper_on:
    register_backend(_hopper.BACKEND)

__all__ = ["Workspace", "Plan", "Backend", "plan", "attention", "reference", "register_backend"]
