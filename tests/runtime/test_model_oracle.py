"""Our runtime vs transformers' own implementation with the same weights (fp32, CPU)."""

from __future__ import annotations

import torch

from hypic_agent.runtime.runner.standalone import decode_step, prefill

from .conftest import rand_tokens

TOL = 1e-4


def test_prefill_logits_match_transformers(model_and_oracle):
    model, hf = model_and_oracle
    ids = rand_tokens(45, seed=1)
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0]
    st = prefill(model, [ids], all_logits=True)[0]
    assert (st.all_logits - ref).abs().max().item() < TOL


def test_prefix_then_continue_equals_one_pass(model_and_oracle):
    model, _ = model_and_oracle
    ids = rand_tokens(50, seed=2)
    one = prefill(model, [ids], all_logits=True)[0]
    first = prefill(model, [ids[:17]])[0]
    rest = prefill(model, [ids[17:]], [first], all_logits=True)[0]
    assert (rest.all_logits - one.all_logits[17:]).abs().max().item() < TOL
    assert rest.length == 50


def test_varlen_batch_equals_each_alone(model_and_oracle):
    model, _ = model_and_oracle
    seqs = [rand_tokens(n, seed=10 + n) for n in (5, 70, 33)]
    batch = prefill(model, seqs, all_logits=True)
    for s, b in zip(seqs, batch):
        alone = prefill(model, [s], all_logits=True)[0]
        assert (b.all_logits - alone.all_logits).abs().max().item() < TOL
        for x, y in zip(b.layers, alone.layers):
            for tx, ty in zip(vars(x).values(), vars(y).values()):
                assert torch.allclose(tx, ty, atol=1e-5)


def test_decode_matches_transformers_cached_decode(model_and_oracle):
    model, hf = model_and_oracle
    ids = rand_tokens(21, seed=3)
    with torch.no_grad():
        x = torch.tensor([ids])
        out = hf.generate(
            x,
            attention_mask=torch.ones_like(x),
            max_new_tokens=6,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
            pad_token_id=256,
        )
    st = prefill(model, [ids])[0]
    for t in range(6):
        assert (st.last_logits - out.logits[t][0]).abs().max().item() < TOL
        decode_step(model, [st], [int(out.sequences[0, 21 + t])])


def test_batched_decode_equals_single(arch):
    from .conftest import make_model

    model, _, _ = make_model(arch)
    a, b = rand_tokens(9, 4), rand_tokens(14, 5)
    sa, sb = prefill(model, [a, b])
    single = prefill(model, [a])[0]
    decode_step(model, [sa, sb], [7, 8])
    decode_step(model, [single], [7])
    assert (sa.last_logits - single.last_logits).abs().max().item() < TOL
