"""`python -m agentrl.probe calibrate SWEEP_JSON`: rewrite the packaged thresholds from a horizon sweep."""

import sys

from agentrl.probe.calibration import main

if __name__ == "__main__":
    argv = sys.argv[1:]
    if not argv or argv[0] != "calibrate":
        print(
            "usage: python -m agentrl.probe calibrate SWEEP_JSON [--out FILE]  (the probe itself: agentrl probe)",
            file=sys.stderr,
        )
        raise SystemExit(2)
    raise SystemExit(main(argv[1:]))
