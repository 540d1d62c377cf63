"""Everything a cluster admin installs for draslice, rendered as plain dicts.

One small module per kind of manifest (claim templates, RBAC, admission policy, workloads,
Kueue) and one YAML writer (:mod:`.yamlio`). ``draslice manifests`` prints them; the committed
copies under ``manifests/`` come from :func:`draslice.cluster.manifests.committed.files`.

Kept free of kfp imports, like the rest of ``draslice.cluster``.
"""
