//! HTTP/3 on every worker. Each per-core worker drives a QUIC endpoint of its own on a UDP
//! socket of its own, all bound to the same address with `SO_REUSEPORT`. The kernel would pick
//! a socket by a hash of the packet's addresses, which changes when a client changes network:
//! its packets would reach a worker that does not know its connection. So a packet is steered
//! by its destination connection ID instead: every connection ID a worker issues starts with a
//! byte `b` where `b % workers` is the worker's index ([`WorkerCids`]), and a classic BPF
//! program attached to the group ([`steering_program`]) sends each packet to socket
//! `dcid[0] % workers` (sockets are numbered in the order they joined the group, which is the
//! workers' order: they are all bound here, at start, before the program is attached). A
//! client's first packets carry an ID the client chose: they land on a worker by that ID's
//! first byte, consistently, and that worker answers with its own IDs.
//!
//! A second process binding the same port must not join the group (it would take a share of
//! the packets and replace the program): the port is first bound without `SO_REUSEPORT`, which
//! fails while any other socket holds it, and once the group is bound, any socket on the
//! address that is not one of ours (a process that started in the same instant) stops the
//! server with an error naming it.

use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::time::Duration;

use anyhow::Context as _;

/// Length of the connection IDs a worker issues (quinn's default).
const CID_LEN: usize = 8;

/// Most workers HTTP/3 can steer among: the index lives in the ID's first byte.
pub const MAX_WORKERS: usize = 256;

/// The connection IDs of worker `worker` of `workers`: random but for the first byte, which is
/// random among the bytes `b` with `b % workers == worker`.
#[derive(Debug, Clone, Copy)]
pub struct WorkerCids {
    worker: u16,
    workers: u16,
}

impl WorkerCids {
    pub fn new(worker: usize, workers: usize) -> Self {
        assert!(worker < workers && workers <= MAX_WORKERS);
        Self {
            worker: u16::try_from(worker).expect("at most 256"),
            workers: u16::try_from(workers).expect("at most 256"),
        }
    }

    /// The first byte of an ID, from a random byte.
    fn first_byte(self, random: u8) -> u8 {
        // The bytes that steer here: worker, worker + workers, ... below 256.
        let choices = (256 - self.worker).div_ceil(self.workers);
        let b = self.worker + self.workers * (u16::from(random) % choices);
        u8::try_from(b).expect("below 256")
    }
}

impl quinn::ConnectionIdGenerator for WorkerCids {
    fn generate_cid(&mut self) -> quinn::ConnectionId {
        let mut id = [0u8; CID_LEN];
        aws_lc_rs::rand::fill(&mut id).expect("the system's random source");
        id[0] = self.first_byte(id[0]);
        quinn::ConnectionId::new(&id)
    }

    fn cid_len(&self) -> usize {
        CID_LEN
    }

    fn cid_lifetime(&self) -> Option<Duration> {
        None
    }
}

/// The program that picks a packet's socket in a group of `workers`: the first byte of its
/// destination connection ID (at offset 6 of a long header: flags, version, the ID's length;
/// at offset 1 of a short one), modulo `workers`. A packet too short to hold it goes to
/// socket 0 (a load past the end ends a classic BPF program with 0), whose endpoint drops it.
fn steering_program(workers: usize) -> [libc::sock_filter; 7] {
    let op = |code: u32, jt: u8, jf: u8, k: u32| libc::sock_filter {
        code: u16::try_from(code).expect("an opcode"),
        jt,
        jf,
        k,
    };
    let n = u32::try_from(workers).expect("at most 256");
    [
        // A = packet[0]
        op(libc::BPF_LD | libc::BPF_B | libc::BPF_ABS, 0, 0, 0),
        // long header (0x80 set)? next : skip 2
        op(libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K, 0, 2, 0x80),
        op(libc::BPF_LD | libc::BPF_B | libc::BPF_ABS, 0, 0, 6),
        op(libc::BPF_JMP | libc::BPF_JA, 0, 0, 1),
        op(libc::BPF_LD | libc::BPF_B | libc::BPF_ABS, 0, 0, 1),
        op(libc::BPF_ALU | libc::BPF_MOD | libc::BPF_K, 0, 0, n),
        op(libc::BPF_RET | libc::BPF_A, 0, 0, 0),
    ]
}

/// Binds `workers` UDP sockets on `addr`, worker 0's first, steered by connection ID when
/// there are several (see the module's comment); one socket if the kernel refuses the
/// steering program (logged).
///
/// # Errors
/// If the address is taken (by another process too) or cannot be bound.
pub fn bind_group(addr: SocketAddr, workers: usize) -> anyhow::Result<Vec<UdpSocket>> {
    let taken = || format!("cannot listen on {addr} (UDP, HTTP/3)");
    if workers <= 1 {
        return Ok(vec![UdpSocket::bind(addr).with_context(taken)?]);
    }
    anyhow::ensure!(
        workers <= MAX_WORKERS,
        "HTTP/3 serves on at most {MAX_WORKERS} worker threads, not {workers} \
         (server.worker_threads)"
    );
    if addr.port() != 0 {
        // Fails while another socket holds the port, with or without SO_REUSEPORT: a second
        // server stops here instead of joining the first one's group.
        drop(
            UdpSocket::bind(addr).with_context(|| {
                format!("{}: is another server already listening there?", taken())
            })?,
        );
    }
    let mut sockets: Vec<UdpSocket> = Vec::with_capacity(workers);
    let mut at = addr;
    for _ in 0..workers {
        let socket = reuse_port_socket(at).with_context(taken)?;
        // Port 0: the first socket's port is the group's.
        at = socket.local_addr()?;
        sockets.push(socket);
    }
    let program = steering_program(workers);
    if let Err(e) = crate::os::attach_reuseport_program(&sockets[0], &program) {
        // A kernel (or sandbox) that refuses the program: one worker serves HTTP/3, as a
        // socket alone in its group gets every packet.
        tracing::warn!(
            "HTTP/3 on the first worker only: the kernel refused the program that steers \
             packets among workers (SO_ATTACH_REUSEPORT_CBPF: {e})"
        );
        sockets.truncate(1);
    }
    if let Some(other) = foreign_socket(at, &sockets) {
        anyhow::bail!(
            "{}: another socket (inode {other}) joined its port at the same time: is another \
             server starting there?",
            taken()
        );
    }
    Ok(sockets)
}

/// A UDP socket bound to `addr` with `SO_REUSEPORT`.
fn reuse_port_socket(addr: SocketAddr) -> std::io::Result<UdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    socket.set_reuse_port(true)?;
    socket.bind(&addr.into())?;
    Ok(socket.into())
}

/// A UDP socket on `addr` (`/proc/net/udp`, `udp6`) that is none of `ours`, by its inode.
fn foreign_socket(addr: SocketAddr, ours: &[UdpSocket]) -> Option<u64> {
    use std::os::unix::fs::MetadataExt as _;
    // Our sockets' inodes: the descriptor's link names the socket, its metadata is the
    // socket's. Unread (a sandbox without them), the check is skipped rather than guessed.
    let inodes: Vec<u64> = ours
        .iter()
        .map(|s| {
            let link = format!("/proc/self/fd/{}", s.as_raw_fd());
            std::fs::metadata(link).ok().map(|m| m.ino())
        })
        .collect::<Option<_>>()?;
    let table = if addr.is_ipv4() {
        "/proc/net/udp"
    } else {
        "/proc/net/udp6"
    };
    let text = std::fs::read_to_string(table).ok()?;
    let on_addr: Vec<u64> = text
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (local, inode) = (fields.get(1)?, fields.get(9)?.parse::<u64>().ok()?);
            (proc_address(local)? == addr).then_some(inode)
        })
        .collect();
    // A table that does not list our own sockets (another network namespace's view) says
    // nothing of others.
    if !inodes.iter().all(|i| on_addr.contains(i)) {
        return None;
    }
    on_addr.into_iter().find(|i| !inodes.contains(i))
}

/// An address as `/proc/net/udp` writes it: the IP's 32-bit words in hex, each in the
/// machine's byte order, a colon, the port in hex.
fn proc_address(text: &str) -> Option<SocketAddr> {
    let (ip, port) = text.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let mut bytes = Vec::with_capacity(16);
    for i in (0..ip.len()).step_by(8) {
        let word = u32::from_str_radix(ip.get(i..i + 8)?, 16).ok()?;
        bytes.extend_from_slice(&word.to_ne_bytes());
    }
    let ip: std::net::IpAddr = match bytes.len() {
        4 => <[u8; 4]>::try_from(bytes).ok()?.into(),
        16 => <[u8; 16]>::try_from(bytes).ok()?.into(),
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

#[cfg(test)]
mod tests {
    use super::*;
    use quinn::ConnectionIdGenerator as _;

    #[test]
    fn every_id_a_worker_issues_steers_back_to_it() {
        for workers in [1, 2, 3, 7, 255, 256] {
            for worker in [0, workers / 2, workers - 1] {
                let mut cids = WorkerCids::new(worker, workers);
                for _ in 0..200 {
                    let id = cids.generate_cid();
                    assert_eq!(id.len(), CID_LEN);
                    assert_eq!(usize::from(id[0]) % workers, worker, "{workers} {worker}");
                }
                // Every random byte maps to a byte that steers here.
                for r in 0..=255u8 {
                    assert_eq!(usize::from(cids.first_byte(r)) % workers, worker);
                }
            }
        }
        // The first byte keeps its randomness among the bytes that steer to the worker.
        let c = WorkerCids::new(1, 2);
        let firsts: std::collections::HashSet<u8> = (0..=255).map(|r| c.first_byte(r)).collect();
        assert_eq!(firsts.len(), 128);
    }

    #[test]
    fn proc_net_udp_addresses_are_read() {
        let v4 = u32::from_ne_bytes([127, 0, 0, 1]);
        assert_eq!(
            proc_address(&format!("{v4:08X}:1F90")),
            Some("127.0.0.1:8080".parse().unwrap())
        );
        let words: String = [0u32, 0, 0, u32::from_ne_bytes([0, 0, 0, 1])]
            .iter()
            .map(|w| format!("{w:08X}"))
            .collect();
        assert_eq!(
            proc_address(&format!("{words}:01BB")),
            Some("[::1]:443".parse().unwrap())
        );
        assert_eq!(proc_address("zz:1"), None);
    }

    #[test]
    fn a_group_takes_its_port_whole_and_a_second_one_is_refused() {
        let group = bind_group("127.0.0.1:0".parse().unwrap(), 2).unwrap();
        let at = group[0].local_addr().unwrap();
        assert_eq!(group[1].local_addr().unwrap(), at);
        assert_eq!(foreign_socket(at, &group), None);
        // A second server on the same port: refused, the group untouched.
        let e = bind_group(at, 2).unwrap_err();
        assert!(format!("{e:#}").contains("another server"), "{e:#}");
        // A socket that joined the group behind the check's back is named.
        let intruder = reuse_port_socket(at).unwrap();
        assert!(foreign_socket(at, &group).is_some());
        drop(intruder);
        assert_eq!(foreign_socket(at, &group), None);
    }

    #[test]
    fn packets_reach_the_socket_their_connection_id_names() {
        let group = bind_group("127.0.0.1:0".parse().unwrap(), 2).unwrap();
        let at = group[0].local_addr().unwrap();
        for s in &group {
            s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        }
        let client = UdpSocket::bind("127.0.0.1:0").unwrap();
        // Short headers (ID at offset 1) and long ones (at offset 6), IDs of both workers.
        for (packet, worker) in [
            (vec![0x40, 4, 9, 9, 9, 9, 9, 9, 9], 0),
            (vec![0x40, 7, 9, 9, 9, 9, 9, 9, 9], 1),
            (vec![0xc0, 0, 0, 0, 1, 8, 9, 9, 9, 9], 1),
            (vec![0xc0, 0, 0, 0, 1, 8, 10, 9, 9, 9], 0),
        ] {
            client.send_to(&packet, at).unwrap();
            let mut buf = [0u8; 64];
            let (n, _) = group[worker].recv_from(&mut buf).unwrap();
            assert_eq!(&buf[..n], &packet[..]);
        }
    }
}
