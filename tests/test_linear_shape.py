"""The linear-attention options of a shape (ModelShape.linear, strata.shapes.LinearAttention):
which layers are linear, the pack header's round trip, and the one-line refusals."""
from __future__ import annotations

import json

import pytest

from strata.errors import StrataError
from strata.shapes import Attn, DenseFfn, LinearAttention, ModelShape


def _shape(**lin) -> ModelShape:
    return ModelShape("qwen3next", 8, 64, 8, 2, 32, 4, 2, 16, 256, dense=DenseFfn(shared=1), attn=Attn(rope_dim=4),
                      linear=LinearAttention(4, 2, 4, 16, 16, **lin))


def test_layer_kinds_by_interval_and_by_list():
    s = _shape()
    assert [s.layer_kind(l) for l in range(8)] == ["linear"] * 3 + ["full"] + ["linear"] * 3 + ["full"]
    kinds = ("full", "linear") * 4
    assert [_shape(layer_types=kinds).layer_kind(l) for l in range(8)] == list(kinds)
    plain = ModelShape()
    assert plain.linear is None and plain.layer_kind(1) == "full"


def test_header_round_trip_through_json():
    for s in (_shape(), _shape(layer_types=("full", "linear") * 4)):
        d = json.loads(json.dumps(s.to_dict()))
        assert ModelShape.from_dict(d) == s
    assert "linear" not in ModelShape().to_dict()     # other shapes' headers are unchanged


def test_group_fields_read_and_change():
    s = _shape()
    assert s.field("linear.n_v_head") == 4
    t = s.with_(**{"linear.full_interval": 2})
    assert t.linear.full_interval == 2 and t.layer_kind(1) == "full"
    with pytest.raises(StrataError, match="no linear options to change"):
        ModelShape().with_(**{"linear.conv_kernel": 3})


@pytest.mark.parametrize("lin, msg", [(dict(layer_types=("full",)), "must name 8 layers"),
                                      (dict(layer_types=("dense",) * 8), "must name 8 layers"),
                                      (dict(full_interval=0), "full_interval must be >= 1")])
def test_bad_options_are_one_line(lin, msg):
    with pytest.raises(StrataError, match=msg):
        _shape(**lin)
    with pytest.raises(StrataError, match="multiple of"):
        ModelShape(linear=LinearAttention(4, 3, 4, 16, 16))
