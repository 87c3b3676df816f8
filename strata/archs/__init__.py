"""Architectures: one record each (strata.archs.record.Arch) holding what differs by
architecture: the model wiring (strata.models), the tensor-name map, the HF and GGUF readers'
hooks, the hparam tables and the presets; strata.archs.registry finds a record by strata name,
HF model_type or GGUF general.architecture.

    record.py        Arch, the record
    registry.py      ARCHS and the lookups (get_arch, by_hf, by_gguf)
    names.py         a pack's dense tensors by the shape's architecture (dense_specs,
                     check_dense); dense.py the tensors every architecture has
    qwen3moe.py, mixtral.py, gpt_oss.py, family.py (glm4moe, deepseek2; family_names,
                     family_gguf, family_hf): the records and their maps and hooks
    gguf_tensors.py, hf_tensors.py   what the readers' hooks share
    hparams_gguf.py, hparams_hf.py, hparam_kinds.py   the hparam tables

The room sits above strata.models (it names the wirings; models never import it) and below
strata.packs (the importers, writer and reader look the records up).
"""
