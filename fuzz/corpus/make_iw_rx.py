#!/usr/bin/env python3
"""Writes the seed corpus of fuzz_iw_rx (fuzz/fuzz_iw_rx.cc): one well-formed stream per
path through the responder, in the layout of RFC 5044 (FPDU), RFC 5041 (DDP), RFC 5040
(RDMAP) and RFC 7306 (atomics, immediate data). Byte 0 is the harness's configuration byte;
STags are the harness's markers (0x7EA500 | MR index); MR i is registered at
TO (i + 1) << 20.

    python3 fuzz/corpus/make_iw_rx.py fuzz/corpus/iw_rx
"""
import os
import struct
import sys

MARK = 0x7EA50000
IOVA = [(i + 1) << 20 for i in range(3)]

WRITE, READ_REQ, READ_RESP, SEND, SEND_INV, SEND_SE, SEND_SE_INV, TERMINATE = range(8)
IMM, IMM_SE, ATOMIC_REQ, ATOMIC_RESP = 8, 9, 10, 11
QN_SEND, QN_RREQ, QN_TERM, QN_ARESP = 0, 1, 2, 3


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def fpdu(ulpdu, crc=False):
    """MPA framing: ULPDU_Length, ULPDU, pad to 4, CRC (LSB first, as siw)."""
    body = struct.pack(">H", len(ulpdu)) + ulpdu
    body += b"\0" * (-len(body) % 4)
    return body + struct.pack("<I", crc32c(body) if crc else 0)


def ctrl(tagged, last, op):
    return bytes([(0x80 if tagged else 0) | (0x40 if last else 0) | 0x01, 0x40 | op])


def tagged(op, stag, to, payload=b"", last=True):
    return ctrl(True, last, op) + struct.pack(">IQ", stag, to) + payload


def untagged(op, qn, msn, mo=0, payload=b"", last=True, rsvd=0):
    return ctrl(False, last, op) + struct.pack(">IIII", rsvd, qn, msn, mo) + payload


def read_req(msn, sink_stag, sink_to, size, src_stag, src_to):
    return untagged(READ_REQ, QN_RREQ, msn,
                    payload=struct.pack(">IQIIQ", sink_stag, sink_to, size, src_stag, src_to))


def atomic_req(msn, op, stag, to, add_swap, compare=0):
    # RFC 7306 §5.2: atomic opcode, request id, STag, TO, add/swap data and mask,
    # compare data and mask.
    ones = (1 << 64) - 1
    return untagged(ATOMIC_REQ, QN_RREQ, msn,
                    payload=struct.pack(">IIIQQQQQ", op, msn, stag, to, add_swap, ones, compare,
                                        ones))


def terminate(layer, etype, ecode):
    hdr = struct.pack(">BBH", (layer << 4) | etype, ecode, 0)
    return untagged(TERMINATE, QN_TERM, 1, payload=hdr)


def seeds():
    s = {}
    msg = b"hello, softverbs"
    s["send_write_read"] = bytes([0x07]) + b"".join([
        fpdu(untagged(SEND, QN_SEND, 1, payload=msg)),
        fpdu(untagged(SEND, QN_SEND, 2, payload=b"A" * 600, last=False)),
        fpdu(untagged(SEND, QN_SEND, 2, mo=600, payload=b"B" * 300)),
        fpdu(tagged(WRITE, MARK | 0, IOVA[0] + 16, b"W" * 32)),
        fpdu(read_req(1, 0x1234, 0, 64, MARK | 1, IOVA[1] + 8)),
        fpdu(untagged(SEND_SE, QN_SEND, 3, payload=msg)),
    ])
    s["crc_send_inv"] = bytes([0x09]) + b"".join([
        fpdu(untagged(SEND, QN_SEND, 1, payload=msg), crc=True),
        fpdu(untagged(SEND_INV, QN_SEND, 2, payload=msg, rsvd=MARK | 0), crc=True),
    ])
    s["sv_atomic_imm"] = bytes([0x13]) + b"".join([
        fpdu(atomic_req(1, 0, MARK | 0, IOVA[0] + 64, 5)),
        fpdu(atomic_req(2, 2, MARK | 0, IOVA[0] + 64, 9, 5)),
        fpdu(untagged(SEND, QN_SEND, 1, payload=msg, rsvd=0x53560001)),
        fpdu(untagged(IMM, QN_SEND, 2, payload=struct.pack(">II", 0xCAFE, 1))),
        fpdu(tagged(WRITE, MARK | 0, IOVA[0], b"w" * 8)),
        fpdu(untagged(IMM_SE, QN_SEND, 3, payload=struct.pack(">II", 0xBEEF, 0))),
    ])
    s["p2p_rtr_then_send"] = bytes([0x21]) + b"".join([
        fpdu(tagged(WRITE, 0, 0)),
        fpdu(untagged(SEND, QN_SEND, 1, payload=msg)),
    ])
    s["big_write_direct"] = bytes([0xC1]) + fpdu(tagged(WRITE, MARK | 0, IOVA[0], b"D" * 4096))
    s["write_beyond_mr"] = bytes([0x41]) + fpdu(tagged(WRITE, MARK | 0, IOVA[0] + 4090, b"x" * 32))
    s["write_readonly"] = bytes([0x41]) + fpdu(tagged(WRITE, MARK | 1, IOVA[1], b"x" * 32))
    s["unsolicited_read_resp"] = bytes([0x01]) + fpdu(tagged(READ_RESP, 0x99, 0, b"r" * 16))
    s["terminate"] = bytes([0x01]) + fpdu(terminate(1, 1, 2))
    s["send_no_recv"] = bytes([0x00]) + fpdu(untagged(SEND, QN_SEND, 1, payload=msg))
    s["send_too_long"] = bytes([0x81]) + fpdu(untagged(SEND, QN_SEND, 1, payload=b"L" * 1500))
    s["bad_msn"] = bytes([0x02]) + fpdu(untagged(SEND, QN_SEND, 7, payload=msg))
    s["read_req_many"] = bytes([0x00]) + b"".join(
        fpdu(read_req(i + 1, 0x1000 + i, 0, 512, MARK | 0, IOVA[0] + 512 * i)) for i in range(6))
    return s


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "iw_rx")
    os.makedirs(out, exist_ok=True)
    for name, data in seeds().items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
