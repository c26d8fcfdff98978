"""`--vattn-dummy-init scaled`: the launcher option, the initialisation itself on a small torch model, and the
patch of the installed sglang's model loader (0.5.17 or 0.5.23)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import sglang_env  # noqa: E402

sglang_env.require_sglang()

import torch  # noqa: E402

from vattn.sglang import dummy_init, options  # noqa: E402


@pytest.mark.parametrize("argv, rest, env", [
    (["--model-path", "m", "--vattn-dummy-init", "scaled", "--tp", "2"], ["--model-path", "m", "--tp", "2"],
     {"VATTN_DUMMY_INIT": "scaled"}),
    (["--vattn-dummy-init=Scaled", "--vattn-base", "fa3"], [], {"VATTN_DUMMY_INIT": "scaled", "VATTN_BASE": "fa3"}),
    (["--load-format", "dummy"], ["--load-format", "dummy"], {}),
])
def test_the_option_is_stripped_and_exported(argv, rest, env):
    assert options.strip(argv) == (rest, env)


@pytest.mark.parametrize("argv, message", [
    (["--vattn-dummy-init", "normal"], r"--vattn-dummy-init: got 'normal'; allowed: sglang, scaled"),
    (["--vattn-dummy-init"], r"--vattn-dummy-init: needs a value; allowed: sglang, scaled"),
])
def test_a_bad_value_names_the_option_and_what_is_allowed(argv, message):
    with pytest.raises(ValueError, match=message):
        options.strip(argv)


class _Block(torch.nn.Module):
    def __init__(self, d=64):
        super().__init__()
        self.input_layernorm = torch.nn.LayerNorm(d)
        self.q_proj = torch.nn.Linear(d, d)
        self.k_proj = torch.nn.Linear(d, d, bias=False)
        self.o_proj = torch.nn.Linear(d, 2 * d, bias=False).to(torch.bfloat16)


def test_scaled_keeps_each_matrix_at_unit_gain_norms_at_one_biases_at_zero():
    model = _Block()
    dummy_init.scaled_init(model)
    assert torch.equal(model.input_layernorm.weight, torch.ones(64))
    assert torch.equal(model.input_layernorm.bias, torch.zeros(64))  # "norm" in its name: a norm's bias
    assert torch.equal(model.q_proj.bias, torch.zeros(64))
    for w in (model.q_proj.weight, model.k_proj.weight, model.o_proj.weight):
        std = w.float().std().item()
        assert 0.9 * 64 ** -0.5 < std < 1.1 * 64 ** -0.5, std
    # unlike sglang's one seed for every parameter, same-shaped matrices differ
    assert not torch.equal(model.q_proj.weight, model.k_proj.weight)
    # and a second launch draws the same model
    again = _Block()
    dummy_init.scaled_init(again)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), again.parameters()))


def test_a_vector_through_scaled_layers_keeps_its_scale_where_sglangs_shrinks_it():
    """Why the option exists: sglang's uniform(-1e-3, 1e-3) takes ~1e-3 off a vector at each projection, so
    attention's output vanishes beside the residual stream and every prompt gets the same answer."""
    from sglang.srt.model_loader.weight_utils import initialize_dummy_weights

    x = torch.randn(8, 64)
    gains = {}
    for name, init in (("sglang", initialize_dummy_weights), ("scaled", dummy_init.scaled_init)):
        model = _Block().float()
        init(model)
        gains[name] = (model.k_proj(x).norm() / x.norm()).item()
    assert 0.5 < gains["scaled"] < 2.0 and gains["sglang"] < 0.01, gains


def test_install_patches_the_loader_only_when_asked(monkeypatch):
    from sglang.srt.model_loader import loader

    monkeypatch.setattr(loader, "initialize_dummy_weights", loader.initialize_dummy_weights)
    own = loader.initialize_dummy_weights
    monkeypatch.delenv("VATTN_DUMMY_INIT", raising=False)
    assert dummy_init.install() is False and loader.initialize_dummy_weights is own
    monkeypatch.setenv("VATTN_DUMMY_INIT", "sglang")
    assert dummy_init.install() is False and loader.initialize_dummy_weights is own
    monkeypatch.setenv("VATTN_DUMMY_INIT", "scaled")
    assert dummy_init.install() is True and loader.initialize_dummy_weights is dummy_init.scaled_init
    monkeypatch.setenv("VATTN_DUMMY_INIT", "xavier")
    with pytest.raises(ValueError, match="VATTN_DUMMY_INIT: got 'xavier'"):
        dummy_init.install()
