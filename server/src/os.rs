//! What the host lets this process hold, and what many tenants take of it.
//!
//! A loaded module keeps its artifact open (one file descriptor: its heap image is mapped from
//! that file) and mapped (three memory mappings: header, code, data). A pool memory slot, once
//! a guest has used it, keeps its module's heap image mapped (up to three mappings more), and
//! each fiber stack is two from the start (the stack and its guard page). Linux limits both:
//! open files by `RLIMIT_NOFILE` (`ulimit -n`, systemd's `LimitNOFILE=`; often a soft limit of
//! 1024) and mappings by `vm.max_map_count` (65530 by default). Past either, loading a module or mapping
//! an image fails with `EMFILE` or `ENOMEM`: this module raises what the process may raise
//! itself, checks the rest at start-up, and names the limit when one is hit.
//!
//! `unsafe`: `libc` calls on a local struct (`getrlimit`, `setrlimit`) and on a socket's
//! options (`setsockopt`, `getsockopt`).
#![allow(unsafe_code)]

use std::io;

/// Mappings a used pool memory slot keeps (zero pages before the image, the image, the rest).
const MAPPINGS_PER_MEMORY_SLOT: u64 = 3;

/// The soft and hard limits of open files (`RLIMIT_NOFILE`).
pub fn open_files_limit() -> Option<(u64, u64)> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `getrlimit` writes the two fields of a struct we own.
    (unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &raw mut r) } == 0)
        .then_some((r.rlim_cur, r.rlim_max))
}

/// Raises the soft limit of open files to the hard limit, as a server holding a file per
/// module and a socket per connection needs (a process may always do this itself). Returns
/// the soft limit before and after if it was raised.
pub fn raise_open_files() -> Option<(u64, u64)> {
    let (soft, hard) = open_files_limit()?;
    if soft >= hard {
        return None;
    }
    let r = libc::rlimit {
        rlim_cur: hard,
        rlim_max: hard,
    };
    // SAFETY: `setrlimit` reads a struct we own.
    (unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raw const r) } == 0).then_some((soft, hard))
}

/// `vm.max_map_count`: the most memory mappings a process may have.
pub fn max_map_count() -> Option<u64> {
    read_number("/proc/sys/vm/max_map_count")
}

/// The memory mappings this process has now (lines of `/proc/self/maps`; a few milliseconds
/// with tens of thousands: for start-up, not requests).
pub fn mappings() -> Option<u64> {
    let maps = std::fs::read("/proc/self/maps").ok()?;
    Some(maps.iter().filter(|&&b| b == b'\n').count() as u64)
}

/// The file descriptors this process has open now.
pub fn open_files() -> Option<u64> {
    Some(std::fs::read_dir("/proc/self/fd").ok()?.count() as u64)
}

fn read_number(path: &str) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// A host limit an operation ran into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exhausted {
    /// No file descriptor left (`EMFILE`, or `ENFILE` for the whole system).
    OpenFiles,
    /// No memory mapping left (`ENOMEM` from `mmap`: `vm.max_map_count`, or memory itself).
    Mappings,
}

impl Exhausted {
    /// The limit an OS error means, if it is one of these.
    pub fn of_os_error(e: &io::Error) -> Option<Self> {
        match e.raw_os_error()? {
            libc::EMFILE | libc::ENFILE => Some(Self::OpenFiles),
            libc::ENOMEM => Some(Self::Mappings),
            _ => None,
        }
    }

    /// The limit an error or one of its causes ran into. wasmtime's own errors carry the OS
    /// error as a cause whose text is the OS's text for it, so causes are compared by text.
    pub fn in_chain<'a>(
        mut causes: impl Iterator<Item = &'a (dyn std::error::Error + 'static)>,
    ) -> Option<Self> {
        causes.find_map(|c| match c.downcast_ref::<io::Error>() {
            Some(io) => Self::of_os_error(io),
            None => {
                let text = c.to_string();
                [libc::EMFILE, libc::ENFILE, libc::ENOMEM]
                    .map(io::Error::from_raw_os_error)
                    .into_iter()
                    .find(|os| os.to_string() == text)
                    .and_then(|os| Self::of_os_error(&os))
            }
        })
    }

    /// What to tell the operator: the limit, its value here, and how to raise it.
    pub fn advice(self) -> String {
        match self {
            Self::OpenFiles => {
                let limit = open_files_limit().map_or("?".into(), |(soft, _)| soft.to_string());
                format!(
                    "the server has no file descriptor left (limit {limit}, `ulimit -n`): each \
                     loaded module keeps its artifact open and each connection is one; raise \
                     the hard limit (systemd LimitNOFILE=, docker --ulimit nofile=)"
                )
            }
            Self::Mappings => {
                let limit = max_map_count().map_or("?".into(), |n| n.to_string());
                format!(
                    "the server cannot map more memory (vm.max_map_count = {limit}, or memory \
                     is short): each loaded module takes 3 mappings and each used pool memory \
                     slot up to 3 more; raise vm.max_map_count (docs/configuration.md, \"Many \
                     tenants\")"
                )
            }
        }
    }
}

/// Checks at start-up, with the tenants loaded, that the pool's memory slots and the
/// connections the server accepts fit what the host allows; each shortfall is a line for the
/// log (nothing fails yet: a host may serve fewer tenants than it holds slots for). Reads
/// `/proc` (milliseconds with many tenants): call it off the reactor.
pub fn check_headroom(memory_slots: u32, max_connections: usize) -> Vec<String> {
    let mut warnings = Vec::new();
    // The stacks are split from their guards when the pool is made: already counted.
    if let (Some(now), Some(limit)) = (mappings(), max_map_count()) {
        let need = now + MAPPINGS_PER_MEMORY_SLOT * u64::from(memory_slots);
        if need > limit {
            warnings.push(format!(
                "vm.max_map_count is {limit}; the server has {now} memory mappings with its \
                 modules loaded and its {memory_slots} memory slots take up to {} more once \
                 used: guests will fail to start (500) before every slot is used; raise \
                 vm.max_map_count to at least {} or lower pool.memory_slots \
                 (docs/configuration.md, \"Many tenants\")",
                need - now,
                need.next_multiple_of(65536),
            ));
        }
    }
    if let (Some(now), Some((soft, _))) = (open_files(), open_files_limit()) {
        let need = now + max_connections as u64;
        if need > soft {
            warnings.push(format!(
                "the server may open {soft} files (`ulimit -n`) and has {now} open with its \
                 modules loaded, so it can hold {} connections, not the {max_connections} of \
                 server.max_connections, and deploys fail with 507 once the files run out; \
                 raise the hard limit of open files (systemd LimitNOFILE=, docker --ulimit)",
                soft.saturating_sub(now),
            ));
        }
    }
    warnings
}

/// `SO_ATTACH_REUSEPORT_CBPF` (`asm-generic/socket.h`; `libc` names it for Android only).
const SO_ATTACH_REUSEPORT_CBPF: libc::c_int = 51;

/// Attaches the classic BPF `program` to the `SO_REUSEPORT` group of `socket`: it picks, for
/// each packet, the index of the group's socket that receives it.
///
/// # Errors
/// The kernel's, e.g. if the socket is in no group or the program is invalid.
pub fn attach_reuseport_program(
    socket: &std::net::UdpSocket,
    program: &[libc::sock_filter],
) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let fprog = libc::sock_fprog {
        len: u16::try_from(program.len()).map_err(|_| std::io::ErrorKind::InvalidInput)?,
        filter: program.as_ptr().cast_mut(),
    };
    // SAFETY: `socket` is open; the option's value is a `sock_fprog` pointing at `program`,
    // which outlives the call (the kernel copies it and never writes through the pointer).
    let attached = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_ATTACH_REUSEPORT_CBPF,
            std::ptr::from_ref(&fprog).cast(),
            u32::try_from(std::mem::size_of::<libc::sock_fprog>()).expect("small"),
        )
    };
    if attached == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Asks for `bytes` of receive and send buffer on `socket`; returns the sizes granted.
pub fn raise_socket_buffers(socket: &std::net::UdpSocket, bytes: usize) -> (usize, usize) {
    use std::os::fd::AsRawFd;
    let fd = socket.as_raw_fd();
    let want = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
    let size = |option: libc::c_int| {
        let len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: `fd` is an open socket; the option's value is one c_int, passed by pointer
        // with its size.
        unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                option,
                std::ptr::from_ref(&want).cast(),
                len,
            );
            let mut got: libc::c_int = 0;
            let mut got_len = len;
            libc::getsockopt(
                fd,
                libc::SOL_SOCKET,
                option,
                std::ptr::from_mut(&mut got).cast(),
                &raw mut got_len,
            );
            // Linux reports twice what it grants (half is its bookkeeping).
            usize::try_from(got).unwrap_or(0) / 2
        }
    };
    (size(libc::SO_RCVBUF), size(libc::SO_SNDBUF))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn os_errors_name_their_limit() {
        let e = |code| io::Error::from_raw_os_error(code);
        assert_eq!(
            Exhausted::of_os_error(&e(libc::EMFILE)),
            Some(Exhausted::OpenFiles)
        );
        assert_eq!(
            Exhausted::of_os_error(&e(libc::ENFILE)),
            Some(Exhausted::OpenFiles)
        );
        assert_eq!(
            Exhausted::of_os_error(&e(libc::ENOMEM)),
            Some(Exhausted::Mappings)
        );
        assert_eq!(Exhausted::of_os_error(&e(libc::ENOENT)), None);
    }

    #[test]
    fn a_cause_deep_in_a_chain_is_found_by_type_or_text() {
        #[derive(Debug)]
        struct Wrapped(Box<dyn std::error::Error>);
        impl std::fmt::Display for Wrapped {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("mmap failed to allocate 0x3000 bytes")
            }
        }
        impl std::error::Error for Wrapped {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&*self.0)
            }
        }
        // The OS error as another type with the OS's text (as wasmtime's `rustix` errors are).
        #[derive(Debug)]
        struct Text(String);
        impl std::fmt::Display for Text {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(&self.0)
            }
        }
        impl std::error::Error for Text {}
        let chain = |e: &Wrapped| {
            let first: &(dyn std::error::Error + 'static) = e;
            Exhausted::in_chain(std::iter::successors(Some(first), |c| c.source()))
        };
        let enomem = io::Error::from_raw_os_error(libc::ENOMEM).to_string();
        assert_eq!(
            chain(&Wrapped(Box::new(Text(enomem)))),
            Some(Exhausted::Mappings)
        );
        let emfile = io::Error::from_raw_os_error(libc::EMFILE);
        assert_eq!(
            chain(&Wrapped(Box::new(emfile))),
            Some(Exhausted::OpenFiles)
        );
        let other = Text("no such file".into());
        assert_eq!(chain(&Wrapped(Box::new(other))), None);
    }

    #[test]
    fn the_limits_of_this_process_are_read() {
        let (soft, hard) = open_files_limit().expect("getrlimit");
        assert!(soft <= hard && soft > 0);
        assert!(max_map_count().expect("vm.max_map_count") > 0);
        assert!(mappings().expect("/proc/self/maps") > 0);
        assert!(open_files().expect("/proc/self/fd") >= 3);
        // Raising is idempotent: afterwards the soft limit is the hard one.
        raise_open_files();
        assert_eq!(open_files_limit(), Some((hard, hard)));
    }
}
