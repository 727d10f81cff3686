"""`python -m calo.native`: build the native walker now (setup does), or say why it does not."""

from calo import native

try:
    print(f"native schedule-graph walker: {native.build()}")
except RuntimeError as err:
    print(f"native schedule-graph walker not built, the Python walker runs instead: {err}")
