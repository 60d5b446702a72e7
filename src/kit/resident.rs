//! What the sidecar keeps resident once it has started.
//!
//! Starting runs code that serving never runs again: flag parsing, the
//! configuration's compiler, TLS and gRPC set-up, reflection's descriptors.
//! The kernel maps the executable's pages as they are first run, 64 KiB
//! around each fault, so an idle sidecar had 8 MiB of its code resident
//! of which serving touches a few hundred KiB. Those pages are clean copies
//! of the file: unmapping them loses nothing, and a page that is run again
//! is mapped again from the page cache (a minor fault, no disk read while
//! the file is cached). So, a moment after start, the read-only file
//! mappings that hold no private copy are unmapped once
//! (docs/performance.md#the-sidecars-resident-memory).

use std::time::Duration;

/// How long after start the pages are given back: long enough for the
/// listeners' first polls, so that what they run is not faulted in twice.
pub const AFTER_START: Duration = Duration::from_secs(1);

/// What [`release_startup_pages`] did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Released {
    /// Mappings unmapped.
    pub mappings: usize,
    /// Their resident bytes before.
    pub bytes: u64,
}

/// Unmaps this process's resident pages of read-only file mappings that
/// hold no private (copy-on-write) page: the executable's code and
/// constants, and its shared libraries'. Nothing is lost: every such page
/// equals the file's, and is mapped again when next touched.
///
/// Returns what was released; nothing on platforms other than Linux, or
/// when `/proc/self/smaps` cannot be read.
pub fn release_startup_pages() -> Released {
    #[cfg(target_os = "linux")]
    {
        let Ok(smaps) = std::fs::read_to_string("/proc/self/smaps") else {
            return Released::default();
        };
        let mut released = Released::default();
        for mapping in clean_file_mappings(&smaps) {
            let Ok(length) = usize::try_from(mapping.end - mapping.start) else {
                continue;
            };
            // SAFETY: the range is one whole mapping of this process, read
            // from the kernel's own list. It is not writable and holds no
            // private page (`Anonymous: 0 kB`), so every page in it equals
            // the file's and MADV_DONTNEED only drops the page table
            // entries: the next access maps the same bytes again. Nothing
            // in this process holds references into it that a drop could
            // invalidate, since the contents do not change.
            let result = unsafe {
                libc::madvise(
                    mapping.start as *mut libc::c_void,
                    length,
                    libc::MADV_DONTNEED,
                )
            };
            if result == 0 {
                released.mappings += 1;
                released.bytes += mapping.resident_bytes;
            }
        }
        released
    }
    #[cfg(not(target_os = "linux"))]
    {
        Released::default()
    }
}

/// One mapping from `/proc/self/smaps` that may be released.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct CleanMapping {
    start: u64,
    end: u64,
    resident_bytes: u64,
}

/// The mappings of an smaps listing that are backed by a file, not
/// writable, hold no private page and none locked, and have pages resident.
fn clean_file_mappings(smaps: &str) -> Vec<CleanMapping> {
    let mut found = Vec::new();
    let mut current: Option<Candidate> = None;
    for line in smaps.lines() {
        if let Some(header) = parse_header(line) {
            if let Some(candidate) = current.take() {
                found.extend(candidate.finish());
            }
            current = Some(header);
            continue;
        }
        let Some(candidate) = current.as_mut() else {
            continue;
        };
        let Some((field, rest)) = line.split_once(':') else {
            continue;
        };
        let kilobytes = rest.trim().trim_end_matches("kB").trim().parse::<u64>();
        match (field, kilobytes) {
            ("Rss", Ok(kb)) => candidate.resident_kb = Some(kb),
            ("Anonymous", Ok(kb)) => candidate.anonymous_kb = Some(kb),
            ("Locked", Ok(kb)) => candidate.locked_kb = Some(kb),
            _ => {}
        }
    }
    if let Some(candidate) = current {
        found.extend(candidate.finish());
    }
    found
}

#[derive(Debug)]
struct Candidate {
    start: u64,
    end: u64,
    eligible: bool,
    resident_kb: Option<u64>,
    anonymous_kb: Option<u64>,
    locked_kb: Option<u64>,
}

impl Candidate {
    fn finish(self) -> Option<CleanMapping> {
        // A field missing from the listing counts against release.
        let resident_kb = self.resident_kb?;
        let clean = self.eligible
            && self.anonymous_kb == Some(0)
            && self.locked_kb.unwrap_or(0) == 0
            && resident_kb > 0;
        clean.then_some(CleanMapping {
            start: self.start,
            end: self.end,
            resident_bytes: resident_kb * 1024,
        })
    }
}

/// `start-end perms offset dev inode path`: a mapping's first line.
fn parse_header(line: &str) -> Option<Candidate> {
    let mut fields = line.split_whitespace();
    let (start, end) = fields.next()?.split_once('-')?;
    let start = u64::from_str_radix(start, 16).ok()?;
    let end = u64::from_str_radix(end, 16).ok()?;
    let perms = fields.next()?;
    let _offset = fields.next()?;
    let _device = fields.next()?;
    let inode = fields.next()?;
    let path = fields.collect::<Vec<_>>().join(" ");
    let perms = perms.as_bytes();
    let eligible = perms.len() == 4
        && perms[0] == b'r'
        && perms[1] == b'-'
        && perms[3] == b'p'
        && inode != "0"
        && path.starts_with('/')
        && !path.ends_with("(deleted)");
    (end > start).then_some(Candidate {
        start,
        end,
        eligible,
        resident_kb: None,
        anonymous_kb: None,
        locked_kb: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMAPS: &str = "\
55d0a0000000-55d0a0100000 r--p 00000000 fe:00 5431883                    /usr/bin/charon
Size:               1024 kB
Rss:                 576 kB
Anonymous:             0 kB
Locked:                0 kB
VmFlags: rd mr mw me
55d0a0100000-55d0a0900000 r-xp 00100000 fe:00 5431883                    /usr/bin/charon
Rss:                8668 kB
Anonymous:             0 kB
Locked:                0 kB
55d0a0900000-55d0a0940000 r--p 00900000 fe:00 5431883                    /usr/bin/charon
Rss:                 252 kB
Anonymous:           252 kB
Locked:                0 kB
55d0a0940000-55d0a0950000 rw-p 00940000 fe:00 5431883                    /usr/bin/charon
Rss:                  64 kB
Anonymous:            64 kB
20000000000-20040000000 rw-p 00000000 00:00 0
Rss:                1740 kB
Anonymous:          1740 kB
7f38b5b1d000-7f38b5c73000 r-xp 00026000 fe:00 326279                     /usr/lib/x86_64-linux-gnu/libc.so.6
Rss:                 576 kB
Anonymous:             0 kB
Locked:                4 kB
7f38b5c73000-7f38b5c80000 r-xp 00000000 fe:00 326280                     /opt/old/lib.so (deleted)
Rss:                  52 kB
Anonymous:             0 kB
7f38b5c80000-7f38b5c90000 r-xp 00000000 fe:00 326281                     /opt/lib/idle.so
Rss:                   0 kB
Anonymous:             0 kB
7ffc3b353000-7ffc3b374000 r-xp 00000000 00:00 0                          [vdso]
Rss:                   4 kB
Anonymous:             0 kB
7ffc3b380000-7ffc3b390000 r-xp 00000000 fe:00 326282                     /opt/lib/no-anonymous-line.so
Rss:                  64 kB
";

    #[test]
    fn only_read_only_file_mappings_without_private_pages_are_released() {
        let found = clean_file_mappings(SMAPS);
        assert_eq!(
            found,
            vec![
                CleanMapping {
                    start: 0x55d0a0000000,
                    end: 0x55d0a0100000,
                    resident_bytes: 576 * 1024,
                },
                CleanMapping {
                    start: 0x55d0a0100000,
                    end: 0x55d0a0900000,
                    resident_bytes: 8668 * 1024,
                },
            ],
            "relocated constants (private pages), writable data, anonymous memory, \
             locked pages, deleted files, nothing resident, the vdso and a \
             mapping whose listing lacks `Anonymous` are kept"
        );
    }

    #[test]
    fn a_listing_that_is_not_smaps_releases_nothing() {
        for garbage in [
            "",
            "\n\n",
            "Rss: 12 kB",
            "zz-yy r-xp 0 0 1 /bin/x\nRss: 4 kB\nAnonymous: 0 kB",
        ] {
            assert_eq!(clean_file_mappings(garbage), Vec::new(), "{garbage:?}");
        }
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn released_code_runs_again() {
        let released = release_startup_pages();
        assert!(released.mappings > 0, "{released:?}");
        // The test binary's code was unmapped: running it maps it again.
        let found =
            clean_file_mappings(&std::fs::read_to_string("/proc/self/smaps").unwrap_or_default());
        assert!(!found.is_empty());
        assert_eq!(format!("{}", 40 + 2), "42");
    }
}
