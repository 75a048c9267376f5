"""Command line: make a lazykv bearer token and the [tenant NAME] section that admits it.

    python3 -m lazykv.tenant new alice --roles data [--key-hex AUTH_KEY]
    echo -n "$TOKEN" | python3 -m lazykv.tenant hash [--key-hex AUTH_KEY]

(A separate module from lazykv.auth, which the package imports, so that `-m` runs it cleanly.)
"""

import sys

from lazykv.auth import main

if __name__ == "__main__":
    sys.exit(main())
