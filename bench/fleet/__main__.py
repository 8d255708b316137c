import sys

from bench.fleet.run import main

sys.exit(main())
