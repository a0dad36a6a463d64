//! `profile.pb.gz`: the bundle's samples as a gzipped pprof profile, which
//! `go tool pprof`, Pyroscope and Parca read.
//!
//! The messages are pprof's `profile.proto` (github.com/google/pprof,
//! `proto/profile.proto`), written here by hand with `#[derive(prost::Message)]`
//! rather than generated: only the eight small messages below are needed, the
//! format is stable, and generating them would put `protoc` and prost-build
//! into every build of plegwatch (the crates that carry generated types, such
//! as `pprof`'s `protobuf-codec`, bring a sampling profiler along). The field
//! numbers and types are the proto file's; fields plegwatch never sets
//! (`drop_frames`, `keep_frames`, line numbers, mappings) are left out, and
//! readers treat them as unset.
//!
//! Each frame is one function with one location (no addresses: frames are
//! names already). Sample value: blocked nanoseconds (`blocked`/`nanoseconds`);
//! labels: the sample's `kind`, `incident`, `wait` and `link`, and `pod`,
//! `namespace` and `container` when the hop's process is in a known pod.

use super::bundle::Sample;
use flate2::{write::GzEncoder, Compression};
use prost::Message;
use std::collections::HashMap;
use std::io::Write;

#[derive(Clone, PartialEq, prost::Message)]
pub struct Profile {
    #[prost(message, repeated, tag = "1")]
    pub sample_type: Vec<ValueType>,
    #[prost(message, repeated, tag = "2")]
    pub sample: Vec<PSample>,
    #[prost(message, repeated, tag = "4")]
    pub location: Vec<Location>,
    #[prost(message, repeated, tag = "5")]
    pub function: Vec<Function>,
    #[prost(string, repeated, tag = "6")]
    pub string_table: Vec<String>,
    #[prost(int64, tag = "9")]
    pub time_nanos: i64,
    #[prost(int64, tag = "10")]
    pub duration_nanos: i64,
    #[prost(message, optional, tag = "11")]
    pub period_type: Option<ValueType>,
    #[prost(int64, tag = "12")]
    pub period: i64,
    #[prost(int64, repeated, tag = "13")]
    pub comment: Vec<i64>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ValueType {
    #[prost(int64, tag = "1")]
    pub r#type: i64,
    #[prost(int64, tag = "2")]
    pub unit: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PSample {
    /// Leaf first.
    #[prost(uint64, repeated, tag = "1")]
    pub location_id: Vec<u64>,
    #[prost(int64, repeated, tag = "2")]
    pub value: Vec<i64>,
    #[prost(message, repeated, tag = "3")]
    pub label: Vec<Label>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Label {
    #[prost(int64, tag = "1")]
    pub key: i64,
    #[prost(int64, tag = "2")]
    pub str: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Location {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(message, repeated, tag = "4")]
    pub line: Vec<Line>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Line {
    #[prost(uint64, tag = "1")]
    pub function_id: u64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Function {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(int64, tag = "2")]
    pub name: i64,
    #[prost(int64, tag = "3")]
    pub system_name: i64,
}

/// Strings by index, `""` first as pprof requires.
struct Strings {
    table: Vec<String>,
    index: HashMap<String, i64>,
}

impl Strings {
    fn new() -> Self {
        Strings { table: vec![String::new()], index: HashMap::from([(String::new(), 0)]) }
    }
    fn id(&mut self, s: &str) -> i64 {
        if let Some(i) = self.index.get(s) {
            return *i;
        }
        let i = self.table.len() as i64;
        self.table.push(s.to_string());
        self.index.insert(s.to_string(), i);
        i
    }
}

/// The profile of these samples; `time_nanos` is when it was taken (Unix ns),
/// `duration_nanos` the time it covers.
pub fn profile(samples: &[Sample], time_nanos: i64, duration_nanos: i64, comment: &str) -> Profile {
    let mut strings = Strings::new();
    let blocked = ValueType { r#type: strings.id("blocked"), unit: strings.id("nanoseconds") };
    let mut frames: HashMap<String, u64> = HashMap::new();
    let mut function = Vec::new();
    let mut location = Vec::new();
    let mut out = Vec::with_capacity(samples.len());
    for s in samples {
        let mut ids = Vec::with_capacity(s.stack.len());
        for f in s.stack.iter().rev() {
            let id = match frames.get(f) {
                Some(id) => *id,
                None => {
                    let id = frames.len() as u64 + 1;
                    let name = strings.id(f);
                    function.push(Function { id, name, system_name: name });
                    location.push(Location { id, line: vec![Line { function_id: id }] });
                    frames.insert(f.clone(), id);
                    id
                }
            };
            ids.push(id);
        }
        let label = s.labels.iter().map(|(k, v)| Label { key: strings.id(k), str: strings.id(v) }).collect();
        out.push(PSample { location_id: ids, value: vec![i64::try_from(s.blocked_ns).unwrap_or(i64::MAX)], label });
    }
    let comment = vec![strings.id(comment)];
    Profile {
        sample_type: vec![blocked.clone()],
        sample: out,
        location,
        function,
        string_table: strings.table,
        time_nanos,
        duration_nanos,
        period_type: Some(blocked),
        period: 1,
        comment,
    }
}

/// The profile, encoded and gzipped as `profile.pb.gz`.
pub fn encode_gz(p: &Profile) -> std::io::Result<Vec<u8>> {
    let mut gz = GzEncoder::new(Vec::new(), Compression::default());
    gz.write_all(&p.encode_to_vec())?;
    gz.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn frames_are_shared_and_leaf_first() {
        let s = |stack: &[&str], v| Sample {
            stack: stack.iter().map(|f| f.to_string()).collect(),
            blocked_ns: v,
            labels: BTreeMap::from([("kind".into(), "umount".into())]),
        };
        let p = profile(&[s(&["a", "b"], 5), s(&["a"], 7)], 1, 2, "c");
        assert_eq!(p.function.len(), 2);
        assert_eq!(p.string_table[0], "");
        let name = |id: u64| &p.string_table[p.function[(id - 1) as usize].name as usize];
        assert_eq!(p.sample[0].location_id.iter().map(|i| name(*i).as_str()).collect::<Vec<_>>(), ["b", "a"]);
        assert_eq!(p.sample.iter().map(|s| s.value[0]).sum::<i64>(), 12);
        let back = Profile::decode(p.encode_to_vec().as_slice()).unwrap();
        assert_eq!(back, p);
        assert!(encode_gz(&p).unwrap().starts_with(&[0x1f, 0x8b]));
    }
}
