"""Walk every page of a KFP list call (``next_page_token``), with a name filter.

The v2beta1 list calls return at most ``page_size`` items and a token for the rest; a
server with many pipelines or schedules must not make draslice miss one of its own.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

PAGE_SIZE = 100
MAX_PAGES = 1000  # a server that keeps answering with a token must not loop us forever


def name_filter(name: str, key: str = "display_name") -> str:
    """The JSON Filter for ``key == name`` that the v2beta1 list calls take."""
    return json.dumps(
        {"predicates": [{"operation": "EQUALS", "key": key, "string_value": name}]}
    )


def every(fetch: Callable[..., Any], items: str, **kwargs) -> Iterator[Any]:
    """Yield the items of every page: ``fetch(page_token=..., page_size=..., **kwargs)``."""
    token = ""
    for _ in range(MAX_PAGES):
        page = fetch(page_token=token, page_size=PAGE_SIZE, **kwargs)
        yield from getattr(page, items) or []
        token = page.next_page_token or ""
        if not token:
            return
    raise RuntimeError(f"more than {MAX_PAGES} pages of {items}; refusing to go on")
