"""Entry point of `hami-control`."""

import sys


def main(argv: list[str] | None = None) -> int:
    print("hami-control: not yet implemented (see issue 'Control plane')", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
