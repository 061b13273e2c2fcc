"""research: studies over the models and the runtime, kept beside the package, not in it.

Each is a command run from the repository root, ``python -m research.<name>``, whose committed output lives in
``results/studies/`` (one folder per run, its README naming the command and the machine). A study imports
``attnzoo.*`` (any layer) and other studies; nothing in the package imports a study, and neither the wheel nor
the sdist holds one (``tests/core/test_layers.py``, ``tests/core/test_packaging.py``).

- :mod:`.mae_forms`: which ONNX form of the MAE variants' pairwise L1 runs fastest on this CPU;
- :mod:`.fusable`: what the opset-23 export (one ``Attention`` op per core) changes on each CPU runtime;
- :mod:`.fused_cores`: each variant's encoder block, eager and ``torch.compile``, against ``standard``;
- :mod:`.quantized`: test-set accuracy of the zoo at fp32 / int8 / fp8, and int8 speed (:mod:`.quantized_speed`);
- :mod:`.int8_accuracy`: dynamic int8 on the trained zoo;
- :mod:`.int8_fidelity`: int8 output fidelity of a pretrained-like ViT under each Q/DQ placement;
- :mod:`.bf16`: the zoo at OpenVINO bf16 (the extra math pinned to f32) and ViT-S fp32 / bf16 / int8 speed;
- :mod:`.train_speed`: what makes a zoo training step cheaper on this CPU.

:mod:`.study` holds what they share (the parser and command line, the zoo selection, ``--table``, the parity-gated
loads and A B A B speed-ups, writing ``<name>.json`` / ``<name>.md``).
How cost grows with tokens and batch is a benchmark of the package: ``python -m attnzoo.benchmarks.scaling``.
"""
