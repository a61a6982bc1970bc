//! The session layer sharded by client (`docs/sharding.md`): which shard each staged input
//! goes to, and in what order the shards' outputs of an input they all take (a sweep, the end
//! of the input) make one worker's. The threads, and the waiting that orders the shards'
//! server-scoped accesses, are the adapter's.

use std::collections::VecDeque;
use std::hash::{BuildHasher, Hash};
use std::net::{IpAddr, SocketAddr};
use std::ops::Range;

use crate::table_hash::HashMap;

use crate::http::HttpEvent;
use crate::mcp::GroupKey;
use crate::mcp::headers;
use crate::mcp::identity::Identities;
use crate::mcp::session::{Scope, is_valid_session_id, scope_of_key};
use crate::mcp::snapshot::{SessionEntry, StateSnapshot};
use crate::model::{Limit, Output, Telemetry, Timestamp};
use crate::pipeline::{Limits, SessionInput};

/// Where an input goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// To one shard.
    One(usize),
    /// To every shard; every shard's outputs count, merged by [`broadcast_order`].
    Every,
    /// To every shard; the first shard's outputs stand for all (each makes the same
    /// telemetry, and nothing else).
    EveryOnce,
}

/// Routes each session-layer input to its shard:
/// - a request that names a session goes to the shard whose answer gave the session its id
///   (one worker keys sessions by id alone, and behind a pool of SNAT addresses one session
///   comes from several peers); a session id not learned goes by (server, id);
/// - any other request goes by (server, client identity), where one worker keeps the
///   client's lineage, stateless label and modern declarations;
/// - the rest of an exchange goes where its request went;
/// - connection ends and PROXY headers go to every shard, as do sweeps and the end.
#[derive(Debug)]
pub struct ShardRouter {
    shards: usize,
    identities: Identities,
    /// Per connection: its latest exchanges' shards. HTTP/1.1 answers in order, so only the
    /// latest `max_pending_requests` (and a few) can still have events.
    exchanges: HashMap<u64, VecDeque<(u64, u32)>>,
    exchanges_per_flow: usize,
    /// Sessions' shards, learned from their answers' `Mcp-Session-Id`, and when each was
    /// last used; at `max_sessions`, the least recently used quarter goes ([`Self::make_room`]).
    sessions: HashMap<(SocketAddr, Box<str>), LearnedRoute>,
    max_sessions: usize,
    /// What the session layer takes for a session id, and how long a loaded one lasts.
    max_session_id_len: usize,
    idle_timeout_ns: i64,
    /// Connections that opened with a PROXY header: the client it named.
    proxied: HashMap<u64, IpAddr>,
    max_proxied: usize,
}

/// A session's shard and the capture time of the last request or answer head that named it.
#[derive(Debug, Clone, Copy)]
struct LearnedRoute {
    shard: u32,
    seen_ns: i64,
}

/// Exchanges remembered per connection beyond the pipelining depth.
const EXCHANGE_SLACK: usize = 4;

fn shard_of(shards: usize, what: impl Hash) -> usize {
    let hash = foldhash::fast::FixedState::with_seed(0x5348_4152_4453).hash_one(what);
    (hash % shards.max(1) as u64) as usize
}

/// The shard of a route bucket ([`Identities::route_bucket`]): each shard takes a run of
/// buckets.
pub fn shard_of_bucket(shards: usize, bucket: u16) -> usize {
    (usize::from(bucket) * shards.max(1)) >> 16
}

impl ShardRouter {
    /// A router over `shards` shards; `identities` must be the pipeline's, so that a client
    /// is the one the session layer sees.
    pub fn new(shards: usize, limits: &Limits, identities: Identities) -> ShardRouter {
        ShardRouter {
            shards: shards.max(1),
            identities,
            exchanges: HashMap::default(),
            exchanges_per_flow: limits.http.max_pending_requests + EXCHANGE_SLACK,
            sessions: HashMap::default(),
            max_sessions: limits.session.max_sessions.max(1),
            max_session_id_len: limits.session.max_session_id_len,
            idle_timeout_ns: limits.session.session_idle_timeout_ns,
            proxied: HashMap::default(),
            // The session layer's bound: past it, both read the peer as the client.
            max_proxied: crate::mcp::MAX_PROXIED_FLOWS,
        }
    }

    pub fn shards(&self) -> usize {
        self.shards
    }

    /// Where `input` goes. Routes forgotten at a bound are counted in `out`
    /// (`limit="shard_routes"`).
    pub fn route(&mut self, input: &SessionInput, out: &mut Vec<Output>) -> Route {
        let (ctx, ts, event) = match input {
            SessionInput::Http { ctx, ts, event } => (ctx, *ts, event),
            SessionInput::ProxyHeader { flow, source, .. } => {
                self.proxied_source(*flow, *source, out);
                return Route::EveryOnce;
            }
            SessionInput::FlowClosed { flow } => {
                self.exchanges.remove(flow);
                self.proxied.remove(flow);
                return Route::EveryOnce;
            }
            SessionInput::Sweep { .. } | SessionInput::Finish { .. } => return Route::Every,
        };
        if self.shards == 1 {
            return Route::One(0);
        }
        let shard = match event {
            HttpEvent::Request { exchange, head, .. } => {
                // An id the session layer refuses names no session: the request is the
                // client's, as there.
                let sid = headers::request_session_id(head)
                    .filter(|sid| is_valid_session_id(sid, self.max_session_id_len));
                let shard = match sid {
                    Some(sid) => self
                        .sessions
                        .get_mut(&(ctx.server, Box::from(sid)))
                        .map(|learned| {
                            learned.seen_ns = learned.seen_ns.max(ts.0);
                            learned.shard as usize
                        })
                        .unwrap_or_else(|| {
                            shard_of_bucket(
                                self.shards,
                                self.identities.route_bucket(ctx.server, sid),
                            )
                        }),
                    None => {
                        let proxied = self.proxied.get(&ctx.flow).copied();
                        let client =
                            self.identities
                                .client_identity_via(ctx.client.ip(), proxied, head);
                        shard_of_bucket(
                            self.shards,
                            self.identities.route_bucket(ctx.server, &client),
                        )
                    }
                };
                let latest = self.exchanges.entry(ctx.flow).or_default();
                if latest.len() >= self.exchanges_per_flow {
                    latest.pop_front();
                }
                latest.push_back((*exchange, shard as u32));
                shard
            }
            HttpEvent::ResponseHead { exchange, head } => {
                let shard = self.exchange(ctx.flow, *exchange);
                // An id the session layer refuses names no session: nothing to learn (and a
                // forged answer's 64 KiB id would hold a route that is never used).
                if let Some(sid) = headers::response_session_id(head)
                    .filter(|sid| is_valid_session_id(sid, self.max_session_id_len))
                {
                    self.learn_session(ctx.server, sid, shard, ts.0, out);
                }
                shard
            }
            HttpEvent::ResponseJson { exchange, .. }
            | HttpEvent::ResponseSse { exchange, .. }
            | HttpEvent::ResponseEnd { exchange, .. }
            | HttpEvent::NoResponse { exchange, .. }
            | HttpEvent::ClientGone { exchange }
            | HttpEvent::Abandoned { exchange, .. }
            | HttpEvent::Anomaly {
                exchange: Some(exchange),
                ..
            }
            | HttpEvent::Undecodable {
                exchange: Some(exchange),
                ..
            } => self.exchange(ctx.flow, *exchange),
            HttpEvent::ProxyHeader { source, .. } => {
                self.proxied_source(ctx.flow, *source, out);
                return Route::EveryOnce;
            }
            // Telemetry alone.
            _ => shard_of(self.shards, ctx.flow),
        };
        Route::One(shard)
    }

    /// Where the records of a snapshot loaded at `now` go, as [`SnapshotShares`]; the router
    /// learns the loaded sessions' shards (those the load keeps), so that their requests
    /// follow them. A record that does not say its route (a snapshot of an older version) goes
    /// where one without a learned route would: a session by its id; a lineage entry or an
    /// ended session's record, whose client it does not name, to every shard.
    pub fn split_snapshot<D>(
        &mut self,
        snap: StateSnapshot<D>,
        now: Timestamp,
        out: &mut Vec<Output>,
    ) -> SnapshotShares<D> {
        let mut own: Vec<StateSnapshot<D>> =
            (0..self.shards).map(|_| StateSnapshot::default()).collect();
        let mut every = StateSnapshot::default();
        for e in snap.sessions {
            let scope = scope_of_key(&e.key);
            let bucket = match (scope, e.route) {
                (Scope::Server | Scope::Endpoint, _) | (Scope::Lineage, None) => {
                    every.sessions.push(e);
                    continue;
                }
                (_, Some(bucket)) => bucket,
                (Scope::Session, None) => self.identities.route_bucket(e.server, &e.key),
            };
            let shard = shard_of_bucket(self.shards, bucket);
            let kept = now.0.saturating_sub(e.last_seen_ns) <= self.idle_timeout_ns
                && is_valid_session_id(&e.key, self.max_session_id_len);
            if scope == Scope::Session
                && kept
                && shard
                    != shard_of_bucket(self.shards, self.identities.route_bucket(e.server, &e.key))
            {
                self.learn_session(e.server, &e.key, shard, e.last_seen_ns, out);
            }
            if let Some(share) = own.get_mut(shard) {
                share.sessions.push(e);
            }
        }
        for e in snap.ended {
            match e
                .route
                .and_then(|b| own.get_mut(shard_of_bucket(self.shards, b)))
            {
                Some(share) => share.ended.push(e),
                None => every.ended.push(e),
            }
        }
        SnapshotShares { own, every }
    }

    fn exchange(&self, flow: u64, exchange: u64) -> usize {
        self.exchanges
            .get(&flow)
            .and_then(|latest| latest.iter().rev().find(|(e, _)| *e == exchange))
            .map(|&(_, s)| s as usize)
            .unwrap_or_else(|| shard_of(self.shards, flow))
    }

    fn learn_session(
        &mut self,
        server: SocketAddr,
        sid: &str,
        shard: usize,
        seen_ns: i64,
        out: &mut Vec<Output>,
    ) {
        let key = (server, Box::from(sid));
        let learned = LearnedRoute {
            shard: shard as u32,
            seen_ns,
        };
        if let Some(known) = self.sessions.get_mut(&key) {
            known.shard = learned.shard;
            known.seen_ns = known.seen_ns.max(seen_ns);
            return;
        }
        if self.sessions.len() >= self.max_sessions {
            self.make_room(out);
        }
        self.sessions.insert(key, learned);
    }

    /// At `max_sessions` routes (as many sessions as one worker tracks at most): the least
    /// recently used quarter goes, so that the sessions in use keep theirs (used: named by a
    /// request or an answer's head; a session kept alive only by a long event stream looks
    /// older than it is, and may lose its route first). A session whose
    /// route went continues by (server, id), perhaps on another shard: counted
    /// (`limit="shard_routes"`). A quarter at a time, so that a flood of new ids costs O(1)
    /// per id, amortised; ties go by key, so that replays stay deterministic.
    fn make_room(&mut self, out: &mut Vec<Output>) {
        let len = self.sessions.len();
        if len == 0 {
            return;
        }
        let drop = (len / 4).max(1);
        let mut by_age: Vec<(i64, &(SocketAddr, Box<str>))> = self
            .sessions
            .iter()
            .map(|(k, learned)| (learned.seen_ns, k))
            .collect();
        by_age.select_nth_unstable(drop - 1);
        let oldest: Vec<(SocketAddr, Box<str>)> = by_age
            .into_iter()
            .take(drop)
            .map(|(_, k)| k.clone())
            .collect();
        for k in &oldest {
            self.sessions.remove(k);
        }
        out.push(Output::Telemetry(Telemetry::LimitHit {
            limit: Limit::ShardRoutes,
        }));
    }

    fn proxied_source(&mut self, flow: u64, source: Option<SocketAddr>, out: &mut Vec<Output>) {
        let Some(source) = source else { return };
        if self.proxied.len() < self.max_proxied || self.proxied.contains_key(&flow) {
            self.proxied.insert(flow, source.ip());
        } else {
            out.push(Output::Telemetry(Telemetry::LimitHit {
                limit: Limit::ShardRoutes,
            }));
        }
    }
}

/// A snapshot split over session shards ([`ShardRouter::split_snapshot`]): each shard's own
/// records, and those every shard loads (server-scoped entries, which each shard keeps a
/// replica of, and ended sessions' records that do not say their route).
#[derive(Debug)]
pub struct SnapshotShares<D> {
    pub own: Vec<StateSnapshot<D>>,
    pub every: StateSnapshot<D>,
}

/// The shards' exports as one worker's: each entry once, in key order, and ended sessions'
/// records once, oldest first. A server-scoped entry is the latest version the shards handed
/// out (`published`; every write hands it out), seen last when any shard's copy was (a read
/// does not hand it out); one that none handed out, and an entry two shards hold, is the copy
/// seen last.
pub fn merge_exports<D>(
    parts: Vec<StateSnapshot<D>>,
    published: Vec<SessionEntry<D>>,
) -> StateSnapshot<D> {
    let mut merged = StateSnapshot::default();
    for part in parts {
        merged.sessions.extend(part.sessions);
        merged.ended.extend(part.ended);
    }
    let by_key =
        |a: &SessionEntry<D>, b: &SessionEntry<D>| (a.server, &a.key).cmp(&(b.server, &b.key));
    // The latest first within a key, so that dedup keeps it.
    merged.sessions.sort_by(|a, b| {
        by_key(a, b).then((b.last_seen_ns, b.requests).cmp(&(a.last_seen_ns, a.requests)))
    });
    merged
        .sessions
        .dedup_by(|later, first| later.server == first.server && later.key == first.key);
    let mut published = published;
    published.sort_by(by_key);
    let mut merged_sessions = Vec::with_capacity(merged.sessions.len());
    let mut latest = published.into_iter().peekable();
    for e in merged.sessions {
        while latest.next_if(|p| by_key(p, &e).is_lt()).is_some() {}
        match latest.next_if(|p| by_key(p, &e).is_eq()) {
            Some(mut p) => {
                p.last_seen_ns = p.last_seen_ns.max(e.last_seen_ns);
                merged_sessions.push(p);
            }
            None => merged_sessions.push(e),
        }
    }
    merged.sessions = merged_sessions;
    merged.ended.sort_by(|a, b| {
        (a.ts_ns, a.server, &a.lineage_id, &a.session_id).cmp(&(
            b.ts_ns,
            b.server,
            &b.lineage_id,
            &b.session_id,
        ))
    });
    merged.ended.dedup_by(|b, a| {
        a.ts_ns == b.ts_ns
            && a.server == b.server
            && a.lineage_id == b.lineage_id
            && a.session_id == b.session_id
    });
    merged
}

/// One shard's outputs of an input every shard took: their index range in the shard's
/// outputs, and the units' marks in it (see [`crate::pipeline::SessionStage::take_group_marks`]),
/// indices in the same outputs, in order.
#[derive(Debug, Clone)]
pub struct BroadcastPart<'a> {
    pub outputs: Range<usize>,
    pub marks: &'a [(usize, GroupKey)],
}

/// The order in which the shards' outputs of one sweep or end of input make one worker's:
/// (shard, index range) pairs. Outputs before a shard's first mark come first, in shard
/// order; then every unit, by key (one worker makes them in key order, each shard its own
/// sessions' units in that order too).
pub fn broadcast_order(parts: &[BroadcastPart<'_>]) -> Vec<(usize, Range<usize>)> {
    let mut units: Vec<(Option<&GroupKey>, usize, Range<usize>)> = Vec::new();
    for (shard, part) in parts.iter().enumerate() {
        let mut start = part.outputs.start;
        let mut key = None;
        for (at, next) in part.marks {
            let at = (*at).clamp(start, part.outputs.end);
            units.push((key, shard, start..at));
            start = at;
            key = Some(next);
        }
        units.push((key, shard, start..part.outputs.end));
    }
    // Stable: equal keys (a server-scoped entry two shards hold, which ends without an
    // output) stay in shard order.
    units.sort_by(|a, b| a.0.cmp(&b.0));
    units
        .into_iter()
        .filter(|(_, _, r)| !r.is_empty())
        .map(|(_, shard, r)| (shard, r))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u8) -> crate::mcp::session::SessionKey {
        ("127.0.0.1:80".parse().expect("addr"), format!("s{n}"))
    }

    #[test]
    fn broadcast_units_merge_by_key_after_the_unmarked_outputs() {
        let a = [
            (1, GroupKey::Idle(key(1))),
            (2, GroupKey::Idle(key(4))),
            (4, GroupKey::Parked(key(0))),
        ];
        let b = [(10, GroupKey::Idle(key(2))), (12, GroupKey::Idle(key(3)))];
        let order = broadcast_order(&[
            BroadcastPart {
                outputs: 0..5,
                marks: &a,
            },
            BroadcastPart {
                outputs: 10..14,
                marks: &b,
            },
        ]);
        assert_eq!(
            order,
            vec![
                (0, 0..1),   // before shard 0's first mark
                (0, 1..2),   // idle s1
                (1, 10..12), // idle s2
                (1, 12..14), // idle s3
                (0, 2..4),   // idle s4
                (0, 4..5),   // parked s0: after every idle end
            ]
        );
    }

    #[test]
    fn a_session_named_by_its_id_goes_where_its_answer_gave_it_the_id() {
        use crate::http::RequestHead;
        use crate::mcp::FlowCtx;
        use crate::mcp::headers::{request_head, response_head};
        use crate::model::Timestamp;
        let limits = Limits::default();
        let mut router = ShardRouter::new(4, &limits, Identities::default());
        let server: SocketAddr = "127.0.0.1:80".parse().expect("addr");
        let mut out = Vec::new();
        let http = |flow: u64, client: &str, event: HttpEvent| SessionInput::Http {
            ctx: FlowCtx {
                flow,
                server,
                client: client.parse().expect("addr"),
            },
            ts: Timestamp(0),
            event,
        };
        let request = |head: RequestHead| HttpEvent::Request {
            exchange: 0,
            head: Box::new(head),
            body: Vec::new(),
        };
        let init = http(
            1,
            "127.0.0.9:5000",
            request(request_head("POST", "/mcp", None, None, None, None)),
        );
        let Route::One(first) = router.route(&init, &mut out) else {
            panic!("a request goes to one shard");
        };
        let answer = response_head(200, Some("application/json"), Some("abc"));
        let head = http(
            1,
            "127.0.0.9:5000",
            HttpEvent::ResponseHead {
                exchange: 0,
                head: Box::new(answer),
            },
        );
        assert_eq!(router.route(&head, &mut out), Route::One(first));
        // The session's next request, from other peers (a SNAT pool): the same shard.
        for peer in 1..40 {
            let again = http(
                1 + peer,
                &format!("127.0.1.{peer}:6000"),
                request(request_head("POST", "/mcp", None, None, Some("abc"), None)),
            );
            assert_eq!(router.route(&again, &mut out), Route::One(first));
        }
        assert!(out.is_empty());
        // An answer's id the session layer refuses is not learned.
        let refused = "x".repeat(limits.session.max_session_id_len + 1);
        let forged = http(
            1,
            "127.0.0.9:5000",
            HttpEvent::ResponseHead {
                exchange: 0,
                head: Box::new(response_head(200, Some("application/json"), Some(&refused))),
            },
        );
        router.route(&forged, &mut out);
        assert_eq!(router.sessions.len(), 1);
        let sweep = SessionInput::Sweep { now: Timestamp(0) };
        assert_eq!(router.route(&sweep, &mut out), Route::Every);
        let closed = SessionInput::FlowClosed { flow: 1 };
        assert_eq!(router.route(&closed, &mut out), Route::EveryOnce);
        assert!(!router.exchanges.contains_key(&1));
    }

    #[test]
    fn at_the_route_bound_the_least_recently_used_routes_go_not_every_one() {
        use crate::http::RequestHead;
        use crate::mcp::FlowCtx;
        use crate::mcp::headers::{request_head, response_head};
        use crate::model::Timestamp;
        let mut limits = Limits::default();
        limits.session.max_sessions = 8;
        let ids = Identities::default();
        let mut router = ShardRouter::new(4, &limits, ids.clone());
        let server: SocketAddr = "127.0.0.1:80".parse().expect("addr");
        let mut out = Vec::new();
        let http = |flow: u64, ts: i64, event: HttpEvent| SessionInput::Http {
            ctx: FlowCtx {
                flow,
                server,
                client: "127.0.0.9:5000".parse().expect("addr"),
            },
            ts: Timestamp(ts),
            event,
        };
        let request = |head: RequestHead| HttpEvent::Request {
            exchange: 0,
            head: Box::new(head),
            body: Vec::new(),
        };
        let init = request(request_head("POST", "/mcp", None, None, None, None));
        let Route::One(home) = router.route(&http(1, 0, init.clone()), &mut out) else {
            panic!("a request goes to one shard");
        };
        // Ids whose own bucket lies elsewhere: only a learned route brings them home.
        let mut away = (0..)
            .map(|n| format!("sid-{n}"))
            .filter(|sid| shard_of_bucket(4, ids.route_bucket(server, sid)) != home);
        let mut learn = |router: &mut ShardRouter, flow: u64, ts: i64, out: &mut Vec<Output>| {
            let sid = away.next().expect("an id");
            router.route(&http(flow, ts, init.clone()), out);
            let answer = response_head(200, Some("application/json"), Some(&sid));
            let head = HttpEvent::ResponseHead {
                exchange: 0,
                head: Box::new(answer),
            };
            router.route(&http(flow, ts, head), out);
            sid
        };
        let named = |sid: &str| request(request_head("POST", "/mcp", None, None, Some(sid), None));
        let busy = learn(&mut router, 10, 0, &mut out);
        let idle = learn(&mut router, 11, 1, &mut out);
        for n in 0..40i64 {
            // The busy session is used between the new ones; the idle one never again.
            assert_eq!(
                router.route(&http(100 + n as u64, 10 + 2 * n, named(&busy)), &mut out),
                Route::One(home)
            );
            learn(&mut router, 200 + n as u64, 11 + 2 * n, &mut out);
            assert!(router.sessions.len() <= 8);
        }
        assert_eq!(
            router.route(&http(999, 1_000, named(&busy)), &mut out),
            Route::One(home),
            "a session in use keeps its route"
        );
        assert_ne!(
            router.route(&http(998, 1_000, named(&idle)), &mut out),
            Route::One(home),
            "the least recently used went"
        );
        let rounds = out
            .iter()
            .filter(|o| {
                matches!(
                    o,
                    Output::Telemetry(Telemetry::LimitHit {
                        limit: Limit::ShardRoutes
                    })
                )
            })
            .count();
        // 42 routes through 8 places, a quarter (2) freed a round.
        assert_eq!(rounds, 17, "each round counted once");
    }
}
