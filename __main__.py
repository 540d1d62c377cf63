"""``python -m draslice`` is the ``draslice`` command."""

from draslice.cli import main

if __name__ == "__main__":
    main()
