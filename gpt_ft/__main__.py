"""`gpt-ft` and `python -m gpt_ft`."""

from gpt_ft.cli import main

if __name__ == "__main__":
    main()
