import sys

from prefillviz.cli import main

sys.exit(main())
