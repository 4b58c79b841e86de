"""The EAGLE-3 head: TTT training computes what vLLM's drafting loop computes, and the
checkpoint round-trips in the layout vLLM loads."""

import json
import math

import pytest
import torch
import torch.nn.functional as F

from specrl.draft.eagle3 import Eagle3Config, Eagle3Head, _rope, ttt_loss
from specrl.features import default_aux_layer_ids, gather_aux_hidden_states, validate_aux_layer_ids

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

    from helpers import tiny_qwen3

    tiny_qwen3(tmp_path, layers=8)
    target = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16).eval()
    head = Eagle3Head.from_target(target, default_aux_layer_ids(8))
    assert {p.dtype for p in head.parameters()} == {torch.float32}
    feats = capture(target, [[1, 2, 3, 4, 5, 6]], [[0, 0, 1, 1, 1, 0]], head.cfg.aux_layer_ids, pad_id=0)
    assert feats.aux.dtype == feats.target_logprobs.dtype == torch.float32
    assert len(evaluate_head(head, feats, 3)) == 3


SMALL = Eagle3Config(**{**CFG.__dict__, "draft_vocab_size": 8})
KEPT = torch.tensor([0, 2, 3, 7, 11, 12, 15, 19])  # target ids of the 8 draft tokens


def test_a_smaller_draft_vocabulary_round_trips_in_the_layout_vllm_loads(tmp_path):
    """EAGLE-3's layout (vLLM's llama_eagle3): lm_head over the draft tokens, `d2t` the
    offset to each one's target id, `t2d` the mask of kept target tokens."""
    from safetensors.torch import load_file

    torch.manual_seed(0)
    head = Eagle3Head(SMALL, torch.randn(CFG.vocab_size, CFG.hidden_size), KEPT)
    assert head.lm_head.weight.shape == (8, CFG.hidden_size)
    head.save(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["draft_vocab_size"] == 8 and cfg["vocab_size"] == CFG.vocab_size
    saved = load_file(str(tmp_path / "model.safetensors"))
    assert torch.equal(torch.arange(8) + saved["d2t"], KEPT)
    assert saved["t2d"].dtype == torch.bool and torch.equal(saved["t2d"].nonzero().flatten(), KEPT)
    back = Eagle3Head.load(tmp_path, head.embed.weight)
    ids, t2d = back.vocab_map()
    assert torch.equal(ids, KEPT) and torch.equal(t2d[KEPT], torch.arange(8)) and int((t2d >= 0).sum()) == 8
    assert torch.equal(back.lm_head.weight, head.lm_head.weight)


def test_a_draft_vocabulary_must_be_distinct_ascending_target_ids(tmp_path):
    embed = torch.randn(CFG.vocab_size, CFG.hidden_size)
    for bad in (KEPT.flip(0), torch.tensor([0, 0, 3, 7, 11, 12, 15, 19]), KEPT[:7], KEPT + 1):
        with pytest.raises(ValueError, match="distinct ascending"):
            Eagle3Head(SMALL, embed, bad)
    Eagle3Head(SMALL, embed, KEPT).save(tmp_path)
    from safetensors.torch import load_file, save_file

    state = load_file(str(tmp_path / "model.safetensors"))
    state["d2t"] = torch.zeros(8, dtype=torch.long)  # every draft token mapped to target 0..7: fine
    save_file(state, str(tmp_path / "model.safetensors"))
    Eagle3Head.load(tmp_path, embed)
    state["d2t"][3] = -3  # draft 3 -> target 0, twice
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="distinct ascending"):
        Eagle3Head.load(tmp_path, embed)


def test_ttt_loss_with_a_draft_vocabulary_scores_the_target_restricted_to_it():
    """The target's probabilities of the kept tokens are what the draft is fitted to (not
    renormalized: a position weighs the mass the draft can match); dense and top-k targets
    agree; a position whose target argmax is not a draft token never counts as agreement."""
    torch.manual_seed(2)
    B, T, V = 2, 6, CFG.vocab_size
    head = Eagle3Head(SMALL, torch.randn(V, CFG.hidden_size), KEPT)
    vocab = head.vocab_map()
    dense = F.log_softmax(3 * torch.randn(B, T, V), -1)
    dense[0, 2, 1] = 5.0  # position 2 of row 0: the argmax is token 1, not a draft token
    dense = F.log_softmax(dense, -1)
    mask = torch.ones(B, T)
    logits = [torch.randn(B, T, 8, requires_grad=True)]
    loss, stats = ttt_loss(logits, dense, mask, vocab=vocab, decay=1.0)
    want = dense[:, 1:, KEPT]
    pred = F.log_softmax(logits[0][:, : T - 1], -1)
    assert torch.allclose(loss, -(want.exp() * pred).sum(-1).mean(), rtol=1e-6)
    agree = KEPT[pred.argmax(-1)] == dense[:, 1:].argmax(-1)
    assert stats["top1_agreement"][0] == pytest.approx(float(agree.float().mean()))
    # top-k that holds every kept token: the same loss and agreement as the dense target
    lp, ids = dense.topk(V, dim=-1)
    loss_k, stats_k = ttt_loss(logits, lp, mask, target_ids=ids, vocab=vocab, decay=1.0)
    assert torch.allclose(loss_k, loss, rtol=1e-5) and stats_k == stats
    # the target argmax outside the draft vocabulary: never agreement, whatever the draft says
    only = torch.zeros(B, T)
    only[0, 2] = 1  # the loss mask is indexed by target position: dense[0, 2] alone
    for d in range(8):
        forced = torch.full((B, T, 8), -10.0)
        forced[..., d] = 10.0
        assert ttt_loss([forced], dense, only, vocab=vocab)[1]["top1_agreement"] == [0.0]


def test_frequent_tokens_keep_the_most_used_ids_ascending():
    from specrl.draft.offline import frequent_tokens

    seqs = [[5, 5, 5, 2, 9], [9, 9, 1, 5], [7]]
    assert frequent_tokens(seqs, 12, 3).tolist() == [1, 5, 9]  # 5, 9 (4, 3 times), then 1 (ties: lower id)
    assert frequent_tokens(seqs, 12, 7).tolist() == [0, 1, 2, 3, 5, 7, 9]  # unseen ids fill from the lowest
