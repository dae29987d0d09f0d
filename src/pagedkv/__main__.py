import sys

from pagedkv.cli import main

sys.exit(main())
