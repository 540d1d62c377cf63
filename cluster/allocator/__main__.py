"""``python -m draslice.cluster.allocator build``: see :func:`draslice.cluster.allocator.main`."""

import sys

from draslice.cluster.allocator import main

sys.exit(main())
