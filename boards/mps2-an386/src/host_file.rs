//! A file on the host, read whole through semihosting (`SYS_OPEN`,
//! `SYS_FLEN`, `SYS_READ`): how an image under QEMU gets what a real
//! board keeps in its configuration storage (a CA certificate).

use core::fmt;

use cortex_m_semihosting::{nr, syscall};

/// The longest path taken, without its terminating NUL.
pub const MAX_PATH: usize = 255;

/// Why a host file could not be read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostFileError {
    /// The path is empty, longer than [`MAX_PATH`] or holds a NUL.
    Path,
    /// The host could not open it.
    Open,
    /// It is larger than the buffer, with its length.
    TooLarge(usize),
    /// The host read fewer bytes than the file has.
    Read,
}

impl fmt::Display for HostFileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HostFileError::Path => write!(f, "a path is 1 to {MAX_PATH} bytes, without NUL"),
            HostFileError::Open => f.write_str("the host cannot open it"),
            HostFileError::TooLarge(len) => write!(f, "{len} bytes: larger than the buffer"),
            HostFileError::Read => f.write_str("the host read it short"),
        }
    }
}

/// Reads the host file at `path` into `buf`; the bytes read.
pub fn read<'b>(path: &str, buf: &'b mut [u8]) -> Result<&'b [u8], HostFileError> {
    if path.is_empty() || path.len() > MAX_PATH || path.contains('\0') {
        return Err(HostFileError::Path);
    }
    let mut name = [0u8; MAX_PATH + 1];
    name[..path.len()].copy_from_slice(path.as_bytes());
    // Mode 1 is "rb"; the length excludes the NUL that ends the name.
    let open = [name.as_ptr() as usize, 1, path.len()];
    // SAFETY: SYS_OPEN reads the NUL-terminated name its block points to,
    // live for the call.
    let handle = unsafe { syscall(nr::OPEN, &open) };
    if handle == usize::MAX {
        return Err(HostFileError::Open);
    }
    let read = (|| {
        // SAFETY: SYS_FLEN takes the handle SYS_OPEN gave.
        let len = unsafe { syscall(nr::FLEN, &[handle]) };
        if len == usize::MAX {
            return Err(HostFileError::Read);
        }
        if len > buf.len() {
            return Err(HostFileError::TooLarge(len));
        }
        let block = [handle, buf.as_mut_ptr() as usize, len];
        // SAFETY: SYS_READ writes at most `len` bytes to `buf`, which is
        // exclusively borrowed and at least that long; it returns how
        // many it did not read.
        let unread = unsafe { syscall(nr::READ, &block) };
        if unread != 0 {
            return Err(HostFileError::Read);
        }
        Ok(len)
    })();
    // SAFETY: SYS_CLOSE takes the handle SYS_OPEN gave, closed once.
    unsafe { syscall(nr::CLOSE, &[handle]) };
    read.map(|len| &buf[..len])
}
