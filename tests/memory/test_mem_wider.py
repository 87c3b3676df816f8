"""A launch choice the carve grows for free (Sizes.wider, PromptLayout.widest): a symbol that
sizes one phase's buffers (as MLA's attention block sizes its scratch) doubles while the union
of phases stays the length the first choice gave, on the dry carve the plan reads and the real
one alike; the choice travels with the buffers (PromptBuffers.dims)."""
import torch
from hypothesis import example, given, strategies as st

from strata.memory import Buf, Carve, LayoutSpec, Phase, PromptLayout, Sizes

# persistent x [T, D]; the attention-like phase a scratch [W, A] (W the growing choice); the
# other phase f [T, F]
SPEC = LayoutSpec((Buf("x", torch.bfloat16, ("T", "D")),),
                  (Phase("attn", (Buf("s", torch.float32, ("W", "A")),)),
                   Phase("ffn", (Buf("f", torch.bfloat16, ("T", "F")),))))


def layout(D, A, F, w0, grows=True, cap=None):
    def dims(T, ring, batch):
        return {"T": T, "D": D, "A": A, "F": F, "W": min(w0, T)}

    def wider(d):
        top = d["T"] if cap is None else min(cap, d["T"])
        return {**d, "W": 2 * d["W"]} if grows and 2 * d["W"] <= top else None
    return PromptLayout(Sizes(n_layer=1, n_expert=2, top_k=1, dims=dims,
                              kv_bytes=lambda n, l: 0, wider=wider), 512, SPEC)


@given(D=st.integers(1, 64), A=st.integers(1, 64), F=st.integers(1, 256),
       w0=st.integers(1, 16), T=st.integers(1, 600), ring=st.integers(0, 3))
@example(D=8, A=4, F=64, w0=4, T=512, ring=2)      # the other phase far longer: grows to T
@example(D=8, A=64, F=1, w0=4, T=512, ring=0)      # the scratch already the longer: stays
def test_the_carve_takes_the_widest_free_choice(D, A, F, w0, T, ring):
    grown, fixed = layout(D, A, F, w0), layout(D, A, F, w0, grows=False)
    need = fixed.bytes_needed(T, ring)
    assert grown.bytes_needed(T, ring) == need                 # free: not one byte more
    buf = torch.zeros(need, dtype=torch.uint8)
    out = grown.carve(Carve(buf), T, ring)
    W = out.dims["W"]
    assert out.stop == need and out["s"].shape == (W, A)
    assert W >= min(w0, T) and W % min(w0, T) == 0
    # the next doubling (where there is one) would have cost bytes: W is the widest free one
    if 2 * W <= T:
        assert layout(D, A, F, 2 * W, grows=False).bytes_needed(T, ring) > need
    # every step between is free too (the chain stops at the first that is not)
    w = min(w0, T)
    while w < W:
        assert layout(D, A, F, w, grows=False).bytes_needed(T, ring) == need
        w *= 2


def test_a_layout_without_wider_carves_its_dims_as_given():
    out = layout(8, 4, 64, 4, grows=False).carve(Carve.dry(), 512, 0)
    assert out.dims["W"] == 4
    assert layout(8, 4, 64, 4).carve(Carve.dry(), 512, 0).dims["W"] == 512


def test_growth_stops_at_its_cap():
    out = layout(8, 4, 64, 4, cap=64).carve(Carve.dry(), 512, 0)
    assert out.dims["W"] == 64

