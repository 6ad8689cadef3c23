"""PPO with a critic: the value model (HF Qwen2ForTokenClassification as the reference), GAE, the
advantage whitening and the clipped value loss against plain NumPy references."""

import json
import os
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from hf_models import TINY_SHAPES, build_hf_model
from transformers import AutoModelForTokenClassification

from hgpo_jax.models import Qwen2Critic, load_pretrained, save_pretrained


def test_critic_from_a_causal_lm_folder_exports_as_token_classification(tmp_path):
    """The critic starts from the policy's folder (backbone loaded, LM head never read, a new
    N(0, 0.02) head with zero bias), exports as transformers' Qwen2ForTokenClassification (one
    label) whose outputs are our values, and loads back with its head."""
    for name in ("untied_gqa1", "tied_gqa2"):
        src = tmp_path / f"lm-{name}"
        build_hf_model(TINY_SHAPES[name], src)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # an unused lm_head.weight is expected, not warned about
            critic = load_pretrained(src, critic=True, seed=3)
        policy = load_pretrained(src)
        assert isinstance(critic, Qwen2Critic) and critic.lm_head is None
        np.testing.assert_array_equal(np.asarray(critic.model.embed_tokens.embedding[...]),
                                      np.asarray(policy.model.embed_tokens.embedding[...]))
        kernel, bias = np.asarray(critic.score.kernel[...]), np.asarray(critic.score.bias[...])
        assert kernel.shape == (TINY_SHAPES[name]["hidden_size"], 1) and (bias == 0).all()
        assert 0.01 < kernel.std() < 0.03
        with pytest.raises(TypeError, match="no LM head"):
            critic.logits(jnp.zeros((1, 1, kernel.shape[0])))

        ids = np.random.RandomState(0).randint(0, TINY_SHAPES[name]["vocab_size"], (2, 9))
        mask = np.ones_like(ids)
        mask[1, 6:] = 0
        ours = np.asarray(critic(jnp.asarray(ids), attention_mask=jnp.asarray(mask)))
        assert ours.shape == (2, 9) and ours.dtype == np.float32

        out = tmp_path / f"critic-{name}"
        save_pretrained(critic, out)
        cfg = json.loads((out / "config.json").read_text())
        assert cfg["architectures"] == ["Qwen2ForTokenClassification"] and len(cfg["id2label"]) == 1
        hf = AutoModelForTokenClassification.from_pretrained(out, dtype=torch.float32).eval()
        with torch.no_grad():
            ref = hf(torch.tensor(ids), attention_mask=torch.tensor(mask)).logits[..., 0].numpy()
        np.testing.assert_allclose(ours * mask, ref * mask, atol=2e-5)
        again = load_pretrained(out, critic=True, seed=99)  # the exported head, not a new one
        np.testing.assert_array_equal(np.asarray(again.score.kernel[...]), kernel)
        assert not os.path.exists(out / "lm_head.safetensors")
