"""Entry point of `hami-node`."""

import sys


def main(argv: list[str] | None = None) -> int:
    print("hami-node: not yet implemented (see issue 'Node daemon')", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
