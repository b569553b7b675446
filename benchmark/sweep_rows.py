"""The rows of a GPU sweep, printed as a markdown table while it runs and written for a results file
(the sweep scripts kept beside their results in `benchmark/results/*/` use it).

    rows = SweepRows("name.txt", "column", ...)   # prints the device line and the header row
    rows.add(cell, ...)                           # prints one row and keeps it
    rows.save()                                   # writes the kept rows to $OUT/name.txt (default /tmp)
"""

from __future__ import annotations

import os
import time

import torch


class SweepRows:
    def __init__(self, name: str, *header):
        self.name, self.rows, self.start = name, [], time.time()
        print(f"{torch.cuda.get_device_name()} torch {torch.__version__}", flush=True)
        self.add(*header)

    def add(self, *cells) -> None:
        row = "| " + " | ".join(str(c) for c in cells) + " |"
        print(row, flush=True)
        self.rows.append(row)

    def elapsed(self) -> float:
        """Seconds since the table started (sweeps stop adding configs past a time limit)."""
        return time.time() - self.start

    def save(self) -> None:
        with open(os.path.join(os.environ.get("OUT", "/tmp"), self.name), "w") as f:
            f.write("\n".join(self.rows) + "\n")
        print("done", time.strftime("%H:%M:%S"), flush=True)
