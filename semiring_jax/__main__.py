"""`python -m semiring_jax`: the command line (see `semiring_jax._src.cli.main`)."""

import sys

from semiring_jax._src.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
