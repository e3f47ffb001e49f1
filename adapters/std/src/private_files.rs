//! Files kept private and never reached through a link.
//!
//! The disk queue and the dead-letter log keep payloads (whatever
//! producers sent) in a directory the operator names. Whoever else can
//! write near it must not aim guard's writes elsewhere, nor read what it
//! keeps:
//!
//! - the directory guard works in must not be a symbolic link and must
//!   belong to this process's user; one guard makes is `0700`, and one
//!   that group or others may write or read is set to `0700`;
//! - every file is opened with `O_NOFOLLOW` (a link planted in place of a
//!   segment, the cursor, a lock or `letters.new` fails the open instead
//!   of truncating, overwriting or reading its target) and `O_NONBLOCK`
//!   (a FIFO planted there cannot hang the open), then checked: a regular
//!   file, this user's, with no other name (a hard link); one guard makes
//!   is `0600`, and an existing one is set to `0600`.
//!
//! Tested in `adapters/std/tests/private_files.rs`.

use std::fs::{self, DirBuilder, File, OpenOptions, Permissions};
use std::io::{self, Read as _};
use std::os::unix::fs::{
    DirBuilderExt as _, MetadataExt as _, OpenOptionsExt as _, PermissionsExt as _,
};
use std::path::Path;

/// The mode of what guard keeps: the directory's and the files'.
const DIR_MODE: u32 = 0o700;
const FILE_MODE: u32 = 0o600;

/// Makes `dir` (and its missing parents) `0700`, and checks it: not a
/// symbolic link, a directory, this user's; its mode is set to `0700`
/// when group or others have any access.
pub(crate) fn create_dir(dir: &Path) -> io::Result<()> {
    DirBuilder::new()
        .recursive(true)
        .mode(DIR_MODE)
        .create(dir)?;
    check_dir(dir)
}

/// Checks an existing `dir` as [`create_dir`] does.
pub(crate) fn check_dir(dir: &Path) -> io::Result<()> {
    let metadata = fs::symlink_metadata(dir)?;
    if metadata.file_type().is_symlink() {
        return Err(refused(
            "it is a symbolic link: name the directory it points to, guard does not follow links",
        ));
    }
    if !metadata.is_dir() {
        return Err(refused("it is not a directory"));
    }
    owned(&metadata)?;
    if metadata.mode() & 0o077 != 0 {
        fs::set_permissions(dir, Permissions::from_mode(DIR_MODE))?;
    }
    Ok(())
}

/// Options that make a file `0600`, never follow a link and never wait
/// on a FIFO; set what to do (read, write, create, ...) on them and open
/// with [`open`].
pub(crate) fn options() -> OpenOptions {
    let flags = rustix::fs::OFlags::NOFOLLOW | rustix::fs::OFlags::NONBLOCK;
    let mut options = File::options();
    options
        .mode(FILE_MODE)
        .custom_flags(flags.bits().cast_signed());
    options
}

/// `path` opened with `options` (from [`options`]), then checked: a
/// regular file of this user's with one name; set to `0600` if it was
/// readable or writable by others.
pub(crate) fn open(options: &OpenOptions, path: &Path) -> io::Result<File> {
    let file = options.open(path)?;
    let metadata = file.metadata()?;
    if !metadata.is_file() {
        return Err(refused("it is not a regular file"));
    }
    if metadata.nlink() != 1 {
        return Err(refused("it has another name (a hard link)"));
    }
    owned(&metadata)?;
    if metadata.mode() & 0o777 != FILE_MODE {
        file.set_permissions(Permissions::from_mode(FILE_MODE))?;
    }
    Ok(file)
}

/// The whole of `path`, opened as [`open`] does.
pub(crate) fn read(path: &Path) -> io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    open(options().read(true), path)?.read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// Refuses what another user owns.
fn owned(metadata: &fs::Metadata) -> io::Result<()> {
    let user = rustix::process::geteuid().as_raw();
    if metadata.uid() != user {
        return Err(refused(&format!(
            "it belongs to user {}, not to this process's user {user}",
            metadata.uid()
        )));
    }
    Ok(())
}

fn refused(why: &str) -> io::Error {
    io::Error::new(io::ErrorKind::PermissionDenied, why.to_owned())
}
