"""The model: what is trained and what is served.

`models` builds the named models (`trainer.config.MODELS`) inside a
strategy's scope and compiles them; `optimizer` makes Adam and its
learning-rate schedule (warmup, constant or cosine); `augment` is the
XLA-compilable random affine layer; `dropout` draws its masks from the
step, so a resume is bit-identical; `export` writes the servable
SavedModel that takes raw uint8 pixels.
"""
