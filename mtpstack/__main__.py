from mtpstack.cli import main

raise SystemExit(main())
