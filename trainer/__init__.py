"""The code that runs inside the trainer image, by concern (docs/layout.md maps every module).

At this level, the fine-tune loop in reading order: ``config`` (every knob, declared once) and
``presets`` (named runs), ``sft`` (the loop, top to bottom) with ``build`` (what it trains),
``measure`` (what it measures), ``checkpoint`` (resume after a kill), ``result`` (its figures
and the models it saves) and ``outputs`` (the output folder's layout, written as one atomic
set); ``input_checks`` (every input checked before work), ``fingerprint``, ``folder_lock``,
``distributed`` and ``torchrun_env``, ``device`` and ``budget`` (the slice), ``loglines``,
``libraries``.

Below it: ``speed/`` (how a step is made fast; its ``__init__`` holds the one decision),
``data/`` and ``model/`` (what is trained), ``tasks/`` (the pipeline's other steps: smoke,
validate, report).

Importing a module here has no side effects: the ``draslice`` command and the components set
up the libraries' logging where they start (``libraries.settle``).
"""
