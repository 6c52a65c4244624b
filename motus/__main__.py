"""``python -m motus`` is the ``motus`` command."""

from motus.cli import main

if __name__ == "__main__":
    main(prog_name="motus")
