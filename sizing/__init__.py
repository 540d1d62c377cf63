"""Sizing: which slice profile a fine-tune needs (the MIG profile table, ``draslice advise``)."""
