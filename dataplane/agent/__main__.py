from dataplane.agent.cli import main

raise SystemExit(main())
