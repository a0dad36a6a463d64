#!/usr/bin/env python3
"""Writes seed inputs for the fuzz targets (real byte layouts, in each target's
input format) into seeds/<target>/. Run: python3 fuzz/seeds/gen.py"""
import os, struct

HERE = os.path.dirname(os.path.abspath(__file__))

def put(target, name, data):
    d = os.path.join(HERE, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)

# ---- netlink ----
def nlmsg(t, flags, seq, pid, payload):
    b = struct.pack("<IHHII", 16 + len(payload), t, flags, seq, pid) + payload
    return b + b"\0" * (-len(b) % 4)

def nlattr(t, payload):
    b = struct.pack("<HH", 4 + len(payload), t) + payload
    return b + b"\0" * (-len(b) % 4)

ifinfo = b"\0" * 16
getlink = nlmsg(18, 0x301, 7, 0, ifinfo)
links = nlmsg(16, 2, 7, 99, ifinfo + nlattr(3, b"lo\0")) + nlmsg(16, 2, 7, 99, ifinfo + nlattr(3, b"eth0\0"))
done = nlmsg(3, 2, 7, 99, struct.pack("<i", 0))
newaddr = nlmsg(20, 0x605, 8, 0, b"\0" * 8)
ack = nlmsg(2, 0x100, 8, 99, struct.pack("<i", 0) + newaddr[:16])
eexist = nlmsg(2, 0, 8, 99, struct.pack("<i", -17) + newaddr[:16])
getfam = nlmsg(16, 0x301, 3, 0, bytes([3, 1, 0, 0]))
newfam = nlmsg(16, 2, 3, 99, bytes([1, 2, 0, 0]) + nlattr(2, b"devlink\0") + nlattr(1, struct.pack("<H", 0x15)))
SEP = b"\xa5"
put("netlink_parse", "route_dump", bytes([0]) + struct.pack("<H", 512) + getlink + SEP + links + done)
put("netlink_parse", "route_ack", bytes([0]) + struct.pack("<H", 512) + newaddr + SEP + ack + SEP + newaddr + SEP + eexist)
put("netlink_parse", "route_cut", bytes([0]) + struct.pack("<H", 40) + getlink + SEP + links + done)
put("netlink_parse", "genl_families", bytes([1]) + struct.pack("<H", 512) + getfam + SEP + newfam + done)

# ---- dbus ----
def dbus_msg(endian, kind, serial, fields, body=b"", flags=0):
    e = "<" if endian == b"l" else ">"
    out = bytearray(endian + bytes([kind, flags, 1]) + struct.pack(e + "III", len(body), serial, 0))
    for code, sig, val in fields:
        out += b"\0" * (-len(out) % 8)
        out += bytes([code, len(sig)]) + sig + b"\0"
        if sig == b"g":
            out += bytes([len(val)]) + val + b"\0"
        elif sig in (b"s", b"o"):
            out += b"\0" * (-len(out) % 4)
            out += struct.pack(e + "I", len(val)) + val + b"\0"
        elif sig == b"u":
            out += b"\0" * (-len(out) % 4)
            out += struct.pack(e + "I", val)
    out[12:16] = struct.pack(e + "I", len(out) - 16)
    out += b"\0" * (-len(out) % 8)
    return bytes(out) + body

def call(endian, serial, member, body=b"\0" * 64):
    return dbus_msg(endian, 1, serial, [
        (1, b"o", b"/org/freedesktop/systemd1"),
        (6, b"s", b"org.freedesktop.systemd1"),
        (2, b"s", b"org.freedesktop.systemd1.Manager"),
        (3, b"s", member),
        (8, b"g", b"ssa(sv)a(sa(sv))"),
    ], body)

def reply(endian, serial, rs, dest=b":1.42"):
    return dbus_msg(endian, 2, serial, [(5, b"u", rs), (6, b"s", dest), (7, b"s", b"org.freedesktop.DBus")])

hello = dbus_msg(b"l", 1, 1, [(1, b"o", b"/org/freedesktop/DBus"), (6, b"s", b"org.freedesktop.DBus"),
                             (2, b"s", b"org.freedesktop.DBus"), (3, b"s", b"Hello")])

def rec(data, extra=0, read=False):
    # extra's low bit: 1 = read; the rest: uncaptured bytes.
    return struct.pack("<HH", len(data), (extra << 1) | int(read)) + data

sasl_c = b"\0AUTH EXTERNAL 30\r\nNEGOTIATE_UNIX_FD\r\nBEGIN\r\n"
sasl_s = b"OK 0123456789abcdef0123456789abcdef\r\nAGREE_UNIX_FD\r\n"
put("dbus_stream", "runc_systemd", b"\0" + rec(sasl_c + hello) + rec(sasl_s + reply(b"l", 1, 1), read=True)
    + rec(call(b"l", 2, b"StartTransientUnit")) + rec(reply(b"l", 3, 2), read=True))
big = call(b"B", 5, b"SetUnitProperties", b"\x07" * 3000)
put("dbus_stream", "cut_body_big_endian", b"\0" + rec(sasl_c) + rec(big[:512], len(big) - 512) + rec(call(b"B", 6, b"X")))
split = sasl_c + hello + call(b"l", 2, b"A")
put("dbus_stream", "split", b"\0" + b"".join(rec(split[i:i + 7]) for i in range(0, len(split), 7)))
put("dbus_stream", "server_side", b"\1" + rec(sasl_c + call(b"l", 9, b"StartTransientUnit"), read=True)
    + rec(b"OK 00ff\r\n" + reply(b"l", 1, 9, b"")))

# ---- ttrpc ----
def ttrpc(length, stream, kind, flags=0):
    return struct.pack(">IIBB", length, stream, kind, flags)

put("ttrpc_header", "request_response", ttrpc(120, 1, 1) + ttrpc(8, 1, 2))
put("ttrpc_header", "streams", ttrpc(64, 3, 1) + ttrpc(32, 3, 3, 1) + ttrpc(0, 5, 1) + ttrpc(16, 5, 2))
put("ttrpc_header", "cut", ttrpc(120, 7, 1)[:6])

# ---- goroutine_decode: a plausible parked g for the first layout (offsets vary by
# version: the fuzzer finds the others; these only give it a start).
g = bytearray(512)
struct.pack_into("<QQ", g, 0, 0xc000001000, 0xc000003000)  # stack.lo, stack.hi
put("goroutine_decode", "zeros", bytes([0]) + bytes(512))
put("goroutine_decode", "stack_bounds", bytes([1]) + bytes(g))
