"""``python -m libshare.k8s``: the Kubernetes device plugin (see ``libshare.k8s._cli``)."""

import sys

from libshare.k8s._cli import main

sys.exit(main())
