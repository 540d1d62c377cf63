"""The pipeline's other steps, as they run in the trainer image: ``smoke`` (the checked
matmul on the slice), ``validate`` (the verdict on a fine-tune's output folder) and ``report``
(the HTML the KFP UI shows for it).

Here, not in ``components/``: the components are thin KFP wrappers that call these, and the
``draslice smoke`` / ``draslice validate`` commands run the same code without KFP; this code
shares the trainer's device, budget and output-folder modules and imports no kfp.
"""
