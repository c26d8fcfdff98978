"""vattn as an sglang attention backend: `register()` makes `--attention-backend vattn` valid.

Three registrations, all through sglang's own extension points, none of them editing sglang:
- its attention-backend registry (`register_attention_backend("vattn")`), which builds the
  target model's backend and the draft model's main backend;
- the CLI choices (`add_attention_backend_choices`, `add_draft_attention_backend_choices`);
- EAGLE's draft backend factory, whose backend maps are local dicts: `vattn` is added to them
  (draft extend -> the base's draft-extend backend wrapped in VattnAttnBackend; the multi-step
  draft decode -> the base's own container, since its steps read a per-step chain rather than
  req_to_token).
Importing this package imports nothing heavy; `register()` imports sglang.
"""
from __future__ import annotations

import functools
import os

NAME = "vattn"
_registered = False


def register() -> None:
    """Idempotent. Call before sglang parses its arguments (vattn.sglang.launch does)."""
    global _registered
    if _registered:
        return
    from sglang.srt.layers.attention import attention_registry

    from vattn.sglang.backend import create_vattn_backend

    attention_registry.register_attention_backend(NAME)(create_vattn_backend)
    _add_cli_choices()
    _hook_draft_factory()
    _registered = True


def _add_cli_choices() -> None:
    """`--attention-backend vattn` (and the prefill/decode variants). sglang 0.5.23 keeps the lists
    in arg_groups.choices with a separate draft list; 0.5.17 keeps one list in server_args, which
    `--speculative-draft-attention-backend` does not restrict."""
    try:
        from sglang.srt.arg_groups import choices
    except ImportError:  # sglang 0.5.17
        from sglang.srt import server_args as choices
    if NAME not in choices.ATTENTION_BACKEND_CHOICES:
        choices.add_attention_backend_choices([NAME])
    drafts = getattr(choices, "DRAFT_ATTENTION_BACKEND_CHOICES", None)
    if drafts is not None and NAME not in drafts:
        choices.add_draft_attention_backend_choices([NAME])
    if os.environ.get("VATTN_DETERMINISTIC", "").strip() == "1":
        # opt-in: sglang's --enable-deterministic-inference checks the backend *name*; the base
        # receives sglang's deterministic settings as usual, but vattn's split plan depends on
        # the batch, so the on arm is not batch-invariant (the A/A baseline measures the rest)
        for listed in ("DETERMINISTIC_ATTENTION_BACKEND_CHOICES", "RADIX_SUPPORTED_DETERMINISTIC_ATTENTION_BACKEND"):
            names = getattr(choices, listed, None)
            if names is not None and NAME not in names:
                names.append(NAME)


def _hook_draft_factory() -> None:
    from sglang.srt.speculative.draft_utils import DraftBackendFactory

    original = DraftBackendFactory._create_backend
    if getattr(original, "_vattn_hook", False):
        return

    def _create_backend(self, backend_name, backend_map, error_template, *args, **kwargs):
        if NAME not in backend_map:
            backend_map = _with_vattn(self.draft_model_runner, backend_map, _multistep(backend_map, args, kwargs))
        # through the attribute, not the closure, so tests can stand in for sglang's method
        return _create_backend.__wrapped__(self, backend_name, backend_map, error_template, *args, **kwargs)

    _create_backend._vattn_hook = True
    _create_backend.__wrapped__ = original
    DraftBackendFactory._create_backend = _create_backend


def _multistep(backend_map: dict, args, kwargs) -> bool:
    """Is this the multi-step draft decode container's map? sglang 0.5.23 says so
    (`stamps_children`); 0.5.17's maps differ only in their creators, `_create_*_decode_backend`."""
    if "stamps_children" in kwargs:
        return bool(kwargs["stamps_children"])
    if args:
        return bool(args[0])
    return all(getattr(fn, "__name__", "").endswith("_decode_backend") for fn in backend_map.values())


def _with_vattn(draft_model_runner, backend_map: dict, multistep: bool) -> dict:
    """A copy of the factory's map with a `vattn` entry, resolved only if sglang picks it (every sglang
    process registers vattn through the plugin entry point, drafts on other backends included): the
    base's own entry (multi-step draft decode, left to the base: its steps read a per-step chain)
    or the base's draft-extend backend, wrapped."""
    backend_map = dict(backend_map)
    backend_map[NAME] = functools.partial(_draft_entry, draft_model_runner, dict(backend_map), multistep)
    return backend_map


def _draft_entry(draft_model_runner, backend_map: dict, multistep: bool):
    from vattn.sglang import base as base_choice

    name, source = base_choice.resolve(draft_model_runner)
    if name not in backend_map:  # sglang's own error would name `vattn`, not the base it lacks
        which = "multi-step draft decode" if multistep else "draft-extend"
        raise ValueError(f"vattn base {name!r} ({source}) has no entry in sglang's {which} backend map; "
                         f"allowed: {', '.join(sorted(backend_map))} (pass --vattn-base)")
    if multistep:
        return backend_map[name]()
    return _wrapped_draft_extend(draft_model_runner, backend_map[name], name)


def _wrapped_draft_extend(draft_model_runner, make_base, name: str):
    from vattn.sglang import compat
    from vattn.sglang.backend import wrap

    return compat.wrap_draft_entry(make_base(), lambda b: wrap(b, draft_model_runner, name))
