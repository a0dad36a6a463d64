//! Every kernel struct field plegwatch's eBPF programs read, located in one
//! BTF parse at load time and handed to them as read-only globals.

use super::{Btf, BtfError, Member};
use std::fmt;

/// One kernel struct field: where it is, or why it could not be found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Field {
    name: &'static str,
    found: Result<Member, String>,
}

impl Field {
    /// Looks up `name`, written `struct.member.path` (e.g. `"task_struct.thread.fsbase"`).
    pub fn lookup(btf: &Btf, name: &'static str) -> Field {
        let found = match name.split_once('.') {
            Some((struct_name, path)) => btf.member(struct_name, path).map_err(|e| e.to_string()),
            None => Err(format!("`{name}` is not written struct.member")),
        };
        Field { name, found }
    }

    /// The first of `names` this kernel has (newest name first); if none, the
    /// first name with every reason.
    pub fn lookup_first(btf: &Btf, names: &[&'static str]) -> Field {
        let mut reasons = Vec::new();
        for &name in names {
            let field = Field::lookup(btf, name);
            match field.found {
                Ok(_) => return field,
                Err(reason) => reasons.push(reason),
            }
        }
        Field { name: names.first().copied().unwrap_or(""), found: Err(reasons.join("; ")) }
    }

    /// A field known to be missing, e.g. because BTF could not be read at all.
    pub fn missing(name: &'static str, reason: impl Into<String>) -> Field {
        Field { name, found: Err(reason.into()) }
    }

    /// `struct.member.path`, as looked up (for a fallback, the name that resolved).
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Byte offset from the start of the outermost struct.
    pub fn offset(&self) -> Option<u32> {
        self.member().map(|m| m.offset)
    }

    /// Size in bytes of the field's type.
    pub fn size(&self) -> Option<u32> {
        self.member().map(|m| m.size)
    }

    /// Offset and size together.
    pub fn member(&self) -> Option<Member> {
        self.found.as_ref().ok().copied()
    }

    /// Why the field is missing, if it is.
    pub fn reason(&self) -> Option<&str> {
        self.found.as_ref().err().map(String::as_str)
    }
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.found {
            Ok(m) => write!(f, "{} at offset {} ({} bytes)", self.name, m.offset, m.size),
            Err(reason) => write!(f, "{} missing: {reason}", self.name),
        }
    }
}

/// The kernel struct fields plegwatch reads, all from one BTF parse. A field
/// this kernel lacks is missing (with its reason) without sinking the others.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelOffsets {
    /// `task_struct.pid` (`pid_t`, the TID).
    pub task_pid: Field,
    /// `task_struct.tgid` (`pid_t`, the PID).
    pub task_tgid: Field,
    /// `task_struct.__state` (`unsigned int`, 5.14+), else `task_struct.state` (`long`).
    pub task_state: Field,
    /// `task_struct.comm` (`char[16]`).
    pub task_comm: Field,
    /// `task_struct.thread.fsbase` (x86_64 only: the TLS base, where Go keeps `g`).
    pub task_fsbase: Field,
    /// `task_struct.files` (`struct files_struct *`).
    pub task_files: Field,
    /// `files_struct.fdt` (`struct fdtable *`).
    pub files_fdt: Field,
    /// `fdtable.fd` (`struct file **`).
    pub fdtable_fd: Field,
    /// `file.private_data` (`void *`; a `struct socket *` for sockets).
    pub file_private_data: Field,
    /// `socket.sk` (`struct sock *`).
    pub socket_sk: Field,
    /// `sock.__sk_common.skc_family` (`unsigned short`).
    pub sock_family: Field,
    /// `sock.sk_protocol` (`u16` since 5.6; a bitfield before, so missing there).
    pub sock_protocol: Field,
    /// `sock.sk_type` (`u16` since 5.6; a bitfield before, so missing there).
    pub sock_type: Field,
    /// `task_struct.mm` (`struct mm_struct *`).
    pub task_mm: Field,
    /// `mm_struct.start_code` (`unsigned long`: where the executable's code starts).
    pub mm_start_code: Field,
    /// `mm_struct.end_code` (`unsigned long`).
    pub mm_end_code: Field,
    /// `task_struct.task_works` (`struct callback_head *`: the thread's queued task_work).
    pub task_works: Field,
}

impl KernelOffsets {
    /// Locates every field in `btf`.
    pub fn from_btf(btf: &Btf) -> KernelOffsets {
        let f = |name| Field::lookup(btf, name);
        KernelOffsets {
            task_pid: f("task_struct.pid"),
            task_tgid: f("task_struct.tgid"),
            task_state: Field::lookup_first(btf, &["task_struct.__state", "task_struct.state"]),
            task_comm: f("task_struct.comm"),
            task_fsbase: f("task_struct.thread.fsbase"),
            task_files: f("task_struct.files"),
            files_fdt: f("files_struct.fdt"),
            fdtable_fd: f("fdtable.fd"),
            file_private_data: f("file.private_data"),
            socket_sk: f("socket.sk"),
            sock_family: f("sock.__sk_common.skc_family"),
            sock_protocol: f("sock.sk_protocol"),
            sock_type: f("sock.sk_type"),
            task_mm: f("task_struct.mm"),
            mm_start_code: f("mm_struct.start_code"),
            mm_end_code: f("mm_struct.end_code"),
            task_works: f("task_struct.task_works"),
        }
    }

    /// Parses the running kernel's BTF and locates every field.
    pub fn from_sys_fs() -> Result<KernelOffsets, BtfError> {
        Ok(KernelOffsets::from_btf(&Btf::from_sys_fs()?))
    }

    /// Every field missing for the same reason (BTF could not be read).
    pub fn all_missing(reason: &str) -> KernelOffsets {
        let f = |name| Field::missing(name, reason);
        KernelOffsets {
            task_pid: f("task_struct.pid"),
            task_tgid: f("task_struct.tgid"),
            task_state: f("task_struct.__state"),
            task_comm: f("task_struct.comm"),
            task_fsbase: f("task_struct.thread.fsbase"),
            task_files: f("task_struct.files"),
            files_fdt: f("files_struct.fdt"),
            fdtable_fd: f("fdtable.fd"),
            file_private_data: f("file.private_data"),
            socket_sk: f("socket.sk"),
            sock_family: f("sock.__sk_common.skc_family"),
            sock_protocol: f("sock.sk_protocol"),
            sock_type: f("sock.sk_type"),
            task_mm: f("task_struct.mm"),
            mm_start_code: f("mm_struct.start_code"),
            mm_end_code: f("mm_struct.end_code"),
            task_works: f("task_struct.task_works"),
        }
    }

    /// All fields, in declaration order (for `plegwatch doctor` and logs).
    pub fn fields(&self) -> [&Field; 17] {
        [
            &self.task_pid,
            &self.task_tgid,
            &self.task_state,
            &self.task_comm,
            &self.task_fsbase,
            &self.task_files,
            &self.files_fdt,
            &self.fdtable_fd,
            &self.file_private_data,
            &self.socket_sk,
            &self.sock_family,
            &self.sock_protocol,
            &self.sock_type,
            &self.task_mm,
            &self.mm_start_code,
            &self.mm_end_code,
            &self.task_works,
        ]
    }

    /// The fields this kernel lacks.
    pub fn missing(&self) -> impl Iterator<Item = &Field> {
        self.fields().into_iter().filter(|f| f.reason().is_some())
    }
}
