"""attnzoo.serve.demo: the Gradio demo (``serve-demo``): Classify, Segment and Compare tabs.

- :mod:`.app`: the ``gr.Blocks`` and its handlers; :mod:`.cli`: ``serve-demo``;
- :mod:`.coldstart`: how long a fresh ``serve-demo`` takes to answer; :mod:`.screenshot`: the README's picture.
"""
