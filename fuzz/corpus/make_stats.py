#!/usr/bin/env python3
"""Seed corpus for fuzz_stats: well-formed statistics files (src/wire/stats_file.h, v1)."""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
NCTR, NWC = 15, 24
SLOT = 40 + 8 * (NCTR + NWC)


def header(nslots, pid=1234, comm=b"ib_write_bw"):
    return (b"SVSTATS1" + struct.pack("<8I", 1, 64, SLOT, nslots, NCTR, NWC, pid, 0)
            + struct.pack("<Q", 99) + comm.ljust(16, b"\0")[:16])


def slot(qpn, state=3, peer=b"\x7f\x00\x00\x01", counters=()):
    c = list(counters) + [0] * (NCTR + NWC - len(counters))
    return (struct.pack("<4I", qpn, state, 2, qpn + 1) + struct.pack("<HH", 2, 0x1234)
            + peer.ljust(16, b"\0") + b"\0" * 4 + struct.pack("<%dQ" % (NCTR + NWC), *c))


def write(name, data):
    d = os.path.join(HERE, "stats")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


write("empty", header(2) + slot(0) + slot(0))
write("two_qps", header(4) + slot(0, counters=[5] * 4) + slot(17, counters=range(1, 30))
      + slot(0) + slot(18, state=6))
write("retired_only", header(1) + slot(0, counters=[1, 2, 3]))
