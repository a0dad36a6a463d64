#!/usr/bin/python3
# plegwatch scenario harness: an external NRI plugin that connects to CRI-O's NRI socket
# and registers, as any NRI plugin does when its DaemonSet pod (re)starts. It speaks the
# wire of containerd/nri v0.11 (CRI-O 1.35.6 vendors it), written out here because the
# Go stub library cannot be fetched on this machine:
# - the socket is multiplexed: frames of [conn id: u32 BE][length: u32 BE][bytes]; conn 1
#   carries the runtime's calls to the plugin (the Plugin service), conn 2 the plugin's
#   calls to the runtime (the Runtime service);
# - each conn carries ttrpc: [length: u32 BE][stream id: u32 BE][type: u8][flags: u8] and a
#   protobuf Request {service = 1, method = 2, payload = 3} (type 1) or Response
#   {status = 1, payload = 2} (type 2).
# It calls Runtime.RegisterPlugin (name "plegwatch-test", index "10"), answers
# Plugin.Configure with events = 1 << 2 (RemovePodSandbox only), and every other call with
# an empty payload (no adjustment, no update). After Configure, CRI-O synchronizes the
# plugin under its NRI lock: that is what the scenario stalls.
#
# It idles in poll(), as a Go plugin does in its netpoller, not in a blocking recv.
#
# Prints one line per step, flushed: "registered", "call METHOD" for each call it gets.
#
# Usage: nri_plugin.py SOCKET

import select
import socket
import struct
import sys

PLUGIN_CONN = 1
RUNTIME_CONN = 2
REQUEST = 1
RESPONSE = 2
REMOVE_POD_SANDBOX = 3


def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def field(num, value):
    if isinstance(value, int):
        return varint(num << 3) + varint(value)
    return varint(num << 3 | 2) + varint(len(value)) + value


def fields(buf):
    """The length-delimited fields of a protobuf message, by number (others skipped)."""
    out, i = {}, 0
    while i < len(buf):
        key, i = read_varint(buf, i)
        num, wire = key >> 3, key & 7
        if wire == 0:
            _, i = read_varint(buf, i)
        elif wire == 2:
            n, i = read_varint(buf, i)
            out[num] = buf[i : i + n]
            i += n
        elif wire == 1:
            i += 8
        elif wire == 5:
            i += 4
        else:
            raise ValueError(f"wire type {wire}")
    return out


def read_varint(buf, i):
    shift = n = 0
    while True:
        b = buf[i]
        i += 1
        n |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return n, i


def log(*words):
    print(*words, flush=True)


class Mux:
    def __init__(self, path):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.poller = select.poll()
        self.poller.register(self.sock, select.POLLIN)
        self.pending = {}

    def send(self, conn, stream, kind, payload):
        msg = struct.pack(">IIBB", len(payload), stream, kind, 0) + payload
        self.sock.sendall(struct.pack(">II", conn, len(msg)) + msg)

    def read_exact(self, n):
        buf = b""
        while len(buf) < n:
            # Idle in poll(), as a Go plugin idles in its netpoller (epoll): a thread
            # blocked in recvfrom() on the runtime's socket would itself look like a
            # client waiting on an unanswering server.
            self.poller.poll()
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise EOFError("the runtime closed the connection")
            buf += chunk
        return buf

    def messages(self):
        """(conn, stream, type, payload) of each ttrpc message, across mux frames."""
        while True:
            conn, length = struct.unpack(">II", self.read_exact(8))
            buf = self.pending.get(conn, b"") + self.read_exact(length)
            while len(buf) >= 10:
                size, stream, kind, _flags = struct.unpack(">IIBB", buf[:10])
                if len(buf) < 10 + size:
                    break
                yield conn, stream, kind, buf[10 : 10 + size]
                buf = buf[10 + size :]
            self.pending[conn] = buf


def main(path):
    mux = Mux(path)
    register = field(1, b"plegwatch-test") + field(2, b"10")
    request = field(1, b"nri.pkg.api.v1alpha1.Runtime") + field(2, b"RegisterPlugin") + field(3, register)
    mux.send(RUNTIME_CONN, 1, REQUEST, request)
    for conn, stream, kind, payload in mux.messages():
        if conn == RUNTIME_CONN and kind == RESPONSE and stream == 1:
            status = fields(payload).get(1)
            if status:
                log("error: registration refused", status)
                sys.exit(1)
            log("registered")
        elif conn == PLUGIN_CONN and kind == REQUEST:
            method = fields(payload).get(2, b"?").decode()
            log("call", method)
            body = field(2, 1 << (REMOVE_POD_SANDBOX - 1)) if method == "Configure" else b""
            mux.send(PLUGIN_CONN, stream, RESPONSE, field(2, body) if body else b"")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: nri_plugin.py SOCKET")
    try:
        main(sys.argv[1])
    except EOFError as e:
        log("closed:", e)
