from boot.cli import main

raise SystemExit(main())
