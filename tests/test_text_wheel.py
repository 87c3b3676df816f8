"""benchmarks/text_wheel.py keeps what the GGUF integration imports, drops other models, and
writes a RECORD that matches what it kept."""
import base64
import hashlib
import zipfile

from tests.scripts import load_script

GGUF = "transformers/integrations/gguf/gguf_tokenizer_mapping.py"


def _wheel(path):
    files = {
        "transformers/__init__.py": b"x = 1\n",
        GGUF: b"from ...models.llama.tokenization_llama import A\n"
              b"    from ...models.gpt2.tokenization_gpt2 import B\n",
        "transformers/models/__init__.py": b"",
        "transformers/models/auto/tokenization_auto.py": b"auto\n",
        "transformers/models/llama/tokenization_llama.py": b"A = 1\n",
        "transformers/models/gpt2/tokenization_gpt2.py": b"B = 2\n",
        "transformers/models/mixtral/modeling_mixtral.py": b"big\n" * 100,
        "transformers-5.24.0.dist-info/METADATA": b"Name: transformers\n",
        "transformers-5.24.0.dist-info/RECORD": b"stale\n",
    }
    with zipfile.ZipFile(path, "w") as z:
        for n, b in files.items():
            z.writestr(n, b)
    return files


def test_cut_keeps_the_imported_tokenizers_and_a_true_record(tmp_path):
    src = tmp_path / "transformers-5.24.0-py3-none-any.whl"
    files = _wheel(src)
    assert load_script("benchmarks/text_wheel.py").main([str(src), str(tmp_path / "out")]) == 0
    with zipfile.ZipFile(tmp_path / "out" / src.name) as z:
        names = set(z.namelist())
        record = z.read("transformers-5.24.0.dist-info/RECORD").decode().splitlines()
        kept = {n: z.read(n) for n in names}
    assert "transformers/models/mixtral/modeling_mixtral.py" not in names
    assert {"transformers/models/llama/tokenization_llama.py", GGUF, "transformers/__init__.py",
            "transformers/models/gpt2/tokenization_gpt2.py", "transformers/models/__init__.py",
            "transformers/models/auto/tokenization_auto.py"} <= names
    listed = {line.split(",")[0]: line for line in record}
    assert set(listed) == names
    for n, data in kept.items():
        if n.endswith("RECORD"):
            continue
        assert data == files[n]
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        assert listed[n] == f"{n},sha256={digest},{len(data)}"


def test_bad_arguments_are_one_line(tmp_path, capsys):
    mod = load_script("benchmarks/text_wheel.py")
    assert mod.main(["nope.txt"]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    assert mod.main([str(tmp_path / "missing.whl"), str(tmp_path / "out")]) == 2
    (tmp_path / "bad.whl").write_text("not a zip")
    assert mod.main([str(tmp_path / "bad.whl"), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(e.startswith("text_wheel: cannot read") for e in err)
    assert not list((tmp_path / "out").glob("*"))
