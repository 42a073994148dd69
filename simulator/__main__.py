"""``python -m simulator``: the same command line as the ``simulator`` console script."""

from simulator.cli import main

if __name__ == "__main__":
    main()
