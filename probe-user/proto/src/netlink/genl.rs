//! Generic netlink families: the message type of a NETLINK_GENERIC message is
//! a family id the kernel hands out at registration (`nlctrl` is always 16),
//! so naming it takes a table. The table fills from CTRL_CMD_NEWFAMILY
//! replies seen on the wire (captures, maybe cut short: read by our own
//! header parser), and from the answer to one CTRL_CMD_GETFAMILY dump of our
//! own (whole messages: built and read with netlink-packet-generic; plegwatch's
//! `kernel::netlink` sends it).

use super::{
    header::{self, CTRL_CMD_DELFAMILY, CTRL_CMD_NEWFAMILY, GENL_ID_CTRL, NLM_F_DUMP, NLM_F_REQUEST},
    names::NETLINK_GENERIC,
};
use netlink_packet_core::{NetlinkMessage, NetlinkPayload};
use netlink_packet_generic::{
    ctrl::{nlas::GenlCtrlAttrs, GenlCtrl, GenlCtrlCmd},
    GenlMessage,
};
use std::collections::HashMap;

/// At most this many families are remembered (the kernel has a few dozen).
const MAX_FAMILIES: usize = 4096;

/// Family id → name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GenlFamilies {
    by_id: HashMap<u16, String>,
}

impl Default for GenlFamilies {
    fn default() -> Self {
        Self::new()
    }
}

impl GenlFamilies {
    /// A table that knows only `nlctrl`.
    pub fn new() -> Self {
        let mut by_id = HashMap::new();
        by_id.insert(GENL_ID_CTRL, "nlctrl".to_string());
        GenlFamilies { by_id }
    }

    pub fn name(&self, id: u16) -> Option<&str> {
        self.by_id.get(&id).map(String::as_str)
    }

    pub fn id(&self, name: &str) -> Option<u16> {
        self.by_id.iter().find(|(_, n)| n.as_str() == name).map(|(id, _)| *id)
    }

    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    /// Adds or renames a family. Ignored when the table is full.
    pub fn insert(&mut self, id: u16, name: &str) {
        if self.by_id.len() < MAX_FAMILIES || self.by_id.contains_key(&id) {
            self.by_id.insert(id, name.to_string());
        }
    }

    /// Learns from one message received on a NETLINK_GENERIC socket:
    /// CTRL_CMD_NEWFAMILY adds, CTRL_CMD_DELFAMILY removes. Returns whether
    /// the table changed.
    pub fn learn(&mut self, msg: &header::NlMsg<'_>) -> bool {
        let Some((id, name)) = &msg.family else { return false };
        match msg.genl_cmd {
            Some(CTRL_CMD_NEWFAMILY) if self.name(*id) != Some(name.as_str()) => {
                self.insert(*id, name);
                true
            }
            Some(CTRL_CMD_DELFAMILY) if *id != GENL_ID_CTRL => self.by_id.remove(id).is_some(),
            _ => false,
        }
    }

    /// Learns from every message of a buffer received on a NETLINK_GENERIC socket.
    pub fn learn_all(&mut self, buf: &[u8]) -> usize {
        header::parse(buf, NETLINK_GENERIC).messages.iter().filter(|m| self.learn(m)).count()
    }

    /// The table from the answer to a CTRL_CMD_GETFAMILY dump of our own
    /// ([`getfamily_dump`]): its messages, each whole (as
    /// [`Dump`](super::dump::Dump) hands them out, header included), read
    /// with netlink-packet-generic. A message that does not read as a family
    /// with an id and a name is passed over. plegwatch's `kernel::netlink`
    /// sends the request.
    pub fn from_dump<'a>(replies: impl IntoIterator<Item = &'a [u8]>) -> Self {
        let mut fams = GenlFamilies::new();
        for raw in replies {
            fams.learn_reply(raw);
        }
        fams
    }

    /// Learns from one whole message of a CTRL_CMD_GETFAMILY dump's answer
    /// (read with netlink-packet-generic, not the capture parser): adds its
    /// family. Returns whether it named one.
    fn learn_reply(&mut self, raw: &[u8]) -> bool {
        let Ok(msg) = NetlinkMessage::<GenlMessage<GenlCtrl>>::deserialize(raw) else { return false };
        let NetlinkPayload::InnerMessage(genl) = msg.payload else { return false };
        let id = genl.payload.nlas.iter().find_map(|a| if let GenlCtrlAttrs::FamilyId(id) = a { Some(*id) } else { None });
        let name = genl.payload.nlas.iter().find_map(|a| if let GenlCtrlAttrs::FamilyName(n) = a { Some(n.as_str()) } else { None });
        match (id, name) {
            (Some(id), Some(name)) => {
                self.insert(id, name);
                true
            }
            _ => false,
        }
    }
}

/// The bytes of a CTRL_CMD_GETFAMILY dump request (netlink-packet-generic).
pub fn getfamily_dump(seq: u32) -> Vec<u8> {
    let mut msg = NetlinkMessage::from(GenlMessage::from_payload(GenlCtrl { cmd: GenlCtrlCmd::GetFamily, nlas: vec![] }));
    msg.header.flags = NLM_F_REQUEST | NLM_F_DUMP;
    msg.header.sequence_number = seq;
    msg.finalize();
    let mut buf = vec![0; msg.buffer_len()];
    msg.serialize(&mut buf);
    buf
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netlink::header::{build, CTRL_CMD_GETFAMILY, NLM_F_MULTI};

    #[test]
    fn learns_from_the_wire() {
        let mut f = GenlFamilies::new();
        assert_eq!(f.name(GENL_ID_CTRL), Some("nlctrl"));
        let mut buf = build::newfamily(0x15, "devlink", 4, NLM_F_MULTI);
        buf.extend(build::newfamily(0x16, "ethtool", 4, NLM_F_MULTI));
        buf.extend(build::done(4, 1));
        assert_eq!(f.learn_all(&buf), 2);
        assert_eq!(f.name(0x16), Some("ethtool"));
        assert_eq!(f.id("devlink"), Some(0x15));
        assert_eq!(f.learn_all(&buf), 0, "nothing new");

        // DELFAMILY removes (nlctrl stays).
        let mut del = build::newfamily(0x15, "devlink", 0, 0);
        del[header::NLMSG_HDRLEN] = CTRL_CMD_DELFAMILY;
        assert_eq!(f.learn_all(&del), 1);
        assert_eq!(f.name(0x15), None);

        // A name without its NUL, or too long, is not learned.
        let long = build::newfamily(0x30, "a_name_far_longer_than_sixteen", 0, 0);
        assert_eq!(f.learn_all(&long), 0);
        // A capture cut inside the attributes learns nothing, and does not panic.
        for cut in 0..buf.len() {
            let mut g = GenlFamilies::new();
            g.learn_all(&buf[..cut]);
            assert!(g.len() <= 3);
        }
    }

    #[test]
    fn request_bytes() {
        let r = getfamily_dump(7);
        let p = header::parse(&r, NETLINK_GENERIC);
        assert_eq!(p.messages.len(), 1);
        assert_eq!(p.messages[0].header.flags, 0x301);
        assert_eq!(p.messages[0].genl_cmd, Some(CTRL_CMD_GETFAMILY));
    }

    #[test]
    fn reads_a_recorded_dump() {
        let replies = [
            build::newfamily(0x15, "devlink", 1, NLM_F_MULTI),
            build::newfamily(0x16, "ethtool", 1, NLM_F_MULTI),
            // Not a family: passed over.
            build::done(1, 1),
        ];
        let f = GenlFamilies::from_dump(replies.iter().map(Vec::as_slice));
        assert_eq!(f.id("nlctrl"), Some(GENL_ID_CTRL));
        assert_eq!(f.name(0x15), Some("devlink"));
        assert_eq!(f.name(0x16), Some("ethtool"));
        assert_eq!(f.len(), 3, "{f:?}");
        // Cut short, a reply reads as nothing, and does not panic.
        for cut in 0..replies[0].len() {
            let f = GenlFamilies::from_dump([&replies[0][..cut]]);
            assert_eq!(f.len(), 1, "cut at {cut}: {f:?}");
        }
    }
}
