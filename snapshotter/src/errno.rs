//! The one place where failures become FUSE errno values. Content that cannot be fetched or
//! verified is EIO: an application sees a read error, never wrong bytes.

use fuser::Errno;

use crate::cache::CacheError;
use crate::fetch::FetchError;

pub fn from_fetch(e: &FetchError) -> Errno {
    match e {
        FetchError::Registry { .. }
        | FetchError::Timeout { .. }
        | FetchError::Mismatch { .. }
        | FetchError::Size { .. }
        | FetchError::Task(_) => Errno::EIO,
        FetchError::Cache(c) => from_cache(c),
    }
}

pub fn from_cache(e: &CacheError) -> Errno {
    match e {
        CacheError::Io { source, .. } if source.kind() == std::io::ErrorKind::StorageFull => {
            Errno::ENOSPC
        }
        CacheError::Io { .. } | CacheError::Corrupt { .. } | CacheError::Missing(_) => Errno::EIO,
    }
}
