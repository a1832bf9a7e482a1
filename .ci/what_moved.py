"""Which installed distributions differ from the pins of a constraints file (`make test-latest` prints it after its run).

Usage: python .ci/what_moved.py constraints.txt  (run by the environment to compare; the local `+cpu`/`+cu130` suffix
of a torch build is not a move)."""

import sys
from importlib.metadata import distributions

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name


def main(path: str) -> int:
    pins = {}
    for line in open(path, encoding="utf-8"):
        line = line.split("#")[0].strip()
        if "==" in line:
            r = Requirement(line)  # a pin that differs by Python or platform carries a marker
            if r.marker is None or r.marker.evaluate():
                pins[canonicalize_name(r.name)] = str(r.specifier).removeprefix("==")
    here = {canonicalize_name(d.metadata["Name"]): d.version for d in distributions()}
    moved = sorted((n, pins[n], v) for n, v in here.items() if n in pins and v.split("+")[0] != pins[n])
    print(f"{len(moved)} of {len(pins)} pinned packages moved since {path}:")
    for name, was, now in moved:
        print(f"  {name}: {was} -> {now}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
