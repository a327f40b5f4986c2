"""The programs the launcher starts on every rank (train.py, through standby.py) and their parts.

Before anything of theirs imports the libraries: the trackers the controller found unused are made absent here
(sft/tracking.py says why), in every program of the ranks, as the package is imported first."""

import os

from .. import tracking

tracking.hide(os.environ.get(tracking.UNUSED_VARIABLE, "").split(","))
