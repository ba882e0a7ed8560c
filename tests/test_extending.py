"""docs/extending.md's three recipes, executed as written (every ```python block of a section, in order), and what
each promises: a method with a client and a server half, on the loop and on the Flower apps; a user's own dataset;
a user's own text with natural clients; a model of one's own through timm's registry and the QK/V splitter."""

import re
from pathlib import Path

import pytest
import torch

import fedfrozen as ff

DOC = Path(__file__).resolve().parents[1] / "docs" / "extending.md"


def recipe(number: int) -> dict:
    """Run section `number`'s code blocks in one fresh namespace (a script's: timm's registry needs a module)."""
    sections = {int(m.group(1)): m.group(2) for m in re.finditer(r"\n## (\d)\. .*?\n(.*?)(?=\n## |\Z)", DOC.read_text(),
                                                                 re.S)}
    code = "\n".join(re.findall(r"```python\n(.*?)```", sections[number], re.S))
    assert code, f"docs/extending.md section {number} has no code"
    namespace = {"__name__": "__main__"}
    exec(compile(code, f"docs/extending.md § {number}", "exec"), namespace)
    return namespace


@pytest.fixture
def method_recipe():
    ns = recipe(1)
    yield ns
    ff.methods.unregister("fedfrozen_clipped")


def test_the_method_recipe_has_a_client_half_a_server_half_and_freezes(method_recipe, monkeypatch, tmp_path):
    cls, cfg, hist = method_recipe["ClippedMomentum"], method_recipe["cfg"], method_recipe["hist"]
    code = [line for line in re.search(r"class ClippedMomentum.*?\n\n\n", DOC.read_text(), re.S).group(0).splitlines()
            if line.strip() and not line.strip().startswith(("#", '"""'))]
    assert len(code) <= 40
    assert [r["stage"] for r in hist.rows] == [1, 1, 2, 2] and all(r["kernel_change"] == 0 for r in hist.rows[2:])
    # the client half: every update that reaches the server has a norm of at most 1, and some were clipped
    norms, before = [], []
    original = cls.upload

    def upload(self, r, cid, delta):
        before.append(delta.norm().item())
        original(self, r, cid, delta)
        norms.append(delta.norm().item())

    monkeypatch.setattr(cls, "upload", upload)
    again = ff.run(cfg, progress=False)
    assert [r["test_acc"] for r in again.rows] == [r["test_acc"] for r in hist.rows]
    assert max(norms) <= 1 + 1e-5 and max(before) > 1
    monkeypatch.undo()
    # the server half: its momentum is state, and a resumed run equals the uninterrupted one
    ckpt = tmp_path / "ckpt.pt"
    ff.run(cfg, progress=False, checkpoint=ckpt, callbacks=[lambda r, row, h: r == 1])
    resumed = ff.run(cfg, progress=False, resume_from=ckpt)
    assert [r["test_acc"] for r in resumed.rows] == [r["test_acc"] for r in hist.rows]
    # no Flower code of its own: the real strategy and ClientApp give the loop's History
    pytest.importorskip("flwr")
    from test_hook_order import Recorder, flower_in_process

    fl = flower_in_process(cfg, Recorder(flower=True))
    assert [r["test_acc"] for r in fl.rows] == pytest.approx([r["test_acc"] for r in hist.rows], abs=1e-6)
    assert [(r["bytes_down"], r["bytes_up"]) for r in fl.rows] == [(r["bytes_down"], r["bytes_up"]) for r in hist.rows]


@pytest.fixture
def dataset_recipe():
    ns = recipe(2)
    yield ns
    ff.data.unregister("stripes")
    ff.data.unregister("dialogue")


def test_the_dataset_recipe_trains_on_the_users_data_and_keys_its_version(dataset_recipe):
    cfg, hist = dataset_recipe["cfg"], dataset_recipe["hist"]
    assert hist.config["dataset"] == "stripes" and len(hist.rows) == cfg.rounds
    accs = [r["test_acc"] for r in hist.rows]
    assert max(accs) > 0.4  # above the 0.25 of guessing among four classes: the stripes are learnt
    key = ff.experiments.config_key(cfg)
    ff.data.register("stripes", dataset_recipe["stripes"], version=2, replace=True)
    assert ff.experiments.config_key(cfg) != key


def test_the_text_recipe_gives_each_speaker_its_own_client(dataset_recipe):
    cfg, hist = dataset_recipe["text_cfg"], dataset_recipe["text_hist"]
    s = ff.loop.prepare(cfg)
    train = ff.data.load("dialogue")[0]
    assert [set(train.owner[c].tolist()) for c in s.client_train] == [{0}, {1}, {2}]  # a client is one speaker
    assert len(hist.rows) == cfg.rounds and hist.diverged is None
    assert ff.qkv.param_names(s.model, ["qk"]) and s.x.dtype == torch.long  # a Transformer's Q/K, tokens as ints


@pytest.fixture
def model_recipe():
    ns = recipe(3)
    yield ns
    ff.layouts.LAYOUTS.pop(ff.layouts.class_path(ns["HeadMajorAttention"]))


def _v_free(model) -> bool:
    """With the rows the split calls V (and their bias) zeroed, the first attention module's output no longer
    depends on its input."""
    attn = model.blocks[0].attn
    with torch.no_grad():
        attn.qkv.v.weight.zero_()
        attn.qkv.v.bias.zero_()
        out = attn(torch.randn(2, 5, attn.qkv.v.weight.shape[1], generator=torch.Generator().manual_seed(0)))
    return bool((out - out[:1]).abs().max() < 1e-6)


def test_the_model_recipe_splits_the_rows_the_forward_pass_uses_and_freezes_them(model_recipe):
    cfg, hist, groups = model_recipe["cfg"], model_recipe["hist"], model_recipe["groups"]
    assert sorted(groups["qk"])[:2] == ["blocks.0.attn.qkv.k.bias", "blocks.0.attn.qkv.k.weight"]
    assert [r["stage"] for r in hist.rows] == [1, 2, 2] and all(r["kernel_change"] == 0 for r in hist.rows[1:])
    assert _v_free(ff.loop.prepare(cfg).model)
    # the layout is what makes it right: read part after part, the rows called V are not the values
    Layout = ff.layouts.Layout
    ff.layouts.register(model_recipe["HeadMajorAttention"], Layout(proj="qkv", roles=("q", "k", "v"),
                                                                   heads="num_heads"))
    assert not _v_free(ff.loop.prepare(cfg).model)
