"""Engine.load_state_dict: a trainer's weights by HF name, from memory, against the
same weights loaded from a checkpoint folder (load_weights), and its refusals.

The tiny HF model `cargo test` writes (TREEGRPO_TEST_MODEL) is read and written here
with numpy alone (the safetensors format is a JSON header and raw bytes), so the
checks run without torch; the torch ones (bf16, tensors shared like a tied head)
run where torch is installed (the TRL venv, tests/trl_tests.rs).
"""

import json
import re
import shutil
import struct

import pytest

import treegrpo

from conftest import TEST_MODEL

np = pytest.importorskip("numpy")

pytestmark = pytest.mark.skipif(
    TEST_MODEL is None, reason="needs the tiny HF model cargo test writes (TREEGRPO_TEST_MODEL)"
)

PROMPTS = ["hello there", "the cat is in"]
DTYPES = {"F32": np.float32, "F16": np.float16}


def read_safetensors(path):
    """A safetensors file's f32/f16 tensors as numpy arrays, by name."""
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    body = data[8 + n :]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        out[name] = np.frombuffer(body[start:end], dtype=DTYPES[info["dtype"]]).reshape(info["shape"]).copy()
    return out


def write_safetensors(path, tensors):
    """Writes ``{name: (dtype, shape, raw bytes)}`` as a safetensors file."""
    header, blobs, offset = {}, [], 0
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for raw in blobs:
            f.write(raw)


def checkpoint(folder, tensors):
    """A copy of the test model's folder holding ``tensors`` (as write_safetensors
    takes them) instead of its weights."""
    shutil.copytree(TEST_MODEL, folder, ignore=shutil.ignore_patterns("*.safetensors*"))
    write_safetensors(folder / "model.safetensors", tensors)
    return folder


def f32_entries(state):
    return {k: ("F32", v.shape, np.ascontiguousarray(v, dtype=np.float32).tobytes()) for k, v in state.items()}


def start_weights():
    return read_safetensors(f"{TEST_MODEL}/model.safetensors")


def moved(state, seed=0):
    """Other weights of the same shapes: what a training step hands over."""
    rng = np.random.default_rng(seed)
    return {k: (v + 0.05 * rng.standard_normal(v.shape)).astype(np.float32) for k, v in state.items()}


def served(engine):
    """Sampled tokens and their log-probabilities, seeded: a function of the weights."""
    return [(g.token_ids, g.logprobs) for g in engine.generate(PROMPTS, max_tokens=12, temperature=1.0, seed=3)]


def new_engine():
    return treegrpo.Engine(TEST_MODEL, kv_mib=64, seed=0)


def test_a_state_dict_serves_bit_identically_to_its_checkpoint(tmp_path):
    state = moved(start_weights())
    by_file, by_state = new_engine(), new_engine()
    before = served(by_state)
    assert by_file.load_weights(str(checkpoint(tmp_path / "ckpt", f32_entries(state)))) == 1
    assert by_state.load_state_dict(state) == 1
    assert by_state.weight_version == 1
    after = served(by_state)
    assert after == served(by_file)  # bit-identical tokens and logprobs
    assert after != before
    assert all(g.weight_version == 1 for g in by_state.generate(PROMPTS, max_tokens=2))
    # A version named by the trainer; strided arrays are read as their values.
    fortran = {k: np.asfortranarray(v) for k, v in state.items()}
    assert by_state.load_state_dict(fortran, version=7) == 7
    assert served(by_state) == after
    with pytest.raises(ValueError, match="version"):
        by_state.load_state_dict(state, version=7)


def test_a_tied_head_is_accepted_when_it_is_the_embedding():
    state = start_weights()
    engine = new_engine()
    before = served(engine)
    head = dict(state, **{"lm_head.weight": state["model.embed_tokens.weight"].copy()})
    assert engine.load_state_dict(head) == 1
    assert served(engine) == before  # the same weights as the engine started with
    same = dict(state, **{"lm_head.weight": state["model.embed_tokens.weight"]})
    assert engine.load_state_dict(same) == 2
    assert served(engine) == before


@pytest.mark.parametrize(
    "change, name",
    [
        (lambda s: s.update({"model.layers.0.mlp.extra_proj.weight": s["model.norm.weight"]}), "model.layers.0.mlp.extra_proj.weight"),
        (lambda s: s.pop("model.layers.1.mlp.up_proj.weight"), "model.layers.1.mlp.up_proj.weight"),
        (lambda s: s.update({"model.layers.0.mlp.gate_proj.weight": s["model.layers.0.mlp.gate_proj.weight"].T}), "model.layers.0.mlp.gate_proj.weight"),
        (lambda s: s.update({"model.norm.weight": s["model.norm.weight"].astype(np.int32)}), "model.norm.weight"),
        (lambda s: s.update({"lm_head.weight": s["model.embed_tokens.weight"] + 1}), "lm_head.weight"),
    ],
    ids=["unknown", "missing", "shape", "dtype", "untied-head"],
)
def test_a_wrong_state_dict_is_a_value_error_and_the_engine_serves_on(change, name):
    engine = new_engine()
    state = moved(start_weights())
    assert engine.load_state_dict(state) == 1
    before = served(engine)
    bad = moved(start_weights(), seed=1)
    change(bad)
    with pytest.raises(ValueError, match=re.escape(name)):
        engine.load_state_dict(bad)
    assert engine.weight_version == 1
    assert served(engine) == before


class _StandIn:
    """Quacks like a tensor (torch's and numpy's attributes) but is neither: its
    addresses point nowhere, and reading them would crash the process."""

    __array_interface__ = {"data": (8, False), "shape": (576,), "typestr": "<f4", "version": 3}

    def data_ptr(self):
        return 8

    def element_size(self):
        return 4


@pytest.mark.parametrize("value", [[1.0, 2.0], _StandIn()], ids=["list", "stand-in"])
def test_a_value_that_is_not_a_tensor_is_a_type_error_and_the_engine_serves_on(value):
    engine = new_engine()
    assert engine.load_state_dict(moved(start_weights())) == 1
    before = served(engine)
    bad = moved(start_weights(), seed=1)
    bad["model.norm.weight"] = value
    with pytest.raises(TypeError, match=re.escape("model.norm.weight")):
        engine.load_state_dict(bad)
    assert engine.weight_version == 1
    assert served(engine) == before


def test_a_state_dict_must_be_a_mapping():
    with pytest.raises(ValueError, match="mapping"):
        new_engine().load_state_dict([("model.norm.weight", np.ones(3, np.float32))])


def test_torch_tensors_in_bf16_serve_as_their_bf16_checkpoint(tmp_path):
    torch = pytest.importorskip("torch")
    state = {k: torch.from_numpy(v) for k, v in moved(start_weights()).items()}
    bf16 = {k: v.to(torch.bfloat16) for k, v in state.items()}
    # The checkpoint holds the same bf16 bits (torch's bf16 has no numpy dtype).
    entries = {k: ("BF16", tuple(v.shape), v.view(torch.int16).numpy().tobytes()) for k, v in bf16.items()}
    by_file, by_state = new_engine(), new_engine()
    by_file.load_weights(str(checkpoint(tmp_path / "bf16", entries)))
    by_state.load_state_dict(bf16)
    assert served(by_state) == served(by_file)
    # f32 tensors (a parameter with requires_grad, as a module's are) serve as numpy's.
    f32_engine = new_engine()
    params = {k: torch.nn.Parameter(v.clone()) for k, v in state.items()}
    f32_engine.load_state_dict(params)
    numpy_engine = new_engine()
    numpy_engine.load_state_dict({k: v.numpy() for k, v in state.items()})
    assert served(f32_engine) == served(numpy_engine) != served(by_state)


def test_a_torch_head_sharing_the_embedding_is_taken_as_tied():
    torch = pytest.importorskip("torch")
    state = {k: torch.from_numpy(v) for k, v in moved(start_weights()).items()}
    state["lm_head.weight"] = state["model.embed_tokens.weight"]  # what transformers' state_dict() holds
    engine, plain = new_engine(), new_engine()
    engine.load_state_dict(state)
    plain.load_state_dict({k: v for k, v in state.items() if k != "lm_head.weight"})
    assert served(engine) == served(plain)
    # A non-contiguous view is read as its values.
    norm = state["model.norm.weight"]
    strided = torch.stack([norm, norm + 1], dim=1)[:, 0]
    assert not strided.is_contiguous() and torch.equal(strided, norm)
    engine.load_state_dict(dict(state, **{"model.norm.weight": strided}))
    assert served(engine) == served(plain)
