"""The training loop, Orbit's split: one controller, two inner loops.

`controller` owns the outer loop (train to the next boundary, log,
evaluate, save, stop on request); `keras_loop` (``Model.fit`` with
``steps_per_execution``) and `custom_loop` (``strategy.run`` with many
steps per ``tf.function``) only run steps; `evaluator` makes the exact
pass over the test split, with the confusion matrix and misclassified
digits of `eval_metrics`; `summaries` writes what TensorBoard shows.
"""
