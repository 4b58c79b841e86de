"""The EAGLE-3 head: TTT training computes what vLLM's drafting loop computes, and the
checkpoint round-trips in the layout vLLM loads."""

import json
import math

import pytest
import torch
import torch.nn.functional as F

from specrl.draft.aux_layers import default_aux_layer_ids, gather_aux_hidden_states, validate_aux_layer_ids
from specrl.draft.eagle3 import Eagle3Config, Eagle3Head, _rope, ttt_loss

CFG = Eagle3Config(
    hidden_size=32,
    intermediate_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    vocab_size=20,
    aux_layer_ids=(2, 3, 5),
    target_num_layers=8,
)


def make_head(seed=0):
    torch.manual_seed(seed)
    head = Eagle3Head(CFG, torch.randn(CFG.vocab_size, CFG.hidden_size))
    for p in head.parameters():  # non-trivial norms too
        if p.requires_grad:
            p.data.add_(0.1 * torch.randn_like(p))
    return head


def step_like_vllm(head, token, hidden, pos, cache_k, cache_v):
    """One drafting forward for one token, appending its K/V to the cache (vLLM's loop)."""
    layer = head.midlayer
    attn = layer.self_attn
    emb = layer.input_layernorm(head.embed(torch.tensor([[token]])))
    x = torch.cat([emb, layer.hidden_norm(hidden)], -1)
    q, k, v = attn.qkv(x, torch.tensor([[pos]]))
    cache_k.append(k)
    cache_v.append(v)
    keys, vals = torch.cat(cache_k, 2), torch.cat(cache_v, 2)
    p = torch.softmax(q @ keys.transpose(-1, -2) / math.sqrt(attn.head_dim), -1)
    out = attn.o_proj((p @ vals).transpose(1, 2).reshape(1, 1, -1))
    residual = out + hidden
    pre = layer.mlp(layer.post_attention_layernorm(residual)) + residual
    return head.lm_head(head.norm(pre)), pre


@torch.no_grad()
def test_ttt_forward_equals_the_inference_drafting_loop():
    head = make_head()
    T, steps = 9, 3
    aux = torch.randn(1, T, 3 * CFG.hidden_size)
    ids = torch.randint(0, CFG.vocab_size, (1, T))
    ttt = head.ttt_forward(aux, ids, steps)
    fc = head.fc(aux)
    for t in range(T - steps - 1):
        cache_k, cache_v = [], []
        # the verified prefix: step-0 entries for positions 0..t
        for s in range(t + 1):
            logits, pre = step_like_vllm(head, ids[0, s + 1].item(), fc[:, s : s + 1], s, cache_k, cache_v)
        assert torch.allclose(logits[0, 0], ttt[0][0, t], atol=1e-5)
        for j in range(1, steps):  # drafting continues from the previous pre-norm hidden
            logits, pre = step_like_vllm(head, ids[0, t + 1 + j].item(), pre, t + j, cache_k, cache_v)
            assert torch.allclose(logits[0, 0], ttt[j][0, t], atol=1e-5), (t, j)


def test_rope_is_neox_style_rotation():
    x = torch.randn(1, 1, 3, 8)
    r = _rope(x, torch.tensor([[0, 1, 2]]), 10000.0)
    assert torch.allclose(r[..., 0, :], x[..., 0, :])
    assert torch.allclose(r.norm(dim=-1), x.norm(dim=-1), atol=1e-5)


def test_ttt_loss_is_zero_gradient_at_the_target():
    torch.manual_seed(0)
    B, T, V = 2, 6, CFG.vocab_size
    target = F.log_softmax(torch.randn(B, T, V), -1)
    # step j is scored against the target shifted by 1 + j
    shifted = [F.pad(target[:, 1 + j :], (0, 0, 0, 1 + j)).clone().requires_grad_(True) for j in range(2)]
    loss, stats = ttt_loss(shifted, target, torch.ones(B, T))
    loss.backward()
    for lg, j in zip(shifted, range(2)):
        assert lg.grad[:, : T - 1 - j].abs().max() < 1e-6
    assert stats["top1_agreement"] == [1.0, 1.0]


def test_ttt_loss_on_topk_targets_equals_the_dense_loss_with_zero_mass_outside():
    """Online adaptation scores a top-k capture without spreading it over the vocabulary;
    loss, gradient and agreement must be those of the densified distribution."""
    torch.manual_seed(1)
    B, T, V, k = 2, 7, CFG.vocab_size, 5
    lp, ids = F.log_softmax(torch.randn(B, T, V), -1).topk(k, dim=-1)
    dense = torch.full((B, T, V), -1e30).scatter(-1, ids, lp)
    mask = (torch.rand(B, T) < 0.8).float()
    logits = [torch.randn(B, T, V, requires_grad=True) for _ in range(3)]
    l_dense, s_dense = ttt_loss(logits, dense, mask)
    grads = torch.autograd.grad(l_dense, logits)
    l_top, s_top = ttt_loss(logits, lp, mask, target_ids=ids)
    assert torch.allclose(l_top, l_dense, rtol=1e-6) and l_top > 0
    for a, b in zip(torch.autograd.grad(l_top, logits), grads):
        assert torch.allclose(a, b, atol=1e-7)
    assert s_top == s_dense


def test_checkpoint_round_trip_in_vllm_layout(tmp_path):
    head = make_head()
    head.save(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [2, 3, 5] and cfg["num_hidden_layers"] == 1
    from safetensors.torch import load_file

    names = set(load_file(str(tmp_path / "model.safetensors")))
    assert "embed.weight" not in names
    assert {
        "fc.weight",
        "midlayer.self_attn.q_proj.weight",
        "midlayer.hidden_norm.weight",
        "lm_head.weight",
    } <= names
    assert load_file(str(tmp_path / "model.safetensors"))["midlayer.self_attn.q_proj.weight"].shape == (
        32,
        64,
    )
    again = Eagle3Head.load(tmp_path, head.embed.weight)
    for (n, a), (_, b) in zip(head.state_dict().items(), again.state_dict().items()):
        assert torch.equal(a, b), n


def test_aux_layer_ids_are_one_definition_and_validated():
    assert default_aux_layer_ids(12) == (2, 6, 9)
    assert default_aux_layer_ids(7) == (2, 3, 4)
    with pytest.raises(ValueError):
        default_aux_layer_ids(6)  # (2, 3, 3) would collapse
    with pytest.raises(ValueError, match="distinct"):
        validate_aux_layer_ids([2, 2, 3], 8)
    with pytest.raises(ValueError, match="outside"):
        validate_aux_layer_ids([2, 3, 8], 8)


def test_aux_capture_matches_transformers_hidden_states_and_vllm_semantics():
    """Aux id i is the residual stream after i layers: hidden_states[i] in transformers."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    m = Qwen3ForCausalLM(
        Qwen3Config(
            vocab_size=20,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=6,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=8,
        )
    )
    ids = torch.randint(0, 20, (1, 5))
    out = m(input_ids=ids, output_hidden_states=True)
    captured = {}
    hooks = [
        m.model.layers[i - 1].register_forward_hook(
            lambda mod, a, o, i=i: captured.__setitem__(i, o[0] if isinstance(o, tuple) else o)
        )
        for i in (2, 3)
    ]
    m(input_ids=ids)
    for h in hooks:
        h.remove()
    aux = gather_aux_hidden_states(out.hidden_states, (2, 3))
    assert not aux.requires_grad
    assert torch.allclose(aux[..., :16], captured[2]) and torch.allclose(aux[..., 16:], captured[3])


def test_a_head_fitted_on_a_bf16_target_trains_in_float32(tmp_path):
    """`specrl draft init` loads the target in bf16 on a GPU: the fresh head (embedding
    included) and the captured features must still be float32, or the head's first
    layer sees mixed dtypes (found by scripts/gpu_draft_check.py on an H100)."""
    from transformers import AutoModelForCausalLM

    from specrl.draft.offline import capture, evaluate_head

    from conftest import tiny_qwen3

    tiny_qwen3(tmp_path, layers=8)
    target = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16).eval()
    head = Eagle3Head.from_target(target, default_aux_layer_ids(8))
    assert {p.dtype for p in head.parameters()} == {torch.float32}
    feats = capture(target, [[1, 2, 3, 4, 5, 6]], [[0, 0, 1, 1, 1, 0]], head.cfg.aux_layer_ids, pad_id=0)
    assert feats.aux.dtype == feats.target_logprobs.dtype == torch.float32
    assert len(evaluate_head(head, feats, 3)) == 3
