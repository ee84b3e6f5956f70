//! A DNS server for tests, on a loopback UDP port from the kernel: it answers SRV questions
//! for one name with the records the test sets (and may change while it runs), and every
//! other question with NXDOMAIN. Point `memcache.srv_resolver` at [`SrvServer::addr`].

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use hickory_resolver::proto::op::{Message, MessageType, ResponseCode};
use hickory_resolver::proto::rr::rdata::SRV;
use hickory_resolver::proto::rr::{Name, RData, Record, RecordType};
use tokio::net::UdpSocket;
use tokio::task::JoinHandle;

/// The records served: (target host, port) each.
type Targets = Arc<Mutex<Vec<(String, u16)>>>;

/// A running responder; stopped when dropped.
pub struct SrvServer {
    addr: SocketAddr,
    targets: Targets,
    task: JoinHandle<()>,
}

impl SrvServer {
    /// Answers SRV questions for `name` (e.g. `_memcache._tcp.mc.test`) with `targets`.
    pub async fn start(name: &str, targets: &[(&str, u16)]) -> SrvServer {
        let socket = UdpSocket::bind("127.0.0.1:0").await.expect("bind DNS");
        let addr = socket.local_addr().expect("DNS address");
        let served = Name::from_ascii(name).expect("SRV name");
        let shared: Targets = Arc::new(Mutex::new(Vec::new()));
        let server = SrvServer {
            addr,
            targets: shared.clone(),
            task: tokio::spawn(answer(socket, served, shared)),
        };
        server.set(targets_of(targets));
        server
    }

    /// `ip:port`, for `memcache.srv_resolver`.
    pub fn addr(&self) -> String {
        self.addr.to_string()
    }

    /// Serves `targets` from now on (none: an answer without records).
    pub fn set(&self, targets: Vec<(String, u16)>) {
        *self.targets.lock().unwrap_or_else(|e| e.into_inner()) = targets;
    }
}

fn targets_of(targets: &[(&str, u16)]) -> Vec<(String, u16)> {
    targets.iter().map(|(h, p)| ((*h).to_owned(), *p)).collect()
}

impl Drop for SrvServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn answer(socket: UdpSocket, served: Name, targets: Targets) {
    let mut buf = vec![0u8; 4096];
    loop {
        let Ok((n, from)) = socket.recv_from(&mut buf).await else {
            return;
        };
        let Ok(question) = Message::from_vec(&buf[..n]) else {
            continue;
        };
        let mut reply = Message::new(
            question.metadata.id,
            MessageType::Response,
            question.metadata.op_code,
        );
        reply.metadata.recursion_desired = question.metadata.recursion_desired;
        reply.metadata.recursion_available = true;
        reply.metadata.authoritative = true;
        let mut known = false;
        for query in &question.queries {
            reply.add_query(query.clone());
            let same = query.name().to_lowercase().to_ascii().trim_end_matches('.')
                == served.to_lowercase().to_ascii().trim_end_matches('.');
            if !same {
                continue;
            }
            known = true;
            if query.query_type() != RecordType::SRV {
                continue;
            }
            let list = targets.lock().unwrap_or_else(|e| e.into_inner()).clone();
            for (host, port) in list {
                let Ok(target) = Name::from_ascii(format!("{host}.")) else {
                    continue;
                };
                let srv = SRV::new(0, 0, port, target);
                reply.add_answer(Record::from_rdata(query.name().clone(), 1, RData::SRV(srv)));
            }
        }
        if !known {
            reply.metadata.response_code = ResponseCode::NXDomain;
        }
        if let Ok(bytes) = reply.to_vec() {
            let _ = socket.send_to(&bytes, from).await;
        }
    }
}
