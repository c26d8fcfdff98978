"""vattn as an sglang attention backend: `register()` makes `--attention-backend vattn` valid.

Three registrations, all through sglang's own extension points, none of them editing sglang:
- its attention-backend registry (`register_attention_backend("vattn")`), which builds the
  target model's backend and the draft model's main backend;
- the CLI choices (`add_attention_backend_choices`, `add_draft_attention_backend_choices`);
- EAGLE's draft backend factory, whose backend maps are local dicts: `vattn` is added to them
  (draft extend -> VattnAttnBackend; the multi-step draft decode -> sglang's Triton container,
  since its steps read a per-step chain rather than req_to_token).
Importing this package imports nothing heavy; `register()` imports sglang.
"""
from __future__ import annotations

NAME = "vattn"
_registered = False


def register() -> None:
    """Idempotent. Call before sglang parses its arguments (vattn.sglang.launch does)."""
    global _registered
    if _registered:
        return
    from sglang.srt.arg_groups import choices
    from sglang.srt.layers.attention import attention_registry

    from vattn.sglang.backend import create_vattn_backend

    attention_registry.register_attention_backend(NAME)(create_vattn_backend)
    if NAME not in choices.ATTENTION_BACKEND_CHOICES:
        choices.add_attention_backend_choices([NAME])
    if NAME not in choices.DRAFT_ATTENTION_BACKEND_CHOICES:
        choices.add_draft_attention_backend_choices([NAME])
    _hook_draft_factory()
    _registered = True


def _hook_draft_factory() -> None:
    from sglang.srt.speculative.draft_utils import DraftBackendFactory

    original = DraftBackendFactory._create_backend
    if getattr(original, "_vattn_hook", False):
        return

    def _create_backend(self, backend_name, backend_map, error_template, stamps_children=False):
        if NAME not in backend_map and "triton" in backend_map:
            backend_map = dict(backend_map)
            if stamps_children:  # the multi-step draft decode container
                backend_map[NAME] = backend_map["triton"]
            else:
                backend_map[NAME] = lambda: (NAME, _draft_backend(self.draft_model_runner))
        # through the attribute, not the closure, so tests can stand in for sglang's method
        return _create_backend.__wrapped__(self, backend_name, backend_map, error_template, stamps_children)

    _create_backend._vattn_hook = True
    _create_backend.__wrapped__ = original
    DraftBackendFactory._create_backend = _create_backend


def _draft_backend(draft_model_runner):
    from vattn.sglang.backend import VattnAttnBackend

    return VattnAttnBackend(draft_model_runner, skip_prefill=False)
