"""What a run trains on, as token rows.

``examples``: a user's data (JSONL prompt/completion or chats, or a saved dataset) read,
checked and tokenized with completion-only labels, packed and split (``TokenRows``);
``synthetic``: the demo's learnable successor chains; ``sampler``: the batches of rows each
step draws, resumable from a checkpoint.
"""
