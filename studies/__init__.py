"""attnzoo.studies: research studies over the models and the runtime, apart from the ``bench-latency`` tool.

Each is a ``python -m attnzoo.studies.<name>`` command whose committed output lives in ``results/studies/``:

- :mod:`.scaling`: latency and memory against tokens and batch size, one variant per cost family;
- :mod:`.mae_forms`: which ONNX form of the MAE variants' pairwise L1 runs fastest on this CPU;
- :mod:`.quantized`: test-set accuracy of the zoo at fp32 / int8 / fp8, and int8 speed;
- :mod:`.int8_accuracy`: dynamic int8 on the trained zoo;
- :mod:`.int8_fidelity`: int8 output fidelity of a pretrained-like ViT under each Q/DQ placement;
- :mod:`.bf16`: the zoo at OpenVINO bf16 (the extra math pinned to f32) and ViT-S fp32 / bf16 / int8 speed.

:mod:`.report` holds what they share (the zoo selection, ``--table``, writing ``<name>.json`` / ``<name>.md``).
"""
