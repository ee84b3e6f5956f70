//! Redis Clusters for tests, built with `redis-cli --cluster create` (`valkey-cli` for Valkey),
//! and what operators do to them: move a slot to another master with the real commands
//! (`CLUSTER SETSLOT ... IMPORTING/MIGRATING`, `MIGRATE`, `CLUSTER SETSLOT ... NODE`), kill a
//! master and wait for its replica to take over.

use std::process::Command;
use std::time::Duration;

use super::{Flavor, RedisServer, wait_until};

/// A Redis Cluster on loopback ports; its nodes are killed when it is dropped.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

/// One line of `CLUSTER NODES`, as a live node sees it.
#[derive(Debug, Clone)]
pub struct ClusterNode {
    pub id: String,
    pub port: u16,
    pub master: bool,
    /// Flagged `fail` (or `fail?`) by the node asked.
    pub failing: bool,
    /// The id of its master, for a replica.
    pub master_id: Option<String>,
    /// The slot ranges it serves (`first..=last`).
    pub slots: Vec<(u16, u16)>,
}

impl ClusterNode {
    pub fn serves(&self, slot: u16) -> bool {
        self.slots.iter().any(|&(a, b)| (a..=b).contains(&slot))
    }
}

impl RedisCluster {
    /// Three masters, no replicas, `cluster-node-timeout` 2000 ms.
    pub fn start() -> RedisCluster {
        Self::start_with(Vec::new)
    }

    /// The same, each node started with the arguments `extra` gives it (e.g. a TLS port).
    pub fn start_with(mut extra: impl FnMut() -> Vec<String>) -> RedisCluster {
        let nodes = (0..3)
            .map(|_| RedisServer::cluster_node(2000, &extra()))
            .collect();
        Self::create(nodes, 0)
    }

    /// Three masters with a replica each, quick to fail over: peers are failing after
    /// `node_timeout` without an answer, a replica may always take over
    /// (`cluster-replica-validity-factor 0`), and, unless `full_coverage`, the masters keep
    /// serving their slots while another master's are not served
    /// (`cluster-require-full-coverage no`).
    pub fn start_replicated(node_timeout: Duration, full_coverage: bool) -> RedisCluster {
        let coverage = if full_coverage { "yes" } else { "no" };
        let extra = [
            "--cluster-replica-validity-factor",
            "0",
            "--cluster-require-full-coverage",
            coverage,
        ]
        .map(str::to_owned);
        let ms = node_timeout.as_millis() as u64;
        let nodes = (0..6)
            .map(|_| RedisServer::cluster_node(ms, &extra))
            .collect();
        let cluster = Self::create(nodes, 1);
        wait_until(Duration::from_secs(20), "replicas in sync", || {
            cluster.topology().iter().filter(|n| !n.master).all(|n| {
                let replica = cluster.by_port(n.port);
                replica
                    .cmd::<String>(&["INFO", "replication"])
                    .contains("master_link_status:up")
            })
        });
        cluster
    }

    fn create(nodes: Vec<RedisServer>, replicas: usize) -> RedisCluster {
        let flavor = Flavor::current();
        let cli = flavor.cli();
        let mut create = Command::new(flavor.program(cli));
        create.arg("--cluster").arg("create");
        for n in &nodes {
            create.arg(n.addr());
        }
        let out = create
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .output()
            .unwrap_or_else(|e| panic!("cannot run {cli} ({e}); run: {}", flavor.install()));
        assert!(
            out.status.success(),
            "{cli} --cluster create failed: {out:?}"
        );
        let cluster = RedisCluster { nodes };
        cluster.wait_ok(Duration::from_secs(20));
        wait_until(
            Duration::from_secs(20),
            "every node knowing every other",
            || {
                cluster.running().all(|n| {
                    let seen = Self::parse_nodes(&n.cmd::<String>(&["CLUSTER", "NODES"]));
                    seen.len() == cluster.nodes.len()
                        && seen.iter().filter(|s| !s.master).count() == replicas * 3
                })
            },
        );
        cluster
    }

    /// Waits until every running node says `cluster_state:ok`.
    pub fn wait_ok(&self, within: Duration) {
        for n in self.running() {
            wait_until(within, "cluster_state:ok", || {
                n.cmd::<String>(&["CLUSTER", "INFO"])
                    .contains("cluster_state:ok")
            });
        }
    }

    /// `redis+cluster://` with every node as a seed.
    pub fn url(&self) -> String {
        let seeds: Vec<String> = self.nodes.iter().map(RedisServer::addr).collect();
        format!("redis+cluster://{}", seeds.join(","))
    }

    /// Calls of the limiter's code (see [`RedisServer::script_calls`]) summed over the
    /// running nodes.
    pub fn script_calls(&self) -> u64 {
        self.running().map(RedisServer::script_calls).sum()
    }

    fn running(&self) -> impl Iterator<Item = &RedisServer> {
        self.nodes.iter().filter(|n| n.is_running())
    }

    fn by_port(&self, port: u16) -> &RedisServer {
        self.nodes
            .iter()
            .find(|n| n.port == port)
            .unwrap_or_else(|| panic!("no test node on port {port}"))
    }

    /// The index in [`Self::nodes`] of the node on `port`.
    pub fn index(&self, port: u16) -> usize {
        self.nodes
            .iter()
            .position(|n| n.port == port)
            .unwrap_or_else(|| panic!("no test node on port {port}"))
    }

    /// `CLUSTER NODES` as the first running node sees it.
    pub fn topology(&self) -> Vec<ClusterNode> {
        let asked = self.running().next().expect("a running node");
        Self::parse_nodes(&asked.cmd::<String>(&["CLUSTER", "NODES"]))
    }

    fn parse_nodes(text: &str) -> Vec<ClusterNode> {
        text.lines().filter_map(Self::parse_node).collect()
    }

    /// `<id> <ip:port@bus[,host]> <flags> <master> <ping> <pong> <epoch> <link> <slot>...`
    fn parse_node(line: &str) -> Option<ClusterNode> {
        let f: Vec<&str> = line.split_whitespace().collect();
        let port = f
            .get(1)?
            .split('@')
            .next()?
            .rsplit(':')
            .next()?
            .parse()
            .ok()?;
        let flags = f.get(2)?;
        let slots = f
            .iter()
            .skip(8)
            .filter(|s| !s.starts_with('['))
            .filter_map(|s| match s.split_once('-') {
                Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
                None => s.parse().ok().map(|a| (a, a)),
            })
            .collect();
        Some(ClusterNode {
            id: (*f.first()?).to_owned(),
            port,
            master: flags.contains("master"),
            failing: flags.contains("fail"),
            master_id: f.get(3).filter(|m| **m != "-").map(|m| (*m).to_owned()),
            slots,
        })
    }

    /// The slot of `key` (`CLUSTER KEYSLOT`).
    pub fn slot_of(&self, key: &str) -> u16 {
        let node = self.running().next().expect("a running node");
        node.cmd::<u16>(&["CLUSTER", "KEYSLOT", key])
    }

    /// The index of the master that serves `slot`, as the first running node sees it.
    pub fn owner(&self, slot: u16) -> usize {
        let node = self
            .topology()
            .into_iter()
            .find(|n| n.master && !n.failing && n.serves(slot))
            .unwrap_or_else(|| panic!("no master serves slot {slot}"));
        self.index(node.port)
    }

    /// The indices of the masters, in order.
    pub fn masters(&self) -> Vec<usize> {
        let mut masters: Vec<usize> = self
            .topology()
            .iter()
            .filter(|n| n.master && !n.failing)
            .map(|n| self.index(n.port))
            .collect();
        masters.sort_unstable();
        masters
    }

    /// The index of a replica of master `master`.
    pub fn replica_of(&self, master: usize) -> usize {
        let topology = self.topology();
        let id = self.id(master);
        let replica = topology
            .iter()
            .find(|n| n.master_id.as_deref() == Some(id.as_str()))
            .unwrap_or_else(|| panic!("node {master} has no replica"));
        self.index(replica.port)
    }

    /// The node's id (`CLUSTER MYID`).
    pub fn id(&self, node: usize) -> String {
        self.nodes[node].cmd(&["CLUSTER", "MYID"])
    }

    /// Moves `slot` to master `to` as an operator does, with a pause after each key so that
    /// clients meet every stage: [`Self::begin_migration`], [`Self::migrate_keys`],
    /// [`Self::end_migration`]. Returns how many keys moved.
    pub fn migrate(&self, slot: u16, to: usize, pause: Duration) -> usize {
        let from = self.begin_migration(slot, to);
        let moved = self.migrate_keys(slot, from, to, usize::MAX, pause);
        self.end_migration(slot, from, to);
        moved
    }

    /// The first stage of moving `slot` to master `to`: the target `IMPORTING` from the
    /// source, then the source `MIGRATING` to the target. Returns the source.
    pub fn begin_migration(&self, slot: u16, to: usize) -> usize {
        let from = self.owner(slot);
        assert_ne!(from, to, "slot {slot} is already on node {to}");
        let slot_text = slot.to_string();
        let (from_id, to_id) = (self.id(from), self.id(to));
        let _: () = self.nodes[to].cmd(&["CLUSTER", "SETSLOT", &slot_text, "IMPORTING", &from_id]);
        let _: () = self.nodes[from].cmd(&["CLUSTER", "SETSLOT", &slot_text, "MIGRATING", &to_id]);
        from
    }

    /// Moves up to `most` keys of `slot` from `from` to `to`, each with its own `MIGRATE`,
    /// pausing `pause` after each; returns how many moved.
    pub fn migrate_keys(
        &self,
        slot: u16,
        from: usize,
        to: usize,
        most: usize,
        pause: Duration,
    ) -> usize {
        let (source, port) = (&self.nodes[from], self.nodes[to].port.to_string());
        let slot_text = slot.to_string();
        let mut moved = 0;
        while moved < most {
            let keys: Vec<Vec<u8>> = source.cmd(&["CLUSTER", "GETKEYSINSLOT", &slot_text, "10"]);
            if keys.is_empty() {
                break;
            }
            for key in keys.into_iter().take(most - moved) {
                let mut migrate = ::redis::cmd("MIGRATE");
                migrate
                    .arg("127.0.0.1")
                    .arg(&port)
                    .arg(key)
                    .arg(0)
                    .arg(5000);
                let _: ::redis::Value = migrate
                    .query(&mut source.conn())
                    .expect("MIGRATE a key of the slot");
                moved += 1;
                std::thread::sleep(pause);
            }
        }
        moved
    }

    /// The last stage: the slot given to `to` (`SETSLOT ... NODE`) on the target, the source
    /// and the other masters, in that order.
    pub fn end_migration(&self, slot: u16, from: usize, to: usize) {
        let (slot_text, to_id) = (slot.to_string(), self.id(to));
        let others = self.masters().into_iter().filter(|&m| m != from && m != to);
        for node in [to, from].into_iter().chain(others) {
            let _: () = self.nodes[node].cmd(&["CLUSTER", "SETSLOT", &slot_text, "NODE", &to_id]);
        }
    }

    /// Moves `slots` slots from master `from` to master `to` with the operator's tool,
    /// `redis-cli --cluster reshard` (`valkey-cli` for Valkey), which takes the lowest slots
    /// `from` serves and migrates their keys in batches of `pipeline` (`MIGRATE ... KEYS`).
    pub fn reshard(&self, from: usize, to: usize, slots: usize, pipeline: usize) {
        let flavor = Flavor::current();
        let cli = flavor.cli();
        let out = Command::new(flavor.program(cli))
            .arg("--cluster")
            .arg("reshard")
            .arg(self.nodes[from].addr())
            .args(["--cluster-from", &self.id(from)])
            .args(["--cluster-to", &self.id(to)])
            .args(["--cluster-slots", &slots.to_string()])
            .args(["--cluster-pipeline", &pipeline.to_string()])
            .arg("--cluster-yes")
            .output()
            .unwrap_or_else(|e| panic!("cannot run {cli} ({e}); run: {}", flavor.install()));
        assert!(
            out.status.success(),
            "{cli} --cluster reshard failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The lowest slot master `node` serves.
    pub fn first_slot(&self, node: usize) -> u16 {
        let port = self.nodes[node].port;
        self.topology()
            .into_iter()
            .filter(|n| n.port == port)
            .flat_map(|n| n.slots)
            .map(|(first, _)| first)
            .min()
            .expect("a master serving slots")
    }

    /// Waits until a running master other than `old` serves `slot` in every running node's
    /// view, and the cluster is ok again; returns that master's index.
    pub fn wait_new_owner(&self, slot: u16, old: usize, within: Duration) -> usize {
        let old_port = self.nodes[old].port;
        let mut owner = None;
        wait_until(within, "another master serving the slot", || {
            let views: Vec<Option<u16>> = self
                .running()
                .map(|n| {
                    Self::parse_nodes(&n.cmd::<String>(&["CLUSTER", "NODES"]))
                        .into_iter()
                        .find(|c| c.master && !c.failing && c.serves(slot))
                        .map(|c| c.port)
                })
                .collect();
            let agreed = views.first().copied().flatten();
            owner = agreed;
            agreed.is_some_and(|p| p != old_port) && views.iter().all(|v| *v == agreed)
        });
        self.wait_ok(within);
        self.index(owner.expect("a new owner"))
    }
}
