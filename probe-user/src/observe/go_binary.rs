//! A Go binary read from disk (a target's executable, or a path given on the
//! command line), for `proto::gosym` to parse. The read is here, with the
//! other reads of files and processes; the parsing is in the parsers' crate,
//! which does no I/O.

use crate::proto::gosym::{GoBinary, GoSymError};
use std::path::Path;

/// Reads and parses `path`. A file that cannot be read is
/// [`GoSymError::Io`], naming the path.
pub fn read(path: impl AsRef<Path>) -> Result<GoBinary, GoSymError> {
    let path = path.as_ref().display().to_string();
    let data = std::fs::read(&path).map_err(|source| GoSymError::Io { binary: path.clone(), source })?;
    GoBinary::parse_named(data, &path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_that_cannot_be_read_is_named() {
        let e = read("/nonexistent/plegwatch-gosym").unwrap_err();
        assert!(matches!(e, GoSymError::Io { .. }), "{e}");
        assert!(e.to_string().contains("/nonexistent/plegwatch-gosym"), "{e}");
    }
}
