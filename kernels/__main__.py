"""``python -m tide_fleet.kernels``: which implementation serves each op on this machine."""

from tide_fleet.kernels.dispatch import main

raise SystemExit(main())
