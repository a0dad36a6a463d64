#!/usr/bin/python3
# plegwatch scenario harness: a stand-in for systemd on a private bus, enough for the systemd
# cgroup driver of runc 1.1.5 (libcontainer/cgroups/systemd) and of runc 1.4.3
# (github.com/opencontainers/cgroups v0.0.6 systemd, its v1 LegacyManager), both through
# go-systemd v22's dbus package.
#
# Owns org.freedesktop.systemd1 and answers, on /org/freedesktop/systemd1 and unit paths:
# - Manager.StartTransientUnit, StopUnit: a job path, then the JobRemoved signal with result
#   "done" (runc waits up to 30 s for it after the call returns);
# - Manager.SetUnitProperties, ResetFailedUnit: an empty reply;
# - Properties.Get: Manager.Version ("252"); a unit's DevicePolicy ("auto") and DeviceAllow
#   (empty), which runc's Set reads; anything else is an UnknownProperty error;
# - Properties.GetAll of a unit: none (CRI-O runs `systemctl show -p NAME systemd` to learn
#   whether systemd has a property: it has not).
# Any other call gets an UnknownMethod error. With cgroup v1 it never touches a cgroup: runc
# joins the cgroups itself after StartTransientUnit. With cgroup v2 runc leaves that to
# systemd, so, as systemd does, StartTransientUnit makes the unit's cgroup under its Slice
# (expanded: a-b.slice is a.slice/a-b.slice) and moves the unit's PIDs into it.
#
# Prints "ready UNIQUE_NAME" once it owns the name, then one line per call it gets
# ("call MEMBER PATH ARG0", for Properties.Get "call Get PATH INTERFACE.PROPERTY", and for StartTransientUnit and SetUnitProperties the names of the
# properties asked for: "props=Description,Slice,..."), and after it "refused MEMBER ..." when
# the answer is an UnknownMethod or UnknownProperty error (a call it does not know), flushed,
# so that a test can follow it.
#
# Usage: fake_systemd.py BUS_ADDRESS  (e.g. unix:path=/run/dbus/system_bus_socket)

import asyncio
import os
import sys

from dbus_next import Message, MessageType, Variant
from dbus_next.aio import MessageBus
from dbus_next.constants import RequestNameReply

NAME = "org.freedesktop.systemd1"
PATH = "/org/freedesktop/systemd1"
MANAGER = "org.freedesktop.systemd1.Manager"
PROPERTIES = "org.freedesktop.DBus.Properties"
UNIT_PATH = PATH + "/unit/"
CGROUP2 = "/sys/fs/cgroup"
UNIFIED = os.path.exists(CGROUP2 + "/cgroup.controllers")


def slice_path(name):
    """systemd's path of a slice: a-b-c.slice is a.slice/a-b.slice/a-b-c.slice; -.slice is the root."""
    if name in ("", "-.slice") or not name.endswith(".slice"):
        return ""
    parts = name[: -len(".slice")].split("-")
    return "/".join("-".join(parts[: i + 1]) + ".slice" for i in range(len(parts)))


def make_unit_cgroup(unit, props):
    """On cgroup v2: the unit's cgroup under its slice, with its PIDs moved in (what systemd
    does for a transient scope); returns the path, or why not."""
    if not UNIFIED:
        return None
    slice_ = props.get("Slice", "system.slice")
    if unit.endswith(".slice"):
        path = os.path.join(CGROUP2, slice_path(unit))
    else:
        path = os.path.join(CGROUP2, slice_path(slice_), unit)
    try:
        os.makedirs(path, exist_ok=True)
        for pid in props.get("PIDs", []):
            with open(os.path.join(path, "cgroup.procs"), "w") as f:
                f.write(str(pid))
    except OSError as e:
        return f"error {e}"
    return path


def log(*words):
    print(*words, flush=True)


async def main(address):
    bus = await MessageBus(bus_address=address).connect()
    loop = asyncio.get_running_loop()
    jobs = [0]

    def job_done(job_id, job, unit):
        bus.send(Message.new_signal(PATH, MANAGER, "JobRemoved", "uoss", [job_id, job, unit, "done"]))

    def handler(msg):
        if msg.message_type != MessageType.METHOD_CALL or msg.destination != NAME:
            return None
        arg0 = msg.body[0] if msg.body else ""
        if msg.interface == PROPERTIES and msg.member == "Get" and len(msg.body) == 2:
            arg0 = ".".join(msg.body)
        words = ["call", msg.member, msg.path, arg0 if isinstance(arg0, str) else ""]
        # StartTransientUnit(ssa(sv)a(sa(sv))): properties third; SetUnitProperties(sba(sv)).
        props = {"StartTransientUnit": 2, "SetUnitProperties": 2}.get(msg.member)
        if msg.interface == MANAGER and props is not None and len(msg.body) > props:
            words.append("props=" + ",".join(p[0] for p in msg.body[props]))
        log(*words)
        if msg.interface == MANAGER and msg.member == "StartTransientUnit" and len(msg.body) > 2:
            made = make_unit_cgroup(arg0, {p[0]: p[1].value for p in msg.body[2]})
            if made is not None:
                log("cgroup", arg0, made)
        if msg.interface == MANAGER and msg.member in ("StartTransientUnit", "StopUnit"):
            jobs[0] += 1
            job = f"{PATH}/job/{jobs[0]}"
            # After the reply: go-systemd registers the job under a lock it holds across the call.
            loop.call_soon(job_done, jobs[0], job, arg0)
            return Message.new_method_return(msg, "o", [job])
        if msg.interface == MANAGER and msg.member in ("SetUnitProperties", "ResetFailedUnit"):
            return Message.new_method_return(msg)
        if msg.interface == PROPERTIES and msg.member == "GetAll" and msg.path.startswith(UNIT_PATH):
            # `systemctl show -p NAME UNIT` (CRI-O asks it whether systemd has a property):
            # no properties, so that NAME is not supported.
            return Message.new_method_return(msg, "a{sv}", [{}])
        if msg.interface == PROPERTIES and msg.member == "Get" and len(msg.body) == 2:
            iface, prop = msg.body
            value = None
            if msg.path == PATH and iface == MANAGER and prop == "Version":
                value = Variant("s", "252")
            elif msg.path.startswith(UNIT_PATH) and prop == "DevicePolicy":
                value = Variant("s", "auto")
            elif msg.path.startswith(UNIT_PATH) and prop == "DeviceAllow":
                value = Variant("a(ss)", [])
            if value is not None:
                return Message.new_method_return(msg, "v", [value])
            log("refused", msg.member, msg.path, f"{iface}.{prop}")
            return Message.new_error(msg, "org.freedesktop.DBus.Error.UnknownProperty", f"no {iface}.{prop}")
        log("refused", msg.member, msg.path, f"{msg.interface}.{msg.member}")
        return Message.new_error(msg, "org.freedesktop.DBus.Error.UnknownMethod", f"no {msg.interface}.{msg.member}")

    bus.add_message_handler(handler)
    reply = await bus.request_name(NAME)
    if reply != RequestNameReply.PRIMARY_OWNER:
        log("error: could not own", NAME, reply)
        sys.exit(1)
    log("ready", bus.unique_name)
    await loop.create_future()


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: fake_systemd.py BUS_ADDRESS")
    asyncio.run(main(sys.argv[1]))
