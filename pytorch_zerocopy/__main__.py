"""``python -m pytorch_zerocopy`` is the ``zerocopy`` command."""

from .cli import main

raise SystemExit(main())
