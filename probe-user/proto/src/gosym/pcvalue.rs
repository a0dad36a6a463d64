//! Go's pc-value tables (`pcsp`, `pcfile`, `pcln`, `pcdata`): how the runtime
//! maps a PC inside a function to a value, such as the SP delta (`pcsp`).
//!
//! Hand-written, because no crate reads them (`gimli` and `object` know DWARF
//! and ELF, not `.gopclntab`); the format is small. As Go's
//! `runtime/symtab.go` (`pcvalue`, `step`) and `debug/gosym` decode it:
//! a table is a run of pairs, each two unsigned LEB128 varints,
//!
//! * a value delta, zig-zag coded (`(d >> 1) ^ -(d & 1)`), added to a value
//!   that starts at -1;
//! * a PC delta, times the PC quantum (`minLC`), added to a PC that starts at
//!   the function's entry.
//!
//! The value holds for the PCs from the previous PC up to (not including) the
//! new one. A value delta of 0 anywhere but the first pair ends the table.
//!
//! For `pcsp` the value is the number of bytes between SP and the return
//! address at that PC: 0 at a function's entry, where `[SP]` is the return
//! address; 8 after `push rbp`; `N + 8` after `push rbp; sub rsp, N`. The
//! caller's SP is `SP + pcsp + 8` on amd64 (`runtime/traceback.go`: `fp = sp +
//! spdelta`, plus the pointer size where the call pushed the return address).

/// One run of a pc-value table: `value` holds for PCs in `[start, end)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PcRun {
    /// First PC of the run.
    pub start: u64,
    /// First PC after the run.
    pub end: u64,
    /// The table's value in the run.
    pub value: i64,
}

/// Why a pc-value table could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PcValueError {
    /// The bytes end in the middle of a varint, with no end marker.
    #[error("pc-value table truncated at byte {0}")]
    Truncated(usize),
    /// A varint longer than ten bytes, or a PC or value that overflows.
    #[error("pc-value table: bad varint or overflow at byte {0}")]
    Overflow(usize),
}

/// Reads one unsigned LEB128 varint at `*pos`, advancing it.
fn uvarint(b: &[u8], pos: &mut usize) -> Result<u64, PcValueError> {
    let start = *pos;
    let mut v = 0u64;
    for shift in (0..70).step_by(7) {
        let byte = *b.get(*pos).ok_or(PcValueError::Truncated(start))?;
        *pos += 1;
        if shift == 63 && byte > 1 {
            return Err(PcValueError::Overflow(start));
        }
        v |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err(PcValueError::Overflow(start))
}

/// Iterates over the runs of a pc-value table that starts at `entry`.
/// Stops after the end marker, or after the first error (yielded once).
pub struct PcRuns<'a> {
    bytes: &'a [u8],
    pos: usize,
    pc: u64,
    value: i64,
    quantum: u64,
    first: bool,
    done: bool,
}

/// The runs of the table `bytes` (which may run past the table's end: the
/// end marker stops it) for a function at `entry`, with PC quantum `min_lc`.
pub fn runs(bytes: &[u8], entry: u64, min_lc: u8) -> PcRuns<'_> {
    PcRuns { bytes, pos: 0, pc: entry, value: -1, quantum: u64::from(min_lc.max(1)), first: true, done: false }
}

impl PcRuns<'_> {
    fn step(&mut self) -> Result<Option<PcRun>, PcValueError> {
        let at = self.pos;
        let uvdelta = uvarint(self.bytes, &mut self.pos)?;
        if uvdelta == 0 && !self.first {
            return Ok(None);
        }
        self.first = false;
        let vdelta = ((uvdelta >> 1) as i64) ^ -((uvdelta & 1) as i64);
        self.value = self.value.checked_add(vdelta).ok_or(PcValueError::Overflow(at))?;
        let pcdelta = uvarint(self.bytes, &mut self.pos)?;
        let start = self.pc;
        self.pc = pcdelta.checked_mul(self.quantum).and_then(|d| start.checked_add(d)).ok_or(PcValueError::Overflow(at))?;
        Ok(Some(PcRun { start, end: self.pc, value: self.value }))
    }
}

impl Iterator for PcRuns<'_> {
    type Item = Result<PcRun, PcValueError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        match self.step() {
            Ok(Some(r)) => Some(Ok(r)),
            Ok(None) => {
                self.done = true;
                None
            }
            Err(e) => {
                self.done = true;
                Some(Err(e))
            }
        }
    }
}

/// The value of the table at `pc` (`None` if `pc` is outside the table, or
/// the table is malformed before reaching it).
pub fn value_at(bytes: &[u8], entry: u64, min_lc: u8, pc: u64) -> Option<i64> {
    if pc < entry {
        return None;
    }
    for run in runs(bytes, entry, min_lc) {
        let run = run.ok()?;
        if pc < run.end {
            return Some(run.value);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Encodes runs the way Go's linker does, for the tests.
    fn encode(runs: &[(i64, u64)]) -> Vec<u8> {
        fn put(out: &mut Vec<u8>, mut v: u64) {
            while v >= 0x80 {
                out.push((v as u8) | 0x80);
                v >>= 7;
            }
            out.push(v as u8);
        }
        let mut out = Vec::new();
        let mut prev = -1i64;
        for &(value, len) in runs {
            let d = value - prev;
            put(&mut out, ((d << 1) ^ (d >> 63)) as u64);
            put(&mut out, len);
            prev = value;
        }
        out.push(0);
        out
    }

    #[test]
    fn decodes_a_prologue_and_epilogue() {
        // entry: 0 for 4 bytes (stack check), 8 after push rbp (4 bytes),
        // 0x28 in the body (200 bytes), 0 after the epilogue's pop/ret.
        let t = encode(&[(0, 4), (8, 4), (0x28, 200), (0, 2)]);
        let e = 0x40_1000;
        assert_eq!(value_at(&t, e, 1, e), Some(0));
        assert_eq!(value_at(&t, e, 1, e + 3), Some(0));
        assert_eq!(value_at(&t, e, 1, e + 4), Some(8));
        assert_eq!(value_at(&t, e, 1, e + 8), Some(0x28));
        assert_eq!(value_at(&t, e, 1, e + 207), Some(0x28));
        assert_eq!(value_at(&t, e, 1, e + 208), Some(0));
        assert_eq!(value_at(&t, e, 1, e + 210), None);
        assert_eq!(value_at(&t, e, 1, e - 1), None);
        let all: Vec<_> = runs(&t, e, 1).collect::<Result<_, _>>().unwrap();
        assert_eq!(all.len(), 4);
        assert_eq!(all[3], PcRun { start: e + 208, end: e + 210, value: 0 });
    }

    #[test]
    fn quantum_multiplies_pc_deltas() {
        let t = encode(&[(0, 1), (16, 3)]);
        assert_eq!(value_at(&t, 0x1000, 4, 0x1004), Some(16));
        assert_eq!(value_at(&t, 0x1000, 4, 0x1010), None);
    }

    #[test]
    fn first_pair_may_have_a_zero_delta_and_big_varints_work() {
        // Value -1 (delta 0) first, then 300 bytes of 1000.
        let t = encode(&[(-1, 2), (1000, 300)]);
        assert_eq!(value_at(&t, 0, 1, 1), Some(-1));
        assert_eq!(value_at(&t, 0, 1, 301), Some(1000));
    }

    #[test]
    fn malformed_tables_are_errors_not_panics() {
        assert_eq!(runs(&[0x02], 0, 1).next(), Some(Err(PcValueError::Truncated(1))));
        assert_eq!(runs(&[0x80], 0, 1).next(), Some(Err(PcValueError::Truncated(0))));
        let long = [0xffu8; 11];
        assert_eq!(runs(&long, 0, 1).next(), Some(Err(PcValueError::Overflow(0))));
        assert_eq!(runs(&[], 0, 1).next(), Some(Err(PcValueError::Truncated(0))));
        // PC overflow.
        let t = encode(&[(0, u64::MAX / 2)]);
        assert!(matches!(runs(&t, u64::MAX / 2 + 5, 1).next(), Some(Err(PcValueError::Overflow(_)))));
    }
}
