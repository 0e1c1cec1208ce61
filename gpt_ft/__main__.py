"""`gpt-ft` and `python -m gpt_ft`."""

import sys

from gpt_ft.cli import main

if __name__ == "__main__":
    sys.argv[0] = "gpt-ft"  # the program the usage lines name (`python -m gpt_ft`'s was __main__.py)
    main()
