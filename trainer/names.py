"""The names of the models, optimizers, learning-rate schedules and precisions.

`trainer.config` offers them as flag choices and `trainer.model.models` builds
them; both import them from here, which needs no TensorFlow, so ``--help``
lists them without loading it.
"""

MODELS = ("guide", "small", "convnet", "convnet_bn")
BATCH_NORM_MODELS = ("convnet_bn",)
OPTIMIZERS = ("adam", "lamb", "lars")
SCHEDULES = ("constant", "cosine")
PRECISIONS = ("none", "bfloat16")
