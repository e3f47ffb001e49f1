//! Files kept private and never reached through a link.
//!
//! The disk queue and the dead-letter log keep payloads (whatever
//! producers sent) in a directory the operator names. Whoever else can
//! write near it must not aim guard's writes elsewhere, nor read what it
//! keeps:
//!
//! - a directory guard makes is `0700`, and the directory it works in must
//!   not be a symbolic link (refused, naming it);
//! - a file guard makes is `0600`, and every file is opened with
//!   `O_NOFOLLOW`, so a link planted in place of a segment, the cursor,
//!   a lock or `letters.new` makes the open fail instead of truncating,
//!   overwriting or reading its target.
//!
//! Tested in `adapters/std/tests/private_files.rs`.

use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::{self, Read as _};
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
use std::path::Path;

/// Makes `dir` (and its missing parents) `0700`, and checks that it is a
/// directory and not a symbolic link.
pub(crate) fn create_dir(dir: &Path) -> io::Result<()> {
    DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
    let file_type = fs::symlink_metadata(dir)?.file_type();
    if file_type.is_symlink() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "it is a symbolic link: name the directory it points to, guard does not follow links",
        ));
    }
    if !file_type.is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "it is not a directory",
        ));
    }
    Ok(())
}

/// Options that make a file `0600` and never follow a link; set what to
/// do (read, write, create, ...) on them.
pub(crate) fn options() -> OpenOptions {
    let mut options = File::options();
    options
        .mode(0o600)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits().cast_signed());
    options
}

/// The whole of `path`, opened without following a link.
pub(crate) fn read(path: &Path) -> io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    options().read(true).open(path)?.read_to_end(&mut bytes)?;
    Ok(bytes)
}
