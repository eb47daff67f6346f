"""`python -m tide_fleet.infra.cli`: the `tide` command."""

from tide_fleet.infra.cli.main import main

raise SystemExit(main())
