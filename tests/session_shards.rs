//! The session layer sharded by client (`docs/sharding.md`, step 1), run serially: one flow
//! layer, N session stages, each input routed as the design says, and the server-scoped
//! entries replicated between the stages through a [`ServerScope`]. The outputs must be one
//! pipeline's, in its order. The exception is a sweep or the end of the input: every shard
//! makes those outputs for its own sessions, so they are compared as a set.
//!
//! Serial order is input order, so the scope below needs no waiting. A threaded one waits
//! for the other shards' progress before each access.

mod common;

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use mcptap_core::detect::ModeTracker;
use mcptap_core::mcp::identity::Identities;
use mcptap_core::mcp::session::{Session, SessionKey};
use mcptap_core::mcp::{GroupKey, ServerScope};
use mcptap_core::model::{Event, Output, Timestamp};
use mcptap_core::pipeline::{Analysis, Limits, Pipeline, SessionStage, Staged};
use mcptap_core::shard::{BroadcastPart, Route, ShardRouter, broadcast_order};
use mcptap_core::usage::SharedUsage;
use mcptap_testkit::mcp::{self as kit, Client, modern};
use mcptap_testkit::sim::Sim;
use mcptap_testkit::tcp::{AppWrite, Endpoint};

/// The server-scoped entries as the shards last wrote them, numbered in write order.
#[derive(Debug, Default)]
struct Store {
    entries: HashMap<SessionKey, (u64, Box<Session<ModeTracker>>)>,
    written: u64,
}

#[derive(Debug)]
struct Replicas(Arc<Mutex<Store>>);

impl ServerScope<ModeTracker> for Replicas {
    fn newer(&mut self, key: &SessionKey, have: u64) -> Option<(u64, Box<Session<ModeTracker>>)> {
        let store = self.0.lock().expect("store");
        let (version, entry) = store.entries.get(key)?;
        (*version > have).then(|| (*version, entry.server_replica()))
    }

    fn publish(&mut self, key: &SessionKey, entry: Box<Session<ModeTracker>>) -> u64 {
        let mut store = self.0.lock().expect("store");
        store.written += 1;
        let version = store.written;
        store.entries.insert(key.clone(), (version, entry));
        version
    }
}

/// Outputs in order, and the inputs each shard took alone.
#[derive(Default)]
struct Merged {
    outputs: Vec<Output>,
    taken: Vec<usize>,
}

/// A stage's marks of its broadcast outputs' units.
type Marks = Vec<(usize, GroupKey)>;

struct Shards {
    stages: Vec<SessionStage>,
    router: ShardRouter,
    merged: Merged,
}

impl Shards {
    fn take(&mut self, flows: &mut Pipeline, steps: Vec<Staged>) {
        for step in steps {
            let input = match step {
                Staged::Output(o) => {
                    self.merged.outputs.push(o);
                    continue;
                }
                Staged::Input(input) => input,
            };
            let out = &mut self.merged.outputs;
            match self.router.route(&input, out) {
                Route::One(shard) => {
                    self.merged.taken[shard] += 1;
                    self.stages[shard].process(Staged::Input(input), out)
                }
                route => {
                    // Every stage: copies to all but the last, which takes the input itself.
                    let last = self.stages.len() - 1;
                    let mut made: Vec<(Vec<Output>, Marks)> = Vec::new();
                    let mut input = Some(input);
                    for (i, stage) in self.stages.iter_mut().enumerate() {
                        let step = match (i == last, input.take()) {
                            (false, Some(it)) => {
                                let copy = flows.stage_copy(&it);
                                input = Some(it);
                                copy
                            }
                            (_, Some(it)) => it,
                            (_, None) => unreachable!("the input is kept for the last stage"),
                        };
                        let mut o = Vec::new();
                        let mut marks = Vec::new();
                        stage.process(Staged::Input(step), &mut o);
                        stage.take_group_marks(&mut marks);
                        made.push((o, marks));
                    }
                    if route == Route::EveryOnce {
                        out.append(&mut made[0].0);
                        continue;
                    }
                    let parts: Vec<BroadcastPart> = made
                        .iter()
                        .map(|(o, marks)| BroadcastPart {
                            outputs: 0..o.len(),
                            marks,
                        })
                        .collect();
                    for (shard, range) in broadcast_order(&parts) {
                        out.extend(made[shard].0[range].iter().cloned());
                    }
                }
            }
        }
    }
}

/// Replays `path` through one flow layer and `shards` session stages; with `replicas`, the
/// stages share their server-scoped entries.
fn sharded(path: &Path, limits: Limits, shards: usize, replicas: bool) -> Merged {
    let usage: Arc<SharedUsage> = Arc::default();
    let (mut flows, mut stages) =
        Pipeline::split_shards(limits, Analysis::default(), usage, shards);
    let store = Arc::new(Mutex::new(Store::default()));
    if replicas {
        for stage in &mut stages {
            stage.share_server_scope(Box::new(Replicas(Arc::clone(&store))));
        }
    }
    let mut shards = Shards {
        stages,
        router: ShardRouter::new(shards, &limits, Identities::default()),
        merged: Merged {
            outputs: Vec::new(),
            taken: vec![0; shards],
        },
    };
    let mut out = Vec::new();
    let paths = [path.to_str().expect("utf-8").to_string()];
    mcptap::capture::read_captures(&paths, &mut |pkt| {
        flows.handle_packet(Timestamp(pkt.ts_nanos), pkt.linktype, pkt.data, &mut out);
        flows.stage_outputs(&mut out);
        let steps = flows.take_staged(Vec::new());
        shards.take(&mut flows, steps);
    })
    .expect("read");
    flows.finish(&mut out);
    flows.stage_outputs(&mut out);
    let steps = flows.take_staged(Vec::new());
    shards.take(&mut flows, steps);
    shards.merged
}

/// `path` through `shards` session shards on threads of their own, as `replay --threads`, and
/// the flow layer on this thread (`flow_threads` 0) or sharded over threads of its own.
fn threaded(path: &Path, limits: Limits, (flow_threads, shards): (usize, usize)) -> Vec<Output> {
    let paths = [path.to_str().expect("utf-8").to_string()];
    let mut all = Vec::new();
    mcptap::sharded::replay_sharded(
        &paths,
        limits,
        Analysis::default(),
        (flow_threads, shards),
        &mut mcptap::progress::ReplayProgress::hidden(),
        &mut |o| all.push(o.clone()),
    )
    .expect("replay");
    all
}

fn assert_same(got: &[Output], want: &[Output], what: &str) {
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g, w, "{what}, output {i}");
    }
    assert_eq!(got.len(), want.len(), "{what}");
}

/// One pipeline's outputs, and the same, in the same order, through 1 to 4 session shards,
/// serially and on threads.
fn assert_shards_agree(path: &Path, limits: Limits) -> Vec<Output> {
    let paths = [path.to_str().expect("utf-8").to_string()];
    let (whole, _) = mcptap::replay::replay_collect(&paths, limits).expect("replay");
    for n in 1..=4 {
        let what = format!("{}: {n} shards", path.display());
        assert_same(&sharded(path, limits, n, true).outputs, &whole, &what);
        for flow_threads in [0, n] {
            assert_same(
                &threaded(path, limits, (flow_threads, n)),
                &whole,
                &format!("{what} on threads, {flow_threads} flow threads"),
            );
        }
    }
    whole
}

fn alerts(outputs: &[Output]) -> Vec<String> {
    outputs
        .iter()
        .filter_map(|o| match o {
            Output::Event(Event::Alert(a)) => Some(format!("{:?}", a.kind)),
            _ => None,
        })
        .collect()
}

/// Clients on addresses of their own, so that they spread over the shards.
fn client(i: u8) -> Endpoint {
    Endpoint::new([10, 2, i / 50, i % 50], 40000 + u16::from(i))
}

fn capture_of(dir: &Path, name: &str, talks: Vec<(Endpoint, Vec<AppWrite>)>) -> std::path::PathBuf {
    let server = Endpoint::new([10, 0, 0, 1], 8080);
    let mut sim = Sim::new(11).with_step(300_000);
    for (c, writes) in talks {
        // One after the other: the order of the clients is the order of their answers.
        let conn = sim.connect(c, server, writes).server_closes();
        sim.run(vec![conn]);
    }
    let path = dir.join(name);
    sim.write_pcap(&path).expect("write");
    path
}

#[test]
fn every_fixture_gives_one_pipelines_outputs_through_session_shards() {
    for f in common::fixture_pcaps() {
        assert_shards_agree(&f, Limits::default());
    }
}

#[test]
fn many_clients_of_a_stateful_server_through_session_shards() {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("bursts.pcap");
    common::write_legacy_bursts(&path);
    let whole = assert_shards_agree(&path, common::bursts_limits());
    assert!(alerts(&whole).len() >= 18);
    // The clients spread over the shards: each takes a share of the work, none most of it.
    // (72 clients of unequal work: a fair hash's shares of them vary, e.g. 7 to 22 clients.)
    let taken = sharded(&path, common::bursts_limits(), 4, true).taken;
    let all: usize = taken.iter().sum();
    assert!(
        taken.iter().all(|t| t * 16 > all && t * 2 < all),
        "{taken:?}"
    );
}

/// A capture of one's own (`MCPTAP_SHARD_CAPTURE=PATH`), e.g. the gateway-shaped bench
/// capture: `cargo test --release --test session_shards -- --ignored --nocapture`. Compared up
/// to the first limit hit, past which one worker and N shards may differ (each shard has the
/// limits of a worker of its own).
#[test]
#[ignore = "needs MCPTAP_SHARD_CAPTURE"]
fn a_capture_of_ones_own_through_session_shards() {
    let path = std::env::var("MCPTAP_SHARD_CAPTURE").expect("MCPTAP_SHARD_CAPTURE=PATH");
    let path = Path::new(&path);
    let paths = [path.to_str().expect("utf-8").to_string()];
    let (want, _) = mcptap::replay::replay_collect(&paths, Limits::default()).expect("replay");
    let limit_hit = want
        .iter()
        .position(|o| {
            matches!(
                o,
                Output::Telemetry(mcptap_core::model::Telemetry::LimitHit { .. })
            )
        })
        .unwrap_or(want.len());
    for n in 2..=4 {
        for (how, got) in [
            (
                "serially",
                sharded(path, Limits::default(), n, true).outputs,
            ),
            ("on threads", threaded(path, Limits::default(), (0, n))),
            (
                "on threads, flows sharded too",
                threaded(path, Limits::default(), (n, n)),
            ),
        ] {
            let same = got.iter().zip(&want).take_while(|(g, w)| g == w).count();
            assert!(
                same >= limit_hit,
                "{n} shards {how}: output {same} differs: {:?}",
                got.get(same)
            );
        }
    }
    eprintln!(
        "{} outputs, {} alerts; identical through 2 to 4 session shards (serially, on threads, and with 2 to 4 flow shards) up to output {limit_hit}",
        want.len(),
        alerts(&want).len()
    );
}

/// A stateless legacy client's exchanges: `initialize`, then a `tools/call` of `search`
/// answered as a stream (`streamed`) or as plain JSON.
fn stateless_call(who: &Client<'_>, streamed: bool) -> Vec<AppWrite> {
    let init = kit::initialize_request(1, kit::FULL_CLIENT_CAPS, who.name, who.version);
    let result = kit::initialize_result(1, r#"{"streaming":true}"#, "stateless");
    let call = kit::tools_call_request(2, "search", "{}");
    let answer = kit::tool_result(2, "found");
    vec![
        AppWrite::client(who.post(&init, None)),
        AppWrite::server(modern::answer(false, &result)),
        AppWrite::client(who.post(&call, None)),
        AppWrite::server(modern::answer(streamed, &answer)),
    ]
}

/// A stateless legacy server answers `tools/call` as a stream to the first clients and as
/// plain JSON to a later one: the endpoint's mode changed, whichever shard each client is on.
#[test]
fn a_stateless_endpoints_mode_is_shared_by_the_shards() {
    let who = Client {
        host: "mcp.internal:8080",
        name: "agent",
        version: "1.0",
    };
    let talks: Vec<(Endpoint, Vec<AppWrite>)> = (0..12u8)
        .map(|i| (client(i), stateless_call(&who, i < 8)))
        .collect();
    let dir = tempfile::tempdir().expect("tmp");
    let path = capture_of(dir.path(), "stateless.pcap", talks);
    let whole = assert_shards_agree(&path, Limits::default());
    assert!(
        alerts(&whole).iter().any(|a| a.contains("Divergence")),
        "{:?}",
        alerts(&whole)
    );
    // Without the replicas, the shards that saw only JSON answers would not alert.
    let alone = sharded(&path, Limits::default(), 4, false);
    assert_ne!(alerts(&alone.outputs), alerts(&whole));
}

/// Stamps the clock refuses and gaps it follows give one pipeline's outputs through the
/// shards: a stateless endpoint's clients, one of whose answers is stamped two hours ahead
/// (a refused stamp: its entry is seen "in the future" until a sweep brings it back), and a
/// quiet gap longer than the flow and session timeouts before the last clients, whose first
/// packets the clock holds pending and which are handled at their own times.
#[test]
fn refused_stamps_and_followed_gaps_give_one_pipelines_outputs_through_the_shards() {
    let who = Client {
        host: "mcp.internal:8080",
        name: "agent",
        version: "1.0",
    };
    let server = Endpoint::new([10, 0, 0, 1], 8080);
    let mut sim = Sim::new(12).with_step(300_000);
    for i in 0..10u8 {
        if i == 6 {
            sim.advance(4000 * 1_000_000_000);
        }
        let conn = sim
            .connect(client(i), server, stateless_call(&who, i < 8))
            .server_closes();
        sim.run(vec![conn]);
    }
    let mut frames = sim.frames().to_vec();
    // The third client's tools/call answer, stamped two hours ahead.
    let answers: Vec<usize> = frames
        .iter()
        .enumerate()
        .filter(|(_, f)| f.data.windows(5).any(|w| w == b"found"))
        .map(|(i, _)| i)
        .collect();
    frames[answers[2]].ts_nanos += 2 * 3600 * 1_000_000_000;
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("clock.pcap");
    std::fs::write(
        &path,
        mcptap_testkit::capture::pcap_bytes(sim.linktype(), &frames),
    )
    .expect("write");
    let whole = assert_shards_agree(&path, Limits::default());
    let jumps: Vec<bool> = whole
        .iter()
        .filter_map(|o| match o {
            Output::Telemetry(mcptap_core::model::Telemetry::ClockJump { followed, .. }) => {
                Some(*followed)
            }
            _ => None,
        })
        .collect();
    assert!(jumps.contains(&true) && jumps.contains(&false), "{jumps:?}");
}

/// Modern clients: one lists the tools (a tool with an `x-mcp-header` parameter) and the
/// others call it without the header; one asks `server/discover`, and a later one gets a
/// narrower result. Every client is checked against what the server told any of them.
#[test]
fn a_servers_tools_and_discover_result_are_shared_by_the_shards() {
    let tools = r#"{"jsonrpc":"2.0","id":1,"result":{"resultType":"complete","tools":[{"name":"execute_sql","inputSchema":{"type":"object","properties":{"region":{"type":"string","x-mcp-header":"Region"}}}}]}}"#;
    let discover = |id: u64, caps: &str| {
        format!(
            r#"{{"jsonrpc":"2.0","id":{id},"result":{{"resultType":"complete","supportedVersions":["{}"],"capabilities":{caps},"_meta":{{"io.modelcontextprotocol/serverInfo":{{"name":"srv","version":"1"}}}}}}}}"#,
            modern::VERSION
        )
    };
    let request = |id: u64, method: &str, params: &str| {
        modern::request(id, method, params, modern::FULL_CAPS, "agent", "1")
    };
    let mut talks = vec![
        (
            client(0),
            vec![
                AppWrite::client(modern::post(
                    &request(1, "tools/list", ""),
                    "tools/list",
                    None,
                    "",
                )),
                AppWrite::server(modern::answer(false, tools)),
            ],
        ),
        (
            client(1),
            vec![
                AppWrite::client(modern::post(
                    &request(1, "server/discover", ""),
                    "server/discover",
                    None,
                    "",
                )),
                AppWrite::server(modern::answer(
                    false,
                    &discover(1, r#"{"tools":{},"prompts":{},"resources":{}}"#),
                )),
            ],
        ),
    ];
    for i in 2..10u8 {
        let call = request(
            1,
            "tools/call",
            r#""name":"execute_sql","arguments":{"region":"eu-central1"}"#,
        );
        let mut writes = vec![
            AppWrite::client(modern::post(&call, "tools/call", Some("execute_sql"), "")),
            AppWrite::server(modern::answer(false, &modern::tool_result(1))),
        ];
        if i == 9 {
            let ask = request(2, "server/discover", "");
            writes.push(AppWrite::client(modern::post(
                &ask,
                "server/discover",
                None,
                "",
            )));
            writes.push(AppWrite::server(modern::answer(
                false,
                &discover(2, r#"{"tools":{}}"#),
            )));
        }
        talks.push((client(i), writes));
    }
    let dir = tempfile::tempdir().expect("tmp");
    let path = capture_of(dir.path(), "modern.pcap", talks);
    let whole = assert_shards_agree(&path, Limits::default());
    let mismatches = |outputs: &[Output]| {
        outputs
            .iter()
            .filter(|o| {
                matches!(
                    o,
                    Output::Telemetry(mcptap_core::model::Telemetry::HeaderMismatch { .. })
                )
            })
            .count()
    };
    assert_eq!(
        mismatches(&whole),
        8,
        "one per call without its Mcp-Param-Region"
    );
    assert!(
        alerts(&whole).iter().any(|a| a.contains("Narrowing")),
        "{:?}",
        alerts(&whole)
    );
    // Without the replicas, calls on other shards than the listing client's go unchecked.
    let alone = sharded(&path, Limits::default(), 4, false);
    assert!(mismatches(&alone.outputs) < 8);
}

/// A capture in two parts, as `run` sees it across a restart: the first part's sessions
/// (streamed, one ended by DELETE per client of a second kind) and a stateless server whose
/// tools stream; then, after the restart, the narrowed re-`initialize`s on the same sessions,
/// new sessions of the clients whose sessions ended, and a stateless answer in plain JSON.
fn restart_captures(dir: &Path) -> (std::path::PathBuf, std::path::PathBuf, Timestamp) {
    use kit::{Answer, Conversation, FULL_CLIENT_CAPS, NARROWED_CLIENT_CAPS};
    let server = Endpoint::new([10, 0, 0, 1], 8080);
    let stateless = Endpoint::new([10, 0, 0, 2], 8080);
    let who = Client {
        host: "mcp.internal:8080",
        name: "agent",
        version: "1.0",
    };
    let stateless_call = |sse: bool, id: u64| {
        let call = kit::tools_call_request(id, "search", "{}");
        vec![
            AppWrite::client(who.post(&call, None)),
            AppWrite::server(modern::answer(sse, &kit::tool_result(id, "found"))),
        ]
    };
    let mut sim = Sim::new(13).with_step(300_000);
    let mut reinit: Vec<Conversation> = Vec::new();
    let mut conns = Vec::new();
    for i in 0..16u8 {
        let mut talk = Conversation::new(&format!("s-{i}"));
        talk.initialize(FULL_CLIENT_CAPS, r#"{"streaming":true}"#, Answer::Sse)
            .initialized()
            .tools_call("one", Answer::Sse);
        conns.push(sim.connect(client(i), server, talk.take_writes()));
        reinit.push(talk);
    }
    for i in 16..24u8 {
        let mut talk = Conversation::new(&format!("p-{i}"));
        talk.initialize(FULL_CLIENT_CAPS, r#"{"streaming":true}"#, Answer::Sse)
            .initialized()
            .tools_call("one", Answer::Sse)
            .delete();
        conns.push(
            sim.connect(client(i), server, talk.take_writes())
                .server_closes(),
        );
    }
    for i in 32..36u8 {
        // Picked up midstream, then re-initialized (so of a lineage) and ended: its record
        // belongs with its client's lineage, not where its id sent its requests.
        let mut talk = Conversation::new(&format!("m-{i}"));
        talk.tools_call("midstream", Answer::Json)
            .reinitialize(FULL_CLIENT_CAPS, r#"{"streaming":true}"#, Answer::Sse)
            .delete();
        conns.push(
            sim.connect(client(i), server, talk.take_writes())
                .server_closes(),
        );
    }
    for i in 24..32u8 {
        let init = kit::initialize_request(1, FULL_CLIENT_CAPS, who.name, who.version);
        let result = kit::initialize_result(1, r#"{"streaming":true}"#, "stateless");
        let mut writes = vec![
            AppWrite::client(who.post(&init, None)),
            AppWrite::server(modern::answer(false, &result)),
        ];
        writes.extend(stateless_call(true, 2));
        conns.push(sim.connect(client(i), stateless, writes).server_closes());
    }
    sim.run(conns);
    let cut = sim.frames().len();
    let restart_at = Timestamp(sim.now());
    sim.advance(2_000_000_000);
    let mut conns = Vec::new();
    for (i, talk) in (0..16u8).zip(&mut reinit) {
        talk.reinitialize(NARROWED_CLIENT_CAPS, r#"{"streaming":false}"#, Answer::Sse)
            .initialized()
            .tools_call("two", Answer::Json)
            .delete();
        let again = Endpoint::new([10, 2, i / 50, i % 50], 50000 + u16::from(i));
        conns.push(
            sim.connect(again, server, talk.take_writes())
                .server_closes(),
        );
    }
    for i in (16..24u8).chain(32..36) {
        let mut talk = Conversation::new(&format!("q-{i}"));
        talk.initialize(NARROWED_CLIENT_CAPS, r#"{"streaming":false}"#, Answer::Json)
            .initialized()
            .tools_call("two", Answer::Json);
        let again = Endpoint::new([10, 2, i / 50, i % 50], 50000 + u16::from(i));
        conns.push(
            sim.connect(again, server, talk.take_writes())
                .server_closes(),
        );
    }
    for i in 24..32u8 {
        // Half of them handshake again, narrowed: against the lineage's first handshake.
        let mut writes = Vec::new();
        if i % 2 == 0 {
            let init = kit::initialize_request(3, NARROWED_CLIENT_CAPS, who.name, who.version);
            let result = kit::initialize_result(3, r#"{"streaming":false}"#, "stateless");
            writes.push(AppWrite::client(who.post(&init, None)));
            writes.push(AppWrite::server(modern::answer(false, &result)));
        }
        writes.extend(stateless_call(false, 4));
        let again = Endpoint::new([10, 2, i / 50, i % 50], 50000 + u16::from(i));
        conns.push(sim.connect(again, stateless, writes).server_closes());
    }
    sim.run(conns);
    let (before, after) = sim.frames().split_at(cut);
    let first = dir.join("before.pcap");
    let second = dir.join("after.pcap");
    std::fs::write(&first, mcptap_testkit::pcap_bytes(sim.linktype(), before)).expect("write");
    std::fs::write(&second, mcptap_testkit::pcap_bytes(sim.linktype(), after)).expect("write");
    (first, second, restart_at)
}

type Snapshot = mcptap::state::Snapshot;

/// One pipeline over `path`, loading `initial` first: its outputs, what it loaded, and the
/// snapshot of the end.
fn whole_from(
    path: &Path,
    initial: Option<(Snapshot, Timestamp)>,
) -> (
    Vec<Output>,
    mcptap_core::mcp::snapshot::ImportReport,
    Snapshot,
) {
    let mut pipeline = Pipeline::new(Limits::default());
    let mut out = Vec::new();
    let mut loaded = Default::default();
    if let Some((snap, now)) = initial {
        loaded = pipeline.import_state(snap, now, &mut Vec::new());
    }
    let paths = [path.to_str().expect("utf-8").to_string()];
    mcptap::capture::read_captures(&paths, &mut |p| {
        pipeline.handle_packet(Timestamp(p.ts_nanos), p.linktype, p.data, &mut out)
    })
    .expect("read");
    pipeline.finish(&mut out);
    let state = pipeline.export_state();
    (out, loaded, state)
}

/// The same through `shards` session shards on threads (the import's own outputs, telemetry
/// in shard order, left out).
fn sharded_from(
    path: &Path,
    shards: usize,
    initial: Option<(Snapshot, Timestamp)>,
) -> (
    Vec<Output>,
    mcptap_core::mcp::snapshot::ImportReport,
    Snapshot,
) {
    let paths = [path.to_str().expect("utf-8").to_string()];
    let mut out = Vec::new();
    let (report, (loaded, _), state) = mcptap::sharded::replay_sharded_from(
        &paths,
        Limits::default(),
        Analysis::default(),
        (0, shards),
        initial,
        &mut |o| out.push(o.clone()),
    )
    .expect("threads");
    report.expect("read");
    (out, loaded, state)
}

/// A snapshot as comparable text: entries in key order, ended sessions' records sorted.
fn snapshot_text(snap: &Snapshot) -> (String, Vec<String>) {
    let sessions = serde_json::to_string(&snap.sessions).expect("json");
    let mut ended: Vec<String> = snap
        .ended
        .iter()
        .map(|e| serde_json::to_string(e).expect("json"))
        .collect();
    ended.sort();
    (sessions, ended)
}

/// `run` with session shards keeps its state across a restart as one worker does: a
/// snapshot written by N shards (or one worker) and loaded by M shards (or one worker) gives
/// the second part one worker's events, in its order, and the same snapshot at the end. The
/// incident's re-`initialize` on the same session alerts against the baseline from before the
/// restart, a client's next session names its predecessor, and a stateless endpoint's mode
/// is known to every shard.
#[test]
fn a_snapshot_of_session_shards_continues_in_any_shard_count() {
    let dir = tempfile::tempdir().expect("tmp");
    let (first, second, restart_at) = restart_captures(dir.path());
    let (_, _, state) = whole_from(&first, None);
    assert!(state.sessions.len() >= 24, "{}", state.sessions.len());
    let (want, want_loaded, want_end) = whole_from(&second, Some((state.clone(), restart_at)));
    let kinds = alerts(&want);
    assert!(
        kinds.iter().filter(|k| k.contains("Narrowing")).count() >= 16,
        "{kinds:?}"
    );
    assert!(kinds.iter().any(|k| k.contains("Divergence")), "{kinds:?}");
    let predecessors = want
        .iter()
        .filter(|o| {
            matches!(o, Output::Event(Event::Handshake(h)) if h.predecessor_session_id.is_some())
        })
        .count();
    assert_eq!(
        predecessors, 12,
        "each q- session names its p- or m- predecessor"
    );
    let lineage_diffs = want
        .iter()
        .filter(|o| {
            matches!(o, Output::Event(Event::Handshake(h)) if h.session_id.is_none() && h.diff.is_some())
        })
        .count();
    assert_eq!(
        lineage_diffs, 4,
        "each stateless re-initialize against its first"
    );
    for (before, after) in [(0, 3), (3, 2), (2, 4), (4, 1), (3, 0)] {
        let what = format!("{before} shards, then {after}");
        let snap = match before {
            0 => state.clone(),
            n => {
                let (_, _, s) = sharded_from(&first, n, None);
                assert_eq!(
                    snapshot_text(&s),
                    snapshot_text(&state),
                    "{what}: first export"
                );
                s
            }
        };
        let (got, loaded, end) = match after {
            0 => whole_from(&second, Some((snap, restart_at))),
            n => sharded_from(&second, n, Some((snap, restart_at))),
        };
        assert_eq!(loaded, want_loaded, "{what}: loaded");
        assert_same(&got, &want, &what);
        assert_eq!(snapshot_text(&end), snapshot_text(&want_end), "{what}: end");
    }
    // A snapshot of an older version says no routes: sessions go by their ids, lineages by
    // their clients' addresses, ended sessions' records to every shard.
    let mut old = state.clone();
    old.sessions.iter_mut().for_each(|e| e.route = None);
    old.ended.iter_mut().for_each(|e| e.route = None);
    let (got, _, _) = sharded_from(&second, 3, Some((old, restart_at)));
    assert_same(&got, &want, "a snapshot without routes, 3 shards");
    // A version 2 file: its route buckets came from SHA-256, written as `route` and
    // `lineage_route`; here they point to the other half of the buckets. Loading it reads
    // them as absent, so records go where requests do.
    let mut v2 = serde_json::to_value(&state).expect("json");
    v2["v"] = mcptap_core::mcp::snapshot::SNAPSHOT_VERSION_2.into();
    let mut moved = 0;
    for (list, names) in [
        (
            "sessions",
            &[("bucket", "route"), ("lineage_bucket", "lineage_route")][..],
        ),
        ("ended", &[("bucket", "route")][..]),
    ] {
        for entry in v2[list].as_array_mut().expect("entries") {
            let entry = entry.as_object_mut().expect("entry");
            for (new, old) in names {
                if let Some(b) = entry.remove(*new).and_then(|b| b.as_u64()) {
                    entry.insert(old.to_string(), (b ^ 0x8000).into());
                    moved += 1;
                }
            }
        }
    }
    assert!(moved >= 24, "{moved} buckets");
    let file = dir.path().join("version-2.json");
    std::fs::write(&file, v2.to_string()).expect("write");
    let loaded = mcptap::state::load(&file)
        .expect("load")
        .expect("a snapshot");
    assert_eq!(loaded.v, mcptap_core::mcp::snapshot::SNAPSHOT_VERSION);
    assert!(
        loaded
            .sessions
            .iter()
            .all(|e| e.route.is_none() && e.lineage_route.is_none())
    );
    assert!(loaded.ended.iter().all(|e| e.route.is_none()));
    let (got, _, _) = sharded_from(&second, 3, Some((loaded, restart_at)));
    assert_same(&got, &want, "a version 2 snapshot, 3 shards");
}
