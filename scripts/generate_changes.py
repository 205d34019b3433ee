#!/usr/bin/env python
"""Write a generated change stream as landing files (see --help)."""

from resources.lsm.testing.changegen import main

if __name__ == "__main__":
    main()
