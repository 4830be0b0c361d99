from profiling.cli import main

raise SystemExit(main())
