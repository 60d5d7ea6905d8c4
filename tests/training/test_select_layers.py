"""Layer selection by windowed-attention ablation (``select_layers``) on the tiny random Llama teacher."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

from hypic_agent.runtime.models.hybrid import HybridForCausalLM
from hypic_agent.training import distill
from hypic_agent.training.data import TokenData
from hypic_agent.training.forward import run_model, sliding_window_mask
from hypic_agent.training.select_layers import (
    SelectOptions,
    copy_prompts,
    keep_layers,
    main,
    score_layers,
    select_layers,
)
from hypic_agent.training.teacher import load_teacher

C, S, SKIP = 96, 16, 4  # context, span, unscored span tokens
OPTS = SelectOptions(teacher="tiny", prompts=5, context=C, span=S, skip=SKIP, window=8, keep=2, batch=2)


@pytest.fixture(scope="module")
def teacher() -> HybridForCausalLM:
    return load_teacher("tiny").build()


@pytest.fixture(scope="module")
def prompts(tiny_corpus: Path) -> torch.Tensor:
    return copy_prompts(TokenData(tiny_corpus).eval, OPTS.prompts, C, S, seed=0)[0]


def test_copy_prompts(tiny_corpus: Path) -> None:
    stream = TokenData(tiny_corpus).eval
    ids, offsets = copy_prompts(stream, 6, C, S, seed=3)
    assert ids.shape == (6, C + S) and ids.dtype == torch.int64
    for row, p in zip(ids, offsets, strict=True):
        assert 0 <= p and p + S <= 3 * C // 4
        assert torch.equal(row[C:], row[p : p + S])  # the span repeats verbatim
        text = row[:C].numpy()  # consecutive corpus text
        assert any((stream[s : s + C] == text).all() for s in range(len(stream) - C + 1))
    again, off2 = copy_prompts(stream, 6, C, S, seed=3)
    assert torch.equal(ids, again) and (offsets == off2).all()
    assert not torch.equal(ids, copy_prompts(stream, 6, C, S, seed=4)[0])
    with pytest.raises(ValueError, match="first 3/4"):
        copy_prompts(stream, 1, 40, 31)


def test_sliding_window_mask() -> None:
    m = sliding_window_mask(5, 2)
    expect = torch.tensor([[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [0, 1, 1, 0, 0], [0, 0, 1, 1, 0], [0, 0, 0, 1, 1]])
    assert torch.equal(m, expect.bool())
    assert torch.equal(sliding_window_mask(4, 4), torch.ones(4, 4).tril().bool())
    with pytest.raises(ValueError):
        sliding_window_mask(4, 0)


def test_window_one_attends_to_self_only(teacher: HybridForCausalLM, prompts: torch.Tensor) -> None:
    """window=1 at layer 1: its attention output is each token's own value; other layers untouched."""
    seen: dict[tuple[int, str], torch.Tensor] = {}

    def probe(i: int, name: str, t: torch.Tensor) -> None:
        seen[(i, name)] = t

    out = run_model(teacher, prompts[:2], windows={1: 1}, capture=True, probe=probe)
    attn = teacher.layers[1].self_attn
    assert attn is not None
    x = seen[(1, "x")]
    _, _, v, _ = attn.qkv(x.reshape(-1, x.shape[-1]))  # v [T, Hkv, Dh]
    v = v.view(*x.shape[:2], attn.hkv, attn.d).repeat_interleave(attn.hq // attn.hkv, dim=2)
    assert torch.allclose(seen[(1, "o")], v, atol=1e-5)
    ref = run_model(teacher, prompts[:2], capture=True)
    assert torch.equal(out.hiddens[0], ref.hiddens[0])  # layer 0 unchanged
    assert (out.hiddens[1] - ref.hiddens[1]).abs().max() > 1e-3
    assert torch.equal(out.hiddens[1][:, 0], ref.hiddens[1][:, 0])  # token 0 sees only itself anyway
    with pytest.raises(ValueError, match="windows names layers"):
        run_model(teacher, prompts[:1], windows={4: 8})


def test_full_window_is_the_teacher(teacher: HybridForCausalLM, prompts: torch.Tensor) -> None:
    for window in (C + S, 4 * (C + S)):  # the whole prompt in view: no change at all
        sc = score_layers(teacher, prompts, C, window, skip=SKIP, batch=2)
        assert len(sc.copy_loss) == len(sc.lm_loss) == 4
        assert all(abs(v) <= 1e-6 for v in sc.copy_loss + sc.lm_loss), sc


def test_small_window_matches_a_direct_ablation(teacher: HybridForCausalLM, prompts: torch.Tensor) -> None:
    """Every layer's scores == NLL differences of full ``run_model`` passes with that layer windowed,
    averaged over exactly the copied tokens from the (SKIP+1)-th on and the context tokens."""
    sc = score_layers(teacher, prompts, C, 8, skip=SKIP, batch=2)

    def nll(windows: dict[int, int] | None) -> torch.Tensor:  # [N, C + S] NLL of each token (col 0 unused)
        with torch.no_grad():
            h = run_model(teacher, prompts, windows=windows).final
            logits = teacher.logits(h.reshape(-1, h.shape[-1])).view(*prompts.shape, -1)
        out = torch.zeros(prompts.shape, dtype=torch.float64)
        out[:, 1:] = F.cross_entropy(logits[:, :-1].transpose(1, 2), prompts[:, 1:], reduction="none").double()
        return out

    base = nll(None)
    assert abs(sc.base_copy_nll - base[:, C + SKIP :].mean().item()) < 1e-5
    assert abs(sc.base_lm_nll - base[:, 1:C].mean().item()) < 1e-5
    for layer in range(4):
        d = nll({layer: 8}) - base
        assert abs(sc.copy_loss[layer] - d[:, C + SKIP :].mean().item()) < 1e-5, layer
        assert abs(sc.lm_loss[layer] - d[:, 1:C].mean().item()) < 1e-5, layer
        assert abs(sc.copy_loss[layer]) > 1e-4 and abs(sc.lm_loss[layer]) > 1e-4  # the window matters


def test_select_layers_deterministic_and_cli_round_trip(
    teacher: HybridForCausalLM, tiny_corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = TokenData(tiny_corpus)
    rep = select_layers(teacher, data, OPTS)
    assert rep["layers"] == 4 and len(rep["keep"]) == OPTS.keep and rep["keep"] == sorted(rep["keep"])
    top = sorted(range(4), key=lambda i: rep["copy_loss"][i], reverse=True)[: OPTS.keep]
    assert rep["keep"] == sorted(top) and rep["ranking"][: OPTS.keep] == top
    assert rep["attention_layers"] == ",".join(map(str, rep["keep"]))
    again = select_layers(teacher, data, OPTS)
    assert again["copy_loss"] == rep["copy_loss"] and again["keep"] == rep["keep"]
    other = select_layers(teacher, data, SelectOptions(**{**OPTS.__dict__, "seed": 1}))
    assert other["span_offsets"] != rep["span_offsets"] and other["copy_loss"] != rep["copy_loss"]
    assert len(select_layers(teacher, data, SelectOptions(**{**OPTS.__dict__, "keep": 1}))["keep"]) == 1

    # the printed --attention-layers value, through the distill command's own parser
    from hypic_agent.cli import app

    got: list[distill.DistillConfig] = []
    monkeypatch.setattr(distill, "run_distill", lambda cfg, log=None, settings=None: got.append(cfg))
    cmd = ["distill", "--tiny", "--out", str(tmp_path), "--attention-layers"]
    res = CliRunner().invoke(app, [*cmd, rep["attention_layers"]])
    assert res.exit_code == 0, res.output
    assert got[0].convert.attention_layers == tuple(rep["keep"])
    types = got[0].convert.layer_types(4)
    assert [i for i, t in enumerate(types) if t == "full_attention"] == rep["keep"]
    res = CliRunner().invoke(app, [*cmd, ""])
    assert res.exit_code == 0 and got[1].convert.attention_layers is None
    for bad in ("1,x", "1,1"):
        res = CliRunner().invoke(app, [*cmd, bad])
        assert res.exit_code == 2 and len(got) == 2, res.output


def test_keep_bounds() -> None:
    assert keep_layers([0.1, 0.3, 0.3, 0.2], 2) == [1, 2]
    assert keep_layers([0.5, 0.3, 0.3, 0.2], 2) == [0, 1]  # tie: lower index first
    for keep in (0, 3):
        with pytest.raises(ValueError, match="half"):
            keep_layers([0.0] * 4, keep)


def test_main_writes_report(tiny_corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sel.json"
    args = ["--teacher", "tiny", "--data", str(tiny_corpus), "--out", str(out), "--prompts", "2", "--context", "64"]
    main([*args, "--span", "8", "--window", "8", "--keep", "2", "--batch", "2"])
    rep = json.loads(out.read_text())
    assert rep["args"]["context"] == 64 and rep["args"]["window"] == 8 and len(rep["copy_loss"]) == 4
    assert len(rep["lm_loss"]) == 4 and len(rep["keep"]) == 2
    printed = capsys.readouterr().out
    assert f'--attention-layers "{rep["attention_layers"]}"' in printed and "copy_loss" in printed
    with pytest.raises(SystemExit, match="half"):
        main([*args, "--span", "8", "--keep", "3"])
