//! Exchanges as per-flow transactions (Suricata style): each connection keeps its open
//! exchanges, bounded, and closing a connection touches only its own.

use super::session::ExchangeKey;
use crate::http::{RequestHead, ResponseHead};
use crate::jsonrpc::Id;
use crate::model::Timestamp;
use crate::table_hash::HashMap;
use std::collections::VecDeque;
use std::net::SocketAddr;

/// A JSON-RPC request carried by one HTTP request.
#[derive(Debug)]
pub struct PendingRequest {
    pub id: Id,
    pub method: String,
    pub tool: Option<String>,
    /// The params ask for progress notifications (`_meta.progressToken`).
    pub progress: bool,
    /// `initialize` params as their JSON text (a `Value` tree costs ~9x the text), parsed
    /// when the handshake is answered.
    pub init_params: Option<Box<str>>,
    pub answered: bool,
    /// What the params declare and name (modern requests, and requests whose headers mirror
    /// body fields).
    pub facts: Option<Box<super::modern::RequestFacts>>,
    /// Headers that disagreed with the body (counted at the request; alerted if accepted).
    pub findings: Vec<super::modern::HeaderFinding>,
    /// The client cancelled it (`notifications/cancelled`) before it was answered.
    pub cancelled: bool,
}

/// The JSON-RPC requests of one HTTP request (one, or a batch), with the unanswered ones
/// indexed by id in a batch: matching each answer of a 64k batch by a linear search would be
/// quadratic.
#[derive(Debug, Default)]
pub struct Requests {
    list: Vec<PendingRequest>,
    /// Unanswered requests by id, in request order per id (batches only).
    open: Option<HashMap<Id, VecDeque<usize>>>,
    open_count: usize,
}

/// Batches longer than this get an id index.
const INDEX_FROM: usize = 8;

impl Requests {
    pub fn new(list: Vec<PendingRequest>) -> Self {
        let open_count = list.iter().filter(|r| !r.answered).count();
        let open = (list.len() > INDEX_FROM).then(|| {
            let mut index: HashMap<Id, VecDeque<usize>> = HashMap::default();
            for (i, r) in list.iter().enumerate().filter(|(_, r)| !r.answered) {
                index.entry(r.id.clone()).or_default().push_back(i);
            }
            index
        });
        Requests {
            list,
            open,
            open_count,
        }
    }

    pub fn len(&self) -> usize {
        self.list.len()
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = &PendingRequest> {
        self.list.iter()
    }

    /// Marks the first unanswered request with `id` cancelled; false if there is none.
    pub fn cancel(&mut self, id: &Id) -> bool {
        let Some(r) = self.find_open(id).and_then(|at| self.list.get_mut(at)) else {
            return false;
        };
        r.cancelled = true;
        true
    }

    /// The first unanswered request with `id`.
    pub fn find_open(&self, id: &Id) -> Option<usize> {
        match &self.open {
            Some(index) => index.get(id).and_then(|at| at.front().copied()),
            None => self.list.iter().position(|r| &r.id == id && !r.answered),
        }
    }

    /// Whether a request is still unanswered. O(1): asked after every answer, a scan of the
    /// list would make answering a batch in order quadratic.
    pub fn has_open(&self) -> bool {
        self.open_count > 0
    }

    /// The only unanswered request, if exactly one is left.
    pub fn sole_open(&self) -> Option<&PendingRequest> {
        if self.open_count != 1 {
            return None;
        }
        self.list.iter().find(|r| !r.answered)
    }

    /// Marks request `at` answered and hands it out.
    pub fn answer(&mut self, at: usize) -> Option<&mut PendingRequest> {
        let r = self.list.get_mut(at)?;
        if !r.answered {
            r.answered = true;
            self.open_count -= 1;
            if let Some(index) = self.open.as_mut()
                && let Some(queue) = index.get_mut(&r.id)
            {
                // Answers come for the first open request of an id: O(1) then.
                if queue.front() == Some(&at) {
                    queue.pop_front();
                } else {
                    queue.retain(|i| *i != at);
                }
                if queue.is_empty() {
                    index.remove(&r.id);
                }
            }
        }
        Some(r)
    }
}

/// What an SSE answer carried so far.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct StreamContent {
    /// Dispatched events, comments and data-less blocks.
    pub items: u32,
    /// JSON-RPC notifications or requests seen.
    pub messages: u32,
    /// An event carried an `id`: the client may resume the stream with `Last-Event-ID`.
    pub event_id_seen: bool,
    /// The last `retry` the stream asked for, in milliseconds.
    pub retry_ms: Option<u64>,
}

/// How one answer to a request was delivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnswerShape {
    Json,
    /// An SSE stream whose first JSON-RPC message is the result.
    SseResultOnly,
    /// An SSE stream in which notifications or requests came before the result.
    SseAfterMessages,
}

impl AnswerShape {
    pub fn media_type(self) -> &'static str {
        match self {
            AnswerShape::Json => "application/json",
            AnswerShape::SseResultOnly | AnswerShape::SseAfterMessages => "text/event-stream",
        }
    }
}

/// One HTTP request/response pair that may carry MCP, while it is open.
#[derive(Debug)]
pub struct ExchangeState {
    /// The flow it came on (an HTTP+SSE POST outlives its place in the flow's queue).
    pub flow: u64,
    /// The request's number on its connection.
    pub number: u64,
    pub ts: Timestamp,
    pub client: SocketAddr,
    pub server: SocketAddr,
    /// Boxed as the HTTP layer hands it over: exchanges move between queues whole.
    pub head: Box<RequestHead>,
    /// Session named by the request header, or learned from the response header.
    pub session_id: Option<String>,
    pub requests: Requests,
    pub response: Option<Box<ResponseHead>>,
    pub stream: StreamContent,
    pub era: crate::model::Era,
    /// The lineage of the exchange's client (without a session id, or from its session).
    pub lineage_id: Option<Box<str>>,
    /// The route bucket of the exchange's client (with its lineage) or of its session.
    pub route: Option<u16>,
    /// A 404 on a named session: the session ends once this exchange is reported.
    pub ends_session: bool,
    /// The client closed or reset its connection before the response ended: it stopped
    /// waiting (the 2026-07-28 revision: closing the stream cancels the request).
    pub client_gone: bool,
    /// Client answers to server requests this POST carried, reported with its status.
    pub server_answers: Vec<Box<crate::model::Exchange>>,
    /// What [`Transactions`] charged for it when it opened; once parked (HTTP+SSE), what its
    /// session is charged for it.
    pub charged: usize,
    /// Its requests are in [`Transactions`]' index of sessionless requests (decided when it
    /// opened: a response may give it a session id later).
    pub indexed: bool,
}

/// The request side of an exchange, as the handshake logic needs it.
#[derive(Debug, Clone)]
pub struct Origin {
    pub flow: u64,
    pub client: SocketAddr,
    pub server: SocketAddr,
    pub head: Box<RequestHead>,
    pub session_id: Option<String>,
    pub era: crate::model::Era,
    pub lineage_id: Option<Box<str>>,
    pub route: Option<u16>,
}

impl ExchangeState {
    /// Bytes this open exchange holds, as charged against the memory budget: the struct, the
    /// request head's strings and the requests (ids, methods, tools, `initialize` params).
    pub fn cost(&self) -> usize {
        let head = &self.head;
        let head_bytes = head.heap_bytes();
        let request_bytes: usize = self
            .requests
            .iter()
            .map(|r| {
                std::mem::size_of::<PendingRequest>()
                    + r.id.0.len()
                    + r.method.len()
                    + r.tool.as_ref().map_or(0, String::len)
                    + r.init_params.as_ref().map_or(0, |p| p.len())
                    + r.facts.as_ref().map_or(0, |f| {
                        std::mem::size_of::<super::modern::RequestFacts>()
                            // Shared with other requests and a cache, charged whole here.
                            + f.declaration.as_ref().map_or(0, |d| {
                                std::mem::size_of::<super::modern::Declaration>()
                                    + 16
                                    + d.heap_bytes()
                            })
                            + f.name_or_uri.as_ref().map_or(0, String::len)
                            + f.arguments.as_ref().map_or(0, |a| a.len())
                    })
                    + r.findings.len() * (std::mem::size_of::<super::modern::HeaderFinding>() + 64)
            })
            .sum();
        std::mem::size_of::<ExchangeState>()
            + head_bytes
            + request_bytes
            + self.lineage_id.as_ref().map_or(0, |l| l.len())
            + self.server_answers.len() * (std::mem::size_of::<crate::model::Exchange>() + 128)
            + usize::from(self.indexed) * self.requests.len() * SESSIONLESS_ENTRY_BYTES
    }

    /// Whether its requests go in the index of sessionless requests: a legacy exchange of a
    /// known lineage without a session id, other than an `initialize` (which a client must
    /// not cancel, and which opens most sessions).
    fn indexable(&self) -> bool {
        self.era == crate::model::Era::Legacy
            && self.session_id.is_none()
            && self.lineage_id.is_some()
            && self.requests.iter().any(|r| r.method != "initialize")
    }

    pub fn origin(&self) -> Origin {
        Origin {
            flow: self.flow,
            client: self.client,
            server: self.server,
            head: self.head.clone(),
            session_id: self.session_id.clone(),
            era: self.era,
            lineage_id: self.lineage_id.clone(),
            route: self.route,
        }
    }
}

/// A flow's queue, charged while the flow lasts: its table slot (a free one beside it) and the
/// smallest buffer of a queue that has held an exchange.
const QUEUE_BYTES: usize = 2 * std::mem::size_of::<(u64, VecDeque<Box<ExchangeState>>)>()
    + KEPT_QUEUE_CAPACITY * std::mem::size_of::<usize>();

/// The index of sessionless requests is keyed by digests already keyed and mixed: its table
/// takes them as they are instead of hashing them again.
#[derive(Debug, Clone, Default)]
struct Digested;

impl std::hash::BuildHasher for Digested {
    type Hasher = DigestAsIs;
    fn build_hasher(&self) -> DigestAsIs {
        DigestAsIs(0)
    }
}

#[derive(Debug)]
struct DigestAsIs(u64);

impl std::hash::Hasher for DigestAsIs {
    fn write(&mut self, bytes: &[u8]) {
        // Only u64 digests are written; anything else is folded in, not dropped.
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

/// An index entry of a sessionless request (digest, key) with its table's slack.
const SESSIONLESS_ENTRY_BYTES: usize = 2 * std::mem::size_of::<(u64, ExchangeKey)>() + 2;

/// Most exchanges an empty queue keeps room for (a queue's smallest buffer).
const KEPT_QUEUE_CAPACITY: usize = 4;

/// Open exchanges, per flow. Requests are numbered in order on a connection and answered in
/// order, so each flow's queue stays sorted by number.
#[derive(Debug, Default)]
pub struct Transactions {
    /// Boxed: an exchange is larger than a cache line several times over, and moves in and
    /// out of its queue whole.
    flows: HashMap<u64, VecDeque<Box<ExchangeState>>>,
    max_per_flow: usize,
    /// Sum of the open exchanges' [`ExchangeState::cost`], as charged when they opened.
    bytes: usize,
    /// The open requests of legacy exchanges without a session id, by a digest of (lineage,
    /// request id; a lineage id names its server): such a client cancels on another connection, and the request
    /// it names is found here at once, not by a scan of every open exchange (which a client
    /// could make quadratic). Each entry is charged in its exchange's cost.
    sessionless: std::collections::HashMap<u64, ExchangeKey, Digested>,
    /// The digest's keyed hasher (so that no client can aim at another's entries).
    digest: crate::table_hash::RandomState,
}

impl Transactions {
    pub fn new(max_per_flow: usize) -> Self {
        Transactions {
            flows: HashMap::default(),
            max_per_flow: max_per_flow.max(1),
            bytes: 0,
            sessionless: Default::default(),
            digest: Default::default(),
        }
    }

    /// Adds (or, `add` false, removes) the index entries of `ex`'s requests (an associated
    /// function: `ex` may be borrowed from the queues beside the index).
    fn index_sessionless(
        index: &mut std::collections::HashMap<u64, ExchangeKey, Digested>,
        digest: &crate::table_hash::RandomState,
        ex: &ExchangeState,
        add: bool,
    ) {
        use std::hash::BuildHasher;
        let Some(lineage) = ex.lineage_id.as_deref().filter(|_| ex.indexed) else {
            return;
        };
        let key = (ex.flow, ex.number);
        for r in ex.requests.iter() {
            let d = digest.hash_one((lineage, &r.id.0));
            if add {
                index.insert(d, key);
            } else if index.get(&d) == Some(&key) {
                index.remove(&d);
            }
        }
    }

    /// Marks cancelled the open request `id` of the legacy client without a session id whose
    /// lineage is `lineage` at `server` (its newest with that id), on whichever connection it
    /// went; false if there is none.
    pub fn cancel_sessionless(&mut self, server: SocketAddr, lineage: &str, id: &Id) -> bool {
        use std::hash::BuildHasher;
        let digest = self.digest.hash_one((lineage, &id.0));
        let Some(&key) = self.sessionless.get(&digest) else {
            return false;
        };
        self.get_mut(key).is_some_and(|ex| {
            ex.indexed
                && ex.server == server
                && ex.lineage_id.as_deref() == Some(lineage)
                && ex.requests.cancel(id)
        })
    }

    /// Bytes held by open exchanges and their flows' queues.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    fn position(queue: &VecDeque<Box<ExchangeState>>, number: u64) -> Option<usize> {
        // Nearly always the oldest (and only) one: answers come in order.
        if queue.front()?.number == number {
            return Some(0);
        }
        queue.binary_search_by_key(&number, |ex| ex.number).ok()
    }

    pub fn get(&self, key: ExchangeKey) -> Option<&ExchangeState> {
        let queue = self.flows.get(&key.0)?;
        queue.get(Self::position(queue, key.1)?).map(|ex| &**ex)
    }

    pub fn get_mut(&mut self, key: ExchangeKey) -> Option<&mut ExchangeState> {
        let queue = self.flows.get_mut(&key.0)?;
        let at = Self::position(queue, key.1)?;
        queue.get_mut(at).map(|ex| &mut **ex)
    }

    /// Opens exchange `ex` on `flow`. Returns the oldest open exchange of that flow when the
    /// flow is over its bound, which the caller drops (and counts).
    pub fn open(&mut self, flow: u64, ex: Box<ExchangeState>) -> Option<Box<ExchangeState>> {
        let mut ex = ex;
        ex.indexed = ex.indexable();
        ex.charged = ex.cost();
        self.bytes += ex.charged;
        let (number, indexed) = (ex.number, ex.indexed);
        let queue = self.flows.entry(flow).or_insert_with(|| {
            self.bytes += QUEUE_BYTES;
            VecDeque::new()
        });
        let dropped = (queue.len() >= self.max_per_flow)
            .then(|| queue.pop_front())
            .flatten();
        let mut replaced = None;
        if let Some(d) = &dropped {
            self.bytes -= d.charged;
        }
        match queue.back() {
            Some(last) if last.number >= ex.number => {
                // Out of order (a caller reusing numbers): keep the queue sorted.
                let at = queue.partition_point(|e| e.number < ex.number);
                if queue.get(at).is_some_and(|e| e.number == ex.number) {
                    let old = std::mem::replace(&mut queue[at], ex);
                    self.bytes -= old.charged;
                    replaced = Some(old);
                } else {
                    queue.insert(at, ex);
                }
            }
            _ => queue.push_back(ex),
        }
        // The entries of what went first, then the new one's (a replacement has its key).
        for gone in dropped.iter().chain(replaced.iter()) {
            Self::index_sessionless(&mut self.sessionless, &self.digest, gone, false);
        }
        if let Some(new) = indexed
            .then(|| self.flows.get(&flow))
            .flatten()
            .and_then(|q| q.get(Self::position(q, number)?))
        {
            Self::index_sessionless(&mut self.sessionless, &self.digest, new, true);
        }
        dropped
    }

    pub fn remove(&mut self, key: ExchangeKey) -> Option<Box<ExchangeState>> {
        let queue = self.flows.get_mut(&key.0)?;
        // An empty queue stays until its flow closes: the next request of the connection
        // reuses it (one allocation and two table updates fewer per exchange). A queue that
        // grew (pipelined requests) gives its buffer back: what stays is what is charged.
        let ex = queue.remove(Self::position(queue, key.1)?);
        if queue.is_empty() && queue.capacity() > KEPT_QUEUE_CAPACITY {
            *queue = VecDeque::new();
        }
        if let Some(ex) = &ex {
            self.bytes -= ex.charged;
            Self::index_sessionless(&mut self.sessionless, &self.digest, ex, false);
        }
        ex
    }

    /// The flow is gone: forget its exchanges (given back, for their heads).
    pub fn close_flow(&mut self, flow: u64) -> VecDeque<Box<ExchangeState>> {
        match self.flows.remove(&flow) {
            Some(queue) => {
                self.bytes -= QUEUE_BYTES + queue.iter().map(|ex| ex.charged).sum::<usize>();
                for ex in &queue {
                    Self::index_sessionless(&mut self.sessionless, &self.digest, ex, false);
                }
                queue
            }
            None => VecDeque::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exchange(number: u64) -> Box<ExchangeState> {
        let addr: SocketAddr = "127.0.0.2:1".parse().expect("addr");
        Box::new(ExchangeState {
            flow: 0,
            number,
            ts: Timestamp(0),
            client: addr,
            server: addr,
            head: Box::default(),
            session_id: None,
            requests: Requests::default(),
            response: None,
            stream: StreamContent::default(),
            era: crate::model::Era::Legacy,
            lineage_id: None,
            route: None,
            ends_session: false,
            client_gone: false,
            server_answers: Vec::new(),
            charged: 0,
            indexed: false,
        })
    }

    /// A legacy client without a session id cancels on another connection: its request is
    /// found by (server, lineage, id) on any flow, never another lineage's; the index holds
    /// nothing once the exchanges are gone, by any way out (answered, dropped from a full
    /// queue, the flow closed), even when a response gave one of them a session id.
    #[test]
    fn sessionless_requests_are_found_on_any_flow_and_leave_no_entry_behind() {
        let mut t = Transactions::new(2);
        let sessionless = |flow: u64, number: u64, lineage: &str, id: &str| {
            let mut ex = exchange(number);
            ex.flow = flow;
            ex.lineage_id = Some(lineage.into());
            ex.requests = Requests::new(vec![request(id)]);
            ex
        };
        let server = exchange(0).server;
        let one = Id("1".into());
        t.open(1, sessionless(1, 0, "a", "1"));
        t.open(2, sessionless(2, 0, "b", "1"));
        assert!(!t.cancel_sessionless(server, "c", &one), "no such lineage");
        assert!(t.cancel_sessionless(server, "b", &one));
        assert!(
            t.get((2, 0))
                .is_some_and(|ex| ex.requests.iter().all(|r| r.cancelled))
        );
        assert!(
            t.get((1, 0))
                .is_some_and(|ex| ex.requests.iter().all(|r| !r.cancelled))
        );
        // A response gives flow 1's exchange a session id: its entry still goes with it.
        if let Some(ex) = t.get_mut((1, 0)) {
            ex.session_id = Some("s".into());
        }
        t.remove((1, 0));
        // Three on a flow that keeps two: the oldest is dropped.
        for n in 1..4 {
            t.open(3, sessionless(3, n, "a", &n.to_string()));
        }
        assert!(
            !t.cancel_sessionless(server, "a", &Id("1".into())),
            "dropped"
        );
        assert!(t.cancel_sessionless(server, "a", &Id("3".into())));
        for flow in 1..4 {
            t.close_flow(flow);
        }
        assert!(t.sessionless.is_empty(), "{:?}", t.sessionless);
        assert_eq!(t.bytes(), 0);
    }

    #[test]
    fn exchanges_are_found_per_flow_and_closing_a_flow_touches_only_its_own() {
        let mut t = Transactions::new(8);
        for n in 0..3 {
            assert!(t.open(1, exchange(n)).is_none());
            assert!(t.open(2, exchange(n)).is_none());
        }
        assert_eq!(t.get((1, 2)).map(|e| e.number), Some(2));
        assert_eq!(t.remove((1, 1)).map(|e| e.number), Some(1));
        assert!(t.get((1, 1)).is_none());
        assert_eq!(t.get((1, 2)).map(|e| e.number), Some(2));
        t.close_flow(1);
        assert!(t.get((1, 0)).is_none());
        assert_eq!(t.get_mut((2, 1)).map(|e| e.number), Some(1));
    }

    #[test]
    fn open_exchanges_are_charged_until_they_close() {
        let mut t = Transactions::new(4);
        let mut big = exchange(1);
        big.head.set_path(&"/".repeat(60_000));
        t.open(1, exchange(0));
        t.open(1, big);
        t.open(2, exchange(0));
        assert!(t.bytes() > 60_000);
        t.remove((1, 1));
        assert!(t.bytes() < 60_000);
        t.close_flow(1);
        t.close_flow(2);
        assert_eq!(t.bytes(), 0);
    }

    #[test]
    fn an_answered_flows_queue_stays_charged_until_the_flow_closes() {
        let mut t = Transactions::new(4);
        t.open(3, exchange(0));
        let one = t.bytes();
        t.remove((3, 0));
        assert_eq!(
            t.bytes(),
            QUEUE_BYTES,
            "the empty queue is kept, and charged"
        );
        t.open(3, exchange(1));
        assert_eq!(t.bytes(), one, "and reused");
        t.remove((3, 1));
        t.close_flow(3);
        assert_eq!(t.bytes(), 0);
        assert!(t.flows.is_empty());
    }

    #[test]
    fn a_queue_that_grew_gives_its_buffer_back_once_empty() {
        let mut t = Transactions::new(64);
        for n in 0..40 {
            t.open(5, exchange(n));
        }
        for n in 0..40 {
            t.remove((5, n));
        }
        let queue = t.flows.get(&5).expect("kept until the flow closes");
        assert!(
            queue.capacity() <= KEPT_QUEUE_CAPACITY,
            "{}",
            queue.capacity()
        );
        assert_eq!(t.bytes(), QUEUE_BYTES);
    }

    #[test]
    fn a_flow_over_its_bound_gives_up_its_oldest_exchange() {
        let mut t = Transactions::new(2);
        assert!(t.open(7, exchange(10)).is_none());
        assert!(t.open(7, exchange(11)).is_none());
        assert_eq!(t.open(7, exchange(12)).map(|e| e.number), Some(10));
        assert!(t.get((7, 10)).is_none());
        assert!(t.get((7, 12)).is_some());
    }

    fn request(id: &str) -> PendingRequest {
        PendingRequest {
            progress: false,
            id: Id(id.to_string()),
            method: "ping".into(),
            tool: None,
            init_params: None,
            answered: false,
            facts: None,
            findings: Vec::new(),
            cancelled: false,
        }
    }

    #[test]
    fn batches_find_open_requests_by_id_in_request_order() {
        for n in [3, 100] {
            let mut ids: Vec<String> = (0..n).map(|i| i.to_string()).collect();
            ids.push("1".into()); // a duplicate id is answered after the first
            let mut r = Requests::new(ids.iter().map(|i| request(i)).collect());
            assert_eq!(r.find_open(&Id("1".into())), Some(1), "{n}");
            r.answer(1);
            assert_eq!(r.find_open(&Id("1".into())), Some(n), "{n}");
            r.answer(n);
            assert_eq!(r.find_open(&Id("1".into())), None, "{n}");
            assert!(r.sole_open().is_none());
            for i in (0..n).filter(|i| *i != 1) {
                r.answer(i);
            }
            assert!(r.sole_open().is_none());
        }
        let mut r = Requests::new(vec![request("a"), request("b")]);
        r.answer(0);
        assert_eq!(r.sole_open().map(|p| p.id.0.as_str()), Some("b"));
    }

    #[test]
    fn has_open_follows_the_answers_without_a_scan() {
        for n in [1, 3, 9, 1000] {
            let mut r = Requests::new((0..n).map(|i| request(&i.to_string())).collect());
            for i in 0..n {
                assert!(r.has_open(), "{n}: {i}");
                let at = r.find_open(&Id(i.to_string())).expect("open");
                r.answer(at);
                // Answering again changes nothing.
                r.answer(at);
                let scanned = r.iter().any(|p| !p.answered);
                assert_eq!(r.has_open(), scanned, "{n}: {i}");
            }
            assert!(!r.has_open());
        }
        assert!(!Requests::new(Vec::new()).has_open());
    }

    #[test]
    fn out_of_order_numbers_keep_the_queue_sorted() {
        let mut t = Transactions::new(8);
        t.open(1, exchange(5));
        t.open(1, exchange(3));
        t.open(1, exchange(4));
        for n in [3, 4, 5] {
            assert_eq!(t.get((1, n)).map(|e| e.number), Some(n));
        }
    }
}
