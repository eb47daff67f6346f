"""`python -m infra.cli`: the `tide` command."""

from infra.cli.main import main

raise SystemExit(main())
