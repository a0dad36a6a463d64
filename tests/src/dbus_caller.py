#!/usr/bin/env python3
# A D-Bus client that is connected and has said Hello before it makes its one call,
# and makes it only when told (SIGUSR1). The scenario freezes the bus daemon in
# between, so that the call sits in the daemon's socket: no stock client (dbus-send,
# gdbus, busctl) can be stopped between its Hello and its call, and no D-Bus library
# for Python is installed here, so the few messages it needs are marshalled by hand
# (D-Bus specification, "Message Format": little-endian, no body).
#
# Usage: dbus_caller.py SOCKET DESTINATION PATH INTERFACE MEMBER
# Prints "ready UNIQUE_NAME SERIAL" once it can call (SERIAL: its call's), then
# "reply TYPE" when the call is answered (2: a return, 3: an error).
import os
import signal
import socket
import struct
import sys


def pad(buf, n):
    return buf + b"\0" * (-len(buf) % n)


def string_field(code, sig, value):
    # One header field, a (BYTE, VARIANT) struct: starts 8-aligned; the value (a
    # STRING or OBJECT_PATH) is its length, 4-aligned, the bytes and a NUL.
    s = value.encode()
    field = struct.pack("<B", code) + bytes([1]) + sig.encode() + b"\0"
    return pad(field, 4) + struct.pack("<I", len(s)) + s + b"\0"


def method_call(serial, destination, path, interface, member):
    fields = b""
    for code, sig, value in ((1, "o", path), (2, "s", interface), (3, "s", member), (6, "s", destination)):
        fields = pad(fields, 8) + string_field(code, sig, value)
    head = struct.pack("<cBBBII", b"l", 1, 0, 1, 0, serial) + struct.pack("<I", len(fields)) + fields
    return pad(head, 8)


def read_exact(sock, n):
    out = b""
    while len(out) < n:
        got = sock.recv(n - len(out))
        if not got:
            sys.exit("closed")
        out += got
    return out


def read_message(sock):
    # Returns (type, reply serial or None, body).
    fixed = read_exact(sock, 16)
    _, mtype, _, _, body_len, _, fields_len = struct.unpack("<cBBBIII", fixed)
    fields = read_exact(sock, fields_len + (-(16 + fields_len) % 8))
    body = read_exact(sock, body_len)
    reply_to = None
    i = 0
    while i < fields_len:
        i += -i % 8
        code, sig_len = fields[i], fields[i + 1]
        sig = fields[i + 2 : i + 2 + sig_len]
        i += 3 + sig_len
        if sig in (b"s", b"o"):
            i += -i % 4
            (n,) = struct.unpack_from("<I", fields, i)
            i += 4 + n + 1
        elif sig == b"u":
            i += -i % 4
            (value,) = struct.unpack_from("<I", fields, i)
            if code == 5:
                reply_to = value
            i += 4
        elif sig == b"g":
            i += 1 + fields[i] + 1
        else:
            break
    return mtype, reply_to, body


def main():
    if len(sys.argv) != 6:
        sys.exit("usage: dbus_caller.py SOCKET DESTINATION PATH INTERFACE MEMBER")
    bus, destination, path, interface, member = sys.argv[1:]
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(bus)
    sock.sendall(b"\0AUTH EXTERNAL " + str(os.getuid()).encode().hex().encode() + b"\r\n")
    line = b""
    while not line.endswith(b"\r\n"):
        line += read_exact(sock, 1)
    if not line.startswith(b"OK "):
        sys.exit("auth refused: %r" % line)
    sock.sendall(b"BEGIN\r\n")
    sock.sendall(method_call(1, "org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus", "Hello"))
    while True:
        mtype, reply_to, body = read_message(sock)
        if reply_to == 1:
            break
    if mtype != 2:
        sys.exit("Hello failed")
    (n,) = struct.unpack_from("<I", body, 0)
    unique = body[4 : 4 + n].decode()
    print("ready", unique, 2, flush=True)
    signal.sigwait({signal.SIGUSR1})
    sock.sendall(method_call(2, destination, path, interface, member))
    while True:
        mtype, reply_to, _ = read_message(sock)
        if reply_to == 2:
            print("reply", mtype, flush=True)
            return


if __name__ == "__main__":
    main()
